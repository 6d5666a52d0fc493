"""Streams split across the ranks of a job (set_rank) and positions mapped between numbers of ranks."""
from __future__ import annotations

import json

import pytest

from recstream.data import Schema
from recstream.data.streams import DirectoryStream, IterableStream
from recstream.data.streams.directory import name_rank


def _files(d, n=8, rows=3):
    for f in range(n):
        (d / f"part-{f:04d}.csv").write_text("".join(f"1,{f * 100 + i}\n" for i in range(rows)))
    return [f"part-{f:04d}.csv" for f in range(n)]


def _read(stream):
    return sorted(int(x) for b in stream for x in b.features.dense[:, 0].tolist())


def test_directory_ranks_read_disjoint_files_and_commit_apart(tmp_path):
    names = _files(tmp_path)
    got = {}
    for r in (0, 1):
        s = DirectoryStream(tmp_path, Schema(["x"]), batch_size=2, idle_timeout=0.2,
                            commit_path=tmp_path / "_committed.json")
        s.set_rank(r, 2)
        got[r] = _read(s)
        assert name_rank(s.position()["file"], 2) == r  # its position is in its own files
        s.commit(s.position())
        assert s.commit_file() == f"{tmp_path}/_committed.json.rank{r}-of-2"
        assert json.loads(open(s.commit_file()).read())["world_size"] == 2
        s.close()
    assert not set(got[0]) & set(got[1])
    assert sorted(got[0] + got[1]) == [f * 100 + i for f in range(8) for i in range(3)]
    assert {name_rank(n, 2) for n in names} == {0, 1}  # numbered names spread over both ranks
    for r in (0, 1):  # a restarted rank resumes from its own commit file: nothing left to read
        s = DirectoryStream(tmp_path, Schema(["x"]), batch_size=2, idle_timeout=0.2,
                            commit_path=tmp_path / "_committed.json")
        s.set_rank(r, 2)
        assert _read(s) == []
        s.close()


def test_directory_positions_map_from_one_process_only(tmp_path):
    _files(tmp_path)
    s = DirectoryStream(tmp_path, Schema(["x"]), batch_size=2, idle_timeout=0.2)
    one = {"file": "part-0003.csv", "offset": 4}
    s.set_rank(1, 3)
    assert s.rank_position([one], 1, 3) == one  # "every file named before part-0003 was read" holds per rank
    s.seek(one)
    assert all(v // 100 > 3 or (v // 100 == 3 and v % 100 >= 2) for v in _read(s))
    with pytest.raises(ValueError, match="positions of 2 rank.* this job has 3"):
        s.rank_position([one, one], 1, 3)
    with pytest.raises(TypeError, match="IterableStream cannot split its records across ranks"):
        IterableStream([1, 2]).set_rank(0, 2)
    with pytest.raises(ValueError, match="'rank' must be an int"):
        s.set_rank(3, 3)
