"""The `HashEmbedding` part of sharded checkpoints (`checkpoint.save_sharded` / `load_sharded`).

A HashEmbedding's state is a hash table, whose slot of a key depends on the table's size: it is
not a tensor DCP could split by rows. Each rank therefore writes its own table whole, and the
checkpoint holds the concatenation of the ranks' tables (each tensor a ``DTensor`` sharded on
dim 0, so every rank writes only its part; one process writes one part):

- per-shard tensors, as the module holds them: ``table.keys/rows/counts/last_seen``,
  ``row_slots``, ``free_rows``, ``dirty``, ``reset_mask`` and ``values`` (the optimizer's per-row
  state of ``values`` follows the same placement, as for row-sharded tables);
- per-shard scalars (``num_free_t``, ``table.num_live_t``, ...) as one entry per shard;
- the eviction log, padded with the EMPTY sentinel to the longest rank's;
- ``default_value`` once. The JSON part records, per module, the number of shards and each
  shard's capacity, pending capacity and slot count, and whether it is disk-tiered.

A disk-tiered table's rows are its stores' (one per rank, `recstream.nn.hash_tier`): instead of
``values`` each rank commits its store and writes the commit, ``tier`` = ``[store uid, generation]``
(a ``[shards, 2]`` entry), which loading returns the store to; the optimizer's state of ``values`` is
that of the rank's cache slots (placement ``"rank_local"``). Loaded into as many shards of the same
geometry, each rank returns its store to its commit. Loaded into another number of shards (one process
on either side), it is resharded: each rank rebuilds its table from the keys it owns, exactly as an
in-memory table does (below), and fills its store from the saving ranks' stores, each key's row and
per-row optimizer state (every array of the stores) streamed from its saved row to its new one in
bounded chunks (`HashEmbedding.reshard_tier_`, `recstream.nn.tier_reshard`); the old stores are only
read, at the checkpoint's commit, so the checkpoint still loads on the ranks that saved it. The cache
starts empty and its slots' optimizer state is not read. The ranks agree on failure (a key shard that
does not fit, an old store missing or past the checkpoint's commit, a store that cannot be filled):
every rank raises. Refused, naming the module: the same number of shards of another geometry (their
stores are this run's), and a tiered table loaded into an in-memory one or the reverse.

Loading: when this run has the same number of shards of the same size, each rank reads back
exactly its own table (bit for bit: slots, free list and all). Otherwise -- a different number of
ranks, one process for serving -- every rank reads all shards, takes every key out of them
(`recstream.nn.hash_embedding.table_entries`), keeps the keys it owns now, rebuilds its table
with them, and moves the optimizer's per-row state of each kept key to the key's new row. A
shard that cannot hold the keys it now owns is refused with a ValueError.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from ..distributed import is_distributed, rank
from ..nn import HashEmbedding
from ..nn.hash_embedding import HashEmbeddingState, table_entries
from ..nn.tensor_hash_table import EMPTY
from ..nn.tier_shard import flagged_ranks

__all__ = ["hash_modules", "hash_doc", "hash_tensors", "hash_templates", "plan_hash_loads", "load_hash_state",
           "remap_optimizer_rows", "full_optimizer_templates", "resharded_hash_caches"]

_ROW_META = ("row_slots", "free_rows", "dirty", "reset_mask")
_PER_ROW = ("values", *_ROW_META)
_PER_SLOT = ("table.keys", "table.rows", "table.counts", "table.last_seen")
_SCALARS = ("num_free_t", "num_pending_t", "global_step_t", "track_evictions_t", "table.num_used_t",
            "table.num_live_t")


def hash_modules(network: nn.Module) -> dict[str, HashEmbedding]:
    return {name: m for name, m in network.named_modules() if isinstance(m, HashEmbedding)}


def _key(name: str, tensor: str) -> str:
    return f"hash.{name}.{tensor}" if name else f"hash.{tensor}"


def hash_doc(network: nn.Module) -> dict:
    """The JSON part: each module's shard geometry (the eviction log's padded length is agreed
    on by all ranks here: a collective when distributed)."""
    doc = {}
    for name, m in hash_modules(network).items():
        longest = torch.tensor([m.evicted_keys.numel()])
        if is_distributed():
            dist.all_reduce(longest, op=dist.ReduceOp.MAX)
        doc[name] = {"shards": m.shards, "capacity": m.capacity, "pending_capacity": m.pending_capacity,
                     "num_slots": m.num_slots, "evicted": int(longest), "tier": m.disk_tier is not None}
    return doc


def _local(m: HashEmbedding, evicted: int) -> dict[str, torch.Tensor]:
    """This shard's tensors, each with a first dimension that is the same on every rank."""
    state = m.state()  # a tiered table: its store committed
    out = {n: state.tensors[n] for n in (*_per_row(m), *_PER_SLOT)}
    out.update({n: state.tensors[n].reshape(1) for n in _SCALARS})
    if m.disk_tier is not None:
        out["tier"] = state.tensors["tier"].reshape(1, 2)
    log = torch.full((evicted,), EMPTY, dtype=state.evicted_keys.dtype, device=state.evicted_keys.device)
    log[: state.evicted_keys.numel()] = state.evicted_keys
    out["evicted_keys"] = log
    return out


