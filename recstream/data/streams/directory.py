"""`DirectoryStream`: follow a directory where data files keep arriving, as a stream of batches.

Contract with the writers:

* Files are read once each, in NAME order (zero-padded sequence numbers or timestamps:
  ``part-00000042.csv``). Only names matching `pattern` count; names starting with ``.``
  or ``_`` never do, so a writer can fill ``.part-42.csv.tmp`` and ``os.rename`` it into
  place (atomic): the usual way, and the only way for Parquet.
* Text files (CSV/TSV/JSON lines/Criteo TSV) may also be appended to in place: only
  complete lines (ending in a newline) are consumed; a partial last line is read once its
  newline arrives. A file is *final* once a file with a greater name exists: its writer
  is done, so an unterminated last line is then read as a record, and the stream moves on.
* A file that appears with a name before the one being read is too late: it is skipped
  with a warning (``late_files`` counts them).
* A file that cannot be read (not Parquet, a corrupt page, a header without a schema
  column) is skipped from where it fails, with one dead letter naming it and the reason:
  the stream goes on with the next file, also after a restart. Parquet files are read one
  row group at a time: a row group with a corrupt page or a failed page checksum is skipped
  from where it fails to its end (one dead letter naming the file, the row group and its
  rows), and the row groups after it are read. Parquet page checksums are verified:
  writers should pass ``write_page_checksum=True`` (``recstream produce`` does); without
  them a flipped bit in a data page usually decodes as a wrong value and is trained.

Memory stays constant: one block (``block_bytes``, or one Parquet record batch) plus
less than one batch of rows, and the names of the directory's files. The directory is listed
when the stream knows no next file (`DirectoryIndex`
keeps the names ahead of the reading point, sorted): consumed files left in place cost no
time per new file; removing them is safe (see below). Position: ``{"file": name, "offset": n}`` - everything in
files named before `name`, and `name` up to byte `n` (Parquet: row `n`), is consumed;
``{"file": None, "offset": 0}`` is the start. A consumed file may be deleted.

``commit(position)`` writes the position atomically to `commit_path` (when given; else it
does nothing); a new stream with the same `commit_path` starts from there, like a Kafka
consumer group. ``committed()`` reads it back.

Ranks (``set_rank(r, n)``, done by `RecModel.online_train` under ``torchrun``): each file
belongs to exactly one rank, the file name's 64-bit BLAKE2b hash modulo n (a rule over the
name alone, so it never changes when new files arrive; a hash that mixes well, so numbered files
spread evenly); a rank lists, reads and positions only its own files, and
commits to ``<commit_path>.rank<r>-of-<n>``. A position saved by one process maps to any number
of ranks (everything named before its file was read, whoever owns it now); positions of several
ranks do not map to another number of ranks (a rank's files would be read partly), which
``rank_position`` refuses.

Reading one file, a block at a time, from a given offset: `TextFileCursor`
(CSV/TSV/JSON lines) reads ``block_bytes`` at ``offset`` and decodes the complete lines in
it; a last line without its newline is left for later, since a writer may still be
appending to it, unless the file is final. A line longer than ``max_record_bytes`` is
skipped without being held in memory and dead-lettered as ``oversize`` (first 4 KiB
kept). `ParquetFileCursor` reads one record batch at a time from a row offset.

>>> import os, tempfile
>>> from recstream.data import Schema
>>> d = tempfile.mkdtemp()
>>> _ = open(os.path.join(d, "part-1.csv"), "w").write("1,0.5\\n0,1.5\\n1,2.5\\n")
>>> s = DirectoryStream(d, Schema(["x"]), batch_size=2, idle_timeout=0.2)
>>> [b.batch_size for b in s], s.position()
([2, 1], {'file': 'part-1.csv', 'offset': 18})
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ...atomic import atomic_write
from ...validation import check_bool, check_choice, check_int, check_number, check_str, check_type
from ..interrupted import reraise_interrupt
from ..readers import DEFAULT_HASH_BUCKETS
from ..schema import Schema
from .base import Stream
from .decoders import DEFAULT_MAX_RECORD_BYTES, ArrowTableDecoder, CriteoTSVDecoder, CSVLineDecoder, JSONDecoder
from .dirindex import DirectoryIndex
from .records import BadRecord, Decoded, line_spans

log = logging.getLogger("recstream.data.streams")
_PATTERNS = {"csv": "*.csv", "tsv": "*.tsv", "jsonl": "*.jsonl", "criteo": "*.tsv", "parquet": "*.parquet"}


class DirectoryStream(Stream):
    """Batches from the files arriving in `path` (see the module docstring).

    format: "csv", "tsv", "jsonl", "criteo" (TSV, schema from `hash_buckets`) or
    "parquet"; or pass a ready `decoder`. poll_interval: seconds between directory scans
    when there is nothing new.
    """

    splits_across_ranks = True

    def __init__(self, path: str | os.PathLike, schema: Schema | None = None, batch_size: int = 1024,
                 format: str = "csv", *, pattern: str | None = None, poll_interval: float = 0.2,
                 decoder=None, delimiter: str | None = None, header: bool = False,
                 hash_buckets=DEFAULT_HASH_BUCKETS, id_column: str | None = None, time_column: str | None = None,
                 fill_missing_dense: float | None = None, log1p_dense: bool = False,
                 max_record_bytes: int | None = None, block_bytes: int = 1 << 20,
                 max_batches: int | None = None, idle_timeout: float | None = None, drop_remainder: bool = False,
                 dead_letter: str | os.PathLike | None = None, commit_path: str | os.PathLike | None = None,
                 max_delay: float | None = None) -> None:
        owner = "DirectoryStream"
        self.path = os.fspath(check_type(owner, "path", path, (str, os.PathLike), allowed="a path"))
        self.format = check_choice(owner, "format", format, sorted(_PATTERNS))
        if not os.path.isdir(self.path):
            raise FileNotFoundError(f"DirectoryStream: no such directory: {self.path!r}")
        self.pattern = check_str(owner, "pattern", pattern, allow_none=True) or _PATTERNS[format]
        self.poll_interval = check_number(owner, "poll_interval", poll_interval, minimum=0, min_open=True)  # seconds
        self.header = check_bool(owner, "header", header)
        if header and format not in ("csv", "tsv"):
            raise ValueError("DirectoryStream: 'header' is for csv/tsv files")
        self.block_bytes = check_int(owner, "block_bytes", block_bytes, minimum=1)
        check_int(owner, "max_record_bytes", max_record_bytes, minimum=1, allow_none=True)
        check_type(owner, "commit_path", commit_path, (str, os.PathLike), allowed="a path", allow_none=True)
        if decoder is not None and (schema is not None or id_column or time_column or max_record_bytes):
            raise ValueError("DirectoryStream: with a 'decoder', set schema / id_column / time_column / "
                             "max_record_bytes on the decoder")
        self.decoder = decoder or _make_decoder(format, schema, delimiter, hash_buckets, id_column, time_column,
                                                fill_missing_dense, log1p_dense,
                                                max_record_bytes or DEFAULT_MAX_RECORD_BYTES)
        self.schema = self.decoder.schema
        self.commit_path = None if commit_path is None else os.fspath(commit_path)
        self.late_files = 0
        self._cur = None                 # the open file cursor
        self._cur_name: str | None = None  # the file being (or last) read
        self._start: dict | None = None  # where to open the next file after a seek
        self._key, self._key_names = 0, {}
        self._index = DirectoryIndex(self.path, self.pattern)  # names ahead: no rescan per file
        super().__init__(batch_size, max_batches=max_batches, idle_timeout=idle_timeout,
                         drop_remainder=drop_remainder, dead_letter=dead_letter, max_delay=max_delay)
        committed = self.committed()
        self._apply_seek(committed if committed is not None else self._position)

    # --- position protocol -------------------------------------------------------------------
    def _initial_position(self) -> dict:
        return {"file": None, "offset": 0}

    def _seek_to(self, position: dict) -> dict:
        name, offset = position.get("file"), position.get("offset")
        if (set(position) != {"file", "offset"} or not (name is None or isinstance(name, str))
                or isinstance(offset, bool) or not isinstance(offset, int) or offset < 0
                or (name is None and offset != 0)):
            raise ValueError(f"DirectoryStream.seek: expected {{'file': name or None, 'offset': int >= 0}}, "
                             f"got {position!r}")
        self._close_file()
        self._cur_name = None
        self._start = {"file": name, "offset": offset}
        if hasattr(self, "_index"):  # the floor moved: what the index knows ahead no longer applies
            self._index.reset()
        return {"file": name, "offset": offset}

    def _advance(self, keys: np.ndarray, afters: np.ndarray) -> None:
        if keys.size:
            key = int(keys[-1])
            self._cursor = {"file": self._key_names[key], "offset": int(afters[-1])}
            for k in [k for k in self._key_names if k < key]:  # older files are done
                del self._key_names[k]

    @property
    def commits_progress(self) -> bool:
        return self.commit_path is not None

    def commit(self, position: dict) -> None:
        """Write `position` to `commit_path` (this rank's file) atomically and durably (no-op without one)."""
        path = self.commit_file()
        if path is None:
            return
        record = {"position": position, "time": time.time(), "rank": self.rank, "world_size": self.world_size}

        def write(tmp: str) -> None:
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(record, f)

        atomic_write(path, write)  # fsyncs the file and the rename

    def committed(self) -> dict | None:
        """The position last committed to this rank's `commit_path` file, or None."""
        path = self.commit_file()
        if path is None or not os.path.exists(path):
            return None
        with open(path, encoding="utf-8") as f:
            return json.load(f)["position"]

    def commit_file(self) -> str | None:
        """Where this rank commits: `commit_path`, or ``<commit_path>.rank<r>-of-<n>`` on several ranks."""
        if self.commit_path is None or self.world_size == 1:
            return self.commit_path
        return f"{self.commit_path}.rank{self.rank}-of-{self.world_size}"

    def owns(self, name: str) -> bool:
        """Whether file `name` is this rank's to read (see the module docstring)."""
        return self.world_size == 1 or name_rank(name, self.world_size) == self.rank

    # --- ranks ---------------------------------------------------------------------------------
    def _set_rank(self, rank: int, world_size: int) -> None:
        self.rank, self.world_size = rank, world_size
        self._index.reset(forget_seen=True)
        committed = self.committed()  # this rank's own commit file
        self._apply_seek(committed if committed is not None else self._initial_position())

    def rank_position(self, positions: list, rank: int, world_size: int) -> dict:
        """One saved position serves any number of ranks: ``{"file": f, "offset": n}`` says every
        file named before `f` was read, so it says the same of each rank's own files."""
        if isinstance(positions, list) and len(positions) == 1:
            return positions[0]
        return super().rank_position(positions, rank, world_size)

    def empty_batch(self):
        return self.decoder._empty

    def close(self) -> None:
        self._close_file()
        super().close()

    # --- reading ---------------------------------------------------------------------------
    def _generate(self) -> Iterator:
        last_data = time.monotonic()
        while True:
            yield from self._overdue()
            if self._step():
                last_data = time.monotonic()
                yield from self._full_batches()
                continue
            waited = time.monotonic() - last_data
            if self.idle_timeout is not None and waited >= self.idle_timeout:
                yield from self._remainder()
                return
            left = self.poll_interval if self.idle_timeout is None else self.idle_timeout - waited
            if self._wait(min(self.poll_interval, max(left, 0.001))):  # nothing new: poll the directory again
                return  # interrupt(): the rows read so far are read again by the next iteration

    def _step(self) -> bool:
        """Read the next block, or move to the next file; False when there is nothing new."""
        if self._cur is None:
            return self._open_next()
        try:
            chunk = self._cur.read(final=False)
            if chunk is None:
                if not self._has_later(self._cur.name):
                    return False
                chunk = self._cur.read(final=True)  # final now: read it to its very end
                if chunk is None:
                    self._close_file()
                    return True
        except (OSError, ValueError, pa.ArrowException) as e:
            reraise_interrupt(e)
            # a corrupt page, a failed checksum, a header without a schema column: the rest of
            # this file cannot be read, now or after a restart; skip it rather than stop the stream
            name, offset = self._cur.name, self._cur.offset
            self._close_file()
            self._skip_file(name, e, offset)
            return True
        d, afters, sources = chunk
        self._queue(d, np.full(d.n_records, self._key, dtype=np.int64), afters, sources)
        return True

    def _open_next(self) -> bool:
        name, offset = self._next_file()
        if name is None:
            return False
        full = os.path.join(self.path, name)
        try:
            if self.format == "parquet":
                cur = ParquetFileCursor(full, name, self.decoder, offset)
                if cur.missing:
                    cur.close()
                    raise ValueError(f"lacks columns {cur.missing}")
            else:
                cur = TextFileCursor(full, name, self.decoder, offset, header=self.header, block_bytes=self.block_bytes)
        except FileNotFoundError:  # removed since the index listed it: list the directory again
            self._index.reset()
            return True
        except (OSError, ValueError, pa.ArrowException) as e:
            reraise_interrupt(e)
            if not self._has_later(name):
                return False  # maybe still being written: try again later
            self._skip_file(name, e)
            return True
        self._key += 1
        self._key_names[self._key] = name
        self._cur, self._cur_name, self._start = cur, name, None
        return True

    def _skip_file(self, name: str, error: Exception, offset: int = 0) -> None:
        """A file is unreadable from `offset` on: one dead letter for the rest of it, then move on."""
        where = f" from offset {offset}" if offset else ""
        log.warning("DirectoryStream: skipping unreadable file %s%s: %s", name, where, error)
        d = Decoded(self.decoder._empty, np.zeros(0, dtype=np.int64), None, None,
                    [BadRecord(0, "malformed", f"unreadable file{where}: {error}", b"")], 1)
        self.dead_letter.write(d.bad, [{"file": name, "offset": offset}])
        self._cur_name, self._start = name, None

    def _next_file(self) -> tuple[str | None, int]:
        """This rank's next file and where to start in it: from the index; the directory is
        listed again only when the index knows no next file."""
        start = self._start
        floor = start["file"] if start is not None else self._cur_name
        for scanned in (False, True):
            if scanned or not self._index.covers(floor):
                self._rescan(floor)
            for n in self._index.after(floor, inclusive=start is not None):
                if self.owns(n):
                    return n, (start["offset"] if start is not None and n == start["file"] else 0)
        return None, 0

    def _rescan(self, floor: str | None) -> None:
        """List the directory (see `DirectoryIndex`); counts and reports this rank's late files."""
        late = [n for n in self._index.scan(floor) if self.owns(n)]
        if late:  # names seen for the first time, behind the reading point
            self.late_files += len(late)
            log.warning("DirectoryStream: %d file(s) arrived with names before %s and are skipped "
                        "(files are read in name order): %s", len(late), floor, late[:5])

    def _has_later(self, name: str) -> bool:
        # any rank's later file: its writer moved on, so `name` is final whoever reads the next one
        if self._index.after(name):
            return True
        self._rescan(name)
        return bool(self._index.after(name))

    def _close_file(self) -> None:
        if self._cur is not None:
            self._cur.close()
            self._cur = None


def name_rank(name: str, world_size: int) -> int:
    """The rank that reads file `name` when `world_size` ranks share a directory.

    >>> [name_rank(f"part-{i:04d}.csv", 2) for i in range(6)]
    [1, 0, 0, 0, 0, 1]
    """
    digest = hashlib.blake2b(name.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % world_size


def _make_decoder(format, schema, delimiter, hash_buckets, id_column, time_column, fill, log1p, max_bytes):
    common = dict(id_column=id_column, time_column=time_column, max_record_bytes=max_bytes)
    if format == "criteo":
        return CriteoTSVDecoder(hash_buckets, **common)  # counts always get log1p, as in CriteoReader
    if schema is None:
        raise ValueError(f"DirectoryStream: format {format!r} needs a 'schema' (or pass a 'decoder')")
    common.update(fill_missing_dense=fill, log1p_dense=log1p)
    if format == "jsonl":
        return JSONDecoder(schema, **common)
    if format == "parquet":
        return ArrowTableDecoder(schema, **common)
    return CSVLineDecoder(schema, delimiter or ("\t" if format == "tsv" else ","), **common)


# --- one file at a time ----------------------------------------------------------------------
_KEEP = 4096  # bytes of an oversize record kept for the dead letter


def _only_bad(decoder, bad: BadRecord) -> Decoded:
    """A decoded chunk of one record, `bad`, and no rows."""
    d = Decoded(decoder._empty, np.zeros(0, dtype=np.int64), None, None, [bad], 1)
    if decoder.id_column is not None:
        d.ids = np.zeros(0, dtype=np.int64)
    if decoder.time_column is not None:
        d.event_time = np.zeros(0, dtype=np.float64)
    return d


class TextFileCursor:
    """Complete lines of a text file from byte `offset` (see the module docstring); offsets are bytes.

    header: the file's first line names its columns (the decoder is rebuilt with them
    via ``decoder.with_columns``) and is skipped. `read` returns ``(Decoded, afters,
    sources)``: the offset just after each record, and for each bad record where it starts
    (``{"file": name, "offset": ...}``).

    >>> import os, tempfile
    >>> from recstream.data import Schema
    >>> path = os.path.join(tempfile.mkdtemp(), "a.csv")
    >>> _ = open(path, "wb").write(b"1,0.5\\n0,1.5\\n1,2")
    >>> cur = TextFileCursor(path, "a.csv", CSVLineDecoder(Schema(["x"])), offset=0)
    >>> d, afters, _ = cur.read(final=False); d.num_rows, afters.tolist(), cur.offset
    (2, [6, 12], 12)
    >>> d, afters, _ = cur.read(final=True); d.num_rows, afters.tolist()
    (1, [15])
    """

    def __init__(self, path: str, name: str, decoder, offset: int = 0, *, header: bool = False,
                 block_bytes: int = 1 << 20) -> None:
        self.path, self.name, self.offset = path, name, int(offset)
        self.decoder = decoder
        self.header = header
        self.max_record_bytes = decoder.max_record_bytes
        # a block always holds a whole record of the maximum size (plus its newline)
        self.block_bytes = max(int(block_bytes), self.max_record_bytes + 2)
        self._fd = os.open(path, os.O_RDONLY)
        self._header_done = not header

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def read(self, final: bool):
        """The next block's records, or None when there is nothing (complete) to read now."""
        if not self._header_done and not self._read_header(final):
            return None
        data = os.pread(self._fd, self.block_bytes, self.offset)
        cut = data.rfind(b"\n") + 1
        if cut == 0:
            if len(data) == self.block_bytes:  # no newline in a full block: an oversize record
                return self._skip_oversize(data, final)
            if not (final and data):
                return None  # an unfinished last line: wait for its newline
            cut = len(data)  # the file is final: its unterminated last line is a record
        return self._decode(data[:cut])

    def _decode(self, block: bytes):
        base = self.offset
        starts, ends = line_spans(block)
        d = self.decoder.decode_spans(block, starts, ends)
        afters = base + np.append(starts[1:], len(block)).astype(np.int64)
        sources = [{"file": self.name, "offset": base + int(starts[b.index])} for b in d.bad]
        self.offset = base + len(block)
        return d, afters, sources

    def _skip_oversize(self, head: bytes, final: bool):
        """Scan to the end of a too-long line without keeping it; one bad record."""
        start, pos = self.offset, self.offset + len(head)
        while True:
            chunk = os.pread(self._fd, self.block_bytes, pos)
            nl = chunk.find(b"\n")
            if nl >= 0:
                end, after = pos + nl, pos + nl + 1
                break
            if len(chunk) < self.block_bytes:  # hit the end of the file
                if not final:
                    return None  # the line is still being written; come back later
                end = after = pos + len(chunk)
                break
            pos += len(chunk)
        bad = BadRecord(0, "oversize", f"record of {end - start} bytes > max_record_bytes={self.max_record_bytes}",
                        head[:_KEEP])
        self.offset = after
        return _only_bad(self.decoder, bad), np.array([after], dtype=np.int64), [{"file": self.name, "offset": start}]

    def _read_header(self, final: bool) -> bool:
        head = os.pread(self._fd, self.block_bytes, 0)
        nl = head.find(b"\n")
        if nl < 0 and not (final and head):
            return False  # the header line is not complete yet
        line = head[: nl if nl >= 0 else len(head)].rstrip(b"\r").decode("utf-8", "replace")
        names = [c.strip().strip('"') for c in line.split(self.decoder.delimiter)]
        self.decoder = self.decoder.with_columns(names)
        self.offset = max(self.offset, nl + 1 if nl >= 0 else len(head))
        self._header_done = True
        return True


class ParquetFileCursor:
    """Record batches of a Parquet file from row `offset`; offsets are rows.

    Parquet files must appear complete (e.g. by rename): a half-written one cannot be read.
    Read one row group at a time: a row group that fails (a corrupt page, a failed page
    checksum) is skipped from where it fails to its end, as one bad record naming the file,
    the row group and its rows; the row groups after it are read as usual.
    """

    def __init__(self, path: str, name: str, decoder, offset: int = 0, *, block_rows: int = 65536) -> None:
        self.path, self.name, self.offset = path, name, int(offset)
        self.decoder = decoder
        # raises for a file that is not (yet) valid Parquet; pages written with checksums
        # (``write_page_checksum=True``) are verified, so flipped bits fail instead of reading wrong
        self._pf = pq.ParquetFile(path, page_checksum_verification=True)
        have = self._pf.schema_arrow.names
        self.missing = [c for c in decoder.schema.columns if c not in have]
        self._cols = [c for c in decoder.columns if c in have]
        self._block_rows = block_rows
        self._starts = np.cumsum([0] + [self._pf.metadata.row_group(i).num_rows
                                        for i in range(self._pf.num_row_groups)])
        self.num_rows = int(self._starts[-1])
        self._rg = max(int(np.searchsorted(self._starts, self.offset, side="right")) - 1, 0)
        self._skip = self.offset - int(self._starts[self._rg])  # rows of the first row group already consumed
        self._batches = None  # the current row group's record batches

    def close(self) -> None:
        self._pf.close()

    def read(self, final: bool = True):
        """The next record batch's records (or one bad record for the rest of a row group that
        fails), or None at the end of the file."""
        while self.offset < self.num_rows and self._rg < self._pf.num_row_groups:
            try:
                if self._batches is None:
                    self._batches = self._pf.iter_batches(batch_size=self._block_rows, row_groups=[self._rg],
                                                          columns=self._cols)
                rb = next(self._batches, None)
            except (OSError, ValueError, pa.ArrowException) as e:
                reraise_interrupt(e)
                return self._skip_row_group(e)
            if rb is None:  # this row group is done
                self._rg, self._batches, self._skip = self._rg + 1, None, 0
                continue
            if self._skip:
                drop = min(self._skip, rb.num_rows)
                rb, self._skip = rb.slice(drop), self._skip - drop
            if rb.num_rows == 0:
                continue
            d = self.decoder.decode_table(pa.Table.from_batches([rb]))
            base = self.offset
            self.offset += rb.num_rows
            return (d, base + np.arange(1, rb.num_rows + 1, dtype=np.int64),
                    [{"file": self.name, "row": base + b.index} for b in d.bad])
        return None

    def _skip_row_group(self, error: Exception):
        """The current row group cannot be read from `offset` on: one bad record for the rest of it."""
        rg, start, end = self._rg, self.offset, int(self._starts[self._rg + 1])
        reason = f"unreadable row group {rg} of {self.name} (rows {start}..{end - 1} skipped): {error}"
        log.warning("DirectoryStream: %s", reason)
        self.offset, self._rg, self._batches, self._skip = end, rg + 1, None, 0
        bad = BadRecord(0, "malformed", reason, b"")
        return (_only_bad(self.decoder, bad), np.array([end], dtype=np.int64),
                [{"file": self.name, "row": start, "row_group": rg}])
