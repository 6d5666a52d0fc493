"""Resharding disk-tiered tables' stores: `old_rank_stores`, `settle_old_store`, `copy_rows`, `move_rows`.

A checkpoint of a disk-tiered `EmbeddingBagCollection` table saved by N ranks holds each rank's store
commit, ``[store uid, generation]``; the rows are in ``<directory>/rank-<k>-of-<N>`` (`tier_shard`).
Loaded into M ranks (M != N; one process, on either side: the store of the whole table, ``<directory>``
itself), each new store is filled from the old ones, rows streamed in chunks of `CHUNK` rows (every array:
the weights and the optimizer's per-row state), so a table larger than memory reshards in a chunk's
memory. The old stores are read, never written: first one process opens each (`settle_old_store`: the
open undoes the writes made after its last commit, as any reopen does, and its uid and generation are
checked against the checkpoint's), then every new rank maps its files read-only in effect
(`open_arrays`, reads only; blocks checked against their checksums). The old checkpoint so stays
loadable by N ranks, and the stores of both world sizes live side by side (their names carry N and M).

A key-sharded disk-tiered `HashEmbedding` reshards the same way, its stores' rows being the rows of the
saving ranks' tables (rank k's rows ``[k * capacity, (k + 1) * capacity)`` of their concatenation): each
new rank rebuilds its table from the keys it owns and `move_rows` streams each key's row from where the
old tables had it to where the new one put it, in the same chunks.

Example:
    >>> import tempfile, numpy as np
    >>> from recstream.nn.tier_shard import open_rank_store
    >>> d = tempfile.mkdtemp()
    >>> olds = [open_rank_store(d, "t", 10, 5 * k, 5 * k + 5, 2, 0.1, k, 2) for k in (0, 1)]
    >>> commits = [(s.uid, s.commit()) for s in olds]; [s.close() for s in olds] and None
    >>> sources = old_rank_stores(d, "t", 10, 2)
    >>> for (path, _, _), (uid, gen) in zip(sources, commits): settle_old_store(path, uid, gen, "ckpt")
    >>> new = open_rank_store(d, "t", 10, 0, 10, 2, 0.1, 0, 1, reshardable=True)
    >>> copy_rows(sources, new, 0, 10)
    >>> want = np.concatenate([open_rank_store(d, "t", 10, 5 * k, 5 * k + 5, 2, 0.1, k, 2, reshardable=True)
    ...                        .read("weight", np.arange(5)) for k in (0, 1)])
    >>> bool((new.read("weight", np.arange(10)) == want).all())
    True
    >>> keys = open_rank_store(d, "t", 12, 4, 8, 2, None, 1, 3, reshardable=True)  # a hash table's rows, placed anew
    >>> move_rows(sources, keys, np.array([7, 2]), np.array([0, 3]))
    >>> bool((keys.read("weight", np.array([0, 3])) == want[[7, 2]]).all())
    True
"""
from __future__ import annotations

import itertools
import json
import os

import numpy as np

from .tier_group import TierArray
from .tier_shard import rank_directory
from .tier_store import TierStore, open_arrays

__all__ = ["CHUNK", "copy_rows", "move_rows", "old_rank_stores", "settle_old_store", "settled_sources"]

CHUNK = 1 << 16  # rows read and written at a time: a chunk's memory, whatever the table's size


def old_rank_stores(directory: str, table: str, rows: int, ranks: int) -> list[tuple[str, int, int]]:
    """``(path, start, stop)`` of each of the `ranks` stores of `table` under `directory`, from their
    ``shard.json`` (a ValueError naming the store if one is missing or describes another shard); the
    store of the whole table, `directory` itself, when one process saved (`ranks` 1)."""
    if ranks == 1:
        if not TierStore.exists(directory):
            raise ValueError(f"table {table!r}: {directory} holds no store of the whole table, which the process "
                             "that saved the checkpoint kept there")
        return [(directory, 0, rows)]
    out = []
    for k in range(ranks):
        path = rank_directory(directory, k, ranks)
        meta = os.path.join(path, "shard.json")
        try:
            with open(meta, encoding="utf-8") as f:
                shard = json.load(f)
        except (OSError, ValueError) as e:
            raise ValueError(f"table {table!r}: cannot read {meta}, the shard of rank {k} of the {ranks} that "
                             f"saved the checkpoint: {e}") from e
        want = {"table": table, "rows": rows, "rank": k, "world_size": ranks}
        if not isinstance(shard, dict) or any(shard.get(key) != v for key, v in want.items()):
            raise ValueError(f"table {table!r}: {meta} describes another shard than rank {k} of {ranks} of a table "
                             f"of {rows} rows (found {shard!r})")
        out.append((path, int(shard["start"]), int(shard["stop"])))
    covered = [(a, b) for _, a, b in out]
    bounds = [0, *(b for _, b in covered)]
    if [a for a, _ in covered] != bounds[:-1] or bounds[-1] != rows:
        raise ValueError(f"table {table!r}: the stores of {ranks} ranks under {directory} hold rows {covered}, "
                         f"not [0, {rows}) split in order")
    return out


