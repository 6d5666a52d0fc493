"""Private helpers that turn metric inputs into tensors without touching the device.

Every helper here only looks at shapes and dtypes (host-side metadata) and builds
lazy device computations; none of them reads tensor values back, so metrics that
use them keep ``update`` free of host/device synchronisation.
"""
from __future__ import annotations

import numpy as np
import torch

from recstream.validation import describe

EVAL_TYPES = ("classification", "multilabel")  # the ``eval_type`` choices of classification metrics
ONEHOT_RULE = ("y of y_pred's shape is read as one-hot, so along axis 1 it must hold 0s and a single 1 "
               "(the values reported are sample positions)")


def check_eval_type(owner: str, value) -> str:
    """``eval_type`` of the classification metrics; anything but the two kinds is a ``TypeError``.

    MindSpore calls ``eval_type`` a *type* of evaluation and raises ``TypeError`` for
    ``Accuracy("test")``; recstream does the same.
    """
    if isinstance(value, str) and value in EVAL_TYPES:
        return value
    raise TypeError(f"{owner}: 'eval_type' must be one of {list(EVAL_TYPES)}, got {describe(value)}")


def to_tensor(data, name: str, owner: str, allow_scalar: bool = False) -> torch.Tensor:
    """Convert a tensor, numpy array or (nested) list to a detached tensor.

    Tensors keep their device, so accumulation happens where the data already is.
    """
    if isinstance(data, torch.Tensor):
        if data.is_complex():
            raise TypeError(f"{owner}: {name} must be real-valued, got a tensor of dtype {data.dtype}.")
        return data.detach()
    if isinstance(data, (list, tuple, np.ndarray)) or (
        allow_scalar and isinstance(data, (int, float, np.number, np.bool_))
    ):
        array = np.asarray(data)
        if array.dtype.kind not in "biuf":
            raise TypeError(
                f"{owner}: {name} must hold booleans or real numbers, got a "
                f"{type(data).__name__} of numpy dtype {array.dtype}."
            )
        # from_numpy cannot wrap negative strides; ascontiguousarray is a no-op otherwise.
        return torch.from_numpy(np.ascontiguousarray(array))
    allowed = "torch.Tensor, numpy.ndarray or list" + (" or a Python number" if allow_scalar else "")
    raise TypeError(f"{owner}: {name} must be a {allowed}, got {type(data).__name__}: {data!r:.80}.")


def to_float(t: torch.Tensor) -> torch.Tensor:
    """Float32/float64 stay as they are; half precision, ints and bools compute in float32."""
    if t.dtype in (torch.float32, torch.float64):
        return t
    return t.to(torch.float32)


def accumulator_dtype(device: torch.device) -> torch.dtype:
    """float64 for running sums (no drift over millions of rows); MPS has no float64."""
    return torch.float32 if device.type == "mps" else torch.float64


def check_num_inputs(inputs: tuple, expected: int, owner: str, names: str) -> None:
    if len(inputs) != expected:
        raise ValueError(
            f"{owner}.update: expects {expected} input(s) {names}, got {len(inputs)} input(s)."
        )


