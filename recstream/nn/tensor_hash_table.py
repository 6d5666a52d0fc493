"""Open-addressing hash table on tensors: `TensorHashTable`.

Maps int64 keys to *slots* of fixed-size tensors, entirely with batched torch
ops (CPU or CUDA), for [`HashEmbedding`][recstream.nn.hash_embedding.HashEmbedding].

Design
------
* ``keys[num_slots]`` with ``num_slots`` a power of two; ``EMPTY = -1`` marks a
  never-used slot, ``DELETED = -2`` a tombstone. Those two values are therefore
  reserved and can not be keys.
* Slot payload tensors (``rows``, ``counts``, ``last_seen``) live next to the
  keys so a rehash moves them along.
* Hash: a murmur-style 32-bit finaliser computed on the two 32-bit halves of
  the key with multipliers < 2**31, so no int64 product can overflow
  (overflow of signed ints is undefined behaviour in the C++ kernels).
* Probing: triangular (quadratic) probing ``h, h+1, h+3, h+6, ...`` mod
  ``num_slots``, which visits every slot of a power-of-two table.
* Batched rounds: every unresolved key examines a window of ``PROBE_WINDOW``
  consecutive probe positions per round, all keys together; each round is a
  handful of gathers plus ONE compaction (``nonzero``: a host sync --
  unavoidable, the next round's size depends on it). At the load kept here
  nearly every key resolves in the first round: for the few hundred keys of
  one feature's batch the cost of a lookup is the number of torch ops, not
  the bytes gathered, so one round of width 8 beats the several rounds of
  width 1 that the longest probe sequence of a batch needs (a batch of new
  keys needs several such rounds; figures: docs/benchmarks.md). Calls on more than
  ``WIDE_WINDOW_MAX_KEYS`` keys pay for bytes instead and probe one slot per
  round. Probes per key are bounded by ``max_rounds``.
* Insert conflicts: keys whose first free slot is the same are sorted by slot;
  the first of each run wins and is written, the others move on past it.
  Deterministic on CPU and CUDA.
* Lookup, then insert of the misses (a training step's new keys): `locate` notes each
  absent key's first free slot while it probes, and `insert_at` writes the keys there when
  no two want the same slot -- one probe instead of two.
* Compiled kernels: on a CPU, tables of int64 keys look up and insert through ``_hash_kernels``
  (C, built with the package; see the comment atop ``_hash_kernels.c``): one pass per key with
  the next keys' probes prefetched, the same probe sequence and tombstone rule, and an insert that
  replays the rounds below claim for claim, so both implementations leave the same layout. The
  torch ops run for int32 keys, wherever the extension was not built (`native`)
  and on a device outside HashEmbedding's training and eval lookups, which take the static-shape
  ops of `hash_static` there (no compaction, no host sync). Counters the device
  path changes on the device reach the host mirrors (`num_used`) at the next read of them.
* Load factor: the owner keeps ``live <= max_load * num_slots`` (0.5 by
  default: ~1.5 probes per successful lookup). Tombstones count as used
  (misses probe past them); when ``used`` would exceed a second, higher bound
  (0.75 for HashEmbedding) the table is rebuilt without them (`rehash`).

Example:
    >>> import torch
    >>> t = TensorHashTable(num_slots=16)
    >>> slots = t.insert(torch.tensor([5, -7, 2**40]))
    >>> bool((t.find(torch.tensor([-7, 3])) == torch.stack([slots[1], torch.tensor(-1)])).all())
    True
"""

from __future__ import annotations

import torch
from torch import nn

from ..hostpath import host_reads_free
from ..sorting import sort_bounded
from ..validation import check_choice, check_int
from . import native

__all__ = ["TensorHashTable", "EMPTY", "DELETED", "NEVER_SEEN", "PROBE_WINDOW", "hash_keys"]

