"""The embedding front-end shared by the models: one fused table per schema.

:class:`FeatureEmbedding` turns the categorical part of a :class:`~recstream.data.Features`
into pooled per-feature vectors with ONE :class:`~recstream.nn.EmbeddingBagCollection`
(one table per categorical feature, rows of all tables in one storage per width, one
``embedding_bag`` call per step). Tables have ``sparse=True`` gradients, so the row-sparse
optimizers of :mod:`recstream.optim` update only the rows a batch touched.

Multi-hot features are pooled with the feature's ``pooling`` ("sum" or "mean"); an empty
bag pools to zeros.

>>> import torch
>>> from recstream.data import CategoricalFeature, Schema
>>> from recstream.data import Features
>>> schema = Schema(["price"], [CategoricalFeature("user", vocab_size=10),
...                             CategoricalFeature("tags", vocab_size=50, multi_hot=True, pooling="mean")])
>>> emb = FeatureEmbedding(schema, embedding_dim=4)
>>> x = Features.from_lengths(torch.zeros(2, 1), torch.tensor([1, 2, 7, 8, 9, 3]),
...                           torch.tensor([[1, 1], [3, 1]]))
>>> emb(x).shape, emb.fields(x).shape
(torch.Size([2, 8]), torch.Size([2, 2, 4]))
"""
from __future__ import annotations

import torch
from torch import nn

from ..data.schema import Schema
from ..features import Features
from ..nn import EmbeddingBagCollection, EmbeddingTableConfig
from ..validation import check_bool, check_int, check_number, check_type


def table_name(feature_name: str) -> str:
    """Table name of a feature: '.' would make state_dict keys ambiguous, so it becomes '_'."""
    return feature_name.replace(".", "_")


def check_schema(owner: str, schema: object, need_categorical: bool = True) -> Schema:
    """`schema` if it is a Schema (with a categorical feature when `need_categorical`)."""
    check_type(owner, "schema", schema, Schema, allowed="a recstream.data.Schema")
    if need_categorical and schema.num_categorical == 0:
        raise ValueError(f"{owner}: 'schema' must have at least one categorical feature, got {schema!r}")
    return schema


def check_features(owner: str, features: object, schema: Schema) -> Features:
    """Shape checks of model inputs against `schema` (metadata only: no device sync).

    Named features (``features.keys``) are matched to the schema's by name in the embedding
    collections, which name any missing one; unnamed ones must be the schema's, in order.
    """
    check_type(f"{owner}.forward", "features", features, Features, allowed="a recstream.data.Features")
    if features.keys is None and features.num_features != schema.num_categorical:
        raise ValueError(f"{owner}.forward: 'features' has {features.num_features} categorical features, "
                         f"the schema has {schema.num_categorical} ({list(schema.categorical_names)})")
    if features.dense.dim() != 2 or features.dense.shape[1] != schema.num_dense:
        raise ValueError(f"{owner}.forward: 'features.dense' must be [batch_size, {schema.num_dense}], "
                         f"got {list(features.dense.shape)}")
    return features


class FeatureEmbedding(nn.Module):
    """Pooled embeddings of every categorical feature of `schema`.

    Args:
        schema: the feature schema; table ``i`` has ``schema.categorical[i].num_embeddings`` rows.
        embedding_dim: width of every table; None keeps each feature's own ``embedding_dim``.
        equal_dims: require one width for all features (FM and dot interactions need it);
            raises ValueError when ``embedding_dim`` is None and the schema's widths differ.
        sparse: sparse COO gradients for the tables (use a row-sparse optimizer).
        init_std: rows start as ``N(0, init_std**2)``.
        validate: check offsets and id ranges on every call. Costs two host syncs per
            step; worth it because an id past its table would otherwise silently read
            the NEXT table's rows of the fused storage.
    """

    def __init__(self, schema: Schema, embedding_dim: int | None = None, *, equal_dims: bool = False,
                 sparse: bool = True, init_std: float = 0.01, validate: bool = True) -> None:
        super().__init__()
        owner = type(self).__name__
        self.schema = check_schema(owner, schema)
        dim = check_int(owner, "embedding_dim", embedding_dim, minimum=1, allow_none=True)
        check_bool(owner, "equal_dims", equal_dims)
        check_bool(owner, "sparse", sparse)
        check_bool(owner, "validate", validate)
        init_std = check_number(owner, "init_std", init_std, minimum=0.0)
        dims = [dim or f.embedding_dim for f in schema.categorical]
        if equal_dims and len(set(dims)) > 1:
            raise ValueError(f"{owner}: this model needs one embedding width for all features, the schema has "
                             f"{dict(zip(schema.categorical_names, dims, strict=True))}; pass 'embedding_dim'")
        names = [table_name(f.name) for f in schema.categorical]
        if len(set(names)) != len(names):
            raise ValueError(f"{owner}: feature names {list(schema.categorical_names)} collide once '.' "
                             "is replaced by '_' in table names")
        # Features are named as in the schema, so named inputs are matched by name.
        tables = [EmbeddingTableConfig(n, f.num_embeddings, d, pooling=f.pooling, init_std=init_std,
                                       feature_names=(f.name,))
                  for n, f, d in zip(names, schema.categorical, dims, strict=True)]
        self.ebc = EmbeddingBagCollection(tables, sparse=sparse, validate=validate)
        self.dims = tuple(dims)
        self.num_fields = len(dims)
        self.output_dim = sum(dims)

    @property
    def field_dim(self) -> int:
        """The common width (only meaningful when all widths are equal)."""
        if len(set(self.dims)) != 1:
            raise ValueError(f"FeatureEmbedding: widths differ {self.dims}, there is no single field_dim")
        return self.dims[0]

    def forward(self, features: Features) -> torch.Tensor:
        """``[B, sum(dims)]``: the features' pooled vectors side by side, in schema order."""
        check_features(type(self).__name__, features, self.schema)
        return self.ebc(features)

    def fields(self, features: Features) -> torch.Tensor:
        """``[B, num_fields, dim]`` (needs equal widths): one vector per feature."""
        dim = self.field_dim
        return self.forward(features).view(features.batch_size, self.num_fields, dim)
