"""Durable file writes (at the ground floor, so `data`, `checkpoint` and `serving` share one copy):
atomic replacement (a reader sees the old file or the complete new one,
never a torn one) and the fsync calls that make files and renames survive a power loss.

Recipe: write to a temporary file in the *same directory* (so ``os.replace`` is a rename within
one filesystem, which POSIX makes atomic), flush and fsync it (the bytes are on disk before the
name points at them), ``os.replace`` it over the final name, then fsync the directory (the rename
itself survives a power loss). On any error the temporary file is removed and the previous file
under the final name is untouched.

>>> import os, tempfile
>>> d = tempfile.mkdtemp()
>>> p = os.path.join(d, "a.txt")
>>> def write(tmp):
...     with open(tmp, "w") as f:
...         f.write("hello")
>>> atomic_write(p, write)
>>> with open(p) as f:
...     f.read()
'hello'
"""
from __future__ import annotations

import os
import tempfile
from collections.abc import Callable

from .validation import check_callable, check_type

__all__ = ["atomic_write", "fsync_dir", "fsync_file", "TMP_SUFFIX"]

TMP_SUFFIX = ".tmp"


def fsync_file(path: str | os.PathLike) -> None:
    """Flush a written file's bytes to disk (before a rename makes the file visible)."""
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def fsync_dir(directory: str | os.PathLike) -> None:
    """Make a rename/unlink in `directory` durable (POSIX; a no-op where directories can't be opened)."""
    if os.name != "posix":
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _default_mode() -> int:
    # mkstemp creates 0600 files; give the final file the mode a plain open() would (0666 & ~umask).
    # Read once at import: os.umask can only be read by setting it, which races with other threads.
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


_FILE_MODE = _default_mode()


def atomic_write(path: str | os.PathLike, write: Callable[[str], object]) -> None:
    """Create/replace `path` atomically; ``write(tmp_path)`` must write the full content to tmp_path.

    The temporary name is hidden (``.<name>.<random>.tmp``) so directory scans for checkpoints
    never mistake it for a finished file.
    """
    path = os.fspath(check_type("atomic_write", "path", path, (str, os.PathLike), allowed="a path"))
    check_callable("atomic_write", "write", write)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=TMP_SUFFIX, dir=directory)
    os.close(fd)
    try:
        write(tmp)
        fsync_file(tmp)
        os.chmod(tmp, _FILE_MODE)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    fsync_dir(directory)
