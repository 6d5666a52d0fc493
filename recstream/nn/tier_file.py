"""One memory-mapped file of fixed-width float32 rows with a checksum per block: `TierFile`.

The storage of a disk-tiered embedding table (`tier_store`) is one such file for the weights and one
per optimizer state of the rows. Layout::

    [0, 4096)                 header: magic, version, rows, cols, block_rows, blocks, generation, crc32
    [4096, 4096 + pad(4*B))   crc32 of each block's bytes, as of the last flush
    [data, data + rows*cols*4) the rows, float32, row-major

A block is ``block_rows`` consecutive rows (one 4 KiB page). Its checksum is refreshed by
`TierFile.flush` for the blocks written since the previous flush; every other block is
checked against its stored checksum the first time it is read or written after the file is opened,
so a corrupt or torn block raises `TierFileError` naming the file and the block instead of
being read. (Blocks written in between are the process's own and are trusted until the next flush.)

A memory map gives the page cache the work of moving rows between memory and disk: a read of a few
rows touches their pages only. A file the page cache can hold is read and written through a private
(copy-on-write) map, whose written pages `TierFile.flush` writes to the file: the kernel's own
write-back never meets a page a step writes. A larger one is read and written through a shared map.
Pages a process touched count in its resident set until dropped, so `TierFile.release` drops them
(the private map's written pages written to the file first).

Example:
    >>> import os, tempfile, numpy as np
    >>> path = os.path.join(tempfile.mkdtemp(), "w.tier")
    >>> f = TierFile.create(path, rows=10, cols=4, fill=lambda a, b: np.full((b - a, 4), 1.0, np.float32))
    >>> f.write_rows(np.array([3]), np.full((1, 4), 7.0, np.float32))
    >>> f.flush(); f.close()
    >>> TierFile.open(path).read_rows(np.array([2, 3]))[:, 0].tolist()
    [1.0, 7.0]
"""

from __future__ import annotations

import mmap
import os
import resource
import struct
import zlib
from collections.abc import Callable

import numpy as np

from ..validation import check_int
from .tier_kernels import gather_rows, put_rows

__all__ = ["TierFile", "TierFileError"]

MAGIC = b"RSTIER\x00\x01"
VERSION = 1
_HEADER = struct.Struct("<8sIQQIQQ")  # magic, version, rows, cols, block_rows, blocks, generation
HEADER_BYTES = 4096
# File pages a process maps in before it drops them (see TierFile.release). Dropping them costs every
# hot row a fault again, and the kernel maps pages around each fault (fault-around), so the measured
# resident set grows many times faster than the rows touched: at 256 MiB a 4M-row store released every
# few steps and trained 7x slower (bench_tiered, 0.03x against 0.39x at 1 GiB, same box). A store the
# page cache cannot hold (over a quarter of the memory: `large_file`) keeps 128 MiB, so that the
# process's resident set stays near its cache whatever the table's size: beside a 200M-row table's
# cache the tier's own bookkeeping takes 1.6 GiB (a slot per row, bit sets), and at 256 MiB its
# checkpoint mapped 551 MiB of file pages, 0.15 GiB past the cache + 2 GiB (bench_tiered).
RELEASE_BYTES = 1 << 30
LARGE_STORE_RELEASE_BYTES = 128 << 20
BLOCK_BYTES = 4096  # a page: an evicted row written back costs one page of undo log, not 64 KiB
_OWNER = "TierFile"


class TierFileError(ValueError):
    """A tier file that cannot be trusted: not a tier file, a torn header, a block failing its checksum."""


def _pad(n: int) -> int:
    return (n + HEADER_BYTES - 1) // HEADER_BYTES * HEADER_BYTES


def mapped_file_bytes() -> int | None:
    """This process's file-backed resident bytes (``/proc/self/statm``'s shared pages); None if unknown.

    Measured, not estimated from rows: reading one row can map far more than its page (fault-around,
    and on recent kernels a page-cache folio of up to 2 MiB mapped whole)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[2]) * mmap.PAGESIZE
    except (OSError, ValueError, IndexError):
        return None


# The most one page fault can map of a file: a page table's span (a 2 MiB folio mapped whole, or
# fault-around at its widest; 2 MiB with 4 KiB pages).
FAULT_BYTES_MAX = mmap.PAGESIZE * (mmap.PAGESIZE // 8)


def page_faults() -> int:
    """Page faults of this process so far, every thread's (a getrusage call: no file to open)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_minflt + usage.ru_majflt


