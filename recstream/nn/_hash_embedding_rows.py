"""Row life cycle of :class:`~recstream.nn.HashEmbedding`: admission and eviction.

A key goes through three states, all stored in the slot payload of the
:class:`~recstream.nn.TensorHashTable`:

* absent  -- not in the table;
* pending -- in the table with ``rows == -1``: its occurrences are counted
  (``counts``) but it reads the default vector and trains nothing;
* admitted -- ``rows >= 0`` points at a row of ``values``.

A pending key is admitted once ``counts >= permit_filter_value``. Rows come
from a free list (a LIFO stack tensor, so a freed row is reused first); when
it is empty the least-recently-seen admitted rows (not seen in the current
step) are evicted. ``step()`` evicts every key -- admitted or pending -- not
seen for more than ``evict_filter_value`` steps. Pending keys are bounded by
``pending_capacity``; the least-recently-seen ones are dropped beyond it.

This mixin only holds methods; the state (``table``, ``values``,
``row_slots``, ``free_rows``, ...) is created by ``HashEmbedding.__init__``.
Every method here is called from a training-mode forward or ``step()``; the
host syncs they contain (``nonzero``, counts read back to size the next
tensor) are inherent to a dynamically sized table.
"""

from __future__ import annotations

import torch

from .tensor_hash_table import NEVER_SEEN, _where

__all__ = ["_RowLifecycle"]

_BUCKET_BITS = 16
_BUCKETS = 1 << _BUCKET_BITS  # histogram size of the LRU select


