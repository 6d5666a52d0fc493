"""Does a steady training step force a host synchronisation on CUDA? (issue 24's target)

Each case trains with ``Model.train`` (``default_optimizer``, metrics ``auc`` and ``loss``, progress
bar off) on batches already on the device: ``--warm`` steps first (optimizer state, caches, graph
capture), then ``--steps`` steady steps under ``torch.cuda.set_sync_debug_mode("error")``, which
raises at the first synchronising CUDA call. A case passes when those steps run through. One that
fails is run again under ``"warn"`` to count its synchronisations per step and say where they are.
Cases: recstream's fixed-table models (WideDeep, DeepFM, DCNv2, DLRM) at each ``--levels`` boost
level (the Model's default, O0, unless given), and the user's idiomatic network of
``bench_boost.py`` (26 ``nn.Embedding`` + MLP, ``torch.optim.Adam``) at boost O1 and O2.

Without CUDA the same steps run on the CPU and only check that they run; for information each also
reports ``recstream.testing.SyncCounter``'s sync-forcing ops per steady step on the path CUDA runs
(``recstream.hostpath.device_path``), what ``tests/train/test_sync_free.py`` asserts.

    python benchmarks/sync_debug_check.py --device cuda --out sync_debug.json
    python benchmarks/sync_debug_check.py --device cpu --steps 3 --warm 2 --batch-size 64 --vocab 100

Exit status 1 when a case does not pass (a synchronisation on CUDA, or any error), else 0.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
import traceback
import warnings
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_boost  # noqa: E402  (the idiomatic network and its batches)

from recstream import Model  # noqa: E402
from recstream.callbacks.base import Callback  # noqa: E402
from recstream.data import SyntheticCTR  # noqa: E402
from recstream.hostpath import device_path  # noqa: E402
from recstream.models import DLRM, DCNv2, DeepFM, WideDeep, default_optimizer  # noqa: E402
from recstream.testing import SyncCounter  # noqa: E402

MODELS = {
    "widedeep": lambda s, h, d: WideDeep(s, hidden=h, embedding_dim=d),
    "deepfm": lambda s, h, d: DeepFM(s, hidden=h, embedding_dim=d),
    "dcnv2": lambda s, h, d: DCNv2(s, num_cross_layers=2, hidden=h, embedding_dim=d),
    "dlrm": lambda s, h, d: DLRM(s, bottom=(64,), top=h, embedding_dim=d),
}
IDIOMATIC_LEVELS = ("O1", "O2")


@dataclass
class CaseResult:
    case: str
    passed: bool
    steady_steps: int
    how: str  # what was checked: "set_sync_debug_mode('error')" or the CPU run
    syncs_per_step: float | None = None  # CUDA: synchronisations warned per steady step (failed cases)
    sync_forcing_ops_per_step: int | None = None  # CPU: SyncCounter's max over steady steps
    ops_per_step: float | None = None  # CPU: dispatched ops per steady step
    where: list[str] = field(default_factory=list)  # the first places a synchronisation came from
    error: str = ""
    seconds: float = 0.0


class _Window(Callback):
    """Calls `enter` at the beginning of step `first` and `leave` at the end of step `last` (0-based),
    and `each` at every step's beginning (SyncCounter.mark)."""

    def __init__(self, first: int, last: int, enter, leave, each=None):
        self.first, self.last, self.enter, self.leave, self.each = first, last, enter, leave, each
        self.step = 0

    def on_train_step_begin(self, run_context):
        if self.each:
            self.each()
        if self.step == self.first:
            self.enter()

    def on_train_step_end(self, run_context):
        if self.step == self.last:
            self.leave()
        self.step += 1


