"""Precision: true positives / predicted positives, per class."""
from __future__ import annotations

from recstream.metrics._class_counts import ClassCountMetric, safe_ratio


class Precision(ClassCountMetric):
    """Precision as ``mindspore.train.Precision``: TP / (TP + FP) for every class.

    Args:
        eval_type: ``"classification"`` or ``"multilabel"``.
        threshold: a binary (N,)/(N, 1) or multilabel score above it is a positive.

    ``update(y_pred, y)`` takes the same inputs as :class:`Accuracy`. ``eval(average=False)``:

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
