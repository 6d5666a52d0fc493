"""Exact, sort-based ROC AUC: the reference that the streaming :class:`AUC` is tested against."""
from __future__ import annotations

import numpy as np
import torch

from recstream.metrics._inputs import binary_scores, to_tensor


def exact_auc(scores, labels) -> float:
    """Exact ROC AUC of binary ``labels`` given ``scores``; tied scores count 1/2.

    Equals the Mann-Whitney U statistic over P * N: the share of (positive, negative)
    pairs where the positive scores higher, ties counting one half. Sorts all scores
    (O(n log n) time, O(n) memory), in float64 on the CPU.

    Args:
        scores: (N,), (N, 1) or (N, 2) (column 1 is used); tensor, numpy array or list.
        labels: 0/1 labels of shape (N,), (N, 1) or one-hot (N, 2).

    Example:
        >>> from recstream.metrics import exact_auc
        >>> exact_auc([0.1, 0.5, 0.5, 0.9], [0, 0, 1, 1])  # the 0.5/0.5 tie counts 1/2
        0.875
    """
    s_t = to_tensor(scores, "scores", "exact_auc")
    l_t = to_tensor(labels, "labels", "exact_auc")
    s_t, l_t = binary_scores(s_t, l_t, "exact_auc")
    s = s_t.detach().cpu().to(torch.float64).numpy()
    y = l_t.detach().cpu().to(torch.float64).numpy()
    if np.isnan(s).any():
        raise ValueError(f"exact_auc: scores must not be NaN, got {int(np.isnan(s).sum())} NaN value(s).")
    bad = (y != 0) & (y != 1)
    if bad.any():
        raise ValueError(f"exact_auc: labels must be 0 or 1, got {float(y[bad][0])!r} (and {int(bad.sum())} in all).")
    n_pos = float(y.sum())
    n_neg = float(y.size - n_pos)
    if n_pos == 0 or n_neg == 0:
        raise ValueError(
            f"exact_auc: labels must contain both classes, got {int(n_pos)} positive and "
            f"{int(n_neg)} negative."
        )
    # One group per distinct score (sorted): pairs across groups are strictly ordered,
    # pairs inside a group are ties.
    distinct, group = np.unique(s, return_inverse=True)
    pos = np.bincount(group, weights=y, minlength=distinct.size)
    neg = np.bincount(group, minlength=distinct.size) - pos
    negatives_below = np.cumsum(neg) - neg
    return float((pos * (negatives_below + 0.5 * neg)).sum() / (n_pos * n_neg))
