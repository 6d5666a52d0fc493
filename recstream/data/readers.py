"""File readers: each a re-iterable stream of [`Batch`][recstream.data.batch.Batch] in constant memory.

* `CSVReader`: delimited text (CSV, TSV, plain or ``.gz``), blocks of whole lines parsed
  by ``pyarrow.csv``;
* `ParquetReader`: Parquet, one record batch in memory at a time;
* `CriteoReader`: the Criteo display-advertising TSV logs (`criteo_schema`).

They share `FileReader`: a format only says how to stream one file as Arrow record
batches and which data row (1-based, per file) each record-batch row came from; the shared
part converts them (`ColumnConverter`), applies
``on_bad_row`` (`recstream.data.badrows`) and re-batches to exactly ``batch_size``
rows. Each ``iter()`` is a new pass.

Every column is read as text (CSV) or as stored (Parquet) and parsed by the converter, so
one bad cell costs one row, not the whole block, and errors name the file and row.

>>> import os, tempfile
>>> import pyarrow as pa, pyarrow.parquet as pq
>>> from recstream.data.schema import Schema, CategoricalFeature
>>> d = tempfile.mkdtemp()
>>> _ = open(os.path.join(d, "d.csv"), "w").write("label,x,tags\\n1,0.5,a|b\\n0,1.5,\\n")
>>> s = Schema(["x"], [CategoricalFeature("tags", hash_buckets=100, multi_hot=True)])
>>> [b.features.lengths().tolist() for b in CSVReader(os.path.join(d, "d.csv"), s, batch_size=8)]
[[[2, 0]]]
>>> path = os.path.join(d, "d.parquet")
>>> pq.write_table(pa.table({"label": [0, 1, 1], "x": [0.1, 0.2, 0.3], "c": [3, 1, 2]}), path)
>>> r = ParquetReader(path, Schema(["x"], [CategoricalFeature("c", vocab_size=4)]), batch_size=2)
>>> r.get_dataset_size(), [b.batch_size for b in r]
(2, [2, 1])
"""
from __future__ import annotations

import numbers
import os
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq

from ..validation import check_bool, check_int, check_str, check_type, describe
from .badrows import BadRow, BadRowHandler
from .batch import Batch
from .convert import ColumnConverter
from .interrupted import reraise_interrupt
from .pipeline import Rebatcher
from .schema import CategoricalFeature, DenseFeature, Schema


# --- shared by every reader -------------------------------------------------------------------
def expand_paths(path_or_paths, suffixes: Sequence[str], owner: str) -> list[str]:
    """Files named by a path, a directory (its files with `suffixes`, sorted) or a list."""
    if isinstance(path_or_paths, (str, os.PathLike)):
        items = [path_or_paths]
    elif isinstance(path_or_paths, Sequence) and path_or_paths:
        items = list(path_or_paths)
    else:
        raise TypeError(f"{owner}: 'path' must be a path, a directory or a non-empty list of paths, "
                        f"got {path_or_paths!r}")
    paths: list[str] = []
    for item in items:
        if not isinstance(item, (str, os.PathLike)):
            raise TypeError(f"{owner}: 'path' entries must be str or os.PathLike, got {type(item).__name__}")
        p = Path(item)
        if p.is_dir():
            found = sorted(str(f) for f in p.iterdir() if f.is_file() and f.name.endswith(tuple(suffixes)))
            if not found:
                raise FileNotFoundError(f"{owner}: directory {str(p)!r} has no {'/'.join(suffixes)} files")
            paths += found
        elif p.is_file():
            paths.append(str(p))
        else:
            raise FileNotFoundError(f"{owner}: no such file or directory: {str(p)!r}")
    return paths


