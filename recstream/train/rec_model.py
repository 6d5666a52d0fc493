"""`RecModel`: `Model` plus `online_train`, training without end on an unbounded stream.

`online_train` reuses the one training loop (`Model._train_loop`) with endless epochs, allows any
positive `sink_size`, and stops cleanly on `request_stop()`, SIGINT or SIGTERM, or when a finite
stream reports its end (the current step finishes, `ModelCheckpoint` writes the final checkpoint
with the stream position, `on_train_end` runs, `online_train` returns). A stream that ends before
its first batch (a scheduled rerun with nothing new) trains 0 steps and changes nothing. The
contract is in docs/semantics.md, section 7.

Exactly once: streams report their position after each batch; the position of the last TRAINED
batch is in the run state (``cb_params.train_position``), saved in every checkpoint, and committed
to the source only once that checkpoint is durable, then published: `OnlineCommitter`
(`committer.py`) runs that protocol around the callbacks, whatever their order. `restore` loads
the newest checkpoint and seeks the stream; the next `online_train` hands the callbacks that keep
a state (`PrequentialMonitor`'s totals) theirs from that checkpoint, so their figures go on.

Under ``torchrun`` (docs/distributed.md, "Online training"): a stream that can split itself
(`DirectoryStream` by file, `KafkaStream` by partition) reads only this rank's share; the ranks
hand out batches in lock-step (`recstream.distributed.Lockstep`: a rank without data trains a
fill batch whose label carries the loss weight 0, so it still takes part in every collective);
stops are agreed after the same step on every rank; checkpoints hold every rank's position
(``{"step", "ranks"}``), and each rank commits its part only once the checkpoint is complete.
`restore` gives each rank its own position (Kafka positions map to another number of ranks; a
`DirectoryStream`'s do not).

>>> import torch
>>> from recstream import RecModel
>>> from recstream.callbacks import Callback
>>> class StopAfter(Callback):
...     def on_train_step_end(self, ctx):
...         if ctx.original_args().cur_step_num >= 6:
...             ctx.request_stop()
>>> net = torch.nn.Linear(4, 2)
>>> model = RecModel(net, torch.nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), lr=0.1))
>>> data = [(torch.randn(8, 4), torch.randint(0, 2, (8,))) for _ in range(4)]
>>> model.online_train(data, callbacks=[StopAfter()], sink_size=2)  # cycles the 4 batches
"""
from __future__ import annotations

import itertools
import logging
import time
import warnings

import torch

from ..callbacks import Callback, CallbackList, History, ModelCheckpoint
from ..callbacks.base import as_callback_list
from ..callbacks.checkpointed import CHECKPOINT_ENTRY, load_callback_states
from ..checkpoint.discovery import load_newest
from ..data.batch import WeightedLabel
from ..data.channel import EndOfStream
from ..data.protocol import BadRecordDataset, SeekableDataset, check_dataset, dataset_size
from ..data.streams import Stream
from ..distributed import is_distributed, rank, world_size
from ..distributed.lockstep import Lockstep, is_job_position
from ..validation import check_bool, check_int
from .committer import OnlineCommitter
from .micro_steps import MicroSteps
from .model import Model
from .signals import StopOnSignal
from .sink import DatasetHelper, batch_prefetch

log = logging.getLogger("recstream.train")


class StreamStats(Callback):
    """Stream facts for other callbacks: ``cb_params.max_event_time`` (the newest event time trained
    on, from the stream's per-batch metadata; `ModelPublisher` records it for freshness) and
    ``cb_params.bad_records`` (the stream's live counter of rejected records by reason, also
    logged, at most every `log_every` seconds, when it grows)."""

    def __init__(self, log_every: float = 10.0):
        self.log_every, self._logged_total, self._logged_at = log_every, 0, 0.0

    def on_train_begin(self, run_context):
        p = run_context.original_args()
        if isinstance(p.train_dataset, BadRecordDataset):
            p.bad_records = p.train_dataset.bad_records

    def on_train_step_end(self, run_context):
        p = run_context.original_args()
        times = [m["event_time"] for m in p.get("train_batch_metas") or () if m.get("event_time") is not None]
        if times:  # stream metadata lives on the host: no device sync
            newest = max(float(t.max()) for t in times if len(t))
            p.max_event_time = max(newest, p.get("max_event_time") or newest)
        bad = p.get("bad_records")
        if bad:
            total, now = sum(bad.values()), time.monotonic()
            if total > self._logged_total and now - self._logged_at >= self.log_every:
                log.warning("%d malformed records skipped so far (%s); see the stream's dead-letter file",
                            total, ", ".join(f"{k}: {v}" for k, v in sorted(bad.items())))
                self._logged_total, self._logged_at = total, now


