"""Time one training step of the embedding layer: lookup + backward + optimizer update.

Workload: batch ``--batch`` (1024) x ``--features`` (26) single-hot categorical features,
embedding dim ``--dim`` (16), ``--vocab`` (100_000) rows per feature, ids drawn from a power
law (``P(id = k) ~ 1/(k+1)``, log-uniform ranks) so a few ids are hot and most are rare.
Variants, all starting from the same pre-generated batches:

- ``dense_adam``  (baseline): 26 separate ``nn.Embedding`` tables, dense gradients,
  ``torch.optim.Adam`` (touches every row of every table every step).
- ``fused_lazyadam`` / ``fused_rowwise``: one ``recstream.nn.EmbeddingBagCollection``
  (``sparse=True``, all tables fused) with ``LazyAdam`` / ``RowWiseAdagrad``.
- ``hash_lazyadam``: ``recstream.nn.HashEmbedding`` with capacity ``features * vocab``
  (same number of rows), keys ``feature * vocab + id``, with ``LazyAdam``.
- ``hash_lazyadam_torch`` / ``hash_full_torch`` (by default on CUDA only): ``hash_lazyadam`` and ``hash_full`` with
  ``table_backend="torch"``, beside the default ``"auto"`` (the Triton table on CUDA), so one run
  gives the Triton table's speed-up over the torch-op device path.
- ``hash_full``: the same HashEmbedding, but FULL and evicting, in its steady state: its keys
  come from a ``--full-vocab`` (10^6) id space per feature, 10x its rows, with a fresh batch
  every step; before the first step it is filled to capacity as ``--full-history`` (200)
  earlier steps of that stream would have left it (their keys, each last seen when it was), so
  the hot keys are in and each step brings the never-seen keys a long run still meets, which
  take least-recently-seen rows (LRU eviction). Eviction runs in batches (one LRU pass
  frees ``(1 - evict_low_watermark) * capacity`` rows), so a few steps pay for a scan and the
  rest none: read the MEAN column for it (the median hides the scans).
- ``fused_hashed``: its reference, an equally sized fused table (``EmbeddingBagCollection``,
  ``vocab`` rows per feature, ``LazyAdam``) fed the SAME ids as ``hash_full``, folded into its
  rows by ``id % vocab`` (the "hashing trick": what one does without a dynamic table), so both
  touch about as many distinct rows per step.

The loss is ``mean(out ** 2)`` on the ``[batch, features * dim]`` output. Repetitions of the
variants are interleaved in one process (round-robin, after warm-up steps) so load on a shared
machine hits all of them alike; the table shows medians and the ratios. Memory per row is
computed from tensor sizes: values + optimizer state (+ hash metadata, + the dense gradient
buffer the baseline allocates each step).

    python benchmarks/bench_embeddings.py --reps 15
    python benchmarks/bench_embeddings.py --vocab 20000 --reps 5   # quick check
"""
from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn

from recstream.nn import EmbeddingBagCollection, EmbeddingTableConfig, HashEmbedding
from recstream.nn.hash_embedding import triton_works
from recstream.optim import LazyAdam, RowWiseAdagrad


def power_law_ids(gen: torch.Generator, shape, vocab: int) -> torch.Tensor:
    """Ids in [0, vocab) with P(k) ~ 1/(k+1): exponentiate a uniform over log(vocab+1)."""
    u = torch.rand(shape, generator=gen, dtype=torch.float64)
    return (torch.exp(u * math.log(vocab + 1)) - 1).long().clamp_(0, vocab - 1)


def nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def state_bytes(opt: torch.optim.Optimizer) -> int:
    return nbytes(v for s in opt.state.values() for v in s.values() if torch.is_tensor(v))


class Variant:
    """One model + optimizer + a ``step(batch)`` closure, and its memory accounting."""

    def __init__(self, name: str, module: nn.Module, opt: torch.optim.Optimizer,
                 forward: Callable[[dict], torch.Tensor], rows: int) -> None:
        self.name, self.module, self.opt, self.forward, self.rows = name, module, opt, forward, rows
        self.times: list[float] = []

    def step(self, batch: dict) -> None:
        out = self.forward(batch)
        loss = out.pow(2).mean()
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()

    def memory_per_row(self) -> dict[str, float]:
        params = list(self.module.parameters())
        mem = {"values": nbytes(params) / self.rows,
               "opt_state": state_bytes(self.opt) / self.rows,
               "metadata": nbytes(self.module.buffers()) / self.rows,
               # The dense baseline materialises a full gradient every step.
               "dense_grad": nbytes(p.grad for p in params
                                    if p.grad is not None and not p.grad.is_sparse) / self.rows}
        mem["total"] = sum(mem.values())
        return mem


