"""History: record the training loss and evaluation results of every epoch (MindSpore's).

After training, ``history.history`` maps ``"net_output"`` to the per-epoch training loss (the
epoch's last step, as a float; the first element when the network returns a tuple) and each
evaluation result name (``fit``'s ``eval_results``: metrics and ``eval_loss``) to its values;
``history.epoch`` is ``{"epoch": [1, 2, ...]}`` as in MindSpore. Evaluation results only exist on
epochs that ``fit`` evaluated, so their lists can be shorter than ``"net_output"``.

>>> h = History()
>>> h.history
{}
"""
from __future__ import annotations

from .base import Callback
from .loss_monitor import loss_value


class History(Callback):
    """Per-epoch training loss and evaluation results; see the module docstring."""

    called_in_fit_eval = False

    def __init__(self):
        self.history: dict[str, list] = {}
        self.epoch: dict[str, list] | None = None

    def on_train_begin(self, run_context):
        self.epoch = {"epoch": []}

    def on_train_epoch_end(self, run_context):
        p = run_context.original_args()
        if self.epoch is None:  # driven without on_train_begin
            self.epoch = {"epoch": []}
        self.epoch["epoch"].append(p.cur_epoch_num if p.cur_epoch_num is not None else 1)
        record = {"net_output": loss_value(p.net_outputs)}  # one host sync per epoch
        results = p.eval_results or p.metrics
        if results:
            record.update(results)
        for key, value in record.items():
            self.history.setdefault(key, []).append(value)
