"""Each rank's part of a dataset, so one script serves ``python`` and ``torchrun`` alike.

`shard(dataset)` is the dataset itself in a plain process. On N ranks it yields, from each
batch of the dataset, rank r's contiguous slice of rows ``[r * B / N, (r + 1) * B / N)``: the N
ranks together train exactly the global batch that one process trains, step for step, so losses
and weights match a single-process run. Every rank reads every batch (cheap for in-memory and
generated data); a stream instead gives each rank its own partitions or files.

>>> import torch
>>> batches = [(torch.arange(4.0).view(4, 1), torch.zeros(4))]
>>> shard(batches) is batches  # one process: unchanged
True
>>> part = RowShard(batches, rank=1, world_size=2)
>>> [x.view(-1).tolist() for x, _ in part]
[[2.0, 3.0]]
"""
from __future__ import annotations

from collections.abc import Iterator

import torch

from ..data.protocol import dataset_size, reset
from ..data.transfer import map_tensors
from ..features import Features
from ..validation import check_int
from .context import is_distributed, rank, world_size


def shard(dataset):
    """`dataset` split by rows across the ranks (see the module docstring); itself on one rank."""
    return RowShard(dataset, rank(), world_size()) if is_distributed() else dataset


class RowShard:
    """Rank `rank`'s rows of every batch of `dataset` (tensors, tuples, dicts, `Batch`, `Features`)."""

    def __init__(self, dataset, rank: int, world_size: int):
        self.world_size = check_int("RowShard", "world_size", world_size, minimum=1)
        self.rank = check_int("RowShard", "rank", rank, minimum=0, maximum=world_size - 1)
        self.dataset = dataset

    def __len__(self) -> int:
        size = dataset_size(self.dataset)
        if size is None:
            raise TypeError(f"RowShard: the sharded {type(self.dataset).__name__} has no size")
        return size

    def reset(self) -> None:
        reset(self.dataset)

    def __iter__(self) -> Iterator:
        for batch in self.dataset:
            yield self._rows(batch)

    def _rows(self, batch):
        rows = _batch_rows(batch)
        if rows % self.world_size:
            raise ValueError(f"RowShard: a batch of {rows} rows does not split evenly over {self.world_size} "
                             "ranks; use a global batch size divisible by the number of ranks")
        part = rows // self.world_size
        start, stop = self.rank * part, (self.rank + 1) * part
        return _slice(batch, start, stop)


def _batch_rows(batch) -> int:
    if isinstance(batch, Features):
        return batch.batch_size
    if isinstance(batch, torch.Tensor):
        return batch.shape[0]
    if isinstance(batch, dict):
        return _batch_rows(next(iter(batch.values())))
    if isinstance(batch, (tuple, list)):
        return _batch_rows(batch[0])
    raise TypeError(f"RowShard: cannot split a batch element of type {type(batch).__name__} by rows")


def _slice(batch, start: int, stop: int):
    if isinstance(batch, Features):  # its ids are ragged: rows are not a slice of each tensor
        return batch.slice(start, stop)
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # NamedTuple (e.g. data.Batch)
        return type(batch)(*(_slice(x, start, stop) for x in batch))
    if isinstance(batch, (tuple, list)):
        return type(batch)(_slice(x, start, stop) for x in batch)
    if isinstance(batch, dict):
        return {k: _slice(v, start, stop) for k, v in batch.items()}
    return map_tensors(batch, lambda t: t[start:stop])
