"""`TorchMetric`: a torchmetrics metric used where recstream expects a `Metric`.

``Model(metrics={"auroc": torchmetrics.classification.BinaryAUROC()})`` works: `get_metrics` wraps
any torchmetrics object (duck-typed: ``update`` / ``compute`` / ``reset``, from the ``torchmetrics``
package) in this adapter, which maps ``update(y_pred, y)`` -> ``update(preds, target)``,
``eval()`` -> ``compute()`` (a Python float for a scalar, else the tensor), ``clear()`` ->
``reset()``. The torchmetrics object moves to the inputs' device at its first update. For its
classification metrics, float 0/1 labels (recstream's CTR labels) are passed as integers, as
they require. Across ranks, torchmetrics synchronises its own states in ``compute()``, so the
adapter's `state_dict` is empty (nothing for recstream to merge).

>>> import torch
>>> from torchmetrics.classification import BinaryAUROC
>>> m = TorchMetric(BinaryAUROC())
>>> m.clear(); m.update(torch.tensor([0.1, 0.9, 0.4]), torch.tensor([0.0, 1.0, 1.0])); m.eval()
1.0
"""
from __future__ import annotations

import torch

from .base import Metric


def is_torchmetric(obj) -> bool:
    """Whether `obj` is a torchmetrics metric (checked without importing torchmetrics)."""
    return type(obj).__module__.split(".")[0] == "torchmetrics" and all(
        callable(getattr(obj, name, None)) for name in ("update", "compute", "reset"))


class TorchMetric(Metric):
    """A torchmetrics metric behind recstream's `Metric` protocol; see the module docstring."""

    def __init__(self, metric):
        super().__init__()
        if not is_torchmetric(metric):
            raise TypeError(f"TorchMetric: 'metric' must be a torchmetrics metric, got {type(metric).__name__}")
        self.metric = metric
        self._integer_labels = type(metric).__module__.startswith("torchmetrics.classification")

    def clear(self):
        self.metric.reset()

    def update(self, *inputs):
        preds, target = self._select(inputs)[-2:]
        preds, target = torch.as_tensor(preds), torch.as_tensor(target)
        if getattr(self.metric, "device", preds.device) != preds.device:
            self.metric.to(preds.device)
        if self._integer_labels and target.is_floating_point():
            target = target.long()
        self.metric.update(preds.reshape(target.shape) if preds.numel() == target.numel() else preds, target)

    def eval(self):
        value = self.metric.compute()
        return float(value) if isinstance(value, torch.Tensor) and value.numel() == 1 else value

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        if state:
            raise ValueError("TorchMetric.load_state_dict: torchmetrics keeps its own states; expected {}")
