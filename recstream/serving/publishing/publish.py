"""Publishing versions of a live network: full snapshots and HashEmbedding deltas.

`SnapshotWriter` holds what must persist between versions of one training run: the
version it wrote last and how many deltas follow the last full version. A version is

* ``full`` -- always for networks without HashEmbedding; else the first one of a writer,
  every ``full_every``-th one (so a loader applies at most ``full_every - 1`` deltas), after
  any failed publish, when the directory's newest version is not the writer's own
  (another writer, or a deleted directory), and when a delta's rows (changed rows plus
  evicted keys) would not be smaller than a full version's (every id new: a delta saves
  nothing and would pin its whole chain on disk);
* ``delta`` otherwise: dense weights in full (small) plus, per HashEmbedding, the rows
  changed since the previous version and the keys evicted since then
  ([`export_delta`][recstream.nn.hash_embedding.HashEmbedding.export_delta]).

The writer must be the only caller of ``export()`` / ``export_delta()`` on the network's
tables: those calls move the delta baseline.

Manifest fields (``manifest.json``; see `recstream.serving.snapshot.layout` for the files):
``format``, ``format_version``, ``version``, ``kind`` (``full``/``delta``), ``base`` (the full
version the chain starts at; itself for a full one), ``parent`` (previous version; null for
full), ``created`` (unix seconds when it became visible), ``taken`` (unix seconds when its weights
were taken from the network: ``created - taken`` is the time writing it took), ``step``, ``epoch``,
``checkpoint_step`` (the step of the newest durable, committed checkpoint when it was taken, or null:
a version with ``step > checkpoint_step`` holds training a restart would redo), ``max_event_time``
(newest event trained on, unix seconds, or null), ``schema``
(``Schema.to_dict()`` or null), ``model`` (see `recstream.serving.snapshot.model_spec`),
``preprocessing`` (``ColumnConverter`` options a server applies to requests),
``hash_embeddings`` (``{path: {"file", "rows", "evicted"}}``), ``files``
(``{path: {"sha256", "bytes"}}``) and ``manifest_sha256``.

>>> import tempfile, torch
>>> from recstream.nn import HashEmbedding
>>> net = torch.nn.ModuleDict({"emb": HashEmbedding(2, capacity=8)})
>>> w = SnapshotWriter(tempfile.mkdtemp(), full_every=3)
>>> _ = net["emb"](torch.tensor([1, 2]))
>>> [w.publish(net)["kind"] for _ in range(4)]
['full', 'delta', 'delta', 'full']
"""
from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass
from typing import Any

from torch import nn

from ...callbacks.divergence import check_finite_tensors
from ...data.schema import Schema
from ...nn.tier_export import tiered_keys
from ...validation import check_bool, check_choice, check_int, check_module, check_number, check_type
from ..snapshot.layout import MODEL_FILE, list_versions
from ..snapshot.model_spec import OUTPUTS, check_factory, check_model_config, check_rebuild, describe_model
from ..snapshot.state_split import dense_state, for_saving, hash_embeddings, hash_file
from .retention import prune
from .writer import write_latest, write_version

log = logging.getLogger(__name__)
PREPROCESSING_KEYS = ("fill_missing_dense", "log1p_dense")


def _check_preprocessing(owner: str, pre: dict | None) -> dict:
    pre = dict(check_type(owner, "preprocessing", pre, dict, allow_none=True) or {})
    unknown = sorted(set(pre) - set(PREPROCESSING_KEYS))
    if unknown:
        raise ValueError(f"{owner}: 'preprocessing' has unknown option(s) {unknown}; allowed "
                         f"{list(PREPROCESSING_KEYS)}, got {pre!r}")
    return pre