EMPTY = -1
DELETED = -2
NEVER_SEEN = torch.iinfo(torch.int64).max  # last_seen of a free slot
PROBE_WINDOW = 8  # probe positions a key examines per round (see the module doc) ...
WIDE_WINDOW_MAX_KEYS = 4096  # ... in a call on at most this many keys; one per round in larger calls
_M32 = 0xFFFFFFFF
# Multipliers < 2**31 so that (32-bit value) * multiplier < 2**63.
_C0, _C1, _C2 = 0x5BD1E995, 0x27D4EB2F, 0x165667B1


def hash_keys(keys: torch.Tensor) -> torch.Tensor:
    """32-bit mix of int64 ``keys`` (non-negative int64 result, overflow-free)."""
    k = keys.to(torch.int64)
    lo = k & _M32
    hi = (k >> 32) & _M32  # arithmetic shift; the mask makes it logical
    h = lo ^ ((hi * _C0) & _M32)
    h = ((h ^ (h >> 16)) * _C1) & _M32
    h = ((h ^ (h >> 13)) * _C2) & _M32
    return h ^ (h >> 16)


def _where(mask: torch.Tensor) -> torch.Tensor:
    """Indices of True entries (1-D). A host sync: the result size is data-dependent."""
    return mask.nonzero().squeeze(1)


def _after_load(module, incompatible_keys) -> None:
    """load_state_dict post-hook: refresh the python mirrors of the 0-d buffers."""
    module._sync_counters()


