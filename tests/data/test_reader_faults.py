"""One broken line in a CSV/Criteo file costs that line only (issue 12, item 4).

Each fault used to cost much more under ``on_bad_row="skip"``: a line longer than the
reader's block aborted the whole file, and a stray quote opened a quoted field that ran
across the following lines, so hundreds of good rows vanished as one bad row.
"""
import json

import pytest

from recstream.data import BadRowError, CategoricalFeature, CriteoReader, CSVReader, Schema

SCHEMA = Schema(["x"], [CategoricalFeature("user", hash_buckets=97),
                        CategoricalFeature("tags", hash_buckets=31, multi_hot=True)])
HEADER = "label,x,user,tags"


def good(i):
    return f"{i % 2},{i}.5,u{i},1|2"


def write(path, lines):
    path.write_text("\n".join(lines) + "\n")
    return path


def xs(reader):
    return [float(v) for b in reader for v in b.features.dense[:, 0]]


def test_an_overlong_line_costs_its_row_not_the_file(tmp_path):
    long_line = "0,7.5,u7," + "|".join(["123456"] * 1000)  # ~7 KB, longer than the 1 KB block
    path = write(tmp_path / "long.csv", [HEADER] + [good(i) for i in range(5)] + [long_line]
                 + [good(i) for i in range(5, 505)])
    reader = CSVReader(path, SCHEMA, batch_size=64, on_bad_row="skip", block_size=1024,
                       bad_row_log=tmp_path / "bad.jsonl")
    assert xs(reader) == [i + 0.5 for i in range(505)]
    assert dict(reader.bad_rows) == {"oversize": 1}
    (rec,) = [json.loads(line) for line in (tmp_path / "bad.jsonl").read_text().splitlines()]
    assert (rec["row"], rec["reason"]) == (6, "oversize")
    with pytest.raises(BadRowError) as info:
        list(CSVReader(path, SCHEMA, batch_size=64, block_size=1024))
    assert (info.value.path, info.value.row, info.value.reason) == (str(path), 6, "oversize")
    assert "block_size" in str(info.value)


def test_an_overlong_last_line_without_newline(tmp_path):
    path = tmp_path / "tail.csv"
    path.write_text("\n".join([HEADER] + [good(i) for i in range(3)]) + "\n0,1.5,u1," + "9" * 5000)
    reader = CSVReader(path, SCHEMA, batch_size=8, on_bad_row="skip", block_size=1024)
    assert xs(reader) == [0.5, 1.5, 2.5] and dict(reader.bad_rows) == {"oversize": 1}


def test_a_stray_quote_costs_its_row_not_the_following_rows(tmp_path):
    path = write(tmp_path / "quote.csv", [HEADER] + [good(i) for i in range(5)] + ['0,9.5,"u9,1|2']
                 + [good(i) for i in range(5, 505)])
    reader = CSVReader(path, SCHEMA, batch_size=64, on_bad_row="skip", block_size=4096)
    assert xs(reader) == [i + 0.5 for i in range(505)]
    assert dict(reader.bad_rows) == {"malformed": 1}
    with pytest.raises(BadRowError) as info:
        list(CSVReader(path, SCHEMA, batch_size=64, block_size=4096))
    assert (info.value.path, info.value.row, info.value.reason) == (str(path), 6, "malformed")


def test_a_stray_quote_that_closes_with_the_right_field_count_is_still_caught(tmp_path):
    # the runaway field ends at the next quote and the merged "row" has 4 fields: before the
    # fix it was read as one good row holding three lines, silently. The closing line is a
    # good row on its own (a quote inside an unquoted value is plain text).
    lines = [HEADER, good(0), '1,1.5,"u1,1|2', good(2), '1,3.5,u3",1|2', good(4)]
    reader = CSVReader(write(tmp_path / "merge.csv", lines), SCHEMA, batch_size=8, on_bad_row="skip")
    assert xs(reader) == [0.5, 2.5, 3.5, 4.5]
    assert dict(reader.bad_rows) == {"malformed": 1}


def test_quoted_fields_and_bad_rows_mixed_in_many_blocks(tmp_path):
    lines = [HEADER]
    expected, bad = [], 0
    for i in range(2000):
        if i % 97 == 5:
            lines.append(f'0,{i}.5,"u{i},1|2')  # stray quote
            bad += 1
        elif i % 89 == 7:
            lines.append(f"0,{i}.5,u{i}," + "7|" * 800)  # over-long
            bad += 1
        else:
            lines.append(f'{i % 2},"{i}.5","u,{i}",1|2')  # quoted, with a delimiter inside
            expected.append(i + 0.5)
    reader = CSVReader(write(tmp_path / "mix.csv", lines), SCHEMA, batch_size=100, on_bad_row="skip",
                       block_size=1024)
    assert xs(reader) == expected
    assert sum(reader.bad_rows.values()) == bad


