"""The trainer of benchmarks/fault_injection.py: Kafka -> RecModel.online_train -> checkpoints + ModelPublisher.

The network counts, in a buffer that is part of its state (so of every checkpoint and every
published version), how many times each event id was trained: the final checkpoint says which
events were lost or trained twice, across however many kills and restarts.

    python benchmarks/fault_worker.py BOOTSTRAP TOPIC DEAD_TOPIC CKPT_DIR PUBLISH_DIR N_EVENTS
"""
from __future__ import annotations

import sys

import torch

from recstream import RecModel
from recstream.callbacks import Callback, CheckpointConfig, ModelCheckpoint
from recstream.data import Schema
from recstream.data.streams import KafkaStream
from recstream.serving import ModelPublisher

SCHEMA = Schema(["event_id", "x1", "x2"])
PARTITIONS = 3


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
    def __init__(self, net: CountingNet):
        self.net = net

    def on_train_step_end(self, ctx):
        p = ctx.original_args()
        if p.cur_step_num % 20 == 0:
            print("trained", int(self.net.trained.sum()), flush=True)  # one host read per 20 steps
            if int((self.net.trained > 0).sum()) >= len(self.net.trained):
                ctx.request_stop()


def main(bootstrap: str, topic: str, dead_topic: str, ckpt_dir: str, publish_dir: str, n_events: int) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    net = CountingNet(n_events)
    model = RecModel(net, torch.nn.BCEWithLogitsLoss(), torch.optim.SGD(net.parameters(), lr=0.05),
                     progress_bar=False)
    stream = KafkaStream(topic, bootstrap, "fault-trainer", SCHEMA, batch_size=100, format="jsonl",
                         assignment=[(topic, p) for p in range(PARTITIONS)], dead_letter_topic=dead_topic,
                         commit_timeout=5.0)
    model.restore(ckpt_dir, stream)
    callbacks = [StopWhenAllTrained(net),
                 ModelCheckpoint("online", ckpt_dir, CheckpointConfig(save_checkpoint_steps=10, keep_checkpoint_max=3)),
                 ModelPublisher(publish_dir, every_seconds=1.0, keep=3, model_factory="fault_worker:make_net",
                                model_config={"n_events": n_events})]
    model.online_train(stream, callbacks=callbacks, dataset_sink_mode=True, sink_size=5)
    stream.close()
    print("done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], int(sys.argv[6]))
