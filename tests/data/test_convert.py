import numpy as np
import pyarrow as pa
import pytest

from recstream.data import CategoricalFeature, Schema
from recstream.data.convert import ColumnConverter, to_float, to_int


def test_parse_flags_exact_rows():
    v, missing, bad = to_float(pa.array(["1", "", None, "x1", "1e3", "-inf", " 2"]))
    assert missing.tolist() == [False, True, True, False, False, False, False]
    assert bad.tolist() == [False, False, False, True, False, False, True]
    assert v[4] == 1000.0 and np.isneginf(v[5])
    v, missing, bad = to_int(pa.array(["7", "99999999999999999999", "-3", "3.0"]))
    assert v.tolist()[0] == 7 and v.tolist()[2] == -3 and bad.tolist() == [False, True, False, True]
    v, missing, bad = to_int(pa.array([1.0, 2.5, None]))
    assert v[0] == 1 and bad.tolist() == [False, True, False] and missing.tolist() == [False, False, True]


def test_multi_hot_vocabulary_and_max_len():
    s = Schema(["x"], [CategoricalFeature("g", vocabulary=["a", "b", "c"], multi_hot=True, max_len=2),
                       CategoricalFeature("k", vocab_size=10, multi_hot=True, separator=";")])
    rb = pa.record_batch({"label": [1, 0, 1, 0], "x": [1.0, 2.0, 3.0, 4.0],
                          "g": ["a|c|b", "zz", None, "b||a"], "k": ["1;2", "", "3", "9;12"]})
    batch, faults = ColumnConverter(s).convert(rb)
    assert [(f.index, f.reason, f.column) for f in faults] == [(3, "id_out_of_range", "k")]
    assert "id 12 outside [0, 10)" in faults[0].detail
    f = batch.features
    assert f.batch_size == 3 and f.lengths().tolist() == [[2, 1, 0], [2, 0, 1]]
    assert f.bag(0)[0].tolist() == [1, 3, 0]  # unknown "zz" -> 0, first two of a|c|b
    assert f.bag(1)[0].tolist() == [1, 2, 3]


def test_type_errors_name_the_column():
    s = Schema(["x"], [CategoricalFeature("k", vocab_size=10, multi_hot=True)])
    with pytest.raises(TypeError, match="column 'k'"):
        ColumnConverter(s).convert(pa.record_batch({"label": [1], "x": [1.0], "k": [1]}))
    with pytest.raises(ValueError, match="lacks columns \\['k'\\]"):
        ColumnConverter(s).convert(pa.record_batch({"label": [1], "x": [1.0]}))


def test_wrong_column_type_names_the_column():
    s = Schema(["x"], [CategoricalFeature("k", vocab_size=10)])
    rb = pa.record_batch({"label": [1], "x": pa.array([[1.0]]), "k": [1]})
    with pytest.raises(TypeError, match="column 'x': expected a numeric or string column, got type list"):
        ColumnConverter(s).convert(rb)
    rb = pa.record_batch({"label": [1], "x": [1.0], "k": pa.array([1.5], pa.float32()).cast(pa.float16())})
    batch, faults = ColumnConverter(s).convert(rb)
    assert faults[0].reason == "unparsable"
