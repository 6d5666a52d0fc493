"""The frozen stand-ins an export puts in place of hash tables read what the live tables read in eval mode."""
from __future__ import annotations

import math

import pytest
import torch

from recstream.data import CategoricalFeature, Features
from recstream.models.dynamic import DynamicTables
from recstream.nn import HashEmbedding
from recstream.serving.export.frozen_dynamic_tables import FrozenDynamicTables
from recstream.serving.export.frozen_hash_lookup import FrozenHashLookup

I64 = torch.iinfo(torch.int64)


def trained_table(keys: torch.Tensor, dim: int = 3, **kwargs) -> HashEmbedding:
    """A table that has seen `keys` once each in training (admitted unless permit_filter_value > 1)."""
    torch.manual_seed(0)
    table = HashEmbedding(dim, capacity=max(keys.numel(), 1) * 2, param_init="uniform", sparse=False, **kwargs)
    if keys.numel():
        table(keys)
    return table.eval()


@pytest.mark.parametrize("n", [0, 1, 2, 3, 4, 7, 8, 100])
def test_every_table_size_reads_like_the_table(n):
    # Sizes around powers of two: the unrolled search has ceil(log2(n + 1)) steps.
    keys = torch.randperm(10 * n + 1)[:n] * 7 - 5 * n
    table = trained_table(keys)
    frozen = FrozenHashLookup.from_hash_embedding(table)
    assert frozen.depth == math.ceil(math.log2(n + 1)) and frozen.num_keys == n
    probe = torch.cat([keys, keys + 1, keys - 1, torch.tensor([I64.min + 2, I64.max, 0, 3])]).view(1, -1)
    with torch.no_grad():
        want = table(probe)
    got = frozen(probe)
    assert got.shape == want.shape == (*probe.shape, 3) and got.dtype == want.dtype
    assert torch.equal(got, want)


def test_the_extreme_keys_and_a_non_zero_default():
    keys = torch.tensor([I64.max, I64.min + 2, 0, -3])
    table = trained_table(keys)
    table.default_value.fill_(0.5)
    frozen = FrozenHashLookup.from_hash_embedding(table)
    probe = torch.tensor([I64.max, I64.max - 1, I64.min + 2, I64.min + 3, -3, 1])
    with torch.no_grad():
        assert torch.equal(frozen(probe), table(probe))
    assert torch.equal(frozen(probe[[1, 3, 5]]), torch.full((3, 3), 0.5))


def test_pending_keys_read_the_default_and_max_norm_scales_like_eval_mode():
    keys = torch.arange(20) * 1000
    table = trained_table(keys, permit_filter_value=2)
    table.train()
    table(keys[:12])  # the second sight: 12 admitted, 8 still pending
    table.eval()
    assert table.num_rows == 12 and table.num_pending == 8
    norms = table.export(reset_delta=False)["values"].norm(dim=1)
    table.max_norm = float(norms.median())  # about half the rows are scaled
    frozen = FrozenHashLookup.from_hash_embedding(table)
    probe = torch.cat([keys, torch.tensor([5, -7])])
    with torch.no_grad():
        want = table(probe)
    assert torch.equal(frozen(probe), want)
    assert want[12:].abs().sum() == 0 and bool((want[:12].norm(dim=1) <= table.max_norm + 1e-6).all())


def test_freezing_leaves_the_table_and_its_delta_alone():
    table = trained_table(torch.tensor([4, 5, 6]))
    table.export()  # the delta baseline
    table.train()
    table(torch.tensor([7]))
    FrozenHashLookup.from_hash_embedding(table)
    assert table.export_delta()["keys"].tolist() == [7]


def test_a_sharded_table_is_refused(monkeypatch):
    table = trained_table(torch.tensor([1]))
    monkeypatch.setattr(HashEmbedding, "sharded", property(lambda self: True))
    with pytest.raises(ValueError, match="FrozenHashLookup: 'table' is key-sharded"):
        FrozenHashLookup.from_hash_embedding(table)


