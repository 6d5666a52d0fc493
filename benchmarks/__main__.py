"""The one benchmark command: ``python -m benchmarks [--quick] [--device cuda] [--out DIR]``.

Runs, in one go, interleaved where it compares:

1. boost levels against hand-written loops (`bench_boost`): the idiomatic network at O0/O1/O2,
   the idiomatic and hand-tuned loops, recstream's WideDeep, the MLP alone;
2. throughput against batch size (256 .. 8192) for the idiomatic network at O1;
3. training-step time and peak memory against table rows (10^4 .. 10^7, 10^8 without --quick)
   for a fused table and a `HashEmbedding` (`bench_rows`, one process per point);
4. DeepCTR-Torch and TorchRec when installed (skipped with a message otherwise: they are not
   dependencies).

Writes ``results.json``, ``results.md`` and, with matplotlib installed (``pip install
"recstream[bench]"``), ``boost.png``, ``batch_scaling.png``, ``rows_scaling.png`` to --out.
``--quick`` finishes in a few minutes on 2 cores.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_boost  # noqa: E402


def _boost(args) -> dict:
    rows = 51_200 if args.quick else 409_600
    return bench_boost.main(["--rows", str(rows), "--test-rows", str(20_000 if args.quick else 100_000),
                             "--reps", "1" if args.quick else "3", "--threads", str(args.threads),
                             "--device", args.device, "--vocab", str(20_000 if args.quick else 100_000)])


def _batch_scaling(args) -> dict:
    sizes = [256, 1024, 4096] if args.quick else [256, 1024, 2048, 4096, 8192]
    out = {}
    for size in sizes:
        res = bench_boost.main(["--rows", str(size * (8 if args.quick else 32)), "--test-rows", "5000",
                                "--batch-size", str(size), "--reps", "1", "--threads", str(args.threads),
                                "--device", args.device, "--vocab", "20000", "--variants", "hand", "O1"])
        out[size] = {v: r["samples_per_s"] for v, r in res.items()}
    return out


def _rows_scaling(args) -> list[dict]:
    counts = [10 ** 4, 10 ** 5, 10 ** 6] if args.quick else [10 ** 4, 10 ** 5, 10 ** 6, 10 ** 7, 10 ** 8]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")]))
    points = []
    for rows in counts:
        for kind in ("fused", "hash"):
            done = subprocess.run([sys.executable, str(HERE / "bench_rows.py"), str(rows), kind],
                                  capture_output=True, text=True, env=env, timeout=1800)
            if done.returncode != 0:
                print(f"rows={rows} {kind}: failed: {done.stderr.strip().splitlines()[-1:]}", flush=True)
                continue
            points.append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(f"rows={rows:>11,} {kind:5s} {points[-1]['ms_per_step']:8.2f} ms/step "
                  f"peak {points[-1]['peak_rss_mib']:8.0f} MiB", flush=True)
    return points


def _field() -> dict:
    """Which comparison systems are installed (they are optional)."""
    found = {name: importlib.util.find_spec(module) is not None
             for name, module in (("DeepCTR-Torch", "deepctr_torch"), ("TorchRec", "torchrec"))}
    for name, present in found.items():
        if not present:
            print(f"{name}: not installed, skipped", flush=True)
        else:
            print(f"{name}: installed, but its runner is not part of this version: skipped", flush=True)
    return found


def _markdown(results: dict) -> str:
    lines = ["## boost levels", "", "| variant | samples/s | vs hand | test AUC |", "| --- | --- | --- | --- |"]
    for v, r in results["boost"].items():
        ratio = f"{r['vs_hand']:.2f}x" if r["vs_hand"] else "-"
        auc = "-" if r["auc"] != r["auc"] else f"{r['auc']:.4f}"
        lines.append(f"| {v} | {r['samples_per_s']:,.0f} | {ratio} | {auc} |")
    lines += ["", "## batch size (samples/s)", "", "| batch | hand | O1 |", "| --- | --- | --- |"]
    for size, r in results["batch_scaling"].items():
        lines.append(f"| {size} | {r['hand']:,.0f} | {r['O1']:,.0f} |")
    lines += ["", "## table rows", "", "| rows | kind | ms/step | peak RSS MiB | table MiB |",
              "| --- | --- | --- | --- | --- |"]
    for p in results["rows_scaling"]:
        lines.append(f"| {p['rows']:,} | {p['kind']} | {p['ms_per_step']:.2f} | {p['peak_rss_mib']:.0f} | "
                     f"{p['table_mib']:.0f} |")
    return "\n".join(lines) + "\n"


def _plots(results: dict, out: Path) -> list[str]:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plots (pip install 'recstream[bench]')", flush=True)
        return []
    fig, ax = plt.subplots(figsize=(8, 4))
    names = list(results["boost"])
    ax.bar(names, [results["boost"][n]["samples_per_s"] for n in names])
    ax.set_ylabel("samples/s")
    ax.set_title("boost levels vs hand-written loops")
    ax.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    fig.savefig(out / "boost.png")
    fig, ax = plt.subplots(figsize=(6, 4))
    sizes = [int(s) for s in results["batch_scaling"]]
    for v in ("hand", "O1"):
        ax.plot(sizes, [results["batch_scaling"][s][v] for s in results["batch_scaling"]], marker="o", label=v)
    ax.set_xscale("log", base=2)
    ax.set(xlabel="batch size", ylabel="samples/s", title="throughput vs batch size")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "batch_scaling.png")
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    for kind in ("fused", "hash"):
        pts = [p for p in results["rows_scaling"] if p["kind"] == kind]
        a1.plot([p["rows"] for p in pts], [p["ms_per_step"] for p in pts], marker="o", label=kind)
        a2.plot([p["rows"] for p in pts], [p["peak_rss_mib"] for p in pts], marker="o", label=kind)
    for ax, label in ((a1, "ms / step"), (a2, "peak RSS MiB")):
        ax.set_xscale("log")
        ax.set(xlabel="table rows", ylabel=label)
        ax.legend()
    fig.tight_layout()
    fig.savefig(out / "rows_scaling.png")
    plt.close("all")
    return ["boost.png", "batch_scaling.png", "rows_scaling.png"]


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes: a few minutes on 2 cores")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default="bench-results")
    p.add_argument("--skip", nargs="*", default=[], choices=["boost", "batch", "rows"])
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = {"args": vars(args), "field": _field(),
               "boost": {} if "boost" in args.skip else _boost(args),
               "batch_scaling": {} if "batch" in args.skip else _batch_scaling(args),
               "rows_scaling": [] if "rows" in args.skip else _rows_scaling(args)}
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    (out / "results.md").write_text(_markdown(results))
    written = ["results.json", "results.md", *_plots(results, out)]
    print(f"wrote {', '.join(written)} to {out}/", flush=True)
    return results


if __name__ == "__main__":
    main()
