"""`IterableStream`: any Python iterable of batches (or of row dicts) with the stream protocol.

Two modes:

* batches: items (``Batch`` or any batch the trainer accepts) pass through unchanged;
  position ``{"batches": n}`` = items consumed.
* rows (give ``schema`` and ``batch_size``): items are dicts ``{column: value}``, decoded
  in chunks with pyarrow like the other sources (bad rows are dead-lettered), cut into
  ``batch_size`` batches; position ``{"records": n}`` = row dicts consumed.

Seeking re-creates the iterable when `source` is a factory (a callable returning a new
iterable) and skips to the position; a one-shot iterable can only seek forward. The
stream never reads ahead of the last batch it yielded (in rows mode it pulls at most the
rows still missing from the current batch), so a one-shot source loses nothing between
iterations. It ends when the iterable does (a generator that blocks waits).

>>> from recstream.data import SyntheticCTR
>>> gen = SyntheticCTR(num_dense=2, num_categorical=2, batch_size=8)
>>> s = IterableStream(lambda: iter(gen.train_batches(10)), max_batches=3)
>>> first = [b.labels for b in s]; s.position()
{'batches': 3}
>>> s.seek({"batches": 1}); bool((next(iter(s)).labels == first[1]).all())
True
"""
from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

from ...validation import check_type
from ..schema import Schema
from .base import Stream
from .decoders import RowDecoder


class IterableStream(Stream):
    """Wrap `source` (an iterable, or a factory returning one). See the module docstring."""

    _needs_batch_size = False  # batches mode passes the source's batches through

    def __init__(self, source: Iterable | Callable[[], Iterable], schema: Schema | None = None,
                 batch_size: int | None = None, *, id_column: str | None = None, time_column: str | None = None,
                 fill_missing_dense: float | None = None, log1p_dense: bool = False,
                 max_batches: int | None = None, drop_remainder: bool = False,
                 dead_letter: str | os.PathLike | None = None) -> None:
        check_type("IterableStream", "schema", schema, Schema, allowed="a recstream.data.Schema", allow_none=True)
        if schema is not None and batch_size is None:
            raise ValueError("IterableStream: rows mode (a schema) needs 'batch_size'")
        if schema is None and (batch_size is not None or id_column or time_column):
            raise ValueError("IterableStream: 'batch_size', 'id_column' and 'time_column' need a 'schema' "
                             "(rows mode); batches pass through as they are")
        self._factory = source if callable(source) else None
        if self._factory is None:
            check_type("IterableStream", "source", source, Iterable, allowed="an iterable or a callable returning one")
        self._unit = "batches" if schema is None else "records"
        super().__init__(batch_size, max_batches=max_batches, drop_remainder=drop_remainder, dead_letter=dead_letter)
        self._decoder = None if schema is None else RowDecoder(
            schema, id_column=id_column, time_column=time_column, fill_missing_dense=fill_missing_dense,
            log1p_dense=log1p_dense)
        self._it: Iterator = iter(self._factory() if self._factory else source)
        self._consumed = 0  # items pulled from self._it

    def _initial_position(self) -> dict:
        return {self._unit: 0}

    def _rewind(self) -> None:
        """Nothing to drop: items are only pulled for the batch being built."""

    def _seek_to(self, position: dict) -> dict:
        n = position.get(self._unit)
        if set(position) != {self._unit} or isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"IterableStream.seek: expected {{{self._unit!r}: int >= 0}}, got {position!r}")
        if n < self._consumed:
            if self._factory is None:
                raise ValueError(f"IterableStream.seek: cannot go back to {n} (at {self._consumed}) on a one-shot "
                                 f"iterable; pass a factory (a callable returning a new iterable)")
            self._it, self._consumed = iter(self._factory()), 0
        skipped = sum(1 for _ in itertools.islice(self._it, n - self._consumed))
        if skipped < n - self._consumed:
            raise ValueError(f"IterableStream.seek: position {n} is past the end ({self._consumed + skipped} items)")
        self._consumed = n
        return {self._unit: n}

    def _advance(self, keys: np.ndarray, afters: np.ndarray) -> None:
        if afters.size:
            self._cursor = {"records": int(afters.max())}

    def _generate(self) -> Iterator[tuple[Any, dict, dict]]:
        if self._decoder is None:
            for item in self._it:
                self._consumed += 1
                self._cursor = {"batches": self._consumed}
                yield item, dict(self._cursor), {"ids": None, "event_time": None}
            return
        while True:
            need = self.batch_size - self._assembler.rows
            rows = list(itertools.islice(self._it, need))
            if rows:
                start = self._consumed
                self._consumed += len(rows)
                d = self._decoder.decode_rows(rows)
                n = d.n_records
                self._queue(d, np.zeros(n, dtype=np.int64), np.arange(start + 1, start + n + 1),
                            [{"record": start + b.index} for b in d.bad])
                yield from self._full_batches()
            if len(rows) < need:  # the iterable is exhausted
                yield from self._remainder()
                return
