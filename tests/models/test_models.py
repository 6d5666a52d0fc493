"""Building, forward shapes, pooling, state_dict round trips and bad arguments."""
import io

import pytest
import torch

from recstream.data import CategoricalFeature, Features, Schema
from recstream.models import DLRM, DCNv2, DeepFM, FeatureEmbedding, WideDeep

from .helpers import BUILDERS, MODEL_NAMES, mixed_schema, random_features


def _features(schema, batch_size=6, seed=0):
    return random_features(schema, batch_size, torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", MODEL_NAMES)
@pytest.mark.parametrize("num_dense", [3, 0])
def test_forward_shape_and_probabilities(name, num_dense):
    torch.manual_seed(0)
    schema = mixed_schema(num_dense)
    net = BUILDERS[name](schema)
    x = _features(schema, batch_size=7)
    out = net(x)
    assert out.shape == (7,) and out.dtype == torch.float32 and torch.isfinite(out).all()
    assert out.requires_grad
    p = net.predict_proba(x)
    assert not p.requires_grad and net.training  # predict_proba restores train mode
    torch.testing.assert_close(p, torch.sigmoid(out.detach()))


@pytest.mark.parametrize("name", ["widedeep", "dcnv2"])
def test_schema_widths_are_kept_when_embedding_dim_is_none(name):
    schema = mixed_schema()
    net = BUILDERS[name](schema, embedding_dim=None)
    assert net.embedding.dims == (4, 8, 4, 4)
    assert net(_features(schema)).shape == (6,)


@pytest.mark.parametrize("cls", [DeepFM, DLRM])
def test_field_models_need_equal_widths(cls):
    with pytest.raises(ValueError, match="embedding_dim"):
        cls(mixed_schema())  # widths 4, 8, 4, 4 and no override


def test_embeddings_use_one_fused_table_with_readable_keys():
    net = WideDeep(mixed_schema(), embedding_dim=4)
    fused = [n for n, _ in net.named_parameters() if "fused_weight" in n]
    assert fused == ["wide.ebc.fused_weight_dim1", "embedding.ebc.fused_weight_dim4"]
    keys = set(net.state_dict())
    assert {"embedding.ebc.tables.user.weight", "wide.ebc.tables.hist.weight"} <= keys
    assert net.embedding.ebc.sparse and net.wide.ebc.sparse


def _one_example(schema, bags, dense=None):
    """Features of one example; `bags` maps feature index -> list of ids."""
    lengths = torch.tensor([[len(bags[i])] for i in range(schema.num_categorical)])
    values = torch.tensor([v for i in range(schema.num_categorical) for v in bags[i]], dtype=torch.int64)
    dense = torch.zeros(1, schema.num_dense) if dense is None else dense
    return Features.from_lengths(dense, values, lengths)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_mean_pooling_and_sum_pooling_in_models(name):
    torch.manual_seed(1)
    schema = mixed_schema()
    net = BUILDERS[name](schema)
    base = {0: [3], 1: [7], 2: [5], 3: [11]}
    # "hist" is mean-pooled: repeating an id does not change the model's output...
    once = net(_one_example(schema, base))
    thrice = net(_one_example(schema, {**base, 3: [11, 11, 11]}))
    torch.testing.assert_close(thrice, once)
    # ...while "tags" is sum-pooled: repeating an id does.
    assert not torch.allclose(net(_one_example(schema, {**base, 2: [5, 5]})), once)
    # ...and [a, b] pools to the average of a and b.
    emb = net.embedding.ebc.table_weight("hist")
    x = _one_example(schema, {**base, 3: [11, 20]})
    pooled = net.embedding.ebc.split(net.embedding(x))["hist"][0]
    torch.testing.assert_close(pooled, (emb[11] + emb[20]) / 2)
    # "tags" is sum-pooled: [a, a] pools to 2 * row a.
    x = _one_example(schema, {**base, 2: [5, 5]})
    pooled = net.embedding.ebc.split(net.embedding(x))["tags"][0]
    torch.testing.assert_close(pooled, 2 * net.embedding.ebc.table_weight("tags")[5])
    # Empty multi-hot bags pool to zeros and still give a finite logit.
    x = _one_example(schema, {**base, 2: [], 3: []})
    parts = net.embedding.ebc.split(net.embedding(x))
    assert not parts["tags"].any() and not parts["hist"].any()
    assert torch.isfinite(net(x)).all()


def test_feature_embedding_fields_view():
    schema = mixed_schema()
    emb = FeatureEmbedding(schema, embedding_dim=5)
    x = _features(schema, batch_size=4)
    flat, fields = emb(x), emb.fields(x)
    assert flat.shape == (4, 20) and fields.shape == (4, 4, 5)
    torch.testing.assert_close(fields.flatten(1), flat)
    with pytest.raises(ValueError, match="widths differ"):
        FeatureEmbedding(schema).fields(x)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_state_dict_round_trip(name):
    schema = mixed_schema()
    torch.manual_seed(0)
    a = BUILDERS[name](schema)
    torch.manual_seed(1)
    b = BUILDERS[name](schema)
    x = _features(schema)
    assert not torch.allclose(a(x), b(x))
    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)
    buf.seek(0)
    b.load_state_dict(torch.load(buf))
    torch.testing.assert_close(a(x), b(x), rtol=0, atol=0)


