"""KafkaStream against a real Kafka-protocol broker (Tansu): positions, seek, commit, groups, dead letters."""
from __future__ import annotations

import json
import threading
import time

import pytest

pytest.importorskip("confluent_kafka", reason="confluent-kafka is not installed (pip install confluent-kafka)")

from recstream.data.streams import KafkaStream

from .events import assert_same_batch, decoder, records, take_ids


def _produce_round_robin(broker, topic, n, partitions, start=0):
    recs = records(n, start)
    for p in range(partitions):
        broker.produce(topic, recs[p::partitions], partition=p)


def _stream(broker, topic, group, partitions=None, **kw):
    # tests stop on the number of events they expect: the idle timeout only bounds a failing run
    kw.setdefault("idle_timeout", 15.0)
    assignment = None if partitions is None else [(topic, p) for p in range(partitions)]
    return KafkaStream(topic, broker.bootstrap_servers, group, batch_size=kw.pop("batch_size", 50),
                       decoder=decoder("csv"), assignment=assignment, **kw)


def test_one_partition_seek_replays_the_same_batches(broker, topic):
    t = topic(1)
    broker.produce(t, records(300))
    with _stream(broker, t, "g-replay", partitions=1, max_batches=2) as s:  # 2 batches per iteration
        assert take_ids(s) == list(range(100))
        pos = s.position()
        assert pos == {f"{t}:0": 100}
        ahead = [(b, s.last_batch_meta()["ids"].tolist()) for b in s]
        s.seek(pos)
        again = [(b, s.last_batch_meta()["ids"].tolist()) for b in s]
        assert [i for _, i in again] == [i for _, i in ahead] == [list(range(100, 150)), list(range(150, 200))]
        for (a, _), (b, _) in zip(ahead, again, strict=True):
            assert_same_batch(a, b)
        assert s.position() == {f"{t}:0": 200}


def test_assigned_partitions_restart_from_a_position_gets_exactly_the_rest(broker, topic):
    t = topic(3)
    _produce_round_robin(broker, t, 600, 3)
    with _stream(broker, t, "g-assign", partitions=3, max_batches=4) as s:
        first = take_ids(s)
        pos = s.position()
    assert len(first) == 200 and sum(pos.values()) == 200  # offsets count the events read
    assert set(pos) <= {f"{t}:{p}" for p in range(3)}
    for key, offset in pos.items():  # per partition: exactly the first `offset` events of it
        p = int(key.rsplit(":", 1)[1])
        assert sorted(i for i in first if i % 3 == p) == list(range(p, 3 * offset, 3))
    with _stream(broker, t, "g-assign", partitions=3) as s:
        s.seek(pos)
        rest = take_ids(s, limit=400)
        assert s.position() == {f"{t}:{p}": 200 for p in range(3)}
    assert sorted(first + rest) == list(range(600))


def test_group_commit_then_a_new_consumer_resumes_there(broker, topic):
    t = topic(2)
    _produce_round_robin(broker, t, 400, 2)
    with _stream(broker, t, "g-commit", batch_size=40, max_batches=5) as a:  # joins the group
        first = take_ids(a)
        committed = a.position()
        a.commit(committed)
        assert a.committed() == committed
    assert len(first) == 200
    with _stream(broker, t, "g-commit") as b:  # same group: starts at the committed offsets
        rest = take_ids(b, limit=200)
    assert sorted(first + rest) == list(range(400))


def test_group_seek_before_the_join_applies_on_assignment(broker, topic):
    t = topic(2)
    _produce_round_robin(broker, t, 200, 2)
    with _stream(broker, t, "g-seek", batch_size=20) as s:
        s.seek({f"{t}:0": 70, f"{t}:1": 90})
        ids = take_ids(s, limit=40)
    assert sorted(ids) == sorted(list(range(140, 200, 2)) + list(range(181, 200, 2)))
    assert s.position() == {f"{t}:0": 100, f"{t}:1": 100}


