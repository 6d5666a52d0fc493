"""A sharded checkpoint of a disk-tiered HashEmbedding saved by 2 ranks loads into 3 ranks and into one
process, and one process's into 2 ranks: the stores are resharded (each new rank's table rebuilt from the
keys it owns, its store filled from the old ones at the checkpoint's commit, rows streamed in chunks). Every
key's row, counts, last-seen step, row number and LazyAdam moments equal exactly those of the in-memory
HashEmbedding resharded from the same checkpoint's data, and training goes on as it does; the old stores
stay as the checkpoint needs them (it still loads into 2 ranks). Keys that do not fit a new rank's
capacity, and an old store past the checkpoint's commit, are refused on every rank."""
import gc
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from recstream.nn import tier_reshard
from recstream.nn.key_sharding import owner_of
from recstream.nn.tier_store import TierStore

from .hash_tier_reshard_worker import SMALL
from .launch import torchrun

WORKER = Path(__file__).with_name("hash_tier_reshard_worker.py")
_PER_KEY = ("keys", "values", "counts", "last_seen", "exp_avg", "exp_avg_sq")


def _assert_same(got: dict, want: dict, atol: float) -> None:
    assert sorted(got) == sorted(want)
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, rtol=0 if atol == 0 else 1e-5, atol=atol, msg=name)


def _union(parts: list[dict]) -> dict:
    """The ranks' tables as one, by key: admitted keys with their rows' data, pending keys, eviction log."""
    out = {}
    for keys, names in (("keys", _PER_KEY), ("pending_keys", ("pending_keys", "pending_counts"))):
        order = torch.argsort(torch.cat([p[keys] for p in parts]))
        out.update({n: torch.cat([p[n] for p in parts])[order] for n in names})
    out["evicted_keys"] = torch.sort(torch.cat([p["evicted_keys"] for p in parts])).values
    return out


def _check_loaded(out: Path, ranks: int, saved_by: int = 2) -> None:
    loaded = []
    for r in range(ranks):
        tiered = load_file(out / f"loaded-tiered-{ranks}-{r}.safetensors")
        # the in-memory reshard's keys, in the same rows, with the same values, counts and moments: exactly
        _assert_same(tiered, load_file(out / f"loaded-memory-{ranks}-{r}.safetensors"), atol=0)
        assert (owner_of(tiered["keys"], ranks) == r).all() and (owner_of(tiered["pending_keys"], ranks) == r).all()
        assert tiered["keys"].numel() > 30 and tiered["global_step"].item() == 6
        _assert_same(load_file(out / f"trained-tiered-{ranks}-{r}.safetensors"),
                     load_file(out / f"trained-memory-{ranks}-{r}.safetensors"), atol=1e-6)
        loaded.append(tiered)
    saved = _union([load_file(out / f"saved-{r}.safetensors") for r in range(saved_by)])
    assert saved["pending_keys"].numel() > 0 and saved["evicted_keys"].numel() > 0
    _assert_same(_union(loaded), saved, atol=0)  # every key kept, with its row's data: nothing lost


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    out = tmp_path_factory.mktemp("hash_tier_reshard")
    torchrun(WORKER, out, "save")
    _copy(out, out / "pristine")  # as the save left them, for the refusals (a load on 2 ranks commits again)
    return out


@pytest.mark.e2e
def test_a_tiered_hash_embedding_saved_by_two_ranks_loads_into_three(saved):
    torchrun(WORKER, saved, "load", ranks=3)
    _check_loaded(saved, 3)
    assert sorted(os.listdir(saved / "tiers" / "emb")) == [
        "rank-0-of-2", "rank-0-of-3", "rank-1-of-2", "rank-1-of-3", "rank-2-of-3"]  # side by side