def test_load_state_dict_rejects_a_different_schema():
    a = WideDeep(mixed_schema(), embedding_dim=4)
    other = Schema(["d0", "d1", "d2"], [CategoricalFeature("user", vocab_size=31), *mixed_schema().categorical[1:]])
    b = WideDeep(other, embedding_dim=4)
    with pytest.raises(RuntimeError, match="size mismatch"):
        b.load_state_dict(a.state_dict())


def test_dotted_feature_names_become_table_names():
    schema = Schema(["x"], [CategoricalFeature("user.id", vocab_size=5)])
    net = WideDeep(schema, hidden=(4,))
    assert "embedding.ebc.tables.user_id.weight" in net.state_dict()


@pytest.mark.parametrize("build, match, exc", [
    (lambda s: WideDeep("schema"), "'schema' must be a recstream.data.Schema", TypeError),
    (lambda s: WideDeep(Schema(["x"])), "at least one categorical", ValueError),
    (lambda s: WideDeep(s, hidden=(16, 0)), r"'hidden' must be a sequence of positive ints, got \(16, 0\)",
     ValueError),
    (lambda s: WideDeep(s, hidden="16"), "'hidden' must be a sequence", TypeError),
    (lambda s: WideDeep(s, embedding_dim=0), "'embedding_dim' must be an int >= 1 or None, got 0", ValueError),
    (lambda s: WideDeep(s, dropout=1.0), "'dropout' must be a finite number >= 0.0 and < 1.0, got 1.0",
     ValueError),
    (lambda s: WideDeep(s, activation="swish"), "'activation' must be one of", ValueError),
    (lambda s: WideDeep(s, wide_dense=1), "'wide_dense' must be a bool", TypeError),
    (lambda s: DeepFM(s, embedding_dim=2.5), "'embedding_dim' must be an int", TypeError),
    (lambda s: DCNv2(s, num_cross_layers=0), "'num_layers' must be an int >= 1, got 0", ValueError),
    (lambda s: DCNv2(s, structure="mixed"), r"'structure' must be one of \['stacked', 'parallel'\], got 'mixed'",
     ValueError),
    (lambda s: DCNv2(s, low_rank=0), "'low_rank' must be an int >= 1 or None, got 0", ValueError),
    (lambda s: DLRM(s, embedding_dim=4, bottom=[-1]), "'bottom' must be a sequence of positive ints", ValueError),
    (lambda s: DLRM(Schema([], [CategoricalFeature("a", vocab_size=3)]), embedding_dim=4),
     "no pair to interact", ValueError),
    (lambda s: FeatureEmbedding(s, init_std=-1.0), "'init_std' must be a finite number >= 0.0, got -1.0",
     ValueError),
])
def test_bad_arguments(build, match, exc):
    with pytest.raises(exc, match=match):
        build(mixed_schema())


def test_dlrm_single_feature_with_self_interaction_is_allowed():
    schema = Schema([], [CategoricalFeature("a", vocab_size=3)])
    net = DLRM(schema, embedding_dim=4, self_interaction=True)
    assert net(_features(schema)).shape == (6,)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_bad_inputs(name):
    schema = mixed_schema()
    net = BUILDERS[name](schema)
    x = _features(schema)
    with pytest.raises(TypeError, match="'features' must be a recstream.data.Features"):
        net(x.dense)
    fewer = Features(x.dense, x.values[:6], torch.arange(7), 6, 1)
    with pytest.raises(ValueError, match="has 1 categorical features, the schema has 4"):
        net(fewer)
    with pytest.raises(ValueError, match=r"'features.dense' must be \[batch_size, 3\]"):
        net(Features(x.dense[:, :2], x.values, x.offsets, 6, 4))
    bad = Features(x.dense, x.values.clone(), x.offsets, 6, 4)
    bad.values[0] = 30  # "user" has 30 rows: id 30 would read the next table's first row
    with pytest.raises(ValueError, match="must be in \\[0, 30\\)"):
        net(bad)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_named_features_are_matched_by_name(name):
    torch.manual_seed(3)
    schema = mixed_schema()
    net = BUILDERS[name](schema).eval()
    x = random_features(schema, 6, torch.Generator().manual_seed(4))
    keyed = Features(x.dense, x.values, x.offsets, x.batch_size, x.num_features, keys=schema.categorical_names)
    expected = net(x)
    torch.testing.assert_close(net(keyed), expected)
    torch.testing.assert_close(net(keyed.select(["hist", "user", "tags", "item"])), expected)
    with pytest.raises(ValueError, match="the features have no 'tags'"):
        net(keyed.select(["hist", "user", "item"]))


def test_dotted_feature_names_are_matched_by_name():
    schema = Schema(["x"], [CategoricalFeature("user.id", vocab_size=5), CategoricalFeature("item.id", vocab_size=7)])
    net = WideDeep(schema, hidden=(4,)).eval()
    x = _one_example(schema, {0: [3], 1: [6]}, torch.ones(1, 1))
    keyed = Features(x.dense, x.values, x.offsets, 1, 2, keys=("user.id", "item.id"))
    torch.testing.assert_close(net(keyed.select(["item.id", "user.id"])), net(x))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_same_logits_on_cuda(name):
    schema = mixed_schema()
    net = BUILDERS[name](schema)
    x = _features(schema)
    expected = net(x).detach()
    got = net.to("cuda")(x.to("cuda")).detach().cpu()
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
