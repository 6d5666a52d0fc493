"""DirectoryStream: exact positions, files arriving (and growing) while it reads, bad lines dead-lettered."""
from __future__ import annotations

import json
import logging
import os
import threading

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recstream.data.streams import DirectoryStream

from .events import SCHEMA, T0, assert_same_batch, decoder, records, rows, take_ids

EXT = {"csv": "csv", "jsonl": "jsonl", "criteo": "tsv"}


def _publish(directory, name, data: bytes) -> None:
    """Write a file the way producers must: a hidden temp name, then an atomic rename."""
    tmp = os.path.join(directory, f".{name}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, os.path.join(directory, name))


def _stream(directory, fmt="csv", **kw):
    kw.setdefault("idle_timeout", 0.5)
    return DirectoryStream(directory, batch_size=kw.pop("batch_size", 64), format=fmt, decoder=decoder(fmt), **kw)


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "criteo"])
def test_position_seek_and_restart_are_exact(tmp_path, fmt):
    files = [records(200, 200 * k, fmt) for k in range(3)]
    for k, lines in enumerate(files):
        _publish(tmp_path, f"part-{k}.{EXT[fmt]}", b"\n".join(lines) + b"\n")
    stream = _stream(tmp_path, fmt, max_batches=4)
    first = take_ids(stream)
    pos = stream.position()
    # 256 events read: file 1 up to the end of its 56th line
    assert pos == {"file": f"part-1.{EXT[fmt]}", "offset": sum(len(x) + 1 for x in files[1][:56])}
    second = [(b, stream.last_batch_meta()["ids"].tolist()) for b in stream]  # continues, loses nothing
    assert second[0][1][0] == 256
    stream.seek(pos)
    again = [(b, stream.last_batch_meta()["ids"].tolist()) for b in stream]
    assert [ids for _, ids in again] == [ids for _, ids in second]
    for (a, _), (b, _) in zip(second, again, strict=True):
        assert_same_batch(a, b)
    restarted = _stream(tmp_path, fmt)
    restarted.seek(pos)
    rest = take_ids(restarted)
    assert first + rest == list(range(600))
    assert restarted.position() == {"file": f"part-2.{EXT[fmt]}", "offset": sum(len(x) + 1 for x in files[2])}
    assert restarted.bad_records == {}


def test_follows_files_arriving_and_growing(tmp_path):
    """A writer adds files while the stream reads, and appends to one in pieces that cut
    lines in half: only complete lines are read, the unterminated last line once a later
    file makes it final; every event exactly once."""
    lines = records(300)
    got_150 = threading.Event()
    errors = []

    def writer():
        try:
            _publish(tmp_path, "part-0.csv", b"\n".join(lines[:100]) + b"\n")
            grow = b"\n".join(lines[100:250])
            cut = sum(len(x) + 1 for x in lines[100:150]) + 10  # 10 bytes into event 150's line
            with open(tmp_path / "part-1.csv", "wb") as f:
                f.write(grow[:cut])
                f.flush()
                if not got_150.wait(30):  # the reader has everything up to the cut line
                    raise TimeoutError("reader did not reach event 149 within 30 s")
                f.write(grow[cut:cut + 2000])  # more halves of lines
                f.flush()
                f.write(grow[cut + 2000:])     # ...and the last line without its newline
            _publish(tmp_path, "part-2.csv", b"\n".join(lines[250:]) + b"\n")
        except Exception as e:  # reported by the test thread
            errors.append(e)

    stream = _stream(tmp_path, batch_size=50, idle_timeout=30, max_batches=6, poll_interval=0.02)
    thread = threading.Thread(target=writer)
    thread.start()
    ids = []
    try:
        for _ in stream:
            ids += stream.last_batch_meta()["ids"].tolist()
            if ids[-1] == 149:
                got_150.set()
    finally:
        got_150.set()
        thread.join(60)
    assert not errors, errors
    assert ids == list(range(300))
    assert stream.bad_records == {}
    assert stream.position() == {"file": "part-2.csv", "offset": sum(len(x) + 1 for x in lines[250:])}


def test_bad_lines_are_dead_lettered_with_their_offsets(tmp_path):
    good = records(6)
    huge = b"1," + b"7" * 5000  # longer than a whole block
    body = [good[0], b"1,2,3", good[1], huge, good[2], good[3].replace(b",", b",x", 1), good[4], b"", good[5]]
    _publish(tmp_path, "part-0.csv", b"\n".join(body) + b"\n")
    dead = tmp_path / "dead" / "letters.jsonl"
    stream = DirectoryStream(tmp_path, batch_size=3, decoder=decoder("csv", max_record_bytes=1000), block_bytes=1024,
                             dead_letter=dead, idle_timeout=0.5)
    assert take_ids(stream) == [0, 1, 2, 4, 5]
    assert stream.bad_records == {"column_count": 2, "oversize": 1, "unparsable": 1}
    letters = [json.loads(x) for x in dead.read_text().splitlines()]
    starts = np.cumsum([0] + [len(x) + 1 for x in body])
    assert [(x["reason"], x["source"]) for x in letters] == [
        ("column_count", {"file": "part-0.csv", "offset": int(starts[1])}),
        ("oversize", {"file": "part-0.csv", "offset": int(starts[3])}),
        ("unparsable", {"file": "part-0.csv", "offset": int(starts[5])}),
        ("column_count", {"file": "part-0.csv", "offset": int(starts[7])}),
    ]
    assert letters[0]["record"] == "1,2,3" and letters[1]["record"].startswith("1,777")
    assert "5002 bytes" in letters[1]["detail"]


