"""Sharded checkpoints on `torch.distributed.checkpoint` (DCP): each rank writes its own rows.

`save_sharded(directory, network, optimizer, extra)` and `load_sharded(directory, network,
optimizer)` are collectives: every rank of the process group calls them (in a plain process they
work alone). The checkpoint loads into any number of ranks, sharded or not: rows written by 2
ranks load into 1 process (for serving or `ModelPublisher`) or into 3 shards, each rank reading
only the rows it owns, with their optimizer state.

What is written, in the directory:

- one safetensors file per rank (DCP's ``HuggingFaceStorageWriter``): a row-sharded table (an
  `EmbeddingBagCollection` after ``shard_rows_``) goes in as a ``DTensor`` sharded on dim 0, so
  each rank writes its rows with their offset in the full table; replicated parameters and
  buffers are written once. Keys: ``model.<parameter name>`` (fused tables as stored, padding
  row included) and ``optim.<optimizer path>.<parameter name>.<state key>``;
- the optimizer state of each parameter: per-row tensors (LazyAdam's moments, RowWiseAdagrad's
  sums, FTRL's accumulators) are sharded exactly as their parameter; scalars (``step``) are
  stored as 0-d tensors;
- every `HashEmbedding`'s tables (``hash.<module>.<tensor>``): each rank writes its key shard
  whole; loading into other ranks or one process rebuilds the tables by key (`recstream.checkpoint._hash_state`);
  a disk-tiered one holds each rank's store commit instead of its rows, and its stores are resharded the same way;
- ``recstream_checkpoint.json``, written by rank 0 last: the optimizer's hyper-parameters and
  parameter groups, and every rank's `extra` (JSON values: step counters, stream positions), in
  rank order.

Nothing is pickled: safetensors and JSON only (DCP's default file format pickles its metadata).

Atomicity: the ranks write into ``<directory>.partial``; once every rank finished (DCP's save
returns after its finish step, then a barrier), rank 0 writes the JSON file, fsyncs, and renames
the directory into place. A crash mid-write leaves at most a ``.partial`` directory (cleared by
the next save of that name): the previous checkpoint stays the newest complete one, and
`is_complete` tells complete checkpoints from the rest. Saving over a checkpoint of the same
name moves the old one to ``<directory>.old`` before the rename and removes it after.

Optimizer state is rebuilt from the stored tensors and handed to the optimizer's own
``load_state_dict`` (`CombinedOptimizer` children by name); no step is taken to create it
(DCP's ``set_optimizer_state_dict`` first steps with zero gradients and a zero learning rate,
which for FTRL rewrites the weights from its still empty state).

>>> import tempfile, torch
>>> net = torch.nn.Linear(3, 1)
>>> opt = torch.optim.Adam(net.parameters(), lr=0.1)
>>> net(torch.ones(2, 3)).sum().backward(); opt.step()
>>> path = tempfile.mkdtemp() + "/step-1"
>>> save_sharded(path, net, opt, extra={"step": 1})
>>> is_complete(path)
True
>>> fresh = torch.nn.Linear(3, 1)
>>> fresh_opt = torch.optim.Adam(fresh.parameters(), lr=0.5)
>>> load_sharded(path, fresh, fresh_opt)  # every saving rank's extra, in rank order
[{'step': 1}]
>>> torch.equal(fresh.weight, net.weight), fresh_opt.param_groups[0]["lr"]
(True, 0.1)
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import warnings

import torch
import torch.distributed as dist
from torch.optim import Optimizer

from ..atomic import fsync_dir, fsync_file
from ..distributed import is_distributed, rank, world_size
from ..validation import check_module, check_type
from ._hash_state import (
    full_optimizer_templates,
    hash_doc,
    hash_templates,
    hash_tensors,
    load_hash_state,
    plan_hash_loads,
    remap_optimizer_rows,
    resharded_hash_caches,
)
from ._sharded_state import (
    assemble_optimizer_state,
    cache_state_fills,
    network_tensors,
    optimizer_doc,
    optimizer_templates,
    optimizer_tensors,
    resharded_caches,
    restore_tiers,
    tier_reshards,
)
from .file_format import CheckpointError

__all__ = ["save_sharded", "load_sharded", "is_complete", "META_FILE", "PARTIAL_SUFFIX"]

META_FILE = "recstream_checkpoint.json"
PARTIAL_SUFFIX = ".partial"
FORMAT = "recstream.sharded_checkpoint/1"
_MESHES: dict = {}


def is_complete(directory: str | os.PathLike) -> bool:
    """Whether `directory` holds a complete sharded checkpoint (every rank wrote, rank 0 renamed)."""
    path = os.fspath(directory).rstrip(os.sep)
    return not path.endswith(PARTIAL_SUFFIX) and os.path.isfile(os.path.join(path, META_FILE))


def _dcp():
    """``torch.distributed.checkpoint`` and its safetensors reader/writer, imported on first use: the
    import takes ~0.7 s (a third of ``import recstream.train``), paid by every script and CLI
    command, most of which never write a sharded checkpoint."""
    import torch.distributed.checkpoint as dcp

    return dcp, (dcp.HuggingFaceStorageReader, dcp.HuggingFaceStorageWriter)


def save_sharded(directory: str | os.PathLike, network: torch.nn.Module, optimizer: Optimizer | None = None,
                 extra=None) -> None:
    """Write `network` (and `optimizer`) to `directory`, each rank its own shard (collective).

    `extra`: this rank's JSON value (e.g. ``{"step": 100, "offsets": {...}}``); the checkpoint
    keeps every rank's. An existing checkpoint of that name is replaced atomically.
    """
    owner = "save_sharded"
    target = _check_args(owner, directory, network, optimizer)
    network = _unwrap(network)
    _check_json(owner, "extra", extra)
    if target.endswith(PARTIAL_SUFFIX):
        raise ValueError(f"{owner}: 'directory' must not end with {PARTIAL_SUFFIX!r} (the name of unfinished "
                         f"saves), got {os.fspath(directory)!r}")
    partial = target + PARTIAL_SUFFIX
    state = {f"model.{k}": v for k, v in network_tensors(owner, network, _mesh()).items()}
    doc = {"format": FORMAT, "world_size": world_size(), "model": sorted(state), "hash": hash_doc(network)}
    state.update(hash_tensors(network, doc["hash"], _mesh()))
    if optimizer is not None:
        state.update(optimizer_tensors(owner, network, optimizer, _mesh()))
        doc["optimizer"] = optimizer_doc(owner, network, optimizer)
    doc["extra"] = _gather_extras(owner, extra, doc.get("optimizer"))
    _on_rank_zero(owner, lambda: _fresh_dir(partial))
    dcp, (_, HuggingFaceStorageWriter) = _dcp()
    with _single_process_quiet():
        dcp.save(state, storage_writer=HuggingFaceStorageWriter(partial, save_distributed=True),
                 no_dist=not is_distributed())
    _on_rank_zero(owner, lambda: _publish(partial, target, doc))


def load_sharded(directory: str | os.PathLike, network: torch.nn.Module, optimizer: Optimizer | None = None) -> list:
    """Load a checkpoint of `save_sharded` into `network` (and `optimizer`), on any number of ranks.

    Collective. Each rank reads the rows its tables hold now (all of them when not sharded).
    Returns every saving rank's `extra`, in their rank order (the list's length is the number
    of ranks that saved, which may differ from this run's).
    """
    owner = "load_sharded"
    path = _check_args(owner, directory, network, optimizer)
    network = _unwrap(network)
    if not is_complete(path):
        raise FileNotFoundError(f"{owner}: {path!r} is not a complete sharded checkpoint (no {META_FILE}; "
                                "a save that did not finish leaves only a '.partial' directory)")
    dcp, (HuggingFaceStorageReader, _) = _dcp()
    try:  # everything is read and checked before the network changes; any problem is the file's
        doc = _read_doc(owner, path)
        state, model, direct, reshard, fills = _templates(owner, path, network, optimizer, doc)
        with _single_process_quiet():
            dcp.load(state, storage_reader=HuggingFaceStorageReader(path), no_dist=not is_distributed())
        state.update({key: torch.zeros(shape) for key, shape in fills.items()})
        plans = plan_hash_loads(network, state, direct, doc.get("hash", {}))  # do the keys fit?
    except CheckpointError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError, IndexError, RecursionError,
            dcp.CheckpointException) as e:  # CheckpointException (a BaseException): a corrupt shard file
        raise CheckpointError(f"{owner}: {path!r} cannot be loaded: {e}") from e
    restore_tiers(network, model, path, reshard)  # each rank's stores back to the commits saved, or resharded
    _copy_into(network, model)
    moves = load_hash_state(network, state, direct, doc.get("hash", {}), plans)
    if optimizer is not None:
        remap_optimizer_rows(network, doc["optimizer"], state, moves)
        optimizer.load_state_dict(assemble_optimizer_state(network, optimizer, doc["optimizer"], state))
    return doc["extra"]


# ----- helpers -----
def _read_doc(owner: str, path: str) -> dict:
    meta = os.path.join(path, META_FILE)
    try:
        with open(meta, encoding="utf-8") as f:
            doc = json.load(f)
    except (ValueError, RecursionError) as e:  # not JSON, not UTF-8, nested too deep
        raise CheckpointError(f"{owner}: {meta!r} is corrupt: {e}") from e
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        found = doc.get("format") if isinstance(doc, dict) else f"a {type(doc).__name__}"
        raise CheckpointError(f"{owner}: {meta!r} has format {found!r}, expected {FORMAT!r}")
    return doc


def _templates(owner: str, path: str, network, optimizer, doc: dict) -> tuple[dict, dict, dict, dict, dict]:
    """The tensors DCP loads into (checked against the files' shapes), the network's part of them,
    per HashEmbedding whether it reads its own shard back (`hash_templates`), the tiered tables to
    reshard (`tier_reshards`) and the zeros standing for their cache slots' optimizer state."""
    _, (HuggingFaceStorageReader, _) = _dcp()
    saved = HuggingFaceStorageReader(path).read_metadata().state_dict_metadata  # shapes from the headers
    reshard = tier_reshards(network, saved)
    model = network_tensors(owner, network, _mesh(), empty=True, reshard=reshard)
    _check_keys(owner, path, "model", sorted(f"model.{k}" for k in model), doc["model"], saved)
    caches = resharded_caches(network, reshard)  # emptied by the reshard: not read
    model = {k: v for k, v in model.items() if k not in caches}
    state = {f"model.{k}": v for k, v in model.items()}
    hashed, direct = hash_templates(owner, path, network, doc.get("hash", {}), saved, _mesh())
    state.update(hashed)
    caches.update(resharded_hash_caches(network, direct))  # resharded tiered HashEmbeddings' caches: not read
    fills = {}
    if optimizer is not None:
        if "optimizer" not in doc:
            raise ValueError(f"{owner}: {path!r} holds no optimizer state; load without an optimizer")
        templates = optimizer_templates(owner, path, network, optimizer, doc["optimizer"], saved, _mesh())
        full_optimizer_templates(network, doc["optimizer"], direct, templates, saved)
        fills = cache_state_fills(network, optimizer, doc["optimizer"], caches, templates)
        state.update(templates)
    for key, value in state.items():
        _check_shape(owner, path, key, value, saved)
    return state, model, direct, reshard, fills


def _check_args(owner: str, directory, network, optimizer) -> str:
    check_type(owner, "directory", directory, (str, os.PathLike))
    check_module(owner, "network", network)
    check_type(owner, "optimizer", optimizer, Optimizer, allow_none=True)
    return os.path.abspath(os.fspath(directory)).rstrip(os.sep)


def _unwrap(network: torch.nn.Module) -> torch.nn.Module:
    """The user's network inside a DistributedDataParallel wrapper (names without ``module.``)."""
    return network.module if isinstance(network, torch.nn.parallel.DistributedDataParallel) else network


def _check_json(owner: str, name: str, value) -> None:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{owner}: '{name}' must be a JSON value (dict, list, str, number, bool, None), "
                        f"got {type(value).__name__}: {exc}") from None


