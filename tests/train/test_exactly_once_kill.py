"""Exactly once under SIGKILL: a real training process is killed at random moments, restarted
from its last durable checkpoint each time, and every event ends up trained exactly once.

What is checked is the surviving history: the trained-count of each event lives in the model's
own state, so whatever a killed process trained after its last checkpoint is rolled back with it.
With micro-steps (each batch of 24 trained as steps of 5 rows), the kills land between two
micro-steps of one batch, and every durable checkpoint must hold whole batches only.
"""
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from recstream.callbacks import load_checkpoint

from .online_kill_worker import BATCH, CountingNet

WORKER = Path(__file__).with_name("online_kill_worker.py")
REPO = Path(__file__).resolve().parents[2]
N_EVENTS, FILES = 6000, 6  # 250 batches of 24 (straddling files), 125 sinks of 2


def _write_events(data_dir: Path) -> None:
    rng = np.random.default_rng(0)
    per_file = N_EVENTS // FILES
    for f in range(FILES):
        ids = np.arange(f * per_file, (f + 1) * per_file)
        x = rng.standard_normal((per_file, 2))
        label = (x[:, 0] > 0).astype(int)
        lines = "".join(f"{y},{i},{a:.4f},{b:.4f}\n" for y, i, (a, b) in zip(label, ids, x, strict=True))
        tmp = data_dir / f".part-{f:04d}.csv.tmp"
        tmp.write_text(lines)
        os.rename(tmp, data_dir / f"part-{f:04d}.csv")


def _start(data_dir, ckpt_dir, micro=None):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    extra = [] if micro is None else [str(micro)]
    return subprocess.Popen([sys.executable, str(WORKER), str(data_dir), str(ckpt_dir), str(N_EVENTS), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _latest_position(ckpt_dir: Path):
    files = sorted(ckpt_dir.glob("*.safetensors"), key=os.path.getmtime)
    if not files:
        return None
    net = CountingNet(N_EVENTS)
    position = load_checkpoint(files[-1], net, restore_rng=False)["train_position"]
    trained = net.trained.numpy()
    done = int(trained.sum())  # whole batches, each event once, in order: no batch half-trained
    assert done % BATCH == 0 and (trained[:done] == 1).all() and (trained[done:] == 0).all(), (
        f"{files[-1].name} holds a partly trained batch: {done} events, counts {np.bincount(trained)}")
    return position


def _key(position):
    return (position["file"] or "", position["offset"])


@pytest.mark.parametrize("micro", [None, 5], ids=["one-step-per-batch", "micro-steps"])
def test_sigkill_at_random_moments_trains_every_event_exactly_once(tmp_path, micro):
    data_dir, ckpt_dir = tmp_path / "data", tmp_path / "ckpt"
    data_dir.mkdir(), ckpt_dir.mkdir()
    _write_events(data_dir)
    rng = random.Random(1234)
    kills, last_step = 0, 0
    while kills < 6:
        proc = _start(data_dir, ckpt_dir, micro)
        target = last_step + rng.randint(5, 25)  # a random number of steps into this life
        deadline = time.monotonic() + 60
        step, finished = last_step, False
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            if line.startswith("done"):
                finished = True
                break
            if line.startswith("mid"):  # micro-steps: a batch is half-trained; it pauses on every 7th
                if step >= target and (int(line.split()[1]) // BATCH) % 7 == 3:
                    break  # killed between two micro-steps of one batch
                continue
            step = int(line.split()[1])
            if step >= target and micro is None:
                time.sleep(rng.random() * 0.05)  # and a random moment inside the step
                break
        if finished:
            break
        assert proc.poll() is None, proc.stderr.read()
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        kills += 1
        last_step = step
        commit_file = ckpt_dir / "committed.json"
        committed = json.loads(commit_file.read_text())["position"] if commit_file.exists() else None
        durable = _latest_position(ckpt_dir)
        if committed is not None:  # the source never learns of a position no checkpoint holds
            assert durable is not None and _key(committed) <= _key(durable)
    assert kills >= 5, f"training finished after only {kills} kills; make the data larger"

    proc = _start(data_dir, ckpt_dir, micro)  # the last life runs to completion
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert "done" in out
    final = sorted(ckpt_dir.glob("*.safetensors"), key=os.path.getmtime)[-1]
    net = CountingNet(N_EVENTS)
    load_checkpoint(final, net, restore_rng=False)
    trained = net.trained.numpy()
    assert (trained == 1).all(), (f"lost: {np.flatnonzero(trained == 0)[:10]}, "
                                  f"duplicated: {np.flatnonzero(trained > 1)[:10]}")
