"""The in-memory cache of a disk-tiered table: `TierCache`.

A tiered table keeps every row and its optimizer state in a `TierStore` on local disk; its trainable
Parameter holds only ``cache_rows`` slots (plus a padding row). Before a lookup, the batch's ids are
mapped to slots (`TierCache.map_ids`): a missing row takes a free slot or the least recently used
one, whose row -- weights and per-row optimizer state -- is written back first if the slot was
trained since it was loaded. The optimizer then updates the cache Parameter as it would any table, so
training equals the in-memory table's as long as a row's optimizer state travels with it.

The optimizer is found without the caller's help: a global ``torch.optim`` step pre-hook binds a
cache to the optimizer whose parameters include its Parameter. Which state entries are per-row, and
their initial values, is an optimizer's *row-state adapter* (`ROW_STATE`, keyed by class name;
`register_row_state` adds one). A row-sparse optimizer is required: a dense update would move
the cached slots only, not every row of the table.

Example:
    >>> import tempfile, torch
    >>> from recstream.nn import DiskTier, EmbeddingBagCollection, EmbeddingTableConfig
    >>> tier = DiskTier(tempfile.mkdtemp(), cache_rows=4)
    >>> ebc = EmbeddingBagCollection([EmbeddingTableConfig("item", 1000, 8, tier=tier)])
    >>> ebc(torch.tensor([5, 999, 5]), torch.tensor([0, 1, 3]), batch_size=2).shape
    torch.Size([2, 8])
    >>> ebc.tier_stats()["item"].misses
    2
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_pre_hook

from . import tier_kernels
from .tier_file import distinct as _distinct
from .tier_kernels import gather_rows, put_rows
from .tier_lru import SlotRecency
from .tier_store import TierStore

__all__ = ["ROW_STATE", "TierCache", "TierStats", "register_row_state"]

RowState = Callable[[dict[str, Any]], dict[str, float]]

# Per optimizer class name: the per-row state entries of a parameter and their initial values, from
# its param group. Names, not classes: nn sits beside optim in the layering and does not import it.
ROW_STATE: dict[str, RowState] = {
    "LazyAdam": lambda g: {"exp_avg": 0.0, "exp_avg_sq": 0.0},
    "SparseAdam": lambda g: {"exp_avg": 0.0, "exp_avg_sq": 0.0},
    "Adam": lambda g: {"exp_avg": 0.0, "exp_avg_sq": 0.0, **({"max_exp_avg_sq": 0.0} if g.get("amsgrad") else {})},
    "AdamW": lambda g: {"exp_avg": 0.0, "exp_avg_sq": 0.0, **({"max_exp_avg_sq": 0.0} if g.get("amsgrad") else {})},
    "RowWiseAdagrad": lambda g: {"sum": float(g["initial_accumulator_value"])},
    "Adagrad": lambda g: {"sum": float(g["initial_accumulator_value"])},
    "FTRL": lambda g: {"accumulator": float(g["initial_accumulator_value"]), "linear": 0.0},
    "SGD": lambda g: {"momentum_buffer": 0.0} if g.get("momentum") else {},  # sparse SGD: no state
}


def register_row_state(optimizer_class_name: str, row_state: RowState) -> None:
    """Teach tiered tables another optimizer: ``row_state(param_group)`` returns
    ``{state key: initial value}`` for the state entries shaped ``[rows, ...]``."""
    if not isinstance(optimizer_class_name, str) or not callable(row_state):
        raise TypeError("register_row_state: expected (str, callable), got "
                        f"({type(optimizer_class_name).__name__}, {type(row_state).__name__})")
    ROW_STATE[optimizer_class_name] = row_state


def _row_state_of(opt: torch.optim.Optimizer, group: dict[str, Any]) -> dict[str, float] | None:
    for cls in type(opt).__mro__:
        if cls.__name__ in ROW_STATE:
            return ROW_STATE[cls.__name__](group)
    return None


@dataclass
class TierStats:
    """Counters of a tiered table since it was built, in rows, not ids: a row a step looks up more than
    once counts once."""

    hits: int = 0
    misses: int = 0
    prefetched: int = 0
    bytes_read: int = 0
    bytes_written: int = 0

    @property
    def hit_rate(self) -> float:
        return self.hits / max(1, self.hits + self.misses)


_CACHES: weakref.WeakSet = weakref.WeakSet()
_HOOK: list = []


def _bind_hook(optimizer: torch.optim.Optimizer, args, kwargs) -> None:
    """Global step pre-hook: hand each tiered table its optimizer (cheap when there are none)."""
    for cache in list(_CACHES):
        for group in optimizer.param_groups:
            if any(p is cache.weight for p in group["params"]):
                row_state = _row_state_of(optimizer, group)
                if row_state is None:  # a wrapper (CombinedOptimizer) steps a child that owns the state
                    cache.unknown = type(optimizer).__name__
                else:
                    cache.bind(optimizer, row_state)


_MOVING = -2  # row2slot of a row a prefetch is loading or writing back
# A prefetch that writes rows back logs their pre-images and fsyncs the undo log; it logs those of
# the trained rows of about this many more prefetches' victims (the next in LRU order) in the same
# fsync, so the write-backs of the next ones need none: an fsync a step costs milliseconds.
_LOG_AHEAD = 8
_LOG_AHEAD_MAX = 1 << 18  # slots at most: the pre-images of one fsync are held in memory until written


def _gather(t: torch.Tensor, slots: np.ndarray) -> np.ndarray:
    """Rows `slots` (int64) of the ``[slots, cols]`` tensor `t`, copied to a host array.
    Not ``t[index]``: advanced indexing copies element by element, several times the cost of row
    copies (rows of thousands of evictions a step); on the host `gather_rows`, a fraction of
    ``index_select``'s CPU (3,800 rows of a 400,000-row cache: 18 against 156 us with ``np.take``)."""
    if t.device.type == "cpu":
        return gather_rows(t.detach().numpy(), slots)
    return torch.index_select(t, 0, torch.from_numpy(slots).to(t.device)).cpu().numpy()


