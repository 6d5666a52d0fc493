"""DCN-V2 (Wang et al., 2021): a cross network and an MLP over the embedded features.

The input ``x_0 = [embeddings of all categorical features, dense values]`` feeds

* ``structure="stacked"``: ``x_0 -> CrossNetwork -> MLP -> Linear(1)``;
* ``structure="parallel"``: ``concat(CrossNetwork(x_0), MLP(x_0)) -> Linear(1)``.

The cross layers can be low-rank (``low_rank=r``, see `CrossNetwork`). An empty
``hidden`` gives the cross network with a linear read-out, in both structures.

Returns logits ``[B]`` (see `recstream.models.base`).

>>> import torch
>>> from recstream.data import CategoricalFeature, Schema
>>> from recstream.data import Features
>>> net = DCNv2(Schema(["x"], [CategoricalFeature("a", vocab_size=5)]), hidden=(8,), embedding_dim=4,
...             structure="parallel", low_rank=2)
>>> net(Features.from_lengths(torch.randn(3, 1), torch.tensor([0, 1, 4]), torch.ones(1, 3))).shape
torch.Size([3])
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from ..data.schema import Schema
from ..features import Features
from ..nn import TierPlan
from ..validation import check_choice
from .base import CTRModel
from .cross import CrossNetwork
from .embedding import FeatureEmbedding, check_schema
from .mlp import MLP

STRUCTURES = ("stacked", "parallel")


class DCNv2(CTRModel):
    """Deep & Cross Network V2 CTR model.

    Args:
        schema: features (at least one categorical).
        num_cross_layers: cross layers (>= 1).
        hidden: widths of the MLP's hidden layers (may be empty).
        structure: "stacked" or "parallel" (see the module doc).
        low_rank: rank of the cross matrices, None for full rank.
        embedding_dim: width of every table; None keeps each feature's own width.
        dropout: drop probability after each hidden layer of the MLP, in [0, 1).
        batch_norm: BatchNorm1d after each hidden linear layer of the MLP.
        activation: of the MLP: one of ``relu, gelu, silu, tanh, sigmoid``.
        init_std: initial std of the tables.
        validate: check ids on every step (see `FeatureEmbedding`).
        disk_tier: a `recstream.nn.TierPlan`: which tables (fixed or dynamic) live on disk behind a cache
            (docs/models.md).

    Submodules: ``embedding``, ``cross`` (`CrossNetwork`), ``deep`` (`MLP`,
    no head), ``head`` (``Linear(., 1)``).
    """

    def __init__(self, schema: Schema, num_cross_layers: int = 3, hidden: Sequence[int] = (256, 128), *,
                 structure: str = "stacked", low_rank: int | None = None, embedding_dim: int | None = None,
                 dropout: float = 0.0, batch_norm: bool = False, activation: str = "relu",
                 init_std: float = 0.01, validate: bool = True,
                 disk_tier: TierPlan | None = None) -> None:
        super().__init__()
        self.schema = check_schema(type(self).__name__, schema)
        self.structure = check_choice(type(self).__name__, "structure", structure, STRUCTURES)
        self.embedding = FeatureEmbedding(schema, embedding_dim, init_std=init_std, validate=validate,
                                          disk_tier=disk_tier)
        width = self.embedding.output_dim + schema.num_dense
        self.cross = CrossNetwork(width, num_cross_layers, low_rank)
        self.deep = MLP(width, hidden, activation=activation, dropout=dropout, batch_norm=batch_norm)
        # Parallel with an empty MLP would feed x_0 twice; read out the cross network only.
        self.parallel_deep = structure == "parallel" and len(self.deep.hidden) > 0
        head_in = self.deep.out_features + (width if self.parallel_deep else 0)
        self.head = nn.Linear(head_in, 1)

    def forward(self, features: Features) -> torch.Tensor:
        x0 = torch.cat([self.embedding(features), features.dense], dim=1)
        crossed = self.cross(x0)
        if self.parallel_deep:
            out = torch.cat([crossed, self.deep(x0)], dim=1)
        else:  # stacked (or parallel without hidden layers)
            out = self.deep(crossed)
        return self.head(out).squeeze(1)
