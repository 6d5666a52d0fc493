"""Clean stops of a real online trainer on a real broker: SIGTERM while the stream is idle, in
sink and non-sink mode, ends with the final checkpoint written and its position committed
(the synchronous commit used to hang while the consumer thread polled back to back), and
within `commit_timeout` even when the broker is frozen.
"""
import os
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from recstream.checkpoint import load_checkpoint

from ..data.streams.conftest import broker, own_broker, tansu_binary, topic  # noqa: F401

WORKER = Path(__file__).with_name("online_kafka_worker.py")
REPO = Path(__file__).resolve().parents[2]
N_EVENTS = 200


class Worker:
    """The trainer process; its stdout lines are collected by a thread."""

    def __init__(self, bootstrap, topic_name, group, ckpt_dir, sink, commit_timeout=60.0):
        env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
        self.proc = subprocess.Popen(
            [sys.executable, str(WORKER), bootstrap, topic_name, group, str(ckpt_dir), "1" if sink else "0",
             str(commit_timeout)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        self.lines: list[str] = []
        self._seen = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            with self._seen:
                self.lines.append(line.strip())
                self._seen.notify_all()

    def wait_for(self, line: str, timeout: float) -> bool:
        with self._seen:
            return self._seen.wait_for(lambda: line in self.lines or self.proc.poll() is not None, timeout) \
                and line in self.lines

    def stop(self, timeout: float) -> int | None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        return self.proc.stderr.read()[-3000:]


def _committed(bootstrap, topic_name, group) -> int:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        return c.committed([TopicPartition(topic_name, 0)], timeout=10)[0].offset
    finally:
        c.close()


def _events(n):
    return [f"{i % 2},{i * 0.01:.2f},1.0".encode() for i in range(n)]


@pytest.mark.parametrize("sink", [True, False])
def test_sigterm_while_idle_writes_the_final_checkpoint_commits_it_and_exits(broker, topic, tmp_path, sink):  # noqa: F811
    name, group = topic(1), f"g-{uuid.uuid4().hex[:8]}"
    broker.produce(name, _events(N_EVENTS), partition=0)
    worker = Worker(broker.bootstrap_servers, name, group, tmp_path, sink)
    try:
        assert worker.wait_for(f"trained {N_EVENTS}", 60), worker.lines
        code = worker.stop(timeout=20)  # the stream is idle now: the trainer caught up
        assert code == 0, (code, worker.lines, worker.kill())
        assert "done" in worker.lines and "closed" in worker.lines
    finally:
        worker.kill()
    files = list(tmp_path.glob("*.safetensors"))
    assert files, "no final checkpoint"
    meta = load_checkpoint(max(files, key=os.path.getmtime), restore_rng=False)
    assert meta["train_position"] == {f"{name}:0": N_EVENTS}
    assert _committed(broker.bootstrap_servers, name, group) == N_EVENTS


def test_a_frozen_broker_delays_the_stop_by_commit_timeout_at_most(own_broker, tmp_path):  # noqa: F811
    own_broker.start()
    name, group = "frozen", "g-frozen"
    own_broker.create_topic(name, 1)
    own_broker.produce(name, _events(N_EVENTS), partition=0)
    worker = Worker(own_broker.bootstrap_servers, name, group, tmp_path, sink=True, commit_timeout=2.0)
    try:
        assert worker.wait_for(f"trained {N_EVENTS}", 60), worker.lines
        own_broker.pause()
        try:
            code = worker.stop(timeout=20)  # a commit bounded by 2 s, then the exit
            assert code == 0, (code, worker.lines, worker.kill())
        finally:
            own_broker.resume()
    finally:
        worker.kill()
    files = list(tmp_path.glob("*.safetensors"))
    assert files and load_checkpoint(files[0], restore_rng=False)["train_position"] == {f"{name}:0": N_EVENTS}
