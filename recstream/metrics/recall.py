"""Recall: true positives / actual positives, per class."""
from __future__ import annotations

from recstream.metrics._class_counts import ClassCountMetric, safe_ratio


class Recall(ClassCountMetric):
    """Recall as ``mindspore.train.Recall``: TP / (TP + FN) for every class.

    Args:
        eval_type: ``"classification"`` or ``"multilabel"``.
        threshold: a binary (N,)/(N, 1) or multilabel score above it is a positive.

    Inputs and return values follow :class:`Precision`; a class absent from y gets 0.

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
        """Per-class recall (see :class:`Precision` for the layout), or their mean if ``average``."""
        tp, _, actual = self._counts()
        return self._finish(safe_ratio(tp, actual), average)
