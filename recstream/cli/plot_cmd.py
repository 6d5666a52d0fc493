"""`recstream plot RUN_DIR`: PNG plots of a run's metrics, with matplotlib.

Reads ``metrics.jsonl`` of a run directory (what ``recstream train`` / ``online`` write: one
row per epoch, or per prequential report online) and writes, next to it or to ``--output``:

- ``loss.png``: training loss and evaluation loss over the steps;
- ``metrics.png``: every other evaluation result (AUC, log loss, accuracy, ...) over the steps;
- ``throughput.png``: steps per second between rows (from the rows' ``seconds``);
- ``prequential.png`` (online runs): rolling and whole-stream AUC over the events.

A plot whose columns the run does not have is not written. ``metrics.png`` draws at most
`MAX_LINES` metrics (the first by name, or those named by ``--metric``): a legend of thousands of
lines took a minute to lay out and could not be read. Malformed rows (not JSON, not an object,
invalid UTF-8, nested too deep, a number too long) are skipped and counted on stderr; a torn last
line (a crash mid-write) is left out. Needs matplotlib (``pip install "recstream[plot]"``).

>>> import argparse
>>> sub = argparse.ArgumentParser().add_subparsers()
>>> add_parser(sub).parse_args(["runs/a"]).output is None
True
"""
from __future__ import annotations

import argparse
import math
import os
import sys

from .errors import EXIT_USAGE, CliError
from .jsonl_rows import read_rows

DESCRIPTION = """Write PNG plots of a run directory's metrics.jsonl (loss, evaluation results,
throughput, prequential AUC) next to it, or to --output."""

_LOSSES = ("loss", "eval_loss")
_NOT_METRICS = {"epoch", "step", "seconds", "events", "window_events", "time", *_LOSSES}
MAX_LINES = 12  # metrics drawn in metrics.png


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("plot", help="PNG plots of a run's metrics", description=DESCRIPTION)
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory holding metrics.jsonl")
    p.add_argument("--output", default=None, help="directory for the PNG files (default: RUN_DIR)")
    p.add_argument("--metric", action="append", default=None, metavar="NAME",
                   help=f"a metric to draw in metrics.png (repeatable; default: the first {MAX_LINES} by name)")
    p.set_defaults(run=run)
    return p


def _number(value) -> float | None:
    """A finite number of a row as a float (not a bool, not an int beyond float's range), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        value = float(value)
    except OverflowError:
        return None
    return value if math.isfinite(value) else None


def _series(rows: list[dict], x: str, y: str) -> tuple[list, list]:
    points = [(a, b) for a, b in ((_number(r.get(x)), _number(r.get(y))) for r in rows) if a is not None
              and b is not None]
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
    timed = [(step, seconds) for step, seconds in ((_number(r.get("step")), _number(r.get("seconds"))) for r in rows)
             if step is not None and seconds is not None]
    xs, ys = [], []
    for (step_a, sec_a), (step_b, sec_b) in zip(timed, timed[1:], strict=False):  # consecutive pairs
        if sec_b > sec_a and step_b > step_a:
            xs.append(step_b)
            ys.append((step_b - step_a) / (sec_b - sec_a))
    return xs, ys


def _metrics(rows: list[dict], chosen: list[str] | None) -> tuple[list[str], int]:
    """The metrics metrics.png draws, and how many the rows hold."""
    found = sorted({k for r in rows for k, v in r.items() if _number(v) is not None and k not in _NOT_METRICS
                    and not k.endswith("_total")})
    if chosen:
        missing = [name for name in chosen if name not in found]
        if missing:
            raise CliError(f"--metric {missing[0]}: not a metric of this run; it has {', '.join(found[:20])}"
                           f"{' ...' if len(found) > 20 else ''}", EXIT_USAGE)
        return list(dict.fromkeys(chosen)), len(found)
    return found[:MAX_LINES], len(found)


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
    found = read_rows(path)
    rows = found.rows
    if found.skipped:
        line, why = found.skipped[0]
        print(f"recstream plot: skipped {len(found.skipped)} malformed row{'s' if len(found.skipped) > 1 else ''} of "
              f"{path} (first: line {line}, {why})", file=sys.stderr)
    if not rows:
        raise CliError(f"{path} holds no rows yet", EXIT_USAGE)
    metrics, total = _metrics(rows, args.metric)
    if total > len(metrics) and not args.metric:
        print(f"recstream plot: metrics.png draws {len(metrics)} of {total} metrics (--metric NAME picks them)",
              file=sys.stderr)
    written = [name for name, done in (
        ("loss.png", _figure(plt, os.path.join(out, "loss.png"), "loss", "step",
                             {k: _series(rows, "step", k) for k in _LOSSES})),
        ("metrics.png", _figure(plt, os.path.join(out, "metrics.png"), "evaluation", "step",
                                {k: _series(rows, "step", k) for k in metrics})),
        ("throughput.png", _figure(plt, os.path.join(out, "throughput.png"), "steps per second", "step",
                                   {"steps/s": _throughput(rows)})),
        ("prequential.png", _figure(plt, os.path.join(out, "prequential.png"), "prequential AUC", "events",
                                    {k: _series(rows, "events", k) for k in ("auc", "auc_total")})),
    ) if done]
    print(f"recstream plot: wrote {', '.join(written) or 'nothing (no plottable columns)'} to {out}")
    return 0
