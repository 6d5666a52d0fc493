"""EmbeddingBagCollection: fused lookups must equal per-table nn.EmbeddingBag."""

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from recstream.features import Features
from recstream.nn import EmbeddingBagCollection, EmbeddingTableConfig

B = 5


def mixed_tables():
    # dims interleave (4, 8, 4, 8) so the fused output needs a column permutation;
    # "b" is shared by two features; sum and mean tables share a dim group.
    return [
        EmbeddingTableConfig("a", 10, 4, pooling="sum"),
        EmbeddingTableConfig("c", 7, 8, pooling="sum", init_std=0.5),
        EmbeddingTableConfig("b", 20, 4, pooling="mean", feature_names=("b1", "b2")),
        EmbeddingTableConfig("d", 5, 8, pooling="mean", init_std=0.3),
    ]


def random_batch(ebc, gen, max_len=4):
    """Feature-major multi-hot batch with some empty bags."""
    rows = [t.num_embeddings for t in ebc.tables for _ in t.feature_names]
    lengths = torch.randint(0, max_len + 1, (len(rows), B), generator=gen)
    lengths[0, 1] = 0  # at least one empty bag per kind of table
    lengths[-1, 3] = 0
    vals = [torch.randint(0, rows[f], (int(lengths[f].sum()),), generator=gen) for f in range(len(rows))]
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.reshape(-1).cumsum(0)])
    return torch.cat(vals), offsets


def reference(ebc, values, offsets):
    """Per-table nn.EmbeddingBag modules with the same weights, run feature by feature."""
    refs = {}
    for t in ebc.tables:
        m = nn.EmbeddingBag(t.num_embeddings, t.embedding_dim, mode=t.pooling, sparse=True)
        with torch.no_grad():
            m.weight.copy_(ebc.table_weight(t.name))
        refs[t.name] = m
    outs = []
    for f, name in enumerate(ebc.feature_names):
        lo, hi = int(offsets[f * B]), int(offsets[(f + 1) * B])
        offs = offsets[f * B:(f + 1) * B] - lo
        outs.append(refs[ebc.feature_table[name]](values[lo:hi], offs))
    return torch.cat(outs, dim=1), refs


@pytest.mark.parametrize("tables", [mixed_tables(), [
    EmbeddingTableConfig("x", 9, 6), EmbeddingTableConfig("y", 13, 6, pooling="mean"),
]], ids=["mixed_dims", "single_group"])
def test_values_and_sparse_grads_match_per_table_embedding_bag(tables):
    torch.manual_seed(0)
    ebc = EmbeddingBagCollection(tables)
    values, offsets = random_batch(ebc, torch.Generator().manual_seed(1))
    out = ebc(values, offsets, B)
    ref_out, refs = reference(ebc, values, offsets)
    assert out.shape == (B, ebc.output_dim)
    torch.testing.assert_close(out, ref_out)

    upstream = torch.randn_like(out)
    (out * upstream).sum().backward()
    (ref_out * upstream).sum().backward()
    for name, param in ebc.named_parameters():
        assert param.grad.layout == torch.sparse_coo, name
    for t in ebc.tables:
        g, start, rows = ebc._table_loc[t.name]
        fused_grad = getattr(ebc, ebc._group_param_names[g]).grad.to_dense()[start:start + rows]
        torch.testing.assert_close(fused_grad, refs[t.name].weight.grad.to_dense())
    if ebc._pad:  # the padding row never receives gradient
        for name in ebc._group_param_names:
            assert getattr(ebc, name).grad.to_dense()[-1].abs().sum() == 0


