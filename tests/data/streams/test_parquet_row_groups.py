"""A Parquet file with a corrupt page loses only the row group of that page, not the whole file.

Real files with several row groups, written with page checksums, one byte flipped in a data page
of one row group: the stream dead-letters that row group (naming the file, the row group and
its rows) and reads every other row group of the file, and the files after it, also after a
restart from inside the file. `recstream produce --format parquet` writes page checksums, so a
flipped byte in its files is caught the same way; without checksums it is read as a wrong value.
"""
from __future__ import annotations

import argparse
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from recstream.cli import produce
from recstream.data import Schema
from recstream.data.streams import ArrowTableDecoder, DirectoryStream

SCHEMA = Schema(["x1", "x2"])
ROWS, GROUPS = 100, 5


def _table(lo: int, n: int) -> pa.Table:
    x = np.arange(lo, lo + n, dtype=np.float64)
    return pa.table({"label": (np.arange(n) % 2).astype(np.float64), "x1": x, "x2": x * 2})


def _write(path, lo: int, n: int, **kw) -> None:
    pq.write_table(_table(lo, n), path, row_group_size=ROWS, compression="NONE", use_dictionary=False, **kw)


def _flip(path, row_group: int, column: str) -> None:
    """Flip one byte of the values in the (only) data page of `column` in `row_group`."""
    md = pq.ParquetFile(path).metadata
    col = md.row_group(row_group).column(md.schema.names.index(column))
    end = col.data_page_offset + col.total_compressed_size
    raw = bytearray(open(path, "rb").read())
    raw[end - 18] ^= 0x40  # an exponent bit of a float value near the end of the page
    open(path, "wb").write(bytes(raw))


def _read(stream) -> list[int]:
    return sorted(int(v) for b in stream for v in b.features.dense[:, 0].tolist())


def _dead(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_failed_page_checksum_dead_letters_only_its_row_group(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    _write(data / "a.parquet", 0, ROWS * GROUPS, write_page_checksum=True)
    _write(data / "b.parquet", 1000, 50, write_page_checksum=True)
    _flip(data / "a.parquet", 2, "x1")
    stream = DirectoryStream(data, SCHEMA, batch_size=25, format="parquet", idle_timeout=0.3,
                             dead_letter=tmp_path / "dead.jsonl")
    assert _read(stream) == [*range(0, 200), *range(300, 500), *range(1000, 1050)]  # only rows 200..299 lost
    assert stream.bad_records == {"malformed": 1}
    [letter] = _dead(tmp_path / "dead.jsonl")
    text = json.dumps(letter)
    assert "a.parquet" in text and "row group 2" in text and "rows 200..299" in text, letter
    # a restart from inside the file, before the bad row group: the same row group is skipped again
    again = DirectoryStream(data, SCHEMA, batch_size=25, format="parquet", idle_timeout=0.3)
    again.seek({"file": "a.parquet", "offset": 150})
    assert _read(again) == [*range(150, 200), *range(300, 500), *range(1000, 1050)]


def test_produce_writes_page_checksums_so_a_flipped_byte_costs_one_row_group(tmp_path):
    parser = argparse.ArgumentParser(prog="recstream")
    produce.add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["produce", "--synthetic", "--rows", "1000", "--format", "parquet", "--num-dense", "2",
                              "--num-categorical", "1", "--directory", str(tmp_path), "--file-records", "1000",
                              "--row-group-records", "250"])
    assert args.run(args) == 0
    path = tmp_path / "part-00000000.parquet"
    assert pq.ParquetFile(path).num_row_groups == 4
    _flip(path, 1, "I1")
    schema = Schema(["I1", "I2"])
    dec = ArrowTableDecoder(schema, id_column="event_id")
    stream = DirectoryStream(tmp_path, batch_size=50, format="parquet", decoder=dec, idle_timeout=0.3)
    ids = sorted(i for _ in stream for i in stream.last_batch_meta()["ids"].tolist())
    assert ids == [*range(0, 250), *range(500, 1000)]  # the row group with the flipped byte, and only it
    assert stream.bad_records == {"malformed": 1}


def test_without_page_checksums_a_flipped_byte_is_read_as_a_wrong_value(tmp_path):
    # why produce writes checksums: the same flip in a file without them goes unnoticed
    _write(tmp_path / "a.parquet", 0, ROWS * GROUPS)
    _flip(tmp_path / "a.parquet", 2, "x1")
    stream = DirectoryStream(tmp_path, SCHEMA, batch_size=25, format="parquet", idle_timeout=0.3)
    values = _read(stream)
    assert len(values) == ROWS * GROUPS and stream.bad_records == {}
    assert values != list(range(ROWS * GROUPS))  # one value silently changed
