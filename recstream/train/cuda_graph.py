"""A training step replayed as one CUDA graph (boost's ``cuda_graphs``).

A CTR step on a GPU is launch-bound: dozens of small kernels per embedding table and layer, each
costing more CPU time to launch than GPU time to run (figures: docs/benchmarks.md).
`CUDAGraphStep` runs the first steps eagerly (warm-up on a side stream, as capture requires), then
captures forward, backward and optimizer step once and replays that graph for every later batch
of the same shapes.

What keeps replays honest:

- inputs are copied into static buffers; a batch of other shapes/dtypes (a last partial batch)
  runs eagerly, which is correct because the optimizer's state is the same tensors either way;
- the optimizer is capturable (Adam/AdamW keep their step counters on the GPU) and its learning
  rates are GPU tensors that are refilled from ``group["lr"]`` before each replay, so LR
  schedulers keep working; a change of any other hyper-parameter, or ``load_state_dict`` on the
  optimizer (new state tensors), makes the next step recapture;
- the returned loss is the graph's static output, overwritten by the next replay (callbacks that
  keep it must copy it, as `History` does).

Inputs may be tensors or containers of them (tuples, lists, dicts, dataclasses such as
`recstream.Features`); what is not a tensor (a batch size, feature keys, a loss weight) is part of
the shapes a graph was captured for.

Conditions (checked by `capture_refusal`): CUDA, one process, loss scaling only where every
optimizer skips an overflowing step from the device flag (fused Adam/AdamW/SGD, with the rows that
boost's hooks update lazily, and recstream's row-sparse optimizers,
`recstream.optim.sparse_rows.skips_overflow_on_device`; any other needs a host read to decide),
optimizers that are
`torch.optim.SGD`, `Adam`, `AdamW` or recstream's row-sparse
ones (`recstream.optim.SparseRowOptimizer`: their capturable mode keeps step counts and rates on
the device and sums a sparse gradient's rows into fixed-size outputs), sparse gradients only for
parameters those hold or that boost's lazy row updates of Adam take (`recstream.optim.sparse_rows`,
capturable likewise), and dynamic (hash) tables only unsharded. A capture that fails anyway (an op
CUDA cannot record) is logged and the step runs eagerly from then on.

Dynamic (hash) tables (`recstream.nn.HashEmbedding` on the device path): a step that finds room by
the table's host bounds does only static-shape work and reads nothing back, so it is captured like
any other; its host side (the step count, the bounds) is recorded at capture and applied before each
replay (`recstream.nn.hash_replay`). A step that needs the counters read (a table short of free rows:
an LRU pass, pending keys over budget, a rebuild) or an age pass that the captured step did not run
is a step the graph cannot hold: it runs eagerly, and replays resume when the bounds show room again.
"""
from __future__ import annotations

import dataclasses
import gc
import logging
import weakref

import torch
from torch import nn

from ..nn.hash_replay import GraphReplay
from ..optim import SparseRowOptimizer
from ..optim.sparse_rows import lazy_rows_of, skips_overflow_on_device

log = logging.getLogger(__name__)
WARMUP_STEPS = 3  # eager steps before capture: lazily created state (moments, cuDNN plans) exists by then
_CAPTURABLE = (torch.optim.Adam, torch.optim.AdamW)
_GRAPHABLE = (*_CAPTURABLE, torch.optim.SGD, SparseRowOptimizer)


