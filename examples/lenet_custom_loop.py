"""A hand-written training loop in MindSpore's custom-loop style, on recstream: LeNet-5 trained
with `WithLossCell`, `TrainOneStepCell`, `DatasetHelper` and `connect_network_with_dataset` in
sink mode.

The images are generated (no download): 32x32 single-channel pictures of ten classes, each
class a different bright bar pattern plus noise, so the network has something real to learn.

    python examples/lenet_custom_loop.py --epochs 10 --sink-size 100
"""
from __future__ import annotations

import argparse

import torch
from torch import nn

from recstream.train import DatasetHelper, TrainOneStepCell, WithLossCell, connect_network_with_dataset


class LeNet5(nn.Module):
    def __init__(self, num_class: int = 10):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5, bias=False)
        self.conv2 = nn.Conv2d(6, 16, 5, bias=False)
        self.fc1, self.fc2, self.fc3 = nn.Linear(16 * 5 * 5, 120), nn.Linear(120, 84), nn.Linear(84, num_class)
        self.pool = nn.MaxPool2d(2, 2)
        for m in self.modules():  # MindSpore's LeNet initialises weights with TruncatedNormal(0.02)
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.trunc_normal_(m.weight, std=0.02)

    def forward(self, x):
        x = self.pool(torch.relu(self.conv1(x)))
        x = self.pool(torch.relu(self.conv2(x)))
        x = torch.relu(self.fc1(x.flatten(1)))
        return self.fc3(torch.relu(self.fc2(x)))


class GeneratedImages:
    """`batches` batches of `batch_size` 1x32x32 images; class k lights up rows 3k..3k+2."""

    def __init__(self, batches: int = 60, batch_size: int = 32, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        labels = torch.randint(0, 10, (batches, batch_size), generator=g)
        images = torch.randn(batches, batch_size, 1, 32, 32, generator=g) * 0.3
        rows = torch.arange(32).view(1, 1, 1, 32, 1)
        start = (labels * 3).view(batches, batch_size, 1, 1, 1)
        images += ((rows >= start) & (rows < start + 3)).float()
        self.images, self.labels = (images - 0.1307) / 0.3081, labels

    def get_dataset_size(self) -> int:
        return len(self.labels)

    def __iter__(self):
        return iter(zip(self.images, self.labels, strict=True))


def main(argv=None) -> list[float]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--sink-size", type=int, default=100)
    p.add_argument("--batches", type=int, default=60)
    # Adam, not the tutorial's Momentum(0.01): LeNet's sigmoid-free start sits on a ln(10) plateau
    # that momentum SGD leaves at a chaotic moment (a run differed between torch builds).
    p.add_argument("--lr", type=float, default=1e-3, help="Adam's learning rate")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    network = LeNet5(10)
    net_loss = nn.CrossEntropyLoss()
    net_opt = torch.optim.Adam(network.parameters(), lr=args.lr)
    net = TrainOneStepCell(WithLossCell(network, net_loss), net_opt)
    dataset_helper = DatasetHelper(GeneratedImages(args.batches), dataset_sink_mode=True,
                                   sink_size=args.sink_size, epoch_num=args.epochs)
    net = connect_network_with_dataset(net, dataset_helper)
    network.train()
    print("============== Starting Training ==============")
    losses = []
    for step in range(args.epochs):
        for inputs in dataset_helper:
            output = net(*inputs)
            losses.append(float(output))  # one host read per sink
            print(f"epoch: {step + 1}/{args.epochs}, losses: {losses[-1]}", flush=True)
    dataset_helper.release()
    return losses


if __name__ == "__main__":
    main()
