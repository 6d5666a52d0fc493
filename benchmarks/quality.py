"""Model quality, measured: test AUC of the recstream.models CTR models.

Two tasks, each trained with ``recstream.Model`` + ``default_optimizer`` and evaluated
with ``ctr_metrics`` (AUC on logits) on held-out rows:

* ``synthetic``: :class:`~recstream.data.SyntheticCTR` (Criteo-shaped by default:
  13 dense, 26 categorical features with Zipf ids over vocabularies of 100..100,000).
  Every training batch is fresh (one pass, no repeats), and the generator knows the true
  click probabilities, so the gap to its Bayes-optimal AUC measures what a model misses.
  Target: gap <= 0.01.
* ``adult``: WideDeep on the UCI Adult census split of ``load_adult`` (80/20). Target:
  test AUC >= 0.90.

Prints one row per (task, model): steps, batch size, test AUC, Bayes AUC, gap, wall time
(training + evaluation, this process; the machine may be shared, so times are noisy).

    python benchmarks/quality.py                       # both tasks, all four models
    python benchmarks/quality.py --task synthetic --models deepfm,dlrm --steps 3000
"""
from __future__ import annotations

import argparse
import functools
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from recstream import Model  # noqa: E402
from recstream.data import SyntheticCTR, load_adult  # noqa: E402
from recstream.models import DLRM, DCNv2, DeepFM, WideDeep, ctr_metrics, default_optimizer  # noqa: E402

# Model shapes used for the reported numbers (embedding width 16 throughout).
BUILDERS = {
    "widedeep": lambda s, a: WideDeep(s, hidden=a.hidden, embedding_dim=a.dim),
    "deepfm": lambda s, a: DeepFM(s, hidden=a.hidden, embedding_dim=a.dim),
    "dcnv2": lambda s, a: DCNv2(s, num_cross_layers=2, hidden=a.hidden, embedding_dim=a.dim, low_rank=a.low_rank),
    "dlrm": lambda s, a: DLRM(s, bottom=(64,), top=a.hidden, embedding_dim=a.dim),
}


def _model(net, args) -> Model:
    opt = default_optimizer(net, lr=args.lr, embedding=args.embedding_optimizer, embedding_lr=args.embedding_lr,
                            wide_lr=args.wide_lr)
    return Model(net, torch.nn.BCEWithLogitsLoss(), opt, metrics=ctr_metrics(), progress_bar=False)


def run_synthetic(name: str, args) -> dict:
    """Train on fresh batches; every `--eval-every` steps evaluate, to find the first step
    count whose gap to the Bayes AUC is <= --target-gap (None: never reached)."""
    gen = SyntheticCTR(num_dense=args.num_dense, num_categorical=args.num_categorical, seed=args.seed,
                       batch_size=args.batch_size)
    bayes = gen.bayes_auc(args.test_rows)
    test = gen.test_split(args.test_rows, batch_size=8192)
    torch.manual_seed(args.seed)
    model = _model(BUILDERS[name](gen.schema, args), args)
    every = args.eval_every or args.steps
    reached, done, auc, curve = None, 0, math.nan, []
    start = time.perf_counter()
    while done < args.steps:
        chunk = min(every, args.steps - done)
        model.train(1, gen.train_batches(chunk, start=done))  # batches done..done+chunk-1: never repeated
        done += chunk
        auc = model.eval(test)["auc"]
        curve.append(f"{done}:{auc:.4f}")
        if reached is None and bayes - auc <= args.target_gap:
            reached = done
    secs = time.perf_counter() - start
    if args.eval_every:
        print(f"  {name} test AUC by step: {' '.join(curve)}", flush=True)
    return dict(task="synthetic", model=name, steps=args.steps, batch=args.batch_size, auc=auc, bayes=bayes,
                gap=bayes - auc, secs=secs, reached=reached)


def run_adult(name: str, args) -> dict:
    train = load_adult("train", batch_size=args.adult_batch_size, embedding_dim=args.dim)
    test = load_adult("test", batch_size=4096, embedding_dim=args.dim)
    torch.manual_seed(args.seed)
    model = _model(BUILDERS[name](train.schema, args), args)
    start = time.perf_counter()
    model.train(args.adult_epochs, train)
    auc = model.eval(test)["auc"]
    return dict(task="adult", model=name, steps=args.adult_epochs * len(train), batch=args.adult_batch_size,
                auc=auc, bayes=math.nan, gap=math.nan, secs=time.perf_counter() - start, reached=None)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--task", choices=("synthetic", "adult", "all"), default="all")
    p.add_argument("--models", default="widedeep,deepfm,dcnv2,dlrm",
                   help="comma-separated subset of " + ",".join(BUILDERS) + " (adult: widedeep unless --adult-all)")
    p.add_argument("--adult-all", action="store_true", help="run every model on Adult, not just WideDeep")
    p.add_argument("--steps", type=int, default=4000, help="synthetic training steps (fresh batches)")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--eval-every", type=int, default=500,
                   help="synthetic: also evaluate every N steps (prints the AUC curve, fills 'reached at')")
    p.add_argument("--target-gap", type=float, default=0.01)
    p.add_argument("--test-rows", type=int, default=200_000)
    p.add_argument("--num-dense", type=int, default=13)
    p.add_argument("--num-categorical", type=int, default=26)
    p.add_argument("--adult-epochs", type=int, default=3)
    p.add_argument("--adult-batch-size", type=int, default=256)
    p.add_argument("--dim", type=int, default=16, help="embedding width")
    p.add_argument("--hidden", default="256,128", help="MLP widths (DLRM: top MLP)")
    p.add_argument("--low-rank", type=int, default=None, help="DCNv2 cross rank (default: full)")
    p.add_argument("--lr", type=float, default=1e-3, help="Adam lr of the dense parameters")
    p.add_argument("--embedding-optimizer", choices=("lazy_adam", "rowwise_adagrad"), default="lazy_adam")
    p.add_argument("--embedding-lr", type=float, default=None)
    p.add_argument("--wide-lr", type=float, default=0.05, help="FTRL alpha of WideDeep's wide part")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1,
                   help="torch.set_num_threads (default 1: on a shared machine extra threads mostly spin)")
    args = p.parse_args(argv)
    args.hidden = tuple(int(h) for h in args.hidden.split(",") if h)
    names = [m for m in args.models.split(",") if m]
    unknown = [m for m in names if m not in BUILDERS]
    if unknown:
        p.error(f"--models: unknown {unknown}; choose from {list(BUILDERS)}")
    if args.threads:
        torch.set_num_threads(args.threads)

    jobs = []
    if args.task in ("synthetic", "all"):
        jobs += [functools.partial(run_synthetic, n) for n in names]
    if args.task in ("adult", "all"):
        jobs += [functools.partial(run_adult, n) for n in (names if args.adult_all else ["widedeep"])]
    header = (f"{'task':<10} {'model':<9} {'steps':>6} {'batch':>6} {'test AUC':>9} {'Bayes AUC':>9} "
              f"{'gap':>8} {'reached at':>10} {'wall s':>7}")
    print(header)
    print("-" * len(header))
    for job in jobs:
        r = job(args)
        print(f"{r['task']:<10} {r['model']:<9} {r['steps']:>6} {r['batch']:>6} {r['auc']:>9.4f} "
              f"{r['bayes']:>9.4f} {r['gap']:>8.4f} {str(r['reached'] or '-'):>10} {r['secs']:>7.1f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
