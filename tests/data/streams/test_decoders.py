"""Record decoders: same Batches as the file readers, and every bad record named with its reason."""
from __future__ import annotations

import pytest

from recstream.data import CriteoReader, CSVReader
from recstream.data.streams import CSVLineDecoder

from .events import SCHEMA, T0, assert_same_batch, decoder, records

META = ["event_id", "event_time"]


def _write(tmp_path, name, lines):
    path = tmp_path / name
    path.write_bytes(b"\n".join(lines) + b"\n")
    return str(path)


def test_csv_decoder_matches_csv_reader(tmp_path):
    lines = records(500)
    (expected,) = CSVReader(_write(tmp_path, "a.csv", lines), SCHEMA, 500, header=False,
                            column_names=list(SCHEMA.columns) + META)
    out = decoder("csv").decode(lines)
    assert out.bad == [] and out.rows.tolist() == list(range(500))
    assert_same_batch(out.batch, expected)
    assert out.ids.tolist() == list(range(500))
    assert out.event_time.tolist() == [T0 + i for i in range(500)]
    # the same bytes as one block of lines (the directory path) decode the same way
    assert_same_batch(decoder("csv").decode_lines(b"\r\n".join(lines) + b"\r\n").batch, expected)


def test_criteo_decoder_matches_criteo_reader(tmp_path):
    lines = records(300, fmt="criteo", meta=False)
    (expected,) = CriteoReader(_write(tmp_path, "day.tsv", lines), 300, hash_buckets=1000)
    from recstream.data.streams import CriteoTSVDecoder
    out = CriteoTSVDecoder(1000).decode(lines)
    assert out.bad == [] and out.ids is None
    assert_same_batch(out.batch, expected)
    with_meta = decoder("criteo").decode(records(300, fmt="criteo"))
    assert_same_batch(with_meta.batch, expected)
    assert with_meta.ids.tolist() == list(range(300))


def test_json_decoder_matches_csv_decoder():
    csv, js = decoder("csv").decode(records(400)), decoder("jsonl").decode(records(400, fmt="jsonl"))
    assert js.bad == []
    assert_same_batch(js.batch, csv.batch)
    assert js.ids.tolist() == csv.ids.tolist() and js.event_time.tolist() == csv.event_time.tolist()


def _csv_line(i, **change):
    """Event i as a CSV line, with some fields replaced (by column name)."""
    fields = records(1, i)[0].decode().split(",")
    names = list(SCHEMA.columns) + META
    for name, value in change.items():
        fields[names.index(name)] = value
    return ",".join(fields).encode()


def test_csv_bad_records_are_named_and_the_rest_kept():
    recs = [
        _csv_line(0),
        b"1,2,3",                                   # 1 wrong field count
        _csv_line(2, I1="abc"),                     # 2 not a number
        _csv_line(3, I1="nan"),                     # 3 NaN
        _csv_line(4, I2="-inf"),                    # 4 inf
        _csv_line(5, C3="9" * 400),                 # 5 longer than max_record_bytes
        b"",                                        # 6 empty
        _csv_line(7, C1="\xff").replace("\xff".encode(), b"\xff"),  # 7 invalid UTF-8
        _csv_line(8, label="2"),                    # 8 label outside [0, 1]
        _csv_line(9, C1="100"),                     # 9 id outside the vocabulary of 100
        _csv_line(10, event_id="x"),                # 10 event id not an integer
        _csv_line(11, event_time=""),               # 11 no event time
        _csv_line(12) + b"\n" + _csv_line(12),      # 12 two records in one message
        _csv_line(13),
        _csv_line(14) + b"\n",                      # 14 one trailing newline is tolerated
    ]
    out = decoder("csv", max_record_bytes=300).decode(recs)
    got = {b.index: b.reason for b in out.bad}
    assert got == {1: "column_count", 2: "unparsable", 3: "non_finite", 4: "non_finite", 5: "oversize",
                   6: "column_count", 7: "malformed", 8: "bad_label", 9: "id_out_of_range", 10: "unparsable",
                   11: "missing_value", 12: "malformed"}
    assert {b.index: b.column for b in out.bad if b.column} == {2: "I1", 3: "I1", 4: "I2", 8: "label", 9: "C1",
                                                                10: "event_id", 11: "event_time"}
    assert [b.raw for b in out.bad if b.index == 1] == [b"1,2,3"]
    assert out.rows.tolist() == [0, 13, 14] and out.ids.tolist() == [0, 13, 14]
    assert_same_batch(out.batch, decoder("csv").decode([_csv_line(0), _csv_line(13), _csv_line(14)]).batch)


def test_json_bad_records_and_changing_types():
    good = records(6, fmt="jsonl")
    recs = [
        good[0],
        b'{"label": 1, "I1": 0.5, "I2": 1',          # 1 broken JSON
        b"[1, 2, 3]",                                # 2 not an object
        good[3].replace(b'"I1":', b'"I1":"') .replace(b',"I2"', b'","I2"', 1),  # 3 number as a string: fine
        good[4] + good[4],                           # 4 two objects on one line
        b'{"label": 0, "I1": "abc", "I2": 1, "C1": 1, "C2": 1, "C3": 1, "event_id": 90, "event_time": 1}',  # 5
        b'{"label": 0, "I1": {"a": 1}, "I2": 1, "C1": 1, "C2": 1, "C3": 1, "event_id": 91, "event_time": 1}',  # 6
        good[5],
    ]
    out = decoder("jsonl").decode(recs)
    reasons = {b.index: b.reason for b in out.bad}
    assert reasons == {1: "malformed", 2: "malformed", 4: "malformed", 5: "unparsable", 6: "malformed"}
    assert out.ids.tolist() == [0, 3, 5]
    assert_same_batch(out.batch, decoder("csv").decode([records(1, i)[0] for i in (0, 3, 5)]).batch)


