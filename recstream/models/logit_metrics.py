"""Metrics for models that output logits (every model of `recstream.models`).

`ctr_metrics` gives ``{"auc": AUC(from_logits=True), "logloss": OnProbabilities(LogLoss())}``
for ``Model(metrics=...)``. `OnProbabilities` adapts any probability metric
(``LogLoss``, ``Accuracy``, ``Precision``...) to logits by applying a sigmoid first.
AUC needs no sigmoid: it is rank-based, and binning logits avoids float32 saturation.

>>> import torch
>>> m = ctr_metrics()
>>> logits, labels = torch.tensor([-2.0, 0.5, 3.0]), torch.tensor([0.0, 1.0, 1.0])
>>> {k: round(v(logits, labels), 4) for k, v in m.items()}
{'auc': 1.0, 'logloss': 0.2165}
"""
from __future__ import annotations

import numpy as np
import torch

from ..metrics import AUC, LogLoss, Metric


class OnProbabilities(Metric):
    """Wrap `metric` so that ``update(logits, y)`` feeds it ``(sigmoid(logits), y)``.

    The sigmoid runs in float32 at least (float16 would round probabilities near 1).
    """

    def __init__(self, metric: Metric) -> None:
        super().__init__()
        if not isinstance(metric, Metric):
            raise TypeError(f"OnProbabilities: 'metric' must be a recstream.metrics.Metric, "
                            f"got {type(metric).__name__}")
        self.metric = metric

    def clear(self):
        self.metric.clear()

    def update(self, *inputs):
        inputs = self._select(inputs)
        if len(inputs) != 2:
            raise ValueError(f"OnProbabilities.update: expected (y_pred, y), got {len(inputs)} inputs")
        logits = inputs[0]
        if not isinstance(logits, torch.Tensor):
            logits = torch.as_tensor(np.asarray(logits))
        logits = logits.detach()
        if logits.dtype not in (torch.float32, torch.float64):
            logits = logits.float()
        self.metric.update(torch.sigmoid(logits), inputs[1])

    def eval(self):
        return self.metric.eval()

    def state_dict(self) -> dict:
        return self.metric.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.metric.load_state_dict(state)

    def __repr__(self) -> str:
        return f"OnProbabilities({type(self.metric).__name__})"


def ctr_metrics() -> dict[str, Metric]:
    """Fresh ``{"auc", "logloss"}`` metrics for logit outputs."""
    return {"auc": AUC(from_logits=True), "logloss": OnProbabilities(LogLoss())}
