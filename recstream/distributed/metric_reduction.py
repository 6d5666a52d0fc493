"""Metrics over every rank's data: accumulators merged across ranks before a metric is read.

A recstream metric keeps sums (counts, sums of losses, AUC's score histogram, class counts), so
the metric of the union of the ranks' data is the metric of the summed accumulators: AUC over all
ranks' predictions, not an average of per-rank AUCs. `all_reduce_metrics` gathers each metric's
`state_dict()` from every rank, merges them and loads the result on every rank, once per
evaluation (small: AUC's histogram travels as its non-zero bins), so every rank reports the same
values.

Merging rules, per state entry: tensors, arrays and numbers are added; ``None`` (a rank that saw
no data) takes the other side; compact count vectors (`recstream.metrics.sparse_counts`, e.g.
AUC's histogram) add their counts bin by bin; other dicts (the invalid-value records) merge by
key, adding counts; anything else (e.g. a label layout) must be equal on every rank that has one.

>>> from recstream.metrics import AUC
>>> a, b, whole = AUC(), AUC(), AUC()
>>> a.update(torch.tensor([0.9, 0.2]), torch.tensor([1, 0])); b.update(torch.tensor([0.4]), torch.tensor([1]))
>>> whole.update(torch.tensor([0.9, 0.2, 0.4]), torch.tensor([1, 0, 1]))
>>> merged = AUC(); merged.load_state_dict(merge_states([a.state_dict(), b.state_dict()], "AUC"))
>>> merged.eval() == whole.eval()
True
"""
from __future__ import annotations

from collections.abc import Iterable
from numbers import Number

import numpy as np
import torch
import torch.distributed as dist

from ..data.transfer import map_tensors
from ..metrics import Metric, sparse_counts
from .context import is_distributed, world_size


def all_reduce_metrics(metrics: Iterable[Metric]) -> None:
    """Replace each metric's state by the merge of all ranks' states (a no-op on one rank)."""
    if not is_distributed():
        return
    for metric in metrics:
        local = map_tensors(metric.state_dict(), lambda t: t.detach().cpu())
        states: list = [None] * world_size()
        dist.all_gather_object(states, local)  # between our own ranks, in memory; never from disk
        metric.load_state_dict(merge_states(states, type(metric).__name__))


def merge_states(states: list, owner: str):
    """The merge of several state dicts of one metric type (rules in the module docstring)."""
    merged = states[0]
    for state in states[1:]:
        merged = _merge(merged, state, owner)
    return merged


def _merge(a, b, owner: str, key: str = "state"):
    if a is None:
        return b
    if b is None:
        return a
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a + b.to(a.device)
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return a + b
    if isinstance(a, Number) and isinstance(b, Number) and not isinstance(a, bool):
        return a + b
    if sparse_counts.is_compact(a) and sparse_counts.is_compact(b):  # not by key: index + index means nothing
        return sparse_counts.merge(a, b, f"{owner}: {key!r}")
    if isinstance(a, dict) and isinstance(b, dict):
        if key == "invalid":  # {rule key: (count, example, rule)}: counts add up
            out = dict(a)
            for k, (count, example, rule) in b.items():
                out[k] = (out[k][0] + count, out[k][1], rule) if k in out else (count, example, rule)
            return out
        return {k: _merge(a.get(k), b.get(k), owner, k) for k in a.keys() | b.keys()}
    if _equal(a, b):
        return a
    raise ValueError(f"{owner}: the ranks' metric states disagree on {key!r} ({a!r} vs {b!r}); "
                     "they cannot be merged (did the ranks feed differently shaped inputs?)")


def _equal(a, b) -> bool:
    try:
        return bool(a == b)
    except (TypeError, ValueError, RuntimeError):
        return False
