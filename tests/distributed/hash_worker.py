"""Runs of a HashEmbedding model for tests/distributed/test_hash_sharding.py, the same script
under `python` (one process, stand-alone) and `torchrun` (hybrid_parallel: keys sharded).

    python hash_worker.py OUT train          # train 6 steps, save_sharded OUT/ckpt, train 4 more
    torchrun --nproc_per_node=2 hash_worker.py OUT train
    torchrun --nproc_per_node=N hash_worker.py OUT resume   # load OUT/ckpt, train the same 4 steps

Global batch 48 (each of N ranks trains 48 / N rows of it). Rank 0 writes
OUT/<action>-<ranks>.json (the per-step global losses, and every rank's exported keys at the
checkpoint and at the end: each key must live on exactly one rank) and
OUT/<action>-<ranks>-keys.safetensors (the union of the ranks' exports at the checkpoint and at
the end: keys, values, counts).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from recstream import Model, checkpoint, distributed, set_auto_parallel_context
from recstream.callbacks import Callback
from recstream.metrics import Loss
from recstream.nn import HashEmbedding
from recstream.optim import LazyAdam, sparse_and_dense

GLOBAL_BATCH, FIELDS, DIM = 48, 3, 4  # 48: splits over 1, 2 and 3 ranks


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        # Zero initial rows: a new key's row is then the same whichever rank (and RNG) draws it.
        # Admission after 2 sightings and age eviction after 3 steps: both must match one process.
        self.emb = HashEmbedding(DIM, capacity=512, param_init="zeros", permit_filter_value=2,
                                 evict_filter_value=3)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(FIELDS * DIM, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))

    def forward(self, keys):
        return self.mlp(self.emb(keys).flatten(1)).squeeze(-1)


def batches(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Keys over a 2**40 range, a few hot ones; labels a fixed function of the keys."""
    gen = torch.Generator().manual_seed(3)
    pool = torch.randint(0, 2**40, (300,), generator=gen)
    out = []
    for _ in range(n):
        idx = (torch.rand(GLOBAL_BATCH, FIELDS, generator=gen) ** 3 * pool.numel()).long()
        keys = pool[idx]
        label = ((keys % 7).sum(1) % 2).float()
        out.append((keys, label))
    return out


class Record(Callback):
    def __init__(self):
        self.losses = []

    def on_train_step_end(self, run_context):
        loss = run_context.original_args().net_outputs.detach().clone()
        if distributed.is_distributed():
            torch.distributed.all_reduce(loss)
            loss /= distributed.world_size()
        self.losses.append(float(loss))


def build():
    torch.manual_seed(0)
    net = Net()
    optimizer = sparse_and_dense(net, sparse=lambda p: LazyAdam(p, lr=0.05),
                                 dense=lambda p: torch.optim.Adam(p, lr=0.01))
    model = Model(net, torch.nn.BCEWithLogitsLoss(), optimizer, metrics={"loss": Loss()}, progress_bar=False)
    return net, optimizer, model


def train(model, data) -> list[float]:
    record = Record()
    model.train(1, distributed.shard(data), callbacks=[record])
    return record.losses


def exported(net) -> dict:
    """This rank's export, and (on every rank) the list of every rank's keys."""
    rows = net.emb.export(reset_delta=False)
    every = [None] * distributed.world_size()
    if distributed.is_distributed():
        torch.distributed.all_gather_object(every, {k: v.tolist() for k, v in rows.items()})
    else:
        every = [{k: v.tolist() for k, v in rows.items()}]
    return every


def union(every: list[dict]) -> dict[str, torch.Tensor]:
    keys = torch.tensor([k for r in every for k in r["keys"]], dtype=torch.int64)
    values = torch.tensor([v for r in every for v in r["values"]], dtype=torch.float32).view(-1, DIM)
    counts = torch.tensor([c for r in every for c in r["counts"]], dtype=torch.int64)
    order = torch.argsort(keys)
    return {"keys": keys[order], "values": values[order], "counts": counts[order]}


def main(out: Path, action: str) -> None:
    torch.set_num_threads(1)
    distributed.init()
    set_auto_parallel_context(parallel_mode="hybrid_parallel")
    net, optimizer, model = build()
    data = batches(10)
    result = {}
    if action == "train":
        result["losses"] = train(model, data[:6])
        at_ckpt = exported(net)
        checkpoint.save_sharded(out / "ckpt", net, optimizer, extra={"rank": distributed.rank()})
    else:
        checkpoint.load_sharded(out / "ckpt", net, optimizer)
        at_ckpt = exported(net)
    result["after"] = train(model, data[6:])
    result["eval"] = model.eval(distributed.shard(data[:6]))  # eval mode: read-only, still routed
    at_end = exported(net)
    # Uneven data: a rank without keys still answers the others' lookups (an empty batch).
    net.eval()
    with torch.no_grad():
        keys = data[0][0] if distributed.rank() == 0 else data[0][0][:0]
        result["uneven"] = net.emb(keys).tolist()
    result["rank_keys"] = {"ckpt": [r["keys"] for r in at_ckpt], "end": [r["keys"] for r in at_end]}
    result["local_rows"] = net.emb.capacity
    if distributed.rank() == 0:
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{action}-{distributed.world_size()}.json").write_text(json.dumps(result))
        tensors = {f"ckpt.{k}": v for k, v in union(at_ckpt).items()}
        tensors.update({f"end.{k}": v for k, v in union(at_end).items()})
        save_file(tensors, out / f"{action}-{distributed.world_size()}-keys.safetensors")
    distributed.shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
