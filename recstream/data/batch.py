"""Columnar batches: :class:`Features` (dense + ragged categorical ids) and :class:`Batch`.

Categorical ids are stored once for the whole batch in a flat ``values`` tensor with
``offsets`` in FEATURE-MAJOR order: the ids of feature ``f`` for example ``b`` are
``values[offsets[f * B + b] : offsets[f * B + b + 1]]``. One ``torch.nn.EmbeddingBag``
over all tables (rows of table ``f`` starting at ``table_offsets[f]``) takes exactly this
after :meth:`Features.fused_ids` adds the per-table row offsets::

    bag = torch.nn.EmbeddingBag(sum(sizes), dim, mode="sum", include_last_offset=True)
    out = bag(features.fused_ids(table_offsets), features.offsets).view(F, B, dim)

>>> import torch
>>> f = Features.from_lengths(torch.zeros(2, 1), torch.tensor([3, 4, 7, 8, 9]),
...                           torch.tensor([[1, 1], [1, 2]]))
>>> f.offsets.tolist(), f.bag(1)[0].tolist()
([0, 1, 2, 3, 5], [7, 8, 9])
>>> feats, labels = Batch(f, torch.tensor([0.0, 1.0]))
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Sequence

import numpy as np
import torch

from . import ragged
from .schema import Schema


def _host(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()


def _like(a: np.ndarray, ref: torch.Tensor) -> torch.Tensor:
    t = torch.from_numpy(np.ascontiguousarray(a))
    return t if ref.device.type == "cpu" else t.to(ref.device)


@dataclass
class Features:
    """Model inputs of one batch: ``dense`` [B, n_dense] float32 and ragged int64 ids.

    ``offsets`` has ``num_features * batch_size + 1`` entries (feature-major, see module doc).
    """

    dense: torch.Tensor
    values: torch.Tensor
    offsets: torch.Tensor
    batch_size: int
    num_features: int

    @classmethod
    def from_lengths(cls, dense: torch.Tensor, values: torch.Tensor, lengths: torch.Tensor) -> "Features":
        """Build from ``lengths`` [F, B] (ids per bag) and the matching flat ``values``."""
        if lengths.dim() != 2:
            raise ValueError(f"'lengths' must be [num_features, batch_size], got shape {tuple(lengths.shape)}")
        offsets = np.zeros(lengths.numel() + 1, dtype=np.int64)
        np.cumsum(_host(lengths).reshape(-1), out=offsets[1:])
        return cls(dense, values.to(torch.int64), _like(offsets, values), int(lengths.shape[1]),
                   int(lengths.shape[0]))

    # --- views ---------------------------------------------------------------------------
    def lengths(self) -> torch.Tensor:
        """Ids per bag, [num_features, batch_size]."""
        return (self.offsets[1:] - self.offsets[:-1]).view(self.num_features, self.batch_size)

    def bag(self, f: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Feature `f` alone: (values, offsets of length B + 1 starting at 0)."""
        if not 0 <= f < self.num_features:
            raise IndexError(f"feature index {f} out of range [0, {self.num_features})")
        offs = self.offsets[f * self.batch_size: (f + 1) * self.batch_size + 1]
        return self.values[int(offs[0]): int(offs[-1])], offs - offs[0]

    def fused_ids(self, table_offsets: Sequence[int] | torch.Tensor) -> torch.Tensor:
        """``values`` shifted by ``table_offsets[f]`` so all tables can live in one tensor."""
        table_offsets = torch.as_tensor(table_offsets, dtype=torch.int64, device=self.values.device)
        if table_offsets.numel() != self.num_features:
            raise ValueError(f"'table_offsets' needs {self.num_features} entries, got {table_offsets.numel()}")
        b = self.batch_size
        per_feature = self.offsets[b::b] - self.offsets[:-1:b] if b else torch.zeros_like(table_offsets)
        return self.values + torch.repeat_interleave(table_offsets, per_feature, output_size=self.values.numel())

    # --- row operations (used by re-batching and shuffling) -------------------------------
    def take(self, rows) -> "Features":
        """The examples at positions `rows` (1-D ints), in that order. Runs on the host
        (see :mod:`recstream.data.ragged`); meant for the input pipeline."""
        rows = np.asarray(_host(torch.as_tensor(rows)), dtype=np.int64)
        if rows.size and (rows.min() < -self.batch_size or rows.max() >= self.batch_size):
            raise IndexError(f"'rows' must be in [0, {self.batch_size}), got {rows.min()}..{rows.max()}")
        values, offsets = ragged.take(_host(self.values), _host(self.offsets), self.num_features,
                                      self.batch_size, rows)
        return Features(_like(_host(self.dense)[rows], self.dense), _like(values, self.values),
                        _like(offsets, self.offsets), int(rows.size), self.num_features)

    def slice(self, start: int, stop: int) -> "Features":
        """Examples ``start:stop`` (clipped like a Python slice)."""
        start, stop, _ = slice(start, stop).indices(self.batch_size)
        stop = max(start, stop)
        values, offsets = ragged.take(_host(self.values), _host(self.offsets), self.num_features,
                                      self.batch_size, slice(start, stop))
        return Features(self.dense[start:stop], _like(values, self.values), _like(offsets, self.offsets),
                        stop - start, self.num_features)

    @staticmethod
    def concat(parts: Sequence["Features"]) -> "Features":
        """Examples of all `parts`, in order (same features, so same ``num_features``)."""
        if not parts:
            raise ValueError("Features.concat: 'parts' is empty")
        if len(parts) == 1:
            return parts[0]
        nf = parts[0].num_features
        if any(p.num_features != nf for p in parts):
            raise ValueError(f"Features.concat: parts have different num_features: {[p.num_features for p in parts]}")
        values, offsets = ragged.concat([(_host(p.values), _host(p.offsets), p.batch_size) for p in parts], nf)
        dense = np.concatenate([_host(p.dense) for p in parts])
        ref = parts[0]
        return Features(_like(dense, ref.dense), _like(values, ref.values), _like(offsets, ref.offsets),
                        sum(p.batch_size for p in parts), nf)

    # --- devices -------------------------------------------------------------------------
    def to(self, device: torch.device | str, non_blocking: bool = False) -> "Features":
        return Features(self.dense.to(device, non_blocking=non_blocking),
                        self.values.to(device, non_blocking=non_blocking),
                        self.offsets.to(device, non_blocking=non_blocking), self.batch_size, self.num_features)

    def pin_memory(self) -> "Features":
        """Page-locked copies, so a later ``.to(cuda, non_blocking=True)`` is truly async."""
        return Features(self.dense.pin_memory(), self.values.pin_memory(), self.offsets.pin_memory(),
                        self.batch_size, self.num_features)

    # --- checks --------------------------------------------------------------------------
    def validate(self, schema: Schema) -> "Features":
        """Raise ValueError (naming feature, example and id) unless this matches `schema`."""
        b, nf = self.batch_size, self.num_features
        if self.dense.dtype != torch.float32 or tuple(self.dense.shape) != (b, schema.num_dense):
            raise ValueError(f"dense must be float32 [{b}, {schema.num_dense}], "
                             f"got {self.dense.dtype} {list(self.dense.shape)}")
        if nf != schema.num_categorical:
            raise ValueError(f"num_features={nf} but the schema has {schema.num_categorical} categorical features")
        if self.values.dtype != torch.int64 or self.offsets.dtype != torch.int64:
            raise ValueError(f"values/offsets must be int64, got {self.values.dtype}/{self.offsets.dtype}")
        if self.values.dim() != 1 or tuple(self.offsets.shape) != (nf * b + 1,):
            raise ValueError(f"values must be 1-D and offsets [{nf * b + 1}], got "
                             f"{list(self.values.shape)} and {list(self.offsets.shape)}")
        if int(self.offsets[0]) != 0 or int(self.offsets[-1]) != self.values.numel():
            raise ValueError(f"offsets must start at 0 and end at len(values)={self.values.numel()}, "
                             f"got {int(self.offsets[0])}..{int(self.offsets[-1])}")
        lens = self.lengths()
        if bool((lens < 0).any()):
            raise ValueError("offsets must be non-decreasing")
        for f, feat in enumerate(schema.categorical):  # one check per feature, vectorized over rows
            self._check_feature(f, feat, lens[f])
        return self

    def _check_feature(self, f: int, feat, lens: torch.Tensor) -> None:
        if not feat.multi_hot and bool((lens != 1).any()):
            row = int((lens != 1).nonzero()[0])
            raise ValueError(f"feature {feat.name!r} is single-hot but example {row} has {int(lens[row])} ids")
        if feat.max_len is not None and bool((lens > feat.max_len).any()):
            row = int((lens > feat.max_len).nonzero()[0])
            raise ValueError(f"feature {feat.name!r}: example {row} has {int(lens[row])} ids > max_len={feat.max_len}")
        ids, offs = self.bag(f)
        bad = (ids < 0) | (ids >= feat.num_embeddings)
        if bool(bad.any()):
            pos = int(bad.nonzero()[0])
            row = int(torch.searchsorted(offs, torch.tensor(pos), right=True)) - 1
            raise ValueError(f"feature {feat.name!r}: example {row} has id {int(ids[pos])} outside "
                             f"[0, {feat.num_embeddings})")


class Batch(NamedTuple):
    """``(features, labels)``: unpacks like any (data, label) pair; ``labels`` is float32 [B].

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

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "Batch":
        return Batch(self.features.to(device, non_blocking), self.labels.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> "Batch":
        return Batch(self.features.pin_memory(), self.labels.pin_memory())

    def take(self, rows: torch.Tensor) -> "Batch":
        rows = np.asarray(_host(torch.as_tensor(rows)), dtype=np.int64)
        return Batch(self.features.take(rows), _like(_host(self.labels)[rows], self.labels))

    def slice(self, start: int, stop: int) -> "Batch":
        return Batch(self.features.slice(start, stop), self.labels[start:stop])

    @staticmethod
    def concat(parts: Sequence["Batch"]) -> "Batch":
        if len(parts) == 1:
            return parts[0]
        labels = np.concatenate([_host(p.labels) for p in parts])
        return Batch(Features.concat([p.features for p in parts]), _like(labels, parts[0].labels))
