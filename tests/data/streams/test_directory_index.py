"""DirectoryStream with many consumed files present: new files cost no rescan of what was consumed.

Each new file used to cost two full listings of the directory (`_list` and `_has_later`), so
the rate fell with every consumed file left in place (473 files/s empty, 3 files/s with
60,000). The stream now keeps an index of the names ahead of its reading point and lists the
directory only when the index knows no next file. Counted here: calls to ``os.scandir``.
"""
from __future__ import annotations

import os

from recstream.data.streams import DirectoryStream, directory, dirindex

from .events import decoder, records, take_ids

CONSUMED, NEW = 2000, 60


def _fill(path, start: int, count: int, per_file: int = 2) -> None:
    for k in range(start, start + count):
        lines = records(per_file, (k * per_file) % 40_000)
        tmp = path / f".part-{k:06d}.csv.tmp"
        tmp.write_bytes(b"\n".join(lines) + b"\n")
        os.replace(tmp, path / f"part-{k:06d}.csv")


def _counting_scandir(monkeypatch) -> list:
    calls = []
    real = os.scandir

    def scandir(path):
        calls.append(path)
        return real(path)

    for module in (directory, dirindex):  # whichever module lists the directory
        monkeypatch.setattr(module.os, "scandir", scandir)
    return calls


def test_new_files_cost_no_rescan_of_the_consumed_ones(tmp_path, monkeypatch):
    _fill(tmp_path, 0, CONSUMED)
    _fill(tmp_path, CONSUMED, NEW)
    calls = _counting_scandir(monkeypatch)
    # resumes after the consumed files, as from a checkpoint
    s = DirectoryStream(tmp_path, batch_size=10, decoder=decoder("csv"), idle_timeout=0.3)
    s.seek({"file": f"part-{CONSUMED - 1:06d}.csv", "offset": 10**9})
    ids = take_ids(s)
    assert len(ids) == NEW * 2
    assert s.position()["file"] == f"part-{CONSUMED + NEW - 1:06d}.csv"
    # a few listings (the first, and those while idling at the end), not two per file
    assert len(calls) <= 10, f"{len(calls)} directory listings for {NEW} new files"


def test_index_is_rebuilt_from_the_checkpointed_position_on_restart(tmp_path):
    _fill(tmp_path, 0, 30)
    a = DirectoryStream(tmp_path, batch_size=10, decoder=decoder("csv"), idle_timeout=0.3, max_batches=2)
    first = take_ids(a)
    position = a.position()
    _fill(tmp_path, 30, 10)  # more files arrive while "down"
    b = DirectoryStream(tmp_path, batch_size=10, decoder=decoder("csv"), idle_timeout=0.3)
    b.seek(position)
    rest = take_ids(b)
    assert sorted(first + rest) == list(range(80))  # none lost, none twice


def test_a_late_file_is_still_reported_with_the_index(tmp_path):
    _fill(tmp_path, 0, 3)
    _fill(tmp_path, 10, 3)
    s = DirectoryStream(tmp_path, batch_size=4, decoder=decoder("csv"), idle_timeout=0.3, max_batches=2)
    take_ids(s)  # into part-000002 or so
    _fill(tmp_path, 1, 1)  # rewritten name behind the reading point: already known, not late
    _fill(tmp_path, 5, 1)  # a new name behind the reading point once it reaches part-000010
    s.max_batches = None
    take_ids(s)
    assert s.late_files == 1
