"""The device path of `HashEmbedding`'s table: static-shape torch ops, no host sync.

On a CPU the table probes in rounds that shrink to the keys still unresolved (``nonzero``: free on
a host) and the compiled kernels do the rest. On a device each of those compactions, each
``unique`` and each count read back would stop the host until the device catches up, so
`HashEmbedding` runs these ops instead whenever ``recstream.hostpath.host_reads_free`` is
false (a CUDA tensor, or a CPU one under ``device_path``). Every output has the size of its input:

* `static_unique` -- ``unique`` by a sort and a mask of each run's first entry, padded to the
  input's length (a ``valid`` mask marks the real entries);
* `probe` -- every key examines its whole probe sequence (``max_rounds`` slots) at once: the
  first stop (the key, or an EMPTY slot) answers it, the first EMPTY-or-tombstone slot is where it
  would go. A key whose sequence has no stop fails a device-side assert (the host path raises);
* `claim` -- new keys written into their first free slots in ``CLAIM_ROUNDS`` rounds: where
  several want one slot the first (in call order) takes it and the others take their next free
  slot in the next round (the host path's rule). A key still without a slot after the last round
  (a chain of more than ``CLAIM_ROUNDS`` keys wanting one slot after another: vanishingly rare at
  the load kept) is left out of the step, as a key over capacity is: it reads the default vector
  and is counted again when next seen;
* `masked_put` -- ``buf[idx[mask]] = value[mask]`` without the boolean index.

Ops per call are fixed (a few dozen); what they cost grows with the keys, not with the data.

>>> import torch
>>> uniq, inverse, counts, valid = static_unique(torch.tensor([7, -3, 7, 7]))
>>> uniq[valid].tolist(), inverse.tolist(), counts[valid].tolist()
([-3, 7], [1, 0, 1, 1], [1, 3])
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..hostpath import device_assert

__all__ = ["static_unique", "window", "probe", "claim", "masked_put", "Scatter", "DevicePlan", "DeviceCall",
           "CLAIM_ROUNDS"]

EMPTY, DELETED = -1, -2  # the table's markers (tensor_hash_table imports nothing from here)
CLAIM_ROUNDS = 4


class Scatter:
    """``buf[idx[i]] = value[i]`` where ``mask[i]`` (targets of masked entries distinct), static shape,
    for several buffers indexed alike.

    The other entries repeat the first masked entry's write (or, when no entry is masked, write
    the buffer's own value back), so every write to one position carries the same value: no boolean
    index, deterministic on CUDA."""

    def __init__(self, idx: torch.Tensor, mask: torch.Tensor):
        self.mask, self.any = mask, mask.any()
        self.first = mask.to(torch.uint8).argmax().reshape(1)
        first_idx = idx.index_select(0, self.first).clamp(min=0)
        self.target = torch.where(mask, idx, first_idx)
        self.first_target = first_idx

    def put(self, buf: torch.Tensor, value) -> None:
        """Write `value` (a tensor like the indices, rows of `buf`, or a scalar) into `buf`."""
        if self.target.numel() == 0:
            return
        current = buf.index_select(0, self.first_target)  # [1, ...]
        if isinstance(value, torch.Tensor):
            value = value.to(buf.dtype)
            v0 = torch.where(self.any, value.index_select(0, self.first), current)
            shape = (-1,) + (1,) * (value.dim() - 1)
            buf.index_put_((self.target,), torch.where(self.mask.view(shape), value, v0))
        else:
            # one value: the masked entries write it, the others the same (or, none masked, `current`)
            fill = torch.where(self.any, torch.full_like(current, value), current)
            buf.index_put_((self.target,), fill.expand(self.target.shape))


def masked_put(buf: torch.Tensor, idx: torch.Tensor, value, mask: torch.Tensor) -> None:
    """``buf[idx[mask]] = value[mask]`` of static shape (`Scatter` for one buffer)."""
    Scatter(idx, mask).put(buf, value)


def static_unique(values: torch.Tensor, mask: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(uniq, inverse, counts, valid)`` of a 1-D tensor, each sized like `values`: ``uniq[valid]``
    and ``counts[valid]`` are ``torch.unique(values[mask], return_counts=True)`` (sorted), ``inverse``
    as ``torch.unique``'s for the entries of `mask` (all entries without one); entries past the
    distinct count are padding."""
    n, dev = values.numel(), values.device
    ordered, order = torch.sort(values, stable=True)
    first = torch.ones(n, dtype=torch.bool, device=dev)
    first[1:] = ordered[1:] != ordered[:-1]
    if mask is not None:  # the masked-out entries after the others, each one no run's start
        kept, by_mask = torch.sort((~mask.index_select(0, order)).to(torch.uint8), stable=True)
        kept = kept.bool()
        order, ordered = order.index_select(0, by_mask), ordered.index_select(0, by_mask)
        first = torch.ones(n, dtype=torch.bool, device=dev)
        first[1:] = ordered[1:] != ordered[:-1]
        first &= ~kept
    run = first.cumsum(0) - 1
    if mask is not None:  # with every entry masked out no run starts: -1 -> 0 (a valid index)
        run = run.clamp(min=0)
    inverse = torch.empty_like(run).index_copy_(0, order, run)
    runs = first.sum()
    index = torch.arange(n, device=dev)
    uniq = ordered.index_select(0, torch.searchsorted(run, index).clamp(max=n - 1))
    ones = first.new_ones(n, dtype=torch.int64) if mask is None else (~kept).to(torch.int64)
    counts = torch.zeros(n, dtype=torch.int64, device=dev).index_add_(0, run, ones)
    return uniq, inverse, counts, index < runs


