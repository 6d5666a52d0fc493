"""Cross features in the models: the linear/wide part gets a width-1 table per cross (trained by the
wide FTRL of `default_optimizer`), the deep embeddings only the crosses of ``deep=True``."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch
from torch import nn

from recstream.data import CategoricalFeature, CrossFeature, Schema
from recstream.data.convert import ColumnConverter, with_crosses
from recstream.models import DLRM, DCNv2, DeepFM, LinearTerm, WideDeep, default_optimizer
from recstream.optim import FTRL


def schema(deep: bool = False) -> Schema:
    return Schema(["x"], [CategoricalFeature("user", hash_buckets=64, embedding_dim=4),
                          CategoricalFeature("genre", vocab_size=6, embedding_dim=4, multi_hot=True),
                          CategoricalFeature("city", dynamic=True, capacity=50, embedding_dim=4)],
                  crosses=[CrossFeature("user_x_genre", ("user", "genre"), hash_buckets=4096, embedding_dim=4),
                           CrossFeature("user_x_city", ("user", "city"), hash_buckets=512, embedding_dim=4,
                                        deep=deep)])


def batch(s: Schema, n: int = 256, seed: int = 0):
    """Clicks of a pure interaction: user u likes genre (u mod 6) -- no first-order signal at all."""
    rng = np.random.default_rng(seed)
    users = rng.integers(0, 40, n)
    genres = rng.integers(0, 6, n)
    label = (genres == users % 6).astype(np.float64)
    t = pa.table({"label": label, "x": rng.normal(size=n), "user": [f"u{u}" for u in users],
                  "genre": [[int(g)] for g in genres], "city": rng.integers(0, 5, n)})
    b, faults = ColumnConverter(s).convert(t)
    assert not faults
    return b


def test_wide_deep_feeds_crosses_to_the_wide_part_only():
    s = schema()
    net = WideDeep(s, hidden=(8,))
    assert net.wide.ebc.feature_names == ["user", "genre", "user_x_genre", "user_x_city"]
    assert net.wide.ebc.table_weight("user_x_genre").shape == (4096, 1)
    assert net.embedding.ebc.feature_names == ["user", "genre"]  # city: a dynamic table; crosses: none
    assert net.embedding.output_dim == 12
    deep = WideDeep(schema(deep=True), hidden=(8,))
    assert deep.embedding.ebc.feature_names == ["user", "genre", "user_x_city"]
    assert deep.wide.ebc.feature_names == net.wide.ebc.feature_names
    b = batch(s, 8)
    assert net(b.features).shape == (8,) and deep(b.features).shape == (8,)


def test_default_optimizer_trains_the_cross_weights_with_the_wide_ftrl():
    s = schema()
    net = WideDeep(s, hidden=(8,))
    opt = default_optimizer(net, wide_l2=1e-3)
    wide = opt.optimizers["wide"]
    assert isinstance(wide, FTRL) and wide.param_groups[0]["l2"] == 1e-3
    cross_storage = net.wide.ebc.table_weight("user_x_genre")
    owners = [name for name, o in opt.optimizers.items() for g in o.param_groups for p in g["params"]
              if p.data_ptr() <= cross_storage.data_ptr() < p.data_ptr() + p.numel() * p.element_size()]
    assert owners == ["wide"]
    loss_fn = nn.BCEWithLogitsLoss()
    b = batch(s)
    for _ in range(30):
        opt.zero_grad()
        loss_fn(net(b.features), b.labels).backward()
        opt.step()
    touched = net.wide.ebc.table_weight("user_x_genre").detach().squeeze(1)
    seen = b.features.bag("user_x_genre")[0].unique()
    assert bool((touched[seen] != 0).all()) and int((touched != 0).sum()) == seen.numel()


def test_a_linear_model_learns_an_interaction_only_through_its_cross():
    """The label is a pure user x genre interaction: a logistic regression with the cross fits it,
    the same model without it cannot (the cross is what carries the signal)."""
    with_cross = schema()
    without = Schema(with_cross.dense, with_cross.categorical)
    losses = {}
    for name, s in (("cross", with_cross), ("plain", without)):
        torch.manual_seed(0)
        lin = LinearTerm(s)
        opt = default_optimizer(lin, wide_lr=0.5)
        b = batch(s, 1024)
        for _ in range(60):
            opt.zero_grad()
            loss = nn.functional.binary_cross_entropy_with_logits(lin(b.features), b.labels)
            loss.backward()
            opt.step()
        losses[name] = float(loss.detach())
    assert losses["cross"] < 0.7 * losses["plain"], losses  # plain: ~ the base rate's entropy (0.45)


@pytest.mark.parametrize("model", [DeepFM, DCNv2, DLRM])
def test_other_models_embed_only_deep_crosses(model):
    kwargs = {"embedding_dim": 4} if model is not DLRM else {"bottom": (4,), "top": (8,), "embedding_dim": 4}
    if model is not DLRM:
        kwargs["hidden"] = (8,)
    for deep in (False, True):
        s = schema(deep)
        net = model(s, **kwargs)
        names = net.embedding.ebc.feature_names
        assert ("user_x_city" in names) == deep and "user_x_genre" not in names
        out = net(batch(s, 16).features)
        assert out.shape == (16,) and bool(torch.isfinite(out).all())


def test_unnamed_inputs_with_crosses_are_read_in_schema_order():
    s = schema()
    net = WideDeep(s, hidden=(8,)).eval()
    f = batch(s, 16).features
    unnamed = type(f)(f.dense, f.values, f.offsets, f.batch_size, f.num_features, None)
    with torch.no_grad():
        assert torch.equal(net(unnamed), net(f))
    short = type(f)(f.dense, f.values, f.offsets, f.batch_size, 4, None)
    with pytest.raises(ValueError, match=r"has 4 categorical features, the schema has 3 .* and 2 crosses"):
        net(short)


def test_batches_without_their_crosses_are_refused_with_the_fix():
    s = schema()
    net = WideDeep(s, hidden=(8,))
    f = batch(s, 8).features
    plain = f.select(list(s.categorical_names))
    with pytest.raises(ValueError, match=r"lack the crosses \['user_x_genre', 'user_x_city'\].*with_crosses"):
        net(plain)
    assert net(with_crosses(s, plain)).shape == (8,)
