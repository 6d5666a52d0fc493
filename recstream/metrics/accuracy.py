"""Accuracy for single-label classification, binary probabilities and multilabel data."""
from __future__ import annotations

from recstream.metrics._inputs import (
    prediction_pair,
    check_eval_type,
    check_threshold,
    decode_classification,
    decode_multilabel,
)
from recstream.metrics.base import Metric

class Accuracy(Metric):
    """Fraction of correct predictions, as ``mindspore.train.Accuracy``.

    Args:
        eval_type: ``"classification"`` (one label per sample) or ``"multilabel"``.
        threshold: for binary (N,)/(N, 1) probabilities and for multilabel scores,
            a score above ``threshold`` predicts the positive class / label.

    ``update(y_pred, y)`` inputs (tensors on any device, numpy arrays or lists):

    * classification, y_pred (N, C) with C >= 2: predicted class is ``argmax``; y is
      class indices (N,) or one-hot (N, C). Extra trailing dims (N, C, d...) with
      y (N, d...) count every position, as in MindSpore.
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
        self.eval_type = check_eval_type(eval_type, "Accuracy")
        self.threshold = check_threshold(threshold, "Accuracy")
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
            pred, labels, bad, layout = decode_classification(y_pred, y, self.threshold, "Accuracy")
            correct = pred == labels
            rule = "y must be 0 or 1" if layout == "binary" else f"y must be class indices in [0, {layout})"
        else:
            pred, labels, bad, layout = decode_multilabel(y_pred, y, self.threshold, "Accuracy")
            correct = (pred == labels).all(dim=1)
            rule = "multilabel y must be 0 or 1"
        if self._layout is not None and layout != self._layout:
            raise ValueError(
                f"Accuracy.update: y_pred layout changed between batches: first {self._layout!r} "
                f"(class count or 'binary'), now {layout!r}."
            )
        self._layout = layout
        self._flag_invalid("y", y, bad, rule)
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
