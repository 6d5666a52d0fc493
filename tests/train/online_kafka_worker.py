"""Worker for the stop tests: online training from a KafkaStream until SIGTERM.

Prints ``trained N`` after every step (N: events trained so far) and ``done`` when
`online_train` has returned. Run:
python online_kafka_worker.py BOOTSTRAP TOPIC GROUP CKPT_DIR SINK(0|1) COMMIT_TIMEOUT
"""
import sys

import torch

from recstream import RecModel
from recstream.callbacks import Callback, CheckpointConfig, ModelCheckpoint
from recstream.data import Schema
from recstream.data.streams import KafkaStream


class Progress(Callback):
    def __init__(self):
        self.trained = 0

    def on_train_step_end(self, ctx):
        p = ctx.original_args()
        self.trained = sum(p.train_position.values())
        print("trained", self.trained, flush=True)


def main(bootstrap: str, topic: str, group: str, ckpt_dir: str, sink: bool, commit_timeout: float) -> None:
    net = torch.nn.Linear(2, 1)
    model = RecModel(_Net(net), torch.nn.BCEWithLogitsLoss(), torch.optim.SGD(net.parameters(), lr=0.01),
                     progress_bar=False)
    stream = KafkaStream(topic, bootstrap, group, Schema(["x1", "x2"]), batch_size=20,
                         assignment=[(topic, 0)], commit_timeout=commit_timeout)
    model.restore(ckpt_dir, stream)
    ckpt = ModelCheckpoint("online", ckpt_dir, CheckpointConfig(save_checkpoint_steps=1000))
    model.online_train(stream, callbacks=[Progress(), ckpt], dataset_sink_mode=sink, sink_size=2)
    print("done", flush=True)
    stream.close()
    print("closed", flush=True)


class _Net(torch.nn.Module):
    def __init__(self, lin):
        super().__init__()
        self.lin = lin

    def forward(self, features):
        return self.lin(features.dense).squeeze(1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5] == "1", float(sys.argv[6]))
