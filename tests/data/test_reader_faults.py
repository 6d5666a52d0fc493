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
