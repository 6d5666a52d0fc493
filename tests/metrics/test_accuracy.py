"""Accuracy against hand-computed values, MindSpore's examples and bad inputs."""
import pytest
import torch

from recstream.metrics import Accuracy

SCORES = [[0.2, 0.5], [0.3, 0.1], [0.9, 0.6]]  # argmax: 1, 0, 0


def test_mindspore_example_indices_and_one_hot():
    assert Accuracy()(SCORES, [1, 0, 1]) == pytest.approx(2 / 3)
    assert Accuracy()(SCORES, [[0, 1], [1, 0], [0, 1]]) == pytest.approx(2 / 3)
    assert Accuracy()(SCORES, [[1], [0], [1]]) == pytest.approx(2 / 3)  # (N, 1) indices


def test_returns_python_float():
    assert type(Accuracy()(SCORES, [1, 0, 1])) is float


def test_accumulates_over_batches():
    m = Accuracy()
    m.update(SCORES, [1, 0, 1])  # 2 of 3
    m.update([[0.1, 0.9]], [0])  # 0 of 1
    assert m.eval() == 0.5
    m.clear()
    m.update([[0.1, 0.9]], [1])
    assert m.eval() == 1.0


@pytest.mark.parametrize("shape", [(4,), (4, 1)])
def test_binary_probabilities_use_threshold(shape):
    p = torch.tensor([0.9, 0.2, 0.7, 0.5]).reshape(shape)
    y = torch.tensor([1, 0, 0, 1]).reshape(shape)
    # threshold 0.5: predictions 1, 0, 1, 0 (0.5 is not above) -> 2 of 4
    assert Accuracy()(p, y) == 0.5
    # threshold 0.4: predictions 1, 0, 1, 1 -> 3 of 4
    assert Accuracy(threshold=0.4)(p, y) == 0.75


def test_binary_bool_and_float_labels():
    assert Accuracy()([0.9, 0.2], torch.tensor([True, False])) == 1.0
    assert Accuracy()([0.9, 0.2], [1.0, 1.0]) == 0.5


def test_multilabel_row_correct_only_if_all_labels_match():
    y_pred = [[0.9, 0.1, 0.8], [0.2, 0.7, 0.4], [0.6, 0.6, 0.6]]
    y = [[1, 0, 1], [0, 1, 1], [1, 1, 1]]  # row 2 misses its last label
    assert Accuracy("multilabel")(y_pred, y) == pytest.approx(2 / 3)
    assert Accuracy("multilabel", threshold=0.3)(y_pred, y) == pytest.approx(1.0)


def test_extra_dimensions_count_every_position():
    # class axis is 1: position 0 predicts class 0, position 1 predicts class 1
    y_pred = torch.tensor([[[0.9, 0.1], [0.1, 0.9]]])
    assert Accuracy()(y_pred, torch.tensor([[0, 0]])) == 0.5


def test_eval_before_update_raises_runtime_error():
    with pytest.raises(RuntimeError, match="number of samples is 0"):
        Accuracy().eval()


def test_wrong_number_of_inputs():
    with pytest.raises(ValueError, match=r"expects 2 input\(s\).*got 3"):
        Accuracy().update(SCORES, [1, 0, 1], [1])


@pytest.mark.parametrize(
    "y_pred, y, match",
    [
        (SCORES, [1, 0], r"y must be class indices of shape \(3,\).*got \(2,\)"),
        ([0.9, 0.1], [1, 0, 1], r"y must have shape \(2,\) or \(2, 1\).*got \(3,\)"),
        (1.0, 1, "must be a torch.Tensor"),
    ],
)
def test_shape_mismatch_names_shapes(y_pred, y, match):
    with pytest.raises((ValueError, TypeError), match=match):
        Accuracy().update(y_pred, y)


def test_scalar_prediction_rejected():
    with pytest.raises(ValueError, match="y_pred must have at least 1 dimension"):
        Accuracy().update(torch.tensor(0.5), torch.tensor(1))


def test_multilabel_shapes_must_match():
    with pytest.raises(ValueError, match=r"y_pred \(2, 2\) and y \(2,\)"):
        Accuracy("multilabel").update([[1, 0], [0, 1]], [1, 0])


def test_class_count_must_not_change():
    m = Accuracy()
    m.update(SCORES, [1, 0, 1])
    with pytest.raises(ValueError, match="first 2 .* now 3"):
        m.update([[0.1, 0.2, 0.7]], [2])
    with pytest.raises(ValueError, match="first 2 .* now 'binary'"):
        m.update([0.7], [1])


def test_invalid_labels_are_reported_by_eval_with_value():
    m = Accuracy()
    m.update(SCORES, [1, 0, 5])  # 5 is not a class of a 2-class y_pred
    with pytest.raises(ValueError, match=r"y must be class indices in \[0, 2\).*1 value.*5\.0"):
        m.eval()
    m = Accuracy()
    m.update([0.9, 0.1], [2, 0])
    with pytest.raises(ValueError, match="y must be 0 or 1.*first one: 2.0"):
        m.eval()
    m = Accuracy()
    m.update(SCORES, [1.0, 0.5, 1.0])
    with pytest.raises(ValueError, match="class indices.*0.5"):
        m.eval()
    m.clear()  # clear forgets the bad batch
    m.update(SCORES, [1, 0, 0])
    assert m.eval() == 1.0


@pytest.mark.parametrize("kwargs, exc, match", [
    ({"eval_type": "regression"}, TypeError, r"Accuracy: 'eval_type' must be one of .*got 'regression'"),
    ({"eval_type": 1}, TypeError, r"Accuracy: 'eval_type' must be one of .*got 1 \(int\)"),
    ({"threshold": "0.5"}, TypeError, r"Accuracy: 'threshold' must be a finite number, got '0.5' \(str\)"),
    ({"threshold": True}, TypeError, r"'threshold' must be a finite number, got True \(bool\)"),
    ({"threshold": float("nan")}, ValueError, "'threshold' must be a finite number, got nan"),
])
def test_bad_constructor_arguments(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        Accuracy(**kwargs)
