"""ProgressBar: a tqdm bar per training epoch (and per evaluation) with steps/s, ETA and the loss.

The bar is redrawn at most every `refresh_interval` seconds, and only then is the loss read from
the device (``float(loss)`` is a host sync), so a fast training loop is not slowed down by it.
Unsized datasets (``batch_num`` unknown) show a counter and rate without ETA. In sink mode the
bar advances by the sink size at each step hook.

`progress_bar_default()` says whether a bar should be shown when the user did not ask: on an
interactive terminal or in a Jupyter notebook (``tqdm.auto`` draws a widget there), not under CI.

>>> import io
>>> bar = ProgressBar(refresh_interval=0.5, file=io.StringIO())
"""
from __future__ import annotations

import math
import os
import sys
import time

from tqdm.auto import tqdm

from ..validation import check_bool, check_number, describe
from .base import Callback
from .loss_monitor import loss_value

# Environment variables set by common CI services (GitHub Actions, GitLab, Jenkins, Travis,
# Azure Pipelines, Buildkite, TeamCity, CircleCI, ...).
_CI_VARS = ("CI", "CONTINUOUS_INTEGRATION", "GITHUB_ACTIONS", "GITLAB_CI", "JENKINS_URL", "TF_BUILD",
            "BUILDKITE", "TEAMCITY_VERSION", "CIRCLECI", "TRAVIS", "BUILD_NUMBER")


def progress_bar_default() -> bool:
    """True on an interactive terminal (stderr) or in a notebook kernel, and no CI environment detected."""
    for var in _CI_VARS:
        value = os.environ.get(var, "")
        if value and value.lower() not in ("0", "false", "no"):
            return False
    if os.environ.get("TERM") == "dumb":
        return False
    if "ipykernel" in sys.modules:  # a notebook: no terminal, but tqdm.auto draws a widget there
        return True
    stream = sys.stderr
    try:
        return bool(stream is not None and stream.isatty())
    except (AttributeError, ValueError):  # replaced or closed stream
        return False


def _fmt(value) -> str:
    try:
        return f"{float(value):.4f}"
    except (TypeError, ValueError):
        return str(value)


class _Bar:
    """One tqdm bar whose redraws we schedule ourselves (tqdm's own timer is switched off)."""

    def __init__(self, total, desc: str, first_step: int, owner: ProgressBar):
        self.first_step = first_step
        self.last_draw = time.perf_counter()
        # mininterval/maxinterval = inf: tqdm never redraws on update() nor from its monitor
        # thread; smoothing=0: the rate is the epoch's average, so ETA does not jump around.
        self.tqdm = tqdm(total=total, desc=desc, unit="step", leave=owner.leave, file=owner.file,
                         dynamic_ncols=True, mininterval=math.inf, maxinterval=math.inf,
                         miniters=sys.maxsize, smoothing=0)

    def advance(self, cur_step: int) -> None:
        n = cur_step - self.first_step
        if n > self.tqdm.n:
            self.tqdm.update(n - self.tqdm.n)

    def due(self, interval: float) -> bool:
        now = time.perf_counter()
        if now - self.last_draw < interval:
            return False
        self.last_draw = now
        return True

    def draw(self, postfix: str | None = None) -> None:
        if postfix is not None:
            self.tqdm.set_postfix_str(postfix, refresh=False)
        self.tqdm.refresh()

    def close(self) -> None:
        self.tqdm.close()


class ProgressBar(Callback):
    """tqdm progress bars for training epochs and evaluation; see the module docstring.

    `refresh_interval`: minimum seconds between redraws (and loss reads). `leave`: keep finished
    bars on screen. `file`: stream to draw on (default: stderr). `show_eval`: also a bar while
    evaluating (in ``fit`` the built-in callbacks do not see evaluation, as in MindSpore).
    """

    called_in_fit_eval = False
    rank_zero_only = True

    def __init__(self, refresh_interval: float = 0.1, leave: bool = True, file=None, show_eval: bool = True):
        owner = "ProgressBar"
        self.refresh_interval = check_number(owner, "refresh_interval", refresh_interval, minimum=0)
        self.leave = check_bool(owner, "leave", leave)
        self.show_eval = check_bool(owner, "show_eval", show_eval)
        if file is not None and not callable(getattr(file, "write", None)):
            raise TypeError(f"{owner}: 'file' must be a writable text stream or None, got {describe(file)}")
        self.file = file
        self._train: _Bar | None = None
        self._eval: _Bar | None = None
        self._last_epoch: int | None = None

    @staticmethod
    def _total(p):
        n = p.batch_num
        return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None

    def on_train_begin(self, run_context):
        self._last_epoch = None

    def on_train_epoch_begin(self, run_context):
        p = run_context.original_args()
        epoch = p.cur_epoch_num or 1
        if self._last_epoch is None and isinstance(p.epoch_num, int):
            self._last_epoch = epoch - 1 + p.epoch_num  # epochs run initial_epoch+1 .. epoch
        desc = f"Epoch {epoch}/{self._last_epoch}" if self._last_epoch else f"Epoch {epoch}"
        self._close_train()
        self._train = _Bar(self._total(p), desc, p.cur_step_num or 0, self)

    def on_train_step_end(self, run_context):
        bar = self._train
        if bar is None:
            return
        p = run_context.original_args()
        bar.advance(p.cur_step_num)
        if bar.due(self.refresh_interval):
            loss = loss_value(p.net_outputs)  # the only device sync, at most once per interval
            parts = [] if loss is None else [f"loss={loss:.4f}"]
            bad = sum(p.bad_records.values()) if p.get("bad_records") else 0
            if bad:  # online training: malformed records skipped by the stream
                parts.append(f"bad={bad}")
            preq = p.get("prequential")
            if preq and preq.get("auc") is not None:  # PrequentialMonitor's last report (online)
                parts.append(f"preq_auc={preq['auc']:.4f}")
            bar.draw(", ".join(parts) if parts else None)

    def on_train_epoch_end(self, run_context):
        bar = self._train
        if bar is None:
            return
        p = run_context.original_args()
        parts = []
        loss = loss_value(p.net_outputs)
        if loss is not None:
            parts.append(f"loss={loss:.4f}")
        for name, value in (p.eval_results or p.metrics or {}).items():
            parts.append(f"{name}={_fmt(value)}")
        bar.draw(", ".join(parts))
        self._close_train()

    def on_train_end(self, run_context):
        self._close_train()

    def on_eval_begin(self, run_context):
        if not self.show_eval:
            return
        p = run_context.original_args()
        self._close_eval()
        self._eval = _Bar(self._total(p), "Eval", p.cur_step_num or 0, self)

    def on_eval_step_end(self, run_context):
        bar = self._eval
        if bar is None:
            return
        bar.advance(run_context.original_args().cur_step_num)
        if bar.due(self.refresh_interval):
            bar.draw()

    def on_eval_end(self, run_context):
        bar = self._eval
        if bar is None:
            return
        metrics = run_context.original_args().metrics or {}
        bar.draw(", ".join(f"{k}={_fmt(v)}" for k, v in metrics.items()))
        self._close_eval()

    def _close_train(self) -> None:
        bar, self._train = self._train, None
        if bar is not None:
            bar.close()

    def _close_eval(self) -> None:
        bar, self._eval = self._eval, None
        if bar is not None:
            bar.close()

    def __exit__(self, *exc_info):
        # Also on an exception: leave the terminal with no dangling bar.
        self._close_eval()
        self._close_train()
        return None
