"""ReduceLROnPlateau: multiply the learning rate by `factor` when a monitored quantity plateaus.

MindSpore's rules, at each ``on_train_epoch_end``: during a cooldown the wait counter stays 0; an
improvement (beyond `min_delta`) resets it; otherwise it grows, and on reaching `patience` every
optimizer param group's ``"lr"`` above `min_lr` becomes ``max(lr * factor, min_lr)``, then the
cooldown starts. The monitored value is read as in `EarlyStopping` (``"loss"``: training loss).

>>> import torch
>>> reduce = ReduceLROnPlateau(monitor="eval_loss", factor=0.5, patience=2, min_lr=1e-5)
>>> reduce.mode
'min'
"""
from __future__ import annotations

import math

import torch

from ..validation import check_bool, check_choice, check_int, check_number, check_str
from ._monitoring import MODES, MonitorReader, is_improvement
from .base import Callback
from .console import say


def _optimizer(p):
    opt = p.optimizer
    if opt is None:  # a custom step cell usually carries its optimizer
        opt = getattr(p.train_network, "optimizer", None)
    if opt is None or not hasattr(opt, "param_groups"):
        raise RuntimeError("ReduceLROnPlateau: the run has no optimizer with 'param_groups' "
                           "(cb_params.optimizer is None); it needs one to change the learning rate")
    return opt


class ReduceLROnPlateau(Callback):
    """Reduce every param group's lr on a plateau of `monitor`; see the module docstring."""

    called_in_fit_eval = False

    def __init__(self, monitor: str = "eval_loss", factor: float = 0.1, patience: int = 10, verbose: bool = False,
                 mode: str = "auto", min_delta: float = 1e-4, cooldown: int = 0, min_lr: float = 0):
        owner = "ReduceLROnPlateau"
        self.monitor = check_str(owner, "monitor", monitor)
        self._reader = MonitorReader(monitor, owner)
        self.factor = check_number(owner, "factor", factor, minimum=0, maximum=1, min_open=True, max_open=True)
        self.patience = check_int(owner, "patience", patience, minimum=0)
        self.verbose = check_bool(owner, "verbose", verbose)
        self.mode = self._reader.mode(check_choice(owner, "mode", mode, MODES))
        self.min_delta = abs(check_number(owner, "min_delta", min_delta))
        self.cooldown = check_int(owner, "cooldown", cooldown, minimum=0)
        self.min_lr = check_number(owner, "min_lr", min_lr, minimum=0)
        self._reset()

    def _reset(self) -> None:
        self.cooldown_counter = 0
        self.wait = 0
        self.best = math.inf if self.mode == "min" else -math.inf

    def on_train_begin(self, run_context):
        self._reset()

    def on_train_epoch_end(self, run_context):
        p = run_context.original_args()
        optimizer = _optimizer(p)
        current = self._reader.read(p)
        if current is None:
            return
        if self.cooldown_counter > 0:
            self.cooldown_counter -= 1
            self.wait = 0
        if is_improvement(self.mode, current, self.best, self.min_delta):
            self.best = current
            self.wait = 0
        elif self.cooldown_counter <= 0:
            self.wait += 1
            if self.wait >= self.patience:
                new_lrs = self._reduce(optimizer)
                if new_lrs and self.verbose:
                    shown = new_lrs[0] if len(new_lrs) == 1 else new_lrs
                    say(f"Epoch {p.cur_epoch_num or 0:05d}: ReduceLROnPlateau reducing learning rate to {shown}.")
                self.cooldown_counter = self.cooldown
                self.wait = 0

    def _reduce(self, optimizer) -> list[float]:
        """Lower each group's lr; returns the new lrs, or [] if all were already at `min_lr`."""
        changed, new_lrs = False, []
        for group in optimizer.param_groups:
            lr = group["lr"]
            old = float(lr)  # a tensor lr lives on the host for LR schedules; once per plateau
            new = max(old * self.factor, self.min_lr) if old > self.min_lr else old
            if new != old:
                changed = True
                if isinstance(lr, torch.Tensor):
                    lr.fill_(new)  # keep it a tensor: fused/capturable optimizers require that
                else:
                    group["lr"] = new
            new_lrs.append(new)
        return new_lrs if changed else []
