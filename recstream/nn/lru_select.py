"""Least-recently-seen selection for [`HashEmbedding`][recstream.nn.hash_embedding.HashEmbedding]'s eviction: `oldest`.

Which ``k`` of a table's keys go when it is full: those seen longest ago. A histogram select
instead of ``topk``: bucket the candidates' ages, find the bucket holding the k-th oldest, take
everything older plus the oldest part of that bucket (much cheaper than a ``topk`` over the
whole table, and deterministic on every device; figures: docs/benchmarks.md). On a CPU the
compiled kernel (``_hash_kernels.oldest``) does it in two passes over the table (three when the
candidates span more than 2**16 steps), instead of the torch ops' dozen passes over every row;
the torch ops run on CUDA and wherever the extension was not built. Both select the same
indices in the same order.

Example:
    >>> import torch
    >>> oldest(torch.tensor([5, 1, 9, 3, 1]), step=9, k=2).tolist()
    [1, 4]
"""

from __future__ import annotations

import torch

from ..hostpath import host_reads_free
from . import native
from .tensor_hash_table import NEVER_SEEN, _where

__all__ = ["oldest", "BUCKET_BITS"]

BUCKET_BITS = 16  # 2**16 buckets: exact ages whenever the candidates span <= 65,536 steps
_BUCKETS = 1 << BUCKET_BITS


def oldest(last_seen: torch.Tensor, step: int, k: int, rows: torch.Tensor | None = None) -> torch.Tensor:
    """Indices of the ``k`` candidates seen longest ago (fewer if there are fewer candidates).

    Candidates: entries with ``last_seen < step`` and, given ``rows``, ``rows < 0`` (a hash table's
    pending keys). The result: every candidate of an older bucket, in index order, then from the
    bucket holding the k-th oldest its oldest entries (a bucket spanning several steps; ties in
    index order) or, when it holds one age, entries evenly spread over it -- for hash slots,
    taking the lowest first would empty one end of the table and crowd the other (keys seen in
    one step, e.g. a bulk load, age together) until probe sequences there grow past max_rounds.
    Host syncs: the candidate count, the minimum age, the threshold bucket.
    """
    if native.kernels is not None and host_reads_free(last_seen):
        out = torch.empty(max(k, 0), dtype=torch.int64)
        n = native.kernels.oldest(last_seen.contiguous().numpy(), None if rows is None else rows.contiguous().numpy(),
                                   step, k, BUCKET_BITS, out.numpy())
        return out[:n]
    candidate = last_seen < step
    if rows is not None:
        candidate &= rows < 0
    return _select(last_seen, candidate, step, k)