def _per_row(m: HashEmbedding) -> tuple[str, ...]:
    """The per-row tensors of `m`'s state: a tiered table's rows are in its store, not in ``values``."""
    return _PER_ROW if m.disk_tier is None else _ROW_META


def _placed(local: torch.Tensor, shards: int, mesh) -> torch.Tensor:
    if mesh is None or shards == 1:
        return local
    from torch.distributed.tensor import DTensor, Shard
    shape = torch.Size([local.shape[0] * shards, *local.shape[1:]])
    stride = tuple(int(torch.Size(shape[i + 1:]).numel()) for i in range(len(shape)))
    return DTensor.from_local(local.contiguous(), mesh, [Shard(0)], run_check=False, shape=shape, stride=stride)


def hash_tensors(network: nn.Module, doc: dict, mesh) -> dict[str, torch.Tensor]:
    """``{checkpoint key: tensor}`` of every HashEmbedding, placed for DCP."""
    tensors = {}
    for name, m in hash_modules(network).items():
        for tensor, local in _local(m, doc[name]["evicted"]).items():
            tensors[_key(name, tensor)] = _placed(local, doc[name]["shards"], mesh)
        tensors[_key(name, "default_value")] = m.default_value.detach()
    return tensors


def _same_geometry(m: HashEmbedding, saved: dict) -> bool:
    return (saved["shards"] == m.shards and saved["capacity"] == m.capacity
            and saved["pending_capacity"] == m.pending_capacity and saved["num_slots"] == m.num_slots)


def hash_templates(owner: str, directory: str, network: nn.Module, doc: dict, saved, mesh
                   ) -> tuple[dict[str, torch.Tensor], dict[str, bool]]:
    """Tensors to load into, and per module whether it reads its own shard back (True) or all
    shards to reshard them (False)."""
    modules = hash_modules(network)
    if sorted(modules) != sorted(doc):
        raise ValueError(f"{owner}: {directory!r} holds HashEmbedding modules {sorted(doc)}, this network "
                         f"{sorted(modules)}")
    templates, direct = {}, {}
    for name, m in modules.items():
        _check_tier(owner, directory, name, m, doc[name])
        direct[name] = _same_geometry(m, doc[name])
        if direct[name]:  # this shard only, placed as it was written
            for tensor, local in _local(m, doc[name]["evicted"]).items():
                templates[_key(name, tensor)] = _placed(torch.empty_like(local), doc[name]["shards"], mesh)
        else:  # every shard, whole, on every rank (a tiered table: every shard's store commit)
            tier = () if m.disk_tier is None else ("tier",)
            for tensor in (*_per_row(m), *_PER_SLOT, *_SCALARS, "evicted_keys", *tier):
                meta = saved[_key(name, tensor)]
                templates[_key(name, tensor)] = torch.empty(list(meta.size), dtype=meta.properties.dtype,
                                                            device=m.values.device)
        templates[_key(name, "default_value")] = torch.empty_like(m.default_value)
    return templates, direct


def _check_tier(owner: str, directory: str, name: str, m: HashEmbedding, saved: dict) -> None:
    """Refuse what a disk-tiered table cannot load: the same number of shards of another geometry (the stores
    the checkpoint's rows are in are this run's: they cannot be refilled from themselves), or a checkpoint of
    the other kind (rows vs commits). Another number of shards reshards."""
    tiered, was = m.disk_tier is not None, bool(saved.get("tier", False))
    if not tiered and not was:
        return
    if tiered != was:
        kinds = {True: "disk-tiered (commits of its stores)", False: "in memory (its rows)"}
        raise ValueError(f"{owner}: {directory!r}: HashEmbedding {name!r} was saved {kinds[was]}, this network "
                         f"holds it {kinds[tiered]}; load it into a network that holds it as it was saved")
    if saved["shards"] == m.shards and not _same_geometry(m, saved):
        mine = (m.shards, m.capacity, m.pending_capacity, m.num_slots)
        theirs = tuple(saved[k] for k in ("shards", "capacity", "pending_capacity", "num_slots"))
        raise ValueError(f"{owner}: {directory!r}: disk-tiered HashEmbedding {name!r} was saved by {saved['shards']} "
                         f"rank(s) as this run holds it, with another table (this is rank {rank()}; (shards, "
                         f"capacity, pending_capacity, num_slots) saved {theirs}, here {mine}): each rank's store "
                         "holds the rows of its keys, and a tier is resharded only into another number of ranks; "
                         "load it with the same table")


