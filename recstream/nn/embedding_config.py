"""Configuration of one embedding table of an :class:`EmbeddingBagCollection`.

A table owns ``num_embeddings`` rows of width ``embedding_dim``. One or more
sparse *features* read from it (``feature_names``; by default the single
feature named like the table). Sharing a table between features (e.g. "user
clicked item" and "candidate item") shares rows and therefore gradients.

Example:
    >>> cfg = EmbeddingTableConfig("item", num_embeddings=1000, embedding_dim=16,
    ...                            pooling="mean", feature_names=("item", "hist_item"))
    >>> cfg.feature_names
    ('item', 'hist_item')
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from ._checks import check_choice, check_float, check_int

__all__ = ["EmbeddingTableConfig", "POOLINGS"]

POOLINGS = ("sum", "mean")


def _check_name(arg: str, value) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{arg} must be a str, got {value!r} ({type(value).__name__})")
    # '.' would make the per-table state_dict key `tables.<name>.weight` ambiguous.
    if not value or "." in value:
        raise ValueError(f"{arg} must be a non-empty string without '.', got {value!r}")
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
    feature_names: Optional[Sequence[str]] = None

    def __post_init__(self) -> None:
        _check_name("name", self.name)
        check_int("num_embeddings", self.num_embeddings, min_value=1)
        check_int("embedding_dim", self.embedding_dim, min_value=1)
        check_choice("pooling", self.pooling, POOLINGS)
        check_float("init_std", self.init_std, min_value=0.0)
        names = (self.name,) if self.feature_names is None else self.feature_names
        if isinstance(names, str) or not isinstance(names, Sequence):
            raise TypeError(
                f"feature_names must be a sequence of str, got {names!r} ({type(names).__name__})"
            )
        names = tuple(_check_name("feature_names[]", n) for n in names)
        if not names:
            raise ValueError(f"feature_names must name at least one feature, got {names!r}")
        if len(set(names)) != len(names):
            raise ValueError(f"feature_names must be unique, got {names!r}")
        # frozen dataclass: normalise list -> tuple so the config stays hashable.
        object.__setattr__(self, "feature_names", names)
