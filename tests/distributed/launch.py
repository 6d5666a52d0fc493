"""Start a test's worker script on 2 gloo ranks under torchrun (1 thread each) and fail with its stderr."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def torchrun(worker: Path, out: Path, action: str, timeout: float = 300, ranks: int = 2) -> None:
    """Run ``worker OUT ACTION`` on `ranks` ranks; assert it exited 0 within `timeout` s (its stderr's tail
    otherwise)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={ranks}", "--standalone", str(worker),
           str(out), action]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-4000:]
