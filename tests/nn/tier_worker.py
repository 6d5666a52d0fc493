"""A training process for the tier's crash-recovery test (tests/nn/test_tiered_recovery.py): trains a
net with two disk-tiered tables for `STEPS` steps, resuming from its last checkpoint if there is one,
and checkpoints (`save_checkpoint`: the stores are committed) every `EVERY` steps."""
import os
import sys

import numpy as np
import torch
from torch import nn

from recstream.checkpoint import load_checkpoint, save_checkpoint
from recstream.features import Features
from recstream.nn import DiskTier, EmbeddingBagCollection, EmbeddingTableConfig
from recstream.optim import LazyAdam

ROWS, BATCH, STEPS, EVERY = 5000, 32, 60, 5


class Net(nn.Module):
    def __init__(self, directory=None, cache_rows=96):
        super().__init__()
        tier = (lambda name: DiskTier(os.path.join(directory, name), cache_rows)) if directory else (lambda name: None)
        self.ebc = EmbeddingBagCollection([
            EmbeddingTableConfig("user", 100, 4),
            EmbeddingTableConfig("item", ROWS, 4, tier=tier("item")),
            EmbeddingTableConfig("wide", ROWS, 1, tier=tier("wide")),
        ])
        self.head = nn.Linear(self.ebc.output_dim, 1)

    def forward(self, x):
        return self.head(self.ebc(x)).squeeze(1)


def batch(step):
    g = np.random.default_rng(step)
    ids = [g.integers(0, 100, BATCH), np.minimum(g.zipf(1.2, BATCH) - 1, ROWS - 1), g.integers(0, ROWS, BATCH)]
    values = torch.from_numpy(np.concatenate(ids).astype(np.int64))
    x = Features.from_lengths(torch.zeros(BATCH, 0), values, torch.ones(3, BATCH, dtype=torch.int64),
                              keys=("user", "item", "wide"))
    return x, torch.from_numpy(g.integers(0, 2, BATCH).astype(np.float32))


def initial(directory=None):
    """The net every run starts from: an in-memory net's rows (seed 0) in the stores."""
    torch.manual_seed(0)
    memory = Net()
    if directory is None:
        return memory
    net = Net(directory)
    net.load_state_dict(memory.state_dict())
    return net


def train(net, opt, start, stop, checkpoint=None):
    for step in range(start, stop):
        x, y = batch(step)
        opt.zero_grad(set_to_none=True)
        nn.functional.binary_cross_entropy_with_logits(net(x), y).backward()
        opt.step()
        if checkpoint is not None:
            if (step + 1) % EVERY == 0:
                save_checkpoint(checkpoint, net, opt, extra={"step": step + 1}, rng=False)
            print(step + 1, flush=True)  # the test kills after a given step


def main(directory):
    checkpoint = os.path.join(directory, "ckpt.safetensors")
    resume = os.path.exists(checkpoint)
    net = Net(directory) if resume else initial(directory)
    opt = LazyAdam(net.parameters(), lr=0.05)
    start = load_checkpoint(checkpoint, net, opt, restore_rng=False)["step"] if resume else 0
    train(net, opt, start, STEPS, checkpoint)


if __name__ == "__main__":
    main(sys.argv[1])
