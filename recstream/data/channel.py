"""DataChannel: the one prefetcher of recstream (sink mode and `Prefetcher` use it).

A producer thread iterates the dataset, optionally pins each batch and copies it to the device
(non-blocking, on a side CUDA stream, with an event the consumer's stream waits on), and puts it
in a bounded queue; the consumer `get()`s batches in order. Data preparation thus overlaps
compute. With ``background=False`` the same producer runs inline, inside `get()`: for CPU
training that already uses every core, where a producer thread has no core of its own and its
torch ops and Python only contend with the training step (figures: docs/benchmarks.md).
Streams report their position after each batch (`Marks`: ``dataset.position()``, read in the
producing thread right after the batch) and it travels with the batch, so a checkpoint records
what was trained, not what was prefetched.

The rules of one walk over a dataset are here too, in one place: `traverse` (passes, resets, an
endless walk) and `EndOfStream` (what a pass that yields nothing means).

>>> channel = DataChannel([1, 2, 3], passes=1)
>>> [channel.get().batch for _ in range(3)], channel.get() is END_OF_PASS
([1, 2, 3], True)
>>> channel.close()
"""
from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import Enum

import torch

from ..validation import check_bool, check_int, check_type
from .protocol import MetadataDataset, SeekableDataset, interrupt, reset
from .transfer import pin_memory as pin
from .transfer import record_stream, to_device

log = logging.getLogger("recstream.data")


def available_cores() -> int:
    """Cores this process may run on (the affinity mask, e.g. a container's limit)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)

END_OF_PASS = object()  # after each full pass (when `passes` is given)
DONE = object()         # the producer has nothing more to give
STOPPED = object()      # the consumer's `should_stop()` became true while it waited


class _ProducerError:
    def __init__(self, exc: BaseException):
        self.exc = exc


class Item:
    """A batch on its way to the device, with the source position just after it and its metadata."""
    __slots__ = ("batch", "event", "position", "meta")

    def __init__(self, batch, event, position, meta):
        self.batch, self.event, self.position, self.meta = batch, event, position, meta


class Marks:
    """What a dataset reports after each batch: its position (`SeekableDataset`) and the batch's
    metadata (`MetadataDataset`), read in the iterating thread right after the batch (the
    protocol: later, a prefetching reader may have moved on). The one place they are read.

    >>> Marks([1, 2]).item(1).position is None
    True
    """
    __slots__ = ("_position", "_meta")

    def __init__(self, dataset):
        self._position = dataset.position if isinstance(dataset, SeekableDataset) else None
        self._meta = dataset.last_batch_meta if isinstance(dataset, MetadataDataset) else None

    def item(self, batch) -> Item:
        """`batch` with the position and metadata the dataset reports now."""
        return Item(batch, None, self._position() if self._position is not None else None,
                    self._meta() if self._meta is not None else None)


class EndOfStream(Enum):
    """What a pass of a dataset that yields no batch means (unless a stop request emptied it).

    - ``NEVER`` (offline training): the data never ends. An empty first pass is a mistake (an
      empty dataset: 0 steps trained in silence would look like a finished run); in an endless
      walk any empty pass is (it would spin); a later epoch's empty pass (a one-shot iterator's
      second epoch) trains nothing.
    - ``AFTER_DATA`` (online training on a dataset that is not a stream): an empty pass after
      earlier batches means the source has ended; an empty first pass is still a mistake.
    - ``EMPTY_PASS`` (online training on a stream, whose iteration ends only when its source
      has): any empty pass means the source has ended; a first one, that it had nothing new.

    >>> EndOfStream.AFTER_DATA.empty_pass(passes_before=1), EndOfStream.EMPTY_PASS.empty_pass(0)
    (True, True)
    """

    NEVER = "never"
    AFTER_DATA = "after_data"
    EMPTY_PASS = "empty_pass"

    def empty_pass(self, passes_before: int, name: str = "train_dataset", endless: bool = False) -> bool:
        """Whether an empty pass after `passes_before` passes with batches ends the source;
        `ValueError` (naming `name`) where it is a mistake. `endless`: a walk without epochs."""
        if self is EndOfStream.EMPTY_PASS or (self is EndOfStream.AFTER_DATA and passes_before):
            return True
        if endless and self is EndOfStream.NEVER:
            raise ValueError(f"'{name}' yielded no batch in a pass: it is empty, or a one-shot iterator "
                             "(e.g. a generator) that cannot be traversed again; pass a re-iterable dataset")
        if not passes_before:
            raise empty_first_pass(name)
        return False


def _one_pass(dataset) -> Iterator:
    it = iter(dataset)
    try:
        yield from it
    finally:  # a reader's generator closes its files now, not whenever GC gets to it
        close = getattr(it, "close", None)
        if callable(close):
            close()


def put_unless_stopped(q: queue.Queue, item, stop: threading.Event) -> bool:
    """Put `item` into the bounded queue `q`, waiting in short slices so that a `stop` set meanwhile
    (the consumer closing) ends the wait; False when stopped. The producer threads' one put."""
    while not stop.is_set():
        try:
            q.put(item, timeout=0.05)
            return True
        except queue.Full:
            continue
    return False


