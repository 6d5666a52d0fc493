"""The training module of each parallel mode: every rank trains on its own part of each batch.

`data_parallel(network)` (every parameter replicated) returns the module the training step calls
on each rank:

- dense parameters go through `torch.nn.parallel.DistributedDataParallel` (DDP): its buckets
  all-reduce gradients while backward still runs, and it broadcasts rank 0's weights at start;
- parameters whose gradients are sparse (embedding tables built with ``sparse=True``: recstream's
  `EmbeddingBagCollection`, `torch.nn.Embedding(sparse=True)`) are left out of DDP — its reducer
  would densify them — and all-reduced as sparse tensors instead, right after each is
  accumulated, on a process group of their own (so their order never interleaves with DDP's).
  A table of 10^8 rows then costs what the batch touched, not what the table holds.

Gradients are averaged (divided by the number of ranks), as DDP does: with the loss a mean over
each rank's part of the batch, ranks training parts of a global batch take the same steps as one
process training the whole batch. `recstream.distributed.shard` gives each rank its part.

`hybrid_parallel(network)` shards the rows of every `EmbeddingBagCollection` across the ranks
instead (`recstream.nn.row_sharding`: ids go to the rank owning their row, rows come back, and
so do their gradients), and the keys of every `HashEmbedding` (`recstream.nn.key_sharding`: each
key lives on the one rank its hash names, which counts, admits, evicts and exports it), and
replicates the rest as above. A table then needs 1/N of its memory per rank, and its optimizer
state stays with its rows.

A disk-tiered `EmbeddingBagCollection` table (``tier=DiskTier(...)``) is row-sharded the same way:
each rank keeps a store of only its rows, ``<directory>/rank-<r>-of-<N>`` (`recstream.nn.tier_shard`),
behind its own cache of ``cache_rows`` slots, and answers the lookups of its rows from that cache. A
sharded checkpoint (`recstream.checkpoint.save_sharded`) commits every rank's store. The network must
be built after the process group is joined (each rank then opens its own store, not the whole table's).
A disk-tiered `HashEmbedding` is key-sharded like an in-memory one, and each rank keeps the rows of its
own keys in a store of its own, ``<directory>/rank-<r>-of-<N>`` (`recstream.nn.hash_tier`), behind its
own cache; sharded checkpoints commit every rank's store, and load back into as many ranks.

`data_parallel` refuses `HashEmbedding` and disk-tiered tables: replicas would each admit and evict
their own ranks' keys and drift apart (broadcasting one rank's table every step would cost the whole table per step).

Sparse all-reduce is implemented by gloo (CPU). NCCL has no sparse all-reduce, so under
data_parallel on NCCL tables must use dense gradients (``sparse=False``) or be sharded.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ..nn import EmbeddingBagCollection, HashEmbedding
from ..validation import check_module
from .context import world_size


def sparse_parameters(network: nn.Module) -> dict[str, nn.Parameter]:
    """``{qualified name: parameter}`` of every parameter that receives sparse gradients."""
    found = {}
    for prefix, module in network.named_modules():
        sparse = isinstance(module, (nn.Embedding, nn.EmbeddingBag, EmbeddingBagCollection)) and module.sparse
        if not sparse:
            continue
        for name, p in module.named_parameters(recurse=False):
            found[f"{prefix}.{name}" if prefix else name] = p
    return found


def data_parallel(network: nn.Module) -> nn.Module:
    """`network` replicated across the ranks of the default process group (module docstring)."""
    check_module("data_parallel", "network", network)
    _refuse_hash_embeddings("data_parallel", network)
    _refuse_tiered_tables("data_parallel", network)
    return _replicate("data_parallel", network, {}, [])


def hybrid_parallel(network: nn.Module) -> nn.Module:
    """Dense parameters replicated, every `EmbeddingBagCollection` row-sharded and every
    `HashEmbedding` key-sharded across the ranks.

    The tables are sharded in place (their Parameters keep their identity, so an optimizer
    built on them works on the shards); everything else is replicated as in `data_parallel`.
    """
    check_module("hybrid_parallel", "network", network)
    for name, module in network.named_modules():  # before any collective: every rank refuses alike
        if isinstance(module, (EmbeddingBagCollection, HashEmbedding)):
            module.check_tiers_shardable(f"hybrid_parallel ({name or 'the network'})")
    sharded, own_buffers = {}, []
    # The lookups' all-to-alls run inside backward, while DDP's bucketed all-reduces start from
    # autograd hooks in an order that depends on timing: on one process group the two could be
    # matched against each other across ranks. Their own group keeps them apart.
    group = dist.new_group(backend=dist.get_backend())
    for prefix, module in network.named_modules():
        if isinstance(module, EmbeddingBagCollection):
            module.shard_rows_(group)
            for name, p in module.named_parameters(recurse=False):
                sharded[f"{prefix}.{name}" if prefix else name] = p
        elif isinstance(module, HashEmbedding):
            module.shard_keys_(group)
            sharded[f"{prefix}.values" if prefix else "values"] = module.values
            # Each rank's table is its own: DDP must not broadcast rank 0's buffers over them.
            own_buffers += [f"{prefix}.{name}" if prefix else name for name, _ in module.named_buffers()]
    return _replicate("hybrid_parallel", network, sharded, own_buffers)


def sharding_plan(network: nn.Module) -> list[str]:
    """One line per parameter that is not simply replicated: where its rows live."""
    lines = []
    for name, p in network.named_parameters():
        layout = getattr(p, "recstream_layout", None)
        if layout is not None and layout.get("placement") in ("row_sharded", "rank_local"):
            ranges = ", ".join(f"rank {r}: rows {a}-{b}" for r, (a, b) in zip(layout["ranks"], layout["rows"],
                                                                                  strict=True))
        if layout is not None and layout.get("placement") == "row_sharded":
            lines.append(f"{name} {layout['shape']}: row-sharded ({ranges})")
        elif layout is not None and layout.get("placement") == "rank_local" and "keys" in layout:
            lines.append(f"{name} {layout['shape'][0] // len(layout['ranks'])} slots per rank: cache of a disk-tiered "
                         f"table, key-sharded ({_keys(layout)}; this rank's store {layout['store']})")
        elif layout is not None and layout.get("placement") == "rank_local":
            lines.append(f"{name} {layout['shape'][0] // len(layout['ranks'])} slots per rank: cache of a disk-tiered "
                         f"table, row-sharded ({ranges}; this rank's store {layout['store']})")
        elif layout is not None and layout.get("placement") == "key_sharded":
            lines.append(f"{name} {layout['shape']}: key-sharded ({_keys(layout)})")
    return lines


def _keys(layout: dict) -> str:
    """Where a key-sharded table's keys live, from its layout."""
    rows = layout["rows"][0][1] - layout["rows"][0][0]
    return f"{rows} rows per rank; key k on rank recstream.nn.key_sharding.owner_of(k, {len(layout['ranks'])})"


