"""The batch and dataset protocol: the one place that says what a dataset and a batch may be.

**A dataset** is anything re-iterable that yields batches: a list, a ``torch.utils.data.DataLoader``,
a recstream reader or stream. It may also offer optional *capabilities*, each a small
``typing.Protocol`` below, tested with ``isinstance`` (never by probing attributes elsewhere):

======================  ============================================  ======================================
capability              methods                                       used by
======================  ============================================  ======================================
`SizedDataset`          ``get_dataset_size() -> int`` (or ``len()``)  ``batch_num``, sink mode with -1
`ResettableDataset`     ``reset()``                                   rewinding between epochs
`SeekableDataset`       ``position()``, ``seek(position)``            checkpoints and `RecModel.restore`
`CommittableDataset`    ``commit(position)``                          ModelCheckpoint, after a durable write
`MetadataDataset`       ``last_batch_meta() -> dict | None``          event times (freshness)
`BadRecordDataset`      ``bad_records``: live ``{reason: count}``     reporting skipped records
`InterruptibleDataset`  ``interrupt()`` (from another thread)         a prompt stop while idle
======================  ============================================  ======================================

**A batch** is one of:

- a tuple/list of columns, ``(data..., label)`` — NamedTuples such as `recstream.data.Batch` too;
- a dict of named columns, the label under ``"label"``;
- anything else (one tensor, a `Features`), passed to the network as its single argument.

`unpack` turns a batch into the ``(args, kwargs)`` the network is called with, and `split_label`
takes the label off them when a loss function needs it: the ``label=`` keyword if present, else the
last positional column.

>>> batch = (torch.ones(2, 3), torch.zeros(2))
>>> args, kwargs, label = split_batch(batch)
>>> len(args), label.tolist()
(1, [0.0, 0.0])
>>> split_batch({"x": torch.ones(2), "label": torch.zeros(2)})[1].keys()
dict_keys(['x'])
>>> dataset_size([batch, batch]), isinstance([batch], SeekableDataset)
(2, False)
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol, runtime_checkable

import torch

__all__ = ["SizedDataset", "ResettableDataset", "SeekableDataset", "CommittableDataset", "MetadataDataset",
           "BadRecordDataset", "InterruptibleDataset", "interrupt", "dataset_size", "check_dataset", "reset",
           "unpack", "split_label", "split_batch", "check_batch", "batch_rows"]


# ------------------------------------------------------------------ dataset capabilities
@runtime_checkable
class SizedDataset(Protocol):
    """Knows its number of batches per pass (MindSpore style; ``len()`` works as well)."""

    def get_dataset_size(self) -> int: ...


@runtime_checkable
class ResettableDataset(Protocol):
    """Keeps its own read position and rewinds it on ``reset()`` (called after every pass)."""

    def reset(self) -> None: ...


@runtime_checkable
class SeekableDataset(Protocol):
    """A stream whose read position can be saved (``position()``, read right after a batch) and
    restored (``seek(position)``); positions are JSON-able."""

    def position(self) -> Any: ...

    def seek(self, position: Any) -> None: ...


@runtime_checkable
class CommittableDataset(Protocol):
    """A stream that acknowledges consumed data to its source (e.g. Kafka offsets); called only
    after the checkpoint holding `position` is durable."""

    def commit(self, position: Any) -> None: ...


@runtime_checkable
class MetadataDataset(Protocol):
    """Describes the batch it yielded last (e.g. ``{"event_time": tensor}``), or None."""

    def last_batch_meta(self) -> dict | None: ...


@runtime_checkable
class BadRecordDataset(Protocol):
    """Counts the records it rejected, by reason, in a live mapping."""

    bad_records: Mapping[str, int]


@runtime_checkable
class InterruptibleDataset(Protocol):
    """Can end a running iteration from another thread (a stop request while it waits for data);
    the records not yet handed out are read again by the next iteration."""

    def interrupt(self) -> None: ...


# ------------------------------------------------------------------ datasets
def dataset_size(dataset) -> int | None:
    """Number of batches per pass, or None when the dataset cannot say (a stream, a generator)."""
    if isinstance(dataset, SizedDataset):
        size = dataset.get_dataset_size()
        return None if size is None or size < 0 else int(size)
    try:
        return len(dataset)
    except TypeError:  # no __len__, or an IterableDataset DataLoader without one
        return None


def check_dataset(dataset, name: str) -> None:
    """Fail early, naming the argument, on something that cannot be iterated as batches."""
    if dataset is None:
        raise ValueError(f"'{name}' must be a dataset (an iterable of batches), got None")
    if isinstance(dataset, (str, bytes, dict, torch.Tensor)) or not isinstance(dataset, Iterable):
        raise TypeError(f"'{name}' must be an iterable of batches (a list, a DataLoader, a recstream reader, "
                        f"or an object with __iter__), got {type(dataset).__name__}")


def reset(dataset) -> None:
    """Rewind a dataset that keeps its own position; others are re-iterated from the start anyway."""
    if isinstance(dataset, ResettableDataset):
        dataset.reset()


def interrupt(dataset) -> None:
    """End a running iteration of `dataset` promptly, even one waiting for data, when the dataset
    can (`InterruptibleDataset`); otherwise nothing."""
    if isinstance(dataset, InterruptibleDataset):
        dataset.interrupt()


# ------------------------------------------------------------------ batches
def unpack(batch) -> tuple[tuple, dict]:
    """A batch as the ``(args, kwargs)`` the network (or its step cell) is called with."""
    if isinstance(batch, (tuple, list)):
        return tuple(batch), {}
    if isinstance(batch, dict):
        return (), batch
    return (batch,), {}


def batch_rows(batch) -> int | None:
    """Rows of a batch, from shapes only (no device read): the batch's or its first part's
    ``batch_size`` (a `Batch`, `Features`), else the first dimension of the first tensor or array
    among its parts; None where no part has one.

    >>> import torch
    >>> batch_rows((torch.zeros(4, 3), torch.zeros(4))), batch_rows({"x": torch.zeros(2, 1)}), batch_rows((1.0,))
    (4, 2, None)
    """
    args, kwargs = unpack(batch)
    for part in (batch, *args, *kwargs.values()):
        shape = getattr(part, "shape", None)
        if isinstance(shape, tuple) and shape:
            return int(shape[0])
        size = getattr(part, "batch_size", None)
        if isinstance(size, int) and not isinstance(size, bool):
            return size
    return None


def split_label(args: tuple, kwargs: dict) -> tuple[tuple, dict, Any]:
    """``(inputs, kwargs, label)``: the ``label=`` keyword if present, else the last positional."""
    if "label" in kwargs:
        kwargs = dict(kwargs)
        return args, kwargs, kwargs.pop("label")
    if len(args) < 2:
        raise ValueError(
            "each batch must hold the network's inputs and a label when a loss function is used, e.g. "
            f"(data, label) or a dict with a 'label' key; got {len(args)} positional element(s) "
            f"and keys {sorted(kwargs)}")
    return args[:-1], kwargs, args[-1]


def split_batch(batch) -> tuple[tuple, dict, Any]:
    """`unpack` then `split_label`: ``(inputs, kwargs, label)``."""
    return split_label(*unpack(batch))


def check_batch(batch, needs_label: bool, name: str = "train_dataset") -> None:
    """Check the first batch of a run, so a wrong dataset fails at once with a clear message."""
    if not needs_label:
        return
    args, kwargs = unpack(batch)
    if len(args) < 2 and "label" not in kwargs:
        got = f"a dict with keys {sorted(kwargs)}" if kwargs else f"{len(args)} element(s) ({type(batch).__name__})"
        raise ValueError(f"When 'loss_fn' is set, each batch of '{name}' must be (data, label) "
                         f"or a dict with a 'label' key; got {got}")
