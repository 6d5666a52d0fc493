"""A broker outage (the process frozen with SIGSTOP for 20 s): streams wait, retry, and resume
with every event delivered exactly once; a commit issued during the outage completes after it.

The group member's session times out during the freeze, so its partitions are lost and come
back: it must resume at its own position, ahead of the (older) offsets the trainer committed,
or it would deliver events again."""
from __future__ import annotations

import logging
import threading
import time

import pytest

pytest.importorskip("confluent_kafka", reason="confluent-kafka is not installed (pip install confluent-kafka)")

from recstream.data.streams import KafkaStream

from .events import decoder, records

FREEZE_S = 20


def test_broker_frozen_20s_loses_and_repeats_nothing(own_broker, caplog):
    caplog.set_level(logging.WARNING, logger="recstream.data.streams")
    broker = own_broker.start()
    broker.create_topic("clicks", 2)
    broker.produce("clicks", records(2000))
    n = 4000
    # a group member (its session times out during the freeze: partitions lost, then back)
    # and an explicitly assigned consumer (no group: it just waits for the broker)
    streams = {
        "group": KafkaStream("clicks", broker.bootstrap_servers, "outage-group", batch_size=100,
                             decoder=decoder(), idle_timeout=60),
        "assigned": KafkaStream("clicks", broker.bootstrap_servers, "outage-assigned", batch_size=100,
                                decoder=decoder(), assignment=[("clicks", 0), ("clicks", 1)], idle_timeout=60),
    }
    ids = {k: [] for k in streams}
    halfway = {k: threading.Event() for k in streams}
    resumed = threading.Event()
    errors: list = []
    commit_result: dict = {}
    checkpoint: dict = {}

    def consume(name):
        s = streams[name]
        try:
            for _ in s:
                ids[name] += s.last_batch_meta()["ids"].tolist()
                if name == "group" and len(ids[name]) == 500:
                    checkpoint.update(s.position())  # the trainer's last durable checkpoint
                if len(ids[name]) >= 1000 and not halfway[name].is_set():
                    halfway[name].set()
                    if name == "group":  # hold here until the broker is frozen: data is in flight
                        resumed.wait(FREEZE_S + 30)
                if len(ids[name]) >= n:
                    return
        except Exception as e:
            errors.append((name, e))
        finally:
            halfway[name].set()

    threads = [threading.Thread(target=consume, args=(k,)) for k in streams]
    for t in threads:
        t.start()
    try:
        assert all(e.wait(60) for e in halfway.values()), "consumers did not get going within 60 s"
        broker.pause()
        frozen_at = time.monotonic()

        def commit():  # the trainer commits a checkpoint (500 events, behind the 1000 read) during
            try:       # the outage: it waits for the broker, then completes
                streams["group"].commit(dict(checkpoint))
                commit_result["done_after"] = time.monotonic() - frozen_at
            except Exception as e:
                commit_result["error"] = e

        committer = threading.Thread(target=commit)
        committer.start()
        resumed.set()  # the group consumer goes on reading into the frozen broker
        time.sleep(FREEZE_S)  # the outage itself: a fixed duration is the point here
        broker.resume()
        broker.produce("clicks", records(2000, 2000))
        committer.join(70)
        for t in threads:
            t.join(120)
    finally:
        resumed.set()
        broker.resume()
        for s in streams.values():
            s.close()
    assert not errors, errors
    assert "error" not in commit_result, commit_result
    assert commit_result["done_after"] >= FREEZE_S - 1  # it waited for the broker, then succeeded
    # the group member's session timed out while frozen: its partitions were lost and came back;
    # it resumed at its own position (1000 read), not at the group's older committed one (500)
    assert "] lost" in caplog.text, caplog.text
    for name in streams:
        assert len(ids[name]) == n, f"{name}: {len(ids[name])} events"
        assert sorted(ids[name]) == list(range(n)), f"{name}: lost or repeated events"
