"""`recstream online CONFIG.yaml` as a real process: on a real Kafka-protocol broker (every event
trained exactly once, offsets committed), and stopped by SIGTERM / SIGINT on an unbounded
directory stream (documented exit status, final checkpoint at the stop, nothing trained twice
after a restart). The events are written as `recstream produce` writes them (by the command into
Kafka, by its DirectoryWriter into the followed directory)."""
from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid

import numpy as np
import pytest
from safetensors import safe_open

from recstream.checkpoint import load_checkpoint
from recstream.cli.errors import EXIT_INTERRUPTED, EXIT_TERMINATED, EXIT_USAGE
from recstream.cli.main import main
from recstream.cli.producers import DirectoryWriter, format_records

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
BATCH = 50

# SyntheticCTR(2, 2)'s columns (what `recstream produce --synthetic --num-dense 2 --num-categorical 2`
# writes, with event_id / event_time appended); the source is filled in per test
CONFIG = """run_dir: run
schema:
  dense: [I1, I2]
  categorical:
    - {name: C1, vocab_size: 100, embedding_dim: 4}
    - {name: C2, vocab_size: 1000, embedding_dim: 4}
stream:
SOURCE
  batch_size: 50
  id_column: event_id
  time_column: event_time
model:
  type: deepfm
  hidden: [8]
train:
  sink_mode: true
  sink_size: 1
  threads: 1
callbacks:
  checkpoint:
    every_steps: 1000
    keep: 2
  prequential:
    window: 500
    log_every: 5
"""
PRODUCE = ["produce", "--synthetic", "--num-dense", "2", "--num-categorical", "2"]


def cli(cwd, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", "recstream", *argv], capture_output=True, text=True,
                            timeout=timeout, env=ENV, cwd=cwd)
    assert "Traceback" not in result.stderr, result.stderr
    return result


def start(cwd, *argv: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "recstream", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=ENV, cwd=cwd)


def json_line(stdout: str) -> dict:
    lines = stdout.strip().splitlines()
    assert len(lines) == 1, stdout
    return json.loads(lines[0])


def metric_rows(run) -> list[dict]:
    path = run / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def newest_checkpoint(run) -> dict:
    files = sorted((run / "checkpoints").iterdir(), key=lambda p: p.stat().st_mtime)
    return load_checkpoint(files[-1], restore_rng=False)


def leftovers(root) -> list[str]:
    return [os.path.join(d, n) for d, dirs, files in os.walk(root) for n in dirs + files if ".tmp" in n]


# --- signals ---------------------------------------------------------------------------------
def lines_before(directory, position: dict) -> int:
    """Events in the files of `directory` before a DirectoryStream position (file, byte offset)."""
    n = 0
    for name in sorted(os.listdir(directory)):
        data = (directory / name).read_bytes()
        if position["file"] is not None and name == position["file"]:
            return n + data[:position["offset"]].count(b"\n")
        n += data.count(b"\n")
    return n


class Events(threading.Thread):
    """An unbounded source: 1000 events/s into `directory` (files of 200), until `stop()`; the events
    are written as `recstream produce` writes them, with the DirectoryWriter it uses."""

    def __init__(self, directory):
        super().__init__(daemon=True)
        self.writer = DirectoryWriter(directory, "csv", file_records=200, flush_interval=0.1)
        self._done = threading.Event()
        self.sent = 0

    def run(self):
        rng = np.random.default_rng(0)
        while not self._done.wait(0.02):
            n, ids = 20, np.arange(self.sent, self.sent + 20)
            labels = rng.integers(0, 2, n).astype(float)
            cats = np.stack([rng.integers(0, 100, n), rng.integers(0, 1000, n)], axis=1)
            self.writer.write(format_records("csv", labels, rng.normal(size=(n, 2)), cats, event_ids=ids,
                                             times=np.full(n, time.time())))
            self.sent += n

    def stop(self):
        self._done.set()
        self.join(10)
        self.writer.close()


@pytest.mark.parametrize("sig, code, word", [(signal.SIGTERM, EXIT_TERMINATED, "terminated"),
                                             (signal.SIGINT, EXIT_INTERRUPTED, "interrupted")])
