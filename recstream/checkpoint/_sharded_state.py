"""The tensors `checkpoint.save_sharded` hands to DCP, and the templates `load_sharded` fills.

A parameter row-sharded by `EmbeddingBagCollection.shard_rows_` (its ``recstream_layout`` says
``"row_sharded"`` and gives the full shape) becomes a ``DTensor`` on the 1-D mesh of all ranks,
``Shard(0)``: rank r's rows ``[r * chunk, (r + 1) * chunk)`` are exactly the split ``Shard(0)``
makes, so DCP knows each rank's offset and reshards on load. Optimizer state whose first
dimension is the parameter's local rows is placed the same way; everything else is replicated.

A disk-tiered table's rows are its store's: each rank commits its store and the checkpoint holds the
commit, ``<module>.tables.<table>.tier`` = ``[store uid, generation]`` per rank (a ``[ranks, 2]``
tensor, one row per rank), which loading returns each rank's store to (`restore_tiers`). Its cache
Parameter (and the cache slots' optimizer state) is the rank's own (placement ``"rank_local"``):
written and read back per rank. Loaded into another number of ranks (one process included), the
stores are resharded instead (`tier_reshards`, `EmbeddingBagCollection.reshard_tier`): each rank's new
store is filled from the old ones' commits, and the cache slots (emptied) and their optimizer state are
not read (zeros: the rows' state is in the store).
"""
from __future__ import annotations

import torch
from torch import nn

from ..nn import EmbeddingBagCollection, HashEmbedding
from ..optim import CombinedOptimizer

_SCALARS = {bool: "bool", int: "int", float: "float"}


# ----- the network -----
def network_tensors(owner: str, network: nn.Module, mesh, empty: bool = False,
                    reshard: dict[str, int] | None = None) -> dict[str, torch.Tensor]:
    """``{name: tensor}`` of every parameter and persistent buffer (this rank's rows when sharded).

    `empty`: fresh tensors of the same placement to load into, instead of the network's own;
    `reshard` (`tier_reshards`): the tier commits to read whole, every saving rank's.
    """
    _refuse_custom_state(owner, network)
    # A HashEmbedding's tensors go through _hash_state (its shards are per-rank tables).
    hashed = {id(t) for m in network.modules() if isinstance(m, HashEmbedding) for t in [*m.parameters(), *m.buffers()]}
    tensors = {}
    for name, p in network.named_parameters():
        if id(p) in hashed:
            continue
        local = torch.empty_like(p) if empty else p.detach()
        tensors[name] = _placed(local, p, mesh)
    tensors.update(_tier_tensors(network, mesh, empty, reshard or {}))
    skipped = hashed | {id(b) for m in network.modules() if isinstance(m, EmbeddingBagCollection) for b in m.buffers()}
    for prefix, module in network.named_modules():
        for name, b in module.named_buffers(recurse=False):
            if b is None or id(b) in skipped or name in module._non_persistent_buffers_set:
                continue
            tensors[f"{prefix}.{name}" if prefix else name] = torch.empty_like(b) if empty else b.detach()
    return tensors


def _tiered(network: nn.Module) -> dict[str, tuple[EmbeddingBagCollection, str]]:
    """``{checkpoint key: (collection, table)}`` of every disk-tiered table's commit entry."""
    return {f"{prefix}.tables.{t.name}.tier" if prefix else f"tables.{t.name}.tier": (m, t.name)
            for prefix, m in network.named_modules() if isinstance(m, EmbeddingBagCollection)
            for t in m.tables if t.tier is not None}


