"""CategoricalFeature(dynamic=True): validation, JSON round trip, and the raw int64 keys readers produce."""
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recstream.data import CategoricalFeature, CSVReader, ParquetReader, Schema, hash_strings
from recstream.data.convert import ColumnConverter


def test_round_trip_and_properties():
    f = CategoricalFeature("user", dynamic=True, capacity=1000, permit_filter_value=3, evict_filter_value=50)
    s = Schema(["x"], [f, CategoricalFeature("c", vocab_size=4)])
    assert Schema.from_dict(s.to_dict()) == s and s.to_dict()["categorical"][0]["capacity"] == 1000
    assert f.num_embeddings == 1000 and not f.hashed and s.dynamic_names == ("user",)
    assert Schema.from_dict(s.to_dict()).feature("user") == f


@pytest.mark.parametrize("kwargs, error, fragment", [
    (dict(dynamic=True), ValueError, "needs 'capacity'"),
    (dict(dynamic=True, capacity=10, vocab_size=5), ValueError, "no fixed id space"),
    (dict(dynamic=True, capacity=10, hash_buckets=5), ValueError, "no fixed id space"),
    (dict(dynamic=True, capacity=10, vocabulary=["a"]), ValueError, "no fixed id space"),
    (dict(dynamic=True, capacity=0), ValueError, "capacity"),
    (dict(dynamic=True, capacity=10, permit_filter_value=0), ValueError, "permit_filter_value"),
    (dict(dynamic=True, capacity=10, evict_filter_value=0), ValueError, "evict_filter_value"),
    (dict(dynamic=True, capacity="10"), TypeError, "capacity"),
    (dict(dynamic="yes", capacity=10), TypeError, "dynamic"),
    (dict(vocab_size=5, capacity=10), ValueError, "dynamic=True features only"),
    (dict(vocab_size=5, table="ids"), ValueError, "dynamic=True features only"),
    (dict(dynamic=True, capacity=10, table=""), ValueError, "table"),
    (dict(dynamic=True, capacity=10, table=3), TypeError, "table"),
    (dict(hash_buckets=5, permit_filter_value=2), ValueError, "dynamic=True features only"),
])
def test_validation(kwargs, error, fragment):
    with pytest.raises(error, match=fragment) as e:
        CategoricalFeature("user", **kwargs)
    assert "'user'" in str(e.value)


def test_a_shared_table_round_trips_and_its_features_must_admit_and_evict_alike():
    a = CategoricalFeature("user", dynamic=True, capacity=10, table="ids")
    s = Schema(["x"], [a, CategoricalFeature("item", dynamic=True, capacity=5, table="ids")])
    assert Schema.from_dict(s.to_dict()) == s and s.to_dict()["categorical"][1]["table"] == "ids"
    assert "table" not in Schema(["x"], [CategoricalFeature("u", dynamic=True, capacity=3)]).to_dict()["categorical"][0]
    for other in (dict(permit_filter_value=2), dict(evict_filter_value=9), dict(embedding_dim=8)):
        b = CategoricalFeature("item", dynamic=True, capacity=5, table="ids", **other)
        with pytest.raises(ValueError, match=r"table 'ids' need the same .* 'user' has \(1, None, 16\)"):
            Schema(["x"], [a, b])


def test_converter_keys_ints_as_themselves_and_hashes_other_strings():
    s = Schema(["x"], [CategoricalFeature("u", dynamic=True, capacity=8),
                       CategoricalFeature("t", dynamic=True, capacity=8, multi_hot=True)])
    conv = ColumnConverter(s)
    big = 2 ** 62 + 5
    batch, bad = conv.convert(pa.table({"label": [1, 0, 1], "x": [0.0, 1.0, 2.0], "u": [big, -1, 7],
                                        "t": [[1, 2], [], [3]]}))
    assert not bad and batch.features.bag("u")[0].tolist() == [big, -1, 7]
    text, bad = conv.convert(pa.table({"label": [1, 0, 1], "x": [0.0, 1.0, 2.0], "u": [str(big), "-1", "bob"],
                                       "t": ["1|2", "", "bob||3"]}))
    assert not bad
    bob = int(hash_strings(pa.array(["bob"])).view("int64")[0])
    assert text.features.bag("u")[0].tolist() == [big, -1, bob]  # CSV "12" is Parquet 12; other text hashed
    assert text.features.bag("t")[0].tolist() == [1, 2, bob, 3]
    _, bad = conv.convert(pa.table({"label": [1, 0], "x": [0.0, 1.0], "u": [None, "a"], "t": [[1], [2]]}))
    assert [(b.index, b.reason, b.column) for b in bad] == [(0, "missing_value", "u")]


def test_csv_and_parquet_readers_give_the_same_keys(tmp_path):
    s = Schema(["x"], [CategoricalFeature("u", dynamic=True, capacity=8)])
    pq.write_table(pa.table({"label": [1, 0], "x": [0.5, 1.5], "u": [123456789012, 5]}), tmp_path / "a.parquet")
    (tmp_path / "a.csv").write_text("label,x,u\n1,0.5,123456789012\n0,1.5,5\n")
    (p,), (c,) = list(ParquetReader(tmp_path / "a.parquet", s, batch_size=2)), list(CSVReader(tmp_path / "a.csv", s,
                                                                                               batch_size=2))
    assert p.features.values.tolist() == c.features.values.tolist() == [123456789012, 5]
    p.features.validate(s)
