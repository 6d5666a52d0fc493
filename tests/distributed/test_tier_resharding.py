"""A sharded checkpoint of disk-tiered EmbeddingBagCollection tables saved by 2 ranks loads into 3 ranks
and into one process: the stores are resharded (each new rank's store filled from the old ones at the
checkpoint's commit, streamed in chunks), the gathered tables and every store array (weights and
optimizer state) equal the saved ones exactly, training goes on as the in-memory net resharded the
same way does, and the old stores stay as the checkpoint needs them: it still loads into 2 ranks. One
process's checkpoint (the whole table's store) loads into 2 ranks the same way."""
import gc
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from recstream.nn import tier_reshard
from recstream.nn.tier_shard import open_rank_store

from .launch import torchrun

WORKER = Path(__file__).with_name("tier_reshard_worker.py")


def _assert_same(got: dict, want: dict, atol: float) -> None:
    assert sorted(got) == sorted(want)
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, rtol=0 if atol == 0 else 1e-5, atol=atol, msg=name)


def _arrays(out: Path, prefix: str, ranks: int) -> dict:
    """Every store array of the tables, the ranks' rows concatenated in rank order."""
    parts = [load_file(out / f"{prefix}-{r}.safetensors") for r in range(ranks)]
    return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}


def _check_loaded(out: Path, ranks: int, saved_by: int = 2) -> None:
    _assert_same(load_file(out / f"loaded-{ranks}.safetensors"), load_file(out / "saved.safetensors"), atol=0)
    saved = _arrays(out, "saved-arrays", saved_by)
    assert {k.rsplit(".", 1)[1] for k in saved} > {"weight"}  # optimizer state in the stores, compared too
    _assert_same(_arrays(out, f"loaded-arrays-{ranks}", ranks), saved, atol=0)
    _assert_same(load_file(out / f"tiered-{ranks}.safetensors"), load_file(out / f"memory-{ranks}.safetensors"),
                 atol=1e-6)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    out = tmp_path_factory.mktemp("tier_reshard")
    torchrun(WORKER, out, "save")
    return out


@pytest.mark.e2e
def test_tiered_tables_saved_by_two_ranks_load_into_three(saved):
    torchrun(WORKER, saved, "load", ranks=3)
    _check_loaded(saved, 3)
    table = saved / "tiers" / "embedding" / "C1"
    assert sorted(n for n in os.listdir(table) if n.startswith("rank-")) == [
        "rank-0-of-2", "rank-0-of-3", "rank-1-of-2", "rank-1-of-3", "rank-2-of-3"]  # side by side


@pytest.mark.e2e
def test_tiered_tables_saved_by_two_ranks_load_into_one_process(saved, monkeypatch):
    from .tier_reshard_worker import load

    monkeypatch.setattr(tier_reshard, "CHUNK", 7)  # rows streamed in many chunks, some across old stores' bounds
    load(saved, sharded=False)
    _check_loaded(saved, 1)
    # and the old stores still hold the checkpoint: it loads into 2 ranks as before
    torchrun(WORKER, saved, "load", ranks=2)
    _check_loaded(saved, 2)


@pytest.mark.e2e
def test_tiered_tables_saved_by_one_process_load_into_two_ranks(tmp_path):
    from .tier_reshard_worker import save

    save(tmp_path)  # one process: the whole tables' stores, in the tables' directories
    gc.collect()  # that net's stores closed (their locks free for the ranks)
    torchrun(WORKER, tmp_path, "load", ranks=2)
    _check_loaded(tmp_path, 2, saved_by=1)


def test_a_reshard_refuses_a_store_past_the_checkpoints_commit(tmp_path):
    stores = [open_rank_store(str(tmp_path), "t", 10, 5 * k, 5 * k + 5, 2, 0.1, k, 2) for k in (0, 1)]
    commits = [(s.uid, s.commit()) for s in stores]
    stores[1].write("weight", np.array([0]), np.ones((1, 2), np.float32))
    assert stores[1].commit() == commits[1][1] + 1  # a later commit (a later checkpoint's)
    for s in stores:
        s.close()
    sources = tier_reshard.old_rank_stores(str(tmp_path), "t", 10, 2)
    tier_reshard.settle_old_store(sources[0][0], *commits[0], "ckpt")
    gen = commits[1][1]
    with pytest.raises(ValueError, match=rf"ckpt: names generation {gen} of tier store {tmp_path}/rank-1-of-2, "
                                         rf"which is at generation {gen + 1}: only a store at the checkpoint's "
                                         r"commit is resharded"):
        tier_reshard.settle_old_store(sources[1][0], *commits[1], "ckpt")
    with pytest.raises(ValueError, match=rf"ckpt: names tier store 5, {tmp_path}/rank-1-of-2 holds store"):
        tier_reshard.settle_old_store(sources[1][0], 5, commits[1][1] + 1, "ckpt")
