"""Stream Parquet files as batches, one record batch in memory at a time.

>>> import pyarrow as pa, pyarrow.parquet as pq, tempfile, os
>>> from recstream.data.schema import Schema, CategoricalFeature
>>> path = os.path.join(tempfile.mkdtemp(), "d.parquet")
>>> pq.write_table(pa.table({"label": [0, 1, 1], "x": [0.1, 0.2, 0.3], "c": [3, 1, 2]}), path)
>>> r = ParquetReader(path, Schema(["x"], [CategoricalFeature("c", vocab_size=4)]), batch_size=2)
>>> r.get_dataset_size(), [b.batch_size for b in r]
(2, [2, 1])
"""
from __future__ import annotations

import os
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .badrows import BadRow
from .reader_base import FileReader
from .schema import Schema


class ParquetReader(FileReader):
    """Batches from one or more Parquet files (or a directory of ``*.parquet``), in order.

    Reads only the schema's columns, via ``ParquetFile.iter_batches`` (row group by row
    group), so memory stays at about one record batch whatever the file size. Columns may
    be numbers or strings (parsed), categorical ids integers or strings, multi-hot ids
    lists or separator-joined strings, dictionary-encoded or not.

    get_dataset_size(): batches per pass from the files' metadata (exact unless bad rows
    are skipped, which can only make it smaller).
    """

    _suffixes = (".parquet", ".parq", ".pq")

    def __init__(self, path_or_paths, schema: Schema, batch_size: int, *, drop_remainder: bool = False,
                 on_bad_row: str = "raise", bad_row_log: str | os.PathLike | None = None,
                 fill_missing_dense: float | None = None, log1p_dense: bool = False,
                 use_threads: bool = True) -> None:
        super().__init__(path_or_paths, schema, batch_size, drop_remainder=drop_remainder,
                         on_bad_row=on_bad_row, bad_row_log=bad_row_log,
                         fill_missing_dense=fill_missing_dense, log1p_dense=log1p_dense)
        self.use_threads = bool(use_threads)
        self.num_rows = 0
        for path in self.paths:  # footers only: cheap, and a wrong file fails now, not mid-epoch
            try:
                pf = pq.ParquetFile(path)
            except (pa.ArrowInvalid, OSError) as e:
                raise ValueError(f"ParquetReader: cannot read {path!r} as Parquet: {e}") from e
            missing = [c for c in schema.columns if c not in pf.schema_arrow.names]
            if missing:
                raise ValueError(f"ParquetReader: {path!r} lacks columns {missing} required by the schema; "
                                 f"it has {pf.schema_arrow.names}")
            self.num_rows += pf.metadata.num_rows
            pf.close()

    def get_dataset_size(self) -> int:
        """Batches per pass (``num_rows / batch_size``, rounded by ``drop_remainder``)."""
        full, rest = divmod(self.num_rows, self.batch_size)
        return full + (1 if rest and not self.drop_remainder else 0)

    def _record_batches(self, path: str) -> Iterator[tuple[pa.RecordBatch, np.ndarray, list[BadRow]]]:
        first = 1
        with pq.ParquetFile(path) as pf:
            for rb in pf.iter_batches(batch_size=self.batch_size, columns=list(self.schema.columns),
                                      use_threads=self.use_threads):
                n = rb.num_rows
                yield rb, np.arange(first, first + n, dtype=np.int64), []
                first += n
