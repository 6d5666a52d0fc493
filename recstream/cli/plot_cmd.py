"""`recstream plot RUN_DIR`: PNG plots of a run's metrics, with matplotlib.

Reads ``metrics.jsonl`` of a run directory (what ``recstream train`` / ``online`` write: one
row per epoch, or per prequential report online) and writes, next to it or to ``--output``:

- ``loss.png``: training loss and evaluation loss over the steps;
- ``metrics.png``: every other evaluation result (AUC, log loss, accuracy, ...) over the steps;
- ``throughput.png``: steps per second between rows (from the rows' ``seconds``);
- ``prequential.png`` (online runs): rolling and whole-stream AUC over the events.

A plot whose columns the run does not have is not written. Needs matplotlib
(``pip install "recstream[plot]"``).

>>> import argparse
>>> sub = argparse.ArgumentParser().add_subparsers()
>>> add_parser(sub).parse_args(["runs/a"]).output is None
True
"""
from __future__ import annotations

import argparse
import json
import os

from .errors import EXIT_USAGE, CliError

DESCRIPTION = """Write PNG plots of a run directory's metrics.jsonl (loss, evaluation results,
throughput, prequential AUC) next to it, or to --output."""

_LOSSES = ("loss", "eval_loss")
_NOT_METRICS = {"epoch", "step", "seconds", "events", "window_events", "time", *_LOSSES}


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("plot", help="PNG plots of a run's metrics", description=DESCRIPTION)
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory holding metrics.jsonl")
    p.add_argument("--output", default=None, help="directory for the PNG files (default: RUN_DIR)")
    p.set_defaults(run=run)
    return p


def read_rows(path: str) -> list[dict]:
    """The rows of a metrics.jsonl; a torn last line (a crash mid-write) is left out."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                if f.readline():  # not the last line: the file is damaged, not torn
                    raise CliError(f"{path}:{number}: not a JSON row ({e.msg})", EXIT_USAGE) from None
    return rows


def _series(rows: list[dict], x: str, y: str) -> tuple[list, list]:
    points = [(r[x], r[y]) for r in rows if isinstance(r.get(x), (int, float)) and isinstance(r.get(y), (int, float))]
    return [p[0] for p in points], [p[1] for p in points]


def _figure(plt, path: str, title: str, xlabel: str, lines: dict[str, tuple[list, list]]) -> bool:
    lines = {name: xy for name, xy in lines.items() if xy[0]}
    if not lines:
        return False
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, (xs, ys) in lines.items():
        ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, label=name)
    ax.set(title=title, xlabel=xlabel)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def _throughput(rows: list[dict]) -> tuple[list, list]:
    timed = [r for r in rows if isinstance(r.get("seconds"), (int, float)) and isinstance(r.get("step"), int)]
    xs, ys = [], []
    for a, b in zip(timed, timed[1:], strict=False):  # consecutive pairs
        if b["seconds"] > a["seconds"] and b["step"] > a["step"]:
            xs.append(b["step"])
            ys.append((b["step"] - a["step"]) / (b["seconds"] - a["seconds"]))
    return xs, ys


def run(args) -> int:
    path = os.path.join(args.run_dir, "metrics.jsonl")
    if not os.path.isdir(args.run_dir):
        raise CliError(f"{args.run_dir} is not a directory (give a run directory)", EXIT_USAGE)
    if not os.path.isfile(path):
        raise CliError(f"{args.run_dir} has no metrics.jsonl (written by recstream train/online)", EXIT_USAGE)
    out = args.output or args.run_dir
    if not os.path.isdir(out):
        raise CliError(f"--output {out} is not a directory (create it first)", EXIT_USAGE)
    try:
        import matplotlib
        matplotlib.use("Agg")  # files only: no display needed
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise CliError(f"plot needs matplotlib: pip install 'recstream[plot]' ({e})") from e
    rows = read_rows(path)
    if not rows:
        raise CliError(f"{path} holds no rows yet", EXIT_USAGE)
    metrics = sorted({k for r in rows for k, v in r.items() if isinstance(v, (int, float)) and k not in _NOT_METRICS
                      and not k.endswith("_total")})
    written = [name for name, done in (
        ("loss.png", _figure(plt, os.path.join(out, "loss.png"), "loss", "step",
                             {k: _series(rows, "step", k) for k in _LOSSES})),
        ("metrics.png", _figure(plt, os.path.join(out, "metrics.png"), "evaluation", "step",
                                {k: _series(rows, "step", k) for k in metrics})),
        ("throughput.png", _figure(plt, os.path.join(out, "throughput.png"), "steps per second", "step",
                                   {"steps/s": _throughput(rows)})),
        ("prequential.png", _figure(plt, os.path.join(out, "prequential.png"), "prequential AUC", "events",
                                    {k: _series(rows, "events", k) for k in ("auc", "auc_total")}
                                    if any("events" in r for r in rows) else {})),
    ) if done]
    print(f"recstream plot: wrote {', '.join(written) or 'nothing (no plottable columns)'} to {out}")
    return 0
