"""RunDirectory: where one config-driven run keeps everything it writes.

Layout (``run_dir:`` of the config)::

    config.yaml          the config as given (train, online; eval writes eval.config.yaml)
    train.log            the run's log (online.log, eval.log): settings, one line per metric row, the result
    metrics.jsonl/.csv   one row per epoch (train) or prequential report (online)
    eval.jsonl/.csv      one row per `recstream eval`
    checkpoints/         ModelCheckpoint files (model-*.safetensors)
    published/           model versions for serving, with publish: (unless publish.directory is elsewhere)
    tensorboard/         TensorBoard events, when callbacks.tensorboard is set

An earlier run is never written over silently (`check_new`): ``train`` refuses a run directory
that holds one (metrics rows, checkpoints, or the config.yaml of another config) unless given
``--resume`` (continue it from its newest checkpoint) or ``--new`` (`set_aside`: its files move
into ``earlier-<time>/``, so that one series of checkpoints and one metrics file stay per run;
``--overwrite`` is the older name of ``--new``); ``online`` refuses one that holds a run but no
checkpoint to resume from, unless ``--overwrite`` is given, and resumes in a run directory with
checkpoints; ``eval`` adds its files to the run it evaluates.

>>> import os, tempfile
>>> src = os.path.join(tempfile.mkdtemp(), "c.yaml"); _ = open(src, "w").write("run_dir: x\\n")
>>> with RunDirectory(os.path.join(os.path.dirname(src), "run"), "train", src) as run:
...     sorted(os.listdir(run.path))
['config.yaml', 'train.log']
"""
from __future__ import annotations

import logging
import os
import shutil
import time

from .config_document import ConfigError


class RunDirectory:
    """Create the run directory, copy the config into it, and log to ``<command>.log`` while open."""

    def __init__(self, path: str, command: str, config_path: str, doc=None) -> None:
        if os.path.exists(path) and not os.path.isdir(path):
            where = f"{doc.path}:{doc.line(('run_dir',))}: " if doc is not None else ""
            raise ConfigError(f"{where}run_dir: got {path!r}; must be a directory (or a path to create), it is a file")
        self.path, self.command = path, command
        self.config_path = config_path
        self._handlers: list[logging.Handler] = []

    def check_new(self, doc, *, resumable: bool = False) -> None:
        """Refuse (exit 2) a run directory that holds an earlier run (`earlier_run`), so that this run
        cannot replace its config.yaml and start its metrics again unnoticed; `resumable`: a directory
        with checkpoints is the run to continue (``online``)."""
        held = self.earlier_run()
        if not held or resumable and self._has_checkpoints():
            return
        where = f"{doc.path}:{doc.line(('run_dir',))}: " if doc is not None else ""
        if resumable:
            raise ConfigError(f"{where}run_dir: got {self.path!r}; it holds an earlier run ({', '.join(held)}); "
                              "recstream online resumes only from checkpoints, and it has none: give a new run_dir, "
                              "or --overwrite to run in it anyway (config.yaml is replaced, the metrics start again, "
                              "other files stay)")
        resume = "--resume to continue it from its newest checkpoint, " if self._has_checkpoints() else ""
        raise ConfigError(f"{where}run_dir: got {self.path!r}; it holds an earlier run ({', '.join(held)}): give "
                          f"{resume}--new to start again (the earlier run's files move into "
                          f"{self.path}/earlier-TIME/), or a new run_dir")

    RUN_FILES = ("metrics.jsonl", "metrics.csv", "checkpoints", "train.log", "eval.jsonl", "eval.csv", "best",
                 "tensorboard", "published", "config.yaml", "eval.config.yaml", "loss.png", "metrics.png",
                 "throughput.png")

    def set_aside(self) -> str | None:
        """Move the earlier run's files (`RUN_FILES` that exist) into ``earlier-<time>/`` of the run
        directory, for a new run (``--new``); its path, or None when there was nothing to move."""
        own = os.path.abspath(self.config_path)  # the config given may be the run directory's copy
        present = [name for name in self.RUN_FILES if os.path.lexists(self.file(name))
                   and os.path.abspath(self.file(name)) != own]
        if not present or not self.earlier_run():
            return None
        stamp = time.strftime("%Y%m%d-%H%M%S")
        target, n = self.file(f"earlier-{stamp}"), 1
        while os.path.lexists(target):
            n += 1
            target = self.file(f"earlier-{stamp}-{n}")
        os.makedirs(target)
        for name in present:
            os.replace(self.file(name), os.path.join(target, name))
        return target

    def earlier_run(self) -> list[str]:
        """What this directory holds that a run would write over: metrics rows, checkpoints, or a
        config.yaml other than this run's config (a run that trained nothing leaves only its own)."""
        held = []
        metrics = self.file("metrics.jsonl")
        if os.path.isfile(metrics) and os.path.getsize(metrics) > 0:
            held.append("metrics.jsonl")
        if self._has_checkpoints():
            held.append("checkpoints/")
        copy = self.file("config.yaml")
        if os.path.exists(copy) and os.path.abspath(copy) != os.path.abspath(self.config_path):
            with open(copy, "rb") as old, open(self.config_path, "rb") as new:
                if old.read() != new.read():
                    held.append("config.yaml of another config")
        return held

    def _has_checkpoints(self) -> bool:
        checkpoints = self.file("checkpoints")
        return os.path.isdir(checkpoints) and bool(os.listdir(checkpoints))

    def file(self, name: str) -> str:
        return os.path.join(self.path, name)

    def __enter__(self) -> RunDirectory:
        os.makedirs(self.path, exist_ok=True)
        copy = "eval.config.yaml" if self.command == "eval" else "config.yaml"
        if os.path.abspath(self.config_path) != os.path.abspath(self.file(copy)):
            shutil.copyfile(self.config_path, self.file(copy))
        to_file = logging.FileHandler(self.file(f"{self.command}.log"), encoding="utf-8")
        to_file.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        # a handler here replaces Python's last-resort one: warnings must still reach stderr
        to_stderr = logging.StreamHandler()
        to_stderr.setLevel(logging.WARNING)
        to_stderr.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        self._handlers = [to_file, to_stderr]
        root = logging.getLogger("recstream")
        for handler in self._handlers:
            root.addHandler(handler)
        if root.level == logging.NOTSET or root.level > logging.INFO:
            root.setLevel(logging.INFO)  # the library's INFO lines go to the file; stderr keeps WARNING+
        return self

    def __exit__(self, *exc) -> None:
        for handler in self._handlers:
            logging.getLogger("recstream").removeHandler(handler)
            handler.close()
        self._handlers = []