class RecModel(Model):
    """A `Model` that can also train online (see the module docstring)."""

    def __init__(self, network, loss_fn=None, optimizer=None, *args, **kwargs):
        if loss_fn is not None and is_distributed():
            loss_fn = _FillWeightedLoss(loss_fn)
        super().__init__(network, loss_fn, optimizer, *args, **kwargs)
        self._resume_epoch, self._resume_step = 0, 0
        self._restored: tuple[str, dict | None] | None = None  # (checkpoint, its callback states) for online_train

    def online_train(self, train_dataset, callbacks=None, dataset_sink_mode=True, sink_size=1,
                     micro_batch_size=None):
        """Train on `train_dataset` until a stop is requested (a callback, SIGINT or SIGTERM) or the
        stream ends (a pass yields no batch after earlier ones did).

        Without sink, an epoch is one pass of the dataset's iterator, then ``reset()``; with sink,
        an epoch is `sink_size` batches (any positive size) and step hooks run once per sink.

        Micro-steps: with `micro_batch_size` k (an int >= 1; None: off), each batch trains as
        consecutive optimizer steps of k rows, in order, the last possibly smaller (`MicroSteps`).
        Everything else stays per batch: the prequential scoring (of the whole batch, before any
        of its steps), ``cur_step_num``, the step hooks, positions, checkpoints and commits. On
        several ranks all take as many steps per batch as the rank with the most rows (one
        all-reduce per batch); the others pad with slices weighted 0.

        Nothing new: a `Stream` whose first pass ends without a batch (a `DirectoryStream` or
        `KafkaStream` resumed at its end whose `idle_timeout` passes, an exhausted `IterableStream`,
        or a stream with no data yet) trains 0 steps: `on_train_begin`, one empty epoch and
        `on_train_end` run, `ModelCheckpoint` writes no file and commits nothing, the stream stays
        where it was, and this returns. A dataset that is not a stream (a list, a generator) and
        yields nothing at all is a mistake: `ValueError`.

        >>> import torch
        >>> from recstream.data.streams import IterableStream
        >>> net = torch.nn.Linear(4, 2)
        >>> model = RecModel(net, torch.nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), lr=0.1),
        ...                  progress_bar=False)
        >>> stream = IterableStream(iter([(torch.randn(8, 4), torch.randint(0, 2, (8,)))] * 4))
        >>> model.online_train(stream, sink_size=2)  # trains the 4 batches, then the stream ends
        >>> model.online_train(stream, sink_size=2)  # a rerun: nothing new, 0 steps
        >>> stream.position()
        {'batches': 4}
        """
        check_bool("RecModel.online_train", "dataset_sink_mode", dataset_sink_mode)
        if dataset_sink_mode:
            check_int("RecModel.online_train", "sink_size", sink_size, minimum=1)
        network = self._micro_steps(micro_batch_size)
        check_dataset(train_dataset, "train_dataset")
        user_callbacks = as_callback_list(callbacks, "RecModel.online_train")
        self._restore_callbacks(user_callbacks)
        if isinstance(train_dataset, Stream) and train_dataset.commits_progress and \
                not any(isinstance(cb, ModelCheckpoint) for cb in user_callbacks):
            # Only where it matters (a stream that commits its progress: without checkpoints it never
            # commits, and a restart reads everything again), and once per call site (a warning, not a
            # log line: Python's default filter shows it once).
            warnings.warn("online_train without a ModelCheckpoint callback on a committing stream: nothing is "
                          "saved or committed, so a restart trains everything again", UserWarning, stacklevel=2)
        # a Stream's iteration ends only when its source has: an empty first pass is "nothing new"
        end = EndOfStream.EMPTY_PASS if isinstance(train_dataset, Stream) else EndOfStream.AFTER_DATA
        lockstep = self._lockstep(train_dataset)
        if lockstep is not None:
            train_dataset = lockstep
        helper = DatasetHelper(train_dataset, dataset_sink_mode, sink_size if dataset_sink_mode else -1,
                               epoch_num=None, device=self._device, end=end, ahead=batch_prefetch(self._network))
        params = self._train_params(None, train_dataset, dataset_sink_mode, sink_size, user_callbacks)
        params.online = True  # ModelCheckpoint: a restart continues the same series of files
        if not dataset_sink_mode:
            params.batch_num = dataset_size(train_dataset)
        epochs = itertools.count(self._resume_epoch + 1)
        # Tracking first, so user callbacks see this step's event time (publishers run after all).
        internal = [StreamStats(), StopOnSignal(on_signal=lockstep.request_stop if lockstep else None)]
        # No History here: online_train returns none, and one record per sink would grow without end.
        shown = [cb for cb in self._default_callbacks(user_callbacks) if not isinstance(cb, History)]
        cbs = internal + user_callbacks + shown
        if rank() != 0:  # printing, files and publishing happen once, on rank 0
            cbs = [cb for cb in cbs if not cb.rank_zero_only]
        with CallbackList(cbs) as cbs:
            # exactly once: position -> durable checkpoint -> commit (-> ranks' agreement) -> publish
            committer = OnlineCommitter(cbs, train_dataset, lockstep, helper)
            self._train_loop(epochs, helper, committer, params, first_step=self._resume_step, network=network)
        if params.cur_step_num == self._resume_step and helper.ended:
            log.info("online_train: the stream ended before its first batch: nothing new, 0 steps trained "
                     "(still at step %d)", self._resume_step)

    def _restore_callbacks(self, callbacks: list) -> None:
        """The first run after `restore`: the callbacks that keep a state go on from the checkpoint's
        (rank 0's, which wrote it; other ranks' callbacks start afresh)."""
        if self._restored is None:
            return
        (path, states), self._restored = self._restored, None
        if rank() == 0:
            load_callback_states(callbacks, states, path, self._resume_step)

    def _micro_steps(self, micro_batch_size) -> MicroSteps | None:
        """The step network that trains a batch as micro-steps, or None (one step per batch)."""
        check_int("RecModel.online_train", "micro_batch_size", micro_batch_size, minimum=1, allow_none=True)
        if micro_batch_size is None:
            return None
        # several ranks agree on the number of steps per batch (padding with zero-weight slices)
        return MicroSteps(self._train_network, micro_batch_size, sync=is_distributed())

    def _run_step(self, step, state, start, network):
        try:
            return super()._run_step(step, state, start, network)
        except BaseException:
            if isinstance(network, MicroSteps) and network.partial:
                state.partial_batch = True  # ModelCheckpoint writes no exception checkpoint of this
            raise

    def _lockstep(self, train_dataset) -> Lockstep | None:
        """Several ranks: this rank's share of the stream, handed out in step with the other ranks."""
        if not is_distributed():
            return None
        if self._loss_fn is None or self._optimizer is None:
            raise ValueError("RecModel.online_train on several ranks needs 'loss_fn' and 'optimizer' (a rank "
                             "without data trains a fill batch whose loss is weighted 0)")
        _split(train_dataset)
        return Lockstep(train_dataset)

    def restore(self, checkpoint, train_dataset=None) -> dict | None:
        """Load the newest checkpoint that loads (a file, or in a directory the newest valid one:
        truncated, corrupt or foreign files are skipped with a warning) into the network and
        optimizer; seek `train_dataset` to the saved position; continue numbering epochs and steps;
        keep the checkpoint's callback states for the next `online_train`'s callbacks.

        Returns the checkpoint's metadata, or None when there is no checkpoint there yet.
        """
        found = load_newest(checkpoint, self._network, self._optimizer)
        if found is None:
            return None
        path, meta = found
        self._resume_epoch = int(meta.get("epoch") or 0)
        self._resume_step = int(meta.get("cur_step_num") or 0)
        self._restored = (path, meta.get(CHECKPOINT_ENTRY))
        position = meta.get("train_position")
        if train_dataset is not None and position is not None:
            if not isinstance(train_dataset, SeekableDataset):
                raise TypeError(f"RecModel.restore: 'train_dataset' ({type(train_dataset).__name__}) cannot seek to "
                                f"the saved position {position!r}: it has no position()/seek() methods")
            _split(train_dataset)  # this rank's share first: its position is of its own files/partitions
            train_dataset.seek(_rank_position(train_dataset, position))
        log.info("restored %s (epoch %s, step %s)", path, self._resume_epoch, self._resume_step)
        return meta


