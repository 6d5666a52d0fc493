"""Full tables load into any number of row shards and gather back unchanged (1 -> 2 -> 3 ranks)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from .reshard_worker import TABLES

WORKER = Path(__file__).with_name("reshard_worker.py")
ROOT = Path(__file__).resolve().parents[2]


def _reshard(source: Path, target: Path, ranks: int) -> list:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={ranks}",
           "--standalone", str(WORKER), str(source), str(target)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    with safe_open(str(target), "pt") as f:
        return json.loads(f.metadata()["shard_rows"])


def test_tables_survive_resharding(tmp_path):
    from recstream.nn import EmbeddingBagCollection
    torch.manual_seed(3)
    original = EmbeddingBagCollection(TABLES).state_dict()
    save_file(original, tmp_path / "one.safetensors")
    two = _reshard(tmp_path / "one.safetensors", tmp_path / "two.safetensors", 2)
    three = _reshard(tmp_path / "two.safetensors", tmp_path / "three.safetensors", 3)
    # dim 4: 101 + 37 rows (+1 padding row, two dims) = 139; dim 8: 12 + 1 = 13
    assert two == [[70, 7], [69, 6]]
    assert three == [[47, 5], [47, 5], [45, 3]]
    for name, table in original.items():
        torch.testing.assert_close(load_file(tmp_path / "three.safetensors")[name], table, rtol=0, atol=0)
