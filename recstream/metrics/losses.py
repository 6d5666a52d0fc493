"""Metrics that average a loss or an error: Loss, LogLoss, MAE and MSE.

Each keeps a running sum on the inputs' device (float64, float32 on MPS, so millions of
rows do not drift) and a host-side count; ``eval`` divides one by the other.
"""
from __future__ import annotations

import torch

from recstream.metrics._inputs import (
    accumulator_dtype,
    binary_scores,
    check_num_inputs,
    prediction_pair,
    to_float,
    to_tensor,
)
from recstream.metrics.base import Metric
from recstream.validation import check_number


class _RunningMean(Metric):
    """A device-side sum and a count of samples (or batches); ``eval`` is their ratio."""

    _state_names = ("sum", "count")
    _name = "_RunningMean"
    _counted = "samples"  # what ``_count`` counts, and how to fix an empty metric:
    _empty_hint = "call update() with a non-empty batch before eval()"

    def __init__(self):
        super().__init__()
        self.clear()

    def clear(self):
        """Reset the sum and the count."""
        self._sum = None  # float64 tensor on the inputs' device
        self._count = 0
        self._reset_invalid()

    def eval(self) -> float:
        """Sum / count since the last ``clear()``."""
        if self._count == 0:
            raise RuntimeError(
                f"{self._name} can not be calculated, because the number of {self._counted} is 0; "
                f"{self._empty_hint}."
            )
        self._raise_invalid()
        return float(self._sum) / self._count


class Loss(_RunningMean):
    """Average of per-batch losses, as ``mindspore.train.Loss``.

    ``update(loss)`` takes exactly one input, a scalar or 1-D loss (tensor, numpy
    array, list or number); its mean is one term. ``eval()`` is the mean of those
    terms over the number of ``update`` calls (batches, not samples).

    Example:
        >>> import torch
        >>> from recstream.metrics import Loss
        >>> metric = Loss()
        >>> metric.update(torch.tensor(0.2))
        >>> metric.update(torch.tensor([0.4, 0.8]))  # this batch counts as 0.6
        >>> round(metric.eval(), 6)
        0.4
    """

    _name = "Loss"
    _counted = "batches"
    _empty_hint = "call update() before eval()"

    def update(self, *inputs):
        """Add one batch loss: a scalar, or a 1-D tensor whose mean is taken."""
        inputs = self._select(inputs)
        check_num_inputs(inputs, 1, "Loss", "(loss,)")
        loss = to_float(to_tensor(inputs[0], "loss", "Loss", allow_scalar=True))
        if loss.ndim > 1:
            raise ValueError(f"Loss.update: loss must be a scalar or 1-D, got shape {tuple(loss.shape)}.")
        if loss.numel() == 0:
            raise ValueError("Loss.update: loss must not be empty, got shape (0,).")
        self._accumulate("_sum", loss.to(accumulator_dtype(loss.device)).mean())
        self._count += 1


class LogLoss(_RunningMean):
    """Mean binary cross-entropy ``-(y log p + (1 - y) log(1 - p))`` over all samples.

    ``p`` and ``1 - p`` are each clipped to ``[eps, 1 - eps]``, so a confident mistake
    costs exactly ``-log(eps)`` on either side instead of infinity (clipping ``1 - p``
    itself matters: ``1 - (1 - 1e-15)`` is not 1e-15 in floating point). The loss is
    computed in float64 (float32 on MPS), where ``1 - p`` is exact for p >= 0.5.

    Args:
        eps: clipping margin, 0 < eps < 0.5.

    ``update(y_pred, y)``: probabilities (N,) or (N, 1) and targets in [0, 1] with N
    elements (soft targets are allowed, as in BCE).

    Example:
        >>> from recstream.metrics import LogLoss
        >>> metric = LogLoss()
        >>> metric.update([0.9, 0.2], [1, 0])
        >>> round(metric.eval(), 6)  # (-log 0.9 - log 0.8) / 2
        0.164252
    """

    _name = "LogLoss"

    def __init__(self, eps: float = 1e-15):
        self.eps = check_number("LogLoss", "eps", eps, minimum=0, maximum=0.5, min_open=True, max_open=True)
        super().__init__()

    def update(self, *inputs):
        """Add one batch ``(y_pred, y)`` of probabilities and 0/1 (or soft) targets."""
        y_pred, y = prediction_pair(self, inputs, "LogLoss")
        p, t = binary_scores(y_pred, y, "LogLoss", two_columns=False)
        dtype = accumulator_dtype(p.device)
        p, t = p.to(dtype), t.to(dtype)
        # NaN fails both comparisons, so it is reported too
        self._flag_invalid("y_pred", p, ~((p >= 0) & (p <= 1)), "y_pred must be probabilities in [0, 1]")
        q = (1 - p).clamp(self.eps, 1 - self.eps)
        p = p.clamp(self.eps, 1 - self.eps)
        self._flag_invalid("y", t, ~((t >= 0) & (t <= 1)), "y must be targets in [0, 1]")
        loss = -(t * torch.log(p) + (1 - t) * torch.log(q))
        self._accumulate("_sum", loss.sum())
        self._count += p.shape[0]


class _ErrorSum(_RunningMean):
    """Sum of an elementwise error over all elements, divided by the number of samples."""

    def _error(self, diff: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def update(self, *inputs):
        """Add one batch ``(y_pred, y)``; y is reshaped to y_pred's shape."""
        y_pred, y = prediction_pair(self, inputs, self._name)
        y_pred, y = to_float(y_pred), to_float(y)
        if y.ndim == 0:
            raise ValueError(f"{self._name}.update: y must have a sample dimension, got a scalar.")
        if y.numel() != y_pred.numel():
            raise ValueError(
                f"{self._name}.update: y must have as many elements as y_pred to be reshaped to "
                f"{tuple(y_pred.shape)}, got y of shape {tuple(y.shape)}."
            )
        diff = y.reshape(y_pred.shape) - y_pred
        self._accumulate("_sum", self._error(diff).sum(dtype=accumulator_dtype(diff.device)))
        # MindSpore divides by the rows of y, not by the element count.
        self._count += y.shape[0]


class MAE(_ErrorSum):
    """Mean absolute error as ``mindspore.train.MAE``: ``sum |y - y_pred| / n_samples``.

    The sum runs over all elements, n_samples is ``y.shape[0]`` summed over batches.

    Example:
        >>> from recstream.metrics import MAE
        >>> round(MAE()([0.1, 0.2, 0.6, 0.9], [0.1, 0.25, 0.7, 0.9]), 6)
        0.0375
        >>> MAE()([[1.0, 2.0], [3.0, 4.0]], [[0.0, 0.0], [0.0, 0.0]])  # 10 / 2 rows
        5.0
    """

    _name = "MAE"

    def _error(self, diff):
        return diff.abs()


class MSE(_ErrorSum):
    """Mean squared error as ``mindspore.train.MSE``: ``sum (y - y_pred)**2 / n_samples``.

    Example:
        >>> from recstream.metrics import MSE
        >>> round(MSE()([0.1, 0.2, 0.6, 0.9], [0.1, 0.25, 0.5, 0.9]), 6)
        0.003125
    """

    _name = "MSE"

    def _error(self, diff):
        return diff.square()
