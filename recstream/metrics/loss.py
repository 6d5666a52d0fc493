"""Running mean of a loss value, one term per ``update`` (MindSpore's ``Loss`` metric)."""
from __future__ import annotations

from recstream.metrics._inputs import accumulator_dtype, check_num_inputs, to_float, to_tensor
from recstream.metrics.base import Metric


class Loss(Metric):
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

    _state_names = ("sum", "count")

    def __init__(self):
        super().__init__()
        self.clear()

    def clear(self):
        """Reset the sum of batch losses and the batch count."""
        self._sum = None  # float64 tensor on the loss's device
        self._count = 0
        self._reset_invalid()

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

    def eval(self) -> float:
        """Mean of the batch losses since the last ``clear()``."""
        if self._count == 0:
            raise RuntimeError(
                "Loss can not be calculated, because the number of batches is 0; "
                "call update() before eval()."
            )
        return float(self._sum) / self._count
