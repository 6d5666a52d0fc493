"""Shared helpers for the recstream.optim tests (not a test module)."""

from __future__ import annotations

import torch


def sparse_grad(rows, values, shape) -> torch.Tensor:
    """Row-sparse COO gradient with rows ``rows`` (duplicates allowed, uncoalesced)."""
    rows = torch.as_tensor(rows, dtype=torch.long)
    return torch.sparse_coo_tensor(rows[None], values, size=tuple(shape), check_invariants=True)


def dense_from_rows(rows, values, shape, dtype=torch.float64) -> torch.Tensor:
    """The dense equivalent of ``sparse_grad`` (duplicates summed)."""
    out = torch.zeros(shape, dtype=dtype)
    out.index_add_(0, torch.as_tensor(rows, dtype=torch.long), values.to(dtype))
    return out


def random_rows(gen: torch.Generator, num_rows: int, k: int) -> torch.Tensor:
    """``k`` distinct random rows, sorted."""
    return torch.randperm(num_rows, generator=gen)[:k].sort().values
