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

Conditions (checked by `capture_refusal`): CUDA, one process, dense gradients only (sparse ones
have data-dependent shapes), no loss scaling (its skip decision is a host read), and optimizers
that are `torch.optim.SGD`, `Adam` or `AdamW`.
"""
from __future__ import annotations

import gc
import logging
import weakref

import torch
from torch import nn

log = logging.getLogger(__name__)
WARMUP_STEPS = 3  # eager steps before capture: lazily created state (moments, cuDNN plans) exists by then
_CAPTURABLE = (torch.optim.Adam, torch.optim.AdamW)
_GRAPHABLE = (*_CAPTURABLE, torch.optim.SGD)


def capture_refusal(network: nn.Module, optimizers: list, device: torch.device, distributed: bool,
                    loss_scaled: bool) -> str | None:
    """Why the training step cannot be captured, or None."""
    if device.type != "cuda":
        return f"the network is on {device.type}, not CUDA"
    if distributed:
        return "several processes (collectives are not captured here)"
    if loss_scaled:
        return "loss scaling decides on the host whether to skip a step"
    sparse = [n for n, m in network.named_modules() if getattr(m, "sparse", False)]
    if sparse:
        return f"modules {sparse[:3]} emit sparse gradients (data-dependent shapes)"
    for opt in optimizers:
        if not isinstance(opt, _GRAPHABLE):
            return f"{type(opt).__name__} is not torch.optim.SGD/Adam/AdamW"
        if isinstance(opt, _CAPTURABLE) and any(opt.state.values()):
            return f"{type(opt).__name__} holds state already (its step counters are on the host)"
    return None


def make_capturable(optimizers: list, device: torch.device) -> None:
    """Adam/AdamW with device step counters and tensor learning rates (before their first step)."""
    for opt in optimizers:
        if isinstance(opt, _CAPTURABLE):
            for group in opt.param_groups:
                group["capturable"] = True
                group["lr"] = torch.tensor(float(group["lr"]), device=device)
            opt.defaults["capturable"] = True


class CUDAGraphStep(nn.Module):
    """`step` (a training cell) replayed from a CUDA graph after `WARMUP_STEPS` eager calls."""

    def __init__(self, step: nn.Module, optimizers: list):
        super().__init__()
        self.step = step
        self._optimizers = optimizers
        self._calls, self._warned = 0, False
        self._graph = self._inputs = self._output = self._signature = self._hypers = None
        self._lrs: list[tuple[dict, torch.Tensor]] = []
        # A weak reference: a closure over `self` would make a reference cycle (optimizer -> hook ->
        # self -> optimizer), freed only by the cyclic GC, which may then destroy this graph while
        # another one is being captured (CUDA refuses that, and the capture fails).
        ref = weakref.ref(self)
        for opt in optimizers:
            opt.register_load_state_dict_post_hook(lambda *_: ref() is not None and ref().reset())

    def reset(self) -> None:
        """Forget the graph: the next step of the captured shapes captures again."""
        self._graph = self._inputs = self._output = self._signature = self._hypers = None

    def forward(self, *inputs, **kwargs):
        flat = [*inputs, *kwargs.values()]
        signature = _signature(flat)
        if signature is None and not self._warned:
            self._warned = True
            log.warning("cuda_graphs: the step's inputs are not all CUDA tensors; it runs eagerly")
        if signature is None or self._calls < WARMUP_STEPS:
            return self._eager(inputs, kwargs, side_stream=signature is not None)
        self._refresh_hypers()
        if self._graph is None:
            self._capture(inputs, kwargs, signature)
        if signature != self._signature:
            return self._eager(inputs, kwargs, side_stream=False)
        for static, value in zip(self._inputs, flat, strict=True):
            static.copy_(value, non_blocking=True)
        self._graph.replay()
        return self._output

    def _eager(self, inputs, kwargs, side_stream: bool):
        self._calls += 1
        if not side_stream:
            return self.step(*inputs, **kwargs)
        # Warm-up on a side stream, as capture requires (no stray work on the capturing stream).
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            out = self.step(*inputs, **kwargs)
        torch.cuda.current_stream().wait_stream(stream)
        return out

    def _capture(self, inputs, kwargs, signature) -> None:
        statics = [t.clone() for t in (*inputs, *kwargs.values())]
        args, named = statics[:len(inputs)], dict(zip(kwargs, statics[len(inputs):], strict=True))
        self._lrs = [(g, g["lr"]) for opt in self._optimizers for g in opt.param_groups
                     if isinstance(g["lr"], torch.Tensor)]
        for opt in self._optimizers:
            opt.zero_grad(set_to_none=True)  # gradients are then allocated inside the graph's pool
        graph = torch.cuda.CUDAGraph()
        gc_was_on = gc.isenabled()
        gc.disable()  # no collection during capture: freeing another graph there invalidates this capture
        try:
            with torch.cuda.graph(graph):
                output = self.step(*args, **named)
        finally:
            if gc_was_on:
                gc.enable()
        self._graph, self._inputs, self._output, self._signature = graph, statics, output, signature
        self._hypers = _hypers(self._optimizers)
        log.info("cuda_graphs: captured the training step for inputs %s", signature)

    def _refresh_hypers(self) -> None:
        for group, lr in self._lrs:  # a scheduler may have put a float there: copy it into the graph's tensor
            if group["lr"] is not lr:
                lr.fill_(float(group["lr"]))
                group["lr"] = lr
        if self._graph is not None and _hypers(self._optimizers) != self._hypers:
            self.reset()  # betas, momentum, weight decay ... are baked into the captured kernels


def _signature(flat) -> tuple | None:
    """Shapes/dtypes/devices of the step's inputs; None when one is not a CUDA tensor."""
    if not all(isinstance(t, torch.Tensor) and t.is_cuda for t in flat):
        return None
    return tuple((tuple(t.shape), t.dtype, t.device) for t in flat)


def _hypers(optimizers) -> list:
    """Every hyper-parameter baked into the captured kernels (a tensor lr is refilled instead)."""
    return [{k: v for k, v in g.items() if k != "params" and not (k == "lr" and isinstance(v, torch.Tensor))}
            for opt in optimizers for g in opt.param_groups]