def empty_first_pass(name: str) -> ValueError:
    """The error for a first pass that yields nothing: an empty dataset offline, or online one that
    is not a stream (a stream's empty first pass online means "nothing new")."""
    return ValueError(f"'{name}' yielded no batch at all: it is empty, or a one-shot iterator (e.g. a generator) "
                      "already consumed; a recstream stream that ends before its first batch ends training "
                      "instead (nothing new)")


def traverse(dataset, passes: int | None = None, end: EndOfStream = EndOfStream.NEVER, stopped=None,
             reset_after_pass: bool = True, name: str = "train_dataset") -> Iterator:
    """The one walk over `dataset`: `passes` passes, each followed by `END_OF_PASS` (and
    ``reset()`` with `reset_after_pass`); ``passes=None``: endlessly, ``reset()`` between passes,
    no markers, an empty pass judged by `end` (``endless``): it ends the walk or raises. `stopped()`
    true ends an endless walk (the channel is closing).

    >>> list(traverse([1, 2], passes=2)) == [1, 2, END_OF_PASS, 1, 2, END_OF_PASS]
    True
    """
    done = 0
    while passes is None or done < passes:
        if passes is not None:
            yield from _one_pass(dataset)
            yield END_OF_PASS
            if reset_after_pass:
                reset(dataset)
            done += 1
            continue
        if stopped is not None and stopped():
            return
        empty = True
        for batch in _one_pass(dataset):
            empty = False
            yield batch
        if empty and ((stopped is not None and stopped()) or end.empty_pass(done, name, endless=True)):
            return  # closing, or the source reported its end
        done += 1
        reset(dataset)


