"""Steps of a dynamic-id model that read its tables' counters on the device path, counted on a CPU.

On a GPU a training step of a model with `HashEmbedding` features reads its tables' counters (a host
sync) when the host's bounds of their free rows, pending keys and used slots do not show room for
the batch; under a CUDA graph (`recstream.train.cuda_graph`) that step runs eagerly instead of
being replayed, at several times a replay's cost. This counts those steps without a GPU: it trains
`bench_dynamic.py`'s dynamic model (its schema and Zipf ids; ``--capacity`` below the ids' span
makes the tables fill and evict) through `Model` on CPU tensors under
`recstream.hostpath.device_path` (the path CUDA runs; the torch-op table backend), and counts the
steps in which a table read its counters (`HashEmbedding._read_counters` or the one read of
`lookup_masked_many`), in three ways:

* ``none``: the counters' asynchronous copies never land (the bounds take every lookup's worst case);
* ``lag N`` (``--lag``): each copy lands N steps after it was queued (a GPU running behind the host);
* ``now``: each copy lands at once (an idle GPU; a CPU).

    python benchmarks/dynamic_reads.py --steps 400 --batch-size 1024 --rows 100000
    python benchmarks/dynamic_reads.py --steps 400 --capacity 20000   # tables that fill and evict
    python benchmarks/dynamic_reads.py --steps 300 --capacity 20000 --low-watermark 0.897   # two batches' room
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_dynamic  # noqa: E402

from recstream import Model  # noqa: E402
from recstream.data import Schema  # noqa: E402
from recstream.hostpath import device_path  # noqa: E402
from recstream.models import default_optimizer  # noqa: E402
from recstream.nn import HashEmbedding, hash_counters, hash_device_path  # noqa: E402


class _Lagged:
    """Stands in for a CUDA event behind a copy: done at its (`lag` + 1)-th query (one query a step)."""

    def __init__(self, lag: int):
        self.left = lag

    def query(self) -> bool:
        self.left -= 1
        return self.left < 0


def _schema(args) -> Schema:
    base = bench_dynamic.schema(args.rows, True, id_features=args.id_features)
    cats = [dataclasses.replace(c, capacity=args.capacity) if c.dynamic else c for c in base.categorical]
    return Schema(base.dense, cats)


def count_reads(args, copies: str) -> list[int]:
    """The steps (0-based) in which a table read its counters, with `copies` "none", "now" or "lag"."""
    torch.manual_seed(0)
    net = bench_dynamic.MODELS[args.model](_schema(args))
    for m in net.modules():
        if isinstance(m, HashEmbedding):
            m.table_backend = "torch"
            m.evict_low_watermark = args.low_watermark
    model = Model(net, torch.nn.BCEWithLogitsLoss(), default_optimizer(net), progress_bar=False)
    data = [(x.to("cpu"), y) for x, y in bench_dynamic.batches(args.steps, args.batch_size, args.rows,
                                                                 id_features=args.id_features)]
    post, read, step = hash_counters.CounterWatch.post, HashEmbedding._read_counters, [0]
    reads: set[int] = set()

    def posted(self, emb):
        if copies == "none":
            return
        post(self, emb)
        if copies == "lag" and self._flight is not None and self._flight.event is None:
            self._flight = dataclasses.replace(self._flight, event=_Lagged(args.lag))

    def counted(self):
        reads.add(step[0])
        return read(self)

    decide = hash_device_path.DevicePath._decide  # after the one read of a lookup (or of several tables)

    def decided(self, plan, values, backend):
        reads.add(step[0])
        return decide(self, plan, values, backend)

    patches = [(hash_counters.CounterWatch, "post", posted), (HashEmbedding, "_read_counters", counted),
               (hash_device_path.DevicePath, "_decide", decided)]
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    try:
        for owner, name, fn in patches:
            setattr(owner, name, fn)
        with device_path():
            for i, (x, y) in enumerate(data):
                step[0] = i
                model.train_network(x, y)
    finally:
        for owner, name, fn in saved:
            setattr(owner, name, fn)
    return sorted(reads)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="widedeep", choices=sorted(bench_dynamic.MODELS))
    p.add_argument("--rows", type=int, default=100_000, help="the ids' span (bench_dynamic's --rows)")
    p.add_argument("--capacity", type=int, default=None, help="each dynamic table's rows (default: --rows)")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--id-features", type=int, default=2)
    p.add_argument("--lag", type=int, default=2, help="steps after which a lagged copy lands")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--low-watermark", type=float, default=0.95, help="the tables' evict_low_watermark")
    args = p.parse_args(argv)
    if not 0.0 <= args.low_watermark <= 1.0:
        p.error(f"--low-watermark must be within [0, 1], got {args.low_watermark}")
    args.capacity = args.capacity or args.rows
    torch.set_num_threads(args.threads)
    print(f"{args.model}, {args.id_features} dynamic id features, capacity {args.capacity:,} each, ids over "
          f"{args.rows:,}, batch {args.batch_size:,}, {args.steps} steps on the device path (CPU tensors), "
          f"evict_low_watermark {args.low_watermark}")
    for copies in ("none", "lag", "now"):
        reads = count_reads(args, copies)
        label = f"lag {args.lag}" if copies == "lag" else copies
        print(f"copies {label:>6}: {len(reads):4d} steps read the counters; first ones {reads[:12]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
