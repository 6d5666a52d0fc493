"""Record decoders: raw records -> [`Batch`][recstream.data.batch.Batch] + bad records, vectorized with pyarrow.

Every decoder shares one pipeline (`TableDecoder`); a format only says how to parse a
contiguous run of records into an Arrow table (``_parse``):

1. find the records' byte spans (one numpy scan), reject empty and oversize ones;
2. parse the whole run in one pyarrow call;
3. if that call fails (one invalid JSON line, invalid UTF-8, a type that changes mid-run),
   split the run in halves and retry each: only the failing record ends up alone, and is
   rejected as ``malformed`` with pyarrow's message; a clean run costs one call;
4. convert with `ColumnConverter` (which flags bad values
   per row) plus the optional event-id / event-time columns.

The formats:

* text records, one per line or Kafka message: `CSVLineDecoder` (CSV, TSV...; one
  ``pyarrow.csv.read_csv`` call per run, every column as text, lines with the wrong field
  count rejected as ``column_count``), `CriteoTSVDecoder` (Criteo's TSV layout) and
  `JSONDecoder` (one JSON object per record, one ``pyarrow.json.read_json`` call per
  run; values may be numbers or numeric strings, multi-hot ids lists; absent keys are
  missing values, unknown keys are ignored). Text records carry no header: the columns are
  `column_names` (default: label, dense, categorical, then the event-id / event-time
  columns if named); quoted fields may hold the delimiter, never a newline.
* structured records: `RowDecoder` (Python row dicts) and `ArrowTableDecoder`
  (Arrow tables / record batches, e.g. Parquet row groups); a bad record's raw form (for
  the dead letter) is its JSON.

>>> from recstream.data import Schema, CategoricalFeature
>>> s = Schema(["x"], [CategoricalFeature("c", vocab_size=5)])
>>> out = CSVLineDecoder(s).decode([b"1,0.5,3", b"0,oops,1", b"1,2"])
>>> out.batch.batch_size, [(b.index, b.reason) for b in out.bad]
(1, [(1, 'unparsable'), (2, 'column_count')])
>>> out = JSONDecoder(s, id_column="id").decode([b'{"label": 1, "x": 0.5, "c": 3, "id": 7}', b'{"label": 0, "x": 1',
...                                              b'{"label": 1, "c": 2, "x": "NaN", "id": 8}'])
>>> out.ids.tolist(), [(b.index, b.reason) for b in out.bad]
([7], [(1, 'malformed'), (2, 'non_finite')])
>>> out = RowDecoder(s).decode_rows([{"label": 1, "x": 0.5, "c": 1}, "oops", {"label": 0, "x": 1.0, "c": 9}])
>>> out.rows.tolist(), [(b.index, b.reason) for b in out.bad]
([0], [(1, 'malformed'), (2, 'id_out_of_range')])
>>> line = "\\t".join(["1"] + ["3"] * 13 + ["68fd1e64"] * 26 + ["42", "1700000000.5"])
>>> out = CriteoTSVDecoder(1000, id_column="event_id", time_column="event_time").decode([line.encode(), b"1\\tnan"])
>>> out.batch.features.dense.shape, out.ids.tolist(), [b.reason for b in out.bad]
(torch.Size([1, 13]), [42], ['column_count'])
"""
from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.json as pjson

from ...validation import check_int, check_str, check_type
from ..batch import Batch
from ..convert import ColumnConverter, to_float, to_int
from ..interrupted import reraise_interrupt
from ..readers import CRITEO_COLUMNS, DEFAULT_HASH_BUCKETS, criteo_schema
from ..schema import Schema
from .records import BadRecord, Decoded, empty_decoded, line_spans

DEFAULT_MAX_RECORD_BYTES = 1 << 20
MAX_JSON_DEPTH = 64  # JSON records nested deeper are rejected as malformed (see JSONDecoder._screen)
_PARSE_ERRORS = (pa.ArrowException, TypeError, ValueError, KeyError, AttributeError, UnicodeDecodeError,
                 IndexError)


class _RunMismatch(ValueError):
    """The parser produced a different number of rows than there are records in the run."""


