"""A disk-tiered HashEmbedding under hybrid_parallel: keys sharded as in memory, each rank keeping its keys'
rows in a store of its own (``<directory>/rank-<r>-of-<N>``) behind a cache of its own. Two gloo ranks train
as the in-memory table does (same keys, rows and LazyAdam moments, bit for bit, with a cache smaller than
a rank's keys: rows evicted and read back), and publish the same versions (so does a model's tiered
dynamic feature trained by Model.train, which prefetches the batches' keys); a sharded checkpoint commits
every rank's store and training resumed from it, in the same processes or fresh ones, goes on identically,
and loads into one process from its stores at its commit (resharded: test_hash_tier_resharding.py); another
rank's store in a rank's place, a checkpoint loaded with another tier directory, from stores committed after
it or into the same number of shards of another size, and a tiered table's checkpoint loaded into an
in-memory one are refused, naming them."""
import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from recstream import checkpoint
from recstream.nn import DiskTier, HashEmbedding
from recstream.nn.hash_tier import open_rank_hash_tier
from recstream.nn.key_sharding import owner_of
from recstream.optim import LazyAdam

from .hash_tier_shard_worker import CACHE, CAPACITY, build
from .launch import torchrun

WORKER = Path(__file__).with_name("hash_tier_shard_worker.py")


def _torchrun(out: Path, action: str) -> None:
    torchrun(WORKER, out, action)


