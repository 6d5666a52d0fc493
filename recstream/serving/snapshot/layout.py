"""On-disk layout of published model versions, and verified reading of their files.

(Writing them is `recstream.serving.publishing.writer`'s job.)

A publish directory holds one sub-directory per version plus a pointer file::

    DIR/
      LATEST                     "v00000012" + newline: the newest version (written atomically)
      v00000010/                 kind "full"
        model.safetensors        the network's state_dict minus HashEmbedding row storage
        hash/<module>.safetensors  every admitted row of that HashEmbedding (keys, values, counts, last_seen)
        manifest.json            written last; lists a sha256 per file and its own digest
      v00000011/                 kind "delta" (base 10, parent 10): model.safetensors in full (it is
        ...                      small), hash files hold only rows changed since the parent + evicted_keys
      .tmp-v00000013-1a2b3c4d/   a version being written: readers never look at dot-names

A version directory only ever appears complete: it is written under a hidden temporary name,
fsynced, and renamed into place (``rename`` of a directory is atomic on POSIX). Readers scan
for ``v########`` names and do not trust ``LATEST`` for correctness (it lags the rename by one
write); it is there for people and shell tools (``cat DIR/LATEST``).

>>> import os, tempfile
>>> d = tempfile.mkdtemp()
>>> os.mkdir(os.path.join(d, version_dirname(3)))
>>> list_versions(d), read_latest(d), version_path(d, 3) == os.path.join(d, "v00000003")
([3], None, True)
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import re
import stat
from typing import Any

from ...validation import check_int

FORMAT = "recstream.serving.snapshot"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
LATEST = "LATEST"
MODEL_FILE = "model.safetensors"
HASH_DIR = "hash"
TMP_PREFIX = ".tmp-"
TRASH_PREFIX = ".trash-"
MAX_VERSION = 10 ** 8 - 1  # eight digits
_VERSION_RE = re.compile(r"^v(\d{8})$")


class SnapshotError(ValueError):
    """A version is missing, incomplete, corrupt, or does not match the network rebuilt for it."""


def version_dirname(version: int) -> str:
    """Directory name of `version` (``v`` + 8 digits, so names sort like numbers)."""
    return f"v{check_int('version_dirname', 'version', version, minimum=1, maximum=MAX_VERSION):08d}"


def version_path(directory: str | os.PathLike, version: int) -> str:
    return os.path.join(os.fspath(directory), version_dirname(version))


def list_versions(directory: str | os.PathLike) -> list[int]:
    """Version numbers present in `directory`, ascending (complete or not: see `read_manifest`)."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted(int(m.group(1)) for m in map(_VERSION_RE.match, names) if m)


def read_file(directory: str | os.PathLike, path: str | os.PathLike) -> bytes:
    """The bytes of `path`, a regular file inside `directory` (the publish directory).

    Refused with SnapshotError (FileNotFoundError when absent): a path that resolves outside
    `directory` (a symlinked version directory or file pointing elsewhere must not be served),
    and anything but a regular file. The file is opened non-blocking and checked with
    ``fstat`` before it is read, so a FIFO named like a version file is refused at once
    instead of blocking the reader (the server's watcher, retention, shutdown) forever.
    """
    root = os.path.realpath(directory)
    real = os.path.realpath(path)
    if os.path.commonpath([root, real]) != root:
        raise SnapshotError(f"{os.path.relpath(path, directory)} resolves outside the publish directory "
                            "(symlink); refused")
    fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    with open(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise SnapshotError(f"{os.path.relpath(path, directory)} is not a regular file; refused")
        return f.read()


def read_latest(directory: str | os.PathLike) -> int | None:
    """The version named by ``LATEST``, or None when there is no (readable) pointer."""
    try:
        m = _VERSION_RE.match(read_file(directory, os.path.join(directory, LATEST)).decode("utf-8").strip())
    except (OSError, SnapshotError, UnicodeDecodeError):
        return None
    return int(m.group(1)) if m else None


def _canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False).encode("utf-8")


def manifest_digest(manifest: dict) -> str:
    """sha256 of the manifest's canonical JSON without its own ``manifest_sha256`` field."""
    return hashlib.sha256(_canonical({k: v for k, v in manifest.items() if k != "manifest_sha256"})).hexdigest()


def _reject_constant(name: str):
    raise ValueError(f"non-finite number {name} is not valid JSON here")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400 parses as infinity: its digest could not even be computed
        raise ValueError(f"number {text[:40]} is not finite")
    return value


def _is_int(value: Any) -> bool:
    return type(value) is int  # not bool: True == 1 must not pass for version 1


def _is_number(value: Any) -> bool:
    return type(value) in (int, float)


def _check_fields(version: int, manifest: dict) -> None:
    """The fields readers use, with their types: a digest-valid manifest may still be wrong."""
    def bad(what: str) -> SnapshotError:
        return SnapshotError(f"version {version}: {MANIFEST} field {what}")

    if not _is_int(manifest.get("version")) or manifest["version"] != version:
        raise bad(f"'version' must be the integer {version}, got {manifest.get('version')!r}")
    if not _is_number(manifest.get("created")):
        raise bad(f"'created' must be unix seconds (a number), got {manifest.get('created')!r}"[:200])
    for key in ("max_event_time", "taken"):
        if manifest.get(key) is not None and not _is_number(manifest[key]):
            raise bad(f"{key!r} must be unix seconds or null, got {manifest[key]!r}"[:200])
    for key in ("step", "epoch", "checkpoint_step"):
        value = manifest.get(key)
        if value is not None and not (_is_int(value) and value >= 0):
            raise bad(f"{key!r} must be a non-negative integer or null, got {value!r}"[:200])
    for key in ("schema", "model", "preprocessing", "hash_embeddings"):
        if manifest.get(key) is not None and not isinstance(manifest[key], dict):
            raise bad(f"{key!r} must be a JSON object or null, got {type(manifest[key]).__name__}")


