"""Sharded checkpoints (torch.distributed.checkpoint): saved by 2 hybrid_parallel ranks, they load
into 1 process and into 3 ranks with every embedding row and its optimizer state unchanged, and
training goes on as it would have; a rank killed mid-save leaves the previous checkpoint the
newest complete one."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from recstream import checkpoint

from .checkpoint_worker import build, full_state, train

WORKER = Path(__file__).with_name("checkpoint_worker.py")
ROOT = Path(__file__).resolve().parents[2]


def _torchrun(out: Path, action: str, ranks: int) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={ranks}",
           "--standalone", str(WORKER), str(out), action]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


def _assert_same(got: dict, want: dict, atol: float = 0.0) -> None:
    assert sorted(got) == sorted(want)
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, rtol=0 if atol == 0 else 1e-5, atol=atol, msg=name)


def test_two_ranks_reshard_to_one_process_and_three_ranks(tmp_path):
    saving = _torchrun(tmp_path, "save", 2)
    assert saving.returncode == 0, saving.stderr[-4000:]
    saved = load_file(tmp_path / "saved.safetensors")
    files = sorted(os.listdir(tmp_path / "ckpt"))
    assert files == ["recstream_checkpoint.json", "shard-00001-model-00001-of-00001.safetensors",
                     "shard-00002-model-00001-of-00001.safetensors"]  # no pickle anywhere
    # the optimizer state of the sharded tables is there, per row
    assert saved["optim.embedding.embedding.ebc.fused_weight_dim4.exp_avg"].shape == (121, 4)
    assert saved["optim.wide.wide.ebc.fused_weight_dim1.linear"].shape == (121, 1)

    # into one process (stand-alone: full tables), here
    net, optimizer, model = build()
    assert checkpoint.load_sharded(tmp_path / "ckpt", net, optimizer) == [{"rank": 0, "step": 3},
                                                                          {"rank": 1, "step": 3}]
    _assert_same(full_state(net, optimizer), saved)
    train(model, 3, 5)
    _assert_same(full_state(net, optimizer), load_file(tmp_path / "after-2.safetensors"), atol=1e-5)

    # into three ranks (shards of 41, 41 and 39 rows), with no pickle read from disk
    loading = _torchrun(tmp_path, "load", 3)
    assert loading.returncode == 0, loading.stderr[-4000:]
    assert "rank 2: rows 82-121" in loading.stdout
    _assert_same(load_file(tmp_path / "loaded-3.safetensors"), saved)
    assert json.loads((tmp_path / "extra-3.json").read_text()) == [{"rank": 0, "step": 3}, {"rank": 1, "step": 3}]
    _assert_same(load_file(tmp_path / "after-3.safetensors"), load_file(tmp_path / "after-2.safetensors"),
                 atol=1e-5)


def test_rank_killed_mid_save_leaves_the_previous_checkpoint(tmp_path):
    crashed = _torchrun(tmp_path, "crash", 2)
    assert crashed.returncode != 0
    assert "exitcode  : -9" in crashed.stderr  # rank 1 died by SIGKILL while saving "second"
    assert checkpoint.is_complete(tmp_path / "first")
    assert not checkpoint.is_complete(tmp_path / "second")
    assert not (tmp_path / "second").exists() and (tmp_path / "second.partial").is_dir()
    net, optimizer, model = build("rowwise_adagrad")
    with pytest.raises(FileNotFoundError, match="not a complete sharded checkpoint"):
        checkpoint.load_sharded(tmp_path / "second", net, optimizer)
    assert checkpoint.load_sharded(tmp_path / "first", net, optimizer)[1] == {"rank": 1, "step": 1}
    first = load_file(tmp_path / "first.safetensors")
    assert first["optim.embedding.embedding.ebc.fused_weight_dim4.sum"].shape == (121,)  # RowWiseAdagrad
    _assert_same(full_state(net, optimizer), first)
    # the next save of that name clears the stale partial directory
    train(model, 1, 2)
    checkpoint.save_sharded(tmp_path / "second", net, optimizer, extra={"step": 2})
    assert checkpoint.is_complete(tmp_path / "second") and not (tmp_path / "second.partial").exists()


def test_replaces_a_checkpoint_and_refuses_mismatches(tmp_path):
    net, optimizer, model = build()
    train(model, 0, 1)
    path = tmp_path / "ckpt"
    checkpoint.save_sharded(path, net, optimizer, extra={"step": 1})
    train(model, 1, 2)
    checkpoint.save_sharded(path, net, optimizer, extra={"step": 2})  # the same name: replaced
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]
    fresh, fresh_optimizer, _ = build()
    assert checkpoint.load_sharded(path, fresh, fresh_optimizer) == [{"step": 2}]
    _assert_same(full_state(fresh, fresh_optimizer), full_state(net, optimizer))

    with pytest.raises(TypeError, match="'extra' must be a JSON value"):
        checkpoint.save_sharded(tmp_path / "bad", net, optimizer, extra={"t": torch.zeros(1)})
    with pytest.raises(ValueError, match="must not end with '.partial'"):
        checkpoint.save_sharded(tmp_path / "x.partial", net, optimizer)
    other = torch.nn.Linear(3, 1)
    with pytest.raises(ValueError, match="does not match this model"):
        checkpoint.load_sharded(path, other)
    with pytest.raises(ValueError, match="holds optimizers"):
        checkpoint.load_sharded(path, fresh, torch.optim.Adam(fresh.parameters()))
    with pytest.raises(TypeError, match="load_sharded"):
        checkpoint.load_sharded(path, "net")
