"""`recstream plot RUN_DIR`: PNG plots of a run's metrics, with matplotlib.

Reads ``metrics.jsonl`` of a run directory (what ``recstream train`` / ``online`` write: one
row per epoch, or per prequential report online) and writes, next to it or to ``--output``:

- ``loss.png``: the mean training loss (``loss``, or ``sink_last_loss``) and the evaluation loss
  (``eval_loss``, else the whole evaluation set's ``logloss``) over the steps, on one labelled axis;
- ``metrics.png``: every other evaluation result (AUC, log loss, accuracy, ...) over the steps,
  one metric per axis (AUC and log loss have different scales and directions);
- ``throughput.png``: steps per second over the run's time, a point per row (each from the row
  before it, the first from the start);
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

_LOSSES = ("loss", "sink_last_loss", "eval_loss")
_NOT_METRICS = {"epoch", "step", "seconds", "events", "window_events", "time", *_LOSSES}
_LABELS = {"loss": "mean training loss", "sink_last_loss": "training loss (mean of each sink's last batch)",
           "eval_loss": "evaluation loss (whole set)", "logloss": "evaluation log loss (whole set)"}
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


def _figure(plt, title: str, xlabel: str, panels: list[tuple[str, dict[str, tuple[list, list]]]]):
    """One figure, an axis per panel ``(y label, {line name: (xs, ys)})``, or None with nothing to draw."""
    panels = [(ylabel, {name: xy for name, xy in lines.items() if xy[0]}) for ylabel, lines in panels]
    panels = [(ylabel, lines) for ylabel, lines in panels if lines]
    if not panels:
        return None
    fig, axes = plt.subplots(len(panels), 1, figsize=(7, 1.2 + 2.6 * len(panels)), sharex=True, squeeze=False)
    for ax, (ylabel, lines) in zip(axes[:, 0], panels, strict=True):
        for name, (xs, ys) in lines.items():
            ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, label=_LABELS.get(name, name))
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    axes[0, 0].set_title(title)
    axes[-1, 0].set_xlabel(xlabel)
    fig.tight_layout()
    return fig


def _throughput(rows: list[dict]) -> tuple[list, list]:
    """Steps per second at each row's time, over the span since the row before it (the first row:
    since the start, step 0 at 0 s)."""
    timed = [(step, seconds) for step, seconds in ((_number(r.get("step")), _number(r.get("seconds"))) for r in rows)
             if step is not None and seconds is not None]
    xs, ys = [], []
    for (step_a, sec_a), (step_b, sec_b) in zip([(0.0, 0.0)] + timed, timed, strict=False):  # consecutive pairs
        if sec_b > sec_a and step_b > step_a:
            xs.append(sec_b)
            ys.append((step_b - step_a) / (sec_b - sec_a))
    return xs, ys


def figures(plt, rows: list[dict], metrics: list[str]) -> dict:
    """``{file name: matplotlib Figure}`` of the plots these rows have columns for."""
    eval_loss = "eval_loss" if any(_number(r.get("eval_loss")) is not None for r in rows) else "logloss"
    losses = ("loss", "sink_last_loss", eval_loss)
    drawn = {
        "loss.png": _figure(plt, "loss", "step", [("loss (log loss, mean)",
                                                   {k: _series(rows, "step", k) for k in losses})]),
        "metrics.png": _figure(plt, "evaluation", "step", [(k, {k: _series(rows, "step", k)}) for k in metrics]),
        "throughput.png": _figure(plt, "throughput", "seconds since the start",
                                  [("steps per second", {"steps/s": _throughput(rows)})]),
        "prequential.png": _figure(plt, "prequential AUC (test, then train)", "events",
                                   [("AUC", {k: _series(rows, "events", k) for k in ("auc", "auc_total")})]),
    }
    return {name: fig for name, fig in drawn.items() if fig is not None}


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
    written = []
    for name, fig in figures(plt, rows, metrics).items():
        fig.savefig(os.path.join(out, name))
        plt.close(fig)
        written.append(name)
    print(f"recstream plot: wrote {', '.join(written) or 'nothing (no plottable columns)'} to {out}")
    return 0
