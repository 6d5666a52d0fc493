"""Float32 overflow and divergence through the command line (issue 27, item 2), in subprocesses.

A CSV row ``1,1e39,3`` used to turn every weight NaN with no dead letter, and `recstream train`
then exited 0 and published the NaN model; ``lr: 1e308`` exited 0 with loss ``null`` and
checkpointed NaN weights. Now the row is a bad row and a diverging run exits 1 naming the step,
with no checkpoint and no version holding a non-finite value."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from recstream.serving import list_versions, load_latest

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}

TRAIN = """run_dir: run
schema:
  dense: [x]
  categorical:
    - {name: c, vocab_size: 10, embedding_dim: 4}
data:
  train: {format: csv, path: data.csv, batch_size: 8, on_bad_row: skip}
model:
  type: widedeep
  hidden: [8]
train:
  epochs: 2
  threads: 1
publish: {}
"""

ONLINE = """run_dir: run
schema:
  dense: [x]
  categorical:
    - {name: c, vocab_size: 10, embedding_dim: 4}
stream:
  directory: {path: events, format: csv}
  batch_size: 8
  idle_timeout: 0.5
  dead_letter: dead.jsonl
model:
  type: widedeep
  hidden: [8]
train:
  threads: 1
publish: {every_steps: 2}
"""


def rows(n: int) -> list[str]:
    return [f"{i % 2},{i / 10},{i % 10}" for i in range(n)]


def run(cwd: Path, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "recstream", *argv, "--json"], capture_output=True, text=True,
                          timeout=180, env=ENV, cwd=cwd)


def written_tensors(run_dir: Path) -> dict[str, dict[str, torch.Tensor]]:
    """Every checkpoint and published version file under `run_dir`, loaded (safetensors only)."""
    return {str(p): load_file(p) for p in sorted(run_dir.rglob("*.safetensors"))}


def all_finite(files: dict) -> bool:
    return all(torch.isfinite(t).all() for tensors in files.values() for t in tensors.values()
               if t.is_floating_point())


def test_train_dead_letters_a_float32_overflow_row_and_publishes_a_finite_model(tmp_path):
    (tmp_path / "data.csv").write_text("\n".join(["label,x,c"] + rows(16)[:5] + ["1,1e39,3"] + rows(16)[5:]) + "\n")
    (tmp_path / "c.yaml").write_text(TRAIN)
    result = run(tmp_path, "train", "c.yaml")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["status"] == "ok" and out["steps"] == 4, out  # 16 good rows in batches of 8, twice: the row skipped
    assert out["metrics"]["loss"] is not None, out
    net, manifest = load_latest(tmp_path / "run" / "published")
    assert all(torch.isfinite(p).all() for p in net.parameters())
    files = written_tensors(tmp_path / "run")
    assert files and all_finite(files)


def test_train_with_a_diverging_learning_rate_exits_1_and_writes_nothing_non_finite(tmp_path):
    (tmp_path / "data.csv").write_text("\n".join(["label,x,c"] + rows(40)) + "\n")
    (tmp_path / "c.yaml").write_text(TRAIN + "optimizer: {lr: 1.0e+308}\n")
    result = run(tmp_path, "train", "c.yaml")
    assert result.returncode == 1, (result.returncode, result.stdout, result.stderr)
    assert "training diverged" in result.stderr and "non-finite" in result.stderr, result.stderr
    assert "epoch 1" in result.stderr and "restore it" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and '"status": "ok"' not in result.stdout
    assert all_finite(written_tensors(tmp_path / "run"))  # no NaN checkpoint (the loss flag stops it first)
    assert not list_versions(tmp_path / "run" / "published") if (tmp_path / "run" / "published").exists() else True


def test_online_with_a_diverging_learning_rate_exits_1_and_publishes_nothing_non_finite(tmp_path):
    (tmp_path / "events").mkdir()
    (tmp_path / "events" / "a.csv").write_text("\n".join(rows(80)) + "\n")
    (tmp_path / "c.yaml").write_text(ONLINE + "optimizer: {lr: 1.0e+308}\n")
    result = run(tmp_path, "online", "c.yaml")
    assert result.returncode == 1, (result.returncode, result.stdout, result.stderr)
    assert "training diverged" in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert all_finite(written_tensors(tmp_path / "run"))
