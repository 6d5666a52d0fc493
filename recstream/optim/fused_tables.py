"""Several embedding tables of one Adam param group kept in one storage: `FusedTables`.

A user's CTR network has a table per field (26 ``nn.Embedding`` for Criteo), so a row-sparse
step on them is 26 small gathers and scatters per state tensor, whose per-call cost exceeds
their work. Fused, the tables' weights are slices (views) of one ``[sum of rows, ...]`` tensor
and Adam's ``exp_avg`` / ``exp_avg_sq`` of each are slices of two more, so one step is one
coalesce of all the rows and one lazy-Adam update: what a hand-written single fused table does.

What is stored does not change: each table's ``weight`` stays its own ``nn.Parameter`` (a view
now), ``state_dict`` keys and shapes are the same, and Adam's state holds per-table tensors
(views too). Anything that swaps one of those tensors for another -- ``load_state_dict`` of the
optimizer, ``module.to(...)``, assigning ``weight.data`` -- is noticed on the next step (a
pointer comparison per tensor) and the tables are fused again from their current values (one
copy of the tables), so fusing is never wrong, at worst undone for a step.

>>> import torch
>>> a, b = torch.nn.Embedding(3, 2, sparse=True), torch.nn.Embedding(5, 2, sparse=True)
>>> adam = torch.optim.Adam([a.weight, b.weight], lr=0.1)
>>> fused = FusedTables([a.weight, b.weight])
>>> fused.weight.shape, b.weight.data_ptr() == fused.weight[3:].data_ptr()
(torch.Size([8, 2]), True)
>>> (a(torch.tensor([0, 2])).sum() + b(torch.tensor([4])).sum()).backward()
>>> fused.step(adam, adam.param_groups[0], [a.weight.grad, b.weight.grad])
>>> float(adam.state[b.weight]["step"]), adam.state[b.weight]["exp_avg"].shape
(1.0, torch.Size([5, 2]))
"""
from __future__ import annotations

from itertools import pairwise
from typing import Any

import torch
from torch import Tensor
from torch.optim import Optimizer
from torch.utils.weak import WeakIdKeyDictionary

from . import triton_rows
from ._base import coalesce_joined
from .lazy_adam import lazy_adam_rows

__all__ = ["FusedTables", "advance_step", "decay_rows", "host_step", "learning_rate", "new_step", "take_back_step"]


