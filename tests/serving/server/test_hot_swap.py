"""Hot swap under load: a real `recstream serve` process, concurrent clients, versions published meanwhile."""
import http.client
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from recstream.serving import SnapshotWriter

from ..helpers import CONFIG, SCHEMA, build, make_batch, new_model, train_step

REPO = Path(__file__).resolve().parents[3]
INSTANCES = [{"x0": 0.3, "x1": -0.2, "user": u, "item": 3, "tags": [1]} for u in ("alice", 17, "bob")]
CLIENTS, MAX_REQUESTS_PER_CLIENT, DEADLINE_S = 4, 4000, 240


def wait_for(condition, timeout, what):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def get(port, path):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


@pytest.fixture
def server_process(tmp_path):
    directory = tmp_path / "models"
    directory.mkdir()
    log = open(tmp_path / "server.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "recstream.cli.serve", str(directory), "--port", "0", "--poll-seconds", "0.05",
         "--model-factory", "tests.serving.helpers:build", "--torch-threads", "1", "--log-level", "WARNING"],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE, stderr=log, text=True)
    lines = queue.Queue()
    threading.Thread(target=lambda: lines.put(proc.stdout.readline()), daemon=True).start()
    try:
        line = lines.get(timeout=120)
    except queue.Empty:
        proc.kill()
        raise AssertionError("server did not report its port: " + (tmp_path / "server.log").read_text()) from None
    assert "listening on http://127.0.0.1:" in line, line
    port = int(line.split("http://127.0.0.1:")[1].split()[0])
    yield directory, port, proc
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=30)
    log.close()


class Client(threading.Thread):
    """Sends /predict requests on one keep-alive connection until told to stop (or its bounds)."""

    def __init__(self, port, stop):
        super().__init__(daemon=True)
        self.port, self.stop = port, stop
        self.results, self.failures = [], []  # results: (version, scores)

    def run(self):
        body = json.dumps({"instances": INSTANCES})
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        end = time.monotonic() + DEADLINE_S
        for _ in range(MAX_REQUESTS_PER_CLIENT):
            if self.stop.is_set() or time.monotonic() > end:
                break
            try:
                conn.request("POST", "/predict", body=body, headers={"Content-Type": "application/json"})
                resp = conn.getresponse()
                payload = json.loads(resp.read())
                if resp.status != 200:
                    self.failures.append((resp.status, payload))
                    continue
                self.results.append((payload["version"], tuple(payload["scores"])))
            except Exception as e:  # any transport error is a failed request
                self.failures.append(repr(e))
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        conn.close()


def test_versions_swap_under_load_without_failed_requests(server_process):
    directory, port, proc = server_process
    assert get(port, "/health")[0] == 503  # started on an empty directory
    net, opt = new_model()
    rng = np.random.default_rng(21)
    writer = SnapshotWriter(directory, SCHEMA, model_factory=build, model_config=CONFIG, full_every=3, keep=2)
    train_step(net, opt, make_batch(rng))
    writer.publish(net, step=1)
    wait_for(lambda: get(port, "/health") == (200, {"status": "ok", "version": 1}), 120, "version 1 to be served")

    stop = threading.Event()
    clients = [Client(port, stop) for _ in range(CLIENTS)]
    for c in clients:
        c.start()
    try:
        for version in range(2, 6):  # 4 more versions: deltas 2, 3, full 4, delta 5
            wait_for(lambda v=version: sum(r[0] == v - 1 for c in clients for r in c.results) >= 5, 120,
                     f"clients to be served by version {version - 1}")
            train_step(net, opt, make_batch(rng, batch_size=8))  # a few rows change: deltas stay deltas
            assert writer.publish(net, step=version)["version"] == version
        wait_for(lambda: sum(r[0] == 5 for c in clients for r in c.results) >= 5, 120, "version 5 to be served")
    finally:
        stop.set()
        for c in clients:
            c.join(timeout=60)

    assert [f for c in clients for f in c.failures] == []
    results = [r for c in clients for r in c.results]
    assert len(results) >= 25
    for c in clients:  # each client only ever moves forward
        versions = [v for v, _ in c.results]
        assert versions == sorted(versions)
    by_version = {}
    for version, scores in results:
        by_version.setdefault(version, set()).add(scores)
    assert set(by_version) == {1, 2, 3, 4, 5}
    assert all(len(s) == 1 for s in by_version.values())  # one version = one model, never a mix
    assert by_version[1] != by_version[5]  # the swapped-in models really differ
    status, info = get(port, "/version")
    assert status == 200 and info["version"] == 5 and info["kind"] == "delta" and info["base"] == 4

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
