"""`recstream train CONFIG.yaml`: train the config's model on ``data.train`` with `Model.fit`.

Evaluates ``data.eval`` (when given) every ``train.valid_frequency`` epochs, and writes the run
directory (``run_dir``: config copy, train.log, metrics.csv/.jsonl with one row per epoch,
checkpoints/, tensorboard/). The config reference is docs/cli.md.
"""
from __future__ import annotations

import logging
import os
import time

from .run_command import add_config_parser, emit, load, published, setup_torch, summary

log = logging.getLogger("recstream.cli")
DESCRIPTION = """Train the config's model on data.train (Model.fit), evaluating data.eval.

Writes the run directory (run_dir): a copy of the config, train.log, metrics.csv and
metrics.jsonl (one row per epoch), checkpoints/ (the last one always) and tensorboard/
(when callbacks.tensorboard is set). A run_dir that holds an earlier run (metrics, checkpoints,
another config.yaml) is refused unless --overwrite is given. A mistake in the config is one line naming the
field, the value, what is allowed and file:line (exit status 2). Reference: docs/cli.md."""


def add_parser(sub) -> None:
    add_config_parser(sub, "train", "train a model from a config file", DESCRIPTION, run, overwrite=True)


def run(args) -> int:
    cfg, doc = load(args, ("data", "train"))
    setup_torch(cfg)
    from .build import build_callbacks, build_model, build_reader, build_schema
    from .run_dir import RunDirectory
    from .run_log import MetricsLog
    run_dir = RunDirectory(cfg.run_dir, "train", args.config, doc)
    if not args.overwrite:
        run_dir.check_new(doc)
    with run_dir:
        schema = build_schema(cfg, doc)
        train = build_reader(cfg, doc, "train", schema)
        if cfg.train.sink_mode and cfg.train.sink_size == -1 and train.get_dataset_size() is None:
            raise doc.error(("train", "sink_size"), -1, f"a {cfg.data.train.format} reader cannot count its batches "
                            "ahead, so one sink per epoch is unknown: set sink_size >= 1 or sink_mode: false")
        valid = build_reader(cfg, doc, "eval", schema) if cfg.data.eval is not None else None
        model, net = build_model(cfg, doc, schema)
        callbacks = build_callbacks(cfg, doc, run_dir.path, online=False, schema=schema)
        metrics = MetricsLog(run_dir.path)
        log.info("train %s: %s on %s, %d epochs", args.config, type(net).__name__, train, cfg.train.epochs)
        start = time.perf_counter()
        model.fit(cfg.train.epochs, train, valid, valid_frequency=cfg.train.valid_frequency,
                  callbacks=callbacks + [metrics], dataset_sink_mode=cfg.train.sink_mode,
                  sink_size=cfg.train.sink_size)
        seconds = time.perf_counter() - start
        last = metrics.last
        scores = {k: v for k, v in last.items() if k not in ("epoch", "step", "seconds")}
        checkpoint = callbacks[0].latest_ckpt_file_name
        versions, versions_words = published(callbacks)
        result = {"run_dir": run_dir.path, "epochs": last.get("epoch"), "steps": last.get("step"),
                  "seconds": round(seconds, 3), "metrics": scores, "checkpoint": checkpoint, "published": versions}
        line = (f"recstream train: {last.get('epoch')} epochs, {last.get('step')} steps in {seconds:.1f} s: "
                f"{summary(scores)}; run directory {run_dir.path}, checkpoint {os.path.basename(checkpoint)}"
                f"{versions_words}")
        log.info("%s", line)
        return emit(args, result, line)