def test_decoder_validates_its_arguments():
    with pytest.raises(ValueError, match="delimiter"):
        CSVLineDecoder(SCHEMA, delimiter=";;")
    with pytest.raises(ValueError, match="id_column"):
        CSVLineDecoder(SCHEMA, id_column="I1")  # a schema column cannot be the event id
    with pytest.raises(ValueError, match="lacks columns"):
        CSVLineDecoder(SCHEMA, column_names=["label", "I1"])


def test_decoder_argument_types_raise_type_errors():
    with pytest.raises(TypeError, match="CSVLineDecoder: 'delimiter' must be a non-empty str, got 44 \\(int\\)"):
        CSVLineDecoder(SCHEMA, delimiter=44)
    with pytest.raises(TypeError, match="CSVLineDecoder: 'schema' must be a recstream.data.Schema"):
        CSVLineDecoder({"x": 1})
    with pytest.raises(TypeError, match="CSVLineDecoder: 'id_column' must be a non-empty str or None"):
        CSVLineDecoder(SCHEMA, id_column=3)
    with pytest.raises(ValueError, match="CSVLineDecoder: 'max_record_bytes' must be an int >= 1, got 0"):
        CSVLineDecoder(SCHEMA, max_record_bytes=0)
    with pytest.raises(TypeError, match="CSVLineDecoder: 'log1p_dense' must be a bool"):
        CSVLineDecoder(SCHEMA, log1p_dense="yes")


def test_json_mixed_int_and_string_ids_with_empty_multi_hot_lists(tmp_path):
    """Ids that are ints in some records and strings in others, next to an empty multi-hot
    list, decode (an empty bag), keyed as the CSV reader and ``/predict`` key them."""
    import json

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from recstream.data import CategoricalFeature, ParquetReader, Schema
    from recstream.data.streams import JSONDecoder
    from recstream.serving.export import instances_to_inputs

    schema = Schema([], [CategoricalFeature("user", dynamic=True, capacity=64),
                         CategoricalFeature("item", hash_buckets=1000),
                         CategoricalFeature("genre", hash_buckets=1000, multi_hot=True)])
    rows = [{"label": 1, "user": 12, "item": 7, "genre": [3, 4]},
            {"label": 0, "user": "ann", "item": "x7", "genre": []},
            {"label": 1, "user": "12", "item": 7, "genre": ["drama"]},
            {"label": 0, "user": 5, "item": "7", "genre": []}]
    lines = [json.dumps(r).encode() for r in rows]
    for recs in (lines, lines[1:2], lines[3:]):  # a batch, and records decoded alone
        out = JSONDecoder(schema).decode(recs)
        assert out.bad == [], out.bad
        assert out.batch.features.lengths()[2].tolist() == [len(json.loads(r)["genre"]) for r in recs]
    got = JSONDecoder(schema).decode(lines).batch
    csv = tmp_path / "a.csv"
    csv.write_text("label,user,item,genre\n" + "".join(
        f"{r['label']},{r['user']},{r['item']},{'|'.join(map(str, r['genre']))}\n" for r in rows))
    (expected,) = CSVReader(str(csv), schema, 4)
    assert_same_batch(got, expected)
    assert got.features.values[:2].tolist() == [12, int(expected.features.values[1])]  # 12 is its own key
    assert int(got.features.values[2]) == 12  # "12" is the key of 12
    pq.write_table(pa.table({"label": [r["label"] for r in rows], "user": [str(r["user"]) for r in rows],
                             "item": [str(r["item"]) for r in rows],
                             "genre": [[str(g) for g in r["genre"]] for r in rows]}), tmp_path / "a.parquet")
    (from_parquet,) = ParquetReader(str(tmp_path / "a.parquet"), schema, 4)
    assert_same_batch(got, from_parquet)
    sig = {"schema": schema.to_dict(), "preprocessing": {"fill_missing_dense": None, "log1p_dense": False}}
    _, values, offsets = instances_to_inputs(sig, [{k: v for k, v in r.items() if k != "label"} for r in rows])
    assert values.tolist() == got.features.values.tolist()
    assert np.diff(offsets.numpy()).tolist() == got.features.lengths().flatten().tolist()


def test_json_malformed_id_fields_are_dead_lettered_by_name():
    import json

    from recstream.data import CategoricalFeature, Schema
    from recstream.data.streams import JSONDecoder

    schema = Schema([], [CategoricalFeature("user", dynamic=True, capacity=64),
                         CategoricalFeature("genre", hash_buckets=1000, multi_hot=True)])
    recs = [json.dumps(r).encode() for r in ({"label": 1, "user": 1, "genre": []},
                                             {"label": 1, "user": [1, 2], "genre": []},
                                             {"label": 1, "user": "b", "genre": {"a": 1}},
                                             {"label": 0, "user": 2, "genre": [None]})]
    out = JSONDecoder(schema).decode(recs)
    assert [(b.index, b.reason) for b in out.bad] == [(1, "malformed"), (2, "malformed")]
    assert "'user'" in out.bad[0].detail and "'genre'" in out.bad[1].detail, out.bad
    assert out.rows.tolist() == [0, 3] and out.batch.features.lengths()[1].tolist() == [0, 0]
