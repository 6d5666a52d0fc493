"""Input-pipeline stages: row-level shuffling across batches, and background prefetching.

>>> from recstream.data.synthetic import SyntheticCTR
>>> data = SyntheticCTR(num_dense=2, num_categorical=2, batch_size=32).train_batches(4)
>>> with Prefetcher(ShuffleBuffer(data, buffer_size=64, seed=1), depth=2) as batches:
...     sizes = [b.batch_size for b in batches]
>>> sizes
[32, 32, 32, 32]
"""
from __future__ import annotations

from typing import Any, Iterable, Iterator

import numpy as np
import torch

from .batch import Batch
from .channel import DataChannel, Item
from .rebatch import Rebatcher, check_batch_size


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
        if isinstance(buffer_size, bool) or not isinstance(buffer_size, int) or buffer_size < 1:
            raise ValueError(f"ShuffleBuffer: 'buffer_size' must be an int >= 1 (rows), got {buffer_size!r}")
        if not isinstance(dataset, Iterable):
            raise TypeError(f"ShuffleBuffer: 'dataset' must be an iterable of Batch, got {type(dataset).__name__}")
        self.dataset, self.buffer_size, self.seed = dataset, buffer_size, int(seed)
        size = batch_size if batch_size is not None else getattr(dataset, "batch_size", None)
        self.batch_size = None if size is None else check_batch_size(size, "ShuffleBuffer")
        self.drop_remainder = bool(drop_remainder)
        self.schema = getattr(dataset, "schema", None)
        self._epoch = 0

    def get_dataset_size(self) -> int | None:
        """The source's size when batch sizes match (rows are only reordered), else None."""
        get = getattr(self.dataset, "get_dataset_size", None)
        same = self.batch_size == getattr(self.dataset, "batch_size", None)
        same &= self.drop_remainder == getattr(self.dataset, "drop_remainder", False)
        return get() if callable(get) and same else None

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
    :meth:`close` or on leaving a ``with`` block; a producer exception is re-raised in the consumer.
    """

    def __init__(self, iterable: Iterable, depth: int = 2, device: torch.device | str | None = None,
                 pin_memory: bool | None = None) -> None:
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise ValueError(f"Prefetcher: 'depth' must be an int >= 1, got {depth!r}")
        if not isinstance(iterable, Iterable):
            raise TypeError(f"Prefetcher: 'iterable' must be iterable, got {type(iterable).__name__}")
        self.iterable, self.depth = iterable, depth
        self.device = torch.device(device) if device is not None else None
        cuda = self.device is not None and self.device.type == "cuda"
        self.pin_memory = cuda if pin_memory is None else bool(pin_memory)
        self.batch_size = getattr(iterable, "batch_size", None)
        self.schema = getattr(iterable, "schema", None)
        self._channel: DataChannel | None = None

    def get_dataset_size(self) -> int | None:
        get = getattr(self.iterable, "get_dataset_size", None)
        return get() if callable(get) else None

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