def _scatter(t: torch.Tensor, slots: np.ndarray, values: np.ndarray) -> None:
    """Rows `slots` (int64, distinct) of `t` := `values`; on the host a row copy each (`put_rows`)."""
    if t.device.type == "cpu" and t.dtype == torch.float32 and t.is_contiguous() and values.dtype == np.float32:
        put_rows(t.detach().numpy(), slots, values)
        return
    t.index_copy_(0, torch.from_numpy(slots).to(t.device), torch.from_numpy(values).to(t.device, t.dtype))


@dataclass
class _Transfer:
    """A prefetch in flight: `rows` going into `slots`, which held `old` (-1: free); the
    `was_dirty` ones among them are written back from the cache's weights and `state` (its per-row
    optimizer state tensors at `_plan`)."""

    rows: np.ndarray
    slots: np.ndarray
    old: np.ndarray
    was_dirty: np.ndarray
    state: dict[str, torch.Tensor]


class TierCache:
    """Slots of the Parameter `weight` (``[cache_rows (+ padding), dim]``) over the rows of `store`.

    ``map_ids`` and ``prefetch`` share one lock, so a prefetch on another thread never races a step's
    mapping; a prefetch never evicts the rows of the step in flight (the last ``map_ids``). The store
    is used by one thread at a time: a prefetch between its `_plan` and `_map_moved` (without the lock),
    or a holder of the lock once no prefetch is in flight (`_quiesce`)."""

    def __init__(self, name: str, weight: nn.Parameter, store: TierStore, cache_rows: int) -> None:
        self.name, self.weight, self.store, self.cache_rows = name, weight, store, cache_rows
        self.rows = store.files["weight"].rows
        self.row2slot = np.full(self.rows, -1, dtype=np.int32)  # 4 bytes a row: the host map
        self.slot2row = np.full(cache_rows, -1, dtype=np.int64)
        self.recency = SlotRecency(cache_rows)  # LRU order of the slots, to the step
        self.dirty = np.zeros(cache_rows, dtype=bool)
        self.lock = threading.Lock()
        self._moved = threading.Condition(self.lock)  # notified when a prefetch is done
        self._in_flight = 0  # prefetches reading or writing the store (0 or 1): it is theirs meanwhile
        self.stats = TierStats()
        self._opt: weakref.ref | None = None
        self._stepped = True  # the optimizer stepped since the last training lookup: its rows may go
        self._row_state: dict[str, float] = {}
        self._reload = False  # the optimizer loaded a state dict: the cached rows' state is stale
        self.unknown: str | None = None  # an optimizer without a row-state adapter stepped this table
        _CACHES.add(self)
        if not _HOOK:
            _HOOK.append(register_optimizer_step_pre_hook(_bind_hook))

    # ----- the optimizer -----
    def bind(self, optimizer: torch.optim.Optimizer, row_state: dict[str, float]) -> None:
        """Called before each step of the optimizer owning ``weight``.

        The first time an optimizer is seen: a fresh one (no state yet) starts every row's state at
        its initial value, so stored state of an earlier optimizer is reset; one holding state (a
        restored one) gets the cached rows' stored state. After its ``load_state_dict`` too."""
        self._stepped = True  # called before each step of the optimizer: the step's gradients are spent
        if self._opt is not None and self._opt() is optimizer and not self._reload:
            return  # every step but the first: without the lock, which a prefetch may hold
        with self.lock:
            self._quiesce()
            if self._opt is not None and self._opt() is optimizer and not self._reload:
                return
            if self._opt is None or self._opt() is not optimizer:
                cache = weakref.ref(self)
                optimizer.register_load_state_dict_post_hook(
                    lambda opt: setattr(cache(), "_reload", True) if cache() is not None else None)
            self._opt, self._row_state, self._reload = weakref.ref(optimizer), row_state, False
            if not optimizer.state.get(self.weight):
                self._reset_stored_state()
            else:
                slots = np.flatnonzero(self.slot2row >= 0)
                self._load(slots, self.slot2row[slots], weights=False)

    def _state(self) -> dict[str, torch.Tensor]:
        """The per-row state tensors of ``weight`` as ``[slots, cols]`` views (empty before the first step),
        each with its array in the store: one the store does not hold yet is added, every row at the
        state's initial value. Only where the store is this thread's (a prefetch in flight, or the lock
        held with none in flight): while nothing has been written, an add remakes the store's file."""
        out = self._state_tensors()
        new = {key: (self.rows, t.shape[1], float(self._row_state[key]))  # a constant: no row written
               for key, t in out.items() if key not in self.store.files}
        self.store.add_arrays(new)  # (all at once: the first step's states join the weights' records)
        return out

    def _state_tensors(self) -> dict[str, torch.Tensor]:
        """`_state` without adding arrays to the store."""
        opt = self._opt() if self._opt is not None else None
        state = {} if opt is None else opt.state.get(self.weight, {})
        out = {}
        for key in self._row_state:
            t = state.get(key)
            if isinstance(t, torch.Tensor) and t.dim() >= 1 and t.shape[0] == self.weight.shape[0]:
                out[key] = t.view(t.shape[0], -1)
        return out

    def _reset_stored_state(self) -> None:
        held = {key: (value, self.store.files[key].cols) for key, value in self._row_state.items()
                if key in self.store.files}
        for start in range(0, self.rows if held else 0, 1 << 16):
            rows = np.arange(start, min(self.rows, start + (1 << 16)))
            self.store.write_many([(key, rows, np.full((rows.size, cols), value, np.float32))
                                   for key, (value, cols) in held.items()])

    # ----- slots -----
    def map_ids(self, rows: torch.Tensor, train: bool, advance: bool | None = None) -> torch.Tensor:
        """Slots of table rows `rows` (int64, any shape), loading missing rows; with `train`, the slots
        are marked to be written back when evicted. Without `advance` the rows join those of the last
        call, which stay pinned too. None (the default): the rows of every lookup since the
        optimizer's last step that followed a training lookup stay pinned -- several lookups before
        one step (gradient accumulation) each keep their rows in their slots until the step spends
        their gradients, which a later lookup evicting them would leave on slots holding other rows."""
        automatic = advance is None
        if automatic:
            advance = self._opt is None or self._stepped
        if train and self._opt is None and self.unknown is not None:
            raise TypeError(f"a disk-tiered table ({self.name!r}) is trained by {self.unknown}, which has no "
                            f"row-state adapter (known: {sorted(ROW_STATE)}); add one with "
                            "recstream.nn.register_row_state")
        ids = rows.detach().cpu().numpy()
        cached = self._lookup_cached(ids, train, advance)  # every id cached (a prefetch's doing): one pass
        if cached is not None:
            if train and automatic:
                self._stepped = False
            return torch.from_numpy(cached.reshape(ids.shape)).to(rows.device)
        unique = _distinct(ids)  # sorted (before the lock: a prefetch waits on it meanwhile)
        if unique.size and (unique[0] < 0 or unique[-1] >= self.rows):  # numpy would wrap a negative index
            bad = int(ids[(ids < 0) | (ids >= self.rows)][0])
            raise ValueError(f"EmbeddingBagCollection: id {bad} of table {self.name!r} must be in [0, {self.rows})")
        with self.lock:
            if advance:
                self.recency.advance()
            if not self._ensure(unique):
                if advance:
                    raise ValueError(f"EmbeddingBagCollection: the disk tier of table {self.name!r} caches "
                                     f"{self.cache_rows} rows, a batch reads {unique.size} distinct ones; raise "
                                     "DiskTier.cache_rows above the distinct rows of a batch")
                raise ValueError(f"EmbeddingBagCollection: the disk tier of table {self.name!r} caches "
                                 f"{self.cache_rows} rows, fewer than the distinct rows looked up since the "
                                 f"optimizer's last step (this lookup: {unique.size}), which stay cached until "
                                 "it; raise DiskTier.cache_rows above them, or step more often")
            slots = self.row2slot[ids]
            if train:
                self.dirty[slots] = True
                if automatic:
                    self._stepped = False
        return torch.from_numpy(slots.astype(np.int64)).to(rows.device)

    def _lookup_cached(self, ids: np.ndarray, train: bool, advance: bool) -> np.ndarray | None:
        """`map_ids` of `ids` if every one is cached, in one pass (`tier_kernels`): their slots (int64,
        flat), the recency advanced and touched, the slots marked trained with `train`, the rows counted
        as hits once a step; None (nothing changed) if one is not cached or no kernel was built."""
        if tier_kernels.kernels is None:
            return None
        flat = np.ascontiguousarray(ids.reshape(-1), dtype=np.int64)
        out, fresh = np.empty(flat.size, dtype=np.int64), np.empty(flat.size, dtype=np.int64)
        with self.lock:
            recency = self.recency
            tick = recency.tick + 1 if advance else recency.tick
            dirty = self.dirty.view(np.uint8) if train else None
            k = tier_kernels.kernels.lookup_cached(flat, self.row2slot, recency.last_use, tick, dirty, out, fresh)
            if k < 0:
                return None
            if advance:
                recency.advance()
            recency.touched(fresh[:k])
            self.stats.hits += k
        return out

    def prefetch(self, rows: torch.Tensor | np.ndarray) -> int:
        """Bring rows into the cache ahead of the step that reads them (from another thread: the step
        goes on meanwhile); the rows of the step in flight stay. Returns how many rows were loaded.

        The disk work runs outside the lock, so a step's ``map_ids`` waits only for rows it needs that
        this prefetch is moving (loading, or writing back), and for the store if it must load rows
        itself: the rows not cached are read first (a step's ``map_ids``, which usually comes as a
        prefetch starts, then finds the lock free), slots are chosen for them under the lock
        (`_plan`), the evicted rows written back and the slots filled without it (`_transfer`,
        `_fill`: here, off the training thread, which is what a cache-full step waits for), the rows
        mapped under it again (`_map_moved`). One prefetch is in flight at a time: from its first read, the store is its
        alone (`_quiesce`)."""
        ids = rows.detach().cpu().numpy() if isinstance(rows, torch.Tensor) else np.asarray(rows)
        ids = ids.astype(np.int64, copy=False).ravel()
        unique = _distinct(ids[(ids >= 0) & (ids < self.rows)])
        with self.lock:
            while self._in_flight:
                self._moved.wait()
            wanted = unique[self.row2slot[unique] == -1]
            if wanted.size == 0:
                self._plan(unique)  # (the cached rows touched: kept for the step that reads them)
                return 0
            self._in_flight += 1
            keys = ("weight", *self._state())
        plan = None
        try:
            # Rows not cached stay so while this prefetch is in flight (a step's lookup that misses
            # waits for it, see _ensure): their stored bytes are current, whatever _plan then picks
            read = self.store.read_many(keys, wanted)
            with self.lock:
                plan = self._plan(unique)
            if plan is not None:
                loaded = self._transfer(plan, wanted, read)
        except BaseException:
            with self.lock:
                if plan is None:
                    self._done()
                else:
                    self._cancel(plan)
            raise
        if plan is not None:
            try:
                self._fill(plan, loaded)
            except BaseException:
                with self.lock:
                    self._drop(plan)
                raise
        with self.lock:
            if plan is not None:
                self.row2slot[plan.old[plan.was_dirty]] = -1  # written back: stored, as any row not cached
                self._map_moved(plan)
                self.stats.prefetched += plan.rows.size
            self._done()
        return 0 if plan is None else plan.rows.size

    def _quiesce(self) -> None:
        """Wait (the lock released meanwhile) until no prefetch is in flight: the store is free and the
        cache maps every row it holds."""
        while self._in_flight:
            self._moved.wait()

    def _plan(self, unique: np.ndarray) -> _Transfer | None:
        """Under the lock, a prefetch in flight: slots for the rows of `unique` not cached (as many as
        fit beside the step in flight), reserved; the rows they held unmapped. The rows moving are
        marked `_MOVING` in ``row2slot`` until `_map_moved`. Nothing is copied here: a step's
        ``map_ids`` waits on this lock."""
        slots = self.row2slot[unique]
        self.recency.touch(slots[slots >= 0].astype(np.int64))
        missing = unique[slots == -1][:self.recency.evictable()]
        if missing.size == 0:
            return None
        victims = self.recency.victims(missing.size)  # none of the step in flight
        self.recency.reserve(victims)
        old = self.slot2row[victims].copy()
        was_dirty = self.dirty[victims].copy()
        held = old >= 0
        self.row2slot[old[held]] = -1
        self.row2slot[old[was_dirty]] = _MOVING  # stored only once written back
        self.row2slot[missing] = _MOVING
        self.slot2row[victims] = missing
        self.dirty[victims] = False
        return _Transfer(missing, victims, old, was_dirty, self._state())

    def _transfer(self, plan: _Transfer, wanted: np.ndarray, read: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Outside the lock (the store is this prefetch's alone): write the evicted rows back; the new
        rows' weights and optimizer state, from `read` (the stored rows of sorted `wanted`, read before
        `_plan`) or the store.

        The evicted slots are reserved: no lookup maps them and no optimizer step writes them until
        `_map_moved` (a step updates the rows of its own lookups, which are never victims), so their
        rows are copied here, not under the lock."""
        back, rows = plan.slots[plan.was_dirty], plan.old[plan.was_dirty]
        if back.size:
            writes = [("weight", rows, _gather(self.weight.data, back))]
            writes += [(key, rows, _gather(t, back)) for key, t in plan.state.items()]
            self.store.write_many(writes, ahead=lambda: self._log_ahead(writes, plan.rows.size))
        # The rows planned are the first of those read: both are the batch's rows not cached, in order,
        # the plan's cut at the slots it can take (nothing maps or unmaps a row while it is in flight)
        k = plan.rows.size
        if not np.array_equal(wanted[:k], plan.rows):
            raise RuntimeError(f"disk tier of table {self.name!r}: a prefetch planned rows it did not read")
        late = [key for key in plan.state if key not in read]  # (states made since the read)
        return {**{key: values[:k] for key, values in read.items()}, **self.store.read_many(late, plan.rows)}

    def _log_ahead(self, writes: list[tuple[str, np.ndarray, np.ndarray]], moving: int) -> list[tuple[str, np.ndarray]]:
        """The rows whose pre-images `writes` log too, as they sync the log: the trained rows of the
        next victims (see `_LOG_AHEAD`). The slots of the step in flight may be among them: their
        stored rows, not the cached ones, are what is logged."""
        with self.lock:  # (a step's map_ids holds it briefly, never while waiting on this prefetch)
            next_victims = self.recency.oldest(min(_LOG_AHEAD * moving, _LOG_AHEAD_MAX))
            rows = self.slot2row[next_victims[self.dirty[next_victims]]]
        return [(key, rows) for key, _, _ in writes] if rows.size else []

    def _fill(self, plan: _Transfer, loaded: dict[str, np.ndarray]) -> None:
        """The read rows into their slots: reserved, so with or without the lock (nothing else reads
        or writes them until `_map_moved`)."""
        _scatter(self.weight.data, plan.slots, loaded["weight"])
        for key, t in self._state_tensors().items():
            if key in loaded:  # (a state made since _plan is at its initial value, as the store's rows)
                _scatter(t, plan.slots, loaded[key])

    def _map_moved(self, plan: _Transfer) -> None:
        """Under the lock: the filled slots mapped to their rows."""
        self.row2slot[plan.rows] = plan.slots
        self.recency.touch(plan.slots)

    def _cancel(self, plan: _Transfer) -> None:
        """A failed transfer: the slots hold their old rows again (trained ones still to write back)."""
        self.row2slot[plan.rows] = -1
        held = plan.old >= 0
        self.row2slot[plan.old[held]] = plan.slots[held]
        self.slot2row[plan.slots] = plan.old
        self.dirty[plan.slots] = plan.was_dirty
        self.recency.touch(plan.slots)
        self._done()

    def _drop(self, plan: _Transfer) -> None:
        """A transfer that failed to fill its slots (the evicted rows written back): its rows and the
        slots' old ones not cached, the slots empty."""
        self.row2slot[plan.rows] = -1
        self.row2slot[plan.old[plan.old >= 0]] = -1
        self.slot2row[plan.slots] = -1
        self.dirty[plan.slots] = False
        self.recency.touch(plan.slots)
        self._done()

    def _done(self) -> None:
        """A prefetch is over (installed, cancelled, or moved nothing): the store is free again."""
        self._in_flight -= 1
        self._sync_io_stats()
        self._moved.notify_all()

    def _ensure(self, unique: np.ndarray) -> bool:
        """Pin the rows of `unique` to the current step, loading those not cached (after waiting for
        the ones a prefetch is moving); False (nothing loaded) if they do not fit."""
        while True:
            slots = self.row2slot[unique]
            missing = unique[slots < 0]
            if not (missing.size and (self._in_flight or (slots == _MOVING).any())):
                break
            self._moved.wait()  # a prefetch holds the store, or moves rows of this step
        hit = slots >= 0
        self.stats.hits += self.recency.touch(slots[hit].astype(np.int64))
        if missing.size == 0:
            return True
        victims = self.recency.victims(missing.size)  # none of the step in flight
        if victims is None:
            return False
        self._evict(victims)
        self.row2slot[missing] = victims
        self.slot2row[victims] = missing
        self.recency.touch(victims)
        self.dirty[victims] = False
        self.stats.misses += missing.size
        self._load(victims, missing)
        self._sync_io_stats()
        return True

    def _evict(self, slots: np.ndarray) -> None:
        """Write the trained rows among `slots` back (weights and per-row state) and unmap them all."""
        held = slots[self.slot2row[slots] >= 0]
        self._write_back(held[self.dirty[held]])
        self.row2slot[self.slot2row[held]] = -1
        self.slot2row[held] = -1

    def _write_back(self, slots: np.ndarray) -> None:
        if slots.size == 0:
            return
        rows = self.slot2row[slots]
        writes = [("weight", rows, _gather(self.weight.data, slots))]
        writes += [(key, rows, _gather(t, slots)) for key, t in self._state().items()]
        self.store.write_many(writes)
        self.dirty[slots] = False

    def _load(self, slots: np.ndarray, rows: np.ndarray, weights: bool = True) -> None:
        """Stored `rows` into `slots`: their optimizer state, and their weights with `weights`."""
        if slots.size == 0:
            return
        state = self._state()
        read = self.store.read_many(("weight", *state) if weights else tuple(state), rows)
        if weights:
            _scatter(self.weight.data, slots, read["weight"])
        for key, t in state.items():
            _scatter(t, slots, read[key])

    def _sync_io_stats(self) -> None:
        self.stats.bytes_read, self.stats.bytes_written = self.store.bytes_read, self.store.bytes_written

    # ----- durability -----
    def commit(self) -> int:
        """Write back every trained cached row and commit the store; returns the generation."""
        with self.lock:
            self._quiesce()
            self._write_back(np.flatnonzero(self.dirty))
            generation = self.store.commit()
            self._sync_io_stats()
            return generation

    def restore(self, generation: int) -> None:
        """Return to committed `generation` (the store's last or the one before): later writes undone,
        the cache emptied."""
        with self.lock:
            self._quiesce()
            try:
                self.store.rollback_to(generation)
            except ValueError as e:
                raise ValueError(f"EmbeddingBagCollection: table {self.name!r}: the checkpoint is of tier "
                                 f"generation {generation}: {e} (restore the latest checkpoint, or the store's "
                                 "directory as it was with that checkpoint)") from e
            self._clear()

    def restore_commit(self, key: str, src, user: str, context: str = "") -> str | None:
        """Return to the commit that checkpoint entry `key` names (`src`: ``[store uid, generation]``);
        the error message instead when it names none of this store's (`user`: who uses the store, for
        the message; `context` goes before a failed restore's reason)."""
        if not isinstance(src, torch.Tensor) or src.shape != (2,) or src.dtype != torch.int64:
            return f'While copying "{key}", expected an int64 tensor [store uid, generation], got {src!r}.'
        if int(src[0]) != self.store.uid:
            return (f'"{key}" is a commit of tier store {int(src[0])}, {user} uses store '
                    f"{self.store.uid} in {self.store.directory}.")
        try:
            self.restore(int(src[1]))
        except ValueError as e:  # TierFileError included: a torn or corrupt store
            return f"{context}{e}"
        return None

    def __deepcopy__(self, memo):
        raise TypeError(f"the disk-tiered table {self.name!r} cannot be deep-copied: its rows are a store on disk "
                        f"({self.store.directory}), not memory; copy what gather_tables() returns instead")

    def import_rows(self, weight: torch.Tensor) -> None:
        """Replace every row's weights by `weight` ``[rows, dim]`` (an in-memory table's), cache emptied."""
        with self.lock:
            self._quiesce()
            self._clear()
            src = weight.detach().cpu().to(torch.float32).numpy()
            for start in range(0, self.rows, 1 << 16):
                rows = np.arange(start, min(self.rows, start + (1 << 16)))
                self.store.write("weight", rows, src[rows])

    def full_weight(self) -> torch.Tensor:
        """Every row (stored rows overlaid by the cached trained ones): materialises the table in memory."""
        out = torch.empty(self.rows, self.weight.shape[1], dtype=torch.float32)
        self.read_rows_into(out)
        return out

    def read_rows_into(self, out: torch.Tensor) -> None:
        """Copy every row into `out` ``[rows, dim]`` (stored rows overlaid by the cached ones), read in
        chunks: memory beyond `out` stays a chunk's, whatever the table's size. Commits nothing."""
        chunk = 1 << 16
        with self.lock, torch.no_grad():
            self._quiesce()  # no prefetch writing the store meanwhile
            for start in range(0, self.rows, chunk):
                rows = np.arange(start, min(self.rows, start + chunk))
                out[start:start + rows.size] = torch.from_numpy(self.store.read("weight", rows))
            held = np.flatnonzero(self.slot2row >= 0)
            out[torch.from_numpy(self.slot2row[held])] = self.weight.data[torch.from_numpy(held)].to(out)

    def _clear(self) -> None:
        self.row2slot[:] = -1
        self.slot2row[:] = -1
        self.recency.clear()
        self.dirty[:] = False
