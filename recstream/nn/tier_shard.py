"""The per-rank store of a row-sharded disk-tiered table: `open_rank_store`.

Under ``hybrid_parallel`` each rank owns a contiguous range of a table's rows (`row_sharding`); for a
disk-tiered table it keeps only those rows, in a `TierStore` of its own under the tier's directory,
``<directory>/rank-<r>-of-<N>``, beside a ``shard.json`` that says which rows of which table it holds.
A store is opened only by the rank, world size and rows it was made for: one of another world size
(rows split differently), of another rank, or the store of the whole table that one process made
there is refused with a ValueError naming the path, the rank and the world size -- never read as if
it held this rank's rows. A key-sharded disk-tiered `HashEmbedding` keeps the rows of each rank's keys the
same way (`open_rank_store` with ``init_std=None``: a store of zeros, a row gets values when a key gets it).
Both kinds of stores are opened `reshardable`: those of other world sizes may lie beside them, and
`load_sharded` fills them from a checkpoint of another number of ranks (`tier_reshard`).

Example:
    >>> import tempfile
    >>> d = tempfile.mkdtemp()
    >>> store = open_rank_store(d, "item", rows=10, start=5, stop=10, dim=4, init_std=0.01, rank=1, world_size=2)
    >>> store.files["weight"].rows, os.path.basename(store.directory)
    (5, 'rank-1-of-2')
    >>> store.close()
    >>> open_rank_store(d, "item", rows=10, start=4, stop=8, dim=4, init_std=0.01, rank=1, world_size=3)
    Traceback (most recent call last):
    ...
    ValueError: ...holds the stores of 2 ranks (rank-1-of-2); this is rank 1 of 3...
"""
from __future__ import annotations

import json
import os
import re

import torch

from ..atomic import atomic_write, fsync_dir
from .tier_store import TierStore

__all__ = ["UnopenedTier", "open_rank_store", "process_ranks", "rank_directory"]

_OWNER = "EmbeddingBagCollection"
_RANK_DIR = re.compile(r"rank-(\d+)-of-(\d+)$")
_META = "shard.json"


def rank_directory(directory: str, rank: int, world_size: int) -> str:
    """Where rank `rank` of `world_size` keeps its rows of the table tiered in `directory`."""
    return os.path.join(directory, f"rank-{rank}-of-{world_size}")


def _rank_dirs(directory: str) -> list[str]:
    try:
        return sorted(n for n in os.listdir(directory) if _RANK_DIR.match(n))
    except FileNotFoundError:
        return []


def process_ranks() -> int:
    """The number of ranks of this process's default group (1 without one)."""
    dist = torch.distributed
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


class UnopenedTier:
    """The tier of a table built in a process of several ranks: a rank holds a store of its own rows
    only, opened when ``hybrid_parallel`` shards the table; until then any use is refused, naming it."""

    def __init__(self, name: str, directory: str, ranks: int, owner: str = _OWNER) -> None:
        self._what = (f"{owner}: disk-tiered table {name!r} was built in a process of {ranks} ranks: each rank "
                      f"keeps a store of its own rows (under {directory}), opened when parallel_mode="
                      "'hybrid_parallel' shards the table (Model, or recstream.distributed.hybrid_parallel); "
                      "build it in a single process to use it unsharded")

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        raise RuntimeError(self._what)


def open_rank_store(directory: str, table: str, rows: int, start: int, stop: int, dim: int, init_std: float | None,
                    rank: int, world_size: int, owner: str = _OWNER, group=None, reshardable: bool = False
                    ) -> TierStore:
    """The store of rows ``[start, stop)`` of `table` (`rows` rows in all) for rank `rank` of
    `world_size`: opened (a crash's uncommitted writes undone) if that rank made it, else created
    with rows drawn from ``N(0, init_std**2)`` (torch's generator, as an in-memory table's); with
    `init_std` None, of zeros (a sparse file: nothing written). `owner` begins the error messages.

    In a process group (`group`, the default one if None) the ranks agree before they return
    (collective: one all-reduce): a rank whose store fails to open raises its error, and every other
    rank a ValueError naming it, instead of going on into collectives that rank never joins.

    `reshardable` (the tables' own: `load_sharded` reshards their stores, `tier_reshard`): the stores of
    other world sizes, and a whole table's, may lie beside this one in `directory`."""
    try:
        store, error = _open_rank_store(directory, table, rows, start, stop, dim, init_std, rank, world_size,
                                        owner, reshardable), None
    except Exception as e:  # noqa: BLE001 -- re-raised below, after the ranks agreed
        store, error = None, e
    failed = flagged_ranks(error is not None, group)
    if error is not None:
        raise error
    if failed:
        store.close()
        raise ValueError(f"{owner}: table {table!r}: rank(s) {failed} of {world_size} could not open their tier "
                         f"stores under {directory} (their errors say why); this is rank {rank}, whose store "
                         "opened, but the table cannot train without every rank's rows")
    return store


