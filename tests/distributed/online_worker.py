"""Online training under torchrun, for tests/distributed/test_online.py.

    torchrun --nproc_per_node=N online_worker.py CONFIG_JSON

CONFIG keys: ``out`` (a directory), ``mode`` ("data_parallel" or "hybrid_parallel"), ``source``
("dir" with ``data``, or "kafka" with ``bootstrap``, ``topic`` and ``group``), ``n_events``, ``batch``,
``sink`` (sink size; 0: normal mode), ``save_steps``, ``idle_timeout`` (None: wait forever),
``max_delay`` (None: a short batch waits to be filled), ``stop_rank``/``stop_step`` (a callback on
that rank alone requests a stop once that step is trained), ``micro`` (micro_batch_size; None: off).

The network counts, in a buffer that is part of its state (and so of every checkpoint), how many
times each event id was trained, over all ranks (the ranks' counts are all-reduced in forward, so
the buffer is the same everywhere). Event ids start at 1: a fill batch's row (zero dense values)
counts into slot 0. Each rank prints ``pid RANK PID`` at start; rank 0 prints ``step N`` after each
step; every rank prints ``done RANK`` when `online_train` returned, and writes
``OUT/rank-RANK.json``: the event ids it trained itself in this life.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import save_file

from recstream import RecModel, distributed, set_auto_parallel_context
from recstream.callbacks import Callback, CheckpointConfig, ModelCheckpoint
from recstream.data import CategoricalFeature, Schema
from recstream.models import default_optimizer
from recstream.nn import EmbeddingBagCollection, EmbeddingTableConfig

SCHEMA = Schema(["event_id", "x1", "x2"], [CategoricalFeature("c", vocab_size=50)])


def say(line: str) -> None:
    """One line in one write: the ranks share torchrun's (unbuffered) stdout."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class CountingNet(torch.nn.Module):
    def __init__(self, n_events: int):
        super().__init__()
        self.ebc = EmbeddingBagCollection([EmbeddingTableConfig("c", 50, 4)])
        self.lin = torch.nn.Linear(2 + 4, 1)
        self.register_buffer("trained", torch.zeros(n_events + 1, dtype=torch.int64))
        self.seen: list[int] = []  # this rank's own events, this life (not state)
        self.steps: list[list[int]] = []  # event ids of each training forward (0: a fill/pad row)

    def forward(self, features):
        ids = features.dense[:, 0].long()
        if self.training:
            self.seen.extend(i for i in ids.tolist() if i)
            self.steps.append(ids.tolist())
            counts = torch.zeros_like(self.trained).index_add_(0, ids, torch.ones_like(ids))
            if dist.is_initialized():
                dist.all_reduce(counts)  # every rank takes part in every step, fill or not
            self.trained += counts
        x = torch.cat([features.dense[:, 1:], self.ebc(features)], dim=1)
        return self.lin(x).squeeze(1)


class Progress(Callback):
    rank_zero_only = True

    def on_train_step_end(self, ctx):
        say(f"step {ctx.original_args().cur_step_num}")


class StopOnOneRank(Callback):
    def __init__(self, step: int):
        self.step = step

    def on_train_step_end(self, ctx):
        if ctx.original_args().cur_step_num >= self.step:
            ctx.request_stop()


def make_stream(cfg: dict):
    common = {"batch_size": cfg["batch"], "idle_timeout": cfg.get("idle_timeout"), "max_delay": cfg.get("max_delay")}
    if cfg["source"] == "dir":
        from recstream.data.streams import DirectoryStream
        return DirectoryStream(cfg["data"], SCHEMA, commit_path=os.path.join(cfg["out"], "ckpt", "committed.json"),
                               **common)
    from recstream.data.streams import KafkaStream
    return KafkaStream(cfg["topic"], cfg["bootstrap"], cfg.get("group", "online-test"), SCHEMA, commit_timeout=10,
                       consumer_config={"session.timeout.ms": 6000}, **common)


def build(n_events: int):
    torch.manual_seed(0)
    net = CountingNet(n_events)
    optimizer = default_optimizer(net, lr=0.01, embedding="rowwise_adagrad")  # state per row, sharded
    return net, RecModel(net, torch.nn.BCEWithLogitsLoss(), optimizer, progress_bar=False)


def main(cfg: dict) -> None:
    torch.set_num_threads(1)
    distributed.init()
    set_auto_parallel_context(parallel_mode=cfg["mode"])
    r = distributed.rank()
    say(f"pid {r} {os.getpid()}")
    net, model = build(cfg["n_events"])
    ckpt_dir = os.path.join(cfg["out"], "ckpt")
    os.makedirs(ckpt_dir, exist_ok=True)
    stream = make_stream(cfg)
    model.restore(ckpt_dir, stream)
    ckpt = ModelCheckpoint("online", ckpt_dir, CheckpointConfig(save_checkpoint_steps=cfg["save_steps"],
                                                                 keep_checkpoint_max=3))
    callbacks = [Progress(), ckpt]
    if cfg.get("stop_rank") == r:
        callbacks.append(StopOnOneRank(cfg["stop_step"]))
    sink = cfg.get("sink", 1)
    model.online_train(stream, callbacks=callbacks, dataset_sink_mode=sink > 0, sink_size=max(sink, 1),
                       micro_batch_size=cfg.get("micro"))
    Path(cfg["out"], f"rank-{r}.json").write_text(json.dumps({"seen": net.seen, "steps": net.steps}))
    if r == 0:  # the final parameters (the same on every rank), for a single-process reference
        params = {k: v.detach().contiguous() for k, v in net.named_parameters()}
        save_file(params, Path(cfg["out"], "params.safetensors"))
    say(f"done {r}")
    stream.close()
    distributed.shutdown()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
