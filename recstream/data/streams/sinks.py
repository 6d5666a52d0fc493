"""Where produced events go: a Kafka topic or a followed directory; and a rate limiter.

* :class:`KafkaSink`: one message per record (Kafka timestamp = the event time), sent
  asynchronously; :meth:`close` waits until every message is acknowledged.
* :class:`DirectorySink`: records appended to a hidden ``.part-N.ext.tmp`` file which is
  renamed to ``part-N.ext`` (atomic) when it holds ``file_records`` records or has been
  open ``flush_interval`` seconds: exactly the contract of
  :class:`~recstream.data.streams.DirectoryStream`. Numbering continues after the files
  already there, so later runs add files that sort after earlier ones.
* :class:`RateLimiter`: paces records to ``rate`` per second (0: no limit).

>>> import tempfile, os
>>> d = tempfile.mkdtemp()
>>> with DirectorySink(d, "csv", file_records=2) as sink:
...     sink.write([b"1,0.5", b"0,1.5", b"1,2.5"])
>>> sorted(os.listdir(d))
['part-00000000.csv', 'part-00000001.csv']
"""
from __future__ import annotations

import os
import re
import time
from typing import Sequence


class RateLimiter:
    """Sleeps so that ``n`` records took at least ``n / rate`` seconds since the start."""

    def __init__(self, rate: float) -> None:
        if not rate >= 0:
            raise ValueError(f"RateLimiter: 'rate' must be >= 0 events/s (0: no limit), got {rate!r}")
        self.rate = float(rate)
        self.start = time.monotonic()
        self.sent = 0

    def chunk(self) -> int:
        """Records to send between two waits (~100 waits per second)."""
        return 4096 if self.rate == 0 else max(1, min(4096, int(self.rate / 100)))

    def wait(self, n: int) -> None:
        self.sent += n
        if self.rate:
            delay = self.start + self.sent / self.rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)


class KafkaSink:
    """Produces records to `topic` (see module docstring)."""

    def __init__(self, bootstrap_servers: str, topic: str, config: dict | None = None) -> None:
        from confluent_kafka import Producer
        self.topic = topic
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
            raise RuntimeError(f"KafkaSink: delivery to {self.topic!r} failed: {self.errors[0]}")

    def close(self, timeout: float = 60.0) -> None:
        left = self._producer.flush(timeout)
        if left or self.errors:
            raise RuntimeError(f"KafkaSink: {left} record(s) not delivered to {self.topic!r}; "
                               f"errors: {self.errors[:3]}")

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class DirectorySink:
    """Writes records into files of `directory` (see module docstring)."""

    def __init__(self, directory: str | os.PathLike, ext: str, file_records: int = 100_000,
                 flush_interval: float | None = None) -> None:
        self.directory, self.ext = os.fspath(directory), ext.lstrip(".")
        os.makedirs(self.directory, exist_ok=True)
        if file_records < 1:
            raise ValueError(f"DirectorySink: 'file_records' must be >= 1, got {file_records!r}")
        self.file_records, self.flush_interval = int(file_records), flush_interval
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
