"""Row operations on feature-major ragged ids, in numpy (take, slice, concatenate).

These run on the host, in the input pipeline (re-batching, shuffling, in-memory datasets).
They are small memory-bound gathers: numpy does them single-threaded with no overhead,
whereas torch's intra-op OpenMP barriers made each one ~50x slower on the loaded 2-core
dev box (a barrier waits for a descheduled thread).

Layout: ``values`` flat; ``offsets`` [F * B + 1]; bag (f, b) is
``values[offsets[f*B + b] : offsets[f*B + b + 1]]``.

>>> import numpy as np
>>> values, offsets = np.array([10, 11, 20, 21, 22]), np.array([0, 1, 2, 4, 5])  # F=2, B=2
>>> v, o = take(values, offsets, 2, 2, np.array([1, 0]))
>>> v.tolist(), o.tolist()
([11, 10, 22, 20, 21], [0, 1, 2, 3, 5])
"""
from __future__ import annotations

from typing import Sequence

import numpy as np


def gather(values: np.ndarray, starts: np.ndarray, lens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Concatenate ``values[s:s+l]`` for every (s, l): (new values, new offsets)."""
    offsets = np.zeros(len(lens) + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    total = int(offsets[-1])
    if total == len(lens) and (lens == 1).all():  # single-hot: one id per bag
        return values[starts], offsets
    idx = np.repeat(starts - offsets[:-1], lens) + np.arange(total, dtype=np.int64)
    return values[idx], offsets


def _starts_lens(offsets: np.ndarray, nf: int, b: int) -> tuple[np.ndarray, np.ndarray]:
    return offsets[:-1].reshape(nf, b), np.diff(offsets).reshape(nf, b)


def take(values: np.ndarray, offsets: np.ndarray, nf: int, b: int, rows) -> tuple[np.ndarray, np.ndarray]:
    """Bags of examples `rows` (an index array or a slice), feature-major.

    Cost is O(selected bags), not O(batch): re-batching slices many small batches out of
    one big block, and must not re-scan the whole block for each.
    """
    starts = offsets[:-1].reshape(nf, b)[:, rows].reshape(-1)
    ends = offsets[1:].reshape(nf, b)[:, rows].reshape(-1)
    return gather(values, starts, ends - starts)


def concat(parts: Sequence[tuple[np.ndarray, np.ndarray, int]], nf: int) -> tuple[np.ndarray, np.ndarray]:
    """Concatenate (values, offsets, batch_size) parts along the example axis."""
    starts, lens, base = [], [], 0
    for values, offsets, b in parts:  # one iteration per part, not per row
        s, l = _starts_lens(offsets, nf, b)
        starts.append(s + base)
        lens.append(l)
        base += len(values)
    all_values = np.concatenate([p[0] for p in parts])
    return gather(all_values, np.concatenate(starts, 1).reshape(-1), np.concatenate(lens, 1).reshape(-1))
