"""Classification metrics: Accuracy, and Precision, Recall, Fbeta and F1 over per-class counts.

All of them read ``update(y_pred, y)`` the same way (see `Accuracy`): (N, C) scores
whose argmax is the predicted class, binary (N,)/(N, 1) probabilities compared with
``threshold``, or, with ``eval_type="multilabel"``, (N, C) scores against 0/1 label rows.
The first batch fixes the layout (class count or binary); a later batch with another
layout is an error, because counts of different class sets cannot be added.
"""
from __future__ import annotations

import numpy as np
import torch

from recstream.metrics._inputs import (
    check_eval_type,
    decode_classification,
    decode_multilabel,
    prediction_pair,
)
from recstream.metrics.base import Metric
from recstream.validation import check_bool, check_number


def _check_layout(owner: str, first, layout) -> None:
    """Reject a batch whose layout differs from the first batch's."""
    if first is not None and layout != first:
        raise ValueError(
            f"{owner}.update: y_pred layout changed between batches: first "
            f"{first!r} (class count or 'binary'), now {layout!r}."
        )


class Accuracy(Metric):
    """Fraction of correct predictions, as ``mindspore.train.Accuracy``.

    Args:
        eval_type: ``"classification"`` (one label per sample) or ``"multilabel"``; anything
            else is a ``TypeError``, as in MindSpore.
        threshold: for binary (N,)/(N, 1) probabilities and for multilabel scores,
            a score above ``threshold`` predicts the positive class / label.

    ``update(y_pred, y)`` inputs (tensors on any device, numpy arrays or lists):

    * classification, y_pred (N, C) with C >= 2: predicted class is ``argmax``; y is
      class indices (N,) or one-hot (N, C). A y of y_pred's shape must really be one-hot
      (0s and a single 1 per sample), as MindSpore requires: ``eval`` raises ``ValueError``
      otherwise. Extra trailing dims (N, C, d...) with y (N, d...) count every position.
    * classification, y_pred (N,) or (N, 1): probabilities of the positive class;
      y holds 0/1 labels of shape (N,) or (N, 1).
    * multilabel, y_pred and y (N, C): a row is correct only if every label matches.

    ``eval()`` returns a Python float.

    Example:
        >>> from recstream.metrics import Accuracy
        >>> metric = Accuracy()
        >>> metric.update([[0.2, 0.5], [0.3, 0.1], [0.9, 0.6]], [1, 0, 1])
        >>> round(metric.eval(), 4)
        0.6667
        >>> Accuracy()([0.9, 0.2, 0.7], [1, 0, 0])  # binary probabilities
        0.6666666666666666
    """

    _state_names = ("correct", "total", "layout")

    def __init__(self, eval_type: str = "classification", threshold: float = 0.5):
        super().__init__()
        self.eval_type = check_eval_type("Accuracy", eval_type)
        self.threshold = check_number("Accuracy", "threshold", threshold)
        self.clear()

    def clear(self):
        """Reset the correct and total counts."""
        self._correct = None  # int64 tensor on the inputs' device
        self._total = 0  # shapes are host metadata, so this stays a Python int
        self._layout = None  # "binary" or the class count, fixed by the first batch
        self._reset_invalid()

    def update(self, *inputs):
        """Add one batch ``(y_pred, y)``; see the class docstring for the shapes."""
        y_pred, y = prediction_pair(self, inputs, "Accuracy")
        if self.eval_type == "classification":
            pred, labels, checks, layout = decode_classification(y_pred, y, self.threshold, "Accuracy")
            correct = pred == labels
        else:
            pred, labels, bad, layout = decode_multilabel(y_pred, y, self.threshold, "Accuracy")
            correct = (pred == labels).all(dim=1)
            checks = [("y", y, bad, "multilabel y must be 0 or 1")]
        _check_layout("Accuracy", self._layout, layout)
        self._layout = layout
        for check in checks:
            self._flag_invalid(*check)
        self._accumulate("_correct", correct.sum())
        self._total += correct.numel()

    def eval(self) -> float:
        """Correct / total over all batches since the last ``clear()``."""
        if self._total == 0:
            raise RuntimeError(
                "Accuracy can not be calculated, because the number of samples is 0; "
                "call update() with a non-empty batch before eval()."
            )
        self._raise_invalid()
        return int(self._correct) / self._total