class PageBudget:
    """Calls `release` when the file pages mapped since the last release pass `limit` bytes.

    ``spent(n)`` after touching `n` rows (or blocks); measured every `every` of them, or, where
    the process's resident set cannot be read, counted at one page each. A measurement opens and
    reads ``/proc/self/statm`` (about 40 us, a few hundred times a step for a busy tier), so it is
    skipped while the page faults since the last one (`page_faults`, cheap) could not have mapped
    past the limit even at `FAULT_BYTES_MAX` each: pages are mapped only by faults."""

    def __init__(self, release: Callable[[], None], limit: int, every: int = 256) -> None:
        self.release, self.limit, self.every = release, limit, every
        self._since = 0
        self._count = 0
        self._faults = page_faults()
        self._base = mapped_file_bytes()
        self._mapped = 0  # bytes over the base at the last measurement

    def spent(self, n: int) -> None:
        self._since += n
        if self._since < self.every:
            return
        self._count += self._since
        self._since = 0
        faults = page_faults()  # before the measurement: later faults are the next one's
        if self._base is not None and (faults - self._faults) * FAULT_BYTES_MAX <= self.limit - self._mapped:
            return
        self._faults = faults
        now = mapped_file_bytes()
        if now is None or self._base is None:
            over = self._count * 4096 > self.limit
        else:
            self._mapped = max(0, now - self._base)
            over = self._mapped > self.limit
        if over:
            self.release()
            self._count, self._mapped = 0, 0
            self._faults, self._base = page_faults(), mapped_file_bytes()


def large_file(nbytes: int) -> bool:
    """Whether `nbytes` of file is more than the page cache can be expected to hold: a quarter of the
    machine's memory (where the platform does not say, never)."""
    try:
        memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return False
    return nbytes > memory // 4


def release_limit(nbytes: int, limit: int) -> int:
    """The mapped bytes past which `nbytes` of tier files are released: `limit`, or at most
    `LARGE_STORE_RELEASE_BYTES` where the page cache cannot hold them (`large_file`)."""
    return min(limit, LARGE_STORE_RELEASE_BYTES) if large_file(nbytes) else limit


def distinct(ids: np.ndarray) -> np.ndarray:
    """The distinct values of int64 `ids`, sorted: a sort and a mask, ~10x faster than ``np.unique``
    (a hash table in numpy >= 2.3) on a batch's ids."""
    ordered = np.sort(ids.ravel())
    if ordered.size < 2:
        return ordered
    first = np.empty(ordered.size, dtype=bool)
    first[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=first[1:])
    return ordered[first]


def _crc(buffer) -> int:
    return zlib.crc32(memoryview(buffer).cast("B"))


