"""One corrupt or mismatched file no longer stops a DirectoryStream for good: it is
dead-lettered (named, with the reason) and the files after it are read, also after a restart.
Parquet pages written with checksums are verified, so flipped bits are caught, not trained on.
"""
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recstream.data import ParquetReader, Schema
from recstream.data.streams import DirectoryStream

SCHEMA = Schema(["x1", "x2"])


def _table(lo, n=10):
    x = np.arange(lo, lo + n, dtype=np.float64)
    return pa.table({"label": (np.arange(n) % 2).astype(np.float64), "x1": x, "x2": x * 2})


def _write_parquet(path, table, **kw):
    pq.write_table(table, path, compression="NONE", use_dictionary=False, **kw)


def _read_all(stream):
    rows = [b.features.dense[:, 0] for b in stream]
    return sorted(np.concatenate([r.numpy() for r in rows]).tolist()) if rows else []


def _dead(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_parquet_file_with_a_corrupt_page_header_is_skipped(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    for name, lo in (("a", 0), ("b", 100), ("c", 200)):
        _write_parquet(data / f"{name}.parquet", _table(lo))
    raw = bytearray((data / "b.parquet").read_bytes())
    raw[4:40] = b"\xff" * 36  # the first page header of the first column chunk
    (data / "b.parquet").write_bytes(bytes(raw))
    stream = DirectoryStream(data, SCHEMA, batch_size=4, format="parquet", idle_timeout=0.3,
                             dead_letter=tmp_path / "dead.jsonl")
    assert _read_all(stream) == list(range(10)) + list(range(200, 210))
    assert stream.bad_records == {"malformed": 1}
    assert "b.parquet" in json.dumps(_dead(tmp_path / "dead.jsonl"))
    # a restart from inside the bad file moves on too
    again = DirectoryStream(data, SCHEMA, batch_size=4, format="parquet", idle_timeout=0.3)
    again.seek({"file": "b.parquet", "offset": 3})
    assert _read_all(again) == list(range(200, 210))


def test_flipped_bytes_in_a_checksummed_parquet_page_are_caught(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    _write_parquet(data / "a.parquet", _table(0, 200), write_page_checksum=True)
    _write_parquet(data / "b.parquet", _table(1000), write_page_checksum=True)
    meta = pq.ParquetFile(data / "a.parquet").metadata.row_group(0).column(1)  # x1's values
    end = meta.data_page_offset + meta.total_compressed_size
    raw = bytearray((data / "a.parquet").read_bytes())
    for i in range(end - 200, end - 136):  # 64 bytes of x1's float values
        raw[i] ^= 0x55
    (data / "a.parquet").write_bytes(bytes(raw))
    stream = DirectoryStream(data, SCHEMA, batch_size=50, format="parquet", idle_timeout=0.3)
    assert _read_all(stream) == list(range(1000, 1010))  # a.parquet skipped, not read wrong
    assert stream.bad_records == {"malformed": 1}


def test_a_csv_file_whose_header_lacks_a_column_is_skipped(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.csv").write_text("label,x1,x2\n1,1.0,2.0\n0,2.0,4.0\n")
    (data / "b.csv").write_text("label,x1\n1,50.0\n")
    (data / "c.csv").write_text("label,x1,x2\n1,3.0,6.0\n")
    stream = DirectoryStream(data, SCHEMA, batch_size=2, header=True, idle_timeout=0.3,
                             dead_letter=tmp_path / "dead.jsonl")
    assert _read_all(stream) == [1.0, 2.0, 3.0]
    dead = _dead(tmp_path / "dead.jsonl")
    assert len(dead) == 1 and "b.csv" in json.dumps(dead[0])


def test_the_parquet_reader_verifies_page_checksums_and_names_the_file(tmp_path):
    path = tmp_path / "a.parquet"
    _write_parquet(path, _table(0, 200), write_page_checksum=True)
    meta = pq.ParquetFile(path).metadata.row_group(0).column(1)
    end = meta.data_page_offset + meta.total_compressed_size
    raw = bytearray(path.read_bytes())
    for i in range(end - 200, end - 136):
        raw[i] ^= 0x55
    path.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="a.parquet' is corrupt after data row 0"):
        list(ParquetReader(str(path), SCHEMA, batch_size=50))


def _csv_files(data, names=("a", "b")):
    for k, name in enumerate(names):
        t = _table(100 * k)
        lines = [f"{lab},{x1},{x2}" for lab, x1, x2 in zip(*(t[c].to_pylist() for c in t.column_names), strict=True)]
        (data / f"{name}.csv").write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("where", ["file", "records"])
def test_a_read_cancelled_by_sigint_interrupts_the_stream_and_skips_nothing(tmp_path, monkeypatch, where):
    """pyarrow raises ArrowCancelled when a SIGINT lands inside one of its reads: the user's
    interrupt, not a corrupt file or malformed records. Before, the stream dead-lettered the rest of
    the file (or the records), so the run's next checkpoint lost them for good."""
    from recstream.data.streams import decoders, directory

    data = tmp_path / "data"
    data.mkdir()
    _csv_files(data)
    owner, name = (directory.TextFileCursor, "read") if where == "file" else (decoders.CSVLineDecoder, "_parse")
    real, calls = getattr(owner, name), []

    def cancelled_once(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:  # a read in the middle of the stream
            raise pa.ArrowCancelled("Operation cancelled")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(owner, name, cancelled_once)
    stream = DirectoryStream(data, SCHEMA, batch_size=4, format="csv", idle_timeout=0.3,
                             dead_letter=tmp_path / "dead.jsonl")
    with pytest.raises(KeyboardInterrupt, match="interrupted during a read"):
        _read_all(stream)
    assert calls and stream.bad_records == {} and not (tmp_path / "dead.jsonl").exists()
    again = DirectoryStream(data, SCHEMA, batch_size=4, format="csv", idle_timeout=0.3)
    assert _read_all(again) == list(range(10)) + list(range(100, 110))


def test_a_parquet_read_cancelled_by_sigint_is_not_a_corrupt_row_group(tmp_path, monkeypatch):
    """The same for Parquet: a cancelled row-group read is neither an unreadable row group of
    `ParquetReader` (skipped under on_bad_row='skip') nor a corrupt file of the stream."""
    _write_parquet(tmp_path / "a.parquet", _table(0))

    def cancelled(self, *args, **kwargs):
        yield from ()  # a generator: the cancellation comes from its first read, as pyarrow's would
        raise pa.ArrowCancelled("Operation cancelled")

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", cancelled)
    reader = ParquetReader(str(tmp_path / "a.parquet"), SCHEMA, batch_size=4, on_bad_row="skip")
    with pytest.raises(KeyboardInterrupt):
        list(reader)
    data = tmp_path / "data"
    data.mkdir()
    _write_parquet(data / "b.parquet", _table(0))
    stream = DirectoryStream(data, SCHEMA, batch_size=4, format="parquet", idle_timeout=0.3)
    with pytest.raises(KeyboardInterrupt):
        _read_all(stream)
    assert stream.bad_records == {}
