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

from collections.abc import Sequence
from dataclasses import dataclass

from ..validation import check_choice, check_int, check_number, check_str, describe

__all__ = ["EmbeddingTableConfig", "POOLINGS"]

POOLINGS = ("sum", "mean")


def _check_name(name: str, value) -> str:
    check_str("EmbeddingTableConfig", name, value)
    # '.' would make the per-table state_dict key `tables.<name>.weight` ambiguous.
    if "." in value:
        raise ValueError(f"EmbeddingTableConfig: '{name}' must be a non-empty str without '.', got {value!r}")
    return value


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
    """

    name: str
    num_embeddings: int
    embedding_dim: int
    pooling: str = "sum"
    init_std: float = 0.01
    feature_names: Sequence[str] | None = None

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
