"""Vectorized parsing of Arrow columns into numpy numbers, flagging rows that fail.

Arrow's casts fail a whole array on one bad value; readers must instead name the bad row
and, under ``on_bad_row="skip"``, keep the others. The fast path is one cast; only when
it fails do we find the bad rows, with a regex over the whole column (vectorized) and, for
the rare values the regex lets through but the cast rejects (int64 overflow), bisection.

>>> import pyarrow as pa
>>> values, missing, bad = to_float(pa.array(["1.5", None, "x"]))
>>> float(values[0]), missing.tolist(), bad.tolist()
(1.5, [False, True, False], [False, False, True])
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

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


def to_text(arr) -> pa.Array:
    """Values as strings (the canonical form that hashing and vocabularies use)."""
    arr = plain(arr)
    t = arr.type
    if is_text(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return arr
    if pa.types.is_integer(t):
        return pc.cast(arr, pa.string())
    raise TypeError(f"expected a string or integer column, got type {t}")