@dataclass(frozen=True)
class ChannelOptions:
    """How a `DataChannel` produces, beside what it walks (`passes`, `total`, `end`).

    Attributes:
        background: produce on a thread of its own (False: inline, inside `get()`).
        reset_after_pass: call ``dataset.reset()`` after each counted pass.
        pin_memory: page-lock batches before copying (None: when the device is CUDA).
        side_stream: copy to a CUDA device on a side stream, with an event the consumer's stream
            waits on (False: a non-blocking copy on the current stream, as a plain loop would).
        producer_threads: torch intra-op threads of the producer thread's own ops (the dataset's
            preparation, pinning). None: the cores training leaves free -- available cores minus
            the creating thread's ``torch.get_num_threads()`` -- at least 1. A producer that
            inherits training's thread count starts a second pool as wide as the first on cores
            that are already busy.
        name: the producer thread's name.
        ahead: called with each batch (as the dataset gave it, before pinning and the copy) by the
            producer before the batch is queued: on the producer's thread, while the steps of the
            batches before it train -- where a step's needs can be readied ahead (a disk-tiered
            table's rows: ``recstream.train.sink.batch_prefetch``). Inline (``background=False``)
            it runs inside `get()`, nothing ahead. Its error reaches the consumer as the dataset's.
    """

    background: bool = True
    reset_after_pass: bool = True
    pin_memory: bool | None = None
    side_stream: bool = True
    producer_threads: int | None = None
    name: str = "recstream-data-channel"
    ahead: Callable | None = None

    def __post_init__(self):
        check_bool("ChannelOptions", "background", self.background)
        check_bool("ChannelOptions", "reset_after_pass", self.reset_after_pass)
        check_bool("ChannelOptions", "pin_memory", self.pin_memory, allow_none=True)
        check_bool("ChannelOptions", "side_stream", self.side_stream)
        check_int("DataChannel", "producer_threads", self.producer_threads, minimum=1, allow_none=True)
        if self.ahead is not None and not callable(self.ahead):
            raise TypeError(f"ChannelOptions: 'ahead' must be callable or None, got {type(self.ahead).__name__}")


