"""Online training on several ranks: each rank's stream, in lock-step with the other ranks.

Every training step is a set of collectives (DDP's gradient all-reduce, the sparse all-reduce,
hybrid_parallel's all-to-alls, a sharded checkpoint's save) that every rank must enter. A
stream, though, gives each rank its own records (`Stream.set_rank`: its files, its Kafka
partitions), and one rank's share can be idle, or end, while others still have data. If that
rank simply waited for data, the others would wait for it inside their next collective: the job
would hang.

`Lockstep(stream)` wraps one rank's stream so that all ranks hand out the same number of batches,
in step. Before each batch the ranks exchange three flags in one tiny all-reduce (a *round*):
"I have a batch", "my stream's pass ended", "I want to stop". Then every rank acts on the same
sums:

- someone has a batch: every rank hands out one: its own, or, if it has none, a *fill batch*
  (one row, no ids, zero dense values) whose label carries the loss weight 0 (`with_loss_weight`;
  `RecModel`'s loss multiplies by it), so the rank takes part in the step's collectives without
  training anything;
- nobody has a batch: no step (all ranks wait and poll again), or, once every rank's pass ended,
  the pass ends on every rank at once (a finite stream ends cleanly everywhere);
- someone wants to stop (a signal, the data channel closing): the pass ends on every rank after
  the same batch, and the wrapper stays stopped (later passes are empty, which ends training).

Nothing cheaper can stand in for the round: DDP synchronises each step only once it runs, and
whether a step runs at all is what the ranks must agree on first. It costs one all-reduce of
three integers per batch, on a process group of its own (the rounds run in the thread that
reads the data, the data channel's producer in sink mode, beside the main thread's collectives).

Each rank reads its stream in a reader thread of its own, so a round asks "is there a batch
now?" without blocking in an idle source. Positions stay per rank: ``position()`` is this rank's
position after the last batch it handed out (a fill batch leaves it unchanged); a checkpoint
stores all ranks' positions together as a *job position* ``{"step": s, "ranks": [p0, p1, ...]}``
(`gather_positions`), and ``commit(job_position)`` commits this rank's own part.

The step-side helpers run in the main thread, at the end of each step, on the default group:
`gather_positions` (every rank's position, for the checkpoint) and `agree` (any rank's stop
request stops all ranks after the same step; the newest step any rank checkpointed lets every
rank commit its part of that checkpoint's positions).

One process (a job of one rank) hands out its batches unchanged:

>>> steps = Lockstep([(torch.ones(2, 1), torch.zeros(2))] * 3)
>>> [len(x) for x, _ in steps], steps.fills
([2, 2, 2], 0)
>>> fill_batch((torch.ones(3, 2), torch.zeros(3)))[0].shape  # a generic batch: its first row
torch.Size([1, 2])
"""
from __future__ import annotations

import copy
import logging
import queue
import threading

import torch
import torch.distributed as dist

from ..data.batch import Batch, with_loss_weight
from ..data.channel import Marks, put_unless_stopped
from ..data.protocol import (
    BadRecordDataset,
    CommittableDataset,
    SeekableDataset,
    interrupt,
    reset,
)
from ..features import Features
from ..validation import check_number
from .context import is_distributed, rank, world_size
from .sharding import _slice

log = logging.getLogger("recstream.distributed")

__all__ = ["Lockstep", "fill_batch", "gather_positions", "agree", "is_job_position"]

_END = object()  # the reader's pass of the stream ended


class _Failed:
    def __init__(self, exc: BaseException):
        self.exc = exc


