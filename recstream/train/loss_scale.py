"""Loss scaling (MindSpore's ``loss_scale_manager``): managers, update cells and the scaled step.

- `FixedLossScaleManager(loss_scale=128.0, drop_overflow_update=True)`: constant scale.
- `DynamicLossScaleManager(init_loss_scale=2**24, scale_factor=2, scale_window=2000)`: on overflow
  (any non-finite gradient) the step is skipped and the scale divided by `scale_factor` (never
  below 1); after `scale_window` consecutive clean steps it is multiplied by `scale_factor`.
- `TrainOneStepWithLossScaleCell(network, optimizer, scale_sense)`: one step returning
  ``(loss, overflow, scale)``.

The scale and the clean-step counter live in an update cell's buffers (device tensors), so the
bookkeeping never reads a value back to the host. Nor does the skip of an overflowing step where
every optimizer takes the overflow flag on the device (``found_inf``, torch's GradScaler protocol:
fused Adam/AdamW/SGD, the rows boost's hooks update lazily on such an Adam, recstream's row-sparse
optimizers; `recstream.optim.sparse_rows.skips_overflow_on_device`); with any other optimizer the
skip is decided on the host, one read of the flag per step (and on a CPU, where reads are free).

>>> import torch
>>> net = torch.nn.Linear(4, 1)
>>> manager = DynamicLossScaleManager(init_loss_scale=2**10, scale_window=2)
>>> step = TrainOneStepWithLossScaleCell(lambda x, y: ((net(x) - y) ** 2).mean(),
...     torch.optim.SGD(net.parameters(), lr=0.1), manager.get_update_cell())
>>> loss, overflow, scale = step(torch.randn(8, 4), torch.randn(8, 1))
>>> bool(overflow), float(scale), manager.get_loss_scale()
(False, 1024.0, 1024.0)
"""
from __future__ import annotations

import abc
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

import torch
from torch import nn

from ..hostpath import host_reads_free
from ..optim import CombinedOptimizer, SparseRowOptimizer
from ..optim.sparse_rows import skips_overflow_on_device
from ..validation import check_bool, check_int, check_number, check_type


class FixedLossScaleUpdateCell(nn.Module):
    """Constant scale. ``drop_overflow_update=False`` steps even when gradients overflow."""

    def __init__(self, loss_scale_value: float, drop_overflow_update: bool = True):
        super().__init__()
        value = check_number("FixedLossScaleUpdateCell", "loss_scale_value", loss_scale_value, minimum=1.0)
        self.drop_overflow_update = check_bool("FixedLossScaleUpdateCell", "drop_overflow_update",
                                               drop_overflow_update)
        self.register_buffer("loss_scale", torch.tensor(value, dtype=torch.float32))

    def forward(self, overflow: torch.Tensor) -> torch.Tensor:
        return overflow


class DynamicLossScaleUpdateCell(nn.Module):
    """Dynamic scale: divide on overflow (floor 1), multiply after `scale_window` clean steps."""

    drop_overflow_update = True

    def __init__(self, loss_scale_value: float, scale_factor: float, scale_window: int):
        super().__init__()
        value = check_number("DynamicLossScaleUpdateCell", "loss_scale_value", loss_scale_value, minimum=1.0)
        self.scale_factor = check_number("DynamicLossScaleUpdateCell", "scale_factor", scale_factor,
                                         minimum=1.0, min_open=True)
        self.scale_window = check_int("DynamicLossScaleUpdateCell", "scale_window", scale_window, minimum=1)
        self.register_buffer("loss_scale", torch.tensor(value, dtype=torch.float32))
        self.register_buffer("good_steps", torch.zeros((), dtype=torch.int64))

    def forward(self, overflow: torch.Tensor) -> torch.Tensor:
        # Branch-free tensor update: the scale stays on its device, no host read per step.
        ov = torch.as_tensor(overflow, device=self.loss_scale.device).to(torch.bool).reshape(())
        good = torch.where(ov, torch.zeros_like(self.good_steps), self.good_steps + 1)
        grown = self.loss_scale * self.scale_factor
        grow = (good >= self.scale_window) & torch.isfinite(grown)  # never grow into inf
        shrunk = torch.clamp(self.loss_scale / self.scale_factor, min=1.0)
        self.loss_scale.copy_(torch.where(ov, shrunk, torch.where(grow, grown, self.loss_scale)))
        self.good_steps.copy_(torch.where(good >= self.scale_window, torch.zeros_like(good), good))
        return overflow


