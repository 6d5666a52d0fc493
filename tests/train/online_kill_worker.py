"""Worker for the exactly-once kill test: online training from a DirectoryStream, resumable.

The network counts, in a buffer that is part of its state (and so of every checkpoint), how
many times each event id was trained. Run: python online_kill_worker.py DATA_DIR CKPT_DIR N [MICRO]

With MICRO (micro-steps of that many rows), the network prints ``mid E`` when it has trained a
slice of a batch that is not the batch's last (E: its last event) and, every 7th batch, pauses
there a moment, so the test can kill the process between two micro-steps of one batch.
"""
import sys
import time

import torch

from recstream import RecModel
from recstream.callbacks import Callback, CheckpointConfig, ModelCheckpoint
from recstream.data import Schema
from recstream.data.streams import DirectoryStream

BATCH = 24  # events per batch; event ids are 0..N-1 in order, so batch b holds ids 24b..24b+23


class CountingNet(torch.nn.Module):
    def __init__(self, n_events: int, report_mid_batch: bool = False):
        super().__init__()
        self.lin = torch.nn.Linear(2, 1)
        self.register_buffer("trained", torch.zeros(n_events, dtype=torch.int64))
        self.report_mid_batch = report_mid_batch

    def forward(self, features):
        event_id, x = features.dense[:, 0].long(), features.dense[:, 1:]
        if self.training:
            self.trained.index_add_(0, event_id, torch.ones_like(event_id))
            last = int(event_id[-1])
            if self.report_mid_batch and (last + 1) % BATCH:  # inside a batch: more of its slices follow
                print("mid", last, flush=True)
                if (last // BATCH) % 7 == 3:
                    time.sleep(0.2)
        return self.lin(x).squeeze(1)


class Progress(Callback):
    def __init__(self, net, n_events):
        self.net, self.n_events = net, n_events

    def on_train_step_end(self, ctx):
        print("step", ctx.original_args().cur_step_num, flush=True)
        if int(self.net.trained.sum()) >= self.n_events:
            ctx.request_stop()


def main(data_dir: str, ckpt_dir: str, n_events: int, micro: int | None = None) -> None:
    torch.manual_seed(0)
    net = CountingNet(n_events, report_mid_batch=micro is not None)
    model = RecModel(net, torch.nn.BCEWithLogitsLoss(), torch.optim.SGD(net.parameters(), lr=0.01),
                     progress_bar=False)
    stream = DirectoryStream(data_dir, Schema(["event_id", "x1", "x2"]), batch_size=BATCH, format="csv",
                             commit_path=f"{ckpt_dir}/committed.json")
    model.restore(ckpt_dir, stream)
    ckpt = ModelCheckpoint("online", ckpt_dir, CheckpointConfig(save_checkpoint_steps=3, keep_checkpoint_max=2))
    model.online_train(stream, callbacks=[Progress(net, n_events), ckpt], sink_size=2, micro_batch_size=micro)
    print("done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]) if len(sys.argv) > 4 else None)
