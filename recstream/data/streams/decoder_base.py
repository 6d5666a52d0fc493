"""The machinery every record decoder shares: spans of records -> Arrow table -> Batch.

A format only says how to parse a contiguous run of records into an Arrow table
(:meth:`TableDecoder._parse`); this base class does the rest, vectorized:

1. find the records' byte spans (one numpy scan), reject empty and oversize ones;
2. parse the whole run in one pyarrow call;
3. if that call fails (one invalid JSON line, invalid UTF-8, a type that changes mid-run),
   split the run in halves and retry each: only the failing record ends up alone, and is
   rejected as ``malformed`` with pyarrow's message; a clean run costs one call;
4. convert with :class:`~recstream.data.convert.ColumnConverter` (which flags bad values
   per row) plus the optional event-id / event-time columns.

>>> from recstream.data import Schema, CategoricalFeature
>>> from recstream.data.streams import CSVLineDecoder
>>> d = CSVLineDecoder(Schema(["x"], [CategoricalFeature("c", vocab_size=5)]))
>>> out = d.decode([b"1,0.5,3", b"0,oops,1", b"1,2"])
>>> out.batch.batch_size, [(b.index, b.reason) for b in out.bad]
(1, [(1, 'unparsable'), (2, 'column_count')])
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import pyarrow as pa

from ..batch import Batch
from ..convert import ColumnConverter
from ..parse import to_float, to_int
from ..schema import Schema
from .records import BadRecord, Decoded, empty_decoded, line_spans

DEFAULT_MAX_RECORD_BYTES = 1 << 20
_PARSE_ERRORS = (pa.ArrowException, TypeError, ValueError, KeyError, AttributeError, UnicodeDecodeError,
                 IndexError)


class _RunMismatch(ValueError):
    """The parser produced a different number of rows than there are records in the run."""


class TableDecoder:
    """Base class of the record decoders (see the module docstring).

    id_column / time_column: optional columns holding an integer event id and the event
    time (seconds since the epoch, float); a record whose id/time is missing or unparsable
    is bad. They are exposed per batch by the streams' ``last_batch_meta()``.
    """

    def __init__(self, schema: Schema, *, id_column: str | None = None, time_column: str | None = None,
                 fill_missing_dense: float | None = None, log1p_dense: bool = False,
                 max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> None:
        owner = type(self).__name__
        if not isinstance(schema, Schema):
            raise TypeError(f"{owner}: 'schema' must be a recstream.data.Schema, got {type(schema).__name__}")
        for name, col in (("id_column", id_column), ("time_column", time_column)):
            if col is not None and (not isinstance(col, str) or col in schema.columns):
                raise ValueError(f"{owner}: '{name}' must be a column name outside the schema, got {col!r}")
        if isinstance(max_record_bytes, bool) or not isinstance(max_record_bytes, int) or max_record_bytes < 1:
            raise ValueError(f"{owner}: 'max_record_bytes' must be an int >= 1, got {max_record_bytes!r}")
        self.schema = schema
        self.id_column, self.time_column = id_column, time_column
        self.max_record_bytes = max_record_bytes
        self._converter = ColumnConverter(schema, fill_missing_dense, log1p_dense)
        self._empty = self._converter.convert(pa.table({c: pa.array([], pa.string()) for c in schema.columns}))[0]

    @property
    def columns(self) -> list[str]:
        """Schema columns plus the meta columns, in the order a line carries them by default."""
        return list(self.schema.columns) + [c for c in (self.id_column, self.time_column) if c]

    # --- format hook ---------------------------------------------------------------------
    def _parse(self, buf: pa.Buffer, n: int) -> tuple[pa.Table, np.ndarray, list[tuple[int, str, str]]]:
        """Parse `n` newline-separated records: (table, record index of each table row,
        [(record index, reason, detail)] of records the parser itself rejected)."""
        raise NotImplementedError

    # --- entry points --------------------------------------------------------------------
    def decode(self, records: Sequence[bytes]) -> Decoded:
        """Decode one record per element (Kafka message values). A single trailing newline
        of a record is tolerated; a newline inside one makes it ``malformed``."""
        records = list(records)
        n = len(records)
        if n == 0:
            return empty_decoded(self._empty, 0, [], self.id_column is not None, self.time_column is not None)
        buf = b"\n".join(records)
        lens = np.fromiter(map(len, records), dtype=np.int64, count=n)
        pre_bad: dict[int, tuple[str, str]] = {}
        if buf.count(b"\n") != n - 1:  # rare: some record holds a newline; look at those only
            records, lens = list(records), lens.copy()
            for i, r in enumerate(records):
                if b"\n" in r:
                    stripped = r.rstrip(b"\r\n")
                    if b"\n" in stripped:
                        pre_bad[i] = ("malformed", "record holds a newline (one record per message)")
                    records[i] = stripped.replace(b"\n", b" ")
                    lens[i] = len(records[i])
            buf = b"\n".join(records)
        ends = np.cumsum(lens) + np.arange(n, dtype=np.int64)
        starts = ends - lens
        return self.decode_spans(buf, starts, ends, pre_bad)

    def decode_lines(self, buf: bytes | memoryview) -> Decoded:
        """Decode newline-separated records (a block of complete lines of a file)."""
        starts, ends = line_spans(buf)
        return self.decode_spans(buf, starts, ends)

    def decode_spans(self, buf: bytes | memoryview, starts: np.ndarray, ends: np.ndarray,
                     pre_bad: dict[int, tuple[str, str]] | None = None) -> Decoded:
        """Records ``buf[starts[i]:ends[i]]``, separated by newlines in `buf`."""
        n = int(starts.size)
        pre_bad = dict(pre_bad or {})
        lens = ends - starts
        for i in np.flatnonzero(lens > self.max_record_bytes):
            pre_bad[int(i)] = ("oversize", f"record of {int(lens[i])} bytes > max_record_bytes={self.max_record_bytes}")
        for i in np.flatnonzero(lens == 0):
            pre_bad.setdefault(int(i), ("column_count", "empty record"))
        mv = memoryview(buf)
        keep = np.ones(n, dtype=bool)
        if pre_bad:
            keep[list(pre_bad)] = False
        bad = [BadRecord(i, r, d, bytes(mv[starts[i]:min(ends[i], starts[i] + 4096)])) for i, (r, d) in pre_bad.items()]
        index = np.flatnonzero(keep)
        if index.size == 0:
            return empty_decoded(self._empty, n, sorted(bad, key=lambda b: b.index),
                                 self.id_column is not None, self.time_column is not None)
        if index.size == n:
            run_buf, run_starts, run_ends = mv, starts, ends
        else:  # rare: rebuild a buffer of the records that are left, one newline between them
            parts = [bytes(mv[starts[i]:ends[i]]) for i in index]
            run_buf = b"\n".join(parts)
            run_lens = ends[index] - starts[index]
            run_ends = np.cumsum(run_lens) + np.arange(index.size, dtype=np.int64)
            run_starts = run_ends - run_lens
        pieces: list = []
        self._decode_run(run_buf, run_starts, run_ends, 0, int(index.size), pieces, bad, index)
        return self._join(pieces, bad, n)

    # --- internals -----------------------------------------------------------------------
    def _span(self, buf, starts, ends, lo: int, hi: int):
        """What :meth:`_parse` gets for records lo..hi-1 (a zero-copy Arrow buffer here)."""
        return pa.py_buffer(buf[int(starts[lo]):int(ends[hi - 1])])

    def _raw(self, buf, starts, ends, j: int) -> bytes:
        """Record j as bytes, for the dead letter."""
        return bytes(buf[int(starts[j]):int(ends[j])])

    def _decode_run(self, buf, starts, ends, lo: int, hi: int, pieces: list, bad: list, index) -> None:
        """Decode records lo..hi-1 of the run; on failure split in halves (see module doc)."""
        try:
            table, kept, rejected = self._parse(self._span(buf, starts, ends, lo, hi), hi - lo)
            if table.num_rows != kept.size or kept.size + len(rejected) != hi - lo:
                raise _RunMismatch(f"parser returned {table.num_rows} rows for {hi - lo} records")
            batch, good, ids, times, faults = self._convert(table)
        except _PARSE_ERRORS as e:
            if hi - lo == 1:
                bad.append(BadRecord(int(index[lo]), "malformed", _short(e), self._raw(buf, starts, ends, lo)))
                return
            mid = (lo + hi) // 2
            self._decode_run(buf, starts, ends, lo, mid, pieces, bad, index)
            self._decode_run(buf, starts, ends, mid, hi, pieces, bad, index)
            return
        for j, reason, detail in rejected:
            bad.append(BadRecord(int(index[lo + j]), reason, detail, self._raw(buf, starts, ends, lo + j)))
        for t, reason, column, detail in faults:
            j = lo + int(kept[t])
            bad.append(BadRecord(int(index[j]), reason, detail, self._raw(buf, starts, ends, j), column))
        pieces.append((batch, index[lo + kept[good]], ids, times))

    def _convert(self, table: pa.Table):
        """(Batch, good table rows, ids, times, [(table row, reason, column, detail)])."""
        n = table.num_rows
        meta_bad = np.zeros(n, dtype=bool)
        faults, ids, times = [], None, None
        if self.id_column is not None:
            ids, missing, unparsable = to_int(_column(table, self.id_column))
            faults += [(int(i), "unparsable", self.id_column, "event id is not an integer") for i in np.flatnonzero(unparsable)]
            faults += [(int(i), "missing_value", self.id_column, "missing event id") for i in np.flatnonzero(missing)]
            meta_bad |= missing | unparsable
        if self.time_column is not None:
            times, missing, unparsable = to_float(_column(table, self.time_column))
            nonfinite = ~np.isfinite(times) & ~(missing | unparsable)
            for mask, reason, what in ((unparsable, "unparsable", "event time is not a number"),
                                       (missing, "missing_value", "missing event time"),
                                       (nonfinite, "non_finite", "event time is not finite")):
                faults += [(int(i), reason, self.time_column, what) for i in np.flatnonzero(mask & ~meta_bad)]
                meta_bad |= mask
        rows = np.flatnonzero(~meta_bad)
        if rows.size < n:
            table = table.filter(pa.array(~meta_bad))
        batch, row_faults = self._converter.convert(table)
        faults += [(int(rows[f.index]), f.reason, f.column, f.detail) for f in row_faults]
        if row_faults:
            ok = np.ones(rows.size, dtype=bool)
            ok[[f.index for f in row_faults]] = False
            rows = rows[ok]
        return (batch, rows, None if ids is None else ids[rows], None if times is None else times[rows], faults)

    def _join(self, pieces: list, bad: list[BadRecord], n: int) -> Decoded:
        bad.sort(key=lambda b: b.index)
        if not pieces:
            return empty_decoded(self._empty, n, bad, self.id_column is not None, self.time_column is not None)
        pieces = [p for p in pieces if p[1].size] or pieces[:1]  # runs are appended in record order
        batch = Batch.concat([p[0] for p in pieces]) if len(pieces) > 1 else pieces[0][0]
        rows = np.concatenate([p[1] for p in pieces]).astype(np.int64)
        ids = None if self.id_column is None else np.concatenate([p[2] for p in pieces])
        times = None if self.time_column is None else np.concatenate([p[3] for p in pieces])
        return Decoded(batch, rows, ids, times, bad, n)


def _column(table: pa.Table, name: str):
    if name not in table.column_names:
        return pa.nulls(table.num_rows, pa.string())
    return table.column(name)


def _short(e: Exception) -> str:
    msg = f"{type(e).__name__}: {e}"
    return msg if len(msg) <= 300 else msg[:297] + "..."
