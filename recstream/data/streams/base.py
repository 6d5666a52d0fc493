"""The stream protocol every source implements, and the loop they share.

A stream is an iterable of :class:`~recstream.data.Batch` of ``batch_size`` rows that
waits for new data (``idle_timeout=None``: forever; else the iteration ends after that
many seconds without a new record, first yielding the short remainder unless
``drop_remainder``). ``max_batches`` ends an iteration after that many batches.

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

A new ``iter()`` resumes just after the last batch yielded (read-ahead of an unfinished
iteration is dropped and read again), so ``for b in stream`` twice never loses rows.

>>> from recstream.data.streams import IterableStream
>>> s = IterableStream(lambda: iter(range(5)), max_batches=2)
>>> list(s), s.position(), list(s), s.position()
([0, 1], {'batches': 2}, [2, 3], {'batches': 4})
"""
from __future__ import annotations

import copy
import logging
import os
from collections import Counter
from typing import Any, Iterator

import numpy as np

from ..rebatch import check_batch_size
from .assembler import Assembler
from .deadletter import DeadLetter
from .records import Decoded, meta_tensors

log = logging.getLogger("recstream.data.streams")


class Stream:
    """Base class: subclasses implement ``_generate``, ``_seek_to``, ``_rewind`` (see below)."""

    def __init__(self, batch_size: int | None, *, max_batches: int | None = None, idle_timeout: float | None = None,
                 drop_remainder: bool = False, dead_letter: str | os.PathLike | DeadLetter | None = None) -> None:
        owner = type(self).__name__
        self.batch_size = None if batch_size is None else check_batch_size(batch_size, owner)
        if max_batches is not None and (isinstance(max_batches, bool) or not isinstance(max_batches, int)
                                        or max_batches < 0):
            raise ValueError(f"{owner}: 'max_batches' must be an int >= 0 or None, got {max_batches!r}")
        if idle_timeout is not None and not (isinstance(idle_timeout, (int, float)) and idle_timeout >= 0):
            raise ValueError(f"{owner}: 'idle_timeout' must be seconds >= 0 or None (wait forever), "
                             f"got {idle_timeout!r}")
        self.max_batches, self.idle_timeout = max_batches, idle_timeout
        self.drop_remainder = bool(drop_remainder)
        self.dead_letter = dead_letter if isinstance(dead_letter, DeadLetter) else DeadLetter(dead_letter)
        self._position: dict = self._initial_position()  # after the last batch yielded
        self._cursor: dict = copy.deepcopy(self._position)  # after the last record consumed
        self._meta: dict = {"ids": None, "event_time": None}
        self._seek_request: dict | None = None
        self._assembler = Assembler(self.batch_size or 1)
        self._closed = False
        self._iterating = False

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
        """Resume at `position` (from :meth:`position`): no record lost, none repeated."""
        if not isinstance(position, dict):
            raise TypeError(f"{type(self).__name__}.seek: 'position' must be a dict from position(), "
                            f"got {type(position).__name__}")
        self._check_open()
        if self._iterating:  # applied by the running iteration before its next batch
            self._seek_request = copy.deepcopy(position)
        else:
            self._apply_seek(position)

    def commit(self, position: dict) -> None:
        """Make `position` durable on the source side (default: nothing to do)."""

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
        self._iterating = True
        gen = self._generate()
        count = 0
        try:
            while self.max_batches is None or count < self.max_batches:
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
            gen.close()

    def _apply_seek(self, position: dict) -> None:
        self._seek_request = None
        self._assembler.clear()
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

    def _cut(self, n: int) -> tuple[Any, dict, dict]:
        """The next `n` queued rows as (batch, position after it, meta)."""
        batch, ids, times, keys, afters = self._assembler.take(n)
        self._advance(keys, afters)
        return batch, copy.deepcopy(self._cursor), meta_tensors(ids, times)

    def _full_batches(self) -> Iterator[tuple[Any, dict, dict]]:
        while self._assembler.rows >= self.batch_size:
            yield self._cut(self.batch_size)

    def _remainder(self) -> Iterator[tuple[Any, dict, dict]]:
        """At the end of an iteration: the short last batch, unless ``drop_remainder``."""
        if self._assembler.rows and not self.drop_remainder:
            yield self._cut(self._assembler.rows)

    def _advance(self, keys: np.ndarray, afters: np.ndarray) -> None:
        """Fold consumed records (source keys, offsets after them) into ``self._cursor``."""
        raise NotImplementedError
