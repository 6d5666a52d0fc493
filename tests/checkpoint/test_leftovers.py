"""Crash leftovers: a save killed mid-write leaves a hidden ``.<name>.<random>.tmp`` file (one
file checkpoints) or a ``<name>.partial`` directory (sharded checkpoints, hybrid_parallel), and
a kill while a sharded checkpoint replaced one of its own name leaves ``<name>.old``. Retention
removes those of the checkpoint series that are older than the newest complete checkpoint, and
never one written since (a save that may still be running)."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from recstream import Model
from recstream.callbacks import CheckpointConfig, ModelCheckpoint

ROOT = Path(__file__).resolve().parents[2]


def _train(directory, prefix="CKP", steps=2):
    torch.manual_seed(0)
    net = torch.nn.Linear(3, 1)
    data = [(torch.randn(4, 3), torch.randn(4, 1)) for _ in range(steps)]
    ckpt = ModelCheckpoint(prefix, directory, CheckpointConfig(save_checkpoint_steps=1, keep_checkpoint_max=2))
    Model(net, torch.nn.MSELoss(), torch.optim.SGD(net.parameters(), lr=0.1)).train(1, data, callbacks=[ckpt],
                                                                                     dataset_sink_mode=False)
    return ckpt


def _age(path, seconds):
    t = time.time() - seconds
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            os.utime(os.path.join(root, name), (t, t))
    os.utime(path, (t, t))


def test_stale_leftovers_of_the_series_are_removed_and_fresh_or_foreign_ones_kept(tmp_path):
    stale_tmp = tmp_path / ".CKP-1_7.safetensors.k3j2h1.tmp"
    stale_tmp.write_bytes(b"half a checkpoint")
    stale_partial = tmp_path / "CKP_1-2_3.partial"
    stale_partial.mkdir()
    (stale_partial / "shard-00001-model-00001-of-00001.safetensors").write_bytes(b"rows")
    stale_old = tmp_path / "CKP-1_1.old"
    stale_old.mkdir()
    (stale_old / "recstream_checkpoint.json").write_text("{}")
    foreign_tmp = tmp_path / ".notes.txt.abc.tmp"  # not a checkpoint of this series
    foreign_tmp.write_bytes(b"x")
    other_series = tmp_path / "OTHER-1_1.partial"
    other_series.mkdir()
    for p in (stale_tmp, stale_partial, stale_old, foreign_tmp, other_series):
        _age(p, 3600)
    running = tmp_path / ".CKP-1_9.safetensors.zzz.tmp"  # written after the newest checkpoint: keep
    running.write_bytes(b"being written")
    future = time.time() + 3600
    os.utime(running, (future, future))

    ckpt = _train(tmp_path)
    assert Path(ckpt.latest_ckpt_file_name).exists()
    assert not stale_tmp.exists() and not stale_partial.exists() and not stale_old.exists()
    assert foreign_tmp.exists() and other_series.exists() and running.exists()


_KILLED_WRITER = """
import sys, torch
from recstream.checkpoint import save_checkpoint
net = torch.nn.Linear(4096, 4096)  # 64 MB: a write takes long enough to be killed in it
while True:
    save_checkpoint(sys.argv[1], net, rng=False)
"""


def test_a_save_killed_by_sigkill_leaves_a_tmp_file_that_retention_removes(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_WRITER, str(tmp_path / "CKP-1_1.safetensors")], env=env)
    try:
        deadline = time.monotonic() + 120
        while not list(tmp_path.glob(".CKP-1_1.safetensors.*.tmp")):
            assert proc.poll() is None and time.monotonic() < deadline, "the writer never wrote"
            time.sleep(0.005)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    (leftover,) = tmp_path.glob(".CKP-1_1.safetensors.*.tmp")
    time.sleep(0.05)  # mtimes of the next checkpoint are strictly later
    _train(tmp_path)
    assert not leftover.exists()
    assert not list(tmp_path.glob(".*.tmp"))
