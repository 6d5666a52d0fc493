"""Train a net with a disk-tiered HashEmbedding under hybrid_parallel (keys sharded; each rank a store of
its own keys' rows), for tests/distributed/test_hash_tier_sharding.py.

    torchrun --nproc_per_node=2 hash_tier_shard_worker.py OUT ACTION

ACTION:

- ``equal``: the net in memory and with its HashEmbedding on disk (a cache of `CACHE` rows per rank, far
  fewer than the keys a rank holds), trained on the same batches with the same seeds; both publish a full
  version after batch 5 and a delta after batch 6 (`SnapshotWriter`, one directory per rank and kind:
  ``OUT/pub-<kind>-<rank>``). Each rank writes ``OUT/<kind>-<rank>.safetensors`` (its keys, by key:
  rows, counts, last-seen steps and LazyAdam's moments) and ``OUT/equal-<rank>.json`` (the losses, the
  tier's counters, the sharding plan and what using a tiered table before sharding says);
- ``save``: the tiered net trains batches 0-5, saves ``OUT/ckpt`` (`save_sharded`), trains 6-11 and writes
  ``OUT/straight-<rank>.safetensors``; then loads ``OUT/ckpt`` in the same processes, trains 6-11 again
  and writes ``OUT/again-<rank>.safetensors``;
- ``resume``: fresh processes load ``OUT/ckpt``, train 6-11 and write ``OUT/resumed-<rank>.safetensors``;
- ``torn``: rank 1's store has a torn ``shard.json``: each rank writes the error it raises to ``OUT/error-<rank>.txt``;
- ``model``: a WideDeep whose dynamic feature ``user`` is in memory, then on disk (24 slots per rank), trained
  by ``Model.train`` (which prefetches the batches' keys); each rank writes the table's keys and rows,
  ``OUT/model-<kind>-<rank>.safetensors``, and the tier's counters, ``OUT/model-<rank>.json``.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from recstream import Model, checkpoint, distributed, set_auto_parallel_context
from recstream.distributed import sharding_plan
from recstream.nn import DiskTier, HashEmbedding
from recstream.optim import LazyAdam, sparse_and_dense
from recstream.serving.publishing.publish import SnapshotWriter
from tests.distributed.hash_worker import DIM, FIELDS, Record, batches

CAPACITY, CACHE, STEPS = 200, 64, 12  # 100 rows per rank (LRU evictions), 64 cached


class Net(torch.nn.Module):
    def __init__(self, tier: DiskTier | None):
        super().__init__()
        # Random initial rows (drawn by the key's owner), admission after 2 sightings, age eviction.
        self.emb = HashEmbedding(DIM, capacity=CAPACITY, param_init="uniform", permit_filter_value=2,
                                 evict_filter_value=3, tier=tier)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(FIELDS * DIM, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))

    def forward(self, keys):
        return self.mlp(self.emb(keys).flatten(1)).squeeze(-1)


def build(out: Path | None):
    torch.manual_seed(0)
    net = Net(None if out is None else DiskTier(str(out / "tiers" / "emb"), cache_rows=CACHE))
    optimizer = sparse_and_dense(net, sparse=lambda p: LazyAdam(p, lr=0.05),
                                 dense=lambda p: torch.optim.Adam(p, lr=0.01))
    return net, optimizer, Model(net, torch.nn.BCEWithLogitsLoss(), optimizer, progress_bar=False)


def train(model, first: int, stop: int) -> list[float]:
    torch.manual_seed(1000 + first)  # new keys' initial rows: the same draws whatever ran before
    record = Record()
    model.train(1, distributed.shard(batches(STEPS)[first:stop]), callbacks=[record])
    return record.losses


def rows_by_key(net, optimizer) -> dict[str, torch.Tensor]:
    """This rank's keys, by key, with their rows, counts, last-seen steps and LazyAdam moments."""
    emb = net.emb
    if emb.disk_tier is not None:
        emb.state_dict()  # commits the store: every trained row and its moments written back
    got = emb.export(reset_delta=False)
    rows = emb.table.rows[emb.table.find(got["keys"])]
    state = next(o.state[emb.values] for o in optimizer.optimizers.values() if emb.values in o.state)
    for key in ("exp_avg", "exp_avg_sq"):
        got[key] = state[key][rows] if emb.disk_tier is None else torch.from_numpy(
            emb.tier_store.read(key, rows.numpy()))
    order = torch.argsort(got["keys"])
    return {k: v[order].contiguous() for k, v in got.items()}


