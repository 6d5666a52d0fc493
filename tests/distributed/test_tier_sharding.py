"""Disk-tiered EmbeddingBagCollection tables under hybrid_parallel: each rank keeps a store of only its
rows (``<directory>/rank-<r>-of-<N>``) behind a cache of its own. Two ranks train as the in-memory
tables do (a cache far smaller than each rank's rows: rows evicted and read back with their optimizer
state); a sharded checkpoint commits every rank's stores and training resumed from it, in the same
processes or fresh ones, goes on identically; stores made for another rank or world size, and a
checkpoint of two ranks' stores loaded into one process, are refused naming path, rank and world size."""
import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from recstream import checkpoint
from recstream.data import SyntheticCTR
from recstream.models import WideDeep, default_optimizer
from recstream.nn import TierPlan
from recstream.nn.tier_shard import open_rank_store

from .launch import torchrun
from .tier_shard_worker import CACHE, GLOBAL_BATCH, VOCAB

WORKER = Path(__file__).with_name("tier_shard_worker.py")


def _torchrun(out: Path, action: str) -> None:
    torchrun(WORKER, out, action)


def _assert_same(got: dict, want: dict, atol: float) -> None:
    assert sorted(got) == sorted(want)
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, rtol=0 if atol == 0 else 1e-5, atol=atol, msg=name)


def _single_process_net(tiers: Path):
    schema = SyntheticCTR(num_dense=4, num_categorical=3, vocab_sizes=VOCAB, batch_size=GLOBAL_BATCH).schema
    return WideDeep(schema, hidden=(16, 8), embedding_dim=4, disk_tier=TierPlan(str(tiers), {"C1": CACHE, "C2": CACHE}))


@pytest.mark.e2e
def test_two_ranks_train_tiered_tables_as_in_memory_ones(tmp_path):
    _torchrun(tmp_path, "equal")
    _assert_same(load_file(tmp_path / "tiered.safetensors"), load_file(tmp_path / "memory.safetensors"), atol=1e-6)
    for rank, owned in ((0, 200), (1, 200)):
        # a sharded tiered table's state_dict entry is its rank's commit, not every row gathered
        assert json.loads((tmp_path / f"stats-{rank}.json").read_text())["state_dict"] == [
            "embedding.ebc.tables.C1.tier", "wide.ebc.tables.C1.tier"]
        stats = json.loads((tmp_path / f"stats-{rank}.json").read_text())["embedding.ebc.C1"]
        assert stats["misses"] + stats["prefetched"] > 2 * CACHE  # rows evicted and read back
        assert stats["bytes_written"] > owned * 4 * 4 and stats["hits"] > 0  # trained rows written back (beyond
        # the initial rows' import)
        store = tmp_path / "tiers" / "embedding" / "C1" / f"rank-{rank}-of-2"
        shard = json.loads((store / "shard.json").read_text())
        assert (shard["rank"], shard["world_size"], shard["stop"] - shard["start"]) == (rank, 2, owned)
        assert json.loads((store / "manifest.json").read_text())["files"]["weight"]["rows"] == owned
    assert sorted(os.listdir(tmp_path / "tiers" / "embedding" / "C1")) == ["rank-0-of-2", "rank-1-of-2"]
    # built on 2 ranks, a tiered table opens no store (the whole table's) until hybrid_parallel shards it
    assert (tmp_path / "unsharded-1.txt").read_text().startswith(
        "EmbeddingBagCollection: disk-tiered table 'C1' was built in a process of 2 ranks: each rank keeps a store "
        f"of its own rows (under {tmp_path}/early/wide/C1), opened when parallel_mode='hybrid_parallel' shards")
    assert not (tmp_path / "early").exists()
    # one process opens a store of the whole table beside the ranks' (a checkpoint of theirs reshards into it:
    # test_tier_resharding), leaving theirs as they are
    _single_process_net(tmp_path / "tiers")
    assert sorted(os.listdir(tmp_path / "tiers" / "wide" / "C1")) == [
        "group-0.tier", "lock", "manifest.json", "rank-0-of-2", "rank-1-of-2", "undo.log"]


@pytest.mark.e2e
def test_two_ranks_checkpoint_and_resume_tiered_tables_identically(tmp_path):
    _torchrun(tmp_path, "save")
    straight = load_file(tmp_path / "straight.safetensors")
    _assert_same(load_file(tmp_path / "again.safetensors"), straight, atol=0)  # restored in the same processes
    _torchrun(tmp_path, "resume")  # fresh processes: the stores reopened, then the checkpoint's commits restored
    _assert_same(load_file(tmp_path / "resumed.safetensors"), straight, atol=0)
    saved = load_file(tmp_path / "ckpt" / "shard-00001-model-00001-of-00001.safetensors")
    assert saved["model.embedding.ebc.tables.C1.tier"].shape == (1, 2)  # rank 0's commit: [store uid, generation]
    # two ranks' stores reshard into one process (test_tier_resharding) from the table's directory only
    net = _single_process_net(tmp_path / "other")
    with pytest.raises(ValueError, match=r"EmbeddingBagCollection: table 'C1' resharded on 1 rank\(s\) \(this is rank "
                                         r"0\): table 'C1': cannot read .*/other/.*/C1/rank-0-of-2/shard.json, the "
                                         r"shard of rank 0 of the 2 that saved the checkpoint"):
        checkpoint.load_sharded(tmp_path / "ckpt", net, default_optimizer(net, lr=0.01))


