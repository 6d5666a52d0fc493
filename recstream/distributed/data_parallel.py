"""Data parallelism: every rank holds the whole model and trains on its own part of each batch.

`data_parallel(network)` returns the module the training step calls on each rank:

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

Sparse all-reduce is implemented by gloo (CPU). NCCL has no sparse all-reduce, so on NCCL tables
must use dense gradients (``sparse=False``) for now.
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
    hashed = [name for name, m in network.named_modules() if isinstance(m, HashEmbedding)]
    if hashed:
        # Each rank would insert its own ids into its own table: the replicas would diverge.
        raise ValueError(f"data_parallel: HashEmbedding modules {hashed} cannot be replicated (each rank admits "
                         "different ids); they need each id on one owning rank (sharding), which "
                         "data_parallel does not do")
    sparse = sparse_parameters(network)
    if sparse and dist.get_backend() != "gloo":
        raise ValueError(f"data_parallel: parameters {sorted(sparse)} get sparse gradients, which the "
                         f"{dist.get_backend()!r} backend cannot all-reduce; build those tables with "
                         "sparse=False, or use the gloo backend")
    if sparse:
        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(network, list(sparse))
        group = dist.new_group(backend="gloo")
        for p in sparse.values():
            dist.broadcast(p.data, src=0, group=group)  # DDP broadcasts only what it manages
            p.register_post_accumulate_grad_hook(_SparseAllReduce(group))
    if not any(p.requires_grad for n, p in network.named_parameters() if n not in sparse):
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
