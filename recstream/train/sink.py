"""Sink execution: batches reach the device through a channel, and several steps run per host
round-trip (the contract is in docs/semantics.md, "Sink mode").

The pieces, each in one place:

- `recstream.data.channel.DataChannel`: a background thread pulls batches from the dataset, pins
  them and copies them to the device (non-blocking, on a side CUDA stream) into a bounded queue,
  so data preparation overlaps compute, on CPU as on GPU.
- `Sink`: the batches of one sink, and `Sink.run` — **the sink loop**, which runs a step network
  on each of them and keeps only the last outputs on the device.
- `BatchStep`: one batch as one step (normal mode), with the same surface as a `Sink`, so the
  training loop (`Model._train_loop`) handles both modes with one code path.
- `DatasetHelper(dataset, dataset_sink_mode, sink_size, epoch_num)`: what the loop iterates,
  always from one producer (a `DataChannel`: on its thread, or inline). ``steps()`` yields one
  `BatchStep` per batch in normal mode and exactly ONE `Sink` per epoch in sink mode
  (`sink_size` batches; the full pass when ``sink_size=-1``). Iterating the helper itself gives
  MindSpore's view: each batch's columns, or ``(sink,)``.
- `connect_network_with_dataset(network, helper)`: for hand-written loops, a network that
  consumes one `Sink` per call (in sink mode) and returns the last step's outputs.

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

from collections.abc import Callable, Iterator
from dataclasses import replace

import torch
from torch import nn

from ..data.batch import loss_weight
from ..data.channel import ChannelOptions, DataChannel, EndOfStream, Item, available_cores
from ..data.protocol import InterruptibleDataset, dataset_size, unpack
from ..features import Features
from ..validation import check_bool, check_int, check_type


class BatchStep:
    """One batch run as one step: the normal-mode counterpart of a `Sink`.

    `position` is the source position right after this batch (streams), `metas` its metadata.
    """

    __slots__ = ("first", "position", "metas")
    planned = 1  # batches the step is expected to train
    count = 1    # batches it trained
    trained = trained_position = None  # one batch: no partial progress to record if it raises

    def __init__(self, batch, position=None, metas=()):
        self.first, self.position, self.metas = batch, position, metas

    def run(self, network: nn.Module, observers=()):
        if observers and loss_weight(self.first) != 0.0:  # a fill batch (weighted 0) is no event
            for observe in observers:
                observe(self.first)
        args, kwargs = unpack(self.first)
        return network(*args, **kwargs)


class Sink:
    """The batches of one sink, pulled lazily from the channel. `first` peeks at the first one.

    `planned` is the advertised number of batches (`DatasetHelper.sink_size()`); after `run` (or
    iteration), `count` is how many were handed out — fewer when a finite source ran dry —,
    `position` the source position just after the last of them and `metas` their metadata.
    """

    def __init__(self, channel: DataChannel, size: int | None, should_stop=None, planned: int = 0):
        self._channel, self._size, self._should_stop = channel, size, should_stop
        self._first: Item | None = None
        self.planned = planned
        self.count = 0
        self.exhausted = False
        self.position = None
        self.metas: list = []
        self.trained, self.trained_position = 0, None  # batches whose step returned, and their position

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

    def run(self, network: nn.Module, observers=()):
        """The sink loop: one step of `network` per batch; returns the last step's outputs.

        The outputs stay on the device: nothing here reads them, so the host does not wait for
        the device between the steps of a sink (a callback reads the loss once per sink, if at all).
        `observers` (``cb_params.batch_observers``) see every batch just before it trains: the
        one way a callback sees each batch of a sink (e.g. test-then-train scoring).
        """
        outputs = None
        for batch in self:
            if observers and loss_weight(batch) != 0.0:  # a fill batch (weighted 0) is no event
                for observe in observers:
                    observe(batch)
            args, kwargs = unpack(batch)
            outputs = network(*args, **kwargs)
            # what is trained so far: if a later batch raises, the exception checkpoint records
            # this (the weights hold these batches), not the position from before the sink
            self.trained, self.trained_position = self.count, self.position
        return outputs


class DatasetHelper:
    """Iterate a dataset the way the training loop consumes it (see the module docstring).

    Every batch comes from one producer, a `DataChannel`: in sink mode on its thread (or inline,
    where training uses every core), in normal mode inline, in this thread, one pass per epoch.
    ``sink_size > 0`` traverses the dataset endlessly, each epoch continuing where the last
    stopped; ``sink_size=-1`` makes each sink one full pass. `epoch_num` bounds the total
    prefetched (None: unbounded, for online training). `end` (`EndOfStream`) says what a pass
    without batches means: a mistake (offline), or the source's end (online; `ended`).
    `prefetch`: batches the sink's producer keeps ready. `ahead` (`batch_prefetch`): called with
    each batch before its step, on a producer thread (in both modes, then) while earlier steps train.
    """

    def __init__(self, dataset, dataset_sink_mode: bool = True, sink_size: int = -1,
                 epoch_num: int | None = 1, device=None, end: EndOfStream = EndOfStream.NEVER, prefetch: int = 2,
                 ahead: Callable | None = None):
        self._channel: DataChannel | None = None
        self._ahead = ahead
        check_bool("DatasetHelper", "dataset_sink_mode", dataset_sink_mode)
        check_sink_size("DatasetHelper", sink_size)
        self.dataset = dataset
        self.dataset_sink_mode = dataset_sink_mode
        self._sink_size = sink_size
        self.epoch_num = epoch_num
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.prefetch = prefetch
        self.steps_done = 0
        self.end = check_type("DatasetHelper", "end", end, EndOfStream)
        self._passes_seen = 0
        self._ended = False
        self.should_stop = None  # set by the training loop: lets a stop interrupt a wait for data
        if dataset_sink_mode and sink_size == -1 and dataset_size(dataset) is None:
            raise ValueError("DatasetHelper: 'sink_size' must be > 0 in sink mode when the dataset cannot report "
                             f"its size (got sink_size=-1 for a {type(dataset).__name__} without "
                             "len()/get_dataset_size())")

    def sink_size(self) -> int:
        """Batches per sink (the dataset's size when ``sink_size=-1``)."""
        if self._sink_size > 0:
            return self._sink_size
        return dataset_size(self.dataset) or 0

    def _background(self) -> bool:
        """Prefetch on a thread, or produce inline? A thread pays where it overlaps something: a
        copy to an accelerator, a stream that must stay interruptible while idle, or a CPU core that
        training leaves free. On a CPU whose cores all compute, the thread's torch ops and Python only
        contend with the step (figures: benchmarks/bench_overhead.py)."""
        if self.device.type != "cpu" or isinstance(self.dataset, InterruptibleDataset) or self._ahead is not None:
            return True  # (`ahead`: readying a batch's rows overlaps disk waits, not only compute)
        return torch.get_num_threads() < available_cores()

    def _open(self) -> DataChannel:
        """The sink's producer, for the whole run."""
        if self._channel is None:
            options = ChannelOptions(background=self._background(), ahead=self._ahead)
            if self._sink_size > 0:
                total = None if self.epoch_num is None else self.epoch_num * self._sink_size
                self._channel = DataChannel(self.dataset, self.device, self.prefetch, total=total, end=self.end,
                                            options=options)
            else:
                self._channel = DataChannel(self.dataset, self.device, self.prefetch, passes=self.epoch_num,
                                            options=options)
        return self._channel

    def _pass(self, device) -> DataChannel:
        """Normal mode's producer: one pass, inline, in this thread (the position is read right after
        each batch, here), on the current CUDA stream as a plain loop copies; the loop resets. With
        `ahead`, on a thread instead (the position read there, right after each batch, as in sink
        mode), so that each batch is readied while the steps before it train."""
        if self._ahead is not None:
            return DataChannel(self.dataset, device, self.prefetch, passes=1,
                               options=replace(_ONE_PASS, background=True, ahead=self._ahead))
        return DataChannel(self.dataset, device, passes=1, options=_ONE_PASS)

    @property
    def ended(self) -> bool:
        """The source has ended (online, see `end`): no step will come any more."""
        return self._ended or (self._channel is not None and self._channel.done)

    def _sink(self) -> Sink:
        size = self._sink_size if self._sink_size > 0 else None
        return Sink(self._open(), size, self.should_stop, planned=self.sink_size())

    def steps(self) -> Iterator[BatchStep | Sink]:
        """One epoch of steps: a `BatchStep` per batch, or one `Sink` in sink mode."""
        if self.dataset_sink_mode:
            sink = self._sink()
            if sink.first is None and not self._channel.done:  # (the loop reads `first` first too)
                self._empty_pass()  # a whole-pass sink's pass was empty (an endless walk judged its own)
            self._passes_seen += 1
            yield sink
            self.steps_done += sink.count  # resumed after the loop ran the sink
            return
        channel = self._pass(self.device if self.device.type != "cpu" else None)  # CPU batches: used in place
        empty = True
        try:
            while isinstance(item := channel.get(), Item):
                empty = False
                self.steps_done += 1
                if item.position is None:
                    yield BatchStep(item.batch)
                else:
                    yield BatchStep(item.batch, item.position, [item.meta] if item.meta is not None else [])
        finally:
            channel.close()
        if empty:
            self._empty_pass()
        self._passes_seen += 1

    def _empty_pass(self) -> None:
        """A pass without batches: the source's end, nothing, or a mistake (`EndOfStream`); nothing
        at all when a stop request emptied it."""
        if not (self.should_stop is not None and self.should_stop()):
            self._ended = self.end.empty_pass(self._passes_seen, "train_dataset") or self._ended

    def __iter__(self):
        """MindSpore's view: each batch (normal mode), or ``(sink,)`` once per epoch (sink mode)."""
        if not self.dataset_sink_mode:
            channel = self._pass(None)
            try:
                while isinstance(item := channel.get(), Item):
                    self.steps_done += 1
                    yield item.batch
            finally:
                channel.close()
            return
        yield (self._sink(),)

    def release(self) -> None:
        """Stop the background producer (training ended or was stopped)."""
        if self._channel is not None:
            self._ended = self._ended or self._channel.done  # `ended` still answers after the release
            self._channel.close()
            self._channel = None

    def __del__(self):
        self.release()


# normal mode: inline, no reset (the loop resets between epochs), no pinning or side stream
_ONE_PASS = ChannelOptions(background=False, reset_after_pass=False, pin_memory=False, side_stream=False)


class SinkNetwork(nn.Module):
    """Runs a whole sink through a step network; returns the last step's outputs (on device)."""

    def __init__(self, network: nn.Module, helper: DatasetHelper):
        super().__init__()
        self.network = network
        self._helper = helper

    def forward(self, sink: Sink):
        outputs = sink.run(self.network)
        self._helper.steps_done += sink.count
        return outputs


def batch_prefetch(network: nn.Module) -> Callable | None:
    """The `DatasetHelper` ``ahead`` hook of `network`: each module's ``batch_prefetcher()`` (an
    `EmbeddingBagCollection` with disk-tiered tables returns one; others None or no such method)
    applied to every `Features` of a batch (the batch's parts, as the network is called with them).
    None when no module has one: nothing to ready, no thread for it.

    >>> batch_prefetch(torch.nn.Linear(2, 1)) is None
    True
    """
    prefetchers = []
    for module in network.modules():
        make = getattr(module, "batch_prefetcher", None)
        prefetcher = make() if callable(make) else None
        if prefetcher is not None:
            prefetchers.append(prefetcher)
    if not prefetchers:
        return None

    def ahead(batch) -> None:
        args, kwargs = unpack(batch)
        for part in (*args, *kwargs.values()):
            if isinstance(part, Features):
                for prefetch in prefetchers:
                    prefetch(part)

    return ahead


def connect_network_with_dataset(network: nn.Module, dataset_helper: DatasetHelper) -> nn.Module:
    """In sink mode, a network that consumes one `Sink` per call; otherwise `network` itself."""
    if not isinstance(dataset_helper, DatasetHelper):
        raise TypeError("connect_network_with_dataset: 'dataset_helper' must be a DatasetHelper, "
                        f"got {type(dataset_helper).__name__}")
    return SinkNetwork(network, dataset_helper) if dataset_helper.dataset_sink_mode else network


def check_sink_size(owner: str, sink_size) -> int:
    """-1 (a full pass per sink) or a positive int."""
    check_int(owner, "sink_size", sink_size)
    if sink_size == 0 or sink_size < -1:
        raise ValueError(f"{owner}: 'sink_size' must be -1 (a full pass per epoch) or a positive int, "
                         f"got {sink_size!r}")
    return sink_size
