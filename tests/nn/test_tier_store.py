"""The tier's storage: TierFile (memory-mapped rows, per-block checksums) and TierStore (commits, undo
log). Real files in tmp_path; corruption is real bytes flipped on disk; the crash is a real SIGKILL."""
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from recstream.nn.tier_file import HEADER_BYTES, TierFile, TierFileError
from recstream.nn.tier_store import TierStore


def _fill(cols, value=None):
    def fill(a, b):
        if value is not None:
            return np.full((b - a, cols), value, np.float32)
        return np.arange(a * cols, b * cols, dtype=np.float32).reshape(b - a, cols)
    return fill


def test_rows_round_trip_and_survive_reopen(tmp_path):
    path = str(tmp_path / "w.tier")
    f = TierFile.create(path, rows=20000, cols=3, fill=_fill(3))
    assert f.blocks > 1  # several blocks, so per-block bookkeeping is exercised
    np.testing.assert_array_equal(f.read_rows(np.array([0, 19999])), [[0, 1, 2], [59997, 59998, 59999]])
    f.write_rows(np.array([7, 4000]), np.full((2, 3), -1.0, np.float32))
    f.flush()
    f.close()
    g = TierFile.open(path)
    g.verify_all()
    assert g.read_rows(np.array([7, 4000, 8])).tolist() == [[-1.0] * 3, [-1.0] * 3, [24.0, 25.0, 26.0]]


@pytest.mark.parametrize("value", [0.0, 0.25])
def test_a_constant_file_is_sparse_and_checksummed_like_a_filled_one(tmp_path, value, monkeypatch):
    """An optimizer state's file (one initial value): zeros are not written where the page cache
    cannot hold the file (the file holds no data page), and every block, the short last one too,
    passes its checksum after a reopen."""
    from recstream.nn import tier_file
    monkeypatch.setattr(tier_file, "large_file", lambda nbytes: True)
    path, rows = str(tmp_path / "s.tier"), 1_000_003  # 1M rows x 4 cols: 16 MB of values, a short last block
    f = TierFile.create(path, rows=rows, cols=4, fill=value)
    f.close()
    on_disk = os.stat(path).st_blocks * 512
    if value == 0.0:
        assert on_disk < 1 << 20  # the header and checksums, not 16 MB of zeros
    else:
        assert on_disk >= rows * 16
    g = TierFile.open(path)
    g.verify_all()
    assert g.read_rows(np.array([0, rows - 1])).tolist() == [[value] * 4] * 2
    g.write_rows(np.array([rows - 1]), np.ones((1, 4), np.float32))
    g.flush()
    g.close()
    h = TierFile.open(path)
    h.verify_all()
    assert h.read_rows(np.array([rows - 2, rows - 1])).tolist() == [[value] * 4, [1.0] * 4]


def test_a_filled_files_checksums_are_those_of_its_bytes(tmp_path):
    """A file made from a fill records each block's checksum from the values it writes (not read back):
    over several fill calls and a short last block, they equal the checksums of the bytes on disk."""
    path = str(tmp_path / "w.tier")
    f = TierFile.create(path, 600_001, 16, _fill(16))  # 64 rows a block, 262,144 rows a fill call
    made = f._crc.copy()
    f.dirty[:] = True
    f.flush()  # checksums computed again, from the file's bytes
    np.testing.assert_array_equal(f._crc, made)
    f.close()
    reopened = TierFile.open(path)
    reopened.verify_all()
    np.testing.assert_array_equal(reopened.read_rows(np.array([600_000])), _fill(16)(600_000, 600_001))
    reopened.close()

def test_a_zero_file_the_page_cache_holds_is_written_so_training_takes_no_hole_faults(tmp_path):
    """A hole's first write allocates its page in a fault of its own (on a cache-full 4M-row table:
    380 a step, most of the write-back's system time). A zero file the page cache can hold is written
    at creation, in sequence, checksummed like a sparse one."""
    path, rows = str(tmp_path / "s.tier"), 100_003
    f = TierFile.create(path, rows=rows, cols=4, fill=0.0)
    f.close()
    assert os.stat(path).st_blocks * 512 >= rows * 16  # every data page allocated: no hole left
    g = TierFile.open(path)
    g.verify_all()
    assert g.read_rows(np.array([0, rows - 1])).tolist() == [[0.0] * 4] * 2
    g.close()


def test_a_flipped_byte_is_detected_naming_the_file_and_block(tmp_path):
    path = str(tmp_path / "w.tier")
    f = TierFile.create(path, rows=20000, cols=3, fill=_fill(3))
    block_rows, data_start = f.block_rows, HEADER_BYTES + 4096  # 4 * blocks < 4096: one page of checksums
    f.close()
    row = block_rows * 2 + 5  # inside block 2
    with open(path, "r+b") as raw:
        raw.seek(data_start + row * 3 * 4 + 1)
        byte = raw.read(1)
        raw.seek(-1, os.SEEK_CUR)
        raw.write(bytes([byte[0] ^ 0xFF]))
    g = TierFile.open(path)
    assert g.read_rows(np.array([0])).tolist() == [[0.0, 1.0, 2.0]]  # block 0 is fine
    with pytest.raises(TierFileError, match=rf"w\.tier: block 2 \(rows {2 * block_rows}\.\..*fails its checksum"):
        g.read_rows(np.array([row]))
    with pytest.raises(TierFileError, match="block 2"):  # a write to the block is refused too
        g.write_rows(np.array([row]), np.zeros((1, 3), np.float32))


