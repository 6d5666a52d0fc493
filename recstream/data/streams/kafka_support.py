"""Kafka plumbing for :class:`~recstream.data.streams.KafkaStream`: config, backoff, retries.

* :func:`consumer_config`: the defaults the stream needs (auto-commit OFF, a 6 s session
  timeout so a group join takes ~3 s instead of ~23 s, reconnect backoff capped at 2 s so
  the stream is back within seconds of a broker returning, fetches that wait at most
  100 ms for data), overridable.
* :class:`Backoff`: exponential backoff (0.1 s doubling to ``cap``) for error loops.
* :func:`commit_sync`: a synchronous offset commit retried with backoff on errors that go
  away (broker down, coordinator moving, rebalance in progress) until a deadline.
* :func:`parse_position`: ``{"topic:partition": offset}`` validated.

>>> b = Backoff(cap=1.0)
>>> [b.next() for _ in range(5)]
[0.1, 0.2, 0.4, 0.8, 1.0]
>>> parse_position({"clicks:0": 42})
{('clicks', 0): 42}
"""
from __future__ import annotations

import logging
import time

from confluent_kafka import KafkaError, KafkaException, TopicPartition

log = logging.getLogger("recstream.data.streams")

# errors after which a commit can succeed if simply tried again a little later
_RETRY_COMMIT = {KafkaError._TRANSPORT, KafkaError._TIMED_OUT, KafkaError._ALL_BROKERS_DOWN,
                 KafkaError._WAIT_COORD, KafkaError.COORDINATOR_NOT_AVAILABLE, KafkaError.NOT_COORDINATOR,
                 KafkaError.COORDINATOR_LOAD_IN_PROGRESS, KafkaError.REQUEST_TIMED_OUT, KafkaError._STATE,
                 KafkaError.NETWORK_EXCEPTION, KafkaError._RESOLVE, KafkaError._IN_PROGRESS}
# the member is (re)joining its group: the commit succeeds only after the consumer polls again
_REJOINING = {KafkaError.REBALANCE_IN_PROGRESS, KafkaError.ILLEGAL_GENERATION, KafkaError.UNKNOWN_MEMBER_ID}


def consumer_config(bootstrap_servers: str, group_id: str, start: str, overrides: dict | None) -> dict:
    """The consumer settings of a KafkaStream (`overrides` win)."""
    if start not in ("earliest", "latest"):
        raise ValueError(f"KafkaStream: 'start' must be 'earliest' or 'latest', got {start!r}")
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
    """Exponential backoff: 0.1 s, 0.2 s, ... up to `cap`; :meth:`reset` after a success."""

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


def commit_sync(consumer, offsets: list[TopicPartition], timeout: float, wait_rejoin: bool = True) -> bool:
    """Commit `offsets` synchronously; retry retriable failures with backoff until `timeout`.

    While the member is rejoining its group the commit can only succeed once the iterating
    thread polls again: with ``wait_rejoin=False`` (we ARE the iterating thread) it is
    skipped at once (logged; returns False) rather than blocking the very poll it waits for.
    Skipping is safe: offsets only move forward, the next commit covers these, and the
    trainer's checkpoint (not the group's offsets) is what a restore seeks to.
    """
    deadline = time.monotonic() + timeout
    backoff = Backoff(cap=2.0)
    while True:
        try:
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
        if (code not in _RETRY_COMMIT and code not in _REJOINING) or time.monotonic() >= deadline:
            raise KafkaException(error)
        delay = backoff.next()
        log.warning("KafkaStream.commit: %s; retrying in %.1f s", error, delay)
        time.sleep(min(delay, max(deadline - time.monotonic(), 0.0)))
