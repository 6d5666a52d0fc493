"""Shared machinery of the file readers: paths, batching, conversion, bad-row policy.

A subclass only says how to stream one file as Arrow record batches and which data row
(1-based, per file) each record-batch row came from; this base converts them, applies
``on_bad_row`` and re-batches to exactly ``batch_size`` rows. Each ``iter()`` is a new pass.
"""
from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import pyarrow as pa

from .badrows import BadRow, BadRowHandler
from .batch import Batch
from .convert import ColumnConverter
from .rebatch import Rebatcher, check_batch_size
from .schema import Schema


def expand_paths(path_or_paths, suffixes: Sequence[str], owner: str) -> list[str]:
    """Files named by a path, a directory (its files with `suffixes`, sorted) or a list."""
    if isinstance(path_or_paths, (str, os.PathLike)):
        items = [path_or_paths]
    elif isinstance(path_or_paths, Sequence) and path_or_paths:
        items = list(path_or_paths)
    else:
        raise TypeError(f"{owner}: expected a path, a directory or a non-empty list of paths, "
                        f"got {path_or_paths!r}")
    paths: list[str] = []
    for item in items:
        if not isinstance(item, (str, os.PathLike)):
            raise TypeError(f"{owner}: paths must be str or os.PathLike, got {type(item).__name__}")
        p = Path(item)
        if p.is_dir():
            found = sorted(str(f) for f in p.iterdir() if f.is_file() and f.name.endswith(tuple(suffixes)))
            if not found:
                raise FileNotFoundError(f"{owner}: directory {str(p)!r} has no {'/'.join(suffixes)} files")
            paths += found
        elif p.is_file():
            paths.append(str(p))
        else:
            raise FileNotFoundError(f"{owner}: no such file or directory: {str(p)!r}")
    return paths


class FileReader:
    """Base class; subclasses implement :meth:`_record_batches`."""

    _suffixes: tuple[str, ...] = ()

    def __init__(self, path_or_paths, schema: Schema, batch_size: int, *, drop_remainder: bool = False,
                 on_bad_row: str = "raise", bad_row_log: str | os.PathLike | None = None,
                 fill_missing_dense: float | None = None, log1p_dense: bool = False) -> None:
        owner = type(self).__name__
        if not isinstance(schema, Schema):
            raise TypeError(f"{owner}: 'schema' must be a recstream.data.Schema, got {type(schema).__name__}")
        self.paths = expand_paths(path_or_paths, self._suffixes, owner)
        self.schema = schema
        self.batch_size = check_batch_size(batch_size, owner)
        self.drop_remainder = bool(drop_remainder)
        self._converter = ColumnConverter(schema, fill_missing_dense, log1p_dense)
        self._bad = BadRowHandler(on_bad_row, bad_row_log, owner)

    @property
    def on_bad_row(self) -> str:
        return self._bad.policy

    @property
    def bad_rows(self) -> Counter:
        """Rows skipped in the current (or last) pass, by reason."""
        return self._bad.counts

    def _record_batches(self, path: str) -> Iterator[tuple[pa.RecordBatch, np.ndarray, list[BadRow]]]:
        """Yield (record batch, 1-based data row of each of its rows, rows the format rejected)."""
        raise NotImplementedError

    def __iter__(self) -> Iterator[Batch]:
        self._bad.start_pass()
        rebatcher = Rebatcher(self.batch_size, self.drop_remainder)
        try:
            for path in self.paths:
                for rb, rows, rejected in self._record_batches(path):
                    batch, faults = self._converter.convert(rb)
                    bad = rejected + [BadRow(path, int(rows[f.index]), f.reason, f.column, f.detail,
                                             _row_data(rb, f.index)) for f in faults]
                    self._bad.handle(bad)
                    yield from rebatcher.add(batch)
                    del batch, rb  # keep at most one record batch alive while the consumer works
            yield from rebatcher.flush()
        finally:
            self._bad.close()

    def __repr__(self) -> str:
        files = self.paths[0] if len(self.paths) == 1 else f"{len(self.paths)} files"
        return f"{type(self).__name__}({files!r}, batch_size={self.batch_size}, on_bad_row={self.on_bad_row!r})"


def _row_data(rb: pa.RecordBatch, i: int) -> dict:
    """One row's raw values, for the bad-row log (called for bad rows only)."""
    return rb.slice(i, 1).to_pylist()[0]
