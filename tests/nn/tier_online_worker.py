"""Worker for the tiered exactly-once kill tests (tests/nn/test_tiered_recovery.py): online training
from a DirectoryStream where each event's trained-count is a row of a disk-tiered table, an
`EmbeddingBagCollection` table indexed by the event id ("ebc") or a `HashEmbedding` keyed by it
("hash").

The count table (one width-1 row per event, initially 0) gets a gradient of -1 per occurrence and
plain SGD with lr 1, so a row's value is the number of times its event was trained -- a count that
lives in the tier store and its commits, not in memory. Run: python tier_online_worker.py DATA CKPT N
[ebc|hash]
"""
import sys

import torch

from recstream import RecModel
from recstream.callbacks import Callback, CheckpointConfig, ModelCheckpoint
from recstream.data import Schema
from recstream.data.streams import DirectoryStream
from recstream.nn import DiskTier, EmbeddingBagCollection, EmbeddingTableConfig, HashEmbedding
from recstream.optim import CombinedOptimizer


class TieredCountingNet(torch.nn.Module):
    def __init__(self, n_events: int, tier_dir: str):
        super().__init__()
        self.lin = torch.nn.Linear(2, 1)
        self.counts = EmbeddingBagCollection([EmbeddingTableConfig("count", n_events, 1, init_std=0.0,
                                                                   tier=DiskTier(tier_dir, cache_rows=64))])

    def forward(self, features):
        event_id, x = features.dense[:, 0].long(), features.dense[:, 1:]
        seen = self.counts(event_id, torch.arange(event_id.numel() + 1), event_id.numel())
        return self.lin(x).squeeze(1), seen.squeeze(1)

    def trained(self) -> torch.Tensor:
        """How many times each event was trained."""
        return self.counts.gather_tables()["count"].squeeze(1)


class HashCountingNet(torch.nn.Module):
    def __init__(self, n_events: int, tier_dir: str):
        super().__init__()
        self.n_events = n_events
        self.lin = torch.nn.Linear(2, 1)
        self.counts = HashEmbedding(1, param_init="zeros", capacity=n_events, tier=DiskTier(tier_dir, cache_rows=64))

    def forward(self, features):
        event_id, x = features.dense[:, 0].long(), features.dense[:, 1:]
        return self.lin(x).squeeze(1), self.counts(event_id).squeeze(1)

    def trained(self) -> torch.Tensor:
        """How many times each event was trained (an event whose key is not in the table: 0)."""
        rows = self.counts.export(reset_delta=False)
        out = torch.zeros(self.n_events)
        out[rows["keys"]] = rows["values"].squeeze(1)
        return out


NETS = {"ebc": TieredCountingNet, "hash": HashCountingNet}


def loss(outputs, label):
    logit, seen = outputs
    return torch.nn.functional.binary_cross_entropy_with_logits(logit, label.float()) - seen.sum()


class Progress(Callback):
    def on_train_step_end(self, ctx):
        print("step", ctx.original_args().cur_step_num, flush=True)


def main(data_dir: str, ckpt_dir: str, n_events: int, table: str = "ebc") -> None:
    torch.manual_seed(0)
    net = NETS[table](n_events, f"{ckpt_dir}/tier")
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
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), *sys.argv[4:5])
