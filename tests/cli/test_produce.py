"""`recstream produce`: events with ids and times into a directory or a topic, at a chosen rate.

The Kafka test uses the stream tests' broker fixtures (tests/cli/conftest.py) and their events.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from recstream.cli import produce
from recstream.cli.errors import EXIT_USAGE, CliError
from recstream.cli.producers import DirectoryWriter, RateLimiter, append_meta, format_records
from recstream.data import Batch
from recstream.data.streams import CriteoTSVDecoder, DirectoryStream
from tests.data.streams.events import assert_same_batch, decoder, records, take_ids


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
    with pytest.raises(CliError, match="--kafka needs --topic") as e:
        _run("--synthetic --kafka 127.0.0.1:1")
    assert e.value.code == EXIT_USAGE


@pytest.mark.parametrize("argv, message", [
    ("--rate -5", "'--rate' must be a finite number >= 0, got -5.0"),
    ("--rows many", "'--rows' must be an int, got 'many'"),
    ("--file-records 0", "'--file-records' must be an int >= 1, got 0"),
])
def test_produce_rejects_bad_numbers_naming_the_option(tmp_path, capsys, argv, message):
    with pytest.raises(SystemExit):
        _run(f"--synthetic --directory {tmp_path} {argv}")
    option = argv.split()[0]
    assert f"recstream produce: error: argument {option}: {message}" in capsys.readouterr().err


def test_producers_validate_their_arguments(tmp_path):
    with pytest.raises(ValueError, match="DirectoryWriter: 'file_records' must be an int >= 1, got 0"):
        DirectoryWriter(tmp_path, "csv", file_records=0)
    with pytest.raises(TypeError, match="DirectoryWriter: 'file_records' must be an int >= 1, got '10'"):
        DirectoryWriter(tmp_path, "csv", file_records="10")
    with pytest.raises(ValueError, match="RateLimiter: 'rate' must be a finite number >= 0, got -1"):
        RateLimiter(-1)
    with pytest.raises(ValueError, match="format_records: 'fmt' must be one of"):
        format_records("xml", np.zeros(1), np.zeros((1, 0)), np.zeros((1, 0)))
    with pytest.raises(ValueError, match="append_meta: 'fmt' must be one of"):
        append_meta([b"1"], "xml", np.zeros(1), np.zeros(1))


def test_directory_writer_publishes_by_count_and_by_time(tmp_path):
    with DirectoryWriter(tmp_path, ".tsv", file_records=3, flush_interval=0) as writer:
        writer.write([b"a", b"b", b"c", b"d"])  # 3 make a file; the 4th is published at once (interval 0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["part-00000000.tsv", "part-00000001.tsv"]
    assert (tmp_path / "part-00000001.tsv").read_bytes() == b"d\n" and writer.count == 4


def test_rate_paces_from_the_first_event(tmp_path):
    """The rate's clock starts when the first events are ready, not at process start: the seconds
    spent importing torch and making the first block used to be sent as one burst."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-m", "recstream", "produce", "--synthetic", "--rows", "300", "--rate",
                             "1000", "--num-dense", "1", "--num-categorical", "1", "--directory", str(tmp_path)],
                            capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 0, result.stderr
    times = [float(line.rsplit(",", 1)[1]) for p in tmp_path.iterdir() for line in p.read_text().splitlines()]
    assert len(times) == 300 and max(times) - min(times) >= 0.25, max(times) - min(times)  # 300 at 1000/s


def _synthetic_lines(tmp_path, capsys, name: str, extra: str = "") -> tuple[list[bytes], str]:
    """The lines a synthetic run wrote (no meta fields) and its final line."""
    out = tmp_path / name
    assert _run(f"--synthetic --rows 50 --num-dense 2 --num-categorical 3 --no-meta --directory {out} {extra}") == 0
    return (out / "part-00000000.csv").read_bytes().splitlines(), capsys.readouterr().out.strip()


def _generated(truth_seed: int, rows_seed: int) -> list[bytes]:
    """The first 50 rows `SyntheticCTR(seed=truth_seed)` draws at the rows seed's batch."""
    from recstream.data import SyntheticCTR
    gen = SyntheticCTR(2, 3, seed=truth_seed, batch_size=4096)
    features, labels = next(iter(gen.train_batches(1, start=rows_seed * produce.ROWS_STRIDE)))
    ids = features.values.view(features.num_features, features.batch_size).T.numpy()
    return format_records("csv", labels.numpy(), features.dense.numpy(), ids, names=list(gen.schema.columns))[:50]


def test_synthetic_rows_differ_per_run_and_the_seed_repeats_them_from_the_same_truth(tmp_path, capsys):
    first, line1 = _synthetic_lines(tmp_path, capsys, "a")
    second, line2 = _synthetic_lines(tmp_path, capsys, "b")
    assert first != second  # without --seed, a new run is new rows
    seed1 = int(line1.split("--seed ")[1].split()[0])
    assert line1.endswith(f"--seed {seed1} --truth-seed 0")
    again, line3 = _synthetic_lines(tmp_path, capsys, "c", f"--seed {seed1}")  # the printed seed repeats them
    assert again == first and line3.endswith(f"--seed {seed1} --truth-seed 0")
    # --seed picks rows of the same hidden truth (truth seed 0); --truth-seed changes the truth
    assert _synthetic_lines(tmp_path, capsys, "d", "--seed 7")[0] == _generated(0, 7)
    assert _synthetic_lines(tmp_path, capsys, "e", "--seed 8")[0] == _generated(0, 8) != _generated(0, 7)
    assert _synthetic_lines(tmp_path, capsys, "f", "--seed 7 --truth-seed 3")[0] == _generated(3, 7)
    assert _generated(3, 7) != _generated(0, 7)
    with pytest.raises(SystemExit):
        _run(f"--synthetic --seed -1 --directory {tmp_path / 'g'}")
    assert "'--seed' must be an int >= 0" in capsys.readouterr().err
