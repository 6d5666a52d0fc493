"""Delimited-text record decoders: CSV lines and Criteo TSV lines -> Batch (+ bad records).

A list of records is joined with newlines and parsed by ONE ``pyarrow.csv.read_csv`` call
(every column as text, then parsed per column by the shared converter), so decoding costs
a few vectorized passes per column, not Python work per row. Lines with the wrong number
of fields reach pyarrow's ``invalid_row_handler`` and are rejected as ``column_count``.

Records carry no header: the columns are `column_names` (default: label, dense,
categorical, then the event-id / event-time columns if named). Quoted fields may hold the
delimiter, never a newline (one record per line).

>>> from recstream.data.streams import CriteoTSVDecoder
>>> line = "\\t".join(["1"] + ["3"] * 13 + ["68fd1e64"] * 26 + ["42", "1700000000.5"])
>>> d = CriteoTSVDecoder(1000, id_column="event_id", time_column="event_time")
>>> out = d.decode([line.encode(), b"1\\tnan"])
>>> out.batch.features.dense.shape, out.ids.tolist(), [b.reason for b in out.bad]
(torch.Size([1, 13]), [42], ['column_count'])
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv

from ..criteo import COLUMNS as CRITEO_COLUMNS
from ..criteo import DEFAULT_HASH_BUCKETS, criteo_schema
from ..schema import Schema
from .decoder_base import DEFAULT_MAX_RECORD_BYTES, TableDecoder


class CSVLineDecoder(TableDecoder):
    """Delimited lines (CSV, TSV...) -> Batch. See the module docstring.

    delimiter: one character; quote_char: '"' by default, False for none (Criteo TSV).
    fill_missing_dense / log1p_dense: as for :class:`~recstream.data.CSVReader`.
    """

    def __init__(self, schema: Schema, delimiter: str = ",", *, column_names: Sequence[str] | None = None,
                 id_column: str | None = None, time_column: str | None = None,
                 quote_char: str | bool = '"', fill_missing_dense: float | None = None,
                 log1p_dense: bool = False, max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> None:
        super().__init__(schema, id_column=id_column, time_column=time_column, fill_missing_dense=fill_missing_dense,
                         log1p_dense=log1p_dense, max_record_bytes=max_record_bytes)
        if not isinstance(delimiter, str) or len(delimiter) != 1 or delimiter in "\r\n":
            raise ValueError(f"CSVLineDecoder: 'delimiter' must be one character (not a newline), got {delimiter!r}")
        self.delimiter, self.quote_char = delimiter, quote_char
        self.column_names = list(column_names) if column_names is not None else self.columns
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

    def with_columns(self, column_names: Sequence[str]) -> "CSVLineDecoder":
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
    appended as columns 41-42) -> Batch, like :class:`~recstream.data.CriteoReader`:
    empty counts are 0, counts get ``log1p`` (`log1p`), hex ids hash into `hash_buckets`."""

    def __init__(self, hash_buckets: int | Sequence[int] = DEFAULT_HASH_BUCKETS, *, embedding_dim: int = 16,
                 log1p: bool = True, id_column: str | None = None, time_column: str | None = None,
                 max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> None:
        extra = [c for c in (id_column, time_column) if c]
        super().__init__(criteo_schema(hash_buckets, embedding_dim), "\t",
                         column_names=list(CRITEO_COLUMNS) + extra, id_column=id_column, time_column=time_column,
                         quote_char=False, fill_missing_dense=0.0, log1p_dense=log1p,
                         max_record_bytes=max_record_bytes)
