"""ColdStartCTR: deterministic, ~43% of events by new users, attributes that predict them, user x genre
interactions in the truth, and a pinned Bayes AUC."""
import numpy as np
import pytest
import torch

from recstream import RecModel
from recstream.data import ColdStartCTR, roc_auc
from recstream.models import WideDeep, default_optimizer


def _new_user_share(gen, start, stop):
    seen, flags = set(), []
    for t in range(stop):
        users = gen.batch(t).features.bag("user")[0].tolist()
        if t >= start:
            flags += [u not in seen for u in users]
        seen.update(users)
    return float(np.mean(flags))


def test_deterministic_random_access_re_iterable_and_valid_for_its_schema():
    gen = ColdStartCTR(num_batches=5, batch_size=64, seed=3)
    first, again = list(gen), list(gen)
    assert len(first) == 5 == gen.get_dataset_size()
    for a, b, c in zip(first, again, [gen.batch(t) for t in range(5)], strict=True):
        assert torch.equal(a.features.values, b.features.values) and torch.equal(a.labels, c.labels)
        assert torch.equal(a.features.offsets, c.features.offsets)
    assert not torch.equal(ColdStartCTR(num_batches=5, batch_size=64, seed=4).batch(0).labels, first[0].labels)
    f = first[0].features.validate(gen.schema)
    assert f.keys == ("user", "item", "age", "gender", "occupation", "genres") and f.dense.shape == (64, 0)
    assert gen.schema.feature("user").dynamic and gen.schema.feature("genres").pooling == "mean"
    with pytest.raises(ValueError, match="'table'"):
        ColdStartCTR(table="shared")
    with pytest.raises(ValueError, match="'session_share'"):
        ColdStartCTR(session_share=1.5)


def test_genres_are_one_to_max_distinct_and_attributes_belong_to_the_user():
    gen = ColdStartCTR(num_batches=20, batch_size=256, seed=0, max_genres=3, num_genres=18)
    lengths = gen.batch(3).features.lengths()[5]
    assert int(lengths.min()) == 1 and int(lengths.max()) == 3
    attrs_of, genres_of = {}, {}
    for t in (0, 5, 19):
        f = gen.batch(t).features
        values, offsets = f.bag("genres")
        for b in range(f.batch_size):
            genres = values[offsets[b]:offsets[b + 1]].tolist()
            assert len(set(genres)) == len(genres) and all(0 <= g < 18 for g in genres)
            assert genres_of.setdefault(f.bag("item")[0][b].item(), genres) == genres
            attrs = tuple(f.bag(n)[0][b].item() for n in ("age", "gender", "occupation"))
            assert attrs_of.setdefault(f.bag("user")[0][b].item(), attrs) == attrs
    assert len(attrs_of) > 100 and len({a[2] for a in attrs_of.values()}) == 21
    hashed = ColdStartCTR(num_batches=20, batch_size=256, seed=0, table="hashed", table_size=1000)
    ids = hashed.batch(4).features.bag("user")[0]
    assert int(ids.min()) >= 1 and int(ids.max()) < 1000 and torch.equal(hashed.batch(4).labels, gen.batch(4).labels)


def test_about_43_percent_of_events_are_by_users_no_earlier_batch_had():
    assert 0.38 < _new_user_share(ColdStartCTR(num_batches=80, seed=0), 20, 80) < 0.48
    # the sessions of newcomers make it: without them, few events are by new users
    assert _new_user_share(ColdStartCTR(num_batches=80, seed=0, session_share=0.0), 20, 80) < 0.1


def test_labels_follow_the_true_probabilities_and_the_bayes_auc_is_pinned():
    gen = ColdStartCTR(num_batches=100, seed=0)
    assert 0.80 < gen.bayes_auc(20, 100) < 0.87
    b = gen.batch(7)
    assert gen.bayes_auc(7, 8) == pytest.approx(roc_auc(gen.probabilities(7), b.labels.numpy()))
    p = np.concatenate([gen.probabilities(t) for t in range(100)])
    y = np.concatenate([gen.batch(t).labels.numpy() for t in range(100)])
    assert abs(p.mean() - y.mean()) < 0.01 and 0.5 < y.mean() < 0.62


