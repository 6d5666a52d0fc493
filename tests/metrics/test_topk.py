"""Top-k categorical accuracy against MindSpore's examples."""
import pytest
import torch

from recstream.metrics import Top1CategoricalAccuracy, Top5CategoricalAccuracy, TopKCategoricalAccuracy

X = [[0.2, 0.5, 0.3, 0.6, 0.2], [0.1, 0.35, 0.5, 0.2, 0.0], [0.9, 0.6, 0.2, 0.01, 0.3]]
Y = [2, 0, 1]


def test_mindspore_examples():
    assert TopKCategoricalAccuracy(3)(X, Y) == pytest.approx(2 / 3)
    assert Top1CategoricalAccuracy()(X, Y) == 0.0
    assert Top5CategoricalAccuracy()(X, Y) == 1.0
    assert Top1CategoricalAccuracy().k == 1 and Top5CategoricalAccuracy().k == 5


def test_label_layouts_and_batches():
    one_hot = torch.nn.functional.one_hot(torch.tensor(Y), 5)
    assert TopKCategoricalAccuracy(3)(X, one_hot) == pytest.approx(2 / 3)
    assert TopKCategoricalAccuracy(3)(X, [[2], [0], [1]]) == pytest.approx(2 / 3)
    m = TopKCategoricalAccuracy(2)
    m.update(X[:1], Y[:1])  # top-2 of row 0: classes 3, 1 -> miss
    m.update(X[1:], Y[1:])  # row 1: 2, 1 -> miss; row 2: 0, 1 -> hit
    assert m.eval() == pytest.approx(1 / 3)


def test_ties_rank_lower_index_first():
    scores = [[0.5, 0.5, 0.5]]
    assert Top1CategoricalAccuracy()(scores, [0]) == 1.0
    assert Top1CategoricalAccuracy()(scores, [1]) == 0.0
    assert TopKCategoricalAccuracy(2)(scores, [1]) == 1.0


def test_k_larger_than_classes_always_hits():
    assert Top5CategoricalAccuracy()([[0.1, 0.9]], [0]) == 1.0


def test_bad_inputs():
    with pytest.raises(ValueError, match="TopKCategoricalAccuracy: 'k' must be an int >= 1, got 0"):
        TopKCategoricalAccuracy(0)
    with pytest.raises(TypeError, match=r"'k' must be an int >= 1, got 1.5 \(float\)"):
        TopKCategoricalAccuracy(1.5)
    with pytest.raises(TypeError, match=r"'k' must be an int >= 1, got True \(bool\)"):
        TopKCategoricalAccuracy(True)
    with pytest.raises(ValueError, match=r"y_pred must have shape \(N, C\), got \(3,\)"):
        Top1CategoricalAccuracy().update([0.1, 0.2, 0.3], [0, 1, 2])
    with pytest.raises(ValueError, match=r"y must have shape \(3,\), \(3, 1\) or one-hot \(3, C\), got \(2,\)"):
        Top1CategoricalAccuracy().update(X, [0, 1])
    with pytest.raises(RuntimeError, match="number of samples is 0"):
        Top5CategoricalAccuracy().eval()
    m = TopKCategoricalAccuracy(2)
    m.update(X, [0, 7, 1])
    with pytest.raises(ValueError, match=r"y must be class indices in \[0, 5\).*first one: 7.0"):
        m.eval()