def _cases(args, device: torch.device) -> dict:
    """{case name: () -> (Model, batches)}, each built fresh (seeded) when called."""
    gen = SyntheticCTR(num_dense=bench_boost.DENSE, num_categorical=bench_boost.FIELDS,
                       vocab_sizes=[args.vocab] * bench_boost.FIELDS, batch_size=args.batch_size,
                       embedding_dim=args.dim, seed=0)
    batches = [b.to(device) for b in gen.train_batches(args.warm + args.steps)]
    hidden = tuple(args.hidden)

    def model(name: str, level: str):
        torch.manual_seed(0)
        net = MODELS[name](gen.schema, hidden, args.dim).to(device)
        return Model(net, nn.BCEWithLogitsLoss(), default_optimizer(net), metrics={"auc", "loss"},
                     boost_level=level, progress_bar=False), batches

    def idiomatic(level: str):
        torch.manual_seed(0)
        net = bench_boost.Idiomatic(args.vocab, args.dim, hidden).to(device)
        return Model(net, nn.BCEWithLogitsLoss(), torch.optim.Adam(net.parameters(), lr=1e-3),
                     metrics={"auc", "loss"}, boost_level=level, progress_bar=False), bench_boost._plain(batches)

    cases = {f"{name}_{level}": (lambda n=name, lv=level: model(n, lv)) for level in args.levels for name in MODELS}
    cases.update({f"idiomatic_{level}": (lambda lv=level: idiomatic(lv)) for level in IDIOMATIC_LEVELS})
    return cases


def _cuda_case(name: str, build, args, device: torch.device) -> CaseResult:
    """Under "error" mode; if that raises, once more under "warn" to count and locate the syncs."""
    last = args.warm + args.steps - 1
    result = CaseResult(name, False, args.steps, "torch.cuda.set_sync_debug_mode('error')")

    def enter(mode):
        torch.cuda.synchronize(device)
        torch.cuda.set_sync_debug_mode(mode)

    def leave():
        torch.cuda.set_sync_debug_mode("default")

    try:
        model, batches = build()
        model.train(1, batches, callbacks=[_Window(args.warm, last, lambda: enter("error"), leave)])
        result.passed = True
        return result
    except Exception as e:  # noqa: BLE001  (a sync raises RuntimeError; any other error fails the case too)
        result.error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
        result.where = [_last_project_frame(e)]
    finally:
        leave()
    with warnings.catch_warnings(record=True) as caught:  # count and locate them
        warnings.simplefilter("always")
        try:
            model, batches = build()
            model.train(1, batches, callbacks=[_Window(args.warm, last, lambda: enter("warn"), leave)])
        except Exception as e:  # noqa: BLE001
            result.where.append(f"warn-mode run failed too: {type(e).__name__}: {e}"[:300])
        finally:
            leave()
    syncs = [w for w in caught if "synchronizing" in str(w.message)]
    result.syncs_per_step = len(syncs) / args.steps
    result.where += [f"{f}:{n} ({c}x)" for (f, n), c in Counter((w.filename, w.lineno) for w in syncs).most_common(5)]
    return result


def _cpu_case(name: str, build, args) -> CaseResult:
    """The steps on the CPU, counted on the torch-op path CUDA runs (device_path)."""
    result = CaseResult(name, False, args.steps, "CPU: the steps run (no CUDA); SyncCounter on device_path")
    counter = SyncCounter(trace=True)
    try:
        model, batches = build()
        with device_path(), counter:
            # marks at each step's beginning, and at the last one's end (before the epoch's end)
            last = args.warm + args.steps - 1
            model.train(1, batches, callbacks=[_Window(0, last, lambda: None, counter.mark, counter.mark)])
    except Exception as e:  # noqa: BLE001
        result.error = f"{type(e).__name__}: {e}"[:300]
        result.where = [_last_project_frame(e)]
        return result
    steady = counter.per_step[1 + args.warm:]  # [0]: before the first step; [i]: step i to step i+1
    result.passed = len(steady) == args.steps
    if steady:
        result.sync_forcing_ops_per_step = max(s.syncs for s in steady)
        result.ops_per_step = sum(s.ops for s in steady) / len(steady)
        if result.sync_forcing_ops_per_step:  # the first ones of the run (warm-up steps included)
            result.where = [f"{packet} at {_project_frame(stack)}" for packet, stack in counter.where[:3]]
    return result


