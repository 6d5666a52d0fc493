"""Write one version directory atomically: files, then manifest, then one rename.

Order, and why:

1. ``mkdir DIR/.tmp-vNNNNNNNN-<random>`` (hidden: scanners ignore it);
2. each safetensors file written and fsynced, its sha256 computed from the bytes on disk;
3. ``manifest.json`` written LAST and fsynced, so a version with a manifest is complete;
4. fsync the temporary directory (its entries are durable), ``rename`` it to ``vNNNNNNNN``
   (atomic; fails instead of overwriting if that name exists), fsync ``DIR``.

A crash before step 4 leaves only a hidden temporary directory (removed by the next
publisher via :func:`remove_stale_temps`); after it, a complete version.

>>> import tempfile, torch
>>> from recstream.serving.layout import list_versions
>>> d = tempfile.mkdtemp()
>>> m = write_version(d, 1, {"model.safetensors": {"w": torch.ones(2)}}, {"kind": "full"})
>>> m["version"], sorted(m["files"]), list_versions(d)
(1, ['model.safetensors'], [1])
"""
from __future__ import annotations

import os
import secrets
import shutil
import time

import torch
from safetensors.torch import save_file

from ..callbacks._atomic import fsync_dir
from .layout import (FORMAT, FORMAT_VERSION, TMP_PREFIX, TRASH_PREFIX, fsync_file, sha256_file, version_dirname,
                     write_manifest)


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
                raise ValueError(f"file name {rel!r} must be relative and stay inside the version directory")
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
