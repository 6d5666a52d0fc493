"""HashEmbedding under hybrid_parallel (keys sharded by hash) on gloo processes: 2 ranks train the
losses one process trains, each key lives on exactly one rank, and sharded checkpoints round-trip:
exactly into 2 ranks, and by resharding into 1 process (serving) and 3 ranks."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from recstream import checkpoint
from recstream.nn.key_sharding import owner_of

from .hash_worker import batches, build, exported, train, union

WORKER = Path(__file__).with_name("hash_worker.py")
ROOT = Path(__file__).resolve().parents[2]


def _run(out: Path, action: str, ranks: int) -> tuple[dict, dict]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    if ranks == 1:
        cmd = [sys.executable, str(WORKER), str(out), action]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={ranks}", "--standalone",
               str(WORKER), str(out), action]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads((out / f"{action}-{ranks}.json").read_text())
    result["stdout"] = proc.stdout
    return result, load_file(out / f"{action}-{ranks}-keys.safetensors")


def _same_keys(got: dict, want: dict, when: str, atol: float) -> None:
    assert torch.equal(got[f"{when}.keys"], want[f"{when}.keys"])
    assert torch.equal(got[f"{when}.counts"], want[f"{when}.counts"])
    torch.testing.assert_close(got[f"{when}.values"], want[f"{when}.values"], rtol=0 if atol == 0 else 1e-5, atol=atol)


def _one_owner(rank_keys: list[list[int]]) -> None:
    """Every key on exactly one rank: the one owner_of names."""
    seen = [k for keys in rank_keys for k in keys]
    assert len(seen) == len(set(seen))
    for rank, keys in enumerate(rank_keys):
        assert (owner_of(torch.tensor(keys, dtype=torch.int64), len(rank_keys)) == rank).all()


def test_two_ranks_match_one_process_and_checkpoints_round_trip(tmp_path):
    one, one_keys = _run(tmp_path / "one", "train", 1)
    two, two_keys = _run(tmp_path / "two", "train", 2)
    assert "emb.values [512, 4]: key-sharded (256 rows per rank" in two["stdout"]
    # the same training: admission after 2 sightings, age eviction, LazyAdam rows, dense DDP
    assert one["losses"] == pytest.approx(two["losses"], abs=1e-5)
    assert one["after"] == pytest.approx(two["after"], abs=1e-5)
    assert one["eval"] == pytest.approx(two["eval"], abs=1e-5)
    # rank 1 looked up nothing, rank 0 a whole batch: no hang, the same vectors as one process
    torch.testing.assert_close(torch.tensor(two["uneven"]), torch.tensor(one["uneven"]), atol=1e-5, rtol=0)
    for when in ("ckpt", "end"):
        _one_owner(two["rank_keys"][when])
        assert all(two["rank_keys"][when])  # both ranks hold keys
        _same_keys(two_keys, one_keys, when, atol=1e-5)
    assert two["local_rows"] == 256

    # into the same 2 ranks: exact, and the next steps are those the saving run took
    resumed, resumed_keys = _run(tmp_path / "two", "resume", 2)
    assert resumed["rank_keys"] == two["rank_keys"]
    assert resumed["after"] == two["after"]
    for when in ("ckpt", "end"):
        _same_keys(resumed_keys, two_keys, when, atol=0)

    # into one process (serving): every key of every shard, with its optimizer state
    net, optimizer, model = build()
    assert checkpoint.load_sharded(tmp_path / "two" / "ckpt", net, optimizer) == [{"rank": 0}, {"rank": 1}]
    assert not net.emb.sharded and net.emb.capacity == 512
    loaded = {f"ckpt.{k}": v for k, v in union(exported(net)).items()}
    _same_keys(loaded, two_keys, "ckpt", atol=0)
    assert train(model, batches(10)[6:]) == pytest.approx(two["after"], abs=1e-5)

    # into three ranks: resharded by the new owners, training goes on the same
    three, three_keys = _run(tmp_path / "two", "resume", 3)
    assert three["local_rows"] == 171  # ceil(512 / 3)
    for when in ("ckpt", "end"):
        _one_owner(three["rank_keys"][when])
    _same_keys(three_keys, two_keys, "ckpt", atol=0)
    assert three["after"] == pytest.approx(two["after"], abs=1e-5)
    _same_keys(three_keys, two_keys, "end", atol=1e-5)


def test_data_parallel_refuses_hash_embedding_and_names_hybrid_parallel():
    from recstream.distributed import data_parallel

    from .hash_worker import Net
    with pytest.raises(ValueError, match=r"HashEmbedding modules \['emb'\].*parallel_mode='hybrid_parallel'"):
        data_parallel(Net())


def _busy(capacity: int):
    """A HashEmbedding with admitted, pending and evicted keys, an eviction log and LazyAdam state."""
    from recstream.nn import HashEmbedding
    from recstream.optim import LazyAdam
    torch.manual_seed(0)
    net = torch.nn.ModuleDict({"emb": HashEmbedding(3, capacity=capacity, permit_filter_value=2,
                                                    evict_filter_value=3)})
    optimizer = LazyAdam(net.parameters(), lr=0.1)
    return net, optimizer


def _rows_by_key(net, optimizer) -> dict[int, tuple]:
    emb = net["emb"]
    state = optimizer.state[emb.values]
    out = {}
    for key in emb.export(reset_delta=False)["keys"].tolist():
        slot = emb.table.find(torch.tensor([key]))
        row = int(emb.table.rows[slot])
        out[key] = (emb.values[row].tolist(), int(emb.table.counts[slot]), int(emb.table.last_seen[slot]),
                    state["exp_avg"][row].tolist(), state["exp_avg_sq"][row].tolist())
    return out


def test_one_process_checkpoint_is_exact_and_loads_into_another_capacity(tmp_path):
    net, optimizer = _busy(8)
    for step in range(6):
        net["emb"](torch.tensor([step, step, step + 1, 100, 200 + step, 7, 7])).pow(2).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        if step == 2:
            net["emb"].export()  # starts the eviction log
    assert net["emb"].evicted_keys.numel() and net["emb"].num_pending
    checkpoint.save_sharded(tmp_path / "c", net, optimizer)

    same, same_opt = _busy(8)  # same geometry: the table back bit for bit
    checkpoint.load_sharded(tmp_path / "c", same, same_opt)
    for name, value in net.state_dict().items():
        assert torch.equal(same.state_dict()[name], value), name
    assert same["emb"].global_step == 6 and same["emb"].num_pending == net["emb"].num_pending

    bigger, bigger_opt = _busy(16)  # rebuilt: every key with its row, counts, step and optimizer rows
    checkpoint.load_sharded(tmp_path / "c", bigger, bigger_opt)
    assert _rows_by_key(bigger, bigger_opt) == _rows_by_key(net, optimizer)
    assert bigger["emb"].num_pending == net["emb"].num_pending and bigger["emb"].global_step == 6
    assert sorted(bigger["emb"].evicted_keys.tolist()) == sorted(net["emb"].evicted_keys.tolist())

    small, small_opt = _busy(2)
    before = {k: v.clone() for k, v in small.state_dict().items()}
    with pytest.raises(checkpoint.CheckpointError, match="do not fit in capacity=2"):
        checkpoint.load_sharded(tmp_path / "c", small, small_opt)
    assert all(torch.equal(v, before[k]) for k, v in small.state_dict().items())  # refused before loading