class TableDecoder:
    """The pipeline every record decoder shares (see the module docstring).

    id_column / time_column: optional columns holding an integer event id and the event
    time (seconds since the epoch, float); a record whose id/time is missing or unparsable
    is bad. They are exposed per batch by the streams' ``last_batch_meta()``.
    """

    def __init__(self, schema: Schema, *, id_column: str | None = None, time_column: str | None = None,
                 fill_missing_dense: float | None = None, log1p_dense: bool = False,
                 max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> None:
        owner = type(self).__name__
        check_type(owner, "schema", schema, Schema, allowed="a recstream.data.Schema")
        for name, col in (("id_column", id_column), ("time_column", time_column)):
            if check_str(owner, name, col, allow_none=True) in schema.columns:
                raise ValueError(f"{owner}: '{name}' must be a column name outside the schema, got {col!r}")
        max_record_bytes = check_int(owner, "max_record_bytes", max_record_bytes, minimum=1)
        self.schema = schema
        self.id_column, self.time_column = id_column, time_column
        self.max_record_bytes = max_record_bytes
        self._converter = ColumnConverter(schema, fill_missing_dense, log1p_dense, owner=owner)
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
        self._screen(buf, starts, ends, pre_bad)
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
    def _screen(self, buf, starts, ends, pre_bad: dict[int, tuple[str, str]]) -> None:
        """Reject records the parser must never see (a format's own dangers); default: none."""

    def _span(self, buf, starts, ends, lo: int, hi: int):
        """What `_parse` gets for records lo..hi-1 (a zero-copy Arrow buffer here)."""
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
            reraise_interrupt(e)
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
            faults += [(int(i), "unparsable", self.id_column, "event id is not an integer")
                       for i in np.flatnonzero(unparsable)]
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

def _names(owner: str, names) -> list[str]:
    """`names` as a list of column names (a sequence of str)."""
    check_type(owner, "column_names", names, Sequence, allowed="a sequence of column names")
    if isinstance(names, str) or not all(isinstance(n, str) for n in names):
        raise TypeError(f"{owner}: 'column_names' must be a sequence of str, got {names!r}")
    return list(names)


# --- text records ------------------------------------------------------------------------
class CSVLineDecoder(TableDecoder):
    """Delimited lines (CSV, TSV...) -> Batch (see the module docstring).

    delimiter: one character; quote_char: '"' by default, False for none (Criteo TSV).
    fill_missing_dense / log1p_dense: as for `CSVReader`.
    """

    def __init__(self, schema: Schema, delimiter: str = ",", *, column_names: Sequence[str] | None = None,
                 id_column: str | None = None, time_column: str | None = None,
                 quote_char: str | bool = '"', fill_missing_dense: float | None = None,
                 log1p_dense: bool = False, max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> None:
        super().__init__(schema, id_column=id_column, time_column=time_column, fill_missing_dense=fill_missing_dense,
                         log1p_dense=log1p_dense, max_record_bytes=max_record_bytes)
        if len(check_str("CSVLineDecoder", "delimiter", delimiter)) != 1 or delimiter in "\r\n":
            raise ValueError(f"CSVLineDecoder: 'delimiter' must be one character (not a newline), got {delimiter!r}")
        self.delimiter, self.quote_char = delimiter, quote_char
        check_type("CSVLineDecoder", "quote_char", quote_char, (str, bool), allowed="a str or False")
        self.column_names = _names("CSVLineDecoder", column_names) if column_names is not None else self.columns
        missing = [c for c in self.columns if c not in self.column_names]
        if missing:
            raise ValueError(f"CSVLineDecoder: 'column_names' lacks columns {missing}")
        if len(set(self.column_names)) != len(self.column_names):
            raise ValueError(f"CSVLineDecoder: 'column_names' has duplicates: {self.column_names}")
        needed = self.columns
        # Options are built once: read_csv is called per decoded chunk
        self._read_options = pcsv.ReadOptions(use_threads=False, column_names=self.column_names,
                                              block_size=1 << 24)
        self._convert_options = pcsv.ConvertOptions(
            column_types={c: pa.string() for c in needed}, include_columns=needed,
            strings_can_be_null=True, quoted_strings_can_be_null=True, null_values=[""])

    def with_columns(self, column_names: Sequence[str]) -> CSVLineDecoder:
        """The same decoder for lines laid out as `column_names` (e.g. read from a header)."""
        return CSVLineDecoder(self.schema, self.delimiter, column_names=column_names, id_column=self.id_column,
                              time_column=self.time_column, quote_char=self.quote_char,
                              fill_missing_dense=self._converter.fill_missing_dense,
                              log1p_dense=self._converter.log1p_dense, max_record_bytes=self.max_record_bytes)

    def _parse(self, buf: pa.Buffer, n: int):
        _check_utf8(buf)  # pyarrow cannot hand undecodable lines to the handler below: fail the run
        rejected: list[tuple[int, str, str]] = []

        def on_invalid(row) -> str:  # once per line with the wrong field count, in order
            rejected.append((row.number - 1, "column_count",
                             f"expected {row.expected_columns} fields, got {row.actual_columns}"))
            return "skip"

        parse = pcsv.ParseOptions(delimiter=self.delimiter, quote_char=self.quote_char,
                                  ignore_empty_lines=False, invalid_row_handler=on_invalid)
        table = pcsv.read_csv(pa.BufferReader(buf), read_options=self._read_options, parse_options=parse,
                              convert_options=self._convert_options)
        if any(j is None or j < 0 for j, _, _ in rejected):
            raise ValueError("pyarrow did not report line numbers of rejected lines")
        kept = np.ones(n, dtype=bool)
        if rejected:
            kept[[j for j, _, _ in rejected if j < n]] = False
        return table, np.flatnonzero(kept), rejected


def _check_utf8(buf: pa.Buffer) -> None:
    """Raise ArrowInvalid unless `buf` is valid UTF-8 (validated in C, without a copy)."""
    offsets = pa.py_buffer(np.array([0, buf.size], dtype=np.int64))
    pa.Array.from_buffers(pa.large_binary(), 1, [None, offsets, buf]).cast(pa.large_string())


class CriteoTSVDecoder(CSVLineDecoder):
    """Criteo display-ads TSV lines (``label, I1..I13, C1..C26``, optional event id / time
    appended as columns 41-42) -> Batch, like `CriteoReader`:
    empty counts are 0, counts get ``log1p`` (`log1p`), hex ids hash into `hash_buckets`."""

    def __init__(self, hash_buckets: int | Sequence[int] = DEFAULT_HASH_BUCKETS, *, embedding_dim: int = 16,
                 log1p: bool = True, id_column: str | None = None, time_column: str | None = None,
                 max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> None:
        extra = [c for c in (id_column, time_column) if c]
        super().__init__(criteo_schema(hash_buckets, embedding_dim), "\t",
                         column_names=list(CRITEO_COLUMNS) + extra, id_column=id_column, time_column=time_column,
                         quote_char=False, fill_missing_dense=0.0, log1p_dense=log1p,
                         max_record_bytes=max_record_bytes)


class JSONDecoder(TableDecoder):
    """JSON-lines records -> Batch (see the module docstring)."""

    def __init__(self, schema: Schema, *, id_column: str | None = None, time_column: str | None = None,
                 fill_missing_dense: float | None = None, log1p_dense: bool = False,
                 max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> None:
        super().__init__(schema, id_column=id_column, time_column=time_column, fill_missing_dense=fill_missing_dense,
                         log1p_dense=log1p_dense, max_record_bytes=max_record_bytes)
        # block_size above any run we decode: one block, so types are inferred once per call
        self._read_options = pjson.ReadOptions(use_threads=False, block_size=1 << 26)
        self._parse_options = pjson.ParseOptions(newlines_in_values=False, unexpected_field_behavior="infer")

    def _screen(self, buf, starts, ends, pre_bad: dict[int, tuple[str, str]]) -> None:
        # pyarrow's JSON parser recurses per nesting level: a record nested some thousands of
        # levels deep overflows the native stack and kills the process (a poison record that
        # would kill every restart too), so such records are rejected before parsing
        for i in deep_json_records(buf, starts, ends, MAX_JSON_DEPTH):
            pre_bad.setdefault(i, ("malformed", f"JSON nested deeper than {MAX_JSON_DEPTH} levels"))

    def _parse(self, buf: pa.Buffer, n: int):
        table = pjson.read_json(pa.BufferReader(buf), read_options=self._read_options,
                                parse_options=self._parse_options)
        if table.num_rows != n:  # blank or multi-object lines: the run is split to find them
            raise ValueError(f"expected one JSON object per line, got {table.num_rows} objects in {n} lines")
        columns = {}
        for name in self.columns:
            col = table.column(name) if name in table.column_names else pa.nulls(n, pa.string())
            if pa.types.is_null(col.type):  # a key that is null/absent everywhere in the block
                col = pa.nulls(n, pa.string())
            columns[name] = col
        return pa.table(columns), np.arange(n, dtype=np.int64), []

def deep_json_records(buf, starts: np.ndarray, ends: np.ndarray, limit: int) -> list[int]:
    """Indices of the records ``buf[starts[i]:ends[i]]`` whose JSON nests deeper than `limit`.

    One numpy pass counts the opening brackets per record; only a record with more than
    `limit` of them is scanned exactly (brackets inside strings do not count).

    >>> recs = [b'{"a": [1]}', b"[" * 100 + b"]" * 100, b'{"s": "' + b"{" * 100 + b'"}']
    >>> ends = np.cumsum([len(r) + 1 for r in recs]) - 1; starts = ends - [len(r) for r in recs]
    >>> b = b" ".join(recs)
    >>> deep_json_records(b, starts, ends, 64)
    [1]
    """
    a = np.frombuffer(buf, dtype=np.uint8)
    opens = np.flatnonzero((a == ord("{")) | (a == ord("[")))
    if opens.size <= limit:  # no record can nest that deep
        return []
    counts = np.searchsorted(opens, ends) - np.searchsorted(opens, starts)
    return [int(i) for i in np.flatnonzero(counts > limit) if _json_depth(a[starts[i]:ends[i]].tobytes()) > limit]


def _json_depth(record: bytes) -> int:
    """The deepest bracket nesting of `record`, skipping string contents."""
    depth = deepest = 0
    in_string = escaped = False
    for c in record:
        if in_string:
            if escaped:
                escaped = False
            elif c == 0x5C:  # backslash
                escaped = True
            elif c == 0x22:  # closing quote
                in_string = False
        elif c == 0x22:
            in_string = True
        elif c in (0x7B, 0x5B):
            depth += 1
            deepest = max(deepest, depth)
        elif c in (0x7D, 0x5D):
            depth -= 1
    return deepest


# --- structured records ------------------------------------------------------------------
class RowDecoder(TableDecoder):
    """Row dicts -> Batch via ``pyarrow.Table.from_pylist``."""

    def decode_rows(self, rows: list) -> Decoded:
        n = len(rows)
        pieces, bad = [], []
        # from_pylist reads a non-dict item as an all-null row: reject it by name instead
        index = np.fromiter((i for i, r in enumerate(rows) if isinstance(r, dict)), dtype=np.int64)
        if index.size < n:
            bad = [BadRecord(i, "malformed", f"row is a {type(r).__name__}, not a dict", self._raw(rows, None, None, i))
                   for i, r in enumerate(rows) if not isinstance(r, dict)]
            rows = [rows[i] for i in index]
        pos = np.arange(index.size, dtype=np.int64)
        if index.size:
            self._decode_run(rows, pos, pos + 1, 0, int(index.size), pieces, bad, index)
        return self._join(pieces, bad, n)

    def _span(self, buf, starts, ends, lo: int, hi: int):
        return buf[lo:hi]

    def _raw(self, buf, starts, ends, j: int) -> bytes:
        return json.dumps(buf[j], default=str).encode()

    def _parse(self, rows: list, n: int):
        return self._select(pa.Table.from_pylist(rows)), np.arange(n, dtype=np.int64), []

    def _select(self, table: pa.Table) -> pa.Table:
        """The decoder's columns; absent or all-null ones as null strings (parsed as missing)."""
        n, cols = table.num_rows, {}
        for name in self.columns:
            col = table.column(name) if name in table.column_names else None
            cols[name] = pa.nulls(n, pa.string()) if col is None or pa.types.is_null(col.type) else col
        return pa.table(cols)


class ArrowTableDecoder(RowDecoder):
    """Arrow tables / record batches (Parquet row groups) -> Batch."""

    def decode_table(self, table: pa.Table | pa.RecordBatch) -> Decoded:
        if isinstance(table, pa.RecordBatch):
            table = pa.Table.from_batches([table])
        n = table.num_rows
        idx = np.arange(n, dtype=np.int64)
        pieces, bad = [], []
        if n:
            self._decode_run(table, idx, idx + 1, 0, n, pieces, bad, idx)
        return self._join(pieces, bad, n)

    def _span(self, table, starts, ends, lo: int, hi: int):
        return table.slice(lo, hi - lo)

    def _raw(self, table, starts, ends, j: int) -> bytes:
        return json.dumps(table.slice(j, 1).to_pylist()[0], default=str).encode()

    def _parse(self, table: pa.Table, n: int):
        return self._select(table), np.arange(n, dtype=np.int64), []
