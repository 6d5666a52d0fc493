"""A network's disk-tiered tables as in-memory ones, for what serves or exports it.

A checkpoint of a tiered table is a commit of its store (``tables.<name>.tier``: [store uid,
generation]; a tiered `HashEmbedding`'s ``tier`` beside its hash table); a server or an exported file
needs the rows themselves. Two ways to get them:

* `materialized_tiers` -- within it, ``state_dict()`` of every `EmbeddingBagCollection` under a
  network holds each tiered table as an in-memory table's ``tables.<name>.weight`` (the stored rows
  overlaid by the cache's trained ones, read in chunks), and commits nothing: a publish must not move
  the generation a checkpoint names. With ``meta=True`` the entries are ``meta`` tensors of the
  table's shape (names and shapes for a rebuild check, no memory). A tiered `HashEmbedding` holds
  its ``values`` there as an in-memory one's ``[capacity, embedding_size]`` (its ``export()`` reads the
  rows of its keys from the store at any time, committing nothing).
* `untiered_copy` -- a deep copy of a network whose tiered collections (and tiered `HashEmbedding` s)
  are in-memory ones of the same tables and rows (what `torch.export` traces).

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
from .hash_embedding import HashEmbedding

__all__ = ["check_tiers_fit", "materialized_tiers", "tiered_collections", "tiered_hash_embeddings", "tiered_keys",
           "untiered_copy"]


def tiered_collections(network: nn.Module) -> list[EmbeddingBagCollection]:
    """The collections under `network` holding at least one disk-tiered table."""
    return [m for m in network.modules()
            if isinstance(m, EmbeddingBagCollection) and any(t.tier is not None for t in m.tables)]


def tiered_hash_embeddings(network: nn.Module) -> list[HashEmbedding]:
    """The `HashEmbedding` s under `network` whose rows are on disk (``tier=``)."""
    return [m for m in network.modules() if isinstance(m, HashEmbedding) and m.disk_tier is not None]


def tiered_keys(network: nn.Module) -> set[str]:
    """The ``state_dict`` keys of `network`'s tiered tables under `materialized_tiers` (tensors made
    afresh for each call: a caller that would copy them need not)."""
    return {f"{prefix}.tables.{t.name}.weight" if prefix else f"tables.{t.name}.weight"
            for prefix, m in network.named_modules() if isinstance(m, EmbeddingBagCollection)
            for t in m.tables if t.tier is not None} | {
        f"{prefix}.values" if prefix else "values" for prefix, m in network.named_modules()
        if isinstance(m, HashEmbedding) and m.disk_tier is not None}


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
    tables = [(t.name, t.num_embeddings, t.embedding_dim) for ebc in tiered_collections(network)
              for t in ebc.tables if t.tier is not None]
    tables += [(name, m.capacity, m.embedding_size) for name, m in network.named_modules()
               if isinstance(m, HashEmbedding) and m.disk_tier is not None]
    for name, rows, dim in tables:
        size = rows * dim * 4
        need += copies * size
        if need > available:
            raise ValueError(
                f"{what}: the disk-tiered table {name!r} ({rows} x {dim} float32, "
                f"{_size(size)}) would be materialised in memory (the tiered tables so far need {_size(need)}) "
                f"but {_size(available)} is available; this needs a machine with the memory for the whole "
                "table (a server holds it in memory too)")


def _size(n: int) -> str:
    return f"{n} bytes ({n / 2**30:.2f} GiB)"


@contextlib.contextmanager
def materialized_tiers(network: nn.Module, meta: bool = False):
    """Within: ``state_dict()`` holds tiered tables as in-memory ones (see module docstring)."""
    found = [*tiered_collections(network), *tiered_hash_embeddings(network)]
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


def _hash_in_memory(emb: HashEmbedding) -> HashEmbedding:
    """An in-memory `HashEmbedding` of `emb`'s geometry, keys and rows (its table's state as is)."""
    args = dict(key_dtype=emb.key_dtype, param_init=emb.param_init, sparse=emb.sparse, max_norm=emb.max_norm,
                permit_filter_value=emb.permit_filter_value, evict_filter_value=emb.evict_filter_value,
                capacity=emb.capacity, pending_capacity=emb.pending_capacity, max_load=emb.max_load,
                auto_step=emb.auto_step, evict_interval=emb.evict_interval,
                evict_low_watermark=emb.evict_low_watermark)
    out = HashEmbedding(emb.embedding_size, **args)
    emb._tier_state = "meta"  # every tensor but the rows, which are read from the store below
    try:
        state = {k: v for k, v in emb.state_dict().items() if k != "values"}
    finally:
        emb._tier_state = "commit"
    missing, unexpected = out.load_state_dict(state, strict=False)
    if missing != ["values"] or unexpected:
        raise RuntimeError(f"untiered_copy: a HashEmbedding's state left {missing} missing, {unexpected} unexpected")
    with torch.no_grad():
        emb._tier.read_rows_into(out.values.data)
    if "_table_backend" in emb.__dict__:
        out.table_backend = emb.table_backend
    return out.train(emb.training)


def untiered_copy(network: nn.Module) -> nn.Module:
    """A deep copy of `network` whose tiered collections and HashEmbeddings are in-memory ones (see
    module docstring)."""
    found, hashed = tiered_collections(network), tiered_hash_embeddings(network)
    if not found and not hashed:
        return copy.deepcopy(network)
    check_tiers_fit(network, f"a copy of {type(network).__name__}")
    memo = {id(ebc): _in_memory(ebc) for ebc in found}  # deepcopy takes these as the copies
    with torch.random.fork_rng(devices=[]):  # the copies' initial rows are overwritten: the caller's stream stays
        memo.update({id(emb): _hash_in_memory(emb) for emb in hashed})
    return copy.deepcopy(network, memo)