@pytest.mark.e2e
def test_a_tiered_hash_embedding_saved_by_two_ranks_loads_into_one_process(saved, monkeypatch):
    from .hash_tier_reshard_worker import load

    monkeypatch.setattr(tier_reshard, "CHUNK", 7)  # rows streamed in many chunks, some across old stores' bounds
    load(saved)
    _check_loaded(saved, 1)
    # and the old stores still hold the checkpoint: it loads into 2 ranks as before
    torchrun(WORKER, saved, "load", ranks=2)
    _check_loaded(saved, 2)


@pytest.mark.e2e
def test_a_tiered_hash_embedding_saved_by_one_process_loads_into_two_ranks(tmp_path):
    from .hash_tier_reshard_worker import save

    save(tmp_path)  # one process: the whole table's store, in the table's directory
    gc.collect()  # that net's store closed (its lock free for the ranks)
    torchrun(WORKER, tmp_path, "load", ranks=2)
    _check_loaded(tmp_path, 2, saved_by=1)


def _copy(saved: Path, to: Path) -> Path:
    """The checkpoint and the stores of the 2 ranks that saved it (not those the other tests made beside)."""
    shutil.copytree(saved / "ckpt", to / "ckpt")
    for k in (0, 1):
        shutil.copytree(saved / "tiers" / "emb" / f"rank-{k}-of-2", to / "tiers" / "emb" / f"rank-{k}-of-2")
    return to


@pytest.mark.e2e
@pytest.mark.parametrize("action", ["small", "msmall"])
def test_every_rank_refuses_keys_that_do_not_fit_its_capacity(saved, tmp_path, action):
    """Tiered (``small``) or in memory (``msmall``): the ranks whose keys fit learn of the others' failure
    (none goes on alone into the collectives of a load the others left)."""
    out = _copy(saved / "pristine", tmp_path)
    if action == "msmall":
        shutil.copytree(saved / "mckpt", out / "mckpt")
    torchrun(WORKER, out, action, ranks=3)
    keys = _union([load_file(saved / f"saved-{r}.safetensors") for r in (0, 1)])["keys"]
    owned = [int((owner_of(keys, 3) == r).sum()) for r in range(3)]
    rows = -(-SMALL // 3)
    failed = [r for r in range(3) if owned[r] > rows]
    assert 0 < len(failed) < 3, owned  # some ranks fit their keys: they learn from the others
    for r in range(3):
        error = (out / f"{action}-{r}.txt").read_text()
        if r in failed:  # the rank whose keys do not fit says so, naming table, rank, keys and capacity
            assert (f"HashEmbedding 'emb': rank {r} of 3 owns {owned[r]} admitted and " in error
                    and f"pending keys of the checkpoint (saved by 2 rank(s)), which do not fit in capacity={rows} "
                    f"and pending_capacity={rows} (rows per rank)" in error)
        else:
            assert f"HashEmbedding: rank(s) {failed} could not read the checkpoint's keys" in error


@pytest.mark.e2e
def test_every_rank_refuses_an_old_store_past_the_checkpoints_commit(saved, tmp_path):
    out = _copy(saved / "pristine", tmp_path)
    store = TierStore.open(str(out / "tiers" / "emb" / "rank-1-of-2"))  # a later commit (a later checkpoint's)
    store.write("weight", np.array([0]), np.ones((1, 4), np.float32))
    generation = store.commit()
    store.close()
    torchrun(WORKER, out, "late", ranks=3)
    # old store 1 is settled by rank 1 of 3: it raises why, the others that it failed
    assert (f"disk-tiered HashEmbedding 'emb' (rank 1 of 3) cannot be resharded from the stores of the 2 rank(s) "
            f"that saved it: hash.emb.tier[1]: names generation {generation - 1} of tier store "
            f"{out}/tiers/emb/rank-1-of-2, which is at generation {generation}: only a store at the checkpoint's "
            "commit is resharded") in (out / "late-1.txt").read_text()
    for r in (0, 2):
        assert (f"HashEmbedding: rank(s) [1] could not read the checkpoint's keys and stores to reshard the "
                f"checkpoint's tables (their errors say why); this is rank {r}"
                ) in (out / f"late-{r}.txt").read_text()
