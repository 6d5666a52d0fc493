"""Scaling out on torch.distributed: throughput with 1, 2 and 4 processes, bytes per step, a model.

Workload: Wide&Deep on Criteo-shaped synthetic data (13 dense, 26 categorical features, ``--vocab``
rows per table, dim ``--dim``), ``--local-batch`` rows per rank per step (weak scaling: the global
batch grows with the ranks), `default_optimizer`, gloo on CPU, 1 intra-op thread per process.

For each number of processes and each mode (data_parallel, hybrid_parallel) it reports:

- samples/s of the whole job (median step time over ``--steps`` after warm-up);
- per rank: compute time (the same local step in a single stand-alone process, measured in the
  same run) and the rest of the step time (communication and waiting: step time - compute);
- bytes each rank sends per step, computed from the model and the batch (not sniffed):
  data_parallel: ring all-reduce of the dense gradients, 2 (N-1)/N x dense bytes, plus the sparse
  embedding gradients, sent to every other rank (gloo's sparse all-reduce gathers them);
  hybrid_parallel: the dense all-reduce, plus the all-to-all of ids (8 bytes each) and of rows
  forward and of their gradients backward (dim x 4 bytes each), (N-1)/N of them off-rank.

Then a model of the same traffic for a Criteo-1TB-sized model (26 tables, 10^8 rows in all,
dim 128) at 8, 64 and 512 ranks on a 100 Gb/s network (see docs/distributed.md).

On this machine the processes share 2 cores: more processes cannot compute faster, so read the
communication column, not the speed-up.

    python benchmarks/bench_distributed.py                 # runs torchrun itself
    python benchmarks/bench_distributed.py --ranks 1 2 4 --steps 30
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

DENSE, CATEGORICAL = 13, 26


def build(args):
    from recstream.data import SyntheticCTR
    from recstream.models import WideDeep, default_optimizer
    gen = SyntheticCTR(DENSE, CATEGORICAL, vocab_sizes=[args.vocab] * CATEGORICAL, batch_size=args.global_batch,
                       embedding_dim=args.dim, seed=0)
    net = WideDeep(gen.schema, hidden=(256, 128), embedding_dim=args.dim)
    return gen, net, default_optimizer(net)


def worker(args) -> None:
    """One rank (or the stand-alone compute baseline): time `steps` training steps."""
    from recstream import Model, distributed, set_auto_parallel_context
    from recstream.callbacks import Callback

    class StepTimer(Callback):
        def __init__(self):
            self.times, self._start = [], 0.0

        def on_train_step_begin(self, run_context):
            self._start = time.perf_counter()

        def on_train_step_end(self, run_context):
            self.times.append(time.perf_counter() - self._start)

    torch.set_num_threads(1)
    distributed.init()
    set_auto_parallel_context(parallel_mode=args.mode)
    torch.manual_seed(0)
    gen, net, optimizer = build(args)
    batches = [b for b in gen.train_batches(args.warmup + args.steps)]  # generated before timing
    model = Model(net, torch.nn.BCEWithLogitsLoss(), optimizer, progress_bar=False)
    timer = StepTimer()
    model.train(1, distributed.shard(batches), callbacks=[timer])
    median = torch.tensor(statistics.median(timer.times[args.warmup:]))
    if distributed.is_distributed():  # the job runs at the pace of its slowest rank
        torch.distributed.all_reduce(median, op=torch.distributed.ReduceOp.MAX)
    if distributed.rank() == 0:
        Path(args.out).write_text(json.dumps({"step_s": float(median)}))
    distributed.shutdown()


def dense_bytes(net) -> int:
    from recstream.distributed import sparse_parameters
    sparse = set(sparse_parameters(net))
    return sum(p.numel() * p.element_size() for n, p in net.named_parameters() if n not in sparse)


def traffic(mode: str, ranks: int, local_batch: int, ids_per_sample: int, dim: int, dense: int,
            unique_fraction: float) -> float:
    """Bytes one rank sends per step (see the module docstring)."""
    if ranks == 1:
        return 0.0
    off = (ranks - 1) / ranks
    allreduce = 2 * off * dense
    ids = local_batch * ids_per_sample
    if mode == "data_parallel":  # unique rows' indices + values, to each other rank
        return allreduce + (ranks - 1) * ids * unique_fraction * (8 + dim * 4)
    return allreduce + off * ids * (8 + 2 * dim * 4)


def run(args, ranks: int, mode: str, out: str) -> float:
    cmd = [sys.executable, __file__, "--worker", "--mode", mode, "--out", out, *args.passthrough]
    if ranks > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={ranks}",
               "--standalone", *cmd[1:]]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    subprocess.run(cmd, check=True, env=env, capture_output=True)
    return json.loads(Path(out).read_text())["step_s"]


def model_cluster(local_batch: int, compute_s: float, dense: int) -> None:
    """Criteo-1TB-sized hybrid_parallel job on 100 Gb/s links, from the traffic formula."""
    link = 100e9 / 8          # bytes/s per rank
    latency = 20e-6           # per message; an all-to-all sends N-1 of them
    dim = 128
    print(f"\nModel: 26 tables, 1e8 rows x {dim} dims ({1e8 * dim * 4 / 1e9:.0f} GB of tables), "
          f"local batch {local_batch}, compute {compute_s * 1e3:.1f} ms/step per rank (measured here), "
          "100 Gb/s per rank, 20 us per message")
    print(f"{'ranks':>6} {'table GB/rank':>13} {'MB sent/step/rank':>18} {'comm ms':>8} {'samples/s':>12}")
    for ranks in (8, 64, 512):
        sent = traffic("hybrid_parallel", ranks, local_batch, CATEGORICAL, dim, dense, 1.0)
        comm = sent / link + 3 * latency * (ranks - 1)  # ids, rows, gradients: three all-to-alls
        rate = ranks * local_batch / (compute_s + comm)
        print(f"{ranks:>6} {1e8 * dim * 4 / ranks / 1e9:>13.2f} {sent / 1e6:>18.2f} {comm * 1e3:>8.2f} "
              f"{rate:>12,.0f}")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--local-batch", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=20_000)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--mode", default="data_parallel", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--global-batch", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args)
        return
    torch.set_num_threads(1)
    _, net, _ = build(argparse.Namespace(vocab=args.vocab, dim=args.dim, global_batch=args.local_batch))
    dense = dense_bytes(net)
    print(f"Wide&Deep, {CATEGORICAL} tables x {args.vocab} rows x {args.dim}, local batch {args.local_batch}, "
          f"dense parameters {dense / 1e6:.2f} MB; gloo on CPU, 1 thread per process")
    print(f"{'mode':<16} {'ranks':>5} {'samples/s':>10} {'step ms':>8} {'compute ms':>10} {'other ms':>9} "
          f"{'MB sent/step/rank':>18}")
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "result.json")
        compute = None
        for ranks in args.ranks:
            for mode in ("data_parallel", "hybrid_parallel"):
                if ranks == 1 and mode == "hybrid_parallel":
                    continue
                args.passthrough = ["--local-batch", str(args.local_batch), "--vocab", str(args.vocab),
                                    "--dim", str(args.dim), "--steps", str(args.steps), "--warmup",
                                    str(args.warmup), "--global-batch", str(args.local_batch * ranks)]
                if compute is None:  # the stand-alone step of one local batch: pure compute
                    base = args.passthrough[:-1] + [str(args.local_batch)]
                    args.passthrough, saved = base, args.passthrough
                    compute = run(args, 1, "stand_alone", out)
                    args.passthrough = saved
                step = run(args, ranks, mode, out)
                sent = traffic(mode, ranks, args.local_batch, CATEGORICAL, args.dim, dense, 1.0)
                label = "stand_alone" if ranks == 1 else mode
                print(f"{label:<16} {ranks:>5} {ranks * args.local_batch / step:>10,.0f} {step * 1e3:>8.1f} "
                      f"{compute * 1e3:>10.1f} {(step - compute) * 1e3:>9.1f} {sent / 1e6:>18.2f}")
    model_cluster(args.local_batch, compute, dense)


if __name__ == "__main__":
    main()
