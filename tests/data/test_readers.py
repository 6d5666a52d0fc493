import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from recstream.data import BadRowError, CategoricalFeature, CSVReader, ParquetReader, Schema
from recstream.data.hashing import hash_strings, to_buckets

SCHEMA = Schema(["x", "y"], [CategoricalFeature("item", vocab_size=50),
                             CategoricalFeature("user", hash_buckets=97),
                             CategoricalFeature("tags", hash_buckets=31, multi_hot=True, max_len=3)])


def table(n=230, seed=0):
    rng = np.random.default_rng(seed)
    tags = ["|".join(str(t) for t in rng.integers(0, 1000, rng.integers(0, 5))) for _ in range(n)]
    return pa.table({"label": rng.integers(0, 2, n).astype(np.float64), "x": rng.standard_normal(n),
                     "y": rng.integers(0, 100, n), "item": rng.integers(0, 50, n),
                     "user": [f"u{i % 37}" for i in range(n)], "tags": tags, "extra": np.zeros(n)})


def collect(reader):
    batches = list(reader)
    labels = torch.cat([b.labels for b in batches])
    feats = batches[0].features.concat([b.features for b in batches])
    return batches, labels, feats


def write_csv(path, t):
    cols = t.column_names
    lines = [",".join(cols)] + [",".join("" if v is None else str(v) for v in row.values())
                                for row in t.to_pylist()]
    path.write_text("\n".join(lines) + "\n")


def test_parquet_streams_exact_batches_over_row_groups_and_files(tmp_path):
    t = table()
    pq.write_table(t.slice(0, 150), tmp_path / "a.parquet", row_group_size=64)
    pq.write_table(t.slice(150), tmp_path / "b.parquet", row_group_size=33)
    reader = ParquetReader(tmp_path, SCHEMA, batch_size=40)
    batches, labels, f = collect(reader)
    assert [b.batch_size for b in batches] == [40] * 5 + [30]
    assert reader.get_dataset_size() == 6 and reader.num_rows == 230
    np.testing.assert_array_equal(labels.numpy(), t["label"].to_numpy())
    np.testing.assert_allclose(f.dense[:, 0].numpy(), t["x"].to_numpy(), rtol=1e-6)
    np.testing.assert_array_equal(f.bag(0)[0].numpy(), t["item"].to_numpy())  # vocab ids pass through
    expected_users = to_buckets(hash_strings(t["user"].combine_chunks()), 97)
    np.testing.assert_array_equal(f.bag(1)[0].numpy(), expected_users)
    tag_lists = [[s for s in v.split("|") if s][:3] for v in t["tags"].to_pylist()]
    assert f.lengths()[2].tolist() == [len(x) for x in tag_lists]
    flat = [s for x in tag_lists for s in x]
    np.testing.assert_array_equal(f.bag(2)[0].numpy(), to_buckets(hash_strings(pa.array(flat, pa.string())), 31))
    f.validate(SCHEMA)
    again = collect(reader)[1]  # re-iterable: a second pass gives the same data
    assert torch.equal(again, labels)
    assert ParquetReader(tmp_path, SCHEMA, batch_size=40, drop_remainder=True).get_dataset_size() == 5


def test_parquet_and_csv_agree(tmp_path):
    t = table(n=120, seed=1)
    pq.write_table(t, tmp_path / "d.parquet")
    write_csv(tmp_path / "d.csv", t)
    _, lp, fp = collect(ParquetReader(tmp_path / "d.parquet", SCHEMA, batch_size=32))
    _, lc, fc = collect(CSVReader(tmp_path / "d.csv", SCHEMA, batch_size=32, block_size=2048))
    assert torch.equal(lp, lc) and torch.equal(fp.values, fc.values) and torch.equal(fp.offsets, fc.offsets)
    torch.testing.assert_close(fp.dense, fc.dense)


def test_parquet_list_and_dictionary_columns(tmp_path):
    t = pa.table({"label": [1, 0], "x": pa.array([1.0, 2.0]).dictionary_encode(), "y": [3, 4],
                  "item": pa.array([7, 8], pa.int32()), "user": pa.array(["a", "b"]).dictionary_encode(),
                  "tags": pa.array([[1, 2, 3, 4], []], pa.list_(pa.int64()))})
    pq.write_table(t, tmp_path / "l.parquet")
    (f, y), = ParquetReader(tmp_path / "l.parquet", SCHEMA, batch_size=8)
    assert f.lengths()[2].tolist() == [3, 0] and f.bag(0)[0].tolist() == [7, 8]
    # ints hash by their decimal text, so Parquet 1 and CSV "1" land in the same bucket
    assert f.bag(2)[0].tolist() == to_buckets(hash_strings(pa.array(["1", "2", "3"])), 31).tolist()


