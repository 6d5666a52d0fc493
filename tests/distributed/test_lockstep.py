"""Lockstep in one process (a job of one rank): batches, positions, commits and stops of the stream
it wraps; the rounds with several ranks are exercised by tests/distributed/test_online.py."""
from __future__ import annotations

import json
import threading

from recstream.data import Schema
from recstream.data.streams import DirectoryStream
from recstream.distributed import Lockstep


def _stream(tmp_path, batch_size=4, **kw):
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    (data / "part-0.csv").write_text("".join(f"1,{i}\n" for i in range(10)))
    return DirectoryStream(data, Schema(["x"]), batch_size=batch_size, commit_path=tmp_path / "committed.json", **kw)


def _values(batches):
    return [b.features.dense[:, 0].tolist() for b in batches]


def test_hands_out_the_stream_with_its_positions_and_commits_its_part(tmp_path):
    stream = _stream(tmp_path, idle_timeout=0.2)
    steps = Lockstep(stream)
    seen = []
    for batch in steps:
        seen.append((batch.features.dense[:, 0].tolist(), steps.position(), steps.last_batch_meta()["fill"]))
    assert seen == [([0, 1, 2, 3], {"file": "part-0.csv", "offset": 16}, False),  # "1,i\n": 4 bytes a row
                    ([4, 5, 6, 7], {"file": "part-0.csv", "offset": 32}, False),
                    ([8, 9], {"file": "part-0.csv", "offset": 40}, False)]
    assert list(steps) == []  # the stream's next pass is empty: the source ended
    job = {"step": 3, "ranks": [steps.position()]}
    steps.commit(job)
    assert json.loads((tmp_path / "committed.json").read_text())["position"] == job["ranks"][0]
    assert (steps.durable_step, steps.committed_step, steps.fills) == (3, 3, 0)


def test_a_stop_wished_while_waiting_for_data_ends_the_pass_and_stays(tmp_path):
    stream = _stream(tmp_path)  # idle_timeout None: waits for data forever
    steps = Lockstep(stream)
    it = iter(steps)
    assert _values([next(it), next(it)]) == [[0, 1, 2, 3], [4, 5, 6, 7]]  # rows 8-9 wait for a full batch
    threading.Timer(0.3, steps.request_stop).start()  # as a signal handler would, while the pass waits
    assert list(it) == [] and steps.stopped
    assert list(steps) == []  # stopped: later passes are empty, which ends training
    assert steps.position() == {"file": "part-0.csv", "offset": 32}
    steps2 = Lockstep(stream)  # a new run: the stream resumes after the last batch handed out
    threading.Timer(0.3, steps2.request_stop).start()
    assert list(steps2) == []
    assert stream.position() == {"file": "part-0.csv", "offset": 32}


def test_batches_read_ahead_but_not_handed_out_are_read_again(tmp_path):
    stream = _stream(tmp_path, batch_size=2, idle_timeout=5.0)  # the reader runs ahead of the one handed out
    steps = Lockstep(stream)
    it = iter(steps)
    assert _values([next(it)]) == [[0, 1]]
    steps.request_stop()
    assert list(it) == []
    assert stream.position() == {"file": "part-0.csv", "offset": 8}  # not where the reader got to
    assert _values(Lockstep(stream)) == [[2, 3], [4, 5], [6, 7], [8, 9]]
