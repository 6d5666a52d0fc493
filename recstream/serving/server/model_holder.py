"""Hot swap: the served version is ONE reference, replaced only by a fully loaded version.

Why this is safe without locks around inference:

* a new version is loaded completely (files verified, network rebuilt, deltas applied, eval
  mode) into a NEW network object on the watcher thread, while requests keep using the old one;
* then ``self._served = Served(...)`` rebinds a single attribute: under CPython that is one
  atomic store, so a request sees either the old or the new `Served`, never a mix;
* each request reads ``holder.current`` ONCE and uses that object's network, manifest and
  parser (schema) to the end, so in-flight requests finish on the version they started with
  and the old network is freed when the last of them drops its reference;
* networks are never mutated after the swap (eval-mode forwards of recstream modules are
  read-only), so concurrent requests may share one.

The watcher polls the directory listing every ``poll_seconds`` (cheap: one ``listdir`` and one
``stat``) and loads only when a version newer than the served one appears. A version that
fails to load is skipped with a logged reason and remembered with the identity (inode, mtime,
size) of its files and of the versions before it: it is tried again as soon as any of them
changes (an incomplete ``cp -r`` that completed, a repaired link of its delta chain), never
re-read while nothing changed. The served version is never replaced by an older one.

>>> import tempfile
>>> from recstream.data import Schema, CategoricalFeature
>>> from recstream.models import WideDeep
>>> from recstream.serving.publishing.publish import publish_version
>>> schema = Schema(["x"], [CategoricalFeature("c", vocab_size=5)])
>>> d = tempfile.mkdtemp()
>>> _ = publish_version(d, WideDeep(schema, hidden=(8,)), model_config={"hidden": [8]})
>>> holder = ModelHolder(d)
>>> holder.refresh(), holder.current.version
(True, 1)
"""
from __future__ import annotations

import logging
import os
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from ...data.schema import Schema
from ...validation import check_int, check_number, check_type
from ..snapshot.layout import MANIFEST, SnapshotError, list_versions, read_manifest, version_path
from ..snapshot.loader import load_version
from ..snapshot.model_spec import check_factory
from .request import InstanceParser

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Served:
    """One loaded version: network, manifest, request parser, and when it started serving."""

    model: nn.Module
    manifest: dict
    parser: InstanceParser
    loaded_at: float = field(default_factory=time.time)
    load_seconds: float | None = None  # how long reading, verifying and rebuilding it took

    @property
    def version(self) -> int:
        return self.manifest["version"]

    def info(self) -> dict:
        """What ``GET /version`` returns."""
        m = self.manifest
        keys = ("version", "kind", "base", "taken", "created", "step", "epoch", "checkpoint_step", "max_event_time",
                "skipped")
        return {**{k: m.get(k) for k in keys}, "loaded_at": self.loaded_at, "load_seconds": self.load_seconds,
                "model_class": (m.get("model") or {}).get("class")}