def equal(out: Path, r: int) -> None:
    report = {}
    early = HashEmbedding(DIM, capacity=16, tier=DiskTier(str(out / "early"), cache_rows=8))
    try:
        early(torch.tensor([1, 2]))
    except RuntimeError as e:
        report["unsharded"] = str(e)
    for kind, base in (("memory", None), ("tiered", out)):
        net, optimizer, model = build(base)
        writer = SnapshotWriter(str(out / f"pub-{kind}-{r}"), full_every=4)
        losses = train(model, 0, 6)
        writer.publish(net)
        losses += train(model, 6, 7)
        writer.publish(net)  # the rows changed by one step, and the keys evicted: a delta
        losses += train(model, 7, STEPS)
        report[kind] = losses
        save_file(rows_by_key(net, optimizer), out / f"{kind}-{r}.safetensors")
    report["stats"] = vars(net.emb.tier_stats())
    report["plan"] = sharding_plan(net)
    (out / f"equal-{r}.json").write_text(json.dumps(report))


def save(out: Path, r: int) -> None:
    net, optimizer, model = build(out)
    train(model, 0, 6)
    checkpoint.save_sharded(out / "ckpt", net, optimizer, extra={"rank": r})
    train(model, 6, STEPS)
    save_file(rows_by_key(net, optimizer), out / f"straight-{r}.safetensors")
    checkpoint.load_sharded(out / "ckpt", net, optimizer)
    train(model, 6, STEPS)
    save_file(rows_by_key(net, optimizer), out / f"again-{r}.safetensors")


def resume(out: Path, r: int) -> None:
    net, optimizer, model = build(out)
    assert checkpoint.load_sharded(out / "ckpt", net, optimizer) == [{"rank": 0}, {"rank": 1}]
    train(model, 6, STEPS)
    save_file(rows_by_key(net, optimizer), out / f"resumed-{r}.safetensors")


def model(out: Path, r: int) -> None:
    from recstream.data import Batch, CategoricalFeature, Features, Schema
    from recstream.models import WideDeep
    from recstream.nn import TierPlan

    schema = Schema(["x"], [CategoricalFeature("user", dynamic=True, capacity=300, embedding_dim=4),
                            CategoricalFeature("item", vocab_size=50, embedding_dim=4)])
    data = []
    for step in range(30):
        g = torch.Generator().manual_seed(step)
        users = (torch.rand(16, generator=g) ** 4 * 10 ** 4).long()  # a few hot users, many rare ones
        values = torch.cat([users, torch.randint(0, 50, (16,), generator=g)])
        x = Features.from_lengths(torch.randn(16, 1, generator=g), values, torch.ones(2, 16, dtype=torch.int64),
                                  keys=("user", "item"))
        data.append(Batch(x, torch.randint(0, 2, (16,), generator=g).float()))
    for kind, plan in (("memory", None), ("tiered", TierPlan(str(out / "model"), {"user": 24}))):
        torch.manual_seed(0)
        net = WideDeep(schema, hidden=(8,), disk_tier=plan)
        Model(net, torch.nn.BCEWithLogitsLoss(), LazyAdam(net.parameters(), lr=0.05), progress_bar=False).train(
            1, distributed.shard(data))
        table = net.embedding.dynamic.tables["user"]
        rows = table.export(reset_delta=False)
        order = torch.argsort(rows["keys"])
        save_file({k: v[order].contiguous() for k, v in rows.items()}, out / f"model-{kind}-{r}.safetensors")
    (out / f"model-{r}.json").write_text(json.dumps(vars(table.tier_stats())))


def torn(out: Path, r: int) -> None:
    """Rank 1's store has a torn ``shard.json`` (the test wrote it): each rank writes the ValueError it raises
    when the net is built and key-sharded to ``OUT/error-<rank>.txt``."""
    try:
        build(out)
    except ValueError as e:  # on every rank: none goes on into collectives another never joins
        (out / f"error-{r}.txt").write_text(str(e))


if __name__ == "__main__":
    torch.set_num_threads(1)
    distributed.init()
    set_auto_parallel_context(parallel_mode="hybrid_parallel")
    {"equal": equal, "save": save, "resume": resume, "model": model, "torn": torn}[sys.argv[2]](
        Path(sys.argv[1]), distributed.rank())
    distributed.shutdown()
