"""`lru_select.oldest_static`: the device path's sync-free LRU selection, against `_select` (what
`oldest` and the host path select), and what it dispatches."""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from recstream.nn import lru_select
from recstream.nn import tensor_hash_table as tht


def _ages(n: int, span: int, step: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    last_seen = step - 1 - torch.randint(0, span, (n,), generator=gen)
    last_seen[torch.randperm(n, generator=gen)[: n // 7]] = step  # seen this step: never chosen
    last_seen[torch.randperm(n, generator=gen)[: n // 11]] = tht.NEVER_SEEN  # free rows
    return last_seen


# one age per bucket (span <= 2**16: the edge spreads its picks) or several (the edge by age)
@pytest.mark.parametrize("span", [1, 3, 50, 2**16, 2**16 + 1, 10**6, 2**40])
def test_oldest_static_selects_what_oldest_selects_in_its_order(span):
    n, step = 5_000, 2**41
    last_seen = _ages(n, span, step, seed=span)
    candidate = last_seen < step
    n_cand = int(candidate.sum())
    for k in (0, 1, 2, 37, 999, n_cand - 1, n_cand, n_cand + 5):
        order, chosen = lru_select.oldest_static(last_seen, step, k)
        want = lru_select._select(last_seen, candidate, step, k)
        assert order.shape == chosen.shape == (n,)
        assert torch.equal(order[chosen], want), k  # the same entries, in the same order
        assert torch.equal(chosen, torch.arange(n) < want.numel()), k  # the chosen ones first
        assert bool(((order >= 0) & (order < n)).all()), k  # the tail: valid indices (masked out)


def test_oldest_static_with_no_candidate_chooses_nothing():
    last_seen = torch.tensor([9, tht.NEVER_SEEN, 9])
    order, chosen = lru_select.oldest_static(last_seen, step=9, k=2)
    assert not bool(chosen.any()) and order.tolist() == [0, 0, 0]


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.__name__.split(".")[0])
        return func(*args, **(kwargs or {}))


def test_oldest_static_sorts_the_table_once_and_reads_nothing_on_the_host():
    """An LRU pass's costliest ops on a GPU are its sorts of the whole table: one (the edge bucket
    by age); its places come of prefix sums and one scatter. No op that reads a device value."""
    last_seen = _ages(4_000, 10**6, 2**30, seed=1)
    with _Ops() as ops:
        lru_select.oldest_static(last_seen, 2**30, 500)
    assert ops.names.count("sort") == 1
    assert ops.names.count("scatter_") == 1
    assert not {"_local_scalar_dense", "nonzero", "item", "unique", "_unique2"} & set(ops.names)
