"""boost_level on a user's own network, against hand-written loops, in one process, interleaved.

Synthetic Criteo-shaped data (13 dense + 26 categorical fields, power-law ids, a known ground
truth), one epoch per variant per repetition; samples/s of the training epoch (evaluation not
timed), test AUC and peak memory (resident memory above the process's before the variant, so
model, optimizer state and activations; on CUDA the peak of allocated memory). Variants:

- ``hand``: the idiomatic network (26 ``nn.Embedding`` + MLP) in a hand loop with ``torch.optim.Adam``
- ``hand_tuned``: one fused sparse table (offsets per field), ``SparseAdam`` + fused ``Adam``
- ``ceiling``: what this card can do with this workload, the reference every GPU figure is read
  against (``vs ceiling``): ONE dense ``nn.Embedding`` over all fields' rows (offsets per field,
  dense gradients) + the MLP, ``Adam(fused=True, capturable=True)``, the whole step (forward,
  backward, optimizer) captured once as a CUDA graph and replayed per batch (the batch copied into
  static buffers). Timed like every variant, from a fresh network: its first steps (warm-up on a
  side stream) and the capture are inside the epoch. Off CUDA (or where capture fails) the same
  step runs eagerly and the output says so (``ceiling: eager ...``).
- ``O0`` / ``O1`` / ``O2``: ``Model(idiomatic, Adam, boost_level=...)``, ``Model.train``;
  ``O1_sparse``: O1 with ``{"sparse_embeddings": True}`` (every table row-sparse and fused, which
  O1 does on a CUDA device only for tables of 2**24 values or more)
- ``widedeep`` / ``widedeep_O2``: recstream's ``WideDeep`` + ``default_optimizer`` at O0 / O2 (on
  CUDA the step is replayed as a CUDA graph at every level); ``widedeep_eager``: O0 with
  ``{"cuda_graphs": False}``, the eager step the graph is measured against
- ``deepfm`` / ``deepfm_O2`` / ``deepfm_eager``: recstream's ``DeepFM`` (same hidden layers and dim) likewise

The first time a ``Model`` variant runs, its ``cuda_graphs`` line of ``Model.boost_report`` is
printed (whether the step was captured, or why not).
- ``dense_only`` / ``dense_only_bf16``: the MLP alone on fixed inputs, fp32 / bf16 autocast (the
  floor no embedding work can beat)
- ``dense_only_dx``: ``dense_only`` also computing its input's gradient, as every model that learns
  its embeddings does (the first layer's backward has two matmuls instead of one)

    python benchmarks/bench_boost.py --rows 200000 --reps 3 --threads 2
    python benchmarks/bench_boost.py --device cuda --rows 1000000 --batch-size 4096

Prints a Markdown table (median samples/s, ratios to ``hand`` and to ``ceiling``, AUC, peak MiB)
and writes it as JSON with --out. ``--time-budget S`` starts no further repetition once the next
would end past S seconds (at least one runs), so a run on a borrowed GPU always ends with its table.
``main(argv, field=...)`` runs comparison systems (``field_runners``) interleaved with these.
"""
from __future__ import annotations

import argparse
import ctypes
import gc
import json
import statistics
import time

import numpy as np
import torch
from torch import nn

from recstream import Model
from recstream.data import SyntheticCTR
from recstream.data.synthetic import roc_auc
from recstream.models import DeepFM, WideDeep, default_optimizer
from recstream.train.amp import cpu_has_native_bf16

DENSE, FIELDS = 13, 26


class Idiomatic(nn.Module):
    """What a user writes: one nn.Embedding per field, concatenated with the dense values, an MLP."""

    def __init__(self, vocab: int, dim: int, hidden: tuple[int, ...]):
        super().__init__()
        self.tables = nn.ModuleList(nn.Embedding(vocab, dim) for _ in range(FIELDS))
        self.mlp = _mlp(DENSE + FIELDS * dim, hidden)

    def forward(self, dense, ids):
        return self.mlp(torch.cat([dense, *(t(ids[i]) for i, t in enumerate(self.tables))], dim=1)).squeeze(-1)


class FusedTable(nn.Module):
    """The hand-tuned version: one table for all fields (ids shifted by field), sparse gradients
    (``ceiling`` builds it with ``sparse=False``: dense gradients, which a CUDA graph can capture)."""

    def __init__(self, vocab: int, dim: int, hidden: tuple[int, ...], sparse: bool = True):
        super().__init__()
        self.table = nn.Embedding(vocab * FIELDS, dim, sparse=sparse)
        self.register_buffer("shift", torch.arange(FIELDS).view(FIELDS, 1) * vocab)
        self.mlp = _mlp(DENSE + FIELDS * dim, hidden)

    def forward(self, dense, ids):
        rows = self.table(ids + self.shift)  # [F, B, D]
        return self.mlp(torch.cat([dense, rows.transpose(0, 1).flatten(1)], dim=1)).squeeze(-1)


