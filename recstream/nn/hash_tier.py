"""The disk tier of a `HashEmbedding`: `HashTier`.

A tiered `HashEmbedding` (``tier=DiskTier(...)``) keeps its hash table -- keys, counts, last-seen
steps, the free list: a few dozen bytes a key -- in memory as ever, and its rows (values and the
optimizer's per-row state) in a `TierStore` of ``capacity`` rows on disk. Its ``values`` Parameter is
the cache: ``cache_rows`` slots, filled and written back by `TierCache` exactly as an
`EmbeddingBagCollection` table's. The table's own life cycle runs on row numbers, unchanged; a row is
turned into a slot only where the Parameter is read or written:

* a lookup maps its rows to slots (`slots_of`; missing rows read from the store, least recently used
  slots written back);
* a row handed to a new key gets its initial values (`put_rows`) and, through ``pop_reset_rows``, its
  optimizer state reset: the slot of a cached row, the stored state of one that is not (`reset_state`);
* a row freed by an eviction leaves the cache without a write-back (`drop_rows`): its bytes belong
  to no key any more, and the next key given the row writes its own;
* exports read rows from the store overlaid by the cached ones (`read_rows`).

The rows of every training lookup stay pinned in the cache until the optimizer steps (`bind`, its
step pre-hook, ends the step): a table looked up several times before one step (``auto_step=False``,
gradient accumulation) keeps the slots its earlier outputs' gradients will update. Their union must
fit in the cache, or the lookup is refused.

Under ``hybrid_parallel`` the table is key-sharded (`recstream.nn.key_sharding`) and each rank keeps the
rows of its own keys in a store of its own, ``<directory>/rank-<r>-of-<N>`` (`open_rank_hash_tier`; the
conventions and refusals of `recstream.nn.tier_shard`), behind its own cache. Built in a process of
several ranks, a tiered table opens no store until then (`unopened_hash_tier`). The stores of other world
sizes, and one process's store of the whole table, may lie beside a rank's: a sharded checkpoint of them
loads into this run's stores by resharding them (`old_hash_stores`, `HashTier.move_from`,
`HashEmbedding.reshard_tier_`); they are not read otherwise.

Example:
    >>> import tempfile, torch
    >>> from recstream.nn import DiskTier, HashEmbedding
    >>> emb = HashEmbedding(4, capacity=1000, param_init="ones", tier=DiskTier(tempfile.mkdtemp(), cache_rows=8))
    >>> tuple(emb.values.shape), tuple(emb(torch.tensor([10, 2**40])).shape)
    ((8, 4), (2, 4))
    >>> emb.export()["values"].tolist()
    [[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0]]
"""

from __future__ import annotations

import os
import threading

import numpy as np
import torch
from torch import nn

from .embedding_config import DiskTier
from .tier_cache import TierCache
from .tier_reshard import move_rows, settled_sources
from .tier_shard import UnopenedTier, open_rank_store, process_ranks
from .tier_store import TierStore

__all__ = ["HashTier", "old_hash_stores", "open_hash_tier", "open_rank_hash_tier", "unopened_hash_tier"]

_OWNER = "HashEmbedding"
_TABLE = "HashEmbedding"  # the ``table`` of a rank store's shard.json: the rows of a HashEmbedding's keys


def unopened_hash_tier(tier: DiskTier) -> UnopenedTier | None:
    """In a process of several ranks: the tier, unopened until ``hybrid_parallel`` key-shards the table
    (each rank then opens a store of its own keys' rows); None in a single process."""
    ranks = process_ranks()
    return UnopenedTier(os.path.basename(tier.directory), tier.directory, ranks, _OWNER) if ranks > 1 else None


