"""Overhead of `Model.train` against a hand-written PyTorch loop (same network, data, optimizer).

Four variants train the same MLP from the same initial weights on the same dataset, one epoch at
a time, interleaved in one process (the machine is noisy: compare ratios, not absolute times):

- ``hand``: ``for x, y in data: zero_grad; loss = loss_fn(net(x), y); backward; step``
- ``model``: ``Model(net, loss_fn, opt).train(1, data)`` (normal mode, no callbacks)
- ``sink``: ``Model.train(1, data, dataset_sink_mode=True)`` (its data channel runs inline when
  training uses every core, on a producer thread otherwise)
- ``sink_thread``: the same with the producer thread forced on

The dataset does realistic per-batch work (gather a shuffled batch of rows, log-transform the
dense features), the part a sink's background thread overlaps with compute.

Checks that all variants end with identical weights (to 1e-6), then prints the median per-epoch
time of each and the ratios to ``hand``.

    python benchmarks/bench_overhead.py --epochs 2 --repeats 7
"""
from __future__ import annotations

import argparse
import statistics
import time
from unittest import mock

import torch

from recstream import Model
from recstream.train.sink import DatasetHelper


class GatherDataset:
    """Batches gathered from in-memory columns by a fixed shuffled order, like a real loader."""

    def __init__(self, rows: int, features: int, batch_size: int, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.rand(rows, features, generator=g) * 100
        self.y = (self.x[:, 0] > 50).long()
        self.order = torch.randperm(rows, generator=g)
        self.batch_size = batch_size

    def __len__(self):
        return len(self.order) // self.batch_size

    def __iter__(self):
        for i in range(len(self)):
            idx = self.order[i * self.batch_size:(i + 1) * self.batch_size]
            x = torch.log1p(self.x.index_select(0, idx))  # the typical dense-feature transform
            yield (x - x.mean(0)) / (x.std(0) + 1e-6), self.y.index_select(0, idx)


def make_net(features: int, hidden: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(features, hidden), torch.nn.ReLU(),
                               torch.nn.Linear(hidden, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 2))


def hand_loop(net, opt, loss_fn, data):
    for x, y in data:
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(net(x), y)
        loss.backward()
        opt.step()


def run(args) -> dict:
    torch.set_num_threads(args.threads)
    data = GatherDataset(args.rows, args.features, args.batch_size)
    loss_fn = torch.nn.CrossEntropyLoss()
    variants = {}
    for name in ("hand", "model", "sink", "sink_thread"):
        net = make_net(args.features, args.hidden)
        opt = torch.optim.Adam(net.parameters(), lr=1e-3)
        model = Model(net, loss_fn, opt, progress_bar=False)
        variants[name] = (net, opt, model)

    def one_epoch(name):
        net, opt, model = variants[name]
        if name == "hand":
            hand_loop(net, opt, loss_fn, data)
        elif name == "sink_thread":  # the sink with its producer thread forced on, for comparison
            with mock.patch.object(DatasetHelper, "_background", lambda self: True):
                model.train(1, data, dataset_sink_mode=True)
        else:
            model.train(1, data, dataset_sink_mode=(name == "sink"))

    times = {name: [] for name in variants}
    for rep in range(args.repeats):
        order = list(variants) if rep % 2 == 0 else list(reversed(variants))
        for name in order:
            start = time.perf_counter()
            for _ in range(args.epochs):
                one_epoch(name)
            times[name].append((time.perf_counter() - start) / args.epochs)

    ref = variants["hand"][0].state_dict()
    max_diff = {name: max((variants[name][0].state_dict()[k] - ref[k]).abs().max().item() for k in ref)
                for name in variants}
    medians = {name: statistics.median(t) for name, t in times.items()}
    return {"medians": medians, "max_weight_diff": max_diff, "steps_per_epoch": len(data)}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=131072)
    p.add_argument("--features", type=int, default=64)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--epochs", type=int, default=1, help="epochs per timed repetition")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    result = run(args)
    hand = result["medians"]["hand"]
    print(f"{result['steps_per_epoch']} steps/epoch, batch {args.batch_size}, MLP {args.features}-"
          f"{args.hidden}-{args.hidden}-2, Adam, {args.threads} threads, {args.repeats} interleaved repeats")
    print(f"{'variant':11} {'median s/epoch':>15} {'vs hand':>9} {'max |w - w_hand|':>17}")
    for name, t in result["medians"].items():
        print(f"{name:11} {t:15.4f} {t / hand:9.3f} {result['max_weight_diff'][name]:17.2e}")
    same = all(d <= 1e-6 for d in result["max_weight_diff"].values())
    print("identical final weights (1e-6):", "yes" if same else "NO")
    print(f"normal-mode overhead: {100 * (result['medians']['model'] / hand - 1):+.2f}%  "
          f"sink vs hand: {100 * (result['medians']['sink'] / hand - 1):+.2f}%")


if __name__ == "__main__":
    main()
