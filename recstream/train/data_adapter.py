"""Data adapter: the one place that knows what a "dataset" and a "batch" may be.

A dataset is anything re-iterable that yields batches: a list, a torch ``DataLoader``, a
recstream reader, or an object with ``get_dataset_size()`` / ``reset()`` (MindSpore style).
A batch is a tuple/list of columns (``(data, label)``, or a ``NamedTuple`` such as
``recstream.data.Batch``), a dict of named columns (``label`` key for the label), or one tensor.
"""
from __future__ import annotations

from typing import Iterable

import torch


def dataset_size(dataset) -> int | None:
    """Number of batches per pass, or None when the dataset cannot say (a stream, a generator)."""
    get_size = getattr(dataset, "get_dataset_size", None)
    if callable(get_size):
        size = get_size()
        return None if size is None or size < 0 else int(size)
    try:
        return len(dataset)
    except TypeError:  # no __len__, or an IterableDataset DataLoader without one
        return None


def check_dataset(dataset, name: str) -> None:
    """Fail early, naming the argument, on something that cannot be iterated."""
    if dataset is None:
        raise ValueError(f"'{name}' must be a dataset (an iterable of batches), got None")
    if isinstance(dataset, (str, bytes, dict, torch.Tensor)) or not isinstance(dataset, Iterable):
        raise TypeError(f"'{name}' must be an iterable of batches (a list, a DataLoader, a recstream reader, "
                        f"or an object with __iter__), got {type(dataset).__name__}")


def unpack(batch) -> tuple[tuple, dict]:
    """A batch as the ``(args, kwargs)`` the network (or its step cell) is called with."""
    if isinstance(batch, (tuple, list)):
        return tuple(batch), {}
    if isinstance(batch, dict):
        return (), batch
    return (batch,), {}


def network_device(network: torch.nn.Module) -> torch.device:
    """The device of the network's first parameter or buffer (CPU for a parameterless network)."""
    for t in network.parameters():
        return t.device
    for t in network.buffers():
        return t.device
    return torch.device("cpu")


