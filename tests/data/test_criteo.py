import gzip
import json

import numpy as np
import pyarrow as pa
import pytest

from recstream.data import BadRowError, CriteoReader, criteo_schema
from recstream.data.hashing import hash_strings, to_buckets


def criteo_lines(n, seed=0):
    """Criteo-format lines plus the values they hold (None = empty field)."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, n)
    dense = rng.integers(-3, 5000, (n, 13)).astype(object)
    dense[rng.random((n, 13)) < 0.3] = None
    cats = np.array([f"{v:08x}" for v in rng.integers(0, 2 ** 32, n * 26)], dtype=object).reshape(n, 26)
    cats[rng.random((n, 26)) < 0.2] = None
    lines = ["\t".join([str(labels[i])] + ["" if v is None else str(v) for v in dense[i]]
                       + ["" if v is None else v for v in cats[i]]) for i in range(n)]
    return lines, labels, dense, cats


def test_schema():
    s = criteo_schema(1000, embedding_dim=4)
    assert s.dense_names[0] == "I1" and s.categorical_names[-1] == "C26" and s.label == "label"
    assert set(s.table_sizes()) == {1000} and s.categorical[0].embedding_dim == 4
    assert criteo_schema(list(range(2, 28))).table_sizes() == list(range(2, 28))
    with pytest.raises(ValueError, match="needs 26 sizes, got 3"):
        criteo_schema([10, 10, 10])
    with pytest.raises(TypeError, match="'hash_buckets'"):
        criteo_schema("many")


@pytest.mark.parametrize("gz", [False, True])
def test_values_missing_fields_and_hashing(tmp_path, gz):
    lines, labels, dense, cats = criteo_lines(300)
    text = "\n".join(lines) + "\n"
    path = tmp_path / ("day.tsv.gz" if gz else "day.tsv")
    if gz:
        with gzip.open(path, "wt") as fh:
            fh.write(text)
    else:
        path.write_text(text)
    reader = CriteoReader(path, batch_size=128, hash_buckets=5000)
    batches = list(reader)
    assert [b.batch_size for b in batches] == [128, 128, 44]
    f = batches[0].features.concat([b.features for b in batches])
    f.validate(reader.schema)
    assert np.concatenate([b.labels.numpy() for b in batches]).tolist() == labels.tolist()
    raw = np.array([[0 if v is None else v for v in row] for row in dense], dtype=np.float64)
    expected = np.log1p(np.maximum(raw, 0))  # missing -> 0; negative counts clip to 0 before log1p
    np.testing.assert_allclose(f.dense.numpy(), expected, rtol=1e-6)
    ids = f.values.view(26, 300).numpy()
    for k in (0, 13, 25):
        col = pa.array(list(cats[:, k]), pa.string())
        want = to_buckets(hash_strings(col), 5000)
        want[np.asarray(col.is_null())] = 0  # empty field -> reserved id 0
        np.testing.assert_array_equal(ids[k], want)


def test_no_log1p(tmp_path):
    lines, _, dense, _ = criteo_lines(5)
    (tmp_path / "d.txt").write_text("\n".join(lines) + "\n")
    (f, _), = CriteoReader(tmp_path / "d.txt", batch_size=8, hash_buckets=10, log1p=False)
    raw = np.array([[0 if v is None else v for v in row] for row in dense], dtype=np.float32)
    np.testing.assert_array_equal(f.dense.numpy(), raw)


def test_bad_rows(tmp_path):
    lines, _, _, _ = criteo_lines(6)
    fields = lines[3].split("\t")
    lines[1] = "\t".join(fields[:-1])  # 39 fields: a truncated line
    lines[3] = "\t".join(fields[:5] + ["12abc"] + fields[6:])  # I5 unparsable
    lines[4] = "\t".join(["2"] + fields[1:])  # label out of range
    path = tmp_path / "bad.tsv"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(BadRowError, match=r"bad.tsv: row 2: expected 40 fields, got 39"):
        list(CriteoReader(path, batch_size=4, hash_buckets=10))
    log = tmp_path / "bad.jsonl"
    reader = CriteoReader(path, batch_size=4, hash_buckets=10, on_bad_row="skip", bad_row_log=log)
    assert sum(b.batch_size for b in reader) == 3
    assert reader.bad_rows == {"column_count": 1, "unparsable": 1, "bad_label": 1}
    recs = [json.loads(x) for x in log.read_text().splitlines()]
    assert [(r["row"], r["reason"], r["column"]) for r in recs] == [
        (2, "column_count", None), (4, "unparsable", "I5"), (5, "bad_label", "label")]
