"""Dynamic embedding table for unbounded id spaces: [`HashEmbedding`][recstream.nn.hash_embedding.HashEmbedding].

The PyTorch counterpart of MindSpore Recommender's ``HashEmbeddingLookup``:
any int64 key (user id, hashed cross feature, ...) maps to a trainable row
without a fixed vocabulary. Everything is tensors (CPU or CUDA):

* keys -> slots: `TensorHashTable` (open addressing,
  triangular probing in batched rounds, load factor <= ``max_load``);
* slots -> rows of ``values`` ``[capacity, embedding_size]``;
* admission after ``permit_filter_value`` occurrences, age eviction after
  ``evict_filter_value`` steps, LRU eviction when all ``capacity`` rows are
  used (see "Row life cycle" below);
* export / incremental export / import for serving (see "Export" below).

Optimizer-state reset protocol: ``values.pop_reset_rows()`` returns the rows
(re)assigned to a new key since the previous call (LongTensor) and clears the
record. Sparse optimizers (recstream.optim) call it before each update and
zero those rows' state, so a new key never inherits the moments of an evicted
one. Optimizers that ignore it still work, with stale state on reused rows.

Memory per admitted row (measure with `memory_bytes`):
``4*embedding_size`` (values, float32) + 26 (row -> slot 8, free list 8, the
row's last-seen step 8 for the LRU pass, dirty and reset flags 2) + 32 bytes
per hash slot (key, row, count, last-seen) times ``num_slots / capacity``
(>= 2 at load 0.5; 4 when ``pending_capacity == capacity``). Optimizer state
comes on top and depends on the optimizer (e.g. lazy Adam: 2 more rows of
``4*embedding_size``). Pre-admission counts live in the same hash table (a slot
with ``rows == -1``): at most ``pending_capacity`` keys, each one 32-byte slot --
the table is sized for ``capacity + pending_capacity`` keys at ``max_load``, so
they cost no extra structure.

Row life cycle
--------------
A key goes through three states, all stored in the slot payload of the
`TensorHashTable`:

* absent  -- not in the table;
* pending -- in the table with ``rows == -1``: its occurrences are counted
  (``counts``) but it reads the default vector and trains nothing;
* admitted -- ``rows >= 0`` points at a row of ``values``.

A pending key is admitted once ``counts >= permit_filter_value``. Rows come
from a free list (a LIFO stack tensor, so a freed row is reused first). When a
step's admissions find too few free rows, ONE pass over the rows evicts the
least-recently-seen admitted keys (never one seen in the current step): the
rows the step needs plus ``floor((1 - evict_low_watermark) * capacity)`` more,
so that the following admissions find free rows without another pass (the
pass is O(capacity); with the default 0.95 it runs once per 5% of capacity
admitted instead of on every step of a full table). Keys last seen in the
same step are evicted evenly spread over the table. ``step()`` evicts every
key -- admitted or pending -- not seen for more than ``evict_filter_value``
steps. Pending keys are bounded by ``pending_capacity``; beyond it the
least-recently-seen ones are dropped, with the same headroom.

Every life-cycle step runs in a training-mode forward or ``step()``. On a CPU they compact
their tensors as they go (``nonzero``, counts read back: free on a host) and run compiled
kernels. On a device (``recstream.hostpath``) they run ops of static shapes instead
(`recstream.nn.hash_static`): no host sync while the host's bounds of the free rows,
pending keys and used slots show room for the batch's keys; one read of the counters when
they do not (it also decides whether the LRU pass and the drop of pending keys over budget
run, on the device too); the host path's ops, with their syncs, for the rare step that
rebuilds the table (the Triton backend rebuilds on the device), logs evictions for ``export_delta``
or brings more new keys than there are keys to evict (see `hash_device_path`, `hash_backend`).
Both paths admit the same keys to the same rows and evict the same ones (their random initial rows
differ: they draw different amounts). Eval mode and ``torch.inference_mode`` only read: nothing
in the module changes (``max_norm`` then scales the returned vectors, not the rows).

Sharding (``hybrid_parallel``)
------------------------------
`shard_keys_` (called by ``recstream.distributed.hybrid_parallel``) keeps on
each rank only the keys it owns (``recstream.nn.key_sharding.owner_of``): each
rank holds ``ceil(capacity / world_size)`` rows, and every forward -- a
collective -- sends each key to its owner, which counts, admits, evicts and
looks it up, and sends the vector back (its gradient follows the same way, so
the optimizer state of a row stays on its owner). Admission counts the whole
global batch, so a sharded table admits and ages keys exactly as one process
would; capacity-driven LRU eviction is per shard. ``export``, ``export_delta``,
``state_dict`` and ``memory_bytes`` are this rank's shard (the union over the
ranks is the table); ``load_rows`` / ``import_`` keep the keys this rank owns.
Sharded checkpoints: ``recstream.checkpoint.save_sharded`` (through `HashEmbedding.state`).
A disk-tiered table is key-sharded the same way, each rank's rows in a store of its own
(``<directory>/rank-<r>-of-<N>``, `recstream.nn.hash_tier`) behind its own cache; build it after
joining the process group (it opens that store when sharded). Its state is the rank's hash table
and a commit of the rank's store; loaded into another number of ranks (or one process), each rank
rebuilds its table from the keys it owns and fills its store from the saving ranks' stores
(`reshard_tier_`).

Export
------
* ``export()`` -- every admitted key with its row, occurrence count and
  last-seen step (pending keys are not exported: they have no row).
* ``export_delta()`` -- only rows marked dirty since the previous export (new
  keys, rows looked up in training -- they get gradients -- and rows changed by
  ``max_norm`` or ``load_rows``), plus ``evicted_keys``: keys whose row was
  evicted since the previous export and that are not live again. A consumer
  applies ``evicted_keys`` as deletes and the rest as upserts.
* ``load_rows(keys, values, counts, last_seen)`` / ``import_(exported)`` --
  insert or overwrite rows (admitting the keys).

The eviction log only starts after the first export (before it nothing was
published, so nothing needs deleting), which keeps it bounded by the evictions
between two exports.

Example:
    >>> import torch
    >>> emb = HashEmbedding(4, capacity=16)
    >>> out = emb(torch.tensor([[10, 2**40], [10, -5]]))
    >>> out.shape, emb.num_rows
    (torch.Size([2, 2, 4]), 3)
    >>> emb.values.pop_reset_rows().tolist()
    [0, 1, 2]
    >>> _ = emb.eval()
    >>> emb(torch.tensor([12345])).abs().sum().item()  # unknown key -> default
    0.0
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from ..hostpath import device_assert, device_path, host_reads_free
from ..sorting import unique
from ..validation import check_bool, check_choice, check_int, check_int_tensor, check_number, check_type
from .embedding_config import DiskTier
from .hash_backend import BACKENDS, HOST, TableBackend, triton_available
from .hash_counters import CounterWatch
from .hash_device_path import STATIC, DevicePath, lookup_masked_many
from .hash_host_path import HostPath
from .hash_replay import GraphReplay, HostEvent
from .hash_tier import HashTier, old_hash_stores, open_hash_tier, open_rank_hash_tier, unopened_hash_tier
from .key_sharding import KeySharding
from .tensor_hash_table import (
    DELETED,
    EMPTY,
    NEVER_SEEN,
    TensorHashTable,
    _where,
)
from .tier_shard import UnopenedTier

__all__ = ["HashEmbedding", "HashEmbeddingState", "table_entries", "lookup_masked_many", "triton_works"]
log = logging.getLogger(__name__)

# Initial row values per ``param_init`` (std / half-width of the distribution).
_INIT_SCALE = {"normal": 0.01, "uniform": 0.05}
_PARAM_INITS = ("normal", "uniform", "zeros", "ones")


def _after_load(module, incompatible_keys) -> None:
    """load_state_dict post-hook: refresh the python mirrors of the 0-d buffers."""
    module._sync_mirrors()


def table_entries(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Every key held by one table's raw tensors (``table.keys``, ``table.rows``, ``table.counts``,
    ``table.last_seen``, ``values``, ``dirty``, ``reset_mask``), as parallel per-key tensors:
    ``keys``, ``counts``, ``last_seen``, ``admitted``, and for admitted keys ``values``, ``dirty``
    and ``reset`` (zeros for pending ones), plus ``row`` (the row it had, -1 if pending).

    What a table holds independently of its slot layout: it rebuilds one of any size and
    sharding ([`HashEmbedding.load_entries_`][recstream.nn.hash_embedding.HashEmbedding.load_entries_]).
    """
    keys = state["table.keys"]
    occ = _where((keys != EMPTY) & (keys != DELETED))
    row = state["table.rows"].index_select(0, occ)
    admitted = row >= 0
    safe = row.clamp(min=0)
    values = state["values"].index_select(0, safe) * admitted.unsqueeze(1).to(state["values"].dtype)
    return {"keys": keys.index_select(0, occ).to(torch.int64), "counts": state["table.counts"].index_select(0, occ),
            "last_seen": state["table.last_seen"].index_select(0, occ), "admitted": admitted, "row": row,
            "values": values, "dirty": state["dirty"].index_select(0, safe) & admitted,
            "reset": state["reset_mask"].index_select(0, safe) & admitted}


