"""LazyAdam against torch.optim.Adam / SparseAdam and the global-step choice."""

import math

import torch

from recstream.optim import LazyAdam

from ._optim_helpers import random_rows, sparse_grad


def test_dense_grads_equal_torch_adam():
    gen = torch.Generator().manual_seed(0)
    init = torch.randn(30, 8, generator=gen)
    a, b = torch.nn.Parameter(init.clone()), torch.nn.Parameter(init.clone())
    ours = LazyAdam([a], lr=0.01, betas=(0.8, 0.99), eps=1e-6)
    ref = torch.optim.Adam([b], lr=0.01, betas=(0.8, 0.99), eps=1e-6)
    for _ in range(10):
        g = torch.randn(30, 8, generator=gen)
        a.grad, b.grad = g.clone(), g.clone()
        ours.step()
        ref.step()
    torch.testing.assert_close(a.detach(), b.detach(), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(ours.state[a]["exp_avg_sq"], ref.state[b]["exp_avg_sq"])


def test_sparse_grads_touching_every_row_equal_torch_adam():
    gen = torch.Generator().manual_seed(1)
    n, d = 12, 4
    init = torch.randn(n, d, dtype=torch.float64, generator=gen)
    a, b = torch.nn.Parameter(init.clone()), torch.nn.Parameter(init.clone())
    ours, ref = LazyAdam([a], lr=0.05), torch.optim.Adam([b], lr=0.05)
    for _ in range(8):
        # Every row, shuffled and with one duplicate split in two halves.
        rows = torch.cat([torch.randperm(n, generator=gen), torch.tensor([3])])
        vals = torch.randn(n + 1, d, dtype=torch.float64, generator=gen)
        a.grad = sparse_grad(rows, vals, (n, d))
        b.grad = a.grad.to_dense()
        ours.step()
        ref.step()
    torch.testing.assert_close(a.detach(), b.detach(), rtol=1e-12, atol=1e-12)


def test_matches_sparse_adam_on_random_row_subsets():
    gen = torch.Generator().manual_seed(2)
    n, d = 50, 3
    init = torch.randn(n, d, dtype=torch.float64, generator=gen)
    a, b = torch.nn.Parameter(init.clone()), torch.nn.Parameter(init.clone())
    # Tiny eps: SparseAdam adds eps before the sqrt(1-beta2^t) rescaling.
    ours = LazyAdam([a], lr=0.02, eps=1e-12)
    ref = torch.optim.SparseAdam([b], lr=0.02, eps=1e-12)
    for _ in range(10):
        rows = random_rows(gen, n, 7)
        vals = torch.randn(7, d, dtype=torch.float64, generator=gen)
        a.grad = sparse_grad(rows, vals, (n, d))
        b.grad = sparse_grad(rows, vals, (n, d))
        ours.step()
        ref.step()
    torch.testing.assert_close(a.detach(), b.detach(), rtol=1e-9, atol=1e-11)


def test_row_first_touched_late_uses_global_step_bias_correction():
    lr, b1, b2, eps = 0.1, 0.9, 0.999, 1e-8
    p = torch.nn.Parameter(torch.zeros(4, 2, dtype=torch.float64))
    opt = LazyAdam([p], lr=lr, betas=(b1, b2), eps=eps)
    for _ in range(4):  # steps 1..4 touch row 0 only
        p.grad = sparse_grad([0], torch.ones(1, 2, dtype=torch.float64), p.shape)
        opt.step()
    g = torch.tensor([[2.0, -0.5]], dtype=torch.float64)
    p.grad = sparse_grad([3], g, p.shape)
    opt.step()  # step 5: row 3 seen for the first time
    t = 5
    m, v = (1 - b1) * g[0], (1 - b2) * g[0] ** 2
    expected = -lr / (1 - b1 ** t) * m / (v.sqrt() / math.sqrt(1 - b2 ** t) + eps)
    torch.testing.assert_close(p.detach()[3], expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(opt.state[p]["exp_avg"][3], m)
    # Rows 1 and 2 were never touched: weights and moments are still zero.
    assert not p.detach()[1:3].any()
    assert not opt.state[p]["exp_avg"][1:3].any() and not opt.state[p]["exp_avg_sq"][1:3].any()
    assert opt.state[p]["step"] == 5