@pytest.mark.parametrize("damage", ["magic", "header", "truncate", "short"])
def test_a_torn_or_foreign_file_is_refused(tmp_path, damage):
    path = str(tmp_path / "w.tier")
    TierFile.create(path, rows=100, cols=2, fill=_fill(2)).close()
    with open(path, "r+b") as raw:
        if damage == "magic":
            raw.write(b"NOTATIER")
        elif damage == "header":
            raw.seek(20)
            raw.write(b"\x07")  # the row count changes: the header's checksum fails
        elif damage == "truncate":
            raw.truncate(os.path.getsize(path) - 4)
        else:
            raw.truncate(100)
    message = {"magic": "bad magic", "header": "header fails its checksum", "truncate": "truncated or corrupt",
               "short": "shorter than its header"}[damage]
    with pytest.raises(TierFileError, match=message):
        TierFile.open(path)


@pytest.mark.parametrize("large", [False, True])
def test_uncommitted_writes_are_rolled_back_and_committed_ones_kept(tmp_path, large, monkeypatch):
    if large:  # a file the page cache cannot hold: one map, read and written, sparse zeros
        from recstream.nn import tier_file
        monkeypatch.setattr(tier_file, "large_file", lambda nbytes: True)
    store = TierStore.create(str(tmp_path), {"weight": (3000, 4, _fill(4)), "sum": (3000, 1, _fill(1, 0.5))})
    store.write_many([("weight", np.array([1, 2999]), np.full((2, 4), 9.0, np.float32)),
                      ("sum", np.array([1]), np.full((1, 1), 2.0, np.float32))])
    assert store.commit() == 1
    store.write_many([("weight", np.array([1, 5]), np.full((2, 4), -3.0, np.float32)),
                      ("sum", np.array([1]), np.full((1, 1), 7.0, np.float32))])
    store.rollback()  # in the same process
    assert store.read("weight", np.array([1, 5, 2999]))[:, 0].tolist() == [9.0, 20.0, 9.0]
    assert store.read("sum", np.array([1, 2])).ravel().tolist() == [2.0, 0.5]
    store.write("weight", np.array([5]), np.full((1, 4), -3.0, np.float32))
    store.close()
    reopened = TierStore.open(str(tmp_path))  # a new process would see the same
    assert reopened.generation == 1
    assert reopened.read("weight", np.array([5]))[0, 0] == 20.0
    for f in reopened.files.values():
        f.verify_all()


def test_an_array_added_later_is_committed_with_the_others(tmp_path):
    store = TierStore.create(str(tmp_path), {"weight": (100, 2, _fill(2))})
    assert store.commit() == 0  # nothing written: no new generation
    store.add("exp_avg", 100, 2, _fill(2, 0.0))
    store.write("exp_avg", np.array([3]), np.ones((1, 2), np.float32))
    store.commit()
    store.write("exp_avg", np.array([3]), np.full((1, 2), 4.0, np.float32))
    store.close()
    reopened = TierStore.open(str(tmp_path))
    assert set(reopened.files) == {"weight", "exp_avg"} and reopened.generation == 1
    assert reopened.read("exp_avg", np.array([3])).tolist() == [[1.0, 1.0]]



def test_states_added_before_anything_is_written_join_the_weights_records(tmp_path):
    """An optimizer's states met at its first step, before any row was written: the store's file is
    made anew with them beside the weights (one record a row), the old file removed; once rows are
    written, an array added gets a file of its own. Both survive a reopen."""
    import json
    store = TierStore.create(str(tmp_path), {"weight": (1000, 3, _fill(3))})
    store.add_arrays({"m": (1000, 3, 0.0), "v": (1000, 2, 0.25)})
    assert {a.file.path for a in store.files.values()} == {str(tmp_path / "group-1.tier")}
    assert sorted(p.name for p in tmp_path.glob("*.tier")) == ["group-1.tier"]
    assert (store.files["m"].start, store.files["v"].stop, store.groups[0].cols) == (3, 8, 8)
    rows = np.array([999, 0, 41])
    np.testing.assert_array_equal(store.read("weight", rows), _fill(3)(0, 1000)[rows])
    assert (store.read("m", rows) == 0).all() and (store.read("v", rows) == 0.25).all()
    store.write_many([("weight", rows, np.ones((3, 3), np.float32)), ("m", rows, np.full((3, 3), 2.0, np.float32)),
                      ("v", rows, np.full((3, 2), 3.0, np.float32))])
    store.commit()
    store.add("sum", 1000, 1, 0.5)
    assert store.files["sum"].file is not store.files["weight"].file
    store.write("sum", np.array([41]), np.full((1, 1), 7.0, np.float32))
    store.close()
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["version"] == 2 and [g["file"] for g in manifest["groups"]] == ["group-1.tier", "group-0.tier"]
    reopened = TierStore.open(str(tmp_path))
    assert reopened.read("m", rows).tolist() == [[2.0] * 3] * 3 and reopened.read("v", rows[:1]).tolist() == [[3.0] * 2]
    assert reopened.read("sum", np.array([41, 1]))[:, 0].tolist() == [0.5, 0.5]  # the uncommitted write undone
    reopened.close()


