"""Raw records and what decoding them gives: the shared vocabulary of the stream sources.

A *record* is one event as bytes: one line of a CSV/TSV/JSON-lines file, or one Kafka
message value. Decoders turn a list of records into a `Decoded`: a Batch of the
good ones (in order), where each good row came from, its event id / event time if the
source carries them, and a `BadRecord` for every record that was rejected.

Reasons a record is rejected (the keys of ``stream.bad_records``): the reasons of
`recstream.data.badrows` (``column_count``, ``unparsable``, ``non_finite``,
``missing_value``, ``id_out_of_range``, ``bad_label``) and two of streams:

* ``oversize``: longer than the stream's ``max_record_bytes``;
* ``malformed``: not a record at all (invalid JSON, invalid UTF-8, a newline inside a
  Kafka message, a field of the wrong shape).

>>> starts, ends = line_spans(b"a,b\\r\\n\\nc\\n")
>>> starts.tolist(), ends.tolist()
([0, 5, 6], [3, 5, 7])
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ..badrows import REASONS as ROW_REASONS
from ..batch import Batch

REASONS = ROW_REASONS + tuple(r for r in ("oversize", "malformed") if r not in ROW_REASONS)


@dataclass(frozen=True)
class BadRecord:
    """A rejected record: its index in the decoded list, why, and the raw bytes."""

    index: int
    reason: str
    detail: str
    raw: bytes
    column: str | None = None


@dataclass
class Decoded:
    """The result of decoding ``n_records`` records.

    rows[i] is the record index that row i of ``batch`` came from (increasing); ``ids`` /
    ``event_time`` are per row (int64 / float64 seconds since the epoch) or None.
    """

    batch: Batch
    rows: np.ndarray
    ids: np.ndarray | None
    event_time: np.ndarray | None
    bad: list[BadRecord] = field(default_factory=list)
    n_records: int = 0

    @property
    def num_rows(self) -> int:
        return int(self.rows.size)


def meta_tensors(ids: np.ndarray | None, event_time: np.ndarray | None) -> dict:
    """The ``last_batch_meta()`` dict: ids as int64, event times as float64 tensors (or None).

    float64, not float32: epoch seconds (~1.7e9) in float32 are rounded to about 2 minutes.
    """
    return {"ids": None if ids is None else torch.from_numpy(np.ascontiguousarray(ids, dtype=np.int64)),
            "event_time": None if event_time is None
            else torch.from_numpy(np.ascontiguousarray(event_time, dtype=np.float64))}


def line_spans(buf: bytes | memoryview, final_newline_optional: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Start and end byte offsets of the lines of `buf`, newline (and a ``\\r`` before it) excluded.

    Vectorized: one numpy scan for ``\\n``. A last line without a newline counts when
    `final_newline_optional` (an empty tail does not).
    """
    a = np.frombuffer(buf, dtype=np.uint8)
    nl = np.flatnonzero(a == 10)
    ends = nl
    if final_newline_optional and (a.size and (nl.size == 0 or nl[-1] != a.size - 1)):
        ends = np.append(nl, a.size)
    starts = np.empty_like(ends)
    if ends.size:
        starts[0] = 0
        starts[1:] = nl[: ends.size - 1] + 1
    ends = ends.copy()
    if ends.size:  # CRLF files: the \r belongs to the line break, not to the last field
        cr = (ends > starts) & (a[np.maximum(ends - 1, 0)] == 13)
        ends[cr] -= 1
    return starts.astype(np.int64), ends.astype(np.int64)


def empty_decoded(batch: Batch, n_records: int, bad: list[BadRecord], with_ids: bool,
                  with_time: bool) -> Decoded:
    """A Decoded with no good row (every record bad, or none at all)."""
    return Decoded(batch, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64) if with_ids else None,
                   np.zeros(0, dtype=np.float64) if with_time else None, bad, n_records)
