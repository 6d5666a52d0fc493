"""Start a test's worker script on 2 gloo ranks under torchrun (1 thread each) and fail with its stderr."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def torchrun(worker: Path, out: Path, action: str, timeout: float = 300) -> None:
    """Run ``worker OUT ACTION`` on 2 ranks; assert it exited 0 (its stderr's tail otherwise) within `timeout` s."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone", str(worker),
           str(out), action]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-4000:]
