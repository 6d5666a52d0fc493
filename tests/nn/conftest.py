"""Fixtures of the nn tests: the hash table's two implementations."""

import pytest
import torch

from recstream.nn import native
from recstream.nn import tensor_hash_table as tht


@pytest.fixture(params=["native", "torch"])
def hash_kernels(request, monkeypatch):
    """Run a test on the hash tables' compiled CPU kernels and again on their torch ops."""
    if request.param == "torch":
        monkeypatch.setattr(native, "kernels", None)
    elif not native.AVAILABLE:
        pytest.fail("recstream.nn._hash_kernels was not built (pip install -e . needs a C compiler)")
    return request.param


def colliding_keys(n: int, start: int, num_slots: int) -> torch.Tensor:
    """The first `n` positive keys whose probe sequence starts at slot `start` of a `num_slots` table:
    keys that really collide, on either implementation (no patched hash)."""
    found, lo = [], 1
    while sum(k.numel() for k in found) < n:
        keys = torch.arange(lo, lo + (1 << 20))
        found.append(keys[(tht.hash_keys(keys) & (num_slots - 1)) == start])
        lo += 1 << 20
    return torch.cat(found)[:n]
