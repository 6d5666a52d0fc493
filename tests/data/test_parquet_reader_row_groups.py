"""ParquetReader with on_bad_row='skip': a failed page checksum costs only its row group.

A real file of 5 row groups written with page checksums, one byte flipped in a data page of row
group 2: the reader skips that row group's rows (one bad row naming the file, the row group and
its data rows) and reads the other four; with on_bad_row='raise' it stops, naming the row group.
"""
from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recstream.data import ParquetReader, Schema

SCHEMA = Schema(["x1", "x2"])


def _corrupt_file(path) -> None:
    x = np.arange(500, dtype=np.float64)
    table = pa.table({"label": (np.arange(500) % 2).astype(np.float64), "x1": x, "x2": x * 2})
    pq.write_table(table, path, row_group_size=100, compression="NONE", use_dictionary=False,
                   write_page_checksum=True)
    col = pq.ParquetFile(path).metadata.row_group(2).column(1)  # x1 in row group 2
    raw = bytearray(path.read_bytes())
    raw[col.data_page_offset + col.total_compressed_size - 18] ^= 0x40
    path.write_bytes(bytes(raw))


def test_skip_loses_only_the_failing_row_group(tmp_path):
    path = tmp_path / "a.parquet"
    _corrupt_file(path)
    reader = ParquetReader(path, SCHEMA, batch_size=64, on_bad_row="skip", bad_row_log=tmp_path / "bad.jsonl")
    values = sorted(int(v) for b in reader for v in b.features.dense[:, 0].tolist())
    assert values == [*range(0, 200), *range(300, 500)]
    assert reader.bad_rows == {"malformed": 1}
    [bad] = [json.loads(line) for line in (tmp_path / "bad.jsonl").read_text().splitlines()]
    assert bad["file"] == str(path) and bad["row"] == 201 and "row group 2" in bad["detail"] \
        and "data rows 201..300" in bad["detail"]


def test_raise_names_the_row_group(tmp_path):
    path = tmp_path / "a.parquet"
    _corrupt_file(path)
    with pytest.raises(ValueError, match=r"corrupt after data row 200 \(row group 2\)"):
        list(ParquetReader(path, SCHEMA, batch_size=64))
