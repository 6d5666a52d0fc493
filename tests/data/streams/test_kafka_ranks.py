"""KafkaStream split across ranks: partition p is rank p % n's, by explicit assignment (no group
membership); positions of any number of ranks map to any other."""
from __future__ import annotations

import pytest

pytest.importorskip("confluent_kafka", reason="confluent-kafka is not installed (pip install confluent-kafka)")

from recstream.data.streams import KafkaStream

from .events import decoder, records, take_ids


def test_partitions_split_by_rank_and_positions_remap(broker, topic):
    t = topic(3)
    recs = records(90)
    for p in range(3):
        broker.produce(t, recs[p::3], partition=p)
    got = {}
    for r in (0, 1):  # group subscription turned into explicit assignment: no rebalance between ranks
        with KafkaStream(t, broker.bootstrap_servers, "g-ranks", batch_size=10, decoder=decoder("csv"),
                         idle_timeout=3.0) as s:
            s.set_rank(r, 2)
            assert s.assignment == [(t, p) for p in range(3) if p % 2 == r]
            got[r] = take_ids(s)
            assert sorted(s.position()) == [f"{t}:{p}" for p in range(3) if p % 2 == r]
    assert sorted(got[0] + got[1]) == list(range(90)) and not set(got[0]) & set(got[1])

    saved = [{f"{t}:0": 30, f"{t}:2": 12}, {f"{t}:1": 7}]  # by 2 ranks
    with KafkaStream(t, broker.bootstrap_servers, "g-ranks3", batch_size=10, decoder=decoder("csv"),
                     assignment=[(t, p) for p in range(3)]) as s:
        s.set_rank(2, 3)  # 3 ranks now: rank 2 reads partition 2 alone
        assert s.rank_position(saved, 2, 3) == {f"{t}:2": 12}
    with KafkaStream(t, broker.bootstrap_servers, "g-ranks1", batch_size=10, decoder=decoder("csv"),
                     assignment=[(t, p) for p in range(3)]) as s:
        assert s.rank_position(saved, 0, 1) == {f"{t}:0": 30, f"{t}:1": 7, f"{t}:2": 12}  # one process
