"""A commit outstanding when the broker freezes (SIGSTOP) must not hang the reader.

The client library serializes the calls on one consumer, so a synchronous commit that the
frozen broker never answers used to hold the consumer: the next ``consume()`` waited behind
it and ``idle_timeout`` never fired. Now the reader reads nothing while a commit holds the
consumer, its idle clock runs, the stuck commit is abandoned after ``commit_timeout``, and the
next checkpoint's position is committed as soon as the broker answers again, never a position
ahead of a durable checkpoint.
"""
from __future__ import annotations

import threading
import time

import pytest

pytest.importorskip("confluent_kafka", reason="confluent-kafka is not installed (pip install confluent-kafka)")

from recstream.data.streams import KafkaStream

from .events import decoder, records

IDLE_S, COMMIT_S = 3.0, 2.0


def freeze(broker) -> None:
    """SIGSTOP the broker and wait until the kernel says it is stopped (delivery is asynchronous)."""
    broker.pause()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        with open(f"/proc/{broker.proc.pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "T":
                return
        time.sleep(0.01)
    raise AssertionError("the broker did not stop")


def test_frozen_broker_with_a_commit_outstanding_does_not_hang_the_reader(own_broker):
    broker = own_broker.start()
    broker.create_topic("clicks", 1)
    broker.produce("clicks", records(300))
    s = KafkaStream("clicks", broker.bootstrap_servers, "frozen-commit", batch_size=100, decoder=decoder(),
                    assignment=[("clicks", 0)], idle_timeout=IDLE_S, commit_timeout=COMMIT_S)
    ids: list[int] = []
    ended = threading.Event()
    errors: list = []
    it = iter(s)

    def read_rest():  # the trainer goes on reading after its commit came back unanswered
        try:
            for _ in it:
                ids.extend(s.last_batch_meta()["ids"].tolist())
        except Exception as e:  # noqa: BLE001 - reported by the test
            errors.append(e)
        finally:
            ended.set()

    try:
        next(it)
        ids.extend(s.last_batch_meta()["ids"].tolist())
        first_checkpoint = s.position()  # durable checkpoint no. 1
        freeze(broker)  # SIGSTOP: the broker neither answers nor closes connections
        t0 = time.monotonic()
        assert s.commit(first_checkpoint) is False  # from the iterating thread, as a checkpoint callback does
        assert time.monotonic() - t0 < COMMIT_S + 1.5, "the commit's wait is bounded by commit_timeout"
        reader = threading.Thread(target=read_rest, daemon=True)
        reader.start()
        # it reads what was fetched before the freeze (or nothing), then idles out: never waits on the commit
        assert ended.wait(IDLE_S + 6), "the reader hung behind the stuck commit: idle_timeout did not fire"
        assert time.monotonic() - t0 >= IDLE_S - 0.5  # idle since the last data, before the freeze
        assert not errors, errors
        second_checkpoint = s.position()  # durable checkpoint no. 2 (everything read so far)
        t2 = time.monotonic()
        assert s.commit(second_checkpoint) is False  # queued behind the stuck one, returns at once
        assert time.monotonic() - t2 < 1.0
    finally:
        broker.resume()  # SIGCONT, whatever happened above
    # the broker answers the stuck commit; the queued one (the newest checkpoint) follows
    deadline = time.monotonic() + 60
    while s.committed() != second_checkpoint and time.monotonic() < deadline:
        time.sleep(0.5)
    assert s.committed() == second_checkpoint, (s.committed(), second_checkpoint)
    assert second_checkpoint["clicks:0"] == len(ids) <= 300  # never ahead of what the checkpoint holds
    # reading goes on where it was: exactly the rest, after the broker came back
    broker.produce("clicks", records(100, 300))
    s.idle_timeout = IDLE_S
    for _ in s:
        ids.extend(s.last_batch_meta()["ids"].tolist())
    s.close()
    assert sorted(ids) == list(range(400))


def test_idle_timeout_fires_for_a_group_member_whose_partitions_are_lost_to_a_frozen_broker(own_broker):
    """A group member's session times out while the broker is frozen and its partitions are lost:
    that is an outage, not a rebalance, so the idle clock keeps running and the iteration ends."""
    broker = own_broker.start()
    broker.create_topic("clicks", 1)
    broker.produce("clicks", records(100))
    idle = 9.0  # longer than the session timeout (6 s): the partitions are lost first
    s = KafkaStream("clicks", broker.bootstrap_servers, "frozen-group", batch_size=100, decoder=decoder(),
                    idle_timeout=idle, commit_timeout=COMMIT_S)
    ended = threading.Event()
    ids: list[int] = []
    got_data = threading.Event()

    def read():
        try:
            for _ in s:
                ids.extend(s.last_batch_meta()["ids"].tolist())
                got_data.set()
        finally:
            ended.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert got_data.wait(60), "the group member got no data"
        freeze(broker)
        t0 = time.monotonic()
        assert ended.wait(idle + 8), "idle_timeout did not fire while the broker was frozen"
        assert time.monotonic() - t0 <= idle + 8
    finally:
        broker.resume()
    s.close()
    assert ids == list(range(100))
