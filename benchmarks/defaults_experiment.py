"""Which `default_optimizer` settings to ship: a small grid, offline and online, measured by AUC.

For each table optimizer (LazyAdam, row-wise Adagrad) and dense learning rate:

- online: DeepFM on `DriftingCTR` with dynamic user/item tables: one offline pass over the first
  20% of the stream, then `RecModel.online_train` test-then-train over the rest; the whole-stream
  prequential AUC (`PrequentialMonitor`) and its gap to the Bayes AUC of the same events;
- offline: WideDeep on Adult, 3 epochs, test AUC.

The table optimizer's learning rate is `default_optimizer`'s own default for it (the dense `lr`
for LazyAdam, 0.05 for row-wise Adagrad) unless `--embedding-lr` is given. One thread; AUCs are
not timings, so a loaded machine does not change them.

    python benchmarks/defaults_experiment.py
"""
from __future__ import annotations

import argparse

import torch

from recstream import Model, RecModel
from recstream.callbacks import PrequentialMonitor
from recstream.data import DriftingCTR, load_adult
from recstream.data.streams import IterableStream
from recstream.models import DeepFM, WideDeep, ctr_metrics, default_optimizer


def online_auc(embedding: str, lr: float, embedding_lr, batches: int) -> tuple[float, float]:
    gen = DriftingCTR(num_batches=batches, batch_size=512, seed=0, table="dynamic", table_size=4096,
                      embedding_dim=8)
    warm = batches // 5
    torch.manual_seed(0)
    net = DeepFM(gen.schema, hidden=(64, 32), embedding_dim=8)
    model = RecModel(net, torch.nn.BCEWithLogitsLoss(),
                     default_optimizer(net, lr=lr, embedding=embedding, embedding_lr=embedding_lr),
                     progress_bar=False)
    model.train(1, [gen.batch(t) for t in range(warm)])
    monitor = PrequentialMonitor(window=10 ** 7, log_every=10 ** 9, verbose=False)
    model.online_train(IterableStream(lambda: (gen.batch(t) for t in range(warm, batches))),
                       callbacks=[monitor], dataset_sink_mode=False)
    return monitor.last["auc_total"], gen.bayes_auc(warm, batches)


def adult_auc(embedding: str, lr: float, embedding_lr) -> float:
    torch.manual_seed(0)
    train, test = load_adult("train", seed=0), load_adult("test", seed=0, batch_size=1024)
    net = WideDeep(train.schema)
    model = Model(net, torch.nn.BCEWithLogitsLoss(),
                  default_optimizer(net, lr=lr, embedding=embedding, embedding_lr=embedding_lr),
                  metrics=ctr_metrics(), progress_bar=False)
    model.train(3, train)
    return model.eval(test)["auc"]


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lrs", type=float, nargs="+", default=[1e-3, 3e-3, 1e-2])
    p.add_argument("--embedding-lr", type=float, default=None)
    p.add_argument("--batches", type=int, default=300)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    rows = []
    print("| table optimizer | dense lr | online prequential AUC (gap to Bayes) | Adult test AUC |")
    print("| --- | --- | --- | --- |")
    for embedding in ("lazy_adam", "rowwise_adagrad"):
        for lr in args.lrs:
            online, bayes = online_auc(embedding, lr, args.embedding_lr, args.batches)
            adult = adult_auc(embedding, lr, args.embedding_lr)
            rows.append({"embedding": embedding, "lr": lr, "online": online, "bayes": bayes, "adult": adult})
            print(f"| {embedding} | {lr:g} | {online:.4f} ({bayes - online:.4f}) | {adult:.4f} |", flush=True)
    return rows


if __name__ == "__main__":
    main()
