"""Prequential AUC of WideDeep on `DriftingCTR` with and without cross features (wide part only).

Test-then-train: every batch is scored by the model as it is, then trained on (one step per batch,
`default_optimizer`); the AUC is over every scored event after the first batch. The crosses are
computed by `recstream.data.convert.with_crosses` (the converter's own `cross_bags`, as the readers,
streams and server do). Indicative figures: one seed, CPU.

    python benchmarks/bench_crosses.py --batches 300 --crosses none user:category user:item
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from torch import nn

from recstream.data import CrossFeature, DriftingCTR, Schema
from recstream.data.convert import with_crosses
from recstream.data.synthetic import roc_auc
from recstream.models import WideDeep, default_optimizer


def prequential_auc(gen: DriftingCTR, crosses: list[tuple[str, ...]], hash_buckets: int, seed: int,
                    micro_batch_size: int | None) -> tuple[float, float]:
    """(prequential AUC, seconds) of WideDeep on `gen` with `crosses` (tuples of feature names)."""
    base = gen.schema
    schema = Schema(base.dense, base.categorical, label=base.label,
                    crosses=[CrossFeature("_x_".join(c), c, hash_buckets=hash_buckets) for c in crosses])
    torch.manual_seed(seed)
    net = WideDeep(schema, hidden=(64, 32))
    opt, loss_fn = default_optimizer(net), nn.BCEWithLogitsLoss()
    scores, labels = [], []
    start = time.perf_counter()
    for t, (features, y) in enumerate(gen):
        x = with_crosses(schema, features) if crosses else features
        if t > 0:
            with torch.no_grad():
                scores.append(net(x).numpy())
            labels.append(y.numpy())
        parts = [(x, y)] if micro_batch_size is None else list(zip(x.split(micro_batch_size),
                                                                    y.split(micro_batch_size), strict=True))
        for xs, ys in parts:  # micro-steps: consecutive steps of micro_batch_size rows, in order
            opt.zero_grad()
            loss_fn(net(xs), ys).backward()
            opt.step()
    return roc_auc(np.concatenate(labels), np.concatenate(scores)), time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", type=int, default=300)
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--hash-buckets", type=int, default=1 << 20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--micro-batch-size", type=int, default=None)
    p.add_argument("--crosses", nargs="+", default=["none", "user:category"],
                   help="'none' or features joined by ':' (one run each; '+' joins several crosses in one run)")
    args = p.parse_args(argv)
    gen = DriftingCTR(num_batches=args.batches, batch_size=args.batch_size, seed=args.seed)
    print(f"DriftingCTR {args.batches} x {args.batch_size}, Bayes AUC {gen.bayes_auc(1, args.batches):.4f}")
    for spec in args.crosses:
        crosses = [] if spec == "none" else [tuple(c.split(":")) for c in spec.split("+")]
        auc, seconds = prequential_auc(gen, crosses, args.hash_buckets, args.seed, args.micro_batch_size)
        print(f"crosses={spec:<28} prequential AUC {auc:.4f}  ({seconds:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
