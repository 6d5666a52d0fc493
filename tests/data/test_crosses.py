"""Cross features: the schema's CrossFeature (validation, round trip) and the ONE computation of
cross ids (`convert.cross_bags`) that the file readers, the stream decoders, the server's request
parser and `with_crosses` share."""
from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.csv  # noqa: F401  (pa.csv)
import pyarrow.parquet as pq
import pytest
import torch

from recstream.data import CategoricalFeature, CrossFeature, CSVReader, ParquetReader, Schema
from recstream.data.convert import ColumnConverter, cross_bags, with_crosses
from recstream.data.hashing import hash_strings, splitmix64, to_buckets
from recstream.data.streams import CSVLineDecoder, JSONDecoder
from recstream.features import Features
from recstream.serving.server.request import InstanceParser

SALT = 0xA24BAED4963EE407  # the documented position salt: a change would re-key every trained cross


def schema(vocabulary: bool = False) -> Schema:
    genre = (CategoricalFeature("genre", vocabulary=["drama", "comedy", "noir"], multi_hot=True) if vocabulary
             else CategoricalFeature("genre", hash_buckets=97, multi_hot=True))
    cats = [CategoricalFeature("user", dynamic=True, capacity=100), CategoricalFeature("item", hash_buckets=1000),
            CategoricalFeature("age", vocab_size=10), genre]
    return Schema(["x"], cats, crosses=[CrossFeature("user_x_item", ("user", "item"), hash_buckets=1 << 20),
                                        CrossFeature("age_x_genre", ("age", "genre"), hash_buckets=5000),
                                        CrossFeature("u_i_a", ("user", "item", "age"), hash_buckets=777, deep=True)])


ROWS = [{"label": 1.0, "x": 0.5, "user": "alice", "item": "i-9", "age": 3, "genre": ["drama", "noir"]},
        {"label": 0.0, "x": -1.0, "user": 42, "item": 7, "age": 0, "genre": []},
        {"label": 1.0, "x": 2.0, "user": "bob", "item": "i-9", "age": 9, "genre": ["comedy"]}]


def _mix(*ids: int) -> int:
    """The documented cross hash, one example, by hand (plain Python ints, no library code path)."""
    h = None
    for pos, i in enumerate(ids):
        m = int(splitmix64(np.array([(i + pos * SALT) % 2**64], dtype=np.uint64))[0])
        h = m if h is None else int(splitmix64(np.array([h ^ m], dtype=np.uint64))[0])
    return h


def _expected(s: Schema) -> dict[str, list[list[int]]]:
    """Cross bags of ROWS computed from the components' ids as documented."""
    def user(v):
        return v if isinstance(v, int) else int(hash_strings(pa.array([v])).view(np.int64)[0])

    def hashed(v, n):
        return int(to_buckets(hash_strings(pa.array([str(v)])), n)[0])

    genre = s.feature("genre")
    out = {"user_x_item": [], "age_x_genre": [], "u_i_a": []}
    for r in ROWS:
        u, i, a = user(r["user"]) % 2**64, hashed(r["item"], 1000), r["age"]
        g = [genre.vocabulary.index(v) + 1 if genre.vocabulary else hashed(v, 97) for v in r["genre"]]
        out["user_x_item"].append([int(to_buckets(np.array([_mix(u, i)], np.uint64), 1 << 20)[0])])
        out["age_x_genre"].append([int(to_buckets(np.array([_mix(a, x)], np.uint64), 5000)[0]) for x in g])
        out["u_i_a"].append([int(to_buckets(np.array([_mix(u, i, a)], np.uint64), 777)[0])])
    return out


def bags(features: Features, name: str) -> list[list[int]]:
    values, offsets = features.bag(name)
    return [values[offsets[k]: offsets[k + 1]].tolist() for k in range(features.batch_size)]


def table() -> pa.Table:
    return pa.table({"label": [r["label"] for r in ROWS], "x": [r["x"] for r in ROWS],
                     "user": [str(r["user"]) for r in ROWS], "item": [str(r["item"]) for r in ROWS],
                     "age": [r["age"] for r in ROWS], "genre": [r["genre"] for r in ROWS]})


# --- schema -----------------------------------------------------------------------------------
def test_schema_round_trip_carries_crosses_and_old_dicts_stay_as_they_were():
    s = schema()
    d = json.loads(json.dumps(s.to_dict()))
    assert Schema.from_dict(d) == s and Schema.from_dict(d).crosses == s.crosses
    assert s.feature_names == ("user", "item", "age", "genre", "user_x_item", "age_x_genre", "u_i_a")
    assert s.columns == ("label", "x", "user", "item", "age", "genre")  # crosses are computed, not read
    assert [t.multi_hot for t in s.cross_tables()] == [False, True, False]
    assert [t.name for t in s.cross_tables(deep_only=True)] == ["u_i_a"]
    plain = Schema(["x"], [CategoricalFeature("c", vocab_size=3)])
    assert "crosses" not in plain.to_dict()
    assert s != Schema(["x"], s.categorical)