def _refuse_hash_embeddings(owner: str, network: nn.Module) -> None:
    hashed = [name for name, m in network.named_modules() if isinstance(m, HashEmbedding)]
    if hashed:
        # Each rank would admit its own ids into its own copy: replicas would diverge.
        raise ValueError(f"{owner}: HashEmbedding modules {hashed} cannot be replicated over several ranks "
                         "(each rank would admit different ids into its own copy); use "
                         "parallel_mode='hybrid_parallel', which shards their keys across the ranks")


def _refuse_tiered_tables(owner: str, network: nn.Module) -> None:
    """Disk-tiered tables, which a replicated mode cannot train, refused before any collective runs:
    each rank's cache would hold other rows in its slots, so an all-reduce of slot gradients would add
    up different rows (tiered `HashEmbedding` s are refused with every `HashEmbedding` before)."""
    tiered = [f"{name}.{t.name}" if name else t.name for name, m in network.named_modules()
              if isinstance(m, EmbeddingBagCollection) for t in m.tables if t.tier is not None]
    if tiered:
        raise ValueError(f"{owner}: disk-tiered tables {tiered} train on one process only (each rank would cache "
                         "other rows in the same slots); train them on one process, or use "
                         "parallel_mode='hybrid_parallel', which gives each rank a store of its own rows of every "
                         "EmbeddingBagCollection table (or keep them in memory)")


def _replicate(owner: str, network: nn.Module, sharded: dict[str, nn.Parameter], own_buffers: list[str]) -> nn.Module:
    """DDP over the parameters that are neither sharded nor sparse; sparse ones all-reduced apart.

    `own_buffers`: buffers that differ per rank by design (a key-sharded table's), kept out of
    DDP's buffer broadcast."""
    sparse = {n: p for n, p in sparse_parameters(network).items() if n not in sharded}
    if sparse and "gloo" not in dist.get_backend():
        raise ValueError(f"{owner}: parameters {sorted(sparse)} get sparse gradients, which the "
                         f"{dist.get_backend()!r} backend cannot all-reduce; build those tables with "
                         "sparse=False, or use the gloo backend")
    if sparse:
        group = dist.new_group(backend="gloo")
        for p in sparse.values():
            dist.broadcast(p.data, src=0, group=group)  # DDP broadcasts only what it manages
            p.register_post_accumulate_grad_hook(_SparseAllReduce(group))
    ignored = [*sparse, *sharded]
    if ignored or own_buffers:
        # DDP's reducer would densify sparse gradients (and must not touch sharded rows at all).
        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(network, [*ignored, *own_buffers])
    if not any(p.requires_grad for n, p in network.named_parameters() if n not in ignored):
        return network  # nothing dense to synchronise (DDP refuses a module without such parameters)
    device = next(network.parameters()).device
    return DistributedDataParallel(network, device_ids=[device] if device.type == "cuda" else None)


class _SparseAllReduce:
    """Average one parameter's sparse gradient over the ranks, once backward has accumulated it."""

    def __init__(self, group):
        self.group = group

    def __call__(self, param: torch.Tensor) -> None:
        grad = param.grad
        if grad is None:
            return
        if not grad.is_sparse:
            raise RuntimeError("data_parallel: a parameter registered as sparse got a dense gradient; "
                               "build its table with sparse=True or leave it to DDP")
        grad = grad.coalesce()
        dist.all_reduce(grad, group=self.group)
        # gloo's sparse all-reduce concatenates the ranks' entries: coalesce sums duplicates.
        param.grad = (grad.coalesce() / world_size())