class TierFile:
    """Rows ``[rows, cols]`` float32 in a memory-mapped file with per-block checksums.

    Build with `create` or `open`. ``generation`` (in the header) is the number of the
    last commit of the store the file belongs to; `set_generation` writes it.
    """

    def __init__(self, path: str, rows: int, cols: int, block_rows: int, generation: int) -> None:
        self.path, self.rows, self.cols, self.block_rows = path, rows, cols, block_rows
        self.blocks = (rows + block_rows - 1) // block_rows
        self.generation = generation
        # A shared map of the file holds its header and checksums, and its rows where the page cache
        # cannot hold it (`large_file`: there a fault reads its page from disk whatever the map, and the
        # pages mapped are measured against a resident-set budget, `TierStore._measuring`).
        #
        # Where the page cache holds the file, rows are in fact read and written through a private
        # (copy-on-write) map, whose writes reach the file only when `flush` (a commit) writes the pages
        # they dirtied with ``pwrite``: over a long run the kernel writes a shared map's dirty pages
        # back as fast as the disk takes them, and each write to a page it cleaned is a fault that waits
        # on that write-back (1,160 faults a step, 22 ms of kernel time, on a 4M-row store over 9,000
        # steps); a private page, once copied, faults no more. Its pages are the process's own memory
        # (not more than the file), counted once in its resident set. `one_map` leaves it.
        self._fd = os.open(path, os.O_RDWR)  # (kept: the private map's pages are written with pwrite)
        size = os.fstat(self._fd).st_size
        self._map = mmap.mmap(self._fd, size)  # MAP_SHARED, read and write: header, checksums
        private = not large_file(size) and 4 * cols <= mmap.PAGESIZE
        self._private_map = mmap.mmap(self._fd, size, flags=mmap.MAP_PRIVATE) if private else None
        # Rows are read at random. In a file the page cache cannot hold, a fault must read its page only,
        # not a readahead window or a 2 MiB folio around it (seen on kernel 6.18: ~2 MiB read from disk
        # per row of a 12.8 GB file). In one it holds, the opposite: MADV_RANDOM also costs each page its
        # own fault, 2.3x the step time of a 4M-row store (bench_tiered, 20 against 8.7 ms a step).
        advices = ("MADV_NOHUGEPAGE", "MADV_RANDOM") if large_file(self._map.size()) else ("MADV_NOHUGEPAGE",)
        for advice in advices:
            if hasattr(mmap, advice):
                for m in self._maps():
                    m.madvise(getattr(mmap, advice))
        mm = self._mm = np.frombuffer(self._map, dtype=np.uint8)
        crc_end = HEADER_BYTES + 4 * self.blocks
        self._crc = mm[HEADER_BYTES:crc_end].view(np.uint32)
        data = HEADER_BYTES + _pad(4 * self.blocks)
        self._data_offset = data
        self._shared_rows = mm[data:data + rows * cols * 4].view(np.float32).reshape(rows, cols)
        # the rows as read and written: the private map's, or the shared map's
        self._rows = self._shared_rows if self._private_map is None else np.frombuffer(
            self._private_map, dtype=np.uint8)[data:data + rows * cols * 4].view(np.float32).reshape(rows, cols)
        self.data = self._rows
        # pages of the private map written since they were last written to the file (`_write_private`)
        self._unsynced = None if self._private_map is None else np.zeros(size // mmap.PAGESIZE + 1, dtype=bool)
        self.verified = np.zeros(self.blocks, dtype=bool)  # checked against its checksum since open
        self.dirty = np.zeros(self.blocks, dtype=bool)  # written since the last flush

    # ----- create / open / close -----
    @classmethod
    def create(cls, path: str, rows: int, cols: int, fill: Callable[[int, int], np.ndarray] | float) -> TierFile:
        """A new file (replacing any at `path`) whose rows ``[a, b)`` are ``fill(a, b)``, flushed; a
        float `fill` is every value (an optimizer state's initial one: see `_create_constant`).

        The header is written last, so a crash during creation leaves a file `open` refuses."""
        rows = check_int(_OWNER, "rows", rows, minimum=1)
        cols = check_int(_OWNER, "cols", cols, minimum=1)
        block_rows = max(1, BLOCK_BYTES // (4 * cols))
        blocks = (rows + block_rows - 1) // block_rows
        size = HEADER_BYTES + _pad(4 * blocks) + rows * cols * 4
        with open(path, "wb") as f:
            f.truncate(size)  # a sparse file: no disk block until a page is written
        tier = cls(path, rows, cols, block_rows, 0)
        if not callable(fill):
            return tier._create_constant(float(fill))
        chunk = block_rows * 4096  # 16 MiB a fill call: few calls for a large table, little memory
        for a in range(0, rows, chunk):
            e = min(rows, a + chunk)
            values = np.ascontiguousarray(fill(a, e), dtype=np.float32)
            tier._shared_rows[a:e] = values
            tier._checksum(a, values)
            if (a // chunk) % 8 == 7:  # every 128 MiB: out of the resident set (see release)
                tier.release()
        tier.verified[:] = True
        tier._sync()
        tier.set_generation(0)
        tier.release()  # the pages the fill went through are not the table's working set
        return tier

    def _checksum(self, start: int, values: np.ndarray) -> None:
        """The checksums of the blocks of rows ``[start, start + len(values))``, `start` a block's first
        row, from `values` (their bytes, just written): a file made is not read back for them (a
        200M-row store's file made anew with its optimizer state, 38 GB, was read back from disk for
        minutes)."""
        for b in range(start // self.block_rows, (start + len(values) - 1) // self.block_rows + 1):
            a, e = self.block_range(b)
            self._crc[b] = _crc(values[a - start:e - start])

    def _create_constant(self, value: float) -> TierFile:
        """Every value `value`. Zeros (Adam's moments, FTRL's linear term) are what the new sparse file
        reads as: in a file the page cache cannot hold (`large_file`) nothing is written, the file takes
        disk only for the pages training writes. A smaller one is written once, in sequence: the first
        write of training to a hole allocates its page in a fault of its own (380 of them a step, most
        of the write-back's system time, on a cache-full 4M-row table with LazyAdam until every page
        was written, steps 100-200), and a Zipf tail writes every page of it within a few hundred
        steps anyway. Every full block holds the same bytes: one checksum, computed once, for all."""
        if value == 0.0 and not large_file(self._map.size()):
            self._write_zeros()
        elif value != 0.0:
            chunk = self.block_rows * 4096
            for a in range(0, self.rows, chunk):
                self._shared_rows[a:min(self.rows, a + chunk)] = value
                self.release()
        full, tail = divmod(self.rows, self.block_rows)
        self._crc[:full] = _crc(np.full(self.block_rows * self.cols, value, np.float32))
        if tail:
            self._crc[full] = _crc(np.full(tail * self.cols, value, np.float32))
        self.verified[:] = True
        self._sync()
        self.set_generation(0)
        self.release()
        return self

    def _write_zeros(self) -> None:
        """The rows' bytes written as zeros, by ``pwrite`` (no page of the file is mapped)."""
        start, end = HEADER_BYTES + _pad(4 * self.blocks), self._map.size()
        zeros = bytes(min(16 << 20, end - start))
        fd = os.open(self.path, os.O_WRONLY)
        try:
            for offset in range(start, end, len(zeros)):
                os.pwrite(fd, zeros[:end - offset], offset)
        finally:
            os.close(fd)

    @classmethod
    def open(cls, path: str) -> TierFile:
        """Open an existing file; its header (magic, version, sizes, checksum) is checked here, each
        block the first time it is used."""
        path = os.fspath(path)
        size = os.path.getsize(path)
        if size < HEADER_BYTES:
            raise TierFileError(f"tier file {path}: {size} bytes, shorter than its header; not a tier file or torn")
        with open(path, "rb") as f:
            head = f.read(_HEADER.size + 4)
        magic, version, rows, cols, block_rows, blocks, generation = _HEADER.unpack(head[:_HEADER.size])
        if magic != MAGIC:
            raise TierFileError(f"tier file {path}: bad magic {magic!r} (expected {MAGIC!r}): not a tier file, "
                                "or its creation was interrupted")
        if struct.unpack("<I", head[_HEADER.size:])[0] != _crc(head[:_HEADER.size]):
            raise TierFileError(f"tier file {path}: the header fails its checksum (torn or corrupt)")
        if version != VERSION:
            raise TierFileError(f"tier file {path}: format version {version}, this recstream reads {VERSION}")
        expected = HEADER_BYTES + _pad(4 * blocks) + rows * cols * 4
        if size != expected or blocks != (rows + block_rows - 1) // block_rows:
            raise TierFileError(f"tier file {path}: {size} bytes, its header ({rows} rows x {cols}) says "
                                f"{expected}: truncated or corrupt")
        return cls(path, rows, cols, block_rows, generation)

    def close(self) -> None:
        """Close the maps. Rows written through the private map since the last `flush` are dropped:
        not committed, they are what the store's undo log would take back."""
        self._map.flush()
        # the views first: a map with views cannot close
        del self.data, self._rows, self._shared_rows, self._crc, self._mm
        for m in self._maps():
            m.close()
        os.close(self._fd)

    def one_map(self) -> None:
        """Read and write rows through the shared map from now on, the private map's written pages
        written to the file and its pages dropped: pages of the shared map are file pages, which a
        resident-set budget that is measured (`TierStore._measuring`) counts and a release drops."""
        if self._private_map is not None and self._rows is not self._shared_rows:
            self._write_private()
            self._unsynced = None
            self._rows = self.data = self._shared_rows
            if hasattr(mmap, "MADV_DONTNEED"):
                self._private_map.madvise(mmap.MADV_DONTNEED)  # (closed with the file: a view may be in use)

    @property
    def private(self) -> bool:
        """Whether rows are written through the private map: the file keeps its bytes until a `flush`,
        `release` or `one_map` writes them (`committed_rows` reads them meanwhile; `discard` drops the writes)."""
        return self._rows is not self._shared_rows

    def committed_rows(self, rows: np.ndarray) -> np.ndarray:
        """Rows `rows` as the file holds them (a copy): a private map's writes are not there until written."""
        return gather_rows(self._shared_rows, rows)

    def discard(self) -> None:
        """Drop the private map's writes not written to the file yet: its pages hold the file's bytes again
        (read back with ``pread``; the pages stay the process's, so a write to them faults no more)."""
        if self._unsynced is None:
            return
        with memoryview(self._private_map) as view:  # (released on an error too: the map can close)
            for a, e in self._unsynced_runs():
                done = a
                while done < e:  # (pread may read less than asked)
                    chunk = os.pread(self._fd, min(e - done, 16 << 20), done)
                    if not chunk:
                        raise TierFileError(f"tier file {self.path}: ends at byte {done}, its header says {e} or more")
                    view[done:done + len(chunk)] = chunk
                    done += len(chunk)
        self._unsynced[:] = False

    def drop_shared(self) -> None:
        """Drop the shared map's pages from the resident set (the data stays in the page cache): those
        `committed_rows` mapped, the rows of a file written through its private map."""
        if hasattr(mmap, "MADV_DONTNEED"):
            self._map.madvise(mmap.MADV_DONTNEED)

    def _unsynced_runs(self) -> list[tuple[int, int]]:
        """Byte ranges ``[a, e)`` of the runs of consecutive private pages written since last written."""
        pages = np.flatnonzero(self._unsynced)
        if pages.size == 0:
            return []
        cut = np.flatnonzero(np.diff(pages) > 1)
        starts, ends = pages[np.r_[0, cut + 1]], pages[np.r_[cut, pages.size - 1]] + 1
        size = self._private_map.size()
        return [(a, min(e, size)) for a, e in zip((starts * mmap.PAGESIZE).tolist(),
                                                  (ends * mmap.PAGESIZE).tolist(), strict=True)]

    def _maps(self) -> list[mmap.mmap]:
        return [self._map] if self._private_map is None else [self._map, self._private_map]

    def release(self) -> None:
        """Drop this process's mapped pages from its resident set (the data stays, in the page cache and
        on disk): the table's disk tier then costs the cache, not the pages it went through. The
        private map's written pages are written to the file first (dropped, they would be lost)."""
        self._write_private()
        if hasattr(mmap, "MADV_DONTNEED"):
            for m in self._maps():
                m.madvise(mmap.MADV_DONTNEED)

    # ----- rows -----
    def block_range(self, b: int) -> tuple[int, int]:
        return b * self.block_rows, min(self.rows, (b + 1) * self.block_rows)

    def blocks_of(self, rows: np.ndarray) -> np.ndarray:
        """The block of each of `rows` (repeats kept: deduplicating thousands of rows a step cost
        more than every use of the blocks, which are bitmaps indexed with them)."""
        return np.asarray(rows, dtype=np.int64) // self.block_rows

    def check_blocks(self, blocks: np.ndarray) -> None:
        """Verify the not-yet-verified `blocks` against their stored checksums."""
        todo = blocks[~self.verified[blocks]]
        for b in np.unique(todo) if todo.size else todo:
            a, e = self.block_range(int(b))
            stored, actual = int(self._crc[b]), _crc(self.data[a:e])
            if stored != actual:
                raise TierFileError(
                    f"tier file {self.path}: block {int(b)} (rows {a}..{e - 1}) fails its checksum (stored "
                    f"{stored:08x}, computed {actual:08x}): the file is corrupt, or was written after its last "
                    "commit without the undo log that rolls such writes back; restore it from a copy")
            self.verified[b] = True

    def read_rows(self, rows: np.ndarray, blocks: np.ndarray | None = None) -> np.ndarray:
        """Rows `rows` (a copy, ``[len(rows), cols]``), their blocks verified first (`blocks`: theirs,
        if known)."""
        rows = np.asarray(rows, dtype=np.int64)
        self.check_blocks(self.blocks_of(rows) if blocks is None else blocks)
        return gather_rows(self.data, rows)

    def write_rows(self, rows: np.ndarray, values: np.ndarray, checked: bool = False,
                   blocks: np.ndarray | None = None) -> None:
        """Write `values` into rows `rows`; their blocks (`blocks`, if known) are verified first unless
        the caller has (`checked`: a store checks a write's blocks once, then writes it in chunks)."""
        rows = np.asarray(rows, dtype=np.int64)
        blocks = self.blocks_of(rows) if blocks is None else blocks
        if not checked:
            self.check_blocks(blocks)
        put_rows(self._rows, rows, values)
        self._mark(rows)
        self.dirty[blocks] = True

    def _mark(self, rows: np.ndarray) -> None:
        """The private map's pages of `rows` (a row at most a page: its first and last byte's) to be
        written to the file."""
        if self._unsynced is not None:
            first = self._data_offset + np.asarray(rows, dtype=np.int64) * (4 * self.cols)
            self._unsynced[first // mmap.PAGESIZE] = True
            self._unsynced[(first + 4 * self.cols - 1) // mmap.PAGESIZE] = True

    def _write_private(self) -> None:
        """Write the private map's pages written since the last call to the file (``pwrite``, a call a
        run of consecutive pages; not synced)."""
        if self._unsynced is None:
            return
        runs = self._unsynced_runs()
        if not runs:
            return
        with memoryview(self._private_map) as view:  # (released on an error too: the map can close)
            for a, e in runs:
                done = a
                while done < e:  # (pwrite may write less than asked)
                    done += os.pwrite(self._fd, view[done:e], done)
        self._unsynced[:] = False

    def crcs(self, blocks: np.ndarray) -> np.ndarray:
        """The stored checksums of verified `blocks` (uint32, a copy)."""
        return self._crc[blocks].copy()

    def restore_crcs(self, blocks: np.ndarray, crcs: np.ndarray) -> None:
        """`restore_crc` of many blocks at once."""
        self._crc[blocks] = crcs
        self.verified[blocks] = False
        self.dirty[blocks] = False

    def restore_crc(self, b: int, crc: int) -> None:
        """Put back a block's committed checksum (undo-log rollback; its rows are put back too)."""
        self._crc[b] = crc
        self.verified[b] = False
        self.dirty[b] = False

    def restore_rows(self, rows: np.ndarray, data: bytes) -> None:
        """Put back rows' committed bytes (undo-log rollback), without touching checksums."""
        self._rows[rows] = np.frombuffer(data, dtype=np.float32).reshape(len(rows), self.cols)
        self._mark(rows)

    # ----- durability -----
    def flush(self) -> None:
        """Refresh the checksums of the blocks written since the last flush, then msync + fsync."""
        # the pages the checksums read
        budget = PageBudget(self.release, release_limit(self._map.size(), RELEASE_BYTES), every=1024)
        for b in np.flatnonzero(self.dirty):
            a, e = self.block_range(int(b))
            self._crc[b] = _crc(self.data[a:e])
            budget.spent(1)
        self.dirty[:] = False
        self._write_private()
        self._sync()
        # The sync left every page written through the shared map clean and write-protected: the next
        # write to each would take a write-protect fault of its own. Unmapped (the data stays in the
        # page cache), a write maps its folio at once: 3x fewer faults after a commit. (The private
        # map's pages stay: they hold what the file now does, and fault no more.)
        if self._private_map is None and hasattr(mmap, "MADV_DONTNEED"):
            self._map.madvise(mmap.MADV_DONTNEED)

    def set_generation(self, generation: int) -> None:
        head = _HEADER.pack(MAGIC, VERSION, self.rows, self.cols, self.block_rows, self.blocks, generation)
        self._mm[:len(head) + 4] = np.frombuffer(head + struct.pack("<I", _crc(head)), dtype=np.uint8)
        self._sync()
        self.generation = generation

    def verify_all(self) -> None:
        """Check every block now (a full read of the file)."""
        self.verified[:] = False
        self.check_blocks(np.arange(self.blocks))

    def _sync(self) -> None:
        self._map.flush()  # msync(MS_SYNC) of the mapping
        os.fsync(self._fd)