def _first_per_slot(wanted: torch.Tensor, num_slots: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One winner per wanted slot: ``(sorted slots, order, first)`` where ``order`` sorts `wanted`
    stably and ``first`` marks the first of each run of equal slots -- of the keys wanting one slot,
    the earliest in call order takes it (deterministic on CPU and CUDA)."""
    slots, order = sort_bounded(wanted, num_slots)
    first = torch.ones_like(slots, dtype=torch.bool)
    first[1:] = slots[1:] != slots[:-1]
    return slots, order, first


class TensorHashTable(nn.Module):
    """Key -> slot map with per-slot payload, all state in buffers.

    Args:
        num_slots: table size, a power of two.
        key_dtype: storage dtype of the keys (int64 or int32).
        max_rounds: probes per key before giving up (RuntimeError); with the load
            kept at 0.5 the longest probe sequence is a few dozen slots even for
            millions of keys.
        device: where the tensors live.

    Memory: 8 (key, int64) + 8 (row) + 8 (count) + 8 (last_seen) = 32 bytes per
    slot (28 with int32 keys).
    """

    EMPTY = EMPTY
    DELETED = DELETED

    def __init__(self, num_slots: int, key_dtype: torch.dtype = torch.int64,
                 max_rounds: int = 128, device=None) -> None:
        super().__init__()
        num_slots = check_int("TensorHashTable", "num_slots", num_slots, minimum=1)
        if num_slots & (num_slots - 1):
            raise ValueError(f"TensorHashTable: 'num_slots' must be a power of two, got {num_slots}")
        check_choice("TensorHashTable", "key_dtype", key_dtype, (torch.int64, torch.int32))
        self.num_slots = num_slots
        self.max_rounds = check_int("TensorHashTable", "max_rounds", max_rounds, minimum=1)
        self._tri_cache: dict[torch.device, torch.Tensor] = {}
        self.register_buffer("keys", torch.full((num_slots,), EMPTY, dtype=key_dtype, device=device))
        self.register_buffer("rows", torch.full((num_slots,), -1, dtype=torch.int64, device=device))
        self.register_buffer("counts", torch.zeros(num_slots, dtype=torch.int64, device=device))
        # Free slots read "seen at +inf", so `last_seen < t` alone selects old keys.
        self.register_buffer("last_seen", torch.full((num_slots,), NEVER_SEEN, dtype=torch.int64,
                                                     device=device))
        # Occupancy scalars as 0-d buffers (checkpointed); the python mirrors
        # below avoid a device->host read on every call.
        self.register_buffer("num_used_t", torch.zeros((), dtype=torch.int64, device=device))
        self.register_buffer("num_live_t", torch.zeros((), dtype=torch.int64, device=device))
        self._used = self._live = 0  # live + tombstones; live (host mirrors, see num_used)
        self._stale = False  # the device path changed the 0-d buffers: the mirrors wait for a read
        self.used_bound = 0  # an upper bound of num_used that never needs a read (the device path's)
        # A module-level function (not a lambda) keeps the module picklable.
        self.register_load_state_dict_post_hook(_after_load)

    @property
    def num_used(self) -> int:
        """Slots holding a key or a tombstone. After the device path (``recstream.nn.hash_static``)
        changed the counters on the device, the first read copies them to the host (one sync)."""
        if self._stale:
            self._sync_counters()
        return self._used

    @property
    def num_live(self) -> int:
        """Slots holding a key (see `num_used`)."""
        if self._stale:
            self._sync_counters()
        return self._live

    def _sync_counters(self) -> None:
        self.set_mirrors(*torch.stack([self.num_used_t, self.num_live_t]).tolist())

    epoch = 0  # moves on at every set_mirrors: a copy of the counters queued before is void (hash_counters)

    def set_mirrors(self, used: int, live: int) -> None:
        """The host's copies of the counters, just read from the device (or set there by the host)."""
        self._used, self._live, self._stale, self.used_bound = used, live, False, used
        self.epoch += 1

    def mark_stale(self, more_used: int) -> None:
        """The device path changed the counters on the device, adding at most `more_used` used slots."""
        self.used_bound = self.num_used_bound() + more_used
        self._stale = True

    def num_used_bound(self) -> int:
        """`num_used` or more, without a read."""
        return self.used_bound if self._stale else self._used

    def _set_counters(self, used: int, live: int) -> None:
        self.set_mirrors(used, live)
        self.num_used_t.fill_(used)
        self.num_live_t.fill_(live)

    def runs_kernels(self, keys: torch.Tensor) -> bool:
        """Whether a call on `keys` runs the compiled kernels: a CPU table of int64 keys, CPU keys on
        the host path (``recstream.hostpath``), the kernels built (module doc)."""
        return native.kernels is not None and self.keys.device.type == "cpu" and self.keys.dtype == torch.int64 \
            and host_reads_free(keys)

    def occupied(self) -> torch.Tensor:
        """Bool mask of slots holding a key."""
        return (self.keys != EMPTY) & (self.keys != DELETED)

    def start_of(self, keys: torch.Tensor) -> torch.Tensor:
        """First probe slot of each of ``keys``: pass it to `find` and `insert` when
        both see the same keys, to hash them once."""
        return hash_keys(keys) & (self.num_slots - 1)

    def _window(self, start: torch.Tensor, offset: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Slots at probe offsets ``offset`` (``[w]`` for all keys or ``[n, w]``, from `_triangular`)
        of keys hashed to ``start`` ``[n]``, and the keys stored there: two ``[n, w]`` tensors."""
        pos = (start.unsqueeze(1) + offset) & (self.num_slots - 1)
        return pos, self.keys.index_select(0, pos.view(-1)).view(pos.shape)

    def _triangular(self, device) -> torch.Tensor:
        """``r * (r + 1) / 2`` for every probe number ``r``: triangular probing's offsets, looked up
        instead of computed (three ops fewer per round)."""
        tri = self._tri_cache.get(device)
        if tri is None:
            r = torch.arange(self.max_rounds + PROBE_WINDOW, device=device)
            tri = self._tri_cache[device] = r * (r + 1) // 2
        return tri

    def _width(self, n: int) -> int:
        """Probes per round for a call on `n` keys. A wide window saves rounds, i.e. ops, which is what
        small calls cost; a large call pays for the bytes instead (measured: 26k keys per call at
        width 8 took 17% longer than at width 1), so it probes one slot per round."""
        return min(PROBE_WINDOW if n <= WIDE_WINDOW_MAX_KEYS else 1, self.max_rounds)

    def find(self, keys: torch.Tensor, start: torch.Tensor | None = None) -> torch.Tensor:
        """Slot of each of ``keys`` (1-D), ``-1`` where absent. Read-only. ``start``: `start_of`."""
        return self._probe(keys, start, want_free=False)[0]

    def locate(self, keys: torch.Tensor, start: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """`find`, plus where each absent key would go: ``(slots, free)``.

        ``free`` holds, for each absent key, the first free slot (EMPTY or tombstone) of its probe
        sequence -- the slot `insert` would give it were it inserted alone -- and ``-1`` for
        present keys. Pass both to `insert_at`: a lookup that admits new keys then probes
        once instead of twice (on a CPU, where a small call costs its number of torch ops, the
        second probe was as dear as the first). Read-only.
        """
        return self._probe(keys, start, want_free=True)

    def _probe(self, keys: torch.Tensor, start: torch.Tensor | None,
               want_free: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.runs_kernels(keys):
            keys = keys.to(torch.int64).contiguous()
            slots = torch.empty_like(keys)
            free = torch.empty_like(keys) if want_free else None
            native.kernels.locate(self.keys.numpy(), keys.numpy(), slots.numpy(),
                                  None if free is None else free.numpy(), self.max_rounds)
            return slots, free
        keys = keys.to(self.keys.dtype)
        start = self.start_of(keys) if start is None else start
        tri = self._triangular(keys.device)
        tombstones = self.num_used > self.num_live  # else a probe's first free slot is its stop
        note_free = want_free and tombstones
        free = torch.full(keys.shape, -1, dtype=torch.int64, device=keys.device) if note_free else None
        # Round 1 covers every key in order (idx None): its results are the outputs, no scatter. The
        # few keys left unresolved go on in later rounds, idx holding their positions.
        idx = out = None
        probe = 0
        while probe < self.max_rounds:
            # Per round: a large call's first round pays for bytes (width 1), the few keys that
            # go on pay for ops (a wide window resolves them in one or two more rounds, not ten).
            width = self._width(keys.numel())
            pos, cur = self._window(start, tri[probe:probe + width])
            hit = cur == keys.unsqueeze(1)
            empty = cur == EMPTY
            stop = hit | empty  # the key, or an EMPTY slot: it is absent (tombstones are probed past)
            if note_free:  # a key's first free slot: keep the one of an earlier round
                self._note_free(free, idx, pos, empty | (cur == DELETED))
            if width > 1:  # the first stop in the window
                first = stop.to(torch.uint8).argmax(1, keepdim=True)
                hit, pos, stop = hit.gather(1, first), pos.gather(1, first), stop.any(1, keepdim=True)
            # Writing -1 for misses (and for keys whose window had no stop: they are rewritten in
            # a later round) is safe: idx holds only unresolved keys.
            found = torch.where(hit, pos, -1).view(-1)
            stop_free = torch.where(hit, -1, pos).view(-1) if want_free and not tombstones else None
            if idx is None:
                out, free = found, (free if stop_free is None else stop_free)
            else:
                out.index_copy_(0, idx, found)
                if stop_free is not None:  # the first free slot is the EMPTY one that stopped the probe
                    free.index_copy_(0, idx, stop_free)
            go = _where(~stop.view(-1))  # host sync: next round's size
            if go.numel() == 0:
                break
            probe += width
            idx = go if idx is None else idx.index_select(0, go)
            keys, start = keys.index_select(0, go), start.index_select(0, go)
        else:
            raise RuntimeError(f"hash table probe exceeded max_rounds={self.max_rounds}")
        if note_free:  # a found key needs no slot (its window may have held a free one)
            free.masked_fill_(out >= 0, -1)
        return out, free

    @staticmethod
    def _note_free(free: torch.Tensor, idx: torch.Tensor | None, pos: torch.Tensor, is_free: torch.Tensor) -> None:
        """Record in ``free[idx]`` (``idx`` None: all of ``free``) the first free slot of this round's
        window ``pos`` ``[n, w]`` (``is_free``), for keys that have none from an earlier round."""
        first = is_free.to(torch.uint8).argmax(1, keepdim=True)
        here = torch.where(is_free.any(1), pos.gather(1, first).squeeze(1), -1)
        if idx is None:  # round 1: no earlier slot to keep
            free.copy_(here)
            return
        before = free.index_select(0, idx)
        free.index_copy_(0, idx, torch.where(before >= 0, before, here))

    def insert_at(self, keys: torch.Tensor, free: torch.Tensor, start: torch.Tensor | None = None) -> torch.Tensor:
        """`insert` of unique absent ``keys`` whose free slots `locate` just found.

        Each key goes to its ``free`` slot: the first free slot of its probe sequence, so
        `find` reaches it before any EMPTY slot. Where several keys want one slot (rare at
        the load kept here, but a call on thousands of new keys has a few) the first takes it and
        the others go through `insert`. ``start``: `start_of` of ``keys``. The layout
        may differ from one `insert` of the same keys (which of two keys wanting one slot
        reaches it first depends on the probe window); both are valid.
        """
        if self.runs_kernels(keys):
            return self._insert_native(keys, free)
        keys = keys.to(self.keys.dtype)
        wanted, order, first = _first_per_slot(free, self.num_slots)  # the rule insert() applies
        lose = None
        if not bool(first.all()):  # host sync: is any slot wanted twice
            lose = order.index_select(0, _where(~first)).sort()[0]  # in call order, as insert() has them compete
            keep = order.index_select(0, _where(first))
            out, free, keys_won = free.clone(), wanted.index_select(0, _where(first)), keys.index_select(0, keep)
        else:
            out, keys_won = free, keys
        # Tombstones reused: only a table that has some can reuse one (spares a gather and a host sync).
        n_reused = int((self.keys.index_select(0, free) == DELETED).sum()) if self.num_used > self.num_live else 0
        self.keys.index_copy_(0, free, keys_won)
        self._reset_payload(free)
        self._set_counters(self.num_used + free.numel() - n_reused, self.num_live + free.numel())
        if lose is not None:  # they probe on past the slots taken above
            lose_start = self.start_of(keys.index_select(0, lose)) if start is None else start.index_select(0, lose)
            out.index_copy_(0, lose, self.insert(keys.index_select(0, lose), lose_start))
        return out

    def _insert_native(self, keys: torch.Tensor, free: torch.Tensor | None) -> torch.Tensor:
        """`insert_at` (`free` given) or `insert` (None) by the compiled kernel."""
        keys = keys.to(torch.int64).contiguous()
        out = torch.empty_like(keys)
        free = None if free is None else free.to(torch.int64).contiguous().numpy()
        reused = native.kernels.insert(
            self.keys.numpy(), self.rows.numpy(), self.counts.numpy(), self.last_seen.numpy(), keys.numpy(), free,
            out.numpy(), self.max_rounds, PROBE_WINDOW, WIDE_WINDOW_MAX_KEYS)
        self.record_inserts(keys.numel(), reused)
        return out

    def record_inserts(self, n: int, reused: int) -> None:
        """Count `n` keys written into free slots, `reused` of them tombstones (`insert` does;
        so does a kernel that inserts for its owner, HashEmbedding's admission)."""
        self._set_counters(self.num_used + n - reused, self.num_live + n)

    def _reset_payload(self, slots: torch.Tensor) -> None:
        """Payload of newly written slots: no row, no count, seen at step 0."""
        self.rows.index_fill_(0, slots, -1)
        self.counts.index_fill_(0, slots, 0)
        self.last_seen.index_fill_(0, slots, 0)

    def insert(self, keys: torch.Tensor, start: torch.Tensor | None = None) -> torch.Tensor:
        """Insert unique keys that are NOT in the table; return their slots.

        The caller guarantees room (``num_used + len(keys)`` within the load
        bound; see `needs_rehash`). Payload of the new slots is reset
        (``last_seen`` to 0). ``start``: `start_of` of ``keys``.
        """
        if self.runs_kernels(keys):
            return self._insert_native(keys, None)
        keys = keys.to(self.keys.dtype)
        n = keys.numel()
        out = torch.empty(n, dtype=torch.int64, device=keys.device)
        idx = torch.arange(n, device=keys.device)
        start = self.start_of(keys) if start is None else start
        probe = torch.zeros(n, dtype=torch.int64, device=keys.device)  # each key's next probe
        reused = torch.zeros((), dtype=torch.int64, device=keys.device)
        steps = torch.arange(self._width(n), device=keys.device)
        tri = self._triangular(keys.device)
        for _ in range(self.max_rounds):  # every round moves each unplaced key >= 1 probe on
            if idx.numel() == 0:
                break
            step = probe.unsqueeze(1) + steps
            pos, cur = self._window(start, tri[step.view(-1)].view(step.shape))
            free = ((cur == EMPTY) | (cur == DELETED)) & (step < self.max_rounds)  # find looks only there
            first = free.to(torch.uint8).argmax(1, keepdim=True)  # the first free slot in the window
            want, was = pos.gather(1, first).squeeze(1), cur.gather(1, first).squeeze(1)
            cand = _where(free.any(1))  # host sync: candidate count
            _, order, head = _first_per_slot(want.index_select(0, cand), self.num_slots)
            win = cand.index_select(0, order.index_select(0, _where(head)))
            wpos = want.index_select(0, win)
            reused += (was.index_select(0, win) == DELETED).sum()
            self.keys.index_copy_(0, wpos, keys.index_select(0, win))
            out.index_copy_(0, idx.index_select(0, win), wpos)
            # Losers go on past the slot they lost (the slots before it were taken); keys with
            # no free slot in their window go on past the window.
            probe = probe + torch.where(free.any(1), first.squeeze(1) + 1, first.new_tensor(cur.shape[1]))
            go = _where(torch.ones_like(idx, dtype=torch.bool).index_fill_(0, win, False)
                        & (probe < self.max_rounds))  # host sync
            if go.numel() + win.numel() < idx.numel():  # someone ran out of probes
                raise RuntimeError(f"hash table insert exceeded max_rounds={self.max_rounds}")
            idx, keys = idx.index_select(0, go), keys.index_select(0, go)
            start, probe = start.index_select(0, go), probe.index_select(0, go)
        self._reset_payload(out)
        n_reused = int(reused)  # host sync: occupancy bookkeeping
        self._set_counters(self.num_used + n - n_reused, self.num_live + n)
        return out

    def delete(self, slots: torch.Tensor) -> None:
        """Turn occupied ``slots`` (unique) into tombstones and clear their payload."""
        self.keys.index_fill_(0, slots, DELETED)
        self.rows.index_fill_(0, slots, -1)
        self.counts.index_fill_(0, slots, 0)
        self.last_seen.index_fill_(0, slots, NEVER_SEEN)
        self._set_counters(self.num_used, self.num_live - slots.numel())

    def needs_rehash(self, n_new: int, max_used: float) -> bool:
        """Whether inserting ``n_new`` keys would push used slots past ``max_used`` (a fraction)."""
        return self.num_used + n_new > max_used * self.num_slots

    def rehash(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Rebuild without tombstones; return ``(old_slots, new_slots)`` of live keys."""
        old = _where(self.occupied())
        keys, rows = self.keys.index_select(0, old), self.rows.index_select(0, old)
        counts, last_seen = self.counts.index_select(0, old), self.last_seen.index_select(0, old)
        self.keys.fill_(EMPTY)
        self.rows.fill_(-1)
        self.counts.zero_()
        self.last_seen.fill_(NEVER_SEEN)
        self._set_counters(0, 0)
        new = self.insert(keys)
        self.rows.index_copy_(0, new, rows)
        self.counts.index_copy_(0, new, counts)
        self.last_seen.index_copy_(0, new, last_seen)
        return old, new

    def extra_repr(self) -> str:
        return f"num_slots={self.num_slots}, live={self.num_live}, used={self.num_used}"
