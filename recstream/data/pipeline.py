"""Input-pipeline stages: exact re-batching, row-level shuffling across batches, background prefetching.

* `Rebatcher`: batches of any sizes in, batches of exactly ``batch_size`` rows out
  (the readers' record batches follow the file layout and shrink when bad rows are skipped);
* `ShuffleBuffer`: shuffles rows across batches with a bounded buffer;
* `Prefetcher`: pulls batches in a background thread, optionally onto a device.

Each keeps the dataset capabilities that still hold after it (``get_dataset_size()`` of the
source, see `recstream.data.protocol`).

>>> from recstream.data.synthetic import SyntheticCTR
>>> data = SyntheticCTR(num_dense=2, num_categorical=2, batch_size=32).train_batches(4)
>>> with Prefetcher(ShuffleBuffer(data, buffer_size=64, seed=1), depth=2) as batches:
...     sizes = [b.batch_size for b in batches]
>>> sizes
[32, 32, 32, 32]
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import torch

from ..validation import check_bool, check_int, check_type
from .batch import Batch
from .channel import DataChannel, Item
from .protocol import SizedDataset, dataset_size


class Rebatcher:
    """Accumulates batches and yields ``batch_size``-row batches (the last may be short).

    Keeps at most ``batch_size`` + one incoming batch of rows in memory.

    >>> import torch
    >>> from recstream.features import Features
    >>> def rows(n):
    ...     return Batch(Features.from_lengths(torch.zeros(n, 1), torch.zeros(0), torch.zeros(0, n)), torch.zeros(n))
    >>> r = Rebatcher(4, drop_remainder=False)
    >>> [b.batch_size for b in [*r.add(rows(3)), *r.add(rows(6)), *r.flush()]]
    [4, 4, 1]
    """

    def __init__(self, batch_size: int, drop_remainder: bool = False) -> None:
        self.batch_size = check_int("Rebatcher", "batch_size", batch_size, minimum=1)
        self.drop_remainder = check_bool("Rebatcher", "drop_remainder", drop_remainder)
        self._pending: list[Batch] = []
        self._rows = 0

    def add(self, batch: Batch) -> Iterator[Batch]:
        """Queue `batch`; yield every full batch now available."""
        n = batch.batch_size
        if n == 0:
            return
        if not self._pending and n == self.batch_size:  # the common case: pass through untouched
            yield batch
            return
        self._pending.append(batch)
        self._rows += n
        if self._rows < self.batch_size:
            return
        merged = Batch.concat(self._pending)
        full = self._rows - self._rows % self.batch_size
        for start in range(0, full, self.batch_size):
            yield merged.slice(start, start + self.batch_size)
        self._pending = [merged.slice(full, self._rows)] if full < self._rows else []
        self._rows -= full

    def flush(self) -> Iterator[Batch]:
        """End of stream: yield the short remainder unless ``drop_remainder``; then reset."""
        pending, rows = self._pending, self._rows
        self._pending, self._rows = [], 0
        if rows and not self.drop_remainder:
            yield Batch.concat(pending)


class ShuffleBuffer:
    """Shuffle rows across incoming batches with a bounded buffer, then re-batch.

    Rows collect in a pool; whenever it holds ``buffer_size + max(buffer_size, batch_size)``
    rows, it is permuted, everything beyond ``buffer_size`` rows is emitted and the rest
    waits to mix with the next rows (so each row is emitted after a random, mostly short,
    stay). Work per row is O(1) amortized; memory is at most ~2x ``buffer_size`` rows plus one
    incoming batch. Each pass uses a new order, reproducible from ``(seed, pass number)``.
    """

    def __init__(self, dataset: Iterable[Batch], buffer_size: int, seed: int = 0, *,
                 batch_size: int | None = None, drop_remainder: bool = False) -> None:
        self.dataset = check_type("ShuffleBuffer", "dataset", dataset, Iterable, allowed="an iterable of Batch")
        self.buffer_size = check_int("ShuffleBuffer", "buffer_size", buffer_size, minimum=1)  # rows
        self.seed = check_int("ShuffleBuffer", "seed", seed, minimum=0)
        check_int("ShuffleBuffer", "batch_size", batch_size, minimum=1, allow_none=True)
        # batch_size and schema are plain descriptive attributes of a source, not capabilities
        self.batch_size = batch_size if batch_size is not None else getattr(dataset, "batch_size", None)
        self.drop_remainder = check_bool("ShuffleBuffer", "drop_remainder", drop_remainder)
        self.schema = getattr(dataset, "schema", None)
        self._epoch = 0

    def get_dataset_size(self) -> int | None:
        """The source's size when batch sizes match (rows are only reordered), else None."""
        same = self.batch_size == getattr(self.dataset, "batch_size", None)
        same &= self.drop_remainder == getattr(self.dataset, "drop_remainder", False)
        return self.dataset.get_dataset_size() if same and isinstance(self.dataset, SizedDataset) else None

    def __iter__(self) -> Iterator[Batch]:
        rng = np.random.default_rng([self.seed, self._epoch])
        self._epoch += 1
        pool, rows, out = [], 0, None
        for batch in self.dataset:
            if not isinstance(batch, Batch):
                raise TypeError(f"ShuffleBuffer: the dataset must yield recstream.data.Batch, "
                                f"got {type(batch).__name__}")
            if out is None:  # the first batch fixes the output size unless it was given
                out = Rebatcher(self.batch_size or batch.batch_size, self.drop_remainder)
            pool.append(batch)
            rows += batch.batch_size
            if rows >= self.buffer_size + max(self.buffer_size, out.batch_size):
                merged = Batch.concat(pool)
                order = rng.permutation(rows)
                keep = merged.take(order[: self.buffer_size])
                yield from out.add(merged.take(order[self.buffer_size:]))
                pool, rows = [keep], self.buffer_size
        if rows:
            yield from out.add(Batch.concat(pool).take(rng.permutation(rows)))
        if out is not None:
            yield from out.flush()