@pytest.mark.parametrize("kwargs, error, words", [
    (dict(features="user"), TypeError, ["'features'", "str"]),
    (dict(features=("user",)), ValueError, ["at least 2", "['user']"]),
    (dict(features=("user", "user")), ValueError, ["more than once", "['user']"]),
    (dict(features=("user", 3)), TypeError, ["features[]", "int"]),
    (dict(hash_buckets=1), ValueError, ["hash_buckets", "1"]),
    (dict(hash_buckets="9"), TypeError, ["hash_buckets"]),
    (dict(deep=1), TypeError, ["deep"]),
])
def test_cross_feature_refuses_bad_arguments_by_name(kwargs, error, words):
    args = {"name": "x", "features": ("user", "item"), "hash_buckets": 100, **kwargs}
    with pytest.raises(error) as e:
        CrossFeature(**args)
    assert all(w in str(e.value) for w in words), str(e.value)


def test_schema_refuses_crosses_of_unknown_dense_or_clashing_names():
    cats = [CategoricalFeature("user", hash_buckets=10), CategoricalFeature("item", hash_buckets=10)]
    with pytest.raises(ValueError, match=r"\['nope'\] \(unknown\)"):
        Schema(["x"], cats, crosses=[CrossFeature("c", ("user", "nope"), hash_buckets=9)])
    with pytest.raises(ValueError, match=r"\['x'\] \(dense features, not categorical\)"):
        Schema(["x"], cats, crosses=[CrossFeature("c", ("user", "x"), hash_buckets=9)])
    for name in ("item", "x", "label"):
        with pytest.raises(ValueError, match=f"name '{name}' is already taken"):
            Schema(["x"], cats, crosses=[CrossFeature(name, ("user", "item"), hash_buckets=9)])
    twice = [CrossFeature("c", ("user", "item"), hash_buckets=9)] * 2
    with pytest.raises(ValueError, match="'c' is already taken"):
        Schema(["x"], cats, crosses=twice)
    with pytest.raises(TypeError, match="crosses"):
        Schema(["x"], cats, crosses=CrossFeature("c", ("user", "item"), hash_buckets=9))
    with pytest.raises(TypeError, match=r"crosses\[\]"):
        Schema(["x"], cats, crosses=[{"name": "c"}])


# --- one computation, every path --------------------------------------------------------------
@pytest.mark.parametrize("vocabulary", [False, True])
def test_converter_cross_ids_are_the_documented_hash(vocabulary):
    s = schema(vocabulary)
    batch, faults = ColumnConverter(s).convert(table())
    assert not faults
    s.check_features(batch.features)
    assert batch.features.keys == s.feature_names
    want = _expected(s)
    for name in s.cross_names:
        assert bags(batch.features, name) == want[name], name
    assert [len(b) for b in bags(batch.features, "age_x_genre")] == [2, 0, 1]  # the cartesian product


def test_reader_rows_stream_records_and_predict_instances_get_the_same_cross_ids(tmp_path):
    s = schema()
    ref = ColumnConverter(s).convert(table())[0].features
    pq.write_table(table(), tmp_path / "d.parquet")
    csv = ["label,x,user,item,age,genre"] + [f"{r['label']},{r['x']},{r['user']},{r['item']},{r['age']},"
                                             f"{'|'.join(r['genre'])}" for r in ROWS]
    (tmp_path / "d.csv").write_text("\n".join(csv) + "\n")
    parquet = next(iter(ParquetReader(str(tmp_path / "d.parquet"), s, batch_size=3))).features
    from_csv = next(iter(CSVReader(str(tmp_path / "d.csv"), s, batch_size=3))).features
    lines = CSVLineDecoder(s).decode([line.encode() for line in csv[1:]]).batch.features
    # ids as text, as in the files: a JSON column mixing ints and strings is decoded record by record,
    # where an empty list alone has no type (a decoder limitation outside crosses)
    text = [dict(r, user=str(r["user"]), item=str(r["item"])) for r in ROWS]
    records = JSONDecoder(s).decode([json.dumps(r).encode() for r in text]).batch.features
    instances = [{k: v for k, v in r.items() if k != "label"} for r in ROWS]
    served = InstanceParser(s).parse({"instances": instances})  # the direct (no converter) path
    assert InstanceParser(s).direct
    for name in s.feature_names:
        want = bags(ref, name)
        for path, got in (("parquet", parquet), ("csv", from_csv), ("csv stream", lines), ("json stream", records),
                          ("/predict", served)):
            assert bags(got, name) == want, (path, name)
    assert served.keys == s.feature_names


