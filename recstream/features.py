"""The sparse + dense model input of one batch: `Features`.

Categorical ids are stored once for the whole batch in a flat ``values`` tensor with
``offsets`` in FEATURE-MAJOR order: the ids of feature ``f`` for example ``b`` are
``values[offsets[f * B + b] : offsets[f * B + b + 1]]``. One ``torch.nn.EmbeddingBag``
over all tables (rows of table ``f`` starting at ``table_offsets[f]``) takes exactly this
after `Features.fused_ids` adds the per-table row offsets::

    bag = torch.nn.EmbeddingBag(sum(sizes), dim, mode="sum", include_last_offset=True)
    out = bag(features.fused_ids(table_offsets), features.offsets).view(F, B, dim)

Features may carry their names (``keys``, one per categorical feature, in storage order),
so a consumer can pick the features it needs by name instead of by position.

>>> import torch
>>> f = Features.from_lengths(torch.zeros(2, 1), torch.tensor([3, 4, 7, 8, 9]),
...                           torch.tensor([[1, 1], [1, 2]]), keys=("user", "tags"))
>>> f.offsets.tolist(), f.bag(1)[0].tolist(), f.bag("tags")[0].tolist()
([0, 1, 2, 3, 5], [7, 8, 9], [7, 8, 9])
>>> f.select(["tags"]).values.tolist(), f.select(["tags"]).keys
([7, 8, 9], ('tags',))

This module depends on torch, numpy, `recstream.validation` and `recstream.hostpath` only, so every layer
(data readers, embedding modules, models, serving) can share it.
"""
from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from .hostpath import host_reads_free, once_per_step, positions
from .validation import check_int, check_str, check_type

__all__ = ["Features"]


# --- host-side ragged gathers ----------------------------------------------------------------
# Row operations (take, slice, concat) run on the host in the input pipeline. They are small
# memory-bound gathers: numpy does them single-threaded with no overhead, whereas torch's
# intra-op OpenMP barriers made each one ~50x slower on a loaded 2-core machine (a barrier
# waits for a descheduled thread).

