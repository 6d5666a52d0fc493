"""Training and evaluation metrics with ``mindspore.train``'s API, on plain torch.

Every metric has ``clear()``, ``update(*inputs)`` and ``eval()``; calling it runs all
three on one batch. Inputs may be torch tensors on any device and in any float dtype,
numpy arrays or lists. ``update`` never synchronises with the device (counts and
sums stay on it as tensors) so metrics can run inside a training loop without
stalling it; ``eval`` reads the result back. Accumulators can be checkpointed with
``state_dict()`` / ``load_state_dict()``.

Example:
    >>> import torch
    >>> from recstream.metrics import get_metrics
    >>> metrics = get_metrics({"auc", "logloss"})
    >>> probs, labels = torch.tensor([0.1, 0.7, 0.4, 0.8]), torch.tensor([0, 1, 0, 1])
    >>> for m in metrics.values():
    ...     m.clear()
    ...     m.update(probs, labels)
    >>> metrics["auc"].eval()
    1.0
"""
from recstream.metrics.auc import AUC, exact_auc
from recstream.metrics.base import Metric, rearrange_inputs
from recstream.metrics.classification import F1, Accuracy, Fbeta, Precision, Recall
from recstream.metrics.confusion_matrix import ConfusionMatrix, ConfusionMatrixMetric
from recstream.metrics.cosine_similarity import CosineSimilarity
from recstream.metrics.losses import MAE, MSE, LogLoss, Loss
from recstream.metrics.registry import get_metric_fn, get_metrics, names
from recstream.metrics.roc import ROC, auc
from recstream.metrics.topk import (
    Top1CategoricalAccuracy,
    Top5CategoricalAccuracy,
    TopKCategoricalAccuracy,
)

__all__ = [
    "Metric",
    "rearrange_inputs",
    "Accuracy",
    "Precision",
    "Recall",
    "Fbeta",
    "F1",
    "AUC",
    "exact_auc",
    "LogLoss",
    "Loss",
    "MAE",
    "MSE",
    "TopKCategoricalAccuracy",
    "Top1CategoricalAccuracy",
    "Top5CategoricalAccuracy",
    "ROC",
    "auc",
    "ConfusionMatrix",
    "ConfusionMatrixMetric",
    "CosineSimilarity",
    "get_metric_fn",
    "get_metrics",
    "names",
]
