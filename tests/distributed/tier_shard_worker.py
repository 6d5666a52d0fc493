"""Train a WideDeep with disk-tiered tables under hybrid_parallel (each rank a store of its own rows).

    torchrun --nproc_per_node=2 tier_shard_worker.py OUT ACTION

ACTION:

- ``equal``: an in-memory WideDeep and the same net with features C1 and C2 on disk (a cache of
  `CACHE` rows per rank and table, far fewer than the rows each rank owns), the same initial rows,
  trained on the same batches; writes both gathered states to ``OUT/memory.safetensors`` and
  ``OUT/tiered.safetensors`` and each rank's tier counters to ``OUT/stats-<rank>.json`` (and, first,
  what a tiered table built on 2 ranks says when used before hybrid_parallel shards it:
  ``OUT/unsharded-<rank>.txt``);
- ``save``: the tiered net trains batches 0-2, saves ``OUT/ckpt`` (`save_sharded`: every rank's stores
  committed), trains batches 3-5 and writes ``OUT/straight.safetensors``; then loads ``OUT/ckpt``
  back in the same processes, trains batches 3-5 again and writes ``OUT/again.safetensors``;
- ``torn``: rank 1's store of table C1 has a torn ``shard.json`` (the test wrote it): every rank builds the
  tiered net and writes the ValueError it raises to ``OUT/error-<rank>.txt``;
- ``resume``: fresh processes (the stores reopened, their writes after the last commit undone) load
  ``OUT/ckpt``, train batches 3-5 and write ``OUT/resumed.safetensors``.

The gathered state is the collections' own gather (``gather_tables()``: every table's full rows; a
sharded tiered table's ``state_dict()`` holds its rank's commit instead, not every row).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from recstream import Model, checkpoint, distributed, set_auto_parallel_context
from recstream.data import SyntheticCTR
from recstream.models import WideDeep, default_optimizer
from recstream.nn import TierPlan

GLOBAL_BATCH, STEPS, CACHE = 16, 16, 20
VOCAB = [400, 300, 30]  # C1 and C2 tiered: 200 and 150 rows per rank behind 20 slots


def batches():
    gen = SyntheticCTR(num_dense=4, num_categorical=3, vocab_sizes=VOCAB, batch_size=GLOBAL_BATCH, seed=1)
    return list(gen.train_batches(STEPS)), gen.schema


def build(tiers: Path | None):
    torch.manual_seed(0)
    _, schema = batches()
    plan = None if tiers is None else TierPlan(str(tiers), {"C1": CACHE, "C2": CACHE})
    net = WideDeep(schema, hidden=(16, 8), embedding_dim=4, disk_tier=plan)
    optimizer = default_optimizer(net, lr=0.01)
    model = Model(net, torch.nn.BCEWithLogitsLoss(), optimizer, progress_bar=False)  # shards under hybrid
    return net, optimizer, model


def train(model, first: int, stop: int) -> None:
    data, _ = batches()
    model.train(1, distributed.shard(data[first:stop]))


def write(path: Path, net) -> None:
    """Every table's full rows and every other tensor of the state (collective)."""
    state = {k: v.detach().clone().contiguous() for k, v in net.state_dict().items() if not k.endswith(".tier")}
    for prefix in ("wide.ebc", "embedding.ebc"):
        state.update({f"{prefix}.tables.{name}.weight": w.contiguous()
                      for name, w in net.get_submodule(prefix).gather_tables().items()})
    if distributed.rank() == 0:
        save_file(state, path)


def main(out: Path, action: str) -> None:
    torch.set_num_threads(1)
    distributed.init()
    set_auto_parallel_context(parallel_mode="hybrid_parallel")
    r = distributed.rank()
    if action == "equal":
        early = WideDeep(batches()[1], hidden=(4,), disk_tier=TierPlan(str(out / "early"), {"C1": CACHE}))
        try:
            early.wide.ebc.tier_stats()
        except RuntimeError as e:
            (out / f"unsharded-{r}.txt").write_text(str(e))
        memory, _, memory_model = build(None)
        tiered, _, tiered_model = build(out / "tiers")
        tiered.load_state_dict(memory.state_dict())  # the same rows: each rank imports its own into its stores
        train(memory_model, 0, STEPS)
        train(tiered_model, 0, STEPS)
        write(out / "memory.safetensors", memory)
        write(out / "tiered.safetensors", tiered)
        stats = {f"{prefix}.{name}": vars(s) for prefix, m in tiered.named_modules() if hasattr(m, "tier_stats")
                 for name, s in m.tier_stats().items()}
        stats["state_dict"] = sorted(k for k in tiered.state_dict() if ".C1." in k)  # (collective)
        (out / f"stats-{r}.json").write_text(json.dumps(stats))
    elif action == "save":
        net, optimizer, model = build(out / "tiers")
        train(model, 0, 3)
        checkpoint.save_sharded(out / "ckpt", net, optimizer, extra={"rank": r})
        train(model, 3, 6)
        write(out / "straight.safetensors", net)
        checkpoint.load_sharded(out / "ckpt", net, optimizer)
        train(model, 3, 6)
        write(out / "again.safetensors", net)
    elif action == "torn":
        try:
            build(out / "tiers")
        except ValueError as e:  # on every rank: none goes on into collectives another never joins
            (out / f"error-{r}.txt").write_text(str(e))
    else:
        net, optimizer, model = build(out / "tiers")
        assert checkpoint.load_sharded(out / "ckpt", net, optimizer) == [{"rank": 0}, {"rank": 1}]
        train(model, 3, 6)
        write(out / "resumed.safetensors", net)
    distributed.shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
