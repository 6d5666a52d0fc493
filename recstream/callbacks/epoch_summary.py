"""EpochSummary: the default output where no progress bar is drawn, a line per epoch (online: per interval).

When output is not an interactive terminal (a log file, CI, a notebook's captured stderr), a
progress bar is noise; `Model.train` / `fit` then print one line per epoch instead, to stderr
(stdout stays the user's and MindSpore's callbacks'): the epoch's last loss, `fit`'s evaluation
results, the steps, the time and the step rate. ``Model(progress_bar=False)`` silences it.

Each figure is printed under the name `History` gives it, so the line and ``history.history``
read alike: ``net_output`` is the training loss (the epoch's last step) and every evaluation
result keeps its own name (each metric, ``eval_loss``). With a metric named ``"loss"``, the line
shows ``net_output=`` (training) and ``loss=`` (validation), never one label twice; a result that
would take the training loss's name is printed as ``eval_net_output``.

Online training (`RecModel.online_train`, which sets ``cb_params.online``) has an epoch per sink,
far too many lines for a long job. There the line comes at most once every `every_seconds` (checked
at the end of a step): the step, its loss, and the steps, events (rows of the batches this process
trained) and events/s since the previous line. When training ends, one more line sums up the run:
steps, events, seconds and events/s up to the end of the last step (a stream that waits for new
events before it ends, ``idle_timeout``, is not training: that wait is given on its own, "then
10.0 s waiting for new events"), the last loss and, where a quiet ``PrequentialMonitor(verbose=False)``
ran, its whole-stream ``auc_total`` and ``logloss_total`` (a verbose one has just printed them on
its own line). A run that trained no step prints nothing.

>>> import io
>>> from recstream.callbacks import RunContext, CallbackParams
>>> out = io.StringIO(); summary = EpochSummary(file=out)
>>> p = CallbackParams(cur_epoch_num=1, epoch_num=2, cur_step_num=0, net_outputs=0.5)
>>> summary.on_train_epoch_begin(RunContext(p))
>>> p.cur_step_num, p.eval_results = 10, {"auc": 0.75, "loss": 0.25}
>>> summary.on_train_epoch_end(RunContext(p))
>>> out.getvalue().split(" in ")[0]
'epoch 1/2: net_output=0.5000, auc=0.7500, loss=0.2500, 10 steps'

Online, with a clock that reads 0 s at the start, 40 s at the end of step 100 and 50 s when the
stream has ended:

>>> out = io.StringIO(); summary = EpochSummary(file=out, clock=iter([0.0, 40.0, 50.0]).__next__)
>>> p = CallbackParams(online=True, cur_step_num=0, net_outputs=0.5, batch_observers=[])
>>> summary.on_train_begin(RunContext(p))
>>> p.cur_step_num = 100; summary.on_train_step_end(RunContext(p))
>>> summary.on_train_end(RunContext(p))
>>> print(out.getvalue().replace("; ", ";\\n"), end="")
online step 100: net_output=0.5000, 100 steps in 40.0 s, 2.5 steps/s
online training ended at step 100: 100 steps in 40.0 s, 2.5 steps/s, net_output=0.5000;
then 10.0 s waiting for new events
"""
from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import NamedTuple

from ..data.protocol import batch_rows
from ..validation import check_callable, check_number, describe
from .base import Callback
from .console import say
from .loss_monitor import loss_value
from .prequential import PrequentialMonitor

LOSS = "net_output"  # History's key for the training loss


class _Mark(NamedTuple):
    """Where a span of an online run begins or ends."""

    seconds: float
    step: int
    events: int