def capture_refusal(network: nn.Module, optimizers: list, device: torch.device, distributed: bool,
                    loss_scaled: bool) -> str | None:
    """Why the training step cannot be captured, or None."""
    if device.type != "cuda":
        return f"the network is on {device.type}, not CUDA"
    if distributed:
        return "several processes (collectives are not captured here)"
    if loss_scaled:
        # The loss-scale cell then hands the overflow flag to the optimizer instead of branching on
        # it (`recstream.train.loss_scale`), so the skip is part of the graph.
        host = [type(o).__name__ for o in optimizers if not skips_overflow_on_device(o)]
        if host:
            return (f"loss scaling: {host[0]} decides on the host whether to skip an overflowing step "
                    "(fused Adam/AdamW/SGD and recstream's row-sparse optimizers decide on the device)")
    sharded = [n for n, m in network.named_modules() if isinstance(m, GraphReplay) and m.sharded]
    if sharded:
        return f"dynamic (hash) tables {sharded[:3]} are sharded (their lookups are collectives)"
    for opt in optimizers:
        if not isinstance(opt, _GRAPHABLE):
            return f"{type(opt).__name__} is not torch.optim.SGD/Adam/AdamW or a recstream.optim row-sparse optimizer"
    # A sparse gradient is summed into fixed-size rows only by recstream's row-sparse optimizers'
    # capturable path; torch's optimizers coalesce it (a data-dependent size).
    row_sparse = {id(p) for opt in optimizers if isinstance(opt, SparseRowOptimizer)
                  for g in opt.param_groups for p in g["params"]}
    for opt in optimizers:  # Adam/AdamW with boost's lazy row updates (recstream.optim.sparse_rows)
        row_sparse.update(lazy_rows_of(opt))
    sparse = [n for n, m in network.named_modules() if getattr(m, "sparse", False)
              and any(id(p) not in row_sparse for p in m.parameters() if p.requires_grad)]
    if sparse:
        return (f"modules {sparse[:3]} emit sparse gradients for an optimizer that coalesces them "
                "(data-dependent sizes)")
    return None


def make_capturable(optimizers: list, device: torch.device) -> None:
    """Adam/AdamW and recstream's row-sparse optimizers with device step counters and tensor
    learning rates. Adam's existing counters (a restored state) move to the device here; the
    row-sparse optimizers convert theirs at their next step."""
    for opt in optimizers:
        if isinstance(opt, (*_CAPTURABLE, SparseRowOptimizer)):
            for group in opt.param_groups:
                group["capturable"] = True
                group["lr"] = torch.tensor(float(group["lr"]), device=device)
            opt.defaults["capturable"] = True
        if isinstance(opt, _CAPTURABLE):
            for state in opt.state.values():
                if isinstance(state.get("step"), torch.Tensor):
                    state["step"] = state["step"].to(device=device, dtype=torch.float32)