def _tier_tensors(network: nn.Module, mesh, empty: bool, reshard: dict[str, int]) -> dict[str, torch.Tensor]:
    """Each tiered table's commit (this rank's store committed now), a ``[1, 2]`` row of ``[ranks, 2]``
    (a resharded one's: ``[saving ranks, 2]`` whole, on every rank)."""
    out, commits = {}, {}
    for key, (m, name) in _tiered(network).items():
        if key in reshard:
            out[key] = torch.empty(reshard[key], 2, dtype=torch.int64)
            continue
        if not empty and id(m) not in commits:
            commits[id(m)] = m.tier_commits()
        local = torch.empty(1, 2, dtype=torch.int64) if empty else commits[id(m)][name].view(1, 2)
        if mesh is None or m.tier_shards == 1:
            out[key] = local
            continue
        from torch.distributed.tensor import DTensor, Shard
        out[key] = DTensor.from_local(local, mesh, [Shard(0)], run_check=False, shape=torch.Size([m.tier_shards, 2]),
                                      stride=(2, 1))
    return out


def tier_reshards(network: nn.Module, saved) -> dict[str, int]:
    """``{commit key: saving ranks}`` of the tiered tables saved by another number of ranks than hold
    them now: their stores are resharded (`restore_tiers`)."""
    out = {}
    for key, (m, _) in _tiered(network).items():
        meta = saved.get(f"model.{key}")
        if meta is not None and int(meta.size[0]) != m.tier_shards:  # a missing one: reported as missing
            out[key] = int(meta.size[0])
    return out


def resharded_caches(network: nn.Module, reshard: dict[str, int]) -> dict[str, nn.Parameter]:
    """``{parameter name: cache Parameter}`` of the collections with a resharded tier: their cache
    slots, emptied by the reshard, are not read from the checkpoint."""
    resharded = {id(_tiered(network)[key][0]) for key in reshard}
    out = {}
    for prefix, m in network.named_modules():
        if id(m) in resharded:
            caches = {id(p) for p in m.tier_cache_parameters()}
            for name, p in m.named_parameters():
                if id(p) in caches:
                    out[f"{prefix}.{name}" if prefix else name] = p
    return out


def cache_state_fills(network: nn.Module, optimizer, doc: dict, caches: dict, templates: dict) -> dict[str, tuple]:
    """Take the per-slot optimizer state of the `caches` out of `templates`; ``{key: local shape}`` of
    the zeros that stand for it (the rows' state is in the resharded store, read when a row is cached)."""
    fills = {}
    for path, _ in _leaves(optimizer):
        for name, entries in doc[path]["state"].items():
            if name not in caches:
                continue
            p = caches[name]
            for key in entries:
                k = _state_key(path, name, key)
                t = templates.get(k)
                if t is not None and t.dim() >= 1:  # per slot, not a scalar (a step count)
                    fills[k] = (p.shape[0], *t.shape[1:])
                    del templates[k]
    return fills


def restore_tiers(network: nn.Module, loaded: dict[str, torch.Tensor], directory: str,
                  reshard: dict[str, int]) -> None:
    """Take the tiered tables' commit entries out of `loaded` (``model.``-less keys) and return each
    rank's stores to them, or reshard them into this run's stores (`reshard`; collective); a
    ValueError naming the table and store if one cannot be."""
    for key, (m, name) in _tiered(network).items():
        value = loaded.pop(key)
        local = value.to_local() if hasattr(value, "to_local") else value
        if key in reshard:
            m.reshard_tier(name, local.clone(), f"{directory!r}: {key}")
            continue
        m.restore_tier_commits({name: local.reshape(2).clone()}, f"{directory!r}:")


def _refuse_custom_state(owner: str, network: nn.Module) -> None:
    """Modules that save more than their parameters and buffers (a hash table's key map) are not
    covered here: their state would be lost silently."""
    for name, module in network.named_modules():
        if isinstance(module, EmbeddingBagCollection):
            continue  # its lookup buffers derive from its configuration
        if isinstance(module, HashEmbedding):
            continue  # its tensors, and a disk tier's commit, go through _hash_state
        custom = type(module)._save_to_state_dict is not nn.Module._save_to_state_dict or \
            type(module).get_extra_state is not nn.Module.get_extra_state
        if custom:
            raise ValueError(f"{owner}: module {name or '<network>'!r} ({type(module).__name__}) keeps state "
                             "beyond its parameters and buffers, which sharded checkpoints do not hold yet; "
                             "use recstream.checkpoint.save_checkpoint on one process")


