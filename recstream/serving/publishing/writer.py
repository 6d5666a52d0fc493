"""Writing a publish directory: one version directory atomically, the ``LATEST`` pointer, cleanup.

A version directory is written in this order (files, then manifest, then one rename):

1. ``mkdir DIR/.tmp-vNNNNNNNN-<random>`` (hidden: scanners ignore it);
2. each safetensors file written and fsynced, its sha256 computed from the bytes on disk;
3. ``manifest.json`` written LAST and fsynced, so a version with a manifest is complete;
4. fsync the temporary directory (its entries are durable), ``rename`` it to ``vNNNNNNNN``
   (atomic; fails instead of overwriting if that name exists), fsync ``DIR``.

A crash before step 4 leaves only a hidden temporary directory (removed by the next
publisher via `remove_stale_temps`); after it, a complete version.

>>> import tempfile, torch
>>> from recstream.serving.snapshot.layout import list_versions, read_latest
>>> d = tempfile.mkdtemp()
>>> m = write_version(d, 1, {"model.safetensors": {"w": torch.ones(2)}}, {"kind": "full"})
>>> write_latest(d, 1)
>>> m["version"], sorted(m["files"]), list_versions(d), read_latest(d)
(1, ['model.safetensors'], [1], 1)
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import secrets
import shutil
import time

import torch
from safetensors.torch import save_file

from ...checkpoint import atomic_write, fsync_dir, fsync_file
from ..snapshot.layout import (
    FORMAT,
    FORMAT_VERSION,
    LATEST,
    MANIFEST,
    TMP_PREFIX,
    TRASH_PREFIX,
    manifest_digest,
    version_dirname,
)

_CHUNK = 1 << 20


def sha256_file(path: str) -> tuple[str, int]:
    """(hex sha256, size in bytes) of a file, read in 1 MiB chunks."""
    h, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
            size += len(chunk)
    return h.hexdigest(), size


def write_manifest(version_dir: str, manifest: dict) -> dict:
    """Add ``manifest_sha256`` and write ``manifest.json`` durably; returns the stored dict."""
    for key in ("created", "taken", "max_event_time"):
        value = manifest.get(key)
        if value is not None and not math.isfinite(value):
            raise ValueError(f"manifest field {key!r} must be finite, got {value!r}")
    manifest = dict(manifest, manifest_sha256=manifest_digest(manifest))
    path = os.path.join(version_dir, MANIFEST)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1, sort_keys=True, allow_nan=False)
        f.flush()
        os.fsync(f.fileno())
    return manifest


def write_latest(directory: str | os.PathLike, version: int) -> None:
    """Point ``LATEST`` at `version` (atomic replace: readers see the old or the new name)."""
    text = version_dirname(version) + "\n"

    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)

    atomic_write(os.path.join(directory, LATEST), write)


def write_version(directory: str | os.PathLike, version: int, files: dict[str, dict[str, torch.Tensor]],
                  manifest: dict) -> dict:
    """Create ``DIR/v{version:08d}`` holding `files` (relative path -> tensors) and the manifest.

    `manifest` is completed with ``format``, ``version``, ``created`` (unix seconds, taken
    just before the rename: the moment the version becomes visible) and ``files``
    (``{path: {"sha256", "bytes"}}``). Returns the manifest as stored.
    """
    directory = os.fspath(directory)
    name = version_dirname(version)
    final = os.path.join(directory, name)
    if os.path.exists(final):
        raise FileExistsError(f"version directory {final} already exists")
    tmp = os.path.join(directory, f"{TMP_PREFIX}{name}-{secrets.token_hex(4)}")
    os.mkdir(tmp)  # 0777 & ~umask: a server running as another user can read it
    try:
        entries, subdirs = {}, {tmp}
        for rel, tensors in files.items():
            if os.path.isabs(rel) or ".." in rel.split("/"):
                raise ValueError(f"write_version: file name {rel!r} must be relative and stay inside the version "
                                 "directory")
            path = os.path.join(tmp, *rel.split("/"))
            os.makedirs(os.path.dirname(path), exist_ok=True)
            subdirs.add(os.path.dirname(path))
            save_file(tensors, path)
            fsync_file(path)
            digest, size = sha256_file(path)
            entries[rel] = {"sha256": digest, "bytes": size}
        for d in subdirs - {tmp}:
            fsync_dir(d)
        stored = write_manifest(tmp, dict(manifest, format=FORMAT, format_version=FORMAT_VERSION,
                                          version=version, created=time.time(), files=entries))
        fsync_dir(tmp)
        os.rename(tmp, final)  # POSIX: fails (ENOTEMPTY/EEXIST) rather than replace a non-empty dir
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    fsync_dir(directory)
    return stored


def remove_stale_temps(directory: str | os.PathLike) -> list[str]:
    """Delete leftovers of interrupted publishes/prunes (hidden ``.tmp-`` / ``.trash-`` dirs).

    Call it only when no other publisher writes to `directory` (one writer per directory).
    """
    removed = []
    for entry in os.scandir(directory):
        if entry.is_dir(follow_symlinks=False) and entry.name.startswith((TMP_PREFIX, TRASH_PREFIX)):
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(entry.name)
    return removed