def flagged_ranks(flag: bool, group=None) -> list[int]:
    """The ranks of `group` (the default one if None) whose `flag` is set: collective, one all-reduce of
    ``world_size`` integers, run by every rank at the same point; ``[]`` outside a process group.

    >>> flagged_ranks(True)  # a plain process: no group, no other rank to tell
    []
    """
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
        return []
    device = "cuda" if dist.get_backend(group) == "nccl" else "cpu"  # NCCL reduces device tensors only
    flags = torch.zeros(dist.get_world_size(group), dtype=torch.int64, device=device)
    flags[dist.get_rank(group)] = int(bool(flag))
    dist.all_reduce(flags, group=group)
    return [r for r, f in enumerate(flags.tolist()) if f]


def _open_rank_store(directory: str, table: str, rows: int, start: int, stop: int, dim: int, init_std: float | None,
                     rank: int, world_size: int, owner: str, reshardable: bool) -> TierStore:
    where = f"tier directory {directory} (table {table!r}, this is rank {rank} of {world_size})"
    if TierStore.exists(directory) and not reshardable:
        raise ValueError(f"{owner}: {where} holds the store of the whole table, made by one process; a table "
                         f"sharded over ranks keeps each rank's rows in {rank_directory(directory, '<r>', world_size)}"
                         ": give it another directory")
    others = sorted({int(m.group(2)) for n in _rank_dirs(directory) for m in [_RANK_DIR.match(n)]} - {world_size})
    if others and not reshardable:
        found = ", ".join(n for n in _rank_dirs(directory) if not n.endswith(f"-of-{world_size}"))
        raise ValueError(f"{owner}: {where} holds the stores of {' and '.join(map(str, others))} ranks ({found}); "
                         f"this is rank {rank} of {world_size}: a tier is trained on the number of ranks that made "
                         "it (its rows are split by it), or give the table another directory")
    path = rank_directory(directory, rank, world_size)
    want = {"table": table, "rows": rows, "start": start, "stop": stop, "dim": dim, "rank": rank,
            "world_size": world_size}
    meta = os.path.join(path, _META)
    if os.path.exists(meta):
        _check_meta(meta, want, rank, world_size, owner)
        if TierStore.exists(path):
            store = TierStore.open(path)
            weight = store.files.get("weight")
            if weight is None or (weight.rows, weight.cols) != (stop - start, dim):
                store.close()
                held = None if weight is None else (weight.rows, weight.cols)
                raise ValueError(f"{owner}: tier store {path} holds {held} rows x cols, rank {rank} of "
                                 f"{world_size} owns {(stop - start, dim)} of table {table!r}; "
                                 "give the table another directory")
            return store
    elif os.path.isdir(path) and os.listdir(path):
        raise ValueError(f"{owner}: {path} has no {_META}: it is not a rank store of table {table!r} (rank {rank} "
                         f"of {world_size}); give the table another directory")
    os.makedirs(path, exist_ok=True)
    _write_meta(meta, want)  # first: a store found later is known to be this rank's

    def fill(a: int, b: int):
        return torch.empty(b - a, dim).normal_(0.0, init_std).numpy()

    return TierStore.create(path, {"weight": (stop - start, dim, 0.0 if init_std is None else fill)})


def _check_meta(meta: str, want: dict, rank: int, world_size: int, owner: str) -> None:
    try:
        with open(meta, encoding="utf-8") as f:
            found = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"{owner}: cannot read {meta} (rank {rank} of {world_size}): {e}") from e
    if found != want:
        diff = {k: (found.get(k) if isinstance(found, dict) else None, v) for k, v in want.items()
                if not isinstance(found, dict) or found.get(k) != v}
        raise ValueError(f"{owner}: {meta} describes another shard than rank {rank} of {world_size} needs "
                         f"(field: (stored, needed) {diff}); give the table another directory")


def _write_meta(meta: str, doc: dict) -> None:
    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(doc, f)

    atomic_write(meta, write)
    fsync_dir(os.path.dirname(meta))
