"""The stream protocol every source implements, and the loop they share.

A stream is an iterable of [`Batch`][recstream.data.batch.Batch] of ``batch_size`` rows that
waits for new data (``idle_timeout=None``: forever; else the iteration ends after that
many seconds without a new record, first yielding the short remainder unless
``drop_remainder``). ``max_batches`` ends an iteration after that many batches. ``max_delay``
(seconds; None: no limit) bounds how long rows wait for a batch to fill: once the oldest
waiting row is that old, the rows are yielded as a short batch, so a slow stream's events
reach training within about ``max_delay`` seconds.

Position protocol (what exactly-once training builds on):

* ``position()``: JSON-able dict, the position just AFTER the last batch yielded. Call it
  in the iterating thread, right after a batch: read-ahead never leaks into it.
* ``seek(position)``: the next batch starts exactly there (also mid-iteration: the
  running iteration continues from there).
* ``commit(position)``: make a position durable on the source side (per source).
* ``reset()``: no-op (unbounded streams have no passes); ``close()``; context manager.
* ``last_batch_meta()``: ``{"ids": LongTensor | None, "event_time": DoubleTensor | None}``
  of the batch just yielded (same thread), when the source carries event ids / times.
* ``bad_records``: Counter of rejected records by reason (since the stream was made;
  a record read again after a seek back counts again); each is also written to the
  ``dead_letter`` file with its reason and source position.

Ranks (online training under ``torchrun``, see docs/distributed.md): a source that can split
its records across the ranks of a job (``splits_across_ranks``: `DirectoryStream` by file,
`KafkaStream` by partition) reads only rank r's share after ``set_rank(r, world_size)``; each
rank's position is its own. ``rank_position(positions, rank, world_size)`` gives this rank's
position from the positions a job of ``len(positions)`` ranks saved (a source that cannot remap
them to another number of ranks refuses, naming both). ``empty_batch()``: a batch of no rows
with the source's columns (None when the source cannot say).

A new ``iter()`` resumes just after the last batch yielded (read-ahead of an unfinished
iteration is dropped and read again), so ``for b in stream`` twice never loses rows.

Batching (`Assembler`): sources decode records in chunks whose sizes follow the
source (a poll, a file block) and shrink when records are bad. The assembler queues the
chunks and cuts exact batches; for each batch it also reports which records it
*consumed*, as per-record ``keys`` (a Kafka partition, a file) and ``afters`` (the source
offset just after the record), so the stream can say precisely where it stands after that
batch. A bad record is consumed with the first batch that ends after it (or at once when
no good row is waiting), so resuming from a batch's position neither skips a good record
nor re-reads one.

>>> from recstream.data.streams import IterableStream
>>> s = IterableStream(lambda: iter(range(5)), max_batches=2)
>>> list(s), s.position(), list(s), s.position()
([0, 1], {'batches': 2}, [2, 3], {'batches': 4})
"""
from __future__ import annotations

import copy
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import numpy as np

from ...validation import check_bool, check_int, check_number, check_type
from ..batch import Batch
from .deadletter import DeadLetter
from .records import Decoded, meta_tensors

log = logging.getLogger("recstream.data.streams")