class ModelHolder:
    """Holds the served version of a publish directory and swaps in newer ones.

    Args:
        directory: the publish directory.
        model_factory: passed to `load_version`.
        poll_seconds: watcher period.
        max_instances: per-request limit of the request parsers.
    """

    def __init__(self, directory: str | os.PathLike, model_factory: Any = None, poll_seconds: float = 1.0,
                 max_instances: int = 1024):
        owner = "ModelHolder"
        self.directory = os.fspath(check_type(owner, "directory", directory, (str, os.PathLike), allowed="a path"))
        self.model_factory = check_factory(owner, model_factory)
        self.poll_seconds = check_number(owner, "poll_seconds", poll_seconds, minimum=0, min_open=True)
        self.max_instances = check_int(owner, "max_instances", max_instances, minimum=1)
        self._served: Served | None = None
        self._served_stat: tuple | None = None  # (inode, mtime, size) of the served manifest file
        self._failed: dict[int, tuple[tuple, str]] = {}  # version -> (identity on disk when it failed, reason)
        self._reported: str | None = None  # the failure last logged as an error (not repeated every poll)
        self._refresh_lock = threading.Lock()  # one loader at a time (watcher vs. a manual refresh)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.last_error: str | None = None
        self.swaps = 0  # versions swapped in
        self.load_failures = 0  # versions skipped as unusable

    @property
    def current(self) -> Served | None:
        """The served version (read it once per request and keep using that object)."""
        return self._served

    @property
    def public_error(self) -> str | None:
        """``last_error`` without local paths (what HTTP clients may see)."""
        return None if self.last_error is None else public_text(self.last_error)

    def _make_served(self, model: nn.Module, manifest: dict, load_seconds: float | None = None) -> Served:
        version = manifest["version"]
        if manifest.get("schema") is None:
            raise SnapshotError(f"version {version}: manifest has no schema; cannot validate requests")
        try:
            parser = InstanceParser(Schema.from_dict(manifest["schema"]), manifest.get("preprocessing"),
                                    self.max_instances)
        except (TypeError, ValueError, KeyError) as e:  # digest-valid, but not a schema requests can use
            raise SnapshotError(f"version {version}: cannot validate requests with its schema/preprocessing: "
                                f"{type(e).__name__}: {e}") from None
        return Served(model, manifest, parser, load_seconds=load_seconds)

    def _manifest_stat(self, version: int) -> tuple | None:
        try:
            st = os.stat(os.path.join(version_path(self.directory, version), MANIFEST))
        except OSError:
            return None
        return st.st_ino, st.st_mtime_ns, st.st_size

    def _was_reset(self, served: Served) -> bool:
        """Is the served version gone or replaced on disk (the publish directory was wiped)?

        Cheap when nothing changed: one ``stat`` of the served manifest; it is read and its
        digest compared only when that file's identity changed.
        """
        now = self._manifest_stat(served.version)
        if now is not None and now == self._served_stat:
            return False
        try:
            on_disk = read_manifest(self.directory, served.version)["manifest_sha256"]
            same = on_disk == served.manifest["manifest_sha256"]
        except (SnapshotError, OSError):
            same = False
        if same:
            self._served_stat = now
        return not same

    def _candidates(self, versions: list[int], current: Served | None) -> list[int]:
        """Versions that would replace the served one, oldest first.

        Higher numbers always. Lower or equal ones only once the served version is gone or
        replaced on disk, and then only those created after it (a restarted trainer): a
        served version that turned unreadable (a symlink out of the directory) is never
        "replaced" by an older one, the server keeps serving it from memory.
        """
        if current is None:
            return versions
        newer = [v for v in versions if v > current.version]
        if not self._was_reset(current):
            return newer
        created = current.manifest["created"]
        restarted = []
        for v in versions:
            if v > current.version:
                break
            try:
                later = read_manifest(self.directory, v)["created"] > created
            except (SnapshotError, OSError):
                later = v == current.version  # the served number, now unreadable: try (and remember) it
            if later:
                restarted.append(v)
        return restarted + newer

    def _identity(self, versions: list[int], version: int) -> tuple:
        """What loading `version` read: every version directory up to it, file by file (lstat).

        A failed version is retried when this changes: a ``cp -r`` that completed, a manifest
        rewritten, a link of its delta chain repaired or replaced.
        """
        return tuple(_tree_stat(version_path(self.directory, v)) for v in versions if v <= version)

    def _load_newest(self, versions: list[int], candidates: list[int]) -> Served | None:
        """The newest candidate that loads (with its chain), skipping unusable ones.

        A version that failed is not tried again while what it is made of is unchanged on disk.
        """
        skipped = []
        current = self._served
        # the served version's rows: a delta continuing its chain reads only the versions after it
        previous = None if current is None else (current.model, current.manifest)
        for v in reversed(candidates):
            identity = self._identity(versions, v)
            known = self._failed.get(v)
            if known is not None and known[0] == identity:
                skipped.append({"version": v, "reason": known[1]})
                continue
            try:
                began = time.monotonic()
                model, manifest = load_version(self.directory, v, self.model_factory, previous=previous)
                served = self._make_served(model, dict(manifest, skipped=skipped), time.monotonic() - began)
            except FileNotFoundError as e:  # removed while we looked (retention, a wipe)
                reason = f"version {v}: {e.strerror or e}"
            except SnapshotError as e:
                reason = str(e)
            else:
                self._failed.pop(v, None)
                return served
            self.load_failures += 1
            log.warning("skipping model version %d in %s: %s", v, self.directory, reason)
            self._failed[v] = (identity, public_text(reason))
            skipped.append({"version": v, "reason": public_text(reason)})
        if skipped:
            self.last_error = "no usable new version: " + "; ".join(f"v{s['version']}: {s['reason']}" for s in skipped)
        return None

    def refresh(self) -> bool:
        """Load and swap in a newer version if there is one; True if the served version changed.

        "Newer" is a higher version number, or -- after the publish directory was wiped and
        versions restarted at 1 -- a version created after the served one, once the served one
        is gone or replaced on disk (see `_candidates`). Unusable versions (torn, corrupt,
        unloadable: bad manifests, non-finite weights, a FIFO, a symlink out of the directory)
        are skipped with a logged reason and older candidates tried; a failed version is retried
        as soon as its files (or those of the versions before it) change on disk.
        """
        with self._refresh_lock:
            versions = list_versions(self.directory)
            current = self._served
            candidates = self._candidates(versions, current) if versions else []
            self._failed = {v: f for v, f in self._failed.items() if v in versions}
            if not candidates:
                return False
            served = self._load_newest(versions, candidates)
            if served is None:
                if self.last_error != self._reported:
                    log.error("model reload from %s failed, still serving %s: %s", self.directory,
                              current.version if current else "nothing", self.last_error)
                    self._reported = self.last_error
                return False
            self._served_stat = self._manifest_stat(served.version)
            self._served = served  # the swap: one reference store
            self.swaps += 1
            self.last_error = self._reported = None
            log.info("serving version %d from %s (%s, skipped %s)", served.version, self.directory,
                     served.manifest["kind"], [s["version"] for s in served.manifest["skipped"]])
            return True

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_seconds):
            try:
                self.refresh()
            except Exception:  # a bug in a model_factory must not kill the watcher silently
                log.exception("model watcher: refresh failed")

    def start(self) -> ModelHolder:
        """Start the background watcher (a daemon thread)."""
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._watch, name="recstream-model-watcher", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None