class CUDAGraphStep(nn.Module):
    """`step` (a training cell) replayed from a CUDA graph after `WARMUP_STEPS` eager calls."""

    def __init__(self, step: nn.Module, optimizers: list):
        super().__init__()
        self.step = step
        self._optimizers = optimizers
        self._calls, self._warned, self._failed = 0, False, False
        self.replays = 0  # steps run by replaying the graph (the others ran eagerly)
        self._graph = self._inputs = self._output = self._signature = self._hypers = None
        self._lrs: list[tuple[dict, torch.Tensor]] = []
        # Dynamic tables: the host side of the last eager step and of the captured one (hash_replay),
        # and the addresses of their tensors that the graph holds.
        self._tables = [m for m in step.modules() if isinstance(m, GraphReplay)]
        self._eager_host = self._eager_sig = self._graph_host = self._table_ptrs = None
        # A weak reference: a closure over `self` would make a reference cycle (optimizer -> hook ->
        # self -> optimizer), freed only by the cyclic GC, which may then destroy this graph while
        # another one is being captured (CUDA refuses that, and the capture fails).
        ref = weakref.ref(self)
        for opt in optimizers:
            opt.register_load_state_dict_post_hook(lambda *_: ref() is not None and ref().reset())

    @property
    def captured(self) -> bool:
        """Whether a graph is held (replayed for inputs of its shapes)."""
        return self._graph is not None

    def reset(self) -> None:
        """Forget the graph: the next step runs eagerly, the one after captures again. (The eager
        step lets state that was just loaded settle on the device: a restored step count is moved
        there, which a capture could not record.)"""
        self._graph = self._inputs = self._output = self._signature = self._hypers = None
        self._graph_host = self._table_ptrs = None
        self._calls = min(self._calls, WARMUP_STEPS - 1)

    def forward(self, *inputs, **kwargs):
        flat: list[torch.Tensor] = []
        spec = _flatten((inputs, kwargs), flat)
        signature = _signature(spec, flat)
        if signature is None and not self._warned:
            self._warned = True
            log.warning("cuda_graphs: the step's inputs are not all CUDA tensors; it runs eagerly")
        if signature is None or self._failed or self._calls < WARMUP_STEPS:
            return self._eager(inputs, kwargs, side_stream=signature is not None and not self._failed,
                               signature=signature)
        self._refresh_hypers()
        if self._graph is not None and self._tables and not self._tables_replayable():
            return self._eager(inputs, kwargs, side_stream=False, signature=signature)
        if self._graph is None:
            # Capture only a step that will need no read: as the last eager step of these shapes did,
            # and the bounds show room for it (else the capture would fail at the read).
            if self._tables and (self._eager_sig != signature or not self._tables_ready(self._eager_host)):
                return self._eager(inputs, kwargs, side_stream=False, signature=signature)
            if not self._capture(spec, flat, signature):
                return self._eager(inputs, kwargs, side_stream=False, signature=signature)
        elif signature != self._signature:
            return self._eager(inputs, kwargs, side_stream=False, signature=signature)
        elif self._tables:  # the captured step's host side, as its Python would have done it
            for table, events in zip(self._tables, self._graph_host, strict=True):
                table.replay_host(events)
        for static, value in zip(self._inputs, flat, strict=True):
            static.copy_(value, non_blocking=True)
        self._graph.replay()
        self.replays += 1
        return self._output

    def _eager(self, inputs, kwargs, side_stream: bool, signature=None):
        self._calls += 1
        for table in self._tables:
            table.record_host()
        try:
            if not side_stream:
                out = self.step(*inputs, **kwargs)
            else:  # warm-up on a side stream, as capture requires (no stray work on the capturing stream)
                stream = torch.cuda.Stream()
                stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(stream):
                    out = self.step(*inputs, **kwargs)
                torch.cuda.current_stream().wait_stream(stream)
        except BaseException:  # a partial host side predicts nothing: no capture until a step completes
            for table in self._tables:
                table.recorded_host()  # stops recording
            self._eager_host = None
            raise
        self._eager_host = [table.recorded_host() for table in self._tables]
        self._eager_sig = signature
        return out

    def _tables_ready(self, host) -> bool:
        """Whether every dynamic table can take a step whose host side was `host` without a read."""
        return host is not None and all(table.replay_ready(events)
                                        for table, events in zip(self._tables, host, strict=True))

    def _tables_replayable(self) -> bool:
        """Whether the graph may replay now: its tables' tensors are the ones it holds (else it is
        dropped, to be captured again) and their bounds show room for the captured step."""
        if [table.device_tensors() for table in self._tables] != self._table_ptrs:
            self.reset()
            return False
        return self._tables_ready(self._graph_host)

    def _capture(self, spec, flat: list[torch.Tensor], signature) -> bool:
        """Capture the step on static copies of the inputs; False (logged) when CUDA refused it."""
        statics = [t.clone() for t in flat]
        args, named = _unflatten(spec, iter(statics))
        self._lrs = [(g, g["lr"]) for opt in self._optimizers for g in opt.param_groups
                     if isinstance(g["lr"], torch.Tensor)]
        for opt in self._optimizers:
            opt.zero_grad(set_to_none=True)  # gradients are then allocated inside the graph's pool
        graph = torch.cuda.CUDAGraph()
        gc_was_on = gc.isenabled()
        gc.disable()  # no collection during capture: freeing another graph there invalidates this capture
        snapshots = [table.host_snapshot() for table in self._tables]
        for table in self._tables:
            table.record_host()
        try:
            with torch.cuda.graph(graph):
                output = self.step(*args, **named)
        except RuntimeError as e:  # an op CUDA cannot record: nothing ran, so the eager step is still exact
            for table, snap in zip(self._tables, snapshots, strict=True):
                table.restore_host(snap)  # its Python ran, its kernels did not
            self._failed = True
            log.warning("cuda_graphs: capturing the training step failed, it runs eagerly from now on: %s",
                        str(e).splitlines()[0] if str(e) else type(e).__name__)
            for opt in self._optimizers:
                opt.zero_grad(set_to_none=True)  # drop gradients that live in the abandoned graph's pool
            return False
        finally:
            if gc_was_on:
                gc.enable()
        self._graph, self._inputs, self._output = graph, statics, output
        self._graph_host = [table.recorded_host() for table in self._tables]
        self._table_ptrs = [table.device_tensors() for table in self._tables]
        self._signature, self._hypers = signature, _hypers(self._optimizers)
        log.info("cuda_graphs: captured the training step for inputs %s", signature)
        return True

    def _refresh_hypers(self) -> None:
        for group, lr in self._lrs:  # a scheduler may have put a float there: copy it into the graph's tensor
            if group["lr"] is not lr:
                lr.fill_(float(group["lr"]))
                group["lr"] = lr
        if self._graph is not None and _hypers(self._optimizers) != self._hypers:
            self.reset()  # betas, momentum, weight decay ... are baked into the captured kernels


