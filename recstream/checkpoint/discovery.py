"""Finding the checkpoint to resume from: the newest one in a directory that loads.

`load_newest(checkpoint, network, optimizer)` takes a checkpoint file, one sharded checkpoint
directory, or a directory of checkpoints (what `ModelCheckpoint` writes into), and loads the
newest that loads:

- one-file checkpoints (``*.safetensors``, hidden temporary files excluded) newest first by
  modification time; a truncated, corrupt, foreign or unverifiable file (`CheckpointError`) is
  skipped with a warning and the next older one is tried;
- when the directory holds complete sharded checkpoints (hybrid_parallel), those instead, newest
  first, with the same fall-back (every rank lists the same directory and fails the same checks,
  so the ranks fall back together);
- nothing there yet (a first run): None; files but none loads: `CheckpointError`.

A sharded checkpoint returns this rank's ``extra``, or rank 0's when it was written by a
different number of ranks (online training stores every rank's position in each).

>>> import os, tempfile, torch
>>> from recstream.checkpoint import save_checkpoint
>>> d = tempfile.mkdtemp()
>>> _ = save_checkpoint(os.path.join(d, "a-1_1.safetensors"), torch.nn.Linear(2, 1), extra={"epoch": 1})
>>> path, meta = load_newest(d, torch.nn.Linear(2, 1), None)
>>> os.path.basename(path), meta["epoch"]
('a-1_1.safetensors', 1)
>>> load_newest(os.path.join(d, "nothing-yet"), torch.nn.Linear(2, 1), None) is None
True
"""
from __future__ import annotations

import glob
import logging
import os

from ..distributed import rank, world_size
from .file_format import CheckpointError, CheckpointMismatch, load_checkpoint
from .sharded import is_complete, load_sharded

__all__ = ["load_newest"]

log = logging.getLogger("recstream.checkpoint")


def load_newest(checkpoint, network, optimizer) -> tuple[str, dict] | None:
    """Load the newest checkpoint that loads into `network` / `optimizer`; ``(path, metadata)``,
    or None when there is no checkpoint yet (see the module docstring)."""
    checkpoint = os.fspath(checkpoint)
    if os.path.isfile(checkpoint):
        return checkpoint, load_checkpoint(checkpoint, network, optimizer)
    if is_complete(checkpoint):  # one sharded checkpoint (hybrid_parallel), on any number of ranks
        return checkpoint, _load_sharded(checkpoint, network, optimizer)
    if not os.path.exists(checkpoint):  # a first run: nothing to resume from yet
        log.warning("no checkpoint at %r yet: starting from the initial weights", checkpoint)
        return None
    if not os.path.isdir(checkpoint):
        raise ValueError(f"'checkpoint' {checkpoint!r} is neither a checkpoint file nor a directory")
    sharded = [d for d in glob.glob(os.path.join(checkpoint, "*")) if is_complete(d)]
    if sharded:  # written by ModelCheckpoint under hybrid_parallel
        return _first_that_loads(checkpoint, sharded, lambda p: _load_sharded(p, network, optimizer))
    files = [f for f in glob.glob(os.path.join(checkpoint, "*.safetensors")) if not os.path.basename(f).startswith(".")]
    return _first_that_loads(checkpoint, files, lambda p: load_checkpoint(p, network, optimizer))


def _first_that_loads(directory: str, paths: list[str], load) -> tuple[str, dict] | None:
    failures: list[tuple[str, Exception]] = []
    for path in sorted(paths, key=lambda p: (_mtime(p), p), reverse=True):
        try:
            return path, load(path)
        except (CheckpointError, FileNotFoundError) as e:
            if not isinstance(e, CheckpointMismatch):  # damage is worth a line per file; another model is not
                log.warning("skipping checkpoint %s: %s", path, e)
            failures.append((os.path.basename(path), e))
    if failures and all(isinstance(e, CheckpointMismatch) for _, e in failures):
        name, e = failures[0]
        raise CheckpointMismatch(f"no checkpoint in {directory!r} fits this model: its {len(failures)} checkpoint(s) "
                                 f"were written by another model (the newest, {name}: {_reason(e)}); "
                                 "give another directory, or this model's checkpoint file")
    if failures:
        raise CheckpointError(f"no checkpoint in {directory!r} loads: " +
                              "; ".join(f"{name}: {e}" for name, e in failures[:5]))
    return None


def _reason(e: Exception) -> str:
    """The error's message without load_checkpoint's prefix naming the file (named already)."""
    text = str(e).splitlines()[0]
    return text.split("': ", 1)[1] if text.startswith("load_checkpoint: '") and "': " in text else text


def _load_sharded(path: str, network, optimizer) -> dict:
    """Load a sharded checkpoint (collective); this rank's metadata, or rank 0's when the
    checkpoint was written by a different number of ranks."""
    extras = load_sharded(path, network, optimizer)
    return extras[rank()] if len(extras) == world_size() else extras[0]


def _mtime(path: str) -> float:
    try:
        return os.path.getmtime(path)
    except FileNotFoundError:  # removed meanwhile (pruned by a writer): tried last, then skipped
        return float("-inf")