def _same(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for name, value in want.items():
        assert torch.equal(got[name], value), name


@pytest.mark.e2e
def test_two_ranks_train_a_tiered_hash_embedding_as_in_memory_and_publish_the_same(tmp_path):
    _torchrun(tmp_path, "equal")
    for rank in (0, 1):
        report = json.loads((tmp_path / f"equal-{rank}.json").read_text())
        assert report["tiered"] == report["memory"] and len(report["memory"]) == 12
        memory = load_file(tmp_path / f"memory-{rank}.safetensors")
        _same(load_file(tmp_path / f"tiered-{rank}.safetensors"), memory)  # keys, rows, counts, moments
        assert (owner_of(memory["keys"], 2) == rank).all() and memory["keys"].numel() > 50  # this rank's keys
        stats = report["stats"]
        assert stats["misses"] > 2 * CACHE and stats["hits"] > 0 and stats["bytes_written"] > 0  # evicted, read back
        for version in ("v00000001", "v00000002"):  # a full version, then a delta: the same files
            got, want = tmp_path / f"pub-tiered-{rank}" / version, tmp_path / f"pub-memory-{rank}" / version
            kinds = [json.loads((d / "manifest.json").read_text())["kind"] for d in (got, want)]
            assert kinds == [{"v00000001": "full", "v00000002": "delta"}[version]] * 2
            for name in ("hash/emb.safetensors", "model.safetensors"):
                _same(load_file(got / name), load_file(want / name))
        store = tmp_path / "tiers" / "emb" / f"rank-{rank}-of-2"
        shard = json.loads((store / "shard.json").read_text())
        assert (shard["rank"], shard["world_size"], shard["stop"] - shard["start"]) == (rank, 2, CAPACITY // 2)
        assert json.loads((store / "manifest.json").read_text())["files"]["weight"]["rows"] == CAPACITY // 2
        assert any(f"this rank's store {store}" in line and "key-sharded (100 rows per rank" in line
                   for line in report["plan"])
        # built on 2 ranks, a tiered table opens no store (the whole table's) until hybrid_parallel shards it
        assert report["unsharded"].startswith(
            "HashEmbedding: disk-tiered table 'early' was built in a process of 2 ranks: each rank keeps a store of "
            f"its own rows (under {tmp_path}/early), opened when parallel_mode='hybrid_parallel' shards the table")
    assert sorted(os.listdir(tmp_path / "tiers" / "emb")) == ["rank-0-of-2", "rank-1-of-2"]
    assert not (tmp_path / "early").exists()
    # one process opens a store of the whole table beside the ranks' (a checkpoint of theirs reshards into it)
    one = HashEmbedding(4, capacity=CAPACITY, tier=DiskTier(str(tmp_path / "tiers" / "emb"), cache_rows=CACHE))
    assert one.tier_store.directory == str(tmp_path / "tiers" / "emb") and one.num_rows == 0
    one.tier_store.close()


@pytest.mark.e2e
def test_a_models_tiered_dynamic_feature_trains_on_two_ranks_as_in_memory_with_prefetch(tmp_path):
    _torchrun(tmp_path, "model")
    for rank in (0, 1):
        memory = load_file(tmp_path / f"model-memory-{rank}.safetensors")
        _same(load_file(tmp_path / f"model-tiered-{rank}.safetensors"), memory)
        assert memory["keys"].numel() > 2 * 24 and (owner_of(memory["keys"], 2) == rank).all()
        stats = json.loads((tmp_path / f"model-{rank}.json").read_text())
        assert stats["prefetched"] > 0 and stats["misses"] > 24  # the batches' keys read ahead; rows evicted
    shard = json.loads((tmp_path / "model" / "embedding" / "user" / "rank-1-of-2" / "shard.json").read_text())
    assert (shard["rank"], shard["world_size"], shard["rows"]) == (1, 2, 300)


@pytest.mark.e2e
def test_two_ranks_checkpoint_and_resume_a_tiered_hash_embedding_identically(tmp_path):
    _torchrun(tmp_path, "save")
    _torchrun(tmp_path, "resume")  # fresh processes: the stores reopened, then the checkpoint's commits restored
    for rank in (0, 1):
        straight = load_file(tmp_path / f"straight-{rank}.safetensors")
        _same(load_file(tmp_path / f"again-{rank}.safetensors"), straight)  # restored in the same processes
        _same(load_file(tmp_path / f"resumed-{rank}.safetensors"), straight)
        saved = load_file(tmp_path / "ckpt" / f"shard-0000{rank + 1}-model-00001-of-00001.safetensors")
        assert saved["hash.emb.tier"].shape == (1, 2) and "hash.emb.values" not in saved  # the commit, not rows
        assert saved["optim.sparse.emb.values.exp_avg"].shape == (CACHE, 4)  # the rank's cache slots' state
    # into one process, the ranks' stores are resharded (test_hash_tier_resharding.py): from the checkpoint's stores
    net, optimizer, _ = build(tmp_path / "one")  # not the directory of the checkpoint's stores
    with pytest.raises(ValueError, match=r"disk-tiered HashEmbedding 'emb' \(rank 0 of 1\) cannot be resharded "
                                         r"from the stores of the 2 rank\(s\) that saved it: .*cannot read "
                                         r".*/one/tiers/emb/rank-0-of-2/shard.json, the shard of rank 0 of the 2"):
        checkpoint.load_sharded(tmp_path / "ckpt", net, optimizer)
    net, optimizer, _ = build(tmp_path)  # at the checkpoint's commit: the runs above committed the stores after it
    with pytest.raises(ValueError, match=r"hash.emb.tier\[0\]: names generation \d+ of tier store .*/rank-0-of-2, "
                                         r"which is at generation \d+: only a store at the checkpoint's commit"):
        checkpoint.load_sharded(tmp_path / "ckpt", net, optimizer)
    net, optimizer, _ = build(None)
    with pytest.raises(ValueError, match=r"HashEmbedding 'emb' was saved disk-tiered \(commits of its stores\), this "
                                         r"network holds it in memory \(its rows\)"):
        checkpoint.load_sharded(tmp_path / "ckpt", net, optimizer)


def _open(directory: Path, rank: int, world_size: int):
    capacity = -(-10 // world_size)
    tier = open_rank_hash_tier(DiskTier(str(directory), cache_rows=4), capacity, 4,
                               torch.nn.Parameter(torch.zeros(4, 4)), rank, world_size)
    tier.store.close()
    return tier


def test_a_hash_rank_store_reopens_for_its_rank_and_world_size_beside_others(tmp_path):
    for rank in (0, 1):
        assert _open(tmp_path, rank, 2).rows == 5
    _open(tmp_path, 1, 2)  # its own: reopened
    assert _open(tmp_path, 1, 3).rows == 4  # another world size's, beside (a checkpoint reshards into it)
    assert sorted(os.listdir(tmp_path)) == ["rank-0-of-2", "rank-1-of-2", "rank-1-of-3"]
    shutil.rmtree(tmp_path / "rank-1-of-2")  # another rank's store in this rank's place: refused, not read
    shutil.copytree(tmp_path / "rank-0-of-2", tmp_path / "rank-1-of-2")
    (tmp_path / "rank-1-of-2" / "lock").unlink()
    with pytest.raises(ValueError, match=rf"HashEmbedding: {tmp_path}/rank-1-of-2/shard.json describes another shard "
                                         r"than rank 1 of 2 needs .*'rank': \(0, 1\)"):
        _open(tmp_path, 1, 2)
    whole = HashEmbedding(4, capacity=10, tier=DiskTier(str(tmp_path / "whole"), cache_rows=4))  # one process's
    whole.tier_store.close()
    assert _open(tmp_path / "whole", 0, 2).rows == 5  # beside the whole table's store
    assert {"rank-0-of-2", "manifest.json", "group-0.tier"} <= set(os.listdir(tmp_path / "whole"))


def test_a_sharded_checkpoint_of_one_process_commits_and_restores_a_tiered_hash_embedding(tmp_path):
    def built(directory):
        torch.manual_seed(0)
        net = torch.nn.ModuleDict({"emb": HashEmbedding(4, capacity=120, tier=DiskTier(str(directory), 25))})
        return net, LazyAdam(net.parameters(), lr=0.05)

    def steps(net, optimizer, first, stop):
        for step in range(first, stop):
            torch.manual_seed(step)
            out = net["emb"](torch.randint(0, 200, (24,)))
            optimizer.zero_grad()
            (out.sum(1) ** 2).mean().backward()
            optimizer.step()
        return net["emb"].export(reset_delta=False)

    net, optimizer = built(tmp_path / "t")
    steps(net, optimizer, 0, 10)
    checkpoint.save_sharded(tmp_path / "ckpt", net, optimizer)
    straight = steps(net, optimizer, 10, 20)  # rows written back past the checkpoint's commit
    assert checkpoint.load_sharded(tmp_path / "ckpt", net, optimizer) == [None]
    _same(steps(net, optimizer, 10, 20), straight)
    assert net["emb"].tier_stats().misses > 4 * 25
    other, other_optimizer = built(tmp_path / "u")
    with pytest.raises(ValueError, match=r"HashEmbedding 'emb': the checkpoint holds a commit of tier store \d+, this "
                                         rf"rank \(rank 0\) uses store \d+ in {tmp_path}/u"):
        checkpoint.load_sharded(tmp_path / "ckpt", other, other_optimizer)
    smaller = torch.nn.ModuleDict({"emb": HashEmbedding(4, capacity=100, tier=DiskTier(str(tmp_path / "v"), 25))})
    with pytest.raises(ValueError, match=r"disk-tiered HashEmbedding 'emb' was saved by 1 rank\(s\) as this run "
                                         r"holds it, with another table \(this is rank 0; \(shards, capacity, "
                                         r"pending_capacity, num_slots\) saved \(1, 120, 0, 256\), here \(1, 100, 0, "
                                         r"256\)\): .* a tier is resharded only into another number of ranks"):
        checkpoint.load_sharded(tmp_path / "ckpt", smaller, LazyAdam(smaller.parameters(), lr=0.05))


@pytest.mark.e2e
def test_every_rank_raises_when_one_cannot_open_its_keys_store(tmp_path):
    # rank 1 alone failed to open its store and raised; rank 0 waited for it in the next collective
    torn = tmp_path / "tiers" / "emb" / "rank-1-of-2"
    torn.mkdir(parents=True)
    (torn / "shard.json").write_text('{"table": "HashEmbedding", "ro')
    torchrun(WORKER, tmp_path, "torn", timeout=120)
    assert (tmp_path / "error-1.txt").read_text().startswith(f"HashEmbedding: cannot read {torn}/shard.json (rank 1 "
                                                             "of 2)")
    assert (tmp_path / "error-0.txt").read_text().startswith(
        f"HashEmbedding: table 'HashEmbedding': rank(s) [1] of 2 could not open their tier stores under "
        f"{tmp_path}/tiers/emb (their errors say why); this is rank 0")
