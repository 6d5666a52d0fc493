"""`recstream eval CONFIG.yaml`: evaluate a checkpoint of the run on ``data.eval``.

The checkpoint is ``--checkpoint`` (``newest``: the newest of ``<run_dir>/checkpoints`` that
loads; ``best``: the best epoch's under early stopping's monitor, ``<run_dir>/best``; or a path),
else ``eval.checkpoint`` (a file, or a directory's newest one that loads), else the run's newest;
the network is built from the same config, so the checkpoint must come from it. Appends one row
to ``<run_dir>/eval.jsonl`` and ``eval.csv``.
"""
from __future__ import annotations

import logging
import os
import time

from .errors import EXIT_USAGE, CliError
from .run_command import add_config_parser, emit, load, setup_torch, summary

log = logging.getLogger("recstream.cli")
DESCRIPTION = """Evaluate a checkpoint of the run on data.eval (AUC, log loss over the whole set).

The checkpoint is --checkpoint (newest, best or a path), else eval.checkpoint, else the
newest of <run_dir>/checkpoints (written by recstream train with the same config). best is
the best epoch's under callbacks.early_stopping's monitor (<run_dir>/best). Appends a row to
<run_dir>/eval.csv and eval.jsonl. Reference: docs/cli.md."""


def add_parser(sub) -> None:
    p = add_config_parser(sub, "eval", "evaluate a trained model from a config file", DESCRIPTION, run)
    p.add_argument("--checkpoint", default=None, metavar="best|newest|PATH",
                   help="which checkpoint: the newest of <run_dir>/checkpoints, the best epoch's under early "
                        "stopping (<run_dir>/best), or a file or directory (default: eval.checkpoint, else newest)")
    p.set_defaults(checkpoint=None)


def choose_checkpoint(args, cfg) -> str:
    """The file or directory to load: `--checkpoint`, else ``eval.checkpoint``, else the newest."""
    from .run_log import read_best
    choice = args.checkpoint
    if choice is None:
        choice = cfg.eval.checkpoint or "newest"
    if choice == "newest":
        return os.path.join(cfg.run_dir, "checkpoints")
    if choice == "best":
        best = os.path.join(cfg.run_dir, "best")
        record = read_best(best)
        if record is None:
            raise CliError(f"--checkpoint best: {best}/best.json does not exist: recstream train records the best "
                           "epoch only with callbacks.early_stopping (its monitor) and data.eval; use --checkpoint "
                           "newest or a PATH", EXIT_USAGE)
        log.info("best checkpoint: epoch %s, %s=%s", record.get("epoch"), record.get("monitor"), record.get("value"))
        return os.path.join(best, record["checkpoint"])
    return choice


def run(args) -> int:
    cfg, doc = load(args, ("data", "eval"))
    setup_torch(cfg)
    checkpoint = choose_checkpoint(args, cfg)
    if not os.path.exists(checkpoint):
        raise CliError(f"no checkpoint: {checkpoint} does not exist (run recstream train {args.config} first, "
                       "or set eval.checkpoint)", EXIT_USAGE)
    from .build import build_model, build_reader, build_schema
    from .run_dir import RunDirectory
    from .run_log import MetricsLog
    with RunDirectory(cfg.run_dir, "eval", args.config, doc) as run_dir:
        schema = build_schema(cfg, doc)
        valid = build_reader(cfg, doc, "eval", schema)
        model, net = build_model(cfg, doc, schema)
        meta = model.restore(checkpoint)
        if meta is None:
            raise CliError(f"no checkpoint in {checkpoint} loads into this config's model ({type(net).__name__}; "
                           "see the warnings above)", EXIT_USAGE)
        start = time.perf_counter()
        results = model.eval(valid)
        seconds = time.perf_counter() - start
        row = {"epoch": meta.get("epoch"), "step": meta.get("cur_step_num"), **results, "seconds": round(seconds, 3)}
        MetricsLog(run_dir.path, append=True, stem="eval").add(row)
        scores = {k: float(v) for k, v in results.items()}
        result = {"run_dir": run_dir.path, "checkpoint": checkpoint, "epoch": row["epoch"], "step": row["step"],
                  "seconds": round(seconds, 3), "metrics": scores}
        line = (f"recstream eval: {summary(scores)} on {valid} (checkpoint of epoch {row['epoch']}, step "
                f"{row['step']}) in {seconds:.1f} s")
        log.info("%s", line)
        return emit(args, result, line)
