"""Training throughput of a model with dynamic-id (HashEmbedding) features vs the same model with
fixed tables of the same size.

Both models read the same batches: ``user`` and ``item`` ids drawn from a Zipf law over
``--rows`` ids (scattered over that range), plus two small fixed features and dense values. The
fixed model has ``vocab_size=--rows`` tables for user and item; the dynamic one
``dynamic=True, capacity=--rows`` tables (every other feature identical), so a full step --
forward, backward, ``default_optimizer`` step -- is compared like for like. One thread; the two
models run interleaved in rounds of ``--steps`` steps (so load changes on a shared machine hit
both alike); the report is the median per-round events/s (per second of this thread's CPU time)
and the ratio fixed/dynamic. With ``--device cuda`` the models and batches live on the GPU and
a round is timed by the wall clock (the device synchronised before and after it); ``--step model``
trains through ``Model`` instead of a hand loop (on CUDA: the step as a CUDA graph). With
``--shared-table`` the dynamic model's id features share one hash table (``table=``, the summed
capacity): one lookup a step instead of one each; ``--id-features 26`` compares 26 such features
(a Criteo-like model) instead of user and item.

    python benchmarks/bench_dynamic.py --rows 100000 --batch-size 1024 --rounds 5 --steps 20
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from recstream import Model
from recstream.data import CategoricalFeature, Features, Schema
from recstream.models import DLRM, DCNv2, DeepFM, WideDeep, default_optimizer

MODELS = {
    "widedeep": lambda s: WideDeep(s, hidden=(256, 128), embedding_dim=16),
    "deepfm": lambda s: DeepFM(s, hidden=(256, 128), embedding_dim=16),
    "dcnv2": lambda s: DCNv2(s, num_cross_layers=2, hidden=(256, 128), embedding_dim=16),
    "dlrm": lambda s: DLRM(s, bottom=(64,), top=(256, 128), embedding_dim=16),
}


def id_names(count: int) -> tuple[str, ...]:
    """The features that are fixed in one model and dynamic in the other."""
    return ("user", "item") if count == 2 else tuple(f"id{i}" for i in range(count))


def schema(rows: int, dynamic: bool, shared: bool = False, id_features: int = 2) -> Schema:
    table = "ids" if shared else None
    ids = [CategoricalFeature(n, dynamic=True, capacity=rows, table=table) if dynamic
           else CategoricalFeature(n, vocab_size=rows) for n in id_names(id_features)]
    return Schema([f"x{i}" for i in range(4)], [*ids, CategoricalFeature("category", vocab_size=100),
                                                 CategoricalFeature("hour", vocab_size=24)])


def batches(n: int, batch_size: int, rows: int, seed: int = 0, id_features: int = 2) -> list:
    rng = np.random.default_rng(seed)
    names = (*id_names(id_features), "category", "hour")
    out = []
    for _ in range(n):
        # heavy head, long tail, scattered
        cols = [(rng.zipf(1.2, batch_size) * 7919) % rows for _ in range(id_features)]
        cols += [rng.integers(0, 100, batch_size), rng.integers(0, 24, batch_size)]
        values = torch.from_numpy(np.concatenate(cols).astype(np.int64))
        offsets = torch.arange(len(names) * batch_size + 1, dtype=torch.int64)
        dense = torch.from_numpy(rng.standard_normal((batch_size, 4), dtype=np.float32))
        out.append((Features(dense, values, offsets, batch_size, len(names), names),
                    torch.from_numpy((rng.random(batch_size) < 0.25).astype(np.float32))))
    return out


def make_step(net: torch.nn.Module, how: str = "hand"):
    """The training step: a hand loop, or ``Model.train_network`` ("model": on CUDA a CUDA graph,
    replayed while the dynamic tables have room; recstream.train.cuda_graph)."""
    opt = default_optimizer(net)
    if how == "model":
        model = Model(net, torch.nn.BCEWithLogitsLoss(), opt, progress_bar=False)
        return model.train_network
    loss_fn = torch.nn.BCEWithLogitsLoss()

    def step(x, y):
        opt.zero_grad()
        loss = loss_fn(net(x), y)
        loss.backward()
        opt.step()
        return loss
    return step


def run(args, name: str) -> dict:
    # Fresh batches every round, as a stream brings them: the long tail keeps bringing ids the
    # dynamic tables have not seen (about 60 of the ~430 distinct ids of a 1024-batch here), and
    # admitting them is part of a dynamic table's cost. Both models train on the same batches.
    device = torch.device(args.device)
    data = [(x.to(device), y.to(device)) for x, y in
            batches(args.warmup + args.rounds * args.steps, args.batch_size, args.rows, id_features=args.id_features)]
    # On CUDA the thread's CPU time misses the time spent waiting for the device: wall clock there.
    clock = time.perf_counter if device.type == "cuda" else time.thread_time
    steps = {}
    for dynamic in (False, True):
        torch.manual_seed(0)
        net = MODELS[name](schema(args.rows, dynamic, args.shared_table, args.id_features))
        steps[dynamic] = make_step(net.to(device), args.step)
        for x, y in data[:args.warmup]:
            steps[dynamic](x, y)
    rates = {False: [], True: []}
    for r in range(args.rounds):
        chunk = data[args.warmup + r * args.steps:args.warmup + (r + 1) * args.steps]
        for dynamic in ((False, True) if r % 2 == 0 else (True, False)):
            # CPU time of this thread (torch runs single-threaded here): what other processes on a
            # shared machine do shows up far less than in wall time.
            _sync(device)
            t0 = clock()
            for x, y in chunk:
                steps[dynamic](x, y)
            _sync(device)
            rates[dynamic].append(len(chunk) * args.batch_size / (clock() - t0))
    if args.profile:
        profile_steps(name, steps[True], data[-args.steps:], device)
    fixed, dyn = statistics.median(rates[False]), statistics.median(rates[True])
    # Through Model on CUDA: how many steps replayed the graph (a dynamic step that must read its
    # tables' counters runs eagerly; recstream.train.cuda_graph).
    replays = {d: getattr(getattr(steps[d], "__self__", steps[d]), "replays", None) for d in (False, True)}
    return {"model": name, "fixed": fixed, "dynamic": dyn, "ratio": fixed / dyn, "replays": replays,
            "steps": args.warmup + args.rounds * args.steps}


def profile_steps(name: str, step, data, device: torch.device, top: int = 12) -> None:
    """Where the dynamic model's steps go on a GPU: wall and kernel ms per step and the kernels
    with the most GPU time (torch.profiler, over `data` once more)."""
    from torch.profiler import ProfilerActivity, profile

    _sync(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for x, y in data:
            step(x, y)
        _sync(device)
        wall = (time.perf_counter() - t0) / len(data)
    from profile_step import print_kernels  # beside this file: run as a script, its folder is on sys.path

    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    n = len(data)
    print(f"## {name} dynamic: {wall * 1e3:.2f} ms/step wall, {sum(e.device_time for e in kernels) / 1e3 / n:.2f} "
          f"ms/step in kernels, {len(kernels) / n:.0f} kernels/step")
    if kernels:
        print_kernels(f"{name} dynamic", kernels, n, top)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=8, max_name_column_width=40))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--models", default="widedeep,deepfm,dcnv2,dlrm")
    p.add_argument("--device", default="cpu")
    p.add_argument("--step", choices=("hand", "model"), default="hand",
                   help="hand: a hand loop (eager); model: Model.train_network (a CUDA graph on CUDA)")
    p.add_argument("--profile", action="store_true", help="profile the dynamic model's last steps (CUDA)")
    p.add_argument("--shared-table", action="store_true", help="the dynamic features in one hash table")
    p.add_argument("--id-features", type=int, default=2,
                   help="features fixed in one model, dynamic in the other (2: user and item)")
    args = p.parse_args()
    if args.id_features < 1:
        p.error(f"--id-features must be >= 1, got {args.id_features}")
    torch.set_num_threads(1)
    print(f"rows={args.rows} batch={args.batch_size} rounds={args.rounds}x{args.steps} steps, 1 thread, "
          f"device={args.device}, step={args.step}, {args.id_features} id features"
          f"{' in one table' if args.shared_table else ''}")
    print(f"{'model':10s} {'fixed ev/s':>11s} {'dynamic ev/s':>13s} {'fixed/dynamic':>14s}")
    for name in args.models.split(","):
        r = run(args, name)
        graphs = "" if r["replays"][True] is None else \
            f"   graph replays: fixed {r['replays'][False]}, dynamic {r['replays'][True]} of {r['steps']} steps"
        print(f"{r['model']:10s} {r['fixed']:11,.0f} {r['dynamic']:13,.0f} {r['ratio']:14.2f}x{graphs}")


if __name__ == "__main__":
    main()
