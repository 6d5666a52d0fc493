"""A broker restart with durable storage (Tansu on PostgreSQL) loses nothing: every produced
event and the group's committed offsets survive, and a new consumer resumes exactly there.

Skipped, with the broker's own message, when the Tansu binary has no PostgreSQL engine.
"""
from __future__ import annotations

import pytest

pytest.importorskip("confluent_kafka", reason="confluent-kafka is not installed (pip install confluent-kafka)")

from recstream.data.streams import KafkaStream
from recstream.testing import BrokerUnavailable, TansuBroker

from .events import decoder, records, take_ids


def test_broker_restart_on_postgres_loses_nothing(tansu_binary, postgres):
    broker = TansuBroker(binary=tansu_binary, storage=postgres)
    try:
        broker.start()
    except BrokerUnavailable as e:
        if "FeatureNotEnabled" in str(e):
            pytest.skip(f"this Tansu build has no PostgreSQL storage engine: {str(e)[-300:]}")
        raise
    try:
        broker.create_topic("durable", 2)
        broker.produce("durable", records(600))
        kw = dict(batch_size=50, decoder=decoder(), idle_timeout=20)
        with KafkaStream("durable", broker.bootstrap_servers, "g-durable", max_batches=6, **kw) as s:
            first = take_ids(s)
            s.commit(s.position())
        broker.restart()
        assert "durable" in broker.topics()
        with KafkaStream("durable", broker.bootstrap_servers, "g-durable", **kw) as s:
            rest = take_ids(s, limit=300)  # resumes at the committed offsets, after the restart
        assert sorted(first + rest) == list(range(600))
        with KafkaStream("durable", broker.bootstrap_servers, "g-all", **kw) as s:
            assert sorted(take_ids(s, limit=600)) == list(range(600))  # every event is still stored
    finally:
        broker.stop()
