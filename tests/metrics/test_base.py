"""Metric protocol and input conversion (docstring examples run through pytest's --doctest-modules)."""
import numpy as np
import pytest
import torch

import recstream.metrics as metrics
from recstream.metrics import MAE, Accuracy, Loss, Metric


class Mean(Metric):
    _state_names = ("total", "count")

    def clear(self):
        self._total, self._count = None, 0

    def update(self, *inputs):
        (x,) = self._select(inputs)
        self._accumulate("_total", x.sum())
        self._count += x.numel()

    def eval(self):
        return float(self._total) / self._count


def test_metric_is_abstract():
    with pytest.raises(TypeError):
        Metric()


def test_call_clears_then_evaluates_one_batch():
    m = Mean()
    m.clear()
    m.update(torch.tensor([10.0, 20.0]))
    assert m(torch.tensor([1.0, 2.0, 3.0])) == 2.0  # earlier batch discarded
    m.update(torch.tensor([6.0]))
    assert m.eval() == 3.0  # __call__ leaves its batch accumulated


def test_set_indexes_reorders_inputs_as_mindspore():
    m = Mean().set_indexes([2])
    m.clear()
    m.update(torch.tensor([100.0]), torch.tensor([200.0]), torch.tensor([4.0, 6.0]))
    assert m.indexes == [2] and m.eval() == 5.0
    acc = Accuracy().set_indexes([1, 2])
    acc.update("ignored", [[0.1, 0.9], [0.8, 0.2]], [1, 1])
    assert acc.eval() == 0.5


@pytest.mark.parametrize("bad, match", [
    ((1, 2), r"Mean.set_indexes: 'indexes' must be a list of int, got \(1, 2\) \(tuple\)"),
    ("0", r"'indexes' must be a list of int, got '0' \(str\)"),
    ([0, "1"], r"Mean.set_indexes: 'indexes\[1\]' must be an int, got '1' \(str\)"),
    ([True], r"'indexes\[0\]' must be an int, got True \(bool\)"),
])
def test_set_indexes_rejects_non_int_lists(bad, match):
    with pytest.raises(TypeError, match=match):
        Mean().set_indexes(bad)


def test_set_indexes_out_of_range_names_indexes():
    acc = Accuracy().set_indexes([0, 5])
    with pytest.raises(ValueError, match=r"indexes \[0, 5\]"):
        acc.update([0.1, 0.9], [0, 1])


@pytest.mark.parametrize(
    "y_pred, y",
    [
        (torch.tensor([[0.2, 0.5], [0.3, 0.1], [0.9, 0.6]]), torch.tensor([1, 0, 1])),
        (np.array([[0.2, 0.5], [0.3, 0.1], [0.9, 0.6]]), np.array([1, 0, 1])),
        ([[0.2, 0.5], [0.3, 0.1], [0.9, 0.6]], [1, 0, 1]),
        ((np.array([[0.2, 0.5], [0.3, 0.1], [0.9, 0.6]]), [1.0, 0.0, 1.0])),
        (torch.tensor([[0.2, 0.5], [0.3, 0.1], [0.9, 0.6]], dtype=torch.bfloat16), torch.tensor([1, 0, 1])),
        (torch.tensor([[0.2, 0.5], [0.3, 0.1], [0.9, 0.6]], dtype=torch.float16), torch.tensor([1.0, 0, 1])),
        (torch.tensor([[0.2, 0.5], [0.3, 0.1], [0.9, 0.6]], dtype=torch.float64), torch.tensor([1, 0, 1])),
    ],
)
def test_tensors_arrays_lists_and_all_float_dtypes_agree(y_pred, y):
    assert Accuracy()(y_pred, y) == pytest.approx(2 / 3)


def test_non_contiguous_and_negative_stride_inputs():
    arr = np.array([0.1, 0.2, 0.6, 0.9])[::-1]  # negative stride
    assert MAE()(arr, np.array([0.9, 0.6, 0.2, 0.1])) == pytest.approx(0.0)
    t = torch.tensor([[0.1, 9.0], [0.2, 9.0]])[:, 0]
    assert MAE()(t, [0.0, 0.0]) == pytest.approx(0.15)


@pytest.mark.parametrize("bad", [{"a": 1}, "0.5", None, np.array(["a", "b"]), object()])
def test_unsupported_input_types_raise_type_error_naming_argument(bad):
    with pytest.raises(TypeError, match="y_pred must"):
        Accuracy().update(bad, [0, 1])


def test_complex_tensor_rejected():
    with pytest.raises(TypeError, match="y must be real-valued"):
        MAE().update(torch.ones(2), torch.ones(2, dtype=torch.complex64))


def test_python_scalar_only_where_documented():
    assert Loss()(0.25) == 0.25
    with pytest.raises(TypeError, match="y_pred must be a torch.Tensor, numpy.ndarray or list"):
        MAE().update(0.5, [0.5])


def test_every_public_class_has_an_example():
    for name in metrics.__all__:
        obj = getattr(metrics, name)
        assert obj.__doc__ and ">>>" in obj.__doc__, name
