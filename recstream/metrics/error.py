"""Mean absolute and mean squared error with MindSpore's per-sample normalisation."""
from __future__ import annotations

import torch

from recstream.metrics._inputs import prediction_pair, accumulator_dtype, to_float
from recstream.metrics.base import Metric


class _ErrorSum(Metric):
    """Sum of an elementwise error over all elements, divided by the number of samples."""

    _state_names = ("sum", "count")
    _name = "_ErrorSum"

    def __init__(self):
        super().__init__()
        self.clear()

    def clear(self):
        """Reset the error sum and the sample count."""
        self._sum = None  # float64 tensor on the inputs' device
        self._count = 0
        self._reset_invalid()

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

    def eval(self) -> float:
        """Error sum / number of samples since the last ``clear()``."""
        if self._count == 0:
            raise RuntimeError(
                f"{self._name} can not be calculated, because the number of samples is 0; "
                "call update() with a non-empty batch before eval()."
            )
        return float(self._sum) / self._count


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
