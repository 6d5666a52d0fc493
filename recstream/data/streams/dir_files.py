"""Reading one file of a followed directory, a block at a time, from a given offset.

:class:`TextFileCursor` (CSV/TSV/JSON lines) reads ``block_bytes`` at ``offset`` and
decodes the complete lines in it; a last line without its newline is left for later,
since a writer may still be appending to it, unless the caller says the file is final
(a later file exists). A line longer than ``max_record_bytes`` is skipped without being
held in memory and dead-lettered as ``oversize`` (first 4 KiB kept). Offsets are bytes.

:class:`ParquetFileCursor` reads one record batch at a time from a row offset (Parquet
files must appear complete, e.g. by rename: a half-written one cannot be read). Offsets
are rows.

Both return ``(Decoded, afters, sources)``: the offset just after each record, and for
each bad record where it starts (``{"file": name, "offset": ...}``).

>>> import os, tempfile
>>> from recstream.data import Schema
>>> from recstream.data.streams import CSVLineDecoder
>>> path = os.path.join(tempfile.mkdtemp(), "a.csv")
>>> _ = open(path, "wb").write(b"1,0.5\\n0,1.5\\n1,2")
>>> cur = TextFileCursor(path, "a.csv", CSVLineDecoder(Schema(["x"])), offset=0)
>>> d, afters, _ = cur.read(final=False); d.num_rows, afters.tolist(), cur.offset
(2, [6, 12], 12)
>>> d, afters, _ = cur.read(final=True); d.num_rows, afters.tolist()
(1, [15])
"""
from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .records import BadRecord, Decoded, line_spans

_KEEP = 4096  # bytes of an oversize record kept for the dead letter


class TextFileCursor:
    """Complete lines of a text file from byte `offset` (see module docstring).

    header: the file's first line names its columns (the decoder is rebuilt with them
    via ``decoder.with_columns``) and is skipped.
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
        d = Decoded(self.decoder._empty, np.zeros(0, dtype=np.int64), None, None, [bad], 1)
        if self.decoder.id_column is not None:
            d.ids = np.zeros(0, dtype=np.int64)
        if self.decoder.time_column is not None:
            d.event_time = np.zeros(0, dtype=np.float64)
        self.offset = after
        return d, np.array([after], dtype=np.int64), [{"file": self.name, "offset": start}]

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
    """Record batches of a Parquet file from row `offset` (see module docstring)."""

    def __init__(self, path: str, name: str, decoder, offset: int = 0, *, block_rows: int = 65536) -> None:
        self.path, self.name, self.offset = path, name, int(offset)
        self.decoder = decoder
        self._pf = pq.ParquetFile(path)  # raises for a file that is not (yet) valid Parquet
        have = self._pf.schema_arrow.names
        self.missing = [c for c in decoder.schema.columns if c not in have]
        cols = [c for c in decoder.columns if c in have]
        starts = np.cumsum([0] + [self._pf.metadata.row_group(i).num_rows
                                  for i in range(self._pf.num_row_groups)])
        self.num_rows = int(starts[-1])
        rg = max(int(np.searchsorted(starts, self.offset, side="right")) - 1, 0)
        self._skip = self.offset - int(starts[rg])  # rows of the first row group already consumed
        self._batches = self._pf.iter_batches(batch_size=block_rows, row_groups=range(rg, self._pf.num_row_groups),
                                              columns=cols) if self.offset < self.num_rows else iter(())

    def close(self) -> None:
        self._pf.close()

    def read(self, final: bool = True):
        """The next record batch's records, or None at the end of the file."""
        for rb in self._batches:
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
