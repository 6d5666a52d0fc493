"""DeepFM (Guo et al., 2017): factorization machine and MLP sharing one set of embeddings.

``logit = linear(x) + FM(fields) + MLP(flatten(fields))`` where ``fields`` is ``[B, n, D]``:
one embedding per categorical feature (pooled, one fused table) followed by one vector per
dense feature, scaled by its value (``x_j * v_j``, as in the paper's treatment of numeric
fields), so dense features take part in the pairwise interactions too. The FM term is the
sum over field pairs of ``<e_i, e_j>``, computed in O(n D) with the identity
``sum_{i<j} <e_i, e_j> = 0.5 * (|sum_i e_i|^2 - sum_i |e_i|^2)``.

Returns logits ``[B]`` (see `recstream.models.base`).

>>> import torch
>>> from recstream.data import CategoricalFeature, Schema
>>> from recstream.data import Features
>>> net = DeepFM(Schema(["x"], [CategoricalFeature("a", vocab_size=5), CategoricalFeature("b", vocab_size=7)]),
...              hidden=(8,), embedding_dim=4)
>>> net(Features.from_lengths(torch.randn(3, 1), torch.tensor([0, 1, 2, 3, 4, 6]), torch.ones(2, 3))).shape
torch.Size([3])
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from ..data.schema import Schema
from ..features import Features
from ..nn import TierPlan
from .base import CTRModel
from .embedding import FeatureEmbedding, check_schema
from .linear import LinearTerm
from .mlp import MLP


def fm_interaction(fields: torch.Tensor) -> torch.Tensor:
    """``sum_{i<j} <fields[:, i], fields[:, j]>`` for ``fields`` ``[B, n, D]`` -> ``[B]``.

    >>> e = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]])
    >>> fm_interaction(e).tolist()  # 11 + 17 + 39
    [67.0]
    """
    square_of_sum = fields.sum(dim=1).square()
    sum_of_square = fields.square().sum(dim=1)
    return 0.5 * (square_of_sum - sum_of_square).sum(dim=1)


class DeepFM(CTRModel):
    """DeepFM CTR model.

    Args:
        schema: features (at least one categorical).
        hidden: widths of the MLP's hidden layers (a final Linear(., 1) follows).
        embedding_dim: width of every field; None requires all schema widths to be equal.
        dropout: drop probability after each hidden layer of the MLP, in [0, 1).
        batch_norm: BatchNorm1d after each hidden linear layer of the MLP.
        activation: of the MLP: one of ``relu, gelu, silu, tanh, sigmoid``.
        init_std: initial std of the embeddings (categorical tables and dense-field vectors).
        validate: check ids on every step (see `FeatureEmbedding`).
        disk_tier: a `recstream.nn.TierPlan`: which tables (fixed or dynamic) live on disk behind a cache
            (docs/models.md).

    Submodules: ``linear`` (`LinearTerm`, first order), ``embedding``
    (`FeatureEmbedding`), ``dense_fields`` (``[n_dense, D]`` Parameter), ``deep``.
    A ``dynamic=True`` feature's first-order weight is column 0 of its ``embedding`` hash table
    (width ``D + 1``), not a table of ``linear``: one hash lookup per feature and step.
    """

    def __init__(self, schema: Schema, hidden: Sequence[int] = (256, 128), *, embedding_dim: int | None = None,
                 dropout: float = 0.0, batch_norm: bool = False, activation: str = "relu",
                 init_std: float = 0.01, validate: bool = True,
                 disk_tier: TierPlan | None = None) -> None:
        super().__init__()
        self.schema = check_schema(type(self).__name__, schema)
        # Dynamic features keep their first-order weight as column 0 of their embedding table:
        # one hash lookup per feature and step instead of two (both parts train with one optimizer).
        self.linear = LinearTerm(schema, validate=validate, use_dynamic=False, disk_tier=disk_tier)
        self.embedding = FeatureEmbedding(schema, embedding_dim, equal_dims=True, init_std=init_std,
                                          validate=validate, first_order=True, disk_tier=disk_tier)
        dim = self.embedding.field_dim
        self.dense_fields = nn.Parameter(torch.randn(schema.num_dense, dim) * init_std)
        self.num_fields = self.embedding.num_fields + schema.num_dense  # deep=True crosses are fields too
        self.deep = MLP(self.num_fields * dim, hidden, out_features=1, activation=activation,
                        dropout=dropout, batch_norm=batch_norm)

    def fields(self, features: Features) -> torch.Tensor:
        """All field vectors ``[B, n_categorical + n_dense, D]``."""
        return self._fields(features)[0]

    def _fields(self, features: Features) -> tuple[torch.Tensor, torch.Tensor | None]:
        cat, first = self.embedding.fields_with_first_order(features)
        if not self.schema.num_dense:
            return cat, first
        dense = features.dense.unsqueeze(2) * self.dense_fields  # [B, n_dense, D]
        return torch.cat([cat, dense], dim=1), first

    def forward(self, features: Features) -> torch.Tensor:
        fields, first = self._fields(features)
        deep = self.deep(fields.flatten(1)).squeeze(1)
        linear = self.linear(features) if first is None else self.linear(features) + first
        return linear + fm_interaction(fields) + deep
