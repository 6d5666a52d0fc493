"""Decoders for records that are already structured: Python row dicts and Arrow tables.

They share :class:`~recstream.data.streams.decoder_base.TableDecoder`'s conversion and
its split-on-failure rule, so a row of the wrong shape (not a dict, a type pyarrow cannot
combine with the others) is rejected alone as ``malformed``; bad values are flagged per
row like in text records. A bad record's raw form (for the dead letter) is its JSON.

>>> import pyarrow as pa
>>> from recstream.data import Schema, CategoricalFeature
>>> s = Schema(["x"], [CategoricalFeature("c", vocab_size=4)])
>>> out = RowDecoder(s).decode_rows([{"label": 1, "x": 0.5, "c": 1}, "oops", {"label": 0, "x": 1.0, "c": 9}])
>>> out.rows.tolist(), [(b.index, b.reason) for b in out.bad]
([0], [(1, 'malformed'), (2, 'id_out_of_range')])
>>> ArrowTableDecoder(s).decode_table(pa.table({"label": [1, 0], "x": [0.5, None], "c": [1, 2]})).rows.tolist()
[0]
"""
from __future__ import annotations

import json

import numpy as np
import pyarrow as pa

from .decoder_base import TableDecoder
from .records import BadRecord, Decoded


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
