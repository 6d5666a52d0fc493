"""The divergence guard under hybrid_parallel: one rank's NaN stops every rank's checkpoint (no rank
waits forever in the save's collective), and the check reads each rank's own rows, never the
gathered tables (``state_dict()`` of a sharded network builds every full table on every rank)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.e2e
def test_a_nan_on_one_rank_stops_the_checkpoint_on_every_rank_without_gathering(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone",
           "-m", "tests.distributed.divergence_worker", str(tmp_path)]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-4000:]
    rank0, rank1 = ((tmp_path / f"rank-{r}.txt").read_text() for r in (0, 1))
    assert rank0.startswith("DivergenceError: training diverged: non-finite values (NaN or inf) in the "
                            "tensors of rank(s) [1]; refusing to write checkpoint"), rank0
    assert rank1.startswith("DivergenceError: training diverged: non-finite values (NaN or inf) in "
                            "'wide.ebc.fused_weight_dim1'"), rank1
    # step 1's checkpoint was written; step 2's never began
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["div-1_1"], os.listdir(tmp_path / "ckpt")