def _project_frame(stack: str) -> str:
    """The innermost 'File "...", line N, in f' of a formatted stack inside recstream (else the innermost)."""
    frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)', stack)
    ours = [f for f in frames if "recstream" in f[0]] or frames[-1:]
    return f"{ours[-1][0]}:{ours[-1][1]} in {ours[-1][2]}" if ours else "?"


def _last_project_frame(e: BaseException) -> str:
    """The innermost frame of the error's traceback inside recstream or benchmarks (else the innermost)."""
    frames = traceback.extract_tb(e.__traceback__)
    ours = [f for f in frames if "recstream" in f.filename or "benchmarks" in f.filename] or frames[-1:]
    return f"{ours[-1].filename}:{ours[-1].lineno} in {ours[-1].name}" if ours else "?"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--steps", type=int, default=100, help="steady steps checked per case")
    p.add_argument("--warm", type=int, default=5, help="steps before the check (state, caches, capture)")
    p.add_argument("--batch-size", type=int, default=4096)
    p.add_argument("--vocab", type=int, default=100_000, help="rows per field table")
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--hidden", type=int, nargs="+", default=[1024, 512, 256])
    p.add_argument("--levels", nargs="+", default=["O0"], choices=["O0", "O1", "O2"],
                   help="boost levels of the fixed-table models")
    p.add_argument("--cases", nargs="+", default=None, help="run only these cases (e.g. widedeep_O0)")
    p.add_argument("--out", help="write the results as JSON here")
    args = p.parse_args(argv)
    for name in ("steps", "warm", "batch_size", "vocab", "dim"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: CUDA is not available here (torch.cuda.is_available() is False)")
    cases = _cases(args, device)
    unknown = sorted(set(args.cases or ()) - set(cases))
    if unknown:
        p.error(f"--cases: unknown {unknown}; known: {sorted(cases)}")
    print(f"device={device} torch={torch.__version__} batch={args.batch_size} vocab/field={args.vocab:,} "
          f"warm={args.warm} steady steps={args.steps}", flush=True)
    results = []
    for name, build in cases.items():
        if args.cases and name not in args.cases:
            continue
        start = time.perf_counter()
        r = _cuda_case(name, build, args, device) if device.type == "cuda" else _cpu_case(name, build, args)
        r.seconds = round(time.perf_counter() - start, 2)
        results.append(r)
        print(f"  {name:14s} {'pass' if r.passed else 'FAIL'}  {r.error}", flush=True)
    _print_table(results, device)
    if args.out:
        Path(args.out).write_text(json.dumps({"args": vars(args), "results": [asdict(r) for r in results]}, indent=1))
    return 0 if all(r.passed for r in results) else 1


def _print_table(results: list[CaseResult], device: torch.device) -> None:
    if device.type == "cuda":
        print("\n| case | set_sync_debug_mode('error'), steady steps | syncs/step | where |\n| --- | --- | --- | --- |")
        for r in results:
            verdict = f"pass ({r.steady_steps})" if r.passed else f"FAIL: {r.error}"
            syncs = "0" if r.passed else ("-" if r.syncs_per_step is None else f"{r.syncs_per_step:g}")
            print(f"| {r.case} | {verdict} | {syncs} | {'; '.join(r.where)} |")
    else:
        print("\n| case | steps ran (CPU) | sync-forcing ops/step | dispatched ops/step | where |\n"
              "| --- | --- | --- | --- | --- |")
        for r in results:
            ops = "-" if r.ops_per_step is None else f"{r.ops_per_step:.0f}"
            print(f"| {r.case} | {'yes' if r.passed else 'NO: ' + r.error} | {r.sync_forcing_ops_per_step} | "
                  f"{ops} | {'; '.join(r.where)} |")
    print(f"\n{sum(r.passed for r in results)} of {len(results)} cases pass", flush=True)


if __name__ == "__main__":
    sys.exit(main())