class FusedTables:
    """Tables (parameters of one Adam/AdamW param group with equal dtype, device and row shape)
    whose weights and Adam moments live in one storage each; `step` updates them all.

    Args:
        params: the tables' weights, in order (at least two).
    """

    def __init__(self, params: list[Tensor]) -> None:
        first = params[0] if len(params) else None
        if len(params) < 2 or any(p.dtype != first.dtype or p.device != first.device
                                  or p.shape[1:] != first.shape[1:] or p.dim() < 1 for p in params):
            raise ValueError("FusedTables: 'params' must be two or more tables of one dtype, device and row shape")
        self.params = list(params)
        self.starts = [0]
        for p in self.params:
            self.starts.append(self.starts[-1] + p.shape[0])
        self.spans = list(pairwise(self.starts))  # each table's rows [a, b) in the fused tensor
        self.weight = self._fuse(self.params)
        self.exp_avg = self.exp_avg_sq = None  # fused on the first step

    def _fuse(self, tensors: list[Tensor]) -> Tensor:
        """One tensor holding `tensors` one after another; each of them made a view of its slice."""
        with torch.no_grad():
            joined = torch.cat([t.detach() for t in tensors])
            for t, (a, b) in zip(tensors, self.spans, strict=True):
                t.data = joined[a:b]
        return joined

    def _is_slice_of(self, tensors: list[Tensor], joined: Tensor | None) -> bool:
        """Whether each of `tensors` still is its slice of `joined` (nothing swapped it since)."""
        if joined is None:
            return False
        row_bytes = joined.stride(0) * joined.element_size()
        return all(t.data_ptr() == joined.data_ptr() + a * row_bytes and t.shape[0] == b - a
                   and t.shape[1:] == joined.shape[1:] for t, (a, b) in zip(tensors, self.spans, strict=True))

    def ready(self, optimizer: Optimizer, capturable: bool = False) -> bool:
        """Whether a joint step can run: every table has Adam state at one step count, or none has.

        `capturable` (the group's flag: the step may be captured in a CUDA graph): the tables
        share one device step counter, so this compares identities, reading nothing; tables with
        separate counters (a loaded state) read them once, in an eager step, and share one from
        then on if they agree."""
        states = [optimizer.state[p] for p in self.params]
        if not any(states):
            return True
        if not all(states):
            return False
        if capturable:
            first = states[0]["step"]
            if all(s["step"] is first for s in states) and first.device == self.weight.device:
                return True
            if len({float(s["step"]) for s in states}) != 1:
                return False
            shared = first.detach().to(device=self.weight.device, dtype=torch.float32).clone()
            for s in states:
                s["step"] = shared
            return True
        steps = {host_step(s) for s in states}
        return len(steps) == 1

    def unshare_steps(self, optimizer: Optimizer) -> None:
        """Give each table its own step counter where they share one (capturable mode, see `ready`):
        before the tables are stepped one by one (a step where some have no gradient), which would
        otherwise advance the shared counter once per table. A later `ready` reads them (once) and
        shares one again only if they agree."""
        seen: set[int] = set()
        for p in self.params:
            state = optimizer.state[p]
            step = state.get("step")
            if isinstance(step, Tensor):
                if id(step) in seen:
                    state["step"] = step.clone()
                seen.add(id(step))

    def step(self, optimizer: Optimizer, group: dict[str, Any], grads: list[Tensor],
             found_inf: Tensor | None = None) -> None:
        """One lazy-Adam step of every table from its row-sparse gradient `grads` (in order), with
        `group`'s hyper-parameters, into Adam's own state entries. Call when `ready` (with
        ``capturable`` true where the group is capturable or a `found_inf` is given).

        `found_inf` (a loss-scaled step's overflow flag, as torch's GradScaler hands it to a fused
        Adam): where non-zero, weights, moments and the step count stay as they were, decided on
        the device (the count is then a device tensor, as in capturable mode)."""
        capturable = bool(group.get("capturable")) or found_inf is not None
        with torch.no_grad():
            if not self._is_slice_of(self.params, self.weight):
                self.weight = self._fuse(self.params)
            states = [optimizer.state[p] for p in self.params]
            self._fuse_state(states, self.weight.device if capturable else None)
            if capturable:  # one device counter shared by every table (see ready()), advanced once
                t = advance_step(states[0], self.weight.device)
            else:
                for state in states:
                    t = advance_step(state)  # the same count for every table: see ready()
            lr, (beta1, beta2), eps = learning_rate(group), group["betas"], group["eps"]
            if not self._kernel_step(group, grads, t, lr, found_inf):
                rows, values = coalesce_joined(grads, self.starts)
                values = decay_rows(optimizer, group, self.weight, rows, values, found_inf)
                lazy_adam_rows(self.weight, rows, values, self.exp_avg, self.exp_avg_sq, t, lr, beta1, beta2, eps,
                               found_inf)
            take_back_step(states[0], found_inf)  # the shared counter: once

    def _kernel_step(self, group: dict[str, Any], grads: list[Tensor], t: float | Tensor, lr: float | Tensor,
                     found_inf: Tensor | None = None) -> bool:
        """The step as one fused GPU kernel over every table's rows (`recstream.optim.triton_rows`:
        ids shifted into the fused tensor, duplicates summed inside); False where none applies, or
        with weight decay (applied by the torch ops, `decay_rows`)."""
        if group.get("weight_decay", 0) or not all(g.layout == torch.sparse_coo and g.sparse_dim() == 1
                                                   for g in grads):
            return False
        if not triton_rows.applies([self.weight, self.exp_avg, self.exp_avg_sq]):
            return False
        values = [g._values() for g in grads]
        if not triton_rows.applies([self.weight, *values]):
            return False
        rows = torch.cat([g._indices()[0] + a for g, a in zip(grads, self.starts[:-1], strict=True)])
        beta1, beta2 = group["betas"]
        triton_rows.lazy_adam(self.weight, self.exp_avg, self.exp_avg_sq, rows, torch.cat(values), t, lr,
                              beta1, beta2, group["eps"], found_inf)
        return True

    def _fuse_state(self, states: list[dict[str, Any]], device: torch.device | None = None) -> None:
        """Adam's entries of every table as slices of the fused moments (created at zero, as Adam
        creates its own, or joined from what the tables hold, e.g. after a load). `device`: the
        capturable mode's, where the tables share one step counter."""
        if not states[0]:
            self.exp_avg, self.exp_avg_sq = torch.zeros_like(self.weight), torch.zeros_like(self.weight)
            shared = new_step(device) if device is not None else None
            for state, (a, b) in zip(states, self.spans, strict=True):
                # Adam's own initial entries (step: a float32 CPU scalar, as non-fused Adam keeps it)
                state.update(step=shared if shared is not None else new_step(), exp_avg=self.exp_avg[a:b],
                             exp_avg_sq=self.exp_avg_sq[a:b])
            return
        for key in ("exp_avg", "exp_avg_sq"):
            tensors = [state[key] for state in states]
            if not self._is_slice_of(tensors, getattr(self, key)):
                setattr(self, key, self._fuse(tensors))


