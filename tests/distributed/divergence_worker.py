"""A non-finite value on one rank of a hybrid_parallel run stops every rank's checkpoint.

    torchrun --nproc_per_node=2 divergence_worker.py OUT

Trains `checkpoint_worker`'s WideDeep on 2 ranks with a checkpoint every step; at step 2's end,
before the checkpoint, rank 1 writes a NaN into its own rows of a sharded table (after the step's
loss: the loss guard sees nothing). Each rank writes what it raised to ``OUT/rank-<r>.txt``.
Gathering a sharded table raises here: the check must read each rank's own rows only.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

from recstream import distributed, set_auto_parallel_context
from recstream.callbacks import Callback, CheckpointConfig, ModelCheckpoint
from recstream.nn import EmbeddingBagCollection

from .checkpoint_worker import batches, build


class PoisonRankOne(Callback):
    def on_train_step_end(self, run_context):
        p = run_context.original_args()
        if p.cur_step_num == 2 and distributed.rank() == 1:
            ebc = next(m for m in p.network.modules() if isinstance(m, EmbeddingBagCollection) and m.sharded)
            with torch.no_grad():
                next(w for w in ebc.parameters() if hasattr(w, "recstream_layout"))[-1, 0] = float("nan")


def _no_gather(self, tiered):
    raise AssertionError("a sharded table was gathered")


def main(out: Path) -> None:
    torch.set_num_threads(1)
    distributed.init()
    set_auto_parallel_context(parallel_mode="hybrid_parallel")
    net, _, model = build()
    EmbeddingBagCollection._gather = _no_gather
    data, _ = batches()
    ckpt = ModelCheckpoint(prefix="div", directory=str(out / "ckpt"), config=CheckpointConfig(save_checkpoint_steps=1))
    try:
        model.train(1, distributed.shard(data[:4]), callbacks=[PoisonRankOne(), ckpt])
        raised = "nothing"
    except Exception as e:  # noqa: BLE001 - written for the test to read
        raised = f"{type(e).__name__}: {e}"
    (out / f"rank-{distributed.rank()}.txt").write_text(raised)
    distributed.shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
