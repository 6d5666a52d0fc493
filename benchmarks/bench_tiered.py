"""A disk-tiered table (`DiskTier`) against the same table in memory: samples/s, peak RSS, disk bytes
read and written per step, cache hit rate; then a checkpoint (a commit of the store) and a restore.

One table of ``--rows`` rows x ``--dim``, read by ``--fields`` features (single-id bags, batch
``--batch``), ids Zipf(``--zipf``) over the rows (scattered by a fixed multiplicative hash, so hot
rows are not neighbours; ``--ids wrapped``: the earlier sampler, about half its ids spread evenly
over the table, see `_ranks`); a linear head (``--head mlp``: an MLP 256-128, as WideDeep's deep part);
LazyAdam (``--optimizer adagrad``: RowWiseAdagrad). The tier caches ``--cache-rows`` rows (default 10%
of the rows) in a store under ``--dir`` (default: a temporary directory on the local disk); each step
the next batch is prefetched on one long-lived thread, as the data channel's.

    python benchmarks/bench_tiered.py --quick                  # CI: small table, tiny cache, both variants
    python benchmarks/bench_tiered.py --rows 10000000          # both variants at a size both can hold
    python benchmarks/bench_tiered.py --rows 200000000 --cache-rows 20000000 --variant tiered \\
        --dir /data/tier   # larger than RAM: 200M x 16 with LazyAdam = 36 GiB of rows and state

Run one variant per process (``--variant tiered`` / ``--variant memory``) for peak-RSS figures of
their own: the peak is the process's. Creating the store writes every row once (minutes for tens of
GiB). Prints one JSON document; ``--out FILE`` writes it too.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
from torch import nn

from recstream.features import Features
from recstream.nn import DiskTier, EmbeddingBagCollection, EmbeddingTableConfig
from recstream.optim import LazyAdam, RowWiseAdagrad


def _status(field: str) -> float:
    """A /proc/self/status figure in MiB (VmHWM: peak RSS; RssAnon: memory that is not a file's)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) / 1024


def _faults() -> int:
    """Page faults of this process so far (every thread's): a write to a store page that is clean
    since the store's creation or its last commit is one, so their count per step tells the steps
    just after those (every page first written again) from the rest."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_minflt + usage.ru_majflt


def _kernel_time() -> float:
    """CPU seconds the calling thread spent in the kernel (0 where the system cannot say)."""
    who = getattr(resource, "RUSAGE_THREAD", None)
    return 0.0 if who is None else resource.getrusage(who).ru_stime


def _io() -> tuple[int, int]:
    """Bytes this process read from and wrote to storage (/proc/self/io; zeros where unreadable)."""
    try:
        with open("/proc/self/io") as f:
            io = dict(line.split(": ") for line in f.read().splitlines())
        return int(io["read_bytes"]), int(io["write_bytes"])
    except (OSError, KeyError, ValueError):
        return 0, 0


class Net(nn.Module):
    def __init__(self, args, tier: DiskTier | None):
        super().__init__()
        names = tuple(f"f{i}" for i in range(args.fields))
        self.ebc = EmbeddingBagCollection([EmbeddingTableConfig("t", args.rows, args.dim, feature_names=names,
                                                                tier=tier)], validate=False)
        d = self.ebc.output_dim
        # linear: the step is all embedding work, the tier's worst case; mlp: WideDeep's deep part at its
        # default widths (256, 128), a model whose dense layers take part of the step
        self.head = nn.Linear(d, 1) if args.head == "linear" else nn.Sequential(
            nn.Linear(d, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 1))

    def forward(self, x):
        return self.head(self.ebc(x)).squeeze(1)


def _ranks(g: np.random.Generator, args, n: int) -> np.ndarray:
    """`n` ranks (0: the hottest) of Zipf(``--zipf``) over the ``--rows`` rows: numpy's Zipf has no upper
    bound, so draws past the rows are drawn again (``--ids zipf``: the law restricted to the rows,
    exactly), or folded onto them by a modulo (``--ids wrapped``, this benchmark's sampler before:
    at 4M rows and s = 1.05, 45% of the draws are past the rows, so nearly half the ids land almost
    uniformly over the table and a 10% cache can hit about half of them at best)."""
    if args.ids == "wrapped":
        return (g.zipf(args.zipf, n).astype(np.uint64) - np.uint64(1)) % np.uint64(args.rows)
    out = np.empty(0, dtype=np.uint64)
    while out.size < n:
        draw = g.zipf(args.zipf, 2 * (n - out.size))
        out = np.concatenate([out, draw[draw <= args.rows].astype(np.uint64)])
    return out[:n] - np.uint64(1)


class _Batches:
    """The run's batches, drawn up front (their draw is not timed) and held compactly: ids as int32 and
    labels as bytes, 33 KB a batch; each becomes its `Features` when asked (tens of microseconds, in
    both variants' steps alike). Held as `Features` they took about 1.2 GB over 9,000 steps, which
    the peak RSS then counted as the tier's."""

    def __init__(self, args, n: int) -> None:
        g = np.random.default_rng(0)
        self.ids = np.empty((n, args.fields * args.batch), dtype=np.int32 if args.rows < 2**31 else np.int64)
        self.labels = np.empty((n, args.batch), dtype=np.uint8)
        for i in range(n):
            ranks = _ranks(g, args, args.fields * args.batch)
            self.ids[i] = (ranks * np.uint64(2654435761)) % np.uint64(args.rows)  # scatter hot rows
            self.labels[i] = g.integers(0, 2, args.batch)
        self.lengths = torch.ones(args.fields, args.batch, dtype=torch.int64)
        self.dense = torch.zeros(args.batch, 0)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> tuple[Features, torch.Tensor]:
        ids = torch.from_numpy(self.ids[i].astype(np.int64))
        return Features.from_lengths(self.dense, ids, self.lengths), torch.from_numpy(self.labels[i].astype(np.float32))


def _optimizer(args, net):
    cls = LazyAdam if args.optimizer == "lazy_adam" else RowWiseAdagrad
    return cls(net.parameters(), lr=0.01)


def _step(net, opt, x, y) -> None:
    opt.zero_grad(set_to_none=True)
    nn.functional.binary_cross_entropy_with_logits(net(x), y).backward()
    opt.step()


def run(args, variant: str, directory: str) -> dict:
    torch.manual_seed(0)
    tier = DiskTier(os.path.join(directory, "t"), args.cache_rows) if variant == "tiered" else None
    t0 = time.perf_counter()
    net = Net(args, tier)
    built_s = time.perf_counter() - t0
    opt = _optimizer(args, net)
    batches = _Batches(args, args.warmup + args.steps + 1)
    for i in range(args.warmup):
        _step(net, opt, *batches[i])
    stats0 = net.ebc.tier_stats().get("t")
    counts0 = (stats0.hits, stats0.misses, stats0.bytes_read, stats0.bytes_written, stats0.prefetched) \
        if stats0 else None
    io0, faults0 = _io(), _faults()
    # One long-lived prefetch thread, as the data channel's (a thread started per step would time its start too)
    # CPU seconds of the prefetch thread (busy, not waiting), and of them in the kernel (page faults:
    # a write to a store page that the kernel wrote back since is one): which thread bounds a step
    prefetch_cpu = [0.0, 0.0]

    def prefetch(features):
        c0, s0 = time.thread_time(), _kernel_time()
        net.ebc.prefetch(features)
        prefetch_cpu[0] += time.thread_time() - c0
        prefetch_cpu[1] += _kernel_time() - s0

    waited = 0.0  # seconds the loop waited for a prefetch after its step: the prefetch bounded the step
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="prefetch") as pool:
        t0, c0 = time.perf_counter(), time.thread_time()
        ahead_batch = batches[args.warmup]
        for i in range(args.warmup, args.warmup + args.steps):
            (x, y), ahead_batch = ahead_batch, batches[i + 1]  # (each batch made once, in either variant)
            ahead = pool.submit(prefetch, ahead_batch[0]) if tier else None
            _step(net, opt, x, y)
            if ahead is not None:
                w0 = time.perf_counter()
                ahead.result()
                waited += time.perf_counter() - w0
        seconds, train_cpu = time.perf_counter() - t0, time.thread_time() - c0
    io1, faults1 = _io(), _faults()
    result = {"variant": variant, "ids": args.ids, "zipf": args.zipf, "head": args.head, "rows": args.rows,
              "dim": args.dim, "batch": args.batch,
              "fields": args.fields, "steps": args.steps, "samples_per_s": args.steps * args.batch / seconds,
              "ms_per_step": 1000 * seconds / args.steps, "build_s": built_s,
              "rss_anon_mib": _status("RssAnon"), "rss_file_mib": _status("RssFile"), **_memory(),
              "os_read_bytes_per_step": (io1[0] - io0[0]) / args.steps,
              "os_write_bytes_per_step": (io1[1] - io0[1]) / args.steps,
              "page_faults_per_step": (faults1 - faults0) / args.steps,
              "train_cpu_ms_per_step": 1000 * train_cpu / args.steps}
    if tier is not None:
        s = net.ebc.tier_stats()["t"]
        hits, misses = s.hits - counts0[0], s.misses - counts0[1]
        # rows read per step: at the step (misses) and ahead of it (prefetched) -- the hit rate counts
        # the step's lookups only, so it does not say how many rows a step moves
        result.update(cache_rows=args.cache_rows, hit_rate=hits / max(1, hits + misses),
                      prefetch_cpu_ms_per_step=1000 * prefetch_cpu[0] / args.steps,
                      prefetch_kernel_ms_per_step=1000 * prefetch_cpu[1] / args.steps,
                      prefetch_wait_ms_per_step=1000 * waited / args.steps,
                      rows_read_per_step=(misses + s.prefetched - counts0[4]) / args.steps,
                      tier_read_bytes_per_step=(s.bytes_read - counts0[2]) / args.steps,
                      tier_written_bytes_per_step=(s.bytes_written - counts0[3]) / args.steps)
        _checkpoint_and_restore(net, opt, batches[len(batches) - 1], args, result)
    return result


def _tier(net):
    return net.ebc._tiers[net.ebc._table_loc["t"][0]]  # the table's cache and store (a benchmark looks inside)


def _sample(tier, rows: np.ndarray) -> dict[str, np.ndarray]:
    """The stored bytes of `rows` in every array of the store (weights and optimizer state)."""
    return {name: tier.store.read(name, rows) for name in tier.store.files}


def _train_uncommitted(net, opt, batch) -> None:
    """One step, its rows then written to the store as evictions would: uncommitted writes on disk."""
    _step(net, opt, *batch)
    tier = _tier(net)
    with tier.lock:
        tier._write_back(np.flatnonzero(tier.dirty))


def _checkpoint_and_restore(net, opt, batch, args, result: dict) -> None:
    """A checkpoint commits the store (only the blocks written since the last one are flushed); one
    more step, written to disk, then the restore undoes it: the rows that step trained (weights and
    optimizer state) must be as checkpointed. With ``--die``, one more such step and a SIGKILL."""
    tier = _tier(net)
    t0 = time.perf_counter()
    state = net.state_dict()
    commit_s = time.perf_counter() - t0
    rows = np.unique(batch[0].values.numpy())
    saved = _sample(tier, rows)
    _train_uncommitted(net, opt, batch)
    moved = not np.array_equal(tier.store.read("weight", rows), saved["weight"])
    t0 = time.perf_counter()
    net.load_state_dict(state)
    restore_s = time.perf_counter() - t0
    equal = all(np.array_equal(v, saved[k]) for k, v in _sample(tier, rows).items())
    if not moved or not equal:
        raise RuntimeError(f"bench_tiered: the step after the checkpoint changed the store: {moved}; the restore "
                           f"returned the checkpoint's rows: {equal}")
    result.update(checkpoint_s=commit_s, restore_s=restore_s, restore_equal=equal, rows_checked=int(rows.size),
                  store_disk_bytes=_disk_bytes(tier.store.directory))
    if args.die:  # the parent (--sigkill) reopens the store and compares
        _train_uncommitted(net, opt, batch)
        np.savez(os.path.join(args.dir, "checkpointed_rows.npz"), rows=rows, **saved)
        result.update(_memory())
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(result, f)
        os.kill(os.getpid(), signal.SIGKILL)


def _disk_bytes(directory: str) -> int:
    """Bytes the store's files take on disk (allocated blocks: its files are sparse)."""
    return sum(os.stat(os.path.join(directory, name)).st_blocks * 512 for name in os.listdir(directory))


class _PeakRss(threading.Thread):
    """Samples RssAnon and RssFile every 0.2 s: /proc has a peak of their sum only (VmHWM); the file
    part is mapped store pages, which the system reclaims."""

    def __init__(self):
        super().__init__(daemon=True)
        self.anon = self.file = 0.0

    def run(self):
        while True:
            self.anon, self.file = max(self.anon, _status("RssAnon")), max(self.file, _status("RssFile"))
            time.sleep(0.2)


_PEAK = _PeakRss()


def _memory() -> dict:
    return {"peak_rss_mib": _status("VmHWM"), "peak_rss_anon_mib": _PEAK.anon, "peak_rss_file_mib": _PEAK.file}


def _sigkill(args, argv) -> dict:
    """Run the tiered variant in a child that SIGKILLs itself after uncommitted writes past its last
    checkpoint; reopen the store here and check it holds the checkpoint's rows."""
    from recstream.nn.tier_store import TierStore
    out = os.path.join(args.dir, "child.json")
    argv = [a for a in argv if a != "--sigkill"]
    child = subprocess.run([sys.executable, os.path.abspath(__file__), *argv, "--die", "--out", out], check=False)
    if child.returncode != -signal.SIGKILL:
        raise RuntimeError(f"bench_tiered: the child exited {child.returncode}, not by SIGKILL")
    with open(out, encoding="utf-8") as f:
        result = json.load(f)
    saved = dict(np.load(os.path.join(args.dir, "checkpointed_rows.npz")))
    rows = saved.pop("rows")
    t0 = time.perf_counter()
    store = TierStore.open(os.path.join(args.dir, "t"))  # undoes the writes after the last commit
    result["reopen_after_sigkill_s"] = time.perf_counter() - t0
    result["sigkill_restore_equal"] = all(np.array_equal(store.read(k, rows), v) for k, v in saved.items())
    store.close()
    result["store_disk_bytes"] = _disk_bytes(os.path.join(args.dir, "t"))
    return {"tiered": result}


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="CI size: 20,000 rows, a 2,000-row cache, 10 steps")
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--cache-rows", type=int, default=None, help="rows the tier caches (default: 10%% of --rows)")
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--fields", type=int, default=8)
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--zipf", type=float, default=1.05)
    p.add_argument("--ids", choices=("zipf", "wrapped"), default="zipf",
                   help="zipf: Zipf(--zipf) over the rows; wrapped: numpy's unbounded Zipf folded onto the rows "
                        "by a modulo (about half the ids near uniform at 4M rows: the sampler of earlier figures)")
    p.add_argument("--optimizer", choices=("lazy_adam", "adagrad"), default="lazy_adam")
    p.add_argument("--head", choices=("linear", "mlp"), default="linear",
                   help="the dense part over the table: a linear layer (the step is all embedding work) or "
                        "an MLP 256-128 as WideDeep's deep part")
    p.add_argument("--variant", choices=("both", "tiered", "memory"), default="both")
    p.add_argument("--dir", default=None, help="where the store goes (default: a temporary directory)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=None)
    p.add_argument("--sigkill", action="store_true",
                   help="tiered only, needs --dir: the run is a child killed by SIGKILL after writes past its last "
                        "checkpoint; the store is then reopened and compared with the checkpoint")
    p.add_argument("--die", action="store_true", help=argparse.SUPPRESS)  # the --sigkill child
    args = p.parse_args(argv)
    if args.sigkill and (args.dir is None or args.variant != "tiered"):
        p.error("--sigkill needs --variant tiered and --dir")
    if args.quick:
        args.rows, args.fields, args.batch, args.steps, args.warmup = 20_000, 4, 128, 10, 2
        args.cache_rows = args.cache_rows or 2_000
    args.cache_rows = args.cache_rows or max(1, args.rows // 10)
    return args


def main(argv=None) -> dict:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse(argv)
    torch.set_num_threads(args.threads)
    _PEAK.start()
    directory = args.dir or tempfile.mkdtemp(prefix="bench_tiered_")
    try:
        if args.sigkill:
            results = _sigkill(args, argv)
        else:
            variants = ("tiered", "memory") if args.variant == "both" else (args.variant,)
            # the tiered run first: a process's peak RSS only grows, so the in-memory run cannot inflate it
            results = {v: run(args, v, directory) for v in variants}
    finally:
        if args.dir is None:
            shutil.rmtree(directory, ignore_errors=True)
    if len(results) == 2:
        results["tiered_vs_memory"] = results["tiered"]["samples_per_s"] / results["memory"]["samples_per_s"]
    print(json.dumps(results, indent=1))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)
    return results


if __name__ == "__main__":
    main()
