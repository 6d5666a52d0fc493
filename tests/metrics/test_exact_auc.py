"""exact_auc against a brute-force count over all positive/negative pairs."""
import numpy as np
import pytest
import torch

from recstream.metrics import exact_auc


def brute_force_auc(scores, labels):
    scores, labels = np.asarray(scores, dtype=float), np.asarray(labels, dtype=bool)
    pos, neg = scores[labels], scores[~labels]
    diff = pos[:, None] - neg[None, :]
    return ((diff > 0).sum() + 0.5 * (diff == 0).sum()) / diff.size


def test_hand_computed():
    assert exact_auc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]) == 0.75
    assert exact_auc([0.5, 0.5], [0, 1]) == 0.5
    assert exact_auc([0.1, 0.5, 0.5, 0.9], [0, 0, 1, 1]) == 0.875
    assert exact_auc([0.9, 0.1], [0, 1]) == 0.0


@pytest.mark.parametrize("seed", range(5))
def test_matches_brute_force_with_many_ties(seed):
    rng = np.random.default_rng(seed)
    labels = rng.random(400) < 0.3
    scores = np.round(rng.random(400) + 0.3 * labels, 1)  # about 14 distinct values
    assert exact_auc(scores, labels) == pytest.approx(brute_force_auc(scores, labels), abs=1e-12)


def test_shapes_and_types():
    s = torch.tensor([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4]])  # column 1 is the positive score
    assert exact_auc(s, [[1, 0], [0, 1], [0, 1]]) == 1.0
    assert exact_auc(s[:, 1:], torch.tensor([[0], [1], [1]])) == 1.0
    assert exact_auc(np.array([0.1, 0.9]), np.array([False, True])) == 1.0


def test_bad_inputs():
    with pytest.raises(ValueError, match="labels must be 0 or 1, got 2.0"):
        exact_auc([0.1, 0.2], [0, 2])
    with pytest.raises(ValueError, match="both classes, got 2 positive and 0 negative"):
        exact_auc([0.1, 0.2], [1, 1])
    with pytest.raises(ValueError, match="scores must not be NaN"):
        exact_auc([0.1, float("nan")], [0, 1])
    with pytest.raises(ValueError, match=r"same number of samples, got 3 and 2"):
        exact_auc([0.1, 0.2, 0.3], [0, 1])
    with pytest.raises(ValueError, match=r"y_pred must have shape \(N,\), \(N, 1\) or \(N, 2\), got \(2, 3\)"):
        exact_auc(np.zeros((2, 3)), [0, 1])
