"""Freshness on a slow stream: with `max_delay`, rows waiting for a batch to fill are yielded as
a short batch once the oldest has waited that long (without it they wait for more rows forever,
or for `idle_timeout`). Positions stay exact: the next batch starts right after the short one.
"""
import threading

from recstream.data import Schema
from recstream.data.streams import DirectoryStream, KafkaStream

SCHEMA = Schema(["x"])


def _first_batch(stream, wait_s=20):
    """The first batch of `stream`, read in a thread (None if none came within `wait_s`)."""
    got = []
    thread = threading.Thread(target=lambda: got.extend(b.batch_size for b in stream), daemon=True)
    thread.start()
    thread.join(wait_s)
    if thread.is_alive():
        stream.interrupt()
        thread.join(5)
    return got[0] if got else None


def test_a_slow_directory_stream_yields_a_short_batch_after_max_delay(tmp_path):
    (tmp_path / "a.csv").write_text("".join(f"{i % 2},{i}.0\n" for i in range(5)))
    stream = DirectoryStream(tmp_path, SCHEMA, batch_size=100, max_delay=0.3, max_batches=1)
    assert _first_batch(stream) == 5
    assert stream.position() == {"file": "a.csv", "offset": (tmp_path / "a.csv").stat().st_size}


def test_without_max_delay_the_rows_wait_for_a_full_batch(tmp_path):
    (tmp_path / "a.csv").write_text("".join(f"{i % 2},{i}.0\n" for i in range(5)))
    stream = DirectoryStream(tmp_path, SCHEMA, batch_size=100, max_batches=1)
    assert _first_batch(stream, wait_s=1.5) is None


def test_a_slow_kafka_stream_yields_a_short_batch_after_max_delay(broker, topic):
    name = topic(1)
    broker.produce(name, [f"{i % 2},{i}.0".encode() for i in range(5)], partition=0)
    with KafkaStream(name, broker.bootstrap_servers, f"g-{name}", SCHEMA, batch_size=100, max_delay=0.3,
                     max_batches=1, assignment=[(name, 0)]) as stream:
        assert _first_batch(stream) == 5
        assert stream.position() == {f"{name}:0": 5}
