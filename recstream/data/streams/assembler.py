"""Cut decoded chunks into batches of exactly ``batch_size`` rows, tracking consumed records.

Sources decode records in chunks whose sizes follow the source (a poll, a file block) and
shrink when records are bad. :class:`Assembler` queues the chunks and cuts exact batches;
for each batch it also reports which records it *consumed*, as per-record ``keys`` (a
Kafka partition, a file) and ``afters`` (the source offset just after the record), so the
stream can say precisely where it stands after that batch. A bad record is consumed with
the first batch that ends after it (or at once when no good row is waiting), so resuming
from a batch's position neither skips a good record nor re-reads one.

>>> import numpy as np, torch
>>> from recstream.data.batch import Batch, Features
>>> from recstream.data.streams.records import Decoded
>>> def chunk(rows, n):  # n records, of which `rows` are good
...     b = Batch(Features.from_lengths(torch.zeros(len(rows), 1), torch.zeros(0), torch.zeros(0, len(rows))), torch.zeros(len(rows)))
...     return Decoded(b, np.array(rows), None, None, [], n)
>>> a = Assembler(2)
>>> a.add(chunk([0, 2], 3), np.zeros(3, int), np.array([10, 20, 30]))
>>> batch, ids, times, keys, afters = a.take(2)
>>> batch.batch_size, afters.tolist()
(2, [10, 20, 30])
"""
from __future__ import annotations

import numpy as np

from ..batch import Batch
from .records import Decoded


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
    """Queue of decoded chunks (see the module docstring)."""

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
            for k, i in zip(uniq.tolist(), idx.tolist()):
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
