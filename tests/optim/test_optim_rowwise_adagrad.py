"""RowWiseAdagrad against hand-written references and torch.optim.Adagrad."""

import pytest
import torch

from recstream.optim import RowWiseAdagrad

from ._optim_helpers import random_rows, sparse_grad


def reference_step(w, acc, g, lr, eps, wd):
    """Dense row-wise Adagrad on the given rows, written out plainly."""
    g = g + wd * w
    acc = acc + (g ** 2).mean(dim=1)
    w = w - lr * g / (torch.sqrt(acc) + eps)[:, None]
    return w, acc


@pytest.mark.parametrize("wd,init_acc", [(0.0, 0.0), (0.01, 0.1)])
def test_sparse_matches_reference_on_touched_rows(wd, init_acc):
    gen = torch.Generator().manual_seed(0)
    n, d, lr, eps = 40, 6, 0.05, 1e-10
    p = torch.nn.Parameter(torch.randn(n, d, dtype=torch.float64, generator=gen))
    opt = RowWiseAdagrad([p], lr=lr, eps=eps, initial_accumulator_value=init_acc,
                         weight_decay=wd)
    w_ref = p.detach().clone()
    acc_ref = torch.full((n,), init_acc, dtype=torch.float64)
    for _ in range(5):
        rows = random_rows(gen, n, 9)
        vals = torch.randn(9, d, dtype=torch.float64, generator=gen)
        p.grad = sparse_grad(rows, vals, p.shape)
        opt.step()
        new_w, new_acc = reference_step(w_ref[rows], acc_ref[rows], vals, lr, eps, wd)
        w_ref[rows], acc_ref[rows] = new_w, new_acc
        torch.testing.assert_close(p.detach(), w_ref, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(opt.state[p]["sum"], acc_ref, rtol=1e-12, atol=1e-12)
    assert opt.state[p]["step"] == 5


def test_accumulator_is_one_scalar_per_row_mean_of_squares():
    p = torch.nn.Parameter(torch.zeros(5, 4))
    opt = RowWiseAdagrad([p], lr=1.0)
    p.grad = sparse_grad([2], torch.tensor([[1.0, 2.0, 3.0, 4.0]]), p.shape)
    opt.step()
    acc = opt.state[p]["sum"]
    assert acc.shape == (5,)
    assert acc[2].item() == pytest.approx((1 + 4 + 9 + 16) / 4)
    assert torch.equal(acc[[0, 1, 3, 4]], torch.zeros(4))
    # Row step: g / sqrt(mean(g^2)), so the row moves by -g/sqrt(7.5).
    torch.testing.assert_close(p.detach()[2], -torch.tensor([1.0, 2, 3, 4]) / 7.5 ** 0.5)


def test_one_dim_param_equals_torch_adagrad():
    # Every element of a 1-D parameter is its own row, so this is plain Adagrad.
    gen = torch.Generator().manual_seed(1)
    init = torch.randn(17, dtype=torch.float64, generator=gen)
    a = torch.nn.Parameter(init.clone())
    b = torch.nn.Parameter(init.clone())
    kw = dict(lr=0.1, eps=1e-10, initial_accumulator_value=0.05, weight_decay=0.01)
    ours, ref = RowWiseAdagrad([a], **kw), torch.optim.Adagrad([b], **kw)
    for _ in range(6):
        g = torch.randn(17, dtype=torch.float64, generator=gen)
        a.grad, b.grad = g.clone(), g.clone()
        ours.step()
        ref.step()
    torch.testing.assert_close(a.detach(), b.detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ours.state[a]["sum"], ref.state[b]["sum"])


def test_weight_decay_does_not_touch_caller_grad_or_untouched_rows():
    p = torch.nn.Parameter(torch.ones(4, 2))
    opt = RowWiseAdagrad([p], lr=0.1, weight_decay=0.5)
    g = torch.ones(4, 2)
    p.grad = g
    opt.step()
    assert torch.equal(g, torch.ones(4, 2))  # dense grad passed in stays intact
    p.grad = sparse_grad([1], torch.zeros(1, 2), p.shape)
    before = p.detach().clone()
    opt.step()
    # Row 1 has zero gradient but decays (lazy L2 on touched rows); others frozen.
    assert (p.detach()[1] < before[1]).all()
    assert torch.equal(p.detach()[[0, 2, 3]], before[[0, 2, 3]])
