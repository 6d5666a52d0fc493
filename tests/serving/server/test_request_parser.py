"""InstanceParser: the training reader's transforms applied to JSON instances.

(The docstring examples of every module are run by pytest's ``--doctest-modules``.)
"""
import pyarrow as pa
import pytest
import torch

from recstream.data import CategoricalFeature, Schema
from recstream.data.hashing import hash_strings, to_buckets
from recstream.serving import InstanceParser, RequestError

SCHEMA = Schema(["n"], [CategoricalFeature("color", vocabulary=["red", "green"]),
                        CategoricalFeature("city", hash_buckets=100, multi_hot=True, max_len=2)])


def test_vocabulary_hashing_nulls_and_max_len():
    f = InstanceParser(SCHEMA).parse({"instances": [
        {"n": 1.0, "color": "green", "city": ["paris", 75, "rome"]},
        {"n": 2.0, "color": "blue", "city": []},
        {"n": 3.0, "color": None, "city": ["x"]},
    ]})
    city = to_buckets(hash_strings(pa.array(["paris", "75", "x"])), 100).tolist()
    # color: "green" -> 2, unknown "blue" -> 0, null -> 0; city cut to max_len=2, ints hash by their text
    assert f.values.tolist() == [2, 0, 0] + city
    assert f.lengths().tolist() == [[1, 1, 1], [2, 0, 1]]
    assert f.dense.tolist() == [[1.0], [2.0], [3.0]]


def test_preprocessing_matches_the_reader():
    p = InstanceParser(SCHEMA, {"fill_missing_dense": 0.0, "log1p_dense": True})
    f = p.parse({"instances": [{"n": None, "color": "red", "city": []}, {"n": -5, "color": "red", "city": []}]})
    assert f.dense.flatten().tolist() == [0.0, 0.0]  # null filled, negatives clipped by log1p(max(x, 0))
    with pytest.raises(RequestError, match="'n' must be a number"):
        InstanceParser(SCHEMA).parse({"instances": [{"n": None, "color": "red", "city": []}]})
    with pytest.raises(RequestError, match="must not contain null"):
        p.parse({"instances": [{"n": 1, "color": "red", "city": [None]}]})



MIXED = Schema(["a", "b"], [CategoricalFeature("id", vocab_size=30), CategoricalFeature("u", hash_buckets=64),
                            CategoricalFeature("ids", vocab_size=30, multi_hot=True, max_len=2),
                            CategoricalFeature("us", hash_buckets=64, multi_hot=True, max_len=3)])


@pytest.mark.parametrize("pre", [None, {"fill_missing_dense": 0.5, "log1p_dense": True}])
def test_the_direct_path_builds_exactly_what_the_reader_converter_builds(pre):
    import numpy as np
    rng = np.random.default_rng(3)
    rows = []
    for i in range(40):
        rows.append({"a": None if (pre and i % 7 == 0) else float(rng.normal() * 10), "b": int(rng.integers(-5, 5)),
                     "id": int(rng.integers(0, 30)), "u": None if i % 5 == 0 else (f"user{i}" if i % 2 else i),
                     "ids": rng.integers(0, 30, int(rng.integers(0, 4))).tolist(),
                     "us": ["", "x", f"t{i}", 7, "y"][: int(rng.integers(0, 6))]})
    p = InstanceParser(MIXED, pre)
    assert p.direct
    parts = [p.columns(rows[:10]), p.columns(rows[10:11]), p.columns(rows[11:])]
    direct, errors = p.convert(parts)
    p.direct = False  # the reader's ColumnConverter, as training sees the same values
    reader, _ = p.convert(parts)
    assert errors == [None] * 3
    for name in ("dense", "values", "offsets"):
        assert torch.equal(getattr(direct, name), getattr(reader, name)), name
    assert direct.keys == reader.keys and direct.batch_size == reader.batch_size == 40


def test_a_request_missing_many_fields_gets_a_short_error_that_points_to_the_schema():
    from recstream.data import criteo_schema
    parser = InstanceParser(criteo_schema(1000, 4), {"fill_missing_dense": 0.0, "log1p_dense": True})
    with pytest.raises(RequestError) as e:
        parser.parse({"instances": [{"I1": 3, "C7": "ab"}]})
    assert e.value.message == ("instance 0: missing 37 field(s): 'C1', 'C10', 'C11', 'C12', 'C13', ... "
                               "(GET /schema lists every field with its type)")
    assert e.value.details["missing"] == 37 and len(e.value.details["fields"]) == 11  # 10 names and "..."
    described = parser.describe()
    assert [f["name"] for f in described["fields"]] == [*[f"I{i}" for i in range(1, 14)],
                                                         *[f"C{i}" for i in range(1, 27)]]
    assert described["fields"][0] == {"name": "I1", "kind": "dense", "type": "number", "nullable": True}
    assert described["preprocessing"] == {"fill_missing_dense": 0.0, "log1p_dense": True}
    assert parser.parse({"instances": [described["example"]]}).batch_size == 1  # the example is valid


def test_describe_names_vocabulary_dynamic_and_multi_hot_features():
    schema = Schema([], [CategoricalFeature("g", vocabulary=["drama", "comedy"], multi_hot=True, max_len=2),
                         CategoricalFeature("u", dynamic=True, capacity=16)])
    described = InstanceParser(schema).describe()
    assert described["fields"] == [
        {"name": "g", "kind": "categorical", "type": "string or integer (the raw value)", "nullable": False,
         "vocabulary_size": 2, "list": True, "max_len": 2},
        {"name": "u", "kind": "categorical", "type": "integer (int64) or non-empty string", "nullable": False,
         "dynamic": True}]
    assert described["example"] == {"g": ["drama"], "u": 1}
    assert InstanceParser(schema).parse({"instances": [described["example"]]}).batch_size == 1
