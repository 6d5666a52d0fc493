"""Feature schema: which columns are dense, which are categorical, and how ids map to rows.

A :class:`Schema` is the contract between the readers (which turn raw columns into
:class:`~recstream.data.Batch` objects) and the models (which size their embedding tables
from it). It is JSON-able so it can be saved next to a checkpoint.

Id conventions, per categorical feature:

* ``vocab_size=N``: ids must already be integers in ``[0, N)``; anything else is a bad row.
* ``vocabulary=[...]``: string values are looked up; id ``0`` is reserved for
  missing/unknown values and ``vocabulary[i]`` gets id ``i + 1`` (so ``vocab_size`` is
  ``len(vocabulary) + 1``).
* ``hash_buckets=N``: values (strings or integers) are hashed with a stable 64-bit hash;
  id ``0`` is reserved for missing values and hashed values land in ``[1, N)``.

>>> s = Schema([DenseFeature("price")], [CategoricalFeature("item", hash_buckets=1000)])
>>> s.num_embeddings("item"), Schema.from_dict(s.to_dict()) == s
(1000, True)
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

_POOLINGS = ("sum", "mean")
_SCHEMA_VERSION = 1


def _check_name(name: Any, what: str) -> str:
    if not isinstance(name, str) or not name:
        raise TypeError(f"{what} name must be a non-empty str, got {name!r}")
    return name


def _positive_int(value: Any, arg: str, owner: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{owner}: '{arg}' must be an int >= {minimum}, got {value!r}")
    return value


@dataclass(frozen=True)
class DenseFeature:
    """A numeric column, fed to the model as one float32 column of ``Features.dense``.

    >>> DenseFeature("age").name
    'age'
    """

    name: str

    def __post_init__(self) -> None:
        _check_name(self.name, "DenseFeature")


@dataclass(frozen=True)
class CategoricalFeature:
    """A categorical column looked up in an embedding table of ``num_embeddings`` rows.

    Exactly one of ``vocab_size`` / ``hash_buckets`` / ``vocabulary`` sets the id space
    (``vocabulary`` fills in ``vocab_size``). Multi-hot values arrive as lists (Parquet) or
    ``separator``-joined strings (CSV); ``max_len`` keeps the first ``max_len`` ids of a bag.

    >>> f = CategoricalFeature("genres", vocabulary=["drama", "comedy"], multi_hot=True)
    >>> f.num_embeddings, f.vocab_size
    (3, 3)
    """

    name: str
    vocab_size: int | None = None
    hash_buckets: int | None = None
    embedding_dim: int = 16
    multi_hot: bool = False
    max_len: int | None = None
    pooling: str = "sum"
    separator: str = "|"
    vocabulary: tuple[str, ...] | None = field(default=None, compare=True)

    def __post_init__(self) -> None:
        owner = f"CategoricalFeature({self.name!r})"
        _check_name(self.name, "CategoricalFeature")
        for arg in ("vocab_size", "hash_buckets", "embedding_dim", "max_len"):
            value = getattr(self, arg)  # numpy ints are fine; store plain ints (JSON-able)
            if isinstance(value, numbers.Integral) and not isinstance(value, (bool, int)):
                object.__setattr__(self, arg, int(value))
        if self.vocabulary is not None:
            self._set_vocabulary(owner)
        if (self.vocab_size is None) == (self.hash_buckets is None):
            raise ValueError(f"{owner}: give exactly one of 'vocab_size' or 'hash_buckets' "
                             f"(got vocab_size={self.vocab_size!r}, hash_buckets={self.hash_buckets!r})")
        if self.vocab_size is not None:
            _positive_int(self.vocab_size, "vocab_size", owner)
        else:  # bucket 0 is reserved for missing values, so at least one more is needed
            _positive_int(self.hash_buckets, "hash_buckets", owner, minimum=2)
        _positive_int(self.embedding_dim, "embedding_dim", owner)
        if not isinstance(self.multi_hot, bool):
            raise TypeError(f"{owner}: 'multi_hot' must be a bool, got {self.multi_hot!r}")
        if self.max_len is not None:
            _positive_int(self.max_len, "max_len", owner)
            if not self.multi_hot:
                raise ValueError(f"{owner}: 'max_len' applies to multi_hot features only")
        if self.pooling not in _POOLINGS:
            raise ValueError(f"{owner}: 'pooling' must be one of {_POOLINGS}, got {self.pooling!r}")
        if not isinstance(self.separator, str) or not self.separator:
            raise ValueError(f"{owner}: 'separator' must be a non-empty str, got {self.separator!r}")

    def _set_vocabulary(self, owner: str) -> None:
        vocab = self.vocabulary
        if isinstance(vocab, (str, bytes)) or not isinstance(vocab, Iterable):
            raise TypeError(f"{owner}: 'vocabulary' must be a sequence of str, got {type(vocab).__name__}")
        vocab = tuple(vocab)
        bad = [v for v in vocab if not isinstance(v, str)]
        if bad:
            raise TypeError(f"{owner}: 'vocabulary' entries must be str, got {bad[0]!r}")
        if len(set(vocab)) != len(vocab):
            raise ValueError(f"{owner}: 'vocabulary' has duplicate entries")
        if self.hash_buckets is not None:
            raise ValueError(f"{owner}: 'vocabulary' and 'hash_buckets' are exclusive")
        size = len(vocab) + 1  # id 0: missing / unknown value
        if self.vocab_size is not None and self.vocab_size != size:
            raise ValueError(f"{owner}: 'vocab_size' must be len(vocabulary) + 1 = {size} "
                             f"(id 0 is reserved for unknown values), got {self.vocab_size}")
        object.__setattr__(self, "vocabulary", vocab)
        object.__setattr__(self, "vocab_size", size)

    @property
    def hashed(self) -> bool:
        """True when raw values are hashed into ``hash_buckets``."""
        return self.hash_buckets is not None

    @property
    def num_embeddings(self) -> int:
        """Rows of this feature's embedding table (ids are in ``[0, num_embeddings)``)."""
        return self.vocab_size if self.vocab_size is not None else self.hash_buckets

    def to_dict(self) -> dict:
        d = {"name": self.name, "embedding_dim": self.embedding_dim, "multi_hot": self.multi_hot,
             "max_len": self.max_len, "pooling": self.pooling, "separator": self.separator}
        if self.vocabulary is not None:
            d["vocabulary"] = list(self.vocabulary)
        elif self.hash_buckets is not None:
            d["hash_buckets"] = self.hash_buckets
        else:
            d["vocab_size"] = self.vocab_size
        return d


