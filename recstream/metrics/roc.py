"""ROC curve points (`ROC`) and the trapezoid area under any curve (`auc`).

As ``mindspore.train.ROC`` and ``mindspore.train.auc``: the curve gives, for every distinct
score used as a threshold, the false and true positive rates, which is what a CTR team needs to
pick a decision threshold. ``auc(fpr, tpr)`` integrates those points with the trapezoid rule.
recstream's ``"auc"`` metric name ([`AUC`][recstream.metrics.auc.AUC]) is a different thing: a
streaming ROC-AUC in constant memory; use ``ROC`` + ``auc`` for the curve itself.
"""
from __future__ import annotations

import numpy as np
import torch

from recstream.metrics._inputs import check_num_inputs, to_tensor
from recstream.metrics.base import Metric
from recstream.validation import check_bool, check_int, describe


def _binary_curve(scores: torch.Tensor, hits: torch.Tensor):
    """(fps, tps, thresholds) at each distinct score, highest first (MindSpore's curve points)."""
    order = torch.argsort(scores, descending=True, stable=True)
    scores, hits = scores[order], hits[order].to(torch.float64)
    # the last position of each run of equal scores closes one threshold
    last = torch.nonzero(scores[1:] != scores[:-1]).reshape(-1)
    last = torch.cat([last, torch.tensor([scores.numel() - 1], device=scores.device)])
    tps = torch.cumsum(hits, 0)[last]
    fps = (last + 1).to(torch.float64) - tps
    return fps.cpu().numpy(), tps.cpu().numpy(), scores[last].cpu().numpy()


def _rates(scores: torch.Tensor, labels: torch.Tensor, positive: int):
    fps, tps, thresholds = _binary_curve(scores, labels == positive)
    fps, tps = np.concatenate([[0.0], fps]), np.concatenate([[0.0], tps])
    thresholds = np.concatenate([thresholds[:1] + 1, thresholds])
    if fps[-1] <= 0:
        raise ValueError(f"ROC.eval: y holds no negative sample for positive class {positive}, "
                         "so the false positive rate is undefined.")
    if tps[-1] <= 0:
        raise ValueError(f"ROC.eval: y holds no positive sample (class {positive}), "
                         "so the true positive rate is undefined.")
    return fps / fps[-1], tps / tps[-1], thresholds