class SnapshotWriter:
    """Writes successive versions of one network into `directory` (see module docstring).

    Args:
        directory: the publish directory (created if missing).
        schema: the feature schema (default: ``network.schema`` when the network has one).
        keep: versions kept by retention after each publish (plus the chains they need).
        full_every: a full version at least every this many versions.
        model_factory: a callable or ``"package.module:function"`` a server calls to rebuild the
            network (`recstream.serving.snapshot.model_spec`); None: the network's own class.
        model_config: the keyword arguments of that rebuild.
        output: what ``network(features)`` returns, ``"logits"`` (servers apply sigmoid) or
            ``"probabilities"``.
        preprocessing: ``fill_missing_dense`` / ``log1p_dense`` as given to the training
            reader's ``ColumnConverter``, so requests are transformed the same way.
        verify_rebuild: check once (on the ``meta`` device) that the manifest rebuilds this network.
    """

    def __init__(self, directory: str | os.PathLike, schema: Schema | None = None, keep: int = 5,
                 full_every: int = 10, model_factory: Any = None, model_config: dict | None = None,
                 output: str = "logits", preprocessing: dict | None = None, verify_rebuild: bool = True):
        owner = "SnapshotWriter"
        self.directory = os.fspath(check_type(owner, "directory", directory, (str, os.PathLike), allowed="a path"))
        if not self.directory:
            raise ValueError(f"{owner}: 'directory' must be a non-empty path, got {directory!r}")
        self.schema = check_type(owner, "schema", schema, Schema, allowed="a recstream.data.Schema", allow_none=True)
        self.keep = check_int(owner, "keep", keep, minimum=1)
        self.full_every = check_int(owner, "full_every", full_every, minimum=1)
        self.model_factory = check_factory(owner, model_factory)
        self.model_config = check_model_config(owner, model_config)
        self.output = check_choice(owner, "output", output, OUTPUTS)
        self.preprocessing = _check_preprocessing(owner, preprocessing)
        self.verify_rebuild = check_bool(owner, "verify_rebuild", verify_rebuild)
        self.last_version: int | None = None
        self._base: int | None = None  # full version the current delta chain starts at
        self._deltas = 0
        self._checked = False

    def invalidate(self) -> None:
        """Make the next version full (call after anything that may have lost a delta)."""
        self.last_version = None

    def _spec(self, network: nn.Module) -> tuple[dict | None, dict]:
        schema = self.schema if self.schema is not None else getattr(network, "schema", None)
        schema = schema if isinstance(schema, Schema) else None
        spec = describe_model(network, schema, self.model_config, self.model_factory, self.output)
        return (schema.to_dict() if schema is not None else None), spec

    def publish(self, network: nn.Module, step: int | None = None, epoch: int | None = None,
                max_event_time: float | None = None, full: bool = False, checkpoint_step: int | None = None) -> dict:
        """Write the next version of `network`; returns its manifest."""
        return self.write(self.prepare(network, step, epoch, max_event_time, full, checkpoint_step=checkpoint_step))

    def prepare(self, network: nn.Module, step: int | None = None, epoch: int | None = None,
                max_event_time: float | None = None, full: bool = False, copy: bool = False,
                checkpoint_step: int | None = None) -> PreparedVersion:
        """Everything `write` needs, taken from `network` now: the version number, the manifest and
        the tensors (with `copy`, copies: the network may go on training while another thread writes).
        (Of a network sharded over ranks, hybrid_parallel, `recstream.serving.publishing.sharded`
        takes the whole model's version, every rank joining.)"""
        taken = time.time()
        step, epoch, max_event_time, checkpoint_step = _check_publish_args(network, step, epoch, max_event_time,
                                                                           full, checkpoint_step)
        version, full = self.plan(network, full)
        manifest = self.manifest(network, version, full, step, epoch, max_event_time, checkpoint_step, taken)
        self.check_rebuild(network, manifest, version)
        files = self.dense_files(network, copy)
        tables_of = hash_embeddings(network)
        self.last_version = None  # any failure from here on: the exports below moved the baseline
        rows_of = {path: emb.export() if full else emb.export_delta() for path, emb in tables_of.items()}
        row_bytes = sum(_nbytes(rows) for rows in rows_of.values())
        if not full and row_bytes >= sum(_full_bytes(e, rows_of[p]) for p, e in tables_of.items()):
            # The delta would hold as much as a full version (every id new, the table turned over):
            # write the full one, which ends the chain, so retention need not keep the older
            # links. export() after export_delta() still returns every row.
            full = True
            rows_of = {path: emb.export() for path, emb in tables_of.items()}
        return self.finish(version, full, manifest, files, rows_of)

    # --- the steps of `prepare` (a sharded publish runs them on the ranks that own what they read) ---
    def plan(self, network: nn.Module, full: bool = False) -> tuple[int, bool]:
        """(the next version's number, whether it is full): reads the directory."""
        os.makedirs(self.directory, exist_ok=True)
        existing = list_versions(self.directory)
        newest = existing[-1] if existing else 0
        full = (full or not hash_embeddings(network)  # without HashEmbedding a delta would hold everything anyway
                or self.last_version is None or self.last_version != newest or self._deltas >= self.full_every - 1)
        return newest + 1, full

    def manifest(self, network: nn.Module, version: int, full: bool, step, epoch, max_event_time,
                 checkpoint_step, taken: float) -> dict:
        """The manifest of `version` so far (`finish` adds its tables; `write` its files)."""
        schema, spec = self._spec(network)
        return {"kind": "full" if full else "delta", "base": version if full else self._base,
                "parent": None if full else version - 1, "step": step, "epoch": epoch,
                "checkpoint_step": checkpoint_step, "taken": taken, "max_event_time": max_event_time,
                "schema": schema, "model": spec, "preprocessing": self.preprocessing}

    def check_rebuild(self, network: nn.Module, manifest: dict, version: int) -> None:
        """Once per writer: can a server rebuild `network` from `manifest` (ValueError if not)?"""
        if self.verify_rebuild and not self._checked:
            check_rebuild(network, dict(manifest, version=version), self.model_factory)
            self._checked = True

    @staticmethod
    def dense_files(network: nn.Module, copy: bool) -> dict:
        """``{model.safetensors: dense state}`` (copies with `copy`)."""
        dense = for_saving(dense_state(network))
        fresh = tiered_keys(network)  # disk-tiered tables, read into new tensors: no second copy
        return {MODEL_FILE: {k: t if k in fresh else t.clone() for k, t in dense.items()} if copy else dense}

    def finish(self, version: int, full: bool, manifest: dict, files: dict, rows_of: dict) -> PreparedVersion:
        """The version of `files` plus each HashEmbedding's rows `rows_of` (checked finite)."""
        self.last_version = None  # the exports moved the baseline: until written, the next one is full
        base = version if full else self._base
        if full:
            manifest.update(kind="full", base=version, parent=None)
        tables = {}
        for path, rows in rows_of.items():
            rel = hash_file(path)
            files[rel] = for_saving(rows)
            tables[path] = {"file": rel, "rows": int(rows["keys"].numel()),
                            "evicted": int(rows["evicted_keys"].numel()) if "evicted_keys" in rows else 0}
        manifest["hash_embeddings"] = tables
        # Last line of defence: a version that cannot predict (NaN/inf weights) is never written.
        check_finite_tensors({f"{f}:{k}": t for f, tensors in files.items() for k, t in tensors.items()},
                             what=f"version {version} in {self.directory!r}")
        return PreparedVersion(version, base, full, files, manifest)

    def write(self, prepared: PreparedVersion) -> dict:
        """Write a prepared version (atomically), point ``LATEST`` at it, apply retention."""
        stored = write_version(self.directory, prepared.version, prepared.files, prepared.manifest)
        self.last_version, self._base = prepared.version, prepared.base
        self._deltas = 0 if prepared.full else self._deltas + 1
        write_latest(self.directory, prepared.version)
        removed = prune(self.directory, self.keep)
        if removed:
            log.debug("retention removed versions %s from %s", removed, self.directory)
        return stored


