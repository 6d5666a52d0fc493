"""Let a user's torch optimizer take row-sparse gradients for its embedding tables.

Boost (``Model(boost_level="O1")``) switches the user's ``nn.Embedding`` / ``nn.EmbeddingBag``
modules to sparse gradients, so a step touches only the rows of the batch. The user's optimizer
must then accept those gradients, *and keep its own state format*, so that a checkpoint written
with boost loads without it and back:

- ``torch.optim.SGD`` and ``torch.optim.Adagrad`` take sparse COO gradients natively and compute
  exactly what they compute on the dense gradient (rows without gradient do not move): nothing to
  install.
- ``torch.optim.Adam`` / ``AdamW`` refuse them. `accept_sparse_rows` installs step hooks: before
  the step the sparse gradients are set aside (Adam then sees only its dense ones), after it the
  set-aside rows get a lazy-Adam update (`lazy_adam_tables`: tables that share a param group
  and step count in one update) written into Adam's own per-parameter
  entries ``step`` / ``exp_avg`` / ``exp_avg_sq``. Lazy means untouched rows keep their moments
  (TF LazyAdam, ``torch.optim.SparseAdam``): the one change of maths boost O1 makes (its effect
  on AUC is measured by ``benchmarks/bench_boost.py``). The hyper-parameters are read from the
  live param group on every step, so LR schedulers keep working.

A loss-scaled step (recstream's loss-scale cell, or torch's GradScaler) hands a fused Adam its
overflow flag ``found_inf`` (and ``grad_scale`` where the gradients are still scaled) instead of
branching on the host; the hooks honour both for the set-aside rows as the fused kernel does for
Adam's own: an overflowing step leaves their weights, moments and step counts as they were, chosen
on the device (the step counts are kept there while a flag is given, as in capturable mode), so a
loss-scaled step reads nothing on the host and may be captured in a CUDA graph.

Weight decay on a sparse table would decay every row every step, which a row-sparse update cannot
do; `sparse_rows_refusal` refuses it unless ``lazy_weight_decay=True`` (boost O2), which decays
only the rows a step touches (documented approximation).

>>> import torch
>>> emb = torch.nn.Embedding(10, 4, sparse=True)
>>> opt = torch.optim.Adam(emb.parameters(), lr=0.1)
>>> print(sparse_rows_refusal(opt, [emb.weight]))
None
>>> handle = accept_sparse_rows(opt, [emb.weight])
>>> emb(torch.tensor([1, 2])).sum().backward(); opt.step()
>>> sorted(opt.state[emb.weight]), float(opt.state[emb.weight]["step"])
(['exp_avg', 'exp_avg_sq', 'step'], 1.0)
>>> handle.remove()
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any
from weakref import WeakKeyDictionary

import torch
from torch import Tensor
from torch.optim import Optimizer

from . import triton_rows
from ._base import SparseRowOptimizer, coalesce_rows
from .combined import CombinedOptimizer
from .fused_tables import FusedTables, advance_step, decay_rows, learning_rate, new_step, take_back_step
from .lazy_adam import lazy_adam_tables

__all__ = ["accept_sparse_rows", "lazy_rows_of", "sparse_rows_refusal", "weight_decay_of"]

_NATIVE = (torch.optim.SGD, torch.optim.Adagrad)  # exact sparse paths inside torch
_ADAM = (torch.optim.Adam, torch.optim.AdamW)


def _group_of(optimizer: Optimizer, param: Tensor) -> dict[str, Any] | None:
    for group in optimizer.param_groups:
        if any(p is param for p in group["params"]):
            return group
    return None


def _child_of(optimizer: Optimizer, param: Tensor) -> Optimizer:
    """The optimizer that really updates `param` (a `CombinedOptimizer`'s child, or `optimizer`)."""
    if isinstance(optimizer, CombinedOptimizer):
        for child in optimizer.optimizers.values():
            if _group_of(child, param) is not None:
                return _child_of(child, param)
    return optimizer


def weight_decay_of(optimizer: Optimizer, param: Tensor) -> float:
    """The weight decay that applies to `param` in `optimizer` (0 when none or not held)."""
    group = _group_of(_child_of(optimizer, param), param)
    return float(group.get("weight_decay", 0) or 0) if group is not None else 0.0


def sparse_rows_refusal(optimizer: Optimizer, params: Iterable[Tensor], lazy_weight_decay: bool = False) -> str | None:
    """Why `optimizer` cannot update `params` from row-sparse gradients, or None when it can."""
    for p in params:
        opt = _child_of(optimizer, p)
        group = _group_of(opt, p)
        if group is None:
            return "the optimizer does not hold this table's weight"
        name = type(opt).__name__
        if isinstance(opt, SparseRowOptimizer):
            continue  # recstream's row-sparse optimizers: made for it
        if not isinstance(opt, (*_NATIVE, *_ADAM)):
            return f"{name} has no row-sparse update (supported: SGD, Adagrad, Adam, AdamW, recstream.optim)"
        if group.get("weight_decay", 0) and not (lazy_weight_decay and isinstance(opt, _ADAM)):
            return (f"{name} has weight_decay={group['weight_decay']}, which decays untouched rows too "
                    "(boost O2 decays only touched rows)")
        # Adam never sees the sparse gradients (the hooks update those rows), so its fused/foreach
        # kernels stay; SGD/Adagrad see them, and only their single-tensor path takes them.
        flags = ("amsgrad", "maximize", "differentiable", "capturable") if isinstance(opt, _ADAM) else \
            ("maximize", "differentiable", "fused", "foreach")
        for flag in flags:
            if group.get(flag):
                return f"{name} has {flag}=True, which has no row-sparse path"
    return None


def accept_sparse_rows(optimizer: Optimizer, params: Iterable[Tensor], fuse: bool = False) -> _Handles:
    """Make `optimizer` update `params` from row-sparse gradients (see the module docstring).

    Call `sparse_rows_refusal` first. `fuse`: tables of one Adam/AdamW param group (same dtype,
    device and row shape) are kept in one storage and stepped as one (`FusedTables`). Returns a
    handle whose ``remove()`` uninstalls the hooks and whose ``fused`` lists the fused sets. The
    hooks take the optimizer's ``found_inf`` / ``grad_scale`` (see the module docstring).
    """
    adam: dict[int, list[Tensor]] = {}
    optimizers: dict[int, Optimizer] = {}
    for p in params:
        opt = _child_of(optimizer, p)
        if isinstance(opt, _ADAM):
            adam.setdefault(id(opt), []).append(p)
            optimizers[id(opt)] = opt
    handles = _Handles()
    for key, ps in adam.items():
        fused = _fuse_tables(optimizers[key], ps) if fuse else []
        handles.fused += fused
        hooks = _LazyAdamHooks(ps, fused)
        handles.add(optimizers[key].register_step_pre_hook(hooks.set_aside))
        handles.add(optimizers[key].register_step_post_hook(hooks.update))
        handles.lazy_rows(optimizers[key], {id(p) for p in ps})
    return handles


# Optimizer -> ids of the parameters whose row-sparse gradients its lazy-Adam hooks update (what
# `recstream.train.cuda_graph` may capture). Weak: forgetting an optimizer forgets its entry.
_LAZY_ROWS: WeakKeyDictionary = WeakKeyDictionary()


def lazy_rows_of(optimizer: Optimizer) -> set[int]:
    """Ids of the parameters whose row-sparse gradients `accept_sparse_rows` made `optimizer`
    (an Adam/AdamW) update lazily: with ``capturable`` set, those updates run on the device alone
    (step counts and rates as device tensors, rows summed into fixed-size outputs)."""
    return set(_LAZY_ROWS.get(optimizer, ()))


def skips_overflow_on_device(optimizer: Optimizer) -> bool:
    """Whether `optimizer` (a CombinedOptimizer: each of its children) can skip an overflowing step
    from a device flag (``found_inf``, as torch's GradScaler drives it) with no host read:
    recstream's row-sparse optimizers (in capturable mode) and torch's fused ones, rows updated
    lazily here included (their hooks honour the flag: see `accept_sparse_rows`)."""
    if isinstance(optimizer, CombinedOptimizer):
        return all(skips_overflow_on_device(child) for child in optimizer.optimizers.values())
    if isinstance(optimizer, SparseRowOptimizer):
        return True
    return bool(getattr(optimizer, "_step_supports_amp_scaling", False))


def _fuse_tables(optimizer: Optimizer, params: list[Tensor]) -> list[FusedTables]:
    """A `FusedTables` for each set of two or more `params` that share a param group of
    `optimizer`, a dtype, a device and a row shape."""
    sets: dict[tuple, list[Tensor]] = {}
    for p in params:
        if p.dim() >= 1:
            sets.setdefault((id(_group_of(optimizer, p)), p.dtype, p.device, tuple(p.shape[1:])), []).append(p)
    return [FusedTables(ps) for ps in sets.values() if len(ps) > 1]


class _Handles:
    """The hook handles of one `accept_sparse_rows` call."""

    def __init__(self):
        self._handles = []
        self._rows: list[tuple[Optimizer, set[int]]] = []
        self.fused: list[FusedTables] = []

    def add(self, handle) -> None:
        self._handles.append(handle)

    def lazy_rows(self, optimizer: Optimizer, ids: set[int]) -> None:
        """Record that `optimizer`'s hooks now update the parameters `ids` (`lazy_rows_of`)."""
        _LAZY_ROWS.setdefault(optimizer, set()).update(ids)
        self._rows.append((optimizer, ids))

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        for optimizer, ids in self._rows:
            _LAZY_ROWS.get(optimizer, set()).difference_update(ids)
        self._rows.clear()


class _LazyAdamHooks:
    """Adam's step hooks for its row-sparse parameters (one instance per optimizer)."""

    def __init__(self, params: list[Tensor], fused: list[FusedTables]):
        self._ids = {id(p) for p in params}
        self._fused = fused
        self._aside: list[tuple[dict[str, Any], Tensor, Tensor]] = []

    def set_aside(self, optimizer: Optimizer, args, kwargs) -> None:
        self._aside.clear()  # a step that raised never ran `update`: its gradients are stale now
        for group in optimizer.param_groups:
            for p in group["params"]:
                if id(p) in self._ids and p.grad is not None and p.grad.is_sparse:
                    self._aside.append((group, p, p.grad))
                    p.grad = None  # Adam skips parameters without gradient

    def update(self, optimizer: Optimizer, args, kwargs) -> None:
        aside, self._aside = self._aside, []
        if not aside:
            return
        # A loss-scaled step's flags, as torch's GradScaler (or recstream's loss-scale cell) hands
        # them to a fused Adam for its own parameters: still set while the post-hooks run.
        found, scale = getattr(optimizer, "found_inf", None), getattr(optimizer, "grad_scale", None)
        with torch.no_grad():
            aside_now = aside
            if scale is not None:  # gradients still scaled (GradScaler without unscale_): as fused Adam does
                aside = [(group, p, _unscaled(grad, scale)) for group, p, grad in aside]
            aside = self._step_fused(optimizer, aside, found)  # the tables left to step one by one
            aside = _kernel_steps(optimizer, aside, found)  # on a GPU: one fused kernel each
            updates = _coalesced(optimizer, aside, found)
            # Tables that share hyper-parameters, step count, dtype, device and row shape take one
            # update together (lazy_adam_tables): the arithmetic runs once, not once per table.
            batches: dict[tuple, tuple[dict[str, Any], list]] = {}
            for (group, p, _), (t, rows, values) in zip(aside, updates, strict=True):
                key = (id(group), t, p.dtype, p.device, tuple(p.shape[1:]))
                state = optimizer.state[p]
                batches.setdefault(key, (group, []))[1].append((p, rows, values, state["exp_avg"], state["exp_avg_sq"]))
            for (_, t, *_), (group, tables) in batches.items():
                lr, (beta1, beta2), eps = learning_rate(group), group["betas"], group["eps"]
                lazy_adam_tables(tables, t, lr, beta1, beta2, eps, found)
            for _, p, _ in aside:  # after the updates, which read the advanced count
                take_back_step(optimizer.state[p], found)
        for _, p, grad in aside_now:
            p.grad = grad  # the user's zero_grad / inspection see what backward produced

    def _step_fused(self, optimizer: Optimizer, aside: list, found: Tensor | None) -> list:
        """Step each fused set whose tables all have a gradient and one step count (the usual case:
        every field in every batch); return the entries of `aside` not stepped."""
        if not self._fused:
            return aside
        by_param = {id(p): (group, grad) for group, p, grad in aside}
        stepped: set[int] = set()
        for fused in self._fused:
            present = [p for p in fused.params if id(p) in by_param]
            if not present:
                continue
            group = by_param[id(present[0])][0]
            if len(present) == len(fused.params) and \
                    fused.ready(optimizer, capturable=bool(group.get("capturable")) or found is not None):
                fused.step(optimizer, group, [by_param[id(p)][1] for p in fused.params], found)
                stepped.update(id(p) for p in fused.params)
            else:  # stepped one by one: each table counts its own steps from here
                fused.unshare_steps(optimizer)
        return [entry for entry in aside if id(entry[1]) not in stepped]


def _unscaled(grad: Tensor, scale: Tensor) -> Tensor:
    """A row-sparse gradient divided by a loss scale (a device tensor; no host read), not in place."""
    values = grad._values() / scale.to(grad.device, grad.dtype)
    return torch.sparse_coo_tensor(grad._indices(), values, grad.shape, is_coalesced=grad.is_coalesced(),
                                   check_invariants=False)


def _adam_state(optimizer: Optimizer, group: dict[str, Any], p: Tensor,
                found: Tensor | None = None) -> tuple[dict[str, Any], torch.device | None]:
    """Adam's state of `p` (its own initial entries created where missing: step a float32 CPU scalar,
    as non-fused Adam keeps it) and the device its step is counted on (capturable mode, or a step
    given an overflow flag `found`, which takes the count back there), or None."""
    state = optimizer.state[p]
    device = p.device if group.get("capturable") or found is not None else None
    if not state:
        state["step"] = new_step(device)
        state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
    return state, device


def _kernel_steps(optimizer: Optimizer, aside: list[tuple[dict[str, Any], Tensor, Tensor]],
                  found: Tensor | None = None) -> list:
    """Step each set-aside table that a fused GPU kernel can (`recstream.optim.triton_rows`: no weight
    decay, float32 contiguous on CUDA; `found` non-zero: the kernel writes nothing and the count is
    taken back); return the entries left for the torch ops."""
    left = []
    for group, p, grad in aside:
        entries = None if group.get("weight_decay", 0) or not triton_rows.applies([p]) \
            else triton_rows.gradient_entries(grad)
        if entries is None or not triton_rows.applies([p, entries[1]]):
            left.append((group, p, grad))
            continue
        state, device = _adam_state(optimizer, group, p, found)
        if not triton_rows.applies([p, state["exp_avg"], state["exp_avg_sq"]]):
            left.append((group, p, grad))
            continue
        t = advance_step(state, device)
        (beta1, beta2), eps = group["betas"], group["eps"]
        triton_rows.lazy_adam(p, state["exp_avg"], state["exp_avg_sq"], *entries, t, learning_rate(group),
                              beta1, beta2, eps, found)
        take_back_step(state, found)
    return left


def _coalesced(optimizer: Optimizer, aside: list[tuple[dict[str, Any], Tensor, Tensor]],
               found: Tensor | None = None) -> list[tuple[float, Tensor, Tensor]]:
    """Each set-aside table's ``(step t, rows, values)``: Adam's state entries created or advanced
    (on the device where `found` is given: the caller takes it back there), the gradient coalesced
    (all tables' together, `coalesce_rows`), weight decay applied."""
    out = []
    rows_values = coalesce_rows([p for _, p, _ in aside], [grad for _, _, grad in aside])
    for (group, p, _), (rows, values) in zip(aside, rows_values, strict=True):
        state, device = _adam_state(optimizer, group, p, found)
        t = advance_step(state, device)
        # Weight decay is only reached with lazy_weight_decay: the touched rows alone.
        out.append((t, rows, decay_rows(optimizer, group, p, rows, values, found)))
    return out
