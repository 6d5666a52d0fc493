"""What a KafkaStream does when its consumer group moves partitions (a mixin of KafkaStream).

librdkafka runs these callbacks inside ``consume()``, i.e. in the iterating thread, so
they may change the stream's position state without locks:

* assigned: partitions with a pending ``seek`` target start there; a partition that comes
  back after a revoke/loss resumes at the later of our own position and the group's
  committed offset (someone else may have moved on meanwhile); others start at the
  committed offset (or ``start``).
* revoked / lost: the partition leaves ``position()`` (another member may own it now, and
  the trainer must not commit it), its unyielded rows are dropped (they are read again by
  the new owner), its position is kept aside in case it comes back.

Eager protocols (librdkafka's default) revoke everything, then assign; cooperative ones
(``partition.assignment.strategy=cooperative-sticky``) move single partitions and need
``incremental_assign``; both are handled.
"""
from __future__ import annotations

import logging
import time

from confluent_kafka import KafkaError, KafkaException, TopicPartition

log = logging.getLogger("recstream.data.streams")


class RebalanceCallbacks:
    """Mixin: needs the KafkaStream attributes _targets, _stash, _cursor, _position, _owned,
    _assembler, _cooperative, _closing, _assigned_at, _last_error and methods _key, _name."""

    def _on_assign(self, consumer, partitions: list[TopicPartition]) -> None:
        keys = [self._key(tp.topic, tp.partition) for tp in partitions]
        back = [tp for tp, k in zip(partitions, keys) if k not in self._targets and k in self._stash]
        committed = {}
        if back:  # coming back to us: someone else may have moved on and committed meanwhile
            try:
                committed = {(tp.topic, tp.partition): tp.offset for tp in consumer.committed(back, timeout=10)}
            except KafkaException as e:
                log.warning("KafkaStream: could not read committed offsets (%s); resuming at own positions", e)
        for tp, key in zip(partitions, keys):
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
        if not self._owned:  # waiting for a new assignment: no data can come, so no idling
            self._assigned_at = None
        self._assembler.drop_keys(keys)
        log.warning("KafkaStream: partitions %s %s", sorted(self._name(k) for k in keys), "lost" if lost else "revoked")
        if self._cooperative:
            consumer.incremental_unassign(partitions)
        else:
            consumer.unassign()

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
