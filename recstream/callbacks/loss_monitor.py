"""LossMonitor: print the training loss every N steps, in MindSpore's format."""
from __future__ import annotations

import math

import torch

from ..validation import check_int
from .base import Callback
from .console import say


def loss_value(net_outputs) -> float | None:
    """The scalar loss in `net_outputs` as a Python float (a device sync: call it sparingly).

    A tuple/list (e.g. ``(loss, overflow, scale)`` from a loss-scale cell) contributes its first
    element; a tensor its mean. Returns ``None`` when there is no tensor loss.
    """
    if isinstance(net_outputs, (tuple, list)) and net_outputs:
        net_outputs = net_outputs[0]
    if isinstance(net_outputs, torch.Tensor):
        return float(net_outputs.detach().float().mean())
    if isinstance(net_outputs, (int, float)):
        return float(net_outputs)
    return None


class LossMonitor(Callback):
    """Print ``epoch: {e} step: {s}, loss is {loss}`` every `per_print_times` global steps.

    `s` is the step inside the epoch. In sink mode the hook runs once per sink, so the printed
    loss is the sink's last step. A NaN or infinite loss stops training with a ValueError.
    The loss is read from the device only on the steps that print. In ``fit``, after each epoch
    that was evaluated, it prints ``Eval result: epoch {e}, metrics: {metrics}`` as well.

    >>> from recstream.callbacks import LossMonitor
    >>> monitor = LossMonitor(per_print_times=100)
    """

    called_in_fit_eval = False
    rank_zero_only = True

    def __init__(self, per_print_times: int = 1):
        self._per_print_times = check_int("LossMonitor", "per_print_times", per_print_times, minimum=0)
        self._last_print_time = 0

    def on_train_step_end(self, run_context):
        p = run_context.original_args()
        if self._per_print_times == 0:
            return
        step_in_epoch = (p.cur_step_num - 1) % p.batch_num + 1 if p.batch_num else p.cur_step_num
        # A resumed or rolled-back run can report a smaller step than the last print.
        while p.cur_step_num <= self._last_print_time:
            self._last_print_time -= max(self._per_print_times, (p.batch_num or 1) if p.dataset_sink_mode else 1)
        if p.cur_step_num - self._last_print_time < self._per_print_times:
            return
        loss = loss_value(p.net_outputs)
        if loss is not None and not math.isfinite(loss):
            raise ValueError(f"epoch: {p.cur_epoch_num} step: {step_in_epoch}. Invalid loss {loss}, "
                             "terminating training.")
        self._last_print_time = p.cur_step_num
        say(f"epoch: {p.cur_epoch_num} step: {step_in_epoch}, loss is {loss}")

    def on_train_epoch_end(self, run_context):
        metrics = run_context.original_args().get("metrics")
        if metrics:  # set only on the epochs that `fit` evaluated
            say(f"Eval result: epoch {run_context.original_args().cur_epoch_num}, metrics: {metrics}")