def test_criteo_overlong_line_and_quotes(tmp_path):
    line = "\t".join(["1"] + ["3"] * 13 + ["68fd1e64"] * 26)
    quoted = line.replace("68fd1e64", '"68fd1e64', 1)  # no quoting in the format: just an id
    long_line = line + "a" * 3000
    path = write(tmp_path / "day_0.tsv", [line] * 10 + [long_line] + [quoted] * 10 + [line] * 10)
    reader = CriteoReader(path, batch_size=16, hash_buckets=1000, on_bad_row="skip", block_size=1024)
    assert sum(b.batch_size for b in reader) == 30
    assert dict(reader.bad_rows) == {"oversize": 1}
    with pytest.raises(BadRowError) as info:
        list(CriteoReader(path, batch_size=16, hash_buckets=1000, block_size=1024))
    assert info.value.row == 11


def test_gzip_file_and_an_overlong_header(tmp_path):
    import gzip

    path = tmp_path / "q.csv.gz"
    lines = [HEADER] + [good(i) for i in range(300)]
    lines[100] = '0,9.5,"u9,1|2'  # data row 100
    path.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    reader = CSVReader(path, SCHEMA, batch_size=64, on_bad_row="skip", block_size=1024)
    assert len(xs(reader)) == 299 and dict(reader.bad_rows) == {"malformed": 1}
    with pytest.raises(BadRowError, match="q.csv.gz: row 100"):
        list(CSVReader(path, SCHEMA, batch_size=64, block_size=1024))
    wide = write(tmp_path / "wide.csv", [HEADER + ",pad" * 600, good(0)])
    with pytest.raises(ValueError, match="header of .*wide.csv.* longer than block_size=1024"):
        list(CSVReader(wide, SCHEMA, batch_size=8, block_size=1024))


@pytest.mark.parametrize("newline", ["\n", ""])
def test_a_stray_quote_in_the_last_value_of_the_last_line(tmp_path, newline):
    # nothing follows for the runaway value to swallow but its own line end: still caught
    path = tmp_path / "end.csv"
    path.write_text("\n".join([HEADER, good(0), good(1), '0,2.5,u2,"1|2']) + newline)
    reader = CSVReader(path, SCHEMA, batch_size=8, on_bad_row="skip")
    assert xs(reader) == [0.5, 1.5] and dict(reader.bad_rows) == {"malformed": 1}


# --- float32 overflow (issue 27, item 2) -----------------------------------------------------
F32_SCHEMA = Schema(["x"], [CategoricalFeature("c", vocab_size=5)])


def _train_on(reader):
    """A few SGD steps of a real model on everything `reader` yields; its parameters."""
    import torch

    from recstream.models import WideDeep
    torch.manual_seed(0)
    net = WideDeep(F32_SCHEMA, hidden=(8,), embedding_dim=4)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for batch in reader:
        loss = torch.nn.functional.binary_cross_entropy_with_logits(net(batch.features), batch.labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return list(net.parameters())


@pytest.mark.parametrize("value", ["1e39", "-1e39", "3.5e38"])
def test_a_dense_value_beyond_float32_is_dead_lettered_and_the_model_stays_finite(tmp_path, value):
    import torch
    rows = [f"{i % 2},{i}.5,{i % 5}" for i in range(20)]
    path = write(tmp_path / "f.csv", ["label,x,c"] + rows[:7] + [f"1,{value},3"] + rows[7:])
    reader = CSVReader(path, F32_SCHEMA, batch_size=8, on_bad_row="skip", bad_row_log=tmp_path / "bad.jsonl")
    params = _train_on(reader)
    assert all(torch.isfinite(p).all() for p in params)
    assert dict(reader.bad_rows) == {"non_finite": 1}
    (rec,) = [json.loads(line) for line in (tmp_path / "bad.jsonl").read_text().splitlines()]
    assert (rec["file"], rec["row"], rec["reason"], rec["column"]) == (str(path), 8, "non_finite", "x")
    assert value in rec["detail"] and "float32" in rec["detail"]
    with pytest.raises(BadRowError) as info:
        list(CSVReader(path, F32_SCHEMA, batch_size=8))
    assert (info.value.path, info.value.row, info.value.reason) == (str(path), 8, "non_finite")


def test_float32_overflow_in_parquet_files_and_arrow_tables(tmp_path):
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from recstream.data import ParquetReader, from_arrow
    x = np.arange(10, dtype=np.float64)
    x[4] = 1e39
    table = pa.table({"label": np.zeros(10), "x": x, "c": np.arange(10) % 5})
    pq.write_table(table, tmp_path / "f.parquet")
    reader = ParquetReader(tmp_path / "f.parquet", F32_SCHEMA, batch_size=4, on_bad_row="skip")
    assert sorted(xs(reader)) == [0, 1, 2, 3, 5, 6, 7, 8, 9]
    assert dict(reader.bad_rows) == {"non_finite": 1}
    with pytest.raises(BadRowError, match="non_finite"):
        from_arrow(table, F32_SCHEMA, batch_size=4)


def test_log1p_dense_checks_the_value_the_model_gets(tmp_path):
    """log1p(1e39) is 89.8, finite in float32: such a count is no bad row; -inf stays one."""
    path = write(tmp_path / "f.csv", ["label,x,c", "1,1e39,3", "0,-inf,2", "0,2,1"])
    reader = CSVReader(path, F32_SCHEMA, batch_size=8, on_bad_row="skip", log1p_dense=True)
    assert [round(v, 3) for v in xs(reader)] == [89.801, 1.099]
    assert dict(reader.bad_rows) == {"non_finite": 1}
