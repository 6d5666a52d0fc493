"""The disk tier's compiled kernels (`recstream.nn.tier_kernels`): the same results as numpy, bounds
checked before anything is written, and tiered training equal with and without them."""
import numpy as np
import pytest
import torch

from recstream.nn import DiskTier, EmbeddingBagCollection, EmbeddingTableConfig, tier_kernels
from recstream.optim import LazyAdam

pytestmark = pytest.mark.skipif(not tier_kernels.AVAILABLE, reason="the C extension was not built (no compiler)")


def _numpy(monkeypatch):
    monkeypatch.setattr(tier_kernels, "kernels", None)


def test_gather_and_put_rows_equal_numpy_on_contiguous_and_column_views(monkeypatch):
    g = np.random.default_rng(0)
    table = g.standard_normal((1000, 12)).astype(np.float32)
    records = g.standard_normal((50, 36)).astype(np.float32)
    rows = g.permutation(1000)[:50]
    np.testing.assert_array_equal(tier_kernels.gather_rows(table, rows), table[rows])
    got, want = table.copy(), table.copy()
    tier_kernels.put_rows(got, rows, records[:, 12:24])  # a column view: rows 144 bytes apart
    want[rows] = records[:, 12:24]
    np.testing.assert_array_equal(got, want)
    _numpy(monkeypatch)
    np.testing.assert_array_equal(tier_kernels.gather_rows(table, rows), table[rows])
    fallback = table.copy()
    tier_kernels.put_rows(fallback, rows, records[:, 12:24])
    np.testing.assert_array_equal(fallback, want)


def test_a_row_out_of_bounds_or_a_size_mismatch_raises_before_anything_is_written():
    table = np.zeros((10, 4), np.float32)
    with pytest.raises(ValueError, match=r"dst_rows\[1\] = 10 is outside the 10 rows"):
        tier_kernels.kernels.copy_rows(table, np.array([3, 10]), np.ones((2, 4), np.float32), None)
    with pytest.raises(ValueError, match=r"src_rows\[0\] = -1"):
        tier_kernels.gather_rows(table, np.array([-1]))
    with pytest.raises(ValueError, match="rows hold 16 bytes, src rows 32"):
        tier_kernels.kernels.copy_rows(table, np.array([1]), np.ones((1, 8), np.float32), None)
    assert not table.any()
    values = np.ones((1, 4), np.float64)  # another dtype: numpy converts it
    tier_kernels.put_rows(table, np.array([2]), values)
    assert table[2].tolist() == [1.0] * 4 and table.sum() == 4


def test_lookup_cached_maps_marks_and_touches_only_when_every_id_is_cached():
    lookup = tier_kernels.kernels.lookup_cached
    row2slot = np.full(100, -1, np.int32)
    row2slot[[5, 7, 9]] = [0, 1, 2]
    last_use = np.array([3, 4, 4, -1], np.int64)
    dirty = np.zeros(4, np.uint8)
    out, fresh = np.empty(5, np.int64), np.empty(5, np.int64)
    ids = np.array([7, 5, 7, 9, 5])
    assert lookup(ids, row2slot, last_use, 4, dirty, out, fresh) == 1  # slot 0: the only one not at tick 4
    assert out.tolist() == [1, 0, 1, 2, 0] and fresh[:1].tolist() == [0]
    assert last_use.tolist() == [4, 4, 4, -1] and dirty.tolist() == [1, 1, 1, 0]
    before = (last_use.copy(), dirty.copy())
    assert lookup(np.array([5, 8]), row2slot, last_use, 5, dirty, out, fresh) == -1  # 8 is not cached
    assert lookup(np.array([5, 100]), row2slot, last_use, 5, dirty, out, fresh) == -2  # outside the table
    last_use[2] = np.iinfo(np.int64).max  # reserved by a prefetch
    assert lookup(np.array([9]), row2slot, last_use, 5, None, out, fresh) == -1
    assert last_use[:2].tolist() == before[0][:2].tolist() and dirty.tolist() == before[1].tolist()
    row2slot[9] = 4  # a slot the cache does not have
    with pytest.raises(ValueError, match="row 9 maps to slot 4 of 4"):
        lookup(np.array([9]), row2slot, last_use, 5, None, out, fresh)


class _Counting:
    """tier_kernels.kernels, counting the lookups it answered (every id cached)."""

    def __init__(self, kernels):
        self.kernels, self.answered = kernels, 0
        self.copy_rows = kernels.copy_rows

    def lookup_cached(self, *args):
        k = self.kernels.lookup_cached(*args)
        self.answered += k >= 0
        return k


def _train(tmp_path) -> tuple[list[float], torch.Tensor]:
    torch.manual_seed(0)
    ebc = EmbeddingBagCollection([EmbeddingTableConfig("t", 2000, 8, tier=DiskTier(tmp_path, 64))])
    opt = LazyAdam(ebc.parameters(), lr=0.05)
    g = np.random.default_rng(1)
    losses = []
    for _ in range(30):
        ids = torch.from_numpy(g.zipf(1.6, 40) % 2000)
        opt.zero_grad()
        loss = ebc(ids, torch.arange(0, 41, 2), 20).square().mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, ebc.gather_tables()["t"]


def test_tiered_training_is_the_same_with_and_without_the_kernels(monkeypatch, tmp_path):
    counting = _Counting(tier_kernels.kernels)
    monkeypatch.setattr(tier_kernels, "kernels", counting)
    on = _train(tmp_path / "on")
    assert counting.answered > 0  # steps whose ids were all cached took the one-pass lookup
    _numpy(monkeypatch)
    off = _train(tmp_path / "off")
    assert on[0] == off[0]
    torch.testing.assert_close(on[1], off[1], rtol=0, atol=0)
