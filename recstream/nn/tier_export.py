"""A network's disk-tiered tables as in-memory ones, for what serves or exports it.

A checkpoint of a tiered table is a commit of its store (``tables.<name>.tier``: [store uid,
generation]); a server or an exported file needs the rows themselves. Two ways to get them:

* `materialized_tiers` -- within it, ``state_dict()`` of every `EmbeddingBagCollection` under a
  network holds each tiered table as an in-memory table's ``tables.<name>.weight`` (the stored rows
  overlaid by the cache's trained ones, read in chunks), and commits nothing: a publish must not move
  the generation a checkpoint names. With ``meta=True`` the entries are ``meta`` tensors of the
  table's shape (names and shapes for a rebuild check, no memory).
* `untiered_copy` -- a deep copy of a network whose tiered collections are in-memory collections of
  the same tables and rows (what `torch.export` traces).

Both put a whole table in memory: `check_tiers_fit` refuses up front, naming the table, when the
tables would not fit in the memory available now.

Example:
    >>> import tempfile, torch
    >>> from recstream.nn import DiskTier, EmbeddingBagCollection, EmbeddingTableConfig
    >>> ebc = EmbeddingBagCollection([EmbeddingTableConfig("item", 100, 4, tier=DiskTier(tempfile.mkdtemp(), 8))])
    >>> with materialized_tiers(ebc):
    ...     sorted(ebc.state_dict()), tuple(ebc.state_dict()["tables.item.weight"].shape)
    (['tables.item.weight'], (100, 4))
    >>> sorted(ebc.state_dict())  # outside: a commit of the store
    ['tables.item.tier']
    >>> copy = untiered_copy(ebc)
    >>> copy.tables[0].tier is None and torch.equal(copy.table_weight("item"), ebc.gather_tables()["item"])
    True
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses

import torch
from torch import nn

from .embedding_bag_collection import EmbeddingBagCollection

__all__ = ["check_tiers_fit", "materialized_tiers", "tiered_collections", "tiered_keys", "untiered_copy"]


def tiered_collections(network: nn.Module) -> list[EmbeddingBagCollection]:
    """The collections under `network` holding at least one disk-tiered table."""
    return [m for m in network.modules()
            if isinstance(m, EmbeddingBagCollection) and any(t.tier is not None for t in m.tables)]


def tiered_keys(network: nn.Module) -> set[str]:
    """The ``state_dict`` keys of `network`'s tiered tables under `materialized_tiers` (tensors made
    afresh for each call: a caller that would copy them need not)."""
    return {f"{prefix}.tables.{t.name}.weight" if prefix else f"tables.{t.name}.weight"
            for prefix, m in network.named_modules() if isinstance(m, EmbeddingBagCollection)
            for t in m.tables if t.tier is not None}


def available_memory() -> int | None:
    """Bytes the kernel says a process can allocate now without swapping (MemAvailable); None if unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_tiers_fit(network: nn.Module, what: str, copies: int = 1, available: int | None = None) -> None:
    """Raise ValueError if `copies` in-memory copies of `network`'s tiered tables would not fit in
    `available` bytes (default: the memory available now), naming the first table that does not."""
    available = available_memory() if available is None else available
    if available is None:
        return
    need = 0
    for ebc in tiered_collections(network):
        for t in ebc.tables:
            if t.tier is None:
                continue
            size = t.num_embeddings * t.embedding_dim * 4
            need += copies * size
            if need > available:
                raise ValueError(
                    f"{what}: the disk-tiered table {t.name!r} ({t.num_embeddings} x {t.embedding_dim} float32, "
                    f"{_size(size)}) would be materialised in memory (the tiered tables so far need {_size(need)}) "
                    f"but {_size(available)} is available; this needs a machine with the memory for the whole "
                    "table (a server holds it in memory too)")


def _size(n: int) -> str:
    return f"{n} bytes ({n / 2**30:.2f} GiB)"


@contextlib.contextmanager
def materialized_tiers(network: nn.Module, meta: bool = False):
    """Within: ``state_dict()`` holds tiered tables as in-memory ones (see module docstring)."""
    found = tiered_collections(network)
    if not meta:
        check_tiers_fit(network, f"state of {type(network).__name__}")
    for ebc in found:
        ebc._tier_state = "meta" if meta else "rows"
    try:
        yield network
    finally:
        for ebc in found:
            ebc._tier_state = "commit"


def _in_memory(ebc: EmbeddingBagCollection) -> EmbeddingBagCollection:
    """An in-memory collection of `ebc`'s tables holding their current rows."""
    tables = [dataclasses.replace(t, tier=None) for t in ebc.tables]
    device = next(iter(ebc.parameters())).device
    with torch.random.fork_rng(devices=[]):  # its random init is overwritten: leave the caller's stream alone
        out = EmbeddingBagCollection(tables, sparse=ebc.sparse, device=device, validate=ebc.validate)
    with torch.no_grad():
        for t in ebc.tables:
            dst = out.table_weight(t.name)
            if t.tier is None:
                dst.copy_(ebc.table_weight(t.name))
            else:  # straight from the store into the table: one copy of the rows in memory
                ebc._tiers[ebc._table_loc[t.name][0]].read_rows_into(dst)
    return out.train(ebc.training)


def untiered_copy(network: nn.Module) -> nn.Module:
    """A deep copy of `network` whose tiered collections are in-memory ones (see module docstring)."""
    found = tiered_collections(network)
    if not found:
        return copy.deepcopy(network)
    check_tiers_fit(network, f"a copy of {type(network).__name__}")
    memo = {id(ebc): _in_memory(ebc) for ebc in found}  # deepcopy takes these as the copies
    return copy.deepcopy(network, memo)

