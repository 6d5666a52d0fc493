"""Save a WideDeep with disk-tiered tables on N ranks and load it into M (resharding the tier stores).

    torchrun --nproc_per_node=N tier_reshard_worker.py OUT ACTION

The nets are `tier_shard_worker`'s (C1 and C2 on disk, a cache of `CACHE` rows per rank and table), the
tiered one's stores under ``OUT/tiers``, an in-memory twin with the same initial rows beside it.

ACTION:

- ``save``: both nets train batches 0-3 and are saved (``OUT/ckpt``, ``OUT/mckpt``); writes the
  tiered net's gathered state at the save (``OUT/saved.safetensors``) and each rank's store arrays
  (``OUT/saved-arrays-<rank>.safetensors``: `arrays`); then trains batches 4-7 (the stores written
  after their commit: a run that goes on, or dies, after a checkpoint);
- ``load``: both nets built on this run's ranks load their checkpoints (the tiered one's stores
  resharded), write ``OUT/loaded-<ranks>.safetensors`` and ``OUT/loaded-arrays-<ranks>-<rank>.safetensors``,
  train batches 4-7 and write ``OUT/tiered-<ranks>.safetensors`` and ``OUT/memory-<ranks>.safetensors``.

Rows are resharded `tier_reshard.CHUNK` = 7 at a time: many chunks, some across the old stores' bounds.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from recstream import checkpoint, distributed, set_auto_parallel_context
from recstream.nn import tier_reshard
from recstream.nn.tier_store import open_arrays

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tier_shard_worker import VOCAB, build, write  # noqa: E402

from recstream.data import SyntheticCTR  # noqa: E402

GLOBAL_BATCH = 12  # splits over 1, 2 and 3 ranks


def batches():
    gen = SyntheticCTR(num_dense=4, num_categorical=3, vocab_sizes=VOCAB, batch_size=GLOBAL_BATCH, seed=1)
    return list(gen.train_batches(8)), gen.schema


def arrays(net) -> dict[str, torch.Tensor]:
    """Every array (weights, per-row optimizer state) of each tiered table's store, as committed."""
    out = {}
    for prefix in ("wide.ebc", "embedding.ebc"):
        m = net.get_submodule(prefix)
        for t in m.tables:
            if t.tier is None:
                continue
            store = m.tier_store_directory(t.name)
            groups, arrays = open_arrays(store)
            for name, a in arrays.items():
                out[f"{prefix}.{t.name}.{name}"] = torch.from_numpy(a.read_rows(np.arange(a.rows)))
            for f in groups:
                f.close()
    return out


def train(model, first: int, stop: int, sharded: bool = True) -> None:
    data, _ = batches()
    model.train(1, distributed.shard(data[first:stop]) if sharded else data[first:stop])


def nets(out: Path):
    memory, memory_opt, memory_model = build(None)
    tiered, tiered_opt, tiered_model = build(out / "tiers")
    return (memory, memory_opt, memory_model), (tiered, tiered_opt, tiered_model)


def save(out: Path) -> None:
    (memory, memory_opt, memory_model), (tiered, tiered_opt, tiered_model) = nets(out)
    tiered.load_state_dict(memory.state_dict())
    train(memory_model, 0, 4)
    train(tiered_model, 0, 4)
    checkpoint.save_sharded(out / "mckpt", memory, memory_opt)
    checkpoint.save_sharded(out / "ckpt", tiered, tiered_opt)
    write(out / "saved.safetensors", tiered)
    save_file(arrays(tiered), out / f"saved-arrays-{distributed.rank()}.safetensors")
    train(tiered_model, 4, 8)


def load(out: Path, sharded: bool) -> None:
    (memory, memory_opt, memory_model), (tiered, tiered_opt, tiered_model) = nets(out)
    ranks, r = distributed.world_size(), distributed.rank()
    checkpoint.load_sharded(out / "mckpt", memory, memory_opt)
    checkpoint.load_sharded(out / "ckpt", tiered, tiered_opt)
    write(out / f"loaded-{ranks}.safetensors", tiered)
    save_file(arrays(tiered), out / f"loaded-arrays-{ranks}-{r}.safetensors")
    train(memory_model, 4, 8, sharded)
    train(tiered_model, 4, 8, sharded)
    write(out / f"memory-{ranks}.safetensors", memory)
    write(out / f"tiered-{ranks}.safetensors", tiered)


def main(out: Path, action: str) -> None:
    torch.set_num_threads(1)
    distributed.init()
    set_auto_parallel_context(parallel_mode="hybrid_parallel")
    tier_reshard.CHUNK = 7  # rows streamed in many chunks, some across the old stores' bounds
    save(out) if action == "save" else load(out, sharded=True)
    distributed.shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
