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

import torch

from .base import Callback
from .loss_monitor import loss_value


class History(Callback):
    """Per-epoch training loss and evaluation results; see the module docstring.

    The loss is kept as the device tensor it is and read when ``history`` is first looked at, so
    recording it costs training no host sync (`Model.train`/`fit` attach one to every run)."""

    called_in_fit_eval = False

    def __init__(self):
        self._records: list[tuple[object, dict]] = []  # (epoch's loss output, evaluation results)
        self._history: dict[str, list] = {}
        self.epoch: dict[str, list] | None = None

    @property
    def history(self) -> dict[str, list]:
        for net_outputs, results in self._records:  # the host reads happen here, once per epoch
            record = {"net_output": loss_value(net_outputs)}
            record.update(results)
            for key, value in record.items():
                self._history.setdefault(key, []).append(value)
        self._records.clear()
        return self._history

    def on_train_begin(self, run_context):
        self.epoch = {"epoch": []}

    def on_train_epoch_end(self, run_context):
        p = run_context.original_args()
        if self.epoch is None:  # driven without on_train_begin
            self.epoch = {"epoch": []}
        self.epoch["epoch"].append(p.cur_epoch_num if p.cur_epoch_num is not None else 1)
        outputs = p.net_outputs
        if isinstance(outputs, (tuple, list)) and outputs:
            outputs = outputs[0]
        if isinstance(outputs, torch.Tensor):
            outputs = outputs.detach().clone()  # a sink may reuse its loss buffer
        self._records.append((outputs, dict(p.eval_results or p.metrics or {})))
