"""Moving batches between memories: map over every tensor of a nested batch, keeping its types.

Handles tensors, tuples (NamedTuples such as `Batch` keep their type), lists, dicts and
dataclasses (such as `Features`); other objects with a ``.to`` method move themselves.

>>> batch = {"x": torch.ones(2), "ids": [torch.zeros(1, dtype=torch.int64)], "note": "kept"}
>>> moved = map_tensors(batch, lambda t: t * 2)
>>> moved["x"].tolist(), moved["note"], to_device(batch, "cpu")["ids"][0].dtype
([2.0, 2.0], 'kept', torch.int64)
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch


def map_tensors(obj: Any, fn: Callable[[torch.Tensor], torch.Tensor], other: Callable[[Any], Any] | None = None) -> Any:
    """Apply `fn` to every tensor of `obj`; `other` (if given) to leaves that are not containers."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, tuple):
        items = [map_tensors(x, fn, other) for x in obj]
        return type(obj)(*items) if hasattr(obj, "_fields") else tuple(items)
    if isinstance(obj, list):
        return [map_tensors(x, fn, other) for x in obj]
    if isinstance(obj, dict):
        return {k: map_tensors(v, fn, other) for k, v in obj.items()}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        changes = {f.name: map_tensors(getattr(obj, f.name), fn, other) for f in dataclasses.fields(obj) if f.init}
        return dataclasses.replace(obj, **changes)
    return other(obj) if other is not None else obj


def to_device(obj: Any, device: torch.device | str, non_blocking: bool = False) -> Any:
    """Every tensor of a (nested) batch on `device`."""
    def move_other(o):
        return o.to(device, non_blocking=non_blocking) if callable(getattr(o, "to", None)) else o
    return map_tensors(obj, lambda t: t.to(device, non_blocking=non_blocking), move_other)


def pin_memory(obj: Any) -> Any:
    """Page-lock every CPU tensor so a host-to-GPU copy can run asynchronously."""
    return map_tensors(obj, lambda t: t.pin_memory() if t.device.type == "cpu" else t)


def record_stream(obj: Any, stream) -> None:
    """Tell the CUDA caching allocator that `stream` uses these tensors (made on another stream),
    so their memory is not reused before that stream's work on them is done."""
    def record(t: torch.Tensor) -> torch.Tensor:
        if t.is_cuda:
            t.record_stream(stream)
        return t
    map_tensors(obj, record)
