"""ConfusionMatrix and ConfusionMatrixMetric, as ``mindspore.train``'s.

`ConfusionMatrix` counts (true class, predicted class) pairs; `ConfusionMatrixMetric` turns
per-class true/false positive/negative counts into one rate (sensitivity, precision, false
positive rate, ...). Both count on the inputs' device; ``eval`` reads the counts back.
"""
from __future__ import annotations

import numpy as np
import torch

from recstream.metrics._inputs import accumulator_dtype, binary_labels, check_num_inputs, class_labels, to_tensor
from recstream.metrics.base import Metric
from recstream.validation import check_bool, check_choice, check_int, check_number, check_str, check_type

NORMALIZE = ("no_norm", "target", "prediction", "all")
DECREASE = ("none", "mean", "sum", "mean_batch", "sum_batch", "mean_channel", "sum_channel")


def _pair(metric: Metric, inputs: tuple, owner: str) -> tuple[torch.Tensor, torch.Tensor]:
    inputs = metric._select(inputs)
    check_num_inputs(inputs, 2, owner, "(y_pred, y)")
    y_pred = to_tensor(inputs[0], "y_pred", owner)
    return y_pred, to_tensor(inputs[1], "y", owner).to(y_pred.device)


class ConfusionMatrix(Metric):
    """Confusion matrix: ``matrix[i, j]`` counts samples of true class i predicted as class j.

    Args:
        num_classes: number of classes C.
        normalize: ``"no_norm"`` (counts), ``"target"`` (each row sums to 1), ``"prediction"``
            (each column sums to 1) or ``"all"`` (the matrix sums to 1); empty rows/columns give 0.
        threshold: a float; float y_pred of y's shape predicts class 1 where ``y_pred >= threshold``.

    ``update(y_pred, y)``: y class indices (N, ...); y_pred class indices of the same shape, float
    scores of that shape (thresholded), or scores (N, C, ...) whose argmax over axis 1 is the class.

    Example:
        >>> from recstream.metrics import ConfusionMatrix
        >>> metric = ConfusionMatrix(num_classes=2)
        >>> metric.update([1, 0, 1, 0], [1, 0, 0, 1])
        >>> metric.eval()
        array([[1., 1.],
               [1., 1.]])
        >>> ConfusionMatrix(2, normalize="target")([0.9, 0.2, 0.7], [1, 0, 0])
        array([[0.5, 0.5],
               [0. , 1. ]])
    """

    _state_names = ("matrix",)

    def __init__(self, num_classes: int, normalize: str = "no_norm", threshold: float = 0.5):
        super().__init__()
        self.num_classes = check_int("ConfusionMatrix", "num_classes", num_classes, minimum=1)
        self.normalize = check_choice("ConfusionMatrix", "normalize", normalize, NORMALIZE)
        # MindSpore accepts only a float here (threshold=1 is a TypeError there too).
        check_type("ConfusionMatrix", "threshold", threshold, float)
        self.threshold = check_number("ConfusionMatrix", "threshold", threshold)
        self.clear()

    def clear(self):
        """Reset the counts."""
        self._matrix = None  # int64 (C * C,) on the inputs' device
        self._reset_invalid()

    def update(self, *inputs):
        """Add one batch ``(y_pred, y)``; see the class docstring for the shapes."""
        y_pred, y = _pair(self, inputs, "ConfusionMatrix")
        if y_pred.ndim == y.ndim + 1:
            y_pred = y_pred.argmax(dim=1)
        elif y_pred.ndim != y.ndim:
            raise ValueError(f"ConfusionMatrix.update: y_pred must have as many dimensions as y, or one more "
                             f"(classes), got y_pred {tuple(y_pred.shape)} and y {tuple(y.shape)}.")
        elif y_pred.is_floating_point():
            y_pred = (y_pred >= self.threshold).long()
        if y_pred.shape != y.shape:
            raise ValueError(f"ConfusionMatrix.update: y_pred must give one class per label, got classes of "
                             f"shape {tuple(y_pred.shape)} for y of shape {tuple(y.shape)}.")
        c = self.num_classes
        labels, bad_y = class_labels(y.reshape(-1), c)
        predicted, bad_pred = class_labels(y_pred.reshape(-1), c)
        self._flag_invalid("y", y, bad_y, f"y must be class indices in [0, {c})")
        self._flag_invalid("y_pred", y_pred, bad_pred, f"predicted classes must be in [0, {c})")
        if self._matrix is None:
            self._matrix = torch.zeros(c * c, dtype=torch.int64, device=labels.device)
        # index_add_ rather than bincount: CUDA bincount reads the max back to size its output.
        self._matrix.index_add_(0, labels * c + predicted, torch.ones_like(labels))

    def eval(self) -> np.ndarray:
        """The (C, C) matrix as float64, normalised as configured."""
        if self._matrix is None:
            raise RuntimeError("ConfusionMatrix can not be calculated, because update() was not called "
                               "since clear().")
        self._raise_invalid()
        matrix = self._matrix.cpu().double().numpy().reshape(self.num_classes, self.num_classes)
        if self.normalize == "no_norm":
            return matrix
        totals = {"target": matrix.sum(axis=1, keepdims=True), "prediction": matrix.sum(axis=0, keepdims=True),
                  "all": matrix.sum()}[self.normalize]
        return np.divide(matrix, totals, out=np.zeros_like(matrix), where=np.broadcast_to(totals, matrix.shape) > 0)