class ROC(Metric):
    """ROC curve: false positive rates, true positive rates and the thresholds that give them.

    Args:
        class_num: classes of a multiclass y_pred (N, C); None: taken from y_pred. Must be 1
            (or None) when y_pred and y have the same number of dimensions (binary scores).
        pos_label: the positive class of binary scores (default 1); must be None for multiclass,
            where every class is in turn the positive one (one-vs-rest).

    ``update(y_pred, y)``: binary scores of any shape with labels of the same number of
    dimensions (both are flattened), or multiclass scores (N, C) with class indices (N,).
    Unlike MindSpore, which keeps only the last batch, every batch since ``clear()`` counts.

    ``eval()`` returns ``(fpr, tpr, thresholds)``, numpy arrays from the highest threshold
    (``max score + 1``: nothing positive) down; for multiclass, three lists with one array per class.

    Example:
        >>> from recstream.metrics import ROC, auc
        >>> metric = ROC(pos_label=2)
        >>> metric.update([3, 1, 4, 2], [0, 1, 2, 3])
        >>> fpr, tpr, thresholds = metric.eval()
        >>> fpr.round(4).tolist(), tpr.tolist(), thresholds.tolist()
        ([0.0, 0.0, 0.3333, 0.6667, 1.0], [0.0, 1.0, 1.0, 1.0, 1.0], [5, 4, 3, 2, 1])
        >>> float(auc(fpr, tpr))
        1.0
    """

    _state_names = ("scores", "labels", "layout")

    def __init__(self, class_num: int | None = None, pos_label: int | None = None):
        super().__init__()
        self.class_num = check_int("ROC", "class_num", class_num, minimum=1, allow_none=True)
        self.pos_label = check_int("ROC", "pos_label", pos_label, allow_none=True)
        self.clear()

    def clear(self):
        """Forget all batches."""
        self._scores, self._labels = [], []  # per-batch tensors, kept on their device
        self._layout = None  # (class count, positive label) fixed by the first batch
        self._reset_invalid()

    def update(self, *inputs):
        """Add one batch ``(y_pred, y)``; see the class docstring for the shapes."""
        inputs = self._select(inputs)
        check_num_inputs(inputs, 2, "ROC", "(y_pred, y)")
        y_pred = to_tensor(inputs[0], "y_pred", "ROC")
        y = to_tensor(inputs[1], "y", "ROC").to(y_pred.device)
        layout = self._layout_of(y_pred, y)
        if self._layout is not None and layout != self._layout:
            raise ValueError(f"ROC.update: the batch layout changed: first (classes, pos_label) = "
                             f"{self._layout}, now {layout}.")
        if layout[0] == 1:
            y_pred, y = y_pred.reshape(-1), y.reshape(-1)
        else:  # (N, C, d...) -> one row of C scores per position
            y_pred, y = y_pred.movedim(1, -1).reshape(-1, layout[0]), y.reshape(-1)
        if y_pred.shape[0] != y.shape[0]:
            raise ValueError(f"ROC.update: y_pred and y must hold the same number of samples, got "
                             f"{y_pred.shape[0]} and {y.shape[0]}.")
        self._layout = layout
        self._scores.append(y_pred)
        self._labels.append(y)

    def _layout_of(self, y_pred: torch.Tensor, y: torch.Tensor) -> tuple[int, int | None]:
        if y_pred.ndim == y.ndim:
            if self.class_num not in (None, 1):
                raise ValueError(f"ROC.update: y_pred and y have the same number of dimensions (binary scores), "
                                 f"so 'class_num' must be 1 or None, got {self.class_num}.")
            return 1, 1 if self.pos_label is None else self.pos_label
        if y_pred.ndim == y.ndim + 1 and y_pred.ndim >= 2:
            if self.pos_label is not None:
                raise ValueError(f"ROC.update: multiclass y_pred {tuple(y_pred.shape)} takes every class as the "
                                 f"positive one in turn, so 'pos_label' must be None, got {self.pos_label}.")
            if self.class_num is not None and self.class_num != y_pred.shape[1]:
                raise ValueError(f"ROC.update: 'class_num' is {self.class_num} but y_pred {tuple(y_pred.shape)} "
                                 f"has {y_pred.shape[1]} classes.")
            return y_pred.shape[1], None
        raise ValueError(f"ROC.update: y_pred must have as many dimensions as y, or one more (classes), got "
                         f"y_pred {tuple(y_pred.shape)} and y {tuple(y.shape)}.")

    def eval(self):
        """``(fpr, tpr, thresholds)``; see the class docstring."""
        if not self._scores:
            raise RuntimeError("ROC can not be calculated, because update() was not called since clear().")
        scores, labels = torch.cat(self._scores), torch.cat(self._labels)
        classes, positive = self._layout
        if classes == 1:
            return _rates(scores, labels, positive)
        curves = [_rates(scores[:, c], labels, c) for c in range(classes)]
        return tuple(list(points) for points in zip(*curves, strict=True))


def _as_curve(owner: str, name: str, values) -> np.ndarray:
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu().numpy()
    if not isinstance(values, (np.ndarray, list, tuple)):
        raise TypeError(f"{owner}: '{name}' must be a numpy.ndarray, list or torch.Tensor, got {describe(values)}")
    array = np.asarray(values, dtype=np.float64)
    if array.ndim == 1 or (array.ndim == 2 and array.shape[1] == 1):
        return array.reshape(-1)
    raise ValueError(f"{owner}: '{name}' must be 1-D or of shape (N, 1), got shape {array.shape}")


def auc(x, y, reorder: bool = False) -> float:
    """Area under the curve through the points ``(x[i], y[i])``, by the trapezoid rule.

    As ``mindspore.train.auc``: with ``reorder=False`` `x` must be non-decreasing or
    non-increasing (``ValueError`` otherwise); ``reorder=True`` sorts the points by x first.
    Typical use: ``auc(*ROC(...).eval()[:2])``.

    Example:
        >>> from recstream.metrics import auc
        >>> auc([0.0, 0.4, 0.4, 0.6, 1.0], [0.0, 0.0, 0.25, 0.75, 1.0])
        0.45
    """
    x, y = _as_curve("auc", "x", x), _as_curve("auc", "y", y)
    check_bool("auc", "reorder", reorder)
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"auc: 'x' and 'y' must hold the same number of points, got {x.shape[0]} and {y.shape[0]}")
    if x.shape[0] < 2:
        raise ValueError(f"auc: a curve needs at least 2 points, got {x.shape[0]}")
    direction = 1.0
    if reorder:
        order = np.lexsort((y, x))
        x, y = x[order], y[order]
    else:
        dx = np.diff(x)
        if np.any(dx < 0):
            if not np.all(dx <= 0):
                raise ValueError(f"auc: 'x' must be non-decreasing or non-increasing (or pass reorder=True), got {x}")
            direction = -1.0
    return float(direction * np.trapezoid(y, x))
