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