def _tree_stat(path: str) -> tuple:
    """``(name, inode, mtime, size, mode)`` of `path` and everything under it, without following links."""
    out = []
    try:
        st = os.lstat(path)
    except OSError:
        return ()
    out.append(("", st.st_ino, st.st_mtime_ns, st.st_size, st.st_mode))
    if not os.path.islink(path):
        for root, dirs, files in os.walk(path):
            for name in sorted(dirs + files):
                full = os.path.join(root, name)
                try:
                    st = os.lstat(full)
                except OSError:
                    continue
                out.append((os.path.relpath(full, path), st.st_ino, st.st_mtime_ns, st.st_size, st.st_mode))
    return tuple(out)


# an absolute path: a "/" that does not continue a word or a relative path
_PATH_RE = re.compile(r"(?<![\w./~-])/(?:[^\s'\",;)]*[^\s'\",;):])?")


def public_text(text: str) -> str:
    """`text` with absolute file paths replaced by ``<path>``: errors shown to HTTP clients must
    not disclose the server's directory layout (the log keeps the full text).

    >>> public_text("no usable version in '/srv/models/a': v3: hash/emb.safetensors fails its checksum")
    "no usable version in '<path>': v3: hash/emb.safetensors fails its checksum"
    """
    return _PATH_RE.sub("<path>", text)