def _table_write(method):
    """A method that changes the hash table runs under `HashEmbedding._table_writes` (a tiered table's
    prefetch reads the table from another thread)."""
    @functools.wraps(method)
    def locked(self, *args, **kwargs):
        with self._table_writes():
            return method(self, *args, **kwargs)
    return locked


def _check_tier(tier, sparse: bool, device) -> DiskTier | None:
    """`HashEmbedding`'s ``tier``: None, or a `DiskTier` for a CPU table with sparse gradients."""
    if tier is None:
        return None
    check_type("HashEmbedding", "tier", tier, DiskTier, allowed="a recstream.nn.DiskTier or None")
    if not sparse:  # a dense gradient would update every cached slot, not the batch's rows
        raise ValueError("HashEmbedding: a disk tier (tier=DiskTier(...)) needs sparse=True (row-sparse updates), "
                         "got sparse=False")
    if device is not None and torch.device(device).type != "cpu":
        raise ValueError(f"HashEmbedding: a disk-tiered table runs on the CPU (its cache is host memory), got "
                         f"device={device!r}; allowed with tier=: device=None or 'cpu'")
    return tier


@dataclass
class HashEmbeddingState:
    """One shard of a `HashEmbedding` (`HashEmbedding.state()`), as a checkpoint stores it.

    `tensors`: every persistent tensor by its ``state_dict`` name (rows, slots, free list, 0-d
    counters, ``default_value``) but the eviction log, which is `evicted_keys` (its length varies);
    a disk-tiered table's rows are not among them: ``tier`` is the commit of its store that `state` made.
    The geometry (`shards`, `capacity`, `pending_capacity`, `num_slots`) says whether another
    module can load the tensors as they are (`HashEmbedding.load_state`) or must rebuild its table
    from the keys (`table_entries` + `HashEmbedding.load_entries_`).
    """

    tensors: dict[str, torch.Tensor]
    evicted_keys: torch.Tensor
    shards: int
    capacity: int
    pending_capacity: int
    num_slots: int
    global_step: int
    track_evictions: bool