def plan_hash_loads(network: nn.Module, loaded: dict, direct: dict[str, bool], doc: dict) -> dict:
    """For each module that reshards: the entries it will own, their saved rows, its eviction log
    and (a tiered one) the old stores, settled at the checkpoint's commits; checked to fit its capacity
    (ValueError) -- before any module changes. When a table reshards, the ranks agree (collective):
    every rank raises if one failed."""
    plans, error = {}, None
    for name, m in hash_modules(network).items():
        try:
            if direct[name] and m.disk_tier is not None:
                _check_store(name, m, _local_part(loaded[_key(name, "tier")]))
            if not direct[name]:
                plans[name] = _plan(name, m, lambda t, name=name: _local_part(loaded[_key(name, t)]), doc[name],
                                    _key(name, "tier"))
        except Exception as e:  # noqa: BLE001 -- raised below, after the ranks agreed (load_sharded wraps it)
            error = e
            break
    if any(not direct[n] for n in hash_modules(network)):  # (a rank whose keys fit would load alone)
        _agree(error, "read the checkpoint's keys and stores")
    if error is not None:
        raise error
    return plans


def _plan(name: str, m: HashEmbedding, get, saved: dict, where: str) -> tuple:
    entries, old_rows, log = _owned_entries(m, get, saved)
    admitted = int(entries["admitted"].sum())
    pending = entries["keys"].numel() - admitted
    if admitted > m.capacity or pending > m.pending_capacity:
        raise ValueError(f"HashEmbedding {name!r}: rank {rank()} of {m.shards} owns {admitted} admitted and {pending} "
                         f"pending keys of the checkpoint (saved by {saved['shards']} rank(s)), which do not fit in "
                         f"capacity={m.capacity} and pending_capacity={m.pending_capacity} (rows per rank); raise the "
                         "table's capacity or load it on more ranks")
    sources = None
    if m.disk_tier is not None:  # the old stores, each settled at its commit by one rank
        try:
            sources = m.old_tier_stores(get("tier").reshape(-1, 2), saved["capacity"], where)
        except ValueError as e:  # TierFileError included
            raise ValueError(f"disk-tiered HashEmbedding {name!r} (rank {rank()} of {m.shards}) cannot be resharded "
                             f"from the stores of the {saved['shards']} rank(s) that saved it: {e}") from e
    return entries, old_rows, log, sources


def _agree(error: Exception | None, what: str) -> None:
    """Every rank learns whether one failed (one all-reduce; nothing outside a process group): a rank that
    failed raises its own error after, the others one naming it -- none goes on into a collective that
    rank never joins."""
    failed = flagged_ranks(error is not None)
    if failed and error is None:
        raise ValueError(f"HashEmbedding: rank(s) {failed} could not {what} to reshard the checkpoint's "
                         f"tables (their errors say why); this is rank {rank()}")


def _check_store(name: str, m: HashEmbedding, tier: torch.Tensor) -> None:
    """A tiered table's commit entry must name this rank's store (checked before anything changes)."""
    store, uid = m.tier_store, int(tier.reshape(-1)[0])
    if uid != store.uid:
        raise ValueError(f"HashEmbedding {name!r}: the checkpoint holds a commit of tier store {uid}, this rank "
                         f"(rank {rank()}) uses store {store.uid} in {store.directory}; load it with the tier "
                         "directory it was saved with")


def load_hash_state(network: nn.Module, loaded: dict, direct: dict[str, bool], doc: dict, plans: dict
                    ) -> dict[str, tuple[torch.Tensor, torch.Tensor, int]]:
    """Put the loaded tensors into the modules (`plans` from `plan_hash_loads`). Returns, per
    resharded module, ``(old rows, new rows, saved rows)``: where each kept key's row was in the
    saved concatenation and is now."""
    moves = {}
    for name, m in hash_modules(network).items():
        get = lambda t, name=name: _local_part(loaded[_key(name, t)])  # noqa: E731
        with torch.no_grad():
            if direct[name]:
                _load_direct(m, get, doc[name])
                continue
            m.default_value.copy_(get("default_value"))
            entries, old_rows, log, sources = plans[name]
            m.set_counters_(int(get("global_step_t")[0]), bool(get("track_evictions_t").max()))
            if sources is not None:
                _reshard_tier(m, entries, log, old_rows[entries["admitted"]], sources)
                continue
            new_rows = m.load_entries_(m.capacity, m.pending_capacity, entries, log)
            moves[name] = (old_rows[entries["admitted"]], new_rows, doc[name]["shards"] * doc[name]["capacity"])
    return moves


