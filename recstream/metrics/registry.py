"""Build metrics from names, as ``mindspore.train.get_metric_fn`` / ``get_metrics``."""
from __future__ import annotations

from recstream.metrics.auc import AUC
from recstream.metrics.base import Metric
from recstream.metrics.classification import F1, Accuracy, Precision, Recall
from recstream.metrics.confusion_matrix import ConfusionMatrix, ConfusionMatrixMetric
from recstream.metrics.cosine_similarity import CosineSimilarity
from recstream.metrics.losses import MAE, MSE, LogLoss, Loss
from recstream.metrics.roc import ROC
from recstream.metrics.topk import Top1CategoricalAccuracy, Top5CategoricalAccuracy, TopKCategoricalAccuracy
from recstream.metrics.torchmetrics_adapter import TorchMetric, is_torchmetric
from recstream.validation import check_type, describe

_METRICS = {
    "accuracy": Accuracy,
    "acc": Accuracy,
    "precision": Precision,
    "recall": Recall,
    "F1": F1,
    "f1": F1,
    "auc": AUC,
    "loss": Loss,
    "logloss": LogLoss,
    "mae": MAE,
    "mse": MSE,
    "top_1_accuracy": Top1CategoricalAccuracy,
    "top_5_accuracy": Top5CategoricalAccuracy,
    "topk": TopKCategoricalAccuracy,
    "roc": ROC,
    "confusion_matrix": ConfusionMatrix,
    "confusion_matrix_metric": ConfusionMatrixMetric,
    "cosine_similarity": CosineSimilarity,
}


def names() -> list[str]:
    """The registered metric names, sorted (``mindspore.train.names``).

    Example:
        >>> from recstream.metrics import names
        >>> "roc" in names() and "auc" in names()
        True
    """
    return sorted(_METRICS)


def get_metric_fn(name: str, *args, **kwargs) -> Metric:
    """Instantiate the metric registered under ``name`` with ``*args, **kwargs``.

    An unknown name is a ``KeyError`` (as in MindSpore); a name that is not a str, a ``TypeError``.

    Example:
        >>> from recstream.metrics import get_metric_fn
        >>> get_metric_fn("auc", from_logits=True).from_logits
        True
    """
    check_type("get_metric_fn", "name", name, str, allowed=f"a metric name, one of {names()}")
    if name not in _METRICS:
        raise KeyError(f"get_metric_fn: unknown metric name {name!r}; registered names: {names()}")
    return _METRICS[name](*args, **kwargs)


def get_metrics(metrics) -> dict[str, Metric]:
    """Normalise ``Model(metrics=...)`` into a ``{name: Metric}`` dict.

    ``metrics`` may be None (no metrics), a set/list/tuple of registered names, or a
    dict mapping any name to a [`Metric`][recstream.metrics.base.Metric] instance or a torchmetrics metric (wrapped in
    [`TorchMetric`][recstream.metrics.torchmetrics_adapter.TorchMetric]). Keys are the user's names.

    Example:
        >>> from recstream.metrics import AUC, get_metrics
        >>> sorted(get_metrics({"acc", "loss"}))
        ['acc', 'loss']
        >>> list(get_metrics({"my_auc": AUC()}))
        ['my_auc']
    """
    if metrics is None:
        return {}
    if isinstance(metrics, dict):
        out = {}
        for key, metric in metrics.items():
            if is_torchmetric(metric):
                metric = TorchMetric(metric)
            out[key] = check_type("get_metrics", f"metrics[{key!r}]", metric, Metric,
                                  allowed="a recstream.metrics.Metric or torchmetrics metric instance")
        return out
    if isinstance(metrics, (set, frozenset, list, tuple)):
        return {name: get_metric_fn(name) for name in metrics}
    hint = f" (wrap a single name in a set: {{{metrics!r}}})" if isinstance(metrics, str) else ""
    raise TypeError(
        "get_metrics: 'metrics' must be None, a set/list/tuple of names or a dict of name -> Metric, "
        f"got {describe(metrics)}{hint}"
    )