def _open(directory, rank, world_size, rows=10):
    chunk = -(-rows // world_size)
    start, stop = rank * chunk, min(rows, (rank + 1) * chunk)
    return open_rank_store(str(directory), "item", rows, start, stop, 4, 0.01, rank, world_size)


def test_a_rank_store_reopens_for_its_rank_and_world_size_only(tmp_path):
    for rank in (0, 1):
        _open(tmp_path, rank, 2).close()
    _open(tmp_path, 1, 2).close()  # its own: reopened
    with pytest.raises(ValueError, match=rf"tier directory {tmp_path} \(table 'item', this is rank 1 of 3\) holds "
                                         r"the stores of 2 ranks \(rank-0-of-2, rank-1-of-2\)"):
        _open(tmp_path, 1, 3)
    # another rank's store in this rank's place (directories copied or renamed): refused, not read
    shutil.rmtree(tmp_path / "rank-1-of-2")
    shutil.copytree(tmp_path / "rank-0-of-2", tmp_path / "rank-1-of-2")
    (tmp_path / "rank-1-of-2" / "lock").unlink()
    with pytest.raises(ValueError, match=rf"{tmp_path}/rank-1-of-2/shard.json describes another shard than rank 1 "
                                         r"of 2 needs .*'rank': \(0, 1\)"):
        _open(tmp_path, 1, 2)


def test_the_store_of_a_whole_table_is_not_opened_as_a_rank_store(tmp_path):
    net = _single_process_net(tmp_path)  # one process: the whole tables' stores
    del net
    with pytest.raises(ValueError, match=rf"tier directory {tmp_path}/embedding/C1 \(table 'item', this is rank 0 "
                                         r"of 2\) holds the store of the whole table, made by one process"):
        _open(tmp_path / "embedding" / "C1", 0, 2)


def _steps(net, optimizer, data):
    for x, y in data:
        optimizer.zero_grad(set_to_none=True)
        torch.nn.functional.binary_cross_entropy_with_logits(net(x).view(-1), y.view(-1)).backward()
        optimizer.step()


def _rows(net) -> dict:
    """Every table's rows (the tiered ones read from store and cache) and every dense parameter."""
    out = {f"{part}.{name}": w for part in ("wide", "embedding")
           for name, w in getattr(net, part).ebc.gather_tables().items()}
    out.update({k: v.detach().clone() for k, v in net.named_parameters() if ".ebc." not in k})
    return out


def test_a_sharded_checkpoint_of_one_process_commits_and_restores_its_stores(tmp_path):
    # save_sharded in one process wrote the cache slots but never committed the stores: a load then
    # left the rows written after the save in the store and the slots mapped to other rows
    torch.manual_seed(0)
    net = _single_process_net(tmp_path / "tiers")
    optimizer = default_optimizer(net, lr=0.01)
    data = list(SyntheticCTR(num_dense=4, num_categorical=3, vocab_sizes=VOCAB, batch_size=GLOBAL_BATCH,
                             seed=1).train_batches(8))
    _steps(net, optimizer, data[:3])
    checkpoint.save_sharded(tmp_path / "ckpt", net, optimizer)
    _steps(net, optimizer, data[3:])
    straight = _rows(net)
    assert checkpoint.load_sharded(tmp_path / "ckpt", net, optimizer) == [None]
    _steps(net, optimizer, data[3:])
    _assert_same(_rows(net), straight, atol=0)
    assert net.embedding.ebc.tier_stats()["C1"].misses > CACHE  # the cache was too small for the run's rows


@pytest.mark.e2e
def test_every_rank_raises_when_one_cannot_open_its_store(tmp_path):
    # rank 1 alone failed to open its store (here a torn shard.json) and raised, while rank 0 went on into
    # the collectives of sharding and training, waiting for it (until a timeout, or torchrun's teardown)
    torn = tmp_path / "tiers" / "wide" / "C1" / "rank-1-of-2"
    torn.mkdir(parents=True)
    (torn / "shard.json").write_text('{"table": "C1", "ro')
    torchrun(WORKER, tmp_path, "torn", timeout=120)
    assert (tmp_path / "error-1.txt").read_text().startswith(f"EmbeddingBagCollection: cannot read {torn}/shard.json "
                                                             "(rank 1 of 2)")
    assert (tmp_path / "error-0.txt").read_text() == (
        f"EmbeddingBagCollection: table 'C1': rank(s) [1] of 2 could not open their tier stores under "
        f"{tmp_path}/tiers/wide/C1 (their errors say why); this is rank 0, whose store opened, but the table "
        "cannot train without every rank's rows")
