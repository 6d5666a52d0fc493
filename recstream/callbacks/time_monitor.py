"""TimeMonitor: print each epoch's wall time and mean step time, in MindSpore's format.

``Train epoch time: 1234.567 ms, per step time: 12.346 ms`` at each training epoch end, and
``Eval epoch time: ...`` after an evaluation (also the one inside ``fit``: MindSpore runs
TimeMonitor there). With ``data_time=True`` (not in sink mode) it appends
`` (data time: x ms)``: the mean time per step spent between one step's end and the next
step's begin, i.e. fetching the batch on the host.

Timing uses ``time.perf_counter`` and never synchronises per step. At epoch end it waits for
queued CUDA work (one sync per epoch) so the epoch time includes the device's tail of work.

>>> monitor = TimeMonitor(data_time=True)
"""
from __future__ import annotations

import time

import torch

from ..validation import check_bool, check_int
from .base import Callback
from .console import say


def _sync_device() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


class _Phase:
    """Clock and step count of one phase (train or eval): fit nests eval inside a train epoch."""

    def __init__(self):
        self.start = 0.0
        self.first_step = 0
        self.batch_num = None
        self.data_time = 0.0
        self.data_start = 0.0


class TimeMonitor(Callback):
    """Print epoch and per-step time at each epoch end (train and eval).

    `data_size`: steps per epoch used when the run does not know its `batch_num` (an unsized
    dataset); if neither is known the steps actually run in the epoch are counted.
    """

    called_in_fit_eval = True  # as in MindSpore: it also times the evaluation inside fit
    rank_zero_only = True

    def __init__(self, data_size: int | None = None, data_time: bool = False):
        self.data_size = check_int("TimeMonitor", "data_size", data_size, minimum=1, allow_none=True)
        self.data_time = check_bool("TimeMonitor", "data_time", data_time)
        self._train, self._eval = _Phase(), _Phase()

    def _begin(self, phase: _Phase, p) -> None:
        phase.batch_num = p.batch_num  # fit's eval overwrites cb_params.batch_num mid-epoch
        phase.first_step = p.cur_step_num or 0
        phase.data_time = 0.0
        phase.start = phase.data_start = time.perf_counter()

    def _end(self, phase: _Phase, p, label: str) -> None:
        _sync_device()
        epoch_ms = (time.perf_counter() - phase.start) * 1000
        if isinstance(phase.batch_num, int) and phase.batch_num > 0:  # None for an unsized dataset
            steps = phase.batch_num
        elif self.data_size is not None:
            steps = self.data_size
        else:
            steps = (p.cur_step_num or 0) - phase.first_step
        line = f"{label} epoch time: {epoch_ms:5.3f} ms"
        if steps > 0:
            line += f", per step time: {epoch_ms / steps:5.3f} ms"
            if self.data_time and not p.dataset_sink_mode:
                line += f" (data time: {phase.data_time * 1000 / steps:5.3f} ms)"
        say(line)

    # Data time: the gap between a step's end and the next step's begin (fetching the batch).
    def _step_begin(self, phase: _Phase) -> None:
        phase.data_time += time.perf_counter() - phase.data_start

    def _step_end(self, phase: _Phase) -> None:
        phase.data_start = time.perf_counter()

    def on_train_epoch_begin(self, run_context):
        self._begin(self._train, run_context.original_args())

    def on_train_epoch_end(self, run_context):
        self._end(self._train, run_context.original_args(), "Train")

    def on_train_step_begin(self, run_context):
        if self.data_time:
            self._step_begin(self._train)

    def on_train_step_end(self, run_context):
        if self.data_time:
            self._step_end(self._train)

    def on_eval_epoch_begin(self, run_context):
        self._begin(self._eval, run_context.original_args())

    def on_eval_epoch_end(self, run_context):
        self._end(self._eval, run_context.original_args(), "Eval")

    def on_eval_step_begin(self, run_context):
        if self.data_time:
            self._step_begin(self._eval)

    def on_eval_step_end(self, run_context):
        if self.data_time:
            self._step_end(self._eval)