class _RowLifecycle:
    """Admission / eviction / free-list methods of ``HashEmbedding``."""

    # ---------------------------------------------------------- scalars
    def _set_free(self, n: int) -> None:
        self._num_free = n
        self.num_free_t.fill_(n)

    def _set_pending(self, n: int) -> None:
        self._num_pending = n
        self.num_pending_t.fill_(n)

    @property
    def global_step(self) -> int:
        """Number of training steps so far (training forwards, or ``step()`` calls)."""
        return self._step

    @property
    def num_rows(self) -> int:
        """Admitted keys, i.e. rows in use."""
        return self.capacity - self._num_free

    @property
    def num_pending(self) -> int:
        """Keys seen but not admitted yet."""
        return self._num_pending

    def step(self) -> None:
        """Advance the step counter; evict keys unseen for over ``evict_filter_value`` steps.

        Called by every training-mode forward when ``auto_step=True``. The age
        eviction is one compare + ``nonzero`` over all slots (O(num_slots), a
        host sync) and runs every ``evict_interval`` steps: with an interval
        > 1 a key is evicted at the first check after it went stale.
        """
        self._step += 1
        self.global_step_t.fill_(self._step)
        n = self.evict_filter_value
        if n is not None and self._step % self.evict_interval == 0:
            # Free slots read last_seen=+inf, so one comparison finds the stale keys.
            self._evict_slots(_where(self.table.last_seen < self._step - n))

    # ---------------------------------------------------------- eviction
    def _evict_slots(self, slots: torch.Tensor) -> None:
        """Remove the keys in ``slots`` (unique, occupied); free their rows."""
        if slots.numel() == 0:
            return
        t = self.table
        rows = t.rows.index_select(0, slots)
        adm = _where(rows >= 0)
        freed = rows.index_select(0, adm)
        if self._track_evictions:  # only once a baseline was exported (bounded log)
            gone = t.keys.index_select(0, slots.index_select(0, adm))
            self.evicted_keys = torch.cat([self.evicted_keys, gone])
        self.row_slots.index_fill_(0, freed, -1)
        self.dirty.index_fill_(0, freed, False)
        self._push_free(freed)
        self._set_pending(self._num_pending - (slots.numel() - freed.numel()))
        t.delete(slots)

    def _oldest(self, candidate: torch.Tensor, k: int) -> torch.Tensor:
        """Slots of the ``k`` candidates with the oldest ``last_seen`` (ties: lowest slot).

        A histogram select instead of ``topk``: bucket the candidates' ages
        (``bincount``), find the bucket holding the k-th oldest (``cumsum``),
        take everything older plus the oldest part of that bucket. A handful of
        elementwise passes over the slots -- ~20x cheaper than ``topk`` for
        k ~ 2e4 of 1e6 on CPU -- and deterministic on every device. Host
        syncs: the candidate count, the minimum age, the threshold bucket.
        """
        dev = candidate.device
        n_cand = int(candidate.sum())
        k = min(k, n_cand)
        if k <= 0:
            return torch.empty(0, dtype=torch.int64, device=dev)
        if k == n_cand:
            return _where(candidate)
        ls = torch.where(candidate, self.table.last_seen, NEVER_SEEN)
        lo = int(ls.min())
        span = self._step - lo  # candidates have lo <= last_seen < step
        # Power-of-two bucket width (a shift, not an int64 division); width 1 --
        # exact ages -- whenever the candidates span <= _BUCKETS steps.
        shift = max(0, (span - 1).bit_length() - _BUCKET_BITS)
        bucket = ((ls - lo) >> shift).clamp_(max=_BUCKETS)  # non-candidates: overflow bucket
        cum = torch.bincount(bucket, minlength=_BUCKETS + 1).cumsum(0)
        t = int(torch.searchsorted(cum, torch.tensor(k, device=dev)))  # first bucket reaching k
        sel = _where(bucket <= t)  # the one full-size compaction
        b = bucket.index_select(0, sel)
        older, edge = sel.index_select(0, _where(b < t)), sel.index_select(0, _where(b == t))
        if shift:  # the edge bucket spans several steps: order it by age
            edge = edge.index_select(0, torch.sort(ls.index_select(0, edge), stable=True).indices)
        return torch.cat([older, edge[: k - older.numel()]])

    def _evict_lru_rows(self, k: int) -> None:
        """Evict up to ``k`` admitted keys not seen in the current step. O(num_slots)."""
        t = self.table
        # Free slots read last_seen=+inf, so `< step` also excludes them.
        self._evict_slots(self._oldest((t.rows >= 0) & (t.last_seen < self._step), k))

    def _evict_lru_pending(self, k: int) -> int:
        """Drop up to ``k`` pending keys not seen in the current step. O(num_slots)."""
        t = self.table
        slots = self._oldest((t.rows < 0) & (t.last_seen < self._step), k)
        self._evict_slots(slots)
        return slots.numel()

    # ---------------------------------------------------------- free list
    def _push_free(self, rows: torch.Tensor) -> None:
        n = self._num_free
        self.free_rows[n:n + rows.numel()] = rows
        self._set_free(n + rows.numel())

    def _pop_free(self, k: int) -> torch.Tensor:
        n = self._num_free
        rows = self.free_rows[n - k:n].flip(0)  # top of the stack first
        self._set_free(n - k)
        return rows

    # ---------------------------------------------------------- admission
    def _assign_rows(self, slots: torch.Tensor) -> torch.Tensor:
        """Give each slot in ``slots`` a fresh, initialised row."""
        rows = self._pop_free(slots.numel())
        self.table.rows.index_copy_(0, slots, rows)
        self.row_slots.index_copy_(0, rows, slots)
        with torch.no_grad():
            self.values.index_copy_(0, rows, self._init_rows(rows.numel()))
        self.dirty.index_fill_(0, rows, True)
        self.reset_mask.index_fill_(0, rows, True)  # optimizer state of these rows is stale
        return rows

    def _rehash_if_needed(self, n_new: int) -> bool:
        """Drop tombstones if inserting ``n_new`` keys would pass the used-slot bound.

        Live keys stay <= ``max_load`` of the slots by sizing; tombstones may fill
        half of the remaining slots before a rebuild (O(num_slots)), so under
        steady eviction churn a rebuild happens every ~num_slots/4 evictions
        (fewer: inserts reuse tombstones they probe over).
        """
        limit = self.max_load + (1.0 - self.max_load) / 2
        if not self.table.needs_rehash(n_new, limit):
            return False
        _, new = self.table.rehash()
        adm = _where(self.table.rows.index_select(0, new) >= 0)
        new = new.index_select(0, adm)
        self.row_slots.index_copy_(0, self.table.rows.index_select(0, new), new)
        return True

    def _train_slots(self, uniq: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Count ``uniq`` (with ``counts`` occurrences), admit, insert; return slots.

        Slots are -1 only for new keys dropped because the pending budget was
        exhausted by this very batch.
        """
        t, step, permit = self.table, self._step, self.permit_filter_value
        slots = t.find(uniq)
        found = slots >= 0
        f_idx, n_idx = _where(found), _where(~found)
        fs = slots.index_select(0, f_idx)
        t.counts.index_add_(0, fs, counts.index_select(0, f_idx))
        t.last_seen.index_fill_(0, fs, step)
        new_keys, new_counts = uniq.index_select(0, n_idx), counts.index_select(0, n_idx)

        # Admission candidates: pending keys that reached the threshold (they
        # waited longest, so they go first), then new keys that reach it at once.
        ripe = fs.index_select(0, _where((t.rows.index_select(0, fs) < 0)
                                         & (t.counts.index_select(0, fs) >= permit)))
        new_ripe = _where(new_counts >= permit)
        n_cand = ripe.numel() + new_ripe.numel()
        if n_cand > self._num_free:
            self._evict_lru_rows(n_cand - self._num_free)
        n_admit = min(n_cand, self._num_free)
        ripe = ripe[:n_admit]
        ripe_keys = t.keys.index_select(0, ripe)
        new_admit = new_ripe[: n_admit - ripe.numel()]
        is_pending = torch.ones(new_keys.numel(), dtype=torch.bool, device=uniq.device)
        new_pending = _where(is_pending.index_fill_(0, new_admit, False))

        # Keep pending keys within budget: drop the oldest, then (if this batch
        # alone brings too many) the surplus new ones -- they restart counting.
        over = self._num_pending - ripe.numel() + new_pending.numel() - self.pending_capacity
        if over > 0:
            over -= self._evict_lru_pending(over)
            if over > 0:
                new_pending = new_pending[: new_pending.numel() - over]

        ins = torch.cat([new_admit, new_pending])
        if self._rehash_if_needed(ins.numel()):
            # A rehash moves every key: re-resolve the slots found above (rare).
            ripe, slots = t.find(ripe_keys), t.find(uniq)
        ins_slots = t.insert(new_keys.index_select(0, ins))
        t.counts.index_copy_(0, ins_slots, new_counts.index_select(0, ins))
        t.last_seen.index_fill_(0, ins_slots, step)
        self._set_pending(self._num_pending - ripe.numel() + new_pending.numel())
        self._assign_rows(torch.cat([ripe, ins_slots[: new_admit.numel()]]))
        slots.index_copy_(0, n_idx.index_select(0, ins), ins_slots)
        return slots
