"""Retention: keep the newest ``keep`` versions and every version one of them depends on.

A delta version is usable only with its whole chain ``base (full) -> ... -> parent``. So the
versions kept are the newest ``keep`` plus, for each of them, the chain it names. A version
whose manifest cannot be read is kept as is but pins nothing (it is unusable anyway; the
loader skips it) and does not count. Nothing newer than the oldest kept version is removed.

A removed version is first renamed to a hidden ``.trash-`` name (one atomic step: a scanner
sees the version or nothing), then deleted.

>>> import tempfile, torch
>>> from recstream.serving.publishing.writer import write_version
>>> d = tempfile.mkdtemp()
>>> for v in (1, 2, 3):
...     _ = write_version(d, v, {}, {"kind": "full"})
>>> prune(d, keep=1), list_versions(d)
([1, 2], [3])
"""
from __future__ import annotations

import os
import secrets
import shutil

from ...checkpoint import fsync_dir
from ...validation import check_int
from ..snapshot.layout import TRASH_PREFIX, SnapshotError, list_versions, read_manifest, version_path


def needed_versions(directory: str | os.PathLike, keep: int) -> set[int]:
    """The newest `keep` versions with a readable manifest, everything newer, and their chains.

    Versions whose manifest cannot be read do not count towards `keep` (otherwise a torn
    newest version could leave nothing loadable); they are kept, not pinned to anything.
    """
    versions = list_versions(directory)
    needed: set[int] = set()
    good = 0
    for v in reversed(versions):
        if good >= keep:
            break
        needed.add(v)
        try:
            manifest = read_manifest(directory, v)
        except SnapshotError:
            continue
        good += 1
        if manifest["kind"] == "delta":
            # Every version from the base up is a link of the chain; keep them all, even where
            # a link itself turns out corrupt (the loader reports it).
            needed.update(x for x in versions if manifest["base"] <= x <= v)
    return needed


def prune(directory: str | os.PathLike, keep: int) -> list[int]:
    """Delete versions not needed by the newest `keep`; returns the removed version numbers."""
    check_int("prune", "keep", keep, minimum=1)
    directory = os.fspath(directory)
    needed = needed_versions(directory, keep)
    oldest_needed = min(needed) if needed else None
    removed = []
    for v in list_versions(directory):
        if v in needed or (oldest_needed is not None and v > oldest_needed):
            continue
        trash = os.path.join(directory, f"{TRASH_PREFIX}v{v:08d}-{secrets.token_hex(4)}")
        try:
            os.rename(version_path(directory, v), trash)
        except FileNotFoundError:
            continue  # someone else pruned it
        removed.append(v)
        shutil.rmtree(trash, ignore_errors=True)
    if removed:
        fsync_dir(directory)
    return removed