class FileReader:
    """Base class; subclasses implement `_record_batches`."""

    _suffixes: tuple[str, ...] = ()

    def __init__(self, path_or_paths, schema: Schema, batch_size: int, *, drop_remainder: bool = False,
                 on_bad_row: str = "raise", bad_row_log: str | os.PathLike | None = None,
                 fill_missing_dense: float | None = None, log1p_dense: bool = False) -> None:
        owner = type(self).__name__
        self.schema = check_type(owner, "schema", schema, Schema, allowed="a recstream.data.Schema")
        self.paths = expand_paths(path_or_paths, self._suffixes, owner)
        self.batch_size = check_int(owner, "batch_size", batch_size, minimum=1)
        self.drop_remainder = check_bool(owner, "drop_remainder", drop_remainder)
        self._converter = ColumnConverter(schema, fill_missing_dense, log1p_dense, owner=owner)
        self._bad = BadRowHandler(on_bad_row, bad_row_log, owner)

    @property
    def on_bad_row(self) -> str:
        return self._bad.policy

    @property
    def bad_rows(self) -> Counter:
        """Rows skipped in the current (or last) pass, by reason."""
        return self._bad.counts

    def _record_batches(self, path: str) -> Iterator[tuple[pa.RecordBatch, np.ndarray, list[BadRow]]]:
        """Yield (record batch, 1-based data row of each of its rows, rows the format rejected)."""
        raise NotImplementedError

    def __iter__(self) -> Iterator[Batch]:
        self._bad.start_pass()
        rebatcher = Rebatcher(self.batch_size, self.drop_remainder)
        try:
            for path in self.paths:
                for rb, rows, rejected in self._record_batches(path):
                    batch, faults = self._converter.convert(rb)
                    bad = rejected + [BadRow(path, int(rows[f.index]), f.reason, f.column, f.detail,
                                             _row_data(rb, f.index)) for f in faults]
                    self._bad.handle(bad)
                    yield from rebatcher.add(batch)
                    del batch, rb  # keep at most one record batch alive while the consumer works
            yield from rebatcher.flush()
        finally:
            self._bad.close()

    def __repr__(self) -> str:
        files = self.paths[0] if len(self.paths) == 1 else f"{len(self.paths)} files"
        return f"{type(self).__name__}({files!r}, batch_size={self.batch_size}, on_bad_row={self.on_bad_row!r})"


def _row_data(rb: pa.RecordBatch, i: int) -> dict:
    """One row's raw values, for the bad-row log (called for bad rows only)."""
    return rb.slice(i, 1).to_pylist()[0]


# --- CSV -------------------------------------------------------------------------------------
def _line_blocks(path: str, block_size: int) -> Iterator[tuple[int, bytes | None]]:
    """Cut a (possibly compressed) file into blocks of whole lines, in constant memory.

    Yields ``(number of the block's first line, bytes)``; a line longer than `block_size`
    is yielded as ``(its number, None)`` and its bytes are skipped, so one runaway line costs
    that line, not the file. Lines are cut at every newline: newlines inside quoted values
    are not supported (a value that spans lines is a bad row, see ``CSVReader._parse``).
    """
    line, buf, skipping = 1, b"", False
    with pa.input_stream(path) as f:  # .gz and other compressions detected by extension
        while True:
            data = f.read(block_size)
            buf = buf + data if buf else data
            if skipping:  # inside an over-long line already reported: drop up to its newline
                nl = buf.find(b"\n")
                if nl < 0:
                    buf = b""
                    if not data:
                        return
                    continue
                buf, skipping = buf[nl + 1:], False
            end = len(buf) if not data else buf.rfind(b"\n") + 1  # at end of file: all of it
            if end:
                block, buf = buf[:end], buf[end:]
                # only the first line can be over-long: it alone may have begun in an earlier read
                first = block.find(b"\n") + 1 or len(block)
                if first - 1 > block_size:
                    yield line, None
                    block, line = block[first:], line + 1
                if block:
                    yield line, block
                line += block.count(b"\n")
            if not data:
                return
            if len(buf) > block_size:  # the unfinished line is already longer than a block
                yield line, None
                line, buf, skipping = line + 1, b"", True


