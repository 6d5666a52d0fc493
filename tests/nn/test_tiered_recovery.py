"""SIGKILL during training with disk-tiered tables, then resume from the last checkpoint: the result
equals an uninterrupted in-memory run -- nothing lost, nothing trained twice, no block corrupt."""
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from recstream.checkpoint import load_checkpoint
from recstream.optim import LazyAdam

from .tier_worker import STEPS, Net, initial, train

WORKER = Path(__file__).with_name("tier_worker.py")
ONLINE_WORKER = Path(__file__).with_name("tier_online_worker.py")


def _run(directory, kill_after=None):
    """Run the worker to the end, or SIGKILL it once it has trained step `kill_after`."""
    env = {**os.environ, "PYTHONPATH": str(WORKER.parents[2])}
    proc = subprocess.Popen([sys.executable, str(WORKER), str(directory)], stdout=subprocess.PIPE, text=True,
                            env=env)
    if kill_after is None:
        assert proc.wait(timeout=300) == 0
        return None
    while int(proc.stdout.readline()) < kill_after:
        pass
    os.kill(proc.pid, signal.SIGKILL)  # steps after the last checkpoint have written evicted rows back
    proc.wait()


@pytest.mark.e2e
def test_sigkill_mid_training_then_resume_equals_an_uninterrupted_run(tmp_path):
    _run(tmp_path, kill_after=13)  # 3 steps past the checkpoint of step 10
    _run(tmp_path, kill_after=29)  # resumed from step 10, killed 4 steps past the one of step 25
    _run(tmp_path)  # resumes and finishes
    tiered = Net(tmp_path)
    assert load_checkpoint(tmp_path / "ckpt.safetensors", tiered, LazyAdam(tiered.parameters()),
                           restore_rng=False)["step"] == STEPS
    reference = initial()
    train(reference, LazyAdam(reference.parameters(), lr=0.05), 0, STEPS)
    got, want = tiered.ebc.gather_tables(), reference.ebc.gather_tables()
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=1e-7)
    for tier in tiered.ebc._tiers:
        if tier is not None:
            for f in tier.store.files.values():
                f.verify_all()


def _online(data_dir, ckpt_dir, n_events, table):
    env = {**os.environ, "PYTHONPATH": str(WORKER.parents[2])}
    return subprocess.Popen([sys.executable, str(ONLINE_WORKER), str(data_dir), str(ckpt_dir), str(n_events), table],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


@pytest.mark.e2e
@pytest.mark.parametrize("table", ["ebc", "hash"])
def test_online_training_killed_at_random_moments_trains_every_event_once_in_the_tier(tmp_path, table):
    """The exactly-once kill test with the trained-count of each event in a disk-tiered table (a cache
    of 64 rows for 3,000 events; an EmbeddingBagCollection table, or a HashEmbedding keyed by the
    event id): after 5 SIGKILLs and restarts from the newest checkpoint, every event's row says it
    was trained exactly once."""
    import random
    import time

    import numpy as np

    from .tier_online_worker import NETS
    n_events, files = 3000, 5
    data_dir, ckpt_dir = tmp_path / "data", tmp_path / "ckpt"
    data_dir.mkdir(), ckpt_dir.mkdir()
    rng = np.random.default_rng(0)
    per_file = n_events // files
    for f in range(files):
        x = rng.standard_normal((per_file, 2))
        rows = "".join(f"{int(a > 0)},{i},{a:.4f},{b:.4f}\n"
                       for i, (a, b) in zip(range(f * per_file, (f + 1) * per_file), x, strict=True))
        (data_dir / f"part-{f:04d}.csv").write_text(rows)
    pick = random.Random(7)
    last = 0
    for _ in range(5):
        proc = _online(data_dir, ckpt_dir, n_events, table)
        target, step = last + pick.randint(5, 20), last
        while step < target:
            line = proc.stdout.readline()
            assert line.startswith("step"), proc.stderr.read()
            step = int(line.split()[1])
        time.sleep(pick.random() * 0.05)  # a random moment inside a step (or a checkpoint's commit)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        last = step
    proc = _online(data_dir, ckpt_dir, n_events, table)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0 and "done" in out, err
    net = NETS[table](n_events, str(ckpt_dir / "tier"))
    final = sorted(ckpt_dir.glob("*.safetensors"), key=os.path.getmtime)[-1]
    load_checkpoint(final, net, restore_rng=False)
    trained = net.trained().numpy()
    assert (trained == 1).all(), (f"lost: {np.flatnonzero(trained == 0)[:10]}, "
                                  f"duplicated: {np.flatnonzero(trained > 1)[:10]}")
