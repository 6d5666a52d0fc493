"""F-beta score (weighted harmonic mean of precision and recall) and F1."""
from __future__ import annotations

from recstream.metrics._class_counts import ClassCountMetric, safe_ratio


class Fbeta(ClassCountMetric):
    """F-beta per class, as ``mindspore.train.Fbeta``.

    ``F = (1 + beta^2) TP / ((1 + beta^2) TP + beta^2 FN + FP)``, i.e.
    ``(1 + beta^2) TP / (beta^2 * actual + predicted)``; a class that is neither
    predicted nor present gets 0.

    Args:
        beta: weight of recall relative to precision, > 0.
        threshold: binary (N,)/(N, 1) probabilities above it predict the positive class.

    Inputs and return values follow :class:`Precision` (classification only).

    Example:
        >>> from recstream.metrics import Fbeta
        >>> metric = Fbeta(1)
        >>> metric.update([[0.2, 0.5], [0.3, 0.1], [0.9, 0.6]], [1, 0, 1])
        >>> metric.eval().round(4)
        array([0.6667, 0.6667])
    """

    _name = "Fbeta"

    def __init__(self, beta: float, threshold: float = 0.5):
        if isinstance(beta, bool) or not isinstance(beta, (int, float)):
            raise TypeError(f"{self._name}: beta must be a number > 0, got {type(beta).__name__}.")
        if not beta > 0:
            raise ValueError(f"{self._name}: beta must be > 0, got {beta!r}.")
        self.beta = float(beta)
        super().__init__("classification", threshold)

    def eval(self, average: bool = False):
        """Per-class F-beta (see :class:`Precision` for the layout), or their mean if ``average``."""
        tp, predicted, actual = self._counts()
        b2 = self.beta**2
        return self._finish(safe_ratio((1 + b2) * tp, b2 * actual + predicted), average)


class F1(Fbeta):
    """F1 score: :class:`Fbeta` with ``beta = 1``.

    Example:
        >>> from recstream.metrics import F1
        >>> F1()([0.9, 0.8, 0.1, 0.7], [1, 0, 1, 1])  # binary: P = 2/3, R = 2/3
        0.6666666666666666
    """

    _name = "F1"

    def __init__(self, threshold: float = 0.5):
        super().__init__(1.0, threshold)
