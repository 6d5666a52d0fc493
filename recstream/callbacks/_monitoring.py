"""Reading a monitored quantity at epoch end, shared by EarlyStopping and ReduceLROnPlateau, and the
scalar evaluation results the loggers (TensorBoard, MLflowLogger) write.

``monitor="loss"`` is the training loss (the last step's `net_outputs`, as MindSpore); any other
name is looked up in ``cb_params.eval_results`` (metrics + ``eval_loss``, set by ``fit`` on the
epochs it evaluates), falling back to ``cb_params.metrics``.

>>> from recstream.callbacks.base import CallbackParams
>>> reader = MonitorReader("auc", "EarlyStopping")
>>> reader.mode("auto"), reader.read(CallbackParams(eval_results={"auc": 0.75, "eval_loss": 0.4}))
('max', 0.75)
"""
from __future__ import annotations

import math
import warnings

import numpy as np
import torch

from .loss_monitor import loss_value

# MindSpore's list of smaller-is-better metrics; names containing "loss"/"error" count too.
SMALLER_IS_BETTER = frozenset({"hausdorff_distance", "mae", "mse", "rmse", "loss", "perplexity",
                               "mean_surface_distance", "root_mean_square_distance", "eval_loss", "logloss"})
MODES = ("auto", "min", "max")


def scalar_results(owner: str, results) -> list[tuple[str, float]]:
    """``(name, value)`` of each evaluation result a logger can plot, names as they are (stripping
    ``eval_`` would make fit's ``eval_loss`` and a metric named ``loss`` collide). None (not
    available this time, e.g. eval_loss without eval indexes) is left out, and so is a non-scalar,
    with a warning naming `owner`."""
    out = []
    for name, value in results.items():
        if value is None:
            continue
        try:
            out.append((name, float(value)))
        except (TypeError, ValueError, RuntimeError):
            warnings.warn(f"{owner}: skipping non-scalar result {name!r} ({type(value).__name__})",
                          RuntimeWarning, stacklevel=4)
    return out


def smaller_is_better(name: str) -> bool:
    low = name.lower()
    return low in SMALLER_IS_BETTER or "loss" in low or "error" in low


def to_scalar(owner: str, name: str, value) -> float:
    """A metric value as a float; tensors/arrays must hold exactly one element."""
    if isinstance(value, (torch.Tensor, np.ndarray)):
        if (value.size if isinstance(value, np.ndarray) else value.numel()) != 1:
            raise ValueError(f"{owner} only supports a scalar monitor; {name!r} has shape {tuple(value.shape)}")
        return float(value.item())
    return float(value)


class MonitorReader:
    """Fetches the monitored value; warns once if it is missing."""

    def __init__(self, monitor: str, owner: str):
        # `monitor` was validated by the owning callback, where the argument enters the API.
        self.monitor, self.owner = monitor, owner
        self._warned = False

    def mode(self, mode: str) -> str:
        """Resolve ``auto`` (one of `MODES`) to ``min``/``max`` from the monitored name."""
        if mode != "auto":
            return mode
        return "min" if smaller_is_better(self.monitor) else "max"

    def read(self, p) -> float | None:
        candidates = {}
        if self.monitor == "loss":
            value = loss_value(p.net_outputs)  # one host sync per epoch
        else:
            candidates = p.eval_results or p.metrics or {}
            value = candidates.get(self.monitor)
        if value is None:
            if not self._warned:
                self._warned = True
                available = sorted({"loss", *candidates})
                warnings.warn(f"{self.owner} is conditioned on {self.monitor!r}, which is not available "
                              f"(available: {available}); epochs without it are skipped.", RuntimeWarning, stacklevel=3)
            return None
        value = to_scalar(self.owner, self.monitor, value)
        if not math.isfinite(value):
            warnings.warn(f"{self.owner}: monitored {self.monitor!r} is {value}", RuntimeWarning, stacklevel=3)
        return value


def is_improvement(mode: str, current: float, best: float, min_delta: float) -> bool:
    if mode == "min":
        return current < best - min_delta
    return current > best + min_delta
