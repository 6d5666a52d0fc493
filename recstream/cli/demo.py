"""`recstream demo`: the embedded default job — Wide & Deep on the bundled Adult census data.

Trains `recstream.models.WideDeep` (FTRL for the wide part, LazyAdam for the embedding tables,
Adam for the MLP) with `Model.fit` in sink mode, evaluating test AUC and log loss after each
epoch, then prints a few predicted probabilities. Adult: UCI Census Income, CC BY 4.0 (see
recstream/data/datasets/README.md).
"""
from __future__ import annotations

import time

from .options import checked

_OWNER = "recstream demo"


def add_parser(sub) -> None:
    p = sub.add_parser("demo", help="train and evaluate Wide&Deep on the bundled Adult data set",
                       description="Train Wide&Deep on the bundled Adult census data and print test AUC and "
                                   "log loss after each epoch.")
    p.add_argument("--epochs", type=checked(int, _OWNER, "--epochs", minimum=1), default=3,
                   help="passes over the training data (default 3)")
    p.add_argument("--batch-size", type=checked(int, _OWNER, "--batch-size", minimum=1), default=256,
                   help="training batch size (default 256)")
    p.add_argument("--seed", type=checked(int, _OWNER, "--seed", minimum=0), default=0)
    p.add_argument("--threads", type=checked(int, _OWNER, "--threads", minimum=1), default=None,
                   help="torch CPU threads (default: the cores the load leaves free, at least 1)")
    p.set_defaults(run=run)


def _epoch_lines(epochs: int):
    """A callback printing one line per epoch: the test set's AUC and log loss (whole-set figures)."""
    from ..callbacks import Callback

    class EpochLine(Callback):
        called_in_fit_eval = False

        def on_train_epoch_begin(self, run_context):
            self.start = time.perf_counter()

        def on_train_epoch_end(self, run_context):
            p = run_context.original_args()
            results = p.eval_results or {}
            print(f"epoch {p.cur_epoch_num}/{epochs}: test auc={results.get('auc', float('nan')):.4f} "
                  f"logloss={results.get('logloss', float('nan')):.4f} (whole test set), "
                  f"{time.perf_counter() - self.start:.1f} s", flush=True)

    return EpochLine()


def run(args) -> int:
    started = time.perf_counter()  # the command's time: torch's import and the data's loading included
    import torch  # here, not at the top: `recstream --help` must not load torch

    from ..data import load_adult
    from ..models import WideDeep, ctr_metrics, default_optimizer
    from ..train import Model
    from .threads import default_threads
    torch.set_num_threads(args.threads or default_threads())
    torch.manual_seed(args.seed)
    train = load_adult("train", seed=args.seed, batch_size=args.batch_size)
    test = load_adult("test", seed=args.seed, batch_size=1024)
    net = WideDeep(train.schema)
    # The demo prints its own line per epoch: no bar or epoch summary beside it.
    model = Model(net, torch.nn.BCEWithLogitsLoss(), default_optimizer(net), metrics=ctr_metrics(), progress_bar=False)
    steps = train.get_dataset_size()
    print(f"recstream demo: Wide&Deep on Adult, {steps} steps/epoch of {args.batch_size} rows, "
          f"{len(train.schema.dense)} dense + {len(train.schema.categorical)} categorical features")
    start = time.perf_counter()
    model.fit(args.epochs, train, test, callbacks=[_epoch_lines(args.epochs)], dataset_sink_mode=True)
    fitted = time.perf_counter() - start
    features, labels = next(iter(test))
    probs = net.predict_proba(features)[:5]
    print("first test rows: p(income >50K) =", [round(float(p), 3) for p in probs],
          "labels =", [int(v) for v in labels[:5]])
    print(f"recstream demo: {time.perf_counter() - started:.1f} s in all, {fitted:.1f} s of it training and "
          "evaluating (the rest: importing torch, loading the data)")
    return 0
