"""Wide & Deep (Cheng et al., 2016): a linear model and an MLP trained jointly.

``logit = wide(x) + deep(x)`` where

* wide = `LinearTerm`: bias + one weight per categorical id
  (+ one per dense value), in its OWN width-1 sparse tables, so it can be trained by a
  different optimizer than the deep part (the paper uses FTRL with L1 for the wide part;
  `default_optimizer` does the same). A ``dynamic=True`` feature's
  wide weight is instead column 0 of its deep hash table (as in DeepFM): one hash lookup per
  feature and step instead of two -- the lookup, not the arithmetic, is what a dynamic
  feature costs -- so those weights train with the tables' optimizer, not FTRL;
* deep = MLP over the concatenated feature embeddings (one fused
  [`EmbeddingBagCollection`][recstream.nn.embedding_bag_collection.EmbeddingBagCollection]) and the dense values.

Returns logits ``[B]`` (see `recstream.models.base` for the convention).

>>> import torch
>>> from torch import nn
>>> from recstream import Model
>>> from recstream.data import SyntheticCTR
>>> from recstream.models import WideDeep, ctr_metrics, default_optimizer
>>> gen = SyntheticCTR(num_dense=2, num_categorical=3, vocab_sizes=[10, 20, 30], batch_size=64)
>>> net = WideDeep(gen.schema, hidden=(16,), embedding_dim=4)
>>> model = Model(net, nn.BCEWithLogitsLoss(), default_optimizer(net), metrics=ctr_metrics(), progress_bar=False)
>>> history = model.train(1, gen.train_batches(5))
>>> sorted(model.eval(gen.test_split(256)))
['auc', 'logloss']
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from ..data.schema import Schema
from ..features import Features
from ..nn import TierPlan
from ..validation import check_bool
from .base import CTRModel
from .embedding import FeatureEmbedding, check_schema
from .linear import LinearTerm
from .mlp import MLP


class WideDeep(CTRModel):
    """Wide & Deep CTR model.

    Args:
        schema: features (at least one categorical).
        hidden: widths of the deep MLP's hidden layers (a final Linear(., 1) follows).
        embedding_dim: width of every deep table; None keeps each feature's own width.
        wide_dense: feed dense values to the wide part too (they always go to the deep part).
        dropout: drop probability after each hidden layer of the deep MLP, in [0, 1).
        batch_norm: BatchNorm1d after each hidden linear layer of the deep MLP.
        activation: of the deep MLP: one of ``relu, gelu, silu, tanh, sigmoid``.
        init_std: initial std of the deep tables.
        validate: check ids on every step (see `FeatureEmbedding`).
        disk_tier: a `recstream.nn.TierPlan`: which tables (fixed or dynamic) live on disk behind a cache
            (docs/models.md).

    Submodules: ``wide`` (`LinearTerm`), ``embedding`` (`FeatureEmbedding`),
    ``deep`` (`MLP`). A ``dynamic=True`` feature's wide weight is column 0 of its
    ``embedding`` hash table (width ``embedding_dim + 1``), not a table of ``wide``.
    """

    def __init__(self, schema: Schema, hidden: Sequence[int] = (256, 128), *, embedding_dim: int | None = None,
                 wide_dense: bool = True, dropout: float = 0.0, batch_norm: bool = False,
                 activation: str = "relu", init_std: float = 0.01, validate: bool = True,
                 disk_tier: TierPlan | None = None) -> None:
        super().__init__()
        self.schema = check_schema(type(self).__name__, schema)
        check_bool(type(self).__name__, "wide_dense", wide_dense)
        # Dynamic features: the wide weight shares the deep row's hash lookup (see the module doc).
        self.wide = LinearTerm(schema, use_dense=wide_dense, validate=validate, use_dynamic=False,
                               disk_tier=disk_tier)
        self.embedding = FeatureEmbedding(schema, embedding_dim, init_std=init_std, validate=validate,
                                          first_order=True, disk_tier=disk_tier)
        self.deep = MLP(self.embedding.output_dim + schema.num_dense, hidden, out_features=1,
                        activation=activation, dropout=dropout, batch_norm=batch_norm)

    def forward(self, features: Features) -> torch.Tensor:
        emb, first = self.embedding.with_first_order(features)
        deep = self.deep(torch.cat([emb, features.dense], dim=1)).squeeze(1)
        wide = self.wide(features) if first is None else self.wide(features) + first
        return wide + deep