class LossScaleManager(abc.ABC):
    """Base of loss-scale managers. A manager owns one update cell (the state on device); the
    step cell drives it, and the Python methods below read or drive the same state."""

    _cell: nn.Module

    def get_loss_scale(self) -> float:
        """Current scale as a float (reads the device value: for logging, not per step)."""
        return float(self._cell.loss_scale)

    def get_drop_overflow_update(self) -> bool:
        return self._cell.drop_overflow_update

    def update_loss_scale(self, overflow) -> None:
        """Apply one step's overflow flag (bool or tensor) to the scale, as the step cell does."""
        self._cell(torch.as_tensor(overflow))

    def get_update_cell(self) -> nn.Module:
        """The update cell for `TrainOneStepWithLossScaleCell` (always the same object)."""
        return self._cell

    @abc.abstractmethod
    def state_dict(self) -> dict:
        ...

    @abc.abstractmethod
    def load_state_dict(self, state: dict) -> None:
        ...

    def _check_state(self, state, keys: tuple[str, ...]) -> None:
        check_type(f"{type(self).__name__}.load_state_dict", "state", state, dict)
        if not set(keys) <= set(state):
            raise ValueError(f"{type(self).__name__}.load_state_dict: 'state' must be a dict with keys "
                             f"{list(keys)}, got {state!r}")


class FixedLossScaleManager(LossScaleManager):
    """Constant loss scale. With ``drop_overflow_update=True`` an overflowing step is skipped;
    with False the loss is scaled, the gradients unscaled and the step always taken.
    (MindSpore returns no update cell for ``drop_overflow_update=False``; here one is returned
    that never skips, because PyTorch optimizers cannot unscale gradients themselves.)"""

    def __init__(self, loss_scale: float = 128.0, drop_overflow_update: bool = True):
        value = check_number("FixedLossScaleManager", "loss_scale", loss_scale, minimum=1.0)
        drop = check_bool("FixedLossScaleManager", "drop_overflow_update", drop_overflow_update)
        self._cell = FixedLossScaleUpdateCell(value, drop)

    def state_dict(self) -> dict:
        return {"loss_scale": self.get_loss_scale(), "drop_overflow_update": self.get_drop_overflow_update()}

    def load_state_dict(self, state: dict) -> None:
        self._check_state(state, ("loss_scale", "drop_overflow_update"))
        owner = "FixedLossScaleManager.load_state_dict"
        self._cell.loss_scale.fill_(check_number(owner, "loss_scale", state["loss_scale"], minimum=1.0))
        self._cell.drop_overflow_update = check_bool(owner, "drop_overflow_update", state["drop_overflow_update"])