def test_bad_messages_go_to_the_dead_letter_file_and_topic(broker, topic, tmp_path):
    t, dlq = topic(1), topic(1)
    good = records(4)
    broker.produce(t, [good[0], b"1,2,3", good[1], good[2].replace(b",", b",nan,", 1), good[2], b"\xff\xfe",
                       good[3]])
    dead = tmp_path / "dead.jsonl"
    with _stream(broker, t, "g-dlq", partitions=1, batch_size=2, dead_letter=dead, dead_letter_topic=dlq) as s:
        assert take_ids(s, limit=4) == [0, 1, 2, 3]
        assert s.position() == {f"{t}:0": 7}
    assert s.bad_records == {"column_count": 2, "malformed": 1}
    letters = [json.loads(x) for x in dead.read_text().splitlines()]
    assert [(x["reason"], x["source"]["offset"]) for x in letters] == [("column_count", 1), ("column_count", 3),
                                                                       ("malformed", 5)]
    assert all(x["source"]["topic"] == t and x["source"]["partition"] == 0 for x in letters)
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": "dlq-reader"})
    c.assign([TopicPartition(dlq, 0, 0)])
    got, deadline = [], time.monotonic() + 20
    while len(got) < 3 and time.monotonic() < deadline:
        got += [json.loads(m.value()) for m in c.consume(10, 0.5) if m.error() is None]
    c.close()
    assert [(x["reason"], x["source"]["offset"]) for x in got] == [("column_count", 1), ("column_count", 3),
                                                                   ("malformed", 5)]


def test_rebalance_moves_partitions_without_loss_or_duplicates(broker, topic, caplog):
    """A reads alone, committing after each batch (as a trainer does); B joins; the group
    moves partitions to B; A drops the revoked ones from its position. Together they read
    every event exactly once."""
    t, n = topic(4), 2000
    _produce_round_robin(broker, t, n, 4)
    ids = {"a": [], "b": []}
    a_started, errors = threading.Event(), []

    def consume(name, stream):
        try:
            with stream:
                for _ in stream:
                    ids[name] += stream.last_batch_meta()["ids"].tolist()
                    stream.commit(stream.position())
                    assert set(stream.position()) <= {f"{t}:{p}" for p in range(4)}
                    if name == "a":
                        a_started.set()
                        if not ids["b"]:  # A is slow until B reads, so the rebalance lands mid-stream
                            time.sleep(0.3)  # (A still polls between batches, as the rebalance needs)
        except Exception as e:
            errors.append(e)
        finally:
            a_started.set()

    a = _stream(broker, t, "g-rebalance", batch_size=20, idle_timeout=4)
    ta = threading.Thread(target=consume, args=("a", a))
    ta.start()
    assert a_started.wait(30), "A read nothing within 30 s"
    b = _stream(broker, t, "g-rebalance", batch_size=20, idle_timeout=4)
    tb = threading.Thread(target=consume, args=("b", b))
    tb.start()
    ta.join(90)
    tb.join(90)
    assert not errors, errors
    assert ids["a"] and ids["b"], f"both should read: A {len(ids['a'])}, B {len(ids['b'])}"
    assert len(ids["a"]) + len(ids["b"]) == n and sorted(ids["a"] + ids["b"]) == list(range(n))
    # in the end each owns some partitions; a revoked one is no longer in the other's position
    assert a.position() and b.position() and not set(a.position()) & set(b.position())
    # several independent trainers in one group is not a supported topology: it is said loudly
    assert "moved to another member of group 'g-rebalance'" in caplog.text


def test_arguments_are_checked_before_any_client_starts():
    with pytest.raises(TypeError, match="KafkaStream: 'topics' must be a topic name or a list of them, got 5"):
        KafkaStream(5, "127.0.0.1:1", "g", decoder=decoder())
    with pytest.raises(ValueError, match="KafkaStream: 'topics' must name at least one topic"):
        KafkaStream([], "127.0.0.1:1", "g", decoder=decoder())
    with pytest.raises(ValueError, match="KafkaStream: 'start' must be one of \\['earliest', 'latest'\\], got 'now'"):
        KafkaStream("t", "127.0.0.1:1", "g", decoder=decoder(), start="now")
    with pytest.raises(ValueError, match="KafkaStream: 'assignment\\[0\\]\\[1\\]' must be an int >= 0, got -1"):
        KafkaStream("t", "127.0.0.1:1", "g", decoder=decoder(), assignment=[("t", -1)])
    with pytest.raises(ValueError, match="KafkaStream: 'batch_size' must be an int >= 1, got 0"):
        KafkaStream("t", "127.0.0.1:1", "g", batch_size=0, decoder=decoder(), dead_letter_topic="dead")
    with pytest.raises(ValueError, match="pass a 'decoder', or a 'schema'"):
        KafkaStream("t", "127.0.0.1:1", "g")