@dataclass
class PreparedVersion:
    """A version taken from a network, not yet written (`SnapshotWriter.prepare` / `write`)."""

    version: int
    base: int
    full: bool
    files: dict
    manifest: dict


def _check_publish_args(network, step, epoch, max_event_time, full, checkpoint_step) -> tuple:
    owner = "SnapshotWriter.publish"
    check_module(owner, "network", network)
    step = check_int(owner, "step", step, minimum=0, allow_none=True)
    epoch = check_int(owner, "epoch", epoch, minimum=0, allow_none=True)
    checkpoint_step = check_int(owner, "checkpoint_step", checkpoint_step, minimum=0, allow_none=True)
    max_event_time = check_number(owner, "max_event_time", max_event_time, allow_none=True)
    check_bool(owner, "full", full)
    return step, epoch, max_event_time, checkpoint_step


def _nbytes(tensors: dict) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


def _full_bytes(emb, rows: dict) -> int:
    """Bytes of the row fields a full export of `emb` would hold (``num_rows`` rows of each field)."""
    return sum(emb.num_rows * math.prod(t.shape[1:]) * t.element_size()
               for name, t in rows.items() if name != "evicted_keys")


def publish_version(directory: str | os.PathLike, network: nn.Module, **kwargs) -> dict:
    """Publish `network` once as a full version (a one-shot `SnapshotWriter`).

    Keyword arguments are those of `SnapshotWriter` and of its ``publish``
    (``step``, ``epoch``, ``max_event_time``).
    """
    publish_keys = ("step", "epoch", "max_event_time")
    pub = {k: kwargs.pop(k) for k in publish_keys if k in kwargs}
    return SnapshotWriter(directory, **kwargs).publish(network, full=True, **pub)
