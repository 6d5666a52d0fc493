"""What ``recstream produce`` writes with: event records, and where they go.

Records (vectorized, no Python string work per record: values become text with pyarrow
casts and are joined with ``binary_join_element_wise``):

* `format_records`: columns -> one CSV / JSON-lines / Criteo TSV record per event;
* `append_meta`: existing records plus ``event_id`` / ``event_time`` as their last two
  fields (JSON: keys), which is what the stream decoders' ``id_column`` / ``time_column`` read.

Writers (the producing side of the streams in `recstream.data.streams`):

* `KafkaWriter`: one message per record (Kafka timestamp = the event time), sent
  asynchronously; `close` waits until every message is acknowledged.
* `DirectoryWriter`: records appended to a hidden ``.part-N.ext.tmp`` file which is
  renamed to ``part-N.ext`` (atomic) when it holds ``file_records`` records or has been
  open ``flush_interval`` seconds: exactly the contract of
  [`DirectoryStream`][recstream.data.streams.directory.DirectoryStream]. Numbering continues after the files
  already there, so later runs add files that sort after earlier ones.
* `ParquetDirectoryWriter`: the same with Parquet files (tables of columns instead of
  records, row groups of ``row_group_records`` rows), written with page checksums: a reader
  that verifies them (`DirectoryStream`, `ParquetReader`) refuses a flipped bit in a data
  page and loses only its row group, where a file without them decodes it as a wrong value.
* `RateLimiter`: paces records to ``rate`` per second (0: no limit).

>>> import numpy as np
>>> format_records("csv", np.array([1.0, 0.0]), np.array([[0.5], [1.5]]), np.array([[3], [4]]),
...                event_ids=np.array([7, 8]), times=np.array([1.5, 2.0]))
[b'1,0.5,3,7,1.5', b'0,1.5,4,8,2']
>>> format_records("jsonl", np.array([1.0]), np.zeros((1, 0)), np.array([[3]]), names=["label", "c"])
[b'{"label":1,"c":3}']
>>> append_meta([b'{"label":1}'], "jsonl", np.array([5]), np.array([9.5]))
[b'{"label":1,"event_id":5,"event_time":9.5}']
>>> import os, tempfile
>>> d = tempfile.mkdtemp()
>>> with DirectoryWriter(d, "csv", file_records=2) as writer:
...     writer.write([b"1,0.5", b"0,1.5", b"1,2.5"])
>>> sorted(os.listdir(d))
['part-00000000.csv', 'part-00000001.csv']
"""
from __future__ import annotations

import os
import re
import time
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..validation import check_choice, check_int, check_number, check_str, check_type

FORMATS = ("csv", "jsonl", "criteo")
META_FORMATS = ("csv", "tsv", "jsonl", "criteo")
ID_COLUMN, TIME_COLUMN = "event_id", "event_time"
_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)


# --- records -------------------------------------------------------------------------------
def _text(values: np.ndarray) -> pa.Array:
    return pc.cast(pa.array(values), pa.string())


def hex8(ids: np.ndarray) -> pa.Array:
    """Low 32 bits of int ids as 8 lowercase hex digits (Criteo's categorical id form)."""
    v = np.asarray(ids, dtype=np.int64).astype(np.uint64) & np.uint64(0xFFFFFFFF)
    shifts = np.arange(28, -1, -4, dtype=np.uint64)
    digits = _HEX[((v[:, None] >> shifts) & np.uint64(15)).astype(np.intp)]  # [n, 8] ascii codes
    return pc.cast(pa.array(np.ascontiguousarray(digits).view("S8").ravel(), pa.binary(8)), pa.string())


