"""The host path of `HashEmbedding`: its table operations where reading a tensor costs nothing
(a CPU tensor outside ``recstream.hostpath.device_path``), and the rare steps a device runs them
too (a rebuild, logged evictions; see `hash_device_path`).

`HostPath` is a mixin of `HashEmbedding` (its state, counters and host mirrors are the module's;
see its "Row life cycle"): find-or-insert with compaction by ``nonzero`` between probe rounds, the
compiled kernels of ``_hash_kernels.c`` (`native`) for int64 tables, admission counting, rows
from the free stack, LRU and age eviction, rehash. `hash_backend.HostBackend` is the table
backend that runs it.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..hostpath import host_reads_free
from ..sorting import sort_bounded
from . import native
from .lru_select import oldest
from .row_gather import gather_rows
from .tensor_hash_table import NEVER_SEEN, PROBE_WINDOW, WIDE_WINDOW_MAX_KEYS, _where

__all__ = ["HostPath"]


class HostPath:
    """The host-path methods of `HashEmbedding` (a mixin: no state of its own)."""

    def _lookup_unique(self, uniq: torch.Tensor, counts: torch.Tensor, mutate: bool,
                       inverse: torch.Tensor | None = None) -> torch.Tensor:
        """The vectors of unique keys (counted and admitted if `mutate`), one per key or, given
        `inverse`, one per entry of ``uniq[inverse]``."""
        slots, rows = self._train_slots(uniq, counts) if mutate else (self.table.find(uniq), None)
        if rows is not None:  # every key has a row, already marked (the training path's usual case)
            r = rows
        else:
            rows = torch.where(slots >= 0, self.table.rows.index_select(0, slots.clamp(min=0)), -1)
            has_row = _where(rows >= 0)
            r = rows.index_select(0, has_row)
            if mutate:
                self._mark_seen(r)
        table_rows = r
        if self._tier is not None:  # disk tier: rows -> slots of the cache that ``values`` is (hash_tier)
            r = self._tier.slots_of(r, mutate)
            rows = r if r.numel() == uniq.numel() else rows
        if self.max_norm is not None and mutate:
            self._renorm(r, table_rows)
        if r.numel() == uniq.numel() and (self.max_norm is None or mutate):
            # Every key has a row (the common case once keys are admitted): one gather.
            if mutate and self.sparse and host_reads_free(self.values):
                # The keys are unique, so are their rows: sorted, they make a gradient the
                # optimizer need not sort and sum again (gather_rows).
                sorted_rows, order = sort_bounded(rows, self.values.shape[0])
                rank = torch.empty_like(order).index_copy_(0, order, torch.arange(order.numel()))
                return gather_rows(self.values, sorted_rows, rank if inverse is None else rank.index_select(0, inverse))
            # Elsewhere the optimizer coalesces the sparse gradient.
            return F.embedding(rows if inverse is None else rows.index_select(0, inverse), self.values,
                               sparse=self.sparse)
        # Gather only admitted rows (one per unique key): the sparse gradient then
        # holds exactly the touched rows, never a placeholder row for pending keys.
        emb = F.embedding(r, self.values, sparse=self.sparse)
        if self.max_norm is not None and not mutate:  # the same rows, renormalised out of place
            emb = emb * self.renorm_scale(emb.detach().norm(dim=1)).unsqueeze(1)
        out = self.default_value.to(emb.dtype).expand(uniq.numel(), -1).clone()
        out = out.index_copy(0, has_row, emb)
        return out if inverse is None else out.index_select(0, inverse)

    def _mark_seen(self, rows: torch.Tensor) -> None:
        """Rows looked up in training: seen this step, and dirty (they get gradients: the optimizer
        changes them)."""
        self.dirty.index_fill_(0, rows, True)
        self.row_last_seen.index_fill_(0, rows, self._step)

    @torch.no_grad()
    def _renorm(self, rows: torch.Tensor, table_rows: torch.Tensor) -> None:
        """Renormalise ``values`` at `rows` (slots when disk-tiered) of table rows `table_rows`."""
        w = self.values.index_select(0, rows)
        norm = w.norm(dim=1)
        changed = norm > self.max_norm
        self.values.index_copy_(0, rows, w * self.renorm_scale(norm).unsqueeze(1))
        self.dirty.index_copy_(0, table_rows, self.dirty.index_select(0, table_rows) | changed)

    # ---------------------------------------------------------- eviction
    def _evict_slots(self, slots: torch.Tensor, rows: torch.Tensor | None = None) -> None:
        """Remove the keys in ``slots`` (unique, occupied); free their rows. ``rows``: the slots'
        rows, when the caller knows every key is admitted (the LRU pass over rows): spares a
        gather over the slots."""
        if slots.numel() == 0:
            return
        t = self.table
        adm = None  # positions of the admitted keys in `slots`; None: all of them
        if rows is None:
            rows = t.rows.index_select(0, slots)
            adm = _where(rows >= 0)
        freed = rows if adm is None else rows.index_select(0, adm)
        if self._track_evictions:  # only once a baseline was exported (bounded log)
            gone = t.keys.index_select(0, slots if adm is None else slots.index_select(0, adm))
            self.evicted_keys = torch.cat([self.evicted_keys, gone])
        if self._tier is not None:  # a freed row's bytes belong to no key: never written back
            self._tier.drop_rows(freed.numpy())
        self.row_slots.index_fill_(0, freed, -1)
        self.row_last_seen.index_fill_(0, freed, NEVER_SEEN)
        self.dirty.index_fill_(0, freed, False)
        self._push_free(freed)
        self._set_pending(self._num_pending - (slots.numel() - freed.numel()))
        t.delete(slots)

    def _oldest(self, last_seen: torch.Tensor, k: int, rows: torch.Tensor | None = None) -> torch.Tensor:
        """The ``k`` entries of ``last_seen`` seen longest before this step (with ``rows``: among
        those whose row is -1, pending keys): `oldest`."""
        return oldest(last_seen, self._step, k, rows)

    def _evict_lru_rows(self, k: int, seen_slots: torch.Tensor) -> None:
        """Evict up to ``k`` admitted keys not seen in the current step. O(capacity).

        Runs over ``row_last_seen`` (one entry per row), not over the ~3x more hash slots.
        ``seen_slots``: the slots of this step's keys found in the table (admitted or pending),
        marked seen first -- the lookup refreshes ``row_last_seen`` only after admission, so
        without this the pass could evict a key of the very batch that needs the rows.
        """
        rows = self.table.rows.index_select(0, seen_slots)
        self.row_last_seen.index_fill_(0, rows.index_select(0, _where(rows >= 0)), self._step)
        # Free rows read last_seen=+inf, so `< step` also excludes them.
        rows = self._oldest(self.row_last_seen, k)
        self._evict_slots(self.row_slots.index_select(0, rows), rows)

    def _evict_lru_pending(self, k: int) -> int:
        """Drop up to ``k`` pending keys not seen in the current step. O(num_slots)."""
        t = self.table
        slots = self._oldest(t.last_seen, k, t.rows)
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
        self._fresh_rows(rows)
        return rows

    def _fresh_rows(self, rows: torch.Tensor) -> None:
        """Rows just given to new keys: initial values, dirty, their optimizer state to reset."""
        if self._tier is not None:
            self._tier.put_rows(rows.numpy(), self._init_rows(rows.numel()))
        else:
            with torch.no_grad():
                self.values.index_copy_(0, rows, self._init_rows(rows.numel()))
        self.dirty.index_fill_(0, rows, True)
        self.reset_mask.index_fill_(0, rows, True)  # optimizer state of these rows is stale
        self._reset_parts.append(rows)

    def _rehash_if_needed(self, n_new: int) -> bool:
        """Drop tombstones if inserting ``n_new`` keys would pass the used-slot bound.

        Live keys stay <= ``max_load`` of the slots by sizing; tombstones may fill
        half of the remaining slots before a rebuild (O(num_slots)), so under
        steady eviction churn a rebuild happens every ~num_slots/4 evictions
        (fewer: inserts reuse tombstones they probe over).
        """
        if not self.table.needs_rehash(n_new, self._used_limit()):
            return False
        _, new = self.table.rehash()
        adm = _where(self.table.rows.index_select(0, new) >= 0)
        new = new.index_select(0, adm)
        self.row_slots.index_copy_(0, self.table.rows.index_select(0, new), new)
        return True

    def _train_slots(self, uniq: torch.Tensor, counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Count ``uniq`` (with ``counts`` occurrences), admit, insert; return their slots and, when
        every key has a row now, the rows (marked seen and dirty: `_mark_seen`), else None.

        Slots are -1 only for new keys dropped because the pending budget (or, with
        ``permit_filter_value=1``, the capacity) was exhausted by this very batch.
        """
        # Pending keys with permit 1 exist only in a state loaded from a table with permit > 1.
        if self.permit_filter_value == 1 and self._num_pending == 0:
            return self._admit_all(uniq, counts)
        return self._count_and_admit(uniq, counts), None

    def _admit_all(self, uniq: torch.Tensor, counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`_train_slots` when every key is admitted at first sight (``permit_filter_value=1``,
        the default): no key is ever pending, so no admission bookkeeping -- a third of the ops of
        the general path, which matters because on a CPU a lookup's cost is its op count."""
        t, step = self.table, self._step
        slots, free = t.locate(uniq)  # the new keys' free slots come with the lookup
        new = _where(slots < 0)  # host sync: how many rows to hand out
        n_new = new.numel()
        if n_new <= self._num_free and t.runs_kernels(uniq) and not t.needs_rehash(n_new, self._used_limit()):
            return slots, self._admit_in_kernel(uniq, counts, slots, free, n_new)
        if n_new:
            evict = n_new > self._num_free
            if evict:
                self._evict_lru_rows(n_new - self._num_free + self._headroom(self.capacity),
                                     slots.index_select(0, _where(slots >= 0)))
            new = new[:self._num_free]  # a batch with more new keys than capacity: the rest read the default
            # Locate again after an eviction (its tombstones may come earlier in a new key's probe
            # sequence: reuse them, as insert() would) or a rehash (it moves every key). Both rare.
            if self._rehash_if_needed(new.numel()) or evict:
                slots, free = t.locate(uniq)
            ins = t.insert_at(uniq.index_select(0, new), free.index_select(0, new))
            slots.index_copy_(0, new, ins)
            self._assign_rows(ins)
        # Over capacity some keys got no slot (-1): count only the others.
        keep = None if new.numel() == n_new else _where(slots >= 0)
        seen = slots if keep is None else slots.index_select(0, keep)
        t.counts.index_add_(0, seen, counts if keep is None else counts.index_select(0, keep))
        t.last_seen.index_fill_(0, seen, step)
        if keep is not None:  # some new keys got no row
            return slots, None
        rows = t.rows.index_select(0, slots)
        self._mark_seen(rows)
        return slots, rows

    def _admit_in_kernel(self, uniq: torch.Tensor, counts: torch.Tensor, slots: torch.Tensor, free: torch.Tensor,
                         n_new: int) -> torch.Tensor:
        """`_admit_all`'s work after the lookup in one compiled pass (``admit`` in
        ``_hash_kernels.c``) when every new key gets a free row without an eviction or a rehash:
        insert the new keys, give them rows from the top of the free stack, count every key and mark
        its row seen and dirty -- the torch ops' state, bit for bit, in one pass instead of ten
        torch ops over the keys. Fills in ``slots``; returns the keys' rows."""
        t = self.table
        rows, new_rows = torch.empty_like(slots), torch.empty(n_new, dtype=torch.int64)
        reused = native.kernels.admit(
            t.keys.numpy(), t.rows.numpy(), t.counts.numpy(), t.last_seen.numpy(), self.row_slots.numpy(),
            self.row_last_seen.numpy(), self.dirty.numpy(), self.free_rows.numpy(), self._num_free,
            uniq.contiguous().numpy(), counts.contiguous().numpy(), slots.numpy(), free.numpy(), self._step,
            t.max_rounds, PROBE_WINDOW, WIDE_WINDOW_MAX_KEYS, rows.numpy(), new_rows.numpy())
        t.record_inserts(n_new, reused)
        self._set_free(self._num_free - n_new)
        self._fresh_rows(new_rows)
        return rows

    def _count_and_admit(self, uniq: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """`_train_slots` with admission after ``permit_filter_value`` > 1 occurrences."""
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
        if self._num_pending:
            ripe = fs.index_select(0, _where((t.rows.index_select(0, fs) < 0)
                                             & (t.counts.index_select(0, fs) >= permit)))
        else:  # no pending key: spare two random gathers over the slots
            ripe = fs[:0]
        new_ripe = _where(new_counts >= permit)
        n_cand = ripe.numel() + new_ripe.numel()
        if n_cand > self._num_free:
            self._evict_lru_rows(n_cand - self._num_free + self._headroom(self.capacity), fs)
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
            dropped = self._evict_lru_pending(over + self._headroom(self.pending_capacity))
            over -= min(dropped, over)
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
