"""Top-k categorical accuracy."""
from __future__ import annotations

import torch

from recstream.metrics._inputs import ONEHOT_RULE, class_labels, onehot_labels, prediction_pair
from recstream.metrics.base import Metric
from recstream.validation import check_int


class TopKCategoricalAccuracy(Metric):
    """Share of samples whose true class is among the k highest scores.

    As ``mindspore.train.TopKCategoricalAccuracy``: y_pred (N, C) scores, y class
    indices (N,) / (N, 1) or one-hot (N, C') — as in MindSpore, any one-hot width C' is
    read by its argmax (a row that is not 0s and a single 1 is an error at ``eval``).
    Among equal scores the lower class index ranks first (stable sort), so results do
    not depend on the device.

    Args:
        k: how many top classes count as a hit, >= 1 (k >= C always hits).

    Example:
        >>> from recstream.metrics import TopKCategoricalAccuracy
        >>> x = [[0.2, 0.5, 0.3, 0.6, 0.2], [0.1, 0.35, 0.5, 0.2, 0.0], [0.9, 0.6, 0.2, 0.01, 0.3]]
        >>> round(TopKCategoricalAccuracy(3)(x, [2, 0, 1]), 4)
        0.6667
    """

    _state_names = ("correct", "count")
    _name = "TopKCategoricalAccuracy"

    def __init__(self, k: int):
        super().__init__()
        self.k = check_int(self._name, "k", k, minimum=1)
        self.clear()

    def clear(self):
        """Reset the hit and sample counts."""
        self._correct = None  # int64 tensor on the inputs' device
        self._count = 0
        self._reset_invalid()

    def update(self, *inputs):
        """Add one batch ``(y_pred, y)``."""
        y_pred, y = prediction_pair(self, inputs, self._name)
        if y_pred.ndim != 2:
            raise ValueError(f"{self._name}.update: y_pred must have shape (N, C), got {tuple(y_pred.shape)}.")
        n, num_classes = y_pred.shape
        if tuple(y.shape) in ((n,), (n, 1)):
            y = y.reshape(-1)
        elif y.ndim == 2 and y.shape[0] == n:
            y, bad_rows, positions = onehot_labels(y)
            self._flag_invalid("onehot", positions, bad_rows, ONEHOT_RULE)
        else:
            raise ValueError(
                f"{self._name}.update: y must have shape ({n},), ({n}, 1) or one-hot ({n}, C), "
                f"got {tuple(y.shape)}."
            )
        labels, bad = class_labels(y, num_classes)
        self._flag_invalid("y", y, bad, f"y must be class indices in [0, {num_classes})")
        top = torch.argsort(y_pred, dim=1, descending=True, stable=True)[:, : self.k]
        self._accumulate("_correct", (top == labels[:, None]).any(dim=1).sum())
        self._count += n

    def eval(self) -> float:
        """Hits / samples since the last ``clear()``."""
        if self._count == 0:
            raise RuntimeError(
                f"{self._name} can not be calculated, because the number of samples is 0; "
                "call update() with a non-empty batch before eval()."
            )
        self._raise_invalid()
        return int(self._correct) / self._count


class Top1CategoricalAccuracy(TopKCategoricalAccuracy):
    """Top-1 categorical accuracy: `TopKCategoricalAccuracy` with ``k = 1``.

    Example:
        >>> from recstream.metrics import Top1CategoricalAccuracy
        >>> Top1CategoricalAccuracy()([[0.1, 0.9], [0.8, 0.2]], [1, 1])
        0.5
    """

    _name = "Top1CategoricalAccuracy"

    def __init__(self):
        super().__init__(1)


class Top5CategoricalAccuracy(TopKCategoricalAccuracy):
    """Top-5 categorical accuracy: `TopKCategoricalAccuracy` with ``k = 5``.

    Example:
        >>> from recstream.metrics import Top5CategoricalAccuracy
        >>> x = [[0.2, 0.5, 0.3, 0.6, 0.2, 0.9], [0.9, 0.6, 0.2, 0.01, 0.3, 0.4]]
        >>> Top5CategoricalAccuracy()(x, [4, 2])  # class 4 ties class 0 at 0.2 and loses
        0.5
    """

    _name = "Top5CategoricalAccuracy"

    def __init__(self):
        super().__init__(5)
