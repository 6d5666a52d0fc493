"""ModelPublisher: publish fresh model versions for serving while training online.

Every ``every_steps`` steps and/or ``every_seconds`` seconds (checked after each step), and
once at the end of training, the network is written as a new version ``v{N:08d}/`` of
`directory` by a `SnapshotWriter`: a full snapshot, or -- for
networks with [`HashEmbedding`][recstream.nn.hash_embedding.HashEmbedding] tables -- a delta holding only the rows
changed since the previous version (plus evicted keys), with a full one at least every
``full_every`` versions. Each version has a checksummed ``manifest.json`` (written last; the
directory appears by one atomic rename), ``LATEST`` points at the newest, and only the newest
``keep`` versions (and the chains they need) are kept. Serve them with
``recstream serve DIR --port P`` or `recstream.serving.load_latest`.

When: a `~recstream.callbacks.Publisher`, it runs after the step's durable checkpoint and its
commit, whatever its place in the callback list (`recstream.train.committer`, step 5): a version
due at a step where a checkpoint is due too appears only once that checkpoint is durable and its
position committed to the source, and the last version follows the run's final checkpoint. The
versions are of the weights just trained, also at steps without a checkpoint (give both the same
cadence to publish only what a restart resumes from): publishing is on its own cadence, so a
version can be far fresher than the last checkpoint. Each manifest says which it is:
``checkpoint_step`` is the step of the newest durable, committed checkpoint when the version was
taken, and a version with ``step > checkpoint_step`` holds training that a restart after a crash
redoes from that checkpoint (the same events, trained again: the next versions are again of
every event exactly once).

Event time: if the trainer sets ``cb_params.max_event_time`` (unix seconds of the newest
event trained on; a number, 0-d tensor or ``datetime``), its running maximum goes into each
manifest, for freshness measurement (`recstream.serving.event_freshness`).

Off the training thread (``background=True``, the default): at a due step the training thread
only takes the version (copies of the dense weights, the table rows, the manifest: a memory
copy), and a writer thread serializes, fsyncs and renames it into place; the step does not wait
for the disk. One write at a time: a version falling due while the previous one is still being
written is taken at the first step after it finished. At the end of training the last write is
waited for and a final version written. The writes stay atomic (a crash mid-write leaves a
temporary directory that the next run removes).

After a publish, ``cb_params.published_manifest`` holds the new manifest (in the background: from
the first step after its write finished); all manifests of the run are in ``publisher.manifests``.
A failed publish (disk full, ...) is logged and training goes on (``on_error="raise"`` stops it
instead, at the step that learns of it); the next version is then full. A diverged model (a
non-finite loss or weight) is never published, whatever ``on_error`` says: publishing raises
`DivergenceError` and training stops.

Several ranks (``torchrun``): under ``data_parallel`` every rank holds the whole model and rank 0
alone publishes. Under ``hybrid_parallel`` no rank does, so the publisher runs on every rank and each
version is a collective (`recstream.serving.publishing.sharded`): every rank joins the gathers of the
row-sharded tables and sends its keys' rows of each key-sharded `HashEmbedding` to rank 0, which writes
the version the whole model would give in one process (and alone touches the directory, ``LATEST`` and
retention, and runs the writer thread). The ranks agree on everything that could differ between them:
whether a version is due (``every_seconds`` on any rank's clock; rank 0's writer still busy: one small
all-reduce per step with ``every_seconds``, per due step with ``every_steps`` only), and every failure:
a diverged loss or weight on any rank raises `DivergenceError` on every rank; any other failure
(rank 0's directory, a write) raises on the rank that had it and
`~recstream.serving.publishing.sharded.ShardedPublishError` on the others, and ``on_error`` then
applies on every rank alike (a failed background write is learnt of at the next due step or the end).
``manifests`` and ``published_manifest`` are rank 0's.

>>> import tempfile
>>> from recstream.data import Schema, CategoricalFeature
>>> from recstream.models import DeepFM
>>> schema = Schema(["x"], [CategoricalFeature("c", vocab_size=5)])
>>> publisher = ModelPublisher(tempfile.mkdtemp(), schema, every_steps=100, model_config={"hidden": [8]})
>>> # Model(DeepFM(schema, hidden=(8,)), ...).train(1, stream, callbacks=[publisher])
"""
from __future__ import annotations

import datetime as _dt
import logging
import math
import os
import threading
import time
from typing import Any

import torch

from ...callbacks import DivergenceError, Publisher
from ...distributed.context import parallel_mode, rank
from ...validation import check_bool, check_choice, check_int, check_number
from .publish import SnapshotWriter
from .sharded import agree_failures, prepare_sharded
from .writer import remove_stale_temps

log = logging.getLogger(__name__)


def _event_time(value: Any) -> float | None:
    """``cb_params.max_event_time`` as unix seconds (None if unset); ValueError if unusable."""
    if value is None:
        return None
    if isinstance(value, _dt.datetime):
        return value.timestamp()
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"cb_params.max_event_time must be one value, got a tensor of shape {tuple(value.shape)}")
        value = value.item()
    if hasattr(value, "item") and not isinstance(value, (int, float)):
        value = value.item()  # numpy scalar
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"cb_params.max_event_time must be finite unix seconds, got {value!r}")
    return float(value)