class DynamicLossScaleManager(LossScaleManager):
    """Dynamic loss scale; `init_scale` is an alias of `init_loss_scale` (PyTorch's name)."""

    def __init__(self, init_loss_scale: float = 2 ** 24, scale_factor: float = 2, scale_window: int = 2000,
                 *, init_scale: float | None = None):
        if init_scale is not None:
            if init_loss_scale != 2 ** 24 and init_loss_scale != init_scale:
                raise ValueError(f"give either 'init_loss_scale' ({init_loss_scale!r}) or its alias "
                                 f"'init_scale' ({init_scale!r}), not both")
            init_loss_scale = init_scale
        owner = "DynamicLossScaleManager"
        self._cell = DynamicLossScaleUpdateCell(
            check_number(owner, "init_loss_scale", init_loss_scale, minimum=1.0),
            check_number(owner, "scale_factor", scale_factor, minimum=1.0, min_open=True),
            check_int(owner, "scale_window", scale_window, minimum=1))

    @property
    def scale_factor(self) -> float:
        return self._cell.scale_factor

    @property
    def scale_window(self) -> int:
        return self._cell.scale_window

    def state_dict(self) -> dict:
        return {"loss_scale": self.get_loss_scale(), "good_steps": int(self._cell.good_steps),
                "scale_factor": self.scale_factor, "scale_window": self.scale_window}

    def load_state_dict(self, state: dict) -> None:
        self._check_state(state, ("loss_scale", "good_steps", "scale_factor", "scale_window"))
        owner = "DynamicLossScaleManager.load_state_dict"
        self._cell.scale_factor = check_number(owner, "scale_factor", state["scale_factor"], minimum=1.0, min_open=True)
        self._cell.scale_window = check_int(owner, "scale_window", state["scale_window"], minimum=1)
        self._cell.loss_scale.fill_(check_number(owner, "loss_scale", state["loss_scale"], minimum=1.0))
        self._cell.good_steps.fill_(check_int(owner, "good_steps", state["good_steps"], minimum=0))


def unscale_grads_(grads: list[torch.Tensor], inv_scale: torch.Tensor, found_inf: torch.Tensor) -> None:
    """Multiply `grads` by `inv_scale` in place; set ``found_inf`` to 1 if any is non-finite.

    Uses PyTorch's fused kernel per (device, dtype) group where it exists, else a foreach
    multiply plus an isfinite reduction. Sparse gradients are handled on their values.
    """
    groups: dict[tuple, list[torch.Tensor]] = {}
    for g in grads:
        if g.is_sparse:  # values of a coalesced sparse grad are a dense, in-place-writable view
            vals = g._values()
            vals.mul_(inv_scale.to(vals.device, vals.dtype))
            found_inf.add_((~torch.isfinite(vals).all()).to(found_inf.device, found_inf.dtype))
        else:
            groups.setdefault((g.device, g.dtype), []).append(g)
    fused = getattr(torch, "_amp_foreach_non_finite_check_and_unscale_", None)
    for (device, _), group in groups.items():
        inv, found = inv_scale.to(device), torch.zeros(1, device=device)
        if fused is not None:
            fused(group, found, inv)
        else:
            torch._foreach_mul_(group, inv.reshape(()))
            found += (~torch.stack([torch.isfinite(g).all() for g in group]).all()).float()
        found_inf.add_(found.to(found_inf.device).reshape(found_inf.shape))
    found_inf.clamp_(max=1.0)


def _skips_on_device(optimizer) -> bool:
    """Whether `optimizer` skips an overflowing step from a device flag
    (`recstream.optim.sparse_rows.skips_overflow_on_device`). recstream's row-sparse optimizers can
    once in capturable mode (step counts on the device), which is switched on here; their state
    dicts stay plain, so a load switches it off and the next step on again."""
    if not skips_overflow_on_device(optimizer):
        return False
    leaves = [optimizer]
    while any(isinstance(o, CombinedOptimizer) for o in leaves):
        leaves = [c for o in leaves for c in (o.optimizers.values() if isinstance(o, CombinedOptimizer) else [o])]
    for leaf in leaves:
        if isinstance(leaf, SparseRowOptimizer):
            for group in leaf.param_groups:
                group["capturable"] = True
    return True


