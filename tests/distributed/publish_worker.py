"""Online training with a ModelPublisher under hybrid_parallel, for tests/distributed/test_sharded_publish.py.

    torchrun --nproc_per_node=2 publish_worker.py OUT ACTION

ACTION ``fixed`` (a WideDeep of fixed-vocabulary tables, row-sharded; background writes), ``dynamic``
(a WideDeep with a dynamic feature too: a key-sharded HashEmbedding; writes in the step) or ``tiered``
(as ``dynamic``, the tables of "item" and "user" disk-tiered, each rank's rows in a store of its own, behind
caches smaller than a rank's rows): `online_train`
with ``ModelPublisher(OUT/pub, every_steps=2)``. A callback records the state at every even step, before
that step's version is taken: the gathered dense state (``OUT/step<s>-dense.safetensors``, rank 0) and
every rank's rows of each HashEmbedding (``OUT/step<s>-rows-<r>.safetensors``). After training both
ranks score `INSTANCES` with the trained (sharded) network, ``OUT/scores-<r>.json``.
ACTION ``diverge``: rank 1's third batch holds a NaN, the publisher is due at step 3: both ranks must
raise DivergenceError (written to ``OUT/error-<r>.txt``), none waits forever.
ACTION ``unwritable``: rank 0 replaces the publish directory by a file after step 3 and restores it
after step 5 (``on_error="log"``): the failed publish (step 4) is every rank's, training goes on and ends.
ACTION ``seconds``: as ``fixed`` with ``every_seconds`` (each rank's clock; rank 1 is slower per step).
ACTION ``blocked``: the publish directory is a file: both ranks raise at the start of training.
Every rank prints ``done RANK FAILURES VERSIONS`` at the end.
"""
from __future__ import annotations

import json
import math
import shutil
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from recstream import RecModel, distributed, set_auto_parallel_context
from recstream.callbacks import Callback, DivergenceError
from recstream.data import Batch, CategoricalFeature, Features, Schema
from recstream.data.streams import IterableStream
from recstream.models import WideDeep
from recstream.nn import TierPlan
from recstream.optim import LazyAdam
from recstream.serving import InstanceParser, ModelPublisher
from recstream.serving.publishing.sharded import ShardedPublishError
from recstream.serving.snapshot.state_split import dense_state, hash_embeddings

STEPS = 8
CONFIG = {"hidden": [8], "embedding_dim": 4}
FIXED = [CategoricalFeature("item", vocab_size=50), CategoricalFeature("shop", vocab_size=31)]
DYNAMIC = [CategoricalFeature("user", dynamic=True, capacity=200)]
INSTANCES = [{"x": 0.3, "item": 2, "shop": 7, "user": 3}, {"x": -1.0, "item": 49, "shop": 0, "user": 10**12},
             {"x": 0.1, "item": 11, "shop": 30, "user": 41}, {"x": 2.0, "item": 0, "shop": 5, "user": 17}]


def schema(dynamic: bool) -> Schema:
    return Schema(["x"], FIXED + (DYNAMIC if dynamic else []))


def batches(dynamic: bool, nan_at: int | None = None) -> list[Batch]:
    """The global batches (16 rows); users drawn from 60 keys, so a delta holds less than a full version."""
    out = []
    for step in range(STEPS):
        g = torch.Generator().manual_seed(step)
        cols = [torch.randint(0, 50, (16,), generator=g), torch.randint(0, 31, (16,), generator=g)]
        if dynamic:
            cols.append(torch.randint(0, 60, (16,), generator=g))
        dense = torch.randn(16, 1, generator=g)
        if step == nan_at:
            dense[8:] = math.nan  # rank 1's half of the global batch
        x = Features.from_lengths(dense, torch.cat(cols), torch.ones(len(cols), 16, dtype=torch.int64),
                                  keys=schema(dynamic).categorical_names)
        out.append(Batch(x, torch.randint(0, 2, (16,), generator=g).float()))
    return out


