"""LearningRateScheduler: change the learning rate during training.

Two forms:

- MindSpore's: ``LearningRateScheduler(fn)`` where ``fn(lr, cur_step_num) -> new_lr`` is called at
  each ``on_train_step_end`` (once per sink in sink mode, with the advanced step count). It is
  applied to every optimizer param group (with that group's current lr); a group is only written
  when the value changes. With ``interval="epoch"`` it is called at ``on_train_epoch_end`` as
  ``fn(lr, cur_epoch_num)``.
- A ``torch.optim.lr_scheduler.LRScheduler`` instance: ``scheduler.step()`` once per training
  step (``interval="step"``; in sink mode as many times as the sink trained steps) or once per
  epoch (``interval="epoch"``). Use `ReduceLROnPlateau` (the callback) for plateau schedules.

>>> import torch
>>> net = torch.nn.Linear(2, 1)
>>> opt = torch.optim.SGD(net.parameters(), lr=0.1)
>>> warmup = LearningRateScheduler(lambda lr, step: 0.1 * min(1.0, step / 100))
>>> cosine = LearningRateScheduler(torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=10), interval="epoch")
"""
from __future__ import annotations

import math
import numbers

import torch
from torch.optim.lr_scheduler import LRScheduler

from ..validation import check_callable, check_choice
from .base import Callback

INTERVALS = ("step", "epoch")


class LearningRateScheduler(Callback):
    """Apply a learning-rate function or a torch LR scheduler; see the module docstring."""

    called_in_fit_eval = False

    def __init__(self, learning_rate_function, interval: str = "step"):
        owner = "LearningRateScheduler"
        self.interval = check_choice(owner, "interval", interval, INTERVALS)
        if isinstance(learning_rate_function, torch.optim.lr_scheduler.ReduceLROnPlateau):
            raise TypeError(f"{owner}: 'learning_rate_function' must not be torch's ReduceLROnPlateau, which needs a "
                            "metric at each step; use recstream.callbacks.ReduceLROnPlateau instead")
        self._scheduler = learning_rate_function if isinstance(learning_rate_function, LRScheduler) else None
        if self._scheduler is None:
            check_callable(owner, "learning_rate_function", learning_rate_function)
        self.learning_rate_function = learning_rate_function
        self._last_step = 0

    def on_train_begin(self, run_context):
        self._last_step = run_context.original_args().cur_step_num or 0

    def on_train_step_end(self, run_context):
        if self.interval != "step":
            return
        p = run_context.original_args()
        if self._scheduler is not None:
            # Keep the schedule in units of training steps, also when a sink ran many at once.
            for _ in range(max(1, p.cur_step_num - self._last_step)):
                self._scheduler.step()
            self._last_step = p.cur_step_num
        else:
            self._apply(p, p.cur_step_num)

    def on_train_epoch_end(self, run_context):
        if self.interval != "epoch":
            return
        p = run_context.original_args()
        if self._scheduler is not None:
            self._scheduler.step()
        else:
            self._apply(p, p.cur_epoch_num)

    def _apply(self, p, counter) -> None:
        optimizer = p.optimizer if p.optimizer is not None else getattr(p.train_network, "optimizer", None)
        if optimizer is None or not hasattr(optimizer, "param_groups"):
            raise RuntimeError("LearningRateScheduler: the run has no optimizer (cb_params.optimizer is None)")
        for group in optimizer.param_groups:
            lr = group["lr"]
            old = float(lr)  # a Python float normally; a CPU tensor for tensor-lr optimizers
            new = self.learning_rate_function(old, counter)
            if isinstance(new, bool) or not isinstance(new, numbers.Real):
                raise TypeError(f"LearningRateScheduler: 'learning_rate_function' must return a number, "
                                f"got {type(new).__name__}: {new!r}")
            if not math.isclose(old, new, rel_tol=1e-10):
                if isinstance(lr, torch.Tensor):
                    lr.fill_(new)
                else:
                    group["lr"] = float(new)
