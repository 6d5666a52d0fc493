"""First-order (linear / "wide") term over categorical ids, cross ids and dense values.

`LinearTerm` computes ``bias + sum_f w_f(ids of f) + dense @ v``, ``f`` over the
schema's categorical features and its crosses (`CrossFeature`, all of
them, whatever their ``deep``): one scalar
weight per id, held as width-1 tables of its own `EmbeddingBagCollection`
(sparse gradients, zero-initialised as a logistic regression should be). This is the
wide part of Wide&Deep (train it with FTRL: its L1 drives unused weights to exactly 0)
and the first-order term of DeepFM.

>>> import torch
>>> from recstream.data import CategoricalFeature, Schema
>>> from recstream.data import Features
>>> lin = LinearTerm(Schema(["x"], [CategoricalFeature("c", vocab_size=5)]))
>>> lin(Features.from_lengths(torch.ones(3, 1), torch.tensor([0, 1, 4]), torch.ones(1, 3))).tolist()
[0.0, 0.0, 0.0]
"""
from __future__ import annotations

import torch
from torch import nn

from ..data.schema import Schema
from ..features import Features
from ..nn import EmbeddingBagCollection, EmbeddingTableConfig, TierPlan
from ..validation import check_bool
from .dynamic import DynamicTables
from .embedding import check_features, check_schema, schema_keys, table_name, tier_lookup


class LinearTerm(nn.Module):
    """Logistic-regression logit ``[B]`` of `schema`'s features.

    Args:
        schema: the feature schema.
        use_dense: include a weight per dense feature (else ids and bias only).
        use_dynamic: include the ``dynamic=True`` features (a width-1 HashEmbedding each, rows
            starting at 0); False when the model takes their weights from elsewhere (DeepFM:
            a column of its embedding tables).
        sparse: sparse COO gradients for the id weights.
        validate: check ids on every call (see `FeatureEmbedding`).
        disk_tier: a `recstream.nn.TierPlan`: the tables of its features on disk (``<directory>/wide/``).
    """

    def __init__(self, schema: Schema, *, use_dense: bool = True, sparse: bool = True,
                 validate: bool = True, use_dynamic: bool = True, disk_tier: TierPlan | None = None) -> None:
        super().__init__()
        owner = type(self).__name__
        self.schema = check_schema(owner, schema, need_categorical=False)
        tiers = tier_lookup(owner, disk_tier, schema, part="wide")
        check_bool(owner, "use_dense", use_dense)
        check_bool(owner, "sparse", sparse)
        check_bool(owner, "validate", validate)
        self.ebc = None
        feats = schema.categorical + schema.cross_tables()  # every cross: the wide part is where they help
        tables = [EmbeddingTableConfig(table_name(f.name), f.num_embeddings, 1, pooling=f.pooling, init_std=0.0,
                                       feature_names=(f.name,), tier=tiers(table_name(f.name), f.name))
                  for f in feats if not f.dynamic]
        if tables:
            self.ebc = EmbeddingBagCollection(tables, sparse=sparse, validate=validate)
        # Dynamic features: a width-1 HashEmbedding each, zero rows (a new key starts at weight 0).
        check_bool(owner, "use_dynamic", use_dynamic)
        dynamic = [f for f in schema.categorical if f.dynamic and use_dynamic]
        self.dynamic = DynamicTables(dynamic, [1] * len(dynamic), init_std=0.0, sparse=sparse,
                                     tiers=tiers) if dynamic else None
        # With dynamic features the fused tables hold a subset: inputs are matched to them by name.
        self._by_name = any(f.dynamic for f in schema.categorical) or bool(schema.crosses)
        self._seen_keys: tuple[str, ...] | None = None  # input names already checked for the crosses
        self.dense = nn.Linear(schema.num_dense, 1, bias=False) if use_dense and schema.num_dense else None
        if self.dense is not None:
            nn.init.zeros_(self.dense.weight)
        self.bias = nn.Parameter(torch.zeros(1))

    def _check_crosses(self, keys: tuple[str, ...]) -> None:
        missing = [n for n in self.schema.cross_names if n not in keys]
        if missing:
            raise ValueError(f"{type(self).__name__}.forward: 'features' lack the crosses {missing}: batches of "
                             "the readers, streams and server carry them; add them to batches built otherwise "
                             "with recstream.data.convert.with_crosses(schema, features)")
        self._seen_keys = keys

    def forward(self, features: Features) -> torch.Tensor:
        check_features(type(self).__name__, features, self.schema)
        logit = self.bias.expand(features.batch_size)
        if self._by_name:
            features = schema_keys(features, self.schema)
            if self.schema.crosses and features.keys != self._seen_keys:  # once per layout of inputs
                self._check_crosses(features.keys)
        if self.dynamic is not None:
            logit = logit + torch.cat(list(self.dynamic(features).values()), dim=1).sum(dim=1)
        if self.ebc is not None:
            # Width-1 tables: the [B, F] output holds one pooled weight per feature.
            logit = logit + self.ebc(features).sum(dim=1)
        if self.dense is not None:
            logit = logit + self.dense(features.dense).squeeze(1)
        return logit