class Stream:
    """Base class: subclasses implement ``_generate``, ``_seek_to``, ``_rewind`` (see below)."""

    _needs_batch_size = True  # False where batches may pass through as they come (IterableStream)
    splits_across_ranks = False  # True where set_rank() gives each rank its own share of the records

    def __init__(self, batch_size: int | None, *, max_batches: int | None = None, idle_timeout: float | None = None,
                 drop_remainder: bool = False, dead_letter: str | os.PathLike | DeadLetter | None = None,
                 max_delay: float | None = None) -> None:
        owner = type(self).__name__
        self.batch_size = check_int(owner, "batch_size", batch_size, minimum=1, allow_none=not self._needs_batch_size)
        self.max_batches = check_int(owner, "max_batches", max_batches, minimum=0, allow_none=True)
        # seconds without a new record before an iteration ends; None waits forever
        self.idle_timeout = check_number(owner, "idle_timeout", idle_timeout, minimum=0, allow_none=True)
        self.drop_remainder = check_bool(owner, "drop_remainder", drop_remainder)
        # seconds a partial batch may wait for more rows before it is yielded short; None: until full
        self.max_delay = check_number(owner, "max_delay", max_delay, minimum=0, allow_none=True)
        self._partial_since: float | None = None  # when the rows waiting now started to wait
        check_type(owner, "dead_letter", dead_letter, (str, os.PathLike, DeadLetter), allowed="a path or a DeadLetter",
                   allow_none=True)
        self.dead_letter = dead_letter if isinstance(dead_letter, DeadLetter) else DeadLetter(dead_letter)
        self._position: dict = self._initial_position()  # after the last batch yielded
        self._cursor: dict = copy.deepcopy(self._position)  # after the last record consumed
        self._meta: dict = {"ids": None, "event_time": None}
        self._seek_request: dict | None = None
        self._assembler = Assembler(self.batch_size or 1)
        self._closed = False
        self._iterating = False
        self._interrupt = threading.Event()  # set by interrupt(): the running iteration ends
        self.rank, self.world_size = 0, 1  # whose share of the records this stream reads (set_rank)

    # --- subclass hooks --------------------------------------------------------------------
    def _initial_position(self) -> dict:
        return {}

    def _generate(self) -> Iterator[tuple[Any, dict, dict]]:
        """Yield (batch, position after it, meta) from the current source state, forever
        or until idle/exhausted."""
        raise NotImplementedError

    def _seek_to(self, position: dict) -> dict:
        """Point the source at `position` (validated); return it normalized. Read-ahead is
        dropped by the caller."""
        raise NotImplementedError

    def _set_rank(self, rank: int, world_size: int) -> None:
        """Read only rank `rank`'s share of the records from now on (sources that can split)."""
        raise TypeError(f"{type(self).__name__} cannot split its records across ranks; give each rank a source "
                        "of its own (e.g. its own files, partitions or iterable)")

    def _rewind(self) -> None:
        """Make the source continue right after the last yielded batch (drop read-ahead).

        The cursor, not the position: it may be ahead only over bad records, which need not
        be read (and dead-lettered) again."""
        self._apply_seek(self._cursor)

    # --- public protocol -------------------------------------------------------------------
    @property
    def bad_records(self) -> Counter:
        """Records rejected so far, by reason."""
        return self.dead_letter.counts

    def position(self) -> dict:
        """Where the next batch starts: just after the last batch yielded (a copy)."""
        return copy.deepcopy(self._position)

    def last_batch_meta(self) -> dict:
        """``{"ids": LongTensor|None, "event_time": DoubleTensor|None}`` of the last batch yielded."""
        return dict(self._meta)

    def seek(self, position: dict) -> None:
        """Resume at `position` (from `position`): no record lost, none repeated."""
        check_type(f"{type(self).__name__}.seek", "position", position, dict, allowed="a dict from position()")
        self._check_open()
        if self._iterating:  # applied by the running iteration before its next batch
            self._seek_request = copy.deepcopy(position)
        else:
            self._apply_seek(position)

    @property
    def commits_progress(self) -> bool:
        """Whether `commit` makes positions durable on the source side (a restart then resumes from
        the last committed one), so that training without checkpoints would lose that."""
        return False

    def commit(self, position: dict) -> None:
        """Make `position` durable on the source side (default: nothing to do)."""

    def set_rank(self, rank: int, world_size: int) -> None:
        """Read only rank `rank`'s share of the records, of `world_size` ranks (before iterating or
        seeking; calling it again with the same values does nothing)."""
        owner = f"{type(self).__name__}.set_rank"
        check_int(owner, "world_size", world_size, minimum=1)
        check_int(owner, "rank", rank, minimum=0, maximum=world_size - 1)
        if (rank, world_size) == (self.rank, self.world_size):
            return
        self._check_open()
        if self._iterating:
            raise RuntimeError(f"{owner}: the stream is being iterated; set the rank before training")
        self._set_rank(rank, world_size)
        self.rank, self.world_size = rank, world_size

    def rank_position(self, positions: list, rank: int, world_size: int) -> dict:
        """This rank's position, from the positions (in rank order) a job of ``len(positions)``
        ranks saved. The default maps only the same number of ranks (each keeps its own)."""
        check_type(f"{type(self).__name__}.rank_position", "positions", positions, list, allowed="a list of positions")
        if len(positions) != world_size:
            raise ValueError(f"{type(self).__name__}: the checkpoint holds the positions of {len(positions)} rank(s) "
                             f"but this job has {world_size}; this source cannot move them to another number of "
                             f"ranks: restart with {len(positions)} rank(s)")
        return positions[rank]

    def empty_batch(self):
        """A batch of no rows with this source's columns, or None (default: unknown)."""
        return None

    def interrupt(self) -> None:
        """End the running iteration promptly, even while it waits for data (any thread, or a
        signal handler). Nothing is lost: rows read but not yet yielded are read again by the
        next iteration. Without a running iteration this does nothing."""
        if self._iterating:
            self._interrupt.set()

    def _wait(self, seconds: float) -> bool:
        """Sleep up to `seconds` (an idle source waiting for data); True if interrupted."""
        return self._interrupt.wait(seconds)

    def reset(self) -> None:
        """No-op: an unbounded stream has no passes; a new iteration continues where it stands."""

    def close(self) -> None:
        self._closed = True
        self.dead_letter.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def get_dataset_size(self) -> None:
        """Unknown: the stream is unbounded."""
        return None

    # --- the loop ------------------------------------------------------------------------
    def __iter__(self):
        self._check_open()
        if self._seek_request is not None:
            self._apply_seek(self._seek_request)
        else:
            self._rewind()
        self._interrupt.clear()
        self._iterating = True
        gen = self._generate()
        count = 0
        try:
            while self.max_batches is None or count < self.max_batches:
                if self._interrupt.is_set():
                    return
                if self._seek_request is not None:
                    gen.close()
                    self._apply_seek(self._seek_request)
                    gen = self._generate()
                try:
                    batch, position, meta = next(gen)
                except StopIteration:  # idle: bad records read after the last batch count as consumed
                    if self._assembler.rows == 0:
                        self._position = copy.deepcopy(self._cursor)
                    return
                self._position, self._meta = position, meta
                count += 1
                yield batch
        finally:
            self._iterating = False
            self._interrupt.clear()
            gen.close()

    def _apply_seek(self, position: dict) -> None:
        self._seek_request = None
        self._assembler.clear()
        self._partial_since = None
        self._position = self._seek_to(copy.deepcopy(position))
        self._cursor = copy.deepcopy(self._position)
        self._meta = {"ids": None, "event_time": None}

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"{type(self).__name__} is closed")

    # --- helpers for subclasses ------------------------------------------------------------
    def _queue(self, decoded: Decoded, keys: np.ndarray, afters: np.ndarray, sources: list[dict]) -> None:
        """Dead-letter the bad records of `decoded`, then queue it for batching."""
        if decoded.bad:
            self.dead_letter.write(decoded.bad, sources)
        consumed = self._assembler.add(decoded, keys, afters)
        if consumed is not None:
            self._advance(*consumed)
        if self._assembler.rows and self._partial_since is None:
            self._partial_since = time.monotonic()

    def _cut(self, n: int) -> tuple[Any, dict, dict]:
        """The next `n` queued rows as (batch, position after it, meta)."""
        batch, ids, times, keys, afters = self._assembler.take(n)
        self._advance(keys, afters)
        if not self._assembler.rows:
            self._partial_since = None
        return batch, copy.deepcopy(self._cursor), meta_tensors(ids, times)

    def _full_batches(self) -> Iterator[tuple[Any, dict, dict]]:
        while self._assembler.rows >= self.batch_size:
            yield self._cut(self.batch_size)

    def _overdue(self) -> Iterator[tuple[Any, dict, dict]]:
        """The waiting rows as a short batch once the oldest waited `max_delay` (freshness on a
        slow stream: events reach training within about `max_delay` seconds)."""
        if self.max_delay is not None and self._assembler.rows and self._partial_since is not None \
                and time.monotonic() - self._partial_since >= self.max_delay:
            yield self._cut(self._assembler.rows)

    def _remainder(self) -> Iterator[tuple[Any, dict, dict]]:
        """At the end of an iteration: the short last batch, unless ``drop_remainder``."""
        if self._assembler.rows and not self.drop_remainder:
            yield self._cut(self._assembler.rows)

    def _advance(self, keys: np.ndarray, afters: np.ndarray) -> None:
        """Fold consumed records (source keys, offsets after them) into ``self._cursor``."""
        raise NotImplementedError


