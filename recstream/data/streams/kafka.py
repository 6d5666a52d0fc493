"""`KafkaStream`: batches from Kafka topics (confluent-kafka), with exact positions.

Each message value is one record (a CSV/TSV line, a JSON object, a Criteo line: the
`decoder`). Each poll asks for what the next batch still needs (so read-ahead stays under
one batch and the consumer polls once per batch, which keeps group rebalances quick) and
is decoded in one pyarrow call. ``poll_timeout``: seconds one poll waits for messages.

* Partitions: a consumer group (``subscribe``, at the first read; partitions are spread over the members)
  or, with ``assignment=[(topic, partition), ...]``, an explicit ``assign`` (instant, no
  group coordination; the group id is still used for commits).
* Position: ``{"topic:partition": next_offset}`` for the partitions this consumer reads
  (after the last batch yielded). ``seek`` works for assigned partitions and for ones the
  group has not assigned yet (applied when they are). ``commit(position)`` commits those
  offsets for the group, synchronously (retried with backoff while the broker is away;
  it returns within ``commit_timeout`` whatever the broker does, False when not
  committed: the checkpoint holds the position anyway; a commit the broker never answers is
  abandoned, reading goes on meanwhile (its idle clock too), and a later commit waits for the
  stuck one on its helper thread and follows it with its own, newer position; called from the iterating thread
  while the member is rejoining its group it is skipped with a warning instead of
  deadlocking, the next one covers it);
  auto-commit is off, so offsets move only when the trainer says its checkpoint is durable.
* Rebalance: positions of revoked or lost partitions leave ``position()`` (another member
  may own them now) and their unyielded rows are dropped; if such a partition comes back,
  reading resumes at the later of our own position and the group's committed offset.
  Exactly-once holds for each partition as long as one stream at a time reads it: when
  partitions move between members a warning says so. Supported topologies: one trainer per
  consumer group (any number of partitions), or several trainers with disjoint explicit
  ``assignment``s; distributed training keeps one coordinated checkpoint of its own.
* Ranks (``set_rank(r, n)``, done by `RecModel.online_train` under ``torchrun``): partition p
  of each topic is rank ``p % n``'s, by explicit ``assign`` (the group's partitions are listed
  once from the broker; an `assignment` given is filtered the same way), so the ranks of one job
  never join the group and never rebalance among themselves; commits still go to the group.
  Positions are per partition, so those saved by any number of ranks map to any other
  (``rank_position`` merges them and keeps this rank's partitions).
* Broker outage: errors are logged (with backoff between repeats), librdkafka reconnects
  with exponential backoff (100 ms doubling to 2 s), and reading resumes where it was.
* Event ids / times: the decoder's `id_column` / `time_column`; without a time column,
  ``last_batch_meta()["event_time"]`` holds the messages' Kafka timestamps (seconds).
* Bad records: counted, written to `dead_letter` (a file) and/or `dead_letter_topic`.

Rebalance callbacks run inside ``consume()``, i.e. in the iterating thread, so they change
the position state without locks. Eager protocols (librdkafka's default) revoke everything,
then assign; cooperative ones (``partition.assignment.strategy=cooperative-sticky``) move
single partitions and need ``incremental_assign``; both are handled.

Consumer defaults (`default_consumer_config`, each overridable with `consumer_config`):
auto-commit OFF, a 6 s session timeout so a group join takes ~3 s instead of ~23 s,
reconnect backoff capped at 2 s so the stream is back within seconds of a broker
returning, fetches that wait at most 100 ms for data.

Example, with a local broker (`recstream.testing.TansuBroker`, for tests and demos)::

    with TansuBroker() as broker:
        broker.create_topic("demo", partitions=1)
        broker.produce("demo", [b"1,0.5", b"0,1.5", b"1,2.5"])
        with KafkaStream("demo", broker.bootstrap_servers, "g", batch_size=2, idle_timeout=1,
                         decoder=CSVLineDecoder(Schema(["x"])), assignment=[("demo", 0)]) as s:
            [b.batch_size for b in s], s.position()  # ([2, 1], {'demo:0': 3})

The helpers need no broker:

>>> b = Backoff(cap=1.0)
>>> [b.next() for _ in range(5)]
[0.1, 0.2, 0.4, 0.8, 1.0]
>>> parse_position({"clicks:0": 42})
{('clicks', 0): 42}
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterator, Sequence

import numpy as np
from confluent_kafka import OFFSET_INVALID, Consumer, KafkaError, KafkaException, TopicPartition

from ...validation import check_choice, check_int, check_number, check_str, check_type
from ..schema import Schema
from .base import Stream
from .deadletter import DeadLetter, DeadLetterProducer
from .decoders import DEFAULT_MAX_RECORD_BYTES, CSVLineDecoder, JSONDecoder

log = logging.getLogger("recstream.data.streams")

# errors after which a commit can succeed if simply tried again a little later
_RETRY_COMMIT = {KafkaError._TRANSPORT, KafkaError._TIMED_OUT, KafkaError._ALL_BROKERS_DOWN,
                 KafkaError._WAIT_COORD, KafkaError.COORDINATOR_NOT_AVAILABLE, KafkaError.NOT_COORDINATOR,
                 KafkaError.COORDINATOR_LOAD_IN_PROGRESS, KafkaError.REQUEST_TIMED_OUT, KafkaError._STATE,
                 KafkaError.NETWORK_EXCEPTION, KafkaError._RESOLVE, KafkaError._IN_PROGRESS}
# the member is (re)joining its group: the commit succeeds only after the consumer polls again
_REJOINING = {KafkaError.REBALANCE_IN_PROGRESS, KafkaError.ILLEGAL_GENERATION, KafkaError.UNKNOWN_MEMBER_ID}


def default_consumer_config(bootstrap_servers: str, group_id: str, start: str, overrides: dict | None) -> dict:
    """The consumer settings of a KafkaStream (`overrides` win)."""
    check_choice("KafkaStream", "start", start, ("earliest", "latest"))
    config = {
        "bootstrap.servers": bootstrap_servers,
        "group.id": group_id,
        "enable.auto.commit": False,        # offsets are committed only by commit(): exactly once
        "enable.auto.offset.store": False,
        "auto.offset.reset": start,         # where a partition without a committed offset starts
        "session.timeout.ms": 6000,         # group join ~3 s (librdkafka's 45 s default: ~23 s)
        "heartbeat.interval.ms": 1000,      # members learn of a rebalance within ~1 s
        "reconnect.backoff.ms": 100,
        "reconnect.backoff.max.ms": 2000,   # back within ~2 s of the broker returning
        "topic.metadata.refresh.interval.ms": 5000,  # notice new partitions / topics quickly
        "fetch.wait.max.ms": 100,           # a fetch waits <= 100 ms for data (500 ms default): fresher
    }
    config.update(overrides or {})
    return config


class Backoff:
    """Exponential backoff: 0.1 s, 0.2 s, ... up to `cap`; `reset` after a success."""

    def __init__(self, first: float = 0.1, cap: float = 5.0) -> None:
        self.first, self.cap = first, cap
        self._next = first

    def next(self) -> float:
        delay = self._next
        self._next = min(self._next * 2, self.cap)
        return delay

    def reset(self) -> None:
        self._next = self.first


def parse_position(position: dict) -> dict[tuple[str, int], int]:
    """``{"topic:partition": next_offset}`` -> ``{(topic, partition): next_offset}`` (validated)."""
    out = {}
    for key, offset in position.items():
        topic, sep, part = key.rpartition(":") if isinstance(key, str) else ("", "", "")
        if not sep or not topic or not part.isdigit() or isinstance(offset, bool) or not isinstance(offset, int) \
                or offset < 0:
            raise ValueError(f"KafkaStream.seek: expected {{'topic:partition': offset >= 0}}, got {position!r}")
        out[(topic, int(part))] = offset
    return out


def commit_sync(consumer, offsets: list[TopicPartition], timeout: float, wait_rejoin: bool = True,
                handle=None) -> bool:
    """Commit `offsets` synchronously; retry retriable failures with backoff until `timeout`.

    Retriable failures that last past `timeout` give False (logged), not an exception: the
    trainer's checkpoint already holds the position. While the member is rejoining its group
    the commit can only succeed once the iterating thread polls again: with
    ``wait_rejoin=False`` (we ARE the iterating thread) it is skipped at once (logged;
    returns False) rather than blocking the very poll it waits for.
    Skipping is safe: offsets only move forward, the next commit covers these, and the
    trainer's checkpoint (not the group's offsets) is what a restore seeks to.
    `handle`: a context manager held around each call into the consumer (the client library
    serializes the calls on one consumer, so the reader must know when the handle is taken).
    """
    deadline = time.monotonic() + timeout
    backoff = Backoff(cap=2.0)
    while True:
        try:
            with handle or contextlib.nullcontext():
                result = consumer.commit(offsets=offsets, asynchronous=False)
            failed = [tp for tp in (result or []) if tp.error is not None]
            if not failed:
                return True
            error = failed[0].error
        except KafkaException as e:
            error = e.args[0]
        code = error.code() if isinstance(error, KafkaError) else None
        if code == KafkaError._NO_OFFSET:
            return True  # nothing to commit
        if code in _REJOINING and not wait_rejoin:
            log.warning("KafkaStream.commit skipped: %s (the consumer is rejoining its group; "
                        "the next commit covers these offsets)", error)
            return False
        if code not in _RETRY_COMMIT and code not in _REJOINING:
            raise KafkaException(error)
        if time.monotonic() >= deadline:
            log.warning("KafkaStream.commit: %s; gave up after %s s, not committed (the next commit covers "
                        "these offsets)", error, timeout)
            return False
        delay = backoff.next()
        log.warning("KafkaStream.commit: %s; retrying in %.1f s", error, delay)
        time.sleep(min(delay, max(deadline - time.monotonic(), 0.0)))


def _topics(topics) -> list[str]:
    """A topic name or a non-empty list of them, as a list."""
    if isinstance(topics, str):
        return [check_str("KafkaStream", "topics", topics)]
    check_type("KafkaStream", "topics", topics, Sequence, allowed="a topic name or a list of them")
    if not topics:
        raise ValueError("KafkaStream: 'topics' must name at least one topic, got []")
    return [check_str("KafkaStream", f"topics[{i}]", t) for i, t in enumerate(topics)]


def _assignment(assignment) -> list[tuple[str, int]]:
    """Explicit partitions: a sequence of (topic, partition) pairs."""
    check_type("KafkaStream", "assignment", assignment, Sequence, allowed="a list of (topic, partition) pairs")
    pairs = []
    for i, pair in enumerate(assignment):
        if not isinstance(pair, Sequence) or isinstance(pair, str) or len(pair) != 2:
            raise TypeError(f"KafkaStream: 'assignment[{i}]' must be a (topic, partition) pair, got {pair!r}")
        pairs.append((check_str("KafkaStream", f"assignment[{i}][0]", pair[0]),
                      check_int("KafkaStream", f"assignment[{i}][1]", pair[1], minimum=0)))
    return pairs


class KafkaStream(Stream):
    """Batches from Kafka (see the module docstring)."""

    splits_across_ranks = True

    def __init__(self, topics: str | Sequence[str], bootstrap_servers: str, group_id: str,
                 schema: Schema | None = None, batch_size: int = 1024, *, decoder=None, format: str = "csv",
                 assignment: Sequence[tuple[str, int]] | None = None, consumer_config: dict | None = None,
                 start: str = "earliest", id_column: str | None = None, time_column: str | None = None,
                 max_record_bytes: int | None = None, max_batches: int | None = None,
                 idle_timeout: float | None = None, drop_remainder: bool = False,
                 dead_letter: str | os.PathLike | None = None, dead_letter_topic: str | None = None,
                 poll_timeout: float = 0.1, commit_timeout: float = 60.0, max_delay: float | None = None) -> None:
        owner = "KafkaStream"
        self.topics = _topics(topics)
        check_str(owner, "bootstrap_servers", bootstrap_servers)
        check_str(owner, "group_id", group_id)
        check_type(owner, "schema", schema, Schema, allowed="a recstream.data.Schema", allow_none=True)
        check_choice(owner, "format", format, ("csv", "jsonl"))
        check_type(owner, "consumer_config", consumer_config, dict, allow_none=True)
        check_int(owner, "max_record_bytes", max_record_bytes, minimum=1, allow_none=True)
        check_str(owner, "dead_letter_topic", dead_letter_topic, allow_none=True)
        self.poll_timeout = check_number(owner, "poll_timeout", poll_timeout, minimum=0)  # seconds
        self.commit_timeout = check_number(owner, "commit_timeout", commit_timeout, minimum=0)  # seconds
        self.assignment = None if assignment is None else _assignment(assignment)
        self._all_partitions: list[tuple[str, int]] | None = None  # the job's, once split by set_rank
        if decoder is None:
            if schema is None:
                raise ValueError("KafkaStream: pass a 'decoder', or a 'schema' with format='csv' or 'jsonl'")
            cls = JSONDecoder if format == "jsonl" else CSVLineDecoder
            decoder = cls(schema, id_column=id_column, time_column=time_column,
                          max_record_bytes=max_record_bytes or DEFAULT_MAX_RECORD_BYTES)
        elif schema is not None or id_column or time_column or max_record_bytes:
            raise ValueError("KafkaStream: with a 'decoder', set schema / id_column / time_column / "
                             "max_record_bytes on the decoder")
        self.decoder, self.schema = decoder, decoder.schema
        self._config = default_consumer_config(bootstrap_servers, group_id, start, consumer_config)
        self._config.setdefault("error_cb", self._on_client_error)
        self._cooperative = "cooperative" in str(self._config.get("partition.assignment.strategy", ""))
        # taken around every call into the consumer: the client serializes the calls on one
        # consumer, so a synchronous commit the broker does not answer holds the handle. The
        # reader never waits for it longer than one poll_timeout (it reads nothing meanwhile and
        # its idle clock runs); a commit waits at most one poll for the reader
        self._lock = threading.Lock()
        self._keys: dict[tuple[str, int], int] = {}  # (topic, partition) -> small int key
        self._tps: list[tuple[str, int]] = []
        self._owned: set[int] = set()
        self._targets: dict[int, int] = {}  # seek targets not applied yet (partition not assigned)
        self._stash: dict[int, int] = {}    # positions of revoked/lost partitions, if they come back
        self._revoked: set[int] = set()     # revoked by the current (eager) rebalance
        self._last_error = ("", 0.0)
        # the idle clock (re)starts at each assignment; before a group's first one, no data can come
        self._assigned_at = time.monotonic() if self.assignment is not None else None
        self._producer = None
        self._closing = False
        self._iter_thread = None
        self._commit_thread: threading.Thread | None = None
        self._committing = threading.Event()  # a commit wants or holds the handle: the reader waits
        self._pending: list[TopicPartition] | None = None  # the newest commit queued behind a stuck one
        self._pending_lock = threading.Lock()
        self._dead_topic = dead_letter_topic
        super().__init__(batch_size, max_batches=max_batches, idle_timeout=idle_timeout, drop_remainder=drop_remainder,
                         max_delay=max_delay,
                         dead_letter=DeadLetter(dead_letter, self._to_dead_topic if dead_letter_topic else None))
        if dead_letter_topic:  # clients start only once every argument is known to be good
            self._producer = DeadLetterProducer(bootstrap_servers, dead_letter_topic)
        self._consumer = Consumer(self._config)
        # a group is joined at the first read, not here: set_rank() may assign partitions explicitly
        # first, and a join once started (librdkafka's own thread) would make this consumer a member
        self._need_subscribe = self.assignment is None
        if self.assignment is not None:  # assigned when iteration starts, once, at the offsets known by then
            self._owned = {self._key(t, p) for t, p in self.assignment}
        self._need_assign = self.assignment is not None

    # --- ranks ---------------------------------------------------------------------------------
    def _set_rank(self, rank: int, world_size: int) -> None:
        """Explicitly assign this rank's partitions (p % world_size == rank), never as a group member."""
        if self._all_partitions is None:  # the first split: what the whole job reads
            if self.assignment is None:
                self._need_subscribe = False  # never a member of the group: no rebalance between ranks
                self._all_partitions = [(topic, p) for topic in self.topics for p in self._partitions(topic)]
            else:
                self._all_partitions = list(self.assignment)
        self.assignment = [(t, p) for t, p in self._all_partitions if p % world_size == rank]
        self._owned = {self._key(t, p) for t, p in self.assignment}
        self._targets, self._stash, self._cursor, self._position = {}, {}, {}, {}
        self._assembler.clear()
        self._need_assign = True
        self._assigned_at = time.monotonic()
        log.info("KafkaStream: rank %d of %d reads %s", rank, world_size, [f"{t}:{p}" for t, p in self.assignment])

    def _partitions(self, topic: str) -> list[int]:
        meta = self._consumer.list_topics(topic, timeout=self.commit_timeout or 10)
        found = meta.topics.get(topic)
        if found is None or found.error is not None or not found.partitions:
            raise ValueError(f"KafkaStream.set_rank: cannot list the partitions of topic {topic!r} "
                             f"({None if found is None else found.error}); create it first")
        return sorted(found.partitions)

    def rank_position(self, positions: list, rank: int, world_size: int) -> dict:
        """Offsets are per partition: the saved positions of any number of ranks are merged, and
        this rank keeps its own partitions' (those of the assignment set by `set_rank`)."""
        check_type("KafkaStream.rank_position", "positions", positions, list, allowed="a list of positions")
        merged: dict = {}
        for position in positions:
            for (topic, part), offset in parse_position(position).items():
                key = f"{topic}:{part}"
                merged[key] = max(offset, merged.get(key, offset))
        if self.assignment is None:  # one consumer of the whole group: every partition
            return merged
        mine = {f"{t}:{p}" for t, p in self.assignment}
        return {k: v for k, v in merged.items() if k in mine}

    def empty_batch(self):
        return self.decoder._empty

    def _to_dead_topic(self, line: bytes) -> None:
        self._producer(line)  # waits out a full queue (bounded), counts and logs undelivered letters

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
            for k, i in zip(uniq.tolist(), last.tolist(), strict=True):
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

    @property
    def commits_progress(self) -> bool:
        return True  # offsets go to the consumer group

    def commit(self, position: dict) -> bool:
        """Commit `position`'s offsets for the group; partitions this consumer no longer owns are
        left alone. Returns True once committed, False when the commit was skipped or did not
        finish within `commit_timeout` (logged; the checkpoint holds the position, the next
        commit covers these offsets). The wait is bounded whatever the broker does (frozen,
        dead) and signal handlers run during it."""
        self._check_open()
        parsed = parse_position(position)
        offsets = [TopicPartition(t, p, off) for (t, p), off in parsed.items()
                   if self._keys.get((t, p)) in self._owned]
        skipped = len(parsed) - len(offsets)
        if skipped:
            log.info("KafkaStream.commit: %d partition(s) no longer assigned here, not committed", skipped)
        if not offsets:
            return True
        # from the iterating thread itself, waiting for a rejoin would deadlock
        same_thread = self._iterating and threading.get_ident() == self._iter_thread
        return self._commit_bounded(offsets, wait_rejoin=not same_thread)

    def _commit_bounded(self, offsets: list[TopicPartition], wait_rejoin: bool) -> bool:
        """Run `commit_sync` on a helper thread and wait for it at most `commit_timeout` s:
        librdkafka's synchronous commit takes no timeout and blocks for as long as the broker
        does not answer. A commit still stuck after that is abandoned (its call cannot be
        cancelled; its outcome is logged when it returns): a new commit meanwhile is queued
        and made by the same helper as soon as the stuck call returns, with the newest position
        (each comes from a durable checkpoint, so none is ever ahead of one)."""
        with self._pending_lock:
            if self._commit_thread is not None and self._commit_thread.is_alive():
                self._pending = offsets
                log.warning("KafkaStream.commit: the previous commit has not returned yet (broker unresponsive); "
                            "this position is committed as soon as it does (the checkpoint holds it meanwhile)")
                return False
        outcome: dict = {}

        def run() -> None:
            try:
                outcome["ok"] = commit_sync(self._consumer, offsets, self.commit_timeout, wait_rejoin,
                                            handle=self._handle())
            except BaseException as e:  # noqa: BLE001 - handed to the waiting caller
                outcome["error"] = e
            self._commit_queued()

        self._commit_thread = threading.Thread(target=run, name="recstream-kafka-commit", daemon=True)
        self._commit_thread.start()
        self._commit_thread.join(self.commit_timeout + 0.5)  # interruptible: signal handlers run meanwhile
        if "error" in outcome:
            raise outcome["error"]
        if "ok" not in outcome:
            log.warning("KafkaStream.commit: no answer from the broker within commit_timeout=%s s; not committed "
                        "(the checkpoint holds the position; the next commit covers these offsets)",
                        self.commit_timeout)
            return False
        return outcome["ok"]

    def _commit_queued(self) -> None:
        """On the helper thread, after its own commit: commit what was queued behind it meanwhile."""
        while True:
            with self._pending_lock:
                offsets, self._pending = self._pending, None
                if offsets is None or self._closed:
                    return
            try:
                ok = commit_sync(self._consumer, offsets, self.commit_timeout, False, handle=self._handle())
                log.info("KafkaStream: queued commit %s", "done" if ok else "not done (the next commit covers it)")
            except Exception as e:  # noqa: BLE001 - nobody waits for this one: log it
                log.warning("KafkaStream: queued commit failed: %s (the next commit covers it)", e)

    @contextlib.contextmanager
    def _handle(self):
        """The consumer, for one commit call: the reader stops polling while a commit wants it."""
        self._committing.set()
        try:
            with self._lock:
                yield
        finally:
            self._committing.clear()

    def committed(self) -> dict:
        """The group's committed offsets of the owned partitions, as a position dict."""
        tps = [TopicPartition(*self._tps[k]) for k in sorted(self._owned)]
        got = self._consumer.committed(tps, timeout=10) if tps else []
        return {f"{tp.topic}:{tp.partition}": tp.offset for tp in got if tp.offset >= 0}

    def close(self) -> None:
        if not self._closed:
            self._closing = True  # the revoke that close() triggers keeps position() as it was
            self._interrupt.set()  # a poll running in another thread ends now
            # leaves the group now, so others get its partitions at once; bounded like a commit:
            # an unresponsive broker must not keep a stopping trainer from exiting
            closer = threading.Thread(target=self._close_consumer, name="recstream-kafka-close", daemon=True)
            closer.start()
            closer.join(self.commit_timeout + 0.5)
            if closer.is_alive():
                log.warning("KafkaStream.close: the broker did not answer within commit_timeout=%s s; "
                            "the group notices this member's absence after its session timeout", self.commit_timeout)
            if self._producer is not None:
                self._producer.close()  # flushes; what is still undelivered is logged and counted
        super().close()

    def _close_consumer(self) -> None:
        with self._lock:
            self._consumer.close()

    # --- rebalance (librdkafka calls these inside consume(), in the iterating thread) ------
    def _on_assign(self, consumer, partitions: list[TopicPartition]) -> None:
        keys = [self._key(tp.topic, tp.partition) for tp in partitions]
        back = [tp for tp, k in zip(partitions, keys, strict=True) if k not in self._targets and k in self._stash]
        committed = {}
        if back:  # coming back to us: someone else may have moved on and committed meanwhile
            try:
                committed = {(tp.topic, tp.partition): tp.offset for tp in consumer.committed(back, timeout=10)}
            except KafkaException as e:
                log.warning("KafkaStream: could not read committed offsets (%s); resuming at own positions", e)
        for tp, key in zip(partitions, keys, strict=True):
            if key in self._targets:
                tp.offset = self._targets.pop(key)
            elif key in self._stash:
                tp.offset = max(self._stash.pop(key), committed.get((tp.topic, tp.partition), -1))
            else:
                continue
            self._cursor[self._name(key)] = tp.offset
        if not self._cooperative:  # eager: the assignment is complete; other targets went elsewhere
            for key in list(self._targets):
                self._targets.pop(key)
                self._cursor.pop(self._name(key), None)
                self._position.pop(self._name(key), None)
        if not self._cooperative:  # eager: what we had before this rebalance and did not get back
            self._warn_moved([k for k in self._revoked if k not in keys])
        self._revoked = set()
        self._owned |= set(keys)
        self._assigned_at = time.monotonic()
        log.info("KafkaStream: assigned %s", [f"{tp.topic}:{tp.partition}@{tp.offset}" for tp in partitions])
        if self._cooperative:
            consumer.incremental_assign(partitions)
        else:
            consumer.assign(partitions)

    def _on_revoke(self, consumer, partitions: list[TopicPartition], lost: bool = False) -> None:
        if self._closing:  # close(): keep position() as it was
            return consumer.incremental_unassign(partitions) if self._cooperative else consumer.unassign()
        keys = {self._key(tp.topic, tp.partition) for tp in partitions}
        for key in keys:
            if self._name(key) in self._cursor:
                self._stash[key] = self._cursor.pop(self._name(key))
            self._position.pop(self._name(key), None)
        self._owned -= keys
        if self._cooperative:  # cooperative: only partitions that move are revoked
            self._warn_moved(keys)
        else:
            self._revoked |= keys
        if not self._owned and not lost:  # waiting for a new assignment: no data can come, so no idling
            self._assigned_at = None  # (lost: the broker is unreachable, an outage: the idle clock runs on)
        self._assembler.drop_keys(keys)
        log.warning("KafkaStream: partitions %s %s", sorted(self._name(k) for k in keys), "lost" if lost else "revoked")
        if self._cooperative:
            consumer.incremental_unassign(partitions)
        else:
            consumer.unassign()

    def _warn_moved(self, keys) -> None:
        """Partitions went to another member of the group: say what that costs (see the docs)."""
        if keys:
            log.warning("KafkaStream: partitions %s moved to another member of group %r. Exactly-once holds per "
                        "partition only while ONE trainer reads it: events this trainer read but has not "
                        "checkpointed may be trained again by the new owner, and a restore may seek back over "
                        "its progress. Supported: one trainer per group (or disjoint explicit assignments); "
                        "distributed training coordinates its own checkpoint.",
                        sorted(self._name(k) for k in keys), self._config.get("group.id"))

    def _on_lost(self, consumer, partitions: list[TopicPartition]) -> None:
        self._on_revoke(consumer, partitions, lost=True)

    def _on_client_error(self, error: KafkaError) -> None:
        """librdkafka's own errors (broker down, ...): logged, at most every 10 s per message."""
        msg, last = self._last_error
        if error.str() != msg or time.monotonic() - last > 10:
            log.warning("KafkaStream: %s (librdkafka retries with backoff)", error.str())
            self._last_error = (error.str(), time.monotonic())
        if error.fatal():
            raise KafkaException(error)

    # --- reading -----------------------------------------------------------------------------
    def _generate(self) -> Iterator:
        self._iter_thread = threading.get_ident()
        if self._need_subscribe:
            self._consumer.subscribe(self.topics, on_assign=self._on_assign, on_revoke=self._on_revoke,
                                     on_lost=self._on_lost)
            self._need_subscribe = False
        if self._need_assign:
            self._assign_all()
            self._need_assign = False
            self._assigned_at = time.monotonic()
        last_data = time.monotonic()
        backoff = Backoff()
        while not self._interrupt.is_set():
            msgs = self._poll()
            if msgs and self._take(msgs, backoff):
                last_data = time.monotonic()
                yield from self._full_batches()
            elif self.idle_timeout is not None and self._assigned_at is not None and \
                    time.monotonic() - max(last_data, self._assigned_at) >= self.idle_timeout:
                yield from self._remainder()
                return
            yield from self._overdue()

    def _poll(self) -> list:
        """The next messages; none, after at most ~poll_timeout, while a commit holds the consumer
        (a broker that does not answer a commit must not stop the reader's idle clock)."""
        if self._committing.is_set() or not self._lock.acquire(timeout=max(self.poll_timeout, 0.005)):
            self._interrupt.wait(min(self.poll_timeout, 0.01) if self._committing.is_set() else 0)
            return []
        try:
            # only what the next batch still needs: read-ahead stays under one batch, and the
            # consumer polls once per batch, which serves rebalances (callbacks run in consume)
            return self._consumer.consume(self.batch_size - self._assembler.rows, self.poll_timeout)
        finally:
            self._lock.release()

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
            msgs = [m for m, ok in zip(msgs, owned.tolist(), strict=True) if ok]
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