def _host(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()


def _like(a: np.ndarray, ref: torch.Tensor) -> torch.Tensor:
    t = torch.from_numpy(np.ascontiguousarray(a))
    return t if ref.device.type == "cpu" else t.to(ref.device)


def _gather(values: np.ndarray, starts: np.ndarray, lens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Concatenate ``values[s:s+l]`` for every (s, l): (new values, new offsets).

    >>> v, o = _gather(np.array([10, 11, 20, 21, 22]), np.array([2, 0]), np.array([3, 1]))
    >>> v.tolist(), o.tolist()
    ([20, 21, 22, 10], [0, 3, 4])
    """
    idx, offsets = _gather_index(starts, lens)
    return values[idx], offsets


def _gather_index(starts: np.ndarray, lens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The positions `_gather` takes, and the new offsets."""
    offsets = np.zeros(len(lens) + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    total = int(offsets[-1])
    if total == len(lens) and (lens == 1).all():  # single-hot: one id per bag
        return starts, offsets
    return np.repeat(starts - offsets[:-1], lens) + np.arange(total, dtype=np.int64), offsets


def _take_bags(values: np.ndarray, offsets: np.ndarray, nf: int, b: int, features, rows) -> tuple[np.ndarray,
                                                                                               np.ndarray]:
    """Bags of `features` x `rows` (each an index array or a slice), feature-major.

    Cost is O(selected bags), not O(batch): re-batching slices many small batches out of
    one big block, and must not re-scan the whole block for each.
    """
    starts = offsets[:-1].reshape(nf, b)[features][:, rows].reshape(-1)
    ends = offsets[1:].reshape(nf, b)[features][:, rows].reshape(-1)
    return _gather(values, starts, ends - starts)


def _concat_bags(parts: Sequence[tuple[np.ndarray, np.ndarray, int]], nf: int) -> tuple[np.ndarray, np.ndarray]:
    """Concatenate (values, offsets, batch_size) parts along the example axis."""
    starts, lens, base = [], [], 0
    for values, offsets, b in parts:  # one iteration per part, not per row
        starts.append(offsets[:-1].reshape(nf, b) + base)
        lens.append(np.diff(offsets).reshape(nf, b))
        base += len(values)
    all_values = np.concatenate([p[0] for p in parts])
    return _gather(all_values, np.concatenate(starts, 1).reshape(-1), np.concatenate(lens, 1).reshape(-1))


def _check_keys(keys, num_features: int) -> tuple[str, ...]:
    if isinstance(keys, str) or not isinstance(keys, Sequence):
        raise TypeError(f"Features: 'keys' must be a sequence of str or None, got {type(keys).__name__}")
    keys = tuple(keys)
    try:
        return _check_key_tuple(keys, num_features)
    except TypeError:  # also an unhashable key, which the cache rejects before the checks run
        for key in keys:
            check_str("Features", "keys[]", key)
        raise


@functools.lru_cache(maxsize=64)
def _device_index(indices: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """Feature positions as a tensor on `device`, made once per layout and device: a host list
    copied to the device in every step costs a transfer, and a CUDA graph cannot record one (a
    model's collections take the same subset of a batch's features every step). Read-only."""
    return torch.tensor(indices, dtype=torch.int64, device=device)


@functools.lru_cache(maxsize=256)
def _check_key_tuple(keys: tuple, num_features: int) -> tuple[str, ...]:
    """Checked once per distinct (keys, count): every batch of a stream carries the same keys,
    and the check must not cost per batch."""
    for key in keys:
        check_str("Features", "keys[]", key)
    if len(keys) != num_features:
        raise ValueError(f"Features: 'keys' must name all {num_features} features, got {len(keys)}: {list(keys)}")
    if len(set(keys)) != len(keys):
        seen, dupes = set(), set()
        for key in keys:
            (dupes if key in seen else seen).add(key)
        raise ValueError(f"Features: 'keys' must be unique, duplicated: {sorted(dupes)}")
    return keys


@dataclass
class Features:
    """Model inputs of one batch: ``dense`` [B, n_dense] float32 and ragged int64 ids.

    ``offsets`` has ``num_features * batch_size + 1`` entries (feature-major, see module doc).
    ``keys`` optionally names the features, in storage order; every operation below keeps it.
    ``feature_sizes`` (ids per feature, on the host) is filled by `to` when a host batch moves to
    an accelerator: a subset of the features then knows its size without reading the device.
    Tensor contents are checked by `validate`, not here (this runs once per batch).
    """

    dense: torch.Tensor
    values: torch.Tensor
    offsets: torch.Tensor
    batch_size: int
    num_features: int
    keys: tuple[str, ...] | None = None
    feature_sizes: tuple[int, ...] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.keys is not None:
            self.keys = _check_keys(self.keys, self.num_features)

    @classmethod
    def from_lengths(cls, dense: torch.Tensor, values: torch.Tensor, lengths: torch.Tensor,
                     keys: Sequence[str] | None = None) -> Features:
        """Build from ``lengths`` [F, B] (ids per bag) and the matching flat ``values``."""
        if lengths.dim() != 2:
            raise ValueError(f"Features.from_lengths: 'lengths' must be [num_features, batch_size], "
                             f"got shape {tuple(lengths.shape)}")
        offsets = np.zeros(lengths.numel() + 1, dtype=np.int64)
        np.cumsum(_host(lengths).reshape(-1), out=offsets[1:])
        return cls(dense, values.to(torch.int64), _like(offsets, values), int(lengths.shape[1]),
                   int(lengths.shape[0]), keys)

    # --- views ---------------------------------------------------------------------------
    def lengths(self) -> torch.Tensor:
        """Ids per bag, [num_features, batch_size]."""
        return (self.offsets[1:] - self.offsets[:-1]).view(self.num_features, self.batch_size)

    def position(self, key: str | int) -> int:
        """Storage position of feature `key` (a name from ``keys``, or a position itself)."""
        if isinstance(key, str):
            if self.keys is None:
                raise KeyError(f"feature {key!r}: these Features have no keys; select by position")
            try:
                return self.keys.index(key)
            except ValueError:
                raise KeyError(f"no feature {key!r}; have {list(self.keys)}") from None
        f = check_int("Features", "key", key)
        if not 0 <= f < self.num_features:
            raise IndexError(f"feature index {f} out of range [0, {self.num_features})")
        return f

    def bag(self, f: int | str) -> tuple[torch.Tensor, torch.Tensor]:
        """Feature `f` (position or name) alone: (values, offsets of length B + 1 starting at 0)."""
        f = self.position(f)
        offs = self.offsets[f * self.batch_size: (f + 1) * self.batch_size + 1]
        return self.values[int(offs[0]): int(offs[-1])], offs - offs[0]

    def fused_ids(self, table_offsets: Sequence[int] | torch.Tensor) -> torch.Tensor:
        """``values`` shifted by ``table_offsets[f]`` so all tables can live in one tensor."""
        table_offsets = torch.as_tensor(table_offsets, dtype=torch.int64, device=self.values.device)
        if table_offsets.numel() != self.num_features:
            raise ValueError(f"Features.fused_ids: 'table_offsets' needs {self.num_features} entries, "
                             f"got {table_offsets.numel()}")
        b = self.batch_size
        per_feature = self.offsets[b::b] - self.offsets[:-1:b] if b else torch.zeros_like(table_offsets)
        return self.values + torch.repeat_interleave(table_offsets, per_feature, output_size=self.values.numel())

    # --- feature selection -----------------------------------------------------------------
    def select(self, names: Sequence[str]) -> Features:
        """Only the features called `names`, in that order (``KeyError`` for an unknown name).

        >>> f = Features.from_lengths(torch.zeros(1, 0), torch.tensor([1, 2, 3]), torch.ones(3, 1),
        ...                           keys=["a", "b", "c"])
        >>> g = f.select(["c", "a"])
        >>> g.keys, g.values.tolist()
        (('c', 'a'), [3, 1])
        """
        if isinstance(names, str):
            raise TypeError(f"Features.select: 'names' must be a sequence of str, got {names!r} (str)")
        return self.permute([self.position(check_type("Features.select", "names[]", n, str)) for n in names])

    def permute(self, indices: Sequence[int]) -> Features:
        """The features at positions `indices`, in that order (a reordering or a subset).

        On CUDA a reordering of all features runs without a host sync; so does a strict subset of
        features moved there by `to` (their ``feature_sizes`` give its size); other strict subsets
        read the number of ids they keep from the device (one sync).

        >>> f = Features.from_lengths(torch.zeros(2, 0), torch.arange(6), torch.tensor([[1, 1], [2, 0], [1, 1]]))
        >>> g = f.to("cpu")
        >>> g.feature_sizes, g.permute([2, 0]).feature_sizes, g.permute([2, 0]).values.tolist()
        ((2, 2, 2), (2, 2), [4, 5, 0, 1])
        """
        nf, b = self.num_features, self.batch_size
        indices = [self.position(i) for i in indices]
        if indices == list(range(nf)):
            return self
        keys = None if self.keys is None else tuple(self.keys[i] for i in indices)
        sizes = None if self.feature_sizes is None else tuple(self.feature_sizes[i] for i in indices)
        on_cpu = host_reads_free(self.values) and not torch.compiler.is_exporting()  # numpy: not traceable
        consecutive = bool(indices) and indices == list(range(indices[0], indices[0] + len(indices)))
        if on_cpu and consecutive:
            # Consecutive features (e.g. a model's fixed-vocabulary ones, next to its dynamic ones) are
            # contiguous in the feature-major layout: views, no copy.
            offs = self.offsets[indices[0] * b: (indices[-1] + 1) * b + 1]
            values, offsets = self.values[int(offs[0]): int(offs[-1])], offs - offs[0]
        elif on_cpu:
            values, offsets = _take_bags(_host(self.values), _host(self.offsets), nf, b, indices, slice(None))
            values, offsets = _like(values, self.values), _like(offsets, self.offsets)
        else:  # a step's modules reading these features in one order share one reordering (hostpath.one_step)
            complete = sorted(indices) == list(range(nf))
            values, offsets = once_per_step(("Features.permute", tuple(indices), sizes), (self.values, self.offsets),
                                            lambda: self._permute_on_device(indices, complete, sizes))
        return Features(self.dense, values, offsets, b, len(indices), keys, sizes)

    def _permute_sized(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """`_permute_on_device` where every feature's size is known on the host (``feature_sizes``): each
        feature's ids and offsets are slices at host-known bounds, its offsets moved by a host int --
        a concatenation of each, a subtraction per moved feature (no index built on the device)."""
        b, starts = self.batch_size, np.concatenate([[0], np.cumsum(self.feature_sizes)]).tolist()
        values, offsets, at = [], [], 0
        for j, f in enumerate(indices):
            values.append(self.values[starts[f]:starts[f + 1]])
            part = self.offsets[f * b:(f + 1) * b + (j == len(indices) - 1)]  # the last one keeps its end
            offsets.append(part if starts[f] == at else part - (starts[f] - at))
            at += starts[f + 1] - starts[f]
        return tuple(parts[0] if len(parts) == 1 else torch.cat(parts) for parts in (values, offsets))

    def _permute_on_device(self, indices: list[int], complete: bool,
                           sizes: tuple[int, ...] | None) -> tuple[torch.Tensor, torch.Tensor]:
        nf, b, device = self.num_features, self.batch_size, self.values.device
        # A tensor made from host data is a copy to the device: once per layout (cached), never in a
        # step a CUDA graph records; a trace makes its own.
        tracing = torch.compiler.is_compiling() or torch.compiler.is_exporting()
        if self.feature_sizes is not None and indices and b and not tracing:
            return self._permute_sized(indices)
        index = (torch.tensor(indices, dtype=torch.int64, device=device) if tracing
                 else _device_index(tuple(indices), device))
        starts = self.offsets[:-1].view(nf, b).index_select(0, index).reshape(-1)
        lens = (self.offsets[1:] - self.offsets[:-1]).view(nf, b).index_select(0, index).reshape(-1)
        offsets = torch.zeros(lens.numel() + 1, dtype=torch.int64, device=device)
        torch.cumsum(lens, 0, out=offsets[1:])
        # A reordering keeps every id, so the size is known without asking the device.
        if complete:
            total = self.values.numel()
        elif sizes is not None:  # counted on the host before the batch was copied
            total = sum(sizes)
        else:  # .item(), not int(): under torch.export a symbolic size, bounded by these checks
            total = offsets[-1].item()
            torch._check(total >= 0)
            torch._check(total <= self.values.numel())
        idx = torch.repeat_interleave(starts - offsets[:-1], lens, output_size=total)
        idx += torch.arange(total, dtype=torch.int64, device=device) if tracing else positions(total, device)
        return self.values[idx], offsets

    # --- row operations (used by re-batching and shuffling) -------------------------------
    def take(self, rows) -> Features:
        """The examples at positions `rows` (1-D ints), in that order. Runs on the host
        (numpy); meant for the input pipeline."""
        rows = np.asarray(_host(torch.as_tensor(rows)), dtype=np.int64)
        if rows.size and (rows.min() < -self.batch_size or rows.max() >= self.batch_size):
            raise IndexError(f"'rows' must be in [0, {self.batch_size}), got {rows.min()}..{rows.max()}")
        values, offsets = _take_bags(_host(self.values), _host(self.offsets), self.num_features,
                                     self.batch_size, slice(None), rows)
        return Features(_like(_host(self.dense)[rows], self.dense), _like(values, self.values),
                        _like(offsets, self.offsets), int(rows.size), self.num_features, self.keys)

    def slice(self, start: int, stop: int) -> Features:
        """Examples ``start:stop`` (clipped like a Python slice)."""
        start, stop, _ = slice(start, stop).indices(self.batch_size)
        stop = max(start, stop)
        values, offsets = _take_bags(_host(self.values), _host(self.offsets), self.num_features,
                                     self.batch_size, slice(None), slice(start, stop))
        return Features(self.dense[start:stop], _like(values, self.values), _like(offsets, self.offsets),
                        stop - start, self.num_features, self.keys)

    def split(self, size: int) -> list[Features]:
        """Consecutive row slices of `size` examples each, in order (the last may be smaller);
        ``[self]`` when the batch has at most `size` rows. Features kept, keys kept.

        The offsets are read on the host once for all the slices (on an accelerator: one host
        sync per call, not per slice); ids are gathered where they live, dense rows are views.

        >>> f = Features.from_lengths(torch.arange(5.0).view(5, 1), torch.arange(1, 9),
        ...                           torch.tensor([[1, 1, 1, 1, 1], [0, 2, 0, 0, 1]]), keys=("a", "b"))
        >>> parts = f.split(2)
        >>> [p.batch_size for p in parts], [p.values.tolist() for p in parts]
        ([2, 2, 1], [[1, 2, 6, 7], [3, 4], [5, 8]])
        >>> parts[2].bag("b")[0].tolist(), parts[2].dense.tolist(), parts[0].keys, parts[0].feature_sizes
        ([8], [[4.0]], ('a', 'b'), (2, 2))
        """
        size = check_int("Features.split", "size", size, minimum=1)
        b, nf = self.batch_size, self.num_features
        if b <= size:
            return [self]
        offsets = _host(self.offsets).reshape(-1)
        firsts, lasts = offsets[:-1].reshape(nf, b), offsets[1:].reshape(nf, b)
        parts = []
        for start in range(0, b, size):
            stop = min(start + size, b)
            starts = firsts[:, start:stop].reshape(-1)
            idx, new_offsets = _gather_index(starts, lasts[:, start:stop].reshape(-1) - starts)
            if self.values.device.type == "cpu":
                values = _like(_host(self.values)[idx], self.values)
            else:  # the index goes to the device; the ids never leave it
                values = self.values.index_select(0, torch.from_numpy(idx).to(self.values.device))
            sizes = tuple(int(n) for n in np.diff(new_offsets[::stop - start]))  # read here anyway: see `to`
            parts.append(Features(self.dense[start:stop], values, _like(new_offsets, self.offsets), stop - start,
                                  nf, self.keys, sizes))
        return parts

    @staticmethod
    def concat(parts: Sequence[Features]) -> Features:
        """Examples of all `parts`, in order (same features: same ``num_features`` and ``keys``)."""
        if not parts:
            raise ValueError("Features.concat: 'parts' is empty")
        if len(parts) == 1:
            return parts[0]
        ref = parts[0]
        nf = ref.num_features
        if any(p.num_features != nf for p in parts):
            raise ValueError(f"Features.concat: parts have different num_features: {[p.num_features for p in parts]}")
        if any(p.keys != ref.keys for p in parts):
            raise ValueError(f"Features.concat: parts have different keys: {sorted({p.keys for p in parts}, key=str)}")
        values, offsets = _concat_bags([(_host(p.values), _host(p.offsets), p.batch_size) for p in parts], nf)
        dense = np.concatenate([_host(p.dense) for p in parts])
        return Features(_like(dense, ref.dense), _like(values, ref.values), _like(offsets, ref.offsets),
                        sum(p.batch_size for p in parts), nf, ref.keys)

    # --- devices -------------------------------------------------------------------------
    def to(self, device: torch.device | str, non_blocking: bool = False) -> Features:
        """On `device`. From the host, ``feature_sizes`` is counted first (one read of
        ``num_features + 1`` offsets that are there anyway), so that the device never has to be
        asked how many ids a subset of the features holds."""
        sizes = self.feature_sizes
        if sizes is None and self.offsets.device.type == "cpu" and not torch.compiler.is_exporting():
            bounds = _host(self.offsets)[::self.batch_size] if self.batch_size else np.zeros(self.num_features + 1)
            sizes = tuple(int(n) for n in np.diff(bounds))
        return Features(self.dense.to(device, non_blocking=non_blocking),
                        self.values.to(device, non_blocking=non_blocking),
                        self.offsets.to(device, non_blocking=non_blocking), self.batch_size, self.num_features,
                        self.keys, sizes)

    def pin_memory(self) -> Features:
        """Page-locked copies, so a later ``.to(cuda, non_blocking=True)`` is truly async."""
        return Features(self.dense.pin_memory(), self.values.pin_memory(), self.offsets.pin_memory(),
                        self.batch_size, self.num_features, self.keys, self.feature_sizes)

    # --- checks --------------------------------------------------------------------------
    def validate(self, schema) -> Features:
        """Raise ValueError (naming feature, example and id) unless this matches `schema`.

        The rules live with the schema (``schema.check_features``); this is a shortcut.
        """
        schema.check_features(self)
        return self