def _split(dataset) -> None:
    """On several ranks, a stream that can split itself reads only this rank's share (idempotent);
    any other dataset is trained as given on each rank (give each rank its own data)."""
    if is_distributed() and isinstance(dataset, Stream) and dataset.splits_across_ranks:
        dataset.set_rank(rank(), world_size())


def _rank_position(dataset, position):
    """This rank's position from a checkpoint's: a job position (every rank's, online training on
    several ranks) or a single process's; the stream maps them to this number of ranks, or refuses."""
    parts = position["ranks"] if is_job_position(position) else [position]
    if len(parts) == 1 and world_size() == 1:
        return parts[0]
    if isinstance(dataset, Stream):
        return dataset.rank_position(parts, rank(), world_size())
    if len(parts) != world_size():
        raise ValueError(f"RecModel.restore: the checkpoint holds the positions of {len(parts)} rank(s) but this "
                         f"job has {world_size()}; a {type(dataset).__name__} cannot map them: restart with "
                         f"{len(parts)} rank(s)")
    return parts[rank()]


class _FillWeightedLoss(torch.nn.Module):
    """The user's loss, times the weight a batch carries in its label (`WeightedLabel`): a fill batch
    (several ranks, `Lockstep`) carries 0, so the rank takes part in the step's collectives with zero
    gradients. Other batches carry no weight: their losses pass through untouched."""

    def __init__(self, loss_fn):
        super().__init__()
        self.loss_fn = loss_fn

    def forward(self, outputs, label, *args, **kwargs):
        if isinstance(label, WeightedLabel):
            return self.loss_fn(outputs, label.labels, *args, **kwargs) * label.weight
        return self.loss_fn(outputs, label, *args, **kwargs)