class DataChannel:
    """Prefetch `dataset` on a background thread, or produce inline (see the module docstring).

    Args:
        device: where batches go (None: left where they are).
        depth: batches ready ahead of the consumer.
        total: stop after this many batches (None: when the source ends).
        passes: traverse the dataset this many times with `END_OF_PASS` after each
            (None: endlessly, ``reset()`` between passes; see `traverse`).
        end: with ``passes=None``, what a pass that yields nothing means (`EndOfStream`): the
            walk ends (`DONE`), or it raises.
        options: a `ChannelOptions`; its fields may also be given as keywords
            (``background=False``), for the common cases.
    """

    def __init__(self, dataset, device=None, depth: int = 2, total: int | None = None, passes: int | None = None,
                 end: EndOfStream = EndOfStream.NEVER, options: ChannelOptions | None = None, **option_fields):
        check_int("DataChannel", "depth", depth, minimum=1)
        check_type("DataChannel", "end", end, EndOfStream)
        check_type("DataChannel", "options", options, ChannelOptions, allow_none=True)
        unknown = set(option_fields) - set(ChannelOptions.__dataclass_fields__)
        if unknown:
            raise TypeError(f"DataChannel: unexpected keyword argument(s) {sorted(unknown)}; allowed: 'options' or "
                            f"the fields of ChannelOptions {sorted(ChannelOptions.__dataclass_fields__)}")
        options = ChannelOptions(**{**(options.__dict__ if options else {}), **option_fields})
        self.device = torch.device(device) if device is not None else None
        cuda = self.device is not None and self.device.type == "cuda"
        self.pin_memory = cuda if options.pin_memory is None else options.pin_memory
        self._side_stream = torch.cuda.Stream(device=self.device) if cuda and options.side_stream else None
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._dataset = dataset
        self.done = False  # DONE was handed out: the producer has nothing more to give
        self._marks = Marks(dataset)
        self._ahead = options.ahead
        source = traverse(dataset, passes, end, self._stop.is_set, options.reset_after_pass)
        self._items = self._produce_items(source, total)
        self._thread = None
        if options.background:
            training_threads = torch.get_num_threads()
            self._producer_threads = options.producer_threads or max(1, available_cores() - training_threads)
            sized = threading.Event()
            self._thread = threading.Thread(target=self._produce, args=(sized,), daemon=True, name=options.name)
            self._thread.start()
            # torch.set_num_threads sets the calling thread's pool AND the default of threads started
            # later: once the producer has sized its own, put that default back (this thread keeps its
            # count either way).
            sized.wait()
            torch.set_num_threads(training_threads)

    # ------------------------------------------------------------------ producer
    def _prepare(self, batch) -> Item:
        item = self._marks.item(batch)  # read right after the batch, in the producing thread
        if self._ahead is not None:
            self._ahead(batch)
        if self.pin_memory:
            batch = pin(batch)
        if self.device is None:
            item.batch = batch
        elif self._side_stream is None:
            item.batch = to_device(batch, self.device, non_blocking=True)
        else:
            with torch.cuda.stream(self._side_stream):
                item.batch = to_device(batch, self.device, non_blocking=True)
                item.event = torch.cuda.Event()
                item.event.record(self._side_stream)
        return item

    def _put(self, item) -> bool:
        return put_unless_stopped(self._queue, item, self._stop)

    def _produce_items(self, source: Iterator, total: int | None) -> Iterator:
        """Items and markers in order, ending with `DONE` (the one producer, for both drivers)."""
        produced = 0
        if total is None or total > 0:
            for batch in source:
                if batch is END_OF_PASS:
                    yield END_OF_PASS
                    continue
                yield self._prepare(batch)
                produced += 1
                if total is not None and produced >= total:
                    break  # stop before pulling a batch nobody will train on
        yield DONE

    def _produce(self, sized: threading.Event):
        """The producer thread: the items into the queue; an error is handed to the consumer."""
        try:
            # get_num_threads first: a thread's first torch call resets its pool to the process default,
            # which would undo set_num_threads once the creating thread has put that default back.
            torch.get_num_threads()
            torch.set_num_threads(self._producer_threads)  # this thread's ops only (see producer_threads)
        finally:
            sized.set()
        try:
            for item in self._items:
                if not self._put(item):
                    return
        except BaseException as exc:  # handed to the consumer, which re-raises it
            self._put(_ProducerError(exc))

    # ------------------------------------------------------------------ consumer
    def get(self, should_stop=None):
        """The next `Item`, or a marker (`END_OF_PASS`, `DONE`, `STOPPED`). Re-raises producer errors.

        Waits in short slices, so that `should_stop()` (e.g. a SIGTERM's stop request) is honoured
        while an idle stream has no data, and a closed channel or a dead producer is reported.
        """
        if self.done:
            return DONE
        if self._thread is None:  # inline: produce the next item here
            if self._stop.is_set():
                raise RuntimeError("DataChannel: this pass was closed (close(), a with-block exit, "
                                   "or a newer iter())")
            item = next(self._items)
            self.done = item is DONE
            return item
        while True:
            if self._stop.is_set():
                raise RuntimeError("DataChannel: this pass was closed (close(), a with-block exit, "
                                   "or a newer iter())")
            try:
                item = self._queue.get(timeout=0.05)
                break
            except queue.Empty:
                if should_stop is not None and should_stop():
                    return STOPPED
                if not self._thread.is_alive() and self._queue.empty():
                    raise RuntimeError("DataChannel: the producer thread died without a message") from None
        if isinstance(item, _ProducerError):
            raise item.exc
        if item is DONE:
            self.done = True
        if isinstance(item, Item) and item.event is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_event(item.event)
            record_stream(item.batch, current)
        return item

    def close(self, timeout: float = 5.0) -> None:
        """Stop the producer and wait up to `timeout` s for it (draining the queue so a blocked
        put sees the flag). A producer blocked inside an idle source cannot see the flag until
        the source yields; it is a daemon thread, so it is left to end then, with a warning."""
        self._stop.set()
        if self._thread is None:
            self._items.close()  # the source's files close now
            return
        deadline = time.monotonic() + timeout
        while self._thread.is_alive() and time.monotonic() < deadline:
            # a producer waiting in an idle stream ends that wait (repeated: it may only be about
            # to enter the stream's iteration)
            interrupt(self._dataset)
            try:
                self._queue.get_nowait()
            except queue.Empty:
                self._thread.join(timeout=0.05)
        if self._thread.is_alive():
            log.warning("%s: the producer is still blocked in its source; it stops when the source yields",
                        self._thread.name)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()
