"""DriftingCTR: deterministic, re-iterable, a pinned Bayes AUC over time, and drift a model trained
once at the start really suffers from."""
import numpy as np
import pytest
import torch

from recstream import RecModel
from recstream.data import DriftingCTR, roc_auc
from recstream.data.streams import IterableStream
from recstream.models import DeepFM, default_optimizer


@pytest.fixture(autouse=True)
def single_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_deterministic_random_access_and_re_iterable():
    gen = DriftingCTR(num_batches=6, batch_size=64, seed=3)
    first, again = list(gen), list(gen)
    assert len(first) == 6 == gen.get_dataset_size()
    for a, b, c in zip(first, again, [gen.batch(t) for t in range(6)], strict=True):
        assert torch.equal(a.features.values, b.features.values) and torch.equal(a.labels, c.labels)
    other = DriftingCTR(num_batches=6, batch_size=64, seed=4).batch(0)
    assert not torch.equal(other.features.values, first[0].features.values)
    assert first[0].features.validate(gen.schema).keys == ("user", "item", "category")
    assert gen.probabilities(2).shape == (64,) and ((gen.probabilities(2) > 0) & (gen.probabilities(2) < 1)).all()


def test_population_grows_and_ids_are_raw_keys_or_buckets():
    dyn = DriftingCTR(num_batches=100, batch_size=256, seed=0)
    assert dyn.schema.feature("user").dynamic and dyn.schema.feature("user").capacity == dyn.table_size
    assert dyn.num_users(99) == dyn.initial_users + 99 * dyn.users_per_batch
    users = dyn.batch(0).features.bag("user")[0]
    assert int(users.max()) > 2 ** 40  # scattered raw ids, no vocabulary could hold them
    seen = set(dyn.batch(0).features.bag("user")[0].tolist())
    for t in range(1, 10):
        seen |= set(dyn.batch(t).features.bag("user")[0].tolist())
    late = dyn.batch(99).features.bag("user")[0].tolist()
    assert np.mean([u in seen for u in late]) < 0.5  # most late users are new
    hashed = DriftingCTR(num_batches=100, batch_size=256, seed=0, table="hashed", table_size=1000)
    ids = hashed.batch(0).features.bag("user")[0]
    assert hashed.schema.feature("user").hash_buckets == 1000 and int(ids.min()) >= 1 and int(ids.max()) < 1000
    assert torch.equal(hashed.batch(5).labels, dyn.batch(5).labels)  # the same events, other ids
    shared = DriftingCTR(num_batches=100, batch_size=256, seed=0, table="shared")
    assert {shared.schema.feature(n).table for n in ("user", "item")} == {"ids"}
    assert torch.equal(shared.batch(5).features.values, dyn.batch(5).features.values)  # the same raw keys


def test_bayes_auc_is_pinned_and_flat_over_time():
    gen = DriftingCTR(num_batches=200, batch_size=256, seed=0)
    curve = gen.bayes_curve(40)
    assert [s for s, _ in curve] == [0, 40, 80, 120, 160]
    aucs = [a for _, a in curve]
    assert all(0.84 < a < 0.90 for a in aucs), aucs
    assert max(aucs) - min(aucs) < 0.03
    b = gen.batch(7)
    assert gen.bayes_auc(7, 8) == pytest.approx(roc_auc(gen.probabilities(7), b.labels.numpy()))


def _auc(net, gen, start, stop):
    net.eval()
    with torch.no_grad():
        scores = [net(gen.batch(t).features).numpy() for t in range(start, stop)]
    return roc_auc(np.concatenate(scores), np.concatenate([gen.batch(t).labels.numpy() for t in range(start, stop)]))


def test_a_model_trained_once_at_the_start_loses_auc_later_while_online_training_keeps_up():
    gen = DriftingCTR(num_batches=200, batch_size=256, seed=0, table_size=4096)
    torch.manual_seed(0)
    net = DeepFM(gen.schema, hidden=(32, 16), embedding_dim=8)
    model = RecModel(net, torch.nn.BCEWithLogitsLoss(), default_optimizer(net, lr=1e-2), progress_bar=False)
    model.train(1, [gen.batch(t) for t in range(40)])
    early, late = _auc(net, gen, 40, 80), _auc(net, gen, 160, 200)
    assert early - late > 0.03, (early, late)  # drift: the same frozen model scores worse later
    assert gen.bayes_auc(160, 200) > gen.bayes_auc(40, 80) - 0.01  # while the task is no harder
    net.train()
    model.online_train(IterableStream(lambda: (gen.batch(t) for t in range(40, 160))), dataset_sink_mode=False)
    assert _auc(net, gen, 160, 200) > late + 0.03  # kept training online: it follows the drift