_TENSOR = "tensor"  # a leaf of the inputs' structure that is a tensor (copied into a static buffer)


def _flatten(obj, tensors: list[torch.Tensor]):
    """The structure of `obj` with its tensors replaced by `_TENSOR` (they are appended to
    `tensors`): tuples, lists, dicts and dataclasses are walked; anything else is a constant."""
    if isinstance(obj, torch.Tensor):
        tensors.append(obj)
        return _TENSOR
    if isinstance(obj, (tuple, list)):
        return (type(obj), tuple(_flatten(o, tensors) for o in obj))
    if isinstance(obj, dict):
        return (dict, tuple((k, _flatten(v, tensors)) for k, v in obj.items()))
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        fields = tuple((f.name, _flatten(getattr(obj, f.name), tensors)) for f in dataclasses.fields(obj) if f.init)
        return (type(obj), fields)
    return ("constant", obj)


def _unflatten(spec, tensors):
    """`_flatten` undone, the tensors taken in order from the iterator `tensors`."""
    if spec is _TENSOR:
        return next(tensors)
    kind, body = spec
    if kind == "constant":
        return body
    if kind is dict:
        return {k: _unflatten(v, tensors) for k, v in body}
    if isinstance(kind, type) and issubclass(kind, (tuple, list)):
        items = [_unflatten(o, tensors) for o in body]
        return kind(*items) if hasattr(kind, "_fields") else kind(items)  # a namedtuple takes positions
    return kind(**{name: _unflatten(v, tensors) for name, v in body})


def _signature(spec, flat: list[torch.Tensor]) -> tuple | None:
    """The inputs' structure and constants, and their tensors' shapes/dtypes/devices; None when a
    tensor is not on CUDA or a constant cannot be compared (unhashable)."""
    if not all(t.is_cuda for t in flat):
        return None
    signature = (spec, tuple((tuple(t.shape), t.dtype, t.device) for t in flat))
    try:
        hash(signature)
    except TypeError:
        return None
    return signature


def _hypers(optimizers) -> list:
    """Every hyper-parameter baked into the captured kernels (a tensor lr is refilled instead)."""
    return [{k: v for k, v in g.items() if k != "params" and not (k == "lr" and isinstance(v, torch.Tensor))}
            for opt in optimizers for g in opt.param_groups]
