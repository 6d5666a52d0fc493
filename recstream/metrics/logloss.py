"""Binary cross-entropy (log loss) of predicted probabilities."""
from __future__ import annotations

import torch

from recstream.metrics._inputs import (
    prediction_pair,
    accumulator_dtype,
    binary_scores,
)
from recstream.metrics.base import Metric


class LogLoss(Metric):
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

    _state_names = ("sum", "count")

    def __init__(self, eps: float = 1e-15):
        super().__init__()
        if isinstance(eps, bool) or not isinstance(eps, (int, float)):
            raise TypeError(f"LogLoss: eps must be a float, got {type(eps).__name__}.")
        if not 0 < eps < 0.5:
            raise ValueError(f"LogLoss: eps must be in (0, 0.5), got {eps!r}.")
        self.eps = float(eps)
        self.clear()

    def clear(self):
        """Reset the loss sum and the sample count."""
        self._sum = None  # float64 tensor on the inputs' device
        self._count = 0
        self._reset_invalid()

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

    def eval(self) -> float:
        """Mean log loss over all samples since the last ``clear()``."""
        if self._count == 0:
            raise RuntimeError(
                "LogLoss can not be calculated, because the number of samples is 0; "
                "call update() with a non-empty batch before eval()."
            )
        self._raise_invalid()
        return float(self._sum) / self._count