def test_states_added_after_rows_were_written_but_never_committed_join_the_records(tmp_path):
    """A table's rows loaded (written, no commit yet) before its optimizer's first step: the states
    still join the weights' records. The written rows stay written and uncommitted: a rollback (or a
    reopen after a crash) returns the store to its creation, merged; committed, they survive a reopen."""
    store = TierStore.create(str(tmp_path), {"weight": (3000, 2, _fill(2))})
    rows = np.arange(0, 3000, 3)
    store.write("weight", rows, np.full((rows.size, 2), 5.0, np.float32))
    store.add_arrays({"m": (3000, 2, 0.0), "v": (3000, 1, 1.0)})
    assert len(store.groups) == 1 and store.changed and not (tmp_path / "merge.aside").exists()
    assert (store.read("weight", rows) == 5.0).all() and (store.read("v", rows) == 1.0).all()
    np.testing.assert_array_equal(store.read("weight", rows + 1), _fill(2)(0, 3000)[rows + 1])
    store.rollback()
    np.testing.assert_array_equal(store.read("weight", rows), _fill(2)(0, 3000)[rows])
    store.write_many([("weight", rows[:4], np.ones((4, 2), np.float32)), ("m", rows[:4], np.ones((4, 2), np.float32))])
    store.commit()
    store.close()
    (tmp_path / "merge.aside").write_bytes(b"rows of a merge a crash stopped")
    reopened = TierStore.open(str(tmp_path))
    assert not (tmp_path / "merge.aside").exists() and len(reopened.groups) == 1
    assert reopened.read("m", rows[:5]).tolist() == [[1.0] * 2] * 4 + [[0.0] * 2]
    assert reopened.read("v", rows[:2]).tolist() == [[1.0]] * 2
    reopened.close()

def test_a_constant_stores_merged_file_stays_constant(tmp_path):
    """A hash table's store (zero rows) and zero optimizer states: the merged file is made as one
    value, like the arrays it joins (sparse where the page cache cannot hold it), and rows never
    written are known without a read."""
    store = TierStore.create(str(tmp_path), {"weight": (5000, 4, 0.0)})
    store.add_arrays({"exp_avg": (5000, 4, 0.0), "exp_avg_sq": (5000, 4, 0.0)})
    assert store.read_many(("weight", "exp_avg_sq"), np.array([7, 4999]))["exp_avg_sq"].tolist() == [[0.0] * 4] * 2
    assert store.bytes_read == 0
    store.close()


def test_a_store_of_a_file_per_array_still_opens_trains_and_rolls_back(tmp_path):
    """A store written before arrays shared files (manifest version 1: ``{name}.tier`` each, log entries
    numbered in the manifest's order) opens, rolls back its uncommitted writes, and trains on."""
    import json
    for name, cols in (("weight", 2), ("exp_avg", 3)):
        f = TierFile.create(str(tmp_path / f"{name}.tier"), 50, cols, _fill(cols))
        f.close()
    (tmp_path / "manifest.json").write_text(json.dumps(
        {"format": "recstream-tier", "version": 1, "generation": 0, "uid": 7,
         "files": {"weight": {"rows": 50, "cols": 2}, "exp_avg": {"rows": 50, "cols": 3}}}))
    store = TierStore.open(str(tmp_path))
    assert store.uid == 7 and store.files["exp_avg"].file.path == str(tmp_path / "exp_avg.tier")
    store.write_many([("weight", np.array([4]), np.ones((1, 2), np.float32)),
                      ("exp_avg", np.array([4]), np.ones((1, 3), np.float32))])
    assert store.commit() == 1
    store.write("exp_avg", np.array([4, 5]), np.full((2, 3), 9.0, np.float32))
    store.close()
    store = TierStore.open(str(tmp_path))
    assert store.read("exp_avg", np.array([4, 5])).tolist() == [[1.0] * 3, _fill(3)(5, 6)[0].tolist()]
    assert store.read("weight", np.array([4])).tolist() == [[1.0] * 2]
    store.close()


def test_a_file_the_manifest_does_not_name_is_removed_at_open(tmp_path):
    """A file being made when its process died (an array's, before the manifest named it) is not the
    store's: removed when the store opens. Files of the store stay."""
    store = TierStore.create(str(tmp_path), {"weight": (10, 2, _fill(2))})
    store.close()
    TierFile.create(str(tmp_path / "group-1.tier"), 10, 2, 0.0).close()
    (tmp_path / "notes.txt").write_text("kept")
    TierStore.open(str(tmp_path)).close()
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix in (".tier", ".txt")) == ["group-0.tier",
                                                                                          "notes.txt"]

_WRITER = textwrap.dedent("""
    import sys, numpy as np
    from recstream.nn.tier_store import TierStore
    store = TierStore.open(sys.argv[1])
    rng = np.random.default_rng(0)
    step = 0
    while True:  # commits every 5 steps: the kill lands between commits (or inside one)
        step += 1
        rows = rng.integers(0, 20000, 64)
        store.write_many([("weight", rows, np.full((64, 4), float(step), np.float32))])
        if step % 5 == 0:
            store.commit()
            print(step, flush=True)
""")


@pytest.mark.e2e
def test_sigkill_while_writing_leaves_the_last_commit(tmp_path):
    """A real process writing and committing in a loop is SIGKILLed; reopening gives exactly a committed
    generation: every row written by a committed step, none by a later one, all blocks valid."""
    TierStore.create(str(tmp_path), {"weight": (20000, 4, _fill(4, 0.0))}).close()
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                            env=env)
    seen = [int(proc.stdout.readline()) for _ in range(4)]
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    store = TierStore.open(str(tmp_path))
    weight = store.files["weight"]
    weight.verify_all()
    committed_step = store.generation * 5
    assert committed_step >= seen[-1]
    # replay the writes the committed steps made: the file must equal it exactly
    expected = np.zeros((20000, 4), np.float32)
    rng = np.random.default_rng(0)
    for step in range(1, committed_step + 1):
        expected[rng.integers(0, 20000, 64)] = float(step)
    np.testing.assert_array_equal(store.read("weight", np.arange(20000)), expected)


