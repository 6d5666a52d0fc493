"""Arrow columns -> [`Batch`][recstream.data.batch.Batch], with every bad row flagged.

All work is vectorized per column (one pass of numpy/pyarrow per feature, never a Python
loop per row); only rows that turn out bad get looked at one by one, to describe them.

Parsing text into numbers (`to_float`, `to_int`, `to_text`): Arrow's
casts fail a whole array on one bad value; readers must instead name the bad row and,
under ``on_bad_row="skip"``, keep the others. The fast path is one cast; only when it
fails do we find the bad rows, with a regex over the whole column (vectorized) and, for
the rare values the regex lets through but the cast rejects (int64 overflow), bisection.

>>> import pyarrow as pa
>>> from recstream.data.schema import Schema, CategoricalFeature
>>> s = Schema(["x"], [CategoricalFeature("c", vocab_size=3)])
>>> batch, bad = ColumnConverter(s).convert(pa.record_batch({"label": [1, 0], "x": [0.5, 2.0], "c": [2, 7]}))
>>> batch.batch_size, batch.features.keys, [(b.index, b.reason) for b in bad]
(1, ('c',), [(1, 'id_out_of_range')])
>>> values, missing, unparsable = to_float(pa.array(["1.5", None, "x"]))
>>> float(values[0]), missing.tolist(), unparsable.tolist()
(1.5, [False, True, False], [False, False, True])
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from ..features import Features
from ..validation import check_bool, check_number, check_str, check_type
from .badrows import REASONS
from .batch import Batch
from .hashing import hash_strings, splitmix64, to_buckets
from .schema import CategoricalFeature, Schema

# --- text -> numbers ---------------------------------------------------------------------
_FLOAT_RE = r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$|^[+-]?(?i:nan|inf|infinity)$"
_INT_RE = r"^[+-]?\d+$"


def is_text(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def plain(arr) -> pa.Array:
    """One contiguous array with dictionaries decoded (their values are what we parse)."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    return arr


def _bisect_bad(arr: pa.Array, target: pa.DataType) -> np.ndarray:
    """Rows whose cast fails, found by halving failing ranges (only the few the regex missed)."""
    bad = np.zeros(len(arr), dtype=bool)
    stack = [(0, len(arr))]
    while stack:
        start, length = stack.pop()
        try:
            pc.cast(arr.slice(start, length), target)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            if length == 1:
                bad[start] = True
            else:
                half = length // 2
                stack += [(start, half), (start + half, length - half)]
    return bad


def _cast_text(arr: pa.Array, target: pa.DataType, pattern: str) -> tuple[pa.Array, np.ndarray]:
    """Cast a string column; unparsable values become null and are flagged."""
    try:
        return pc.cast(arr, target), np.zeros(len(arr), dtype=bool)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        pass
    # nulls and "" are missing values, not bad ones
    empty = np.asarray(pc.fill_null(pc.equal(pc.binary_length(arr), 0), True), dtype=bool)
    bad = ~np.asarray(pc.fill_null(pc.match_substring_regex(arr, pattern), True), dtype=bool) & ~empty
    cleaned = pc.if_else(pa.array(bad | empty), pa.scalar(None, arr.type), arr)
    try:
        return pc.cast(cleaned, target), bad
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        bad |= _bisect_bad(cleaned, target)
        return pc.cast(pc.if_else(pa.array(bad | empty), pa.scalar(None, arr.type), arr), target), bad


def _null_mask(arr: pa.Array) -> np.ndarray:
    if arr.null_count == 0:
        return np.zeros(len(arr), dtype=bool)
    return np.asarray(arr.is_null(), dtype=bool)


