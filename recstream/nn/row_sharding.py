"""Row-wise sharding of a fused embedding table over the ranks of a process group.

`RowSharding` splits a table of ``rows`` rows into one contiguous range per rank (rank ``r`` owns
rows ``[r * chunk, (r + 1) * chunk)``, ``chunk = ceil(rows / world_size)``); each rank stores only
its range. A pooled lookup (`pool`) then runs in four moves, all inside autograd:

1. every id goes to its owning rank (one all-to-all of ids; the per-rank counts are exchanged
   first, so each step costs one small host sync to size the transfer);
2. each owner gathers the rows it was asked for from its own shard;
3. the rows travel back to the ranks that asked (a differentiable all-to-all: in backward the
   gradients of those rows travel to their owners the same way, and land as a sparse gradient
   of the owner's shard, so the optimizer state of a row lives with the row);
4. the asking rank pools its bags (sum, with per-id weights for mean pooling).

Traffic per step and rank: ``ids x 8`` bytes out and ``ids x dim x 4`` bytes of rows back (and
the same again for gradients), independent of the table's size.

Gradients are divided by the number of ranks: with each rank's loss a mean over its own part of
the global batch, that makes a step equal to one process training the whole global batch (as
data parallelism averages dense gradients).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["RowSharding"]


class RowSharding:
    """Which rows of a `rows`-row table this rank owns in `group`, and the routed lookup."""

    def __init__(self, rows: int, group=None):
        self.group = group
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.rows = rows
        self.chunk = -(-rows // self.world_size)  # ceil
        self.start = min(self.rank * self.chunk, rows)
        self.stop = min(self.start + self.chunk, rows)

    def ranges(self) -> list[tuple[int, int]]:
        """``[start, stop)`` of every rank, in rank order."""
        return [(min(r * self.chunk, self.rows), min((r + 1) * self.chunk, self.rows))
                for r in range(self.world_size)]

    def local_rows(self, full: torch.Tensor) -> torch.Tensor:
        """This rank's rows of a full table (a copy, so the full table can be freed)."""
        return full[self.start:self.stop].clone()

    def gather(self, shard: torch.Tensor) -> torch.Tensor:
        """The full table, assembled from every rank's shard (a collective: all ranks call it)."""
        padded = shard.new_zeros(self.chunk, *shard.shape[1:])
        padded[: shard.shape[0]] = shard.detach()
        parts = [torch.empty_like(padded) for _ in range(self.world_size)]
        dist.all_gather(parts, padded, group=self.group)
        return torch.cat([part[: stop - start] for part, (start, stop) in zip(parts, self.ranges(), strict=True)])

    def scale_gradient(self, shard: torch.Tensor) -> None:
        """Average the shard's gradient over the ranks (see the module docstring)."""
        shard.register_post_accumulate_grad_hook(_DivideGrad(self.world_size))

    def pool(self, shard: torch.Tensor, ids: torch.Tensor, bag_of_id: torch.Tensor, num_bags: int,
             weights: torch.Tensor | None, sparse: bool, slots=None) -> torch.Tensor:
        """``[num_bags, dim]``: for each bag, the (weighted) sum of the rows of its ids.

        `ids` are row numbers of the whole table, `bag_of_id` the bag each belongs to. Every rank
        must call this the same number of times per step (it runs collectives). `slots`: for a
        shard that is a cache (a disk-tiered table), maps the owner's local row numbers to rows of
        `shard` (loading them), called once per call on the rows this rank was asked for.
        """
        owner = torch.div(ids, self.chunk, rounding_mode="floor")
        order = torch.argsort(owner, stable=True)
        send_counts = torch.bincount(owner, minlength=self.world_size)
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts, group=self.group)
        send, recv = send_counts.tolist(), recv_counts.tolist()  # the one host sync: sizes the transfers
        asked = ids.new_empty(sum(recv))
        dist.all_to_all_single(asked, ids[order], recv, send, group=self.group)
        local = asked - self.start
        rows = torch.nn.functional.embedding(local if slots is None else slots(local), shard, sparse=sparse)
        answered = _AllToAll.apply(rows, send, recv, self.group)
        by_id = torch.zeros_like(answered).index_copy(0, order, answered)  # back to the ids' order
        if weights is not None:
            by_id = by_id * weights.unsqueeze(1).to(by_id.dtype)
        return by_id.new_zeros(num_bags, by_id.shape[1]).index_add(0, bag_of_id, by_id)


class _AllToAll(torch.autograd.Function):
    """All-to-all of rows whose backward is the reverse all-to-all of their gradients.

    Written here because torch's differentiable version (torch.distributed.nn.functional) is
    deprecated in favour of a private module; this is the whole of what we need from it.
    """

    @staticmethod
    def forward(ctx, rows: torch.Tensor, out_splits: list[int], in_splits: list[int], group) -> torch.Tensor:
        ctx.out_splits, ctx.in_splits, ctx.group = out_splits, in_splits, group
        out = rows.new_empty(sum(out_splits), *rows.shape[1:])
        dist.all_to_all_single(out, rows.contiguous(), out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        back = grad.new_empty(sum(ctx.in_splits), *grad.shape[1:])
        dist.all_to_all_single(back, grad.contiguous(), ctx.in_splits, ctx.out_splits, group=ctx.group)
        return back, None, None, None


class _DivideGrad:
    def __init__(self, world_size: int):
        self.world_size = world_size

    def __call__(self, param: torch.Tensor) -> None:
        if param.grad is not None:
            param.grad = param.grad / self.world_size