_FRESH_WRITER = textwrap.dedent("""
    import sys, numpy as np
    from recstream.nn.tier_store import TierStore
    store = TierStore.create(sys.argv[1], {"weight": (20000, 4, 0.25)})  # created here: its rows' value known
    rng = np.random.default_rng(0)
    step = 0
    while True:
        step += 1
        rows = np.unique(rng.integers(0, 20000, 64))
        store.write_many([("weight", rows, np.full((rows.size, 4), float(step), np.float32))])
        if step % 5 == 0:
            store.commit()
            print(step, flush=True)
""")


@pytest.mark.e2e
def test_sigkill_after_writes_of_never_written_rows_leaves_the_last_commit(tmp_path):
    """Rows never written since the store was created are logged as their value (not their bytes): a
    process SIGKILLed while writing such rows reopens to its last commit, every other row at the value."""
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    proc = subprocess.Popen([sys.executable, "-c", _FRESH_WRITER, str(tmp_path)], stdout=subprocess.PIPE,
                            text=True, env=env)
    seen = [int(proc.stdout.readline()) for _ in range(4)]
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    store = TierStore.open(str(tmp_path))
    store.files["weight"].verify_all()
    committed_step = store.generation * 5
    assert committed_step >= seen[-1]
    expected = np.full((20000, 4), 0.25, np.float32)
    rng = np.random.default_rng(0)
    for step in range(1, committed_step + 1):
        expected[np.unique(rng.integers(0, 20000, 64))] = float(step)
    np.testing.assert_array_equal(store.read("weight", np.arange(20000)), expected)


def test_never_written_rows_are_logged_as_their_value(tmp_path):
    """The undo log of a write to rows still at their file's creation value (an array added with one
    value once the store trained: a file of its own) holds the rows (8 bytes each), not their bytes (64
    each here). Rollback, also one commit back, restores the value."""
    store = TierStore.create(str(tmp_path), {"weight": (20000, 16, _fill(16))})
    store.write("weight", np.array([3]), np.ones((1, 16), np.float32))
    store.commit()
    store.add("exp_avg", 20000, 16, 0.5)
    assert store.files["exp_avg"].file is not store.files["weight"].file
    log = os.path.join(str(tmp_path), "undo.log")
    before = os.path.getsize(log)
    rows = np.arange(0, 20000, 7)
    store.write("exp_avg", rows, np.full((rows.size, 16), 3.0, np.float32))
    blocks = 20000 // 64 + 1  # each block's committed checksum, 12 bytes
    assert os.path.getsize(log) - before < rows.size * 8 + blocks * 12 + 1024  # (bytes: rows.size * 64 more)
    store.rollback()
    assert (store.read("exp_avg", rows) == 0.5).all()
    store.write("exp_avg", rows[:10], np.full((10, 16), 3.0, np.float32))
    store.commit()
    store.write("exp_avg", rows[5:20], np.full((15, 16), 4.0, np.float32))  # 10 fresh rows, 5 logged as bytes
    store.close()
    store = TierStore.open(str(tmp_path))
    assert store.read("exp_avg", rows[:20])[:, 0].tolist() == [3.0] * 10 + [0.5] * 10
    store.rollback_to(1)
    assert (store.read("exp_avg", rows[:20]) == 0.5).all()
    for f in store.files.values():
        f.verify_all()
    store.close()


def test_rows_logged_ahead_are_written_without_a_sync_and_rolled_back(tmp_path, monkeypatch):
    """write_many(ahead=...) logs the pre-images of rows written later in the same fsync: those writes
    sync nothing, and a rollback still restores them (and rows logged ahead but never written). A
    store written through shared maps: one written through private maps logs at its commit."""
    store = TierStore.create(str(tmp_path), {"weight": (20000, 4, _fill(4)), "sum": (20000, 4, 0.5)})
    for f in store.groups:
        f.one_map()
    fsyncs = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: fsyncs.append(fd) or real_fsync(fd))
    first, later, never = np.arange(0, 100), np.arange(5000, 5100), np.arange(9000, 9010)
    asked = []

    def ahead():  # asked only by a write that logs (a cache's LRU order is read under its lock)
        asked.append(1)
        return [(name, np.concatenate([later, never])) for name in ("weight", "sum")]

    store.write_many([(name, first, np.full((100, 4), 7.0, np.float32)) for name in ("weight", "sum")], ahead=ahead)
    assert len(fsyncs) == 1 and len(asked) == 1
    store.write_many([(name, later, np.full((100, 4), 8.0, np.float32)) for name in ("weight", "sum")], ahead=ahead)
    assert len(fsyncs) == 1 and len(asked) == 1  # every pre-image was durable already: nothing asked
    store.rollback()
    rows = np.concatenate([first, later, never])
    np.testing.assert_array_equal(store.read("weight", rows), _fill(4)(0, 20000)[rows])
    assert (store.read("sum", rows) == 0.5).all()
    for f in store.files.values():
        f.verify_all()
    store.close()