def _reshard_tier(m: HashEmbedding, entries: dict, log: torch.Tensor, old_rows: torch.Tensor, sources: list) -> None:
    """`HashEmbedding.reshard_tier_`, the ranks agreeing on its success (collective)."""
    error = None
    try:
        m.reshard_tier_(entries, log, old_rows, sources)
    except Exception as e:  # noqa: BLE001 -- raised below, after the ranks agreed (a corrupt block, a full disk)
        error = e
    _agree(error, "fill their stores")
    if error is not None:
        raise error


def _local_part(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def _load_direct(m: HashEmbedding, get, saved: dict) -> None:
    tensors = {n: get(n) for n in (*_per_row(m), *_PER_SLOT, "default_value")}
    tensors.update({n: get(n).reshape(()) for n in _SCALARS})
    if m.disk_tier is not None:  # load_state returns the store to this commit
        tensors["tier"] = get("tier").reshape(2).clone()
    log = get("evicted_keys")
    m.load_state(HashEmbeddingState(
        tensors, log[log != EMPTY].clone(), saved["shards"], saved["capacity"], saved["pending_capacity"],
        saved["num_slots"], int(tensors["global_step_t"]), bool(tensors["track_evictions_t"])))


def _owned_entries(m: HashEmbedding, get, saved: dict) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """Every key of every saved shard that `m` owns now, with its row in the saved concatenation
    (-1 for pending keys), and the owned part of the eviction log. Reads only. A tiered table's rows
    are in its stores (row r of the concatenation: row r of the old stores' table): no values here."""
    shards, cap, slots = saved["shards"], saved["capacity"], saved["num_slots"]
    parts, olds = [], []
    for s in range(shards):
        state = {n: get(n)[s * slots:(s + 1) * slots] for n in _PER_SLOT}
        state.update({n: get(n)[s * cap:(s + 1) * cap] for n in ("dirty", "reset_mask")})
        state["values"] = get("values")[s * cap:(s + 1) * cap] if m.disk_tier is None else torch.zeros(cap, 0)
        entries = table_entries(state)
        olds.append(torch.where(entries["admitted"], entries["row"] + s * cap, -1))
        parts.append(entries)
    entries = {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
    old_rows = torch.cat(olds)
    log = get("evicted_keys")
    log = torch.unique(log[log != EMPTY])
    mine = m.owns(entries["keys"])
    return {k: v[mine] for k, v in entries.items()}, old_rows[mine], log[m.owns(log)]


def _state_keys(network: nn.Module, doc_optimizer: dict, name: str):
    """The checkpoint keys of the optimizer's tensor state of module `name`'s ``values``."""
    param = f"{name}.values" if name else "values"
    for path, leaf in doc_optimizer.items():
        for key, kind in leaf["state"].get(param, {}).items():
            if kind == "tensor":
                yield f"optim.{path}{param}.{key}"


def full_optimizer_templates(network: nn.Module, doc_optimizer: dict, direct: dict[str, bool], templates: dict,
                             saved) -> None:
    """Resharded modules read every shard's per-row optimizer state whole (replaces templates); a tiered
    table's is its cache slots' (`resharded_hash_caches`)."""
    for name, m in hash_modules(network).items():
        if direct[name] or m.disk_tier is not None:
            continue
        for key in _state_keys(network, doc_optimizer, name):
            meta = saved[key]
            templates[key] = torch.empty(list(meta.size), dtype=meta.properties.dtype, device=m.values.device)


def remap_optimizer_rows(network: nn.Module, doc_optimizer: dict, loaded: dict, moves: dict) -> None:
    """Move each kept key's per-row optimizer state to its new row (in `loaded`, in place)."""
    modules = hash_modules(network)
    for name, (old_rows, new_rows, saved_rows) in moves.items():
        for key in _state_keys(network, doc_optimizer, name):
            full = loaded[key]
            if full.dim() == 0 or full.shape[0] != saved_rows:
                continue  # not per row (e.g. a step count)
            local = full.new_zeros(modules[name].capacity, *full.shape[1:])
            local[new_rows] = full[old_rows]
            loaded[key] = local


def resharded_hash_caches(network: nn.Module, direct: dict[str, bool]) -> dict[str, nn.Parameter]:
    """``{parameter name: cache}`` of the resharded disk-tiered tables: their caches start empty, and their
    slots' optimizer state is not read (the rows' is in the stores)."""
    return {f"{name}.values" if name else "values": m.values for name, m in hash_modules(network).items()
            if not direct[name] and m.disk_tier is not None}
