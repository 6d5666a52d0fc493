"""`recstream demo`: the embedded default job — train and evaluate a click-through-rate model.

It generates a small CTR-like data set (dense features and a click label from a hidden logistic
model), trains an MLP with `Model.fit` in sink mode, and prints the loss and validation AUC.
"""
from __future__ import annotations

import torch

from ..callbacks.loss_monitor import LossMonitor
from ..train import Model


def add_parser(sub) -> None:
    p = sub.add_parser("demo", help="train and evaluate a small CTR model end to end")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--rows", type=int, default=20_000)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(run=run)


def make_ctr_data(rows: int, batch_size: int, seed: int):
    """Dense features -> click probability through a hidden logistic model; (x, y) batches."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 16, generator=g)
    w = torch.randn(16, generator=g)
    logits = x @ w * 0.8 + 0.5 * torch.sin(3 * x[:, 0]) - 1.5
    y = torch.bernoulli(torch.sigmoid(logits), generator=g)
    return [(x[i:i + batch_size], y[i:i + batch_size]) for i in range(0, rows, batch_size)]


class CTRNet(torch.nn.Module):
    def __init__(self, features: int = 16, hidden: int = 64):
        super().__init__()
        self.mlp = torch.nn.Sequential(torch.nn.Linear(features, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1))

    def forward(self, x):
        return torch.sigmoid(self.mlp(x).squeeze(-1))  # click probability


def run(args) -> int:
    torch.manual_seed(args.seed)
    data = make_ctr_data(args.rows, args.batch_size, args.seed)
    split = int(len(data) * 0.8)
    train, valid = data[:split], data[split:]
    net = CTRNet()
    model = Model(net, torch.nn.BCELoss(), torch.optim.Adam(net.parameters(), lr=3e-3),
                  metrics={"auc", "logloss", "accuracy"})
    print(f"recstream demo: {len(train)} train / {len(valid)} valid batches of {args.batch_size}")
    model.fit(args.epochs, train, valid, callbacks=[LossMonitor(len(train))], dataset_sink_mode=True)
    result = model.eval(valid)
    print("validation: " + ", ".join(f"{k}={v:.4f}" for k, v in sorted(result.items())))
    return 0