def prediction_pair(metric, inputs: tuple, owner: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``(y_pred, y)`` of an ``update`` call (after the metric's `indexes`) as tensors, with
    ``y`` moved to ``y_pred``'s device; the prologue every two-input metric shares."""
    inputs = metric._select(inputs)
    check_num_inputs(inputs, 2, owner, "(y_pred, y)")
    y_pred = to_tensor(inputs[0], "y_pred", owner)
    return y_pred, to_tensor(inputs[1], "y", owner).to(y_pred.device)


def binary_labels(y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (labels as bool, mask of values that are neither 0 nor 1)."""
    if y.dtype == torch.bool:
        return y, torch.zeros_like(y)
    return y == 1, (y != 0) & (y != 1)


def class_labels(y: torch.Tensor, num_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (int64 class indices clamped to [0, C), mask of invalid indices).

    Clamping keeps later ``index_add_`` calls in range (an out-of-range index is a
    device-side assert on CUDA); the mask lets ``eval`` report the bad values.
    """
    labels = y.long()
    bad = (labels < 0) | (labels >= num_classes)
    if y.is_floating_point():
        bad = bad | (labels.to(y.dtype) != y)  # 1.5 or NaN is not a class index
    return labels.clamp(0, num_classes - 1), bad


def _shape(t: torch.Tensor) -> tuple:
    return tuple(t.shape)


def onehot_labels(y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Class indices of one-hot labels (class axis 1), without a read-back.

    Returns ``(indices, bad, positions)``: ``bad`` marks the samples whose row along axis 1 is not
    0s and a single 1 (MindSpore refuses those labels too), ``positions`` numbers the samples so
    that an error can say which one it was.
    """
    zero_one = ((y == 0) | (y == 1)).all(dim=1)
    bad = ~zero_one | (y.sum(dim=1) != 1)
    return y.argmax(dim=1), bad, torch.arange(bad.numel(), device=y.device).reshape(bad.shape)


def decode_classification(y_pred: torch.Tensor, y: torch.Tensor, threshold: float, owner: str):
    """Predicted and true class indices for single-label classification.

    Returns ``(pred, labels, checks, layout)`` where ``layout`` is ``"binary"`` for (N,)/(N, 1)
    probabilities (class = p > threshold) or the class count C, and ``checks`` lists the deferred
    value checks as ``(key, values, bad, rule)`` arguments of ``Metric._flag_invalid``.
    """
    if y_pred.ndim == 0:
        raise ValueError(f"{owner}: y_pred must have at least 1 dimension, got a scalar.")
    if y_pred.ndim == 1 or (y_pred.ndim == 2 and y_pred.shape[1] == 1):
        n = y_pred.shape[0]
        if _shape(y) not in ((n,), (n, 1)):
            raise ValueError(
                f"{owner}: y must have shape ({n},) or ({n}, 1) to match binary y_pred of shape "
                f"{_shape(y_pred)}, got {_shape(y)}."
            )
        labels, bad = binary_labels(y.reshape(-1))
        checks = [("y", y, bad, "y must be 0 or 1")]
        return (y_pred.reshape(-1) > threshold).long(), labels.long(), checks, "binary"
    num_classes = y_pred.shape[1]
    checks = []
    if y.ndim == y_pred.ndim and _shape(y) == _shape(y_pred):
        y, bad_rows, positions = onehot_labels(y)
        checks.append(("onehot", positions, bad_rows, ONEHOT_RULE))
    elif y_pred.ndim == 2 and _shape(y) == (y_pred.shape[0], 1):
        y = y.reshape(-1)
    expected = (y_pred.shape[0],) + _shape(y_pred)[2:]
    if _shape(y) != expected:
        raise ValueError(
            f"{owner}: y must be class indices of shape {expected} or one-hot of shape "
            f"{_shape(y_pred)} for y_pred of shape {_shape(y_pred)}, got {_shape(y)}."
        )
    labels, bad = class_labels(y, num_classes)
    checks.append(("y", y, bad, f"y must be class indices in [0, {num_classes})"))
    return y_pred.argmax(dim=1), labels, checks, num_classes


def decode_multilabel(y_pred: torch.Tensor, y: torch.Tensor, threshold: float, owner: str):
    """Rows of (predicted, true) label sets for multilabel data, as bool (R, C) tensors.

    Like MindSpore, the class axis is 1 and every other position is a row.
    """
    if y_pred.ndim < 2 or _shape(y) != _shape(y_pred):
        raise ValueError(
            f"{owner}: multilabel y_pred and y must have the same shape (N, C, ...), got "
            f"y_pred {_shape(y_pred)} and y {_shape(y)}."
        )
    num_classes = y_pred.shape[1]
    pred = (y_pred > threshold).movedim(1, -1).reshape(-1, num_classes)
    labels, bad = binary_labels(y)
    return pred, labels.movedim(1, -1).reshape(-1, num_classes), bad, num_classes


def binary_scores(y_pred: torch.Tensor, y: torch.Tensor, owner: str, two_columns: bool = True):
    """Flatten binary scores and labels: (N,), (N, 1) or, if allowed, (N, 2) -> column 1."""
    allowed = "(N,), (N, 1)" + (" or (N, 2)" if two_columns else "")

    def column(t: torch.Tensor, name: str) -> torch.Tensor:
        if t.ndim == 1:
            return t
        if t.ndim == 2 and (t.shape[1] == 1 or (two_columns and t.shape[1] == 2)):
            return t[:, -1]  # (N, 2) holds [negative, positive] columns
        raise ValueError(f"{owner}: {name} must have shape {allowed}, got {_shape(t)}.")

    scores, labels = column(y_pred, "y_pred"), column(y, "y")
    if scores.shape[0] != labels.shape[0]:
        raise ValueError(
            f"{owner}: y_pred and y must hold the same number of samples, got "
            f"{scores.shape[0]} and {labels.shape[0]}."
        )
    return scores, labels
