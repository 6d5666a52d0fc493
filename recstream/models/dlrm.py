"""DLRM (Naumov et al., 2019): bottom MLP, pairwise dot interactions, top MLP.

* bottom MLP: dense values -> ... -> ``D`` (ReLU on every layer, as the reference model),
  so the dense part becomes one more ``D``-vector next to the categorical embeddings;
* interaction: the dot products ``<t_i, t_j>`` of every pair ``i < j`` of the ``n``
  vectors ``[bottom(dense), e_1, ..., e_F]`` (``i <= j`` with ``self_interaction``),
  computed as one batched matrix product and read out by a fixed index of the pairs;
* top MLP over ``[bottom(dense), dots]`` -> ``Linear(1)``.

Without dense features the bottom MLP is skipped and only the embeddings interact.
Returns logits ``[B]`` (see `recstream.models.base`).

>>> import torch
>>> from recstream.data import CategoricalFeature, Schema
>>> from recstream.data import Features
>>> net = DLRM(Schema(["x", "y"], [CategoricalFeature("a", vocab_size=5), CategoricalFeature("b", vocab_size=5)]),
...            bottom=(8,), top=(8,), embedding_dim=4)
>>> net(Features.from_lengths(torch.randn(3, 2), torch.tensor([0, 1, 4, 2, 2, 3]), torch.ones(2, 3))).shape
torch.Size([3])
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from ..data.schema import Schema
from ..features import Features
from ..nn import TierPlan
from ..validation import check_bool, check_sizes
from .base import CTRModel
from .embedding import FeatureEmbedding, check_schema
from .mlp import MLP


class DLRM(CTRModel):
    """Deep Learning Recommendation Model.

    Args:
        schema: features (at least one categorical).
        bottom: hidden widths of the bottom MLP; a last layer of width ``D`` is appended.
        top: hidden widths of the top MLP (a final Linear(., 1) follows).
        embedding_dim: width ``D`` of every table; None requires equal schema widths.
        self_interaction: also use each vector's squared norm ``<t_i, t_i>``.
        activation: of the top MLP: one of ``relu, gelu, silu, tanh, sigmoid``.
        dropout: drop probability after each hidden layer of the top MLP, in [0, 1).
        batch_norm: BatchNorm1d after each hidden linear layer of the top MLP.
        init_std: initial std of the tables.
        validate: check ids on every step (see `FeatureEmbedding`).
        disk_tier: a `recstream.nn.TierPlan`: which tables (fixed or dynamic) live on disk behind a cache
            (docs/models.md).

    Submodules: ``embedding``, ``bottom`` (None without dense features), ``top``.
    """

    def __init__(self, schema: Schema, bottom: Sequence[int] = (64,), top: Sequence[int] = (256, 128), *,
                 embedding_dim: int | None = None, self_interaction: bool = False, activation: str = "relu",
                 dropout: float = 0.0, batch_norm: bool = False, init_std: float = 0.01,
                 validate: bool = True,
                 disk_tier: TierPlan | None = None) -> None:
        super().__init__()
        owner = type(self).__name__
        self.schema = check_schema(owner, schema)
        bottom = check_sizes(owner, "bottom", bottom)
        check_bool(owner, "self_interaction", self_interaction)
        self.embedding = FeatureEmbedding(schema, embedding_dim, equal_dims=True, init_std=init_std,
                                          validate=validate, disk_tier=disk_tier)
        dim = self.embedding.field_dim
        self.bottom = MLP(schema.num_dense, bottom + (dim,)) if schema.num_dense else None
        n = self.embedding.num_fields + (1 if self.bottom is not None else 0)  # with deep=True crosses
        rows, cols = torch.tril_indices(n, n, offset=0 if self_interaction else -1)
        # Flat positions in the [n, n] dot matrix: one gather instead of advanced 2-D indexing.
        self.register_buffer("_pairs", rows * n + cols, persistent=False)
        top_in = self._pairs.numel() + (dim if self.bottom is not None else 0)
        if top_in == 0:
            raise ValueError(f"{owner}: one categorical feature and no dense feature leave no pair to "
                             f"interact; pass self_interaction=True or add features (schema {schema!r})")
        self.top = MLP(top_in, top, out_features=1, activation=activation, dropout=dropout,
                       batch_norm=batch_norm)

    def forward(self, features: Features) -> torch.Tensor:
        emb = self.embedding.fields(features)  # [B, F, D]
        if self.bottom is not None:
            z = self.bottom(features.dense)  # [B, D]
            vectors = torch.cat([z.unsqueeze(1), emb], dim=1)
        else:
            vectors = emb
        dots = torch.bmm(vectors, vectors.transpose(1, 2)).flatten(1)  # [B, n*n]
        inter = dots.index_select(1, self._pairs)
        top_in = inter if self.bottom is None else torch.cat([z, inter], dim=1)
        return self.top(top_in).squeeze(1)