class CSVReader(FileReader):
    """Batches from delimited text file(s), streamed block by block.

    header: the first line names the columns; else `column_names` (default: the schema's
    label, dense and categorical names, in that order) gives every column of the file.
    Empty cells are missing values; multi-hot cells are separator-joined ids. Extra
    columns are allowed and ignored. ``get_dataset_size()`` is None (unknown without a scan).

    The file is read `block_size` bytes at a time and cut into whole lines; each block is
    parsed in one pyarrow call. One line is one row: a quoted value may hold the delimiter
    but not a newline. So one broken line costs that line only: a line longer than
    `block_size` is an ``oversize`` bad row (skipped unread), a stray quote that would run
    into the next lines a ``malformed`` one (only a block holding one is re-parsed, in
    halves, to find it); every line after it is read.
    """

    _suffixes = (".csv", ".tsv", ".txt", ".csv.gz", ".tsv.gz", ".txt.gz")

    def __init__(self, path, schema: Schema, batch_size: int, delimiter: str = ",", header: bool = True, *,
                 column_names: Sequence[str] | None = None, drop_remainder: bool = False,
                 on_bad_row: str = "raise", bad_row_log: str | os.PathLike | None = None,
                 fill_missing_dense: float | None = None, log1p_dense: bool = False,
                 quote_char: str | bool = '"', block_size: int = 1 << 22) -> None:
        super().__init__(path, schema, batch_size, drop_remainder=drop_remainder, on_bad_row=on_bad_row,
                         bad_row_log=bad_row_log, fill_missing_dense=fill_missing_dense, log1p_dense=log1p_dense)
        owner = type(self).__name__
        if len(check_str(owner, "delimiter", delimiter)) != 1:
            raise ValueError(f"{owner}: 'delimiter' must be one character, got {delimiter!r}")
        self.delimiter, self.header = delimiter, check_bool(owner, "header", header)
        self.quote_char = check_type(owner, "quote_char", quote_char, (str, bool), allowed="a str or False")
        self.block_size = check_int(owner, "block_size", block_size, minimum=1024)  # bytes
        if column_names is not None and self.header:
            raise ValueError(f"{owner}: 'column_names' is for header=False files (a header names the columns)")
        if column_names is not None:
            check_type(owner, "column_names", column_names, Sequence, allowed="a sequence of column names")
        self.column_names = list(column_names) if column_names is not None else (
            None if self.header else list(schema.columns))
        if self.column_names is not None:
            missing = [c for c in schema.columns if c not in self.column_names]
            if missing:
                raise ValueError(f"{owner}: 'column_names' lacks schema columns {missing}")

    def get_dataset_size(self) -> None:
        return None

    def _options(self, names: list[str], on_invalid, block_size: int):
        needed = list(self.schema.columns)
        return dict(
            read_options=pcsv.ReadOptions(use_threads=False, block_size=block_size, column_names=names),
            parse_options=pcsv.ParseOptions(delimiter=self.delimiter, quote_char=self.quote_char,
                                            ignore_empty_lines=False, invalid_row_handler=on_invalid),
            convert_options=pcsv.ConvertOptions(
                # bytes first: one invalid UTF-8 byte then costs its row (see _as_text), not the file
                column_types={c: pa.binary() for c in needed}, include_columns=needed,
                strings_can_be_null=True, quoted_strings_can_be_null=True, null_values=[""]))

    def _header(self, path: str, line: bytes) -> list[str]:
        """Column names from the header line; a file lacking a schema column fails here."""
        try:
            names = pcsv.read_csv(pa.BufferReader(line), read_options=pcsv.ReadOptions(use_threads=False),
                                  parse_options=pcsv.ParseOptions(delimiter=self.delimiter,
                                                                  quote_char=self.quote_char)).column_names
        except pa.ArrowInvalid as e:
            raise ValueError(f"CSVReader: cannot read the header of {path!r}: {e}") from e
        missing = [c for c in self.schema.columns if c not in names]
        if missing:
            raise ValueError(f"CSVReader: cannot read {path!r} with columns {list(self.schema.columns)}: "
                             f"its header lacks {missing}")
        return names

    def _record_batches(self, path: str) -> Iterator[tuple[pa.RecordBatch, np.ndarray, list[BadRow]]]:
        names, header_lines = self.column_names, 1 if self.header else 0
        for line, block in _line_blocks(path, self.block_size):
            row = line - header_lines  # data row of the block's first line
            if block is None and names is None:
                raise ValueError(f"CSVReader: the header of {path!r} is longer than block_size="
                                 f"{self.block_size} bytes")
            if block is None:
                yield self._rejected_only([BadRow(
                    path, row, "oversize", None, f"line longer than block_size={self.block_size} bytes "
                    f"(raise block_size to read such lines)", None)])
                continue
            if names is None:  # the first block starts with the header line
                cut = block.find(b"\n") + 1 or len(block)
                names, block, row = self._header(path, block[:cut]), block[cut:], row + 1
                if not block:
                    continue
            for table, rows, rejected in self._parse(path, block, row, names):
                if table is None:
                    yield self._rejected_only(rejected)
                    continue
                start = 0
                for rb in table.to_batches():
                    part = rows[start:start + rb.num_rows]
                    start += rb.num_rows
                    rb, part, undecodable = _as_text(rb, part, path)
                    yield rb, part, rejected + undecodable
                    rejected = []
                if rejected:  # a piece whose every line was rejected
                    yield self._rejected_only(rejected)

    def _rejected_only(self, rejected: list[BadRow]) -> tuple[pa.RecordBatch, np.ndarray, list[BadRow]]:
        text = pa.schema([pa.field(c, pa.string()) for c in self.schema.columns])
        return _empty_like(text), np.zeros(0, dtype=np.int64), rejected

    def _parse(self, path: str, block: bytes, first_row: int, names: list[str]) -> list:
        """Parse whole lines at once; a block whose rows do not match its lines one to one is
        split in halves until each stray line stands alone (a fallback: normal blocks parse once).

        A stray quote opens a quoted value that pyarrow continues across newlines, merging the
        following lines into one (bad or even good-looking) row: counting rows against lines
        catches it. An empty line appended to the block makes the count catch it on the last
        line too (a value running to the end swallows that line).
        Returns ``[(table or None, data row of each table row, rejected rows), ...]`` in file order.
        """
        n = block.count(b"\n") + (not block.endswith(b"\n"))
        # an empty line after the block: a runaway value always swallows it, so its row goes missing
        body = block + (b"\n" if block.endswith(b"\n") else b"\n\n")
        rejected: list[BadRow] = []

        def on_invalid(row) -> str:  # called once per line with the wrong field count, in order
            rejected.append(BadRow(path, first_row + row.number - 1, "column_count", None,
                                   f"expected {row.expected_columns} fields, got {row.actual_columns}", row.text))
            return "skip"

        error = None
        try:
            table = pcsv.read_csv(pa.BufferReader(body), **self._options(names, on_invalid, len(body) + 1))
            if table.num_rows + len(rejected) == n + 1 and all(r.row < first_row + n for r in rejected):
                table = table.slice(0, table.num_rows - 1)  # the empty line's row
                rows = np.delete(np.arange(first_row, first_row + n, dtype=np.int64),
                                 [r.row - first_row for r in rejected])
                return [(table, rows, rejected)]
        except pa.ArrowInvalid as e:
            error = e
        if n == 1:
            detail = f"cannot parse the line: {error}" if error else "unbalanced quote (a value spans lines)"
            text = block.decode("utf-8", errors="replace").rstrip("\r\n")
            return [(None, None, [BadRow(path, first_row, "malformed", None, detail, text)])]
        newlines = np.flatnonzero(np.frombuffer(block, dtype=np.uint8) == 10)
        cut = int(newlines[n // 2 - 1]) + 1
        return (self._parse(path, block[:cut], first_row, names)
                + self._parse(path, block[cut:], first_row + n // 2, names))


def _as_text(rb: pa.RecordBatch, rows: np.ndarray, path: str) -> tuple[pa.RecordBatch, np.ndarray, list[BadRow]]:
    """The byte columns of `rb` as UTF-8 text; rows holding invalid UTF-8 are taken out and
    reported (a Python scan of a column happens only when its one-call cast fails)."""
    bad = np.zeros(rb.num_rows, dtype=bool)
    for col in rb.columns:
        try:
            col.cast(pa.string())
        except pa.ArrowInvalid:
            for i, v in enumerate(col.to_pylist()):
                if v is not None and not _utf8(v):
                    bad[i] = True
    report = [BadRow(path, int(rows[i]), "malformed", None, "invalid UTF-8",
                     {n: rb.column(n)[int(i)].as_py() for n in rb.schema.names}) for i in np.flatnonzero(bad)]
    if report:
        keep = pa.array(~bad)
        rb, rows = rb.filter(keep), rows[~bad]
    text = pa.schema([pa.field(f.name, pa.string()) for f in rb.schema])
    return pa.RecordBatch.from_arrays([c.cast(pa.string()) for c in rb.columns], schema=text), rows, report


def _utf8(value: bytes) -> bool:
    try:
        value.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def _empty_like(schema: pa.Schema) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.array([], f.type) for f in schema], schema=schema)


# --- Parquet ---------------------------------------------------------------------------------
class ParquetReader(FileReader):
    """Batches from one or more Parquet files (or a directory of ``*.parquet``), in order.

    Reads only the schema's columns, via ``ParquetFile.iter_batches`` (row group by row
    group), so memory stays at about one record batch whatever the file size. Columns may
    be numbers or strings (parsed), categorical ids integers or strings, multi-hot ids
    lists or separator-joined strings, dictionary-encoded or not.

    get_dataset_size(): batches per pass from the files' metadata (exact unless bad rows
    are skipped, which can only make it smaller). Page checksums are verified; with
    ``on_bad_row="skip"`` a row group that fails (a corrupt page, a failed checksum) is skipped
    from where it fails, as one bad row naming the file, the row group and its data rows.
    """

    _suffixes = (".parquet", ".parq", ".pq")

    def __init__(self, path_or_paths, schema: Schema, batch_size: int, *, drop_remainder: bool = False,
                 on_bad_row: str = "raise", bad_row_log: str | os.PathLike | None = None,
                 fill_missing_dense: float | None = None, log1p_dense: bool = False,
                 use_threads: bool = True) -> None:
        super().__init__(path_or_paths, schema, batch_size, drop_remainder=drop_remainder,
                         on_bad_row=on_bad_row, bad_row_log=bad_row_log,
                         fill_missing_dense=fill_missing_dense, log1p_dense=log1p_dense)
        self.use_threads = check_bool("ParquetReader", "use_threads", use_threads)
        self.num_rows = 0
        for path in self.paths:  # footers only: cheap, and a wrong file fails now, not mid-epoch
            try:
                pf = pq.ParquetFile(path)
            except (pa.ArrowInvalid, OSError) as e:
                raise ValueError(f"ParquetReader: cannot read {path!r} as Parquet: {e}") from e
            missing = [c for c in schema.columns if c not in pf.schema_arrow.names]
            if missing:
                raise ValueError(f"ParquetReader: {path!r} lacks columns {missing} required by the schema; "
                                 f"it has {pf.schema_arrow.names}")
            self.num_rows += pf.metadata.num_rows
            pf.close()

    def get_dataset_size(self) -> int:
        """Batches per pass (``num_rows / batch_size``, rounded by ``drop_remainder``)."""
        full, rest = divmod(self.num_rows, self.batch_size)
        return full + (1 if rest and not self.drop_remainder else 0)

    def _record_batches(self, path: str) -> Iterator[tuple[pa.RecordBatch, np.ndarray, list[BadRow]]]:
        # pages written with checksums (``write_page_checksum=True``) are verified: flipped bits
        # fail here, naming the file, instead of silently changing values. One row group at a
        # time: with on_bad_row='skip' a row group that fails costs only its own remaining rows
        with pq.ParquetFile(path, page_checksum_verification=True) as pf:
            first = 1
            for rg in range(pf.num_row_groups):
                end = first + pf.metadata.row_group(rg).num_rows  # the next row group's first data row
                batches = pf.iter_batches(batch_size=self.batch_size, row_groups=[rg],
                                          columns=list(self.schema.columns), use_threads=self.use_threads)
                while True:
                    try:
                        rb = next(batches)
                    except StopIteration:
                        break
                    except (OSError, pa.ArrowException) as e:
                        reraise_interrupt(e)
                        if self.on_bad_row == "raise":
                            raise ValueError(f"ParquetReader: {path!r} is corrupt after data row {first - 1} "
                                             f"(row group {rg}): {e}") from e
                        yield self._unreadable(pf, path, rg, first, end, e)
                        break
                    n = rb.num_rows
                    yield rb, np.arange(first, first + n, dtype=np.int64), []
                    first += n
                first = end

    def _unreadable(self, pf, path: str, rg: int, first: int, end: int, error: Exception):
        """No rows, and one bad row standing for the rest of row group `rg` (data rows first..end-1)."""
        fields = [pf.schema_arrow.field(c) for c in self.schema.columns]
        empty = pa.RecordBatch.from_arrays([pa.array([], type=f.type) for f in fields], schema=pa.schema(fields))
        bad = BadRow(path, first, "malformed", None,
                     f"row group {rg} unreadable, data rows {first}..{end - 1} skipped: {error}", None)
        return empty, np.zeros(0, dtype=np.int64), [bad]


# --- Criteo ---------------------------------------------------------------------------------
# Each line: ``label \\t I1..I13 \\t C1..C26`` - a 0/1 click label, 13 integer counts and 26
# categorical ids as 8-digit hex strings; any field may be empty. Empty counts become 0 and
# then (by default) ``log1p(max(x, 0))``, the usual transform for these heavy-tailed counts;
# hex ids are hashed into ``hash_buckets`` with id 0 reserved for an empty field.
NUM_DENSE = 13
NUM_CATEGORICAL = 26
DENSE_NAMES = tuple(f"I{i}" for i in range(1, NUM_DENSE + 1))
CATEGORICAL_NAMES = tuple(f"C{i}" for i in range(1, NUM_CATEGORICAL + 1))
CRITEO_COLUMNS = ("label",) + DENSE_NAMES + CATEGORICAL_NAMES
DEFAULT_HASH_BUCKETS = 100_000  # 26 tables x 100k x 16 floats = 166 MB: fits a CPU run


def criteo_schema(hash_buckets: int | Sequence[int] = DEFAULT_HASH_BUCKETS, embedding_dim: int = 16) -> Schema:
    """Schema of the Criteo columns: dense I1..I13, hashed categorical C1..C26.

    `hash_buckets` is one size for all 26 features or one per feature.

    >>> s = criteo_schema(1000, embedding_dim=8)
    >>> s.num_dense, s.num_categorical, s.num_embeddings("C26")
    (13, 26, 1000)
    """
    if isinstance(hash_buckets, numbers.Integral) and not isinstance(hash_buckets, bool):
        sizes = [check_int("criteo_schema", "hash_buckets", hash_buckets, minimum=2)] * NUM_CATEGORICAL
    elif isinstance(hash_buckets, Sequence) and not isinstance(hash_buckets, str):
        if len(hash_buckets) != NUM_CATEGORICAL:
            raise ValueError(f"criteo_schema: 'hash_buckets' needs {NUM_CATEGORICAL} sizes, got {len(hash_buckets)}")
        sizes = [check_int("criteo_schema", f"hash_buckets[{i}]", n, minimum=2) for i, n in enumerate(hash_buckets)]
    else:
        raise TypeError(f"criteo_schema: 'hash_buckets' must be an int or a sequence of {NUM_CATEGORICAL} ints, "
                        f"got {describe(hash_buckets)}")
    cats = [CategoricalFeature(name, hash_buckets=n, embedding_dim=embedding_dim)
            for name, n in zip(CATEGORICAL_NAMES, sizes, strict=True)]
    return Schema([DenseFeature(n) for n in DENSE_NAMES], cats, label="label")


class CriteoReader(CSVReader):
    """Batches from Criteo TSV file(s) (plain or ``.gz``), streamed in constant memory.

    Bad rows (wrong field count, non-numeric count, NaN/inf, label not 0/1, a line longer
    than `block_size`) follow ``on_bad_row`` like any `CSVReader`. The format has
    no quoting, so a quote is plain text. ``schema`` holds the matching schema.

    >>> import tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "day_0.tsv")
    >>> line = "\\t".join(["1"] + ["3"] * 13 + ["68fd1e64"] * 26)
    >>> _ = open(path, "w").write(line + "\\n" + line.replace("\\t3\\t", "\\t\\t", 1) + "\\n")
    >>> (features, labels), = CriteoReader(path, batch_size=4, hash_buckets=1000)
    >>> features.dense.shape, labels.tolist(), features.values.shape
    (torch.Size([2, 13]), [1.0, 1.0], torch.Size([52]))
    """

    _suffixes = (".tsv", ".txt", ".csv", ".tsv.gz", ".txt.gz", ".gz")

    def __init__(self, path, batch_size: int, hash_buckets: int | Sequence[int] = DEFAULT_HASH_BUCKETS, *,
                 embedding_dim: int = 16, log1p: bool = True, drop_remainder: bool = False,
                 on_bad_row: str = "raise", bad_row_log: str | os.PathLike | None = None,
                 block_size: int = 1 << 22) -> None:
        super().__init__(path, criteo_schema(hash_buckets, embedding_dim), batch_size, delimiter="\t",
                         header=False, column_names=CRITEO_COLUMNS, drop_remainder=drop_remainder,
                         on_bad_row=on_bad_row, bad_row_log=bad_row_log, fill_missing_dense=0.0,
                         log1p_dense=log1p, quote_char=False, block_size=block_size)
        self.log1p = log1p  # checked by the converter
