"""Names of a checkpoint series: ``{prefix}-{epoch}_{step_in_epoch}.safetensors`` (one file) or
``{prefix}-{epoch}_{step_in_epoch}`` (a sharded checkpoint directory, hybrid_parallel), with
MindSpore's rule for a new run into a directory that holds the files of an earlier one: the
prefix becomes ``{prefix}_1``, ``{prefix}_2``, ... so nothing of the earlier run is overwritten
or pruned.

>>> import os, tempfile
>>> d = tempfile.mkdtemp()
>>> checkpoint_name("ctr", 1, 20, sharded=False)
'ctr-1_20.safetensors'
>>> open(os.path.join(d, checkpoint_name("ctr", 1, 20, sharded=False)), "w").close()
>>> unique_prefix(d, "ctr", sharded=False)
'ctr_1'
>>> [os.path.basename(p) for p in series_files(d, series_pattern("ctr", every_run=True), sharded=False)]
['ctr-1_20.safetensors']
"""
from __future__ import annotations

import os
import re

__all__ = ["SUFFIX", "suffix", "checkpoint_name", "unique_prefix", "series_pattern", "series_files"]

SUFFIX = ".safetensors"


def suffix(sharded: bool) -> str:
    """A one-file checkpoint's suffix; none for a sharded checkpoint's directory."""
    return "" if sharded else SUFFIX


def checkpoint_name(prefix: str, epoch: int, step_in_epoch: int, sharded: bool) -> str:
    return f"{prefix}-{epoch}_{step_in_epoch}{suffix(sharded)}"


def unique_prefix(directory: str, prefix: str, sharded: bool) -> str:
    """MindSpore's rule: if ``prefix-*`` or ``prefix_N-*`` checkpoints exist, ``prefix_{max N + 1}``."""
    n = 0
    pattern = re.compile(re.escape(prefix) + r"(?:_(\d+))?-\d+_\d+" + re.escape(suffix(sharded)) + "$")
    for name in os.listdir(directory):
        m = pattern.match(name)
        if m:
            n = max(n, int(m.group(1)) + 1 if m.group(1) else 1)
    return f"{prefix}_{n}" if n else prefix


def series_pattern(prefix: str, every_run: bool) -> str:
    """A regular expression for the series' names without suffix (epoch and step as groups):
    of `prefix` alone, or (`every_run`) of every run of it (``prefix`` and ``prefix_N``)."""
    return re.escape(prefix) + (r"(?:_\d+)?" if every_run else "") + r"-(\d+)_(\d+)"


def series_files(directory: str, pattern: str, sharded: bool) -> list[str]:
    """The complete checkpoints of a series (`series_pattern`) in `directory`, oldest first
    (equal mtimes, from coarse clocks or fast saves, fall back to epoch/step order)."""
    regex = re.compile(pattern + re.escape(suffix(sharded)) + "$")
    found = []
    for name in os.listdir(directory):
        m = regex.match(name)
        if m:
            path = os.path.join(directory, name)
            try:
                found.append((os.stat(path).st_mtime_ns, int(m.group(1)), int(m.group(2)), path))
            except FileNotFoundError:  # removed concurrently
                continue
    return [f[-1] for f in sorted(found)]
