"""Micro-steps in online training: prequential AUC and events/s with and without them, on DriftingCTR.

Protocol (issue 25's): the model is warm-started by one offline pass over the first `--warmup`
of the stream, then trained online test-then-train (`RecModel.online_train` with a
`PrequentialMonitor`: every batch is scored before any update from it) on the rest, once per
`--micro` value ("none": one optimizer step per batch; k: each batch as steps of k rows). The same
events, the same warm-started weights, the same optimizer settings for every run.

    python benchmarks/bench_micro_steps.py                      # DeepFM, batches of 256, micro none and 32
    python benchmarks/bench_micro_steps.py --micro none 16 32 64 --model widedeep
"""
from __future__ import annotations

import argparse
import copy
import time

import torch

from recstream import RecModel
from recstream.callbacks import PrequentialMonitor
from recstream.data import DriftingCTR
from recstream.data.streams import IterableStream
from recstream.models import DeepFM, WideDeep, default_optimizer

MODELS = {"deepfm": DeepFM, "widedeep": WideDeep}


def _micro(value: str) -> int | None:
    return None if value == "none" else int(value)


def run(args) -> list[dict]:
    gen = DriftingCTR(num_batches=args.batches, batch_size=args.batch_size, seed=args.seed, table=args.table,
                      table_size=args.table_size, embedding_dim=args.dim)
    warm = int(args.batches * args.warmup)
    torch.manual_seed(0)
    net = MODELS[args.model](gen.schema, hidden=(64, 32), embedding_dim=args.dim)
    RecModel(net, torch.nn.BCEWithLogitsLoss(), default_optimizer(net, lr=args.lr), progress_bar=False) \
        .train(1, [gen.batch(t) for t in range(warm)])
    rows = []
    for micro in args.micro:
        online = copy.deepcopy(net)
        model = RecModel(online, torch.nn.BCEWithLogitsLoss(), default_optimizer(online, lr=args.lr),
                         progress_bar=False)
        monitor = PrequentialMonitor(window=10 ** 9, log_every=10 ** 9, verbose=False)
        stream = IterableStream(lambda: (gen.batch(t) for t in range(warm, args.batches)))
        start = time.perf_counter()
        model.online_train(stream, callbacks=[monitor], dataset_sink_mode=False, micro_batch_size=micro)
        seconds = time.perf_counter() - start
        events = (args.batches - warm) * args.batch_size
        rows.append({"micro": micro, "auc": monitor.last["auc_total"], "events": events,
                     "events_per_s": events / seconds})
    return rows


def report(args, rows: list[dict]) -> None:
    print(f"DriftingCTR ({args.table} tables, seed {args.seed}): {args.batches} batches x {args.batch_size}, "
          f"{args.model}, default_optimizer(lr={args.lr}), warm start on the first {args.warmup:.0%}, "
          f"torch threads {torch.get_num_threads()}")
    base = next((r for r in rows if r["micro"] is None), rows[0])
    print(f"{'micro_batch_size':>16s} {'preq. AUC':>9s} {'events/s':>10s} {'vs none':>8s}")
    for r in rows:
        print(f"{str(r['micro']):>16s} {r['auc']:9.4f} {r['events_per_s']:10,.0f} "
              f"{r['events_per_s'] / base['events_per_s']:8.2f}")


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batches", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--micro", nargs="+", type=_micro, default=[None, 32], help="'none' or row counts")
    p.add_argument("--table", default="dynamic", choices=("dynamic", "hashed", "shared"))
    p.add_argument("--table-size", type=int, default=4096)
    p.add_argument("--dim", type=int, default=8)
    p.add_argument("--warmup", type=float, default=0.2)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", default="deepfm", choices=sorted(MODELS))
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = run(args)
    report(args, rows)
    return rows


if __name__ == "__main__":
    main()
