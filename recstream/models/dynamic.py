"""Pooled lookups of a schema's ``dynamic=True`` features: one `HashEmbedding` each,
or one for all the features that name the same ``table``.

A dynamic feature has no id space: its ids are int64 keys, and its table gives a row to every
key seen ``permit_filter_value`` times in training (evicting the least recently seen beyond
``capacity``, and keys unseen for ``evict_filter_value`` steps). A key without a row (never
seen, not admitted yet, or evicted) reads the table's ``default_value`` -- zeros -- in
training and in serving alike, so a server answers a new user instead of failing.

The models' `FeatureEmbedding` and
`LinearTerm` hold a `DynamicTables` for their dynamic features
next to the fused `EmbeddingBagCollection` of the fixed ones.

Keys ``-1`` and ``-2`` are the hash table's reserved EMPTY/DELETED markers; they are stored as
``-2**63 + 1`` and ``-2**63`` instead (so an id -1, a common "unknown" code, still trains).

Features that share a table (``CategoricalFeature(table=...)``) are looked up together, one call
for all their ids; each one's keys are XOR-ed with a 64-bit hash of its name first
(`feature_salt`), so equal ids of two features stay two keys. Two keys of different features
could still meet -- when their XOR equals the XOR of the two salts --, a chance of about one in
2**64 per pair of keys, the same as for two string ids hashing alike.

>>> import torch
>>> from recstream.data import CategoricalFeature, Features
>>> tables = DynamicTables([CategoricalFeature("user", dynamic=True, capacity=100)], [4], init_std=0.01)
>>> x = Features.from_lengths(torch.zeros(3, 0), torch.tensor([7, 2**40, -1]), torch.ones(1, 3), keys=["user"])
>>> tables(x)["user"].shape, tables.tables["user"].num_rows
(torch.Size([3, 4]), 3)
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import torch
import torch.nn.functional as F
from torch import nn

from ..data.hashing import hash_strings
from ..data.schema import CategoricalFeature
from ..features import Features
from ..hostpath import host_reads_free, positions
from ..nn import HashEmbedding
from ..nn.hash_device_path import lookup_masked_many
from ..validation import check_number

_RESERVED_SHIFT = -(2 ** 63) + 2  # -1 -> -2**63 + 1, -2 -> -2**63: keys no real id uses in practice
# HashEmbedding's fixed initial scale of param_init="normal" (its rows start as N(0, 0.01**2)).
_HASH_INIT_STD = 0.01


def table_key(keys: torch.Tensor) -> torch.Tensor:
    """`keys` with the two reserved values moved out of the way (see the module doc).

    >>> table_key(torch.tensor([5, -1, -2, -3])).tolist()
    [5, -9223372036854775807, -9223372036854775808, -3]
    """
    return torch.where((keys | 1) == -1, keys + _RESERVED_SHIFT, keys)  # x | 1 == -1 only for -1 and -2


def feature_salt(feature: CategoricalFeature) -> int:
    """What a shared table's feature XORs its keys with: the stable hash of its name (part of a
    trained model's meaning: it never changes); 0 (keys as they are) for a feature with a table of
    its own.

    >>> feature_salt(CategoricalFeature("user", dynamic=True, capacity=8))
    0
    >>> feature_salt(CategoricalFeature("user", dynamic=True, capacity=8, table="ids"))
    -403470525483829148
    """
    if feature.table is None:
        return 0
    return int(hash_strings(pa.array([feature.name])).view(np.int64)[0])


def hash_init(owner: str, init_std: float) -> str:
    """HashEmbedding's ``param_init`` for a model's `init_std`: it has two fixed choices."""
    init_std = check_number(owner, "init_std", init_std, minimum=0.0)
    if init_std == 0.0:
        return "zeros"
    if abs(init_std - _HASH_INIT_STD) > 1e-12:
        raise ValueError(f"{owner}: 'init_std' must be 0.0 or {_HASH_INIT_STD} for a schema with dynamic features "
                         f"(their HashEmbedding rows start as N(0, {_HASH_INIT_STD}**2) or zeros), got {init_std}")
    return "normal"


def _table_key(feature: CategoricalFeature) -> str:
    """The key of the table `feature` reads in ``DynamicTables.tables``: its shared table's name or its
    own ('.' is not allowed in a module name)."""
    return (feature.table or feature.name).replace(".", "_")


class DynamicTables(nn.Module):
    """The dynamic features' hash tables; ``forward(features)`` -> ``{name: pooled [B, dim]}``.

    Args:
        features: the dynamic features (schema order).
        dims: the width of each one's table (features of one ``table``: the same width).
        init_std: 0.0 (rows start at zero: a linear term) or 0.01 (see `hash_init`).
        sparse: sparse COO gradients on the rows (use a row-sparse optimizer).
        tiers: ``(table key, feature names) -> DiskTier | None``: which tables keep their rows on disk
            (a model's ``disk_tier``, `recstream.nn.TierPlan`); None: all in memory.

    Submodule ``tables`` is an ``nn.ModuleDict`` of `HashEmbedding`, keyed by
    feature name, or by ``table`` name for features that share one ('.' becomes '_'); a shared
    table has the sum of its features' capacities.
    """

    def __init__(self, features: Sequence[CategoricalFeature], dims: Sequence[int], *, init_std: float = 0.01,
                 sparse: bool = True, tiers=None) -> None:
        super().__init__()
        owner = type(self).__name__
        init = hash_init(owner, init_std)
        self.features = tuple(features)
        self.names = tuple(f.name for f in self.features)
        dims = tuple(dims)
        if len(dims) != len(self.features):
            raise ValueError(f"{owner}: needs one width per feature, got {len(dims)} for {len(self.features)}")
        # table key -> its features (positions in self.features), in schema order
        self._members: dict[str, list[int]] = {}
        for i, f in enumerate(self.features):
            self._members.setdefault(_table_key(f), []).append(i)
        shared = {_table_key(f) for f in self.features if f.table is not None}
        own = [_table_key(f) for f in self.features if f.table is None]
        if clash := sorted(shared.intersection(own)):
            raise ValueError(f"{owner}: a shared table's name is also a dynamic feature's own table: {clash}; "
                             f"rename the table")
        self._salts = tuple(feature_salt(f) for f in self.features)
        tables = {}
        for key, members in self._members.items():
            f = self.features[members[0]]
            widths = {dims[i] for i in members}
            if len(widths) != 1:
                raise ValueError(f"{owner}: the features of table {key!r} need one width, got "
                                 f"{[(self.features[i].name, dims[i]) for i in members]}")
            tables[key] = HashEmbedding(dims[members[0]], param_init=init, sparse=sparse,
                                        capacity=sum(self.features[i].capacity for i in members),
                                        permit_filter_value=f.permit_filter_value,
                                        evict_filter_value=f.evict_filter_value,
                                        tier=None if tiers is None else tiers(key, [self.names[i] for i in members]))
        self.tables = nn.ModuleDict(tables)

    def table_of(self, name: str) -> HashEmbedding:
        """The hash table that feature `name` reads (shared with others, or its own)."""
        if name not in self.names:
            raise ValueError(f"{type(self).__name__}: no dynamic feature {name!r}; there are {list(self.names)}")
        return self.tables[_table_key(self.features[self.names.index(name)])]

    def _keys(self, features: Features, members: list[int]) -> torch.Tensor:
        """The table keys of the ids of features `members` (positions in ``self.features``) of one table."""
        return self._table_keys(members, [features.bag(self.features[i].name)[0] for i in members])

    def _table_keys(self, members: list[int], ids: list[torch.Tensor]) -> torch.Tensor:
        """One table's keys of `ids`, the ids of its features `members` in order (salted where the
        table is shared), as one tensor."""
        keys = [x ^ self._salts[i] if self._salts[i] else x for i, x in zip(members, ids, strict=True)]
        return table_key(keys[0] if len(keys) == 1 else torch.cat(keys))

    def batch_prefetcher(self):
        """For a pipeline that has batches ready ahead of their steps (`recstream.train.sink.batch_prefetch`):
        None without disk-tiered tables; otherwise a function that `HashEmbedding.prefetch` es the keys
        of a `Features` carrying these features (by name; one that does not is passed over)."""
        tiered = [(key, members) for key, members in self._members.items()
                  if self.tables[key].disk_tier is not None]
        if not tiered:
            return None

        def prefetch_if_read(features: Features) -> None:
            if features.keys is None or not set(self.names) <= set(features.keys):
                return
            for key, members in tiered:
                self.tables[key].prefetch(self._keys(features, members))

        return prefetch_if_read

    def forward(self, features: Features) -> dict[str, torch.Tensor]:
        """Pooled vectors of every dynamic feature (`features` must carry ``keys``)."""
        if not host_reads_free(features.values) and not any(t.sharded for t in self.tables.values()):
            sizes = features.feature_sizes
            return self._forward_static(features) if sizes is None else self._forward_sized(features, sizes)
        out = {}
        for key, members in self._members.items():
            bags = [features.bag(self.features[i].name) for i in members]
            # one lookup for all the features of the table: its cost is mostly per call, not per key
            emb = self.tables[key](self._table_keys(members, [ids for ids, _ in bags]))  # [n, dim]
            for i, (ids, offsets), part in zip(members, bags, emb.split([ids.numel() for ids, _ in bags]),
                                               strict=True):
                out[self.features[i].name] = self._pool(self.features[i], ids, offsets, part, features.batch_size)
        return {name: out[name] for name in self.names}  # schema order

    def _forward_sized(self, features: Features, sizes: Sequence[int]) -> dict[str, torch.Tensor]:
        """`forward` on a device with no host sync when the batch's ids per feature were counted on
        the host (``Features.feature_sizes``, set as the batch moved there): each table looks up only
        its features' ids, slices of ``values`` at host-known bounds (`_forward_static`'s masked
        lookups of the whole batch cost each table the batch's ids, and their padding one hot row)."""
        values, b = features.values, features.batch_size
        starts = np.concatenate([[0], np.cumsum(sizes)]).tolist()
        # table_key is elementwise: once over the batch for every unsalted feature, whose keys are slices of it
        keyed = table_key(values) if not all(self._salts) else None
        calls, where = [], {}
        for key, members in self._members.items():
            where[key] = [features.position(self.features[i].name) for i in members]
            parts = [table_key(values[starts[f]:starts[f + 1]] ^ self._salts[i]) if self._salts[i]
                     else keyed[starts[f]:starts[f + 1]] for i, f in zip(members, where[key], strict=True)]
            flat = parts[0] if len(parts) == 1 else torch.cat(parts)
            calls.append((self.tables[key], flat, None))  # every key of the slices: no mask
        out = {}
        # every table at once: those whose bounds do not show room read their counters in one read
        looked_up = lookup_masked_many(calls, reserved_free=True)  # keys through table_key: none reserved
        for (key, members), emb in zip(self._members.items(), looked_up, strict=True):
            parts = emb.split([sizes[f] for f in where[key]])
            for i, f, part in zip(members, where[key], parts, strict=True):
                if self._one_per_bag(self.features[i], sizes[f], b):  # nothing to pool: no offsets made
                    out[self.features[i].name] = part
                    continue
                offsets = features.offsets[f * b:(f + 1) * b + 1] - starts[f]
                out[self.features[i].name] = self._pool(self.features[i], values[starts[f]:starts[f + 1]],
                                                        offsets, part, b)
        return {name: out[name] for name in self.names}  # schema order

    def _forward_static(self, features: Features) -> dict[str, torch.Tensor]:
        """`forward` on a device with no host sync: a feature's ids are a slice of ``values``
        whose bounds are data (``Features.bag`` reads them), so each table looks up every id of the
        batch with a mask of its features' ids (``lookup_masked_many``: one host read at most for all
        the tables) and each feature pools its own bags out of the whole batch's: every shape is the
        batch's."""
        values, offsets, b = features.values, features.offsets, features.batch_size
        positions = torch.arange(values.numel(), device=values.device)
        feature_of = (torch.searchsorted(offsets, positions, right=True) - 1) // b
        calls, where = [], {}
        for key, members in self._members.items():
            where[key] = [features.position(self.features[i].name) for i in members]
            mask, keys = None, values
            for i, f in zip(members, where[key], strict=True):
                mine = feature_of == f
                mask = mine if mask is None else mask | mine
                if self._salts[i]:
                    keys = torch.where(mine, values ^ self._salts[i], keys)
            calls.append((self.tables[key], table_key(keys), mask))
        out = {}
        # every table at once: those whose bounds do not show room read their counters in one read
        looked_up = lookup_masked_many(calls, reserved_free=True)  # keys through table_key: none reserved
        for (key, members), emb in zip(self._members.items(), looked_up, strict=True):
            for i, f in zip(members, where[key], strict=True):
                pooled = F.embedding_bag(positions, emb, offsets, mode=self.features[i].pooling,
                                         include_last_offset=True)
                out[self.features[i].name] = pooled[f * b:(f + 1) * b]
        return {name: out[name] for name in self.names}

    @staticmethod
    def _one_per_bag(f: CategoricalFeature, n: int, batch_size: int) -> bool:
        """Whether `n` ids of feature `f` are one per bag of a batch: its looked-up rows are its vectors."""
        return not f.multi_hot and n == batch_size

    @staticmethod
    def _pool(f: CategoricalFeature, ids: torch.Tensor, offsets: torch.Tensor, emb: torch.Tensor,
              batch_size: int) -> torch.Tensor:
        if DynamicTables._one_per_bag(f, ids.numel(), batch_size):  # one id per bag: nothing to pool
            return emb
        # pool the looked-up rows per bag (empty bags give zeros)
        return F.embedding_bag(positions(ids.numel(), ids.device), emb, offsets, mode=f.pooling,
                               include_last_offset=True)
