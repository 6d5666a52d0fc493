"""EpochSummary: one line per training epoch, the default output where no progress bar is drawn.

When output is not an interactive terminal (a log file, CI, a notebook's captured stderr), a
progress bar is noise; `Model.train` / `fit` then print one line per epoch instead, to stderr
(stdout stays the user's and MindSpore's callbacks'): the epoch's last loss, `fit`'s evaluation
results, the steps, the time and the step rate. ``Model(progress_bar=False)`` silences it.

>>> import io
>>> from recstream.callbacks import RunContext, CallbackParams
>>> out = io.StringIO(); summary = EpochSummary(file=out)
>>> p = CallbackParams(cur_epoch_num=1, epoch_num=2, cur_step_num=0, net_outputs=None)
>>> summary.on_train_epoch_begin(RunContext(p))
>>> p.cur_step_num, p.eval_results = 10, {"auc": 0.75}
>>> summary.on_train_epoch_end(RunContext(p))
>>> out.getvalue().split(" in ")[0]
'epoch 1/2: auc=0.7500, 10 steps'
"""
from __future__ import annotations

import sys
import time

from ..validation import describe
from .base import Callback
from .console import say
from .loss_monitor import loss_value


class EpochSummary(Callback):
    """Prints one line per training epoch to `file` (default: stderr); see the module docstring."""

    called_in_fit_eval = False
    rank_zero_only = True

    def __init__(self, file=None):
        if file is not None and not callable(getattr(file, "write", None)):
            raise TypeError(f"EpochSummary: 'file' must be a writable text stream or None, got {describe(file)}")
        self.file = file
        self._start, self._first_step, self._last_epoch = 0.0, 0, None

    def on_train_begin(self, run_context):
        self._last_epoch = None

    def on_train_epoch_begin(self, run_context):
        p = run_context.original_args()
        if self._last_epoch is None and isinstance(p.epoch_num, int):
            self._last_epoch = (p.cur_epoch_num or 1) - 1 + p.epoch_num  # epochs run initial_epoch+1 .. epoch
        self._start, self._first_step = time.perf_counter(), p.cur_step_num or 0

    def on_train_epoch_end(self, run_context):
        p = run_context.original_args()
        seconds = time.perf_counter() - self._start
        epoch = p.cur_epoch_num or 1
        parts = []
        loss = loss_value(p.net_outputs)  # one host sync per epoch
        if loss is not None:
            parts.append(f"loss={loss:.4f}")
        for name, value in (p.eval_results or {}).items():
            parts.append(f"{name}={_fmt(value)}")
        steps = (p.cur_step_num or 0) - self._first_step
        rate = f", {steps / seconds:,.1f} steps/s" if seconds > 0 else ""
        parts.append(f"{steps} steps in {seconds:.1f} s{rate}")
        head = f"epoch {epoch}/{self._last_epoch}" if self._last_epoch else f"epoch {epoch}"
        say(f"{head}: {', '.join(parts)}", file=self.file or sys.stderr)


def _fmt(value) -> str:
    try:
        return f"{float(value):.4f}"
    except (TypeError, ValueError):
        return str(value)