def _sharded_rows(p: torch.Tensor) -> int | None:
    """The full number of rows of a row-sharded parameter, None for a replicated one."""
    layout = getattr(p, "recstream_layout", None)
    if layout is None or layout.get("placement") not in ("row_sharded", "key_sharded", "rank_local"):
        return None
    return int(layout["shape"][0])


def _placed(local: torch.Tensor, p: torch.Tensor, mesh) -> torch.Tensor:
    """`local` as a DTensor sharded on rows when it holds `p`'s local rows of a sharded table."""
    rows = _sharded_rows(p)
    if mesh is None or rows is None or local.dim() == 0 or local.shape[0] != p.shape[0]:
        return local
    from torch.distributed.tensor import DTensor, Shard
    shape = torch.Size([rows, *local.shape[1:]])
    return DTensor.from_local(local.contiguous(), mesh, [Shard(0)], run_check=False, shape=shape,
                              stride=_contiguous_stride(shape))


def _contiguous_stride(shape: torch.Size) -> tuple[int, ...]:
    stride, step = [], 1
    for size in reversed(shape):
        stride.append(step)
        step *= max(size, 1)
    return tuple(reversed(stride))


# ----- the optimizer -----
def _leaves(optimizer, path: str = "") -> list[tuple[str, torch.optim.Optimizer]]:
    """Every optimizer that holds state itself, with its path (`CombinedOptimizer` children by name)."""
    if isinstance(optimizer, CombinedOptimizer):
        return [leaf for name, child in optimizer.optimizers.items() for leaf in _leaves(child, f"{path}{name}.")]
    return [(path, optimizer)]


def _param_names(owner: str, network: nn.Module, optimizer) -> dict[int, str]:
    names = {id(p): n for n, p in network.named_parameters()}
    for _, leaf in _leaves(optimizer):
        for group in leaf.param_groups:
            for p in group["params"]:
                if id(p) not in names:
                    raise ValueError(f"{owner}: the optimizer updates a parameter of shape {tuple(p.shape)} "
                                     "that is not one of the network's")
    return names


def _state_key(path: str, name: str, key: str) -> str:
    return f"optim.{path}{name}.{key}"


def optimizer_tensors(owner: str, network: nn.Module, optimizer, mesh) -> dict[str, torch.Tensor]:
    """``{key: tensor}`` of every tensor and number in the optimizer's per-parameter state."""
    names = _param_names(owner, network, optimizer)
    tensors = {}
    for path, leaf in _leaves(optimizer):
        for group in leaf.param_groups:
            for p in group["params"]:
                for key, value in leaf.state.get(p, {}).items():
                    if isinstance(value, torch.Tensor):
                        tensors[_state_key(path, names[id(p)], key)] = _placed(value.detach(), p, mesh)
                    elif type(value) in _SCALARS:
                        tensors[_state_key(path, names[id(p)], key)] = torch.tensor(value)
    return tensors


def optimizer_doc(owner: str, network: nn.Module, optimizer) -> dict:
    """The JSON part: each group's hyper-parameters and parameter names, and what each state entry is."""
    names = _param_names(owner, network, optimizer)
    doc = {}
    for path, leaf in _leaves(optimizer):
        groups, state = [], {}
        for i, group in enumerate(leaf.param_groups):
            hyper = {k: _json_hyper(owner, path, i, k, v) for k, v in group.items() if k != "params"}
            groups.append({**hyper, "params": [names[id(p)] for p in group["params"]]})
            for p in group["params"]:
                entries = leaf.state.get(p, {})
                if entries:
                    state[names[id(p)]] = {k: _kind(owner, path, names[id(p)], k, v) for k, v in entries.items()}
        doc[path] = {"param_groups": groups, "state": state}
    return doc