def _sharded() -> bool:
    """Under hybrid_parallel no rank holds the whole model: every rank takes part in each version."""
    return parallel_mode() == "hybrid_parallel"


class ModelPublisher(Publisher):
    """Publish versions of the trained network to `directory` (see module docstring).

    Args:
        directory: publish directory (created if missing). One publisher per directory.
        schema: feature schema recorded for servers (default: ``network.schema``).
        every_steps: publish after every this many training steps (None: not by steps).
        every_seconds: publish when this much time passed since the last publish (None: not by time).
        keep: versions kept (plus the older ones a kept delta needs).
        model_factory: how servers rebuild a non-``recstream.models`` network: a module-level
            function ``f(manifest) -> nn.Module`` (its name is recorded; servers pass it too).
        model_config: JSON-able constructor kwargs of a ``recstream.models`` class, e.g.
            ``{"hidden": [256, 128], "embedding_dim": 16}``.
        full_every: a full version at least every this many versions.
        output: ``"logits"`` (default: servers apply sigmoid) or ``"probabilities"``.
        preprocessing: the reader's ``fill_missing_dense`` / ``log1p_dense``, applied to requests.
        publish_on_end: publish at the end of training if anything was trained since the last one.
        on_error: ``"log"`` (keep training) or ``"raise"``.
        background: write versions on a writer thread (default) instead of in the training step.
    """

    @property
    def rank_zero_only(self) -> bool:
        """One publisher per directory: rank 0 writes. Replicated weights (data_parallel) are rank 0's
        alone; row- and key-sharded tables (hybrid_parallel) need every rank to publish them, so the
        publisher runs on every rank (`recstream.serving.publishing.sharded`)."""
        return not _sharded()

    def __init__(self, directory: str | os.PathLike, schema=None, every_steps: int | None = None,
                 every_seconds: float | None = None, keep: int = 5, model_factory=None, *,
                 model_config: dict | None = None, full_every: int = 10, output: str = "logits",
                 preprocessing: dict | None = None, publish_on_end: bool = True, on_error: str = "log",
                 verify_rebuild: bool = True, background: bool = True):
        owner = "ModelPublisher"
        self.every_steps = check_int(owner, "every_steps", every_steps, minimum=1, allow_none=True)
        self.every_seconds = check_number(owner, "every_seconds", every_seconds, minimum=0, min_open=True,
                                          allow_none=True)
        self.publish_on_end = check_bool(owner, "publish_on_end", publish_on_end)
        self.on_error = check_choice(owner, "on_error", on_error, ("log", "raise"))
        self.background = check_bool(owner, "background", background)
        self._writing: threading.Thread | None = None
        self._written: tuple | None = None  # (manifest or exception, step, cb_params) of the last background write
        self._pending: Exception | None = None  # hybrid_parallel: a failed write to raise on every rank, at a round
        # The writer validates the arguments that describe the snapshots.
        self.writer = SnapshotWriter(directory, schema, keep, full_every, model_factory, model_config, output,
                                     preprocessing, verify_rebuild)
        self.manifests: list[dict] = []
        self.failures = 0
        self._max_event_time: float | None = None
        self._checkpoint_step: int | None = None  # the newest durable, committed checkpoint's step
        self._last_step = 0
        self._last_time = time.monotonic()

    @property
    def directory(self) -> str:
        return self.writer.directory

    def on_train_begin(self, run_context):
        p = run_context.original_args()
        error = None
        try:
            if rank() == 0:  # the only rank that touches the directory
                os.makedirs(self.directory, exist_ok=True)
                stale = remove_stale_temps(self.directory)
                if stale:
                    log.info("ModelPublisher: removed leftovers of interrupted publishes: %s", stale)
        except Exception as e:
            error = e
        if _sharded():  # rank 0 failing alone would leave the others in the first step's collectives
            agree_failures(error, f"prepare the publish directory {self.directory!r}")
        elif error is not None:
            raise error
        self.writer.invalidate()  # a new run starts with a full version
        self._last_step = p.cur_step_num or 0
        self._last_time = time.monotonic()

    def _due(self, step: int) -> bool:
        if self.every_steps is not None and step - self._last_step >= self.every_steps:
            return True
        return self.every_seconds is not None and time.monotonic() - self._last_time >= self.every_seconds

    def after_step_commit(self, run_context):
        p = run_context.original_args()
        event_time = _event_time(p.max_event_time)
        if event_time is not None:
            self._max_event_time = event_time if self._max_event_time is None else max(self._max_event_time, event_time)
        self._checkpoint_step = getattr(run_context.run_state, "checkpoint_step", None)
        self._collect(wait=False)
        due = self._due(p.cur_step_num or 0)
        if not _sharded():
            if due and self._writing is None:
                self.publish(p, background=self.background)
            return
        if self.every_seconds is None and not due:
            return  # a step count is the same on every rank: no need to ask the others
        due, busy = self._agree(due)
        if due and not busy:
            self.publish(p, background=self.background)

    def after_train_commit(self, run_context):
        p = run_context.original_args()
        self._checkpoint_step = getattr(run_context.run_state, "checkpoint_step", None)
        self._collect(wait=True)
        due = self.publish_on_end and (p.cur_step_num or 0) > self._last_step
        if _sharded():
            due, _ = self._agree(due)
        if due:
            self.publish(p)

    def _agree(self, due: bool) -> tuple[bool, bool]:
        """hybrid_parallel (collective, every rank at the same step): (whether a version is due on any
        rank's clock, whether rank 0's writer thread is still busy); a failed write that rank 0 learnt
        of since (``on_error="raise"``) raises on every rank."""
        error, self._pending = self._pending, None
        due_on, busy = agree_failures(error, f"publish to {self.directory!r}",
                                      [int(due), int(self._writing is not None)])
        return due_on > 0, busy > 0

    def __exit__(self, *exc_info):
        self._collect(wait=True, report=False)  # training raised: let the write in flight finish
        return None

    def publish(self, cb_params, background: bool = False) -> dict | None:
        """Publish now from a run's ``cb_params``; returns the manifest (None if it failed and was
        logged, or when `background` left the write to the writer thread)."""
        step = cb_params.cur_step_num or 0
        self._last_step, self._last_time = step, time.monotonic()
        try:
            if _sharded():
                return self._publish_sharded(cb_params, step, background)
            if getattr(cb_params, "loss_watch", None) is not None:  # a diverged run publishes nothing
                cb_params.loss_watch.check()
            prepared = self.writer.prepare(cb_params.network, step=step, epoch=cb_params.cur_epoch_num,
                                           max_event_time=self._max_event_time, copy=background,
                                           checkpoint_step=self._checkpoint_step)
            if background:
                self._start_writing(prepared, step, cb_params)
                return None
            manifest = self.writer.write(prepared)
        except DivergenceError:
            self.failures += 1
            raise  # not an I/O failure that training may outlive (on_error): the run must stop
        except Exception as e:
            return self._failed(e, step)
        return self._published(manifest, step, cb_params)

    def _publish_sharded(self, cb_params, step: int, background: bool) -> dict | None:
        """`publish` under hybrid_parallel: every rank takes part, rank 0 writes (its manifest is
        returned there, None elsewhere). Every failure is agreed on (every rank raises)."""
        error = None
        try:
            if getattr(cb_params, "loss_watch", None) is not None:  # each rank's own losses
                cb_params.loss_watch.check()
        except DivergenceError as e:
            error = e
        prepared = prepare_sharded(self.writer, cb_params.network, step=step, epoch=cb_params.cur_epoch_num,
                                   max_event_time=self._max_event_time, copy=background,
                                   checkpoint_step=self._checkpoint_step, error=error)
        if background:
            if prepared is not None:  # rank 0: its writer thread; a failure is agreed on at a later round
                self._start_writing(prepared, step, cb_params)
            return None
        manifest = None
        try:
            if prepared is not None:
                manifest = self.writer.write(prepared)
        except Exception as e:
            error = e
        agree_failures(error, f"write the version of step {step} to {self.directory!r}")
        return None if manifest is None else self._published(manifest, step, cb_params)

    def _start_writing(self, prepared, step: int, cb_params) -> None:
        """Write `prepared` on the writer thread; `_collect` takes the outcome in."""
        self._writing = threading.Thread(target=self._write, args=(prepared, step, cb_params), daemon=True,
                                         name="recstream-publisher")
        self._writing.start()

    def _write(self, prepared, step: int, cb_params) -> None:
        """The writer thread: write, and leave the outcome for the training thread to collect."""
        try:
            self._written = (self.writer.write(prepared), step, cb_params)
        except Exception as e:  # reported by _collect, in the training thread
            self._written = (e, step, cb_params)

    def _collect(self, wait: bool, report: bool = True) -> None:
        """Take in a finished background write (waiting for it with `wait`)."""
        if self._writing is None or (self._writing.is_alive() and not wait):
            return
        self._writing.join()
        self._writing = None
        outcome, step, cb_params = self._written
        self._written = None
        if isinstance(outcome, Exception):
            if report:
                self._failed(outcome, step, defer=_sharded())
            else:
                self.failures += 1
                self.writer.invalidate()
        elif report:
            self._published(outcome, step, cb_params)

    def _failed(self, error: Exception, step: int, defer: bool = False) -> None:
        self.failures += 1
        self.writer.invalidate()
        if self.on_error == "raise":
            if defer:  # hybrid_parallel: raised on every rank at the next round (`_agree`), not here alone
                self._pending = error
                return None
            raise error
        log.error("ModelPublisher: publishing to %s failed at step %d; training goes on",
                  self.directory, step, exc_info=error)
        return None

    def _published(self, manifest: dict, step: int, cb_params) -> dict:
        self.manifests.append(manifest)
        cb_params.published_manifest = manifest
        log.info("ModelPublisher: published version %d (%s) at step %d", manifest["version"], manifest["kind"], step)
        return manifest
