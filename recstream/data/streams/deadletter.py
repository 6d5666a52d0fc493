"""Dead letters: every rejected record, with its reason and source position, kept for later.

Each bad record becomes one JSON line::

    {"reason": "unparsable", "column": "x", "detail": "cannot parse 'abc' as a number",
     "source": {"topic": "clicks", "partition": 0, "offset": 41}, "record": "1,abc,3",
     "time": 1700000000.1}

``record`` is the raw record decoded as UTF-8 (undecodable bytes as U+FFFD), cut to
``max_bytes``. Lines go to a file (appended, flushed per call, so a crash loses nothing
already handled) and/or are forwarded to a callable (the Kafka stream passes one that
produces to a dead-letter topic). Counts by reason are kept in :attr:`DeadLetter.counts`.

Delivery is at-least-once: a stream that is sought back and decodes the same bad record
again writes it again (the ``source`` position tells duplicates apart).

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

from ...validation import check_callable, check_int, check_type
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