def build_variants(args, device) -> list[Variant]:
    F, D, V = args.features, args.dim, args.vocab
    torch.manual_seed(0)
    variants = []
    if "dense_adam" in args.variants:
        tables = nn.ModuleList(nn.Embedding(V, D) for _ in range(F)).to(device)
        variants.append(Variant(
            "dense_adam", tables, torch.optim.Adam(tables.parameters(), lr=1e-3),
            lambda b: torch.cat([t(b["ids"][:, f]) for f, t in enumerate(tables)], dim=1), F * V))
    cfgs = [EmbeddingTableConfig(f"t{f}", V, D) for f in range(F)]
    for name, opt_cls, ids in (("fused_lazyadam", LazyAdam, "values"), ("fused_rowwise", RowWiseAdagrad, "values"),
                               ("fused_hashed", LazyAdam, "full_values")):
        if name in args.variants:
            ebc = EmbeddingBagCollection(cfgs, sparse=True, device=device)
            # Trusted benchmark input: skip per-call validation (it costs host syncs).
            fwd = (lambda e, i: lambda b: e(b[i], b["offsets"], b["batch"], validate=False))(ebc, ids)
            variants.append(Variant(name, ebc, opt_cls(ebc.parameters(), lr=1e-2), fwd, F * V))
    for name in ("hash_lazyadam", "hash_lazyadam_torch"):
        if name in args.variants:
            emb = HashEmbedding(D, capacity=F * V, device=device)
            emb.table_backend = "torch" if name.endswith("_torch") else "auto"
            variants.append(Variant(
                name, emb, LazyAdam(emb.parameters(), lr=1e-3),
                (lambda e: lambda b: e(b["keys"]).reshape(b["batch"], F * D))(emb), F * V))
    for name in ("hash_full", "hash_full_torch"):
        if name in args.variants:
            full = HashEmbedding(D, capacity=F * V, device=device, evict_low_watermark=args.low_watermark)
            full.table_backend = "torch" if name.endswith("_torch") else "auto"
            keys, last_seen = history(args)
            full.load_rows(keys.to(device), torch.zeros(keys.numel(), D, device=device),
                           last_seen=last_seen.to(device))
            full.values.pop_reset_rows()
            variants.append(Variant(
                name, full, LazyAdam(full.parameters(), lr=1e-3),
                (lambda e: lambda b: e(b["full_keys"]).reshape(b["batch"], F * D))(full), F * V))
    return variants