class TrainOneStepWithLossScaleCell(nn.Module):
    """One step with loss scaling; ``forward(*inputs) -> (loss, overflow, scale)``.

    `scale_sense`: an update cell (``manager.get_update_cell()``), a manager, or a number/tensor
    for a fixed scale (overflowing steps are skipped, as in MindSpore). The loss is returned
    detached and unscaled; `overflow` is a bool tensor; `scale` is the scale used in this step.
    `autocast`: zero-argument factory of the context manager wrapping the forward (mixed precision).
    """

    def __init__(self, network: Callable, optimizer: torch.optim.Optimizer, scale_sense,
                 autocast: Callable[[], AbstractContextManager] | None = None):
        super().__init__()
        if not hasattr(optimizer, "step") or not hasattr(optimizer, "zero_grad"):
            raise TypeError("TrainOneStepWithLossScaleCell: 'optimizer' must be a torch.optim.Optimizer, "
                            f"got {type(optimizer).__name__}")
        if isinstance(scale_sense, LossScaleManager):
            scale_sense = scale_sense.get_update_cell()
        elif isinstance(scale_sense, torch.Tensor):
            if scale_sense.numel() != 1 or not scale_sense.is_floating_point():
                raise ValueError("'scale_sense' tensor must hold one floating value, got shape "
                                 f"{tuple(scale_sense.shape)} dtype {scale_sense.dtype}")
            scale_sense = FixedLossScaleUpdateCell(float(scale_sense))
        elif isinstance(scale_sense, (int, float)) and not isinstance(scale_sense, bool):
            scale_sense = FixedLossScaleUpdateCell(scale_sense)
        if not isinstance(scale_sense, (FixedLossScaleUpdateCell, DynamicLossScaleUpdateCell)):
            raise TypeError("'scale_sense' must be an update cell, a LossScaleManager, a number or a tensor, "
                            f"got {type(scale_sense).__name__}")
        self.network = network
        self.optimizer = optimizer
        self.scale_update = scale_sense
        self.autocast = autocast or nullcontext

    @property
    def loss_scale(self) -> torch.Tensor:
        return self.scale_update.loss_scale

    def set_sense_scale(self, value: float) -> None:
        """Overwrite the current scale (MindSpore's ``set_sense_scale``)."""
        self.scale_update.loss_scale.fill_(check_number("TrainOneStepWithLossScaleCell", "value", value, minimum=1.0))

    def _params(self) -> list[torch.Tensor]:
        return [p for group in self.optimizer.param_groups for p in group["params"] if p.grad is not None]

    def forward(self, *inputs, **kwargs):
        self.optimizer.zero_grad(set_to_none=True)
        with self.autocast():
            loss = self.network(*inputs, **kwargs)
        if not isinstance(loss, torch.Tensor) or not loss.requires_grad:
            raise TypeError("TrainOneStepWithLossScaleCell: the network must return a loss tensor that "
                            f"requires grad, got {type(loss).__name__}")
        if self.scale_update.loss_scale.device != loss.device:  # one-time move, e.g. built on CPU
            self.scale_update.to(loss.device)
        scale = self.scale_update.loss_scale.clone()  # the update below changes the buffer in place
        # Seeding backward with the scale = backward of loss * scale, without touching `loss`.
        loss.backward(scale.to(loss.dtype).expand_as(loss))
        params = self._params()
        for p in params:
            # On a host, summed duplicates are checked too (coalesce); on a device that is a sync, so
            # each entry is checked instead (the row-sparse optimizers sum them into fixed-size rows).
            if p.grad.is_sparse and host_reads_free(p.grad):
                p.grad = p.grad.coalesce()
        found_inf = torch.zeros(1, device=scale.device)
        unscale_grads_([p.grad for p in params], scale.reciprocal().reshape(1), found_inf)
        overflow = found_inf.reshape(()) > 0
        self.scale_update(overflow)
        if not self.scale_update.drop_overflow_update:
            self.optimizer.step()
        elif not host_reads_free(overflow) and _skips_on_device(self.optimizer):
            # A fused torch optimizer (its lazily updated rows too) or recstream's row-sparse ones
            # (in capturable mode) skip an overflowing step on the device (weights, moments and
            # step counts stay), as torch's GradScaler drives it: no host read of the flag.
            self.optimizer.found_inf = found_inf.reshape(())
            try:
                self.optimizer.step()
            finally:
                del self.optimizer.found_inf
        # Otherwise a host sync (one per step): skipping the step must leave weights and optimizer
        # state (moments, step counts) untouched, which only a Python-side branch can guarantee.
        elif not bool(overflow):
            self.optimizer.step()
        return loss.detach(), overflow, scale
