"""ROC AUC of binary labels: streaming [`AUC`][recstream.metrics.auc.AUC] in constant memory with a proven error bound,
and `exact_auc`, the sort-based reference it is tested against.

Both count, per score group (a histogram bin or one distinct score), the positives and the
negatives, and share `_auc_from_counts`: pairs across groups are ordered by the groups,
pairs inside one group count 1/2.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from recstream.metrics._inputs import (
    binary_labels,
    binary_scores,
    prediction_pair,
    to_float,
    to_tensor,
)
from recstream.metrics.base import Metric, _copy
from recstream.metrics.sparse_counts import compact as _compact_counts
from recstream.metrics.sparse_counts import expand as _expand_counts
from recstream.validation import check_bool, check_int


def _auc_from_counts(pos: np.ndarray, neg: np.ndarray, n_pos: float, n_neg: float) -> float:
    """AUC from positive/negative counts per score group, groups in increasing score order.

    A positive beats every negative of a lower group and half of those in its own group.
    """
    negatives_below = np.cumsum(neg) - neg
    return float((pos * (negatives_below + 0.5 * neg)).sum() / (n_pos * n_neg))


# Each half of the score axis spans 31 octaves (powers of two) of the binned quantity:
# probabilities use q = min(p, 1 - p) in [2**-32, 2**-1]; logits use |z| in [2**-25, 2**6].
_OCTAVES = 31
_PROB_MIN_EXPONENT = -32
_LOGIT_MIN_EXPONENT = -25
_FLOAT32_MANTISSA_BITS = 23


def _octave_bins(x: torch.Tensor, min_exponent: int, mantissa_bits: int) -> torch.Tensor:
    """Bin non-negative float32 values by exponent and the top ``mantissa_bits`` bits.

    The IEEE-754 bit pattern of a non-negative float, read as an int32, increases
    with the value, so shifting it right is a monotone (non-decreasing) binning:
    exact integer arithmetic, no rounding that could reorder two scores. Values
    below 2**min_exponent (and negatives) land in bin 0, values from
    2**(min_exponent + 31) up (and inf/NaN) in the last bin, ``31 << mantissa_bits``.
    """
    key = x.contiguous().view(torch.int32) >> (_FLOAT32_MANTISSA_BITS - mantissa_bits)
    lowest = (127 + min_exponent) << mantissa_bits  # key of 2**min_exponent
    return (key.long() - lowest).clamp_(0, _OCTAVES << mantissa_bits)


class AUC(Metric):
    """Area under the ROC curve of binary labels, streamed through fixed histograms.

    Args:
        num_bins: memory budget, the most histogram bins per class. The histograms use
            ``62 * 2**m + 1`` bins for the largest ``m`` that fits (``m = 14``, 1,015,809
            bins, 16 MB of int64 counts for the default ``2**20``); at least 63. The
            sizes used are kept in ``self.num_bins`` and ``self.mantissa_bits`` (= m).
        from_logits: scores are logits rather than probabilities in [0, 1].

    ``update(y_pred, y)``: y_pred of shape (N,), (N, 1) or (N, 2) (column 1 is the
    positive class), y 0/1 labels of shape (N,), (N, 1) or one-hot (N, 2). Counts are
    added on the inputs' device; nothing is read back until ``eval``.

    How exactness is achieved and bounded:

    * Binning. The score axis is cut at float32 bit-pattern boundaries of
      ``q = min(p, 1 - p)`` (mirrored around 0.5; ``1 - p`` is exact in floating point
      for p >= 0.5), i.e. every bin is ``2**-m`` of an octave of q, at most ``q * 2**-m``
      wide: bins are narrow where CTR scores concentrate (default m = 14: 3.8e-6 for
      p in [0.0625, 0.125), 6e-7 around 0.01) and equally fine towards 1. With ``from_logits=True`` the logits z
      are binned the same way by ``|z|`` (sign-mirrored): sigmoid is strictly
      increasing, so the AUC of sigmoid(z) equals the AUC of z, and binning z avoids
      sigmoid saturating to exactly 1.0 in float32 (z > ~17), which would merge scores.
    * Every bin map is monotone (a higher score never lands in a lower bin), so a
      positive/negative pair in different bins is ordered exactly as by the scores.
      Only pairs inside one bin are unknown; they count 1/2, exactly like a tie, and
      each truly contributes 0, 1/2 or 1. Hence
      ``|AUC - exact| <= 0.5 * sum_b pos_b * neg_b / (P * N)``, which
      `error_bound` returns. Values that are exactly equal share a bin, so ties
      are counted 1/2 as in the exact AUC; float16/bfloat16 scores (10/7 mantissa bits)
      get one bin per distinct value, hence the exact AUC, once ``m`` is at least
      that width (probabilities with q >= 2**-32, logits with |z| in [2**-25, 2**6]).
    * Memory is constant (two histograms) and counts are exact int64s.
    * ``state_dict`` saves only the non-zero bins (16 bytes each: a few thousand events fill
      kilobytes, not the dense 16 MB); ``load_state_dict`` rebuilds the same counts and also
      reads the dense histogram tensor that older checkpoints hold.

    Example:
        >>> from recstream.metrics import AUC, exact_auc
        >>> metric = AUC()
        >>> metric.update([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1])
        >>> metric.eval()
        0.75
        >>> exact_auc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1])
        0.75
        >>> metric.error_bound() <= 1e-3
        True
    """

    _state_names = ("hist",)

    def __init__(self, num_bins: int = 2**20, from_logits: bool = False):
        super().__init__()
        num_bins = check_int("AUC", "num_bins", num_bins, minimum=2 * _OCTAVES + 1)
        from_logits = check_bool("AUC", "from_logits", from_logits)
        # Largest m with 2 * 31 * 2**m + 1 <= num_bins, capped by float32's 23 mantissa bits.
        self.mantissa_bits = min((num_bins - 1) // (2 * _OCTAVES), 1 << 23).bit_length() - 1
        self.num_bins = 2 * (_OCTAVES << self.mantissa_bits) + 1
        self.from_logits = from_logits
        self.clear()

    def clear(self):
        """Drop both histograms."""
        self._hist = None  # int64 (2 * num_bins,): negatives' counts, then positives'
        self._reset_invalid()

    def _bins(self, scores: torch.Tensor) -> torch.Tensor:
        m, half = self.mantissa_bits, _OCTAVES << self.mantissa_bits
        if self.from_logits:
            z = scores.to(torch.float32)  # rounding to float32 is monotone
            magnitude = _octave_bins(z.abs(), _LOGIT_MIN_EXPONENT, m)
            return torch.where(z > 0, half + magnitude, half - magnitude)
        upper = scores > 0.5
        # 1 - p is exact for p in [0.5, 1] (Sterbenz), in the input's own precision.
        q = torch.where(upper, 1 - scores, scores).to(torch.float32)
        distance = _octave_bins(q, _PROB_MIN_EXPONENT, m)
        return torch.where(upper, 2 * half - distance, distance)

    def update(self, *inputs):
        """Add one batch ``(y_pred, y)`` to the histograms (no device synchronisation)."""
        y_pred, y = prediction_pair(self, inputs, "AUC")
        scores, labels = binary_scores(y_pred, y, "AUC")
        scores = to_float(scores)
        positive, bad_labels = binary_labels(labels)
        self._flag_invalid("y", labels, bad_labels, "y must be 0 or 1")
        if self.from_logits:
            self._flag_invalid("y_pred", scores, torch.isnan(scores), "y_pred must not be NaN")
        else:
            bad = ~((scores >= 0) & (scores <= 1))  # also catches NaN
            rule = "y_pred must be probabilities in [0, 1] (use from_logits=True for logits)"
            self._flag_invalid("y_pred", scores, bad, rule)
        index = self._bins(scores) + self.num_bins * positive.long()
        if self._hist is None:
            self._hist = torch.zeros(2 * self.num_bins, dtype=torch.int64, device=index.device)
        index = index.to(self._hist.device)
        self._hist.index_add_(0, index, torch.ones_like(index))

    def _class_histograms(self) -> tuple[np.ndarray, np.ndarray, float, float]:
        if self._hist is None:
            raise RuntimeError(
                "AUC can not be calculated, because the number of samples is 0; "
                "call update() with a non-empty batch before eval()."
            )
        self._raise_invalid()
        neg, pos = self._hist.cpu().double().numpy().reshape(2, self.num_bins)
        n_pos, n_neg = pos.sum(), neg.sum()
        if n_pos == 0 or n_neg == 0:
            raise RuntimeError(
                f"AUC is undefined unless both classes are present; got {int(n_pos)} positive "
                f"and {int(n_neg)} negative label(s)."
            )
        return neg, pos, n_pos, n_neg

    def eval(self) -> float:
        """P(score of a positive > score of a negative), ties (same bin) counting 1/2."""
        neg, pos, n_pos, n_neg = self._class_histograms()
        return _auc_from_counts(pos, neg, n_pos, n_neg)

    def error_bound(self) -> float:
        """Proven bound on ``|eval() - exact AUC|``: half the share of same-bin pos/neg pairs."""
        neg, pos, n_pos, n_neg = self._class_histograms()
        return float(0.5 * (pos * neg).sum() / (n_pos * n_neg))

    def state_dict(self) -> dict:
        """The histograms' non-zero bins (`recstream.metrics.sparse_counts`) and the deferred errors.

        ``{"hist": None | {"length", "index", "count"}, "invalid": ...}``: a checkpoint holds
        16 bytes per bin in use instead of the dense 16 MB, and `load_state_dict` rebuilds the very
        same counts (the AUC after a restore is the uninterrupted one, to the last bit).

        >>> metric = AUC()
        >>> metric.update([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1])
        >>> state = metric.state_dict()
        >>> state["hist"]["index"].numel(), state["hist"]["length"] == 2 * metric.num_bins
        (4, True)
        >>> again = AUC()
        >>> again.load_state_dict(state)
        >>> again.eval() == metric.eval()
        True
        """
        if self._hist is None or self._hist.is_meta:  # meta tensors have no values to find the bins in:
            return super().state_dict()  # the dense form (shape only), which load_state_dict reads too
        return {"hist": _compact_counts(self._hist), "invalid": _copy(self._invalid)}

    def load_state_dict(self, state: dict) -> None:
        """Restore a `state_dict`: the compact form, or the dense histogram tensor of older checkpoints."""
        if isinstance(state, dict) and isinstance(state.get("hist"), Mapping):
            where = f"AUC.load_state_dict (num_bins={self.num_bins}): state['hist']"
            state = {**state, "hist": _expand_counts(state["hist"], 2 * self.num_bins, where)}
        super().load_state_dict(state)

    def _check_state(self, state: dict) -> None:
        hist = state["hist"]  # here None or dense: load_state_dict expanded the compact form
        if hist is not None and (not isinstance(hist, torch.Tensor) or hist.shape != (2 * self.num_bins,)):
            shape = tuple(hist.shape) if isinstance(hist, torch.Tensor) else type(hist).__name__
            raise ValueError(
                f"AUC.load_state_dict: state['hist'] must be None, a dict of the non-zero bins or a tensor of "
                f"shape ({2 * self.num_bins},) for num_bins={self.num_bins}, got {shape}."
            )
        if hist is not None and hist.dtype != torch.int64:
            raise ValueError(f"AUC.load_state_dict: state['hist'] must hold int64 counts, got {hist.dtype}.")
        if hist is not None and not hist.is_meta and bool((hist < 0).any()):
            raise ValueError("AUC.load_state_dict: state['hist'] holds a negative count.")


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
    return _auc_from_counts(pos, neg, n_pos, n_neg)
