"""One training batch: [`Batch`][recstream.data.batch.Batch] ``(features, labels)``.

The model input, `Features` (dense values + feature-major ragged
ids), is defined in `recstream.features` so that the embedding layers can use it without
depending on the data package; it is re-exported here and from `recstream.data`.

>>> import torch
>>> f = Features.from_lengths(torch.zeros(2, 1), torch.tensor([3, 4, 7, 8, 9]),
...                           torch.tensor([[1, 1], [1, 2]]))
>>> feats, labels = Batch(f, torch.tensor([0.0, 1.0]))
>>> feats.bag(1)[0].tolist()
[7, 8, 9]
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from ..features import Features

__all__ = ["Batch", "Features", "WeightedLabel", "with_loss_weight"]


class Batch(NamedTuple):
    """``(features, labels)``: unpacks like any (data, label) pair; ``labels`` is float32 [B].

    Row operations run on the host (numpy), like those of `Features`.

    >>> import torch
    >>> b = Batch(Features.from_lengths(torch.ones(3, 2), torch.zeros(0), torch.zeros(0, 3)), torch.zeros(3))
    >>> b.batch_size, b.slice(1, 3).batch_size
    (3, 2)
    """

    features: Features
    labels: torch.Tensor

    @property
    def batch_size(self) -> int:
        return self.features.batch_size

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        return Batch(self.features.to(device, non_blocking), self.labels.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> Batch:
        return Batch(self.features.pin_memory(), self.labels.pin_memory())

    def take(self, rows: torch.Tensor) -> Batch:
        rows = np.asarray(torch.as_tensor(rows).cpu().numpy(), dtype=np.int64)
        return Batch(self.features.take(rows), _like(self.labels.detach().cpu().numpy()[rows], self.labels))

    def slice(self, start: int, stop: int) -> Batch:
        return Batch(self.features.slice(start, stop), self.labels[start:stop])

    @staticmethod
    def concat(parts: Sequence[Batch]) -> Batch:
        if len(parts) == 1:
            return parts[0]
        labels = np.concatenate([p.labels.detach().cpu().numpy() for p in parts])
        return Batch(Features.concat([p.features for p in parts]), _like(labels, parts[0].labels))


def _like(a: np.ndarray, ref: torch.Tensor) -> torch.Tensor:
    """`a` as a tensor on `ref`'s device."""
    t = torch.from_numpy(np.ascontiguousarray(a))
    return t if ref.device.type == "cpu" else t.to(ref.device)


@dataclasses.dataclass(frozen=True)
class WeightedLabel:
    """A batch's labels with the weight its loss gets: the batch carries the weight into the loss.

    Made by `with_loss_weight`; a loss that understands it (`RecModel`'s on several ranks, where
    a rank without data trains a *fill batch* weighted 0) unwraps it. A dataclass, so moving a
    batch (`recstream.data.transfer`: to a device, pinned) moves its labels too.
    """

    labels: Any
    weight: float

    def to(self, device, non_blocking: bool = False) -> WeightedLabel:
        labels = self.labels.to(device, non_blocking=non_blocking) if hasattr(self.labels, "to") else self.labels
        return WeightedLabel(labels, self.weight)

    def pin_memory(self) -> WeightedLabel:
        return WeightedLabel(self.labels.pin_memory(), self.weight)


def with_loss_weight(batch, weight: float):
    """`batch` with its label (the ``"label"`` key of a dict, else the last element) weighted.

    >>> import torch
    >>> x, y = with_loss_weight((torch.zeros(1, 2), torch.ones(1)), 0.0)
    >>> y.weight, y.labels.tolist()
    (0.0, [1.0])
    """
    if isinstance(batch, dict) and "label" in batch:
        return {**batch, "label": WeightedLabel(batch["label"], float(weight))}
    if isinstance(batch, tuple) and len(batch) >= 2:
        parts = (*batch[:-1], WeightedLabel(batch[-1], float(weight)))
        return type(batch)(*parts) if hasattr(batch, "_fields") else parts
    if isinstance(batch, list) and len(batch) >= 2:
        return [*batch[:-1], WeightedLabel(batch[-1], float(weight))]
    raise ValueError(f"with_loss_weight: 'batch' must hold a label ((inputs..., label) or a dict with a 'label' "
                     f"key), got {type(batch).__name__}")


def loss_weight(batch) -> float | None:
    """The weight `with_loss_weight` gave `batch`'s loss, or None (no weight: 1)."""
    label = batch.get("label") if isinstance(batch, dict) else (
        batch[-1] if isinstance(batch, (tuple, list)) and batch else None)
    return label.weight if isinstance(label, WeightedLabel) else None