def num_embeddings(feature: CategoricalFeature) -> int:
    """Rows of the embedding table for `feature`.

    >>> num_embeddings(CategoricalFeature("c", vocab_size=10))
    10
    """
    if not isinstance(feature, CategoricalFeature):
        raise TypeError(f"'feature' must be a CategoricalFeature, got {type(feature).__name__}")
    return feature.num_embeddings


class Schema:
    """Dense features, categorical features and the label column, validated together.

    Strings in `dense` are shorthand for :class:`DenseFeature`.

    >>> s = Schema(["x"], [CategoricalFeature("c", vocab_size=5, embedding_dim=4)], label="y")
    >>> s.dense_names, s.categorical_names, s.table_sizes()
    (('x',), ('c',), [5])
    """

    def __init__(self, dense: Sequence[DenseFeature | str] = (),
                 categorical: Sequence[CategoricalFeature] = (), label: str = "label") -> None:
        if isinstance(dense, (str, DenseFeature)) or isinstance(categorical, CategoricalFeature):
            raise TypeError("'dense' and 'categorical' must be sequences of features, not a single feature")
        self.dense = tuple(DenseFeature(d) if isinstance(d, str) else d for d in dense)
        self.categorical = tuple(categorical)
        for d in self.dense:
            if not isinstance(d, DenseFeature):
                raise TypeError(f"'dense' entries must be DenseFeature or str, got {type(d).__name__}")
        for c in self.categorical:
            if not isinstance(c, CategoricalFeature):
                raise TypeError(f"'categorical' entries must be CategoricalFeature, got {type(c).__name__}")
        self.label = _check_name(label, "label")
        names = [d.name for d in self.dense] + [c.name for c in self.categorical] + [label]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"Schema: column names must be unique (label included), duplicated: {dupes}")
        if not self.dense and not self.categorical:
            raise ValueError("Schema: needs at least one dense or categorical feature")
        self._index = {c.name: i for i, c in enumerate(self.categorical)}

    @property
    def dense_names(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.dense)

    @property
    def categorical_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.categorical)

    @property
    def num_dense(self) -> int:
        return len(self.dense)

    @property
    def num_categorical(self) -> int:
        return len(self.categorical)

    @property
    def columns(self) -> tuple[str, ...]:
        """All column names a reader needs: label, dense, categorical."""
        return (self.label,) + self.dense_names + self.categorical_names

    def feature(self, key: str | int) -> CategoricalFeature:
        """A categorical feature by name or position."""
        if isinstance(key, str):
            if key not in self._index:
                raise KeyError(f"no categorical feature {key!r}; have {list(self._index)}")
            return self.categorical[self._index[key]]
        if isinstance(key, int) and not isinstance(key, bool):
            if not -len(self.categorical) <= key < len(self.categorical):
                raise IndexError(f"categorical feature index {key} out of range [0, {len(self.categorical)})")
            return self.categorical[key]
        raise TypeError(f"feature key must be a name or an index, got {type(key).__name__}")

    def num_embeddings(self, f: str | int | CategoricalFeature) -> int:
        """Embedding-table rows of feature `f` (a name, an index or the feature itself)."""
        return num_embeddings(f if isinstance(f, CategoricalFeature) else self.feature(f))

    def table_sizes(self) -> list[int]:
        """``num_embeddings`` of every categorical feature, in schema order."""
        return [c.num_embeddings for c in self.categorical]

    def to_dict(self) -> dict:
        """A JSON-able description; :meth:`from_dict` rebuilds an equal schema."""
        return {"version": _SCHEMA_VERSION, "label": self.label,
                "dense": [d.name for d in self.dense],
                "categorical": [c.to_dict() for c in self.categorical]}

    @classmethod
    def from_dict(cls, d: dict) -> "Schema":
        if not isinstance(d, dict):
            raise TypeError(f"Schema.from_dict: expected a dict, got {type(d).__name__}")
        if d.get("version") != _SCHEMA_VERSION:
            raise ValueError(f"Schema.from_dict: unsupported version {d.get('version')!r}, "
                             f"expected {_SCHEMA_VERSION}")
        cats = []
        for c in d.get("categorical", []):
            c = dict(c)
            if "vocabulary" in c:
                c["vocabulary"] = tuple(c["vocabulary"])
            cats.append(CategoricalFeature(**c))
        return cls([DenseFeature(n) for n in d.get("dense", [])], cats, label=d.get("label", "label"))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Schema):
            return NotImplemented
        return (self.dense, self.categorical, self.label) == (other.dense, other.categorical, other.label)

    def __hash__(self) -> int:
        return hash((self.dense, self.categorical, self.label))

    def __repr__(self) -> str:
        return (f"Schema(dense={list(self.dense_names)}, categorical={list(self.categorical_names)}, "
                f"label={self.label!r})")
