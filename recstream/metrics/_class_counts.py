"""Shared accumulator of per-class counts behind Precision, Recall and Fbeta."""
from __future__ import annotations

import numpy as np
import torch

from recstream.metrics._inputs import (
    prediction_pair,
    check_eval_type,
    check_threshold,
    decode_classification,
    decode_multilabel,
)
from recstream.metrics.base import Metric


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

    Classification accumulates three int64 vectors of length C (binary probabilities
    are two classes, class 1 = score > threshold). Multilabel follows MindSpore: the
    values are per *sample* (each row's own true positives, predicted and actual
    labels), kept as a list of per-batch tensors.
    """

    _state_names = ("layout", "tp", "predicted", "actual", "rows")
    _name = "ClassCountMetric"

    def __init__(self, eval_type: str = "classification", threshold: float = 0.5):
        super().__init__()
        self.eval_type = check_eval_type(eval_type, self._name)
        self.threshold = check_threshold(threshold, self._name)
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
            self._set_layout(layout)
            self._flag_invalid("y", y, bad, "multilabel y must be 0 or 1")
            counts = torch.stack([(pred & labels).sum(1), pred.sum(1), labels.sum(1)])
            self._rows.append(counts)
            return
        pred, labels, bad, layout = decode_classification(y_pred, y, self.threshold, self._name)
        self._set_layout(layout)
        num_classes = 2 if layout == "binary" else layout
        rule = "y must be 0 or 1" if layout == "binary" else f"y must be class indices in [0, {layout})"
        self._flag_invalid("y", y, bad, rule)
        pred, labels = pred.reshape(-1), labels.reshape(-1)
        if self._tp is None:
            zeros = torch.zeros(num_classes, dtype=torch.int64, device=pred.device)
            self._tp, self._predicted, self._actual = zeros, zeros.clone(), zeros.clone()
        device = self._tp.device
        pred, labels = pred.to(device), labels.to(device)
        # index_add_ rather than bincount: CUDA bincount reads the max back to size its output.
        ones = torch.ones_like(pred)
        self._predicted.index_add_(0, pred, ones)
        self._actual.index_add_(0, labels, ones)
        self._tp.index_add_(0, labels, (pred == labels).long())

    def _set_layout(self, layout) -> None:
        if self._layout is not None and layout != self._layout:
            raise ValueError(
                f"{self._name}.update: y_pred layout changed between batches: first "
                f"{self._layout!r} (class count or 'binary'), now {layout!r}."
            )
        self._layout = layout

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
        if not isinstance(average, bool):
            raise TypeError(f"{self._name}.eval: average must be a bool, got {average!r}.")
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