# --- batching ------------------------------------------------------------------------------
class _Entry:
    """One decoded chunk; records ``[rec:]`` and rows ``[row:]`` are not consumed yet."""

    __slots__ = ("batch", "rows", "ids", "times", "keys", "afters", "row", "rec")

    def __init__(self, d: Decoded, keys: np.ndarray, afters: np.ndarray) -> None:
        self.batch, self.rows, self.ids, self.times = d.batch, d.rows, d.ids, d.event_time
        self.keys, self.afters = keys, afters
        self.row, self.rec = 0, 0

    @property
    def left(self) -> int:
        return int(self.rows.size) - self.row


class Assembler:
    """Queue of decoded chunks, cut into exact batches (see the module docstring).

    >>> import numpy as np, torch
    >>> from recstream.features import Features
    >>> def chunk(rows, n):  # n records, of which `rows` are good
    ...     k = len(rows)
    ...     b = Batch(Features.from_lengths(torch.zeros(k, 1), torch.zeros(0), torch.zeros(0, k)), torch.zeros(k))
    ...     return Decoded(b, np.array(rows), None, None, [], n)
    >>> a = Assembler(2)
    >>> a.add(chunk([0, 2], 3), np.zeros(3, int), np.array([10, 20, 30]))
    >>> batch, ids, times, keys, afters = a.take(2)
    >>> batch.batch_size, afters.tolist()
    (2, [10, 20, 30])
    """

    def __init__(self, batch_size: int) -> None:
        self.batch_size = batch_size
        self._entries: list[_Entry] = []
        self.rows = 0  # good rows waiting

    def add(self, d: Decoded, keys: np.ndarray, afters: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """Queue `d` (``keys[i]``/``afters[i]``: record i's source and offset after it).

        Returns the records consumed right away (a chunk of bad records only, with no good
        row waiting before it), else None.
        """
        if d.n_records == 0:
            return None
        if len(keys) != d.n_records or len(afters) != d.n_records:
            raise ValueError(f"Assembler.add: need one key and offset per record ({d.n_records}), "
                             f"got {len(keys)} and {len(afters)}")
        if d.num_rows == 0 and not self._entries:
            return np.asarray(keys), np.asarray(afters)
        self._entries.append(_Entry(d, np.asarray(keys), np.asarray(afters)))
        self.rows += d.num_rows
        return None

    def take(self, n: int):
        """(Batch of the next `n` rows, ids, times, consumed keys, consumed afters)."""
        if not 0 < n <= self.rows:
            raise ValueError(f"Assembler.take: {n} rows asked, {self.rows} waiting")
        parts, ids, times, keys, afters = [], [], [], [], []
        need = n
        while need or (self._entries and self.rows == need == 0):
            e = self._entries[0]
            k = min(e.left, need)
            if k:
                whole = e.row == 0 and k == e.rows.size
                parts.append(e.batch if whole else e.batch.slice(e.row, e.row + k))
                if e.ids is not None:
                    ids.append(e.ids[e.row:e.row + k])
                if e.times is not None:
                    times.append(e.times[e.row:e.row + k])
                last = int(e.rows[e.row + k - 1])
                e.row += k
                need -= k
                self.rows -= k
            if e.left == 0:  # chunk done: its trailing bad records go with this batch
                keys.append(e.keys[e.rec:])
                afters.append(e.afters[e.rec:])
                self._entries.pop(0)
            else:
                keys.append(e.keys[e.rec:last + 1])
                afters.append(e.afters[e.rec:last + 1])
                e.rec = last + 1
        batch = parts[0] if len(parts) == 1 else Batch.concat(parts)
        return (batch, np.concatenate(ids) if ids else None, np.concatenate(times) if times else None,
                np.concatenate(keys), np.concatenate(afters))

    def first_pending(self) -> dict[int, int]:
        """Per key, the ``after`` of its first record not consumed yet (for rewinding)."""
        first: dict[int, int] = {}
        for e in self._entries:
            keys, afters = e.keys[e.rec:], e.afters[e.rec:]
            uniq, idx = np.unique(keys, return_index=True)
            for k, i in zip(uniq.tolist(), idx.tolist(), strict=True):
                first.setdefault(k, int(afters[i]))
        return first

    def drop_keys(self, dropped) -> None:
        """Forget every pending record of the keys in `dropped` (revoked partitions)."""
        dropped = np.asarray(sorted(dropped))
        kept: list[_Entry] = []
        for e in self._entries:
            keep_rec = ~np.isin(e.keys[e.rec:], dropped)
            rows = e.rows[e.row:] - e.rec
            keep_row = keep_rec[rows]
            if keep_rec.all():
                kept.append(e)
                continue
            new_index = np.cumsum(keep_rec) - 1
            d = Decoded(e.batch.slice(e.row, e.rows.size).take(np.flatnonzero(keep_row)), new_index[rows[keep_row]],
                        None if e.ids is None else e.ids[e.row:][keep_row],
                        None if e.times is None else e.times[e.row:][keep_row], [], int(keep_rec.sum()))
            if d.n_records:
                kept.append(_Entry(d, e.keys[e.rec:][keep_rec], e.afters[e.rec:][keep_rec]))
        self._entries = kept
        self.rows = sum(e.left for e in kept)

    def clear(self) -> None:
        self._entries, self.rows = [], 0
