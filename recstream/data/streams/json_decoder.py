"""JSON-lines record decoder: one JSON object per record -> Batch (+ bad records).

A list of records is parsed by ONE ``pyarrow.json.read_json`` call. Values may be numbers
or numeric strings (``"x": 1.5`` or ``"x": "1.5"``), ids integers or strings, multi-hot
ids lists; absent keys are missing values; unknown keys are ignored. pyarrow rejects a
whole block for one invalid line or for a column whose JSON type changes between lines;
the shared base then splits the block until the culprit stands alone (``malformed``), so
a clean stream costs one parse per block.

>>> from recstream.data import Schema, CategoricalFeature
>>> d = JSONDecoder(Schema(["x"], [CategoricalFeature("c", vocab_size=9)]), id_column="id")
>>> out = d.decode([b'{"label": 1, "x": 0.5, "c": 3, "id": 7}', b'{"label": 0, "x": 1', b'{"label": 1, "c": 2, "x": "NaN", "id": 8}'])
>>> out.ids.tolist(), [(b.index, b.reason) for b in out.bad]
([7], [(1, 'malformed'), (2, 'non_finite')])
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.json as pjson

from ..schema import Schema
from .decoder_base import DEFAULT_MAX_RECORD_BYTES, TableDecoder


class JSONDecoder(TableDecoder):
    """JSON-lines records -> Batch. See the module docstring."""

    def __init__(self, schema: Schema, *, id_column: str | None = None, time_column: str | None = None,
                 fill_missing_dense: float | None = None, log1p_dense: bool = False,
                 max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> None:
        super().__init__(schema, id_column=id_column, time_column=time_column, fill_missing_dense=fill_missing_dense,
                         log1p_dense=log1p_dense, max_record_bytes=max_record_bytes)
        # block_size above any chunk we decode: one block, so types are inferred once per call
        self._read_options = pjson.ReadOptions(use_threads=False, block_size=1 << 26)
        self._parse_options = pjson.ParseOptions(newlines_in_values=False, unexpected_field_behavior="infer")

    def _parse(self, buf: pa.Buffer, n: int):
        table = pjson.read_json(pa.BufferReader(buf), read_options=self._read_options,
                                parse_options=self._parse_options)
        if table.num_rows != n:  # blank or multi-object lines: the base splits to find them
            raise ValueError(f"expected one JSON object per line, got {table.num_rows} objects in {n} lines")
        columns = {}
        for name in self.columns:
            col = table.column(name) if name in table.column_names else pa.nulls(n, pa.string())
            if pa.types.is_null(col.type):  # a key that is null/absent everywhere in the block
                col = pa.nulls(n, pa.string())
            columns[name] = col
        return pa.table(columns), np.arange(n, dtype=np.int64), []
