"""Feature schema: which columns are dense, which are categorical, and how ids map to rows.

A [`Schema`][recstream.data.schema.Schema] is the contract between the readers (which turn raw columns into
[`Batch`][recstream.data.batch.Batch] objects) and the models (which size their embedding tables
from it). It is JSON-able so it can be saved next to a checkpoint.

Id conventions, per categorical feature:

* ``vocab_size=N``: ids must already be integers in ``[0, N)``; anything else is a bad row.
* ``vocabulary=[...]``: string values are looked up; id ``0`` is reserved for
  missing/unknown values and ``vocabulary[i]`` gets id ``i + 1`` (so ``vocab_size`` is
  ``len(vocabulary) + 1``).
* ``hash_buckets=N``: values (strings or integers) are hashed with a stable 64-bit hash;
  id ``0`` is reserved for missing values and hashed values land in ``[1, N)``.
* ``dynamic=True`` (with ``capacity=N``): no id space at all. Ids are int64 KEYS of a
  [`HashEmbedding`][recstream.nn.hash_embedding.HashEmbedding] that gives a row to every key seen
  ``permit_filter_value`` times in training (at most ``capacity`` rows, least recently seen
  evicted first, keys unseen for ``evict_filter_value`` steps evicted). Integers (and
  strings holding a decimal integer, so CSV ``"12"`` is Parquet ``12``) are their own key;
  any other string is keyed by its stable 64-bit hash (`hash_strings`).
  A missing value is a bad row, as for ``vocab_size``. Unknown keys read a default vector.
  Dynamic features that name the same ``table`` share one hash table (one lookup a step for all
  of them; see [`CategoricalFeature`][recstream.data.schema.CategoricalFeature]).

Cross features (`CrossFeature`, ``Schema(..., crosses=[...])``) are derived, not read:
the converter computes them from the ids of two or more categorical features (see
`cross_bags`), and they follow the categorical features in
``Features`` (``schema.feature_names``). They feed the wide/linear part of a model unless
``deep=True``.

>>> s = Schema([DenseFeature("price")], [CategoricalFeature("item", hash_buckets=1000)])
>>> s.num_embeddings("item"), Schema.from_dict(s.to_dict()) == s
(1000, True)
>>> d = Schema(["price"], [CategoricalFeature("user", dynamic=True, capacity=10_000, permit_filter_value=2)])
>>> d.feature("user").dynamic, Schema.from_dict(d.to_dict()) == d
(True, True)
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from ..validation import check_bool, check_choice, check_int, check_str, check_type

if TYPE_CHECKING:
    from ..features import Features

_POOLINGS = ("sum", "mean")
_SCHEMA_VERSION = 1


@dataclass(frozen=True)
class DenseFeature:
    """A numeric column, fed to the model as one float32 column of ``Features.dense``.

    >>> DenseFeature("age").name
    'age'
    """

    name: str

    def __post_init__(self) -> None:
        check_str("DenseFeature", "name", self.name)


@dataclass(frozen=True)
class CategoricalFeature:
    """A categorical column looked up in an embedding table of ``num_embeddings`` rows.

    Exactly one of ``vocab_size`` / ``hash_buckets`` / ``vocabulary`` / ``dynamic=True`` sets
    the id space (``vocabulary`` fills in ``vocab_size``; see the module doc for each). Multi-hot
    values arrive as lists (Parquet) or ``separator``-joined strings (CSV); ``max_len`` keeps the
    first ``max_len`` ids of a bag.

    Dynamic features (``dynamic=True``) need ``capacity`` (rows of their hash table) and take
    ``permit_filter_value`` (occurrences before a key gets a row, >= 1) and
    ``evict_filter_value`` (steps unseen before a key is evicted; None: only capacity evicts);
    these three apply to dynamic features only.

    ``table`` (dynamic features only) names a hash table that several dynamic features share:
    one table, one lookup per step for all of them, instead of a table and a lookup each -- what
    keeps many dynamic features fast. Each feature's keys are kept apart from the others' (mixed
    with a 64-bit hash of the feature's name, so the same id in two features has two rows); the
    table's capacity is the sum of its features' ``capacity``, and its least recently seen keys
    are evicted whichever feature they belong to. Features of one table need the same
    ``permit_filter_value``, ``evict_filter_value`` and embedding width.

    >>> f = CategoricalFeature("genres", vocabulary=["drama", "comedy"], multi_hot=True)
    >>> f.num_embeddings, f.vocab_size
    (3, 3)
    >>> CategoricalFeature("user", dynamic=True, capacity=1000).num_embeddings
    1000
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
    dynamic: bool = False
    capacity: int | None = None
    permit_filter_value: int = 1
    evict_filter_value: int | None = None
    table: str | None = None

    def __post_init__(self) -> None:
        check_str("CategoricalFeature", "name", self.name)
        owner = f"CategoricalFeature({self.name!r})"
        check_bool(owner, "dynamic", self.dynamic)
        # bucket 0 is reserved for missing values, so hashing needs at least one more
        minimums = {"vocab_size": 1, "hash_buckets": 2, "embedding_dim": 1, "max_len": 1, "capacity": 1,
                    "permit_filter_value": 1, "evict_filter_value": 1}
        for arg, minimum in minimums.items():  # numpy ints are fine; stored as plain ints (JSON-able)
            value = getattr(self, arg)
            if value is not None or arg in ("embedding_dim", "permit_filter_value"):  # None: not given
                object.__setattr__(self, arg, check_int(owner, arg, value, minimum=minimum))
        if self.vocabulary is not None:
            self._set_vocabulary(owner)
        if self.dynamic:
            self._check_dynamic(owner)
        elif (self.capacity, self.permit_filter_value, self.evict_filter_value, self.table) != (None, 1, None, None):
            raise ValueError(f"{owner}: 'capacity', 'permit_filter_value', 'evict_filter_value' and 'table' apply "
                             f"to dynamic=True features only (got capacity={self.capacity!r}, permit_filter_value="
                             f"{self.permit_filter_value!r}, evict_filter_value={self.evict_filter_value!r}, "
                             f"table={self.table!r})")
        elif (self.vocab_size is None) == (self.hash_buckets is None):
            raise ValueError(f"{owner}: give exactly one of 'vocab_size' or 'hash_buckets' (or 'vocabulary', or "
                             f"dynamic=True with 'capacity'), got vocab_size={self.vocab_size!r}, "
                             f"hash_buckets={self.hash_buckets!r}")
        check_bool(owner, "multi_hot", self.multi_hot)
        if self.max_len is not None and not self.multi_hot:
            raise ValueError(f"{owner}: 'max_len' applies to multi_hot features only")
        check_choice(owner, "pooling", self.pooling, _POOLINGS)
        check_str(owner, "separator", self.separator)

    def _check_dynamic(self, owner: str) -> None:
        given = {k: getattr(self, k) for k in ("vocab_size", "hash_buckets", "vocabulary") if getattr(self, k)}
        if given:
            raise ValueError(f"{owner}: a dynamic=True feature has no fixed id space; drop {sorted(given)} "
                             f"(got {given})")
        if self.capacity is None:
            raise ValueError(f"{owner}: dynamic=True needs 'capacity' (rows of its hash table), got None")
        if self.table is not None:
            check_str(owner, "table", self.table)

    def _set_vocabulary(self, owner: str) -> None:
        vocab = self.vocabulary
        if isinstance(vocab, (str, bytes)) or not isinstance(vocab, Iterable):
            raise TypeError(f"{owner}: 'vocabulary' must be a sequence of str, got {type(vocab).__name__}")
        vocab = tuple(vocab)
        for entry in vocab:
            check_type(owner, "vocabulary[]", entry, str, allowed="a str")
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
        """Rows of this feature's embedding table (ids are in ``[0, num_embeddings)``, except for a
        dynamic feature: any int64 key, ``capacity`` rows)."""
        if self.dynamic:
            return self.capacity
        return self.vocab_size if self.vocab_size is not None else self.hash_buckets

    def to_dict(self) -> dict:
        """A JSON-able description (the keyword arguments that rebuild this feature)."""
        d = {"name": self.name, "embedding_dim": self.embedding_dim, "multi_hot": self.multi_hot,
             "max_len": self.max_len, "pooling": self.pooling, "separator": self.separator}
        if self.dynamic:
            d.update(dynamic=True, capacity=self.capacity, permit_filter_value=self.permit_filter_value,
                     evict_filter_value=self.evict_filter_value)
            if self.table is not None:
                d["table"] = self.table
        elif self.vocabulary is not None:
            d["vocabulary"] = list(self.vocabulary)
        elif self.hash_buckets is not None:
            d["hash_buckets"] = self.hash_buckets
        else:
            d["vocab_size"] = self.vocab_size
        return d


@dataclass(frozen=True)
class CrossFeature:
    """An exact-id cross of two or more categorical `features`, hashed into `hash_buckets` rows.

    Its id, per example, is a stable 64-bit hash of the components' ids (the ids the model
    gets: vocabulary positions, hash buckets or dynamic keys) bucketed into ``[1, hash_buckets)``
    like a hashed feature. A multi-hot component makes the cross a bag holding every
    combination (the cartesian product; an empty component bag gives an empty cross bag).

    ``deep=False`` (the default) feeds it to the wide/linear part only (`LinearTerm`,
    WideDeep's wide part, trained by FTRL under `default_optimizer`):
    measured, crosses help a linear model and hurt the deep embeddings. ``deep=True`` also
    gives it an embedding table of width `embedding_dim` in the deep part.

    >>> c = CrossFeature("user_x_genre", features=("user", "genre"), hash_buckets=1 << 20)
    >>> c.features, c.deep, CrossFeature.from_dict(c.to_dict()) == c
    (('user', 'genre'), False, True)
    """

    name: str
    features: tuple[str, ...]
    hash_buckets: int
    embedding_dim: int = 16
    deep: bool = False

    def __post_init__(self) -> None:
        check_str("CrossFeature", "name", self.name)
        owner = f"CrossFeature({self.name!r})"
        feats = self.features
        if isinstance(feats, (str, bytes)) or not isinstance(feats, Iterable):
            raise TypeError(f"{owner}: 'features' must be a sequence of categorical feature names, "
                            f"got {type(feats).__name__}")
        feats = tuple(feats)
        for f in feats:
            check_type(owner, "features[]", f, str, allowed="a str (a categorical feature's name)")
        if len(feats) < 2:
            raise ValueError(f"{owner}: 'features' needs at least 2 feature names, got {list(feats)}")
        dupes = sorted({f for f in feats if feats.count(f) > 1})
        if dupes:
            raise ValueError(f"{owner}: 'features' names {dupes} more than once")
        object.__setattr__(self, "features", feats)
        object.__setattr__(self, "hash_buckets", check_int(owner, "hash_buckets", self.hash_buckets, minimum=2))
        object.__setattr__(self, "embedding_dim", check_int(owner, "embedding_dim", self.embedding_dim, minimum=1))
        check_bool(owner, "deep", self.deep)

    def to_dict(self) -> dict:
        """A JSON-able description; `from_dict` rebuilds an equal cross."""
        return {"name": self.name, "features": list(self.features), "hash_buckets": self.hash_buckets,
                "embedding_dim": self.embedding_dim, "deep": self.deep}

    @classmethod
    def from_dict(cls, d: dict) -> CrossFeature:
        check_type("CrossFeature.from_dict", "d", d, dict)
        return cls(**{**d, "features": tuple(d.get("features", ()))})

    def table(self, multi_hot: bool) -> CategoricalFeature:
        """The table view of this cross (a hashed categorical feature of its name): what the
        models size their tables from. `multi_hot`: whether a component is multi-hot."""
        return CategoricalFeature(self.name, hash_buckets=self.hash_buckets, embedding_dim=self.embedding_dim,
                                  multi_hot=multi_hot)


def num_embeddings(feature: CategoricalFeature) -> int:
    """Rows of the embedding table for `feature`.

    >>> num_embeddings(CategoricalFeature("c", vocab_size=10))
    10
    """
    return check_type("num_embeddings", "feature", feature, CategoricalFeature).num_embeddings


class Schema:
    """Dense features, categorical features and the label column, validated together.

    Strings in `dense` are shorthand for `DenseFeature`. `crosses` are
    `CrossFeature` s of the categorical features (computed, not read: they are no columns).

    >>> s = Schema(["x"], [CategoricalFeature("c", vocab_size=5, embedding_dim=4)], label="y")
    >>> s.dense_names, s.categorical_names, s.table_sizes()
    (('x',), ('c',), [5])
    >>> x = Schema([], [CategoricalFeature("u", hash_buckets=9), CategoricalFeature("i", vocab_size=3)],
    ...            crosses=[CrossFeature("u_x_i", ("u", "i"), hash_buckets=100)])
    >>> x.feature_names, x.columns, Schema.from_dict(x.to_dict()) == x
    (('u', 'i', 'u_x_i'), ('label', 'u', 'i'), True)
    """

    def __init__(self, dense: Sequence[DenseFeature | str] = (),
                 categorical: Sequence[CategoricalFeature] = (), label: str = "label",
                 crosses: Sequence[CrossFeature] = ()) -> None:
        if isinstance(dense, (str, DenseFeature)) or isinstance(categorical, CategoricalFeature):
            raise TypeError("Schema: 'dense' and 'categorical' must be sequences of features, not a single feature")
        self.dense = tuple(DenseFeature(d) if isinstance(d, str) else d for d in dense)
        self.categorical = tuple(categorical)
        for d in self.dense:
            check_type("Schema", "dense[]", d, DenseFeature, allowed="a DenseFeature or str")
        for c in self.categorical:
            check_type("Schema", "categorical[]", c, CategoricalFeature)
        self.label = check_str("Schema", "label", label)
        names = [d.name for d in self.dense] + [c.name for c in self.categorical] + [label]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"Schema: column names must be unique (label included), duplicated: {dupes}")
        if not self.dense and not self.categorical:
            raise ValueError("Schema: needs at least one dense or categorical feature")
        self._check_shared_tables()
        self._index = {c.name: i for i, c in enumerate(self.categorical)}
        self.crosses = self._check_crosses(crosses, set(names))
        by_name = {c.name: c for c in self.categorical}
        self._cross_tables = tuple(x.table(any(by_name[f].multi_hot for f in x.features)) for x in self.crosses)

    def _check_crosses(self, crosses: Sequence[CrossFeature], columns: set[str]) -> tuple[CrossFeature, ...]:
        if isinstance(crosses, CrossFeature) or not isinstance(crosses, Iterable):
            raise TypeError(f"Schema: 'crosses' must be a sequence of CrossFeature, got {type(crosses).__name__}")
        crosses = tuple(crosses)
        seen: set[str] = set()
        for x in crosses:
            check_type("Schema", "crosses[]", x, CrossFeature)
            if x.name in columns or x.name in seen:
                raise ValueError(f"Schema: cross feature name {x.name!r} is already taken (names of columns, "
                                 "the label and crosses must be unique)")
            seen.add(x.name)
            unknown = [f for f in x.features if f not in self._index]
            if unknown:
                kind = "dense features, not categorical" if set(unknown) <= set(self.dense_names) else "unknown"
                raise ValueError(f"Schema: cross {x.name!r} crosses {unknown} ({kind}); crosses take the "
                                 f"categorical features {list(self.categorical_names)}")
        return crosses

    def _check_shared_tables(self) -> None:
        """Dynamic features of one ``table`` admit and evict alike (it is one hash table)."""
        first_of_table: dict[str, CategoricalFeature] = {}
        for c in self.categorical:
            if c.table is None:
                continue
            first = first_of_table.setdefault(c.table, c)
            ours, theirs = ((f.permit_filter_value, f.evict_filter_value, f.embedding_dim) for f in (c, first))
            if ours != theirs:
                raise ValueError(f"Schema: dynamic features of table {c.table!r} need the same permit_filter_value, "
                                 f"evict_filter_value and embedding_dim: {first.name!r} has {theirs}, {c.name!r} "
                                 f"has {ours}")

    @property
    def dense_names(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.dense)

    @property
    def categorical_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.categorical)

    @property
    def cross_names(self) -> tuple[str, ...]:
        return tuple(x.name for x in self.crosses)

    @property
    def feature_names(self) -> tuple[str, ...]:
        """Names of the features a model gets, in ``Features`` order: categorical, then crosses."""
        return self.categorical_names + self.cross_names

    @property
    def num_features(self) -> int:
        """Categorical features plus crosses (``Features.num_features`` of converted batches)."""
        return len(self.categorical) + len(self.crosses)

    def cross_tables(self, deep_only: bool = False) -> tuple[CategoricalFeature, ...]:
        """The crosses' table views (`CrossFeature.table`), those with ``deep=True`` only
        when `deep_only`."""
        return tuple(t for t, x in zip(self._cross_tables, self.crosses, strict=True) if x.deep or not deep_only)

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

    @property
    def dynamic_names(self) -> tuple[str, ...]:
        """Names of the ``dynamic=True`` categorical features (hash tables), in schema order."""
        return tuple(c.name for c in self.categorical if c.dynamic)

    def check_features(self, features: Features) -> None:
        """Raise ValueError (naming feature, example and id) unless `features` match this schema.

        Checks shapes and dtypes, feature names (when ``features.keys`` is set), offsets, bag
        lengths (single-hot, ``max_len``) and id ranges. Meant for tests and debugging: it
        reads tensors on the host.

        >>> from recstream.features import Features
        >>> s = Schema(["x"], [CategoricalFeature("c", vocab_size=5)])
        >>> s.check_features(Features.from_lengths(torch.zeros(2, 1), torch.tensor([4, 5]), torch.ones(1, 2)))
        Traceback (most recent call last):
            ...
        ValueError: feature 'c': example 1 has id 5 outside [0, 5)
        """
        b, nf = features.batch_size, features.num_features
        dense, values, offsets = features.dense, features.values, features.offsets
        if dense.dtype != torch.float32 or tuple(dense.shape) != (b, self.num_dense):
            raise ValueError(f"dense must be float32 [{b}, {self.num_dense}], got {dense.dtype} {list(dense.shape)}")
        if nf != self.num_features:
            raise ValueError(f"num_features={nf} but the schema has {self.num_features} categorical features "
                             "and crosses")
        if features.keys is not None and features.keys != self.feature_names:
            raise ValueError(f"feature keys {list(features.keys)} do not match the schema's categorical "
                             f"features and crosses {list(self.feature_names)}")
        if values.dtype != torch.int64 or offsets.dtype != torch.int64:
            raise ValueError(f"values/offsets must be int64, got {values.dtype}/{offsets.dtype}")
        if values.dim() != 1 or tuple(offsets.shape) != (nf * b + 1,):
            raise ValueError(f"values must be 1-D and offsets [{nf * b + 1}], got "
                             f"{list(values.shape)} and {list(offsets.shape)}")
        if int(offsets[0]) != 0 or int(offsets[-1]) != values.numel():
            raise ValueError(f"offsets must start at 0 and end at len(values)={values.numel()}, "
                             f"got {int(offsets[0])}..{int(offsets[-1])}")
        lens = features.lengths()
        if bool((lens < 0).any()):
            raise ValueError("offsets must be non-decreasing")
        for f, feature in enumerate(self.categorical + self._cross_tables):  # one check each, vectorized
            _check_bags(feature, lens[f], *features.bag(f))

    def to_dict(self) -> dict:
        """A JSON-able description; `from_dict` rebuilds an equal schema."""
        d = {"version": _SCHEMA_VERSION, "label": self.label,
                "dense": [d.name for d in self.dense],
                "categorical": [c.to_dict() for c in self.categorical]}
        if self.crosses:  # absent when none: schemas without crosses serialise as before
            d["crosses"] = [x.to_dict() for x in self.crosses]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Schema:
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
        crosses = [CrossFeature.from_dict(x) for x in d.get("crosses", [])]
        return cls([DenseFeature(n) for n in d.get("dense", [])], cats, label=d.get("label", "label"),
                   crosses=crosses)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Schema):
            return NotImplemented
        return ((self.dense, self.categorical, self.label, self.crosses)
                == (other.dense, other.categorical, other.label, other.crosses))

    def __hash__(self) -> int:
        return hash((self.dense, self.categorical, self.label, self.crosses))

    def __repr__(self) -> str:
        crosses = f", crosses={list(self.cross_names)}" if self.crosses else ""
        return (f"Schema(dense={list(self.dense_names)}, categorical={list(self.categorical_names)}, "
                f"label={self.label!r}{crosses})")


def _check_bags(feature: CategoricalFeature, lens: torch.Tensor, ids: torch.Tensor, offsets: torch.Tensor) -> None:
    """Bag lengths and id range of one feature's bags (`lens`, `ids` and their `offsets`)."""
    if not feature.multi_hot and bool((lens != 1).any()):
        row = int((lens != 1).nonzero()[0])
        raise ValueError(f"feature {feature.name!r} is single-hot but example {row} has {int(lens[row])} ids")
    if feature.max_len is not None and bool((lens > feature.max_len).any()):
        row = int((lens > feature.max_len).nonzero()[0])
        raise ValueError(f"feature {feature.name!r}: example {row} has {int(lens[row])} ids "
                         f"> max_len={feature.max_len}")
    if feature.dynamic:  # any int64 is a key
        return
    bad = (ids < 0) | (ids >= feature.num_embeddings)
    if bool(bad.any()):
        pos = int(bad.nonzero()[0])
        row = int(torch.searchsorted(offsets, torch.tensor(pos, device=offsets.device), right=True)) - 1
        raise ValueError(f"feature {feature.name!r}: example {row} has id {int(ids[pos])} outside "
                         f"[0, {feature.num_embeddings})")
