"""Where a training step's time goes on a GPU: a torch.profiler trace of steady `Model.train` steps.

For each variant (bench_boost.py's workload: 26 fields x ``--vocab`` ids x ``--dim``, 13 dense, the
MLP ``--hidden``), trains ``--warm`` steps, then profiles ``--steps`` more and prints per step: wall
milliseconds, GPU kernel time (the sum of kernel durations: the card's busy time when they do not
overlap), kernels launched, CUDA graph launches, memcpy calls and synchronisations, and the ten ops
with the most CPU time; on CUDA also the ``--top-kernels`` kernels with the most GPU time (kernels
inside a replayed CUDA graph are traced one by one too). A step whose wall time is far above its
GPU time is host-bound; one whose GPU time is far above `ceiling`'s is bound by those kernels.

    python benchmarks/profile_step.py --device cuda --variants widedeep widedeep_eager O1
    python benchmarks/profile_step.py --device cpu --batch-size 64 --vocab 100 --hidden 16 --steps 2
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

from recstream import Model
from recstream.models import DeepFM, WideDeep, default_optimizer

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_boost  # noqa: E402  (the workload, the idiomatic network and its batches)

BUILT_IN = {"widedeep": WideDeep, "deepfm": DeepFM}


def _model(name: str, gen, args, device):
    torch.manual_seed(0)
    hidden = tuple(args.hidden)
    base = name.split("_")[0]
    if base in BUILT_IN:
        net = BUILT_IN[base](gen.schema, hidden=hidden, embedding_dim=args.dim).to(device)
        config = {"cuda_graphs": False} if name.endswith("eager") else None
        return Model(net, nn.BCEWithLogitsLoss(), default_optimizer(net), progress_bar=False,
                     boost_level="O2" if name.endswith("O2") else "O0", boost_config_dict=config), False
    net = bench_boost.Idiomatic(args.vocab, args.dim, hidden).to(device)
    config = {"sparse_embeddings": True} if name == "O1_sparse" else None
    return Model(net, nn.BCEWithLogitsLoss(), torch.optim.Adam(net.parameters(), lr=1e-3),
                 boost_level=name[:2], progress_bar=False, boost_config_dict=config), True


def profile_variant(name: str, gen, batches, args, device) -> None:
    model, plain = _model(name, gen, args, device)
    data = bench_boost._plain(batches) if plain else batches
    warm, steady = data[:args.warm], data[args.warm:]
    model.train(1, warm)
    cuda = device.type == "cuda"
    sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
    sync()
    with profile(activities=[ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]) as prof:
        start = time.perf_counter()
        model.train(1, steady)
        sync()
        wall = (time.perf_counter() - start) / len(steady)
    events = prof.key_averages()
    n = len(steady)
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    gpu_ms = sum(e.device_time for e in kernels) / 1e3 / n

    def count(*names):
        return sum(e.count for e in events if any(k in e.key for k in names)) / n

    graph = next((x for x in model.boost_report if x.startswith("cuda_graphs")), "cuda_graphs: -")
    print(f"\n## {name}: {wall * 1e3:.2f} ms/step wall, {gpu_ms:.2f} ms/step in kernels, "
          f"{len(kernels) / n:.0f} kernels/step, graph launches {count('cudaGraphLaunch'):.1f}, "
          f"launches {count('cudaLaunchKernel', 'cuLaunchKernel'):.1f}, memcpy {count('cudaMemcpy'):.1f}, "
          f"syncs {count('Synchronize'):.1f} per step ({graph})")
    print(events.table(sort_by="self_cpu_time_total", row_limit=10, max_name_column_width=48))
    if kernels:  # where the GPU's time goes, kernel by kernel (inside a replayed graph too)
        print_kernels(name, kernels, n, args.top_kernels)


def print_kernels(name: str, kernels: list, steps: int, top: int) -> None:
    """The `top` kernels (profiler device events) with the most GPU time, per step of `steps`."""
    by_name: dict[str, list[float]] = {}
    for e in kernels:
        by_name.setdefault(e.name, []).append(e.device_time)
    most = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:top]
    print(f"### {name}: the {len(most)} kernels with the most GPU time (of {len(by_name)} distinct)")
    print("| kernel | us/step | calls/step |\n| --- | --- | --- |")
    for kernel, times in most:
        print(f"| {kernel[:90]} | {sum(times) / steps:.1f} | {len(times) / steps:.1f} |")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--batch-size", type=int, default=4096)
    p.add_argument("--vocab", type=int, default=100_000)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--hidden", type=int, nargs="+", default=[1024, 512, 256])
    p.add_argument("--warm", type=int, default=8)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--variants", nargs="+", default=["widedeep", "widedeep_eager", "O1"])
    p.add_argument("--top-kernels", type=int, default=15, help="kernels listed by GPU time (CUDA only)")
    args = p.parse_args(argv)
    device = torch.device(args.device)  # cpu: the wiring only (no kernels to count)
    gen = bench_boost.SyntheticCTR(num_dense=bench_boost.DENSE, num_categorical=bench_boost.FIELDS,
                                   vocab_sizes=[args.vocab] * bench_boost.FIELDS, batch_size=args.batch_size,
                                   embedding_dim=args.dim, seed=0)
    batches = [b.to(device) for b in gen.train_batches(args.warm + args.steps)]
    for name in args.variants:
        profile_variant(name, gen, batches, args, device)


if __name__ == "__main__":
    main()
