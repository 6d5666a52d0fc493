import numpy as np
import pytest
import torch

from recstream.data import Batch, CategoricalFeature, Features, Rebatcher, Schema


def random_features(b=7, sizes=(5, 9, 4), max_len=(1, 3, 2), seed=0):
    """Features plus the per-(feature, example) id lists they should hold."""
    rng = np.random.default_rng(seed)
    bags = [[rng.integers(0, sizes[f], rng.integers(0 if max_len[f] > 1 else 1, max_len[f] + 1)).tolist()
             for _ in range(b)] for f in range(len(sizes))]
    lengths = torch.tensor([[len(x) for x in feat] for feat in bags])
    values = torch.tensor([i for feat in bags for bag in feat for i in bag], dtype=torch.int64)
    dense = torch.from_numpy(rng.standard_normal((b, 2)).astype(np.float32))
    return Features.from_lengths(dense, values, lengths), bags


def bags_of(f: Features):
    return [[f.values[f.offsets[k * f.batch_size + i]: f.offsets[k * f.batch_size + i + 1]].tolist()
             for i in range(f.batch_size)] for k in range(f.num_features)]


def test_feature_major_layout():
    f, bags = random_features()
    assert f.offsets.shape == (3 * 7 + 1,) and f.offsets.dtype == torch.int64
    assert bags_of(f) == bags
    values, offsets = f.bag(1)
    assert [values[offsets[i]:offsets[i + 1]].tolist() for i in range(7)] == bags[1]


def test_fused_ids_match_per_table_embedding_bags():
    f, _ = random_features()
    sizes = [5, 9, 4]
    tables = [torch.randn(n, 3) for n in sizes]
    fused = torch.nn.EmbeddingBag(sum(sizes), 3, mode="sum", include_last_offset=True)
    fused.weight.data = torch.cat(tables)
    out = fused(f.fused_ids([0, 5, 14]), f.offsets).view(3, 7, 3)
    for k in range(3):
        values, offsets = f.bag(k)
        ref = torch.nn.functional.embedding_bag(values, tables[k], offsets, mode="sum", include_last_offset=True)
        torch.testing.assert_close(out[k], ref)


def test_take_slice_concat_match_reference():
    f, bags = random_features(b=9, seed=3)
    rows = [4, 0, 8, 4]
    t = f.take(torch.tensor(rows))
    assert bags_of(t) == [[feat[r] for r in rows] for feat in bags]
    torch.testing.assert_close(t.dense, f.dense[rows])
    s = f.slice(2, 6)
    assert bags_of(s) == [feat[2:6] for feat in bags] and s.batch_size == 4
    g, gbags = random_features(b=4, seed=5)
    c = Features.concat([s, g])
    assert bags_of(c) == [a + b for a, b in zip([feat[2:6] for feat in bags], gbags, strict=True)]
    assert c.batch_size == 8 and c.dense.shape == (8, 2)
    with pytest.raises(IndexError, match="'rows' must be in"):
        f.take(torch.tensor([9]))


def test_batch_is_a_two_tuple():
    f, _ = random_features(b=3)
    batch = Batch(f, torch.tensor([0.0, 1.0, 1.0]))
    features, labels = batch
    assert features is f and len(batch) == 2 and batch.batch_size == 3
    moved = batch.to("cpu", non_blocking=True)
    assert isinstance(moved, Batch) and torch.equal(moved.labels, batch.labels)
    sub = Batch.concat([batch.slice(0, 1), batch.take([2])])
    assert sub.labels.tolist() == [0.0, 1.0] and sub.features.batch_size == 2


def schema_for(multi=(False, True, True)):
    return Schema(["a", "b"], [CategoricalFeature(f"c{k}", vocab_size=n, multi_hot=m, max_len=3 if m else None)
                               for k, (n, m) in enumerate(zip((5, 9, 4), multi, strict=True))])


