"""A count vector as its non-zero entries: the compact, lossless form metric states are saved in.

A histogram of a million bins that a few thousand events filled is mostly zeros; its saved state
``{"length": n, "index": i, "count": c}`` holds only the non-zero bins (``i`` strictly increasing
int64 bin numbers, ``c`` their int64 counts), so a checkpoint carries bytes in proportion to the
bins used, not to the histogram's size, and the dense vector rebuilt from it is the same, count
for count. `expand` checks everything before it builds anything: a state that is not one
(mismatched lengths, an index out of range or repeated, a negative count) is a `ValueError`
naming the entry and what is wrong, never a silently different histogram.

>>> import torch
>>> dense = torch.tensor([0, 3, 0, 0, 1], dtype=torch.int64)
>>> state = compact(dense)
>>> state["length"], state["index"].tolist(), state["count"].tolist()
(5, [1, 4], [3, 1])
>>> torch.equal(expand(state, 5, "state['hist']"), dense)
True
>>> merge(state, compact(torch.tensor([1, 1, 0, 0, 0])), "state['hist']")["count"].tolist()
[1, 4, 1]
"""
from __future__ import annotations

from collections.abc import Mapping

import torch

__all__ = ["KEYS", "compact", "expand", "is_compact", "merge"]

KEYS = frozenset({"length", "index", "count"})


def compact(dense: torch.Tensor) -> dict:
    """The non-zero entries of the 1-d count tensor `dense`, in increasing index order (on its device).

    Reads the tensor back to size the result (a checkpoint or a merge, never a training step)."""
    index = dense.nonzero().reshape(-1)
    return {"length": int(dense.numel()), "index": index, "count": dense[index].to(torch.int64)}


def is_compact(state) -> bool:
    """Whether `state` has the keys of a compact count vector (its values are checked by `expand`)."""
    return isinstance(state, Mapping) and set(state) == KEYS


def _checked_parts(state, where: str) -> tuple[torch.Tensor, torch.Tensor]:
    if not is_compact(state):
        got = sorted(state) if isinstance(state, Mapping) else type(state).__name__
        raise ValueError(f"{where} must be a dict with the keys {sorted(KEYS)}, got {got}")
    index, count = state["index"], state["count"]
    for key, value in (("index", index), ("count", count)):
        if not (isinstance(value, torch.Tensor) and value.dtype == torch.int64 and value.dim() == 1):
            got = f"{value.dtype} tensor of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) \
                else type(value).__name__
            raise ValueError(f"{where}[{key!r}] must be a 1-d int64 tensor, got a {got}")
    if len(index) != len(count):
        raise ValueError(f"{where}: 'index' and 'count' must have one length, got {len(index)} and {len(count)}")
    if index.device != count.device:
        raise ValueError(f"{where}: 'index' and 'count' must be on one device, got {index.device} and {count.device}")
    return index, count


def expand(state, length: int, where: str) -> torch.Tensor:
    """The dense int64 count vector of `length` entries that `state` encodes (on its tensors' device).

    Args:
        state: ``{"length", "index", "count"}`` as `compact` makes it.
        length: the length the caller's histogram has; the state's ``length`` must equal it.
        where: the entry's name for error messages, e.g. ``"AUC.load_state_dict: state['hist']"``.
    """
    index, count = _checked_parts(state, where)
    saved = state["length"]
    if isinstance(saved, bool) or not isinstance(saved, int) or saved != length:
        raise ValueError(f"{where}['length'] is {saved!r}, expected {length} (the histogram it loads into)")
    if len(index):
        low, high = int(index.min()), int(index.max())
        if low < 0 or high >= length:
            bad = low if low < 0 else high
            raise ValueError(f"{where}['index'] holds {bad}, out of range [0, {length})")
        if not bool((index[1:] > index[:-1]).all()):
            raise ValueError(f"{where}['index'] must be strictly increasing (each bin once)")
        if int(count.min()) < 0:
            raise ValueError(f"{where}['count'] holds a negative count, {int(count.min())}")
    dense = torch.zeros(length, dtype=torch.int64, device=index.device)
    dense[index] = count  # each index once: an exact assignment
    return dense


def merge(a, b, where: str) -> dict:
    """The compact sum of two compact count vectors of one length (e.g. two ranks' histograms)."""
    index_a, count_a = _checked_parts(a, where)
    _checked_parts(b, where)
    length = a["length"]
    if b["length"] != length:
        raise ValueError(f"{where}: the histograms have {length} and {b['length']} bins; they cannot be added")
    index_b, count_b = b["index"].to(index_a.device), b["count"].to(index_a.device)
    index, slot = torch.unique(torch.cat([index_a, index_b]), sorted=True, return_inverse=True)
    count = torch.zeros(len(index), dtype=torch.int64, device=index.device)
    count.index_add_(0, slot, torch.cat([count_a, count_b]))
    return {"length": length, "index": index, "count": count}
