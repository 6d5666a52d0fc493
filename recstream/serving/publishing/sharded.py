"""Publishing a network sharded over ranks (``hybrid_parallel``): one version of the whole model.

Under ``hybrid_parallel`` a rank holds only its rows of each `EmbeddingBagCollection` table and
only its keys of each `HashEmbedding`, so no rank alone can publish the model. `prepare_sharded`
is a collective (every rank calls it at the same step) that takes the version a single process
holding every row would take:

1. rank 0 plans: it reads the directory and decides the version's number and whether it is full
   (a delta continues rank 0's chain); one all-reduce tells every rank, together with whether any
   rank failed so far (a diverged loss, rank 0's unreadable directory);
2. every rank joins the gathers of the dense state (``state_dict()`` all-gathers the row-sharded
   tables, disk-tiered ones through `materialized_tiers`) and of the rebuild check;
3. every rank exports its keys' rows of each `HashEmbedding` (``export()`` or ``export_delta()``,
   as rank 0 decided; the keys are disjoint, each on the rank `owner_of` names). A delta holding as
   much as a full version becomes a full one, decided on the sizes summed over the ranks, and then
   every rank exports in full. The rows are gathered to rank 0, sorted by key;
4. rank 0 assembles the version and checks it finite; a last all-reduce agrees on the outcome.

At every agreement, a failure on any rank becomes every rank's, so no rank waits alone in a later
collective: a `DivergenceError` (a non-finite loss or row on any rank) raises on every rank; any
other failure raises on the rank that had it and `ShardedPublishError` on the others. Only rank 0
gets a `PreparedVersion` (to write; the others get None): rank 0 alone touches the directory.

In a plain process (and under ``data_parallel``, where every rank holds the whole model) it is
`SnapshotWriter.prepare`:

>>> import tempfile, torch
>>> from recstream.nn import HashEmbedding
>>> net = torch.nn.ModuleDict({"emb": HashEmbedding(2, capacity=8)})
>>> _ = net["emb"](torch.tensor([1, 2]))
>>> w = SnapshotWriter(tempfile.mkdtemp())
>>> prepared = prepare_sharded(w, net)
>>> w.write(prepared)["kind"], prepared.manifest["hash_embeddings"]["emb"]["rows"]
('full', 2)
"""
from __future__ import annotations

import math
import time

import torch
import torch.distributed as dist
from torch import nn

from ...callbacks import DivergenceError
from ...distributed.context import is_distributed, rank, world_size
from ...nn.tier_export import check_tiers_fit
from ..snapshot.state_split import hash_embeddings
from .publish import PreparedVersion, SnapshotWriter, _check_publish_args, _full_bytes, _nbytes

__all__ = ["ShardedPublishError", "agree_failures", "gather_rows", "prepare_sharded"]

_OK, _FAILED, _DIVERGED = 0, 1, 2


class ShardedPublishError(RuntimeError):
    """Publishing a sharded network failed on another rank (its log and exception say why)."""


def _device() -> str:
    return "cuda" if dist.get_backend() == "nccl" else "cpu"  # NCCL reduces device tensors only


def agree_failures(error: BaseException | None, what: str, payload: list[int] | None = None) -> list[int]:
    """Collective: every rank learns whether any failed; returns the sums of `payload` over the ranks.

    One all-reduce of ``world_size + len(payload)`` integers. If any rank's `error` is set, every rank
    raises: its own `error`, else `DivergenceError` when some rank diverged, else `ShardedPublishError`
    (both naming the ranks and `what`).
    """
    payload = list(payload or [])
    if not is_distributed():
        if error is not None:
            raise error
        return payload
    w = world_size()
    flags = torch.zeros(w + len(payload), dtype=torch.int64, device=_device())
    flags[rank()] = _OK if error is None else _DIVERGED if isinstance(error, DivergenceError) else _FAILED
    if payload:
        flags[w:] = torch.tensor(payload, dtype=torch.int64)
    dist.all_reduce(flags)
    values = flags.tolist()
    kinds, sums = values[:w], values[w:]
    if error is not None:
        raise error
    diverged = [r for r, k in enumerate(kinds) if k == _DIVERGED]
    if diverged:
        raise DivergenceError(f"training diverged on rank(s) {diverged} (a non-finite loss or weight); refusing "
                              f"to {what}; the newest checkpoint on disk is the last good one: restore it and "
                              "lower the learning rate")
    failed = [r for r, k in enumerate(kinds) if k == _FAILED]
    if failed:
        raise ShardedPublishError(f"could not {what}: it failed on rank(s) {failed} (see that rank's log)")
    return sums