def test_validate_accepts_good_and_names_the_problem():
    f, _ = random_features()
    f.validate(schema_for())
    bad_values = f.values.clone()
    bad_values[0] = 5  # feature c0 has vocab 5
    with pytest.raises(ValueError, match="feature 'c0': example 0 has id 5 outside \\[0, 5\\)"):
        Features(f.dense, bad_values, f.offsets, 7, 3).validate(schema_for())
    with pytest.raises(ValueError, match="single-hot"):
        f.validate(schema_for(multi=(False, False, True)))
    with pytest.raises(ValueError, match="dense must be float32"):
        Features(f.dense.double(), f.values, f.offsets, 7, 3).validate(schema_for())
    with pytest.raises(ValueError, match="offsets must start at 0 and end at len"):
        Features(f.dense, f.values[:-1], f.offsets, 7, 3).validate(schema_for())


def test_rebatcher_exact_sizes_and_order():
    f, _ = random_features(b=10)
    batch = Batch(f, torch.arange(10, dtype=torch.float32))
    r = Rebatcher(4)
    out = list(r.add(batch.slice(0, 3))) + list(r.add(batch.slice(3, 10))) + list(r.flush())
    assert [b.batch_size for b in out] == [4, 4, 2]
    assert torch.cat([b.labels for b in out]).tolist() == list(range(10))
    assert bags_of(Features.concat([b.features for b in out])) == bags_of(f)
    r = Rebatcher(4, drop_remainder=True)
    assert [b.batch_size for b in list(r.add(batch)) + list(r.flush())] == [4, 4]
    with pytest.raises(ValueError, match="'batch_size' must be an int >= 1, got 0"):
        Rebatcher(0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_to_cuda_and_back():
    f, bags = random_features()
    batch = Batch(f, torch.zeros(7)).pin_memory().to("cuda", non_blocking=True)
    assert batch.features.values.is_cuda and batch.labels.is_cuda
    assert bags_of(batch.features.take(torch.tensor([1, 0])).to("cpu")) == [[x[1], x[0]] for x in bags]


KEYS = ("c0", "c1", "c2")


def test_keys_survive_every_row_and_device_operation():
    f, _ = random_features()
    named = Features(f.dense, f.values, f.offsets, f.batch_size, f.num_features, keys=list(KEYS))
    assert named.keys == KEYS  # any sequence, stored as a tuple
    assert Features.from_lengths(f.dense, f.values, f.lengths(), keys=KEYS).keys == KEYS
    for g in (named.take([2, 0]), named.slice(1, 4), Features.concat([named, named]), named.to("cpu"),
              Batch(named, torch.zeros(7)).take([1]).features):
        assert g.keys == KEYS
    assert f.take([0]).keys is None
    if torch.cuda.is_available():
        assert named.pin_memory().keys == KEYS


def test_select_and_permute_by_name_and_position():
    f, bags = random_features()
    named = Features(f.dense, f.values, f.offsets, f.batch_size, f.num_features, keys=KEYS)
    assert named.select(KEYS) is named
    # (consecutive runs -- ["c1"], ["c1", "c2"], ["c0", "c1"] -- are views of the flat layout)
    for names in (["c2", "c0"], ["c1"], ["c2", "c1", "c0"], ["c1", "c2"], ["c0", "c1"]):
        g = named.select(names)
        assert g.keys == tuple(names) and g.num_features == len(names) and g.dense is f.dense
        assert bags_of(g) == [bags[KEYS.index(n)] for n in names]
        # The on-device path (torch, no host sync for a full reordering) gives the same result.
        idx = [KEYS.index(n) for n in names]
        values, offsets = named._permute_on_device(idx, complete=len(idx) == 3, sizes=None)
        assert torch.equal(values, g.values) and torch.equal(offsets, g.offsets)
        sizes = named.to("cpu").feature_sizes  # counted on the host: a subset's size without a device read
        values, offsets = named._permute_on_device(idx, complete=False, sizes=tuple(sizes[i] for i in idx))
        assert torch.equal(values, g.values) and torch.equal(offsets, g.offsets)
    assert bags_of(f.permute([2, 0])) == [bags[2], bags[0]] and f.permute([2, 0]).keys is None
    assert named.bag("c1")[0].tolist() == named.bag(1)[0].tolist() and named.position("c2") == 2
    with pytest.raises(KeyError, match="no feature 'nope'"):
        named.select(["nope"])
    with pytest.raises(KeyError, match="have no keys"):
        f.select(["c0"])
    with pytest.raises(TypeError, match="'names' must be a sequence of str"):
        named.select("c0")
    with pytest.raises(IndexError, match="out of range"):
        f.permute([3])


def test_a_sized_reordering_on_the_device_path_is_slices_and_two_concatenations():
    """With every feature's size known on the host (``feature_sizes``, set by `to`), a device-path
    reordering takes each feature's ids and offsets as slices at host bounds: a concatenation of each
    and a subtraction per moved feature (11 ops before: an index built on the device), the host
    path's result for every order and subset, empty bags included."""
    from itertools import permutations

    from torch.utils._python_dispatch import TorchDispatchMode

    from recstream.hostpath import device_path

    class Ops(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.n += not func.is_view
            return func(*args, **(kwargs or {}))

    f, _ = random_features()
    sized = f.to("cpu")
    assert sized.feature_sizes is not None
    for k in (1, 2, 3):
        for idx in permutations(range(3), k):
            host = f.permute(list(idx))
            with device_path(), Ops() as ops:
                dev = sized.permute(list(idx))
            assert torch.equal(dev.values, host.values) and torch.equal(dev.offsets, host.offsets), idx
            assert dev.feature_sizes == tuple(sized.feature_sizes[i] for i in idx)
            if list(idx) != [0, 1, 2]:
                assert ops.n <= 2 * (k > 1) + k - 1 + (idx[0] != 0), (idx, ops.n)


def test_keys_are_checked():
    f, _ = random_features()
    with pytest.raises(ValueError, match="Features: 'keys' must name all 3 features, got 2"):
        Features(f.dense, f.values, f.offsets, 7, 3, keys=("a", "b"))
    with pytest.raises(ValueError, match=r"Features: 'keys' must be unique, duplicated: \['a'\]"):
        Features(f.dense, f.values, f.offsets, 7, 3, keys=("a", "b", "a"))
    with pytest.raises(TypeError, match="Features: 'keys' must be a sequence of str or None"):
        Features(f.dense, f.values, f.offsets, 7, 3, keys="abc")
    with pytest.raises(TypeError, match=r"Features: 'keys\[\]' must be a non-empty str, got 1 \(int\)"):
        Features(f.dense, f.values, f.offsets, 7, 3, keys=("a", "b", 1))
    named = Features(f.dense, f.values, f.offsets, 7, 3, keys=KEYS)
    with pytest.raises(ValueError, match="parts have different keys"):
        Features.concat([named, f])


def test_schema_checks_named_features():
    f, _ = random_features()
    named = Features(f.dense, f.values, f.offsets, 7, 3, keys=KEYS)
    assert named.validate(schema_for()) is named
    schema_for().check_features(named)
    with pytest.raises(ValueError, match=r"feature keys \['c0', 'c2', 'c1'\] do not match the schema"):
        named.select(["c0", "c2", "c1"]).validate(schema_for())


def test_a_loss_weight_travels_with_the_batch_to_the_device_and_back():
    from recstream.data.batch import WeightedLabel, loss_weight, with_loss_weight
    from recstream.data.transfer import pin_memory, to_device

    f, _ = random_features(b=3)
    weighted = with_loss_weight(Batch(f, torch.ones(3)), 0.0)
    assert isinstance(weighted, Batch) and isinstance(weighted.labels, WeightedLabel)
    for moved in (to_device(weighted, "cpu"), weighted.to("cpu"), pin_memory(weighted) if torch.cuda.is_available()
                  else weighted):
        assert loss_weight(moved) == 0.0 and moved.labels.labels.tolist() == [1.0, 1.0, 1.0]
    assert loss_weight({"x": 1, "label": WeightedLabel(torch.ones(1), 0.5)}) == 0.5
    assert loss_weight(with_loss_weight([torch.zeros(1), torch.ones(1)], 2)) == 2.0
    assert loss_weight((torch.zeros(1), torch.ones(1))) is None and loss_weight(torch.zeros(1)) is None
    with pytest.raises(ValueError, match="'batch' must hold a label"):
        with_loss_weight(torch.zeros(2), 0.0)
