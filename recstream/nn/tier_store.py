"""The files of one disk-tiered table, committed together: `TierStore`.

A directory holds a ``manifest.json`` (the committed generation and the files), one `TierFile` per
array (``weight``, and one per per-row optimizer state such as ``exp_avg``) and ``undo.log``.

Crash safety without a second copy of the table: rows are written in place, and before a row is
first written since the last commit its committed bytes (and, for the first row of a block, the
block's committed checksum) are appended to the undo log and fsynced. A commit flushes every file
(data and checksums), then atomically replaces the manifest with generation ``g + 1`` (the commit
point), then stamps the files' headers and empties the undo log. Opening the store (or
`TierStore.rollback`) undoes every write made after the manifest's generation, so after a
SIGKILL the table is exactly as at the last commit: nothing of a later step is kept, nothing of an
earlier one lost. An undo entry torn by the kill is one whose rows were never written (the log is
fsynced before the write), so the entries are read up to the first one failing its checksum.

The log of the last commit is kept (``undo.prev``), so the store can also return one commit back: a
checkpoint commits the store before its own file is written, and a kill between the two must leave
the previous checkpoint restorable (`TierStore.rollback_to`).

Example:
    >>> import tempfile, numpy as np
    >>> d = tempfile.mkdtemp()
    >>> s = TierStore.create(d, {"weight": (8, 2, lambda a, b: np.zeros((b - a, 2), np.float32))})
    >>> s.write("weight", np.array([1]), np.ones((1, 2), np.float32)); s.commit()
    1
    >>> s.write("weight", np.array([1]), np.full((1, 2), 5.0, np.float32))  # not committed
    >>> s.close(); TierStore.open(d).read("weight", np.array([1])).tolist()
    [[1.0, 1.0]]
"""

from __future__ import annotations

import fcntl
import json
import os
import struct
import threading
import weakref
import zlib
from collections.abc import Callable

import numpy as np

from ..atomic import atomic_write, fsync_dir
from .tier_file import RELEASE_BYTES, PageBudget, TierFile, TierFileError, distinct, release_limit

__all__ = ["TierStore"]

_LOG_MAGIC = b"RSUNDO02"  # 02: may hold _FILL entries (an 01 log, which cannot, is read too)
_LOG_MAGICS = (b"RSUNDO01", _LOG_MAGIC)
_LOG_HEAD = struct.Struct("<8sQ")  # magic, generation the pre-images belong to
# An undo entry: kind, file index, block (kind _CRC) or row or block count (kinds _ROWS, _CRCS), the
# block's committed checksum (kind _CRC), bytes that follow (kind _ROWS: the rows as int64, then their
# committed bytes; kind _CRCS: the blocks as int64, then their committed checksums as uint32; kind
# _FILL: the rows as int64, whose committed bytes are all one value, its float32 bits in the crc
# field: rows never written, of an array created at that value). This version writes _ROWS, _CRCS
# and _FILL (entries per file and write, not per block); _CRC is still read.
_ENTRY = struct.Struct("<BIQII")
_CRC, _ROWS, _CRCS, _FILL = 0, 1, 2, 3
_LOG_ENTRY_BYTES = 4 << 20  # an entry's bytes at most: a rollback reads an entry whole
FORMAT = "recstream-tier"
_CHUNK = 256  # rows a read or write maps before the pages mapped are measured (PageBudget)
# Rows a read or write touches in one call when nothing is measured (TierStore._measuring): its copy
# of them is a few MiB at most, whatever the call's size (a reload of a whole cache's state is one).
_UNMEASURED_CHUNK = 1 << 16
_OPEN: weakref.WeakSet = weakref.WeakSet()  # the stores open in this process (see TierStore._measuring)
_OPEN_LOCK = threading.Lock()  # a store made on one thread while another's prefetch sums their files

Fill = Callable[[int, int], np.ndarray] | float  # rows [a, b), or one value for every row


