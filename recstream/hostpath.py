"""Which code path a tensor's step takes: the host's, or the one a device (CUDA) runs.

A few steps of a training step have two implementations. On a CPU, reading a tensor's values on
the host is free (no device to wait for), so a check can raise a clear error, a single-hot batch
can be recognised by comparing its offsets, and a row-sparse gradient can be coalesced by
`unique` into exactly its touched rows. On a device, each of those reads is a host
synchronisation, so the device path runs static-shape ops instead (device-side asserts, sort and
boundary masks, outputs sized to the input). `host_reads_free` tells which applies.

`device_path` makes CPU tensors take the device path for a while: that is how the test suite
runs the ops CUDA runs on a machine without a GPU, and counts their host synchronisations
(``recstream.testing.SyncCounter``). It changes which (equivalent) ops run, not the results.

>>> import torch
>>> host_reads_free(torch.zeros(1))
True
>>> with device_path():
...     host_reads_free(torch.zeros(1))
False
"""
from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch

__all__ = ["host_reads_free", "device_path", "device_assert", "one_step", "once_per_step", "positions"]

_forced = threading.local()
_memo = threading.local()
# CUDA's device-side assert keeps its message in a fixed buffer: torch refuses a longer one with
# "Message length must be smaller than 255" at the call, i.e. the first step on a GPU would fail.
MAX_ASSERT_MESSAGE = 254


def host_reads_free(t: torch.Tensor) -> bool:
    """Whether reading `t`'s values on the host costs no device synchronisation: `t` is on the CPU
    and `device_path` is not in force (in this thread)."""
    return t.device.type == "cpu" and not getattr(_forced, "on", False)


@contextmanager
def device_path() -> Iterator[None]:
    """Within the block (this thread), CPU tensors take the path a device runs (see the module)."""
    before = getattr(_forced, "on", False)
    _forced.on = True
    try:
        yield
    finally:
        _forced.on = before


def device_assert(ok: torch.Tensor, message: str) -> None:
    """Assert the boolean scalar `ok` on its device, with no host synchronisation: a false `ok`
    fails a later kernel (on a CPU, the call itself). `message` must fit CUDA's assert buffer
    (`MAX_ASSERT_MESSAGE` bytes); that is checked here on every device, so the CPU tests catch a
    message that CUDA would refuse.

    >>> device_assert(torch.tensor(True), "ids must be >= 0")
    >>> device_assert(torch.tensor(True), "x" * 300)
    Traceback (most recent call last):
    ...
    ValueError: device_assert: message is 300 bytes, CUDA allows at most 254: 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxx'...
    """
    size = len(message.encode())
    if size > MAX_ASSERT_MESSAGE:
        raise ValueError(f"device_assert: message is {size} bytes, CUDA allows at most {MAX_ASSERT_MESSAGE}: "
                         f"{message[:30]!r}...")
    torch._assert_async(ok, message)


@contextmanager
def one_step() -> Iterator[None]:
    """Within the block (this thread; a training or eval step's forward), what `once_per_step` makes
    of a step's inputs -- a reordering of a batch's features, a check passed -- is made once, however
    many modules ask for it (a wide and a deep part reading one batch). A nested block shares the
    outer one's memo.

    >>> calls = []
    >>> x = torch.arange(3)
    >>> with one_step():
    ...     _ = [once_per_step("sum", (x,), lambda: calls.append(1) or x.sum()) for _ in range(2)]
    >>> len(calls)
    1
    """
    before = getattr(_memo, "d", None)
    _memo.d = {} if before is None else before
    try:
        yield
    finally:
        _memo.d = before


def once_per_step(what, tensors: tuple[torch.Tensor, ...], make):
    """``make()`` the first time `what` is asked of `tensors` as they are now within a `one_step`
    block, its result again after that (`tensors` written in place since -- their version counters --
    make it anew); outside a block, while torch.compile or torch.export trace, or for inference-mode
    tensors, ``make()`` every time. A `make` that raises leaves nothing behind. The memo holds
    `tensors`, so their identities stay theirs while it lives."""
    memo = getattr(_memo, "d", None)
    if memo is None or torch.compiler.is_compiling() or torch.compiler.is_exporting() or any(
            t.is_inference() for t in tensors):  # an inference tensor has no version counter to tell a write
        return make()
    key = (what, *((id(t), t._version) for t in tensors))
    hit = memo.get(key)
    if hit is None:
        hit = memo[key] = (make(), tensors)
    return hit[0]


_aranges: dict = {}  # (device, dtype) -> the longest arange made so far
# Every arange ever kept stays alive: a CUDA graph captured with a view of a shorter one reads its
# memory at each replay, which a freed tensor would hand to other allocations (geometric growth: all
# of them together are at most twice the longest).
_outgrown: list = []


def positions(n: int, device, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """``torch.arange(n)`` on `device`: a view of one kept arange (made again, twice as long, when a
    longer one is asked for), so a step's index vector is no op of the step. Not kept while a CUDA
    graph is captured (its values would exist only once the graph runs): then a new one, an op.

    >>> positions(4, "cpu").tolist(), positions(2, "cpu").data_ptr() == positions(3, "cpu").data_ptr()
    ([0, 1, 2, 3], True)
    """
    key = (torch.device(device), dtype)
    kept = _aranges.get(key)
    if kept is not None and kept.numel() >= n:
        return kept[:n]
    if key[0].type == "cuda" and torch.cuda.is_current_stream_capturing():
        return torch.arange(n, dtype=dtype, device=device)
    if kept is not None:
        _outgrown.append(kept)
    kept = _aranges[key] = torch.arange(max(n, 2 * (0 if kept is None else kept.numel()), 1024), dtype=dtype,
                                        device=device)
    return kept[:n]
