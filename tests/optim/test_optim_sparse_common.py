"""Behaviour shared by all row-sparse optimizers: laziness, duplicates, state, e2e."""

import io

import pytest
import torch
from torch import nn

from recstream.optim import FTRL, LazyAdam, RowWiseAdagrad

from ._optim_helpers import random_rows, sparse_grad

FACTORIES = {
    "rowwise_adagrad": lambda ps: RowWiseAdagrad(ps, lr=0.1, weight_decay=1e-4),
    "lazy_adam": lambda ps: LazyAdam(ps, lr=0.05),
    "ftrl": lambda ps: FTRL(ps, lr=0.1, l1=0.01, l2=0.1),
}
STATE_KEYS = {"rowwise_adagrad": ["sum"], "lazy_adam": ["exp_avg", "exp_avg_sq"],
              "ftrl": ["accumulator", "linear"]}


def _state_rows(opt, p, name, rows):
    return {k: opt.state[p][k][rows].clone() for k in STATE_KEYS[name]}


@pytest.fixture(params=sorted(FACTORIES))
def name(request):
    return request.param


def test_untouched_rows_and_state_are_unchanged(name):
    gen = torch.Generator().manual_seed(0)
    p = nn.Parameter(torch.randn(20, 4, generator=gen))
    opt = FACTORIES[name]([p])
    p.grad = sparse_grad([0, 5, 7], torch.randn(3, 4, generator=gen), p.shape)
    opt.step()  # initialise state
    frozen = torch.tensor([1, 2, 3, 4, 6, 8, 19])
    w_before = p.detach()[frozen].clone()
    st_before = _state_rows(opt, p, name, frozen)
    touched = torch.tensor([5, 9, 12])
    w_touched = p.detach()[touched].clone()
    for _ in range(3):
        p.grad = sparse_grad(touched, torch.randn(3, 4, generator=gen), p.shape)
        opt.step()
    assert torch.equal(p.detach()[frozen], w_before)
    for k, v in _state_rows(opt, p, name, frozen).items():
        assert torch.equal(v, st_before[k]), k
    assert (p.detach()[touched] != w_touched).any(dim=1).all()


def test_duplicate_indices_are_summed(name):
    gen = torch.Generator().manual_seed(1)
    init = torch.randn(10, 3, generator=gen)
    a, b = nn.Parameter(init.clone()), nn.Parameter(init.clone())
    opt_a, opt_b = FACTORIES[name]([a]), FACTORIES[name]([b])
    v = torch.randn(4, 3, generator=gen)
    for _ in range(2):
        a.grad = sparse_grad([4, 2, 4, 4], v, a.shape)  # uncoalesced duplicates
        b.grad = sparse_grad([2, 4], torch.stack([v[1], v[0] + v[2] + v[3]]), b.shape)
        opt_a.step()
        opt_b.step()
    torch.testing.assert_close(a.detach(), b.detach(), rtol=1e-6, atol=1e-6)


def test_dense_grad_equals_sparse_grad_over_all_rows(name):
    gen = torch.Generator().manual_seed(2)
    init = torch.randn(6, 5, dtype=torch.float64, generator=gen)
    a, b = nn.Parameter(init.clone()), nn.Parameter(init.clone())
    opt_a, opt_b = FACTORIES[name]([a]), FACTORIES[name]([b])
    for _ in range(3):
        g = torch.randn(6, 5, dtype=torch.float64, generator=gen)
        a.grad = g.clone()
        b.grad = sparse_grad(torch.arange(6), g, g.shape)
        opt_a.step()
        opt_b.step()
    torch.testing.assert_close(a.detach(), b.detach(), rtol=1e-12, atol=1e-12)


def test_state_dict_round_trip_resumes_identically(name):
    gen = torch.Generator().manual_seed(3)
    p = nn.Parameter(torch.randn(30, 4, generator=gen))
    opt = FACTORIES[name]([p])
    grads = [(random_rows(gen, 30, 6), torch.randn(6, 4, generator=gen)) for _ in range(6)]
    for rows, vals in grads[:3]:
        p.grad = sparse_grad(rows, vals, p.shape)
        opt.step()
    buf = io.BytesIO()
    torch.save(opt.state_dict(), buf)
    buf.seek(0)
    q = nn.Parameter(p.detach().clone())
    resumed = FACTORIES[name]([q])
    resumed.load_state_dict(torch.load(buf, weights_only=True))
    for rows, vals in grads[3:]:
        p.grad = sparse_grad(rows, vals, p.shape)
        q.grad = sparse_grad(rows, vals, q.shape)
        opt.step()
        resumed.step()
    assert torch.equal(p.detach(), q.detach())
    for k in STATE_KEYS[name] + ["step"]:
        assert torch.equal(torch.as_tensor(opt.state[p][k]), torch.as_tensor(resumed.state[q][k]))


