"""`recstream train CONFIG.yaml`: train the config's model on ``data.train`` with `Model.fit`.

Evaluates ``data.eval`` (when given) every ``train.valid_frequency`` epochs, and writes the run
directory (``run_dir``: config copy, train.log, metrics.csv/.jsonl with one row per epoch,
checkpoints/, best/, tensorboard/). Prints one line per epoch (stderr) and the result (stdout);
every loss it reports is a mean (`run_log`). A run directory that holds a run is continued with
``--resume`` (`resume_point`) or set aside with ``--new``; Ctrl-C names the checkpoint written and
the command that resumes. The config reference is docs/cli.md.
"""
from __future__ import annotations

import logging
import os
import shlex
import signal
import sys
import time
from dataclasses import dataclass

from .errors import EXIT_INTERRUPTED, EXIT_TERMINATED, EXIT_USAGE, CliError
from .run_command import add_config_parser, emit, load, no_arrow_cancel, published, setup_torch, summary

log = logging.getLogger("recstream.cli")
STOPPED = {signal.SIGINT: ("interrupted", EXIT_INTERRUPTED), signal.SIGTERM: ("terminated", EXIT_TERMINATED)}
DESCRIPTION = """Train the config's model on data.train (Model.fit), evaluating data.eval.

Writes the run directory (run_dir): a copy of the config, train.log, metrics.csv and
metrics.jsonl (one row per epoch: loss is the epoch's mean training loss, eval_loss and
logloss the whole evaluation set's), checkpoints/ (the last one always), best/ (the best
epoch's checkpoint under callbacks.early_stopping's monitor) and tensorboard/ (when
callbacks.tensorboard is set). A run_dir that holds an earlier run (metrics, checkpoints,
another config.yaml) is refused unless --resume (continue it from its newest checkpoint)
or --new (its files move into run_dir/earlier-TIME/) is given. Ctrl-C stops after the
current step: the checkpoint written and the command that resumes are printed (exit 130).
A mistake in the config is one line naming the field, the value, what is allowed and
file:line (exit status 2). Reference: docs/cli.md."""


def add_parser(sub) -> None:
    p = add_config_parser(sub, "train", "train a model from a config file", DESCRIPTION, run,
                          overwrite="the same as --new (its older name)")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--resume", action="store_true", help="continue the run in run_dir from its newest checkpoint "
                     "(at the epoch after it; metrics.csv goes on)")
    how.add_argument("--new", action="store_true", help="start again in a run_dir that holds a run: its files "
                     "move into run_dir/earlier-TIME/ (--overwrite: the same)")
    p.set_defaults(resume=False, new=False)


@dataclass
class ResumePoint:
    """Where a resumed run starts: the checkpoint loaded, the epochs completed (training runs
    ``epochs_done+1 ..``) and the global step after them, and whether the checkpoint was written
    inside an epoch (that epoch then runs again from its start, on the checkpoint's weights)."""

    path: str
    epochs_done: int
    step: int
    mid_epoch: bool

    def words(self) -> str:
        name = os.path.basename(self.path)
        if self.mid_epoch:
            return (f"resumed from {name}, written inside epoch {self.epochs_done + 1}: that epoch runs again "
                    "from its start on these weights")
        return f"resumed from {name} (end of epoch {self.epochs_done}, step {self.step})"


def resume_point(checkpoints: str, net, optimizer, rows: list[dict]) -> ResumePoint | None:
    """Load the newest checkpoint of `checkpoints` that loads into `net`/`optimizer`; None if none.
    `rows`: the run's metrics rows, one per completed epoch (``epoch``, global ``step``): the
    checkpoint ends its epoch when that epoch's row has the checkpoint's step."""
    from ..checkpoint.discovery import load_newest
    if not os.path.isdir(checkpoints) or not os.listdir(checkpoints):
        return None
    found = load_newest(checkpoints, net, optimizer)
    if found is None:
        return None
    path, meta = found
    epoch, step = int(meta.get("epoch") or 0), int(meta.get("cur_step_num") or 0)
    steps = {row.get("epoch"): row.get("step") for row in rows}
    if steps.get(epoch) == step:
        return ResumePoint(path, epoch, step, False)
    return ResumePoint(path, epoch - 1, int(steps.get(epoch - 1) or 0), True)


def resume_command(args) -> str:
    """The command line that resumes this run."""
    return f"recstream train {shlex.quote(args.config)} --resume"