class EpochSummary(Callback):
    """Prints one line per training epoch (online: per `every_seconds`, and one at the end) to
    `file` (default: stderr); see the module docstring.

    Args:
        file: a writable text stream, or None for ``sys.stderr``.
        every_seconds: online training only: the least time between two lines (0: every step).
        clock: online training only: a function returning seconds, for the intervals and rates
            (default ``time.monotonic``; a test may pass its own).
    """

    called_in_fit_eval = False
    rank_zero_only = True

    def __init__(self, file=None, every_seconds: float = 30.0, clock: Callable[[], float] = time.monotonic):
        if file is not None and not callable(getattr(file, "write", None)):
            raise TypeError(f"EpochSummary: 'file' must be a writable text stream or None, got {describe(file)}")
        self.file = file
        self.every_seconds = check_number("EpochSummary", "every_seconds", every_seconds, minimum=0)
        self.clock = check_callable("EpochSummary", "clock", clock)
        self._start, self._first_step, self._last_epoch = 0.0, 0, None
        self._online, self._events = False, 0
        self._begun = self._printed = self._stepped = _Mark(0.0, 0, 0)

    def on_train_begin(self, run_context):
        p = run_context.original_args()
        self._last_epoch = None
        self._online = bool(p.online)
        if self._online:
            self._events = 0
            self._begun = self._printed = self._stepped = self._mark(p)
            if isinstance(p.batch_observers, list):  # sees every batch, also inside a sink
                p.batch_observers.append(self._count)

    def on_train_epoch_begin(self, run_context):
        if self._online:
            return
        p = run_context.original_args()
        if self._last_epoch is None and isinstance(p.epoch_num, int):
            self._last_epoch = (p.cur_epoch_num or 1) - 1 + p.epoch_num  # epochs run initial_epoch+1 .. epoch
        self._start, self._first_step = self.clock(), p.cur_step_num or 0

    def on_train_epoch_end(self, run_context):
        if self._online:
            return
        p = run_context.original_args()
        seconds = self.clock() - self._start
        parts = _loss(p)  # one host sync per epoch
        for name, value in (p.eval_results or {}).items():
            parts.append(f"{'eval_' + name if name == LOSS else name}={_fmt(value)}")
        steps = (p.cur_step_num or 0) - self._first_step
        rate = f", {steps / seconds:,.1f} steps/s" if seconds > 0 else ""
        parts.append(f"{steps} steps in {seconds:.1f} s{rate}")
        epoch = p.cur_epoch_num or 1
        head = f"epoch {epoch}/{self._last_epoch}" if self._last_epoch else f"epoch {epoch}"
        self._say(f"{head}: {', '.join(parts)}")

    def on_train_step_end(self, run_context):
        if not self._online:
            return
        now = self.clock()  # the clock only, per step: the loss is read from the device when a line is due
        p = run_context.original_args()
        self._stepped = mark = _Mark(now, p.cur_step_num or 0, self._events)
        if now - self._printed.seconds < self.every_seconds:
            return
        self._say(f"online step {mark.step}: {', '.join(_loss(p) + _span(self._printed, mark))}")
        self._printed = mark

    def on_train_end(self, run_context):
        if not self._online:
            return
        p = run_context.original_args()
        if self._count in (p.batch_observers or ()):
            p.batch_observers.remove(self._count)
        end = self._mark(p)
        if end.step == self._begun.step:
            return  # nothing trained: no line of 0 steps
        # the rates end with the last step: a wait for events that never came (idle_timeout) is no training
        last = self._stepped if self._stepped.step == end.step else end
        parts = _span(self._begun, _Mark(last.seconds, end.step, end.events)) + _loss(p) + _prequential(p)
        idle = end.seconds - last.seconds
        wait = f"; then {idle:.1f} s waiting for new events" if idle >= 1.0 else ""
        self._say(f"online training ended at step {end.step}: {', '.join(parts)}{wait}")

    def _count(self, batch) -> None:
        self._events += batch_rows(batch) or 0

    def _mark(self, p) -> _Mark:
        return _Mark(self.clock(), p.cur_step_num or 0, self._events)

    def _say(self, line: str) -> None:
        say(line, file=self.file or sys.stderr)


def _loss(p) -> list[str]:
    loss = loss_value(p.net_outputs)
    return [] if loss is None else [f"{LOSS}={loss:.4f}"]


def _span(start: _Mark, end: _Mark) -> list[str]:
    """Steps, events and their rate between two marks (steps/s where batches have no row count)."""
    seconds, steps, events = end.seconds - start.seconds, end.step - start.step, end.events - start.events
    if events:
        parts = [f"{steps} steps", f"{events} events in {seconds:.1f} s"]
        return parts + ([f"{events / seconds:,.1f} events/s"] if seconds > 0 else [])
    return [f"{steps} steps in {seconds:.1f} s"] + ([f"{steps / seconds:,.1f} steps/s"] if seconds > 0 else [])


def _prequential(p) -> list[str]:
    """A quiet PrequentialMonitor's whole-stream figures (a verbose one printed them itself)."""
    report = p.prequential
    monitors = [cb for cb in p.list_callback or () if isinstance(cb, PrequentialMonitor)]
    if not report or not monitors or any(cb.verbose for cb in monitors):
        return []
    return [f"{name}={_fmt(report.get(name))}" for name in ("auc_total", "logloss_total")]


def _fmt(value) -> str:
    try:
        return f"{float(value):.4f}"
    except (TypeError, ValueError):
        return str(value)