def history(args) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and last-seen steps that fill hash_full as ``--full-history`` earlier steps would have.

    The keys of that many batches from the same distribution (the most recent ``capacity`` of
    them; each with the step it was last seen, <= 0), topped up with never-used keys seen
    before all of them: the table starts full, holding the hot keys, as after a long run.
    """
    F, B, V, fv, steps = args.features, args.batch, args.vocab, args.full_vocab, args.full_history
    gen = torch.Generator().manual_seed(args.seed + 1)
    keys = torch.cat([(power_law_ids(gen, (B, F), fv) + torch.arange(F) * fv).reshape(-1) for _ in range(steps)])
    seen = torch.arange(-steps + 1, 1).repeat_interleave(B * F)  # step of each occurrence
    uniq, inverse = torch.unique(keys, return_inverse=True)
    last = torch.full((uniq.numel(),), -steps, dtype=torch.int64).scatter_reduce_(0, inverse, seen, "amax")
    recent = torch.argsort(last, descending=True, stable=True)[: F * V]
    uniq, last = uniq[recent], last[recent]
    pad = F * V - uniq.numel()  # distinct negative keys: never in a batch
    return (torch.cat([uniq, -torch.arange(3, pad + 3)]),
            torch.cat([last, torch.full((pad,), -steps - 1, dtype=torch.int64)]))


def make_batches(args, device) -> list[dict]:
    gen = torch.Generator().manual_seed(args.seed)
    B, F, V = args.batch, args.features, args.vocab
    batches = []
    # hash_full needs fresh keys every step: one batch per step, never cycled.
    steps = (args.warmup + args.reps if {"hash_full", "hash_full_torch", "fused_hashed"} & set(args.variants)
             else args.num_batches)
    for _ in range(max(steps, args.num_batches)):
        ids = power_law_ids(gen, (B, F), V)
        batches.append({
            "batch": B,
            "ids": ids.to(device),
            # Feature-major flat layout of EmbeddingBagCollection: one id per bag.
            "values": ids.t().reshape(-1).to(device),
            "offsets": torch.arange(F * B + 1, device=device),
            "keys": (ids + torch.arange(F) * V).to(device),
        })
        if {"hash_full", "hash_full_torch", "fused_hashed"} & set(args.variants):
            full = power_law_ids(gen, (B, F), args.full_vocab)
            batches[-1]["full_keys"] = (full + torch.arange(F) * args.full_vocab).to(device)
            batches[-1]["full_values"] = (full % V).t().reshape(-1).to(device)
    return batches


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--features", type=int, default=26)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--vocab", type=int, default=100_000, help="rows per feature table")
    p.add_argument("--reps", type=int, default=15, help="timed steps per variant")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps per variant first")
    p.add_argument("--num-batches", type=int, default=16, help="distinct batches cycled through")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default="cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--full-vocab", type=int, default=1_000_000, help="ids per feature of hash_full")
    p.add_argument("--full-history", type=int, default=200, help="earlier steps whose keys fill hash_full")
    p.add_argument("--low-watermark", type=float, default=0.95, help="evict_low_watermark of hash_full")
    names = ["dense_adam", "fused_lazyadam", "fused_rowwise", "hash_lazyadam", "hash_full", "fused_hashed"]
    # The *_torch twins pin HashEmbedding.table_backend to the torch-op device path; the plain ones
    # take "auto" (the Triton table on CUDA when it works there), so one run compares the two.
    torch_twins = ["hash_lazyadam_torch", "hash_full_torch"]
    p.add_argument("--variants", nargs="+", default=None, choices=names + torch_twins,
                   help="default: all of them on CUDA, all but the *_torch twins elsewhere")
    args = p.parse_args(argv)
    if args.variants is None:
        args.variants = names + (torch_twins if args.device.startswith("cuda") else [])
    if not 0.0 <= args.low_watermark <= 1.0:
        p.error(f"--low-watermark must be within [0, 1], got {args.low_watermark}")
    for name in ("batch", "features", "dim", "vocab", "reps", "num_batches", "threads", "full_vocab", "full_history"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)

    batches = make_batches(args, device)
    variants = build_variants(args, device)
    print(f"batch={args.batch} features={args.features} dim={args.dim} vocab/table={args.vocab} "
          f"rows={args.features * args.vocab:,} threads={torch.get_num_threads()} device={device}")
    for i in range(args.warmup):
        for v in variants:
            v.step(batches[i % len(batches)])
    for i in range(args.reps):  # round-robin: each round times every variant once
        b = batches[(args.warmup + i) % len(batches)]
        for v in variants:
            sync(device)
            t0 = time.perf_counter()
            v.step(b)
            sync(device)
            v.times.append(time.perf_counter() - t0)

    med = {v.name: statistics.median(v.times) for v in variants}
    mean = {v.name: statistics.fmean(v.times) for v in variants}
    print(f"\n{'variant':19s} {'median ms':>10s} {'mean ms':>8s} {'min ms':>8s} {'max ms':>8s} | bytes/row: "
          f"{'values':>6s} {'opt':>6s} {'meta':>6s} {'dgrad':>6s} {'total':>6s}")
    for v in variants:
        m = v.memory_per_row()
        print(f"{v.name:19s} {med[v.name] * 1e3:10.2f} {mean[v.name] * 1e3:8.2f} {min(v.times) * 1e3:8.2f} "
              f"{max(v.times) * 1e3:8.2f} |            {m['values']:6.1f} {m['opt_state']:6.1f} "
              f"{m['metadata']:6.1f} {m['dense_grad']:6.1f} {m['total']:6.1f}")
    print()
    if "dense_adam" in med:
        for name in ("fused_lazyadam", "fused_rowwise"):
            if name in med:
                print(f"speedup {name} vs dense_adam: {med['dense_adam'] / med[name]:.2f}x "
                      "(goal >= 3x)")
    if "hash_lazyadam" in med and "fused_lazyadam" in med:
        print(f"hash_lazyadam / fused_lazyadam time: "
              f"{med['hash_lazyadam'] / med['fused_lazyadam']:.2f}x (goal <= 3x)")
    if "hash_full" in med and "fused_hashed" in med:
        full = v_by_name(variants, "hash_full").module
        print(f"hash_full / fused_hashed mean time: {mean['hash_full'] / mean['fused_hashed']:.2f}x "
              f"(goal <= 1.5x); rows used {full.num_rows:,} of {full.capacity:,}, "
              f"evict_low_watermark={full.evict_low_watermark}")
    for name in ("hash_lazyadam", "hash_full"):
        if name in med and name + "_torch" in med:
            used = ("host path" if device.type == "cpu"
                    else "triton" if device.type == "cuda" and triton_works(device) else "torch")
            print(f"{name} (table backend auto = {used}) is {med[name + '_torch'] / med[name]:.2f}x "
                  f"as fast as {name}_torch")


def v_by_name(variants: list[Variant], name: str) -> Variant:
    return next(v for v in variants if v.name == name)


if __name__ == "__main__":
    main()