def _json_hyper(owner: str, path: str, i: int, key: str, value):
    if isinstance(value, torch.Tensor) and value.dim() == 0:
        value = value.item()  # once per save, not per step
    if isinstance(value, tuple):
        value = list(value)
    if not isinstance(value, (bool, int, float, str, list, type(None))):
        raise TypeError(f"{owner}: optimizer {path or '<root>'!r} group {i} hyper-parameter {key!r} is a "
                        f"{type(value).__name__}, which a checkpoint cannot hold as JSON")
    return value


def _kind(owner: str, path: str, name: str, key: str, value):
    if isinstance(value, torch.Tensor):
        return "tensor"
    if type(value) in _SCALARS:
        return _SCALARS[type(value)]
    if value is None or isinstance(value, (str, list)):
        return {"json": value}
    raise TypeError(f"{owner}: optimizer state {path}{name}.{key} is a {type(value).__name__}, which a "
                    "checkpoint cannot hold")


def optimizer_templates(owner: str, directory: str, network: nn.Module, optimizer, doc: dict, saved,
                        mesh) -> dict[str, torch.Tensor]:
    """Empty tensors, placed for this run's sharding, for every tensor entry the checkpoint holds."""
    names = _param_names(owner, network, optimizer)
    params = dict(network.named_parameters())
    leaves = dict(_leaves(optimizer))
    if sorted(leaves) != sorted(doc):
        raise ValueError(f"{owner}: {directory!r} holds optimizers {sorted(doc)}, this one has {sorted(leaves)}")
    templates = {}
    for path, leaf in leaves.items():
        groups = [[names[id(p)] for p in g["params"]] for g in leaf.param_groups]
        saved_groups = [g["params"] for g in doc[path]["param_groups"]]
        if groups != saved_groups:
            raise ValueError(f"{owner}: {directory!r}: optimizer {path or '<root>'!r} has parameter groups "
                             f"{saved_groups}, this one {groups}")
        for name, entries in doc[path]["state"].items():
            p = params[name]
            for key, kind in entries.items():
                if isinstance(kind, dict):
                    continue  # JSON, in the doc itself
                meta = saved[_state_key(path, name, key)]
                size, rows = list(meta.size), _sharded_rows(p)
                per_row = rows is not None and len(size) > 0 and size[0] == rows
                if per_row:  # this rank's rows of it
                    size[0] = p.shape[0]
                empty = torch.empty(size, dtype=meta.properties.dtype, device=p.device)
                templates[_state_key(path, name, key)] = _placed(empty, p, mesh) if per_row else empty
    return templates


def assemble_optimizer_state(network: nn.Module, optimizer, doc: dict, loaded: dict, path: str = "") -> dict:
    """The state dict `optimizer.load_state_dict` takes, built from the loaded tensors and the doc."""
    if isinstance(optimizer, CombinedOptimizer):
        return {"optimizers": {name: assemble_optimizer_state(network, child, doc, loaded, f"{path}{name}.")
                               for name, child in optimizer.optimizers.items()}}
    names = {id(p): n for n, p in network.named_parameters()}
    leaf_doc = doc[path]
    groups, state, index = [], {}, 0
    for group, saved in zip(optimizer.param_groups, leaf_doc["param_groups"], strict=True):
        hyper = {k: tuple(v) if isinstance(group.get(k), tuple) and isinstance(v, list) else v
                 for k, v in saved.items() if k != "params"}
        groups.append({**hyper, "params": list(range(index, index + len(group["params"])))})
        for p in group["params"]:
            entries = leaf_doc["state"].get(names[id(p)])
            if entries:
                state[index] = {k: _value(kind, loaded.get(_state_key(path, names[id(p)], k)))
                                for k, kind in entries.items()}
            index += 1
    return {"state": state, "param_groups": groups}


def _value(kind, tensor):
    if isinstance(kind, dict):
        return kind["json"]
    if kind == "tensor":
        return tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return {"bool": bool, "int": int, "float": float}[kind](tensor.item())  # once per load