# metric name (spaces or underscores, any case) -> short name, MindSpore's list and aliases
_ALIASES = {
    "tpr": ("sensitivity", "recall", "hit_rate", "true_positive_rate"),
    "tnr": ("specificity", "selectivity", "true_negative_rate"),
    "ppv": ("precision", "positive_predictive_value"),
    "npv": ("negative_predictive_value",),
    "fnr": ("miss_rate", "false_negative_rate"),
    "fpr": ("fall_out", "false_positive_rate"),
    "fdr": ("false_discovery_rate",),
    "for": ("false_omission_rate",),
    "pt": ("prevalence_threshold",),
    "ts": ("threat_score", "critical_success_index", "csi"),
    "acc": ("accuracy",),
    "ba": ("balanced_accuracy",),
    "f1": ("f1_score",),
    "mcc": ("matthews_correlation_coefficient",),
    "fm": ("fowlkes_mallows_index",),
    "bm": ("informedness", "bookmaker_informedness"),
    "mk": ("markedness", "deltap"),
}
METRIC_NAMES = {alias: short for short, aliases in _ALIASES.items() for alias in (short, *aliases)}


class UnknownMetricName(NotImplementedError, ValueError):
    """An unknown ``metric_name``: MindSpore raises NotImplementedError; by recstream's rule it is a
    wrong value, so it is a ValueError as well."""


def _ratio(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """num / den, NaN where den is 0 (an undefined rate, as MindSpore)."""
    return torch.where(den != 0, num / torch.where(den != 0, den, torch.ones_like(den)), torch.nan)


def rate(short: str, counts: torch.Tensor) -> torch.Tensor:
    """The rate `short` from ``counts[..., (tp, fp, tn, fn)]`` (float64), NaN where undefined."""
    tp, fp, tn, fn = counts.unbind(-1)
    p, n = tp + fn, fp + tn
    tpr, tnr, ppv, npv = _ratio(tp, p), _ratio(tn, n), _ratio(tp, tp + fp), _ratio(tn, tn + fn)
    one = torch.ones_like(tp)
    formulas = {
        "tpr": lambda: tpr, "tnr": lambda: tnr, "ppv": lambda: ppv, "npv": lambda: npv,
        "fnr": lambda: _ratio(fn, p), "fpr": lambda: _ratio(fp, n),
        "fdr": lambda: _ratio(fp, fp + tp), "for": lambda: _ratio(fn, fn + tn),
        "pt": lambda: _ratio(torch.sqrt(tpr * (1 - tnr)) + tnr - 1, tpr + tnr - 1),
        "ts": lambda: _ratio(tp, tp + fn + fp), "acc": lambda: _ratio(tp + tn, p + n),
        "ba": lambda: (tpr + tnr) / 2, "f1": lambda: _ratio(2 * tp, 2 * tp + fn + fp),
        "mcc": lambda: _ratio(tp * tn - fp * fn, torch.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))),
        "fm": lambda: torch.sqrt(ppv * tpr), "bm": lambda: tpr + tnr - one, "mk": lambda: ppv + npv - one,
    }
    return formulas[short]()


