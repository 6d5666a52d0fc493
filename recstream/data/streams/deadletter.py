"""Dead letters: every rejected record, with its reason and source position, kept for later.

Each bad record becomes one JSON line::

    {"reason": "unparsable", "column": "x", "detail": "cannot parse 'abc' as a number",
     "source": {"topic": "clicks", "partition": 0, "offset": 41}, "record": "1,abc,3",
     "time": 1700000000.1}

``record`` is the raw record decoded as UTF-8 (undecodable bytes as U+FFFD), cut to
``max_bytes``. Lines go to a file (appended, flushed per call, so a crash loses nothing
already handled) and/or are forwarded to a callable (the Kafka stream passes one that
produces to a dead-letter topic). Counts by reason are kept in `DeadLetter.counts`.

Delivery is at-least-once: a stream that is sought back and decodes the same bad record
again writes it again (the ``source`` position tells duplicates apart).

`DeadLetterProducer` is the forward callable for a Kafka dead-letter topic. No dead
letter is lost silently: a full producer queue (``BufferError``) is waited out, serving
delivery reports, for at most ``max_block`` seconds and then raises `DeadLetterError`
(the stream stops loudly instead of dropping records); every delivery is confirmed by a
callback, and each one that fails (or is still queued when ``flush``/``close`` gives up) is
logged at ERROR and counted in `DeadLetterProducer.undelivered`.

>>> import tempfile, os, json
>>> from recstream.data.streams.records import BadRecord
>>> path = os.path.join(tempfile.mkdtemp(), "dead.jsonl")
>>> dl = DeadLetter(path)
>>> dl.write([BadRecord(0, "unparsable", "cannot parse 'x'", b"1,x")], [{"file": "a.csv", "offset": 0}])
>>> dl.close(); dl.counts["unparsable"], json.loads(open(path).read())["record"]
(1, '1,x')
"""
from __future__ import annotations

import json
import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Sequence

from ...validation import check_callable, check_int, check_number, check_str, check_type
from .records import BadRecord

log = logging.getLogger("recstream.data.streams")


class DeadLetter:
    """Counts bad records by reason and writes each to `path` (JSONL) and/or passes it to `forward`."""

    def __init__(self, path: str | os.PathLike | None = None, forward: Callable[[bytes], None] | None = None,
                 max_bytes: int = 4096) -> None:
        check_type("DeadLetter", "path", path, (str, os.PathLike), allowed="a path", allow_none=True)
        self.path = None if path is None else os.fspath(path)
        self.forward = check_callable("DeadLetter", "forward", forward, allow_none=True)
        self.max_bytes = check_int("DeadLetter", "max_bytes", max_bytes, minimum=1)
        self.counts: Counter = Counter()
        self._file = None
        self._warned = False

    def write(self, bad: Sequence[BadRecord], sources: Sequence[dict]) -> None:
        """Record `bad` (``sources[i]`` is where ``bad[i]`` came from)."""
        if not bad:
            return
        self.counts.update(b.reason for b in bad)
        if self.path is None and self.forward is None:
            if not self._warned:  # counted, but say once that the records themselves are not kept
                log.warning("bad records are counted but not kept: pass dead_letter=PATH to keep them "
                            "(first: %s: %s)", bad[0].reason, bad[0].detail)
                self._warned = True
            return
        now = time.time()
        lines = [json.dumps({"reason": b.reason, "column": b.column, "detail": b.detail, "source": src,
                             "record": b.raw[: self.max_bytes].decode("utf-8", "replace"), "time": now},
                            default=str).encode() for b, src in zip(bad, sources, strict=True)]
        if self.path is not None:
            if self._file is None:
                os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
                self._file = open(self.path, "ab")
            self._file.write(b"\n".join(lines) + b"\n")
            self._file.flush()
        if self.forward is not None:
            for line in lines:
                self.forward(line)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        close = getattr(self.forward, "close", None)
        if close is not None:  # e.g. a DeadLetterProducer: deliver what is queued, report the rest
            close()


class DeadLetterError(RuntimeError):
    """A dead letter could not be handed to the producer (its queue stayed full)."""


class DeadLetterProducer:
    """Produces dead letters to a Kafka topic without losing any silently (see module docstring).

    Args:
        bootstrap_servers: the brokers.
        topic: the dead-letter topic.
        config: extra librdkafka producer settings (e.g. ``queue.buffering.max.messages``).
        max_block: seconds a full queue may block one dead letter before DeadLetterError.
        flush_timeout: seconds ``close`` waits for queued dead letters to be delivered.
    """

    def __init__(self, bootstrap_servers: str, topic: str, config: dict | None = None, max_block: float = 30.0,
                 flush_timeout: float = 10.0) -> None:
        from confluent_kafka import Producer  # here: only a Kafka dead-letter topic needs the client

        owner = "DeadLetterProducer"
        check_str(owner, "bootstrap_servers", bootstrap_servers)
        self.topic = check_str(owner, "topic", topic)
        check_type(owner, "config", config, dict, allow_none=True)
        self.max_block = check_number(owner, "max_block", max_block, minimum=0)
        self.flush_timeout = check_number(owner, "flush_timeout", flush_timeout, minimum=0)
        self.produced = self.delivered = self.undelivered = 0
        self._producer = Producer({"bootstrap.servers": bootstrap_servers, "linger.ms": 50, **(config or {})})
        self._closed = False

    def _on_delivery(self, err, msg) -> None:
        if err is None:
            self.delivered += 1
            return
        self.undelivered += 1
        log.error("dead letter NOT delivered to topic %r: %s (%d undelivered so far)", self.topic, err,
                  self.undelivered)

    def __call__(self, line: bytes) -> None:
        """Queue one dead letter; waits out a full queue for at most ``max_block`` s, then raises."""
        deadline = time.monotonic() + self.max_block
        while True:
            try:
                self._producer.produce(self.topic, line, on_delivery=self._on_delivery)
                break
            except BufferError:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise DeadLetterError(f"dead-letter topic {self.topic!r}: the producer queue stayed full for "
                                          f"{self.max_block:g} s (broker unreachable or too slow); stopping rather "
                                          "than dropping dead letters") from None
                self._producer.poll(min(0.1, left))  # serve delivery reports: they free queue slots
        self.produced += 1
        self._producer.poll(0)

    def flush(self, timeout: float | None = None) -> int:
        """Deliver what is queued, waiting at most `timeout` s; returns (and logs) how many were not."""
        left = self._producer.flush(self.flush_timeout if timeout is None else timeout)
        if left:
            log.error("%d dead letter(s) still undelivered to topic %r after flush; they are lost", left, self.topic)
        return left

    def close(self) -> None:
        """Flush once; dead letters still queued then count as undelivered."""
        if not self._closed:
            self._closed = True
            left = self.flush()  # delivery callbacks run inside: count after them
            self.undelivered += left
