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

Memory stays constant: one block (``block_bytes``, or one Parquet record batch) plus
less than one batch of rows. Position: ``{"file": name, "offset": n}`` - everything in
files named before `name`, and `name` up to byte `n` (Parquet: row `n`), is consumed;
``{"file": None, "offset": 0}`` is the start. A consumed file may be deleted.

``commit(position)`` writes the position atomically to `commit_path` (when given; else it
does nothing); a new stream with the same `commit_path` starts from there, like a Kafka
consumer group. ``committed()`` reads it back.

>>> import os, tempfile
>>> from recstream.data import Schema
>>> d = tempfile.mkdtemp()
>>> _ = open(os.path.join(d, "part-1.csv"), "w").write("1,0.5\\n0,1.5\\n1,2.5\\n")
>>> s = DirectoryStream(d, Schema(["x"]), batch_size=2, idle_timeout=0.2)
>>> [b.batch_size for b in s], s.position()
([2, 1], {'file': 'part-1.csv', 'offset': 18})
"""
from __future__ import annotations

import fnmatch
import json
import logging
import os
import time
from typing import Iterator

import numpy as np
import pyarrow as pa

from ..criteo import DEFAULT_HASH_BUCKETS
from ..schema import Schema
from .base import Stream
from .decoder_base import DEFAULT_MAX_RECORD_BYTES
from .decoders import CriteoTSVDecoder, CSVLineDecoder
from .dir_files import ParquetFileCursor, TextFileCursor
from .json_decoder import JSONDecoder
from .records import BadRecord, Decoded
from .table_decoders import ArrowTableDecoder

log = logging.getLogger("recstream.data.streams")
_PATTERNS = {"csv": "*.csv", "tsv": "*.tsv", "jsonl": "*.jsonl", "criteo": "*.tsv", "parquet": "*.parquet"}


class DirectoryStream(Stream):
    """Batches from the files arriving in `path` (see the module docstring).

    format: "csv", "tsv", "jsonl", "criteo" (TSV, schema from `hash_buckets`) or
    "parquet"; or pass a ready `decoder`. poll_interval: seconds between directory scans
    when there is nothing new.
    """

    def __init__(self, path: str | os.PathLike, schema: Schema | None = None, batch_size: int = 1024,
                 format: str = "csv", *, pattern: str | None = None, poll_interval: float = 0.2,
                 decoder=None, delimiter: str | None = None, header: bool = False,
                 hash_buckets=DEFAULT_HASH_BUCKETS, id_column: str | None = None, time_column: str | None = None,
                 fill_missing_dense: float | None = None, log1p_dense: bool = False,
                 max_record_bytes: int | None = None, block_bytes: int = 1 << 20,
                 max_batches: int | None = None, idle_timeout: float | None = None, drop_remainder: bool = False,
                 dead_letter: str | os.PathLike | None = None, commit_path: str | os.PathLike | None = None) -> None:
        if format not in _PATTERNS:
            raise ValueError(f"DirectoryStream: 'format' must be one of {sorted(_PATTERNS)}, got {format!r}")
        self.path = os.fspath(path)
        if not os.path.isdir(self.path):
            raise FileNotFoundError(f"DirectoryStream: no such directory: {self.path!r}")
        if not (isinstance(poll_interval, (int, float)) and poll_interval > 0):
            raise ValueError(f"DirectoryStream: 'poll_interval' must be seconds > 0, got {poll_interval!r}")
        if header and format not in ("csv", "tsv"):
            raise ValueError("DirectoryStream: 'header' is for csv/tsv files")
        self.format, self.pattern = format, pattern or _PATTERNS[format]
        self.poll_interval, self.header, self.block_bytes = float(poll_interval), bool(header), int(block_bytes)
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
        self._listed: set[str] = set()
        super().__init__(batch_size, max_batches=max_batches, idle_timeout=idle_timeout,
                         drop_remainder=drop_remainder, dead_letter=dead_letter)
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
        return {"file": name, "offset": offset}

    def _advance(self, keys: np.ndarray, afters: np.ndarray) -> None:
        if keys.size:
            key = int(keys[-1])
            self._cursor = {"file": self._key_names[key], "offset": int(afters[-1])}
            for k in [k for k in self._key_names if k < key]:  # older files are done
                del self._key_names[k]

    def commit(self, position: dict) -> None:
        """Write `position` to `commit_path` atomically and durably (no-op without one)."""
        if self.commit_path is None:
            return
        tmp = f"{self.commit_path}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"position": position, "time": time.time()}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.commit_path)
        dir_fd = os.open(os.path.dirname(os.path.abspath(self.commit_path)), os.O_RDONLY)
        try:  # the rename itself must reach the disk too
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def committed(self) -> dict | None:
        """The position last committed to `commit_path`, or None."""
        if self.commit_path is None or not os.path.exists(self.commit_path):
            return None
        with open(self.commit_path, encoding="utf-8") as f:
            return json.load(f)["position"]

    def close(self) -> None:
        self._close_file()
        super().close()

    # --- reading ---------------------------------------------------------------------------
    def _generate(self) -> Iterator:
        last_data = time.monotonic()
        while True:
            if self._step():
                last_data = time.monotonic()
                yield from self._full_batches()
                continue
            waited = time.monotonic() - last_data
            if self.idle_timeout is not None and waited >= self.idle_timeout:
                yield from self._remainder()
                return
            left = self.poll_interval if self.idle_timeout is None else self.idle_timeout - waited
            time.sleep(min(self.poll_interval, max(left, 0.001)))  # nothing new: poll the directory again

    def _step(self) -> bool:
        """Read the next block, or move to the next file; False when there is nothing new."""
        if self._cur is None:
            return self._open_next()
        chunk = self._cur.read(final=False)
        if chunk is None:
            if not self._has_later(self._cur.name):
                return False
            chunk = self._cur.read(final=True)  # final now: read it to its very end
            if chunk is None:
                self._close_file()
                return True
        d, afters, sources = chunk
        self._queue(d, np.full(d.n_records, self._key, dtype=np.int64), afters, sources)
        return True

    def _open_next(self) -> bool:
        names = self._list()
        start, after = self._start, self._cur_name
        if start is not None and start["file"] is not None and start["file"] in names:
            name, offset = start["file"], start["offset"]
        else:
            floor = start["file"] if start is not None else after
            name = next((n for n in names if floor is None or n > floor), None)
            offset = 0
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
        except (OSError, ValueError, pa.ArrowException) as e:
            if not self._has_later(name):
                return False  # maybe still being written: try again later
            self._skip_file(name, e)
            return True
        self._key += 1
        self._key_names[self._key] = name
        self._cur, self._cur_name, self._start = cur, name, None
        return True

    def _skip_file(self, name: str, error: Exception) -> None:
        """A whole file is unreadable: one dead letter for it, then move on."""
        log.warning("DirectoryStream: skipping unreadable file %s: %s", name, error)
        d = Decoded(self.decoder._empty, np.zeros(0, dtype=np.int64), None, None,
                    [BadRecord(0, "malformed", f"unreadable file: {error}", b"")], 1)
        self.dead_letter.write(d.bad, [{"file": name, "offset": 0}])
        self._cur_name, self._start = name, None

    def _list(self) -> list[str]:
        names = sorted(e.name for e in os.scandir(self.path) if not e.name.startswith((".", "_"))
                       and fnmatch.fnmatchcase(e.name, self.pattern) and e.is_file())
        current = self._cur_name or (self._start or {}).get("file")
        if current is not None:
            late = [n for n in names if n < current and n not in self._listed]
            if late and self._listed:  # names seen for the first time, behind the reading point
                self.late_files += len(late)
                log.warning("DirectoryStream: %d file(s) arrived with names before %s and are skipped "
                            "(files are read in name order): %s", len(late), current, late[:5])
        self._listed = set(names)
        return names

    def _has_later(self, name: str) -> bool:
        return any(n > name for n in self._list())

    def _close_file(self) -> None:
        if self._cur is not None:
            self._cur.close()
            self._cur = None


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
