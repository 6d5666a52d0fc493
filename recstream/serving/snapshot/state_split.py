"""Split a network's state into the "dense" part and the rows of its HashEmbedding tables.

A [`HashEmbedding`][recstream.nn.hash_embedding.HashEmbedding] keeps, besides its rows, training bookkeeping sized by
``capacity``: free lists, dirty and reset flags, the hash table's slot arrays, the eviction
log. None of that means anything to a server, and it is what makes a raw ``state_dict``
impossible to patch incrementally. So a snapshot stores

* ``model.safetensors``: every state_dict entry EXCEPT those owned by a HashEmbedding, whose
  ``default_value`` (what unknown keys read) is kept;
* per HashEmbedding, its rows in [`export`][recstream.nn.hash_embedding.HashEmbedding.export] form
  (``keys, values, counts, last_seen``), full or as a delta.

The loader rebuilds each table by ``import_`` of the merged rows sorted by key, so a model
loaded from a full version and one loaded through a chain of deltas are bit-identical.

>>> import torch
>>> from recstream.nn import HashEmbedding
>>> net = torch.nn.ModuleDict({"user": HashEmbedding(4, capacity=8), "out": torch.nn.Linear(4, 1)})
>>> sorted(dense_state(net)), list(hash_embeddings(net)), hash_file("user")
(['out.bias', 'out.weight', 'user.default_value'], ['user'], 'hash/user.safetensors')
"""
from __future__ import annotations

import torch
from torch import nn

from ...nn import HashEmbedding
from ...nn.tier_export import materialized_tiers
from .layout import HASH_DIR

ROW_FIELDS = ("keys", "values", "counts", "last_seen")
_KEPT_HASH_STATE = ("default_value",)


def hash_embeddings(network: nn.Module) -> dict[str, HashEmbedding]:
    """``{module path: HashEmbedding}`` of `network` (the root itself is path ``""``), in module order."""
    return {name: m for name, m in network.named_modules() if isinstance(m, HashEmbedding)}


def hash_file(path: str) -> str:
    """Relative file name of a HashEmbedding's rows inside a version directory."""
    return f"{HASH_DIR}/{path or '_root'}.safetensors"


def _owned(name: str, prefixes: list[str]) -> bool:
    for p in prefixes:
        if p == "" or name.startswith(p):
            rest = name[len(p):]
            return rest not in _KEPT_HASH_STATE
    return False


def for_saving(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Detached, contiguous CPU tensors that share no storage (safetensors refuses shared ones)."""
    out, seen = {}, set()
    for name, t in tensors.items():
        t = t.detach().cpu()
        if not t.is_contiguous():
            t = t.contiguous()
        key = (t.untyped_storage().data_ptr(), t.dtype) if t.numel() else None
        if key is not None and key in seen:  # tied weights: store a copy, loading writes both
            t = t.clone()
        elif key is not None:
            seen.add(key)
        out[name] = t
    return out


def dense_state(network: nn.Module, shapes_only: bool = False) -> dict[str, torch.Tensor]:
    """The network's state_dict without HashEmbedding row storage (see module docstring). Disk-tiered
    tables are in it as in-memory tables' rows (`recstream.nn.tier_export`), the store not committed;
    with `shapes_only`, as ``meta`` tensors (names and shapes, no memory)."""
    prefixes = [p + "." if p else "" for p in hash_embeddings(network)]
    with materialized_tiers(network, meta=shapes_only):
        return {k: v for k, v in network.state_dict().items() if not _owned(k, prefixes)}


def hash_owned_keys(network: nn.Module) -> set[str]:
    """state_dict keys that `dense_state` leaves out (restored from the row files instead)."""
    prefixes = [p + "." if p else "" for p in hash_embeddings(network)]
    with materialized_tiers(network, meta=True):
        return {k for k in network.state_dict() if _owned(k, prefixes)}


def apply_delta(rows: dict[str, torch.Tensor], delta: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rows after a delta: keys in ``delta["evicted_keys"]`` are deleted, delta rows upserted.

    >>> rows = {"keys": torch.tensor([1, 2, 3]), "values": torch.tensor([[1.], [2.], [3.]]),
    ...         "counts": torch.ones(3, dtype=torch.int64), "last_seen": torch.zeros(3, dtype=torch.int64)}
    >>> delta = {"keys": torch.tensor([3, 4]), "values": torch.tensor([[30.], [4.]]),
    ...          "counts": torch.ones(2, dtype=torch.int64), "last_seen": torch.ones(2, dtype=torch.int64),
    ...          "evicted_keys": torch.tensor([1])}
    >>> out = apply_delta(rows, delta); out["keys"].tolist(), out["values"].flatten().tolist()
    ([2, 3, 4], [2.0, 30.0, 4.0])
    """
    gone = torch.cat([delta["evicted_keys"].to(rows["keys"].dtype), delta["keys"].to(rows["keys"].dtype)])
    keep = ~torch.isin(rows["keys"], gone)
    return {f: torch.cat([rows[f][keep], delta[f].to(rows[f].dtype)]) for f in ROW_FIELDS}


def sort_rows(rows: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rows ordered by key: one canonical import order, hence one canonical table layout."""
    order = torch.argsort(rows["keys"], stable=True)
    return {f: rows[f].index_select(0, order) for f in ROW_FIELDS}
