"""The Triton backend of `HashEmbedding`'s device path (``table_backend="triton"``; by default on
CUDA when ``triton`` imports): the steps of a training lookup as a handful of kernel launches.

The device path's decision stays `DevicePath`'s (host bounds of free rows, pending keys and used
slots; one read of the counters when they do not show room; then the LRU pass and the drop of
pending keys over budget, and a rebuild when tombstones pass the used-slot bound; the host path's
step only while evictions are logged or a batch brings more new keys than there are keys to
evict). What runs on the device per step:

* ``unique`` (a sort, then two launches: `hash_triton_unique`; `static_unique`'s torch ops for a
  masked lookup): every key of the batch once, so each key is found or inserted by exactly one
  kernel lane -- no two lanes ever insert the same key;
* ``probe`` (one launch; in a training lookup it first writes the unique keys' counts from their
  runs' ends): each key walks its probe sequence (the table's triangular probing, its
  hash: the layout `TensorHashTable` and the compiled CPU kernels read) to its slot or an EMPTY one,
  and reads its row and count -- the plan `DevicePath._decide` needs;
* ``round`` (``CLAIM_ROUNDS`` launches for ``CLAIM_ROUNDS`` rounds: the probe of a training lookup
  makes the first round's bids, and a round's writes share a launch with the next round's bids;
  after a read that decides the plan again, those bids are void and the first round runs as a
  launch of its own): new keys claim free slots -- each bids for its first free
  slot with ``atomic_max`` on a per-slot claim word (the lowest key index wins: the host path's
  rule, the same on every GPU), the winner alone writes its key there, the losers bid for their
  next free slot -- free, and bid for in no earlier round of the step -- in the next round (as
  HierarchicalKV's probing, made deterministic); a key without a slot after the last round is
  left out of the step, as on the torch path;
* ``carry_out`` (one launch): counts and last-seen steps are written; a key admitted now takes the
  row at its place from the top of the device free stack (its rank among the admitted keys, ripe
  pending ones first, then new ones in key order -- the admitted keys of earlier programs, which
  the last claim round counted per program, plus a cumsum within the block --, so every backend
  gives a key the same row), gets its initial values, and its row is marked seen, dirty and to
  reset; it also writes the rows looked up and the rows to reset, padded (`DevicePath._padded`'s
  rule) with no torch op; slot and pending counters move by one ``atomic_add`` per program;
* ``gather`` (one launch, `_KernelRows`): each batch entry's vector -- its unique key's row, or
  ``default_value`` for a key without one -- and the row and flag the backward's sparse gradient
  names (two gathers, an ``embedding`` and a ``where`` on the torch path);
* ``evict_stale`` (one launch): the age eviction of ``step()`` -- every stale slot becomes a
  tombstone and its row goes back onto the free stack (in slot order, as on the host path);
* after the one read of a full step: ``mark`` + `oldest_static` (torch ops) + ``evict_chosen`` for
  the LRU pass and the pending drop, ``reinsert`` for a rebuild (every live key CAS-inserted
  into the emptied table: no host loop, no sync), ``probe`` again.

Semantics are the device path's (tests/nn/test_hash_triton.py runs the host path, the torch ops
and these kernels -- on CPU tensors, in Triton's interpreter -- on the same key streams): the same
keys admitted to the same slots and rows, counted, aged and evicted, with the same values. One
step differs: a rebuild CAS-inserts every live key at once, so on a GPU its slot layout follows the
atomics' order, not the host path's rehash. A slot is no part of the semantics, but two choices
follow the slot order: the age eviction pushes rows onto the free stack in slot order, and the
pending drop breaks ties of equal age by slot. So after a device rebuild, with age eviction or
pending keys over budget, which free row a key gets next and which of equally old pending keys
goes may differ from the host path's; the table stays sound (tests check its invariants).
"""
from __future__ import annotations

import functools

import torch

from ..hostpath import device_assert
from . import hash_triton_unique
from .hash_device_path import StaticBackend, _MaskedRows
from .hash_static import CLAIM_ROUNDS, DevicePlan
from .lru_select import oldest_static
from .tensor_hash_table import _M32, DELETED, EMPTY, NEVER_SEEN

__all__ = ["TritonBackend", "TRITON", "launches"]

BLOCK = 128  # keys (slots) per program
PBLOCK_MAX = 1024  # per-program counts a program sums at a time (more programs: a loop)


def per_program_block(nprog: int) -> int:
    """The block in which a kernel sums `nprog` programs' counts: a power of two, 16 to ``PBLOCK_MAX``."""
    return max(16, min(PBLOCK_MAX, 1 << (nprog - 1).bit_length()))

launches = 0
"""Kernels launched by this backend so far (what a step costs in launches; tests read it)."""


# The kernels are plain functions here, made Triton kernels by `_kernels` on first use (``triton`` is
# optional: this module imports without it). Inside them ``tl``, ``_start`` and ``_claim`` are this
# module's globals, set by `_kernels`; constants are literals (-1 EMPTY, -2 DELETED; the multipliers
# of `tensor_hash_table.hash_keys`), as a kernel reads no other global.
tl = _start = _claim = None


def _start_fn(key, m32, slot_mask):
    """`hash_keys` of int64 `key` & `slot_mask`: the first slot of its probe sequence."""
    lo = key & m32
    hi = (key >> 32) & m32
    h = lo ^ ((hi * 1540483477) & m32)
    h = ((h ^ (h >> 16)) * 668265263) & m32
    h = ((h ^ (h >> 13)) * 374761393) & m32
    return (h ^ (h >> 16)) & slot_mask