class Lockstep:
    """One rank's `dataset`, handing out batches in step with the other ranks (module docstring).

    `wait`: seconds a round waits for this rank's next batch when it has been getting data (or
    when nobody has): long enough for a busy reader, short enough to notice a stop at once.
    """

    def __init__(self, dataset, wait: float = 0.05):
        self.dataset = dataset
        self.wait = check_number("Lockstep", "wait", wait, minimum=0)
        self.rank, self.world_size = rank(), world_size()
        # rounds run in whichever thread iterates this wrapper, concurrently with the main thread's
        # collectives: a group of their own keeps the two sequences apart
        self._group = dist.new_group(backend="gloo") if is_distributed() else None
        self._seekable = isinstance(dataset, SeekableDataset)
        self._position = dataset.position() if self._seekable else None
        self._meta: dict = {"ids": None, "event_time": None, "fill": False}
        self._template = None  # the last batch of our own: what a fill batch is made like
        self._wish = threading.Event()  # this rank wants to stop (a signal, the channel closing)
        self.stopped = False  # the ranks agreed to stop: no batch any more
        self.fills = 0  # fill batches handed out
        self.durable_step = -1  # the step of the newest job position a complete checkpoint holds
        self.committed_step = -1  # ... and of the newest whose part this rank committed

    # --- the dataset protocol ------------------------------------------------------------------
    def position(self):
        """This rank's position after the last batch of its own handed out."""
        return copy.deepcopy(self._position)

    def seek(self, position) -> None:
        """Resume this rank's stream at `position` (its own part of a job position)."""
        self._position = copy.deepcopy(position)
        self.dataset.seek(position)

    def last_batch_meta(self) -> dict:
        """The stream's metadata of the batch just handed out, with ``"fill"``: whether it was a fill."""
        return dict(self._meta)

    def commit(self, job_position: dict):
        """A checkpoint holding `job_position` is complete: commit this rank's part to the source."""
        result = self.commit_own(job_position)
        self.durable_step = max(self.durable_step, int(job_position["step"]))
        return result

    def commit_own(self, job_position: dict):
        self.committed_step = max(self.committed_step, int(job_position["step"]))
        if isinstance(self.dataset, CommittableDataset):
            return self.dataset.commit(job_position["ranks"][self.rank])
        return None

    def request_stop(self) -> None:
        """Ask all ranks to stop (safe in a signal handler): the next round or step end agrees on it."""
        self._wish.set()

    @property
    def stop_wished(self) -> bool:
        return self._wish.is_set()

    def interrupt(self) -> None:
        """The data channel is closing: stop, with the other ranks (they close theirs at the same step)."""
        self._wish.set()

    def reset(self) -> None:
        reset(self.dataset)

    def get_dataset_size(self) -> None:
        return None

    @property
    def bad_records(self):
        if not isinstance(self.dataset, BadRecordDataset):
            raise AttributeError("bad_records")
        return self.dataset.bad_records

    # --- one pass ------------------------------------------------------------------------------
    def __iter__(self):
        if self.stopped:
            return
        if self._seekable and self.dataset.position() != self._position:
            self.dataset.seek(self._position)  # batches the last pass read but did not hand out
        reader = _Reader(self.dataset)
        had = others = True
        try:
            while True:
                item = reader.peek(self.wait if had or not others else 0.0)
                has, ended = isinstance(item, tuple), item is _END
                batches, passes_ended, stops = self._round(has, ended, self._wish.is_set())
                if stops:
                    self.stopped = True
                    return
                if not batches:
                    if passes_ended == self.world_size:
                        return  # every rank's stream ended its pass: this pass ends everywhere
                    others = False
                    continue  # nobody has data: wait, together
                had = others = True
                try:
                    yield self._take(reader) if has else self._fill()
                except GeneratorExit:
                    # closed between rounds (the channel closing, the training loop leaving): the
                    # other ranks are in, or will enter, the next round; meet them there with a stop
                    if not self.stopped:
                        self.stopped = True
                        self._round(False, False, True)
                    raise
                had = has
        finally:
            reader.stop()
            if self._seekable and self.dataset.position() != self._position:
                # the reader read batches nobody trained: the stream itself resumes after the last
                # one handed out (a later run, or a checkpoint of it, must not skip them)
                self.dataset.seek(self._position)

    def _round(self, has: bool, ended: bool, stop: bool) -> list[int]:
        """The ranks' summed flags. Needed once per batch, and nothing cheaper stands in for it: DDP
        synchronises only inside a step, and whether the step runs at all is decided here."""
        flags = [int(has), int(ended), int(stop)]
        if self._group is None:  # one process: its own flags are the sums
            return flags
        flags = torch.tensor(flags, dtype=torch.int64)
        dist.all_reduce(flags, group=self._group)
        return flags.tolist()

    def _take(self, reader: _Reader):
        batch, position, meta = reader.take()
        self._position, self._template = position, batch
        self._meta = dict(meta or {"ids": None, "event_time": None}, fill=False)
        return batch

    def _fill(self):
        template = self._template
        if template is None:
            empty = getattr(self.dataset, "empty_batch", None)
            template = empty() if callable(empty) else None
        if template is None:
            raise RuntimeError(f"Lockstep: rank {self.rank} has no batch yet while other ranks do, and its "
                               f"{type(self.dataset).__name__} cannot describe an empty batch (empty_batch()); "
                               "it cannot take part in the step")
        self.fills += 1
        self._meta = {"ids": None, "event_time": None, "fill": True}
        return with_loss_weight(fill_batch(template), 0.0)  # the batch carries its weight into the loss