def test_a_signal_stops_online_at_a_checkpoint_and_a_restart_trains_each_event_once(tmp_path, sig, code, word):
    events, run = tmp_path / "events", tmp_path / "run"
    events.mkdir()
    (tmp_path / "c.yaml").write_text(CONFIG.replace("SOURCE", "  directory: {path: events, format: csv, "
                                                              "poll_interval: 0.05}") + "publish: {}\n")
    source = Events(events)  # events keep arriving, and the config has no idle_timeout
    source.start()
    online = start(tmp_path, "online", "c.yaml", "--json")
    try:
        deadline = time.monotonic() + 60
        while not any(r["step"] >= 10 for r in metric_rows(run)):
            assert online.poll() is None and time.monotonic() < deadline, online.stderr.read() if online.poll() else ""
            time.sleep(0.05)
        online.send_signal(sig)
        out, err = online.communicate(timeout=30)
    finally:
        online.kill()
        source.stop()
    assert "Traceback" not in err, err
    assert online.returncode == code, err
    assert err.strip().splitlines()[-1].startswith(f"recstream online: {word}"), err
    first = json_line(out)
    assert first["status"] == word
    # the final checkpoint is at the step it stopped, with the position after that step's batch
    meta = newest_checkpoint(run)
    steps = meta["cur_step_num"]
    assert steps == first["steps"] >= 10 and meta["train_position"] == first["position"]
    assert json.loads((run / "stream_position.json").read_text())["position"] == first["position"]
    assert lines_before(events, first["position"]) == steps * BATCH == metric_rows(run)[-1]["events"]
    assert first["published"]["step"] == steps  # and the final model version for serving
    assert leftovers(tmp_path) == [] and not [n for n in os.listdir(run / "published") if n.startswith(".")]

    total = sum(p.read_bytes().count(b"\n") for p in events.iterdir())
    assert total == source.sent > steps * BATCH  # it stopped mid-stream: events went on arriving
    (tmp_path / "c.yaml").write_text((tmp_path / "c.yaml").read_text().replace(
        "  batch_size: 50\n", "  batch_size: 50\n  idle_timeout: 1\n"))
    second = json_line(cli(tmp_path, "online", "c.yaml", "--json").stdout)
    assert second["status"] == "ok" and second["resumed_from_step"] == steps
    rest = total - steps * BATCH
    # the events after the checkpoint, each once; the prequential count goes on from the checkpoint's
    # (it started at 0 again after a restart, and prequential.png went back)
    assert second["metrics"]["events"] == steps * BATCH + rest == total
    assert second["steps"] == steps + -(-rest // BATCH)
    assert lines_before(events, second["position"]) == total


# --- Kafka -----------------------------------------------------------------------------------
def kafka_config(bootstrap: str, topic_name: str, group: str) -> str:
    # explicit partitions: no group join to wait for, and the offsets are still committed to `group`
    source = (f"  kafka: {{topics: {topic_name}, bootstrap_servers: '{bootstrap}', group_id: {group}, "
              "partitions: [0, 1]}")
    return CONFIG.replace("SOURCE", source).replace("  batch_size: 50\n", "  batch_size: 50\n  idle_timeout: 1\n")


def committed_and_end(bootstrap: str, topic_name: str, group: str, events: int) -> tuple[dict, dict]:
    """The group's committed offsets, and each partition's end offset, found by reading all `events`
    records (the broker's high watermark is not exact), as ``{"topic:partition": offset}``."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{group}-reader", "enable.auto.commit": False})
    try:
        c.assign([TopicPartition(topic_name, p, OFFSET_BEGINNING) for p in (0, 1)])
        end, seen, deadline = {}, 0, time.monotonic() + 30
        while seen < events and time.monotonic() < deadline:
            for msg in c.consume(1000, timeout=0.5):
                if msg.error() is None:
                    key = f"{topic_name}:{msg.partition()}"
                    end[key], seen = max(end.get(key, 0), msg.offset() + 1), seen + 1
    finally:
        c.close()
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        tps = [TopicPartition(topic_name, p) for p in (0, 1)]
        committed = {f"{topic_name}:{tp.partition}": tp.offset for tp in c.committed(tps, timeout=10)
                     if tp.offset >= 0}
    finally:
        c.close()
    assert seen == events, (seen, events)
    return committed, end


def test_online_on_kafka_trains_every_event_exactly_once(broker, tmp_path):  # noqa: F811 - fixture
    t, group, run = f"t-{uuid.uuid4().hex[:10]}", f"g-{uuid.uuid4().hex[:8]}", tmp_path / "run"
    kafka = ["--kafka", broker.bootstrap_servers, "--topic", t]
    # in this process (torch is imported already); paced, so that librdkafka's sticky partitioner
    # spreads the events over both partitions
    assert main([*PRODUCE, "--rows", "600", "--rate", "3000", "--partitions", "2", *kafka]) == 0
    (tmp_path / "c.yaml").write_text(kafka_config(broker.bootstrap_servers, t, group))
    first = json_line(cli(tmp_path, "online", "c.yaml", "--json").stdout)
    committed, end = committed_and_end(broker.bootstrap_servers, t, group, 600)
    assert len(end) == 2  # both partitions hold events
    assert first["steps"] == 600 // BATCH and first["metrics"]["events"] == 600
    assert committed == end == first["position"] == newest_checkpoint(run)["train_position"]

    # 120 more: a second run trains those only (the last batch short, at the idle end)
    assert main([*PRODUCE, "--rows", "120", "--id-start", "600", *kafka]) == 0
    second = json_line(cli(tmp_path, "online", "c.yaml", "--json").stdout)
    committed, end = committed_and_end(broker.bootstrap_servers, t, group, 720)
    assert second["resumed_from_step"] == 12
    assert second["steps"] == 15 and second["metrics"]["events"] == 600 + 120  # the count goes on
    assert committed == end == second["position"] == newest_checkpoint(run)["train_position"]


def test_a_kafka_source_without_the_client_names_the_extra(tmp_path):
    (tmp_path / "c.yaml").write_text(kafka_config("127.0.0.1:1", "clicks", "g"))
    # the import of confluent_kafka fails as it does where the extra is not installed
    code = ("import sys; sys.modules['confluent_kafka'] = None; from recstream.cli.main import main; "
            "sys.exit(main(['online', 'c.yaml']))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=ENV,
                            cwd=tmp_path)
    assert result.returncode == EXIT_USAGE and "Traceback" not in result.stderr, result.stderr
    line = CONFIG.splitlines().index("SOURCE") + 1
    assert result.stderr.strip() == (f"recstream online: c.yaml:{line}: stream.kafka: KafkaStream needs the Kafka "
                                     "client: pip install 'recstream[kafka]' (confluent-kafka)")
    assert not (tmp_path / "run").exists()


# --- a scheduled rerun with nothing new ------------------------------------------------------
def test_a_rerun_with_no_new_events_trains_0_steps_changes_nothing_and_exits_0(tmp_path):
    events, run = tmp_path / "events", tmp_path / "run"
    events.mkdir()
    writer = DirectoryWriter(events, "csv", file_records=200, flush_interval=0.1)
    rng = np.random.default_rng(0)
    writer.write(format_records("csv", rng.integers(0, 2, 120).astype(float), rng.normal(size=(120, 2)),
                                np.stack([rng.integers(0, 100, 120), rng.integers(0, 1000, 120)], axis=1),
                                event_ids=np.arange(120), times=np.full(120, time.time())))
    writer.close()
    (tmp_path / "c.yaml").write_text(CONFIG.replace("SOURCE", "  directory: {path: events, format: csv, "
                                                              "poll_interval: 0.05}")
                                     .replace("  batch_size: 50\n", "  batch_size: 50\n  idle_timeout: 0.3\n"))
    first = json_line(cli(tmp_path, "online", "c.yaml", "--json").stdout)
    assert first["steps"] == 3  # 50, 50 and the remainder of 20
    files = {p.name: p.stat().st_mtime_ns for p in (run / "checkpoints").iterdir()}
    committed = (run / "stream_position.json").stat().st_mtime_ns
    rows = metric_rows(run)

    second = cli(tmp_path, "online", "c.yaml", "--json")  # the next scheduled run: nothing new has arrived
    assert second.returncode == 0, second.stderr
    line = second.stderr.strip().splitlines()[-1]  # with --json the human line goes to stderr
    assert line.startswith("recstream online: nothing new: 0 steps (still at step 3)"), line
    assert "no new checkpoint" in line and "prequential" not in line  # no scores of an earlier run
    result = json_line(second.stdout)
    assert result["status"] == "ok" and result["resumed_from_step"] == result["steps"] == 3
    assert result["new_steps"] == 0 and result["checkpoint"] is None and result["metrics"] == {}
    assert result["position"] == first["position"]
    assert {p.name: p.stat().st_mtime_ns for p in (run / "checkpoints").iterdir()} == files
    assert (run / "stream_position.json").stat().st_mtime_ns == committed and metric_rows(run) == rows


# --- a torn metrics row ----------------------------------------------------------------------
def write_events(events, first: int, n: int) -> None:
    writer = DirectoryWriter(events, "csv", file_records=200, flush_interval=0.1)
    rng = np.random.default_rng(first)
    writer.write(format_records("csv", rng.integers(0, 2, n).astype(float), rng.normal(size=(n, 2)),
                                np.stack([rng.integers(0, 100, n), rng.integers(0, 1000, n)], axis=1),
                                event_ids=np.arange(first, first + n), times=np.full(n, time.time())))
    writer.close()


def test_a_torn_metrics_row_is_repaired_and_the_run_resumes(tmp_path):
    """A run killed mid-write leaves metrics.jsonl with a torn last line: the next `recstream online`
    cuts it off (a warning on stderr and in online.log), resumes and appends its rows after the whole ones."""
    events, run = tmp_path / "events", tmp_path / "run"
    events.mkdir()
    write_events(events, 0, 300)
    (tmp_path / "c.yaml").write_text(CONFIG.replace("SOURCE", "  directory: {path: events, format: csv, "
                                                              "poll_interval: 0.05}")
                                     .replace("  batch_size: 50\n", "  batch_size: 50\n  idle_timeout: 0.3\n"))
    first = json_line(cli(tmp_path, "online", "c.yaml", "--json").stdout)
    rows = metric_rows(run)
    assert first["steps"] == 6 and [r["step"] for r in rows] == [5, 6]
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 7, "auc": 0.6')  # the row a killed run was writing
    write_events(events, 300, 250)
    second = cli(tmp_path, "online", "c.yaml", "--json")
    assert second.returncode == 0, second.stderr
    assert "metrics.jsonl:3: removed a torn last line" in second.stderr
    assert "removed a torn last line" in (run / "online.log").read_text()
    assert json_line(second.stdout)["steps"] == 11
    # the reports go on every log_every (5) steps of the whole stream, and at the end
    assert [r["step"] for r in metric_rows(run)] == [5, 6, 10, 11]


# --- micro-steps -----------------------------------------------------------------------------
def dense_optimizer_steps(run) -> set[float]:
    """The step counts of the dense (Adam) parameters in the newest checkpoint: one per optimizer step."""
    path = sorted((run / "checkpoints").iterdir(), key=lambda p: p.stat().st_mtime)[-1]
    with safe_open(path, "pt") as f:
        return {float(f.get_tensor(k)) for k in f.keys() if k.startswith("optimizer.") and k.endswith(".step")}


@pytest.mark.parametrize("micro, optimizer_steps", [(None, 3), (20, 7)])
def test_stream_micro_batch_size_trains_each_batch_as_steps_of_that_many_rows(tmp_path, micro, optimizer_steps):
    events, run = tmp_path / "events", tmp_path / "run"
    events.mkdir()
    write_events(events, 0, 120)  # batches of 50, 50 and 20; with micro-steps of 20: 3 + 3 + 1 steps
    key = "" if micro is None else f"  micro_batch_size: {micro}\n"
    (tmp_path / "c.yaml").write_text(CONFIG.replace("SOURCE", "  directory: {path: events, format: csv, "
                                                              "poll_interval: 0.05}")
                                     .replace("  batch_size: 50\n", f"  batch_size: 50\n{key}  idle_timeout: 0.3\n"))
    result = json_line(cli(tmp_path, "online", "c.yaml", "--json").stdout)
    assert result["steps"] == 3 and result["metrics"]["events"] == 120  # counted and scored per batch
    assert dense_optimizer_steps(run) == {float(optimizer_steps)}


@pytest.mark.parametrize("value, words", [("0", "greater than 0"), ("2.5", "got 2.5"), ("many", "got 'many'")])
def test_a_bad_micro_batch_size_is_a_config_mistake_naming_the_key(tmp_path, value, words):
    (tmp_path / "events").mkdir()
    text = CONFIG.replace("SOURCE", "  directory: {path: events, format: csv}").replace(
        "  batch_size: 50\n", f"  batch_size: 50\n  micro_batch_size: {value}\n")
    (tmp_path / "c.yaml").write_text(text)
    result = cli(tmp_path, "online", "c.yaml")
    assert result.returncode == EXIT_USAGE, result.stderr
    line = next(i for i, s in enumerate(text.splitlines(), 1) if "micro_batch_size" in s)
    message = result.stderr.strip()
    assert message.startswith(f"recstream online: c.yaml:{line}: stream.micro_batch_size:"), message
    assert words in message, message
    assert not (tmp_path / "run").exists()


# --- prequential totals across a SIGKILL -----------------------------------------------------
SCORES = ("step", "events", "window_events", "auc", "logloss", "auc_total", "logloss_total")


def test_sigkill_and_a_resume_continue_the_prequential_totals_as_if_it_never_stopped(tmp_path):
    """Killed mid-stream (SIGKILL: no final checkpoint), resumed by the same command: metrics.csv's
    rows are those of a run that never stopped, totals included (they began at 0 again, and the
    events after the checkpoint were counted twice or not at all)."""
    events, run = tmp_path / "events", tmp_path / "run"
    events.mkdir()
    write_events(events, 0, 600)  # 12 batches; checkpoints at steps 5 and 10
    config = CONFIG.replace("SOURCE", "  directory: {path: events, format: csv, poll_interval: 0.05}") \
        .replace("every_steps: 1000", "every_steps: 5").replace("log_every: 5", "log_every: 2")
    (tmp_path / "c.yaml").write_text(config)  # no idle_timeout: it waits for more events
    online = start(tmp_path, "online", "c.yaml")
    try:
        deadline = time.monotonic() + 120
        while not any(r["step"] == 12 for r in metric_rows(run)):
            assert online.poll() is None and time.monotonic() < deadline, online.stderr.read() if online.poll() else ""
            time.sleep(0.05)
    finally:
        online.send_signal(signal.SIGKILL)
        online.wait(timeout=30)
    assert newest_checkpoint(run)["cur_step_num"] == 10  # steps 11 and 12 are trained again
    write_events(events, 600, 400)
    finite = config.replace("  batch_size: 50\n", "  batch_size: 50\n  idle_timeout: 1\n")
    (tmp_path / "c.yaml").write_text(finite)
    resumed = json_line(cli(tmp_path, "online", "c.yaml", "--json").stdout)
    assert resumed["resumed_from_step"] == 10 and resumed["steps"] == 20

    whole = tmp_path / "whole"  # the same events, in one run that never stopped
    whole.mkdir()
    (whole / "c.yaml").write_text(finite)
    shutil.copytree(events, whole / "events")
    assert json_line(cli(whole, "online", "c.yaml", "--json").stdout)["steps"] == 20
    got = [{k: r[k] for k in SCORES} for r in metric_rows(run)]
    want = [{k: r[k] for k in SCORES} for r in metric_rows(whole / "run")]
    assert [r["step"] for r in got] == list(range(2, 21, 2)) and got[-1]["events"] == 1000
    assert got == want
    with open(run / "metrics.csv") as f:  # the plotted file: the totals' line goes on
        rows = list(csv.DictReader(f))
    assert [float(r["logloss_total"]) for r in rows] == [r["logloss_total"] for r in want]

