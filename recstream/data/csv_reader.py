"""Stream delimited text files (CSV, TSV) as batches with ``pyarrow.csv.open_csv``.

Every column is read as text and parsed by :mod:`recstream.data.parse`, so one bad cell
costs one row, not the whole block, and errors can name the row. Lines with the wrong
number of fields reach pyarrow's ``invalid_row_handler`` with their line number (parsing
is kept single-threaded for that; conversion is vectorized anyway).

Row numbers are line numbers less the header line, so records must not span lines
(quoted fields may hold delimiters, not newlines).

>>> import tempfile, os
>>> from recstream.data.schema import Schema, CategoricalFeature
>>> path = os.path.join(tempfile.mkdtemp(), "d.csv")
>>> _ = open(path, "w").write("label,x,tags\\n1,0.5,a|b\\n0,1.5,\\n")
>>> s = Schema(["x"], [CategoricalFeature("tags", hash_buckets=100, multi_hot=True)])
>>> [b.features.lengths().tolist() for b in CSVReader(path, s, batch_size=8)]
[[[2, 0]]]
"""
from __future__ import annotations

import os
from typing import Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv

from .badrows import BadRow
from .reader_base import FileReader
from .schema import Schema


class _LineTracker:
    """Maps the n-th valid row of a file to its data-row number, given the skipped lines.

    pyarrow reports each rejected line (in file order, before the batch that follows it);
    valid row k (0-based) is data row ``k + 1 + #rejected rows before it``. Rejected rows
    that lie before every future row are folded into a counter: memory stays constant.
    """

    def __init__(self) -> None:
        self.valid_seen = 0
        self.rejected_total = 0
        self.folded = 0
        self._gaps: list[int] = []  # per pending rejected row: valid rows before it

    def reject(self, data_row: int) -> None:
        self._gaps.append(data_row - 1 - self.rejected_total)
        self.rejected_total += 1

    def rows_for(self, n: int) -> np.ndarray:
        k = np.arange(self.valid_seen, self.valid_seen + n, dtype=np.int64)
        gaps = np.asarray(self._gaps, dtype=np.int64)
        rows = k + 1 + self.folded + np.searchsorted(gaps, k, side="right")
        self.valid_seen += n
        done = int(np.searchsorted(gaps, self.valid_seen, side="right"))  # before all later rows
        self.folded += done
        del self._gaps[:done]
        return rows


class CSVReader(FileReader):
    """Batches from delimited text file(s), streamed block by block.

    header: the first line names the columns; else `column_names` (default: the schema's
    label, dense and categorical names, in that order) gives every column of the file.
    Empty cells are missing values; multi-hot cells are separator-joined ids. Extra
    columns are allowed and ignored. ``get_dataset_size()`` is None (unknown without a scan).
    """

    _suffixes = (".csv", ".tsv", ".txt", ".csv.gz", ".tsv.gz", ".txt.gz")

    def __init__(self, path, schema: Schema, batch_size: int, delimiter: str = ",", header: bool = True, *,
                 column_names: Sequence[str] | None = None, drop_remainder: bool = False,
                 on_bad_row: str = "raise", bad_row_log: str | os.PathLike | None = None,
                 fill_missing_dense: float | None = None, log1p_dense: bool = False,
                 quote_char: str | bool = '"', block_size: int = 1 << 22) -> None:
        super().__init__(path, schema, batch_size, drop_remainder=drop_remainder, on_bad_row=on_bad_row,
                         bad_row_log=bad_row_log, fill_missing_dense=fill_missing_dense, log1p_dense=log1p_dense)
        if not isinstance(delimiter, str) or len(delimiter) != 1:
            raise ValueError(f"CSVReader: 'delimiter' must be one character, got {delimiter!r}")
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1024:
            raise ValueError(f"CSVReader: 'block_size' must be an int >= 1024 (bytes), got {block_size!r}")
        self.delimiter, self.header, self.quote_char, self.block_size = delimiter, bool(header), quote_char, block_size
        if column_names is not None and self.header:
            raise ValueError("CSVReader: 'column_names' is for header=False files (a header names the columns)")
        self.column_names = list(column_names) if column_names is not None else (
            None if self.header else list(schema.columns))
        if self.column_names is not None:
            missing = [c for c in schema.columns if c not in self.column_names]
            if missing:
                raise ValueError(f"CSVReader: 'column_names' lacks schema columns {missing}")

    def get_dataset_size(self) -> None:
        return None

    def _open(self, path: str, tracker: _LineTracker, rejected: list[BadRow]):
        header_lines = 1 if self.header else 0

        def on_invalid(row) -> str:  # called once per malformed line, in file order
            data_row = row.number - header_lines
            tracker.reject(data_row)
            rejected.append(BadRow(path, data_row, "column_count", None,
                                   f"expected {row.expected_columns} fields, got {row.actual_columns}", row.text))
            return "skip"

        needed = list(self.schema.columns)
        try:
            return pcsv.open_csv(
                path,
                read_options=pcsv.ReadOptions(use_threads=False, block_size=self.block_size,
                                              column_names=self.column_names),
                parse_options=pcsv.ParseOptions(delimiter=self.delimiter, quote_char=self.quote_char,
                                                ignore_empty_lines=False, invalid_row_handler=on_invalid),
                convert_options=pcsv.ConvertOptions(
                    column_types={c: pa.string() for c in needed}, include_columns=needed,
                    strings_can_be_null=True, quoted_strings_can_be_null=True, null_values=[""]))
        except (pa.ArrowInvalid, KeyError) as e:
            raise ValueError(f"CSVReader: cannot read {path!r} with columns {needed}: {e}") from e

    def _record_batches(self, path: str) -> Iterator[tuple[pa.RecordBatch, np.ndarray, list[BadRow]]]:
        tracker, rejected = _LineTracker(), []
        reader = self._open(path, tracker, rejected)
        try:
            while True:
                try:
                    rb = reader.read_next_batch()
                except StopIteration:
                    break
                except pa.ArrowInvalid as e:
                    raise ValueError(f"CSVReader: {path!r}: {e}") from e
                report, rejected[:] = list(rejected), []
                yield rb, tracker.rows_for(rb.num_rows), report
            if rejected:  # malformed lines after the last good one
                yield _empty_like(reader.schema), np.zeros(0, dtype=np.int64), list(rejected)
        finally:
            reader.close()


def _empty_like(schema: pa.Schema) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.array([], f.type) for f in schema], schema=schema)