@pytest.mark.parametrize("keys", [None, ("y", "x", "z")], ids=["positional", "by_name"])
def test_single_hot_features_gather_rows_with_the_values_and_gradients_of_the_bags(monkeypatch, keys):
    """Every bag one id (single-hot fields): a row gather instead of embedding_bag, same results."""
    tables = [EmbeddingTableConfig("x", 9, 6), EmbeddingTableConfig("y", 13, 6, pooling="mean"),
              EmbeddingTableConfig("z", 4, 6)]
    gen = torch.Generator().manual_seed(5)
    ids = torch.stack([torch.randint(0, t.num_embeddings, (B,), generator=gen) for t in tables])
    if keys:  # input order y, x, z
        ids = ids[[1, 0, 2]]
    features = Features(torch.zeros(B, 1), ids.reshape(-1), torch.arange(3 * B + 1), B, 3, keys)
    upstream = torch.randn(B, 18, generator=gen)
    results, bags = [], []
    real = torch.nn.functional.embedding_bag
    monkeypatch.setattr(torch.nn.functional, "embedding_bag", lambda *a, **k: bags.append(1) or real(*a, **k))
    for single in (True, False):
        torch.manual_seed(0)
        ebc = EmbeddingBagCollection(tables)
        bags.clear()
        if not single:
            monkeypatch.setattr(EmbeddingBagCollection, "_one_id_per_bag", lambda *a: False)
        out = ebc(features)
        (out * upstream).sum().backward()
        assert len(bags) == (0 if single else 1)
        grad = ebc.get_parameter(ebc._group_param_names[0]).grad
        assert grad.layout == torch.sparse_coo
        results.append((out.detach(), grad.to_dense()))
    torch.testing.assert_close(results[0][0], results[1][0], rtol=0, atol=0)
    torch.testing.assert_close(results[0][1], results[1][1], rtol=0, atol=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_single_hot_features_on_cuda_keep_embedding_bag():
    """The row-gather path is CPU-only (asking whether every bag holds one id is a host sync on CUDA)."""
    ebc = EmbeddingBagCollection([EmbeddingTableConfig("x", 9, 6)]).cuda()
    assert not ebc._one_id_per_bag(torch.zeros(B, dtype=torch.int64, device="cuda"),
                                   torch.arange(B + 1, device="cuda"), B)
    out = ebc(torch.zeros(B, dtype=torch.int64, device="cuda"), torch.arange(B + 1, device="cuda"), B)
    torch.testing.assert_close(out, ebc.table_weight("x")[0].expand(B, 6))


def test_one_embedding_bag_call_per_dim_group(monkeypatch):
    ebc = EmbeddingBagCollection(mixed_tables())
    values, offsets = random_batch(ebc, torch.Generator().manual_seed(2))
    calls = []
    real = torch.nn.functional.embedding_bag
    monkeypatch.setattr(torch.nn.functional, "embedding_bag",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    ebc(values, offsets, B)
    assert len(calls) == 2  # dims 4 and 8


def test_forward_dict_and_split_are_per_feature_slices():
    ebc = EmbeddingBagCollection(mixed_tables())
    values, offsets = random_batch(ebc, torch.Generator().manual_seed(3))
    out = ebc(values, offsets, B)
    parts = ebc.forward_dict(values, offsets, B)
    assert list(parts) == ["a", "c", "b1", "b2", "d"]
    assert [p.shape[1] for p in parts.values()] == [4, 8, 4, 4, 8]
    torch.testing.assert_close(torch.cat(list(parts.values()), dim=1), out)
    assert ebc.split(out)["b2"].data_ptr() == out[:, 16:20].data_ptr()  # a view


def test_empty_bags_pool_to_zero_for_sum_and_mean():
    ebc = EmbeddingBagCollection([EmbeddingTableConfig("s", 4, 3),
                                  EmbeddingTableConfig("m", 4, 3, pooling="mean")])
    values = torch.tensor([1, 2, 3])
    offsets = torch.tensor([0, 0, 2, 2, 3])  # B=2: s=[[], [1,2]], m=[[], [3]]
    out = ebc(values, offsets, 2)
    assert out[0].abs().sum() == 0
    w_s, w_m = ebc.table_weight("s"), ebc.table_weight("m")
    torch.testing.assert_close(out[1], torch.cat([w_s[1] + w_s[2], w_m[3]]))


def test_sgd_step_on_sparse_grads_updates_only_touched_rows():
    ebc = EmbeddingBagCollection([EmbeddingTableConfig("t", 6, 2)])
    before = ebc.table_weight("t").detach().clone()
    opt = torch.optim.SGD(ebc.parameters(), lr=0.1)
    ebc(torch.tensor([1, 4, 4]), torch.tensor([0, 1, 3]), 2).sum().backward()
    opt.step()
    after = ebc.table_weight("t").detach()
    torch.testing.assert_close(after[[0, 2, 3, 5]], before[[0, 2, 3, 5]])
    torch.testing.assert_close(after[1], before[1] - 0.1)
    torch.testing.assert_close(after[4], before[4] - 0.2)  # seen twice


def test_dense_gradients_when_sparse_false():
    ebc = EmbeddingBagCollection([EmbeddingTableConfig("t", 6, 2)], sparse=False)
    ebc(torch.tensor([1]), torch.tensor([0, 1]), 1).sum().backward()
    assert ebc.fused_weight_dim2.grad.layout == torch.strided


def test_state_dict_is_per_table_and_round_trips():
    src = EmbeddingBagCollection(mixed_tables())
    sd = src.state_dict()
    assert set(sd) == {"tables.a.weight", "tables.b.weight", "tables.c.weight", "tables.d.weight"}
    assert sd["tables.b.weight"].shape == (20, 4)
    torch.testing.assert_close(sd["tables.c.weight"], src.table_weight("c"))
    dst = EmbeddingBagCollection(mixed_tables())
    values, offsets = random_batch(src, torch.Generator().manual_seed(4))
    assert not torch.allclose(dst(values, offsets, B), src(values, offsets, B))
    dst.load_state_dict(sd)
    torch.testing.assert_close(dst(values, offsets, B), src(values, offsets, B))
    # Nested under a parent module the keys get the usual prefix.
    parent = nn.ModuleDict({"ebc": dst})
    assert "ebc.tables.a.weight" in parent.state_dict()
    parent.load_state_dict(nn.ModuleDict({"ebc": src}).state_dict())


def test_state_dict_saves_with_safetensors():
    safetensors_torch = pytest.importorskip("safetensors.torch")
    src = EmbeddingBagCollection(mixed_tables())
    loaded = safetensors_torch.load(safetensors_torch.save(src.state_dict()))
    dst = EmbeddingBagCollection(mixed_tables())
    dst.load_state_dict(loaded)
    torch.testing.assert_close(dst.table_weight("d"), src.table_weight("d"))


def test_load_state_dict_reports_missing_unexpected_and_mismatched():
    ebc = EmbeddingBagCollection(mixed_tables())
    sd = ebc.state_dict()
    missing = {k: v for k, v in sd.items() if k != "tables.a.weight"}
    with pytest.raises(RuntimeError, match="Missing key.*tables.a.weight"):
        ebc.load_state_dict(missing)
    with pytest.raises(RuntimeError, match="Unexpected key.*tables.zz.weight"):
        ebc.load_state_dict({**sd, "tables.zz.weight": torch.zeros(1)})
    with pytest.raises(RuntimeError, match="size mismatch for tables.c.weight"):
        ebc.load_state_dict({**sd, "tables.c.weight": torch.zeros(3, 8)})
    result = ebc.load_state_dict(missing, strict=False)
    assert result.missing_keys == ["tables.a.weight"]


def test_id_range_validation_names_feature_value_and_range():
    ebc = EmbeddingBagCollection(mixed_tables())
    values, offsets = random_batch(ebc, torch.Generator().manual_seed(5))
    start_b2 = int(offsets[3 * B])  # feature index 3 is "b2" (table b, 20 rows)
    bad = values.clone()
    bad[start_b2] = 20
    with pytest.raises(ValueError, match=r"=20 \(feature 'b2', table 'b'\) must be in \[0, 20\)"):
        ebc(bad, offsets, B)
    bad[start_b2] = -3
    with pytest.raises(ValueError, match="=-3"):
        ebc(bad, offsets, B)
    # validate=False skips the check: id 20 of "b" silently reads the next table's row.
    bad[start_b2] = 20
    ebc(bad, offsets, B, validate=False)


def test_input_validation():
    ebc = EmbeddingBagCollection(mixed_tables())
    values, offsets = random_batch(ebc, torch.Generator().manual_seed(6))
    with pytest.raises(ValueError, match=r"offsets must have num_features\*batch_size\+1 = 5\*4\+1"):
        ebc(values, offsets, 4)
    with pytest.raises(TypeError, match="'values' must have a dtype"):
        ebc(values.int(), offsets, B)
    with pytest.raises(TypeError, match="'batch_size' must be an int"):
        ebc(values, offsets, 5.0)
    broken = offsets.clone()
    broken[-1] += 1
    with pytest.raises(ValueError, match="offsets must start at 0"):
        ebc(values, broken, B)
    with pytest.raises(ValueError, match="'pooled' must have shape"):
        ebc.split(torch.zeros(2, 3))
    with pytest.raises(ValueError, match="'name' must be one of \\['a', 'c', 'b', 'd'\\]"):
        ebc.table_weight("nope")


def test_config_validation():
    with pytest.raises(ValueError, match="'pooling' must be one of \\['sum', 'mean'\\], got 'max'"):
        EmbeddingTableConfig("t", 3, 2, pooling="max")
    with pytest.raises(ValueError, match="'num_embeddings' must be an int >= 1, got 0"):
        EmbeddingTableConfig("t", 0, 2)
    with pytest.raises(TypeError, match="'embedding_dim' must be an int"):
        EmbeddingTableConfig("t", 3, 2.5)
    with pytest.raises(ValueError, match="without '.'"):
        EmbeddingTableConfig("a.b", 3, 2)
    with pytest.raises(ValueError, match="'feature_names' must be unique"):
        EmbeddingTableConfig("t", 3, 2, feature_names=["x", "x"])
    with pytest.raises(ValueError, match="feature names must be unique, got duplicates \\['x'\\]"):
        EmbeddingBagCollection([EmbeddingTableConfig("t", 3, 2, feature_names=["x"]),
                                EmbeddingTableConfig("u", 3, 2, feature_names=["x"])])
    with pytest.raises(ValueError, match="table names must be unique"):
        EmbeddingBagCollection([EmbeddingTableConfig("t", 3, 2), EmbeddingTableConfig("t", 4, 2,
                                                                                      feature_names=["y"])])
    with pytest.raises(ValueError, match="at least one"):
        EmbeddingBagCollection([])


def named(ebc, values, offsets, order, extra=0):
    """The batch as Features named by `ebc.feature_names`, stored in `order` (positions), plus
    `extra` features the collection does not read (ids out of every table's range)."""
    keys = tuple(ebc.feature_names)
    lengths = (offsets[1:] - offsets[:-1]).view(len(keys), B)
    parts = [values[offsets[f * B]:offsets[(f + 1) * B]] for f in range(len(keys))]
    lengths = torch.cat([lengths[order], torch.ones(extra, B, dtype=torch.int64)])
    vals = torch.cat([parts[f] for f in order] + [torch.full((extra * B,), -7)])
    names = tuple(keys[f] for f in order) + tuple(f"extra{i}" for i in range(extra))
    return Features.from_lengths(torch.zeros(B, 0), vals, lengths, keys=names)


@pytest.mark.parametrize("tables", [mixed_tables(), [
    EmbeddingTableConfig("x", 9, 6), EmbeddingTableConfig("y", 13, 6, pooling="mean"),
]], ids=["mixed_dims", "single_group"])
@pytest.mark.parametrize("extra", [0, 2], ids=["same_features", "extra_features"])
def test_features_are_matched_by_name(tables, extra):
    torch.manual_seed(0)
    ebc = EmbeddingBagCollection(tables)
    values, offsets = random_batch(ebc, torch.Generator().manual_seed(7))
    nf = ebc.num_features
    expected = ebc(values, offsets, B)
    unnamed = Features.from_lengths(torch.zeros(B, 0), values, (offsets[1:] - offsets[:-1]).view(nf, B))
    torch.testing.assert_close(ebc(unnamed), expected)
    for order in (list(range(nf)), list(reversed(range(nf)))):
        x = named(ebc, values, offsets, order, extra)
        out = ebc(x)
        torch.testing.assert_close(out, expected)
        assert ebc(x, validate=False).shape == out.shape
        torch.testing.assert_close(torch.cat(list(ebc.forward_dict(x).values()), dim=1), expected)
    # gradients reach the same rows as with positional input
    ebc.zero_grad()
    ebc(named(ebc, values, offsets, list(reversed(range(nf))), extra)).sum().backward()
    by_name = {n: p.grad.to_dense().clone() for n, p in ebc.named_parameters()}
    ebc.zero_grad()
    ebc(values, offsets, B).sum().backward()
    for n, p in ebc.named_parameters():
        torch.testing.assert_close(by_name[n], p.grad.to_dense())


def test_by_name_layout_is_cached_per_keys():
    ebc = EmbeddingBagCollection(mixed_tables())
    values, offsets = random_batch(ebc, torch.Generator().manual_seed(8))
    x = named(ebc, values, offsets, [4, 3, 2, 1, 0])
    ebc(x)
    layout = ebc._layouts[x.keys]
    ebc(named(ebc, values, offsets, [4, 3, 2, 1, 0]))
    assert ebc._layouts[x.keys] is layout and len(ebc._layouts) == 1


def test_features_input_errors():
    ebc = EmbeddingBagCollection(mixed_tables())
    values, offsets = random_batch(ebc, torch.Generator().manual_seed(9))
    x = named(ebc, values, offsets, [0, 1, 2, 3, 4])
    with pytest.raises(ValueError, match=r"the features have no 'b2' \(keys: \['a', 'c', 'b1', 'd'\]\)"):
        ebc(x.select(["a", "c", "b1", "d"]))
    with pytest.raises(ValueError, match=r"features has 4 features but the collection reads 5"):
        ebc(Features(x.dense, x.values, x.offsets[:4 * B + 1], B, 4))
    with pytest.raises(TypeError, match="pass either Features or"):
        ebc(x, offsets, B)
    bad = named(ebc, values, offsets, [4, 3, 2, 1, 0])
    bad.values[int(bad.offsets[B])] = 20  # first id of "b2", stored second
    with pytest.raises(ValueError, match=r"=20 \(feature 'b2', table 'b'\) must be in \[0, 20\)"):
        ebc(bad)


def test_checks_on_the_device_path_are_device_side_asserts_without_a_host_sync():
    """On a device the id and offset checks must not read a value back (issue 24): they assert there."""
    from recstream.hostpath import device_path
    from recstream.testing import SyncCounter

    ebc = EmbeddingBagCollection([EmbeddingTableConfig("user", 10, 4)])
    values, offsets = torch.tensor([1, 7, 3]), torch.tensor([0, 1, 2, 3])
    with device_path(), SyncCounter() as counter:
        ebc(values, offsets, 3)
    assert counter.syncs == 0 and counter.sync_ops == {}
    with device_path(), pytest.raises(RuntimeError, match="an id lies outside"):
        ebc(torch.tensor([1, 10, 3]), offsets, 3)
    with device_path(), pytest.raises(RuntimeError, match="offsets must start at 0"):
        ebc(values, torch.tensor([0, 2, 1, 3]), 3)
    with pytest.raises(ValueError, match=r"values\[1\]=10"):  # the host path still names the id
        ebc(torch.tensor([1, 10, 3]), offsets, 3)


def test_device_asserts_fit_cuda_whatever_the_tables(monkeypatch):
    """CUDA refuses an assert message over 254 bytes at the call (a CPU accepts it), so a message
    listing the tables failed every built-in model's first step on a GPU."""
    from recstream.hostpath import device_path

    messages = []
    real = torch._assert_async
    monkeypatch.setattr(torch, "_assert_async", lambda ok, msg: (messages.append(msg), real(ok, msg))[1])
    tables = [EmbeddingTableConfig(f"a_rather_long_table_name_{i}", 100_000, 4) for i in range(26)]
    ebc = EmbeddingBagCollection(tables)
    values, offsets = torch.arange(26) * 7, torch.arange(27)
    with device_path():
        out = ebc(values, offsets, 1)
    assert out.shape == (1, 26 * 4)
    assert len(messages) == 2 and max(len(m.encode()) for m in messages) <= 254, messages


class _Ops(TorchDispatchMode):
    """Counts the non-view torch ops dispatched inside it."""
    n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += not func.is_view and func.overloadpacket is not torch.ops.aten.detach
        return func(*args, **(kwargs or {}))


def test_collections_reading_one_batch_in_a_step_reorder_and_check_it_once():
    """A wide and a deep collection of one schema (WideDeep's) read the same batch: within a step
    (`hostpath.one_step`, entered by the training cell) its features are reordered, its offsets and
    ids checked and its ids mapped to fused rows once, by the first; a batch written in place since
    is reordered and checked again."""
    from recstream.hostpath import device_path, one_step

    tables = [EmbeddingTableConfig("a", 10, 4), EmbeddingTableConfig("d", 5, 4, pooling="mean")]
    deep, wide = EmbeddingBagCollection(tables), EmbeddingBagCollection([
        EmbeddingTableConfig("a", 10, 1), EmbeddingTableConfig("d", 5, 1, pooling="mean")])
    other = EmbeddingBagCollection([EmbeddingTableConfig("d", 5, 4, pooling="mean"), EmbeddingTableConfig("a", 10, 4)])
    # a feature the collections do not read sits between theirs: each needs the batch reordered
    batch = Features.from_lengths(torch.zeros(3, 0), torch.tensor([1, 7, 3, 50, 60, 70, 0, 4, 4, 2]),
                                  torch.tensor([[1, 1, 1], [1, 1, 1], [2, 1, 1]]), keys=["a", "dyn", "d"]).to("cpu")
    expected = deep(batch), wide(batch)
    with device_path():
        alone = []
        for ebc in (deep, wide):
            with _Ops() as ops:
                ebc(batch)
            alone.append(ops.n)
        with one_step():
            with _Ops() as first:
                out_deep = deep(batch)
            with _Ops() as second:
                out_wide = wide(batch)
            out_other = other(batch)  # its tables' rows lie elsewhere: its own fused rows
            batch.values.add_(0)  # written in place: nothing derived from it before is reused
            with _Ops() as again:
                wide(batch)
    assert torch.equal(out_deep, expected[0]) and torch.equal(out_wide, expected[1])
    assert torch.equal(out_other, other(batch))
    assert first.n == alone[0] and again.n == alone[1]
    # the reordering (3 ops: a sized batch's slices), the offsets' check (7), the ids' check (6) and each
    # id's feature and fused row (6: the tables' rows line up in both collections) are not made again
    assert second.n <= alone[1] - 22, (alone, second.n)


def test_a_step_in_inference_mode_reads_its_batch_without_a_memo():
    """Inference tensors keep no version counter: a step in inference mode reorders and checks its
    batch every time, with the results of a step outside it."""
    from recstream.hostpath import device_path, one_step

    ebc = EmbeddingBagCollection([EmbeddingTableConfig("a", 10, 4), EmbeddingTableConfig("d", 5, 4)])
    with torch.inference_mode():
        batch = Features.from_lengths(torch.zeros(2, 0), torch.tensor([1, 3, 50, 60, 4]),
                                      torch.tensor([[1, 1], [1, 1], [0, 1]]), keys=["a", "dyn", "d"]).to("cpu")
        with device_path(), one_step():
            twice = [ebc(batch), ebc(batch)]
    expected = ebc(batch)
    assert all(torch.equal(out, expected) for out in twice)
