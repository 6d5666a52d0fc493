"""Split nested Python state (state_dicts, RNG states, metadata) into JSON plus named tensors.

safetensors stores only a flat ``name -> tensor`` map and a ``str -> str`` metadata map, and we
never pickle. So a nested value is encoded as JSON in which every tensor is replaced by a
reference ``{"__tensor__": name}``; the tensor itself is stored under that name. Names follow
the path to the value, e.g. an optimizer's ``state[3]["exp_avg"]`` becomes
``optimizer.state.3.exp_avg``. Tuples and non-string dict keys (optimizer state is keyed by int)
are tagged so they decode to the same Python types.

>>> import torch
>>> tensors = {}
>>> doc = encode({"state": {0: {"m": torch.ones(2)}}, "betas": (0.9, 0.99)}, "opt", tensors)
>>> sorted(tensors)
['opt.state.0.m']
>>> decode(doc, tensors.__getitem__)["betas"]
(0.9, 0.99)
"""
from __future__ import annotations

import math
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

TENSOR = "__tensor__"
TUPLE = "__tuple__"
ITEMS = "__items__"
FLOAT = "__float__"
_TAGS = {TENSOR, TUPLE, ITEMS, FLOAT}


def encode(obj: Any, name: str, tensors: dict[str, torch.Tensor]) -> Any:
    """Return a JSON-able form of `obj`; tensors found inside are added to `tensors` by path name."""
    if isinstance(obj, torch.Tensor):
        key, i = name, 1
        while key in tensors:  # two paths can spell the same dotted name ({"a.b": x} vs {"a": {"b": y}})
            key, i = f"{name}#{i}", i + 1
        tensors[key] = obj
        return {TENSOR: key}
    if isinstance(obj, np.ndarray):
        return encode(torch.from_numpy(np.ascontiguousarray(obj)), name, tensors)
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return {FLOAT: repr(obj)}  # strict JSON has no inf/nan
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, tuple):
        return {TUPLE: [encode(v, f"{name}.{i}", tensors) for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [encode(v, f"{name}.{i}", tensors) for i, v in enumerate(obj)]
    if isinstance(obj, dict):
        if all(isinstance(k, str) for k in obj) and not (len(obj) == 1 and next(iter(obj)) in _TAGS):
            return {k: encode(v, f"{name}.{k}", tensors) for k, v in obj.items()}
        items = []
        for k, v in obj.items():
            if not (k is None or isinstance(k, (bool, int, float, str))):
                raise TypeError(f"cannot store {name!r}: dict key {k!r} ({type(k).__name__}) is not a "
                                "str/int/float/bool/None")
            items.append([k, encode(v, f"{name}.{k}", tensors)])
        return {ITEMS: items}
    raise TypeError(
        f"cannot store {name!r}: a {type(obj).__name__} is neither a tensor nor a JSON value "
        "(None, bool, int, float, str, list, tuple, dict); checkpoints never pickle objects")


def decode(doc: Any, get_tensor: Callable[[str], torch.Tensor]) -> Any:
    """Inverse of `encode`: rebuild the value, fetching referenced tensors with `get_tensor(name)`."""
    if isinstance(doc, list):
        return [decode(v, get_tensor) for v in doc]
    if isinstance(doc, dict):
        if len(doc) == 1:
            (tag, value), = doc.items()
            if tag == TENSOR:
                return get_tensor(value)
            if tag == TUPLE:
                return tuple(decode(v, get_tensor) for v in value)
            if tag == ITEMS:
                return {k: decode(v, get_tensor) for k, v in value}
            if tag == FLOAT:
                return float(value)
        return {k: decode(v, get_tensor) for k, v in doc.items()}
    return doc


def tensor_refs(doc: Any) -> list[str]:
    """Names of all tensors referenced by an encoded document (to check a file holds them all)."""
    if isinstance(doc, list):
        return [r for v in doc for r in tensor_refs(v)]
    if isinstance(doc, dict):
        if len(doc) == 1 and TENSOR in doc:
            return [doc[TENSOR]]
        return [r for v in doc.values() for r in tensor_refs(v)]
    return []


def checksum(t: torch.Tensor) -> int:
    """CRC32 of a CPU tensor's raw bytes (no copy for contiguous tensors)."""
    flat = t.detach().reshape(-1)
    if flat.numel() == 0:
        return 0
    raw = flat.contiguous().view(torch.uint8)  # reinterpret any dtype (bf16 too) as bytes
    return zlib.crc32(memoryview(raw.numpy()))


def prepare_for_save(tensors: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """CPU, contiguous, storage-disjoint tensors for safetensors, plus ``alias -> stored name``.

    safetensors refuses tensors that share memory. Exact aliases (tied weights: same storage,
    offset, shape, strides) are stored once and recorded as aliases; partial overlaps (views into
    one buffer) are cloned, since they load back as independent tensors anyway.
    """
    out: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    exact: dict[tuple, str] = {}
    storages: set[int] = set()
    for name, t in tensors.items():
        if t.is_sparse or t.layout != torch.strided:
            raise TypeError(f"cannot store {name!r}: only dense (strided) tensors are supported, got layout {t.layout}")
        t = t.detach()
        if t.numel():
            ptr = t.untyped_storage().data_ptr()
            ident = (t.device, ptr, t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)
            if ident in exact:
                aliases[name] = exact[ident]
                continue
            exact[ident] = name
            if (t.device, ptr) in storages:
                t = t.clone()
            else:
                storages.add((t.device, ptr))
        t = t.to("cpu")
        if not t.is_contiguous():
            t = t.contiguous()
        out[name] = t
    return out, aliases