def _entry(kind: int, index: int, count: int, *arrays: np.ndarray, word: int = 0) -> list:
    """An undo entry as the parts to write: its head (`word` in its crc field), `arrays` (contiguous)
    as they are, the checksum of them all (as `TierStore._read_log` checks it: over the head and the
    bytes that follow)."""
    arrays = tuple(np.ascontiguousarray(a) for a in arrays)
    head = _ENTRY.pack(kind, index, count, word, sum(a.nbytes for a in arrays))
    crc = zlib.crc32(head)
    for a in arrays:
        crc = zlib.crc32(memoryview(a).cast("B"), crc)
    return [head, *(memoryview(a).cast("B") for a in arrays), struct.pack("<I", crc)]


class _RowIndex:
    """Where one array of rows falls in the store's bit-per-row maps (a bit per row, little-endian in
    each byte: each row's byte and bit) and in each block size's blocks, worked out once for the
    several arrays (weights, each optimizer state) that a cache reads, logs and writes with the same
    rows: on the ~3,800 rows of a cache-full step, each such index costs about what the test it
    serves does, and a prefetch made about ten of them."""

    __slots__ = ("rows", "byte", "bit", "_blocks")

    def __init__(self, rows: np.ndarray) -> None:
        self.rows = rows.copy()  # its own: a caller's array may be refilled for another call
        self.byte = rows >> 3
        self.bit = np.left_shift(np.uint8(1), (rows & 7).astype(np.uint8))
        self._blocks: dict[int, np.ndarray] = {}

    def bits(self, bits: np.ndarray, where: np.ndarray | None = None) -> np.ndarray:
        """Whether each row (`where`: each it selects) has its bit set in `bits`."""
        if where is None:
            return (bits[self.byte] & self.bit) != 0
        return (bits[self.byte[where]] & self.bit[where]) != 0

    def set(self, bits: np.ndarray, where: np.ndarray | None = None) -> None:
        """Set the bit of each row (`where`: of each it selects; repeats allowed) in `bits`. ``ufunc.at``:
        rows sharing a byte each keep their bit (half the CPU of a sort and a ``reduceat`` on the
        ~3,800 rows a cache-full step writes back, numpy >= 1.25)."""
        at, bit = (self.byte, self.bit) if where is None else (self.byte[where], self.bit[where])
        np.bitwise_or.at(bits, at, bit)

    def clear(self, bits: np.ndarray) -> None:
        """Clear the bit of each row in `bits` (`set`'s counterpart)."""
        np.bitwise_and.at(bits, self.byte, ~self.bit)

    def blocks(self, f: TierFile) -> np.ndarray:
        """The blocks of the rows in file `f` (`TierFile.blocks_of`)."""
        out = self._blocks.get(f.block_rows)
        if out is None:
            out = self._blocks[f.block_rows] = f.blocks_of(self.rows)
        return out


def _float_bits(value: float) -> int:
    return struct.unpack("<I", struct.pack("<f", value))[0]


def _lock(directory: str):
    """An exclusive lock on the store, so two tables (in this process or another) never write one store."""
    lock = open(os.path.join(directory, "lock"), "a+b")  # noqa: SIM115 -- held for the store's life
    try:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise TierFileError(f"tier store {directory} is in use by another table (in this process or another); "
                            "give each table its own directory") from None
    return lock


def _release(files: dict[str, TierFile]) -> None:
    """Drop the mapped pages of every file from the process's resident set (`TierFile.release`), so
    its peak RSS does not grow with the table."""
    for f in files.values():
        f.release()