def test_a_store_written_through_private_maps_logs_pre_images_at_its_commit_and_a_torn_commit_rolls_back(
        tmp_path, monkeypatch):
    """A file written through its private map keeps its committed bytes until a commit writes the
    map's pages: a write logs and syncs nothing, and the commit logs the pre-images of every row
    written since the last one before its first page reaches the file. A commit that dies after
    writing some of the pages leaves a store that opens at the previous commit."""
    store = TierStore.create(str(tmp_path), {"weight": (20000, 4, _fill(4)), "sum": (20000, 4, 0.5)})
    assert all(f.private for f in store.groups)
    first = np.arange(0, 100)
    store.write_many([(name, first, np.full((100, 4), 7.0, np.float32)) for name in ("weight", "sum")])
    assert store.commit() == 1
    path, log = store.groups[0].path, tmp_path / "undo.log"
    committed, log_bytes = open(path, "rb").read(), log.stat().st_size
    fsyncs = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: fsyncs.append(fd) or real_fsync(fd))
    rows = np.r_[50:3000:7, 15000:19000:7]  # two runs of pages; some rows committed at 7.0, the rest at the fill
    store.write_many([(name, rows, np.full((rows.size, 4), 9.0, np.float32)) for name in ("weight", "sum")])
    assert store.changed and store.logged("sum", rows)  # (deferred: a write of them syncs nothing)
    assert not fsyncs and log.stat().st_size == log_bytes and open(path, "rb").read() == committed
    real_pwrite, written = os.pwrite, []

    def torn(fd, data, offset):  # the disk fails after the commit's first run of pages
        if written:
            raise OSError(28, "No space left on device")
        written.append(offset)
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", torn)
    with pytest.raises(OSError, match="No space"):
        store.commit()
    assert written and open(path, "rb").read() != committed  # torn: part of the new rows in the file
    assert log.stat().st_size > log_bytes + rows.size * 8 * 4  # the records' pre-images (8 floats), logged first
    monkeypatch.setattr(os, "pwrite", real_pwrite)
    store.close()
    store = TierStore.open(str(tmp_path))
    assert store.generation == 1
    every = np.arange(20000)
    expected = _fill(4)(0, 20000)
    expected[first] = 7.0
    np.testing.assert_array_equal(store.read("weight", every), expected)
    assert (store.read("sum", first) == 7.0).all() and (store.read("sum", np.arange(100, 20000)) == 0.5).all()
    for f in store.files.values():
        f.verify_all()
    store.close()


def test_an_undo_log_naming_a_file_the_store_lacks_is_refused_and_the_rows_are_untouched(tmp_path):
    """An undo log whose entry names a group file the store does not have is another store's (copied
    in by hand): opening refuses it, naming the log, rather than writing its bytes into some file."""
    from recstream.nn import tier_store
    store = TierStore.create(str(tmp_path), {"weight": (100, 4, _fill(4))})
    store.close()
    rows, pre = np.array([3], dtype=np.int64), np.full((1, 4), 9.0, np.float32)
    with open(tmp_path / "undo.log", "ab") as log:
        for part in tier_store._entry(tier_store._ROWS, 1, rows.size, rows, pre):
            log.write(part)
    refused = r"undo.log names file 1, the store has 1: the log is not this store's"
    with pytest.raises(TierFileError, match=refused) as first:
        TierStore.open(str(tmp_path))
    # The refused open let the store's lock go, though its error (and so the store) is still held: the
    # same error again, not "in use by another table"
    with pytest.raises(TierFileError, match=refused):
        TierStore.open(str(tmp_path))
    assert first.value.__traceback__ is not None
    f = TierFile.open(str(tmp_path / "group-0.tier"))
    np.testing.assert_array_equal(f.read_rows(np.arange(100)), _fill(4)(0, 100))
    f.close()


def test_the_store_returns_one_commit_back_and_no_further(tmp_path):
    """A checkpoint commits the store before its file is written: a kill between the two must leave the
    previous checkpoint's generation reachable, also from a new process."""
    store = TierStore.create(str(tmp_path), {"weight": (20000, 4, _fill(4, 0.0))})
    for generation in (1, 2):
        store.write("weight", np.array([generation, 10000 + generation]), np.full((2, 4), generation, np.float32))
        assert store.commit() == generation
    store.write("weight", np.array([1, 3]), np.full((2, 4), 9.0, np.float32))  # uncommitted
    store.close()
    store = TierStore.open(str(tmp_path))
    store.rollback_to(1)
    assert store.generation == 1
    assert store.read("weight", np.array([1, 2, 3, 10001, 10002]))[:, 0].tolist() == [1.0, 0.0, 0.0, 1.0, 0.0]
    store.write("weight", np.array([5]), np.ones((1, 4), np.float32))
    store.commit()
    store.close()
    store = TierStore.open(str(tmp_path))
    with pytest.raises(TierFileError, match="cannot return to generation 0; it is at generation 2"):
        store.rollback_to(0)  # two back
    store.rollback_to(1)  # one back, again
    assert store.read("weight", np.array([1, 5]))[:, 0].tolist() == [1.0, 0.0]
    with pytest.raises(TierFileError, match="cannot return to generation 0; it is at generation 1"):
        store.rollback_to(0)  # the previous commit's log was used up
    for f in store.files.values():
        f.verify_all()


def test_a_store_in_use_is_refused_until_closed(tmp_path):
    store = TierStore.create(str(tmp_path), {"weight": (10, 2, _fill(2))})
    with pytest.raises(TierFileError, match="is in use by another table"):
        TierStore.open(str(tmp_path))
    store.close()
    TierStore.open(str(tmp_path)).close()