class Record(Callback):
    """The state at every even step (every rank runs it: the gathers are collectives)."""

    def __init__(self, out: Path):
        self.out = out

    def on_train_step_end(self, run_context):
        p = run_context.original_args()
        if p.cur_step_num % 2:
            return
        net, r = p.network, distributed.rank()
        dense = dense_state(net)  # gathers the row-sharded tables
        if r == 0:
            save_file({k: v.contiguous() for k, v in dense.items()},
                      self.out / f"step{p.cur_step_num}-dense.safetensors")
        rows = {f"{path}.{k}": v.contiguous() for path, emb in hash_embeddings(net).items()
                for k, v in emb.export(reset_delta=False).items()}
        save_file(rows, self.out / f"step{p.cur_step_num}-rows-{r}.safetensors")


class Vandal(Callback):
    """Rank 0: the publish directory becomes a file after step 3, a directory again after step 5."""

    def __init__(self, directory: Path):
        self.directory = directory

    def on_train_step_end(self, run_context):
        step = run_context.original_args().cur_step_num
        if distributed.rank() != 0 or step not in (3, 5):
            return
        if step == 3:
            shutil.move(self.directory, self.directory.with_name("moved"))
            self.directory.write_text("not a directory")
        else:
            self.directory.unlink()
            shutil.move(self.directory.with_name("moved"), self.directory)


class Slow(Callback):
    """Rank 1 takes 30 ms longer per step: the ranks' clocks reach `every_seconds` at different steps."""

    def on_train_step_end(self, run_context):
        if distributed.rank() == 1:
            time.sleep(0.03)


def scores(net, dynamic: bool) -> list[float]:
    features = InstanceParser(schema(dynamic)).parse({"instances": [
        {k: v for k, v in i.items() if dynamic or k != "user"} for i in INSTANCES]})
    net.eval()
    with torch.no_grad():
        return torch.sigmoid(net(features)).flatten().tolist()


def main(out: Path, action: str) -> None:
    r = distributed.rank()
    dynamic = action not in ("fixed", "seconds")
    torch.manual_seed(0)
    tier = TierPlan(str(out / "tiers"), {"item": 20, "user": 24}) if action == "tiered" else None
    net = WideDeep(schema(dynamic), **CONFIG, disk_tier=tier)
    model = RecModel(net, torch.nn.BCEWithLogitsLoss(), LazyAdam(net.parameters(), lr=0.05), progress_bar=False)
    every = 3 if action == "diverge" else 2
    timed = action == "seconds"
    publisher = ModelPublisher(out / "pub", every_steps=None if timed else every,
                               every_seconds=0.05 if timed else None, model_config=CONFIG, full_every=10,
                               on_error="log" if action == "unwritable" else "raise",
                               background=action in ("fixed", "seconds"))
    extra = {"fixed": [Record(out)], "dynamic": [Record(out)], "tiered": [Record(out)], "diverge": [], "blocked": [],
             "seconds": [Slow()],
             "unwritable": [Vandal(out / "pub")]}[action]
    if action == "blocked" and r == 0:
        (out / "pub").write_text("a file where the publish directory should be")
    data = batches(dynamic, nan_at=2 if action == "diverge" else None)
    try:
        model.online_train(IterableStream(lambda: iter(distributed.shard(data))), callbacks=[publisher, *extra],
                           dataset_sink_mode=False)
    except (DivergenceError, OSError, ShardedPublishError) as e:
        if action not in ("diverge", "blocked"):
            raise
        (out / f"error-{r}.txt").write_text(f"{type(e).__name__}: {e}")
    if action in ("fixed", "dynamic", "tiered", "seconds"):
        (out / f"scores-{r}.json").write_text(json.dumps(scores(net, dynamic)))
    # one write: the ranks share torchrun's stdout (print writes the line and its end separately)
    sys.stdout.write(f"done {r} {publisher.failures} {[m['version'] for m in publisher.manifests]}\n")
    sys.stdout.flush()


if __name__ == "__main__":
    torch.set_num_threads(1)
    distributed.init()
    set_auto_parallel_context(parallel_mode="hybrid_parallel")
    main(Path(sys.argv[1]), sys.argv[2])
    distributed.shutdown()
