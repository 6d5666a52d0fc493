"""A training process for the disk-tiered HashEmbedding's crash-recovery test (tests/nn/test_hash_tier.py):
trains a net whose HashEmbedding is on disk behind a small cache for `STEPS` steps, resuming from its last
checkpoint if there is one, and checkpoints (`save_checkpoint`: the store committed, the RNG saved -- new
keys' initial rows are drawn from it) every `EVERY` steps."""
import os
import sys

import numpy as np
import torch
from torch import nn

from recstream.checkpoint import load_checkpoint, save_checkpoint
from recstream.nn import DiskTier, HashEmbedding
from recstream.optim import LazyAdam

BATCH, STEPS, EVERY = 32, 40, 5


class Net(nn.Module):
    def __init__(self, directory=None):
        super().__init__()
        tier = DiskTier(os.path.join(directory, "emb"), cache_rows=40) if directory else None
        # 150 rows for ~400 distinct keys: capacity and age evictions, rows reused by new keys.
        self.emb = HashEmbedding(4, capacity=150, evict_filter_value=8, tier=tier)
        self.head = nn.Linear(4, 1)

    def forward(self, keys):
        return self.head(self.emb(keys)).squeeze(1)


def batch(step):
    g = np.random.default_rng(step)
    keys = torch.from_numpy((np.minimum(g.zipf(1.2, BATCH), 3000) * 7919).astype(np.int64))
    return keys, torch.from_numpy(g.integers(0, 2, BATCH).astype(np.float32))


def initial_net(directory, resume=False):
    """The net every run starts from (seed 0), tiered in `directory` (None: in memory), and its optimizer."""
    torch.manual_seed(0)
    net = Net(directory)
    return net, LazyAdam(net.parameters(), lr=0.05)


def train_net(net, opt, start, stop, checkpoint=None):
    for step in range(start, stop):
        x, y = batch(step)
        opt.zero_grad(set_to_none=True)
        nn.functional.binary_cross_entropy_with_logits(net(x), y).backward()
        opt.step()
        if checkpoint is not None:
            if (step + 1) % EVERY == 0:
                save_checkpoint(checkpoint, net, opt, extra={"step": step + 1})
            print(step + 1, flush=True)  # the test kills after a given step


def main(directory):
    checkpoint = os.path.join(directory, "ckpt.safetensors")
    resume = os.path.exists(checkpoint)
    net, opt = initial_net(directory, resume)
    start = load_checkpoint(checkpoint, net, opt)["step"] if resume else 0
    train_net(net, opt, start, STEPS, checkpoint)


if __name__ == "__main__":
    main(sys.argv[1])
