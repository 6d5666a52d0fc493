"""Worker for the prequential restart tests: `RecModel.online_train` with a `PrequentialMonitor` on a
`DirectoryStream`, resumed from its checkpoints. Run: python prequential_worker.py DATA_DIR CKPT_DIR
PAUSE; prints ``resumed STEP`` (when it resumed), ``step N`` after each step (then sleeps PAUSE
seconds, so that a test can kill it mid-stream), and at the end ``report {json}``: the monitor's
figures over the whole stream."""
import json
import os
import sys
import time

import numpy as np
import torch

from recstream import RecModel
from recstream.callbacks import Callback, CheckpointConfig, ModelCheckpoint, PrequentialMonitor
from recstream.data import Schema
from recstream.data.streams import DirectoryStream

BATCH, EVENTS, FILES = 20, 1200, 4  # 60 steps of one batch; checkpoints every 4 steps


def write_events(data_dir) -> None:
    """Labels that follow the features (so the AUC means something), in files that batches straddle."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((EVENTS, 2))
    label = (x[:, 0] - 0.5 * x[:, 1] + rng.standard_normal(EVENTS) > 0).astype(int)
    per_file = EVENTS // FILES + 7  # 307 events a file: the batches straddle the files
    for f, start in enumerate(range(0, EVENTS, per_file)):
        rows = range(start, min(start + per_file, EVENTS))
        tmp = os.path.join(data_dir, f".part-{f}.tmp")
        with open(tmp, "w") as out:
            out.writelines(f"{label[i]},{x[i, 0]:.5f},{x[i, 1]:.5f}\n" for i in rows)
        os.rename(tmp, os.path.join(data_dir, f"part-{f}.csv"))


class Net(torch.nn.Module):
    def __init__(self, fail_at_batch: int | None = None):
        super().__init__()
        self.lin = torch.nn.Linear(2, 1)
        self.fail_at_batch, self.batches = fail_at_batch, 0

    def forward(self, features):
        if self.training:  # a failure while training a batch, after the monitor scored it
            self.batches += 1
            if self.batches == self.fail_at_batch:
                raise RuntimeError(f"failed training batch {self.batches}")
        return self.lin(features.dense).squeeze(1)


class Steps(Callback):
    def __init__(self, pause: float = 0.0):
        self.pause = pause

    def on_train_step_end(self, ctx):
        print("step", ctx.original_args().cur_step_num, flush=True)
        time.sleep(self.pause)


def run(data_dir, ckpt_dir, callbacks=(), *, fail_at_batch=None, exception_save=False):
    """One life of the trainer; returns (the step it resumed from or None, its monitor)."""
    torch.manual_seed(0)
    net = Net(fail_at_batch)
    model = RecModel(net, torch.nn.BCEWithLogitsLoss(), torch.optim.SGD(net.parameters(), lr=0.1),
                     progress_bar=False)
    stream = DirectoryStream(data_dir, Schema(["x1", "x2"]), batch_size=BATCH, format="csv", idle_timeout=0.3,
                             commit_path=os.path.join(ckpt_dir, "committed.json"))
    meta = model.restore(ckpt_dir, stream)
    monitor = PrequentialMonitor(window=100, log_every=1, verbose=False)
    config = CheckpointConfig(save_checkpoint_steps=4, keep_checkpoint_max=2, exception_save=exception_save)
    try:
        model.online_train(stream, callbacks=[monitor, ModelCheckpoint("online", ckpt_dir, config), *callbacks],
                           dataset_sink_mode=False)
    finally:
        stream.close()
    return (None if meta is None else meta["cur_step_num"]), monitor


def main(data_dir: str, ckpt_dir: str, pause: float) -> None:
    resumed, monitor = run(data_dir, ckpt_dir, [Steps(pause)])
    if resumed is not None:
        print("resumed", resumed, flush=True)
    print("report", json.dumps(monitor.compute()), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]))
