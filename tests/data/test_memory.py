import pytest
import torch

from recstream.data import Batch, Features, InMemoryDataset


def rows(n):
    lengths = torch.ones(1, n, dtype=torch.long)
    return Batch(Features.from_lengths(torch.arange(float(n))[:, None], torch.arange(n), lengths), torch.zeros(n))


def test_batches_sizes_and_order():
    ds = InMemoryDataset(rows(10), batch_size=4)
    assert len(ds) == ds.get_dataset_size() == 3
    got = [b.features.values.tolist() for b in ds]
    assert got == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert [b.batch_size for b in InMemoryDataset(rows(10), 4, drop_remainder=True)] == [4, 4]


def test_shuffle_new_order_each_pass_same_rows():
    ds = InMemoryDataset(rows(50), 8, shuffle=True, seed=2)
    a = torch.cat([b.features.values for b in ds])
    b = torch.cat([b.features.values for b in ds])
    assert not torch.equal(a, b) and sorted(a.tolist()) == list(range(50)) == sorted(b.tolist())
    # dense follows ids
    for batch in ds:
        assert torch.equal(batch.features.dense[:, 0].long(), batch.features.values)


def test_from_batches_and_errors():
    ds = InMemoryDataset.from_batches([rows(3), rows(4)], batch_size=5)
    assert ds.num_rows == 7 and [b.batch_size for b in ds] == [5, 2]
    with pytest.raises(TypeError, match="'data' must be a recstream.data.Batch"):
        InMemoryDataset([1, 2], 4)
    with pytest.raises(ValueError, match="yielded no batches"):
        InMemoryDataset.from_batches([])
