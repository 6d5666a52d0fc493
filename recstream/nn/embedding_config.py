"""Configuration of one embedding table of an `EmbeddingBagCollection`.

A table owns ``num_embeddings`` rows of width ``embedding_dim``. One or more
sparse *features* read from it (``feature_names``; by default the single
feature named like the table). Sharing a table between features (e.g. "user
clicked item" and "candidate item") shares rows and therefore gradients.
Table names become state_dict keys and must not contain '.'; feature names may.

Example:
    >>> cfg = EmbeddingTableConfig("item", num_embeddings=1000, embedding_dim=16,
    ...                            pooling="mean", feature_names=("item", "hist_item"))
    >>> cfg.feature_names
    ('item', 'hist_item')
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..validation import check_choice, check_int, check_number, check_str, describe

__all__ = ["DiskTier", "EmbeddingTableConfig", "POOLINGS", "TierPlan"]

POOLINGS = ("sum", "mean")


def _check_name(name: str, value) -> str:
    check_str("EmbeddingTableConfig", name, value)
    # '.' would make the per-table state_dict key `tables.<name>.weight` ambiguous.
    if "." in value:
        raise ValueError(f"EmbeddingTableConfig: '{name}' must be a non-empty str without '.', got {value!r}")
    return value


@dataclass(frozen=True)
class DiskTier:
    """Keep a table's rows and their optimizer state on local disk, ``cache_rows`` of them in memory.

    Args:
        directory: the table's store (created if absent, opened -- and a crash's uncommitted writes
            undone -- if present); one directory per table, on a local disk.
        cache_rows: rows held in memory (the trainable Parameter); at least the distinct rows of a
            batch. See docs/models.md for sizing.

    Example:
        >>> DiskTier("/tmp/item_tier", cache_rows=100_000).cache_rows
        100000
    """

    directory: str
    cache_rows: int

    def __post_init__(self) -> None:
        if not isinstance(self.directory, (str, os.PathLike)) or not os.fspath(self.directory):
            raise TypeError(f"DiskTier: 'directory' must be a non-empty path, got {describe(self.directory)}")
        object.__setattr__(self, "directory", os.fspath(self.directory))
        object.__setattr__(self, "cache_rows", check_int("DiskTier", "cache_rows", self.cache_rows, minimum=1))


@dataclass(frozen=True)
class TierPlan:
    """Which tables of a model live on disk: the tables of the features in `cache_rows`, each with
    a `DiskTier` of that many cached rows in ``directory/<part>/<table>`` (``part``: the model's
    ``embedding`` or ``wide`` tables). The recstream models take it as ``disk_tier=``; a fixed
    feature's table is an `EmbeddingBagCollection` table, a dynamic one's a `HashEmbedding`.

    Example:
        >>> plan = TierPlan("tiers", {"C3": 50_000})
        >>> plan.for_table("embedding", "C3", ("C3",))
        DiskTier(directory='tiers/embedding/C3', cache_rows=50000)
        >>> plan.for_table("embedding", "C1", ("C1",)) is None
        True
    """

    directory: str
    cache_rows: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.directory, (str, os.PathLike)) or not os.fspath(self.directory):
            raise TypeError(f"TierPlan: 'directory' must be a non-empty path, got {describe(self.directory)}")
        object.__setattr__(self, "directory", os.fspath(self.directory))
        if not isinstance(self.cache_rows, Mapping):
            raise TypeError(f"TierPlan: 'cache_rows' must map feature names to rows, got {describe(self.cache_rows)}")
        object.__setattr__(self, "cache_rows", {check_str("TierPlan", "cache_rows key", k):
                                                check_int("TierPlan", f"cache_rows[{k!r}]", v, minimum=1)
                                                for k, v in self.cache_rows.items()})

    def for_table(self, part: str, table: str, features: Sequence[str]) -> DiskTier | None:
        """The tier of table `table` of `part`, read by `features` (None: in memory)."""
        rows = [self.cache_rows[f] for f in features if f in self.cache_rows]
        return DiskTier(os.path.join(self.directory, part, table), max(rows)) if rows else None

    def check_features(self, owner: str, features: Sequence[str]) -> None:
        """Refuse a feature that is not one of the model's categorical features (fixed or dynamic)."""
        unknown = sorted(set(self.cache_rows) - set(features))
        if unknown:
            raise ValueError(f"{owner}: disk_tier names {unknown}, which are not categorical features of "
                             f"the schema; those are {list(features)}")


@dataclass(frozen=True)
class EmbeddingTableConfig:
    """One embedding table.

    Args:
        name: table name; the state_dict key is ``tables.<name>.weight``.
        num_embeddings: number of rows; ids must lie in ``[0, num_embeddings)``.
        embedding_dim: row width.
        pooling: ``"sum"`` or ``"mean"`` over the ids of one bag (an empty bag
            pools to zeros in both modes).
        init_std: rows are initialised from ``N(0, init_std**2)``.
        feature_names: features looked up in this table, default ``(name,)``.
        tier: a `DiskTier` to keep the table on disk behind a cache (None: in memory).
    """

    name: str
    num_embeddings: int
    embedding_dim: int
    pooling: str = "sum"
    init_std: float = 0.01
    feature_names: Sequence[str] | None = None
    tier: DiskTier | None = None

    def __post_init__(self) -> None:
        owner = "EmbeddingTableConfig"
        _check_name("name", self.name)
        # numpy ints and floats are fine; stored as plain python numbers
        object.__setattr__(self, "num_embeddings", check_int(owner, "num_embeddings", self.num_embeddings, minimum=1))
        object.__setattr__(self, "embedding_dim", check_int(owner, "embedding_dim", self.embedding_dim, minimum=1))
        check_choice(owner, "pooling", self.pooling, POOLINGS)
        object.__setattr__(self, "init_std", check_number(owner, "init_std", self.init_std, minimum=0.0))
        names = (self.name,) if self.feature_names is None else self.feature_names
        if isinstance(names, str) or not isinstance(names, Sequence):
            raise TypeError(f"{owner}: 'feature_names' must be a sequence of str, got {describe(names)}")
        names = tuple(check_str(owner, "feature_names[]", n) for n in names)
        if not names:
            raise ValueError(f"{owner}: 'feature_names' must name at least one feature, got {names!r}")
        if len(set(names)) != len(names):
            raise ValueError(f"{owner}: 'feature_names' must be unique, got {names!r}")
        # frozen dataclass: normalise list -> tuple so the config stays hashable.
        object.__setattr__(self, "feature_names", names)
        if self.tier is not None and not isinstance(self.tier, DiskTier):
            raise TypeError(f"{owner}: 'tier' must be a DiskTier or None, got {describe(self.tier)}")
