"""`recstream produce`: events with ids and times into a directory or a topic, at a chosen rate."""
from __future__ import annotations

import argparse
import os
import time

import pytest
import torch

from recstream.cli import produce
from recstream.data import Batch
from recstream.data.streams import CriteoTSVDecoder, DirectoryStream

from .events import assert_same_batch, decoder, records, take_ids


def _run(argv: str) -> int:
    parser = argparse.ArgumentParser(prog="recstream")
    produce.add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["produce", *argv.split()])
    return args.run(args)


def test_synthetic_criteo_events_into_a_directory(tmp_path, capsys):
    before = time.time()
    assert _run(f"--synthetic --rows 2500 --format criteo --directory {tmp_path} --file-records 1000") == 0
    after = time.time()
    assert "2500 events" in capsys.readouterr().out
    assert sorted(os.listdir(tmp_path)) == ["part-00000000.tsv", "part-00000001.tsv", "part-00000002.tsv"]
    dec = CriteoTSVDecoder(1000, id_column="event_id", time_column="event_time")
    stream = DirectoryStream(tmp_path, batch_size=500, format="criteo", decoder=dec, idle_timeout=0.3)
    times = []
    ids = []
    for _ in stream:
        ids += stream.last_batch_meta()["ids"].tolist()
        times += stream.last_batch_meta()["event_time"].tolist()
    assert ids == list(range(2500)) and stream.bad_records == {}
    assert before - 1e-3 <= min(times) and max(times) <= after + 1e-3
    # a second run continues the numbering of files, so its files sort after the first run's
    _run(f"--synthetic --rows 10 --format criteo --directory {tmp_path} --file-records 1000 --id-start 2500")
    assert take_ids(stream) == list(range(2500, 2510))


def test_rate_limit_paces_the_events(tmp_path):
    start = time.monotonic()
    _run(f"--synthetic --rows 1500 --num-dense 2 --num-categorical 3 --directory {tmp_path} --rate 3000")
    elapsed = time.monotonic() - start
    assert elapsed >= 0.45, f"1500 events at 3000/s took only {elapsed:.2f} s"


def test_a_file_into_kafka_with_ids_and_times(broker, topic, tmp_path):
    from recstream.data.streams import KafkaStream  # needs confluent-kafka (the broker fixture checks)
    t = topic(2)
    src = tmp_path / "events.jsonl"
    src.write_bytes(b"\n".join(records(300, fmt="jsonl", meta=False)) + b"\n")
    before = time.time()
    _run(f"--input {src} --input-format jsonl --kafka {broker.bootstrap_servers} --topic {t} --id-start 1000")
    with KafkaStream(t, broker.bootstrap_servers, "g-produce", batch_size=100, decoder=decoder("jsonl"),
                     assignment=[(t, 0), (t, 1)], idle_timeout=15) as s:
        ids, times, batches = [], [], []
        for batch in s:
            batches.append(batch)
            ids += s.last_batch_meta()["ids"].tolist()
            times += s.last_batch_meta()["event_time"].tolist()
            if len(ids) >= 300:
                break
    assert sorted(ids) == list(range(1000, 1300)) and s.bad_records == {}
    assert min(times) >= before - 1e-3 and max(times) <= time.time()
    # the records are the file's lines plus the meta fields: the features are the file's
    got = Batch.concat(batches).take(torch.tensor(ids).argsort())
    assert_same_batch(got, decoder("jsonl").decode(records(300, fmt="jsonl")).batch)


def test_produce_needs_a_topic_with_kafka():
    with pytest.raises(SystemExit):
        _run("--synthetic --kafka 127.0.0.1:1")
