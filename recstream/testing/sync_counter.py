"""Count the ops of a training step that force a host synchronisation on a device.

On CUDA a step runs asynchronously: the host queues kernels and moves on, unless an op needs a
value back (``.item()``, ``bool(t)``) or an output whose size depends on the data (``nonzero``,
``unique``, a boolean mask, ``repeat_interleave`` without ``output_size``, a COO ``coalesce``). Each
such op waits for the device and makes the step impossible to capture as one CUDA graph.
`SyncCounter` is a ``TorchDispatchMode`` that counts them, and every dispatched op, on any
device: run on CPU tensors under `recstream.hostpath.device_path` (with the compiled CPU
kernels off), it sees the ops CUDA would run, so the test suite checks a step is sync-free without
a GPU.

>>> import torch
>>> with SyncCounter() as counter:
...     x = torch.arange(6)
...     _ = x[x > 2]          # a boolean mask: the size of the result is data
...     _ = bool(x.sum() > 0)  # a value read on the host
>>> counter.syncs, sorted(counter.sync_ops)
(2, ['aten._local_scalar_dense', 'aten.index'])

``per_step`` records the counts between calls of `mark` (one per step). ``Tensor.tolist`` and
``Tensor.numpy``, which read values without dispatching an op, are counted too while the mode is on.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["SyncCounter", "StepCount", "SYNC_OPS"]

aten = torch.ops.aten

SYNC_OPS = frozenset({
    "aten._local_scalar_dense",  # .item(), bool(t), int(t), float(t), t.tolist()
    "aten.nonzero",
    "aten.unique", "aten._unique", "aten._unique2", "aten.unique_dim", "aten.unique_consecutive",
    "aten.unique_dim_consecutive",
    "aten.equal", "aten.is_nonzero",
    "aten._coalesce", "aten.masked_select",
})
"""Packets (``aten.<name>``) whose every call forces a host synchronisation on CUDA."""

_HOST_COPIES = ("tolist", "numpy")
"""Tensor methods that copy values to the host without dispatching an op (counted as ``Tensor.<name>``;
on CPU tensors they cost nothing, but a step on the device path should not call them)."""


@dataclass
class StepCount:
    """Counts of one step (or of the whole run): sync-forcing ops and all ops, by packet."""

    syncs: int = 0
    ops: int = 0
    sync_ops: Counter = field(default_factory=Counter)


def _packet(func) -> str:
    return f"aten.{func.__name__.split('.')[0]}" if func.namespace == "aten" else str(func.overloadpacket)


def _forces_sync(func, args, kwargs) -> bool:
    """Whether this call forces a host sync: a packet of `SYNC_OPS`, or one of the ops that sync only
    for some arguments (indexing by a boolean mask, `repeat_interleave` without ``output_size``,
    ``masked_scatter``, ``nonzero_static`` never)."""
    packet = _packet(func)
    if packet in SYNC_OPS:
        return True
    if packet in ("aten.index", "aten.index_put", "aten._index_put_impl"):
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        # index_put_ with a boolean mask is a masked fill of static shape on CUDA; reading one is not.
        return packet == "aten.index" and any(
            isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices or ())
    if packet == "aten.repeat_interleave":
        # Tensor repeats: the output's length is their sum, read on the host unless given.
        return func.__name__ in ("repeat_interleave.Tensor", "repeat_interleave.self_Tensor") \
            and kwargs.get("output_size") is None
    return packet == "aten.masked_scatter"


class SyncCounter(TorchDispatchMode):
    """A dispatch mode counting sync-forcing ops (`SYNC_OPS` and the argument-dependent ones) and all
    dispatched ops. ``total`` covers everything seen; `mark` closes a step into ``per_step``.
    ``where`` records the first few sync-forcing calls' Python stacks when ``trace=True``."""

    def __init__(self, trace: bool = False):
        super().__init__()
        self.total = StepCount()
        self.current = StepCount()
        self.per_step: list[StepCount] = []
        self.trace = trace
        self.where: list[tuple[str, str]] = []
        self.launches: Counter = Counter()  # `one_op` blocks, by name
        self._paused = False

    @property
    def syncs(self) -> int:
        return self.total.syncs

    @property
    def ops(self) -> int:
        return self.total.ops

    @property
    def sync_ops(self) -> Counter:
        return self.total.sync_ops

    def mark(self) -> StepCount:
        """End the current step: append its counts to ``per_step`` and start a new one."""
        done, self.current = self.current, StepCount()
        self.per_step.append(done)
        return done

    @contextmanager
    def one_op(self, name: str) -> Iterator[None]:
        """Count what runs inside the block as one dispatched op, ``name`` (not a sync): a GPU kernel's
        launch that Triton's interpreter runs on a CPU as many torch ops and host reads."""
        self._paused = True
        try:
            yield
        finally:
            self._paused = False
            for count in (self.total, self.current):
                count.ops += 1
            self.launches[name] += 1

    def __enter__(self):
        # Reads that bypass the dispatcher: a device tensor's values copied to the host whole.
        self._patched = {name: getattr(torch.Tensor, name) for name in _HOST_COPIES}
        for name, original in self._patched.items():
            setattr(torch.Tensor, name, self._counting(name, original))
        return super().__enter__()

    def __exit__(self, *exc):
        for name, original in self._patched.items():
            setattr(torch.Tensor, name, original)
        return super().__exit__(*exc)

    def _counting(self, name, original):
        def read(tensor, *args, **kwargs):
            if not self._paused:
                self._record(f"Tensor.{name}")
            return original(tensor, *args, **kwargs)
        return read

    def _record(self, packet: str) -> None:
        for count in (self.total, self.current):
            count.syncs += 1
            count.sync_ops[packet] += 1
        if self.trace and len(self.where) < 200:
            import traceback
            self.where.append((packet, "".join(traceback.format_stack(limit=12)[:-3])))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self._paused:
            return func(*args, **kwargs)
        for count in (self.total, self.current):
            count.ops += 1
        if _forces_sync(func, args, kwargs):
            self._record(_packet(func))
        return func(*args, **kwargs)