def test_missing_column_is_named(tmp_path):
    pq.write_table(table().drop(["user"]), tmp_path / "m.parquet")
    with pytest.raises(ValueError, match=r"lacks columns \['user'\]"):
        ParquetReader(tmp_path / "m.parquet", SCHEMA, batch_size=8)
    write_csv(tmp_path / "m.csv", table().drop(["user"]))
    with pytest.raises(ValueError, match="m.csv"):
        list(CSVReader(tmp_path / "m.csv", SCHEMA, batch_size=8))
    with pytest.raises(FileNotFoundError, match="nope.parquet"):
        ParquetReader(tmp_path / "nope.parquet", SCHEMA, batch_size=8)


HEADER = "label,x,y,item,user,tags"
GOOD = "1,0.5,3,7,u1,1|2"
BAD_CSV_ROWS = {  # data row content -> (reason, column)
    "1,0.5,3": ("column_count", None),
    "0,abc,3,7,u1,": ("unparsable", "x"),
    "0,nan,3,7,u1,": ("non_finite", "x"),
    "0,-inf,3,7,u1,": ("non_finite", "x"),
    "0,0.5,3,50,u1,": ("id_out_of_range", "item"),
    "0,0.5,3,-1,u1,": ("id_out_of_range", "item"),
    "0,0.5,3,1.5,u1,": ("unparsable", "item"),
    "0,,3,7,u1,": ("missing_value", "x"),
    "2,0.5,3,7,u1,": ("bad_label", "label"),
}


@pytest.mark.parametrize("bad_line", list(BAD_CSV_ROWS))
def test_csv_bad_row_raises_with_file_and_row(tmp_path, bad_line):
    path = tmp_path / "bad.csv"
    path.write_text("\n".join([HEADER, GOOD, GOOD, bad_line, GOOD]) + "\n")
    reason, column = BAD_CSV_ROWS[bad_line]
    with pytest.raises(BadRowError) as info:
        list(CSVReader(path, SCHEMA, batch_size=2))
    err = info.value
    assert (err.row, err.reason, err.column) == (3, reason, column)
    assert str(path) in str(err) and "row 3" in str(err) and "on_bad_row='skip'" in str(err)


def test_csv_skip_counts_logs_and_keeps_good_rows_in_order(tmp_path):
    bad = list(BAD_CSV_ROWS)
    lines, expected_good = [HEADER], []
    for i, b in enumerate(bad):  # good row i (label i % 2, y = i), then a bad row
        lines += [f"{i % 2},{i}.5,{i},7,u1,", b]
        expected_good.append(i)
    path, log = tmp_path / "mixed.csv", tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    reader = CSVReader(path, SCHEMA, batch_size=4, on_bad_row="skip", bad_row_log=log, block_size=1024)
    _, labels, f = collect(reader)
    assert f.dense[:, 1].tolist() == [float(i) for i in expected_good]
    expected_counts = {}
    for reason, _ in BAD_CSV_ROWS.values():
        expected_counts[reason] = expected_counts.get(reason, 0) + 1
    assert dict(reader.bad_rows) == expected_counts
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["row"] for r in records] == [2 * (i + 1) for i in range(len(bad))]  # exact data-row numbers
    assert [r["reason"] for r in records] == [BAD_CSV_ROWS[b][0] for b in bad]
    assert records[0]["data"] == "1,0.5,3" and records[1]["data"]["x"] == "abc"
    list(reader)  # a new pass starts new counts, not doubled ones
    assert sum(reader.bad_rows.values()) == len(bad)


def test_csv_row_numbers_after_many_short_lines(tmp_path):
    # malformed lines shift nothing: row numbers stay file data-row numbers across blocks
    lines = [HEADER] + [GOOD if i % 7 else "1,2" for i in range(1, 400)] + ["0,0.5,3,99,u1,"]
    path = tmp_path / "shift.csv"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(BadRowError) as info:
        list(CSVReader(path, SCHEMA, batch_size=16, block_size=1024))
    assert info.value.row == 7  # the first malformed line
    reader = CSVReader(path, SCHEMA, batch_size=16, on_bad_row="skip", bad_row_log=tmp_path / "l.jsonl",
                       block_size=1024)
    n = sum(b.batch_size for b in reader)
    assert n == 399 - 57 and reader.bad_rows == {"column_count": 57, "id_out_of_range": 1}
    last = json.loads((tmp_path / "l.jsonl").read_text().splitlines()[-1])
    assert (last["row"], last["reason"], last["column"]) == (400, "id_out_of_range", "item")


def test_csv_without_header_and_other_delimiter(tmp_path):
    path = tmp_path / "d.tsv"
    path.write_text("1\t0.5\t2\t3\tu\ta|b|c|d\n0\t1.5\t4\t5\t\t\n")
    reader = CSVReader(path, SCHEMA, batch_size=8, delimiter="\t", header=False)
    (f, y), = reader
    assert y.tolist() == [1.0, 0.0] and f.lengths()[2].tolist() == [3, 0]
    assert f.bag(1)[0][1].item() == 0  # empty hashed value -> reserved id 0
    assert reader.get_dataset_size() is None