def _rss_file_mib() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith("RssFile:"))


def test_release_drops_mapped_pages_from_the_resident_set_and_keeps_written_rows(tmp_path):
    path = str(tmp_path / "w.tier")
    f = TierFile.create(path, rows=1 << 20, cols=16, fill=_fill(16, 1.0))  # 64 MiB
    f.release()
    before = _rss_file_mib()
    f.read_rows(np.arange(0, 1 << 20, 64))  # a row of every page
    f.write_rows(np.array([5, 1 << 19]), np.full((2, 16), 3.0, np.float32))
    assert _rss_file_mib() - before > 48
    f.release()  # written pages not flushed yet: they must survive
    assert _rss_file_mib() - before < 8
    assert f.read_rows(np.array([5, 6, 1 << 19]))[:, 0].tolist() == [3.0, 1.0, 3.0]
    f.flush()
    f.close()
    assert TierFile.open(path).read_rows(np.array([5, 1 << 19]))[:, 0].tolist() == [3.0, 3.0]


def _mapped_mib(array: np.ndarray) -> float:
    """Resident MiB of the mapping (/proc/self/smaps) that holds `array`'s first byte."""
    address, inside = array.ctypes.data, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                start, end = (int(x, 16) for x in head.split("-"))
                inside = start <= address < end
            elif inside and head == "Rss:":
                return int(line.split()[1]) / 1024
    raise AssertionError("no mapping holds the array")


def test_rows_are_written_through_a_private_map_and_reach_the_file_at_a_flush(tmp_path):
    """A file the page cache holds is written through a private map: the file's bytes change only when
    a flush writes the pages written (so the kernel's write-back never cleans a page the next step
    writes, each such write a fault waiting on it); a page once written faults no more, flushes
    included; a close without a flush drops the writes (uncommitted: the store's undo log's to undo)."""
    import resource
    path = str(tmp_path / "w.tier")
    f = TierFile.create(path, rows=1 << 18, cols=16, fill=_fill(16, 1.0))  # 16 MiB, 64 rows a page
    rows = np.arange(0, 1 << 18, 64)  # a row of every page

    def on_disk():
        raw = np.fromfile(path, dtype=np.float32, offset=HEADER_BYTES + f.blocks * 4 + (-(f.blocks * 4)) % 4096)
        return raw.reshape(1 << 18, 16)[rows[[0, -1]], 0].tolist()

    f.write_rows(rows, np.full((rows.size, 16), 2.0, np.float32))
    assert f.read_rows(rows[[0, -1]])[:, 0].tolist() == [2.0, 2.0] and on_disk() == [1.0, 1.0]
    f.flush()
    assert on_disk() == [2.0, 2.0]
    before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
    f.write_rows(rows, np.full((rows.size, 16), 3.0, np.float32))
    assert resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before < 16  # (a page each: 4,096)
    f.close()
    reopened = TierFile.open(path)
    assert reopened.read_rows(rows[[0, -1]])[:, 0].tolist() == [2.0, 2.0]  # the unflushed write dropped
    reopened.close()


def test_stores_whose_two_maps_could_pass_the_page_budget_read_through_one_map(tmp_path, monkeypatch):
    """While twice the open stores' files fit in 1.5 budgets a file is read and written through a
    private map (its written pages the process's own memory); past that, through the shared map whose
    file pages the budget measures (the private map's writes written to the file, its pages dropped)."""
    import gc

    from recstream.nn import tier_store
    gc.collect()  # stores of earlier tests, unreachable, are not open
    monkeypatch.setattr(tier_store, "RELEASE_BYTES", 6 << 20)
    a = TierStore.create(str(tmp_path / "a"), {"weight": (1 << 15, 16, _fill(16, 1.0))})  # 2 MiB: 4 in two maps < 9
    rows = np.arange(0, 1 << 15, 64)
    assert (a.read("weight", rows) == 1.0).all()
    f = a.files["weight"].file
    assert f.data is not f._shared_rows and _mapped_mib(f.data) > 1.5  # the private map
    b = TierStore.create(str(tmp_path / "b"), {"weight": (1 << 16, 16, _fill(16, 1.0))})  # 6 MiB open: 12 > 9
    a.write("weight", rows, np.full((rows.size, 16), 2.0, np.float32))
    assert f.data is f._shared_rows  # one map: reads and writes (nothing measured yet: 6 MiB, not past 6)
    assert (a.read("weight", rows) == 2.0).all() and a.read("weight", np.array([1]))[0, 0] == 1.0
    a.add("sum", 1 << 15, 1, 0.5)  # an array added later is read through one map too
    assert a.files["sum"].file.data is a.files["sum"].file._shared_rows and (a.read("sum", rows) == 0.5).all()
    a.commit()
    a.close(), b.close()
    reopened = TierStore.open(str(tmp_path / "a"))
    assert (reopened.read("weight", rows) == 2.0).all()
    reopened.close()


