"""ModelCheckpoint: save the network, optimizer and RNG states during training (MindSpore's rules).

Files are named ``{prefix}-{epoch}_{step_in_epoch}.safetensors`` in `directory`. If files with
this prefix already exist there when the callback is created, the prefix becomes
``{prefix}_1``, ``{prefix}_2``, ... (as MindSpore), so a new run never overwrites or prunes the
files of an earlier one; ``continue_from_step=N`` (a run that resumes the earlier one at its
global step N, as ``recstream train --resume``) keeps `prefix` instead, counts the steps in names
and files from N, and ``keep_checkpoint_max`` then counts the earlier run's files of the series too.
Online training (`RecModel.online_train`) is one endless pass: its files are named
``{prefix}-1_{step}`` (``model-1_257`` after step 257).

Each file also holds the state of the run's callbacks that keep one (a ``checkpoint_key``, e.g.
`PrequentialMonitor`'s whole-stream totals), taken at the step end it is written at, so that it
describes the same events as the weights and the stream position (`recstream.callbacks.checkpointed`).

A save happens when ``save_checkpoint_steps`` global steps passed since
the last one (in sink mode step hooks run once per sink, so saves land on sink boundaries) or
``save_checkpoint_seconds`` elapsed, and once more at the end of training if the last step was
not saved. Old files beyond ``keep_checkpoint_max`` are deleted, oldest first. With
``exception_save``, an exception during training writes ``{prefix}-{epoch}_{step}_breakpoint.safetensors``.

Resume: ``meta = load_checkpoint(path, net, opt)`` then ``model.train(epochs, data,
initial_epoch=meta["epoch"])``; this continues exactly as an uninterrupted run when the file was
written at the end of an epoch.

>>> import tempfile
>>> cb = ModelCheckpoint(prefix="ctr", directory=tempfile.mkdtemp(),
...                      config=CheckpointConfig(save_checkpoint_steps=1000, keep_checkpoint_max=3))
>>> cb.latest_ckpt_file_name
''
"""
from __future__ import annotations

import os
import warnings
from time import monotonic as _monotonic

import torch
from safetensors import SafetensorError

from ..checkpoint import save_checkpoint, save_sharded
from ..checkpoint.naming import SUFFIX, checkpoint_name, series_files, series_pattern, unique_prefix
from ..checkpoint.retention import prune, remove_leftovers
from ..distributed import parallel_mode, rank
from ..validation import check_int, check_str, check_type
from .base import Callback
from .checkpoint_config import CheckpointConfig
from .checkpointed import CHECKPOINT_ENTRY, callback_states
from .divergence import check_finite_model

__all__ = ["ModelCheckpoint", "SUFFIX"]


def _sharded() -> bool:
    """Under hybrid_parallel a checkpoint is a directory that every rank writes its rows into
    (`recstream.checkpoint.save_sharded`); otherwise one safetensors file."""
    return parallel_mode() == "hybrid_parallel"


