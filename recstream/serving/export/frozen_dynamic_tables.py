"""The exportable stand-in of a model's `DynamicTables`.

``DynamicTables.forward`` slices each dynamic feature's ids out of the batch (``Features.bag``:
the slice bounds are read from ``offsets``, a data-dependent size) before its table's lookup.
An export cannot carry a size known only at run time through every format, so this module
looks up EVERY id of the batch in each dynamic feature's `FrozenHashLookup` and pools
only that feature's bags: ``F.embedding_bag`` over all ``F * B`` bags of the batch (whose
offsets start at 0 and end at ``N``: no slicing), then the feature's ``B`` rows are taken.
Each dynamic feature costs one lookup of the ``N`` ids (a few gathers each) instead of its own.

The keys go through `table_key` first (ids -1 and -2 are
stored under other keys), and a feature of a shared table XORs them with its salt before that
(`feature_salt`), as in training. The result is
``{name: pooled [B, dim]}``, equal to the eval forward of the tables: sum or mean pooling, zeros
for an empty bag.

>>> import torch
>>> from recstream.data import CategoricalFeature, Features
>>> from recstream.models.dynamic import DynamicTables
>>> tables = DynamicTables([CategoricalFeature("user", dynamic=True, capacity=8)], [2], init_std=0.01)
>>> x = Features.from_lengths(torch.zeros(3, 0), torch.tensor([7, 9, -1]), torch.ones(1, 3), keys=["user"])
>>> _ = tables(x)  # a training forward admits the three keys
>>> frozen = FrozenDynamicTables.from_dynamic_tables(tables.eval())
>>> torch.equal(frozen(x)["user"], tables(x)["user"])
True
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ...features import Features
from ...models.dynamic import DynamicTables, feature_salt, table_key
from ...validation import check_type
from .frozen_hash_lookup import FrozenHashLookup


class FrozenDynamicTables(nn.Module):
    """``forward(features)`` -> ``{name: pooled [B, dim]}`` from frozen tables (`features` carry ``keys``).

    Args:
        features: the dynamic [`CategoricalFeature`][recstream.data.schema.CategoricalFeature] s, in schema order.
        tables: the `FrozenHashLookup` s.
        table_index: for each feature, the position of its table in `tables` (features of a shared
            table have the same one); default: one table per feature, in order.
    """

    def __init__(self, features, tables, table_index=None) -> None:
        super().__init__()
        owner = type(self).__name__
        self.features = tuple(features)
        self.table_index = tuple(range(len(self.features)) if table_index is None else table_index)
        if len(self.table_index) != len(self.features) or not all(0 <= i < len(tables) for i in self.table_index):
            raise ValueError(f"{owner}: needs a table for each of the {len(self.features)} features, got "
                             f"{len(tables)} tables and table_index={list(self.table_index)}")
        self.salts = tuple(feature_salt(f) for f in self.features)
        self.tables = nn.ModuleList(tables)

    @classmethod
    def from_dynamic_tables(cls, dynamic: DynamicTables) -> FrozenDynamicTables:
        """A snapshot of `dynamic`'s tables now (see `FrozenHashLookup.from_hash_embedding`)."""
        check_type(cls.__name__, "dynamic", dynamic, DynamicTables)
        position = {id(t): i for i, t in enumerate(dynamic.tables.values())}
        tables = [FrozenHashLookup.from_hash_embedding(t) for t in dynamic.tables.values()]
        return cls(dynamic.features, tables, [position[id(dynamic.table_of(n))] for n in dynamic.names])

    def forward(self, features: Features) -> dict[str, torch.Tensor]:
        b, nf = features.batch_size, features.num_features
        keys = table_key(features.values)
        ids = torch.arange(keys.shape[0], dtype=torch.int64, device=keys.device)
        bag_len = (features.offsets[1:] - features.offsets[:-1]).view(nf, b)
        out = {}
        for f, t, salt in zip(self.features, self.table_index, self.salts, strict=True):
            p = features.position(f.name)
            table_keys = table_key(features.values ^ salt) if salt else keys
            # Every bag of the batch pooled from this table's rows; only feature p's are kept.
            pooled = F.embedding_bag(ids, self.tables[t](table_keys), features.offsets, mode="sum",
                                     include_last_offset=True)
            pooled = pooled.view(nf, b, -1)[p]
            if f.pooling == "mean":  # what mode="mean" computes: the sum over the bag's length (0 for empty bags)
                pooled = pooled / bag_len[p].clamp(min=1).to(pooled.dtype).unsqueeze(1)
            out[f.name] = pooled
        return out
