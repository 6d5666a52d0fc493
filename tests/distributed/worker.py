"""One training run for the equivalence tests: the same script under `python` and `torchrun`.

    python worker.py OUT_DIR MODEL MODE             # one process, global batch 64
    torchrun --nproc_per_node=2 worker.py OUT_DIR MODEL MODE   # two ranks, 32 rows each per step

An optional fourth argument is a directory for ModelCheckpoint.
MODEL: "widedeep" (fused EmbeddingBagCollection with sparse gradients, FTRL + LazyAdam + Adam)
or "mlp" (dense only, Adam). MODE: the parallel mode set ("data_parallel" or "hybrid_parallel";
a single process runs stand-alone whatever is set). Rank 0 writes the per-step global losses, the evaluation results and
what cb_params reported to OUT_DIR/result.json, and the final weights to OUT_DIR/weights.safetensors.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from recstream import Model, distributed, set_auto_parallel_context
from recstream.callbacks import Callback, CheckpointConfig, ModelCheckpoint
from recstream.data import SyntheticCTR
from recstream.metrics import AUC, Loss
from recstream.models import WideDeep, default_optimizer


class Record(Callback):
    """Each step's loss averaged over the ranks (= the loss of the global batch), and cb_params."""

    def __init__(self):
        self.losses, self.params = [], {}

    def on_train_begin(self, run_context):
        p = run_context.original_args()
        self.params = {"parallel_mode": p.parallel_mode, "device_number": p.device_number, "rank": p.rank}

    def on_train_step_end(self, run_context):
        loss = run_context.original_args().net_outputs.detach().clone()
        if distributed.is_distributed():
            torch.distributed.all_reduce(loss)
            loss /= distributed.world_size()
        self.losses.append(float(loss))


class Dense(torch.nn.Module):
    def __init__(self, num_dense: int):
        super().__init__()
        self.mlp = torch.nn.Sequential(torch.nn.Linear(num_dense, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))

    def forward(self, features):
        return self.mlp(features.dense).squeeze(-1)


def build(kind: str):
    """The data, network and optimizer of a run (the same in every process)."""
    torch.manual_seed(0)  # same initial weights everywhere (data_parallel also broadcasts rank 0's)
    gen = SyntheticCTR(num_dense=4, num_categorical=3, vocab_sizes=[50, 40, 30], batch_size=64, seed=1)
    if kind == "widedeep":
        net = WideDeep(gen.schema, hidden=(16, 8), embedding_dim=4)
        return gen, net, default_optimizer(net, lr=0.01)
    net = Dense(4)
    return gen, net, torch.optim.Adam(net.parameters(), lr=0.01)


def main(out: Path, kind: str, mode: str, checkpoints: str | None = None) -> None:
    torch.set_num_threads(1)
    distributed.init()
    set_auto_parallel_context(parallel_mode=mode)
    gen, net, optimizer = build(kind)
    if os.environ.get("RECSTREAM_TEST_DEVICE") == "cuda":  # the CUDA variant of the equivalence test
        net.cuda()  # before the optimizer's first step: its state is created on the GPU
    train, valid = gen.train_batches(6), gen.test_split(256, batch_size=64)
    metrics = {"auc": AUC(from_logits=True), "loss": Loss()}
    model = Model(net, torch.nn.BCEWithLogitsLoss(), optimizer, metrics=metrics, progress_bar=False)
    record = Record()
    callbacks = [record]
    if checkpoints:  # every 5 steps, keep 2 (under hybrid_parallel: sharded directories, all ranks write)
        callbacks.append(ModelCheckpoint("w", checkpoints, CheckpointConfig(save_checkpoint_steps=5,
                                                                            keep_checkpoint_max=2)))
    model.fit(2, distributed.shard(train), valid_dataset=distributed.shard(valid), callbacks=callbacks)
    results = model.eval(distributed.shard(valid))
    weights = net.state_dict()  # every rank: sharded tables are gathered from all of them
    if distributed.rank() == 0:
        out.mkdir(parents=True, exist_ok=True)
        save_file({k: v.detach().cpu().contiguous() for k, v in weights.items()}, out / "weights.safetensors")
        placements = {name: entry["placement"] for name, entry in model.infer_train_layout().items()}
        (out / "result.json").write_text(json.dumps({"losses": record.losses, "eval": results,
                                                     "cb_params": record.params, "placements": placements}))
    distributed.shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], sys.argv[3], *sys.argv[4:])
