"""`recstream eval CONFIG.yaml`: evaluate the newest checkpoint of the run on ``data.eval``.

The checkpoint is ``eval.checkpoint`` (a file, or a directory's newest one that loads) or
else the run's ``<run_dir>/checkpoints``; the network is built from the same config, so the
checkpoint must come from it. Appends one row to ``<run_dir>/eval.jsonl`` and ``eval.csv``.
"""
from __future__ import annotations

import logging
import os
import time

from .errors import EXIT_USAGE, CliError
from .run_command import add_config_parser, emit, load, setup_torch, summary

log = logging.getLogger("recstream.cli")
DESCRIPTION = """Evaluate the run's newest checkpoint on data.eval (AUC, log loss).

The checkpoint is eval.checkpoint or else <run_dir>/checkpoints (written by recstream
train with the same config). Appends a row to <run_dir>/eval.csv and eval.jsonl.
Reference: docs/cli.md."""


def add_parser(sub) -> None:
    add_config_parser(sub, "eval", "evaluate a trained model from a config file", DESCRIPTION, run)


def run(args) -> int:
    cfg, doc = load(args, ("data", "eval"))
    setup_torch(cfg)
    checkpoint = cfg.eval.checkpoint or os.path.join(cfg.run_dir, "checkpoints")
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