def test_predict_through_the_converter_path_gets_the_same_cross_ids():
    s = schema(vocabulary=True)  # a vocabulary makes the parser use the converter
    parser = InstanceParser(s)
    assert not parser.direct
    served = parser.parse({"instances": [{k: v for k, v in r.items() if k != "label"} for r in ROWS]})
    want = _expected(s)
    for name in s.cross_names:
        assert bags(served, name) == want[name], name
    assert parser.describe()["crosses"] == [x.to_dict() for x in s.crosses]
    assert "user_x_item" not in {f["name"] for f in parser.describe()["fields"]}  # computed, never sent


def test_with_crosses_appends_what_the_converter_computes():
    s = schema()
    ref = ColumnConverter(s).convert(table())[0].features
    lengths = ref.lengths()[: s.num_categorical]
    plain = Features.from_lengths(ref.dense, ref.values[: int(lengths.sum())], lengths)
    got = with_crosses(s, plain)
    assert got.keys == s.feature_names
    assert torch.equal(got.values, ref.values) and torch.equal(got.offsets, ref.offsets)
    with pytest.raises(ValueError, match="categorical features"):
        with_crosses(s, ref)  # crosses already there


def test_cross_bags_of_no_rows_and_three_multi_hot_components():
    s = Schema([], [CategoricalFeature(n, vocab_size=5, multi_hot=True) for n in "abc"],
               crosses=[CrossFeature("abc", tuple("abc"), hash_buckets=1 << 30)])
    ((ids, lens),) = cross_bags(s, [(np.array([1, 2]), np.array([2])), (np.array([3, 4]), np.array([2])),
                                    (np.array([1]), np.array([1]))])
    assert lens.tolist() == [4] and len(set(ids.tolist())) == 4
    want = [int(to_buckets(np.array([_mix(x, y, 1)], np.uint64), 1 << 30)[0]) for x in (1, 2) for y in (3, 4)]
    assert ids.tolist() == want  # row by row, in bag order
    ((ids, lens),) = cross_bags(s, [(np.zeros(0, np.int64), np.zeros(0, np.int64))] * 3)
    assert ids.shape == (0,) and lens.shape == (0,)


def test_online_training_from_a_directory_stream_trains_the_cross_weights(tmp_path):
    """`online_train` on CSV files in a directory: the stream's decoder computes the crosses, the
    wide part learns their weights, prequential scoring covers every event."""
    from recstream import RecModel
    from recstream.callbacks import PrequentialMonitor
    from recstream.data.streams import DirectoryStream
    from recstream.models import WideDeep, default_optimizer

    s = Schema(["x"], [CategoricalFeature("user", hash_buckets=50), CategoricalFeature("item", vocab_size=8)],
               crosses=[CrossFeature("user_x_item", ("user", "item"), hash_buckets=4096)])
    rng = np.random.default_rng(0)
    users, items = rng.integers(0, 20, 400), rng.integers(0, 8, 400)
    lines = [f"{int((u + i) % 3 == 0)},{rng.normal():.3f},u{u},{i}" for u, i in zip(users, items, strict=True)]
    (tmp_path / "events").mkdir()
    (tmp_path / "events" / "part-0.csv").write_text("\n".join(lines) + "\n")
    stream = DirectoryStream(tmp_path / "events", s, batch_size=50, idle_timeout=0.2)
    torch.manual_seed(0)
    net = WideDeep(s, hidden=(8,))
    model = RecModel(net, torch.nn.BCEWithLogitsLoss(), default_optimizer(net), progress_bar=False)
    monitor = PrequentialMonitor(window=400, log_every=1, verbose=False)
    model.online_train(stream, callbacks=[monitor])
    assert monitor.last["events"] == 400
    rows = pa.csv.read_csv(tmp_path / "events" / "part-0.csv",
                           read_options=pa.csv.ReadOptions(column_names=list(s.columns)),
                           convert_options=pa.csv.ConvertOptions(column_types={"user": pa.string()}))
    want = ColumnConverter(s).convert(rows)[0]  # the stream's cross ids are these: exactly their weights trained
    seen = want.features.bag("user_x_item")[0].unique()
    weights = net.wide.ebc.table_weight("user_x_item").detach().squeeze(1)
    assert bool((weights[seen] != 0).all()) and int((weights != 0).sum()) == seen.numel()