@pytest.mark.parametrize("name", ["rowwise_adagrad", "lazy_adam"])
def test_lr_is_read_from_param_group_each_step(name):
    # First steps of Adagrad/Adam move weights by an amount proportional to lr.
    init = torch.randn(5, 2)
    a, b = nn.Parameter(init.clone()), nn.Parameter(init.clone())
    opt_a, opt_b = FACTORIES[name]([a]), FACTORIES[name]([b])
    sched = torch.optim.lr_scheduler.LambdaLR(opt_b, lambda epoch: 0.5)
    assert opt_b.param_groups[0]["lr"] == pytest.approx(opt_a.param_groups[0]["lr"] / 2)
    g = sparse_grad([1, 3], torch.ones(2, 2), a.shape)
    a.grad, b.grad = g, g.clone()
    opt_a.step()
    opt_b.step()
    sched.step()
    torch.testing.assert_close(b.detach() - init, (a.detach() - init) / 2)


def test_param_groups_use_their_own_hyper_parameters(name):
    a, b = nn.Parameter(torch.zeros(4, 2)), nn.Parameter(torch.zeros(4, 2))
    opt = FACTORIES[name]([{"params": [a]}, {"params": [b], "lr": 1e-3}])
    for p in (a, b):
        p.grad = sparse_grad([0], torch.ones(1, 2), p.shape)
    opt.step()
    assert a.detach()[0].abs().min() > 10 * b.detach()[0].abs().max() > 0


def test_embedding_bag_end_to_end_loss_decreases(name):
    torch.manual_seed(0)
    num_ids, bag = 200, 3  # odd bag size: no ties
    # Each id has a hidden +-1 score; the label says whether the bag sums > 0.
    score = torch.randint(0, 2, (num_ids,)).float() * 2 - 1
    emb = nn.EmbeddingBag(num_ids, 1, mode="sum", sparse=True)
    nn.init.zeros_(emb.weight)
    opt = FACTORIES[name](emb.parameters())
    opt.param_groups[0]["lr"] = 0.5  # sparse ids get few, small updates: use a larger lr
    losses = []
    for _ in range(300):
        ids = torch.randint(0, num_ids, (64, bag))
        y = (score[ids].sum(1) > 0).float()
        loss = nn.functional.binary_cross_entropy_with_logits(emb(ids).squeeze(1), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        assert emb.weight.grad.is_sparse
        opt.step()
        losses.append(loss.item())
    assert sum(losses[-10:]) < 0.6 * sum(losses[:10])


def test_zero_dim_and_one_dim_params(name):
    s, v = nn.Parameter(torch.tensor(0.0)), nn.Parameter(torch.zeros(3))
    opt = FACTORIES[name]([s, v])
    for _ in range(2):
        s.grad, v.grad = torch.tensor(2.0), torch.tensor([1.0, 0.0, -1.0])
        opt.step()
    assert s.shape == () and s.item() < 0.0
    assert v[0].item() < 0.0 == v[1].item() < v[2].item()


@pytest.mark.parametrize("dim", [1, 16])
def test_a_large_gradient_is_summed_like_coalesce(name, dim):
    """From VECTORIZED_COALESCE_MIN entries a CPU gradient is summed by unique + index_add_, not
    coalesce(): the same rows, sums equal to float rounding, and the same step."""
    from recstream.optim import _base
    gen = torch.Generator().manual_seed(1)
    n = _base.VECTORIZED_COALESCE_MIN + 1000
    idx = torch.randint(0, 3000, (n,), generator=gen)  # many duplicates, unsorted
    values = torch.randn(n, dim, generator=gen)
    grad = torch.sparse_coo_tensor(idx[None], values, (3000, dim), check_invariants=True)
    assert not grad.is_coalesced()
    rows, summed = _base._rows_and_values(grad, grad)
    ref = grad.coalesce()
    assert torch.equal(rows, ref.indices()[0])
    torch.testing.assert_close(summed, ref.values(), rtol=1e-5, atol=1e-5)
    stepped = []
    for g in (grad, ref):  # the same optimizer step either way
        p = nn.Parameter(torch.randn(3000, dim, generator=torch.Generator().manual_seed(2)))
        opt = FACTORIES[name]([p])
        p.grad = g
        opt.step()
        stepped.append(p.detach().clone())
    torch.testing.assert_close(stepped[0], stepped[1], rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_steps_equal_cpu_steps(name):
    """On CUDA the gradient is summed by coalesce() (index_add_ sums in a varying order there):
    a few steps with duplicate rows, small and large gradients, give the CPU's parameters and state."""
    gen = torch.Generator().manual_seed(3)
    params = {dev: nn.Parameter(torch.randn(3000, 8, generator=torch.Generator().manual_seed(4)).to(dev))
              for dev in ("cpu", "cuda")}
    opts = {dev: FACTORIES[name]([p]) for dev, p in params.items()}
    for n in (50, 9000, 50):  # 9000: above VECTORIZED_COALESCE_MIN, the CPU's other summing path
        idx, values = torch.randint(0, 3000, (n,), generator=gen), torch.randn(n, 8, generator=gen)
        for dev, p in params.items():
            p.grad = sparse_grad(idx, values, p.shape).to(dev)
            opts[dev].step()
    torch.testing.assert_close(params["cuda"].detach().cpu(), params["cpu"].detach(), rtol=1e-4, atol=1e-5)
    for key in STATE_KEYS[name]:
        torch.testing.assert_close(opts["cuda"].state[params["cuda"]][key].cpu(),
                                   opts["cpu"].state[params["cpu"]][key], rtol=1e-4, atol=1e-5)