class _Reader:
    """Iterates one pass of a dataset in a thread of its own; `peek` asks for the next batch
    without blocking longer than asked. Items: ``(batch, position, meta)``, then `_END`."""

    def __init__(self, dataset):
        self._dataset = dataset
        self._marks = Marks(dataset)
        self._queue: queue.Queue = queue.Queue(maxsize=2)
        self._head = None
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="recstream-lockstep-reader")
        self._thread.start()

    def _run(self) -> None:
        try:
            for batch in self._dataset:
                marked = self._marks.item(batch)  # read in the iterating thread, right after its batch
                if not self._put((batch, marked.position, marked.meta)):
                    return
            self._put(_END)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, which re-raises it
            self._put(_Failed(exc))

    def _put(self, item) -> bool:
        return put_unless_stopped(self._queue, item, self._halt)

    def peek(self, timeout: float):
        """The next item (left in place), or None if none came within `timeout` seconds."""
        if self._head is None:
            try:
                self._head = self._queue.get(timeout=timeout) if timeout > 0 else self._queue.get_nowait()
            except queue.Empty:
                return None
        if isinstance(self._head, _Failed):
            raise self._head.exc
        return self._head

    def take(self):
        item, self._head = self._head, None
        return item

    def stop(self, timeout: float = 10.0) -> None:
        """End the pass: the source's wait for data is interrupted; what was read stays unused."""
        self._halt.set()
        self._thread.join(0.0)
        waited = 0.0
        while self._thread.is_alive() and waited < timeout:
            interrupt(self._dataset)  # repeated: the thread may only be about to enter the source's wait
            self._thread.join(0.05)
            waited += 0.05
        if self._thread.is_alive():
            log.warning("Lockstep: the stream reader is still blocked in its source; it stops when the source yields")


def fill_batch(template):
    """A one-row batch like `template` that trains nothing when weighted 0: for a `Batch`, zero
    dense values, no ids in any bag (no embedding row is touched) and label 0; otherwise the
    template's first row."""
    if isinstance(template, Batch):
        f = template.features
        dense = torch.zeros((1,) + tuple(f.dense.shape[1:]), dtype=f.dense.dtype, device=f.dense.device)
        values = f.values.new_zeros(0)
        offsets = f.offsets.new_zeros(f.num_features + 1)
        labels = template.labels.new_zeros((1,) + tuple(template.labels.shape[1:]))
        return Batch(Features(dense, values, offsets, 1, f.num_features, f.keys), labels)
    return _slice(template, 0, 1)


def is_job_position(position) -> bool:
    """Whether `position` is a job position (every rank's, see the module docstring)."""
    return isinstance(position, dict) and set(position) == {"step", "ranks"} and isinstance(position["ranks"], list)


def gather_positions(step: int, position) -> dict:
    """Every rank's `position` (collective, main thread): the job position of step `step`."""
    positions = [None] * world_size()
    dist.all_gather_object(positions, position)  # small JSON values, in memory
    return {"step": int(step), "ranks": positions}


def agree(stop: bool, durable_step: int) -> tuple[bool, int]:
    """(whether any rank asks to stop, the newest step any rank checkpointed) - collective, one
    all-reduce of two integers; run by every rank after the same step."""
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"  # NCCL reduces device tensors only
    flags = torch.tensor([int(stop), int(durable_step)], dtype=torch.int64, device=device)
    dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    stop_any, newest = flags.tolist()
    return bool(stop_any), int(newest)
