"""Retention of a checkpoint directory: how many checkpoints are kept, and what a crashed save
left behind.

`prune(files, keep_max=..., per_minutes=...)`: of a series' files (oldest first, the one just
written excluded), keep the newest ``keep_max - 1`` (so ``keep_max`` with the new one), or of
those written in the last ``per_minutes`` only the oldest (MindSpore's rules).

A save killed mid-write leaves, beside the complete checkpoints:

- a hidden ``.<name>.<random>.tmp`` file (`atomic_write`'s temporary file; one-file checkpoints);
- a ``<name>.partial`` directory (a sharded save under hybrid_parallel, before rank 0 renamed it);
- a ``<name>.old`` directory (a sharded save replacing a checkpoint of its own name).

None of them is ever loaded (discovery skips hidden, ``.partial`` and ``.old`` names), but they pile
up. `remove_leftovers` deletes those of one checkpoint series that were last written *before* the
newest complete checkpoint: a save that may still be running (in another process) has written
since, so it is never touched.

>>> import os, tempfile, time
>>> d = tempfile.mkdtemp()
>>> stale = os.path.join(d, ".ckpt-1_1.safetensors.x7.tmp")
>>> open(stale, "w").close(); os.utime(stale, (0, 0))
>>> newest = os.path.join(d, "ckpt-1_2.safetensors"); open(newest, "w").close()
>>> [os.path.basename(p) for p in remove_leftovers(d, r"ckpt-\\d+_\\d+", newest)]
['.ckpt-1_1.safetensors.x7.tmp']
"""
from __future__ import annotations

import os
import re
import shutil
import time

from ..atomic import TMP_SUFFIX

__all__ = ["PARTIAL_SUFFIX", "OLD_SUFFIX", "prune", "remove_checkpoint", "leftovers", "remove_leftovers"]

PARTIAL_SUFFIX = ".partial"
OLD_SUFFIX = ".old"
_CHECKPOINT_SUFFIX = r"(?:\.safetensors)?"


def leftovers(directory: str, name_pattern: str) -> list[str]:
    """Paths of crash leftovers in `directory` whose checkpoint name matches `name_pattern` (a
    regular expression for the name without its ``.safetensors`` suffix)."""
    name = name_pattern + _CHECKPOINT_SUFFIX
    tmp = re.compile(r"\." + name + r"\.[^.]+" + re.escape(TMP_SUFFIX) + "$")
    unfinished = re.compile(name + "(?:" + re.escape(PARTIAL_SUFFIX) + "|" + re.escape(OLD_SUFFIX) + ")$")
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return [os.path.join(directory, n) for n in sorted(names) if tmp.match(n) or unfinished.match(n)]


def _last_written(path: str) -> int:
    """The newest mtime (ns) of `path` and, for a directory, of everything in it."""
    newest = os.stat(path).st_mtime_ns
    if os.path.isdir(path) and not os.path.islink(path):
        for root, dirs, files in os.walk(path):
            for n in dirs + files:
                try:
                    newest = max(newest, os.lstat(os.path.join(root, n)).st_mtime_ns)
                except FileNotFoundError:
                    continue
    return newest


def remove_leftovers(directory: str, name_pattern: str, newest_complete: str) -> list[str]:
    """Delete the leftovers (see `leftovers`) last written before `newest_complete` was; return them."""
    try:
        cutoff = _last_written(newest_complete)
    except FileNotFoundError:
        return []
    removed = []
    for path in leftovers(directory, name_pattern):
        try:
            if _last_written(path) >= cutoff:
                continue  # written since the newest checkpoint: a save may still be running
        except FileNotFoundError:  # removed concurrently
            continue
        remove_checkpoint(path)
        removed.append(path)
    return removed


def remove_checkpoint(path: str) -> None:
    """Delete a checkpoint file or a sharded checkpoint directory (gone already: fine)."""
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.remove(path)
    except FileNotFoundError:
        pass


def prune(older: list[str], keep_max: int, per_minutes: int) -> None:
    """Apply the keep rules to `older` (a series' checkpoints oldest first, without the newest)."""
    if keep_max:
        for path in older[: max(0, len(older) - keep_max + 1)]:  # keep_max - 1 older + the newest
            remove_checkpoint(path)
    elif per_minutes:
        # MindSpore: of the files written in the last `per_minutes`, keep only the oldest one.
        now = time.time()
        recent = []
        for path in older:
            try:
                if now - os.path.getmtime(path) < per_minutes * 60:
                    recent.append(path)
            except FileNotFoundError:
                continue
        for path in recent[1:]:
            remove_checkpoint(path)
