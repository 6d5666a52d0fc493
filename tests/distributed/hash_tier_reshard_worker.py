"""Save a net with a disk-tiered HashEmbedding on N ranks (or one process) and load it into M (resharding
its stores), beside an in-memory twin resharded from the same checkpoint's data, for
tests/distributed/test_hash_tier_resharding.py.

    torchrun --nproc_per_node=N hash_tier_reshard_worker.py OUT ACTION

The tiered net's stores are under ``OUT/tiers/emb`` (a cache of `CACHE` rows per rank, fewer than a rank's
keys: rows evicted and read back), the in-memory twin's rows in memory; both train on the same batches
with the same seeds (`hash_tier_shard_worker`: they stay equal bit for bit).

ACTION:

- ``save``: both nets train batches 0-5 (exported after batch 2: an eviction log); each rank writes its
  tiered table, by key (rows, counts, last-seen steps, the row each key is in, LazyAdam's moments:
  `table_by_key`), to ``OUT/saved-<rank>.safetensors``;
  both nets are saved (``OUT/ckpt``, ``OUT/mckpt``), then the tiered one trains batches 6-11 (its stores
  written after their commit: a run that goes on, or dies, after a checkpoint);
- ``load``: both nets, built on this run's ranks, load their checkpoints (the tiered one's stores resharded)
  and write ``OUT/loaded-<kind>-<ranks>-<rank>.safetensors``; both train batches 6-8 and write
  ``OUT/trained-<kind>-<ranks>-<rank>.safetensors``;
- ``small``: the tiered net, with a capacity (`SMALL`) some ranks' keys do not fit, loads ``OUT/ckpt``;
  each rank writes the error it raises to ``OUT/small-<rank>.txt``; ``msmall``: the same with the
  in-memory net and ``OUT/mckpt``;
- ``late``: the tiered net loads ``OUT/ckpt``, whose rank 1 store was committed again after it; each rank
  writes its error to ``OUT/late-<rank>.txt``.

Rows are resharded `tier_reshard.CHUNK` = 7 at a time: many chunks, some across the old stores' bounds.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from recstream import Model, checkpoint, distributed, set_auto_parallel_context
from recstream.nn import DiskTier, HashEmbedding, tier_reshard
from recstream.nn.tensor_hash_table import DELETED, EMPTY
from recstream.optim import LazyAdam, sparse_and_dense
from tests.distributed.hash_worker import DIM, FIELDS, batches

CAPACITY, STEPS = 240, 12  # 120 rows a rank on 2 ranks, 80 on 3, 240 in one process
SMALL = 138  # 46 rows a rank on 3 ranks: some ranks own more of the checkpoint's keys, some fewer
CACHE = {1: 100}  # cached rows per rank, by the number of ranks (else 48): fewer than the keys a rank holds,
# more than the distinct admitted keys of the batch it looks up (one process: all the global batch's)


class Net(torch.nn.Module):
    def __init__(self, tier: DiskTier | None, capacity: int = CAPACITY):
        super().__init__()
        # Random initial rows (drawn by the key's owner), admission after 2 sightings (pending keys), age eviction.
        self.emb = HashEmbedding(DIM, capacity=capacity, param_init="uniform", permit_filter_value=2,
                                 evict_filter_value=3, tier=tier)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(FIELDS * DIM, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))

    def forward(self, keys):
        return self.mlp(self.emb(keys).flatten(1)).squeeze(-1)


def build(out: Path | None, capacity: int = CAPACITY):
    torch.manual_seed(0)
    cache = CACHE.get(distributed.world_size(), 48)
    net = Net(None if out is None else DiskTier(str(out / "tiers" / "emb"), cache_rows=cache), capacity)
    optimizer = sparse_and_dense(net, sparse=lambda p: LazyAdam(p, lr=0.05),
                                 dense=lambda p: torch.optim.Adam(p, lr=0.01))
    return net, optimizer, Model(net, torch.nn.BCEWithLogitsLoss(), optimizer, progress_bar=False)


def train(model, first: int, stop: int) -> None:
    torch.manual_seed(1000 + first)  # new keys' initial rows: the same draws whatever ran before
    model.train(1, distributed.shard(batches(STEPS)[first:stop]))


def table_by_key(net, optimizer) -> dict[str, torch.Tensor]:
    """This rank's admitted keys, by key, with their rows' values, counts, last-seen steps, the row each is
    in and LazyAdam's moments; its pending keys with their counts; the table's step and eviction log."""
    emb = net.emb
    if emb.disk_tier is not None:
        emb.state_dict()  # commits the store: every trained row and its moments written back
    got = emb.export(reset_delta=False)
    got["row"] = emb.table.rows[emb.table.find(got["keys"])]
    state = next(o.state[emb.values] for o in optimizer.optimizers.values() if emb.values in o.state)
    for key in ("exp_avg", "exp_avg_sq"):
        got[key] = state[key][got["row"]] if emb.disk_tier is None else torch.from_numpy(
            emb.tier_store.read(key, got["row"].numpy()))
    order = torch.argsort(got["keys"])
    out = {k: v[order].contiguous() for k, v in got.items()}
    keys = emb.table.keys
    pending = (keys != EMPTY) & (keys != DELETED) & (emb.table.rows < 0)
    order = torch.argsort(keys[pending])
    out["pending_keys"], out["pending_counts"] = keys[pending][order], emb.table.counts[pending][order]
    out["global_step"] = torch.tensor([emb.global_step])
    out["evicted_keys"] = torch.sort(emb.evicted_keys).values
    return out


def save(out: Path) -> None:
    r = distributed.rank()
    memory, memory_opt, memory_model = build(None)
    tiered, tiered_opt, tiered_model = build(out)
    for net, model in ((memory, memory_model), (tiered, tiered_model)):
        train(model, 0, 3)
        net.emb.export()  # the eviction log starts: the age evictions of batches 3-5 are in the checkpoint
        train(model, 3, 6)
    save_file(table_by_key(tiered, tiered_opt), out / f"saved-{r}.safetensors")  # (commits: before the save's)
    checkpoint.save_sharded(out / "mckpt", memory, memory_opt)
    checkpoint.save_sharded(out / "ckpt", tiered, tiered_opt)
    train(tiered_model, 6, STEPS)


def load(out: Path) -> None:
    ranks, r = distributed.world_size(), distributed.rank()
    nets = {"memory": build(None), "tiered": build(out)}
    for kind, (net, optimizer, _) in nets.items():
        checkpoint.load_sharded(out / {"memory": "mckpt", "tiered": "ckpt"}[kind], net, optimizer)
        save_file(table_by_key(net, optimizer), out / f"loaded-{kind}-{ranks}-{r}.safetensors")
    for kind, (net, optimizer, model) in nets.items():
        train(model, 6, 9)
        save_file(table_by_key(net, optimizer), out / f"trained-{kind}-{ranks}-{r}.safetensors")


def refused(out: Path, action: str) -> None:
    """Each rank writes the ValueError the load raises to ``OUT/<action>-<rank>.txt`` (none goes on into a
    collective another never joins)."""
    net, optimizer, _ = build(None if action == "msmall" else out, capacity=CAPACITY if action == "late" else SMALL)
    try:
        checkpoint.load_sharded(out / ("mckpt" if action == "msmall" else "ckpt"), net, optimizer)
    except ValueError as e:
        (out / f"{action}-{distributed.rank()}.txt").write_text(str(e))


def main(out: Path, action: str) -> None:
    torch.set_num_threads(1)
    distributed.init()
    set_auto_parallel_context(parallel_mode="hybrid_parallel")
    tier_reshard.CHUNK = 7  # rows streamed in many chunks, some across the old stores' bounds
    {"save": save, "load": load}.get(action, lambda out: refused(out, action))(out)
    distributed.shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
