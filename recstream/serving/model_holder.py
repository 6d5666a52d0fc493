"""Hot swap: the served version is ONE reference, replaced only by a fully loaded version.

Why this is safe without locks around inference:

* a new version is loaded completely (files verified, network rebuilt, deltas applied, eval
  mode) into a NEW network object on the watcher thread, while requests keep using the old one;
* then ``self._served = Served(...)`` rebinds a single attribute: under CPython that is one
  atomic store, so a request sees either the old or the new :class:`Served`, never a mix;
* each request reads ``holder.current`` ONCE and uses that object's network, manifest and
  parser (schema) to the end, so in-flight requests finish on the version they started with
  and the old network is freed when the last of them drops its reference;
* networks are never mutated after the swap (eval-mode forwards of recstream modules are
  read-only), so concurrent requests may share one.

The watcher polls the directory listing every ``poll_seconds`` (cheap: one ``listdir``) and
loads only when a version newer than the served one appears; a newest version that fails
to load is remembered and not retried until a still newer one appears.

>>> import tempfile
>>> from recstream.data import Schema, CategoricalFeature
>>> from recstream.models import WideDeep
>>> from recstream.serving.publish import publish_version
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
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from ..data.schema import Schema
from ..validation import check_int, check_number, check_type
from .layout import SnapshotError, list_versions
from .loader import load_latest
from .model_spec import check_factory
from .request import InstanceParser

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Served:
    """One loaded version: network, manifest, request parser, and when it started serving."""

    model: nn.Module
    manifest: dict
    parser: InstanceParser
    loaded_at: float = field(default_factory=time.time)

    @property
    def version(self) -> int:
        return self.manifest["version"]

    def info(self) -> dict:
        """What ``GET /version`` returns."""
        m = self.manifest
        keys = ("version", "kind", "base", "created", "step", "epoch", "max_event_time", "skipped")
        return {**{k: m.get(k) for k in keys}, "loaded_at": self.loaded_at,
                "model_class": (m.get("model") or {}).get("class")}


class ModelHolder:
    """Holds the served version of a publish directory and swaps in newer ones.

    Args:
        directory: the publish directory.
        model_factory: passed to :func:`~recstream.serving.load_latest`.
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
        self._attempted = 0  # newest version number a load was attempted for
        self._refresh_lock = threading.Lock()  # one loader at a time (watcher vs. a manual refresh)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.last_error: str | None = None

    @property
    def current(self) -> Served | None:
        """The served version (read it once per request and keep using that object)."""
        return self._served

    def _make_served(self, model: nn.Module, manifest: dict) -> Served:
        if manifest.get("schema") is None:
            raise SnapshotError(f"version {manifest['version']}: manifest has no schema; cannot validate requests")
        parser = InstanceParser(Schema.from_dict(manifest["schema"]), manifest.get("preprocessing"),
                                self.max_instances)
        return Served(model, manifest, parser)

    def refresh(self) -> bool:
        """Load and swap in a newer version if there is one; True if the served version changed."""
        with self._refresh_lock:
            versions = list_versions(self.directory)
            if not versions or versions[-1] <= self._attempted:
                return False
            self._attempted = versions[-1]
            try:
                model, manifest = load_latest(self.directory, self.model_factory)
                served = self._make_served(model, manifest)
            except (SnapshotError, FileNotFoundError) as e:
                self.last_error = str(e)
                log.error("model reload from %s failed, still serving %s: %s", self.directory,
                          self._served.version if self._served else "nothing", e)
                return False
            current = self._served
            if current is not None and served.version <= current.version:
                return False  # the newer ones were all unusable; keep what is served
            self._served = served  # the swap: one reference store
            self.last_error = None
            log.info("serving version %d from %s (%s, skipped %s)", served.version, self.directory,
                     manifest["kind"], [s["version"] for s in manifest["skipped"]])
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
