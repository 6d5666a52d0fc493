"""Data adapter: the one place that knows what a "dataset" and a "batch" may be.

A dataset is anything re-iterable that yields batches: a list, a torch ``DataLoader``, a
recstream reader, or an object with ``get_dataset_size()`` / ``reset()`` (MindSpore style).
A batch is a tuple/list of columns (``(data, label)``, or a ``NamedTuple`` such as
``recstream.data.Batch``), a dict of named columns (``label`` key for the label), or one tensor.
"""
from __future__ import annotations

from typing import Any, Iterable, Iterator

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


def reset(dataset) -> None:
    """Rewind a dataset that keeps its own position (MindSpore datasets, recstream streams)."""
    fn = getattr(dataset, "reset", None)
    if callable(fn):
        fn()


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


def to_device(obj: Any, device: torch.device, non_blocking: bool = False) -> Any:
    """Move every tensor in a (nested) batch to `device`; objects with ``.to`` move themselves."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device, non_blocking=non_blocking)
    if isinstance(obj, tuple):
        moved = [to_device(x, device, non_blocking) for x in obj]
        return type(obj)(*moved) if hasattr(obj, "_fields") else tuple(moved)  # keep NamedTuples
    if isinstance(obj, list):
        return [to_device(x, device, non_blocking) for x in obj]
    if isinstance(obj, dict):
        return {k: to_device(v, device, non_blocking) for k, v in obj.items()}
    if hasattr(obj, "to") and callable(obj.to):
        return obj.to(device, non_blocking=non_blocking)
    return obj


def pin_memory(obj: Any) -> Any:
    """Page-lock every CPU tensor in a batch so the host-to-GPU copy can run asynchronously."""
    if isinstance(obj, torch.Tensor):
        return obj.pin_memory() if obj.device.type == "cpu" else obj
    if isinstance(obj, tuple):
        pinned = [pin_memory(x) for x in obj]
        return type(obj)(*pinned) if hasattr(obj, "_fields") else tuple(pinned)
    if isinstance(obj, list):
        return [pin_memory(x) for x in obj]
    if isinstance(obj, dict):
        return {k: pin_memory(v) for k, v in obj.items()}
    if hasattr(obj, "pin_memory") and callable(obj.pin_memory):
        return obj.pin_memory()
    return obj


def network_device(network: torch.nn.Module) -> torch.device:
    """The device of the network's first parameter or buffer (CPU for a parameterless network)."""
    for t in network.parameters():
        return t.device
    for t in network.buffers():
        return t.device
    return torch.device("cpu")


def repeat_forever(dataset, name: str = "train_dataset") -> Iterator:
    """Traverse `dataset` endlessly: at the end of a pass, ``reset()`` it and start a new one.

    Raises if a pass yields nothing (an empty dataset, or a one-shot iterator already consumed),
    since cycling it would otherwise spin forever.
    """
    while True:
        empty = True
        for batch in dataset:
            empty = False
            yield batch
        if empty:
            raise ValueError(f"'{name}' yielded no batch in a pass: it is empty, or a one-shot iterator "
                             "(e.g. a generator) that cannot be traversed again; pass a re-iterable dataset")
        reset(dataset)