def test_the_truth_has_user_x_genre_and_attribute_x_genre_interactions_and_nothing_else():
    """logit(u1, i1) + logit(u2, i2) - logit(u1, i2) - logit(u2, i1) is 0 for a truth additive in user and item."""
    items = np.arange(1, 401, 2)

    def interaction(gen, u, v):
        u, v = np.resize(u, len(items)), np.resize(v, len(items))
        return gen.logits(u, items) + gen.logits(v, items[::-1]) - gen.logits(u, items[::-1]) - gen.logits(v, items)
    full, no_taste = ColdStartCTR(), ColdStartCTR(taste_scale=0.0)
    attrs = full.attributes(np.arange(5000))
    profile = attrs["age"] * 1000 + attrs["gender"] * 100 + attrs["occupation"]
    twins = [np.flatnonzero(profile == p)[:2] for p in np.unique(profile)]
    u, v = np.array([t for t in twins if len(t) == 2]).T  # pairs of users with the same attributes
    assert len(u) > 50
    # users with the same attributes interact with genres differently only through their own taste ...
    assert np.abs(interaction(full, u, v)).mean() > 0.3
    np.testing.assert_allclose(interaction(no_taste, u, v), 0, atol=1e-9)
    # ... users with other attributes also through attributes x genre ...
    assert np.abs(interaction(no_taste, u, v[::-1])).mean() > 0.1
    # ... and without taste and attribute terms the truth is additive
    np.testing.assert_allclose(interaction(ColdStartCTR(taste_scale=0.0, attribute_scale=0.0), u, v[::-1]), 0,
                               atol=1e-9)


def _occupation_auc_on_new_users(gen, train, test):
    """Score each new user's events by the click rate of their occupation so far."""
    clicks, counts, seen = np.zeros(21), np.zeros(21), set()
    for t in train:
        f, y = gen.batch(t).features, gen.batch(t).labels.numpy()
        np.add.at(clicks, f.bag("occupation")[0].numpy(), y)
        np.add.at(counts, f.bag("occupation")[0].numpy(), 1)
        seen.update(f.bag("user")[0].tolist())
    scores, labels = [], []
    for t in test:
        b = gen.batch(t)
        users, occupation = b.features.bag("user")[0].tolist(), b.features.bag("occupation")[0].numpy()
        new = np.array([u not in seen for u in users])
        scores.append(((clicks + 1) / (counts + 2))[occupation][new])
        labels.append(b.labels.numpy()[new])
        seen.update(users)
    return roc_auc(np.concatenate(scores), np.concatenate(labels))


def test_attributes_predict_the_label_of_a_user_never_seen():
    assert _occupation_auc_on_new_users(ColdStartCTR(num_batches=100, seed=0), range(60), range(60, 100)) > 0.57
    flat = ColdStartCTR(num_batches=100, seed=0, attribute_scale=0.0, attribute_share=0.0)
    assert _occupation_auc_on_new_users(flat, range(60), range(60, 100)) < 0.53


def test_a_model_trains_on_it_and_beats_chance_on_later_batches():
    torch.set_num_threads(1)
    gen = ColdStartCTR(num_batches=40, seed=0)
    torch.manual_seed(0)
    net = WideDeep(gen.schema, hidden=(16,))
    model = RecModel(net, torch.nn.BCEWithLogitsLoss(), default_optimizer(net, lr=1e-2), progress_bar=False)
    model.train(1, [gen.batch(t) for t in range(30)])
    net.eval()
    with torch.no_grad():
        scores = np.concatenate([net(gen.batch(t).features).numpy() for t in range(30, 40)])
    labels = np.concatenate([gen.batch(t).labels.numpy() for t in range(30, 40)])
    assert roc_auc(scores, labels) > 0.62
