"""Vectorized record formatting: columns -> one bytes record per event (CSV, JSON lines, Criteo TSV).

The producers of demos, tests and load runs need many records fast, so values are turned
into text with pyarrow casts and joined with ``binary_join_element_wise``: no Python
string work per record. Event ids and times, when given, become the last two fields
(``event_id``, ``event_time``), which is what the decoders' ``id_column`` /
``time_column`` expect.

>>> import numpy as np
>>> recs = format_records("csv", np.array([1.0, 0.0]), np.array([[0.5], [1.5]]), np.array([[3], [4]]),
...                       event_ids=np.array([7, 8]), times=np.array([1.5, 2.0]))
>>> recs
[b'1,0.5,3,7,1.5', b'0,1.5,4,8,2']
>>> format_records("jsonl", np.array([1.0]), np.zeros((1, 0)), np.array([[3]]), names=["label", "c"])
[b'{"label":1,"c":3}']
>>> append_meta([b'{"label":1}', b"0,2.5"][:1], "jsonl", np.array([5]), np.array([9.5]))
[b'{"label":1,"event_id":5,"event_time":9.5}']
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

FORMATS = ("csv", "jsonl", "criteo")
ID_COLUMN, TIME_COLUMN = "event_id", "event_time"
_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)


def _text(values: np.ndarray) -> pa.Array:
    return pc.cast(pa.array(values), pa.string())


def hex8(ids: np.ndarray) -> pa.Array:
    """Low 32 bits of int ids as 8 lowercase hex digits (Criteo's categorical id form)."""
    v = np.asarray(ids, dtype=np.int64).astype(np.uint64) & np.uint64(0xFFFFFFFF)
    shifts = np.arange(28, -1, -4, dtype=np.uint64)
    digits = _HEX[((v[:, None] >> shifts) & np.uint64(15)).astype(np.intp)]  # [n, 8] ascii codes
    return pc.cast(pa.array(np.ascontiguousarray(digits).view("S8").ravel(), pa.binary(8)), pa.string())


def format_records(fmt: str, labels: np.ndarray, dense: np.ndarray, cat_ids: np.ndarray, *,
                   names: Sequence[str] | None = None, event_ids: np.ndarray | None = None,
                   times: np.ndarray | None = None) -> list[bytes]:
    """Records of `fmt` for rows of labels [n], dense [n, d], single-hot categorical ids [n, c].

    names: column names (label, dense..., categorical...) for JSON (default: label, I1..,
    C1..). Criteo writes dense values as integer counts (``floor(max(x, 0))``) and ids as
    8 hex digits. event_ids / times: per-event ids (int) and event times (epoch seconds).
    """
    if fmt not in FORMATS:
        raise ValueError(f"format_records: 'fmt' must be one of {FORMATS}, got {fmt!r}")
    d, c = dense.shape[1], cat_ids.shape[1]
    names = list(names) if names is not None else (["label"] + [f"I{i + 1}" for i in range(d)]
                                                   + [f"C{i + 1}" for i in range(c)])
    cols = [_text(np.asarray(labels).astype(np.int64))]
    if fmt == "criteo":
        cols += [_text(np.floor(np.maximum(dense[:, j], 0)).astype(np.int64)) for j in range(d)]
        cols += [hex8(cat_ids[:, j]) for j in range(c)]
    else:
        cols += [_text(np.asarray(dense[:, j], dtype=np.float32)) for j in range(d)]
        cols += [_text(np.asarray(cat_ids[:, j], dtype=np.int64)) for j in range(c)]
    if event_ids is not None:
        names.append(ID_COLUMN)
        cols.append(_text(np.asarray(event_ids, dtype=np.int64)))
    if times is not None:
        names.append(TIME_COLUMN)
        cols.append(_text(np.asarray(times, dtype=np.float64)))
    if fmt == "jsonl":
        parts = []
        for i, (key, col) in enumerate(zip(names, cols)):
            parts += [('{"' if i == 0 else ',"') + key + '":', col]
        joined = pc.binary_join_element_wise(*parts, "}", "")
    else:
        joined = pc.binary_join_element_wise(*cols, "\t" if fmt == "criteo" else ",")
    return pc.cast(joined, pa.binary()).to_pylist()


def append_meta(lines: Sequence[bytes], fmt: str, event_ids: np.ndarray, times: np.ndarray) -> list[bytes]:
    """Existing records with ``event_id`` / ``event_time`` added (last two fields, or JSON keys).

    fmt: "csv", "tsv", "criteo" or "jsonl".
    """
    arr = pa.array(lines, pa.binary())
    ids, ts = pc.cast(_text(event_ids), pa.binary()), pc.cast(_text(times), pa.binary())
    if fmt == "jsonl":  # '{...}' -> '{...,"event_id":1,"event_time":2.5}'
        body = pc.replace_substring_regex(arr, r"\}\s*$", "")
        return pc.binary_join_element_wise(body, b',"' + ID_COLUMN.encode() + b'":', ids,
                                           b',"' + TIME_COLUMN.encode() + b'":', ts, b"}", b"").to_pylist()
    body = pc.replace_substring_regex(arr, r"\r$", "")
    return pc.binary_join_element_wise(body, ids, ts, b"\t" if fmt in ("criteo", "tsv") else b",").to_pylist()