def test_a_large_scattered_read_keeps_the_mapped_pages_bounded_while_it_runs(tmp_path, monkeypatch):
    """A read of rows spread over the whole file maps a page (or, on kernels mapping large page-cache
    folios, far more) per row: the store measures the pages mapped as it goes and drops them past its
    budget, so the resident set stays bounded during one call, not only after it."""
    from recstream.nn import tier_file, tier_store
    monkeypatch.setattr(tier_store, "RELEASE_BYTES", 8 << 20)
    store = TierStore.create(str(tmp_path), {"weight": (1 << 20, 16, _fill(16, 1.0))})  # 64 MiB
    store._release()
    base, peaks = tier_file.mapped_file_bytes(), []
    read_rows = TierFile.read_rows

    def watched(self, rows, blocks=None):  # behaviour unchanged: records the mapped bytes after each file read
        out = read_rows(self, rows, blocks)
        peaks.append(tier_file.mapped_file_bytes() - base)
        return out

    monkeypatch.setattr(TierFile, "read_rows", watched)
    out = store.read("weight", np.arange(0, 1 << 20, 64))  # a row of every page: 64 MiB of pages
    assert out.shape == (1 << 14, 16) and (out == 1.0).all()
    assert max(peaks) < (8 << 20) + (4 << 20), [p >> 20 for p in peaks]  # budget + one chunk's pages
    store.close()


def test_rows_of_a_constant_array_never_written_are_not_read_from_its_file(tmp_path):
    """Arrays created at one value (optimizer states at their initial one, a hash table's zero rows):
    rows no write has touched are that value, known without reading the file (most rows a step loads
    are new to training). Written rows are read back from the file (whole records: 6 floats here),
    rolled back ones too; a store opened from disk knows nothing and reads all."""
    store = TierStore.create(str(tmp_path), {"sum": (4096, 4, 0.5), "m": (4096, 2, 0.5)})
    fresh = store.read("sum", np.array([3, 700, 4095]))
    assert fresh.tolist() == [[0.5] * 4] * 3 and store.bytes_read == 0
    store.write("sum", np.array([700]), np.full((1, 4), 9.0, np.float32))
    assert store.read("sum", np.array([3, 700])).tolist() == [[0.5] * 4, [9.0] * 4]
    assert store.read("m", np.array([700])).tolist() == [[0.5] * 2]
    assert store.bytes_read == 48  # row 700's record, twice
    store.rollback()
    assert store.read("sum", np.array([700, 701])).tolist() == [[0.5] * 4] * 2
    store.write("sum", np.array([5]), np.full((1, 4), 2.0, np.float32))
    store.commit()
    store.close()
    reopened = TierStore.open(str(tmp_path))
    assert reopened.read("sum", np.array([5, 6])).tolist() == [[2.0] * 4, [0.5] * 4]
    assert reopened.bytes_read == 48
    reopened.close()


def test_reads_of_mapped_rows_do_not_measure_the_resident_set(tmp_path, monkeypatch):
    """Measuring the mapped pages opens /proc/self/statm (tens of us): a busy tier read it every 256
    rows, hundreds of times a step. Rows whose pages are mapped already fault nothing, so nothing
    can have passed the budget: no measurement (before: one per 256 rows, 64 here)."""
    from recstream.nn import tier_file
    store = TierStore.create(str(tmp_path), {"weight": (1 << 16, 16, _fill(16, 1.0))})  # 4 MiB
    store.read("weight", np.arange(1 << 16))  # every page mapped
    measured = []
    real = tier_file.mapped_file_bytes
    monkeypatch.setattr(tier_file, "mapped_file_bytes", lambda: measured.append(1) or real())
    for start in range(0, 1 << 14, 256):
        assert (store.read("weight", np.arange(start, start + 256)) == 1.0).all()
    assert len(measured) <= 2, len(measured)
    store.close()


def test_a_large_scattered_write_keeps_the_mapped_pages_bounded_with_its_undo_log(tmp_path, monkeypatch):
    """Writing rows spread over the file reads their committed bytes into the undo log first: those
    pages are measured too (a commit's write-back of a large cache went to 6.5 GB of mapped pages)."""
    from recstream.nn import tier_file, tier_store
    monkeypatch.setattr(tier_store, "RELEASE_BYTES", 8 << 20)
    store = TierStore.create(str(tmp_path), {"weight": (1 << 20, 16, _fill(16, 1.0))})  # 64 MiB
    store._release()
    base, peaks = tier_file.mapped_file_bytes(), []
    spent = tier_file.PageBudget.spent

    def watched(self, n):  # behaviour unchanged: records the mapped bytes at each measuring point
        peaks.append(tier_file.mapped_file_bytes() - base)
        spent(self, n)

    monkeypatch.setattr(tier_file.PageBudget, "spent", watched)
    rows = np.arange(0, 1 << 20, 64)
    store.write("weight", rows, np.full((rows.size, 16), 2.0, np.float32))
    assert max(peaks) < (8 << 20) + (4 << 20), [p >> 20 for p in peaks]
    store.rollback()  # the undo log holds every row's committed bytes
    assert (store.read("weight", rows) == 1.0).all()
    store.close()


