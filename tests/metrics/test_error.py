"""MAE and MSE with MindSpore's normalisation by y.shape[0]."""
import numpy as np
import pytest
import torch

from recstream.metrics import MAE, MSE


def test_mindspore_examples():
    x = torch.tensor([0.1, 0.2, 0.6, 0.9])
    assert MAE()(x, torch.tensor([0.1, 0.25, 0.7, 0.9])) == pytest.approx(0.0375, abs=1e-7)
    assert MSE()(x, torch.tensor([0.1, 0.25, 0.5, 0.9])) == pytest.approx(0.003125, abs=1e-8)


def test_sum_over_all_elements_divided_by_rows():
    y_pred = [[1.0, 2.0], [3.0, 4.0]]
    zeros = [[0.0, 0.0], [0.0, 0.0]]
    assert MAE()(y_pred, zeros) == 5.0  # 10 / 2 rows
    assert MSE()(y_pred, zeros) == 15.0  # 30 / 2 rows
    # y is reshaped to y_pred's shape but the divisor is y.shape[0], as in MindSpore
    assert MAE()(y_pred, [0.0, 0.0, 0.0, 0.0]) == 2.5
    assert MSE()([1.0, 2.0], [[0.0], [0.0]]) == 2.5


def test_accumulates_over_batches_and_dtypes():
    m = MSE()
    m.update(np.array([1.0, 2.0]), np.array([0.0, 0.0]))  # 5
    m.update(torch.tensor([[3.0]], dtype=torch.bfloat16), torch.tensor([1]))  # 4
    assert m.eval() == 3.0  # 9 / 3
    assert MAE()(torch.tensor([3, 1]), torch.tensor([1, 1])) == 1.0  # integer inputs


def test_bad_inputs():
    with pytest.raises(ValueError, match=r"y must have as many elements as y_pred to be reshaped to \(2,\), "
                                         r"got y of shape \(3,\)"):
        MAE().update([1.0, 2.0], [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="y must have a sample dimension"):
        MSE().update(torch.tensor(1.0), torch.tensor(1.0))
    with pytest.raises(RuntimeError, match="MSE can not be calculated"):
        MSE().eval()
    with pytest.raises(ValueError, match=r"MAE.update: expects 2 input\(s\)"):
        MAE().update([1.0])