def gather_rows(rows: dict[str, torch.Tensor]) -> dict[str, torch.Tensor] | None:
    """Collective: the concatenation over the ranks (in rank order) of each tensor of `rows` (the same
    names on every rank, any number of rows each), at rank 0; None on the other ranks."""
    if not is_distributed():
        return dict(rows)
    w, me, device = world_size(), rank(), _device()
    names = sorted(rows)
    counts = torch.tensor([rows[n].shape[0] for n in names], dtype=torch.int64, device=device)
    every = [torch.empty_like(counts) for _ in range(w)]
    dist.all_gather(every, counts)
    sizes = torch.stack(every).tolist()  # [rank][name]
    out = {}
    for i, name in enumerate(names):
        t = rows[name].detach().to(device)
        longest = max(s[i] for s in sizes)
        padded = t.new_zeros((longest,) + tuple(t.shape[1:]))
        padded[: t.shape[0]] = t
        parts = [torch.empty_like(padded) for _ in range(w)] if me == 0 else None
        dist.gather(padded, parts, dst=0)
        if me == 0:
            out[name] = torch.cat([p[: s[i]] for p, s in zip(parts, sizes, strict=True)]).cpu()
    return out if me == 0 else None


def _sorted_union(rows: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The gathered rows ordered by key (the deletes too): one file whatever the number of ranks."""
    order = torch.argsort(rows["keys"], stable=True)
    out = {k: v.index_select(0, order) for k, v in rows.items() if k != "evicted_keys"}
    if "evicted_keys" in rows:
        out["evicted_keys"] = torch.sort(rows["evicted_keys"]).values
    return out


def prepare_sharded(writer: SnapshotWriter, network: nn.Module, step: int | None = None, epoch: int | None = None,
                    max_event_time: float | None = None, full: bool = False, copy: bool = False,
                    checkpoint_step: int | None = None, error: BaseException | None = None
                    ) -> PreparedVersion | None:
    """The version of the whole `network` (collective, see the module docstring): rank 0's to write,
    None on the other ranks. `error`: this rank's failure found before (e.g. a diverged loss), agreed
    on with the others' first. Arguments as `SnapshotWriter.prepare`."""
    if not is_distributed():
        if error is not None:
            raise error
        return writer.prepare(network, step, epoch, max_event_time, full, copy, checkpoint_step)
    taken = time.time()
    lead = rank() == 0
    version = 0
    if error is None:
        try:
            step, epoch, max_event_time, checkpoint_step = _check_publish_args(network, step, epoch, max_event_time,
                                                                               full, checkpoint_step)
            if lead:
                version, full = writer.plan(network, full)
        except Exception as e:
            error = e
    what = f"publish a version to {writer.directory!r}"
    version, full = agree_failures(error, what, [version, int(full) if lead else 0])
    full = bool(full)
    max_event_time = _newest(max_event_time)  # each rank saw its own events
    manifest = None
    try:
        manifest = writer.manifest(network, version, full, step, epoch, max_event_time, checkpoint_step, taken)
        # Once per writer, on every rank alike: its shapes read the state, the sharded tables' gathers.
        writer.check_rebuild(network, manifest, version)
        # refused on one rank inside the gathers below, it would leave the others waiting in them
        check_tiers_fit(network, f"state of {type(network).__name__}")
    except Exception as e:
        error = e
    agree_failures(error, what)
    files = writer.dense_files(network, copy and lead)  # every rank: the gathers
    tables_of = hash_embeddings(network)
    rows_of, full = _export(tables_of, full, what)
    # a key-sharded table's rows are the union of the ranks' (disjoint keys); another is whole on every rank
    union = {path: gather_rows(rows) if tables_of[path].sharded else rows for path, rows in rows_of.items()}
    prepared = None
    if lead:
        try:
            prepared = writer.finish(version, full, manifest, files,
                                     {p: _sorted_union(rows) for p, rows in union.items()})
        except Exception as e:
            error = e
    agree_failures(error, what)
    return prepared


def _newest(event_time: float | None) -> float | None:
    """The newest of the ranks' event times (collective; None where no rank has one)."""
    value = torch.tensor([-math.inf if event_time is None else float(event_time)], dtype=torch.float64,
                         device=_device())
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    newest = value.item()
    return None if newest == -math.inf else newest


def _export(tables_of: dict, full: bool, what: str) -> tuple[dict, bool]:
    """This rank's rows of every HashEmbedding of `tables_of` (full or delta, as agreed) and whether they
    are full: a delta as large as a full version on all ranks together is exported in full on every rank."""
    error = None
    try:
        rows_of = {path: emb.export() if full else emb.export_delta() for path, emb in tables_of.items()}
        sizes = [sum(_nbytes(r) for r in rows_of.values()),
                 sum(_full_bytes(e, rows_of[p]) for p, e in tables_of.items())]
    except Exception as e:
        error, rows_of, sizes = e, {}, [0, 0]
    row_bytes, full_bytes = agree_failures(error, what, sizes)
    if not full and row_bytes >= full_bytes:
        # The delta would hold as much as a full version (see SnapshotWriter.prepare): every rank exports in full.
        full = True
        rows_of = {path: emb.export() for path, emb in tables_of.items()}
    return rows_of, full