def _parquet(path, start, n, row_group_size):
    labels, dense, ids = rows(n, start)
    cols = {"label": labels, "I1": dense[:, 0], "I2": dense[:, 1], "C1": ids[:, 0], "C2": ids[:, 1],
            "C3": ids[:, 2], "event_id": np.arange(start, start + n), "event_time": T0 + np.arange(start, start + n)}
    tmp = f"{path}.tmp"
    pq.write_table(pa.table(cols), tmp, row_group_size=row_group_size)
    os.replace(tmp, path)  # a half-written Parquet file is unreadable: publish by rename


def test_parquet_files_seek_by_row(tmp_path):
    _parquet(tmp_path / "part-0.parquet", 0, 130, 50)
    _parquet(tmp_path / "part-1.parquet", 130, 100, 30)
    kw = dict(format="parquet", id_column="event_id", time_column="event_time", idle_timeout=0.5)
    stream = DirectoryStream(tmp_path, SCHEMA, 40, max_batches=2, **kw)
    first = take_ids(stream)
    assert first == list(range(80)) and stream.position() == {"file": "part-0.parquet", "offset": 80}
    stream.seek({"file": "part-1.parquet", "offset": 37})  # inside the second row group
    assert take_ids(stream)[:3] == [167, 168, 169]
    restarted = DirectoryStream(tmp_path, SCHEMA, 40, **kw)
    restarted.seek({"file": "part-0.parquet", "offset": 80})
    batches = list(restarted)
    assert sum(b.batch_size for b in batches) == 150
    expected = decoder("csv").decode(records(150, 80)).batch
    from recstream.data import Batch
    assert_same_batch(Batch.concat(batches), expected)


def test_commit_path_is_where_a_new_stream_starts(tmp_path):
    (tmp_path / "in").mkdir()
    _publish(tmp_path / "in", "part-0.csv", b"\n".join(records(100)) + b"\n")
    marker = tmp_path / "offsets.json"
    stream = _stream(tmp_path / "in", batch_size=30, max_batches=2, commit_path=marker)
    assert take_ids(stream) == list(range(60))
    stream.commit(stream.position())
    stream.close()
    assert json.loads(marker.read_text())["position"] == stream.position()
    resumed = _stream(tmp_path / "in", batch_size=30, commit_path=marker)
    assert resumed.committed() == stream.position()
    assert take_ids(resumed) == list(range(60, 100))


def test_csv_header_names_the_columns(tmp_path):
    names = ["event_time", "C3", "I2", "label", "event_id", "C1", "I1", "C2"]  # any order
    order = list(SCHEMA.columns) + ["event_id", "event_time"]
    fields = [line.split(b",") for line in records(20)]
    shuffled = [b",".join(f[order.index(n)] for n in names) for f in fields]
    _publish(tmp_path, "part-0.csv", (",".join(names) + "\n").encode() + b"\n".join(shuffled) + b"\n")
    stream = DirectoryStream(tmp_path, SCHEMA, 20, header=True, id_column="event_id", time_column="event_time",
                             idle_timeout=0.3)
    (batch,) = list(stream)
    assert_same_batch(batch, decoder("csv").decode(records(20)).batch)
    stream.seek({"file": "part-0.csv", "offset": 0})  # the header is never a record
    assert take_ids(stream) == list(range(20)) and stream.bad_records == {}


def test_a_file_arriving_too_late_is_skipped_with_a_warning(tmp_path, caplog):
    _publish(tmp_path, "part-1.csv", b"\n".join(records(10)) + b"\n")
    _publish(tmp_path, "part-3.csv", b"\n".join(records(10, 10)) + b"\n")
    stream = _stream(tmp_path, batch_size=10, idle_timeout=0.3)
    assert take_ids(stream) == list(range(20))
    _publish(tmp_path, "part-2.csv", b"\n".join(records(10, 20)) + b"\n")  # sorts before part-3
    _publish(tmp_path, ".part-4.csv.tmp", b"\n".join(records(10, 30)) + b"\n")  # hidden: never read
    with caplog.at_level(logging.WARNING, logger="recstream.data.streams"):
        assert take_ids(stream) == []
    assert stream.late_files == 1 and "part-2.csv" in caplog.text


def test_arguments_name_the_stream(tmp_path):
    with pytest.raises(ValueError, match="DirectoryStream: 'format' must be one of .*, got 'xml'"):
        DirectoryStream(tmp_path, SCHEMA, format="xml")
    with pytest.raises(TypeError, match="DirectoryStream: 'poll_interval' must be a finite number > 0, got '1'"):
        DirectoryStream(tmp_path, SCHEMA, poll_interval="1")
    with pytest.raises(ValueError, match="DirectoryStream: 'idle_timeout' must be a finite number >= 0 or None"):
        DirectoryStream(tmp_path, SCHEMA, idle_timeout=-1)
    with pytest.raises(FileNotFoundError, match="no such directory"):
        DirectoryStream(tmp_path / "missing", SCHEMA)