def settle_old_store(path: str, uid: int, generation: int, where: str) -> None:
    """Open the old store at `path` once (its writes after the last commit undone, as any reopen does)
    and check it is the store and commit that checkpoint `where` names; closed again, unchanged else."""
    store = TierStore.open(path)
    try:
        if store.uid != uid:
            raise ValueError(f"{where}: names tier store {uid}, {path} holds store {store.uid}")
        if store.generation != generation:
            raise ValueError(
                f"{where}: names generation {generation} of tier store {path}, which is at generation "
                f"{store.generation}: only a store at the checkpoint's commit is resharded (a later commit may "
                f"belong to a later checkpoint); load it on the {_ranks_of(path)} ranks that saved it first")
    finally:
        store.close()


def _ranks_of(path: str) -> str:
    name = os.path.basename(path)
    return name.rsplit("-of-", 1)[1] if "-of-" in name else "1"


def settled_sources(directory: str, table: str, rows: int, commits, rank: int, ranks: int, where: str
                    ) -> list[tuple[str, int, int]]:
    """`old_rank_stores` of the ``len(commits)`` ranks that saved a checkpoint (`commits`: their ``[store uid,
    generation]`` rows), each settled at its commit (`settle_old_store`) by one of this run's `ranks`
    processes, old store k by this run's rank ``k % ranks`` (opening a store takes its lock); `where` names
    the checkpoint entry in errors. Every process returns them all: the ranks agree before they read them."""
    sources = old_rank_stores(directory, table, rows, len(commits))
    for k, (path, _, _) in enumerate(sources):
        if k % ranks == rank:
            settle_old_store(path, int(commits[k][0]), int(commits[k][1]), f"{where}[{k}]")
    return sources


def copy_rows(sources: list[tuple[str, int, int]], store: TierStore, start: int, stop: int) -> None:
    """Fill `store` (rows ``[start, stop)`` of the table) from the old stores `sources`, every array,
    `CHUNK` rows at a time, and commit it. The old stores must be settled (`settle_old_store`)."""
    def pieces(a: int, b: int):
        lo, hi = max(a, start), min(b, stop)
        for first in range(lo, hi, CHUNK):
            rows = np.arange(first, min(hi, first + CHUNK), dtype=np.int64)
            yield rows, rows - start

    _fill(sources, store, pieces)


def move_rows(sources: list[tuple[str, int, int]], store: TierStore, old_rows: np.ndarray, new_rows: np.ndarray
              ) -> None:
    """Write row ``old_rows[i]`` of the old stores' table (every array) to row ``new_rows[i]`` of `store`,
    `CHUNK` rows at a time, in the old stores' row order, and commit it: the rows of a hash table's keys,
    which a reshard places anew (`HashEmbedding.reshard_tier_`). Rows of `store` not in `new_rows` keep
    what they hold (free rows: a key given one writes its own). The old stores must be settled."""
    old_rows, new_rows = np.asarray(old_rows, dtype=np.int64), np.asarray(new_rows, dtype=np.int64)
    order = np.argsort(old_rows, kind="stable")
    ordered = old_rows[order]

    def pieces(a: int, b: int):
        lo, hi = (int(i) for i in np.searchsorted(ordered, [a, b]))
        for first in range(lo, hi, CHUNK):
            pick = order[first:min(hi, first + CHUNK)]
            yield old_rows[pick], new_rows[pick]

    _fill(sources, store, pieces)


def _fill(sources: list[tuple[str, int, int]], store: TierStore, pieces) -> None:
    """Stream into `store` the chunks ``(old rows, new rows)`` that ``pieces(start, stop)`` yields for each
    old store of rows ``[start, stop)``: every array, one chunk in memory at a time; then commit."""
    arrays = None
    for path, a, b in sources:
        chunks = pieces(a, b)
        first = next(chunks, None)
        if first is None:
            continue
        groups, files = open_arrays(path)
        try:
            arrays = _check_arrays(path, files, store, arrays)
            for old, new in itertools.chain([first], chunks):
                store.write_many([(name, new, f.read_rows(old - a)) for name, f in files.items()])
                for f in groups:
                    f.release()
        finally:
            for f in groups:
                f.close()
    store.commit()


def _check_arrays(path: str, files: dict[str, TierArray], store: TierStore, seen: list[str] | None) -> list[str]:
    """The arrays of every old store must be the same (the optimizer stepped every rank); the new store
    gets those it lacks and must hold no others (their rows would keep another run's state)."""
    names = sorted(files)
    if seen is not None and names != seen:
        raise ValueError(f"tier store {path} holds arrays {names}, another rank's store {seen}: the stores "
                         "are not of one run")
    extra = sorted(set(store.files) - set(names))
    if extra:
        raise ValueError(f"tier store {store.directory} holds arrays {extra} that the stores it is resharded from "
                         f"({path}: {names}) do not: give the table another directory")
    store.add_arrays({name: (store.rows, files[name].cols, 0.0)  # every row written below
                      for name in names if name not in store.files})
    for name in names:
        if store.files[name].cols != files[name].cols:
            raise ValueError(f"tier store {path}: array {name!r} has {files[name].cols} columns, the table's new "
                             f"store {store.files[name].cols}")
    return names
