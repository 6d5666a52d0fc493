"""`recstream online CONFIG.yaml`: train the config's model on ``stream:`` with `RecModel.online_train`.

Resumes from ``<run_dir>/checkpoints`` (network, optimizer and the stream position) when a
checkpoint is there; trains each batch as steps of ``stream.micro_batch_size`` rows when that is
set; reports prequential (test-then-train) AUC and log loss every
``callbacks.prequential.log_every`` steps into metrics.csv/.jsonl; publishes model versions for
``recstream serve`` with ``publish:``; stops when the stream ends (``stream.idle_timeout``,
``stream.max_batches``; a rerun with nothing new trains 0 steps and writes nothing), exit status
0, or on Ctrl-C / SIGTERM: the current step finishes, the final checkpoint (and version) is
written, the result printed, and the exit status is 130 / 143 (a supervisor sees that the run
was stopped, not finished; the next run resumes there).
"""
from __future__ import annotations

import logging
import os
import signal
import sys
import time

from .errors import EXIT_INTERRUPTED, EXIT_TERMINATED
from .run_command import add_config_parser, emit, load, no_arrow_cancel, published, setup_torch, summary

log = logging.getLogger("recstream.cli")
DESCRIPTION = """Train the config's model online on stream: (a directory of arriving files or a Kafka topic).

Resumes from <run_dir>/checkpoints with the stream position; reports prequential
(test-then-train) AUC and log loss into metrics.csv/.jsonl; publishes model versions for
recstream serve (publish:); stops when the stream ends (stream.idle_timeout,
stream.max_batches), or cleanly on Ctrl-C/SIGTERM: the final checkpoint is written, then
it exits 130/143. A run_dir that holds an earlier run but no checkpoint is refused
unless --overwrite is given. Reference: docs/cli.md."""
STOPPED = {signal.SIGINT: ("interrupted", EXIT_INTERRUPTED), signal.SIGTERM: ("terminated", EXIT_TERMINATED)}


def _end_recorder():
    from ..callbacks import Callback

    class TrainEnd(Callback):
        """Keeps the last step, its stream position (the checkpoint's: ``stream.position()`` after training
        may include batches read ahead but never trained) and the signal that stopped training
        (``cb_params.stop_signal``, set by the trainer's StopOnSignal), if one did."""

        step = position = signum = None

        def on_train_end(self, run_context):
            p = run_context.original_args()
            self.step, self.position, self.signum = p.cur_step_num, p.train_position, p.stop_signal

    return TrainEnd()


def add_parser(sub) -> None:
    add_config_parser(sub, "online", "train a model online on a stream, from a config file", DESCRIPTION, run,
                      overwrite=True)


def run(args) -> int:
    cfg, doc = load(args, ("stream",))
    from ..callbacks import PrequentialMonitor
    from ..callbacks.checkpointed import saved_state
    from .build import build_callbacks, build_model, build_schema, build_stream, kafka_client
    if cfg.stream.kafka is not None:
        kafka_client(doc)  # a missing extra is a config mistake: found before the run directory is made
    setup_torch(cfg)
    from .run_dir import RunDirectory
    from .run_log import MetricsLog
    run_dir = RunDirectory(cfg.run_dir, "online", args.config, doc)
    if not args.overwrite:
        run_dir.check_new(doc, resumable=True)
    with run_dir:
        schema = build_schema(cfg, doc)
        model, net = build_model(cfg, doc, schema, online=True)
        stream = build_stream(cfg, doc, schema, run_dir.path)
        try:
            meta = model.restore(os.path.join(run_dir.path, "checkpoints"), stream)
            if meta is not None:
                log.info("resumed from step %s at %s", meta.get("cur_step_num"), meta.get("train_position"))
                # a human line: on stdout, or beside the human result line on stderr with --json
                print(f"recstream online: resumed from step {meta.get('cur_step_num')}",
                      file=sys.stderr if args.json else sys.stdout, flush=True)
            # a resumed run continues the series (steps are global online: no offset), never model_1-*
            callbacks = build_callbacks(cfg, doc, run_dir.path, online=True, schema=schema,
                                        resume_step=0 if meta is not None else None)
            metrics, end = MetricsLog(run_dir.path, online=True, append=meta is not None), _end_recorder()
            if meta is not None:  # the event axis, the totals and the time go on from the earlier run's
                counted = saved_state(meta, PrequentialMonitor.checkpoint_key) is not None
                metrics.continue_online(int(meta.get("cur_step_num") or 0), counts_restored=counted)
            start = time.perf_counter()
            no_arrow_cancel()
            model.online_train(stream, callbacks=callbacks + [metrics, end], dataset_sink_mode=cfg.train.sink_mode,
                               sink_size=cfg.train.sink_size if cfg.train.sink_size > 0 else 1,
                               micro_batch_size=cfg.stream.micro_batch_size)
            seconds = time.perf_counter() - start
        finally:
            stream.close()
        return _report(args, run_dir.path, meta, callbacks, metrics.last, end, seconds)


def _report(args, run_dir: str, meta: dict | None, callbacks: list, last: dict, end, seconds: float) -> int:
    """Print the result; the exit status: 0, or 130 / 143 after a stop by SIGINT / SIGTERM."""
    first = int(meta.get("cur_step_num") or 0) if meta else 0
    trained = end.step is not None and end.step > first
    steps = end.step if trained else first
    # without a step trained, the last metrics row is an earlier run's: not this run's result
    scores = {k: v for k, v in last.items() if k not in ("step", "seconds")} if trained else {}
    checkpoint = callbacks[0].latest_ckpt_file_name or None  # None: nothing trained, nothing saved
    versions, versions_words = published(callbacks)
    result = {"run_dir": run_dir, "resumed_from_step": first if meta else None, "steps": steps,
              "new_steps": steps - first, "seconds": round(seconds, 3), "metrics": scores, "checkpoint": checkpoint,
              "position": end.position if trained else (meta or {}).get("train_position"), "published": versions}
    saved = f"checkpoint {os.path.basename(checkpoint)}" if checkpoint else "no new checkpoint (no step trained)"
    if trained or end.signum in STOPPED:
        done = f"steps {first}..{steps} in {seconds:.1f} s" + (f": prequential {summary(scores)}" if scores else "")
    else:  # the stream ended before its first batch: a scheduled rerun found no new event
        done = f"nothing new: 0 steps (still at step {first}) in {seconds:.1f} s"
    line = f"recstream online: {done}; run directory {run_dir}, {saved}{versions_words}"
    log.info("%s", line)
    if end.signum not in STOPPED:
        return emit(args, result, line)
    word, code = STOPPED[end.signum]
    emit(args, result, line, status=word)
    message = (f"recstream online: {word} ({signal.Signals(end.signum).name}): stopped cleanly after step {steps}"
               f"{', final checkpoint written' if checkpoint else ''}; the same command resumes there")
    log.info("%s", message)
    print(message, file=sys.stderr, flush=True)
    return code
