"""`recstream online CONFIG.yaml`: train the config's model on ``stream:`` with `RecModel.online_train`.

Resumes from ``<run_dir>/checkpoints`` (network, optimizer and the stream position) when a
checkpoint is there; reports prequential (test-then-train) AUC and log loss every
``callbacks.prequential.log_every`` steps into metrics.csv/.jsonl; stops when the stream ends
(``stream.idle_timeout``, ``stream.max_batches``) or on Ctrl-C / SIGTERM, after writing the
final checkpoint.
"""
from __future__ import annotations

import logging
import os
import time

from .config_cmd import add_config_parser, emit, load, setup_torch, summary

log = logging.getLogger("recstream.cli")
DESCRIPTION = """Train the config's model online on stream: (a directory of arriving files or a Kafka topic).

Resumes from <run_dir>/checkpoints with the stream position; reports prequential
(test-then-train) AUC and log loss into metrics.csv/.jsonl; stops when the stream ends
(stream.idle_timeout, stream.max_batches) or cleanly on Ctrl-C/SIGTERM, writing a final
checkpoint. Reference: docs/cli.md."""


def add_parser(sub) -> None:
    add_config_parser(sub, "online", "train a model online on a stream, from a config file", DESCRIPTION, run)


def run(args) -> int:
    cfg, doc = load(args, ("stream",))
    setup_torch(cfg)
    from .build import build_callbacks, build_model, build_schema, build_stream
    from .metrics_log import MetricsLog
    from .run_dir import RunDirectory
    with RunDirectory(cfg.run_dir, "online", args.config, doc) as run_dir:
        schema = build_schema(cfg, doc)
        model, net = build_model(cfg, doc, schema, online=True)
        stream = build_stream(cfg, doc, schema, run_dir.path)
        try:
            meta = model.restore(os.path.join(run_dir.path, "checkpoints"), stream)
            if meta is not None:
                log.info("resumed from step %s at %s", meta.get("cur_step_num"), meta.get("train_position"))
            callbacks = build_callbacks(cfg, doc, run_dir.path, online=True)
            metrics = MetricsLog(run_dir.path, online=True, append=meta is not None)
            start = time.perf_counter()
            model.online_train(stream, callbacks=callbacks + [metrics], dataset_sink_mode=cfg.train.sink_mode,
                               sink_size=cfg.train.sink_size if cfg.train.sink_size > 0 else 1)
            seconds = time.perf_counter() - start
            position = stream.position()
        finally:
            stream.close()
        last = metrics.last
        scores = {k: v for k, v in last.items() if k not in ("step", "seconds")}
        checkpoint = callbacks[0].latest_ckpt_file_name
        first = int(meta.get("cur_step_num") or 0) if meta else 0
        result = {"run_dir": run_dir.path, "resumed_from_step": first if meta else None, "steps": last.get("step"),
                  "seconds": round(seconds, 3), "metrics": scores, "checkpoint": checkpoint,
                  "position": position}
        line = (f"recstream online: steps {first}..{last.get('step')} in {seconds:.1f} s: prequential "
                f"{summary(scores)}; run directory {run_dir.path}, checkpoint {os.path.basename(checkpoint)}")
        log.info("%s", line)
        return emit(args, result, line)
