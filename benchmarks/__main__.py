"""The one benchmark command: ``python -m benchmarks [--quick] [--device cuda] [--out DIR]``.

Runs, in one go, interleaved where it compares:

1. boost levels against hand-written loops (`bench_boost`): the idiomatic network at O0/O1/O2,
   the idiomatic and hand-tuned loops, recstream's WideDeep, the MLP alone (samples/s, test AUC,
   peak memory);
2. throughput against batch size (256 .. 8192) for the idiomatic network at O1;
3. training-step time and peak memory against table rows (10^4 .. 10^7, 10^8 without --quick)
   for a fused table and a `HashEmbedding` (`bench_rows`, one process per point);
4. DeepCTR-Torch (WDL, DeepFM) and TorchRec (EmbeddingBagCollection, and its fused FBGEMM
   collection) on the same data, interleaved with step 1, when they import; skipped with a message
   otherwise: they are not dependencies (`field_runners`; ``--skip field`` leaves them out even
   when installed). Install them beside torch 2.13::

       pip install deepctr-torch==0.3.0
       pip install --no-deps torchrec==1.8.0 fbgemm-gpu-cpu==1.8.0
       pip install tensordict==0.15.3 pyre-extensions==0.0.32

Writes ``results.json``, ``results.md`` and, with matplotlib installed (``pip install
"recstream[bench]"``), ``boost.png``, ``batch_scaling.png``, ``rows_scaling.png`` to --out.
``--quick`` finishes in a few minutes on 2 cores.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_boost  # noqa: E402
import field_runners  # noqa: E402


def _boost(args, systems: list[str]) -> dict:
    rows = 51_200 if args.quick else 409_600
    field = functools.partial(field_runners.runners, systems=systems) if systems else None
    return bench_boost.main(["--rows", str(rows), "--test-rows", str(20_000 if args.quick else 100_000),
                             "--reps", "1" if args.quick else "3", "--threads", str(args.threads),
                             "--device", args.device, "--vocab", str(20_000 if args.quick else 100_000)],
                            field=field)


def _batch_scaling(args) -> dict:
    sizes = [256, 1024, 4096] if args.quick else [256, 1024, 2048, 4096, 8192]

    def run(size: int, rows: int) -> dict:
        return bench_boost.main(["--rows", str(rows), "--test-rows", "5000", "--batch-size", str(size),
                                 "--reps", "1", "--threads", str(args.threads), "--device", args.device,
                                 "--vocab", "20000", "--variants", "hand", "O1"])

    if "boost" in args.skip:
        # One repetition per point, so the first point would carry the process's one-time start-up
        # (on CUDA: the context, lazily loaded kernels, cuBLAS handles -- on an H100 the hand loop
        # measured 20k samples/s at batch 256 that way, a tenth of its rate at batch 1024): a short
        # untimed run first. (Without --skip boost, the boost runs before have warmed everything.)
        run(sizes[0], sizes[0] * 4)
    return {size: {v: r["samples_per_s"] for v, r in run(size, size * (8 if args.quick else 32)).items()}
            for size in sizes}


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


def _field(args) -> dict[str, str]:
    """What becomes of each comparison system (they are optional): "runs", or why it is skipped."""
    skipped = "boost" in args.skip or "field" in args.skip
    why = {name: f"not installed ({field_runners.SYSTEMS[name][1]}), skipped [{error}]" if error is not None
           else "skipped (--skip)" if skipped else "runs"
           for name, error in field_runners.available(args.device).items()}
    for name, what in why.items():
        print(f"{name}: {what}", flush=True)
    return why


def _field_variants() -> set[str]:
    return {v for names in field_runners.VARIANTS.values() for v in names}


def _row(v: str, r: dict, hand: dict | None) -> str:
    ratio = f"{r['vs_hand']:.2f}x" if r["vs_hand"] else "-"
    auc = "-" if r["auc"] != r["auc"] else f"{r['auc']:.4f}"
    peak = r.get("peak_mib", float("nan"))
    mem = f"{peak / hand['peak_mib']:.2f}x" if hand and hand.get("peak_mib", 0) > 0 and peak == peak else "-"
    return f"| {v} | {r['samples_per_s']:,.0f} | {ratio} | {auc} | {peak:,.0f} | {mem} |"


def _markdown(results: dict) -> str:
    head = ["| variant | samples/s | vs hand | test AUC | peak MiB | peak vs hand |",
            "| --- | --- | --- | --- | --- | --- |"]
    boost, hand, field = results["boost"], results["boost"].get("hand"), _field_variants()
    lines = ["## boost levels", "", *head, *(_row(v, r, hand) for v, r in boost.items() if v not in field)]
    lines += ["", "## comparison systems (same data, batch, dim, one epoch; interleaved with the above)", "", *head]
    lines += [_row(v, r, hand) for v, r in boost.items() if v == "hand" or v in field]
    skipped = [f"- {name}: {what}" for name, what in results.get("field", {}).items() if what != "runs"]
    lines += ["", *skipped] if skipped else []
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
    _boost_plot(plt, results["boost"], out / "boost.png")
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


def _boost_plot(plt, boost: dict, path: Path) -> None:
    """Samples/s and peak memory per variant; the comparison systems' bars in a second colour."""
    names, field = list(boost), _field_variants()
    colours = ["tab:orange" if n in field else "tab:blue" for n in names]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, key, label in zip(axes, ("samples_per_s", "peak_mib"), ("samples/s", "peak MiB"), strict=True):
        ax.bar(names, [boost[n].get(key, float("nan")) for n in names], color=colours)
        ax.set_ylabel(label)
        ax.tick_params(axis="x", rotation=45)
        for tick in ax.get_xticklabels():
            tick.set_ha("right")
    axes[0].set_title("training samples/s (one epoch)")
    axes[1].set_title("peak memory of the epoch")
    if field & set(names):
        axes[0].legend(handles=[plt.Rectangle((0, 0), 1, 1, color=c) for c in ("tab:blue", "tab:orange")],
                       labels=["recstream / hand loops", "DeepCTR-Torch / TorchRec"])
    fig.tight_layout()
    fig.savefig(path)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes: a few minutes on 2 cores")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default="bench-results")
    p.add_argument("--skip", nargs="*", default=[], choices=["boost", "field", "batch", "rows"])
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    field = _field(args)
    results = {"args": vars(args), "field": field,
               "boost": {} if "boost" in args.skip else _boost(args, [n for n, w in field.items() if w == "runs"]),
               "batch_scaling": {} if "batch" in args.skip else _batch_scaling(args),
               "rows_scaling": [] if "rows" in args.skip else _rows_scaling(args)}
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    (out / "results.md").write_text(_markdown(results))
    written = ["results.json", "results.md", *_plots(results, out)]
    print(f"wrote {', '.join(written)} to {out}/", flush=True)
    return results


if __name__ == "__main__":
    main()
