"""A dataset held in memory as one big [`Batch`][recstream.data.batch.Batch], served in batches.

For data that fits in RAM (the Adult census set, a synthetic test split, an evaluation
slice): each pass yields ``batch_size``-row batches, optionally in a new random order
per pass (deterministic given ``seed``).

>>> import torch
>>> from recstream.data.batch import Batch
>>> from recstream.features import Features
>>> rows = Batch(Features.from_lengths(torch.arange(5.0).view(5, 1), torch.zeros(0), torch.zeros(0, 5)), torch.zeros(5))
>>> ds = InMemoryDataset(rows, batch_size=2)
>>> ds.get_dataset_size(), [b.features.dense.view(-1).tolist() for b in ds]
(3, [[0.0, 1.0], [2.0, 3.0], [4.0]])

From a table already in memory (an Arrow table, or a pandas DataFrame with `from_pandas`), its
columns named as the schema names them; bad rows raise `BadRowError` naming the row, or are
skipped and counted with ``on_bad_row="skip"``:

>>> import pyarrow as pa
>>> from recstream.data import CategoricalFeature, Schema
>>> schema = Schema(["x"], [CategoricalFeature("c", vocab_size=3)])
>>> table = pa.table({"label": [1, 0, 1], "x": [0.5, 2.0, 1.0], "c": [2, 7, 0]})
>>> ds = InMemoryDataset.from_arrow(table, schema, batch_size=2, on_bad_row="skip")
>>> ds.num_rows, dict(ds.bad_rows)
(2, {'id_out_of_range': 1})

As a stream for `RecModel.online_train` (seekable: the factory re-creates the pass):

>>> from recstream.data.streams import IterableStream
>>> stream = IterableStream(lambda: iter(ds))
>>> [b.batch_size for b in stream], stream.position()
([2], {'batches': 1})
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np
import pyarrow as pa

from ..validation import check_bool, check_int, check_type
from .badrows import BadRow, BadRowHandler
from .batch import Batch
from .convert import ColumnConverter
from .schema import Schema


def from_arrow(table, schema: Schema, batch_size: int, **kwargs) -> InMemoryDataset:
    """`InMemoryDataset.from_arrow`: a sized, re-iterable dataset of an Arrow table's rows."""
    return InMemoryDataset.from_arrow(table, schema, batch_size, **kwargs)


def from_pandas(frame, schema: Schema, batch_size: int, **kwargs) -> InMemoryDataset:
    """`InMemoryDataset.from_pandas`: a sized, re-iterable dataset of a DataFrame's rows."""
    return InMemoryDataset.from_pandas(frame, schema, batch_size, **kwargs)


class InMemoryDataset:
    """Batches of `data` (one Batch with all rows); re-iterable, sized; ``schema`` optional."""

    def __init__(self, data: Batch, batch_size: int, *, shuffle: bool = False, seed: int = 0,
                 drop_remainder: bool = False, schema: Schema | None = None) -> None:
        owner = "InMemoryDataset"
        self.data = check_type(owner, "data", data, Batch, allowed="a recstream.data.Batch")
        self.batch_size = check_int(owner, "batch_size", batch_size, minimum=1)
        self.shuffle = check_bool(owner, "shuffle", shuffle)
        self.seed = check_int(owner, "seed", seed, minimum=0)
        self.drop_remainder = check_bool(owner, "drop_remainder", drop_remainder)
        # optional: the Schema the rows follow
        self.schema = check_type(owner, "schema", schema, Schema, allowed="a recstream.data.Schema", allow_none=True)
        self._epoch = 0
        self.bad_rows: dict[str, int] = {}  # rows `from_arrow` skipped, by reason

    @classmethod
    def from_batches(cls, batches: Iterable[Batch], batch_size: int | None = None, **kwargs) -> InMemoryDataset:
        """Collect a (finite) stream of batches; `batch_size` defaults to the stream's."""
        parts = list(batches)
        if not parts:
            raise ValueError("InMemoryDataset.from_batches: the stream yielded no batches")
        # the stream's declared batch size (a plain attribute), else that of its first batch
        size = batch_size if batch_size is not None else getattr(batches, "batch_size", parts[0].batch_size)
        return cls(Batch.concat(parts), size, **kwargs)

    @classmethod
    def from_arrow(cls, table, schema: Schema, batch_size: int, *, on_bad_row: str = "raise",
                   fill_missing_dense: float | None = None, log1p_dense: bool = False,
                   name: str = "<arrow table>", **kwargs) -> InMemoryDataset:
        """The rows of an Arrow table or record batch whose columns the `schema` names (others
        are ignored), converted as the file readers convert them. Bad rows raise `BadRowError`
        (row numbered from 1, as in files; `name` stands for the file) or, with
        ``on_bad_row="skip"``, are dropped and counted in ``bad_rows``. Other keywords: see the
        constructor (``shuffle``, ``seed``, ``drop_remainder``)."""
        owner = "InMemoryDataset.from_arrow"
        check_type(owner, "table", table, (pa.Table, pa.RecordBatch), allowed="a pyarrow Table or RecordBatch")
        check_type(owner, "schema", schema, Schema, allowed="a recstream.data.Schema")
        handler = BadRowHandler(on_bad_row, None, owner)
        converter = ColumnConverter(schema, fill_missing_dense, log1p_dense, owner=owner)
        batch, faults = converter.convert(table)
        handler.start_pass()
        handler.handle([BadRow(name, f.index + 1, f.reason, f.column, f.detail, None) for f in faults])
        if batch.batch_size == 0:
            raise ValueError(f"{owner}: no usable row in {name} ({table.num_rows} rows, {len(faults)} bad)")
        dataset = cls(batch, batch_size, schema=schema, **kwargs)
        dataset.bad_rows = dict(handler.counts)
        return dataset

    @classmethod
    def from_pandas(cls, frame, schema: Schema, batch_size: int, **kwargs) -> InMemoryDataset:
        """`from_arrow` of a pandas DataFrame (its index is not a column); needs pandas installed."""
        if not (hasattr(frame, "columns") and hasattr(frame, "dtypes")):
            raise TypeError(f"InMemoryDataset.from_pandas: 'frame' must be a pandas DataFrame, got "
                            f"{type(frame).__name__}")
        return cls.from_arrow(pa.Table.from_pandas(frame, preserve_index=False), schema, batch_size,
                              name=kwargs.pop("name", "<DataFrame>"), **kwargs)

    @property
    def num_rows(self) -> int:
        return self.data.batch_size

    def get_dataset_size(self) -> int:
        full, rest = divmod(self.num_rows, self.batch_size)
        return full + (1 if rest and not self.drop_remainder else 0)

    def __len__(self) -> int:
        return self.get_dataset_size()

    def __iter__(self) -> Iterator[Batch]:
        n, bs = self.num_rows, self.batch_size
        stop = n - n % bs if self.drop_remainder else n
        if self.shuffle:  # a new order each pass, reproducible from (seed, pass number)
            order = np.random.default_rng([self.seed, self._epoch]).permutation(n)
            self._epoch += 1
            for start in range(0, stop, bs):
                yield self.data.take(order[start: start + bs])
        else:
            for start in range(0, stop, bs):
                yield self.data.slice(start, start + bs)

    def __repr__(self) -> str:
        return f"InMemoryDataset(rows={self.num_rows}, batch_size={self.batch_size}, shuffle={self.shuffle})"
