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
from ..validation import check_int

__all__ = ["Batch", "Features", "WeightedLabel", "num_rows", "split_rows", "with_loss_weight"]


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

    def split(self, size: int) -> list[Batch]:
        """Consecutive slices of `size` rows, in order (the last may be smaller): `Features.split`
        and the matching labels (a `WeightedLabel` keeps its weight in every slice).

        >>> b = Batch(Features.from_lengths(torch.ones(5, 1), torch.zeros(0), torch.zeros(0, 5)), torch.arange(5.0))
        >>> [part.labels.tolist() for part in b.split(2)]
        [[0.0, 1.0], [2.0, 3.0], [4.0]]
        """
        return split_rows(self, size)

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


def num_rows(data) -> int:
    """The number of rows (examples) of `data`: a `Batch`, `Features`, a tensor, a `WeightedLabel`,
    or a tuple / list / dict of them; everything with rows must agree (see `split_rows`).

    >>> num_rows((torch.zeros(3, 2), {"label": torch.zeros(3)}, None))
    3
    """
    rows = _rows(data, set())
    if not rows:
        raise ValueError(f"num_rows: 'data' ({type(data).__name__}) holds nothing with rows (Features, a tensor of "
                         "one or more dimensions, a WeightedLabel)")
    if len(rows) > 1:
        raise ValueError(f"num_rows: the parts of 'data' have different numbers of rows: {sorted(rows)}; every "
                         "Features, tensor of one or more dimensions and label must have one row per example")
    return rows.pop()


def split_rows(data, size: int) -> list:
    """`data` (as `num_rows` takes it: a batch, or a step's inputs) as consecutive slices of `size`
    rows each, in order (the last may be smaller), each of the same structure as `data`.

    Everything with rows is sliced (`Features.split`, tensor views); a `WeightedLabel` keeps its
    weight in every slice; what has no rows (None, numbers, strings, 0-dim tensors) is repeated.

    >>> x, y = with_loss_weight((torch.arange(10.0).view(5, 2), torch.arange(5.0)), 0.5)
    >>> [(p[0].shape[0], p[1].labels.tolist(), p[1].weight) for p in split_rows((x, y), 2)]
    [(2, [0.0, 1.0], 0.5), (2, [2.0, 3.0], 0.5), (1, [4.0], 0.5)]
    """
    size = check_int("split_rows", "size", size, minimum=1)
    pieces = max(1, -(-num_rows(data) // size))
    return _split(data, size, pieces)


def _rows(data, found: set) -> set:
    if isinstance(data, Features):
        found.add(data.batch_size)
    elif isinstance(data, torch.Tensor):
        if data.dim() > 0:
            found.add(int(data.shape[0]))
    elif isinstance(data, WeightedLabel):
        _rows(data.labels, found)
    elif isinstance(data, (tuple, list)):
        for part in data:
            _rows(part, found)
    elif isinstance(data, dict):
        for part in data.values():
            _rows(part, found)
    return found


def _split(data, size: int, pieces: int) -> list:
    """`data` in `pieces` slices of `size` rows (its rows were counted by `num_rows`)."""
    if pieces == 1:
        return [data]
    if isinstance(data, Features):
        return data.split(size)
    if isinstance(data, torch.Tensor):
        return list(torch.split(data, size)) if data.dim() > 0 else [data] * pieces
    if isinstance(data, WeightedLabel):
        return [WeightedLabel(labels, data.weight) for labels in _split(data.labels, size, pieces)]
    if isinstance(data, (tuple, list)) and data:
        columns = zip(*(_split(part, size, pieces) for part in data), strict=True)
        if isinstance(data, list):
            return [list(c) for c in columns]
        return [type(data)(*c) if hasattr(data, "_fields") else tuple(c) for c in columns]
    if isinstance(data, dict) and data:
        keys = list(data)
        columns = zip(*(_split(data[k], size, pieces) for k in keys), strict=True)
        return [dict(zip(keys, c, strict=True)) for c in columns]
    return [data] * pieces
