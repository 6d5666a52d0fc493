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


def test_from_arrow_converts_like_the_readers_and_names_a_bad_row():
    import pyarrow as pa

    from recstream.data import BadRowError, CategoricalFeature, InMemoryDataset, Schema

    schema = Schema(["x"], [CategoricalFeature("c", vocab_size=3), CategoricalFeature("u", hash_buckets=16)])
    table = pa.table({"label": [1, 0, 1, 0], "x": ["0.5", "2", "oops", "1"], "c": [2, 1, 0, 2],
                      "u": ["alice", "bob", "carol", "alice"], "ignored": [0, 0, 0, 0]})
    with pytest.raises(BadRowError, match=r"<arrow table>: row 3: column 'x'.*unparsable"):
        InMemoryDataset.from_arrow(table, schema, batch_size=2)
    ds = InMemoryDataset.from_arrow(table, schema, batch_size=2, on_bad_row="skip", shuffle=True)
    assert ds.num_rows == 3 and ds.bad_rows == {"unparsable": 1} and len(ds) == 2
    first = next(iter(InMemoryDataset.from_arrow(table.slice(0, 2), schema, batch_size=2)))
    assert first.features.dense.view(-1).tolist() == [0.5, 2.0]
    u = first.features.values[2:]  # feature-major: c's two ids, then u's
    assert u[0] != u[1]  # alice and bob hash apart


def test_from_pandas_and_its_argument_errors():
    import pandas as pd

    from recstream.data import CategoricalFeature, InMemoryDataset, Schema

    schema = Schema(["x"], [CategoricalFeature("c", vocab_size=3)])
    frame = pd.DataFrame({"label": [1.0, 0.0], "x": [0.5, 1.5], "c": [1, 2]}, index=[10, 20])
    ds = InMemoryDataset.from_pandas(frame, schema, batch_size=8)
    assert ds.num_rows == 2 and ds.data.labels.tolist() == [1.0, 0.0]
    with pytest.raises(TypeError, match="'frame' must be a pandas DataFrame"):
        InMemoryDataset.from_pandas([1, 2], schema, batch_size=8)
    with pytest.raises(TypeError, match="'table' must be"):
        InMemoryDataset.from_arrow({"label": [1]}, schema, batch_size=8)
    with pytest.raises(ValueError, match="no usable row"):
        InMemoryDataset.from_pandas(frame.assign(c=[5, 6]), schema, batch_size=8, on_bad_row="skip")
