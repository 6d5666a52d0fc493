import json

import pytest

from recstream.data import CategoricalFeature, DenseFeature, Schema, num_embeddings


def make_schema():
    return Schema(
        ["price", DenseFeature("age")],
        [CategoricalFeature("item", vocab_size=1000, embedding_dim=8),
         CategoricalFeature("user", hash_buckets=5000),
         CategoricalFeature("tags", hash_buckets=64, multi_hot=True, max_len=5, pooling="mean", separator=";"),
         CategoricalFeature("color", vocabulary=["red", "green"])],
        label="click")


def test_sizes_and_names():
    s = make_schema()
    assert s.dense_names == ("price", "age")
    assert s.categorical_names == ("item", "user", "tags", "color")
    assert s.columns == ("click", "price", "age", "item", "user", "tags", "color")
    assert s.table_sizes() == [1000, 5000, 64, 3]  # vocabulary: + id 0 for unknown
    assert s.num_embeddings("user") == 5000 and s.num_embeddings(0) == 1000
    assert num_embeddings(s.feature("color")) == 3
    assert s.feature("tags").hashed and not s.feature("item").hashed
    assert s.feature("color").vocab_size == 3


def test_json_round_trip():
    s = make_schema()
    text = json.dumps(s.to_dict())
    back = Schema.from_dict(json.loads(text))
    assert back == s and hash(back) == hash(s)
    assert back.feature("tags").separator == ";" and back.feature("tags").pooling == "mean"
    assert back.feature("color").vocabulary == ("red", "green")


def test_from_dict_rejects_unknown_version():
    d = make_schema().to_dict()
    d["version"] = 99
    with pytest.raises(ValueError, match="version"):
        Schema.from_dict(d)


@pytest.mark.parametrize("kwargs, match", [
    (dict(), "exactly one of 'vocab_size' or 'hash_buckets'"),
    (dict(vocab_size=10, hash_buckets=10), "exactly one"),
    (dict(vocab_size=0), "'vocab_size' must be an int >= 1, got 0"),
    (dict(hash_buckets=1), "'hash_buckets' must be an int >= 2, got 1"),
    (dict(vocab_size=10, embedding_dim=0), "'embedding_dim'"),
    (dict(vocab_size=10, pooling="max"), "'pooling' must be one of"),
    (dict(vocab_size=10, max_len=3), "multi_hot features only"),
    (dict(vocab_size=10, multi_hot=True, max_len=0), "'max_len'"),
    (dict(vocab_size=10, multi_hot=True, separator=""), "'separator'"),
    (dict(vocabulary=["a", "a"]), "duplicate"),
    (dict(vocabulary=["a"], vocab_size=5), "len\\(vocabulary\\) \\+ 1 = 2"),
    (dict(vocabulary=["a"], hash_buckets=5), "exclusive"),
])
def test_categorical_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CategoricalFeature("c", **kwargs)


def test_type_errors():
    with pytest.raises(TypeError, match=r"'vocabulary\[\]' must be a str"):
        CategoricalFeature("c", vocabulary=["a", 1])
    with pytest.raises(ValueError, match="'name' must be a non-empty str"):
        DenseFeature("")
    with pytest.raises(TypeError, match=r"'categorical\[\]' must be a CategoricalFeature"):
        Schema(["x"], ["not a feature"])
    with pytest.raises(TypeError, match="single feature"):
        Schema("x")


def test_schema_rejects_duplicate_names():
    with pytest.raises(ValueError, match=r"duplicated: \['x'\]"):
        Schema(["x"], [CategoricalFeature("x", vocab_size=3)])
    with pytest.raises(ValueError, match=r"duplicated: \['label'\]"):
        Schema(["label"])
    with pytest.raises(ValueError, match="at least one"):
        Schema([], [])


def test_feature_lookup_errors():
    s = make_schema()
    with pytest.raises(KeyError, match="no categorical feature 'nope'"):
        s.feature("nope")
    with pytest.raises(IndexError, match="out of range"):
        s.feature(4)