def to_float(arr) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(float64 values with NaN where missing/bad, missing mask, unparsable mask)."""
    arr = plain(arr)
    t = arr.type
    if is_text(t):
        arr, bad = _cast_text(arr, pa.float64(), _FLOAT_RE)
    elif pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t) or pa.types.is_decimal(t):
        arr, bad = pc.cast(arr, pa.float64()), np.zeros(len(arr), dtype=bool)
    else:
        raise TypeError(f"expected a numeric or string column, got type {t}")
    missing = _null_mask(arr) & ~bad
    values = arr.to_numpy(zero_copy_only=False)  # nulls -> NaN
    return np.asarray(values, dtype=np.float64), missing, bad


def to_int(arr) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(int64 values, 0 where missing/bad; missing mask; unparsable mask).

    Floats are accepted when integral (Parquet files written from pandas store ids with
    missing values as float); ``1.5`` is unparsable as an id.
    """
    arr = plain(arr)
    t = arr.type
    if is_text(t):
        arr, bad = _cast_text(arr, pa.int64(), _INT_RE)
    elif pa.types.is_integer(t):
        # uint64 ids above 2**63 wrap to negative here and are then out of range, not hidden
        arr, bad = pc.cast(arr, pa.int64(), safe=False), np.zeros(len(arr), dtype=bool)
    elif pa.types.is_floating(t):
        f = np.asarray(pc.cast(arr, pa.float64()).to_numpy(zero_copy_only=False), dtype=np.float64)
        with np.errstate(invalid="ignore"):
            ok = np.isfinite(f) & (np.floor(f) == f) & (np.abs(f) < 2.0 ** 63)
        missing = _null_mask(arr)
        bad = ~ok & ~missing
        return np.where(ok, f, 0).astype(np.int64), missing, bad
    else:
        raise TypeError(f"expected an integer or string column, got type {t}")
    missing = _null_mask(arr) & ~bad
    values = pc.fill_null(arr, 0).to_numpy(zero_copy_only=False)
    return np.asarray(values, dtype=np.int64), missing, bad


def to_keys(arr) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """int64 keys of a ``dynamic=True`` feature's values: (keys, 0 where missing/bad; missing mask;
    unparsable mask).

    An integer is its own key, and so is a string holding a decimal int64 (CSV ``"12"`` and
    Parquet ``12`` are one key); any other string is keyed by its stable 64-bit hash
    (`hash_strings`). Null and ``""`` are missing.

    >>> keys, missing, bad = to_keys(pa.array(["12", "user-a", None]))
    >>> int(keys[0]), bool(keys[1] != 0), missing.tolist(), bad.tolist()
    (12, True, [False, False, True], [False, False, False])
    """
    arr = plain(arr)
    t = arr.type
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        arr, t = pc.cast(arr, pa.string()), pa.string()  # the text a JSON request would send
    if not is_text(t):
        return to_int(arr)  # integers (and integral floats) are keys as they are
    ints, _, not_int = to_int(arr)  # not_int: text that is no int64 (nulls and "" are missing)
    missing = np.asarray(pc.fill_null(pc.equal(pc.binary_length(arr), 0), True), dtype=bool)
    if not_int.any():
        hashed = hash_strings(arr).view(np.int64)
        ints = np.where(not_int, hashed, ints)
    return ints, missing, np.zeros(len(arr), dtype=bool)