def safe_ratio(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    """numerator / denominator with 0 where the denominator is 0, and no warning.

    MindSpore adds ``sys.float_info.min`` to the denominator, which gives the same
    values (x / (d + tiny) == x / d for d >= 1 in float64, and 0 for x = d = 0).
    """
    numerator = np.asarray(numerator, dtype=np.float64)
    out = np.zeros(np.broadcast(numerator, denominator).shape, dtype=np.float64)
    return np.divide(numerator, denominator, out=out, where=np.asarray(denominator) > 0)


class ClassCountMetric(Metric):
    """Counts, per class, true positives, predictions and actual occurrences.

    The shared accumulator behind `Precision`, `Recall` and `Fbeta`.
    Classification accumulates three int64 vectors of length C (binary probabilities
    are two classes, class 1 = score > threshold). Multilabel follows MindSpore: the
    values are per *sample* (each row's own true positives, predicted and actual
    labels), kept as a list of per-batch tensors.
    """

    _state_names = ("layout", "tp", "predicted", "actual", "rows")
    _name = "ClassCountMetric"

    def __init__(self, eval_type: str = "classification", threshold: float = 0.5):
        super().__init__()
        self.eval_type = check_eval_type(self._name, eval_type)
        self.threshold = check_number(self._name, "threshold", threshold)
        self.clear()

    def clear(self):
        """Reset all counts."""
        self._layout = None  # "binary" or the class count, fixed by the first batch
        self._tp = self._predicted = self._actual = None
        self._rows = []  # multilabel: (tp, predicted, actual) per row, one (3, R) tensor a batch
        self._reset_invalid()

    def update(self, *inputs):
        """Add one batch ``(y_pred, y)``: scores (N, C) or binary (N,)/(N, 1), labels as for Accuracy."""
        y_pred, y = prediction_pair(self, inputs, self._name)
        if self.eval_type == "multilabel":
            pred, labels, bad, layout = decode_multilabel(y_pred, y, self.threshold, self._name)
            _check_layout(self._name, self._layout, layout)
            self._layout = layout
            self._flag_invalid("y", y, bad, "multilabel y must be 0 or 1")
            counts = torch.stack([(pred & labels).sum(1), pred.sum(1), labels.sum(1)])
            self._rows.append(counts)
            return
        pred, labels, checks, layout = decode_classification(y_pred, y, self.threshold, self._name)
        _check_layout(self._name, self._layout, layout)
        self._layout = layout
        for check in checks:
            self._flag_invalid(*check)
        pred, labels = pred.reshape(-1), labels.reshape(-1)
        if self._tp is None:
            num_classes = 2 if layout == "binary" else layout
            zeros = torch.zeros(num_classes, dtype=torch.int64, device=pred.device)
            self._tp, self._predicted, self._actual = zeros, zeros.clone(), zeros.clone()
        device = self._tp.device
        pred, labels = pred.to(device), labels.to(device)
        # index_add_ rather than bincount: CUDA bincount reads the max back to size its output.
        ones = torch.ones_like(pred)
        self._predicted.index_add_(0, pred, ones)
        self._actual.index_add_(0, labels, ones)
        self._tp.index_add_(0, labels, (pred == labels).long())

    def _counts(self):
        """(tp, predicted, actual) as float64 numpy arrays; raises if nothing was added."""
        if self._layout is None or (self.eval_type == "multilabel" and not self._rows):
            raise RuntimeError(
                f"{self._name} can not be calculated, because the number of samples is 0; "
                "call update() with a non-empty batch before eval()."
            )
        self._raise_invalid()
        if self.eval_type == "multilabel":
            rows = torch.cat([r.cpu() for r in self._rows], dim=1).double().numpy()
            return rows[0], rows[1], rows[2]
        return tuple(t.cpu().double().numpy() for t in (self._tp, self._predicted, self._actual))

    def _finish(self, values: np.ndarray, average):
        """Per-class array (or positive-class float for binary data), or their mean."""
        check_bool(f"{self._name}.eval", "average", average)
        if average:
            return float(values.mean())
        if self._layout == "binary":
            return float(values[1])
        return values

    def _check_state(self, state: dict) -> None:
        if not isinstance(state["rows"], list):
            raise TypeError(
                f"{self._name}.load_state_dict: state['rows'] must be a list, "
                f"got {type(state['rows']).__name__}."
            )


class Precision(ClassCountMetric):
    """Precision as ``mindspore.train.Precision``: TP / (TP + FP) for every class.

    Args:
        eval_type: ``"classification"`` or ``"multilabel"``.
        threshold: a binary (N,)/(N, 1) or multilabel score above it is a positive.

    ``update(y_pred, y)`` takes the same inputs as `Accuracy`. ``eval(average=False)``:

    * (N, C) scores: numpy array of per-class precision (class = argmax of y_pred);
      a class that was never predicted gets 0.
    * binary (N,)/(N, 1) probabilities: the positive class's precision, a float.
    * multilabel: like MindSpore, a numpy array with one value per sample.

    ``eval(average=True)`` returns the mean of those values (for binary data, of both
    classes) as a float.

    Example:
        >>> from recstream.metrics import Precision
        >>> metric = Precision()
        >>> metric.update([[0.2, 0.5], [0.3, 0.1], [0.9, 0.6]], [1, 0, 1])
        >>> metric.eval()
        array([0.5, 1. ])
        >>> metric.eval(average=True)
        0.75
        >>> Precision()([0.9, 0.8, 0.1], [1, 0, 1])  # binary: positive-class precision
        0.5
    """

    _name = "Precision"

    def eval(self, average: bool = False):
        """Per-class precision (see class docstring), or their mean if ``average``."""
        tp, predicted, _ = self._counts()
        return self._finish(safe_ratio(tp, predicted), average)


class Recall(ClassCountMetric):
    """Recall as ``mindspore.train.Recall``: TP / (TP + FN) for every class.

    Args:
        eval_type: ``"classification"`` or ``"multilabel"``.
        threshold: a binary (N,)/(N, 1) or multilabel score above it is a positive.

    Inputs and return values follow `Precision`; a class absent from y gets 0.

    Example:
        >>> from recstream.metrics import Recall
        >>> metric = Recall()
        >>> metric.update([[0.2, 0.5], [0.3, 0.1], [0.9, 0.6]], [1, 0, 1])
        >>> metric.eval()
        array([1. , 0.5])
        >>> Recall()([0.9, 0.8, 0.1], [1, 0, 1])  # binary: positive-class recall
        0.5
    """

    _name = "Recall"

    def eval(self, average: bool = False):
        """Per-class recall (see `Precision` for the layout), or their mean if ``average``."""
        tp, _, actual = self._counts()
        return self._finish(safe_ratio(tp, actual), average)


class Fbeta(ClassCountMetric):
    """F-beta per class, as ``mindspore.train.Fbeta``.

    ``F = (1 + beta^2) TP / ((1 + beta^2) TP + beta^2 FN + FP)``, i.e.
    ``(1 + beta^2) TP / (beta^2 * actual + predicted)``; a class that is neither
    predicted nor present gets 0.

    Args:
        beta: weight of recall relative to precision, > 0.
        threshold: binary (N,)/(N, 1) probabilities above it predict the positive class.

    Inputs and return values follow `Precision` (classification only).

    Example:
        >>> from recstream.metrics import Fbeta
        >>> metric = Fbeta(1)
        >>> metric.update([[0.2, 0.5], [0.3, 0.1], [0.9, 0.6]], [1, 0, 1])
        >>> metric.eval().round(4)
        array([0.6667, 0.6667])
    """

    _name = "Fbeta"

    def __init__(self, beta: float, threshold: float = 0.5):
        self.beta = check_number(self._name, "beta", beta, minimum=0, min_open=True)
        super().__init__("classification", threshold)

    def eval(self, average: bool = False):
        """Per-class F-beta (see `Precision` for the layout), or their mean if ``average``."""
        tp, predicted, actual = self._counts()
        b2 = self.beta**2
        return self._finish(safe_ratio((1 + b2) * tp, b2 * actual + predicted), average)


class F1(Fbeta):
    """F1 score: `Fbeta` with ``beta = 1``.

    Example:
        >>> from recstream.metrics import F1
        >>> F1()([0.9, 0.8, 0.1, 0.7], [1, 0, 1, 1])  # binary: P = 2/3, R = 2/3
        0.6666666666666666
    """

    _name = "F1"

    def __init__(self, threshold: float = 0.5):
        super().__init__(1.0, threshold)