def _mlp(width: int, hidden: tuple[int, ...]) -> nn.Sequential:
    layers = []
    for h in hidden:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    return nn.Sequential(*layers, nn.Linear(width, 1))


def _data(args):
    gen = SyntheticCTR(num_dense=DENSE, num_categorical=FIELDS, vocab_sizes=[args.vocab] * FIELDS,
                       batch_size=args.batch_size, embedding_dim=args.dim, seed=0)
    train = [b.to(args.device) for b in gen.train_batches(args.rows // args.batch_size)]
    test = gen.test_split(args.test_rows, batch_size=8192)
    return gen, train, [b.to(args.device) for b in test]


def _plain(batches):
    """(dense, ids [F, B], label) tuples for the hand-written networks."""
    return [(b[0].dense, b[0].values.view(FIELDS, -1), b[1]) for b in batches]


def _auc(net, batches, plain: bool) -> float:
    net.eval()
    with torch.no_grad():
        scores = [net(*x[:2]) if plain else net(x[0]) for x in batches]
    net.train()
    labels = torch.cat([x[-1] for x in batches])
    return roc_auc(torch.cat(scores).float().cpu().numpy(), labels.cpu().numpy())


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def _hand(net, opts, batches, device):
    loss_fn = nn.BCEWithLogitsLoss()
    _sync(device)
    start = time.perf_counter()
    for dense, ids, y in batches:
        for opt in opts:
            opt.zero_grad(set_to_none=True)
        loss_fn(net(dense, ids), y).backward()
        for opt in opts:
            opt.step()
    _sync(device)
    return time.perf_counter() - start


WARMUP = 3  # eager steps before the capture (cuBLAS workspaces, Adam's state), as torch's docs do


def _ceiling(net, batches, device, lr) -> tuple[float, str]:
    """One epoch of the ``ceiling`` step over `batches`: (seconds, how it ran).

    On CUDA: the first WARMUP batches train eagerly on a side stream, then one step is captured as a
    CUDA graph over static input buffers and replayed for every later batch (each copied in first).
    Elsewhere, or if the capture fails (the reason is returned), every step runs eagerly.
    """
    capture = device.type == "cuda"
    opt = torch.optim.Adam(net.parameters(), lr=lr, fused=True, capturable=capture)
    loss_fn = nn.BCEWithLogitsLoss()

    def step(dense, ids, y):
        opt.zero_grad(set_to_none=True)
        loss_fn(net(dense, ids), y).backward()
        opt.step()

    _sync(device)
    start = time.perf_counter()
    if not capture or len(batches) <= WARMUP:
        for batch in batches:
            step(*batch)
        how = "eager (a CUDA graph needs CUDA)" if not capture else f"eager ({len(batches)} batches: none to replay)"
    else:
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for batch in batches[:WARMUP]:
                step(*batch)
        torch.cuda.current_stream(device).wait_stream(side)
        static = tuple(t.clone() for t in batches[WARMUP])
        graph = torch.cuda.CUDAGraph()
        try:
            opt.zero_grad(set_to_none=True)  # the graph's backward allocates .grad in its own pool
            with torch.cuda.graph(graph):
                loss_fn(net(*static[:2]), static[2]).backward()
                opt.step()
        except RuntimeError as e:  # report it and still measure the step, eagerly
            torch.cuda.synchronize(device)
            for batch in batches[WARMUP:]:
                step(*batch)
            how = f"eager (CUDA graph capture failed: {str(e).splitlines()[0][:160]})"
        else:
            for batch in batches[WARMUP:]:
                for buffer, value in zip(static, batch, strict=True):
                    buffer.copy_(value, non_blocking=True)
                graph.replay()
            how = f"CUDA graph ({WARMUP} eager warm-up steps, then {len(batches) - WARMUP} replays)"
    _sync(device)
    return time.perf_counter() - start, how


def _model(model, batches, device):
    _sync(device)
    start = time.perf_counter()
    model.train(1, batches)
    _sync(device)
    return time.perf_counter() - start


class PeakMemory:
    """Peak memory of what runs inside it, in MiB above the memory in use when it starts.

    CPU: the process's resident high-water mark (VmHWM), reset on entry through
    /proc/self/clear_refs after handing freed heap back (malloc_trim), so one process can measure
    variant after variant; nan where that is unavailable. CUDA: torch's peak allocated memory.
    """

    def __init__(self, device: torch.device):
        self.device, self.mib = device, float("nan")

    def __enter__(self):
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._base = torch.cuda.memory_allocated(self.device) / 2 ** 20
            return self
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # 5: reset the peak resident size to the current one
            self._base = _status_mib("VmRSS:")
        except (OSError, AttributeError):  # not Linux / not glibc: no per-variant peak
            self._base = None
        return self

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.mib = torch.cuda.max_memory_allocated(self.device) / 2 ** 20 - self._base
        elif self._base is not None:
            self.mib = _status_mib("VmHWM:") - self._base
        return False


def _status_mib(key: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) / 1024
    raise OSError(f"no {key} in /proc/self/status")


CEILING_MODES: dict[str, str] = {}  # how `ceiling` last ran, per device (printed when it changes)
GRAPH_LINES: dict[str, str] = {}  # each Model variant's cuda_graphs line (printed when it changes)


def _say_graph(name: str, model) -> None:
    line = next((x for x in model.boost_report if x.startswith("cuda_graphs")), "cuda_graphs: not considered (O0)")
    step = model.train_network
    if getattr(step, "captured", False):
        line += ", captured"
    elif hasattr(step, "captured"):
        line += ", NOT captured (the log says why)"
    if GRAPH_LINES.get(name) != line:
        GRAPH_LINES[name] = line
        print(f"  {name}: {line}", flush=True)


def run_variant(name, args, data):
    gen, train, test = data
    device, hidden = torch.device(args.device), tuple(args.hidden)
    plain_train, plain_test = _plain(train), _plain(test)
    torch.manual_seed(0)
    if name in ("hand", "hand_tuned", "O0", "O1", "O2", "O1_sparse"):
        net = (FusedTable if name == "hand_tuned" else Idiomatic)(args.vocab, args.dim, hidden).to(device)
        if name == "hand":
            seconds = _hand(net, [torch.optim.Adam(net.parameters(), lr=args.lr)], plain_train, device)
        elif name == "hand_tuned":
            opts = [torch.optim.SparseAdam([net.table.weight], lr=args.lr),
                    torch.optim.Adam(net.mlp.parameters(), lr=args.lr, fused=True)]
            seconds = _hand(net, opts, plain_train, device)
        else:
            model = Model(net, nn.BCEWithLogitsLoss(), torch.optim.Adam(net.parameters(), lr=args.lr),
                          boost_level=name[:2], progress_bar=False,
                          boost_config_dict={"sparse_embeddings": True} if name == "O1_sparse" else None)
            seconds = _model(model, plain_train, device)
            _say_graph(name, model)
        return seconds, _auc(net, plain_test, plain=True)
    if name == "ceiling":
        net = FusedTable(args.vocab, args.dim, hidden, sparse=False).to(device)
        seconds, how = _ceiling(net, plain_train, device, args.lr)
        if how != CEILING_MODES.get(args.device):  # said once per run, and again if it changes
            CEILING_MODES[args.device] = how
            print(f"  ceiling: {how}", flush=True)
        return seconds, _auc(net, plain_test, plain=True)
    if name.startswith(("widedeep", "deepfm")):
        builder = WideDeep if name.startswith("widedeep") else DeepFM
        net = builder(gen.schema, hidden=hidden, embedding_dim=args.dim).to(device)
        model = Model(net, nn.BCEWithLogitsLoss(), default_optimizer(net, lr=args.lr),
                      boost_level="O2" if name.endswith("O2") else "O0", progress_bar=False,
                      boost_config_dict={"cuda_graphs": False} if name.endswith("eager") else None)
        seconds = _model(model, train, device)
        _say_graph(name, model)
        return seconds, _auc(net, test, plain=False)
    if name.startswith("dense_only"):  # "dense_only_bf16": the same under bf16 autocast (O2's precision)
        mlp = _mlp(DENSE + FIELDS * args.dim, hidden).to(device)
        inputs = [(torch.randn(len(y), DENSE + FIELDS * args.dim, device=device), None, y) for _, _, y in plain_train]
        opt = torch.optim.Adam(mlp.parameters(), lr=args.lr, fused=True)
        low = name.endswith("bf16")
        # "dense_only_dx": the input also gets its gradient, as the embeddings' output does in any
        # model that learns them (the first layer's backward then has two matmuls, not one).
        dx = name.endswith("dx")

        def forward(x, _):
            x = x.detach().requires_grad_(dx)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=low):
                return mlp(x).squeeze(-1).float()
        return _hand(forward, [opt], inputs, device), float("nan")
    raise ValueError(f"unknown variant {name!r}")


def _results(seconds: dict, aucs: dict, peaks: dict, rows: int) -> dict:
    """Medians per variant, with samples/s ratios to ``hand`` and to ``ceiling`` (None where absent)."""
    median = {v: statistics.median(s) for v, s in seconds.items()}
    hand, ceiling = median.get("hand"), median.get("ceiling")
    return {v: {"samples_per_s": rows / median[v], "auc": float(np.mean(aucs[v])),
                "vs_hand": hand / median[v] if hand else None,
                "vs_ceiling": ceiling / median[v] if ceiling else None,
                "peak_mib": float(np.median(peaks[v]))} for v in seconds}


def main(argv=None, field=None):
    """Runs the variants; `field(args, data)` may return more, ``{name: run() -> (seconds, auc)}``."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=200_000, help="training rows per epoch")
    p.add_argument("--test-rows", type=int, default=100_000)
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=100_000, help="rows per field table")
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--hidden", type=int, nargs="+", default=[1024, 512, 256])
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default="cpu")
    p.add_argument("--variants", nargs="+",
                   default=["hand", "hand_tuned", "ceiling", "O0", "O1", "O2", "widedeep", "widedeep_O2", "dense_only",
                            "dense_only_dx", "dense_only_bf16"])
    p.add_argument("--out", help="write the results as JSON here")
    p.add_argument("--time-budget", type=float, default=None,
                   help="seconds since the start (data generation included): start no repetition that "
                        "would end past it (at least one runs)")
    args = p.parse_args(argv)
    began = time.perf_counter()
    torch.set_num_threads(args.threads)
    data = _data(args)
    rows = len(data[1]) * args.batch_size
    print(f"rows/epoch={rows:,} batch={args.batch_size} vocab/field={args.vocab:,} dim={args.dim} "
          f"hidden={args.hidden} threads={args.threads} device={args.device} torch={torch.__version__}", flush=True)
    variants = list(args.variants)
    if "dense_only_bf16" in variants and args.device == "cpu" and not cpu_has_native_bf16():
        # Emulated bf16 is ~35x slower than fp32 here: it would measure the emulation (and take longest
        # of all), while O2 itself stays fp32 on such a CPU (boost skips bf16_autocast).
        variants.remove("dense_only_bf16")
        print("dense_only_bf16: skipped: this CPU has no native bf16 (O2 runs fp32 here)", flush=True)
    runs = {v: (lambda v=v: run_variant(v, args, data)) for v in variants}
    runs.update(field(args, data) if field else {})
    seconds, aucs, peaks = ({v: [] for v in runs} for _ in range(3))
    first = time.perf_counter()
    for rep in range(args.reps):  # interleaved: a load change hits every variant alike
        now = time.perf_counter()
        if rep and args.time_budget and now - began + (now - first) / rep > args.time_budget:
            print(f"  --time-budget {args.time_budget:g}s: stopping after {rep} of {args.reps} repetitions",
                  flush=True)
            break
        for v, run in runs.items():
            with PeakMemory(torch.device(args.device)) as mem:
                s, auc = run()
            seconds[v].append(s)
            aucs[v].append(auc)
            peaks[v].append(mem.mib)
            print(f"  rep {rep} {v:14s} {rows / s:10,.0f} samples/s  AUC {auc:.4f}  peak {mem.mib:7.0f} MiB",
                  flush=True)
    results = _results(seconds, aucs, peaks, rows)
    if "ceiling" in results:
        results["ceiling"]["mode"] = CEILING_MODES.get(args.device, "")
    print("\n| variant | samples/s | vs hand | vs ceiling | test AUC | peak MiB |\n"
          "| --- | --- | --- | --- | --- | --- |")
    for v, r in results.items():
        ratios = [f"{r[k]:.2f}x" if r[k] else "-" for k in ("vs_hand", "vs_ceiling")]
        auc = "-" if np.isnan(r["auc"]) else f"{r['auc']:.4f}"
        label = v if v != "ceiling" or r["mode"].startswith("CUDA graph") else "ceiling (eager)"
        print(f"| {label} | {r['samples_per_s']:,.0f} | {ratios[0]} | {ratios[1]} | {auc} | {r['peak_mib']:,.0f} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=1)
    return results


if __name__ == "__main__":
    main()
