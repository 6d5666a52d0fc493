"""Precision, Recall, Fbeta and F1 against hand-computed values."""
import warnings

import numpy as np
import pytest

from recstream.metrics import F1, Fbeta, Precision, Recall

SCORES = [[0.2, 0.5], [0.3, 0.1], [0.9, 0.6]]  # predicted classes 1, 0, 0
LABELS = [1, 0, 1]
# class 0: predicted twice, present once, 1 true positive
# class 1: predicted once, present twice, 1 true positive


def test_mindspore_examples():
    np.testing.assert_allclose(Precision()(SCORES, LABELS), [0.5, 1.0])
    np.testing.assert_allclose(Recall()(SCORES, LABELS), [1.0, 0.5])
    np.testing.assert_allclose(F1()(SCORES, LABELS), [2 / 3, 2 / 3])


def test_fbeta_weights_recall():
    # (1 + 4) tp / (4 actual + predicted): class 0 -> 5 / 6, class 1 -> 5 / 9
    np.testing.assert_allclose(Fbeta(2)(SCORES, LABELS), [5 / 6, 5 / 9])
    # beta 0.5: 1.25 tp / (0.25 actual + predicted): class 0 -> 1.25 / 2.25, class 1 -> 1.25 / 1.5
    np.testing.assert_allclose(Fbeta(0.5)(SCORES, LABELS), [1.25 / 2.25, 1.25 / 1.5])


def test_average_returns_float_mean():
    m = Precision()
    m.update(SCORES, LABELS)
    assert m.eval(average=True) == 0.75 and type(m.eval(average=True)) is float
    with pytest.raises(TypeError, match=r"Precision.eval: 'average' must be a bool, got 'yes' \(str\)"):
        m.eval(average="yes")


def test_one_hot_labels_and_batches():
    m = Recall()
    m.update(SCORES[:2], [[0, 1], [1, 0]])
    m.update(SCORES[2:], [[0, 1]])
    np.testing.assert_allclose(m.eval(), [1.0, 0.5])


def test_absent_classes_give_zero_without_warning():
    # predicts classes 0, 1; both labels are 0: class 1 is never present, class 2 never
    # predicted nor present
    y_pred = [[0.9, 0.1, 0.0], [0.1, 0.9, 0.0]]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_allclose(Precision()(y_pred, [0, 0]), [1.0, 0.0, 0.0])
        np.testing.assert_allclose(Recall()(y_pred, [0, 0]), [0.5, 0.0, 0.0])
        np.testing.assert_allclose(F1()(y_pred, [0, 0]), [2 / 3, 0.0, 0.0])


@pytest.mark.parametrize("shape", [(4,), (4, 1)])
def test_binary_returns_positive_class_float(shape):
    p = np.array([0.9, 0.8, 0.1, 0.7]).reshape(shape)  # predicts 1, 1, 0, 1
    y = np.array([1, 0, 1, 1]).reshape(shape)  # tp = 2, predicted 3, actual 3
    for metric in (Precision(), Recall(), F1()):
        value = metric(p, y)
        assert type(value) is float and value == pytest.approx(2 / 3)
    # class 0: predicted once (wrongly), present once -> precision 0; mean (0 + 2/3) / 2
    m = Precision()
    m.update(p, y)
    assert m.eval(average=True) == pytest.approx(1 / 3)
    assert Precision(threshold=0.85)(p, y) == 1.0  # only 0.9 predicts positive


def test_multilabel_is_per_sample_like_mindspore():
    y_pred = [[1, 0, 1], [0, 1, 1]]
    y = [[1, 1, 1], [0, 1, 0]]
    # row 0: tp 2, predicted 2, actual 3; row 1: tp 1, predicted 2, actual 1
    p, r = Precision("multilabel"), Recall("multilabel")
    p.update(y_pred, y)
    r.update(y_pred, y)
    np.testing.assert_allclose(p.eval(), [1.0, 0.5])
    np.testing.assert_allclose(r.eval(), [2 / 3, 1.0])
    assert p.eval(average=True) == 0.75
    assert r.eval(average=True) == pytest.approx(5 / 6)
    p.update([[0.2, 0.2, 0.2]], [[1, 0, 0]])  # predicts nothing -> 0, no warning
    np.testing.assert_allclose(p.eval(), [1.0, 0.5, 0.0])


def test_eval_before_update():
    for metric in (Precision(), Recall(), F1(), Precision("multilabel")):
        with pytest.raises(RuntimeError, match="number of samples is 0"):
            metric.eval()


def test_bad_inputs():
    with pytest.raises(ValueError, match="Fbeta: 'beta' must be a finite number > 0, got 0"):
        Fbeta(0)
    with pytest.raises(TypeError, match=r"Fbeta: 'beta' must be a finite number > 0, got '1' \(str\)"):
        Fbeta("1")
    with pytest.raises(TypeError, match="Recall: 'eval_type' must be one of"):  # MindSpore: TypeError
        Recall("binary")
    with pytest.raises(TypeError, match="Precision: 'eval_type' must be one of"):
        Precision(None)
    with pytest.raises(TypeError, match="F1: 'threshold' must be a finite number"):
        F1("0.5")
    with pytest.raises(ValueError, match=r"expects 2 input\(s\)"):
        Precision().update(SCORES)
    m = Recall()
    m.update(SCORES, [1, 0, 2])
    with pytest.raises(ValueError, match=r"Recall: y must be class indices in \[0, 2\).*2\.0"):
        m.eval()
    m = F1()
    m.update(SCORES, LABELS)
    with pytest.raises(ValueError, match="layout changed"):
        m.update([0.5, 0.6], [0, 1])
