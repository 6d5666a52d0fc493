import tracemalloc

import numpy as np
import pytest
import torch

from recstream.data import SyntheticCTR, roc_auc


def small(**kw):
    args = dict(num_dense=4, num_categorical=6, vocab_sizes=[20, 100, 1000, 10_000, 100, 1000],
                batch_size=2048, seed=3)
    args.update(kw)
    return SyntheticCTR(**args)


def test_shapes_schema_and_determinism():
    gen = small()
    a, b = list(gen.train_batches(2)), list(gen.train_batches(2))
    assert len(a) == 2 and gen.train_batches(2).get_dataset_size() == 2
    for x, y in zip(a, b, strict=True):  # re-iterable and deterministic
        assert torch.equal(x.features.values, y.features.values) and torch.equal(x.labels, y.labels)
        x.features.validate(gen.schema)
    assert a[0].features.dense.shape == (2048, 4) and a[0].features.values.shape == (6 * 2048,)
    assert not torch.equal(a[0].features.values, a[1].features.values)
    (later,) = gen.train_batches(1, start=1)  # batch i depends only on (seed, i)
    assert torch.equal(later.features.values, a[1].features.values)
    other = list(small(seed=4).train_batches(1))[0]
    assert not torch.equal(other.features.values, a[0].features.values)
    test = next(iter(gen.test_split(4096)))
    assert not torch.equal(test.features.values[:100], a[0].features.values[:100])
    assert torch.equal(test.labels, next(iter(gen.test_split(4096))).labels)


def test_ids_follow_a_power_law():
    gen = SyntheticCTR(num_dense=1, num_categorical=1, vocab_sizes=[10 ** 6], zipf_alpha=1.1, batch_size=200_000)
    (f, _), = gen.train_batches(1)
    counts = np.sort(np.bincount(f.values.numpy()))[::-1]
    ranks = np.arange(1, 101)
    slope = np.polyfit(np.log(ranks[2:]), np.log(counts[2:100]), 1)[0]  # skip the first ranks' bias
    assert -1.3 < slope < -0.9
    assert counts[0] > 50 * np.median(counts[counts > 0])


def test_huge_vocab_in_constant_memory():
    tracemalloc.start()
    gen = SyntheticCTR(num_dense=2, num_categorical=3, vocab_sizes=[10 ** 8, 10 ** 8, 2 ** 31], batch_size=4096)
    (f, _), = gen.train_batches(1)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 20 * 2 ** 20  # a table of 10**8 effects alone would be 800 MB
    ids = f.values.view(3, -1)
    assert int(ids.max()) >= 10 ** 6 and int(ids.min()) >= 0 and int(ids[0].max()) < 10 ** 8
    assert len(np.unique(ids[0].numpy())) > 500  # scattered over the id space, not 0..k
    effects = gen.id_effect(0, np.array([0, 5 * 10 ** 7, 10 ** 8 - 1]))
    assert effects.shape == (3,) and np.isfinite(effects).all()
    with pytest.raises(ValueError, match="'ids' must be in"):
        gen.id_effect(0, [10 ** 8])


def test_hash_buckets_option():
    gen = SyntheticCTR(num_dense=1, num_categorical=2, vocab_sizes=[50, 10 ** 8], hash_buckets=1000, batch_size=512)
    assert gen.schema.categorical[0].vocab_size == 50 and gen.schema.categorical[1].hash_buckets == 1000
    (f, _), = gen.train_batches(1)
    f.validate(gen.schema)


def test_effects_sit_on_frequent_ids():
    gen = small()
    (f, _), = gen.train_batches(1)
    ids = f.values.view(6, -1)[3].numpy()  # the 10_000-id feature
    counts = np.bincount(ids, minlength=10_000)
    frequent, rare = np.argsort(counts)[-20:], np.flatnonzero(counts == 1)
    assert np.abs(gen.id_effect(3, frequent)).mean() > 3 * np.abs(gen.id_effect(3, rare)).mean()


def test_labels_follow_probabilities_and_bayes_auc():
    gen = small()
    bayes = gen.bayes_auc(50_000)
    assert bayes == gen.bayes_auc(50_000) and 0.65 < bayes < 0.9
    (f, y), = gen.test_split(50_000, batch_size=50_000)
    assert 0.15 < float(y.mean()) < 0.45
    assert roc_auc(f.dense[:, 0].numpy(), y.numpy()) < bayes  # one feature alone is worse
    default = SyntheticCTR()
    assert 0.75 < default.bayes_auc(20_000) < 0.86  # Criteo-like difficulty


@pytest.fixture
def one_thread():
    # tiny torch ops: OpenMP barriers only cost time on a shared 2-core box
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def test_a_simple_model_gets_close_to_bayes(one_thread):
    """Counts-based target encoding + logistic regression: a real (if simple) model."""
    gen = small(num_interactions=0)
    bayes = gen.bayes_auc(50_000)
    batches = list(gen.train_batches(100))
    ids = np.concatenate([b.features.values.view(6, -1).numpy() for b in batches], 1)
    dense = np.concatenate([b.features.dense.numpy() for b in batches])
    y = np.concatenate([b.labels.numpy() for b in batches])
    prior, a, tables = y.mean(), 20.0, []
    for f, v in enumerate(gen.vocab_sizes):
        n, s = np.bincount(ids[f], minlength=v), np.bincount(ids[f], weights=y, minlength=v)
        p = (s + a * prior) / (n + a)
        tables.append(np.log(p / (1 - p)))

    def encode(ids, dense):
        cols = np.stack([tables[f][ids[f]] for f in range(6)], 1)
        return torch.tensor(np.concatenate([dense, cols], 1), dtype=torch.float32)

    x, target = encode(ids, dense), torch.from_numpy(y)
    lin = torch.nn.Linear(x.shape[1], 1)
    opt = torch.optim.LBFGS(lin.parameters(), max_iter=50)

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(lin(x).squeeze(-1), target)
        loss.backward()
        return loss

    opt.step(closure)
    (f, yt), = gen.test_split(50_000, batch_size=50_000)
    with torch.no_grad():
        scores = lin(encode(f.values.view(6, -1).numpy(), f.dense.numpy())).squeeze(-1).numpy()
    assert bayes - roc_auc(scores, yt.numpy()) < 0.015


def test_roc_auc():
    assert roc_auc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]) == 0.75
    assert roc_auc([1, 1, 1], [0, 1, 1]) == 0.5
    with pytest.raises(ValueError, match="both classes"):
        roc_auc([0.1, 0.2], [1, 1])


@pytest.mark.parametrize("kwargs, match", [
    (dict(vocab_sizes=[10]), "needs 26 entries"),
    (dict(num_categorical=1, vocab_sizes=[0]), "'vocab_sizes\\[0\\]' must be an int >= 1 and <= 2147483648, got 0"),
    (dict(zipf_alpha=-1), "'zipf_alpha'"),
    (dict(num_dense=-1), "'num_dense'"),
    (dict(batch_size=0), "'batch_size'"),
])
def test_argument_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SyntheticCTR(**kwargs)


@pytest.mark.parametrize("kwargs, match", [
    (dict(num_dense=2.0), "SyntheticCTR: 'num_dense' must be an int >= 0, got 2.0 \\(float\\)"),
    (dict(vocab_sizes=10, num_categorical=1), "'vocab_sizes' must be a sequence of ints"),
    (dict(batch_size="64"), "'batch_size'"),
])
def test_argument_type_errors(kwargs, match):
    with pytest.raises(TypeError, match=match):
        SyntheticCTR(**kwargs)