def run(args) -> int:
    started = time.perf_counter()  # the command's time: torch's import and the data's loading included
    from ..train.signals import StopOnSignal
    cfg, doc = load(args, ("data", "train"))
    setup_torch(cfg)
    from .build import build_callbacks, build_model, build_reader, build_schema
    from .run_dir import RunDirectory
    from .run_log import MetricsLog
    run_dir = RunDirectory(cfg.run_dir, "train", args.config, doc)
    aside = None
    if args.resume and args.overwrite:
        raise CliError("--resume and --overwrite: give one (--overwrite starts the run again, as --new)", EXIT_USAGE)
    if args.new or args.overwrite:
        aside = run_dir.set_aside()
    elif not args.resume:
        run_dir.check_new(doc)
    with run_dir:
        if aside:
            log.info("the earlier run's files moved into %s", aside)
        schema = build_schema(cfg, doc)
        train = build_reader(cfg, doc, "train", schema)
        if cfg.train.sink_mode and cfg.train.sink_size == -1 and train.get_dataset_size() is None:
            raise doc.error(("train", "sink_size"), -1, f"a {cfg.data.train.format} reader cannot count its batches "
                            "ahead, so one sink per epoch is unknown: set sink_size >= 1 or sink_mode: false")
        valid = build_reader(cfg, doc, "eval", schema) if cfg.data.eval is not None else None
        model, net = build_model(cfg, doc, schema)
        metrics = MetricsLog(run_dir.path, append=args.resume, echo=sys.stderr)
        point = _resume(args, cfg, run_dir, net, model, metrics)
        callbacks = build_callbacks(cfg, doc, run_dir.path, online=False, schema=schema,
                                    resume_step=point.step if point else None)
        before, after = _run_callbacks(cfg, run_dir, callbacks, metrics)
        first = point.epochs_done if point else 0
        log.info("train %s: %s on %s, epochs %d..%d", args.config, type(net).__name__, train, first + 1,
                 cfg.train.epochs)
        stopper = StopOnSignal()  # Ctrl-C / SIGTERM: the step finishes, the final checkpoint is written
        no_arrow_cancel()
        try:
            model.fit(cfg.train.epochs, train, valid, valid_frequency=cfg.train.valid_frequency,
                      callbacks=before + callbacks + after + [stopper], dataset_sink_mode=cfg.train.sink_mode,
                      sink_size=cfg.train.sink_size, initial_epoch=first)
        except KeyboardInterrupt as e:  # a second Ctrl-C: at once, the last periodic checkpoint stands
            return _stopped(args, e.args[0] if e.args else "interrupted", getattr(e, "code", EXIT_INTERRUPTED),
                            callbacks[0], metrics)
        if stopper.received is not None:
            word, code = STOPPED.get(stopper.received, ("interrupted", EXIT_INTERRUPTED))
            return _stopped(args, word, code, callbacks[0], metrics)
        return _result(args, run_dir, callbacks, metrics, time.perf_counter() - started)


def _resume(args, cfg, run_dir, net, model, metrics):
    """``--resume``: the newest checkpoint loaded (`resume_point`) and the metrics rows after it
    dropped, or a usage error saying why not."""
    if not args.resume:
        return None
    optimizer = getattr(model.train_network, "optimizer", None)  # the training cell's (build_model's)
    point = resume_point(run_dir.file("checkpoints"), net, optimizer, metrics.rows)
    if point is None:
        raise CliError(f"--resume: {run_dir.file('checkpoints')} holds no checkpoint to resume from (start the run "
                       f"without --resume)", EXIT_USAGE)
    if point.epochs_done >= cfg.train.epochs:
        raise CliError(f"--resume: {os.path.basename(point.path)} completed epoch {point.epochs_done} of "
                       f"train.epochs: {cfg.train.epochs}; nothing is left to train (raise train.epochs to go on)",
                       EXIT_USAGE)
    metrics.continue_after(point.epochs_done)
    print(f"recstream train: {point.words()}", file=sys.stderr, flush=True)
    log.info("%s", point.words())
    return point


def _run_callbacks(cfg, run_dir, callbacks, metrics) -> tuple[list, list]:
    """The CLI's own callbacks, to run before the config's (the evaluation's mean loss) and after
    them: the best checkpoint, the metrics rows (and the line per epoch), and a progress bar on a
    terminal that leaves no line behind."""
    from ..callbacks import EarlyStopping
    from ..callbacks.progress_bar import ProgressBar, progress_bar_default
    from .run_log import BestCheckpoint, EvalLossMean
    extra: list = [EvalLossMean()]
    stop = next((cb for cb in callbacks if isinstance(cb, EarlyStopping)), None)
    if stop is not None and cfg.data.eval is not None:
        extra.append(BestCheckpoint(run_dir.file("best"), stop.monitor, stop.mode, metrics))
    extra.append(metrics)
    if progress_bar_default():
        extra.append(ProgressBar(leave=False))
    # EvalLossMean first: EarlyStopping and the loggers then see the whole evaluation set's loss
    return extra[:1], extra[1:]


def _stopped(args, word: str, code: int, checkpoint, metrics) -> int:
    """Stopped by a signal: name the checkpoint written and the command that resumes; exit 130 / 143."""
    last = checkpoint.latest_ckpt_file_name
    saved = f"checkpoint {last} written" if last else "no checkpoint was written (a new run starts from scratch)"
    done = metrics.last.get("epoch")
    if isinstance(done, int) and metrics.final_step == metrics.last.get("step"):
        where = f"after epoch {done}"  # the signal came between two epochs
    else:
        where = f"in epoch {done + 1}" if isinstance(done, int) else "in the first epoch"
    lines = [f"recstream train: {word} {where}; {saved}"]
    if last:
        lines.append(f"recstream train: resume with: {resume_command(args)}")
    for line in lines:
        log.info("%s", line)
        print(line, file=sys.stderr, flush=True)
    return code


def _result(args, run_dir, callbacks, metrics, seconds: float) -> int:
    last = metrics.last
    scores = {k: v for k, v in last.items() if k not in ("epoch", "step", "seconds")}
    checkpoint = callbacks[0].latest_ckpt_file_name
    versions, versions_words = published(callbacks)
    result = {"run_dir": run_dir.path, "epochs": last.get("epoch"), "steps": last.get("step"),
              "seconds": round(seconds, 3), "metrics": scores, "checkpoint": checkpoint, "published": versions}
    line = (f"recstream train: {last.get('epoch')} epochs, {last.get('step')} steps, {seconds:.1f} s in all: "
            f"{summary(scores)}; run directory {run_dir.path}, checkpoint {os.path.basename(checkpoint)}"
            f"{versions_words}")
    log.info("%s", line)
    return emit(args, result, line)
