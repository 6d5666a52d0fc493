"""Turn a stream of batches of any sizes into batches of exactly ``batch_size`` rows.

Readers get record batches whose sizes follow the file layout (Parquet row groups, CSV
blocks) and shrink when bad rows are skipped; :class:`Rebatcher` evens them out, keeping
at most ``batch_size`` + one incoming batch of rows in memory.

>>> import torch
>>> from recstream.data.batch import Batch, Features
>>> def rows(n):
...     return Batch(Features.from_lengths(torch.zeros(n, 1), torch.zeros(0), torch.zeros(0, n)), torch.zeros(n))
>>> r = Rebatcher(4, drop_remainder=False)
>>> [b.batch_size for b in r.add(rows(3))] + [b.batch_size for b in r.add(rows(6))] + [b.batch_size for b in r.flush()]
[4, 4, 1]
"""
from __future__ import annotations

from typing import Iterator

from .batch import Batch


def check_batch_size(batch_size, owner: str) -> int:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"{owner}: 'batch_size' must be an int >= 1, got {batch_size!r}")
    return batch_size


class Rebatcher:
    """Accumulates batches and yields ``batch_size``-row batches (the last may be short)."""

    def __init__(self, batch_size: int, drop_remainder: bool = False) -> None:
        self.batch_size = check_batch_size(batch_size, "Rebatcher")
        self.drop_remainder = bool(drop_remainder)
        self._pending: list[Batch] = []
        self._rows = 0

    def add(self, batch: Batch) -> Iterator[Batch]:
        """Queue `batch`; yield every full batch now available."""
        n = batch.batch_size
        if n == 0:
            return
        if not self._pending and n == self.batch_size:  # the common case: pass through untouched
            yield batch
            return
        self._pending.append(batch)
        self._rows += n
        if self._rows < self.batch_size:
            return
        merged = Batch.concat(self._pending)
        full = self._rows - self._rows % self.batch_size
        for start in range(0, full, self.batch_size):
            yield merged.slice(start, start + self.batch_size)
        self._pending = [merged.slice(full, self._rows)] if full < self._rows else []
        self._rows -= full

    def flush(self) -> Iterator[Batch]:
        """End of stream: yield the short remainder unless ``drop_remainder``; then reset."""
        pending, rows = self._pending, self._rows
        self._pending, self._rows = [], 0
        if rows and not self.drop_remainder:
            yield Batch.concat(pending)