def test_parquet_bad_rows_numbered_across_row_groups(tmp_path):
    t = table(n=200)
    x = t["x"].to_numpy().copy()
    x[150] = np.inf
    t = t.set_column(1, "x", pa.array(x))
    pq.write_table(t, tmp_path / "p.parquet", row_group_size=64)
    with pytest.raises(BadRowError, match=r"p.parquet: row 151: column 'x': non-finite"):
        list(ParquetReader(tmp_path / "p.parquet", SCHEMA, batch_size=50))
    reader = ParquetReader(tmp_path / "p.parquet", SCHEMA, batch_size=50, on_bad_row="skip")
    assert sum(b.batch_size for b in reader) == 199 and reader.bad_rows == {"non_finite": 1}


def test_fill_missing_dense_and_argument_errors(tmp_path):
    path = tmp_path / "f.csv"
    path.write_text(HEADER + "\n1,,3,7,u1,\n")
    (f, _), = CSVReader(path, SCHEMA, batch_size=4, fill_missing_dense=-1.0)
    assert f.dense[0].tolist() == [-1.0, 3.0]
    with pytest.raises(ValueError, match="'on_bad_row' must be one of"):
        CSVReader(path, SCHEMA, batch_size=4, on_bad_row="ignore")
    with pytest.raises(ValueError, match="'bad_row_log' needs on_bad_row='skip'"):
        CSVReader(path, SCHEMA, batch_size=4, bad_row_log=tmp_path / "x")
    with pytest.raises(ValueError, match="'batch_size' must be an int >= 1"):
        CSVReader(path, SCHEMA, batch_size=0)
    with pytest.raises(ValueError, match="'delimiter' must be one character"):
        CSVReader(path, SCHEMA, batch_size=4, delimiter=";;")
    with pytest.raises(TypeError, match="'schema' must be"):
        CSVReader(path, {"x": 1}, batch_size=4)
    with pytest.raises(TypeError, match="CSVReader: 'delimiter' must be a non-empty str, got 9 \\(int\\)"):
        CSVReader(path, SCHEMA, batch_size=4, delimiter=9)
    with pytest.raises(TypeError, match="CSVReader: 'batch_size' must be an int >= 1, got 4.0"):
        CSVReader(path, SCHEMA, batch_size=4.0)
    with pytest.raises(ValueError, match="CSVReader: 'block_size' must be an int >= 1024, got 10"):
        CSVReader(path, SCHEMA, batch_size=4, block_size=10)
    with pytest.raises(TypeError, match="CSVReader: 'fill_missing_dense' must be a finite number or None"):
        CSVReader(path, SCHEMA, batch_size=4, fill_missing_dense="0")


def test_streaming_keeps_arrow_memory_bounded(tmp_path):
    """Peak Arrow memory while reading does not grow with the file (it would, x3, if the
    reader loaded whole files)."""
    def peak_for(n):
        rng = np.random.default_rng(0)
        body = np.char.add(np.char.add(rng.integers(0, 2, n).astype(str), ",0.25,7,3,u"),
                           np.char.add(rng.integers(0, 10 ** 6, n).astype(str), ",1|2"))
        path = tmp_path / f"big{n}.csv"
        path.write_text(HEADER + "\n" + "\n".join(body.tolist()) + "\n")
        base, peak, rows = pa.total_allocated_bytes(), 0, 0  # other tests may hold Arrow memory
        for b in CSVReader(path, SCHEMA, batch_size=1000, block_size=1 << 16):
            rows += b.batch_size
            peak = max(peak, pa.total_allocated_bytes() - base)
        assert rows == n
        return peak, path.stat().st_size

    (small_peak, small_size), (big_peak, big_size) = peak_for(150_000), peak_for(450_000)
    assert big_size > 2.9 * small_size
    assert big_peak < 1.3 * small_peak and big_peak < big_size / 4, (small_peak, big_peak, big_size)


def test_an_invalid_utf8_byte_costs_its_row_not_the_file(tmp_path):
    """on_bad_row="skip": a file with one invalid UTF-8 byte used to abort as a whole."""
    from recstream.data import CSVReader, Schema

    path = tmp_path / "a.csv"
    path.write_bytes(b"label,x\n" + b"".join(f"{i % 2},{i}.5\n".encode() for i in range(5))
                     + b"0,\xff9.5\n" + b"".join(f"{i % 2},{i}.5\n".encode() for i in range(5, 10)))
    reader = CSVReader(str(path), Schema(["x"]), batch_size=4, on_bad_row="skip")
    xs = sorted(float(v) for b in reader for v in b.features.dense[:, 0])
    assert xs == [i + 0.5 for i in range(10)]
    assert dict(reader.bad_rows) == {"malformed": 1}
