"""FTRL-Proximal against a scalar, per-coordinate reference of the paper."""

import math

import pytest
import torch

from recstream.optim import FTRL

from ._optim_helpers import random_rows, sparse_grad


def ftrl_coordinate(w, n, z, g, alpha, power, l1, l2):
    """One FTRL-Proximal step for one coordinate, McMahan et al. 2013 (beta=0)."""
    n_new = n + g * g
    sigma = (n_new ** power - n ** power) / alpha
    z = z + g - sigma * w
    n = n_new
    if abs(z) <= l1:
        w = 0.0
    else:
        w = -(z - math.copysign(l1, z)) / (n ** power / alpha + l2)
    return w, n, z


@pytest.mark.parametrize("lr_power,l1,l2", [(-0.5, 0.0, 0.0), (-0.5, 0.3, 0.2),
                                            (-0.3, 0.1, 1.0), (0.0, 0.05, 0.0)])
def test_matches_scalar_reference_on_touched_rows(lr_power, l1, l2):
    gen = torch.Generator().manual_seed(0)
    rows_n, d, alpha, init_acc = 20, 3, 0.2, 0.1
    p = torch.nn.Parameter(torch.randn(rows_n, d, dtype=torch.float64, generator=gen) * 0.1)
    opt = FTRL([p], lr=alpha, lr_power=lr_power, l1=l1, l2=l2,
               initial_accumulator_value=init_acc)
    w = p.detach().clone().tolist()
    n = [[init_acc] * d for _ in range(rows_n)]
    z = [[0.0] * d for _ in range(rows_n)]
    for _ in range(6):
        rows = random_rows(gen, rows_n, 8)
        vals = torch.randn(8, d, dtype=torch.float64, generator=gen)
        p.grad = sparse_grad(rows, vals, p.shape)
        opt.step()
        for r, gr in zip(rows.tolist(), vals.tolist(), strict=True):
            for c in range(d):
                w[r][c], n[r][c], z[r][c] = ftrl_coordinate(
                    w[r][c], n[r][c], z[r][c], gr[c], alpha, -lr_power, l1, l2)
    dt = torch.float64
    torch.testing.assert_close(p.detach(), torch.tensor(w, dtype=dt), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(opt.state[p]["accumulator"], torch.tensor(n, dtype=dt))
    torch.testing.assert_close(opt.state[p]["linear"], torch.tensor(z, dtype=dt))


def _train_logistic(l1):
    # Logistic regression: feature 0 predicts the label, features 1..9 are noise.
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2000, 10, generator=gen)
    y = (x[:, 0] > 0).float()
    w = torch.nn.Parameter(torch.zeros(10))
    opt = FTRL([w], lr=0.5, l1=l1)
    for i in range(0, 2000, 50):
        loss = torch.nn.functional.binary_cross_entropy_with_logits(x[i:i + 50] @ w,
                                                                    y[i:i + 50])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return w.detach()


def test_l1_drives_noise_features_to_exact_zero():
    w = _train_logistic(l1=1.0)
    assert w[0].item() > 1.0
    assert torch.equal(w[1:], torch.zeros(9))
    # Without L1 the same run leaves the noise weights non-zero.
    assert (_train_logistic(l1=0.0)[1:] != 0).all()


def test_dense_grad_updates_every_coordinate():
    p = torch.nn.Parameter(torch.zeros(3, 2))
    opt = FTRL([p], lr=0.1)
    p.grad = torch.ones(3, 2)
    opt.step()
    # n = 0.1 + 1, z = 1, w = -z / (sqrt(n) / lr)
    torch.testing.assert_close(p.detach(), torch.full((3, 2), -0.1 / math.sqrt(1.1)))