_END = object()


class Prefetcher:
    """Pull batches from `iterable` in a background thread, `depth` ahead of the consumer.

    With a `device`, batches are (optionally) pinned and copied there by the thread with
    ``non_blocking=True``; on CUDA the copies run on a side stream and the consumer's
    stream waits on an event, so the copy of batch i+1 overlaps the step on batch i.
    ``pin_memory`` defaults to True exactly when `device` is a CUDA device.

    Each ``iter()`` starts a fresh pass (and thread) of a `DataChannel`. The thread stops when
    the pass ends, when the consumer stops iterating (the generator is closed), on
    `close` or on leaving a ``with`` block; a producer exception is re-raised in the consumer.
    """

    def __init__(self, iterable: Iterable, depth: int = 2, device: torch.device | str | None = None,
                 pin_memory: bool | None = None) -> None:
        self.iterable = check_type("Prefetcher", "iterable", iterable, Iterable, allowed="an iterable (of batches)")
        self.depth = check_int("Prefetcher", "depth", depth, minimum=1)
        check_type("Prefetcher", "device", device, (torch.device, str), allowed="a torch.device or str",
                   allow_none=True)
        self.device = torch.device(device) if device is not None else None
        cuda = self.device is not None and self.device.type == "cuda"
        self.pin_memory = cuda if pin_memory is None else check_bool("Prefetcher", "pin_memory", pin_memory)
        self.batch_size = getattr(iterable, "batch_size", None)  # descriptive attributes of the source
        self.schema = getattr(iterable, "schema", None)
        self._channel: DataChannel | None = None

    def get_dataset_size(self) -> int | None:
        """The source's size: prefetching changes no batch."""
        return dataset_size(self.iterable)

    def __iter__(self) -> Iterator[Any]:
        # a generator: the thread starts on the first next() and is stopped in `finally`,
        # which also runs when the consumer breaks out of its loop or raises
        self.close()  # one pass at a time
        channel = DataChannel(self.iterable, self.device, self.depth, passes=1, reset_after_pass=False,
                              pin_memory=self.pin_memory, name="recstream-prefetch")
        self._channel = channel
        try:
            while isinstance(item := channel.get(), Item):
                yield item.batch
        finally:
            channel.close()

    def close(self) -> None:
        """Stop the current pass's thread (if any) and wait for it."""
        if self._channel is not None:
            self._channel.close()

    def __enter__(self) -> Iterator[Any]:
        return iter(self)

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

