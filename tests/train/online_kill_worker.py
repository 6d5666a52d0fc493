"""Worker for the exactly-once kill test: online training from a DirectoryStream, resumable.

The network counts, in a buffer that is part of its state (and so of every checkpoint), how
many times each event id was trained. Run: python online_kill_worker.py DATA_DIR CKPT_DIR N
"""
import sys

import torch

from recstream import RecModel
from recstream.callbacks import Callback, CheckpointConfig, ModelCheckpoint
from recstream.data import Schema
from recstream.data.streams import DirectoryStream


class CountingNet(torch.nn.Module):
    def __init__(self, n_events: int):
        super().__init__()
        self.lin = torch.nn.Linear(2, 1)
        self.register_buffer("trained", torch.zeros(n_events, dtype=torch.int64))

    def forward(self, features):
        event_id, x = features.dense[:, 0].long(), features.dense[:, 1:]
        if self.training:
            self.trained.index_add_(0, event_id, torch.ones_like(event_id))
        return self.lin(x).squeeze(1)


class Progress(Callback):
    def __init__(self, net, n_events):
        self.net, self.n_events = net, n_events

    def on_train_step_end(self, ctx):
        print("step", ctx.original_args().cur_step_num, flush=True)
        if int(self.net.trained.sum()) >= self.n_events:
            ctx.request_stop()


def main(data_dir: str, ckpt_dir: str, n_events: int) -> None:
    torch.manual_seed(0)
    net = CountingNet(n_events)
    model = RecModel(net, torch.nn.BCEWithLogitsLoss(), torch.optim.SGD(net.parameters(), lr=0.01),
                     progress_bar=False)
    stream = DirectoryStream(data_dir, Schema(["event_id", "x1", "x2"]), batch_size=24, format="csv",
                             commit_path=f"{ckpt_dir}/committed.json")
    model.restore(ckpt_dir, stream)
    ckpt = ModelCheckpoint("online", ckpt_dir, CheckpointConfig(save_checkpoint_steps=3, keep_checkpoint_max=2))
    model.online_train(stream, callbacks=[Progress(net, n_events), ckpt], sink_size=2)
    print("done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