def open_rank_hash_tier(tier: DiskTier, capacity: int, embedding_size: int, weight: nn.Parameter, rank: int,
                        world_size: int, group=None) -> HashTier:
    """The tier of rank `rank` of `world_size`'s key shard of `capacity` rows: its store
    ``<directory>/rank-<rank>-of-<world_size>`` opened, or created of zeros (`tier_shard.open_rank_store`;
    another rank's store in its place is refused, naming path, rank and world size; the stores of other
    world sizes may lie beside it; the ranks of `group` agree first, so every rank raises when one cannot
    open its store)."""
    store = open_rank_store(tier.directory, _TABLE, world_size * capacity, rank * capacity, (rank + 1) * capacity,
                            embedding_size, None, rank, world_size, owner=_OWNER, group=group, reshardable=True)
    return HashTier(store.directory, weight, store, tier.cache_rows)


def open_hash_tier(tier: DiskTier, capacity: int, embedding_size: int, weight: nn.Parameter) -> HashTier:
    """The tier of a table of `capacity` rows: its store opened (a crash's uncommitted writes undone)
    or created (rows of zeros: a sparse file, nothing written; a row gets values when a key gets it).
    Rank stores (a key-sharded table's) may lie beside it: a checkpoint of them reshards into it."""
    if TierStore.exists(tier.directory):
        store = TierStore.open(tier.directory)
        held = store.files.get("weight")
        if held is None or (held.rows, held.cols) != (capacity, embedding_size):
            shape = None if held is None else (held.rows, held.cols)
            store.close()
            raise ValueError(f"{_OWNER}: the table is {capacity}x{embedding_size} (capacity x embedding_size), its "
                             f"tier store {tier.directory} holds {shape}; give the table its own directory")
    else:
        store = TierStore.create(tier.directory, {"weight": (capacity, embedding_size, 0.0)})
    return HashTier(tier.directory, weight, store, tier.cache_rows)


def old_hash_stores(tier: DiskTier, capacity: int, commits: torch.Tensor, rank: int, ranks: int, where: str
                    ) -> list[tuple[str, int, int]]:
    """The stores of a checkpoint of a table tiered in `tier` saved by ``len(commits)`` shards of `capacity`
    rows (`commits`: each one's ``[store uid, generation]``; one shard: one process's store of the whole
    table), ``(path, first row, stop)`` in the saved tables' concatenation, each checked and settled at its
    commit by one of this run's `ranks` processes (`tier_reshard.settled_sources`; `where` names the
    checkpoint entry in errors). A ValueError names the store that is missing or not the commit's."""
    return settled_sources(tier.directory, _TABLE, len(commits) * capacity, commits, rank, ranks, where)