def _read(directory, version: int, path: str) -> bytes:
    """`read_file` with the version named in its errors (FileNotFoundError passes through)."""
    try:
        return read_file(directory, path)
    except SnapshotError as e:
        raise SnapshotError(f"version {version}: {e}") from None
    except FileNotFoundError:
        raise
    except OSError as e:  # unreadable, a symlink loop, ...: this version is unusable, not the server
        raise SnapshotError(f"version {version}: cannot read {os.path.relpath(path, directory)}: "
                            f"{e.strerror or e}") from None


def read_manifest(directory: str | os.PathLike, version: int) -> dict:
    """The verified manifest of `version`; SnapshotError if absent, unparsable or inconsistent."""
    path = os.path.join(version_path(directory, version), MANIFEST)
    try:
        manifest = json.loads(_read(directory, version, path).decode("utf-8"), parse_constant=_reject_constant,
                              parse_float=_finite_float)
    except FileNotFoundError:
        raise SnapshotError(f"version {version}: {MANIFEST} is missing (incomplete version)") from None
    except RecursionError:  # the C decoder's answer to nesting deeper than the recursion limit
        raise SnapshotError(f"version {version}: {MANIFEST} is nested too deeply to be a manifest") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise SnapshotError(f"version {version}: {MANIFEST} is not valid JSON ({e})") from None
    if not isinstance(manifest, dict):
        raise SnapshotError(f"version {version}: {MANIFEST} must hold a JSON object")
    if manifest.get("manifest_sha256") != manifest_digest(manifest):
        raise SnapshotError(f"version {version}: {MANIFEST} digest mismatch (corrupt manifest)")
    if manifest.get("format") != FORMAT or manifest.get("format_version") != FORMAT_VERSION:
        raise SnapshotError(f"version {version}: unsupported format {manifest.get('format')!r} "
                            f"v{manifest.get('format_version')!r}; this reader knows {FORMAT} v{FORMAT_VERSION}")
    _check_fields(version, manifest)
    kind = manifest.get("kind")
    if kind not in ("full", "delta"):
        raise SnapshotError(f"version {version}: unknown kind {kind!r}")
    if kind == "delta":
        parent, base = manifest.get("parent"), manifest.get("base")
        if not (_is_int(parent) and _is_int(base) and 0 < base <= parent < version):
            raise SnapshotError(f"version {version}: delta needs 0 < base <= parent < version, "
                                f"got base={base!r} parent={parent!r}")
    files = manifest.get("files")
    if not isinstance(files, dict) or not all(isinstance(e, dict) for e in files.values()):
        raise SnapshotError(f"version {version}: manifest has no 'files' table of {{path: {{sha256, bytes}}}}")
    return manifest


def read_verified(directory: str | os.PathLike, manifest: dict, relpath: str) -> bytes:
    """Bytes of one file of a version, checked against the manifest's size and sha256.

    The check and the parse use the same bytes (read once), so a file replaced between
    verification and use cannot slip through.
    """
    version = manifest["version"]
    entry = manifest["files"].get(relpath)
    if not isinstance(entry, dict):
        raise SnapshotError(f"version {version}: manifest does not list {relpath!r}")
    path = os.path.join(version_path(directory, version), relpath)
    try:
        data = _read(directory, version, path)
    except FileNotFoundError:
        raise SnapshotError(f"version {version}: {relpath} is missing") from None
    if len(data) != entry.get("bytes") or hashlib.sha256(data).hexdigest() != entry.get("sha256"):
        raise SnapshotError(f"version {version}: {relpath} fails its checksum "
                            f"({len(data)} bytes, manifest says {entry.get('bytes')}): corrupt or truncated")
    return data


def chain_of(directory: str | os.PathLike, version: int, max_length: int = 100_000) -> list[int]:
    """``[base, ..., version]``: the versions needed to load `version`, oldest first.

    Follows ``parent`` links (reading each manifest), so a gap or a corrupt link raises
    SnapshotError naming the broken version.
    """
    chain, manifest = [version], read_manifest(directory, version)
    base = manifest.get("base")
    while manifest["kind"] == "delta":
        if len(chain) > max_length:
            raise SnapshotError(f"version {version}: delta chain longer than {max_length}")
        parent = manifest["parent"]
        try:
            manifest = read_manifest(directory, parent)
        except SnapshotError as e:
            raise SnapshotError(f"version {version} needs version {parent}, which is unusable: {e}") from None
        if manifest["kind"] == "delta" and manifest.get("base") != base:
            raise SnapshotError(f"version {version}: chain mixes bases {base} and {manifest.get('base')}")
        chain.append(parent)
    if chain[-1] != base and len(chain) > 1:
        raise SnapshotError(f"version {version}: chain ends at full version {chain[-1]}, manifest says base {base}")
    return chain[::-1]
