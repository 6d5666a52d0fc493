"""Rows of a table gathered with a gradient that is already coalesced.

`F.embedding(rows, weight, sparse=True)` gives `weight` a sparse gradient with one entry per
looked-up id, duplicates and all; a row-sparse optimizer then sorts and sums it (`coalesce`,
or unique + index_add_ on a CPU). A caller that already knows the unique rows -- a hash table
looks each key up once -- can hand them over sorted: the backward then sums the entries of a
row into it directly (one `index_add_`) and returns a COO gradient marked coalesced, which the
optimizer uses as it is. On a CPU, for a full `HashEmbedding` with 26k ids a step, that spares
the optimizer's sort of all the ids (see docs/benchmarks.md).

>>> import torch
>>> w = torch.nn.Parameter(torch.arange(12.0).view(6, 2))
>>> out = gather_rows(w, torch.tensor([1, 4]), torch.tensor([1, 0, 1]))  # rows 4, 1, 4
>>> out.detach().tolist()
[[8.0, 9.0], [2.0, 3.0], [8.0, 9.0]]
>>> out.sum().backward()
>>> w.grad.is_coalesced(), w.grad.indices().tolist(), w.grad.values().tolist()
(True, [[1, 4]], [[1.0, 1.0], [2.0, 2.0]])
"""
from __future__ import annotations

import torch

__all__ = ["gather_rows"]


class _GatherRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, weight: torch.Tensor, rows: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(rows, index)
        ctx.num_rows = weight.shape[0]
        return weight.index_select(0, rows.index_select(0, index))

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        rows, index = ctx.saved_tensors
        summed = grad.new_zeros(rows.numel(), *grad.shape[1:]).index_add_(0, index, grad)
        # rows are unique and ascending: the invariant `is_coalesced` promises
        out = torch.sparse_coo_tensor(rows.unsqueeze(0), summed, (ctx.num_rows, *grad.shape[1:]), is_coalesced=True,
                                      check_invariants=False)
        # Why ctx keeps it: autograd stores a sparse gradient it holds the only reference to by
        # rebuilding it from its indices and values, which drops the coalesced flag (torch 2.13);
        # one referenced elsewhere it clones, flag and all. Freed with the graph. Should that change,
        # the optimizer coalesces the gradient again (slower, the same result; the doctest notices).
        ctx.grad = out
        return out, None, None


def gather_rows(weight: torch.Tensor, rows: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``weight[rows[index]]``, where `rows` are unique and ascending; `weight`'s gradient is a
    sparse COO tensor over `rows`, already coalesced.

    Only where `index_add_` sums in a fixed order (a CPU: CUDA's atomics would make the sums'
    last bits vary between runs; there, `F.embedding(sparse=True)` and the optimizer's coalesce).
    """
    return _GatherRows.apply(weight, rows, index)