def _gather_extras(owner: str, extra, optimizer: dict | None) -> list:
    """Every rank's `extra`, in rank order; checks that all ranks hold the same optimizer entries
    (rank 0 writes the JSON part for all)."""
    if not is_distributed():
        return [extra]
    gathered = [None] * world_size()
    dist.all_gather_object(gathered, (extra, optimizer))  # in memory only: small JSON values
    differing = [r for r, (_, other) in enumerate(gathered) if other != optimizer]
    if differing:
        raise ValueError(f"{owner}: ranks {differing} hold other optimizer groups or state entries than rank "
                         f"{rank()} (did every rank take the same optimizer steps?)")
    return [e for e, _ in gathered]


@contextlib.contextmanager
def _single_process_quiet():
    """DCP warns on every single-process save and load that it assumes a single process; it is one."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        yield


def _mesh():
    """The 1-D device mesh of all ranks (DTensor placement of row shards); None on one process."""
    if not is_distributed():
        return None
    from torch.distributed.device_mesh import init_device_mesh
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    key = (id(dist.group.WORLD), device)  # one mesh per process group, not one per save
    if key not in _MESHES:
        _MESHES[key] = init_device_mesh(device, (world_size(),))
    return _MESHES[key]


def _on_rank_zero(owner: str, action) -> None:
    """Run `action` on rank 0; every rank returns once it is done, or raises if it failed there."""
    error = None
    if rank() == 0:
        try:
            action()
        except Exception as exc:  # noqa: BLE001 - re-raised on every rank below
            error = f"{type(exc).__name__}: {exc}"
            if not is_distributed():
                raise
    if is_distributed():
        box = [error]
        dist.broadcast_object_list(box, src=0)
        error = box[0]
    if error is not None:
        raise RuntimeError(f"{owner}: rank 0 failed: {error}")


def _fresh_dir(path: str) -> None:
    if os.path.lexists(path):
        shutil.rmtree(path)  # a save that crashed earlier
    os.makedirs(path)


def _publish(partial: str, target: str, doc: dict) -> None:
    """Write the JSON file last, make everything durable, rename the directory into place."""
    meta = os.path.join(partial, META_FILE)
    with open(meta, "w", encoding="utf-8") as f:
        json.dump(doc, f)
        f.flush()
        os.fsync(f.fileno())
    for name in os.listdir(partial):  # DCP fsyncs its files; the directory entries need it too
        fsync_file(os.path.join(partial, name))
    fsync_dir(partial)
    old = target + ".old"
    if os.path.lexists(target):  # replace an older checkpoint of the same name
        if os.path.lexists(old):
            shutil.rmtree(old)
        os.replace(target, old)
    os.replace(partial, target)
    fsync_dir(os.path.dirname(target))
    if os.path.lexists(old):
        shutil.rmtree(old)



def _check_keys(owner: str, path: str, what: str, wanted: list[str], listed: list[str], saved) -> None:
    missing = [k for k in wanted if k not in saved]
    unexpected = [k for k in listed if k not in wanted]
    if missing or unexpected:
        raise ValueError(f"{owner}: {path!r} does not match this {what}: missing {missing[:10]}, "
                         f"unexpected {unexpected[:10]}")


def _check_shape(owner: str, path: str, key: str, value: torch.Tensor, saved) -> None:
    if key not in saved:
        raise ValueError(f"{owner}: {path!r} lists {key} but none of its files holds it")
    size = saved[key].size
    if tuple(value.shape) != tuple(size):
        raise ValueError(f"{owner}: {path!r}: {key} has shape {tuple(size)} in the checkpoint, "
                         f"{tuple(value.shape)} here")


def _copy_into(network: torch.nn.Module, loaded: dict[str, torch.Tensor]) -> None:
    """Copy the loaded tensors into the network's parameters and buffers (this rank's rows)."""
    tensors = dict(network.named_parameters())
    tensors.update(network.named_buffers())
    with torch.no_grad():
        for name, value in loaded.items():
            local = value.to_local() if hasattr(value, "to_local") else value
            tensors[name].copy_(local)

