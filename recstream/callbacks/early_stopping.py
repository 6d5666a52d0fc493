"""EarlyStopping: stop training when a monitored quantity stops improving (MindSpore's rules).

At each ``on_train_epoch_end`` the monitored value (``"loss"`` = training loss,
otherwise ``eval_results``/``metrics`` from ``fit``) is compared with the best so far. The wait
counter goes up by one each epoch and back to 0 on an improvement (better than best by more
than `min_delta`, and better than `baseline` if one is given); when it reaches `patience`,
training stops. As in MindSpore, ``patience=0`` therefore stops after the first monitored epoch.
``restore_best_weights`` loads the best epoch's network weights back when stopping.

>>> stop = EarlyStopping(monitor="auc", patience=2, min_delta=1e-3)
>>> stop.mode
'max'
"""
from __future__ import annotations

import math

from ..validation import check_bool, check_choice, check_int, check_number, check_str
from ._monitoring import MODES, MonitorReader, is_improvement
from .base import Callback
from .console import say


class EarlyStopping(Callback):
    """Stop when `monitor` has not improved for `patience` epochs; see the module docstring.

    Attributes after a run: ``best`` (best value), ``wait``, ``stopped_epoch`` (0 if not stopped).
    """

    called_in_fit_eval = False

    def __init__(self, monitor: str = "eval_loss", min_delta: float = 0, patience: int = 0, verbose: bool = False,
                 mode: str = "auto", baseline: float | None = None, restore_best_weights: bool = False):
        owner = "EarlyStopping"
        self.monitor = check_str(owner, "monitor", monitor)
        self._reader = MonitorReader(monitor, owner)
        self.min_delta = abs(check_number(owner, "min_delta", min_delta))
        self.patience = check_int(owner, "patience", patience, minimum=0)
        self.verbose = check_bool(owner, "verbose", verbose)
        self.mode = self._reader.mode(check_choice(owner, "mode", mode, MODES))
        self.baseline = check_number(owner, "baseline", baseline, allow_none=True)
        self.restore_best_weights = check_bool(owner, "restore_best_weights", restore_best_weights)
        self._reset()

    def _reset(self) -> None:
        self.wait = 0
        self.stopped_epoch = 0
        self.best = math.inf if self.mode == "min" else -math.inf
        self.best_weights = None

    def on_train_begin(self, run_context):
        self._reset()

    def on_train_epoch_end(self, run_context):
        p = run_context.original_args()
        current = self._reader.read(p)
        if current is None:
            return
        network = p.network if p.network is not None else p.train_network
        self.wait += 1
        if is_improvement(self.mode, current, self.best, self.min_delta):
            self.best = current
            if self.restore_best_weights and network is not None:
                # A copy, not references: the live tensors keep changing in place.
                self.best_weights = {k: v.detach().clone() for k, v in network.state_dict().items()}
            if self.baseline is None or is_improvement(self.mode, current, self.baseline, self.min_delta):
                self.wait = 0
        if self.wait >= self.patience:
            self.stopped_epoch = p.cur_epoch_num or 0
            run_context.request_stop()
            if self.restore_best_weights and self.best_weights is not None and network is not None:
                if self.verbose:
                    say("Restoring model weights from the end of the best epoch.")
                network.load_state_dict(self.best_weights)

    def on_train_end(self, run_context):
        if self.stopped_epoch > 0 and self.verbose:
            say(f"Epoch {self.stopped_epoch:05d}: early stopping")
