"""The device path of `HashEmbedding`: its training and eval lookups, LRU and age
passes with static shapes and no host sync (ops in `hash_static`).

`DevicePath` is a mixin of `HashEmbedding` (its state, counters and host
bounds are the module's; see its "Row life cycle"); `lookup_masked_many` looks several tables
up with one host read at most. What each step does on the host path lives in ``hash_embedding.py``;
here is its static-shape twin, which must keep the same semantics (tests/nn/test_hash_device_path.py
runs both on the same key streams).
"""
from __future__ import annotations

import logging
import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from ..hostpath import positions
from ..validation import check_int_tensor, check_type
from .hash_backend import HOST, TableBackend
from .hash_replay import HostEvent
from .hash_static import DeviceCall, DevicePlan, Scatter, claim, masked_put, probe, static_unique, window
from .lru_select import oldest_static
from .tensor_hash_table import DELETED, NEVER_SEEN

log = logging.getLogger(__name__)

__all__ = ["DevicePath", "StaticBackend", "STATIC", "lookup_masked_many"]


class StaticBackend(TableBackend):
    """The table backend of the device path's torch ops (``"torch"``): `probe`, `claim` and the
    scatters of `hash_static`, a few dozen ops per step whatever the data. `plan`, `carry_out`,
    `read` and `evict_stale` are the steps another device backend (``hash_triton``) replaces; the
    decision between them (host bounds, the one read, the LRU pass) is `DevicePath`'s."""

    name = "torch"
    rebuilds = False  # a step that must rebuild the table runs the host path's ops (with their syncs)

    def lookup(self, emb, flat: torch.Tensor, mutate: bool) -> torch.Tensor:
        return emb._device_lookup(flat, mutate, self)

    def unique(self, flat: torch.Tensor, mask: torch.Tensor | None
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """`static_unique` of a training lookup's keys (the first step of `DevicePath._begin_device`)."""
        return static_unique(flat, mask)

    def evict_stale(self, emb, stale: torch.Tensor) -> None:
        emb._evict_stale(stale)

    def plan(self, emb, uniq: torch.Tensor, counts: torch.Tensor, valid: torch.Tensor) -> DevicePlan:
        """Probe the unique keys (no write): `DevicePath._probe_plan`."""
        return emb._probe_plan(uniq, counts, valid)

    def discard_bids(self, emb, plan: DevicePlan) -> None:
        """Before `plan` is decided again after a read: void what its probe began (nothing here)."""

    def unique_plan(self, emb, flat: torch.Tensor, mask: torch.Tensor | None) -> tuple[DevicePlan, torch.Tensor]:
        """`unique` then `plan` of a training lookup: ``(plan, inverse)`` (a backend may fuse the two)."""
        uniq, inverse, counts, valid = self.unique(flat, mask)
        return self.plan(emb, uniq, counts, valid), inverse

    def carry_out(self, emb, plan: DevicePlan, inverse: torch.Tensor) -> torch.Tensor:
        """Insert, count, admit and look up as `plan` says: `DevicePath._carry_out`."""
        return emb._carry_out(plan, inverse)

    def read(self, emb, flat: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """An eval-mode lookup: `DevicePath._device_read`."""
        return emb._device_read(flat, mask)

    def evict_lru(self, emb, k: int, batch_rows: torch.Tensor) -> None:
        """The LRU pass: evict exactly `k` admitted keys not in the batch (`DevicePath._evict_unseen`)."""
        emb._evict_unseen(k, batch_rows)

    def drop_pending(self, emb, k: int, plan: DevicePlan) -> None:
        """Drop exactly `k` pending keys not in the batch (`DevicePath._drop_unseen_pending`)."""
        emb._drop_unseen_pending(k, plan)

    def rebuild(self, emb, live: int) -> None:
        """Rebuild the table without tombstones on the device (`live` keys), where `rebuilds`."""
        raise NotImplementedError(f"the {self.name!r} backend does not rebuild on the device")

    def reprobe(self, emb, plan: DevicePlan) -> None:
        """Probe the plan's keys again after an eviction or a rebuild: their slots and first free slots."""
        plan.slots, plan.free = probe(emb.table, plan.uniq, plan.valid, plan.pos)


STATIC = StaticBackend()


class _MaskedRows(torch.autograd.Function):
    """``where(mask, values[index], default)`` with the sparse gradient of `values` built in one
    step: the incoming gradient where `mask` holds, zeros elsewhere, at the rows `index` -- what
    autograd's ``where`` and sparse ``embedding`` backward give, without the zero scalar their
    ``where`` makes each step (the zero is a view of a kept arange, `hostpath.positions`)."""

    @staticmethod
    def forward(ctx, values, index, mask, default):
        ctx.save_for_backward(index, mask)
        ctx.shape = values.shape
        emb = F.embedding(index, values)
        return torch.where(mask, emb, default.to(emb.dtype))

    @staticmethod
    @torch.autograd.function.once_differentiable  # as a sparse embedding's gradient: no double backward
    def backward(ctx, grad):
        index, mask = ctx.saved_tensors
        zero = positions(1, grad.device, grad.dtype)  # [0.]
        rows = torch.sparse_coo_tensor(index.unsqueeze(0), torch.where(mask, grad, zero), ctx.shape,
                                       check_invariants=False)
        return rows, None, None, None


class DevicePath:
    """The device-path methods of `HashEmbedding` (a mixin: no state of its own)."""

    def _evict_stale(self, stale: torch.Tensor) -> None:
        """`_evict_slots` of every slot in the mask `stale`, static shape: the admitted keys'
        rows go onto the free stack in slot order (the host path's), every stale slot becomes a
        tombstone."""
        t = self.table
        rows = t.rows
        admitted = stale & (rows >= 0)
        safe = rows.clamp(min=0)
        freed = Scatter(safe, admitted)
        freed.put(self.row_slots, -1)
        freed.put(self.row_last_seen, NEVER_SEEN)
        freed.put(self.dirty, False)
        stack = (self.num_free_t + admitted.cumsum(0) - 1).clamp(0, self.capacity - 1)
        Scatter(stack, admitted).put(self.free_rows, rows)
        n_freed, n_stale = admitted.sum(), stale.sum()
        self.num_free_t.add_(n_freed)
        self.num_pending_t.sub_(n_stale - n_freed)
        t.num_live_t.sub_(n_stale)
        t.keys.masked_fill_(stale, DELETED)
        t.rows.masked_fill_(stale, -1)
        t.counts.masked_fill_(stale, 0)
        t.last_seen.masked_fill_(stale, NEVER_SEEN)
        self._stale = t._stale = True  # the bounds hold: free rows only grow, pending keys only shrink

    def _begin_masked(self, keys: torch.Tensor, mask: torch.Tensor | None,
                      reserved_free: bool = False) -> torch.Tensor | DeviceCall:
        """`lookup_masked` up to the host read (see `lookup_masked_many`; `mask` None: every key;
        `reserved_free`: no key is a reserved marker): its result, or on a device the call to finish."""
        backend = self._backend_for(keys)
        if backend is HOST:
            if mask is None:
                return self(keys)
            out = self.default_value.expand(keys.numel(), -1).clone()
            return out.index_put((mask,), self(keys[mask]))
        keys = keys if mask is None else torch.where(mask, keys, 0)
        if reserved_free and self.key_dtype == torch.int64:  # nothing left to check: 5 ops a step fewer
            keys = keys.to(torch.int64)
        else:
            keys = self._check_keys("HashEmbedding", keys)
        mutate = self.training and not torch.is_inference_mode_enabled()
        if mutate and self.auto_step:
            self.step()
        return self._begin_device(keys, mutate, mask, backend)

    def _device_lookup(self, flat: torch.Tensor, mutate: bool, backend: StaticBackend) -> torch.Tensor:
        """`forward` of an unsharded table on a device (``recstream.hostpath``): the ops of
        ``recstream.nn.hash_static``, every shape that of the batch. No host sync while the table
        has room for the batch's keys (the host keeps bounds of its free rows, pending keys and used
        slots); one read of the counters when the bounds do not show it (`_has_room`); the host
        path's ops (with their syncs) for a step that must rebuild the table (`_decide`)."""
        call = self._begin_device(flat, mutate, None, backend)
        if isinstance(call, torch.Tensor):
            return call
        return self._finish(call, torch.stack(self._read_terms(call.plan)).tolist() if call.read else None)

    def _begin_device(self, flat: torch.Tensor, mutate: bool, mask: torch.Tensor | None,
                      backend: StaticBackend) -> torch.Tensor | DeviceCall:
        """The device path up to the decision that may need a host read: an eval lookup's result, or
        the probed batch (`DeviceCall`), by `backend`'s ops."""
        if not mutate:
            return backend.read(self, flat, mask)
        plan, inverse = backend.unique_plan(self, flat, mask)
        return DeviceCall(flat, mask, inverse, plan, read=not self._has_room(plan), backend=backend)

    def _finish(self, call: DeviceCall, read: list[int] | None) -> torch.Tensor:
        """Decide (given the counters `read` for a call that needed them), then carry out."""
        flat, mask, inverse = call.flat, call.mask, call.inverse
        if read is not None:  # the plan may change (or the host path's step run): no step of it is kept
            call.backend.discard_bids(self, call.plan)
        plan = call.plan if read is None else self._decide(call.plan, read, call.backend)
        if plan is None:  # a rebuild (or another rare step) must run: the host path's step
            keys = flat if mask is None else flat[mask]
            uniq, inverse, counts = torch.unique(keys, sorted=True, return_inverse=True, return_counts=True)
            out = self._lookup_unique(uniq, counts, True, inverse)
            return out if mask is None else self.default_value.expand(flat.numel(), -1).to(out.dtype).index_put(
                (mask,), out)
        out = call.backend.carry_out(self, plan, inverse)
        return out if mask is None else torch.where(mask.unsqueeze(1), out, self.default_value.to(out.dtype))

    def _device_read(self, flat: torch.Tensor, mask: torch.Tensor | None,
                     rows: torch.Tensor | None = None) -> torch.Tensor:
        """An eval-mode lookup on a device: unknown and pending keys read ``default_value``. `rows`:
        each key's row (-1: none), when a backend looked them up already."""
        t = self.table
        if rows is None:
            slots, _ = probe(t, flat, torch.ones_like(flat, dtype=torch.bool) if mask is None else mask)
            rows = torch.where(slots >= 0, t.rows.index_select(0, slots.clamp(min=0)), -1)
        has = rows >= 0
        emb = F.embedding(self._padded(rows, has, rows.clamp(min=0)[:1]), self.values, sparse=self.sparse)
        if self.max_norm is not None:  # the same rows, renormalised out of place
            emb = emb * self.renorm_scale(emb.detach().norm(dim=1)).unsqueeze(1)
        return torch.where(has.unsqueeze(1), emb, self.default_value.to(emb.dtype))

    @staticmethod
    def _padded(rows: torch.Tensor, has: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
        """`rows` with the entries that have none (`has` false) set to the first row there is (or
        `fallback` ``[1]``): a gather of static shape whose sparse gradient names only rows that
        get one anyway (zeros added to a row's gradient change nothing)."""
        # The first entry with a row, or `fallback` where none has one (argmax of all-false is 0).
        first = torch.where(has, rows, fallback).index_select(0, has.to(torch.uint8).argmax().reshape(1))
        return torch.where(has, rows, first)

    def _probe_plan(self, uniq: torch.Tensor, counts: torch.Tensor, valid: torch.Tensor) -> DevicePlan:
        """Probe `uniq`: which keys are found, new, admitted now or pending (no write)."""
        t, permit = self.table, self.permit_filter_value
        pos = window(t, uniq)
        slots, free = probe(t, uniq, valid, pos)
        found, new = slots >= 0, free >= 0
        safe = slots.clamp(min=0)
        total = torch.where(found, t.counts.index_select(0, safe) + counts, counts)
        row = torch.where(found, t.rows.index_select(0, safe), -1)
        plan = DevicePlan(uniq=uniq, slots=slots, free=free, found=found, new=new, total=total, row=row,
                          ripe=found & (row < 0) & (total >= permit), new_admit=new & (counts >= permit),
                          new_pending=new & (counts < permit), valid=valid, pos=pos, pad_ok=True)
        return plan

    def _has_room(self, plan: DevicePlan) -> bool:
        """Whether the host's bounds show room for every key of the batch (no read needed); then
        they are moved on by the batch's worst case."""
        n = plan.uniq.numel()
        self._refresh_bounds(n)
        room = self._room(n, self._free_bound, self._pending_bound, self.table.num_used_bound())
        self._log_host(HostEvent("room" if room else "other", n))  # see hash_replay
        if room:
            self._take_room(n)
        return room

    def _read_terms(self, plan: DevicePlan) -> list[torch.Tensor]:
        """What `_decide` needs read from the device: the counters, then the batch's keys
        admitted now, ripe pending ones, new pending ones, new ones, ones with a row, pending ones."""
        t = self.table
        ripe = plan.ripe.sum()
        return [self.num_free_t, self.num_pending_t, t.num_used_t, t.num_live_t, ripe + plan.new_admit.sum(), ripe,
                plan.new_pending.sum(), plan.new.sum(), (plan.row >= 0).sum(), (plan.found & (plan.row < 0)).sum()]

    def _decide(self, plan: DevicePlan, read: list[int], backend: StaticBackend) -> DevicePlan | None:
        """Given `_read_terms` read: run the LRU pass if the rows run short and drop the oldest
        pending keys if they go over budget (the host path's order and rules), or return None for a
        step the host path must run (a rebuild, logged evictions, more new keys than there are keys
        to evict); then nothing changed."""
        t = self.table
        self._set_read(read[:4])
        n_admit, n_ripe, n_pending, n_new, n_seen, n_pending_seen = read[4:]
        short = n_admit - self._free  # rows an LRU pass must free
        unseen = self.capacity - self._free - n_seen  # admitted keys not in this batch: what it may evict
        over = self._pending - n_ripe + n_pending - self.pending_capacity  # pending keys over budget
        dropped = min(over + self._headroom(self.pending_capacity), self._pending - n_pending_seen) if over > 0 else 0
        surplus = max(over - dropped, 0)  # new pending keys turned away (they restart counting)
        rebuild = t.needs_rehash(n_new - surplus, self._used_limit())
        if (rebuild and not backend.rebuilds) or (short > 0 and (self._track_evictions or short > unseen)):
            return None  # rare: the host path's step (its ops, its syncs)
        evicted = 0
        if short > 0:
            self._warn_thin_headroom("capacity", self.capacity, plan.uniq.numel())
            evicted = min(short + self._headroom(self.capacity), unseen)
            backend.evict_lru(self, evicted, plan.row)
            self._free += evicted
        if dropped > 0:
            self._warn_thin_headroom("pending_capacity", self.pending_capacity, plan.uniq.numel())
            backend.drop_pending(self, dropped, plan)
            self._pending -= dropped
        if surplus:  # the last new pending keys (key order) are not inserted
            rank = plan.new_pending.cumsum(0)
            plan.new_pending = plan.new_pending & (rank <= n_pending - surplus)
            plan.new = plan.new_admit | plan.new_pending
        if rebuild:  # after the evictions, as the host path: their tombstones go too
            backend.rebuild(self, read[3] - evicted - dropped)
        if short > 0 or dropped > 0 or rebuild:
            backend.reprobe(self, plan)  # tombstones may come first in a probe now
        self._free_bound = self._free - n_admit
        self._pending_bound = self._pending - n_ripe + n_pending - surplus
        t.mark_stale(n_new - surplus)
        self._stale = True
        plan.pad_ok = n_admit > 0 or self._free_bound > 0  # a row whose optimizer state may be reset
        return plan

    def _warn_thin_headroom(self, name: str, budget: int, keys: int) -> None:
        """Warn once per table when a pass over a full `budget` (``capacity`` or ``pending_capacity``)
        leaves room for fewer than a batch's `keys`: the host's bounds take every key of a step as new,
        so such a table reads its counters at nearly every step (a host sync; a CUDA graph's step then
        runs eagerly)."""
        if self._headroom(budget) >= keys or self.__dict__.get("_warned_headroom"):
            return
        self.__dict__["_warned_headroom"] = True
        most = 1.0 - 2 * keys / budget
        fix = (f"set evict_low_watermark to at most {math.floor(most * 1000) / 1000} (room for two batches)"
               if most > 0 else f"raise {name} above two batches' keys ({2 * keys})")
        log.warning("HashEmbedding: a pass over the full %s=%d frees %d beyond the step's need, fewer than a "
                    "batch's %d keys (evict_low_watermark=%s): on a device this table reads its counters at "
                    "nearly every step (a host sync; a CUDA graph's step runs eagerly); %s", name, budget,
                    self._headroom(budget), keys, self.evict_low_watermark, fix)

    def _drop_unseen_pending(self, k: int, plan: DevicePlan) -> None:
        """`_evict_lru_pending` of exactly `k` pending keys not in this batch, static shape."""
        t, step = self.table, self._step
        Scatter(plan.slots, plan.found).put(t.last_seen, step)  # the batch's keys stay (as the host path marks them)
        slots, chosen = oldest_static(torch.where(t.rows < 0, t.last_seen, NEVER_SEEN), step, k)
        dead = Scatter(slots, chosen)
        dead.put(t.keys, DELETED)
        dead.put(t.counts, 0)
        dead.put(t.last_seen, NEVER_SEEN)
        self.num_pending_t.sub_(k)
        t.num_live_t.sub_(k)

    def _evict_unseen(self, k: int, batch_rows: torch.Tensor) -> None:
        """`_evict_lru_rows` of exactly `k` admitted keys not in this batch (their rows:
        ``batch_rows``, -1 for keys without one), static shape: the rows `oldest` picks, in
        its order onto the free stack. Not while evictions are logged (the log's length is data)."""
        t, step = self.table, self._step
        Scatter(batch_rows, batch_rows >= 0).put(self.row_last_seen, step)  # the batch's keys stay
        rows, chosen = oldest_static(self.row_last_seen, step, k)
        slots = self.row_slots.index_select(0, rows)
        gone = Scatter(rows, chosen)
        gone.put(self.row_slots, -1)
        gone.put(self.row_last_seen, NEVER_SEEN)
        gone.put(self.dirty, False)
        stack = self.num_free_t + torch.arange(rows.numel(), device=rows.device)  # chosen rows come first
        Scatter(stack.clamp(max=self.capacity - 1), chosen).put(self.free_rows, rows)
        dead = Scatter(slots.clamp(min=0), chosen)
        dead.put(t.keys, DELETED)
        dead.put(t.rows, -1)
        dead.put(t.counts, 0)
        dead.put(t.last_seen, NEVER_SEEN)
        self.num_free_t.add_(k)
        t.num_live_t.sub_(k)

    def _carry_out(self, plan: DevicePlan, inverse: torch.Tensor) -> torch.Tensor:
        """Carry out `_plan`: insert the new keys, count, admit (rows from the top of the free
        stack: ripe pending keys first, then new ones, in key order -- the host path's order), mark
        the rows seen; return the vectors of ``uniq[inverse]``."""
        # The step count as the device holds it (a tensor, not the host's int): a replayed CUDA
        # graph of this step then writes the current step, not the one it was captured at.
        t, step, p = self.table, self.global_step_t, plan
        ins, reused = claim(t, p.uniq, p.new, p.free, p.pos)
        placed = ins >= 0  # a key claim() left out is not counted this step (as one over capacity)
        slot = torch.where(p.found, p.slots, ins)
        seen = Scatter(slot, p.found | placed)
        seen.put(t.counts, p.total)
        seen.put(t.last_seen, step.expand(slot.shape))
        n_ins = placed.sum()
        t.num_used_t.add_(n_ins - reused)
        t.num_live_t.add_(n_ins)
        admit_new = p.new_admit & placed
        adm = p.ripe | admit_new
        n_ripe, n_adm = p.ripe.sum(), adm.sum()
        rank = torch.where(p.ripe, p.ripe.cumsum(0) - 1, n_ripe + admit_new.cumsum(0) - 1)
        row = self.free_rows.index_select(0, (self.num_free_t - 1 - rank).clamp(0, self.capacity - 1))
        masked_put(t.rows, slot, row, adm)
        fresh = Scatter(row, adm)
        fresh.put(self.row_slots, slot)
        with torch.no_grad():
            fresh.put(self.values, self._init_rows(row.numel()))
        fresh.put(self.reset_mask, True)
        self.num_free_t.sub_(n_adm)
        self.num_pending_t.add_((p.new_pending & placed).sum() - n_ripe)
        if p.pad_ok:  # padding: a new row, else the free stack's top (their optimizer state is stale)
            top = self.free_rows.index_select(0, (self.num_free_t - 1).clamp(min=0).reshape(1))
            self._reset_parts.append(self._padded(row, adm, top))
        rows = torch.where(adm, row, p.row)
        has = rows >= 0
        looked_up = Scatter(rows, has)  # looked up in training: seen, and dirty (see _mark_seen)
        looked_up.put(self.dirty, True)
        looked_up.put(self.row_last_seen, step.expand(rows.shape))
        return self._train_vectors(rows, has, inverse)

    def _train_vectors(self, rows: torch.Tensor, has: torch.Tensor, inverse: torch.Tensor,
                       padded: torch.Tensor | None = None, gather=None) -> torch.Tensor:
        """The vectors of a training step's unique keys' `rows` (`has`: the key has one; renormalised
        in place with ``max_norm``) for ``uniq[inverse]``; ``default_value`` for keys without a row.
        `padded`: `_padded` of `rows` with the free stack's top as fallback, when the caller has it
        (the Triton backend's kernel writes it). `gather`: ``gather(values, padded, has, inverse,
        default)``, the same vectors with `_MaskedRows`' sparse gradient in one launch (the Triton
        backend's `_KernelRows`), taken unless the table's gradient is dense. Every device backend
        ends its step here."""
        if self.max_norm is not None:
            self._renorm_masked(rows, has)
        grad = self.values.requires_grad and torch.is_grad_enabled()
        if gather is not None and padded is not None and (self.sparse or not grad):
            return gather(self.values, padded, has, inverse, self.default_value)
        if padded is None:
            top = self.free_rows.index_select(0, (self.num_free_t - 1).clamp(min=0).reshape(1))
            padded = self._padded(rows, has, top)
        index, mask = padded.index_select(0, inverse), has.index_select(0, inverse).unsqueeze(1)
        if self.sparse and grad:
            return _MaskedRows.apply(self.values, index, mask, self.default_value)
        emb = F.embedding(index, self.values, sparse=self.sparse)
        return torch.where(mask, emb, self.default_value.to(emb.dtype))

    @torch.no_grad()
    def _renorm_masked(self, rows: torch.Tensor, has: torch.Tensor) -> None:
        """`_renorm` of ``rows[has]``, static shape."""
        safe = rows.clamp(min=0)
        w = self.values.index_select(0, safe)
        norm = w.norm(dim=1)
        renormed = Scatter(safe, has)
        renormed.put(self.values, w * self.renorm_scale(norm).unsqueeze(1))
        renormed.put(self.dirty, self.dirty.index_select(0, safe) | (norm > self.max_norm))


def lookup_masked_many(calls: Sequence[tuple[DevicePath, torch.Tensor, torch.Tensor | None]],
                       reserved_free: bool = False) -> list[torch.Tensor]:
    """`HashEmbedding.lookup_masked` of several distinct tables ``(table, keys, mask)``, with at
    most ONE host read for all of them on a device (the tables whose bounds do not show room for
    their batch read their counters together; see the module doc). A mask of None looks up every
    key (as an all-true mask, with fewer ops: no second sort of the keys, no masked result).
    `reserved_free`: the caller guarantees that no key is one of the table's reserved markers (-1,
    -2; e.g. keys through `recstream.models.dynamic.table_key`), so an int64-keyed table skips that
    check.

    >>> from recstream.nn import HashEmbedding
    >>> a, b = HashEmbedding(2, capacity=8, param_init="ones"), HashEmbedding(3, capacity=8)
    >>> keys, mask = torch.tensor([5, 6]), torch.tensor([True, False])
    >>> [tuple(out.shape) for out in lookup_masked_many([(a, keys, mask), (b, keys, ~mask)])]
    [(2, 2), (2, 3)]
    """
    checked = _checked_calls(calls)  # every call checked before any begins: a bad one changes no table
    started: list = []
    out: list[torch.Tensor] = []
    try:
        for table, keys, mask in checked:
            started.append(table._begin_masked(keys, mask, reserved_free))
        reading = [(table, call) for (table, _, _), call in zip(checked, started, strict=True)
                   if isinstance(call, DeviceCall) and call.read]
        values: dict[int, list[int]] = {}
        if reading:  # the one read
            terms = [table._read_terms(call.plan) for table, call in reading]
            flat = torch.stack([t.to(torch.int64) for ts in terms for t in ts]).tolist()
            size = len(terms[0])
            values = {id(call): flat[i * size:(i + 1) * size] for i, (_, call) in enumerate(reading)}
        for (table, _, _), call in zip(checked, started, strict=True):
            out.append(call if isinstance(call, torch.Tensor) else table._finish(call, values.get(id(call))))
        return out
    except BaseException:
        # A call begun but not finished (a later one raised, e.g. a probe's assert on a CPU) leaves
        # its probe's first claim round behind: void it, or those bids would compete with the
        # table's next step's (`TableBackend.discard_bids`).
        for (table, _, _), call in zip(checked[len(out):], started[len(out):], strict=False):
            if isinstance(call, DeviceCall):
                call.backend.discard_bids(table, call.plan)
        raise


def _checked_calls(calls) -> list[tuple[DevicePath, torch.Tensor, torch.Tensor | None]]:
    """`lookup_masked_many`'s calls with their keys and masks checked (keys 1-D int, a mask None or
    a bool tensor shaped like its keys)."""
    owner, checked = "HashEmbedding.lookup_masked", []
    for table, keys, mask in calls:
        keys = check_int_tensor(owner, "keys", keys, ndim=1)
        if mask is not None:  # None: every key (no masked sort, no masking of the result)
            check_type(owner, "mask", mask, torch.Tensor)
            if mask.dtype != torch.bool or mask.shape != keys.shape:
                raise ValueError(f"{owner}: 'mask' must be a bool tensor shaped like 'keys' {tuple(keys.shape)}, "
                                 f"got {mask.dtype} {tuple(mask.shape)}")
        checked.append((table, keys, mask))
    return checked
