"""Pooled lookups of a schema's ``dynamic=True`` features: one :class:`~recstream.nn.HashEmbedding` each.

A dynamic feature has no id space: its ids are int64 keys, and its table gives a row to every
key seen ``permit_filter_value`` times in training (evicting the least recently seen beyond
``capacity``, and keys unseen for ``evict_filter_value`` steps). A key without a row (never
seen, not admitted yet, or evicted) reads the table's ``default_value`` -- zeros -- in
training and in serving alike, so a server answers a new user instead of failing.

The models' :class:`~recstream.models.FeatureEmbedding` and
:class:`~recstream.models.LinearTerm` hold a :class:`DynamicTables` for their dynamic features
next to the fused :class:`~recstream.nn.EmbeddingBagCollection` of the fixed ones.

Keys ``-1`` and ``-2`` are the hash table's reserved EMPTY/DELETED markers; they are stored as
``-2**63 + 1`` and ``-2**63`` instead (so an id -1, a common "unknown" code, still trains).

>>> import torch
>>> from recstream.data import CategoricalFeature, Features
>>> tables = DynamicTables([CategoricalFeature("user", dynamic=True, capacity=100)], [4], init_std=0.01)
>>> x = Features.from_lengths(torch.zeros(3, 0), torch.tensor([7, 2**40, -1]), torch.ones(1, 3), keys=["user"])
>>> tables(x)["user"].shape, tables.tables["user"].num_rows
(torch.Size([3, 4]), 3)
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..data.schema import CategoricalFeature
from ..features import Features
from ..nn import HashEmbedding
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


def hash_init(owner: str, init_std: float) -> str:
    """HashEmbedding's ``param_init`` for a model's `init_std`: it has two fixed choices."""
    init_std = check_number(owner, "init_std", init_std, minimum=0.0)
    if init_std == 0.0:
        return "zeros"
    if abs(init_std - _HASH_INIT_STD) > 1e-12:
        raise ValueError(f"{owner}: 'init_std' must be 0.0 or {_HASH_INIT_STD} for a schema with dynamic features "
                         f"(their HashEmbedding rows start as N(0, {_HASH_INIT_STD}**2) or zeros), got {init_std}")
    return "normal"


class DynamicTables(nn.Module):
    """One HashEmbedding per dynamic feature; ``forward(features)`` -> ``{name: pooled [B, dim]}``.

    Args:
        features: the dynamic features (schema order).
        dims: the width of each one's table.
        init_std: 0.0 (rows start at zero: a linear term) or 0.01 (see :func:`hash_init`).
        sparse: sparse COO gradients on the rows (use a row-sparse optimizer).

    Submodule ``tables`` is an ``nn.ModuleDict`` keyed by feature name ('.' becomes '_').
    """

    def __init__(self, features: Sequence[CategoricalFeature], dims: Sequence[int], *, init_std: float = 0.01,
                 sparse: bool = True) -> None:
        super().__init__()
        init = hash_init(type(self).__name__, init_std)
        self.features = tuple(features)
        self.names = tuple(f.name for f in self.features)
        self._table_names = tuple(f.name.replace(".", "_") for f in self.features)
        self.tables = nn.ModuleDict({
            f.name.replace(".", "_"): HashEmbedding(d, param_init=init, sparse=sparse, capacity=f.capacity,
                                                    permit_filter_value=f.permit_filter_value,
                                                    evict_filter_value=f.evict_filter_value)
            for f, d in zip(self.features, dims, strict=True)})

    def forward(self, features: Features) -> dict[str, torch.Tensor]:
        """Pooled vectors of every dynamic feature (`features` must carry ``keys``)."""
        out = {}
        b = features.batch_size
        for f, name in zip(self.features, self._table_names, strict=True):
            ids, offsets = features.bag(f.name)
            emb = self.tables[name](table_key(ids))  # [n, dim]
            if not f.multi_hot and ids.numel() == b:  # one id per bag: nothing to pool
                out[f.name] = emb
            else:  # pool the looked-up rows per bag (empty bags give zeros)
                out[f.name] = F.embedding_bag(torch.arange(ids.numel(), device=ids.device), emb, offsets,
                                              mode=f.pooling, include_last_offset=True)
        return out