class HashEmbedding(HostPath, DevicePath, GraphReplay, nn.Module):
    """Embedding lookup keyed by arbitrary int64 ids with admission and eviction.

    Args:
        embedding_size: row width.
        key_dtype: key storage dtype, ``torch.int64`` or ``torch.int32`` (halves
            key memory; keys must then fit in int32).
        param_init: initial value of a newly admitted row: ``"normal"``
            (N(0, 0.01^2)), ``"uniform"`` (U(-0.05, 0.05)), ``"zeros"``, ``"ones"``.
        sparse: sparse COO gradients on ``values`` (only the looked-up rows).
        max_norm: if set, looked-up rows with a larger L2 norm are renormalised
            in place to ``max_norm`` (as ``nn.Embedding(max_norm=...)``) in
            training forwards; eval mode and ``inference_mode`` scale the
            returned vectors and leave the rows alone.
        permit_filter_value: occurrences (counted over training forwards) a key
            needs before it gets its own row; 1 = admitted on first sight.
        evict_filter_value: evict keys unseen for more than this many steps
            (``None``: only capacity-driven LRU eviction).
        capacity: number of rows.
        device: device of all tensors.
        pending_capacity: most not-yet-admitted keys tracked (default
            ``capacity`` if ``permit_filter_value > 1`` else 0); beyond it the
            least recently seen are dropped and restart counting.
        max_load: hash table load bound; the table has the next power of two
            >= ``(capacity + pending_capacity) / max_load`` slots.
        auto_step: a training-mode forward calls `step` first. Set False
            when one module is called several times per step and call ``step()``
            yourself once per step.
        evict_interval: run the age-eviction scan (O(num_slots)) only every
            this many steps, trading eviction promptness for speed.
        evict_low_watermark: when admissions find the rows full (or the pending
            keys over ``pending_capacity``), one LRU pass evicts down to this
            fraction of ``capacity`` (of ``pending_capacity``) -- not just
            the few rows the step needs -- so the O(num_slots) scan runs once
            per ``(1 - evict_low_watermark) * capacity`` admissions instead of
            every step. ``1.0``: evict exactly what is needed (a scan per step
            once full). On a device, keep ``(1 - evict_low_watermark) * capacity``
            above a batch's keys: otherwise a full table reads its counters at every
            step (a host sync), and the first such pass logs a warning.
        tier: a `DiskTier` to keep the rows and their optimizer state on local disk, ``cache_rows``
            of them in memory (`recstream.nn.hash_tier`); ``None``: in memory. The hash table (keys,
            counts, free list: a few dozen bytes a key) stays in memory. CPU, ``sparse=True`` and a
            row-sparse optimizer only; key-sharded (``hybrid_parallel``), each rank keeps its keys' rows
            in a store of its own, ``<directory>/rank-<r>-of-<N>``.

    Attributes:
        values: the trainable rows, ``Parameter [capacity, embedding_size]``,
            carrying ``pop_reset_rows``; with ``tier``, the cache of them,
            ``[cache_rows, embedding_size]``, and ``pop_reset_rows`` gives cache slots.
        default_value: buffer ``[embedding_size]`` read by unknown and pending
            keys; zeros, write into it for another fixed default.
    """

    def __init__(self, embedding_size: int, key_dtype: torch.dtype = torch.int64,
                 param_init: str = "normal", sparse: bool = True, max_norm: float | None = None,
                 permit_filter_value: int = 1, evict_filter_value: int | None = None,
                 capacity: int = 2 ** 20, device=None, *, pending_capacity: int | None = None,
                 max_load: float = 0.5, auto_step: bool = True, evict_interval: int = 1,
                 evict_low_watermark: float = 0.95, tier: DiskTier | None = None) -> None:
        super().__init__()
        owner = "HashEmbedding"
        self.embedding_size = check_int(owner, "embedding_size", embedding_size, minimum=1)
        self.key_dtype = check_choice(owner, "key_dtype", key_dtype, (torch.int64, torch.int32))
        self.param_init = check_choice(owner, "param_init", param_init, _PARAM_INITS)
        self.sparse = check_bool(owner, "sparse", sparse)
        self.max_norm = check_number(owner, "max_norm", max_norm, minimum=0.0, min_open=True, allow_none=True)
        self.permit_filter_value = check_int(owner, "permit_filter_value", permit_filter_value, minimum=1)
        self.evict_filter_value = check_int(owner, "evict_filter_value", evict_filter_value, minimum=1,
                                            allow_none=True)
        self.capacity = check_int(owner, "capacity", capacity, minimum=1)
        if pending_capacity is None:
            pending_capacity = self.capacity if self.permit_filter_value > 1 else 0
        self.pending_capacity = check_int(owner, "pending_capacity", pending_capacity,
                                          minimum=1 if self.permit_filter_value > 1 else 0)
        self.max_load = check_number(owner, "max_load", max_load, minimum=0.0, min_open=True, maximum=0.9)
        self.auto_step = check_bool(owner, "auto_step", auto_step)
        self.evict_interval = check_int(owner, "evict_interval", evict_interval, minimum=1)
        self.evict_low_watermark = check_number(owner, "evict_low_watermark", evict_low_watermark,
                                                minimum=0.0, maximum=1.0)
        self._tier_config = _check_tier(tier, self.sparse, device)
        self._tier: HashTier | UnopenedTier | None = None  # opened below, once `values` has its cache's shape
        self._tier_state = "commit"  # what state_dict holds of a tiered table (see tier_export)

        self.values = nn.Parameter(torch.zeros(0, self.embedding_size, device=device))
        self.register_buffer("default_value", torch.zeros(self.embedding_size, device=device))
        self.register_buffer("evicted_keys", torch.empty(0, dtype=key_dtype, device=device))
        for name in ("num_free_t", "num_pending_t", "global_step_t", "track_evictions_t"):
            self.register_buffer(name, torch.zeros((), dtype=torch.int64, device=device))
        # Python mirrors of the 0-d buffers: read on every call without a host sync.
        self._step, self._track_evictions = 0, False
        # Free rows and pending keys: host copies (read only when `_stale`: the device path changed
        # the buffers on the device) and bounds the device path keeps without reading (see _plan).
        self._free = self._pending = self._free_bound = self._pending_bound = 0
        self._stale = False
        self._watch = CounterWatch()  # the counters copied to the host without a sync (hash_counters)
        self._sharding: KeySharding | None = None  # set by shard_keys_
        self._allocate(self.capacity, self.pending_capacity)
        if self._tier_config is not None:  # on several ranks: each opens its keys' store once sharded
            self._tier = unopened_hash_tier(self._tier_config) or open_hash_tier(
                self._tier_config, self.capacity, self.embedding_size, self.values)
        # A module-level function (not a lambda) keeps the module picklable.
        self.register_load_state_dict_post_hook(_after_load)

    def _allocate(self, capacity: int, pending_capacity: int) -> None:
        """Empty table, rows and free list for `capacity` rows and `pending_capacity` pending keys.

        ``values`` keeps its Parameter object (an optimizer built on it still holds it).
        """
        device, key_dtype = self.default_value.device, self.key_dtype
        self.capacity, self.pending_capacity = capacity, pending_capacity
        live = capacity + pending_capacity
        num_slots = 1 << max(1, math.ceil(math.log2(math.ceil(live / self.max_load))))
        self.table = TensorHashTable(num_slots, key_dtype, device=device)
        cached = capacity if self._tier_config is None else self._tier_config.cache_rows  # tiered: the cache
        self.values.data = torch.zeros(cached, self.embedding_size, device=device)
        self._attach_reset_hook()
        i64 = dict(dtype=torch.int64, device=device)
        self.register_buffer("row_slots", torch.full((capacity,), -1, **i64))
        # last_seen of each row's key (+inf for free rows): the LRU pass scans rows, not slots.
        # Derived from the table, so not in state_dict (rebuilt after loading).
        self.register_buffer("row_last_seen", torch.full((capacity,), NEVER_SEEN, **i64), persistent=False)
        # LIFO stack: free_rows[:num_free] are free, top = free_rows[num_free-1].
        self.register_buffer("free_rows", torch.arange(capacity - 1, -1, -1, **i64))
        self.register_buffer("dirty", torch.zeros(capacity, dtype=torch.bool, device=device))
        self.register_buffer("reset_mask", torch.zeros(capacity, dtype=torch.bool, device=device))
        self._reset_parts: list[torch.Tensor] = []  # rows set in reset_mask, not popped yet
        self._set_free(capacity)
        self._set_pending(0)

    @property
    def num_slots(self) -> int:
        return self.table.num_slots

    def _attach_reset_hook(self) -> None:
        # Protocol hook for sparse optimizers (see module docstring). Re-attached
        # after deepcopy/unpickling and load_state_dict(assign=True), which all
        # produce a Parameter without the attribute.
        self.values.pop_reset_rows = self.pop_reset_rows

    def __setstate__(self, state) -> None:
        super().__setstate__(state)
        self.__dict__.setdefault("_watch", CounterWatch())  # a module pickled before it existed
        self._attach_reset_hook()

    def _sync_mirrors(self) -> None:
        self._attach_reset_hook()
        self._step = int(self.global_step_t)
        self._read_counters()
        self._track_evictions = bool(self.track_evictions_t)
        self._reset_parts = [self.reset_mask.nonzero().squeeze(1)]
        self._sync_row_last_seen()

    def _sync_row_last_seen(self) -> None:
        """Rebuild ``row_last_seen`` from the table (after loading a state)."""
        self.row_last_seen.fill_(NEVER_SEEN)
        live = _where(self.row_slots >= 0)
        self.row_last_seen.index_copy_(0, live, self.table.last_seen.index_select(
            0, self.row_slots.index_select(0, live)))

    @_table_write
    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        # The eviction log has a data-dependent length: size it to the checkpoint.
        src = state_dict.get(prefix + "evicted_keys")
        if isinstance(src, torch.Tensor) and src.shape != self.evicted_keys.shape:
            self.evicted_keys = torch.empty(src.shape, dtype=self.key_dtype,
                                            device=self.evicted_keys.device)
        handled = self._tier is not None and self._load_tier(state_dict, prefix, error_msgs)
        if handled:  # the rows are the store's: the Parameter (the cache) is not in the checkpoint
            state_dict = {k: v for k, v in state_dict.items() if k not in (prefix + "tier", prefix + "values")}
        before = len(missing_keys)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)
        if handled:
            missing_keys[before:] = [k for k in missing_keys[before:] if k != prefix + "values"]

    # ---------------------------------------------------------- disk tier (hash_tier)
    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        if self._tier is None:
            return
        key = prefix + "values"
        if self._tier_state == "rows":  # for a server (tier_export): every row, stored overlaid by cached
            destination[key] = self._tier.full_weight()
        elif self._tier_state == "meta":
            destination[key] = torch.empty(self.capacity, self.embedding_size, device="meta")
        else:  # a commit of the store: the checkpoint holds which one (the table's own tensors beside it)
            del destination[key]
            generation = self._tier.commit()
            destination[prefix + "tier"] = torch.tensor([self._tier.store.uid, generation])

    def _load_tier(self, state_dict, prefix: str, error_msgs: list) -> bool:
        """A checkpoint's rows into the tier: the commit it names (``tier``: [store uid, generation]), or
        an in-memory table's ``values`` written to the store. False: neither is in `state_dict`."""
        tier, key = self._tier, prefix + "tier"
        src = state_dict.get(key)
        if src is None:
            values = state_dict.get(prefix + "values")
            if not isinstance(values, torch.Tensor):
                return False
            if tuple(values.shape) != (self.capacity, self.embedding_size):
                error_msgs.append(f"size mismatch for {prefix}values: copying a param with shape "
                                  f"{tuple(values.shape)}, the disk-tiered table is "
                                  f"{(self.capacity, self.embedding_size)} (capacity x embedding_size).")
            else:
                tier.import_rows(values)
            return True
        error = tier.restore_commit(key, src, "this HashEmbedding", context=f"HashEmbedding: {key}: ")
        if error is not None:
            error_msgs.append(error)
        return True

    def _apply(self, fn, recurse=True):
        if self._tier is not None:  # .to(), .cuda(), .half(): refused before anything moves
            probe = fn(torch.zeros(1))
            if probe.device.type != "cpu" or probe.dtype != torch.float32:
                raise ValueError(f"HashEmbedding: a disk-tiered table (tier={self._tier_config}) stays float32 on "
                                 f"the CPU (its cache is host memory over a float32 store), got a move to "
                                 f"{probe.device} {probe.dtype}; allowed: cpu, float32")
        return super()._apply(fn, recurse)

    def _refuse_tier(self, what: str, needs: str) -> None:
        if self._tier is not None:
            raise ValueError(f"HashEmbedding.{what}: a disk-tiered table (tier={self._tier_config}) does not support "
                             f"{needs}; allowed: tier=None")

    @property
    def disk_tier(self) -> DiskTier | None:
        """The `DiskTier` the rows live in (None: in memory)."""
        return self._tier_config

    @property
    def tier_store(self):
        """The `TierStore` holding the rows (this rank's keys' rows, when key-sharded); None in memory."""
        return None if self._tier is None else self._tier.store

    def tier_stats(self):
        """The disk tier's `TierStats` (hits, misses, bytes read and written); None in memory."""
        return None if self._tier is None else self._tier.stats

    def pop_reset_rows(self) -> torch.Tensor:
        """Rows (re)assigned to a new key since the last call (distinct, LongTensor); clears them.

        Also reachable as ``self.values.pop_reset_rows``. O(rows assigned), no
        host sync of its own.
        """
        if not self._reset_parts:
            return torch.empty(0, dtype=torch.int64, device=self.reset_mask.device)
        if self._tier is not None:  # rows -> the cached ones' slots of ``values`` (hash_tier.reset_state)
            rows = torch.unique(torch.cat(self._reset_parts))
            self._reset_parts = []
            self.reset_mask.index_fill_(0, rows, False)
            return self._tier.reset_state(rows.numpy())
        # The rows assigned since the last call, kept as a list: a scan of `reset_mask`
        # (O(capacity)) per optimizer step would cost more than the step's own lookups.
        # One part (one admitting call since the last pop, the usual case) holds distinct rows already.
        parts = self._reset_parts
        if len(parts) == 1:
            rows = parts[0]
        else:  # the device path's parts repeat rows (padding): filling a row twice is filling it once
            rows = torch.cat(parts)
            rows = torch.unique(rows) if host_reads_free(rows) else rows
        self._reset_parts = []
        self.reset_mask.index_fill_(0, rows, False)
        return rows

    def _init_rows(self, n: int) -> torch.Tensor:
        draw, scale = self._init_draw(n)
        if draw is None:
            return torch.full((n, self.embedding_size), scale, dtype=self.values.dtype, device=self.values.device)
        return draw * scale if self.param_init == "normal" else (draw * 2 - 1) * scale

    def _init_draw(self, n: int) -> tuple[torch.Tensor | None, float]:
        """`_init_rows`' draw from the generator (``randn`` for "normal", ``rand`` for "uniform") and its
        scale, or (None, the constant): a kernel may do the arithmetic itself (``hash_triton``)."""
        shape, kw = (n, self.embedding_size), dict(dtype=self.values.dtype, device=self.values.device)
        if self.param_init == "normal":
            return torch.randn(shape, **kw), _INIT_SCALE["normal"]
        if self.param_init == "uniform":
            return torch.rand(shape, **kw), _INIT_SCALE["uniform"]
        return None, 0.0 if self.param_init == "zeros" else 1.0

    def _check_keys(self, owner: str, keys) -> torch.Tensor:
        """`keys` as int64, after rejecting the table's reserved sentinel values."""
        check_int_tensor(owner, "keys", keys)
        keys = keys.to(torch.int64)
        bad = (keys | 1) == EMPTY  # EMPTY (-1) and DELETED (-2) are the two values x with x | 1 == -1
        if self.key_dtype == torch.int32:
            bad |= (keys < -2 ** 31) | (keys >= 2 ** 31)
        if not host_reads_free(keys):  # a device: checked there (see recstream.hostpath)
            device_assert(~bad.any(), f"{owner}: keys must not be -1 or -2 (the hash table's EMPTY/DELETED "
                                      f"markers) and must fit in {str(self.key_dtype).replace('torch.', '')}")
            return keys
        if bool(bad.any()):  # host sync: the only way to decide whether to raise
            i = bad.reshape(-1).nonzero()[0, 0]
            allowed = "int32 values" if self.key_dtype == torch.int32 else "int64 values"
            raise ValueError(
                f"keys must not contain {EMPTY} or {DELETED} (reserved EMPTY/DELETED sentinels of "
                f"the hash table); allowed: any other {allowed}; got keys.flatten()[{int(i)}]="
                f"{int(keys.reshape(-1)[i])}"
            )
        return keys

    def forward(self, keys: torch.Tensor) -> torch.Tensor:
        """Rows of ``keys`` (any shape, integer dtype) -> ``[*keys.shape, embedding_size]``.

        Training mode: counts keys, admits/evicts, marks looked-up rows dirty,
        renormalises looked-up rows in place with ``max_norm``.
        Eval mode or ``torch.inference_mode``: read-only (nothing in the module
        changes; ``max_norm`` scales the returned vectors only); unknown and
        pending keys read ``default_value``.
        Host syncs: on a CPU ``unique``, the sentinel check and the probe rounds' compactions
        (free there); on a device none while the table has room (module doc, "Row life cycle").
        """
        keys = self._check_keys("HashEmbedding", keys)
        flat = keys.reshape(-1)
        # A served model (eval mode, or inference_mode) must not change: no counting,
        # admission, eviction, step, dirty flag or max_norm write-back.
        mutate = self.training and not torch.is_inference_mode_enabled()
        if mutate and self.auto_step:
            self.step()
        if flat.numel() == 0 and self._sharding is None:  # sharded: still answer the other ranks
            return self.values.new_zeros(*keys.shape, self.embedding_size)
        if self._sharding is not None:  # keys routed to their owners; every rank takes part
            self._log_host(HostEvent("other"))
            uniq, inverse, counts = unique(flat, return_inverse=True, return_counts=True)
            out = self._sharding.lookup(uniq, counts, self._owner_lookup(mutate))
            return out.index_select(0, inverse).view(*keys.shape, self.embedding_size)
        backend = self._backend_for(flat)
        if mutate and backend is HOST:
            self._log_host(HostEvent("other"))  # the host path's step: not replayed from a CUDA graph
        with self._table_writes():
            out = backend.lookup(self, flat, mutate)  # hash_backend: host, torch ops or Triton
        return out.view(*keys.shape, self.embedding_size)

    def _owner_lookup(self, mutate: bool):
        """What a key-sharded table's owner runs on the keys asked of it (`KeySharding.lookup`)."""
        def local(keys: torch.Tensor, counts: torch.Tensor, inverse: torch.Tensor) -> torch.Tensor:
            with self._table_writes():
                return self._lookup_unique(keys, counts, mutate, inverse)
        return local

    def _table_writes(self):
        """Held while a lookup or an age eviction changes the table: a tiered table's `prefetch` reads
        it from another thread."""
        return self._tier.table_lock if self._tier is not None else contextlib.nullcontext()

    def prefetch(self, keys: torch.Tensor) -> int:
        """Bring the rows of the admitted ones among `keys` (a batch ahead's) into a disk-tiered
        table's cache; returns the rows read. Thread-safe: call it from the thread that prepares
        batches while a step trains (the models' ``batch_prefetcher`` does, in ``Model.train``).
        Keys not admitted yet, and the rows of keys evicted meanwhile, are read at their step. In
        memory: nothing to do (0).

        >>> import tempfile
        >>> from recstream.nn import DiskTier
        >>> emb = HashEmbedding(2, capacity=100, tier=DiskTier(tempfile.mkdtemp(), cache_rows=8))
        >>> for start in (0, 4, 8):  # keys 0..3 leave the cache (a prefetch keeps the last lookup's rows)
        ...     _ = emb(torch.arange(start, start + 4))
        >>> emb.prefetch(torch.tensor([0, 1, 99])), emb.tier_stats().prefetched  # 99: not admitted
        (2, 2)
        """
        if self._tier is None:
            return 0
        check_int_tensor("HashEmbedding.prefetch", "keys", keys)
        keys = keys.reshape(-1).to(torch.int64)
        keys = unique(keys[(keys | 1) != EMPTY])  # the EMPTY/DELETED markers are no one's keys (forward refuses them)
        with self._tier.table_lock:
            slots = self.table.find(keys)
            rows = self.table.rows.index_select(0, slots[slots >= 0])
        return self._tier.prefetch(rows[rows >= 0])

    def renorm_scale(self, norm: torch.Tensor) -> torch.Tensor:
        """The factor ``max_norm`` applies to rows of norm `norm` (1 where within it); the rule of
        ``torch.embedding_renorm_``: ``max_norm / (norm + 1e-7)``. Used by exports that freeze the rows."""
        return torch.where(norm > self.max_norm, self.max_norm / (norm + 1e-7), torch.ones_like(norm))

    def _headroom(self, budget: int) -> int:
        """Extra keys one LRU pass evicts beyond the step's need (see ``evict_low_watermark``)."""
        return int(budget * (1.0 - self.evict_low_watermark) + 1e-9)  # floor, robust to 0.1 != 1 - 0.9

    def _used_limit(self) -> float:
        """The fraction of slots live keys and tombstones may use before a rebuild: half of what
        ``max_load`` leaves free (see `_rehash_if_needed`)."""
        return self.max_load + (1.0 - self.max_load) / 2

    @property
    def table_backend(self) -> str:
        """Which backend runs the device path (CUDA tensors, or CPU ones under
        ``recstream.hostpath.device_path``): ``"auto"`` (Triton on CUDA when it imports, else the
        torch ops), ``"torch"`` or ``"triton"`` (see `recstream.nn.hash_backend`). Not saved:
        every backend reads and writes the same tensors, so a state moves between them.

        >>> emb = HashEmbedding(2, capacity=4)
        >>> emb.table_backend = "torch"
        >>> emb.table_backend
        'torch'
        """
        return self.__dict__.get("_table_backend", "auto")

    @table_backend.setter
    def table_backend(self, value: str) -> None:
        check_choice("HashEmbedding", "table_backend", value, BACKENDS)
        if value == "triton" and not triton_available():
            raise ValueError("HashEmbedding: table_backend='triton' needs the optional package triton "
                             "(pip install triton); allowed without it: 'auto', 'torch'")
        self.__dict__["_table_backend"] = value

    def _backend_for(self, tensor: torch.Tensor, host_only: bool = False) -> TableBackend:
        """The backend (`recstream.nn.hash_backend`) that runs the table on a batch on `tensor`'s
        device: the host path where reads are free, the table is sharded or `host_only` (a step that
        logs evictions); else the device path's, as `table_backend` says."""
        if host_only or self._sharding is not None or self._tier is not None or host_reads_free(tensor):
            return HOST
        choice = self.table_backend
        auto_torch = choice == "auto" and (tensor.device.type != "cuda" or not triton_works(tensor.device))
        if choice == "torch" or auto_torch:
            return STATIC
        from .hash_triton import TRITON  # imports triton: only once a Triton backend runs

        return TRITON

    # ---------------------------------------------------------- scalars
    @property
    def _num_free(self) -> int:
        if self._stale:
            self._read_counters()
        return self._free

    @property
    def _num_pending(self) -> int:
        if self._stale:
            self._read_counters()
        return self._pending

    def _read_counters(self) -> None:
        """Copy the counters the device path keeps on the device to the host: ONE read."""
        t = self.table
        self._set_read(torch.stack([self.num_free_t, self.num_pending_t, t.num_used_t, t.num_live_t]).tolist())

    def _set_read(self, values: list[int]) -> None:
        """The host's copies of (free rows, pending keys, used slots, live slots), just read."""
        self._free, self._pending = values[0], values[1]
        self._free_bound, self._pending_bound = values[0], values[1]
        self.table.set_mirrors(values[2], values[3])
        self._stale = False
        self._watch.void()

    def _set_free(self, n: int) -> None:
        self._free = self._free_bound = n
        self.num_free_t.fill_(n)
        self._watch.void()

    def _set_pending(self, n: int) -> None:
        self._pending = self._pending_bound = n
        self.num_pending_t.fill_(n)
        self._watch.void()

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
        host sync; on a device, masks over all slots and no sync unless evictions
        are logged for ``export_delta``) and runs every ``evict_interval`` steps:
        with an interval > 1 a key is evicted at the first check after it went stale.
        """
        self._step += 1
        # Counted on the device too (not filled from the host's count): a replayed CUDA graph of the
        # step then advances it (see hash_replay).
        self.global_step_t.add_(1)
        age = self._age_due(self._step)
        self._log_host(HostEvent("step", age=age))
        if age:
            # Free slots read last_seen=+inf, so one comparison finds the stale keys.
            stale = self.table.last_seen < self.global_step_t - self.evict_filter_value
            # Logged evictions have a data-dependent length: the host path's step.
            backend = self._backend_for(stale, host_only=self._track_evictions)
            if backend is HOST:
                self._log_host(HostEvent("other"))
            with self._table_writes():
                backend.evict_stale(self, stale)

    # ---------------------------------------------------------- the device path (no host sync)
    def lookup_masked(self, keys: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """`forward` of the 1-D `keys` where `mask` holds, ``default_value`` elsewhere: the
        entries out of `mask` are not counted, admitted or looked up. ``[len(keys), embedding_size]``.
        On a device nothing is compacted (no host sync): a caller with a batch of several features
        passes all its ids and masks the ones of this table's features.

        >>> emb = HashEmbedding(2, capacity=8, param_init="ones")
        >>> emb.lookup_masked(torch.tensor([5, 6]), torch.tensor([True, False])).tolist(), emb.num_rows
        ([[1.0, 1.0], [0.0, 0.0]], 1)
        """
        return lookup_masked_many([(self, keys, mask)])[0]

    # ---------------------------------------------------------- key sharding
    @property
    def sharded(self) -> bool:
        """Whether this module holds only the keys its rank owns (after `shard_keys_`)."""
        return self._sharding is not None

    def shard_keys_(self, group=None) -> HashEmbedding:
        """Keep only the keys this rank owns (collective: every rank of `group` calls it).

        Rank 0's table is broadcast first, so all ranks start from the same keys. Each rank then
        holds ``ceil(capacity / world_size)`` rows and ``ceil(pending_capacity / world_size)``
        pending keys; forwards route keys to their owners (`recstream.nn.key_sharding`). The
        ``values`` Parameter stays the same object: build the optimizer's state after. A disk-tiered
        table (built in the process of its rank, so it holds no keys yet) opens the store of this rank's
        keys' rows, ``<directory>/rank-<r>-of-<N>`` (`hash_tier.open_rank_hash_tier`).
        """
        if self.sharded:
            raise RuntimeError("HashEmbedding.shard_keys_: the keys are sharded already")
        self.check_tiers_shardable("HashEmbedding.shard_keys_")
        src = dist.get_global_rank(group, 0) if group is not None else 0
        size = torch.tensor([self.evicted_keys.numel()], device=self.evicted_keys.device)
        dist.broadcast(size, src=src, group=group)
        self.evicted_keys = self.evicted_keys.new_empty(int(size))
        # A tiered table's state_dict would commit its store (not opened yet): its buffers are the table.
        for tensor in self.state_dict(keep_vars=True).values() if self._tier is None else list(self.buffers()):
            dist.broadcast(tensor.data, src=src, group=group)
        self._sync_mirrors()
        sharding = KeySharding(group)
        w = sharding.world_size
        capacity, pending = -(-self.capacity // w), -(-self.pending_capacity // w)
        evicted = self.evicted_keys[sharding.owned(self.evicted_keys)]
        if self._tier is None:
            entries = self._entries()
            keep = sharding.owned(entries["keys"])
            self.load_entries_(capacity, pending, {k: v[keep] for k, v in entries.items()}, evicted)
        else:
            self._shard_tier(capacity, pending, evicted, sharding)
        self._sharding = sharding
        sharding.scale_gradient(self.values)
        self.values.recstream_layout = {  # read by Model.infer_train_layout and sharded checkpoints
            "shape": [w * self.capacity, self.embedding_size], "dtype": str(self.values.dtype).replace("torch.", ""),
            "device": str(self.values.device), "placement": "key_sharded", "ranks": list(range(w)),
            "rows": [[r * self.capacity, (r + 1) * self.capacity] for r in range(w)],
            "keys": f"recstream.nn.key_sharding.owner_of(key, {w}) == rank"}
        if self._tier is not None:  # the Parameter is this rank's cache: saved and loaded per rank
            self.values.recstream_layout.update(shape=[w * self.values.shape[0], self.embedding_size],
                                                placement="rank_local", store=self._tier.store.directory)
        return self

    def check_tiers_shardable(self, owner: str) -> None:
        """Refuse (ValueError) to key-shard a disk-tiered table whose store holds every key's rows: built
        in a process without a group of several ranks (checked before any collective)."""
        if isinstance(self._tier, HashTier):
            raise ValueError(f"{owner}: the disk-tiered HashEmbedding (tier={self._tier_config}) was built in a "
                             "single process, its store holds every key's rows; build the network after joining the "
                             "process group (distributed.init()), so that each rank opens a store of its own keys' "
                             "rows")

    def _shard_tier(self, capacity: int, pending: int, evicted: torch.Tensor, sharding: KeySharding) -> None:
        """A tiered table's shard: `capacity` rows in this rank's store. Built on several ranks, the table
        opened no store before, so it cannot hold keys (their rows would be nowhere)."""
        if self.num_rows or self.num_pending:
            raise RuntimeError(f"HashEmbedding.shard_keys_: a disk-tiered table without a store holds {self.num_rows} "
                               f"admitted and {self.num_pending} pending keys")
        self._allocate(capacity, pending)
        self.evicted_keys = evicted
        self._tier = open_rank_hash_tier(self._tier_config, capacity, self.embedding_size, self.values,
                                         sharding.rank, sharding.world_size, group=sharding.group)

    @property
    def shards(self) -> int:
        """The number of key shards (ranks) the table is split into; 1 when not sharded."""
        return self._sharding.world_size if self._sharding is not None else 1

    def owns(self, keys: torch.Tensor) -> torch.Tensor:
        """Bool mask: which of `keys` this shard holds (all of them when not sharded)."""
        if self._sharding is None:
            return torch.ones(keys.shape, dtype=torch.bool, device=keys.device)
        return self._sharding.owned(keys)

    def state(self) -> HashEmbeddingState:
        """This shard's complete table (detached views, no copy): what a checkpoint stores.

        >>> m = HashEmbedding(2, capacity=4)
        >>> _ = m(torch.tensor([7]))
        >>> s = m.state()
        >>> s.capacity, s.shards, sorted(s.tensors)[:3]
        (4, 1, ['default_value', 'dirty', 'free_rows'])
        >>> other = HashEmbedding(2, capacity=4)
        >>> other.load_state(s)
        >>> torch.equal(other(torch.tensor([7])), m(torch.tensor([7])))
        True
        """
        tensors = {n: t.detach() for n, t in self.state_dict(keep_vars=True).items() if n != "evicted_keys"}
        return HashEmbeddingState(tensors, self.evicted_keys.detach(), self.shards, self.capacity,
                                  self.pending_capacity, self.num_slots, self.global_step,
                                  bool(self.track_evictions_t))

    @torch.no_grad()
    def load_state(self, state: HashEmbeddingState) -> None:
        """Load a `state()` of a shard of the same geometry (shards, capacity, pending capacity,
        slots): ValueError naming the difference otherwise, before anything changes."""
        check_type("HashEmbedding.load_state", "state", state, HashEmbeddingState)
        mine = (self.shards, self.capacity, self.pending_capacity, self.num_slots)
        theirs = (state.shards, state.capacity, state.pending_capacity, state.num_slots)
        if mine != theirs:
            raise ValueError(f"HashEmbedding.load_state: the state has (shards, capacity, pending_capacity, "
                             f"num_slots) = {theirs}, this module {mine}; rebuild it with load_entries_")
        self.load_state_dict({**state.tensors, "evicted_keys": state.evicted_keys})

    @torch.no_grad()
    def set_counters_(self, global_step: int, track_evictions: bool) -> None:
        """Set the step counter and the eviction log switch (when rebuilding from other shards)."""
        self.global_step_t.fill_(check_int("HashEmbedding.set_counters_", "global_step", global_step, minimum=0))
        self.track_evictions_t.fill_(check_bool("HashEmbedding.set_counters_", "track_evictions", track_evictions))
        self._sync_mirrors()

    def _entries(self) -> dict[str, torch.Tensor]:
        """Every key in the table (admitted and pending) with its state; see `table_entries`."""
        state = {f"table.{n}": b for n, b in self.table.named_buffers()}
        state.update(values=self.values.detach(), dirty=self.dirty, reset_mask=self.reset_mask)
        return table_entries(state)

    @torch.no_grad()
    def load_entries_(self, capacity: int, pending_capacity: int, entries: dict[str, torch.Tensor],
                      evicted_keys: torch.Tensor) -> torch.Tensor:
        """Rebuild the table with `capacity` rows holding exactly `entries` (as `table_entries`).

        Keeps the step counter and the export baseline flag. Returns the row each admitted
        entry got, in entry order (to move per-row optimizer state along). Raises ValueError
        when the entries do not fit.
        """
        self._refuse_tier("load_entries_", "rebuilding its table from other shards' keys (reshard_tier_ does, "
                          "with the rows of the stores they were saved in)")
        rows = self._rebuild_table(capacity, pending_capacity, entries, evicted_keys)
        adm = _where(entries["admitted"])
        self.values.index_copy_(0, rows, entries["values"].index_select(0, adm).to(self.values.dtype))
        return rows

    def _rebuild_table(self, capacity: int, pending_capacity: int, entries: dict[str, torch.Tensor],
                       evicted_keys: torch.Tensor) -> torch.Tensor:
        """`load_entries_` but the rows' values: the table, its rows' flags and the eviction log."""
        adm = _where(entries["admitted"])
        n_pending = entries["keys"].numel() - adm.numel()
        if adm.numel() > capacity or n_pending > pending_capacity:
            raise ValueError(f"HashEmbedding: {adm.numel()} admitted and {n_pending} pending keys do not fit "
                             f"in capacity={capacity} and pending_capacity={pending_capacity}")
        self._allocate(capacity, pending_capacity)
        t = self.table
        slots = t.insert(entries["keys"].to(self.values.device))
        t.counts.index_copy_(0, slots, entries["counts"])
        t.last_seen.index_copy_(0, slots, entries["last_seen"])
        rows = self._pop_free(adm.numel())
        adm_slots = slots.index_select(0, adm)
        t.rows.index_copy_(0, adm_slots, rows)
        self.row_slots.index_copy_(0, rows, adm_slots)
        self.row_last_seen.index_copy_(0, rows, entries["last_seen"].index_select(0, adm))
        self.dirty.index_copy_(0, rows, entries["dirty"].index_select(0, adm))
        reset = entries["reset"].index_select(0, adm)
        self.reset_mask.index_copy_(0, rows, reset)
        self._reset_parts = [rows[reset]]
        self._set_pending(n_pending)
        self.evicted_keys = evicted_keys.to(device=self.values.device, dtype=self.key_dtype)
        return rows

    def old_tier_stores(self, commits: torch.Tensor, capacity: int, where: str) -> list[tuple[str, int, int]]:
        """The stores a sharded checkpoint of this disk-tiered table kept, saved by ``len(commits)`` shards of
        `capacity` rows (`commits`: their ``[store uid, generation]``), each settled at its commit by one of
        this run's ranks (`hash_tier.old_hash_stores`; `where` names the entry in errors). Read only: for
        `reshard_tier_`, after every rank returned (the ranks agree first: a collective of the caller's)."""
        if not isinstance(self._tier, HashTier):
            raise ValueError(f"HashEmbedding: {where}: the disk-tiered table has no store open (built in a process "
                             "of several ranks, not key-sharded yet)")
        rank, ranks = (0, 1) if self._sharding is None else (self._sharding.rank, self._sharding.world_size)
        return old_hash_stores(self._tier_config, capacity, commits, rank, ranks, where)

    @torch.no_grad()
    @_table_write
    def reshard_tier_(self, entries: dict[str, torch.Tensor], evicted_keys: torch.Tensor, old_rows: torch.Tensor,
                      sources: list[tuple[str, int, int]]) -> torch.Tensor:
        """A disk-tiered table's `load_entries_` from a checkpoint of another number of shards: the table
        rebuilt with this shard's capacity holding exactly `entries` (`table_entries`, their ``values``
        unused), and each admitted entry's row -- weights and per-row optimizer state -- copied into this
        shard's store from row ``old_rows[i]`` of the old stores `sources` (`old_tier_stores`; streamed in
        chunks, the old stores only read); the cache emptied, the store committed. Returns the new rows
        (entry order, as `load_entries_`); a ValueError when the entries do not fit."""
        if not isinstance(self._tier, HashTier):
            raise ValueError("HashEmbedding.reshard_tier_: the table is not disk-tiered or has no store open")
        rows = self._rebuild_table(self.capacity, self.pending_capacity, entries, evicted_keys)
        self._tier.move_from(sources, old_rows.numpy(), rows.numpy())
        return rows

    # ---------------------------------------------------------- export / import
    def _rows_dict(self, rows: torch.Tensor) -> dict[str, torch.Tensor]:
        slots = self.row_slots[rows]
        t = self.table
        values = self.values.detach()[rows].clone() if self._tier is None else self._tier.read_rows(rows.numpy())
        return {"keys": t.keys[slots].clone(), "values": values,
                "counts": t.counts[slots].clone(), "last_seen": t.last_seen[slots].clone()}

    def _start_delta(self) -> None:
        self.dirty.zero_()
        self.evicted_keys = self.evicted_keys[:0]
        self._track_evictions = True
        self.track_evictions_t.fill_(1)

    @torch.no_grad()
    def export(self, reset_delta: bool = True) -> dict[str, torch.Tensor]:
        """All admitted rows: ``{"keys", "values", "counts", "last_seen"}``, ordered by row.

        With ``reset_delta`` the export is the new baseline of ``export_delta``.
        """
        out = self._rows_dict((self.row_slots >= 0).nonzero().squeeze(1))
        if reset_delta:
            self._start_delta()
        return out

    @torch.no_grad()
    def export_delta(self) -> dict[str, torch.Tensor]:
        """Rows changed since the last export, plus ``"evicted_keys"`` (deletes)."""
        out = self._rows_dict(((self.row_slots >= 0) & self.dirty).nonzero().squeeze(1))
        gone = torch.unique(self.evicted_keys)
        if gone.numel():
            slots = self.table.find(gone)
            live = (slots >= 0) & (self.table.rows[slots.clamp(min=0)] >= 0)
            gone = gone[~live]  # re-admitted since: published as an upsert instead
        out["evicted_keys"] = gone
        self._start_delta()
        return out

    def import_(self, exported: Mapping[str, torch.Tensor]) -> None:
        """Load the output of `export` (or of ``export_delta`` minus its deletes)."""
        owner = "HashEmbedding.import_"
        check_type(owner, "exported", exported, Mapping, allowed="a mapping (as returned by export())")
        if "keys" not in exported or "values" not in exported:
            raise ValueError(f"{owner}: 'exported' must hold at least 'keys' and 'values' (as returned by "
                             f"export()), got keys {sorted(exported)}")
        self.load_rows(exported["keys"], exported["values"], exported.get("counts"),
                       exported.get("last_seen"))

    @torch.no_grad()
    @_table_write
    def load_rows(self, keys: torch.Tensor, values: torch.Tensor,
                  counts: torch.Tensor | None = None,
                  last_seen: torch.Tensor | None = None) -> None:
        """Insert or overwrite rows for unique ``keys`` ``[n]`` with ``values`` ``[n, dim]``.

        ``counts`` defaults to ``max(current count, permit_filter_value)`` and
        ``last_seen`` to the current step. Key-sharded (`shard_keys_`): only the keys
        this rank owns are loaded, so every rank can pass the same ones. New keys take free rows (reported by
        ``pop_reset_rows``); raises ValueError if there are not enough, rather
        than evicting.
        """
        owner = "HashEmbedding.load_rows"
        keys = self._check_keys(owner, check_int_tensor(owner, "keys", keys, ndim=1))
        n, dev = keys.numel(), self.values.device
        keys = keys.to(dev)
        check_type(owner, "values", values, torch.Tensor)
        if values.shape != (n, self.embedding_size):
            raise ValueError(f"{owner}: 'values' must be a tensor of shape ({n}, {self.embedding_size}), "
                             f"got {tuple(values.shape)}")
        for name, v in (("counts", counts), ("last_seen", last_seen)):
            if v is not None and check_int_tensor(owner, name, v, ndim=1).numel() != n:
                raise ValueError(f"{owner}: '{name}' must have {n} entries (one per key), got {v.numel()}")
        if torch.unique(keys).numel() != n:
            raise ValueError(f"{owner}: 'keys' must be unique, got duplicates")
        if self._sharding is not None:  # every rank may pass the same keys: each keeps its own
            mine = self._sharding.owned(keys)
            keys, values = keys[mine], values.to(dev)[mine]
            counts = None if counts is None else counts.to(dev)[mine]
            last_seen = None if last_seen is None else last_seen.to(dev)[mine]
        t = self.table
        slots = t.find(keys)
        new = (slots < 0).nonzero().squeeze(1)
        need_row = slots < 0
        need_row[slots >= 0] = t.rows[slots[slots >= 0]] < 0
        n_rows = int(need_row.sum())
        if n_rows > self._num_free:
            raise ValueError(f"keys need {n_rows} new rows but only {self._num_free} of capacity="
                             f"{self.capacity} are free; raise capacity or load fewer keys")
        if self._rehash_if_needed(new.numel()):
            slots = t.find(keys)
        n_pending = n_rows - new.numel()  # pending keys being admitted
        slots[new] = t.insert(keys[new])
        self._set_pending(self._num_pending - n_pending)
        self._assign_rows(slots[need_row])
        rows = t.rows[slots]
        if self._tier is not None:
            self._tier.put_rows(rows.numpy(), values)
        else:
            self.values[rows] = values.to(device=dev, dtype=self.values.dtype)
        if counts is None:
            t.counts[slots] = t.counts[slots].clamp(min=self.permit_filter_value)
        else:
            t.counts[slots] = counts.to(device=dev, dtype=torch.int64)
        t.last_seen[slots] = self._step if last_seen is None else last_seen.to(dev, torch.int64)
        self.row_last_seen[rows] = t.last_seen[slots]
        self.dirty[rows] = True

    def memory_bytes(self) -> dict[str, float]:
        """Measured bytes of the module's tensors, total and per row of capacity."""
        slot = sum(b.numel() * b.element_size() for b in self.table.buffers())
        values = self.values.numel() * self.values.element_size()
        rows = sum(b.numel() * b.element_size() for n, b in self.named_buffers()
                   if not n.startswith("table.") and b.dim() == 1 and b.numel() == self.capacity)
        total = sum(t.numel() * t.element_size() for t in [*self.parameters(), *self.buffers()])
        return {"values": values, "row_metadata": rows, "hash_slots": slot, "total": total,
                "per_row": total / self.capacity}

    def extra_repr(self) -> str:
        return (f"embedding_size={self.embedding_size}, capacity={self.capacity}, "
                f"num_slots={self.num_slots}, rows={self.num_rows}, pending={self._num_pending}, "
                f"permit={self.permit_filter_value}, evict={self.evict_filter_value}, "
                f"sparse={self.sparse}, step={self._step}"
                + (f", tier={self._tier_config.directory!r}/{self._tier_config.cache_rows} cached"
                   if self._tier_config is not None else ""))



def triton_works(device: torch.device) -> bool:
    """Whether ``table_backend="auto"`` takes the Triton backend on `device`: triton imports, and a
    small table trained there with it matches the torch ops (checked once per device, warned
    otherwise). The check runs every kernel a table uses before a real table depends on them: a
    kernel Triton cannot compile on this machine then costs the speed of the torch ops, not a run."""
    return triton_available() and _triton_matches_torch(str(device))


@functools.cache
def _triton_matches_torch(device: str) -> bool:
    g = torch.Generator().manual_seed(0)
    # Admission after 2 sightings, age eviction and more keys than rows: every kernel runs.
    stream = [torch.randint(0, 40, (24,), generator=g) * 7919 + 2 ** 40 for _ in range(4)]
    tables = {}
    try:
        with torch.enable_grad(), device_path():
            for backend in ("triton", "torch"):
                emb = HashEmbedding(4, param_init="ones", permit_filter_value=2, evict_filter_value=2,
                                    capacity=16, device=device)
                emb.table_backend = backend
                outs = [emb(keys.to(device)).detach().cpu() for keys in stream]
                tables[backend] = (outs, emb.export(reset_delta=False))
    except Exception as e:  # noqa: BLE001 -- any failure of the optional backend means: use the torch ops
        log.warning("HashEmbedding: the Triton backend failed on %s (%s: %s); tables there run on the torch ops",
                    device, type(e).__name__, str(e).splitlines()[0] if str(e) else "")
        return False
    (outs, a), (ref, b) = tables["triton"], tables["torch"]
    same = all(torch.equal(x, y) for x, y in zip(outs, ref, strict=True)) and \
        torch.equal(a["keys"].sort().values.cpu(), b["keys"].sort().values.cpu())
    if not same:
        log.warning("HashEmbedding: the Triton backend disagreed with the torch ops on %s; tables there run "
                    "on the torch ops", device)
    return same