def _select(last_seen: torch.Tensor, candidate: torch.Tensor, step: int, k: int) -> torch.Tensor:
    """`oldest` on torch ops."""
    dev = candidate.device
    n_cand = int(candidate.count_nonzero())
    k = min(k, n_cand)
    if k <= 0:
        return torch.empty(0, dtype=torch.int64, device=dev)
    if k == n_cand:
        return _where(candidate)
    ls = torch.where(candidate, last_seen, NEVER_SEEN)
    lo = int(ls.min())
    span = step - lo  # candidates have lo <= last_seen < step
    # Power-of-two bucket width (a shift, not an int64 division); width 1 --
    # exact ages -- whenever the candidates span <= _BUCKETS steps.
    shift = max(0, (span - 1).bit_length() - BUCKET_BITS)
    # Non-candidates (NEVER_SEEN) land in the overflow bucket _BUCKETS; clamping before the
    # subtraction keeps NEVER_SEEN - lo from overflowing when last_seen went negative
    # (load_rows accepts any step).
    bucket = ls.clamp_(max=lo + (_BUCKETS << shift)).sub_(lo) >> shift
    cum = torch.bincount(bucket, minlength=_BUCKETS + 1).cumsum(0)
    t = int(torch.searchsorted(cum, torch.tensor(k, device=dev)))  # first bucket reaching k
    sel = _where(bucket <= t)  # the one full-size compaction
    b = bucket.index_select(0, sel)
    older, edge = sel.index_select(0, _where(b < t)), sel.index_select(0, _where(b == t))
    m = k - older.numel()
    if shift:  # the edge bucket spans several steps: order it by age
        edge = edge.index_select(0, torch.sort(ls.index_select(0, edge), stable=True).indices)
        return torch.cat([older, edge[:m]])
    return torch.cat([older, edge.index_select(0, torch.arange(m, device=dev) * edge.numel() // m)])


def oldest_static(last_seen: torch.Tensor, step: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`oldest` (without ``rows``) with no host sync: ``(order, chosen)``, both sized like
    `last_seen`, where ``order[chosen]`` is `oldest`'s result (the chosen entries first, in its
    order; ``chosen`` is true exactly on the first of them). The bucket width, threshold bucket and
    counts stay on the device.

    One sort over the table (the edge bucket's entries by age), not three: each chosen entry's
    place in `oldest`'s order comes of prefix sums, and one scatter puts it there (a sort of the
    whole table is the costliest op of an LRU pass on a GPU).

    >>> order, chosen = oldest_static(torch.tensor([5, 1, 9, 3, 1]), step=9, k=2)
    >>> order[chosen].tolist(), chosen.tolist()
    ([1, 4], [True, True, False, False, False])
    """
    n, dev = last_seen.numel(), last_seen.device
    index = torch.arange(n, device=dev)
    candidate = last_seen < step
    n_cand = candidate.sum()
    k_eff = torch.minimum(n_cand, torch.tensor(max(k, 0), device=dev))
    ls = torch.where(candidate, last_seen, NEVER_SEEN)
    lo = ls.min()
    span = (step - lo).clamp(min=1)  # no candidate: every entry NEVER_SEEN, nothing chosen below
    bits = ((span - 1).unsqueeze(0) >= (torch.ones(1, dtype=torch.int64, device=dev)
                                         << torch.arange(63, device=dev))).sum()  # (span - 1).bit_length()
    shift = (bits - BUCKET_BITS).clamp(min=0)
    top = lo + (torch.full((), _BUCKETS, dtype=torch.int64, device=dev) << shift)
    bucket = torch.where(candidate, (torch.minimum(ls, top) - lo) >> shift, _BUCKETS)
    cum = torch.zeros(_BUCKETS + 1, dtype=torch.int64, device=dev).index_add_(
        0, bucket, torch.ones_like(bucket)).cumsum(0)
    t = torch.searchsorted(cum, k_eff.reshape(1))  # the first bucket reaching k
    older = candidate & (bucket < t)
    edge = candidate & (bucket == t)
    n_older = older.sum()
    m = k_eff - n_older  # taken from the edge bucket
    # One age in the edge bucket: entries evenly spread over it (the e-th of E is taken when some
    # j < m has j * E // m == e), in index order; several ages: its oldest (ties in index order),
    # in that order -- an edge entry's rank by age is its place in the one sort.
    e, size = edge.cumsum(0) - 1, edge.sum()
    j = (e * m + size - 1) // size.clamp(min=1)  # the least j with j * E // m >= e
    spread = edge & (j < m) & ((j * size) // m.clamp(min=1) == e)
    by_age = torch.sort(torch.where(edge, ls, NEVER_SEEN), stable=True).indices
    age_rank = torch.empty_like(by_age).index_copy_(0, by_age, index)
    several = shift > 0
    chosen = older | torch.where(several, edge & (age_rank < m), spread)
    # Places in `oldest`'s order: the older buckets' entries by index, then the edge's; every
    # candidate chosen: all of them by index.
    place = torch.where(several, age_rank, spread.cumsum(0) - 1) + n_older
    place = torch.where(older, older.cumsum(0) - 1, place)
    every = k_eff == n_cand
    chosen = torch.where(every, candidate, chosen)
    place = torch.where(every, candidate.cumsum(0) - 1, place)
    # one scatter; entries not chosen all write the spare last word (dropped), so `order`'s tail
    # stays 0: a valid index its consumers mask out
    order = torch.zeros(n + 1, dtype=torch.int64, device=dev).scatter_(0, torch.where(chosen, place, n), index)
    return order[:n], index < k_eff
