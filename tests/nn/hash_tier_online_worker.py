"""Worker for the disk-tiered HashEmbedding's exactly-once kill test (tests/nn/test_hash_tier.py): as
tier_online_worker.py, with each event's trained-count a row of a tiered HashEmbedding keyed by the
event id (rows start at zero, SGD with lr 1 and a gradient of -1 per occurrence: the row's value is the
number of times its event was trained). Run: python hash_tier_online_worker.py DATA CKPT N
"""
import sys

import torch

from recstream import RecModel
from recstream.callbacks import Callback, CheckpointConfig, ModelCheckpoint
from recstream.data import Schema
from recstream.data.streams import DirectoryStream
from recstream.nn import DiskTier, HashEmbedding
from recstream.optim import CombinedOptimizer


def loss(outputs, label):
    logit, seen = outputs
    return torch.nn.functional.binary_cross_entropy_with_logits(logit, label.float()) - seen.sum()


class Progress(Callback):
    def on_train_step_end(self, ctx):
        print("step", ctx.original_args().cur_step_num, flush=True)


class HashCountingNet(torch.nn.Module):
    def __init__(self, n_events: int, tier_dir: str):
        super().__init__()
        self.lin = torch.nn.Linear(2, 1)
        self.counts = HashEmbedding(1, param_init="zeros", capacity=n_events,
                                    tier=DiskTier(tier_dir, cache_rows=64))

    def forward(self, features):
        event_id, x = features.dense[:, 0].long(), features.dense[:, 1:]
        return self.lin(x).squeeze(1), self.counts(event_id).squeeze(1)


def main(data_dir: str, ckpt_dir: str, n_events: int) -> None:
    torch.manual_seed(0)
    net = HashCountingNet(n_events, f"{ckpt_dir}/tier")
    opt = CombinedOptimizer({"count": torch.optim.SGD(net.counts.parameters(), lr=1.0),
                             "lin": torch.optim.SGD(net.lin.parameters(), lr=0.01)})
    model = RecModel(net, loss, opt, progress_bar=False)
    stream = DirectoryStream(data_dir, Schema(["event_id", "x1", "x2"]), batch_size=24, format="csv",
                             commit_path=f"{ckpt_dir}/committed.json", idle_timeout=0.5)  # ends at the data's end
    model.restore(ckpt_dir, stream)
    ckpt = ModelCheckpoint("online", ckpt_dir, CheckpointConfig(save_checkpoint_steps=3, keep_checkpoint_max=2))
    model.online_train(stream, callbacks=[Progress(), ckpt], sink_size=2)
    print("done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
