"""RunDirectory: where one config-driven run keeps everything it writes.

Layout (``run_dir:`` of the config)::

    config.yaml          the config as given (train, online; eval writes eval.config.yaml)
    train.log            the run's log (online.log, eval.log): settings, one line per metric row, the result
    metrics.jsonl/.csv   one row per epoch (train) or prequential report (online)
    eval.jsonl/.csv      one row per `recstream eval`
    checkpoints/         ModelCheckpoint files (model-*.safetensors)
    published/           model versions for serving, with publish: (unless publish.directory is elsewhere)
    tensorboard/         TensorBoard events, when callbacks.tensorboard is set

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

from .config_file import ConfigError


class RunDirectory:
    """Create the run directory, copy the config into it, and log to ``<command>.log`` while open."""

    def __init__(self, path: str, command: str, config_path: str, doc=None) -> None:
        if os.path.exists(path) and not os.path.isdir(path):
            where = f"{doc.path}:{doc.line(('run_dir',))}: " if doc is not None else ""
            raise ConfigError(f"{where}run_dir: got {path!r}; must be a directory (or a path to create), it is a file")
        self.path, self.command = path, command
        self.config_path = config_path
        self._handlers: list[logging.Handler] = []

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