@pytest.mark.parametrize("n", [0, 1, 7, 9, 4000])
def test_row_bits_are_set_and_cleared_as_one_row_at_a_time_would(n):
    """The store's bit-per-row sets (rows logged, rows still at their value) are updated a whole array
    of rows at a time: same bits as one row at a time, repeats and rows sharing a byte included."""
    from recstream.nn.tier_store import _RowIndex
    rows = np.random.default_rng(n).integers(0, 3000, n)
    rows = np.concatenate([rows, rows[: n // 2]])  # repeats
    bits = np.zeros(375, np.uint8)
    _RowIndex(rows).set(bits)
    every = _RowIndex(np.arange(3000))
    assert np.array_equal(np.flatnonzero(every.bits(bits)), np.unique(rows))
    cleared = rows[: n // 3]
    _RowIndex(cleared).clear(bits)
    assert np.array_equal(np.flatnonzero(every.bits(bits)), np.setdiff1d(rows, cleared))
    some = rows % 3 == 0  # a selection of the rows (where=)
    bits[:] = 0
    _RowIndex(rows).set(bits, some)
    assert np.array_equal(np.flatnonzero(every.bits(bits)), np.unique(rows[some]))
    assert np.array_equal(_RowIndex(rows).bits(bits, some), np.ones(some.sum(), bool))


def _counting(monkeypatch, owner, name):
    calls = []
    real = getattr(owner, name)
    monkeypatch.setattr(owner, name, lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


def test_stores_within_the_page_budget_touch_rows_in_one_call_without_measuring(tmp_path, monkeypatch):
    """The files of the open stores cannot map more than they hold: while that is within a store's
    budget, a read or write of 4,096 scattered rows is one file call per array and counts no page
    faults (before: 16 calls of 256 rows, a getrusage after each, and as many for the pre-images).
    Once another store takes the open files past the budget, they are measured as they go again."""
    import gc

    from recstream.nn import tier_file, tier_store
    gc.collect()  # stores of earlier tests, unreachable, are not open
    monkeypatch.setattr(tier_store, "RELEASE_BYTES", 6 << 20)
    a = TierStore.create(str(tmp_path / "a"), {"weight": (1 << 16, 16, _fill(16, 1.0))})  # 4 MiB
    faults = _counting(monkeypatch, tier_file, "page_faults")
    reads = _counting(monkeypatch, TierFile, "read_rows")
    writes = _counting(monkeypatch, TierFile, "write_rows")
    rows = np.arange(0, 1 << 16, 16)  # 4,096 rows, one in four of a page's
    assert (a.read("weight", rows) == 1.0).all()
    a.write("weight", rows, np.full((rows.size, 16), 2.0, np.float32))  # pre-images logged first
    assert (len(reads), len(writes), len(faults)) == (1, 1, 0)
    b = TierStore.create(str(tmp_path / "b"), {"weight": (1 << 16, 16, _fill(16, 1.0))})  # 8 MiB open now
    reads.clear(), faults.clear()
    assert (a.read("weight", rows) == 2.0).all()
    assert len(reads) == 16 and len(faults) >= 16  # (+1 after a release: rows written are mapped twice)
    b.close()  # back within the budget
    a.rollback()
    faults.clear()
    assert (a.read("weight", rows) == 1.0).all() and not faults
    a.close()


def test_an_array_of_rows_refilled_between_writes_logs_the_new_rows_pre_images(tmp_path):
    """The store keeps the positions of the rows it was last given for the next calls: an array the
    caller refills with other rows must not reuse them, or the new rows would be written without
    their pre-images in the undo log and a rollback would keep their uncommitted bytes."""
    store = TierStore.create(str(tmp_path), {"weight": (5000, 2, _fill(2))})
    rows = np.array([4000, 7, 9])
    store.write("weight", rows, np.ones((3, 2), np.float32))
    rows[:] = [1, 2, 3]  # the same array, other rows
    store.write("weight", rows, np.full((3, 2), 5.0, np.float32))
    assert store.logged("weight", rows)
    store.rollback()
    every = np.array([1, 2, 3, 7, 9, 4000])
    np.testing.assert_array_equal(store.read("weight", every), _fill(2)(0, 5000)[every])
    store.close()


def test_state_arrays_written_with_the_same_rows_index_them_once(tmp_path, monkeypatch):
    """A cache writes a row's arrays together: the rows' positions in the bit maps and blocks are
    worked out once for all the arrays (on the ~3,800 rows a cache-full step writes back, each such
    index costs about what the test it serves does). Arrays of one file written with other rows each
    change their own columns of the records; a row's record is logged whole, once."""
    from recstream.nn import tier_store
    store = TierStore.create(str(tmp_path), {"weight": (5000, 2, _fill(2)), "m": (5000, 2, 0.0),
                                             "v": (5000, 2, 0.0)})
    indexes = _counting(monkeypatch, tier_store, "_RowIndex")
    rows = np.array([4000, 7, 9])
    store.write_many([(name, rows, np.ones((3, 2), np.float32)) for name in ("weight", "m", "v")])
    assert len(indexes) == 1
    assert store.read("m", rows).tolist() == [[1.0] * 2] * 3 and len(indexes) == 1  # (the same rows)
    store.write_many([("m", np.array([1]), np.full((1, 2), 2.0, np.float32)),
                      ("v", np.array([2]), np.full((1, 2), 3.0, np.float32))])
    assert store.read("m", np.array([1, 2, 7, 8])).tolist() == [[2.0] * 2, [0.0] * 2, [1.0] * 2, [0.0] * 2]
    assert store.read("v", np.array([1, 2, 9])).tolist() == [[0.0] * 2, [3.0] * 2, [1.0] * 2]
    assert store.logged("m", np.array([1, 2, 4000])) and not store.logged("m", np.array([3]))
    assert store.logged("v", np.array([1, 2, 9])) and not store.logged("v", np.array([3]))
    store.rollback()  # every write undone: the logged rows were set per array
    assert store.read("m", np.array([1, 7])).tolist() == [[0.0] * 2] * 2
    assert store.read("v", np.array([2, 9])).tolist() == [[0.0] * 2] * 2
    assert store.read("weight", np.array([7]))[0].tolist() == [14.0, 15.0]
    store.close()