def test_shape_errors():
    with pytest.raises(ValueError, match=r"FrozenHashLookup: needs keys \[n\], rows \[n, dim\]"):
        FrozenHashLookup(torch.arange(3), torch.zeros(2, 4), torch.zeros(4))
    with pytest.raises(TypeError, match="FrozenHashLookup: 'keys'"):
        FrozenHashLookup([1, 2], torch.zeros(2, 4), torch.zeros(4))


def test_frozen_dynamic_tables_pool_like_the_live_ones():
    features = [CategoricalFeature("user", dynamic=True, capacity=16, permit_filter_value=2),
                CategoricalFeature("tags", dynamic=True, capacity=16, multi_hot=True, pooling="mean")]
    tables = DynamicTables(features, [3, 2], init_std=0.01, sparse=False)
    # Feature-major: user [5, -1, 5, -1, 9, -2], tags in bags of 0..3; a fixed feature in between.
    lengths = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1], [0, 3, 1, 2, 0, 1]])
    values = torch.tensor([5, -1, 5, -1, 9, -2, 0, 1, 2, 3, 4, 5, 8, 8, -1, 2, 8, 8, 2])
    train = Features.from_lengths(torch.zeros(6, 0), values, lengths, keys=["user", "item", "tags"])
    tables(train)  # 5, -1, 8 and 2 (twice or more) are admitted; 9, -2 pending
    tables.eval()
    frozen = FrozenDynamicTables.from_dynamic_tables(tables)
    probe = Features.from_lengths(torch.zeros(4, 0), torch.tensor([5, 9, -2, 77, 1, 1, 1, 1, 8, -1, 2, 2, 99]),
                                  torch.tensor([[1, 1, 1, 1], [1, 1, 1, 1], [2, 0, 3, 0]]),
                                  keys=["user", "item", "tags"])
    with torch.no_grad():
        want = tables(probe)
    got = frozen(probe)
    assert list(got) == ["user", "tags"]
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=0.0, atol=1e-7)


def test_frozen_shared_table_reads_each_features_keys_like_the_live_one():
    """Two features of one table (and one with a table of its own): each reads its own salted keys."""
    features = [CategoricalFeature("user", dynamic=True, capacity=8, table="ids"),
                CategoricalFeature("tags", dynamic=True, capacity=8, multi_hot=True, table="ids"),
                CategoricalFeature("city", dynamic=True, capacity=8)]
    tables = DynamicTables(features, [3, 3, 2], init_std=0.01, sparse=False)
    assert list(tables.tables) == ["ids", "city"] and tables.tables["ids"].capacity == 16
    lengths = torch.tensor([[1, 1, 1], [2, 0, 1], [1, 1, 1]])
    train = Features.from_lengths(torch.zeros(3, 0), torch.tensor([5, 8, -1, 8, 5, 5, 4, 5, 6]), lengths,
                                  keys=["user", "tags", "city"])
    tables(train)  # user 5, 8, -1 and tags 8, 5 are five keys of "ids": the same ids, other features
    assert tables.tables["ids"].num_rows == 5 and tables.tables["city"].num_rows == 3
    tables.eval()
    frozen = FrozenDynamicTables.from_dynamic_tables(tables)
    assert frozen.table_index == (0, 0, 1)
    probe = Features.from_lengths(torch.zeros(4, 0), torch.tensor([5, 8, 7, -1, 8, 5, 5, 9, 4, 4, 5, 1]),
                                  torch.tensor([[1, 1, 1, 1], [1, 2, 0, 1], [1, 1, 1, 1]]),
                                  keys=["user", "tags", "city"])
    with torch.no_grad():
        want = tables(probe)
    got = frozen(probe)
    assert list(got) == ["user", "tags", "city"]
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=0.0, atol=1e-7)
    assert not torch.equal(want["user"][0], want["tags"][1])  # id 5 as a user is not id 5 as a tag
