"""recstream.sorting: the same results as torch.sort / torch.unique, whichever path runs."""
import pytest
import torch

from recstream import sorting
from recstream.sorting import sort_bounded, unique


@pytest.fixture(autouse=True, params=["default sizes", "numpy at every size"])
def numpy_from(request, monkeypatch):
    """Every test runs twice: as shipped, and with numpy's path taken at any size."""
    if request.param != "default sizes":
        monkeypatch.setattr(sorting, "SORT_NUMPY_MIN", 2)
        monkeypatch.setattr(sorting, "UNIQUE_NUMPY_MIN", 2)


@pytest.mark.parametrize("n", [0, 1, 2, 7, 5000])
@pytest.mark.parametrize("bound", [1, 3, 1000, 2 ** 40])
def test_sort_bounded_is_a_stable_sort(n, bound):
    values = torch.randint(0, bound, (n,), generator=torch.Generator().manual_seed(n))
    got, order = sort_bounded(values, bound)
    want, want_order = torch.sort(values, stable=True)
    assert torch.equal(got, want) and torch.equal(order, want_order)
    assert got.dtype == order.dtype == torch.int64


def test_sort_bounded_falls_back_when_value_and_position_do_not_fit_in_an_int64():
    values = torch.tensor([2 ** 61, 5, 2 ** 61, 0]).repeat(1000)
    assert sorting._packable(values.numel(), 2 ** 62) == 0
    got, order = sort_bounded(values, 2 ** 62)
    want, want_order = torch.sort(values, stable=True)
    assert torch.equal(got, want) and torch.equal(order, want_order)


@pytest.mark.parametrize("bound", [None, 2 ** 20])
@pytest.mark.parametrize("n", [0, 1, 2, 300, 30000])
def test_unique_matches_torch_unique(n, bound):
    g = torch.Generator().manual_seed(n)
    values = torch.randint(0, 2 ** 20 if bound else 2 ** 62, (n,), generator=g) % max(1, n // 3)
    if bound is None:  # arbitrary int64, negatives included
        values = values * -(2 ** 40) + 7
    for inverse in (False, True):
        for counts in (False, True):
            want = torch.unique(values, sorted=True, return_inverse=inverse, return_counts=counts)
            got = unique(values, return_inverse=inverse, return_counts=counts, bound=bound)
            want, got = (want, got) if isinstance(want, tuple) else ((want,), (got,))
            assert len(got) == len(want)
            for a, b in zip(got, want, strict=True):
                assert a.dtype == b.dtype and torch.equal(a, b)


@pytest.mark.parametrize("low", [-(2 ** 63), -(2 ** 40), 0, 2 ** 63 - 2 ** 20])
def test_unique_of_values_in_a_narrow_span_anywhere_in_int64(low):
    # A span of 2**20 leaves room for the positions: packed relative to the minimum, even at the
    # ends of the int64 range (the span is computed in python ints, the shift can not overflow).
    values = low + torch.randint(0, 2 ** 20, (20000,), generator=torch.Generator().manual_seed(1))
    values[:2] = torch.tensor([low, low + 2 ** 20 - 1])
    want = torch.unique(values, sorted=True, return_inverse=True, return_counts=True)
    got = unique(values, return_inverse=True, return_counts=True)
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)


def test_unique_of_a_non_contiguous_tensor():
    values = torch.tensor([[5, 1], [5, 2], [1, 3]]).t()[0]  # [5, 5, 1], strided
    uniq, inverse, counts = unique(values, return_inverse=True, return_counts=True)
    assert uniq.tolist() == [1, 5] and inverse.tolist() == [1, 1, 0] and counts.tolist() == [1, 2]


def test_unique_of_other_integer_dtypes_is_torch_unique():
    values = torch.tensor([3, 1, 3], dtype=torch.int32)
    uniq, inverse = unique(values, return_inverse=True)
    assert uniq.dtype == torch.int32 and uniq.tolist() == [1, 3] and inverse.tolist() == [1, 0, 1]