def window(table, keys: torch.Tensor) -> torch.Tensor:
    """Every probe slot of `keys` ``[n, max_rounds]`` (they depend on the keys alone: compute them
    once for `probe` and `claim` of the same keys)."""
    tri = table._triangular(keys.device)[:table.max_rounds]
    return (table.start_of(keys.to(table.keys.dtype)).unsqueeze(1) + tri) & (table.num_slots - 1)


def _first(mask: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """The slot of the first True of each row of `mask` ``[n, w]`` (any slot where none)."""
    return pos.gather(1, mask.to(torch.uint8).argmax(1, keepdim=True)).squeeze(1)


def probe(table, keys: torch.Tensor, valid: torch.Tensor,
          pos: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(slots, free)`` of ``table.locate`` for the `valid` entries of `keys` (-1 elsewhere): the slot
    of each key found, and for each absent one the first free slot of its probe sequence. `pos`:
    `window` of `keys`."""
    keys = keys.to(table.keys.dtype)
    pos = window(table, keys) if pos is None else pos
    cur = table.keys.index_select(0, pos.view(-1)).view(pos.shape)
    hit = cur == keys.unsqueeze(1)
    empty = cur == EMPTY
    stop = hit | empty
    device_assert((stop.any(1) | ~valid).all(),
                  f"HashEmbedding: a key's probe sequence passed max_rounds={table.max_rounds} slots "
                  f"without an empty one (hash table too full)")
    j = stop.to(torch.uint8).argmax(1, keepdim=True)
    found = hit.gather(1, j).squeeze(1) & valid
    slots = torch.where(found, pos.gather(1, j).squeeze(1), -1)
    free = torch.where(valid & ~found, _first(empty | (cur == DELETED), pos), -1)
    return slots, free


def claim(table, keys: torch.Tensor, want: torch.Tensor, free: torch.Tensor,
          pos: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Write the `want` keys (distinct, absent; ``free``: `probe`'s; `pos`: `window`'s)
    into free slots.

    Returns ``(slots, reused)``: each key's slot (-1 where not wanted or, after ``CLAIM_ROUNDS``
    rounds, left out) and the number of tombstones reused (a 0-d tensor). The caller updates the
    table's counters and payload."""
    keys = keys.to(table.keys.dtype)
    n, size = keys.numel(), table.num_slots
    slots = torch.full((n,), -1, dtype=torch.int64, device=keys.device)
    reused = torch.zeros((), dtype=torch.int64, device=keys.device)
    for r in range(CLAIM_ROUNDS):
        if r == 0:  # the probe's first free slots: no window needed
            active, want_slot = want, free
            was_deleted = table.keys.index_select(0, free.clamp(min=0)) == DELETED
        else:  # the slots taken so far are no longer free: each loser's next free one comes first
            if pos is None:
                pos = window(table, keys)
            cur = table.keys.index_select(0, pos.view(-1)).view(pos.shape)
            is_free = (cur == EMPTY) | (cur == DELETED)
            active = want & (slots < 0) & is_free.any(1)
            j = is_free.to(torch.uint8).argmax(1, keepdim=True)
            want_slot, was_deleted = pos.gather(1, j).squeeze(1), cur.gather(1, j).squeeze(1) == DELETED
        ordered, order = torch.sort(torch.where(active, want_slot, size), stable=True)
        head = torch.ones(n, dtype=torch.bool, device=keys.device)
        head[1:] = ordered[1:] != ordered[:-1]
        win = torch.empty_like(head).index_copy_(0, order, head & (ordered < size))
        masked_put(table.keys, want_slot, keys, win)
        slots = torch.where(win, want_slot, slots)
        reused = reused + (win & was_deleted).sum()
    return slots, reused


@dataclass
class DevicePlan:
    """What ``HashEmbedding._probe_plan`` found for one batch's keys (every tensor sized like `uniq`):
    their slots (-1: absent) and first free slots, which are found / new, their counts after the
    batch and current rows (-1: none), which are admitted now (`ripe` pending keys, `new_admit` new
    ones) or stay pending, which entries are real (`valid`), their probe slots (`pos`); `pad_ok`:
    some row's optimizer state may be reset (padding of the reset rows: a row admitted now, or a
    free one)."""

    uniq: torch.Tensor
    slots: torch.Tensor
    free: torch.Tensor
    found: torch.Tensor
    new: torch.Tensor
    total: torch.Tensor
    row: torch.Tensor
    ripe: torch.Tensor
    new_admit: torch.Tensor
    new_pending: torch.Tensor
    valid: torch.Tensor
    pos: torch.Tensor
    pad_ok: bool
    bids: tuple | None = None  # the Triton backend's claim scratch, its first round bid by the probe


@dataclass
class DeviceCall:
    """A training lookup on the device path probed and planned, waiting for the decision that may
    need a host read (`read`): its ids (`flat`, `mask`), ``inverse`` of `static_unique`, its plan
    and the backend running it."""

    flat: torch.Tensor
    mask: torch.Tensor | None
    inverse: torch.Tensor
    plan: DevicePlan
    read: bool
    backend: object = None  # the device backend (``hash_backend``) that planned it and carries it out