class TierStore:
    """Named `TierFile` s committed as one generation, with an undo log for uncommitted writes."""

    def __init__(self, directory: str, files: dict[str, TierFile], generation: int, uid: int, lock) -> None:
        self.directory, self.files, self.generation = directory, files, generation
        self._lock = lock  # held while the store is open (released by close, or by the kernel at exit)
        self.uid = uid  # names this store in checkpoints, so one of another store is refused
        # Since the last commit: blocks whose checksum is logged, rows (a bit each) whose bytes are.
        self._preimaged = {name: np.zeros(f.blocks, dtype=bool) for name, f in files.items()}
        self._logged_rows = {name: np.zeros((f.rows + 7) // 8, dtype=np.uint8) for name, f in files.items()}
        # Arrays this process created with one value (an optimizer state's initial one): that value, and
        # a bit per row still at it (never written since). Such rows are not read, their value is known:
        # most rows a step loads are new to training, so their state is its initial value (two of the
        # three arrays LazyAdam reads). Cleared by writes; unknown (empty) for a store opened from disk.
        self._fresh: dict[str, tuple[float, np.ndarray]] = {}
        self.bytes_read = 0
        self.bytes_written = 0
        # File pages mapped in since the last release; over the files, not self: no cycle keeping the store
        # (and its lock) alive after its table is dropped.
        self._pages = PageBudget(lambda: _release(files), 0)
        self._file_bytes = 0  # of this store's files while it is open (0 once closed)
        self._one_map = False  # its files read through their write maps (see _measuring)
        self._indexes: list[_RowIndex] = []  # of the arrays of rows last read, logged or written (_indexed)
        self._sized()
        with _OPEN_LOCK:
            _OPEN.add(self)

    def _sized(self) -> None:
        """The files' bytes and the release limit that goes with them (again after `add`)."""
        self._file_bytes = sum(f.rows * f.cols * 4 for f in self.files.values())
        self._pages.limit = release_limit(self._file_bytes, RELEASE_BYTES)

    def _measuring(self) -> bool:
        """Whether the pages a read or write maps must be measured as it goes (`PageBudget`): only while
        the files of the stores open in this process could map past this store's limit. Below it
        nothing can need releasing, and a read or write touches its rows in one call per array, not one
        per `_CHUNK` rows with a fault count (getrusage) after each: a cache-full prefetch of a 4M-row
        table (768 MB of files) made 66 file calls and 76 fault counts, 933 Python calls in all; now 6,
        0 and 521 (cProfile).

        While twice the open stores' files fit in 1.5 times the limit, a file is read through a map of
        its own (`TierFile`: a write then faults once per page, not twice), so its file pages count up
        to twice in the resident set (the same page-cache pages); past that, a store's files are read
        through their write maps (`TierFile.one_map`). So the file pages the maps hold stay under 1.5
        GiB: the resident-set bound of the cache + 2 GiB, less about 0.4 GiB that the interpreter,
        torch and the tier's bookkeeping take (4M-row bench_tiered: 0.39 GiB anonymous beside a 77 MB
        cache)."""
        with _OPEN_LOCK:
            stores = list(_OPEN)
        total = sum(s._file_bytes for s in stores)
        if 2 * total > 3 * self._pages.limit // 2 and not self._one_map:
            self._one_map = True
            for f in self.files.values():
                f.one_map()
        return total > self._pages.limit

    # ----- create / open -----
    @classmethod
    def create(cls, directory: str, files: dict[str, tuple[int, int, Fill]]) -> TierStore:
        os.makedirs(directory, exist_ok=True)
        lock = _lock(directory)
        opened = {name: TierFile.create(os.path.join(directory, f"{name}.tier"), rows, cols, fill)
                  for name, (rows, cols, fill) in files.items()}
        store = cls(directory, opened, 0, int.from_bytes(os.urandom(7), "little"), lock)
        for name, (_, _, fill) in files.items():
            store._mark_fresh(name, fill)
        store._reset_log()
        store._write_manifest(0)
        return store

    @classmethod
    def exists(cls, directory: str) -> bool:
        return os.path.exists(os.path.join(directory, "manifest.json"))

    @classmethod
    def open(cls, directory: str) -> TierStore:
        """Open a store, undoing the writes made after its last commit (a crash's leftovers)."""
        path = os.path.join(directory, "manifest.json")
        try:
            with open(path, encoding="utf-8") as f:
                manifest = json.load(f)
        except (OSError, ValueError) as e:
            raise TierFileError(f"tier store {directory}: cannot read {path}: {e}") from e
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            raise TierFileError(f"tier store {directory}: {path} is not a {FORMAT} manifest")
        lock = _lock(directory)
        files = {name: TierFile.open(os.path.join(directory, f"{name}.tier")) for name in manifest["files"]}
        store = cls(directory, files, int(manifest["generation"]), int(manifest["uid"]), lock)
        store.rollback()
        return store

    def add(self, name: str, rows: int, cols: int, fill: Fill) -> None:
        """A new array (an optimizer state met after creation), part of the store from now on."""
        if name in self.files:
            raise ValueError(f"TierStore: {self.directory} has an array {name!r} already")
        f = TierFile.create(os.path.join(self.directory, f"{name}.tier"), rows, cols, fill)
        f.set_generation(self.generation)
        if self._one_map:
            f.one_map()
        self.files[name] = f
        self._sized()
        self._preimaged[name] = np.zeros(f.blocks, dtype=bool)
        self._logged_rows[name] = np.zeros((f.rows + 7) // 8, dtype=np.uint8)
        self._mark_fresh(name, fill)
        self._write_manifest(self.generation)

    def _mark_fresh(self, name: str, fill: Fill) -> None:
        if not callable(fill):
            self._fresh[name] = (float(fill), np.full((self.files[name].rows + 7) // 8, 0xFF, dtype=np.uint8))

    def close(self) -> None:
        for f in self.files.values():
            f.close()
        self._lock.close()
        self._file_bytes = 0

    # ----- rows -----
    def _indexed(self, rows: np.ndarray) -> _RowIndex:
        """The `_RowIndex` of int64 `rows`, kept for the next few calls with the same rows (a cache
        passes one array of rows for every array of the store, and a write its victims' and the rows
        logged ahead of them). Matched by value, not by identity: a wrong index would set another
        row's logged bit, and that row's pre-image would then be missing from the undo log; the
        comparison costs a fifth of the index."""
        for index in self._indexes:
            if index.rows.shape == rows.shape and np.array_equal(index.rows, rows):
                return index
        index = _RowIndex(rows)
        self._indexes = [index, *self._indexes[:3]]
        return index

    def read(self, name: str, rows: np.ndarray) -> np.ndarray:
        f, rows = self.files[name], np.asarray(rows, dtype=np.int64)
        index = self._indexed(rows)
        fresh = self._fresh.get(name)
        if fresh is not None:  # rows never written since this process created the array: its value
            value, bits = fresh
            at_value = index.bits(bits)
            if at_value.any():
                out = np.full((rows.size, f.cols), value, dtype=np.float32)
                stored = np.flatnonzero(~at_value)
                if stored.size:
                    out[stored] = self._read_stored(f, rows[stored])
                return out
        return self._read_stored(f, rows, index.blocks(f))

    def _read_stored(self, f: TierFile, rows: np.ndarray, blocks: np.ndarray | None = None) -> np.ndarray:
        out = np.empty((rows.size, f.cols), dtype=np.float32)
        measuring = self._measuring()
        chunk = _CHUNK if measuring else _UNMEASURED_CHUNK
        if blocks is None:
            blocks = f.blocks_of(rows)
        for a in range(0, rows.size, chunk):
            out[a:a + chunk] = f.read_rows(rows[a:a + chunk], blocks[a:a + chunk])
            if measuring:
                self._pages.spent(min(chunk, rows.size - a))
        self.bytes_read += out.nbytes
        return out

    def _release(self) -> None:
        _release(self.files)

    def write(self, name: str, rows: np.ndarray, values: np.ndarray) -> None:
        """Write rows in place, after logging the pre-images of blocks first written since the commit."""
        self.write_many([(name, rows, values)])

    def write_many(self, writes: list[tuple[str, np.ndarray, np.ndarray]],
                   ahead: Callable[[], list[tuple[str, np.ndarray]]] | None = None) -> None:
        """Several writes (rows unique within each), with one fsync of the undo log before them.

        `ahead`: returns rows likely written soon (a cache's next victims), called only when these
        writes must log pre-images; so do those rows then, in the same fsync: the writes that follow
        then log nothing and sync nothing (an fsync a step costs milliseconds). A row logged and
        never written costs log bytes only (its committed bytes are restored onto themselves)."""
        writes = [(name, np.asarray(rows, dtype=np.int64), values) for name, rows, values in writes]
        for name, rows, _ in writes:  # a pre-image must be sound
            self._check_blocks(name, rows)
        self._log_preimages(writes, ahead)
        measuring = self._measuring()
        for name, rows, values in writes:
            if name in self._fresh:  # no longer (known to be) at the array's value
                self._indexed(rows).clear(self._fresh[name][1])
            chunk = _CHUNK if measuring else _UNMEASURED_CHUNK
            blocks = self._indexed(rows).blocks(self.files[name])
            for a in range(0, rows.size, chunk):  # chunks: the pages they map are measured as they go
                self.files[name].write_rows(rows[a:a + chunk], values[a:a + chunk], checked=True,
                                            blocks=blocks[a:a + chunk])
                if measuring:
                    self._pages.spent(min(chunk, rows.size - a))
            self.bytes_written += values.nbytes

    def _check_blocks(self, name: str, rows: np.ndarray) -> None:
        """Verify the blocks of int64 `rows` of array `name` (their index kept for the write or log
        that follows)."""
        self.files[name].check_blocks(self._indexed(rows).blocks(self.files[name]))

    def logged(self, name: str, rows: np.ndarray) -> bool:
        """Whether every one of `rows` of array `name` has its pre-image in the undo log (a write of
        them syncs nothing)."""
        rows = np.asarray(rows, dtype=np.int64)
        return bool(self._indexed(rows).bits(self._logged_rows[name]).all())

    # ----- commit / rollback -----
    @property
    def changed(self) -> bool:
        """Whether anything was written since the last commit."""
        return any(seen.any() for seen in self._preimaged.values())

    def commit(self) -> int:
        """Make every write so far durable as generation ``generation + 1`` and return it; with nothing
        written since the last commit, that commit's generation (no new one)."""
        if not self.changed:
            return self.generation
        measuring = self._measuring()
        for f in self.files.values():
            if measuring:  # each file's checksums map its dirty blocks: the others' pages dropped first
                self._release()
            f.flush()
        generation = self.generation + 1
        self._write_manifest(generation)  # the commit point
        self.generation = generation
        self._finish()
        return generation

    def _finish(self) -> None:
        """After a commit point: stamp the files, keep the log as the previous commit's, start a new one."""
        for f in self.files.values():
            if f.generation != self.generation:
                f.set_generation(self.generation)
        if self._log_generation(self._log_path) == self.generation - 1:
            os.replace(self._log_path, self._prev_path)  # can take the store back one commit
        self._reset_log()

    def rollback(self) -> None:
        """Undo the writes made after the last commit (in this process or a crashed one)."""
        log = self._log_generation(self._log_path)
        if log is not None and log < self.generation:  # a commit point passed, its finish did not
            self._finish()
            return
        if log is not None and log > self.generation:  # an interrupted rollback_to: finish it
            self._undo(self._log_path)
            self._undo(self._prev_path)
            self._after_undo()
            return
        self._undo(self._log_path)
        self._after_undo(keep_prev=True)

    def rollback_to(self, generation: int) -> None:
        """Return to committed `generation`: the last commit, or the one before it (a checkpoint whose
        file was not written when the process died right after committing the store for it)."""
        self.rollback()
        if generation == self.generation:
            return
        if generation != self.generation - 1 or self._log_generation(self._prev_path) != generation:
            raise TierFileError(
                f"tier store {self.directory}: cannot return to generation {generation}; it is at generation "
                f"{self.generation} and can return only to it or the one before (if that was its last commit)")
        self._write_manifest(generation)  # intent first: a crash from here on finishes the rollback at open
        self.generation = generation
        self._undo(self._prev_path)
        self._after_undo()

    def _undo(self, path: str) -> None:
        names = list(self.files)
        for kind, index, what, crc, data in self._read_log(path):
            f = self.files[names[index]]
            if kind == _CRC:
                f.restore_crc(what, crc)
            elif kind == _FILL:
                rows = np.frombuffer(data, dtype=np.int64)
                value = struct.unpack("<f", struct.pack("<I", crc))[0]
                f.restore_rows(rows, np.full((rows.size, f.cols), value, dtype=np.float32))
            elif kind == _CRCS:
                f.restore_crcs(np.frombuffer(data[:8 * what], dtype=np.int64),
                               np.frombuffer(data[8 * what:], dtype=np.uint32))
            else:
                rows = np.frombuffer(data[:8 * what], dtype=np.int64)
                f.restore_rows(rows, data[8 * what:])

    def _after_undo(self, keep_prev: bool = False) -> None:
        for f in self.files.values():
            f.dirty[:] = False
            if abs(f.generation - self.generation) > 1:
                raise TierFileError(f"tier file {f.path}: generation {f.generation}, its store's manifest "
                                    f"says {self.generation}: the file belongs to another commit")
            f.flush()
            if f.generation != self.generation:
                f.set_generation(self.generation)
        if not keep_prev and os.path.exists(self._prev_path):
            os.unlink(self._prev_path)
        self._reset_log()

    # ----- undo log -----
    @property
    def _log_path(self) -> str:
        return os.path.join(self.directory, "undo.log")

    @property
    def _prev_path(self) -> str:
        return os.path.join(self.directory, "undo.prev")

    def _reset_log(self) -> None:
        def write(tmp: str) -> None:
            with open(tmp, "wb") as f:
                f.write(_LOG_HEAD.pack(_LOG_MAGIC, self.generation))

        atomic_write(self._log_path, write)
        for seen in (*self._preimaged.values(), *self._logged_rows.values()):
            seen[:] = 0

    def _log_generation(self, path: str) -> int | None:
        """The generation a log's pre-images restore (None: no log)."""
        try:
            with open(path, "rb") as f:
                head = f.read(_LOG_HEAD.size)
        except FileNotFoundError:
            return None
        if len(head) < _LOG_HEAD.size or head[:8] not in _LOG_MAGICS:
            raise TierFileError(f"tier store {self.directory}: {path} is not an undo log")
        return _LOG_HEAD.unpack(head)[1]

    def _log_preimages(self, writes: list[tuple[str, np.ndarray, np.ndarray]],
                       ahead: Callable[[], list[tuple[str, np.ndarray]]] | None) -> None:
        """Append the committed checksums of blocks and bytes of rows about to be written for the first
        time since the last commit, then fsync; if there are any, those of the rows `ahead` too.
        Rows, not blocks: an evicted row costs its own bytes. An entry's parts go to the file as they
        are (its checksum computed over them in turn): a step logs about a MiB of pre-images, which
        joining would copy several times."""
        logged: list = []  # (name, blocks, rows) to mark as logged once the log is durable
        parts = self._preimage_parts([(name, rows) for name, rows, _ in writes], logged)
        if parts and ahead is not None:
            ahead = [(name, np.asarray(rows, dtype=np.int64)) for name, rows in ahead()]
            for name, rows in ahead:
                self._check_blocks(name, rows)
            parts += self._preimage_parts(ahead, logged)
        if not parts:
            return
        with open(self._log_path, "ab") as log:
            for part in parts:
                log.write(part)
            log.flush()
            os.fsync(log.fileno())  # before the rows change: a kill after this finds their pre-images
        for name, blocks, (at, unlogged) in logged:
            self._preimaged[name][blocks] = True
            at.set(self._logged_rows[name], unlogged)

    def _preimage_parts(self, rows_of: list[tuple[str, np.ndarray]], logged: list) -> list:
        """The undo entries (as parts to write) of `rows_of` ``(array, rows)`` not logged since the
        commit; what they cover is appended to `logged`, to be marked once the log is durable."""
        names = list(self.files)
        parts: list = []
        measuring = self._measuring()
        for name, rows in rows_of:
            f, index, at = self.files[name], names.index(name), self._indexed(rows)
            blocks = at.blocks(f)
            blocks = blocks[~self._preimaged[name][blocks]]
            if blocks.size:  # one entry for all the blocks first written since the commit
                blocks = distinct(blocks)
                f.check_blocks(blocks)
                parts += _entry(_CRCS, index, blocks.size, blocks, f.crcs(blocks))
                if measuring:  # blocks not yet verified are read for their checksums
                    self._pages.spent(blocks.size)
            unlogged = ~at.bits(self._logged_rows[name])
            new = rows[unlogged]
            stored = new
            fresh = self._fresh.get(name)
            if fresh is not None and new.size:  # rows still at the array's value: that value, not bytes
                at_value = at.bits(fresh[1], unlogged)
                stored = new[~at_value]
                filled = new[at_value]
                for a in range(0, filled.size, _LOG_ENTRY_BYTES // 8):
                    part = filled[a:a + _LOG_ENTRY_BYTES // 8]
                    parts += _entry(_FILL, index, part.size, part, word=_float_bits(fresh[0]))
            per = max(_CHUNK, _LOG_ENTRY_BYTES // (4 * f.cols + 8))  # rows an entry holds
            for a in range(0, stored.size, per):
                part = stored[a:a + per]
                pre = np.empty((part.size, f.cols), dtype=np.float32)
                chunk = _CHUNK if measuring else _UNMEASURED_CHUNK
                for b in range(0, part.size, chunk):  # chunks: the pages the pre-images map are measured
                    pre[b:b + chunk] = np.take(f.data, part[b:b + chunk], axis=0)  # (see TierFile.read_rows)
                    if measuring:
                        self._pages.spent(min(chunk, part.size - b))
                parts += _entry(_ROWS, index, part.size, part, pre)
            logged.append((name, blocks, (at, unlogged)))
        return parts

    def _read_log(self, path: str):
        """The intact entries ``(kind, file index, block or row count, crc, data)`` of the log at `path`
        (none if there is no log), read one at a time: a log can be long."""
        if self._log_generation(path) is None:
            return
        with open(path, "rb") as f:
            f.seek(_LOG_HEAD.size)
            while True:
                head = f.read(_ENTRY.size)
                if len(head) < _ENTRY.size:
                    return
                kind, index, what, crc, n = _ENTRY.unpack(head)
                data, tail = f.read(n), f.read(4)
                if len(data) < n or len(tail) < 4 or struct.unpack("<I", tail)[0] != zlib.crc32(head + data):
                    return  # torn tail: written before a kill, its rows never changed
                yield kind, index, what, crc, data

    def _write_manifest(self, generation: int) -> None:
        manifest = {"format": FORMAT, "version": 1, "generation": generation, "uid": self.uid,
                    "files": {name: {"rows": f.rows, "cols": f.cols} for name, f in self.files.items()}}

        def write(tmp: str) -> None:
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(manifest, f)

        atomic_write(os.path.join(self.directory, "manifest.json"), write)
        fsync_dir(self.directory)
