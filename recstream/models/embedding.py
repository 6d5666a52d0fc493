"""The embedding front-end shared by the models: one fused table per schema.

`FeatureEmbedding` turns the categorical part of a `Features`
into pooled per-feature vectors with ONE `EmbeddingBagCollection`
(one table per categorical feature, rows of all tables in one storage per width, one
``embedding_bag`` call per step). Tables have ``sparse=True`` gradients, so the row-sparse
optimizers of `recstream.optim` update only the rows a batch touched.

Multi-hot features are pooled with the feature's ``pooling`` ("sum" or "mean"); an empty
bag pools to zeros.

Dynamic features (``CategoricalFeature(dynamic=True, capacity=...)``, ids are any int64 keys)
get one [`HashEmbedding`][recstream.nn.hash_embedding.HashEmbedding] each (`DynamicTables`,
submodule ``dynamic``), mixed freely with the fixed ones, which keep the fused collection
(``ebc``, None when every feature is dynamic). The output is in schema order either way.

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
from ..nn import EmbeddingBagCollection, EmbeddingTableConfig, TierPlan
from ..validation import check_bool, check_int, check_number, check_type
from .dynamic import DynamicTables


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
    if features.keys is None and features.num_features not in (schema.num_categorical, schema.num_features):
        raise ValueError(f"{owner}.forward: 'features' has {features.num_features} categorical features, "
                         f"the schema has {schema.num_categorical} ({list(schema.categorical_names)})"
                         + (f" and {len(schema.crosses)} crosses" if schema.crosses else ""))
    if features.dense.dim() != 2 or features.dense.shape[1] != schema.num_dense:
        raise ValueError(f"{owner}.forward: 'features.dense' must be [batch_size, {schema.num_dense}], "
                         f"got {list(features.dense.shape)}")
    return features


def schema_keys(features: Features, schema: Schema) -> Features:
    """Unnamed `features` named as `schema`'s: its categorical features, then its crosses when
    they are there too (models with crosses read their inputs by name)."""
    if features.keys is not None:
        return features
    names = schema.feature_names if features.num_features == schema.num_features else schema.categorical_names
    return with_keys(features, names)


def with_keys(features: Features, names: tuple[str, ...]) -> Features:
    """`features` named by `names` (the schema's order) unless they carry names already."""
    if features.keys is not None:
        return features
    return Features(features.dense, features.values, features.offsets, features.batch_size,
                    features.num_features, names, features.feature_sizes)


def tier_lookup(owner: str, plan, schema: Schema, part: str = "embedding"):
    """``(table, features) -> DiskTier | None`` of a model's ``disk_tier`` (None: every table in memory);
    `features`: the name of the one feature a fixed table serves, or the names a dynamic table serves."""
    if plan is None:
        return lambda table, features: None
    if not isinstance(plan, TierPlan):
        raise TypeError(f"{owner}: 'disk_tier' must be a recstream.nn.TierPlan or None, got {type(plan).__name__}")
    plan.check_features(owner, [f.name for f in schema.categorical])
    return lambda table, features: plan.for_table(part, table, (features,) if isinstance(features, str) else features)


def _first_and_rest(pooled: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A dynamic feature's pooled ``[B, 1 + dim]``: its first-order column ``[B]`` and its vector.

    Where a gradient flows, as one ``split``: its backward is one ``cat`` of the two gradients, where a
    select's and a slice's backward each make a zero tensor and copy theirs in, and an add sums them
    (a step on a GPU launches 4 kernels fewer a table). Elsewhere (eval, exports) a select and a
    slice: an exported ``Split`` of this column ran into ONNX Runtime's buffer-reuse error
    ("Shape mismatch attempting to re-use buffer") on a served model with crosses."""
    if pooled.requires_grad and torch.is_grad_enabled() and not torch.jit.is_tracing():
        column, rest = pooled.split([1, pooled.shape[1] - 1], dim=1)
        return column.squeeze(1), rest
    return pooled[:, 0], pooled[:, 1:]


class FeatureEmbedding(nn.Module):
    """Pooled embeddings of every categorical feature of `schema`.

    Args:
        schema: the feature schema; table ``i`` has ``schema.categorical[i].num_embeddings`` rows,
            followed by a table per cross of ``deep=True`` (the others feed the linear part only).
        embedding_dim: width of every table; None keeps each feature's own ``embedding_dim``.
        equal_dims: require one width for all features (FM and dot interactions need it);
            raises ValueError when ``embedding_dim`` is None and the schema's widths differ.
        sparse: sparse COO gradients for the tables (use a row-sparse optimizer).
        init_std: rows start as ``N(0, init_std**2)``.
        validate: check offsets and id ranges on every call. Costs two host syncs per
            step; worth it because an id past its table would otherwise silently read
            the NEXT table's rows of the fused storage.
        first_order: give each dynamic feature's table one more column, its first-order
            (linear) weight, read by `with_first_order`: one hash lookup per feature and
            step instead of two (DeepFM uses it; its embeddings and linear term share an optimizer).
        disk_tier: a `recstream.nn.TierPlan`: the tables of its features live on disk behind a cache
            (``<directory>/embedding/<table>``; see docs/models.md).
    """

    def __init__(self, schema: Schema, embedding_dim: int | None = None, *, equal_dims: bool = False,
                 sparse: bool = True, init_std: float = 0.01, validate: bool = True,
                 first_order: bool = False, disk_tier: TierPlan | None = None) -> None:
        super().__init__()
        owner = type(self).__name__
        tiers = tier_lookup(owner, disk_tier, schema)
        self.schema = check_schema(owner, schema)
        dim = check_int(owner, "embedding_dim", embedding_dim, minimum=1, allow_none=True)
        check_bool(owner, "equal_dims", equal_dims)
        self.first_order = check_bool(owner, "first_order", first_order)
        check_bool(owner, "sparse", sparse)
        check_bool(owner, "validate", validate)
        init_std = check_number(owner, "init_std", init_std, minimum=0.0)
        feats = schema.categorical + schema.cross_tables(deep_only=True)  # crosses: deep=True ones only
        dims = [dim or f.embedding_dim for f in feats]
        if equal_dims and len(set(dims)) > 1:
            raise ValueError(f"{owner}: this model needs one embedding width for all features, the schema has "
                             f"{dict(zip([f.name for f in feats], dims, strict=True))}; pass 'embedding_dim'")
        names = [table_name(f.name) for f in feats]
        if len(set(names)) != len(names):
            raise ValueError(f"{owner}: feature names {[f.name for f in feats]} collide once '.' "
                             "is replaced by '_' in table names")
        # Features are named as in the schema, so named inputs are matched by name.
        tables = [EmbeddingTableConfig(n, f.num_embeddings, d, pooling=f.pooling, init_std=init_std,
                                       feature_names=(f.name,), tier=tiers(n, f.name))
                  for n, f, d in zip(names, feats, dims, strict=True) if not f.dynamic]
        self.ebc = EmbeddingBagCollection(tables, sparse=sparse, validate=validate) if tables else None
        dynamic = [(f, d) for f, d in zip(feats, dims, strict=True) if f.dynamic]
        extra = 1 if first_order else 0  # column 0: the first-order weight (see with_first_order)
        self.dynamic = DynamicTables([f for f, _ in dynamic], [d + extra for _, d in dynamic], init_std=init_std,
                                     sparse=sparse, tiers=tiers) if dynamic else None
        self._names = tuple(f.name for f in feats)
        self._crosses = bool(schema.crosses)  # inputs then hold more features than tables: read by name
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
        return self.with_first_order(features)[0]

    def with_first_order(self, features: Features) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(forward(features), first-order logit [B] of the dynamic features)``; the second is
        None unless built with ``first_order=True`` (and a dynamic feature)."""
        check_features(type(self).__name__, features, self.schema)
        if self._crosses:
            features = schema_keys(features, self.schema)
        if self.dynamic is None:
            return self.ebc(features), None
        features = with_keys(features, self._names)
        parts = {} if self.ebc is None else self.ebc.split(self.ebc(features))
        first = None
        for name, pooled in self.dynamic(features).items():
            if self.first_order:
                column, pooled = _first_and_rest(pooled)
                first = column if first is None else first + column
            parts[name] = pooled
        return torch.cat([parts[n] for n in self._names], dim=1), first

    def by_name(self, features: Features) -> dict[str, torch.Tensor]:
        """``{feature name: pooled [B, dim]}`` of every categorical feature."""
        out = self.forward(features)
        return dict(zip(self._names, out.split(self.dims, dim=1), strict=True))

    def fields(self, features: Features) -> torch.Tensor:
        """``[B, num_fields, dim]`` (needs equal widths): one vector per feature."""
        return self.fields_with_first_order(features)[0]

    def fields_with_first_order(self, features: Features) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`fields` and the first-order logit of `with_first_order`."""
        dim = self.field_dim
        out, first = self.with_first_order(features)
        return out.view(features.batch_size, self.num_fields, dim), first
