"""Online learning on a drifting stream (DriftingCTR): prequential AUC vs a model trained once, vs the Bayes curve,
for fixed (hashed) and dynamic (HashEmbedding) user/item tables.

For each table kind: a DeepFM (``--model widedeep``: a WideDeep) is trained offline, one pass, on the
first ``--warmup`` fraction of the stream. Then

* offline-once: that model, frozen, scores the rest of the stream (eval mode: a dynamic table
  answers unseen ids with its default vector, a hashed one with whatever row the bucket holds);
* online: a copy goes on with ``RecModel.online_train`` over the rest, test-then-train, measured by
  ``PrequentialMonitor`` (each event scored before the model trains on it);
* Bayes: ``DriftingCTR.bayes_auc`` -- the AUC of the true probabilities on the same events.

Per window of ``--window`` batches and over the whole rest of the stream, the report gives the three
AUCs and the online model's gap to the Bayes curve. One thread.

    python benchmarks/bench_online_drift.py --batches 300 --batch-size 512 --table-size 4096
"""
from __future__ import annotations

import argparse
import copy
import time

import numpy as np
import torch

from recstream import RecModel
from recstream.callbacks import Callback, PrequentialMonitor
from recstream.data import DriftingCTR, roc_auc
from recstream.data.streams import IterableStream
from recstream.models import DeepFM, WideDeep, default_optimizer

MODELS = {"deepfm": DeepFM, "widedeep": WideDeep}


class WindowScores(Callback):
    """Keeps PrequentialMonitor's window report at the end of every `every`-th step."""

    def __init__(self, every: int):
        self.every, self.reports = every, []

    def on_train_step_end(self, run_context):
        p = run_context.original_args()
        if p.cur_step_num % self.every == 0 and p.get("prequential"):
            self.reports.append(dict(p.prequential))


def frozen_scores(net, gen: DriftingCTR, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
    net.eval()
    with torch.no_grad():
        scores = [net(gen.batch(t).features).numpy() for t in range(start, stop)]
    labels = [gen.batch(t).labels.numpy() for t in range(start, stop)]
    return np.concatenate(scores), np.concatenate(labels)


def run(args, table: str) -> dict:
    gen = DriftingCTR(num_batches=args.batches, batch_size=args.batch_size, seed=args.seed, table=table,
                      table_size=args.table_size, embedding_dim=args.dim)
    warm = int(args.batches * args.warmup)
    torch.manual_seed(0)
    net = MODELS[args.model](gen.schema, hidden=(64, 32), embedding_dim=args.dim)
    offline = RecModel(net, torch.nn.BCEWithLogitsLoss(), default_optimizer(net, lr=args.lr), progress_bar=False)
    offline.train(1, [gen.batch(t) for t in range(warm)])
    online_net = copy.deepcopy(net)
    scores, labels = frozen_scores(net, gen, warm, args.batches)

    online_net.train()
    model = RecModel(online_net, torch.nn.BCEWithLogitsLoss(), default_optimizer(online_net, lr=args.lr),
                     progress_bar=False)
    monitor = PrequentialMonitor(window=args.window * args.batch_size, log_every=args.window, verbose=False)
    windows = WindowScores(args.window)
    t0 = time.perf_counter()
    model.online_train(IterableStream(lambda: (gen.batch(t) for t in range(warm, args.batches))),
                       callbacks=[monitor, windows], dataset_sink_mode=False)
    seconds = time.perf_counter() - t0

    rows, per = [], args.window * args.batch_size
    for k, report in enumerate(windows.reports):
        start = warm + k * args.window
        stop = start + args.window
        sl = slice(k * per, (k + 1) * per)
        rows.append((start, gen.bayes_auc(start, stop), report["auc"], roc_auc(scores[sl], labels[sl])))
    total = {"bayes": gen.bayes_auc(warm, args.batches), "online": monitor.last["auc_total"],
             "offline": roc_auc(scores, labels), "events_per_s": (args.batches - warm) * args.batch_size / seconds}
    return {"table": table, "rows": rows, "total": total, "warm": warm}


def report(result: dict) -> None:
    t = result["total"]
    print(f"\n{result['table']} user/item tables (offline pass on batches 0..{result['warm'] - 1}, then online)")
    print(f"{'from batch':>10s} {'Bayes':>7s} {'online':>7s} {'offline-once':>13s} {'gap online':>11s}")
    for start, bayes, online, off in result["rows"]:
        print(f"{start:10d} {bayes:7.4f} {online:7.4f} {off:13.4f} {bayes - online:11.4f}")
    print(f"{'all':>10s} {t['bayes']:7.4f} {t['online']:7.4f} {t['offline']:13.4f} {t['bayes'] - t['online']:11.4f}"
          f"   ({t['events_per_s']:,.0f} events/s online, test-then-train)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batches", type=int, default=300)
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--table-size", type=int, default=4096)
    p.add_argument("--dim", type=int, default=8)
    p.add_argument("--warmup", type=float, default=0.2, help="fraction of the stream trained on offline first")
    p.add_argument("--window", type=int, default=40, help="batches per reported window")
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tables", default="hashed,dynamic")
    p.add_argument("--model", default="deepfm", choices=sorted(MODELS))
    args = p.parse_args()
    torch.set_num_threads(1)
    print(f"DriftingCTR: {args.batches} batches x {args.batch_size} events, user/item tables of {args.table_size} "
          f"rows, {args.model} dim {args.dim}, default_optimizer(lr={args.lr}), 1 thread")
    for table in args.tables.split(","):
        report(run(args, table))


if __name__ == "__main__":
    main()