def format_records(fmt: str, labels: np.ndarray, dense: np.ndarray, cat_ids: np.ndarray, *,
                   names: Sequence[str] | None = None, event_ids: np.ndarray | None = None,
                   times: np.ndarray | None = None) -> list[bytes]:
    """Records of `fmt` for rows of labels [n], dense [n, d], single-hot categorical ids [n, c].

    names: column names (label, dense..., categorical...) for JSON (default: label, I1..,
    C1..). Criteo writes dense values as integer counts (``floor(max(x, 0))``) and ids as
    8 hex digits. event_ids / times: per-event ids (int) and event times (epoch seconds).
    """
    check_choice("format_records", "fmt", fmt, FORMATS)
    d, c = dense.shape[1], cat_ids.shape[1]
    names = list(names) if names is not None else (["label"] + [f"I{i + 1}" for i in range(d)]
                                                   + [f"C{i + 1}" for i in range(c)])
    cols = [_text(np.asarray(labels).astype(np.int64))]
    if fmt == "criteo":
        cols += [_text(np.floor(np.maximum(dense[:, j], 0)).astype(np.int64)) for j in range(d)]
        cols += [hex8(cat_ids[:, j]) for j in range(c)]
    else:
        cols += [_text(np.asarray(dense[:, j], dtype=np.float32)) for j in range(d)]
        cols += [_text(np.asarray(cat_ids[:, j], dtype=np.int64)) for j in range(c)]
    if event_ids is not None:
        names.append(ID_COLUMN)
        cols.append(_text(np.asarray(event_ids, dtype=np.int64)))
    if times is not None:
        names.append(TIME_COLUMN)
        cols.append(_text(np.asarray(times, dtype=np.float64)))
    if fmt == "jsonl":
        parts = []
        for i, (key, col) in enumerate(zip(names, cols, strict=True)):
            parts += [('{"' if i == 0 else ',"') + key + '":', col]
        joined = pc.binary_join_element_wise(*parts, "}", "")
    else:
        joined = pc.binary_join_element_wise(*cols, "\t" if fmt == "criteo" else ",")
    return pc.cast(joined, pa.binary()).to_pylist()


def records_table(labels: np.ndarray, dense: np.ndarray, cat_ids: np.ndarray, names: Sequence[str], *,
                  event_ids: np.ndarray | None = None, times: np.ndarray | None = None) -> pa.Table:
    """The columns of `format_records` as a table (label and ids int64, dense float32), for Parquet.

    >>> records_table(np.array([1.0]), np.array([[0.5]]), np.array([[3]]), ["label", "x", "c"],
    ...               event_ids=np.array([7]), times=np.array([1.5])).to_pylist()
    [{'label': 1, 'x': 0.5, 'c': 3, 'event_id': 7, 'event_time': 1.5}]
    """
    d = dense.shape[1]
    cols = [np.asarray(labels).astype(np.int64)] + [np.asarray(dense[:, j], dtype=np.float32) for j in range(d)]
    cols += [np.asarray(cat_ids[:, j], dtype=np.int64) for j in range(cat_ids.shape[1])]
    names = list(names)
    if event_ids is not None:
        names.append(ID_COLUMN)
        cols.append(np.asarray(event_ids, dtype=np.int64))
    if times is not None:
        names.append(TIME_COLUMN)
        cols.append(np.asarray(times, dtype=np.float64))
    return pa.table(dict(zip(names, cols, strict=True)))


def append_meta(lines: Sequence[bytes], fmt: str, event_ids: np.ndarray, times: np.ndarray) -> list[bytes]:
    """Existing records with ``event_id`` / ``event_time`` added (last two fields, or JSON keys).

    fmt: "csv", "tsv", "criteo" or "jsonl".
    """
    check_choice("append_meta", "fmt", fmt, META_FORMATS)
    arr = pa.array(lines, pa.binary())
    ids, ts = pc.cast(_text(event_ids), pa.binary()), pc.cast(_text(times), pa.binary())
    if fmt == "jsonl":  # '{...}' -> '{...,"event_id":1,"event_time":2.5}'
        body = pc.replace_substring_regex(arr, r"\}\s*$", "")
        return pc.binary_join_element_wise(body, b',"' + ID_COLUMN.encode() + b'":', ids,
                                           b',"' + TIME_COLUMN.encode() + b'":', ts, b"}", b"").to_pylist()
    body = pc.replace_substring_regex(arr, r"\r$", "")
    return pc.binary_join_element_wise(body, ids, ts, b"\t" if fmt in ("criteo", "tsv") else b",").to_pylist()