def _probe_fn(tkeys, trows, tcounts, uniq, cnt, valid, ends, out_slot, out_free, out_row, out_total, out_ok, flags,
          owner, tag, active, want_buf, deleted_buf, placed, n, slot_mask, max_rounds, m32, permit,
          BLOCK: tl.constexpr, FLAGS: tl.constexpr, ENDS: tl.constexpr, BID: tl.constexpr):
    """`ENDS`: the unique keys' counts and valid flags are first computed here, from the ends of
    their runs in the sorted batch (`static_unique`'s counts, computed here: `ends` is the
    previous launch's output, and each lane writes only its own `cnt` and `valid` entries).

    `BID` (with `FLAGS`): the first claim round's first half too (`_round_fn`'s `FIRST` launch,
    folded in): each new key bids for the free slot it found. Race-free: this launch writes no key
    word (its reads of `tkeys` see the table as before it), its only shared writes are the bids'
    commuting ``atomic_max`` es, which nothing in it reads, and each lane writes only its own
    entries of the claim buffers."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inb = i < n
    key = tl.load(uniq + i, mask=inb, other=0)
    if ENDS:
        run_end = tl.load(ends + i, mask=inb, other=0)
        run_count = run_end - tl.load(ends + i - 1, mask=inb & (i > 0), other=0)
        tl.store(cnt + i, run_count, mask=inb)
        tl.store(valid + i, (run_count > 0).to(tl.int8), mask=inb)
        act = inb & (run_count > 0)
    else:
        act = inb & (tl.load(valid + i, mask=inb, other=0) != 0)
    h = _start(key, m32, slot_mask)
    slot = tl.full([BLOCK], -1, tl.int64)
    free = tl.full([BLOCK], -1, tl.int64)
    r = 0
    while (tl.max(act.to(tl.int32), 0) > 0) & (r < max_rounds):
        pos = (h + r * (r + 1) // 2) & slot_mask
        cur = tl.load(tkeys + pos, mask=act, other=-1).to(tl.int64)
        hit = act & (cur == key)
        slot = tl.where(hit, pos, slot)
        free = tl.where(act & ~hit & (free < 0) & ((cur == -1) | (cur == -2)), pos, free)
        act = act & ~hit & (cur != -1)
        r += 1
    found = slot >= 0
    safe = tl.where(found, slot, 0)
    c = tl.load(cnt + i, mask=inb, other=0)
    free = tl.where(found, -1, free)
    row = tl.where(found, tl.load(trows + safe, mask=inb & found, other=-1), -1)
    total = tl.where(found, tl.load(tcounts + safe, mask=inb & found, other=0) + c, c)
    tl.store(out_slot + i, slot, mask=inb)
    tl.store(out_free + i, free, mask=inb)
    tl.store(out_row + i, row, mask=inb)
    tl.store(out_total + i, total, mask=inb)
    tl.store(out_ok + i, (~act).to(tl.int8), mask=inb)  # 0: the probe passed max_rounds (a device assert)
    if FLAGS:  # the plan's masks (`TritonBackend.plan`), rows of `flags` [5, n], here rather than 10 ops
        new = free >= 0
        tl.store(flags + i, found.to(tl.int8), mask=inb)
        tl.store(flags + n + i, new.to(tl.int8), mask=inb)
        tl.store(flags + 2 * n + i, (found & (row < 0) & (total >= permit)).to(tl.int8), mask=inb)
        tl.store(flags + 3 * n + i, (new & (c >= permit)).to(tl.int8), mask=inb)
        tl.store(flags + 4 * n + i, (new & (c < permit)).to(tl.int8), mask=inb)
        if BID:  # as `_round_fn`'s FIRST launch: the claim buffers start here, then round 0's bids
            tl.store(active + i, new.to(tl.int8), mask=inb)
            tl.store(placed + i, tl.full([BLOCK], -1, tl.int64), mask=inb)
            tl.store(deleted_buf + i, tl.full([BLOCK], 0, tl.int8), mask=inb)
            bid = inb & new
            safe = tl.where(bid, free, 0)
            tl.store(deleted_buf + i, (tl.load(tkeys + safe, mask=bid, other=0) == -2).to(tl.int8), mask=bid)
            tl.store(want_buf + i, tl.where(bid, free, -1), mask=inb)
            tl.atomic_max(owner + safe, ((tl.load(tag) + 1) << 32) - 1 - i.to(tl.int64), mask=bid)
            # the device assert's word (``tag + 1``, 1 since the last carry-out): 0 if a probe ended
            # without an empty slot; programs' ``atomic_min`` s commute, and nothing here reads it
            tl.atomic_min(tag + 1, tl.min((~act).to(tl.int64), 0))

def _claim_fn(tkeys, key, act, h, slot_mask, max_rounds, BLOCK: tl.constexpr):
    """Each `act` lane's key into the first free slot of its sequence it wins by compare-and-swap:
    ``(slot or -1, whether it was a tombstone)``."""
    slot = tl.full([BLOCK], -1, tl.int64)
    was_deleted = act & (slot > 0)
    r = 0
    while (tl.max(act.to(tl.int32), 0) > 0) & (r < max_rounds):
        pos = (h + r * (r + 1) // 2) & slot_mask
        cur = tl.load(tkeys + pos, mask=act, other=-1)
        free = act & ((cur == -1) | (cur == -2))
        # Lanes with nothing to claim swap a value for itself: a no-op whatever the slot holds.
        cmp = cur
        prev = tl.atomic_cas(tkeys + pos, cmp, tl.where(free, key.to(cur.dtype), cur))
        won = free & (prev == cmp)
        slot = tl.where(won, pos, slot)
        was_deleted = was_deleted | (won & (cur == -2))
        act = act & ~won
        r += 1
    return slot, was_deleted

def _round_fn(tkeys, owner, uniq, new_in, active, want_buf, deleted_buf, placed, free_in, n, slot_mask, max_rounds,
              m32, tag, rnd, ripe_in, admit_in, block_counts, num_free, FIRST: tl.constexpr, LAST: tl.constexpr,
              BLOCK: tl.constexpr):
    """Launch `rnd` of the claim rounds: the second half of round ``rnd - 1`` (unless `FIRST`), then
    the first half of round `rnd` (unless `LAST`) -- ``CLAIM_ROUNDS + 1`` launches in all, where a
    round was two; ``CLAIM_ROUNDS`` where the probe made round 0's bids (`_probe_fn`'s `BID`).

    Second half of a round: the winner of each wanted slot writes its key there and is placed; the
    others stay active. First half: each active key wants a free slot -- its probe's first free slot
    in the first round (`free_in`), else the first slot of its sequence free now -- and bids for it
    with ``atomic_max`` of ``base - i`` on the slot's claim word: the lowest key index wins (the host
    path's rule: the first in call order), on every GPU alike. ``base`` grows with the round counter
    `tag` (on the device: a replayed CUDA graph counts too), so no claim word is ever cleared: round
    ``r`` bids ``((tag + r + 1) << 32) - 1 - i`` and `carry_out` moves `tag` on by
    ``CLAIM_ROUNDS`` after the last round.

    Race-free although one launch both writes round ``rnd - 1``'s winners and bids round `rnd`: "free
    now" is read as "the key word free and the claim word bid in no earlier round of this step" (its
    value outside those rounds' range). Every slot bid for in an earlier round has a winner
    that writes it, so that set is the slots free after the earlier rounds' writes, whether or not
    a winner of round ``rnd - 1`` has written its key yet when another program reads the slot. Those
    claim words are final: they were written by earlier launches, and no bid of this round goes to
    a slot they mark (so the winners' check reads a word nobody changes now); this round's bids
    raise other words to ``tag + rnd + 1``, free either way. Each lane writes only its own entries
    of `active`, `placed`, `want_buf` and `deleted_buf`, and a winner alone writes its slot's key.

    The `FIRST` launch also sets its lanes' `active` (the plan's new keys), `placed` (-1) and
    `deleted_buf` (0). The `LAST` launch also counts, per program, its lanes' keys admitted in this
    step -- ripe pending ones (``block_counts[pid]``) and new ones placed with an admitting count
    (``block_counts[n + pid]``) -- for `carry_out`'s ranks, and moves the free-row counter down by
    them: every key's placement is final once its own lane has run this launch, each program writes
    only its own count word, and integer ``atomic_add`` s commute (the same counter whatever order
    programs run in; `carry_out`, a later launch, is its only reader)."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inb = i < n
    if FIRST:  # the rounds' buffers start here, each lane its own entries (no fill launched before)
        act = inb & (tl.load(new_in + i, mask=inb, other=0) != 0)
        tl.store(active + i, act.to(tl.int8), mask=inb)
        tl.store(placed + i, tl.full([BLOCK], -1, tl.int64), mask=inb)
        tl.store(deleted_buf + i, tl.full([BLOCK], 0, tl.int8), mask=inb)
        want = tl.load(free_in + i, mask=act, other=-1)
    else:  # round rnd - 1's second half: its winners write their keys
        act = inb & (tl.load(active + i, mask=inb, other=0) != 0)
        prev = tl.load(want_buf + i, mask=act, other=-1)
        ok = act & (prev >= 0)
        safe = tl.where(ok, prev, 0)
        won = ok & (tl.load(owner + safe, mask=ok, other=0) == ((tl.load(tag) + rnd) << 32) - 1 - i.to(tl.int64))
        key = tl.load(uniq + i, mask=won, other=0)
        tl.store(tkeys + safe, key.to(tkeys.dtype.element_ty), mask=won)
        before = tl.load(placed + i, mask=inb, other=-1)  # earlier rounds' placements (earlier launches)
        tl.store(placed + i, prev, mask=won)
        tl.store(active + i, tl.full([BLOCK], 0, tl.int8), mask=won)
        if LAST:  # every lane's placement is final now
            ripe = inb & (tl.load(ripe_in + i, mask=inb, other=0) != 0)
            adm_new = inb & (tl.load(admit_in + i, mask=inb, other=0) != 0) & ((before >= 0) | won)
            n_ripe, n_new = tl.sum(ripe.to(tl.int64), 0), tl.sum(adm_new.to(tl.int64), 0)
            pid = tl.program_id(0)
            tl.store(block_counts + pid, n_ripe)
            tl.store(block_counts + n + pid, n_new)  # the second row of [2, n] words
            tl.atomic_add(num_free, -(n_ripe + n_new))
        else:  # round rnd's first half: the keys still without a slot look for the next free one
            act = act & ~won
            # The claim words bid in rounds 0 .. rnd - 1 of this step, exactly: round r's words lie in
            # ``((tag + r + 1) << 32) - n .. ((tag + r + 1) << 32) - 1`` (n < 2**32 keys); earlier
            # steps' (and never-bid zeros) lie below, this round's above.
            taken_lo = ((tl.load(tag) + 1) << 32) - n
            taken_hi = ((tl.load(tag) + rnd) << 32) - 1
            key = tl.load(uniq + i, mask=act, other=0)
            h = _start(key, m32, slot_mask)
            want = tl.full([BLOCK], -1, tl.int64)
            look = act
            r = 0
            while (tl.max(look.to(tl.int32), 0) > 0) & (r < max_rounds):
                pos = (h + r * (r + 1) // 2) & slot_mask
                cur = tl.load(tkeys + pos, mask=look, other=0)
                bid = tl.load(owner + pos, mask=look, other=0)
                free = look & ((cur == -1) | (cur == -2)) & ((bid < taken_lo) | (bid > taken_hi))
                want = tl.where(free, pos, want)
                look = look & ~free
                r += 1
    if not LAST:
        base = ((tl.load(tag) + rnd + 1) << 32) - 1
        ok = act & (want >= 0)
        safe = tl.where(ok, want, 0)
        tl.store(deleted_buf + i, (tl.load(tkeys + safe, mask=ok, other=0) == -2).to(tl.int8), mask=ok)
        tl.store(want_buf + i, tl.where(ok, want, -1), mask=inb)
        tl.atomic_max(owner + safe, base - i.to(tl.int64), mask=ok)


def _carry_out_fn(trows, tcounts, tlast, row_slots, row_last, dirty, reset, free_rows, values, init,
                  num_pending, num_used, num_live, num_free, tag, placed_in, deleted_in, slots_in, total_in, row_in,
                  ripe_in, admit_in, pending_in, block_counts, out_rows, out_reset, out_has, n, dim, cap, nprog,
                  rounds, step_ptr, init_scale, BLOCK: tl.constexpr, DIM: tl.constexpr, PBLOCK: tl.constexpr,
                  INIT: tl.constexpr):
    """Count, admit and look up the batch's keys after the claim rounds (see the module doc).

    Race-free: a program writes only its own keys' slots and rows (distinct keys: distinct slots;
    admitted keys: distinct stack positions, so distinct rows), reads of shared words (the claim
    rounds' per-program counts, `num_free`, the free stack, the plan) are of values no program of
    this launch writes, and counters move by commuting integer ``atomic_add`` s. Every program
    computes the same sums of `block_counts` (the same loads, the same order) and the same padding
    row, so the result does not depend on the order programs run in."""
    pid = tl.program_id(0)
    i = pid * BLOCK + tl.arange(0, BLOCK)
    inb = i < n
    step = tl.load(step_ptr)  # the table's step count on the device: a replayed CUDA graph reads the current one
    # The keys admitted by earlier programs (ripe ones, new ones) and by all: the ranks' offsets.
    zero = tl.sum(tl.zeros([PBLOCK], tl.int64), 0)
    ripe_before, new_before, ripe_all, new_all = zero, zero, zero, zero
    for p0 in range(0, nprog, PBLOCK):
        q = p0 + tl.arange(0, PBLOCK)
        qm = q < nprog
        r = tl.load(block_counts + q, mask=qm, other=0)
        a = tl.load(block_counts + n + q, mask=qm, other=0)
        ripe_all += tl.sum(r, 0)
        new_all += tl.sum(a, 0)
        ripe_before += tl.sum(tl.where(q < pid, r, 0), 0)
        new_before += tl.sum(tl.where(q < pid, a, 0), 0)
    num_free_now = tl.load(num_free)  # the last claim round took the step's admissions off already
    free_old = num_free_now + ripe_all + new_all
    placed = tl.load(placed_in + i, mask=inb, other=-1)
    placed_new = inb & (placed >= 0)
    was_deleted = tl.load(deleted_in + i, mask=inb, other=0) != 0
    found_slot = tl.load(slots_in + i, mask=inb, other=-1)
    slot = tl.where(found_slot >= 0, found_slot, placed)
    seen = inb & (slot >= 0)
    tl.store(tcounts + slot, tl.load(total_in + i, mask=inb, other=0), mask=seen)
    tl.store(tlast + slot, tl.full([BLOCK], 0, tl.int64) + step, mask=seen)
    ripe = inb & (tl.load(ripe_in + i, mask=inb, other=0) != 0)
    admit_new = placed_new & (tl.load(admit_in + i, mask=inb, other=0) != 0)
    adm = ripe | admit_new
    # Rows from the top of the free stack: ripe pending keys first, then new ones, in key order (the
    # host path's order, so every backend gives a key the same row).
    rank = tl.where(ripe, ripe_before + tl.cumsum(ripe.to(tl.int64), 0) - 1,
                    ripe_all + new_before + tl.cumsum(admit_new.to(tl.int64), 0) - 1)
    stack = tl.minimum(tl.maximum(free_old - 1 - rank, 0), cap - 1)
    row = tl.load(free_rows + stack, mask=adm, other=-1)
    tl.store(trows + slot, row, mask=adm | placed_new)  # -1: a new pending key
    tl.store(row_slots + row, slot, mask=adm)
    tl.store(reset + row, tl.full([BLOCK], 1, tl.int8), mask=adm)
    cols = tl.arange(0, DIM)
    for d in range(0, dim, DIM):
        c = d + cols
        m2 = adm[:, None] & (c < dim)[None, :]
        if INIT == 2:  # a constant (zeros, ones)
            v = tl.zeros([BLOCK, DIM], tl.float32) + init_scale
        else:  # `_init_rows`' float32 arithmetic on the same draw: the same values
            v = tl.load(init + i[:, None] * dim + c[None, :], mask=m2, other=0.0)
            if INIT == 1:
                v = v * 2.0 - 1.0  # uniform: exact doubling, then one rounding, as torch's two ops
            v = v * init_scale
        tl.store(values + row[:, None] * dim + c[None, :], v.to(values.dtype.element_ty), mask=m2)
    rows = tl.where(adm, row, tl.load(row_in + i, mask=inb, other=-1))
    has = inb & (rows >= 0)
    tl.store(dirty + rows, tl.full([BLOCK], 1, tl.int8), mask=has)
    tl.store(row_last + rows, tl.full([BLOCK], 0, tl.int64) + step, mask=has)
    # The rows to reset: the admitted ones, padded with rank 0's row (admitted, when any key is; else
    # the free stack's top, whose optimizer state is stale): the set `_padded` gives.
    top_old = tl.load(free_rows + tl.minimum(tl.maximum(free_old - 1, 0), cap - 1))
    tl.store(out_reset + i, tl.where(adm, row, top_old), mask=inb)
    # The rows looked up, padded with the row of the first key (in key order) that has one -- a row
    # the step's gradient names anyway (`DevicePath._padded`) --, else the free stack's top. Each
    # program finds that key itself (a scan from key 0, which stops at the first block with one).
    first = tl.sum(tl.zeros([BLOCK], tl.int64), 0) + n
    b = 0
    while (first == n) & (b < n):
        j = b + tl.arange(0, BLOCK)
        jm = j < n
        had = tl.load(row_in + j, mask=jm, other=-1) >= 0
        gets = (tl.load(ripe_in + j, mask=jm, other=0) != 0) | (
            (tl.load(admit_in + j, mask=jm, other=0) != 0) & (tl.load(placed_in + j, mask=jm, other=-1) >= 0))
        first = tl.min(tl.where(jm & (had | gets), j.to(tl.int64), n), 0)
        b += BLOCK
    safe_first = tl.minimum(first, n - 1)
    first_row = tl.load(row_in + safe_first)
    first_ripe = tl.load(ripe_in + safe_first) != 0
    # an admitted first key is rank 0 (ripe) or the first new one (rank ripe_all): no key before it has a row
    first_stack = tl.minimum(tl.maximum(free_old - 1 - tl.where(first_ripe, 0, ripe_all), 0), cap - 1)
    first_row = tl.where(first_row >= 0, first_row, tl.load(free_rows + first_stack))
    top = tl.load(free_rows + tl.maximum(num_free_now - 1, 0))
    pad = tl.where(first < n, first_row, top)
    tl.store(out_rows + i, tl.where(has, rows, pad), mask=inb)
    tl.store(out_has + i, has.to(tl.int8), mask=inb)
    pend = placed_new & (tl.load(pending_in + i, mask=inb, other=0) != 0)
    tl.atomic_add(num_used, tl.sum((placed_new & ~was_deleted).to(tl.int64), 0))
    tl.atomic_add(num_live, tl.sum(placed_new.to(tl.int64), 0))
    tl.atomic_add(num_pending, tl.sum(pend.to(tl.int64), 0) - tl.sum(ripe.to(tl.int64), 0))
    if pid == 0:  # the claim rounds' counter moves on (no program of this launch reads it), and the
        tl.store(tag, tl.load(tag) + rounds)  # probe's assert word is 1 again (read before this launch)
        tl.store(tag + 1, zero + 1)

def _evict_stale_fn(tkeys, trows, tcounts, tlast, row_slots, row_last, dirty, free_rows, stale_in, stack_in,
                    num_pending, num_live, n, never, BLOCK: tl.constexpr):
    s = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    stale = (s < n) & (tl.load(stale_in + s, mask=s < n, other=0) != 0)
    row = tl.load(trows + s, mask=stale, other=-1)
    adm = stale & (row >= 0)
    tl.store(free_rows + tl.load(stack_in + s, mask=adm, other=0), row, mask=adm)
    tl.store(row_slots + row, tl.full([BLOCK], -1, tl.int64), mask=adm)
    tl.store(row_last + row, tl.full([BLOCK], 0, tl.int64) + never, mask=adm)
    tl.store(dirty + row, tl.full([BLOCK], 0, tl.int8), mask=adm)
    tl.store(tkeys + s, tl.full([BLOCK], -2, tl.int64).to(tkeys.dtype.element_ty), mask=stale)
    tl.store(trows + s, tl.full([BLOCK], -1, tl.int64), mask=stale)
    tl.store(tcounts + s, tl.full([BLOCK], 0, tl.int64), mask=stale)
    tl.store(tlast + s, tl.full([BLOCK], 0, tl.int64) + never, mask=stale)
    n_stale, n_adm = tl.sum(stale.to(tl.int64), 0), tl.sum(adm.to(tl.int64), 0)
    tl.atomic_add(num_pending, n_adm - n_stale)
    tl.atomic_add(num_live, -n_stale)


def _mark_fn(buf, idx, n, step, BLOCK: tl.constexpr):
    """``buf[idx[i]] = step`` where ``idx[i] >= 0``: the batch's rows (slots) seen before an LRU pass."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    j = tl.load(idx + i, mask=i < n, other=-1)
    tl.store(buf + j, tl.full([BLOCK], 0, tl.int64) + step, mask=(i < n) & (j >= 0))


def _evict_chosen_fn(tkeys, trows, tcounts, tlast, row_slots, row_last, dirty, free_rows, order, chosen_in,
                     num_free, n, cap, never, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    """Evict the `chosen` entries of `order` (`oldest_static`'s: chosen ones first): rows (`ROWS`)
    go onto the free stack in that order and their slots become tombstones; or pending slots."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ch = (i < n) & (tl.load(chosen_in + i, mask=i < n, other=0) != 0)
    idx = tl.load(order + i, mask=ch, other=0)
    if ROWS:
        slot = tl.load(row_slots + idx, mask=ch, other=0)
        tl.store(row_slots + idx, tl.full([BLOCK], -1, tl.int64), mask=ch)
        tl.store(row_last + idx, tl.full([BLOCK], 0, tl.int64) + never, mask=ch)
        tl.store(dirty + idx, tl.full([BLOCK], 0, tl.int8), mask=ch)
        tl.store(free_rows + tl.minimum(tl.load(num_free) + i, cap - 1), idx, mask=ch)
    else:
        slot = idx
    tl.store(tkeys + slot, tl.full([BLOCK], -2, tl.int64).to(tkeys.dtype.element_ty), mask=ch)
    tl.store(trows + slot, tl.full([BLOCK], -1, tl.int64), mask=ch)
    tl.store(tcounts + slot, tl.full([BLOCK], 0, tl.int64), mask=ch)
    tl.store(tlast + slot, tl.full([BLOCK], 0, tl.int64) + never, mask=ch)


def _reinsert_fn(tkeys, trows, tcounts, tlast, row_slots, old_keys, old_rows, old_counts, old_last, n, slot_mask,
                 max_rounds, m32, BLOCK: tl.constexpr):
    """A rebuild: every live key of the old arrays into the emptied table (a CAS claim each, as an
    insert), with its payload; an admitted key's row learns its new slot."""
    s = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    cur = tl.load(old_keys + s, mask=s < n, other=-1)
    live = (s < n) & (cur != -1) & (cur != -2)
    key = cur.to(tl.int64)
    slot, _ = _claim(tkeys, key, live, _start(key, m32, slot_mask), slot_mask, max_rounds, BLOCK)
    ok = live & (slot >= 0)
    row = tl.load(old_rows + s, mask=ok, other=-1)
    tl.store(trows + slot, row, mask=ok)
    tl.store(tcounts + slot, tl.load(old_counts + s, mask=ok, other=0), mask=ok)
    tl.store(tlast + slot, tl.load(old_last + s, mask=ok, other=0), mask=ok)
    tl.store(row_slots + row, slot, mask=ok & (row >= 0))
    tl.store(old_keys + s, tl.full([BLOCK], -1, tl.int64).to(old_keys.dtype.element_ty), mask=ok)


def _gather_fn(values, rows, has, inverse, default, out, index, flag, n, dim, BLOCK: tl.constexpr,
               DIM: tl.constexpr):
    """A training lookup's vectors, one launch after `carry_out`: batch entry ``e`` reads the row of
    its unique key ``u = inverse[e]`` (`carry_out`'s padded ``rows[u]``) where the key has one
    (``has[u]``), ``default`` where not, and writes that row and flag for the backward's sparse
    gradient (`_KernelRows`). It replaces two gathers by `inverse`, an ``embedding`` and a ``where``.
    Race-free: each lane writes only its own entry's words; the table is only read."""
    e = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inb = e < n
    u = tl.load(inverse + e, mask=inb, other=0)
    row = tl.load(rows + u, mask=inb, other=0)
    on = inb & (tl.load(has + u, mask=inb, other=0) != 0)
    tl.store(index + e, row, mask=inb)
    tl.store(flag + e, on.to(tl.int8), mask=inb)
    cols = tl.arange(0, DIM)
    for d in range(0, dim, DIM):
        c = d + cols
        cm = c < dim
        v = tl.load(values + row[:, None] * dim + c[None, :], mask=on[:, None] & cm[None, :], other=0.0)
        fill = tl.load(default + c, mask=cm, other=0.0)
        tl.store(out + e.to(tl.int64)[:, None] * dim + c[None, :], tl.where(on[:, None], v, fill[None, :]),
                 mask=inb[:, None] & cm[None, :])


@functools.cache
def _kernels():
    """``(probe, claim round, carry_out, evict_stale, mark, evict_chosen, reinsert, gather)`` as Triton
    kernels, built on first use."""
    global tl, _start, _claim
    import triton
    import triton.language

    tl = triton.language
    _start, _claim = triton.jit(_start_fn), triton.jit(_claim_fn)
    jit = triton.jit
    # `rnd` is 1 in one launch: unspecialised, or a GPU would compile that launch's kernel apart
    return (jit(_probe_fn), jit(_round_fn, do_not_specialize=["rnd"]), jit(_carry_out_fn), jit(_evict_stale_fn),
            jit(_mark_fn), jit(_evict_chosen_fn), jit(_reinsert_fn), jit(_gather_fn))


def _launch(kernel, n: int, *args, **meta) -> None:
    """Launch `kernel` over `n` keys (slots). On CPU tensors it runs in Triton's interpreter, which
    reads the tensors itself: not ops of the step, so outside any dispatch mode (a sync counter
    counts what a device would run, and a launch is no sync)."""
    global launches
    launches += 1
    meta.setdefault("BLOCK", BLOCK)
    grid = (max(1, -(-n // meta["BLOCK"])),)
    if args[0].device.type == "cpu":
        from torch.utils._python_dispatch import _disable_current_modes

        _check_interpreter(kernel)
        with _disable_current_modes():
            kernel[grid](*args, **meta)
    else:
        kernel[grid](*args, **meta)


def _check_interpreter(kernel) -> None:
    from triton.runtime.interpreter import InterpretedFunction

    if not isinstance(kernel, InterpretedFunction):
        raise RuntimeError("HashEmbedding: table_backend='triton' on CPU tensors runs Triton's interpreter: set "
                           "TRITON_INTERPRET=1 before triton is imported (or use 'torch' on a CPU)")


def scratch(n: int, words: int, bytes_: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """int64 ``[words, n]`` and int8 ``[bytes_, n]`` scratch for a step's kernels, views of ONE
    allocation (each allocation is an op of the step)."""
    buf = torch.empty(words * n + -(-(bytes_ * n) // 8), dtype=torch.int64, device=device)
    return buf[:words * n].view(words, n), buf[words * n:].view(torch.int8)[:bytes_ * n].view(bytes_, n)


def _u8(t: torch.Tensor) -> torch.Tensor:
    """A bool tensor as the bytes a kernel reads and writes."""
    return t.view(torch.uint8) if t.dtype == torch.bool else t


class _KernelRows(_MaskedRows):
    """`_MaskedRows` with its forward as one launch (`_gather_fn`): the vectors of a training lookup's
    batch entries from its unique keys' padded `rows`, `has` and `inverse` (`carry_out`'s outputs);
    the same sparse gradient (`_MaskedRows.backward`)."""

    @staticmethod
    def forward(ctx, values, rows, has, inverse, default):
        n, dim = inverse.numel(), values.shape[1]
        out = torch.empty(n, dim, dtype=values.dtype, device=values.device)
        index, flag = scratch(n, 1, 1, values.device)  # one allocation: each entry's row and flag
        dims = max(16, min(128, 1 << (dim - 1).bit_length()))
        _launch(_kernels()[7], n, values.detach(), rows, _u8(has), inverse, default.to(values.dtype), out, index[0],
                flag[0], n, dim, BLOCK=max(16, 4096 // dims), DIM=dims)
        ctx.save_for_backward(index[0], flag[0].view(torch.bool).unsqueeze(1))
        ctx.shape = values.shape
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        return _MaskedRows.backward(ctx, grad)[0], None, None, None, None


class TritonBackend(StaticBackend):
    """The device path with its per-step table work in Triton kernels (see the module doc)."""

    name = "triton"
    rebuilds = True

    def _probe(self, emb, uniq: torch.Tensor, counts: torch.Tensor, valid: torch.Tensor, plan: bool = False,
               ends: torch.Tensor | None = None, claim: tuple | None = None
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(slot, free, row, total, flags)`` of each key (one launch; see ``probe``); with `plan`
        the first five rows of `flags` (int8 [6, n]) are the plan's found / new / ripe / new_admit /
        new_pending masks. Its last row (1: the key's probe ended) backs the device-side assert.
        `ends`: `counts` and `valid` are written by this launch first, from the unique keys' run ends.
        `claim` (with `plan`): ``(owner, tag, words, bytes_)``, the new keys' first claim round's
        bids made here (see `_insert`)."""
        t, n = emb.table, uniq.numel()
        out, flags = scratch(n, 4, 6, uniq.device)
        slot, free, row, total = out.unbind(0)
        owner, tag, words, bytes_ = claim if claim is not None else (t.keys, t.keys, out, flags)  # unused pointers
        _launch(_kernels()[0], n, t.keys, t.rows, t.counts, uniq, counts, _u8(valid), counts if ends is None else ends,
                slot, free, row, total, flags[5], flags, owner, tag, bytes_[0], words[1], bytes_[1], words[0], n,
                t.num_slots - 1, t.max_rounds, _M32, emb.permit_filter_value, FLAGS=plan, ENDS=ends is not None,
                BID=claim is not None)
        # with the bids, the launch's programs wrote one word of the claim counters for this (no `all`)
        ok = flags[5].view(torch.bool).all() if claim is None else self._claim_words(emb, uniq.device)[2]
        try:
            device_assert(ok, f"HashEmbedding: a key's probe sequence passed max_rounds={t.max_rounds} slots "
                              f"without an empty one (hash table too full)")
        except RuntimeError:  # raised here (a CPU): no carry-out sets the word back or moves the
            if claim is not None:  # round counter on past this probe's bids, so this does
                ok.fill_(1)
                claim[1].add_(1)
            raise
        return slot, free, row, total, flags

    def plan(self, emb, uniq: torch.Tensor, counts: torch.Tensor, valid: torch.Tensor,
             ends: torch.Tensor | None = None) -> DevicePlan:
        # the claim rounds' scratch (see carry_out), its first round's bids made by the probe
        words, bytes_ = scratch(uniq.numel(), 6, 3, uniq.device)
        owner, tag, _ = self._claim_words(emb, uniq.device)
        slots, free, row, total, flags = self._probe(emb, uniq, counts, valid, plan=True, ends=ends,
                                                     claim=(owner, tag, words, bytes_))
        found, new, ripe, new_admit, new_pending = flags.view(torch.bool).unbind(0)[:5]
        return DevicePlan(uniq=uniq, slots=slots, free=free, found=found, new=new, total=total, row=row,
                          ripe=ripe, new_admit=new_admit, new_pending=new_pending, valid=valid, pos=None,
                          pad_ok=True, bids=(words, bytes_))

    def discard_bids(self, emb, plan: DevicePlan) -> None:
        """The probe's round-0 bids are void (the plan is decided again after a read): the claim
        words' round counter moves on by one, so those bids lie below every later round's range
        (`_round_fn`) and lose to its bids; `carry_out` then runs the first round itself."""
        if plan.bids is not None:
            self._claim_words(emb, plan.uniq.device)[1].add_(1)
            plan.bids = None

    def unique_plan(self, emb, flat: torch.Tensor, mask: torch.Tensor | None) -> tuple[DevicePlan, torch.Tensor]:
        """`unique` then `plan` in a sort and three launches (`hash_triton_unique`'s two, then the
        probe, which computes the unique keys' counts from their runs' ends first: the outputs of
        `static_unique`, exactly) for a lookup of every key; a masked one (a batch's features not
        sized on the host) keeps `static_unique`'s torch ops."""
        if not self._unique_by_kernels(flat, mask):
            return super().unique_plan(emb, flat, mask)
        uniq, inverse, ends, counts, valid = self._runs(flat)
        return self.plan(emb, uniq, counts, valid.view(torch.bool), ends=ends), inverse

    @staticmethod
    def _unique_by_kernels(flat: torch.Tensor, mask: torch.Tensor | None) -> bool:
        return mask is None and flat.dtype == torch.int64 and flat.numel() > 0

    @staticmethod
    def _runs(flat: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The sort and the two launches of the unique keys: ``(uniq, inverse, ends, counts, valid)``,
        the last two for the probe launch to write."""
        n, dev = flat.numel(), flat.device
        ordered, order = torch.sort(flat, stable=True)
        block = hash_triton_unique.BLOCK
        nprog = -(-n // block)
        # one allocation: inverse, uniq, ends, counts and the per-program run counts (nprog <= n words); valid
        words, valid = scratch(n, 5, 1, dev)
        inverse, uniq, ends, counts, block_counts = words.unbind(0)
        starts_k, runs_k = hash_triton_unique.kernels()
        _launch(starts_k, n, ordered, block_counts, n, BLOCK=block)
        _launch(runs_k, n, ordered, order, block_counts, inverse, uniq, ends, n, nprog, BLOCK=block,
                PBLOCK=per_program_block(nprog))
        return uniq, inverse, ends, counts, valid[0]

    def _claim_words(self, emb, dev: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The claim rounds' per-slot words, their round counter and, the word after it, the probe's
        assert word (1: every probe of the bids' launch ended; the carry-out sets it to 1 again):
        scratch, not state (new ones work as well; kept so that steps and a CUDA graph's replays
        reuse them)."""
        t = emb.table
        owner, counters = emb.__dict__.get("_claim_words", (None, None))
        if owner is None or owner.shape != t.keys.shape or owner.device != dev:  # new, rebuilt or moved
            owner = torch.zeros_like(t.keys, dtype=torch.int64)
            counters = torch.tensor([0, 1], dtype=torch.int64, device=dev)
            emb.__dict__["_claim_words"] = (owner, counters)
        return owner, counters[0], counters[1]

    def _insert(self, emb, p: DevicePlan, words: torch.Tensor, bytes_: torch.Tensor, owner: torch.Tensor,
                tag: torch.Tensor) -> None:
        """Write the plan's new keys into free slots in ``CLAIM_ROUNDS`` rounds, ``CLAIM_ROUNDS``
        launches after the probe's first bids (``CLAIM_ROUNDS + 1`` where `discard_bids` voided them;
        `_round_fn`: a round's winners' writes and the next round's bids share one;
        `hash_static.claim`'s rule: of the keys wanting one slot the first takes it, the others
        their next free one), into ``words[0]`` (slot or -1) and ``bytes_[1]``
        (whether it was a tombstone). A key still without a slot after the last round is left out of
        the step, as on the torch path. The last round counts the keys admitted per program into
        ``words[2:4]`` (see `_round_fn`); `carry_out` moves `tag` on."""
        t, n = emb.table, p.uniq.numel()
        placed, want, block_counts = words[0], words[1], words[2:4]
        active, deleted = bytes_[0], bytes_[1]
        for r in range(0 if p.bids is None else 1, CLAIM_ROUNDS + 1):  # round 0's bids: the probe's
            _launch(_kernels()[1], n, t.keys, owner, p.uniq, _u8(p.new), active, want, deleted, placed, p.free, n,
                    t.num_slots - 1, t.max_rounds, _M32, tag, r, _u8(p.ripe), _u8(p.new_admit), block_counts,
                    emb.num_free_t, FIRST=r == 0, LAST=r == CLAIM_ROUNDS)

    def carry_out(self, emb, plan: DevicePlan, inverse: torch.Tensor) -> torch.Tensor:
        t, p, n, dev = emb.table, plan, plan.uniq.numel(), plan.uniq.device
        nprog = max(1, -(-n // BLOCK))
        # scratch of the step, one allocation: placed slots, wanted slots, the last round's counts per
        # program (2 rows), the rows looked up (padded), the rows to reset; active, deleted, has
        words, bytes_ = scratch(n, 6, 3, dev) if p.bids is None else p.bids
        owner, tag, _ = self._claim_words(emb, dev)
        self._insert(emb, p, words, bytes_, owner, tag)
        # as the torch ops draw: key i's initial row comes of draw[i] on both; the kernel scales it
        draw, init_scale = emb._init_draw(n)
        init_mode = 2 if draw is None else 0 if emb.param_init == "normal" else 1
        dim = emb.embedding_size
        rows, reset, has = words[4], words[5], bytes_[2]
        _launch(_kernels()[2], n, t.rows, t.counts, t.last_seen, emb.row_slots, emb.row_last_seen, _u8(emb.dirty),
                _u8(emb.reset_mask), emb.free_rows, emb.values.detach(), emb.values.detach() if draw is None else draw,
                emb.num_pending_t, t.num_used_t,
                t.num_live_t, emb.num_free_t, tag, words[0], bytes_[1], p.slots, p.total, p.row, _u8(p.ripe),
                _u8(p.new_admit), _u8(p.new_pending), words[2:4], rows, reset, has, n, dim, emb.capacity, nprog,
                CLAIM_ROUNDS, emb.global_step_t, float(init_scale), DIM=max(16, min(64, 1 << (dim - 1).bit_length())),
                PBLOCK=per_program_block(nprog), INIT=init_mode)
        if p.pad_ok:  # padding: a new row, else the free stack's top (their optimizer state is stale)
            emb._reset_parts.append(reset)
        gather = _KernelRows.apply if emb.values.is_contiguous() else None  # the kernel reads rows of `dim` values
        return emb._train_vectors(rows, has.view(torch.bool), inverse, padded=rows, gather=gather)

    def read(self, emb, flat: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        valid = torch.ones_like(flat, dtype=torch.bool) if mask is None else mask
        rows = self._probe(emb, flat, torch.zeros_like(flat), valid)[2]
        return emb._device_read(flat, mask, rows)

    def evict_stale(self, emb, stale: torch.Tensor) -> None:
        t = emb.table
        freed = stale & (t.rows >= 0)  # their rows go onto the free stack in slot order (the host path's)
        stack = (emb.num_free_t + freed.cumsum(0) - 1).clamp(0, emb.capacity - 1)
        emb.num_free_t.add_(freed.sum())
        _launch(_kernels()[3], t.num_slots, t.keys, t.rows, t.counts, t.last_seen, emb.row_slots, emb.row_last_seen,
                _u8(emb.dirty), emb.free_rows, _u8(stale), stack, emb.num_pending_t, t.num_live_t, t.num_slots,
                NEVER_SEEN)
        emb._stale = t._stale = True  # the bounds hold: free rows only grow, pending keys only shrink

    def evict_lru(self, emb, k: int, batch_rows: torch.Tensor) -> None:
        t = emb.table
        _launch(_kernels()[4], batch_rows.numel(), emb.row_last_seen, batch_rows, batch_rows.numel(), emb._step)
        rows, chosen = oldest_static(emb.row_last_seen, emb._step, k)  # the batch's keys stay
        _launch(_kernels()[5], rows.numel(), t.keys, t.rows, t.counts, t.last_seen, emb.row_slots, emb.row_last_seen,
                _u8(emb.dirty), emb.free_rows, rows, _u8(chosen), emb.num_free_t, rows.numel(), emb.capacity,
                NEVER_SEEN, ROWS=True)
        emb.num_free_t.add_(k)
        t.num_live_t.sub_(k)

    def drop_pending(self, emb, k: int, plan: DevicePlan) -> None:
        t = emb.table
        _launch(_kernels()[4], plan.slots.numel(), t.last_seen, plan.slots, plan.slots.numel(), emb._step)
        slots, chosen = oldest_static(torch.where(t.rows < 0, t.last_seen, NEVER_SEEN), emb._step, k)
        _launch(_kernels()[5], slots.numel(), t.keys, t.rows, t.counts, t.last_seen, emb.row_slots,
                emb.row_last_seen, _u8(emb.dirty), emb.free_rows, slots, _u8(chosen), emb.num_free_t, slots.numel(),
                emb.capacity, NEVER_SEEN, ROWS=False)
        emb.num_pending_t.sub_(k)
        t.num_live_t.sub_(k)

    def rebuild(self, emb, live: int) -> None:
        """The table without tombstones, on the device: its arrays copied, emptied, every live key
        inserted again by CAS (one launch, no host loop; on a GPU the layout follows the atomics'
        order, not the host path's rehash -- see the module doc); `live`, known from the step's read,
        sets the host's counters. A key that found no slot stays in the copy: a device-side assert."""
        t = emb.table
        old = [b.clone() for b in (t.keys, t.rows, t.counts, t.last_seen)]
        t.keys.fill_(EMPTY)
        t.rows.fill_(-1)
        t.counts.zero_()
        t.last_seen.fill_(NEVER_SEEN)
        _launch(_kernels()[6], t.num_slots, t.keys, t.rows, t.counts, t.last_seen, emb.row_slots, *old, t.num_slots,
                t.num_slots - 1, t.max_rounds, _M32)
        left = old[0]  # the kernel marks every key it placed EMPTY in the copy
        device_assert(((left == EMPTY) | (left == DELETED)).all(), f"HashEmbedding: a rebuild passed "
                                                                  f"max_rounds={t.max_rounds} probes")
        t.num_used_t.copy_(t.num_live_t)  # no tombstone left
        t.set_mirrors(live, live)

    def reprobe(self, emb, plan: DevicePlan) -> None:
        plan.slots, plan.free = self._probe(emb, plan.uniq, torch.zeros_like(plan.uniq), plan.valid)[:2]


TRITON = TritonBackend()
