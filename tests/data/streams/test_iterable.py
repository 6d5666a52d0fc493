"""IterableStream: position = items consumed; seek replays exactly; rows mode dead-letters bad rows."""
from __future__ import annotations

import json

import pytest

from recstream.data import SyntheticCTR
from recstream.data.streams import IterableStream

from .events import SCHEMA, assert_same_batch


def test_batches_position_seek_round_trip():
    gen = SyntheticCTR(num_dense=2, num_categorical=2, batch_size=16)
    stream = IterableStream(lambda: iter(gen.train_batches(20)), max_batches=5)
    first = list(stream)
    assert stream.position() == {"batches": 5}
    mid = stream.position()
    second = list(stream)  # a new iteration continues: nothing lost, nothing repeated
    assert stream.position() == {"batches": 10}
    stream.seek(mid)
    again = list(stream)
    for a, b in zip(second, again, strict=True):
        assert_same_batch(a, b)
    fresh = IterableStream(lambda: iter(gen.train_batches(20)))  # a restart from the position
    fresh.seek(mid)
    rest = list(fresh)
    assert len(first) + len(rest) == 20
    for a, b in zip(first + rest, gen.train_batches(20), strict=True):
        assert_same_batch(a, b)
    assert fresh.position() == {"batches": 20} and fresh.last_batch_meta() == {"ids": None, "event_time": None}


def test_one_shot_iterable_seeks_forward_only():
    stream = IterableStream(iter(range(10)), max_batches=3)
    assert list(stream) == [0, 1, 2]
    stream.seek({"batches": 5})
    assert list(stream) == [5, 6, 7]
    with pytest.raises(ValueError, match="one-shot"):
        stream.seek({"batches": 1})
    with pytest.raises(ValueError, match="expected"):
        stream.seek({"records": 1})


def _row(i):
    return {"label": i % 2, "I1": 0.5 * i, "I2": 1.0, "C1": i % 100, "C2": 7, "C3": 9, "event_id": i,
            "event_time": 1e9 + i}


def test_rows_mode_dead_letters_bad_rows_and_keeps_positions(tmp_path):
    rows = [_row(i) for i in range(30)]
    rows[4]["I1"] = "abc"
    rows[7] = "not a row"
    rows[9]["C1"] = 1000
    rows[12]["I2"] = float("inf")
    del rows[15]["event_time"]
    dead = tmp_path / "dead.jsonl"
    stream = IterableStream(lambda: iter(rows), SCHEMA, 5, id_column="event_id", time_column="event_time",
                            dead_letter=dead, max_batches=2)
    ids = [stream.last_batch_meta()["ids"].tolist() for _ in stream]
    assert ids == [[0, 1, 2, 3, 5], [6, 8, 10, 11, 13]]
    assert stream.position() == {"records": 14}  # record 14 is the next one
    stream.seek({"records": 6})
    assert [stream.last_batch_meta()["ids"].tolist() for _ in stream] == [[6, 8, 10, 11, 13], [14, 16, 17, 18, 19]]
    # counted each time they are read: the seek back to 6 read 7, 9 and 12 again
    assert stream.bad_records == {"unparsable": 1, "malformed": 2, "id_out_of_range": 2, "non_finite": 2,
                                  "missing_value": 1}
    lines = [json.loads(x) for x in dead.read_text().splitlines()]
    # written when decoded; the seek decoded records 7..19 again (at-least-once dead letters)
    by_record = {}
    for x in lines:
        by_record.setdefault(x["source"]["record"], set()).add(x["reason"])
    assert by_record == {4: {"unparsable"}, 7: {"malformed"}, 9: {"id_out_of_range"}, 12: {"non_finite"},
                         15: {"missing_value"}}
    assert json.loads(next(x for x in lines if x["source"]["record"] == 4)["record"])["I1"] == "abc"


def test_rows_mode_needs_schema_and_batch_size():
    with pytest.raises(ValueError, match="batch_size"):
        IterableStream([], SCHEMA)
    with pytest.raises(ValueError, match="schema"):
        IterableStream([], batch_size=4)


def test_streams_offer_the_dataset_capabilities(tmp_path):
    from recstream.data import protocol
    from recstream.data.streams import DirectoryStream

    for stream in (IterableStream([]), DirectoryStream(tmp_path, SCHEMA, batch_size=4, idle_timeout=0)):
        for capability in (protocol.SeekableDataset, protocol.CommittableDataset, protocol.MetadataDataset,
                           protocol.BadRecordDataset, protocol.ResettableDataset, protocol.SizedDataset):
            assert isinstance(stream, capability), (type(stream).__name__, capability.__name__)
        assert protocol.dataset_size(stream) is None  # unbounded


def test_argument_types_and_values_are_told_apart():
    with pytest.raises(TypeError, match="IterableStream: 'max_batches' must be an int >= 0 or None, got '3'"):
        IterableStream([], max_batches="3")
    with pytest.raises(ValueError, match="IterableStream: 'max_batches' must be an int >= 0 or None, got -1"):
        IterableStream([], max_batches=-1)
    with pytest.raises(TypeError, match="IterableStream: 'source' must be an iterable or a callable"):
        IterableStream(5)
    with pytest.raises(TypeError, match="IterableStream.seek: 'position' must be a dict from position()"):
        IterableStream([]).seek([1])