# --- pacing --------------------------------------------------------------------------------
class RateLimiter:
    """Sleeps so that ``n`` records took at least ``n / rate`` seconds since the start: the first
    `chunk` call, when the first records are ready (counting from the limiter's creation sent the
    seconds of imports, connecting and making the first block as one burst)."""

    def __init__(self, rate: float) -> None:
        self.rate = check_number("RateLimiter", "rate", rate, minimum=0)  # events/s, 0: no limit
        self.start: float | None = None
        self.sent = 0

    def chunk(self) -> int:
        """Records to send between two waits (~100 waits per second)."""
        if self.start is None:
            self.start = time.monotonic()
        return 4096 if self.rate == 0 else max(1, min(4096, int(self.rate / 100)))

    def wait(self, n: int) -> None:
        self.sent += n
        if self.start is None:
            self.start = time.monotonic()
        if self.rate:
            delay = self.start + self.sent / self.rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)


# --- writers -------------------------------------------------------------------------------
class KafkaWriter:
    """Produces records to `topic` (see the module docstring)."""

    def __init__(self, bootstrap_servers: str, topic: str, config: dict | None = None) -> None:
        check_str("KafkaWriter", "bootstrap_servers", bootstrap_servers)
        self.topic = check_str("KafkaWriter", "topic", topic)
        check_type("KafkaWriter", "config", config, dict, allow_none=True)
        from confluent_kafka import Producer  # only a Kafka run needs the client library
        self._producer = Producer({"bootstrap.servers": bootstrap_servers, "linger.ms": 5,
                                   "queue.buffering.max.messages": 1_000_000, **(config or {})})
        self.errors: list = []
        self.count = 0

    def _delivered(self, err, msg) -> None:
        if err is not None:
            self.errors.append(err)

    def write(self, records: Sequence[bytes], timestamps_ms: Sequence[int] | None = None) -> None:
        produce, poll = self._producer.produce, self._producer.poll
        for i, rec in enumerate(records):
            kwargs = {} if timestamps_ms is None else {"timestamp": int(timestamps_ms[i])}
            while True:
                try:
                    produce(self.topic, rec, on_delivery=self._delivered, **kwargs)
                    break
                except BufferError:  # the local queue is full: wait for deliveries
                    poll(0.05)
        poll(0)
        self.count += len(records)
        if self.errors:
            raise RuntimeError(f"KafkaWriter: delivery to {self.topic!r} failed: {self.errors[0]}")

    def close(self, timeout: float = 60.0) -> None:
        left = self._producer.flush(timeout)
        if left or self.errors:
            raise RuntimeError(f"KafkaWriter: {left} record(s) not delivered to {self.topic!r}; "
                               f"errors: {self.errors[:3]}")

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class DirectoryWriter:
    """Writes records into files of `directory` (see the module docstring)."""

    def __init__(self, directory: str | os.PathLike, ext: str, file_records: int = 100_000,
                 flush_interval: float | None = None) -> None:
        check_type("DirectoryWriter", "directory", directory, (str, os.PathLike), allowed="a path")
        self.directory = os.fspath(directory)
        self.ext = check_str("DirectoryWriter", "ext", ext).lstrip(".")
        self.file_records = check_int("DirectoryWriter", "file_records", file_records, minimum=1)
        self.flush_interval = check_number("DirectoryWriter", "flush_interval", flush_interval, minimum=0,
                                           allow_none=True)
        os.makedirs(self.directory, exist_ok=True)
        pat = re.compile(r"part-(\d+)\.")
        taken = [int(m.group(1)) for n in os.listdir(self.directory) if (m := pat.match(n))]
        self._seq = max(taken) + 1 if taken else 0
        self._file, self._in_file, self._opened = None, 0, 0.0
        self.count = 0
        self.files: list[str] = []

    def _name(self) -> str:
        return f"part-{self._seq:08d}.{self.ext}"

    def write(self, records: Sequence[bytes], timestamps_ms=None) -> None:
        i = 0
        while i < len(records):
            if self._file is None:
                self._file = open(os.path.join(self.directory, f".{self._name()}.tmp"), "wb")
                self._in_file, self._opened = 0, time.monotonic()
            take = min(len(records) - i, self.file_records - self._in_file)
            self._file.write(b"\n".join(records[i:i + take]) + b"\n")
            self._in_file += take
            i += take
            if self._in_file >= self.file_records:
                self._publish()
        self.count += len(records)
        if self._file is not None and self.flush_interval is not None \
                and time.monotonic() - self._opened >= self.flush_interval:
            self._publish()

    def _publish(self) -> None:
        """Make the current file visible under its final name (atomic rename)."""
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        final = os.path.join(self.directory, self._name())
        os.replace(os.path.join(self.directory, f".{self._name()}.tmp"), final)
        self.files.append(final)
        self._file, self._seq = None, self._seq + 1

    def close(self) -> None:
        if self._file is not None:
            self._publish()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class ParquetDirectoryWriter(DirectoryWriter):
    """Writes tables into Parquet files of `directory`, with page checksums (see the module docstring).

    >>> import os, tempfile
    >>> d = tempfile.mkdtemp()
    >>> with ParquetDirectoryWriter(d, file_records=3, row_group_records=2) as writer:
    ...     writer.write(pa.table({"x": [1.0, 2.0, 3.0, 4.0]}))
    >>> sorted(os.listdir(d)), pq.ParquetFile(os.path.join(d, "part-00000000.parquet")).num_row_groups
    (['part-00000000.parquet', 'part-00000001.parquet'], 2)
    """

    def __init__(self, directory: str | os.PathLike, file_records: int = 100_000, flush_interval: float | None = None,
                 row_group_records: int = 10_000) -> None:
        super().__init__(directory, "parquet", file_records, flush_interval)
        self.row_group_records = check_int("ParquetDirectoryWriter", "row_group_records", row_group_records,
                                           minimum=1)
        self._rows: list[pa.Table] = []  # the next row group, not written yet
        self._buffered = 0

    def write(self, table: pa.Table, timestamps_ms=None) -> None:
        check_type("ParquetDirectoryWriter", "table", table, pa.Table, allowed="a pyarrow Table")
        i = 0
        while i < table.num_rows:
            if self._file is None:
                # page checksums: a reader verifying them refuses a flipped bit in a data page
                self._file = pq.ParquetWriter(os.path.join(self.directory, f".{self._name()}.tmp"), table.schema,
                                              write_page_checksum=True)
                self._in_file, self._opened = 0, time.monotonic()
            take = min(table.num_rows - i, self.file_records - self._in_file)
            self._rows.append(table.slice(i, take))
            self._buffered += take
            self._in_file += take
            i += take
            if self._buffered >= self.row_group_records:
                self._write_row_groups()
            if self._in_file >= self.file_records:
                self._publish()
        self.count += table.num_rows
        if self._file is not None and self.flush_interval is not None \
                and time.monotonic() - self._opened >= self.flush_interval:
            self._publish()

    def _write_row_groups(self) -> None:
        if self._rows:
            self._file.write_table(pa.concat_tables(self._rows), row_group_size=self.row_group_records)
            self._rows, self._buffered = [], 0

    def _publish(self) -> None:
        self._write_row_groups()
        self._file.close()
        tmp = os.path.join(self.directory, f".{self._name()}.tmp")
        fd = os.open(tmp, os.O_RDONLY)
        try:  # durable before it becomes visible
            os.fsync(fd)
        finally:
            os.close(fd)
        final = os.path.join(self.directory, self._name())
        os.replace(tmp, final)
        self.files.append(final)
        self._file, self._seq = None, self._seq + 1