class HashTier(TierCache):
    """`TierCache` with the row operations of a hash table's life cycle (see the module doc). Rows are
    int64 numpy arrays of distinct row numbers; every method takes the cache's lock."""

    def __init__(self, name: str, weight: nn.Parameter, store: TierStore, cache_rows: int) -> None:
        super().__init__(name, weight, store, cache_rows)
        # Held by the table's lookups and age evictions, which change the hash table, and by a prefetch
        # on another thread while it finds its keys' rows there (`HashEmbedding.prefetch`).
        self.table_lock = threading.Lock()

    def _map(self, rows: torch.Tensor, train: bool, lookup: bool = True) -> torch.Tensor:
        """`map_ids`, pinning the rows of every lookup since the optimizer's last step that followed a
        training lookup (before an optimizer is bound: those of this lookup only). Not a `lookup` (rows
        written by `put_rows`): its rows start no such run; a training lookup reading them pins them."""
        advance = self._opt is None or self._stepped
        try:
            slots = self.map_ids(rows, train, advance=advance)
        except ValueError as e:
            if "raise DiskTier.cache_rows" not in str(e):
                raise
            raise ValueError(f"{_OWNER}: the disk tier {self.name} caches {self.cache_rows} rows, fewer than the "
                             f"distinct admitted keys looked up since the optimizer's last step (this lookup: "
                             f"{rows.numel()}); raise DiskTier.cache_rows above them") from e
        if train and lookup:
            self._stepped = False
        return slots

    def slots_of(self, rows: torch.Tensor, train: bool) -> torch.Tensor:
        """The slots of distinct `rows` (a lookup's), loading the missing ones; with `train` they are
        written back when evicted."""
        if rows.numel() > self.cache_rows:
            raise ValueError(f"{_OWNER}: the disk tier {self.name} caches {self.cache_rows} rows, a batch reads "
                             f"{rows.numel()} distinct admitted keys; raise DiskTier.cache_rows above the distinct "
                             "keys of a batch")
        return self._map(rows, train)

    def put_rows(self, rows: np.ndarray, values: torch.Tensor) -> None:
        """Set the values of `rows` (new keys' initial rows, ``load_rows``). Rows that fit in the cache
        are brought in (a new key is looked up next) and written there, to be written back; rows the
        cache cannot take (more than it holds beside the rows pinned for the step) go to the store."""
        values = values.detach().to(torch.float32)
        if rows.size == 0:
            return
        if rows.size <= self.cache_rows:
            try:
                slots = self._map(torch.from_numpy(rows), train=True, lookup=False)
            except ValueError as e:  # (nothing was loaded)
                if "raise DiskTier.cache_rows" not in str(e):
                    raise
            else:
                with self.lock, torch.no_grad():
                    self.weight.data[slots] = values.to(self.weight.device)
                return
        with self.lock:
            self._quiesce()
            self.drop_cached(rows)
            self.store.write("weight", rows, values.cpu().numpy())
            self._sync_io_stats()

    def read_rows(self, rows: np.ndarray) -> torch.Tensor:
        """The values of `rows` ``[len(rows), dim]``: stored, overlaid by the cached ones."""
        with self.lock:
            self._quiesce()
            out = torch.from_numpy(self.store.read("weight", rows))
            slots = self.row2slot[rows]
            hit = np.flatnonzero(slots >= 0)
            out[torch.from_numpy(hit)] = self.weight.data[torch.from_numpy(slots[hit].astype(np.int64))].cpu()
            self._sync_io_stats()
            return out

    def drop_rows(self, rows: np.ndarray) -> None:
        """Rows freed by the table (their keys evicted): out of the cache, not written back."""
        with self.lock:
            self._quiesce()
            self.drop_cached(rows)

    def drop_cached(self, rows: np.ndarray) -> None:
        """Under the lock, no prefetch in flight: unmap the cached ones of `rows`, unwritten."""
        slots = self.row2slot[rows]
        slots = slots[slots >= 0].astype(np.int64)
        self.row2slot[self.slot2row[slots]] = -1
        self.slot2row[slots] = -1
        self.dirty[slots] = False

    def reset_state(self, rows: np.ndarray) -> torch.Tensor:
        """``pop_reset_rows`` of a tiered table: rows given to new keys get fresh optimizer state. The
        slots of the cached ones are returned (the optimizer resets them); the stored state of the
        others is set to its initial value here (their slots were reused before the optimizer's step)."""
        with self.lock:
            self._quiesce()
            slots = self.row2slot[rows]
            cold = rows[slots < 0]
            if cold.size and self._opt is not None:
                writes = [(key, cold, np.full((cold.size, self.store.files[key].cols), value, np.float32))
                          for key, value in self._row_state.items() if key in self.store.files]
                if writes:
                    self.store.write_many(writes)
                    self._sync_io_stats()
            return torch.from_numpy(slots[slots >= 0].astype(np.int64))

    def move_from(self, sources: list[tuple[str, int, int]], old_rows: np.ndarray, new_rows: np.ndarray) -> None:
        """Empty the cache and fill the store's rows `new_rows` with rows `old_rows` of the old stores
        `sources` (`old_hash_stores`: every array, weights and optimizer state, streamed in chunks,
        `tier_reshard.move_rows`), then commit: a resharded table's keys' rows where its table put them."""
        with self.lock:
            self._quiesce()
            self._clear()
            move_rows(sources, self.store, old_rows, new_rows)
            self._sync_io_stats()
