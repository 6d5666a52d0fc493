"""Sink execution ("数据下沉", seed 003): batches reach the device through a channel, and several
steps run per host round-trip.

- `recstream.data.channel.DataChannel`: a background thread pulls batches from the dataset, pins
  them and copies them to the device (non-blocking, on a side CUDA stream) into a bounded queue.
  Data preparation then overlaps compute, on CPU as on GPU.
- `DatasetHelper(dataset, dataset_sink_mode, sink_size, epoch_num)`: iterating it yields one item
  per step in normal mode, and exactly ONE item per epoch in sink mode: a `Sink` of `sink_size`
  batches (the full pass when ``sink_size=-1``).
- `connect_network_with_dataset(network, helper)`: in sink mode, wraps a step network so that
  ``net(sink)`` runs every step of the sink and returns the last loss. The loss stays on the
  device: the host reads it (if at all) once per sink, in a callback.

>>> import torch
>>> from recstream.train import TrainOneStepCell, WithLossCell
>>> net = torch.nn.Linear(4, 2)
>>> step = TrainOneStepCell(WithLossCell(net, torch.nn.CrossEntropyLoss()),
...                         torch.optim.SGD(net.parameters(), lr=0.1))
>>> data = [(torch.randn(8, 4), torch.randint(0, 2, (8,))) for _ in range(5)]
>>> helper = DatasetHelper(data, dataset_sink_mode=True, sink_size=3, epoch_num=2)
>>> train = connect_network_with_dataset(step, helper)
>>> losses = [train(*inputs) for epoch in range(2) for inputs in helper]  # 2 sinks, 6 steps
>>> len(losses), helper.steps_done
(2, 6)
"""
from __future__ import annotations

from typing import Iterator

import torch
from torch import nn

from ..data.channel import DataChannel, Item
from .data_adapter import dataset_size, unpack

class Sink:
    """The batches of one sink, pulled lazily from the channel. `first` peeks at the first one.

    After iteration, `count` is the number of batches handed out, `position` the source position
    just after the last of them and `metas` their per-batch metadata (for streams that give them).
    """

    def __init__(self, channel: DataChannel, size: int | None, should_stop=None):
        self._channel, self._size, self._should_stop = channel, size, should_stop
        self._first: Item | None = None
        self.count = 0
        self.exhausted = False
        self.position = None
        self.metas: list = []

    @property
    def first(self):
        if self._first is None and not self.exhausted:
            self._first = self._next()
        return None if self._first is None else self._first.batch

    def _next(self) -> Item | None:
        if self._size is not None and self.count + (self._first is not None) >= self._size:
            return None
        item = self._channel.get(self._should_stop)
        if not isinstance(item, Item):  # end of pass, end of data, or a stop request
            self.exhausted = True
            return None
        return item

    def _hand_out(self, item: Item):
        self.count += 1
        if item.position is not None:
            self.position = item.position
        if item.meta is not None:
            self.metas.append(item.meta)
        return item.batch

    def __iter__(self) -> Iterator:
        if self.first is None:
            return
        first, self._first = self._first, None
        yield self._hand_out(first)
        while (item := self._next()) is not None:
            yield self._hand_out(item)


class DatasetHelper:
    """Iterate a dataset the way the training loop consumes it (see the module docstring).

    Normal mode yields each batch's columns; sink mode yields ``(sink,)`` once per epoch.
    ``sink_size > 0`` traverses the dataset endlessly, each epoch continuing where the last
    stopped; ``sink_size=-1`` makes each sink one full pass. `epoch_num` bounds the total
    prefetched (None: unbounded, for online training).
    """

    def __init__(self, dataset, dataset_sink_mode: bool = True, sink_size: int = -1,
                 epoch_num: int | None = 1, device=None, prefetch: int = 2):
        self._channel: DataChannel | None = None
        if not isinstance(dataset_sink_mode, bool):
            raise TypeError(f"'dataset_sink_mode' must be a bool, got {dataset_sink_mode!r}")
        check_sink_size(sink_size)
        self.dataset = dataset
        self.dataset_sink_mode = dataset_sink_mode
        self._sink_size = sink_size
        self.epoch_num = epoch_num
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.prefetch = prefetch
        self.steps_done = 0
        self.should_stop = None  # set by the training loop: lets a stop interrupt a wait for data
        if dataset_sink_mode and sink_size == -1 and dataset_size(dataset) is None:
            raise ValueError("'sink_size' must be > 0 in sink mode when the dataset cannot report its size "
                             f"(got sink_size=-1 for a {type(dataset).__name__} without len()/get_dataset_size())")

    def sink_size(self) -> int:
        """Batches per sink (the dataset's size when ``sink_size=-1``)."""
        if self._sink_size > 0:
            return self._sink_size
        return dataset_size(self.dataset) or 0

    def _open(self) -> DataChannel:
        if self._channel is None:
            if self._sink_size > 0:
                total = None if self.epoch_num is None else self.epoch_num * self._sink_size
                self._channel = DataChannel(self.dataset, self.device, self.prefetch, total=total)
            else:
                self._channel = DataChannel(self.dataset, self.device, self.prefetch, passes=self.epoch_num)
        return self._channel

    def __iter__(self):
        if not self.dataset_sink_mode:
            for batch in self.dataset:
                self.steps_done += 1
                yield batch
            return
        sink = Sink(self._open(), self._sink_size if self._sink_size > 0 else None, self.should_stop)
        yield (sink,)

    def release(self) -> None:
        """Stop the background producer (training ended or was stopped)."""
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    def __del__(self):
        self.release()


class SinkNetwork(nn.Module):
    """Runs a whole sink through a step network; returns the last step's outputs (on device)."""

    def __init__(self, network: nn.Module, helper: DatasetHelper):
        super().__init__()
        self.network = network
        self._helper = helper

    def forward(self, sink: Sink):
        outputs = None
        for batch in sink:
            args, kwargs = unpack(batch)
            outputs = self.network(*args, **kwargs)
        self._helper.steps_done += sink.count
        return outputs


def connect_network_with_dataset(network: nn.Module, dataset_helper: DatasetHelper) -> nn.Module:
    """In sink mode, a network that consumes one `Sink` per call; otherwise `network` itself."""
    if not isinstance(dataset_helper, DatasetHelper):
        raise TypeError(f"'dataset_helper' must be a DatasetHelper, got {type(dataset_helper).__name__}")
    return SinkNetwork(network, dataset_helper) if dataset_helper.dataset_sink_mode else network


def check_sink_size(sink_size) -> None:
    if isinstance(sink_size, bool) or not isinstance(sink_size, int) or sink_size == 0 or sink_size < -1:
        raise ValueError(f"'sink_size' must be -1 (a full pass per epoch) or a positive int, got {sink_size!r}")