class ModelCheckpoint(Callback):
    """Save checkpoints during training; see the module docstring. `latest_ckpt_file_name`: last file written."""

    called_in_fit_eval = False

    @property
    def rank_zero_only(self) -> bool:
        """Replicated weights are written by rank 0 alone; row-sharded tables (hybrid_parallel) by
        every rank together, each its own rows, into one checkpoint directory."""
        return not _sharded()

    def __init__(self, prefix: str = "CKP", directory: str | os.PathLike | None = None,
                 config: CheckpointConfig | None = None, *, continue_from_step: int | None = None):
        owner = "ModelCheckpoint"
        check_str(owner, "prefix", prefix)
        if "/" in prefix or os.sep in prefix:
            raise ValueError(f"{owner}: 'prefix' must be a non-empty str without path separators, got {prefix!r}")
        check_type(owner, "directory", directory, (str, os.PathLike), allowed="a path", allow_none=True)
        config = CheckpointConfig() if config is None else check_type(owner, "config", config, CheckpointConfig)
        self._directory = os.path.abspath(os.fspath(directory) if directory is not None else os.getcwd())
        os.makedirs(self._directory, exist_ok=True)
        self._config = config
        self._exception_prefix = prefix
        self._step_offset = check_int(owner, "continue_from_step", continue_from_step, minimum=0, allow_none=True)
        self._continue = self._step_offset is not None
        self._step_offset = self._step_offset or 0
        self._prefix = prefix if self._continue else unique_prefix(self._directory, prefix, _sharded())
        self._append = dict(config.append_dict or {})
        self._append_epoch_num = self._append.get("epoch_num", 0)
        self._append_step_num = self._append.get("step_num", 0)
        self._latest_ckpt_file_name = ""
        self._last_triggered_step = self._begin_step = 0
        self._last_time = _monotonic()
        self._last_time_for_keep = _monotonic()
        self._params = None
        self._series = False

    @property
    def latest_ckpt_file_name(self) -> str:
        return self._latest_ckpt_file_name

    @property
    def prefix(self) -> str:
        return self._prefix

    @property
    def directory(self) -> str:
        return self._directory

    def on_train_begin(self, run_context):
        p = run_context.original_args()
        self._params = p
        # online training continues across restarts: the files of earlier runs (the same prefix
        # with any _N suffix) are the same series, and keep_checkpoint_max counts them all
        self._series = bool(p.get("online")) or self._continue
        # A reused callback starts counting again: the loop restarts cur_step_num at 0 each run
        # (a resumed online run restarts at its checkpoint's step, which is saved already).
        self._last_triggered_step = self._begin_step = p.cur_step_num or 0
        self._last_time = _monotonic()

    def on_train_step_end(self, run_context):
        p = run_context.original_args()
        if p.cur_step_num and p.cur_step_num == self._begin_step == self._last_triggered_step:
            # Only a callback driven by hand reports the begin step again at a step end (the loop has
            # trained a step by then): it counts absolute steps, from 0, as MindSpore's does.
            self._last_triggered_step = 0
        self._save(p, force=False)

    def on_train_end(self, run_context):
        self._save(run_context.original_args(), force=True)

    def __exit__(self, exc_type, exc, tb):
        p = self._params
        self._params = None
        if exc_type is None or not self._config.exception_save or p is None or p.cur_epoch_num is None:
            return None
        if p.get("partial_batch"):  # online micro-steps stopped inside a batch: no position describes the weights
            warnings.warn("ModelCheckpoint: no exception checkpoint: the weights hold part of a batch (its micro-steps "
                          "were interrupted), which no stream position describes; the last periodic checkpoint "
                          "stands", RuntimeWarning, stacklevel=2)
            return None
        if _sharded():  # a save is a collective, and after a failure the other ranks may never join it
            warnings.warn("ModelCheckpoint: no exception checkpoint under hybrid_parallel (saving sharded "
                          "tables needs every rank); the last periodic checkpoint stands", RuntimeWarning,
                          stacklevel=2)
            return None
        try:  # never let a failing rescue save hide the original exception
            name = f"{self._exception_prefix}-{p.cur_epoch_num}_{self._step_in_epoch(p)}_breakpoint{SUFFIX}"
            # no callback states: the batch that raised may have been observed (scored) but not trained
            self._write(p, os.path.join(self._directory, name), with_callbacks=False)
        except Exception as e:  # noqa: BLE001 - reported, then the original exception propagates
            warnings.warn(f"ModelCheckpoint: could not save the exception checkpoint: {e}", RuntimeWarning,
                          stacklevel=2)
        return None

    # ------------------------------------------------------------------ internals
    def _step_in_epoch(self, p) -> int:
        step = p.cur_step_num or 0
        if isinstance(p.batch_num, int) and p.batch_num > 0 and step > 0:
            return (step - 1) % p.batch_num + 1
        return self._step_offset + step

    def _name_numbers(self, p) -> tuple[int, int]:
        """The epoch and step a file's name shows. Online training is one endless pass whose epochs
        are sinks (and a sink that found no data counts one too): its names show that pass and the
        step, ``model-1_257`` for step 257 (the file's metadata keeps the loop's own epoch)."""
        if p.get("online"):
            return 1, self._step_offset + (p.cur_step_num or 0)
        return p.cur_epoch_num, self._step_in_epoch(p)

    def _due(self, p, force: bool) -> bool:
        steps, seconds = self._config.save_checkpoint_steps, self._config.save_checkpoint_seconds
        if force:  # end of training: always keep the final state
            self._last_time = _monotonic()
            return True
        if steps:
            return p.cur_step_num >= self._last_triggered_step + steps
        if seconds:
            now = _monotonic()
            if now - self._last_time > seconds:
                self._last_time = now
                return True
        return False

    def _save(self, p, force: bool) -> None:
        if p.cur_step_num is None or p.cur_step_num == self._last_triggered_step:
            return  # nothing trained since the last save (e.g. the final save right after a periodic one)
        if not self._due(p, force):
            return
        name = checkpoint_name(self._prefix, *self._name_numbers(p), _sharded())
        path = os.path.join(self._directory, name)
        # Write first, prune after: a failed write must not cost an old checkpoint.
        try:
            self._write(p, path)
        except (OSError, SafetensorError) as e:  # a full disk, an unwritable directory, a size limit
            # (safetensors reports its own I/O failures as SafetensorError, not OSError)
            last = self._latest_ckpt_file_name or "none yet"
            raise OSError(getattr(e, "errno", None), f"ModelCheckpoint: could not write checkpoint {path!r}: "
                          f"{getattr(e, 'strerror', None) or e}; nothing was replaced "
                          f"(last good checkpoint: {last})") from e
        if rank() == 0:  # one rank prunes the shared directory
            self._prune(path)
        self._last_triggered_step = p.cur_step_num
        self._last_time_for_keep = _monotonic()
        self._latest_ckpt_file_name = path
        p.latest_ckpt_file = path
        p.last_save_ckpt_step = p.cur_step_num
        # durable now (written, fsynced, renamed): the run's committer may commit this position
        p.checkpoint_position = p.get("train_position")

    def _write(self, p, path: str, with_callbacks: bool = True) -> None:
        # Explicit None checks: an empty nn.Sequential is falsy.
        network = next((n for n in (self._config.saved_network, p.network, p.train_network) if n is not None), None)
        if network is None:
            raise RuntimeError("ModelCheckpoint: run_context has no 'network' to save")
        optimizer = p.optimizer
        if optimizer is None:  # a custom step cell still usually carries its optimizer
            optimizer = getattr(p.train_network, "optimizer", None)
            optimizer = optimizer if isinstance(optimizer, torch.optim.Optimizer) else None
        extra = {"epoch": p.cur_epoch_num, "step_in_epoch": self._step_in_epoch(p),
                 "cur_step_num": self._step_offset + (p.cur_step_num or 0), "batch_num": p.batch_num}
        for key, value in self._append.items():
            if key == "epoch_num":
                value = self._append_epoch_num + (p.cur_epoch_num or 0)
            elif key == "step_num":
                value = self._append_step_num + (p.cur_step_num or 0)
            extra[key] = value
        if p.get("train_position") is not None:  # where the stream resumes: just after the last trained batch
            extra["train_position"] = p.train_position
        states = callback_states(p.get("list_callback") or ()) if with_callbacks and not _sharded() else {}
        if states:  # at a step end: the same events as the weights and the position (sharded extras are JSON only)
            extra[CHECKPOINT_ENTRY] = states
        # Divergence guard, last line: never write a state that diverged (the loss flag, then the weights).
        if p.get("loss_watch") is not None:
            p.loss_watch.check()
        check_finite_model(network, optimizer, what=f"checkpoint {path!r}", sharded=_sharded())
        if _sharded():  # every rank writes its rows and its own extra (e.g. its stream position)
            save_sharded(path, network, optimizer, extra=extra)
        else:
            save_checkpoint(path, network, optimizer, extra=extra, crc=self._config.crc_check)

    def _own_files(self) -> list[str]:
        """This run's periodic checkpoints, oldest first (breakpoint files and other prefixes
        excluded); in online training, those of earlier runs of the same prefix too."""
        pattern = series_pattern(self._exception_prefix, every_run=True) if self._series \
            else series_pattern(self._prefix, every_run=False)
        return series_files(self._directory, pattern, _sharded())

    def _prune(self, new_path: str) -> None:
        # what killed saves of this series (any run of the prefix) left, older than new_path
        remove_leftovers(self._directory, series_pattern(self._exception_prefix, every_run=True), new_path)
        older = [f for f in self._own_files() if f != new_path]
        keep_max, per_minutes = self._config.keep_checkpoint_max, self._config.keep_checkpoint_per_n_minutes
        # keep_checkpoint_per_n_minutes applies only while the last save is within the window
        if keep_max or _monotonic() - self._last_time_for_keep < per_minutes * 60:
            prune(older, keep_max, per_minutes)
