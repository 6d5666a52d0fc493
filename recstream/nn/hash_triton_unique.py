"""The kernels of `hash_static.static_unique` of a batch's keys (no mask) as a sort and two Triton
launches: the first step of the Triton backend's training lookup (``TritonBackend.unique_plan`` in
`hash_triton`, which launches them), 17 torch ops on the torch path.

After ``torch.sort`` (stable, as `static_unique`'s):

* ``starts`` (one launch): each program counts the runs that start in its block of the sorted keys
  (an entry whose key differs from the one before it);
* ``runs`` (one launch): each entry's run (its key's index among the distinct keys: the runs that
  start in earlier blocks, from the counts, plus a cumsum within its block) goes to ``inverse`` at
  its place in the batch; the first entry of a run writes its key to ``uniq``, the last its end
  (exclusive) to ``ends``; index ``k`` past the last run is padding (``uniq[k]`` the largest key,
  ``ends[k] = n``), written by lane ``k``;
* the counts, ``counts[k] = ends[k] - ends[k - 1]`` (0 for padding) and ``valid = counts > 0``,
  are computed by the table's probe launch, which reads ``ends`` (`hash_triton._probe_fn`).

Every output matches `static_unique`'s exactly, padding included (tests/nn/test_hash_triton.py).
Race-free: every word is written by one lane only (``inverse`` at a permutation's entries; ``uniq`` and
``ends`` at a run by that run's first / last entry, past the runs by the lane of that index), and a
launch reads only what earlier launches wrote, so the results do not depend on the order programs run in.
"""
from __future__ import annotations

import functools

__all__ = ["BLOCK", "kernels"]

BLOCK = 256  # sorted entries per program
tl = None  # triton.language, set by `_kernels` (triton is optional: this module imports without it)


def _starts_fn(ordered, block_counts, n, BLOCK: tl.constexpr):
    j = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inb = j < n
    key = tl.load(ordered + j, mask=inb, other=0)
    prev = tl.load(ordered + j - 1, mask=inb & (j > 0), other=0)
    first = inb & ((j == 0) | (key != prev))
    tl.store(block_counts + tl.program_id(0), tl.sum(first.to(tl.int64), 0))


def _runs_fn(ordered, order, block_counts, inverse, uniq, ends, n, nprog, BLOCK: tl.constexpr,
             PBLOCK: tl.constexpr):
    pid = tl.program_id(0)
    j = pid * BLOCK + tl.arange(0, BLOCK)
    inb = j < n
    zero = tl.sum(tl.zeros([PBLOCK], tl.int64), 0)
    before, runs = zero, zero
    for p0 in range(0, nprog, PBLOCK):  # every program sums the same words in the same order
        q = p0 + tl.arange(0, PBLOCK)
        c = tl.load(block_counts + q, mask=q < nprog, other=0)
        runs += tl.sum(c, 0)
        before += tl.sum(tl.where(q < pid, c, 0), 0)
    key = tl.load(ordered + j, mask=inb, other=0)
    prev = tl.load(ordered + j - 1, mask=inb & (j > 0), other=0)
    nxt = tl.load(ordered + j + 1, mask=j + 1 < n, other=0)
    first = inb & ((j == 0) | (key != prev))
    last = inb & ((j == n - 1) | (key != nxt))
    run = before + tl.cumsum(first.to(tl.int64), 0) - 1
    tl.store(inverse + tl.load(order + j, mask=inb, other=0), run, mask=inb)
    tl.store(uniq + run, key, mask=first)
    tl.store(ends + run, j.to(tl.int64) + 1, mask=last)
    pad = inb & (j >= runs)  # indices past the last run: padding, each written by its own lane
    tl.store(uniq + j, tl.zeros([BLOCK], tl.int64) + tl.load(ordered + n - 1), mask=pad)
    tl.store(ends + j, tl.zeros([BLOCK], tl.int64) + n, mask=pad)


@functools.cache
def kernels():
    """``(starts, runs)`` as Triton kernels, built on first use."""
    global tl
    import triton
    import triton.language

    tl = triton.language
    return triton.jit(_starts_fn), triton.jit(_runs_fn)