def to_text(arr) -> pa.Array:
    """Values as strings (the canonical form that hashing and vocabularies use)."""
    arr = plain(arr)
    t = arr.type
    if is_text(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return arr
    if pa.types.is_integer(t):
        return pc.cast(arr, pa.string())
    raise TypeError(f"expected a string or integer column, got type {t}")


# --- cross features -----------------------------------------------------------------------
# Salt of a component's position in a cross: (a, b) and (b, a) are different crosses. Fixed: the
# cross ids are part of a trained model's meaning.
_POSITION_SALT = 0xA24BAED4963EE407


def _product(ha: np.ndarray, la: np.ndarray, hb: np.ndarray, lb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Hashes of every pair (one of bag a, one of bag b) per row, row by row: the cartesian
    product of two bag columns (hashes `ha`/`hb` flat, bag lengths `la`/`lb` [n])."""
    if (la == 1).all() and (lb == 1).all():  # single-hot: one pair a row
        return splitmix64(ha ^ hb), la
    lens = la * lb
    rows = np.repeat(np.arange(len(la), dtype=np.int64), lens)
    pos = np.arange(int(lens.sum()), dtype=np.int64) - np.repeat(np.cumsum(lens) - lens, lens)
    width = lb[rows]
    a = (np.cumsum(la) - la)[rows] + pos // width
    b = (np.cumsum(lb) - lb)[rows] + pos % width
    return splitmix64(ha[a] ^ hb[b]), lens


def cross_bags(schema: Schema, cats: list[tuple[np.ndarray, np.ndarray]]) -> list[tuple[np.ndarray, np.ndarray]]:
    """``(ids, lengths)`` of every cross of `schema` from its categorical features' `cats`.

    `cats` holds, per categorical feature in schema order, its ids (int64, flat) and bag
    lengths (int64 ``[n]``), as the model gets them. The ONE place cross ids are computed: the
    readers' and streams' `ColumnConverter`, the server's request parser and
    `with_crosses` all call it. A cross id is ``to_buckets(h, hash_buckets)`` of
    ``h = splitmix64(... splitmix64(m_1 ^ m_2) ^ m_3 ...)``, ``m_k`` the splitmix64 hash of
    component k's id plus k times a fixed salt; multi-hot components give the cartesian product
    (row by row, in bag order).

    >>> from recstream.data.schema import CategoricalFeature, CrossFeature
    >>> s = Schema([], [CategoricalFeature("u", vocab_size=9), CategoricalFeature("g", vocab_size=5, multi_hot=True)],
    ...            crosses=[CrossFeature("u_x_g", ("u", "g"), hash_buckets=1000)])
    >>> ((ids, lens),) = cross_bags(s, [(np.array([3, 3]), np.array([1, 1])), (np.array([1, 2, 1]), np.array([2, 1]))])
    >>> lens.tolist(), bool(ids[0] == ids[2]), bool(ids[0] != ids[1])
    ([2, 1], True, True)
    """
    index = {c.name: k for k, c in enumerate(schema.categorical)}
    out = []
    for x in schema.crosses:
        h = lens = None
        for pos, name in enumerate(x.features):
            ids, bag = cats[index[name]]
            salt = np.uint64(pos * _POSITION_SALT % 2**64)
            hk = splitmix64(np.asarray(ids, dtype=np.int64).view(np.uint64) + salt)
            h, lens = (hk, bag) if h is None else _product(h, lens, hk, bag)
        out.append((to_buckets(h, x.hash_buckets), np.asarray(lens, dtype=np.int64)))
    return out


def with_crosses(schema: Schema, features: Features) -> Features:
    """`features` of `schema`'s categorical features (in schema order) with its crosses appended,
    computed by `cross_bags`: for batches built without a converter (generators such as
    `DriftingCTR`). Reads the ids on the host.

    >>> from recstream.data.schema import CategoricalFeature, CrossFeature
    >>> s = Schema([], [CategoricalFeature("u", vocab_size=9), CategoricalFeature("i", vocab_size=9)],
    ...            crosses=[CrossFeature("u_x_i", ("u", "i"), hash_buckets=100)])
    >>> x = with_crosses(s, Features.from_lengths(torch.zeros(2, 0), torch.tensor([1, 2, 5, 5]), torch.ones(2, 2)))
    >>> x.keys, x.num_features, x.values.shape
    (('u', 'i', 'u_x_i'), 3, torch.Size([6]))
    """
    check_type("with_crosses", "schema", schema, Schema, allowed="a recstream.data.Schema")
    check_type("with_crosses", "features", features, Features, allowed="a recstream.data.Features")
    if features.num_features != schema.num_categorical or features.keys not in (None, schema.categorical_names):
        raise ValueError(f"with_crosses: 'features' must hold the schema's categorical features "
                         f"{list(schema.categorical_names)} in order, got {features.num_features} features "
                         f"named {features.keys}")
    values = features.values.cpu().numpy()
    lengths = features.lengths().cpu().numpy()
    bounds = np.concatenate([[0], np.cumsum(lengths.sum(axis=1))])
    cats = [(values[bounds[k]: bounds[k + 1]], lengths[k]) for k in range(features.num_features)]
    cats += cross_bags(schema, cats)
    all_values = torch.from_numpy(np.concatenate([ids for ids, _ in cats]).astype(np.int64, copy=False))
    all_lengths = torch.from_numpy(np.stack([lens for _, lens in cats]))
    return Features.from_lengths(features.dense, all_values.to(features.values.device),
                                 all_lengths, keys=schema.feature_names)


# --- columns -> Batch ---------------------------------------------------------------------
_CODE = {r: i + 1 for i, r in enumerate(REASONS)}  # 0 = good row
_F32_MAX = float(np.finfo(np.float32).max)


@dataclass(frozen=True)
class RowFault:
    """A bad row of one record batch: its 0-based index there, why, and where."""

    index: int
    reason: str
    column: str
    detail: str


class _Faults:
    """First fault per row (columns are checked in schema order)."""

    def __init__(self, n: int) -> None:
        self.code = np.zeros(n, dtype=np.int8)
        self.column = np.zeros(n, dtype=np.int32)
        self.id_value = np.zeros(n, dtype=np.int64)  # the offending id, for out-of-range messages

    def mark(self, mask: np.ndarray, reason: str, column: int, ids: np.ndarray | None = None) -> None:
        new = mask & (self.code == 0)
        if new.any():
            self.code[new] = _CODE[reason]
            self.column[new] = column
            if ids is not None:
                self.id_value[new] = ids[new]


@contextmanager
def _naming(column: str):
    """Prefix a type error (a whole column of the wrong type) with the column's name."""
    try:
        yield
    except TypeError as e:
        if str(e).startswith("column "):
            raise
        raise TypeError(f"column {column!r}: {e}") from e


class ColumnConverter:
    """Converts record batches holding the `schema`'s columns (any extra columns are ignored).

    fill_missing_dense: value for empty dense cells (None: such rows are bad, 'missing_value').
    log1p_dense: apply ``log1p(max(x, 0))`` to dense values (the usual Criteo transform).
    owner: the public class whose arguments these are, named in argument errors.
    The Features of each Batch carry the schema's categorical names as ``keys``, followed by
    its crosses (computed here from the ids: `cross_bags`).
    """

    def __init__(self, schema: Schema, fill_missing_dense: float | None = None, log1p_dense: bool = False, *,
                 owner: str = "ColumnConverter") -> None:
        check_str("ColumnConverter", "owner", owner)
        self.schema = check_type(owner, "schema", schema, Schema, allowed="a recstream.data.Schema")
        self.fill_missing_dense = check_number(owner, "fill_missing_dense", fill_missing_dense, allow_none=True)
        self.log1p_dense = check_bool(owner, "log1p_dense", log1p_dense)
        self._keys = tuple(self.schema.feature_names)  # crosses follow the categorical features
        self._vocab = {c.name: pa.array(c.vocabulary, pa.string()) for c in schema.categorical if c.vocabulary}

    def convert(self, rb: pa.RecordBatch | pa.Table) -> tuple[Batch, list[RowFault]]:
        """(Batch of the good rows in order, faults of the bad rows)."""
        missing = [c for c in self.schema.columns if c not in rb.schema.names]
        if missing:
            raise ValueError(f"record batch lacks columns {missing}; it has {rb.schema.names}")
        n = rb.num_rows
        faults = _Faults(n)
        cols = self.schema.columns  # label, dense..., categorical... (the column index space)
        with _naming(self.schema.label):
            labels = self._labels(rb.column(self.schema.label), faults)
        dense = np.empty((n, self.schema.num_dense), dtype=np.float32)
        for j, d in enumerate(self.schema.dense):
            with _naming(d.name):
                dense[:, j] = self._dense(rb.column(d.name), faults, 1 + j)
        cats = []
        for k, c in enumerate(self.schema.categorical):
            with _naming(c.name):
                cats.append(self._categorical(rb.column(c.name), c, faults, 1 + self.schema.num_dense + k))
        bad = np.flatnonzero(faults.code)
        if len(bad):
            keep = faults.code == 0
            labels, dense = labels[keep], dense[keep]
            cats = [(ids[np.repeat(keep, lens)], lens[keep]) for ids, lens in cats]
        batch = self._assemble(dense, labels, cats)
        return batch, [self._describe(rb, faults, i, cols) for i in bad]

    # --- columns -------------------------------------------------------------------------
    def _labels(self, col, faults: _Faults) -> np.ndarray:
        y, missing, bad = to_float(col)
        faults.mark(bad, "unparsable", 0)
        faults.mark(missing, "missing_value", 0)
        with np.errstate(invalid="ignore"):
            faults.mark(~(missing | bad) & ~((y >= 0) & (y <= 1)), "bad_label", 0)
        return y.astype(np.float32)

    def _dense(self, col, faults: _Faults, c: int) -> np.ndarray:
        x, missing, bad = to_float(col)
        faults.mark(bad, "unparsable", c)
        if self.fill_missing_dense is None:
            faults.mark(missing, "missing_value", c)
        else:
            x = np.where(missing, self.fill_missing_dense, x)
        x, nonfinite = self.dense_float32(x)
        faults.mark(nonfinite & ~(missing | bad), "non_finite", c)
        return x

    def dense_float32(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(dense values as the model gets them: transformed, then cast to float32; mask of
        the values that are not finite, as given or THERE).

        The one place dense values become float32 (readers, stream decoders and ``/predict``
        all come through here): the check runs after the cast because a finite float64 like
        ``1e39`` is ``inf`` in float32, and one such value turns every weight NaN.

        >>> c = ColumnConverter(Schema(["x"]))
        >>> v, bad = c.dense_float32(np.array([1.5, 1e39, -3.5e38, np.nan, 3.4e38]))
        >>> bad.tolist()
        [False, True, True, True, False]
        """
        x = np.asarray(x, dtype=np.float64)
        raw_bad = ~np.isfinite(x)  # -inf stays bad under log1p (which would map it to 0)
        if self.log1p_dense:
            with np.errstate(invalid="ignore"):  # NaN stays NaN (flagged below)
                x = np.log1p(np.maximum(x, 0.0))  # negative counts (Criteo's I2) map to 0, not NaN
        with np.errstate(over="ignore", invalid="ignore"):
            x32 = x.astype(np.float32)
        return x32, raw_bad | ~np.isfinite(x32)

    def _categorical(self, col, feat: CategoricalFeature, faults: _Faults, c: int):
        """(ids int64 flat, lengths int64 [n]) of one feature; marks bad rows."""
        col = plain(col)
        n = len(col)
        if not feat.multi_hot:
            ids, _ = self._ids(col, feat, faults, c, rows=None)
            return ids, np.ones(n, dtype=np.int64)
        if is_text(col.type):
            col = pc.split_pattern(col, feat.separator)
        if not (pa.types.is_list(col.type) or pa.types.is_large_list(col.type)):
            raise TypeError(f"column {feat.name!r}: multi-hot values must be lists or "
                            f"{feat.separator!r}-joined strings, got type {col.type}")
        lens = np.asarray(pc.fill_null(pc.list_value_length(col), 0), dtype=np.int64)
        elems = plain(pc.list_flatten(col))  # null lists contribute nothing
        if pa.types.is_null(elems.type):  # only empty/null lists (JSON `[]` is list<null>): no ids
            elems = pa.nulls(len(elems), pa.string())
        rows = np.repeat(np.arange(n, dtype=np.int64), lens)
        present = ~np.asarray(elems.is_null(), dtype=bool)
        if is_text(elems.type):  # "1||2" and "" hold empty elements: absent, not ids
            present &= np.asarray(pc.fill_null(pc.binary_length(elems), 0), dtype=np.int64) > 0
        if not present.all():
            elems, rows = elems.filter(pa.array(present)), rows[present]
            lens = np.bincount(rows, minlength=n).astype(np.int64)
        ids, _ = self._ids(elems, feat, faults, c, rows=rows)
        if feat.max_len is not None and len(ids) and lens.max() > feat.max_len:
            pos = np.arange(len(ids), dtype=np.int64) - np.repeat(np.cumsum(lens) - lens, lens)
            ids, lens = ids[pos < feat.max_len], np.minimum(lens, feat.max_len)
        return ids, lens

    def _ids(self, col: pa.Array, feat: CategoricalFeature, faults: _Faults, c: int, rows):
        """Ids of single values; `rows` maps each value to its row (None: value i is row i)."""
        def mark(mask, reason, ids=None):
            if rows is None:
                faults.mark(mask, reason, c, ids)
            elif mask.any():
                row_mask = np.zeros(len(faults.code), dtype=bool)
                row_mask[rows[mask]] = True
                row_ids = np.zeros(len(faults.code), dtype=np.int64)
                if ids is not None:
                    row_ids[rows[mask]] = ids[mask]
                faults.mark(row_mask, reason, c, row_ids if ids is not None else None)

        if feat.dynamic:  # raw int64 keys of a hash table: no range
            ids, missing, bad = to_keys(col)
            mark(bad, "unparsable")
            mark(missing, "missing_value")
            return ids, None
        if feat.hashed:  # ids of any type hash by their text, so CSV "12" == Parquet 12
            text = to_text(col)
            ids = to_buckets(hash_strings(text), feat.hash_buckets)
            if text.null_count:
                ids[np.asarray(text.is_null(), dtype=bool)] = 0  # reserved id for missing
            return ids, None
        if feat.vocabulary is not None:
            pos = pc.index_in(to_text(col), value_set=self._vocab[feat.name])
            return np.asarray(pc.fill_null(pc.add(pos, 1), 0), dtype=np.int64), None  # 0: unknown
        ids, missing, bad = to_int(col)
        mark(bad, "unparsable")
        mark(missing, "missing_value")
        out = ~(missing | bad) & ((ids < 0) | (ids >= feat.vocab_size))
        mark(out, "id_out_of_range", ids)
        return ids, None

    # --- output --------------------------------------------------------------------------
    def _assemble(self, dense: np.ndarray, labels: np.ndarray, cats) -> Batch:
        n = len(labels)
        cats = cats + cross_bags(self.schema, cats)  # from the good rows' ids
        if cats:
            values = torch.from_numpy(np.concatenate([ids for ids, _ in cats]).astype(np.int64, copy=False))
            lengths = torch.from_numpy(np.stack([lens for _, lens in cats]))
        else:
            values, lengths = torch.zeros(0, dtype=torch.int64), torch.zeros(0, n, dtype=torch.int64)
        features = Features.from_lengths(torch.from_numpy(dense), values, lengths, keys=self._keys)
        return Batch(features, torch.from_numpy(labels))

    def _describe(self, rb, faults: _Faults, i: int, cols) -> RowFault:
        reason, name = REASONS[faults.code[i] - 1], cols[faults.column[i]]
        raw = rb.column(name)[i].as_py()  # one bad row at a time: only bad rows get here
        if reason == "id_out_of_range":
            size = self.schema.feature(name).vocab_size
            detail = f"id {int(faults.id_value[i])} outside [0, {size}) (value {raw!r})"
        else:
            detail = {"unparsable": f"cannot parse {raw!r} as a number",
                      "non_finite": f"non-finite value {raw!r} (dense values must be finite in float32, "
                                    f"|x| <= {_F32_MAX:.8g})",
                      "missing_value": "missing value",
                      "bad_label": f"label {raw!r} is not a number in [0, 1]"}[reason]
        return RowFault(int(i), reason, name, detail)
