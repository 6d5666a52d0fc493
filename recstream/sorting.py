"""Sorting and ``unique`` of 1-D integer tensors, fast on a CPU.

Embedding tables sort ids on every step: a hash table dedups its keys, a row-sparse optimizer
sums a gradient's duplicate rows, an insert orders the slots its keys want. On a CPU torch
sorts int64 with a comparison sort, while numpy's ``np.sort`` is vectorised (x86-simd-sort, in
numpy >= 2.0), several times faster (figures: docs/benchmarks.md). So on a CPU, for calls large enough that the sort
outweighs a few microseconds of conversions (``SORT_NUMPY_MIN``, ``UNIQUE_NUMPY_MIN``), these
functions sort with numpy (zero-copy views of the same memory), otherwise with torch; the
results are identical either way.

* `sort_bounded` -- values known to lie in ``[0, bound)`` (rows, slots): each value is
  packed with its position into one int64 and the packed values sorted, which gives the order
  too, stably, at the cost of a plain sort (``torch.sort(..., stable=True)`` otherwise).
* `unique` -- ``torch.unique(sorted=True)`` with inverse and counts: on a CPU values and
  positions packed the same way when the values' span allows (ids, keys prefixed by a feature
  number), numpy's ``argsort`` for arbitrary int64 (hashed keys).

>>> import torch
>>> sort_bounded(torch.tensor([5, 2, 5, 0]), bound=8)
(tensor([0, 2, 5, 5]), tensor([3, 1, 0, 2]))
>>> unique(torch.tensor([7, -3, 7, 7]), return_inverse=True, return_counts=True)
(tensor([-3,  7]), tensor([1, 0, 1, 1]), tensor([1, 3]))
"""
from __future__ import annotations

import numpy as np
import torch

__all__ = ["sort_bounded", "unique"]

# Sizes from which numpy's path wins (measured, one thread: below them a few microseconds of
# fixed cost per call -- conversions, a dozen small numpy calls -- outweigh the faster sort).
# At 4096 ids: sort_bounded 42 us vs torch.sort 152 us; unique 86-140 us vs torch.unique 97 us.
SORT_NUMPY_MIN = 1024
UNIQUE_NUMPY_MIN = 4096


def _packable(n: int, bound: int) -> int:
    """Bits that hold a position among `n`, if a value below `bound` and a position fit in an
    int64 together (0 otherwise)."""
    pos_bits = max(1, (n - 1).bit_length())
    return pos_bits if (bound - 1).bit_length() + pos_bits <= 62 else 0


def _sort_packed(array: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """(sorted values, order) of a non-negative int64 array whose values and positions fit
    together in ``62 - bits`` and `bits` bits (see `_packable`)."""
    # value << bits | position: distinct, so any sort is stable, and the order comes with it.
    packed = np.left_shift(array, bits)
    packed |= np.arange(array.size, dtype=np.int64)
    packed.sort()
    return packed >> bits, packed & ((1 << bits) - 1)


def sort_bounded(values: torch.Tensor, bound: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Stable ascending sort of a 1-D int64 tensor whose entries lie in ``[0, bound)``:
    ``(sorted values, order)`` with ``values[order] == sorted values``; equal values keep their
    order. The range is the caller's promise (not checked: that would cost a pass and a sync)."""
    n = values.numel()
    bits = _packable(n, bound) if values.device.type == "cpu" and n >= SORT_NUMPY_MIN else 0
    if not bits:
        ordered, order = torch.sort(values, stable=True)
        return ordered, order
    ordered, order = _sort_packed(values.contiguous().numpy(), bits)
    return torch.from_numpy(ordered), torch.from_numpy(order)


def unique(values: torch.Tensor, return_inverse: bool = False, return_counts: bool = False,
           bound: int | None = None):
    """``torch.unique(values, sorted=True, return_inverse=..., return_counts=...)`` of a 1-D
    integer tensor, the same results. On a CPU, values whose span (max - min) leaves room for a
    position in an int64 -- ids, keys that carry a feature number in their high bits -- are sorted
    packed with their positions (one plain sort, no argsort: ~2x faster at 26k values); hashed
    64-bit keys span everything and take the argsort. `bound`: entries are known to lie in
    ``[0, bound)``, which spares finding the span."""
    n = values.numel()
    if values.device.type != "cpu" or n < UNIQUE_NUMPY_MIN or values.dtype != torch.int64:
        return torch.unique(values, sorted=True, return_inverse=return_inverse, return_counts=return_counts)
    # numpy from here on too: a handful of passes over ~10^3-10^4 ints, where torch's per-op
    # overhead (~5 us) would cost as much as the work.
    array = values.contiguous().numpy()
    lo = 0 if bound is not None else int(array.min())
    bits = _packable(n, bound if bound is not None else int(array.max()) - lo + 1)  # python ints: no overflow
    if bits:
        ordered, order = _sort_packed(array - lo if lo else array, bits)
        if lo:
            ordered += lo
    else:
        order = np.argsort(array)
        ordered = array[order]
    first = np.empty(n, dtype=bool)  # first of a run of equal values
    first[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=first[1:])
    starts = np.flatnonzero(first)
    out = (torch.from_numpy(ordered[starts]),)
    if return_inverse:
        inverse = np.empty_like(order)
        inverse[order] = np.cumsum(first) - 1
        out += (torch.from_numpy(inverse),)
    if return_counts:
        counts = np.empty_like(starts)
        np.subtract(starts[1:], starts[:-1], out=counts[:-1])
        counts[-1] = n - starts[-1]
        out += (torch.from_numpy(counts),)
    return out if len(out) > 1 else out[0]
