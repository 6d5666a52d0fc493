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


def run(args) -> int:
    import torch  # here, not at the top: `recstream --help` must not load torch

    from ..callbacks import LossMonitor
    from ..data import load_adult
    from ..models import WideDeep, ctr_metrics, default_optimizer
    from ..train import Model
    from .threads import default_threads
    torch.set_num_threads(args.threads or default_threads())
    torch.manual_seed(args.seed)
    train = load_adult("train", seed=args.seed, batch_size=args.batch_size)
    test = load_adult("test", seed=args.seed, batch_size=1024)
    net = WideDeep(train.schema)
    # The demo prints its own lines (LossMonitor, the test AUC below): no bar or epoch summary beside them.
    model = Model(net, torch.nn.BCEWithLogitsLoss(), default_optimizer(net), metrics=ctr_metrics(), progress_bar=False)
    steps = train.get_dataset_size()
    print(f"recstream demo: Wide&Deep on Adult, {steps} steps/epoch of {args.batch_size} rows, "
          f"{len(train.schema.dense)} dense + {len(train.schema.categorical)} categorical features")
    start = time.perf_counter()
    history = model.fit(args.epochs, train, test, callbacks=[LossMonitor(steps)], dataset_sink_mode=True)
    for epoch, results in enumerate(history.history.get("auc", []), start=1):
        print(f"epoch {epoch}: test auc={results:.4f} logloss={history.history['logloss'][epoch - 1]:.4f}")
    features, labels = next(iter(test))
    probs = net.predict_proba(features)[:5]
    print("first test rows: p(income >50K) =", [round(float(p), 3) for p in probs],
          "labels =", [int(v) for v in labels[:5]])
    print(f"trained in {time.perf_counter() - start:.1f} s")
    return 0
