"""The least-recently-seen select of one LRU pass of a full `HashEmbedding`, per implementation.

An LRU pass picks the ``--k`` rows seen longest ago among ``--rows`` (a full table evicting down to
its low watermark: 5% of 2.6M rows by default, as `bench_embeddings.py`'s ``hash_full``):

- ``static``: `lru_select.oldest_static`, the device path's select (no host read; what a GPU runs);
- ``torch_ops``: `lru_select._select`, the same selection on torch ops with three host reads (the
  baseline: what the device path would run without the static one);
- ``compiled`` (CPU only): `lru_select.oldest`, the compiled kernel the host path runs.

Two age profiles: ``--spans`` ages drawn over 30 steps (one age per bucket: the edge bucket's picks
spread over it) and over 200,000 (several ages per bucket: the edge by age). Each variant runs
``--reps`` times after one warm-up (on CUDA the device synchronised around each); the report is the
median, and each variant's time over ``torch_ops``'s from the same run. ``static`` and ``compiled``
are checked to select what ``torch_ops`` selects, in its order.

    python benchmarks/bench_lru.py --rows 2600000 --k 130000 --reps 5
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from recstream.nn import lru_select, native


def _time(fn, reps: int, device: torch.device) -> tuple[float, object]:
    fn()  # warm-up (and on CUDA the kernels' first loads)
    times, out = [], None
    for _ in range(reps):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        out = fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def measure(last_seen: torch.Tensor, step: int, k: int, reps: int, device: torch.device) -> list[tuple[str, float]]:
    """``(variant, median seconds)`` of each select of `k` rows of `last_seen`; raises SystemExit if
    one selects other rows than the torch ops."""
    base, want = _time(lambda: lru_select._select(last_seen, last_seen < step, step, k), reps, device)
    out = [("torch_ops", base)]
    ms, (order, chosen) = _time(lambda: lru_select.oldest_static(last_seen, step, k), reps, device)
    if not torch.equal(order[chosen], want):
        raise SystemExit("bench_lru: oldest_static selected other rows than _select")
    out.append(("static", ms))
    if device.type == "cpu" and native.kernels is not None:
        ms, got = _time(lambda: lru_select.oldest(last_seen, step, k), reps, device)
        if not torch.equal(got, want):
            raise SystemExit("bench_lru: the compiled kernel selected other rows than _select")
        out.append(("compiled", ms))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=2_600_000)
    p.add_argument("--k", type=int, default=130_000)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--spans", default="30,200000", help="comma-separated age spans (steps)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    if args.rows < 1 or args.k < 1 or args.reps < 1:
        p.error(f"--rows, --k and --reps must be >= 1, got {args.rows}, {args.k}, {args.reps}")
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    step = 10**9
    print(f"rows={args.rows:,} k={args.k:,} reps={args.reps} device={device} threads={args.threads}")
    print("| ages over | variant | ms (median) | vs torch_ops |")
    print("| --- | --- | --- | --- |")
    for span in (int(s) for s in args.spans.split(",")):
        gen = torch.Generator().manual_seed(span)
        last_seen = step - 1 - torch.randint(0, span, (args.rows,), generator=gen)
        last_seen[torch.randperm(args.rows, generator=gen)[: args.rows // 26]] = step  # this batch's rows
        rows = measure(last_seen.to(device), step, args.k, args.reps, device)
        for name, ms in rows:
            print(f"| {span:,} | {name} | {ms * 1e3:.2f} | {ms / rows[0][1]:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
