"""The trainer of benchmarks/fault_injection.py: Kafka -> RecModel.online_train -> checkpoints + ModelPublisher.

The network counts, in a buffer that is part of its state (so of every checkpoint and every
published version), how many times each event id was trained: the final checkpoint says which
events were lost or trained twice, across however many kills and restarts.

The stream has an ``idle_timeout`` (IDLE_S): when it passes without data the worker prints
``idle <epoch seconds>`` and goes on training the same stream. A broker frozen with a commit
outstanding must not keep the reader from noticing (the frozen-broker-with-commit fault looks for
this line). Progress rows go to ``RUN_DIR/metrics.jsonl`` through `MetricsLog(append=True)`, which
every restart reads back (the torn-metrics-line fault leaves half a row at its end).

    python benchmarks/fault_worker.py BOOTSTRAP TOPIC DEAD_TOPIC CKPT_DIR PUBLISH_DIR N_EVENTS [RUN_DIR]
"""
from __future__ import annotations

import sys
import time

import torch

from recstream import RecModel
from recstream.callbacks import Callback, CheckpointConfig, ModelCheckpoint
from recstream.cli.run_log import MetricsLog
from recstream.data import Schema
from recstream.data.streams import KafkaStream
from recstream.serving import ModelPublisher

SCHEMA = Schema(["event_id", "x1", "x2"])
PARTITIONS = 3
IDLE_S = 8.0      # the stream's idle_timeout
COMMIT_S = 5.0    # the stream's commit_timeout


class CountingNet(torch.nn.Module):
    """A logistic model on (x1, x2) that also counts, per event id, the times it trained on it."""

    def __init__(self, n_events: int):
        super().__init__()
        self.schema = SCHEMA
        self.lin = torch.nn.Linear(2, 1)
        self.register_buffer("trained", torch.zeros(n_events, dtype=torch.int64))

    def forward(self, features):
        event_id, x = features.dense[:, 0].long(), features.dense[:, 1:]
        if self.training:
            self.trained.index_add_(0, event_id, torch.ones_like(event_id))
        return self.lin(x).squeeze(1)


def make_net(manifest: dict) -> CountingNet:
    """The servers' model factory (``--model-factory fault_worker:make_net``)."""
    return CountingNet(int(manifest["model"]["config"]["n_events"]))


class StopWhenAllTrained(Callback):
    def __init__(self, net: CountingNet, metrics: MetricsLog | None = None):
        self.net, self.metrics = net, metrics

    def done(self) -> bool:
        return int((self.net.trained > 0).sum()) >= len(self.net.trained)

    def on_train_step_end(self, ctx):
        p = ctx.original_args()
        if p.cur_step_num % 20 == 0:
            trained = int(self.net.trained.sum())  # one host read per 20 steps
            print("trained", trained, flush=True)
            if self.metrics is not None:
                self.metrics.add({"step": p.cur_step_num, "trained": trained, "time": time.time()})
            if self.done():
                ctx.request_stop()


def main(bootstrap: str, topic: str, dead_topic: str, ckpt_dir: str, publish_dir: str, n_events: int,
         run_dir: str | None = None) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    net = CountingNet(n_events)
    model = RecModel(net, torch.nn.BCEWithLogitsLoss(), torch.optim.SGD(net.parameters(), lr=0.05),
                     progress_bar=False)
    stream = KafkaStream(topic, bootstrap, "fault-trainer", SCHEMA, batch_size=100, format="jsonl",
                         assignment=[(topic, p) for p in range(PARTITIONS)], dead_letter_topic=dead_topic,
                         commit_timeout=COMMIT_S, idle_timeout=IDLE_S)
    model.restore(ckpt_dir, stream)
    metrics = None if run_dir is None else MetricsLog(run_dir, online=True, append=True)  # reads earlier rows
    stop = StopWhenAllTrained(net, metrics)
    callbacks = [stop,
                 ModelCheckpoint("online", ckpt_dir, CheckpointConfig(save_checkpoint_steps=10, keep_checkpoint_max=3)),
                 ModelPublisher(publish_dir, every_seconds=1.0, keep=3, model_factory="fault_worker:make_net",
                                model_config={"n_events": n_events})]
    while True:
        model.online_train(stream, callbacks=callbacks, dataset_sink_mode=True, sink_size=5)
        if stop.done():
            break
        print("idle", time.time(), flush=True)  # idle_timeout passed without data: read on
    stream.close()
    print("done", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:6], int(sys.argv[6]), *sys.argv[7:8])
