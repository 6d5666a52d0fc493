"""The files of one disk-tiered table, committed together: `TierStore`.

A directory holds a ``manifest.json`` (the committed generation and the files), the `TierFile` s of
its arrays (``weight``, and each per-row optimizer state such as ``exp_avg``) and ``undo.log``. Arrays
made together share a file, a row of each side by side in one record (`tier_group`): the weights and
the optimizer state a cache loads and writes back together are one page and one pre-image a row.

Crash safety without a second copy of the table: rows are written in place, and before a row is
first written since the last commit its committed bytes (and, for the first row of a block, the
block's committed checksum) are appended to the undo log and fsynced. A file written through a
private map (one the page cache holds: `TierFile`) keeps its committed bytes until something writes
that map's pages to it, so its rows' pre-images are logged then, all at once and read from the file
(`TierStore._log_deferred`: at a commit, or before `TierFile.one_map`), not at each write. A commit
flushes every file (data and checksums), then atomically replaces the manifest with generation
``g + 1`` (the commit point), then stamps the files' headers and empties the undo log. Opening the store (or
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
from .tier_group import Fill, GroupSpec, TierArray, group_arrays, group_fill, open_groups, specs_of
from .tier_kernels import gather_rows

__all__ = ["TierStore"]

_LOG_MAGIC = b"RSUNDO02"  # 02: may hold _FILL entries (an 01 log, which cannot, is read too)
_LOG_MAGICS = (b"RSUNDO01", _LOG_MAGIC)
_LOG_HEAD = struct.Struct("<8sQ")  # magic, generation the pre-images belong to
# An undo entry: kind, file (group) index, block (kind _CRC) or row or block count (kinds _ROWS, _CRCS), the
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
_ASIDE = "merge.aside"  # rows set aside while a store written since its creation is merged (_merge_written)
_OPEN: weakref.WeakSet = weakref.WeakSet()  # the stores open in this process (see TierStore._measuring)
_OPEN_LOCK = threading.Lock()  # a store made on one thread while another's prefetch sums their files


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


def _release(files: list[TierFile]) -> None:
    """Drop the mapped pages of every file from the process's resident set (`TierFile.release`), so
    its peak RSS does not grow with the table."""
    for f in files:
        f.release()


class TierStore:
    """Named arrays (`TierArray`, in group files) committed as one generation, with an undo log for
    uncommitted writes. ``files``: the arrays by name (``rows``, ``cols``); ``groups``: the files."""

    def __init__(self, directory: str, specs: list[GroupSpec], groups: list[TierFile], generation: int, uid: int,
                 lock) -> None:
        self.directory, self.specs, self.groups, self.generation = directory, specs, groups, generation
        self.files: dict[str, TierArray] = group_arrays(specs, groups)
        self._lock = lock  # held while the store is open (released by close, or by the kernel at exit)
        self.uid = uid  # names this store in checkpoints, so one of another store is refused
        # Per group, since the last commit: blocks whose checksum is logged, rows (a bit each) whose bytes are.
        self._preimaged = [np.zeros(f.blocks, dtype=bool) for f in groups]
        self._logged_rows = [np.zeros((f.rows + 7) // 8, dtype=np.uint8) for f in groups]
        # Per group, rows (a bit each) written through a private map and not logged: their committed bytes
        # are still the file's (see _log_deferred)
        self._deferred = [np.zeros((f.rows + 7) // 8, dtype=np.uint8) for f in groups]
        # Groups this process created with one value (every array an optimizer state's initial one, or a
        # hash table's zero rows with theirs): that value, and a bit per row still at it (never written
        # since). Such rows are not read, their value is known: most rows a step loads are new to
        # training. Cleared by writes; unknown (absent) for a store opened from disk.
        self._fresh: dict[int, tuple[float, np.ndarray]] = {}
        self.bytes_read = 0
        self.bytes_written = 0
        # File pages mapped in since the last release; over the files (a list changed in place), not self:
        # no cycle keeping the store (and its lock) alive after its table is dropped.
        self._pages = PageBudget(lambda: _release(groups), 0)
        self._file_bytes = 0  # of this store's files while it is open (0 once closed)
        self._one_map = False  # its files read through their write maps (see _measuring)
        self._indexes: list[_RowIndex] = []  # of the arrays of rows last read, logged or written (_indexed)
        self._sized()
        with _OPEN_LOCK:
            _OPEN.add(self)

    @property
    def rows(self) -> int:
        return self.groups[0].rows

    def _sized(self) -> None:
        """The files' bytes and the release limit that goes with them (again after `add`)."""
        self._file_bytes = sum(f.rows * f.cols * 4 for f in self.groups)
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
            self._log_deferred()  # (one_map writes the private maps' pages to the files)
            self._one_map = True
            for f in self.groups:
                f.one_map()
        return total > self._pages.limit

    # ----- create / open -----
    @classmethod
    def create(cls, directory: str, files: dict[str, tuple[int, int, Fill]]) -> TierStore:
        """A new store of arrays ``name: (rows, cols, fill)``, every one of the same rows, in one file of
        records (`tier_group`)."""
        rows = {r for r, _, _ in files.values()}
        if len(rows) != 1:
            raise ValueError(f"TierStore: the arrays of a store have one number of rows, got {sorted(rows)}")
        os.makedirs(directory, exist_ok=True)
        lock = _lock(directory)
        spec = GroupSpec("group-0.tier", tuple((name, cols) for name, (_, cols, _) in files.items()))
        fill = group_fill([(cols, fill) for _, cols, fill in files.values()])
        group = TierFile.create(os.path.join(directory, spec.file), rows.pop(), spec.cols, fill)
        store = cls(directory, [spec], [group], 0, int.from_bytes(os.urandom(7), "little"), lock)
        store._mark_fresh(0, fill)
        store._reset_log()
        store._write_manifest(0)
        return store

    @classmethod
    def exists(cls, directory: str) -> bool:
        return os.path.exists(os.path.join(directory, "manifest.json"))

    @classmethod
    def open(cls, directory: str) -> TierStore:
        """Open a store, undoing the writes made after its last commit (a crash's leftovers)."""
        manifest = read_manifest(directory)
        lock = _lock(directory)
        specs = specs_of(manifest, directory)
        try:
            groups = open_groups(directory, specs)
        except BaseException:
            lock.close()
            raise
        store = cls(directory, specs, groups, int(manifest["generation"]), int(manifest["uid"]), lock)
        try:
            store._remove_strays()
            store.rollback()
        except BaseException:
            store.close()  # (its lock too: the directory can be opened again once repaired)
            raise
        return store

    def _remove_strays(self) -> None:
        """Remove group files the manifest does not name: one being made when a process died (`add`),
        or one replaced (`_merge`) whose removal the process did not live to make; and rows set aside
        by a `_merge_written` that did not finish (uncommitted writes: a crash loses them)."""
        named = {spec.file for spec in self.specs}
        for entry in os.listdir(self.directory):
            stray = (entry.endswith(".tier") and entry not in named) or entry == _ASIDE
            if stray and os.path.isfile(os.path.join(self.directory, entry)):
                os.unlink(os.path.join(self.directory, entry))

    def add(self, name: str, rows: int, cols: int, fill: Fill) -> None:
        """A new array (an optimizer state met after creation), part of the store from now on."""
        self.add_arrays({name: (rows, cols, fill)})

    def add_arrays(self, arrays: dict[str, tuple[int, int, Fill]]) -> None:
        """New arrays ``name: (rows, cols, fill)`` (an optimizer's states, met at its first step), part of
        the store from now on. While the store holds nothing but what it was made with (generation 0,
        nothing written), they join its file's records (`_merge`); later, they get a file of their own."""
        if not arrays:
            return
        for name, (rows, _, _) in arrays.items():
            if name in self.files:
                raise ValueError(f"TierStore: {self.directory} has an array {name!r} already")
            if rows != self.rows:
                raise ValueError(f"TierStore: array {name!r} has {rows} rows, the store's arrays {self.rows}")
        parts = [(cols, fill) for _, cols, fill in arrays.values()]
        new = tuple((name, cols) for name, (_, cols, _) in arrays.items())
        if self.generation == 0 and len(self.groups) == 1 and not self.changed:
            self._merge(new, parts)
        elif self.generation == 0 and len(self.groups) == 1:
            self._merge_written(new, parts)
        else:
            spec = GroupSpec(self._free_name(), new)
            fill = group_fill(parts)
            f = TierFile.create(os.path.join(self.directory, spec.file), self.rows, spec.cols, fill)
            f.set_generation(self.generation)
            self._join(len(self.groups), spec, f, fill)
        self._write_manifest(self.generation)  # (after _merge's: the old file is gone only once this is made)

    def _merge(self, new: tuple[tuple[str, int], ...], parts: list[tuple[int, Fill]]) -> None:
        """Group 0 made anew with arrays `new` beside its own (a store nothing has been written to since its
        creation: its committed state is its file), the old file removed once the manifest names the new."""
        old, spec = self.groups[0], self.specs[0]
        fresh = self._fresh.get(0)
        if fresh is not None:
            own: Fill = fresh[0]
        else:
            def own(a: int, b: int) -> np.ndarray:  # the old file's records (blocks checked), pages let go
                out = old.read_rows(np.arange(a, b))
                old.release()
                return out
        fill = group_fill([(spec.cols, own), *parts])
        merged = GroupSpec(self._free_name(), spec.arrays + new)
        f = TierFile.create(os.path.join(self.directory, merged.file), self.rows, merged.cols, fill)
        self._join(0, merged, f, fill)
        self._write_manifest(self.generation)  # the new file is the store's from here
        old.close()
        os.unlink(old.path)
        fsync_dir(self.directory)

    def _merge_written(self, new: tuple[tuple[str, int], ...], parts: list[tuple[int, Fill]]) -> None:
        """`_merge` of a store written since its creation and never committed (a table's rows loaded
        before its optimizer's first step): the written rows' records are set aside in a file, the
        store rolled back to its creation, merged, and the rows written again, logged as any write (a
        crash before they are loses them, as it would have lost the writes; the file set aside is
        removed at the next open)."""
        f, written = self.groups[0], self.specs[0].arrays
        rows = np.flatnonzero(np.unpackbits(self._logged_rows[0] | self._deferred[0], bitorder="little")[:f.rows])
        aside = os.path.join(self.directory, _ASIDE)
        with open(aside, "wb") as out:
            for a in range(0, rows.size, _UNMEASURED_CHUNK):
                out.write(f.read_rows(rows[a:a + _UNMEASURED_CHUNK]).tobytes())
        self.rollback()
        self._merge(new, parts)
        own = [(name, self.files[name].start, self.files[name].stop) for name, _ in written]
        with open(aside, "rb") as src:
            for a in range(0, rows.size, _UNMEASURED_CHUNK):
                part = rows[a:a + _UNMEASURED_CHUNK]
                values = np.frombuffer(src.read(part.size * f.cols * 4), dtype=np.float32).reshape(part.size, f.cols)
                self.write_many([(name, part, values[:, start:stop]) for name, start, stop in own])
        os.unlink(aside)

    def _join(self, g: int, spec: GroupSpec, f: TierFile, fill: Fill) -> None:
        """File `f` of `spec` as group `g` (a new one, or in place of group `g`)."""
        if self._one_map:
            f.one_map()
        if g == len(self.groups):
            self.groups.append(f)
            self.specs.append(spec)
            self._preimaged.append(np.zeros(f.blocks, dtype=bool))
            self._logged_rows.append(np.zeros((f.rows + 7) // 8, dtype=np.uint8))
            self._deferred.append(np.zeros((f.rows + 7) // 8, dtype=np.uint8))
        else:
            self.groups[g], self.specs[g] = f, spec
            self._preimaged[g] = np.zeros(f.blocks, dtype=bool)
            self._logged_rows[g] = np.zeros((f.rows + 7) // 8, dtype=np.uint8)
            self._deferred[g] = np.zeros((f.rows + 7) // 8, dtype=np.uint8)
        self.files = group_arrays(self.specs, self.groups)
        self._fresh.pop(g, None)
        self._mark_fresh(g, fill)
        self._sized()

    def _free_name(self) -> str:
        used = {spec.file for spec in self.specs}
        k = 0
        while f"group-{k}.tier" in used:
            k += 1
        return f"group-{k}.tier"

    def _mark_fresh(self, g: int, fill: Fill) -> None:
        if not callable(fill):
            self._fresh[g] = (float(fill), np.full((self.groups[g].rows + 7) // 8, 0xFF, dtype=np.uint8))

    def close(self) -> None:
        for f in self.groups:
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
        """Rows `rows` of array `name` (a contiguous copy)."""
        return np.ascontiguousarray(self.read_many((name,), rows)[name])

    def read_many(self, names, rows: np.ndarray) -> dict[str, np.ndarray]:
        """Rows `rows` of each array of `names`: a record read per group, each array its columns (views)."""
        rows = np.asarray(rows, dtype=np.int64)
        index = self._indexed(rows)
        records: dict[int, np.ndarray] = {}
        out = {}
        for name in names:
            a = self.files[name]
            if a.group not in records:
                records[a.group] = self._read_group(a.group, rows, index)
            out[name] = a.columns(records[a.group])
        return out

    def _read_group(self, g: int, rows: np.ndarray, index: _RowIndex) -> np.ndarray:
        f = self.groups[g]
        fresh = self._fresh.get(g)
        if fresh is not None:  # rows never written since this process created the group: its value
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
        _release(self.groups)

    def write(self, name: str, rows: np.ndarray, values: np.ndarray) -> None:
        """Write rows in place, after logging the pre-images of blocks first written since the commit."""
        self.write_many([(name, rows, values)])

    def write_many(self, writes: list[tuple[str, np.ndarray, np.ndarray]],
                   ahead: Callable[[], list[tuple[str, np.ndarray]]] | None = None) -> None:
        """Several writes (rows unique within each), with one fsync of the undo log before them. The
        writes of one group's arrays with the same rows are one write of records.

        `ahead`: returns rows likely written soon (a cache's next victims), called only when these
        writes must log pre-images; so do those rows then, in the same fsync: the writes that follow
        then log nothing and sync nothing (an fsync a step costs milliseconds). A row logged and
        never written costs log bytes only (its committed bytes are restored onto themselves)."""
        records = self._records(writes)
        for g, rows, _ in records:  # a pre-image must be sound
            self._check_group(g, rows)
        measuring = self._measuring()  # (first: it may leave the private maps, see one_map)
        self._log_preimages([(g, rows) for g, rows, _ in records if not self.groups[g].private], ahead, measuring)
        chunk = _CHUNK if measuring else _UNMEASURED_CHUNK
        for g, rows, parts in records:
            f, index = self.groups[g], self._indexed(rows)
            values = self._record(f, rows, parts)
            if g in self._fresh:  # no longer (known to be) at the group's value
                index.clear(self._fresh[g][1])
            if f.private:  # the file keeps the committed bytes: they are logged when it is written
                index.set(self._deferred[g])
            blocks = index.blocks(f)
            for a in range(0, rows.size, chunk):  # chunks: the pages they map are measured as they go
                f.write_rows(rows[a:a + chunk], values[a:a + chunk], checked=True, blocks=blocks[a:a + chunk])
                if measuring:
                    self._pages.spent(min(chunk, rows.size - a))
            self.bytes_written += sum(v.nbytes for _, v in parts)

    def _records(self, writes: list[tuple[str, np.ndarray, np.ndarray]]
                 ) -> list[tuple[int, np.ndarray, list[tuple[TierArray, np.ndarray]]]]:
        """`writes` as writes of records: ``(group, int64 rows, [(array, values)])``, the arrays of one
        group written with the same rows together (a cache writes back every array of its victims)."""
        out: list[tuple[int, np.ndarray, list]] = []
        for name, rows, values in writes:
            a, rows = self.files[name], np.asarray(rows, dtype=np.int64)
            for g, held, parts in out:
                if g == a.group and (held is rows or (held.shape == rows.shape and np.array_equal(held, rows))):
                    parts.append((a, values))
                    break
            else:
                out.append((a.group, rows, [(a, values)]))
        return out

    @staticmethod
    def _record(f: TierFile, rows: np.ndarray, parts: list[tuple[TierArray, np.ndarray]]) -> np.ndarray:
        """The records of `rows` of group file `f` once `parts` are written: assembled from them if they
        cover every array of the group, else the stored records (blocks checked) with theirs replaced."""
        if len(parts) == 1 and parts[0][0].whole:
            return parts[0][1]
        covered = {a.name: a.cols for a, _ in parts}
        if sum(covered.values()) == f.cols:
            out = np.empty((rows.size, f.cols), dtype=np.float32)
        else:
            out = gather_rows(f.data, rows)
        for a, values in parts:
            out[:, a.start:a.stop] = values
        return out

    def _check_group(self, g: int, rows: np.ndarray) -> None:
        """Verify the blocks of int64 `rows` of group `g` (their index kept for the write or log that
        follows)."""
        f = self.groups[g]
        f.check_blocks(self._indexed(rows).blocks(f))

    def logged(self, name: str, rows: np.ndarray) -> bool:
        """Whether every one of `rows` of array `name` has its pre-image in the undo log, or is deferred
        (written through a private map, its committed bytes still the file's): a write of them syncs nothing."""
        rows = np.asarray(rows, dtype=np.int64)
        g = self.files[name].group
        return bool(self._indexed(rows).bits(self._logged_rows[g] | self._deferred[g]).all())

    # ----- commit / rollback -----
    @property
    def changed(self) -> bool:
        """Whether anything was written since the last commit."""
        return any(seen.any() for seen in (*self._preimaged, *self._deferred))

    def commit(self) -> int:
        """Make every write so far durable as generation ``generation + 1`` and return it; with nothing
        written since the last commit, that commit's generation (no new one)."""
        if not self.changed:
            return self.generation
        self._log_deferred()  # before the flushes write the private maps' pages to the files
        measuring = self._measuring()
        for f in self.groups:
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
        for f in self.groups:
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
        for f in self.groups:  # the writes still in private maps only (the log undoes those in the files)
            f.discard()
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
        for kind, index, what, crc, data in self._read_log(path):
            if index >= len(self.groups):
                raise TierFileError(f"tier store {self.directory}: {path} names file {index}, the store has "
                                    f"{len(self.groups)}: the log is not this store's")
            f = self.groups[index]
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
        for f in self.groups:
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
        for seen in (*self._preimaged, *self._logged_rows, *self._deferred):
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

    def _log_preimages(self, writes: list[tuple[int, np.ndarray]],
                       ahead: Callable[[], list[tuple[str, np.ndarray]]] | None, measuring: bool) -> None:
        """Append the committed checksums of blocks and bytes of rows about to be written for the first
        time since the last commit (`writes`: ``(group, rows)``), then fsync; if there are any, those of
        the rows `ahead` (``(array, rows)``) too (`measuring`: the pages read are measured, `_measuring`).
        Rows, not blocks: an evicted row costs its own bytes. An entry's parts go to the file as they
        are (its checksum computed over them in turn): a step logs about a MiB of pre-images, which
        joining would copy several times."""
        logged: list = []  # (group, blocks, rows) to mark as logged once the log is durable
        parts = self._preimage_parts(writes, logged, measuring)
        if parts and ahead is not None:
            more = [(g, rows) for g, rows, _ in self._records([(name, rows, None) for name, rows in ahead()])]
            for g, rows in more:
                self._check_group(g, rows)
            parts += self._preimage_parts(more, logged, measuring)
        if not parts:
            return
        with open(self._log_path, "ab") as log:
            for part in parts:
                log.write(part)
            log.flush()
            os.fsync(log.fileno())  # before the rows change: a kill after this finds their pre-images
        self._mark_logged(logged)

    def _log_deferred(self) -> None:
        """Log the pre-images of the rows written through private maps and not logged (`_deferred`): read
        from the files, which hold their committed bytes until this returns. In chunks of rows, one
        fsync in all: a commit after a long run logs up to every row of the table."""
        todo = [(g, np.flatnonzero(np.unpackbits(bits, bitorder="little")[:self.groups[g].rows]))
                for g, bits in enumerate(self._deferred) if bits.any()]
        if not todo:
            return
        logged: list = []
        with open(self._log_path, "ab") as log:
            for g, rows in todo:
                for a in range(0, rows.size, _UNMEASURED_CHUNK):
                    for part in self._preimage_parts([(g, rows[a:a + _UNMEASURED_CHUNK])], logged, False,
                                                     committed=True):
                        log.write(part)
                    self.groups[g].drop_shared()  # (the pages the pre-images were read through)
            log.flush()
            os.fsync(log.fileno())  # before the files change: a kill after this finds the pre-images
        self._mark_logged(logged)
        for bits in self._deferred:
            bits[:] = 0

    def _mark_logged(self, logged: list) -> None:
        for g, blocks, (at, unlogged) in logged:
            self._preimaged[g][blocks] = True
            at.set(self._logged_rows[g], unlogged)

    def _preimage_parts(self, rows_of: list[tuple[int, np.ndarray]], logged: list, measuring: bool,
                        committed: bool = False) -> list:
        """The undo entries (as parts to write) of `rows_of` ``(group, rows)`` not logged since the
        commit; what they cover is appended to `logged`, to be marked once the log is durable. With
        `measuring`, the pages read are measured (`_measuring`); with `committed`, the rows' bytes are
        read from the file (`TierFile.committed_rows`), not as written."""
        parts: list = []
        for index, rows in rows_of:
            f, at = self.groups[index], self._indexed(rows)
            blocks = at.blocks(f)
            blocks = blocks[~self._preimaged[index][blocks]]
            if blocks.size:  # one entry for all the blocks first written since the commit
                blocks = distinct(blocks)
                f.check_blocks(blocks)
                parts += _entry(_CRCS, index, blocks.size, blocks, f.crcs(blocks))
                if measuring:  # blocks not yet verified are read for their checksums
                    self._pages.spent(blocks.size)
            unlogged = ~at.bits(self._logged_rows[index])
            new = rows[unlogged]
            stored = new
            fresh = self._fresh.get(index)
            if fresh is not None and new.size:  # rows still at the group's value: that value, not bytes
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
                    if committed:
                        pre[b:b + chunk] = f.committed_rows(part[b:b + chunk])
                    else:
                        pre[b:b + chunk] = gather_rows(f.data, part[b:b + chunk])
                    if measuring:
                        self._pages.spent(min(chunk, part.size - b))
                parts += _entry(_ROWS, index, part.size, part, pre)
            logged.append((index, blocks, (at, unlogged)))
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
        manifest = {"format": FORMAT, "version": 2, "generation": generation, "uid": self.uid,
                    "files": {name: {"rows": a.rows, "cols": a.cols} for name, a in self.files.items()},
                    "groups": [spec.as_json() for spec in self.specs]}

        def write(tmp: str) -> None:
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(manifest, f)

        atomic_write(os.path.join(self.directory, "manifest.json"), write)
        fsync_dir(self.directory)


def read_manifest(directory: str) -> dict:
    """The manifest of the store in `directory` (checked to be one)."""
    path = os.path.join(directory, "manifest.json")
    try:
        with open(path, encoding="utf-8") as f:
            manifest = json.load(f)
    except (OSError, ValueError) as e:
        raise TierFileError(f"tier store {directory}: cannot read {path}: {e}") from e
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise TierFileError(f"tier store {directory}: {path} is not a {FORMAT} manifest")
    if manifest.get("version", 1) not in (1, 2):
        raise TierFileError(f"tier store {directory}: {path} is of format version {manifest['version']}, this "
                            "recstream reads versions 1 and 2")
    return manifest


def open_arrays(directory: str) -> tuple[list[TierFile], dict[str, TierArray]]:
    """The files and arrays of the store in `directory`, opened to be read only, without its lock or
    its undo log (a store settled at a commit: `tier_reshard`). Close the files when done."""
    specs = specs_of(read_manifest(directory), directory)
    files = open_groups(directory, specs)
    return files, group_arrays(specs, files)