# Adam's step counts as the host last wrote them: step tensor -> (its _version then, the count). A
# step is read on the host every update (the bias corrections are Python floats); the tensor is read
# only when something else wrote it since (a load, the user): no `.item()` per table per step.
# Keyed by identity (a WeakKeyDictionary would compare tensors with ==, itself a read of their values).
_HOST_STEPS: WeakIdKeyDictionary = WeakIdKeyDictionary()


def new_step(device: torch.device | None = None) -> Tensor:
    """Adam's initial ``step`` entry: a float32 CPU scalar, as non-fused Adam keeps it, known to the
    host; on `device` when given (capturable mode: counted there, never read back)."""
    if device is not None:
        return torch.zeros((), dtype=torch.float32, device=device)
    step = torch.tensor(0.0)
    _HOST_STEPS[step] = (step._version, 0.0)
    return step


def learning_rate(group: dict[str, Any]) -> float | Tensor:
    """A group's ``lr``: a Python float, or the 0-d device tensor of a capturable group (not read)."""
    lr = group["lr"]
    return lr if isinstance(lr, Tensor) and group.get("capturable") else float(lr)


def host_step(state: dict[str, Any]) -> float:
    """Adam's ``state["step"]`` as a Python float, read from the tensor only when the host's copy of
    it is stale."""
    step = state["step"]
    known = _HOST_STEPS.get(step)
    if known is not None and known[0] == step._version:
        return known[1]
    count = float(step)
    _HOST_STEPS[step] = (step._version, count)
    return count


def advance_step(state: dict[str, Any], device: torch.device | None = None) -> float | Tensor:
    """Count one more step in Adam's ``state["step"]`` and return the count (on the host).

    `device` (capturable mode): the count stays a float32 tensor there, advanced by a kernel and
    returned as that tensor, never read on the host."""
    if device is not None:
        if state["step"].device != device or state["step"].dtype != torch.float32:
            state["step"] = state["step"].to(device=device, dtype=torch.float32)
        state["step"] += 1
        return state["step"]
    if state["step"].device.type != "cpu":
        # Loaded from a fused/capturable Adam: read on the host from now on (one copy, not one per step).
        state["step"] = state["step"].cpu()
    count = host_step(state) + 1
    step = state["step"]
    step.fill_(count)
    if count >= 2 ** 24:  # past float32's exact integers: the count the tensor holds
        count = float(step)
    _HOST_STEPS[step] = (step._version, count)
    return count


def take_back_step(state: dict[str, Any], found_inf: Tensor | None) -> None:
    """After an update given a loss-scaled step's `found_inf` (which then wrote no row): count the
    step back where the flag is set, on the device (``state["step"]`` is a device tensor then)."""
    if found_inf is not None:
        state["step"] -= found_inf.reshape(()).to(state["step"].dtype)


def decay_rows(optimizer: Optimizer, group: dict[str, Any], p: Tensor, rows: Tensor, values: Tensor,
               found_inf: Tensor | None = None) -> Tensor:
    """Weight decay of `group` on the touched `rows` of `p` alone (boost's ``lazy_weight_decay``):
    AdamW shrinks those rows now (by a factor 1 where `found_inf` is set: an overflowing step keeps
    them); Adam adds the decay to their gradient `values` (returned)."""
    weight_decay = group.get("weight_decay", 0)
    if not weight_decay:
        return values
    if isinstance(optimizer, torch.optim.AdamW):
        factor = 1.0 - learning_rate(group) * weight_decay
        if found_inf is not None:
            factor = torch.where(found_inf.reshape(()) != 0, 1.0, factor)  # scalars: no host-to-device copy
        p.index_copy_(0, rows, p.index_select(0, rows).mul_(factor))
        return values
    return values.add(p.index_select(0, rows), alpha=weight_decay)