def _reduce(chart: torch.Tensor, decrease: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(reduced values, how many defined values each holds) of a (batch, class) chart with NaNs."""
    defined = (~torch.isnan(chart)).to(chart.dtype)
    chart = torch.nan_to_num(chart, nan=0.0)

    def mean(values, counts):
        return torch.where(counts > 0, values / torch.where(counts > 0, counts, 1), 0), counts

    if decrease == "mean":  # mean over classes per sample, then over the samples that have one
        per_sample, counts = mean(chart.sum(1), defined.sum(1))
        return mean(per_sample.sum(), (counts > 0).to(chart.dtype).sum())
    if decrease == "sum":
        return chart.sum(), defined.sum()
    if decrease in ("mean_batch", "sum_batch"):
        values, counts = chart.sum(0), defined.sum(0)
    elif decrease in ("mean_channel", "sum_channel"):
        values, counts = chart.sum(1), defined.sum(1)
    else:  # "none"
        return chart, defined
    return mean(values, counts) if decrease.startswith("mean") else (values, counts)


class ConfusionMatrixMetric(Metric):
    """A rate computed from true/false positives/negatives, per class of one-hot data.

    Args:
        skip_channel: as in MindSpore, ``True`` counts every channel (class) and ``False``
            leaves out the first one (e.g. a background class).
        metric_name: ``"sensitivity"``/``"tpr"``, ``"specificity"``, ``"precision"``,
            ``"false positive rate"``/``"fpr"``, ``"accuracy"``, ``"f1 score"``, ... (MindSpore's
            list and aliases; spaces or underscores, any case). An unknown name raises
            ``NotImplementedError`` (as MindSpore), which is also a ``ValueError``.
        calculation_method: False: add up the counts of all samples, then compute the rate once.
            True: compute the rate per sample and class, then reduce with `decrease`.
        decrease: ``"none"``, ``"mean"``, ``"sum"``, ``"mean_batch"``, ``"sum_batch"``,
            ``"mean_channel"`` or ``"sum_channel"`` (used with ``calculation_method=True``).

    ``update(y_pred, y)``: 0/1 tensors of the same shape (N, C, ...), class on axis 1 (e.g. a
    thresholded click prediction and its label as two one-hot columns).

    ``eval()``: with ``calculation_method=False`` a numpy array holding the one rate (NaN when
    undefined); with True, the mean of the per-batch reduced values over the defined ones.

    Example:
        >>> from recstream.metrics import ConfusionMatrixMetric
        >>> metric = ConfusionMatrixMetric(metric_name="tpr")
        >>> metric.update([[[0], [1]], [[1], [0]]], [[[0], [1]], [[0], [1]]])
        >>> metric.eval()
        array([0.5])
    """

    _state_names = ("counts", "total", "defined")

    def __init__(self, skip_channel: bool = True, metric_name: str = "sensitivity",
                 calculation_method: bool = False, decrease: str = "mean"):
        super().__init__()
        owner = "ConfusionMatrixMetric"
        self.skip_channel = check_bool(owner, "skip_channel", skip_channel)
        self.calculation_method = check_bool(owner, "calculation_method", calculation_method)
        self.metric_name = check_str(owner, "metric_name", metric_name)
        self.decrease = check_choice(owner, "decrease", decrease, DECREASE)
        key = metric_name.strip().lower().replace(" ", "_")
        if key not in METRIC_NAMES:
            raise UnknownMetricName(f"{owner}: 'metric_name' must be one of {sorted(METRIC_NAMES)} "
                                    f"(spaces or underscores, any case), got {metric_name!r}")
        self._short = METRIC_NAMES[key]
        self.clear()

    def clear(self):
        """Reset the counts."""
        self._counts = None  # calculation_method=False: (tp, fp, tn, fn) summed, float64 on the device
        self._total = self._defined = None  # calculation_method=True: sums of reduced values and of their counts
        self._reset_invalid()

    def update(self, *inputs):
        """Add one batch ``(y_pred, y)`` of 0/1 values; see the class docstring."""
        y_pred, y = _pair(self, inputs, "ConfusionMatrixMetric")
        if y_pred.ndim < 2 or y_pred.shape != y.shape:
            raise ValueError(f"ConfusionMatrixMetric.update: y_pred and y must have the same shape (N, C, ...), "
                             f"got y_pred {tuple(y_pred.shape)} and y {tuple(y.shape)}.")
        if not self.skip_channel and y.shape[1] > 1:
            y_pred, y = y_pred[:, 1:], y[:, 1:]
        pred, bad_pred = binary_labels(y_pred)
        truth, bad_y = binary_labels(y)
        self._flag_invalid("y_pred", y_pred, bad_pred, "y_pred must be 0 or 1")
        self._flag_invalid("y", y, bad_y, "y must be 0 or 1")
        counts = self._per_sample_counts(pred, truth)
        if not self.calculation_method:
            self._accumulate("_counts", counts.sum(dim=(0, 1)))
            return
        values, defined = _reduce(rate(self._short, counts), self.decrease)
        if self._total is not None and values.shape != self._total.shape:
            raise ValueError(f"ConfusionMatrixMetric.update: decrease={self.decrease!r} gives values of shape "
                             f"{tuple(values.shape)} for this batch but {tuple(self._total.shape)} before.")
        self._accumulate("_total", values * defined)
        self._accumulate("_defined", defined)

    @staticmethod
    def _per_sample_counts(pred: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
        """(N, C, 4) counts of (tp, fp, tn, fn) over each sample's positions, as float64."""
        n, c = pred.shape[:2]
        pred, truth = pred.reshape(n, c, -1), truth.reshape(n, c, -1)
        dtype = accumulator_dtype(pred.device)
        tp = (pred & truth).sum(2).to(dtype)
        tn = (~pred & ~truth).sum(2).to(dtype)
        positives = truth.sum(2).to(dtype)
        fn, fp = positives - tp, (truth.shape[2] - positives) - tn
        return torch.stack([tp, fp, tn, fn], dim=-1)

    def eval(self):
        """The rate; see the class docstring."""
        if self._counts is None and self._total is None:
            raise RuntimeError("ConfusionMatrixMetric can not be calculated, because update() was not called "
                               "since clear().")
        self._raise_invalid()
        if not self.calculation_method:
            return rate(self._short, self._counts.cpu().double()[None]).numpy()
        total, defined = self._total.cpu().double().numpy(), self._defined.cpu().double().numpy()
        return np.divide(total, defined, out=np.full_like(total, np.nan), where=defined > 0)
