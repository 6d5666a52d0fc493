"""LogLoss and MindSpore's Loss metric."""
import math

import numpy as np
import pytest
import torch

from recstream.metrics import LogLoss, Loss


def test_logloss_hand_computed():
    expected = -(math.log(0.9) + math.log(0.8)) / 2
    assert LogLoss()([0.9, 0.2], [1, 0]) == pytest.approx(expected, abs=1e-12)
    # float32 inputs: 0.9 and 0.2 are rounded before the float64 loss
    assert LogLoss()(torch.tensor([[0.9], [0.2]]), torch.tensor([[1], [0]])) == pytest.approx(expected, abs=1e-7)


def test_logloss_mean_over_samples_across_batches():
    m = LogLoss()
    m.update([0.9], [1])
    m.update([0.2, 0.5], [0, 1])
    assert m.eval() == pytest.approx(-(math.log(0.9) + math.log(0.8) + math.log(0.5)) / 3, abs=1e-12)


def test_logloss_clips_probabilities():
    # p = 0 for a positive and p = 1 for a negative both cost -log(eps)
    assert LogLoss()([0.0, 1.0], [1, 0]) == pytest.approx(-math.log(1e-15), rel=1e-12)
    assert LogLoss(eps=1e-3)([0.0], [1]) == pytest.approx(-math.log(1e-3), rel=1e-9)
    # computed in float64 even for float32 input, so 1 - eps is not rounded to 1
    assert math.isfinite(LogLoss()(torch.tensor([1.0], dtype=torch.float32), torch.tensor([0.0])))


def test_logloss_soft_targets_and_low_precision():
    assert LogLoss()([0.5], [0.5]) == pytest.approx(math.log(2), abs=1e-12)
    p = torch.tensor([0.9, 0.2], dtype=torch.bfloat16)
    assert LogLoss()(p, [1, 0]) == pytest.approx(LogLoss()(p.double(), [1, 0]), abs=1e-12)


def test_logloss_bad_inputs():
    with pytest.raises(ValueError, match="LogLoss: 'eps' must be a finite number > 0 and < 0.5, got 0"):
        LogLoss(eps=0)
    with pytest.raises(ValueError, match="'eps' must be a finite number > 0 and < 0.5, got 0.5"):
        LogLoss(eps=0.5)
    with pytest.raises(TypeError, match=r"LogLoss: 'eps' must be a finite number > 0 and < 0.5, got '1e-7' \(str\)"):
        LogLoss(eps="1e-7")
    with pytest.raises(ValueError, match=r"y_pred must have shape \(N,\), \(N, 1\), got \(2, 2\)"):
        LogLoss().update([[0.1, 0.9], [0.2, 0.8]], [1, 0])
    with pytest.raises(RuntimeError, match="number of samples is 0"):
        LogLoss().eval()
    with pytest.raises(ValueError, match=r"y must be targets in \[0, 1\].*first one: 2.0"):
        LogLoss()([0.5, 0.5], [0, 2])
    with pytest.raises(ValueError, match=r"y_pred must be probabilities in \[0, 1\].*first one: nan"):
        LogLoss()([float("nan")], [1])
    with pytest.raises(ValueError, match=r"y_pred must be probabilities in \[0, 1\].*first one: -2.0"):
        LogLoss()([0.5, -2.0], [1, 0])


def test_loss_mindspore_example_and_batch_mean():
    assert Loss()(torch.tensor(0.2)) == pytest.approx(0.2, abs=1e-7)
    m = Loss()
    m.update(torch.tensor(0.2))
    m.update(np.array([0.4, 0.8]))  # counts once, as 0.6
    m.update([1.0])
    assert m.eval() == pytest.approx((0.2 + 0.6 + 1.0) / 3, abs=1e-7)
    m.update(torch.tensor(3.0, dtype=torch.float16))
    assert m.eval() == pytest.approx((0.2 + 0.6 + 1.0 + 3.0) / 4, abs=1e-6)


def test_loss_bad_inputs():
    with pytest.raises(ValueError, match=r"expects 1 input\(s\) \(loss,\), got 2"):
        Loss().update(0.1, 0.2)
    with pytest.raises(ValueError, match=r"loss must be a scalar or 1-D, got shape \(2, 2\)"):
        Loss().update(torch.ones(2, 2))
    with pytest.raises(ValueError, match="loss must not be empty"):
        Loss().update(torch.ones(0))
    with pytest.raises(RuntimeError, match="number of batches is 0"):
        Loss().eval()
    with pytest.raises(TypeError, match="loss must be a torch.Tensor.*Python number, got str"):
        Loss().update("0.1")
