"""The compiled row updates of LazyAdam, RowWiseAdagrad and FTRL (recstream/optim/_row_kernels.c) against
their torch ops, and the kernels' refusals of bad arguments."""

import numpy as np
import pytest
import torch

from recstream.optim import FTRL, LazyAdam, RowWiseAdagrad, native

from ._optim_helpers import random_rows, sparse_grad


class CountingKernels:
    """native.kernels that counts its calls, so a test knows which path ran."""

    def __init__(self, kernels):
        self.kernels, self.calls = kernels, 0

    def __getattr__(self, name):
        fn = getattr(self.kernels, name)

        def counted(*args):
            self.calls += 1
            return fn(*args)
        return counted


@pytest.fixture
def counting(monkeypatch):
    if not native.AVAILABLE:
        pytest.fail("recstream.optim._row_kernels was not built (pip install -e . needs a C compiler)")
    kernels = CountingKernels(native.kernels)
    monkeypatch.setattr(native, "kernels", kernels)
    return kernels


def train(cls, shape, kwargs, kernels, monkeypatch, steps=6, dtype=torch.float32, dense_step=False):
    """`steps` sparse steps (duplicated rows included) of `cls` on a fresh table; its weight and state."""
    monkeypatch.setattr(native, "kernels", kernels)
    gen = torch.Generator().manual_seed(0)
    p = torch.nn.Parameter(torch.randn(shape, dtype=dtype, generator=gen))
    opt = cls([p], **kwargs)
    for step in range(steps):
        rows = torch.cat([random_rows(gen, shape[0], 12), torch.tensor([0, 0])])  # row 0 thrice: summed first
        values = torch.randn(len(rows), *shape[1:], dtype=dtype, generator=gen)
        p.grad = sparse_grad(rows, values, shape)
        if dense_step and step == 3:
            p.grad = p.grad.to_dense()  # every row counts: the torch ops, in place
        opt.step()
    return p.detach(), {k: v for k, v in opt.state[p].items() if torch.is_tensor(v)}


CASES = [
    (LazyAdam, (50, 16), dict(lr=0.01)),
    (LazyAdam, (50,), dict(lr=0.1, betas=(0.3, 0.99), eps=1e-6)),  # 1 - beta1 >= 0.5: lerp's other form
    (RowWiseAdagrad, (50, 16), dict(lr=0.1)),
    (RowWiseAdagrad, (50, 5), dict(lr=0.1, weight_decay=0.01, initial_accumulator_value=0.1, eps=1e-6)),
    (RowWiseAdagrad, (50, 1), dict(lr=0.1)),
    (RowWiseAdagrad, (50,), dict(lr=0.1, weight_decay=0.02)),
    (FTRL, (50, 1), dict(lr=0.05, l1=0.01, l2=0.1)),
    (FTRL, (50, 16), dict(lr=0.5)),
    (FTRL, (50, 3), dict(lr=0.05, l1=0.5, initial_accumulator_value=0.0)),
]


@pytest.mark.parametrize("cls,shape,kwargs", CASES)
def test_kernels_update_rows_as_the_torch_ops_do(cls, shape, kwargs, counting, monkeypatch):
    got, got_state = train(cls, shape, kwargs, counting, monkeypatch, dense_step=True)
    assert counting.calls == 5  # every sparse step ran on the kernels, the dense one on torch ops
    want, want_state = train(cls, shape, kwargs, None, monkeypatch, dense_step=True)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    assert got_state.keys() == want_state.keys()
    for key in want_state:
        torch.testing.assert_close(got_state[key], want_state[key], rtol=1e-6, atol=1e-6)
    if "l1" in kwargs:
        assert (got == 0).any()  # FTRL's L1 zeroed some rows, on both paths alike
        assert torch.equal(got == 0, want == 0)


@pytest.mark.parametrize("cls,kwargs", [(RowWiseAdagrad, dict(lr=0.1)), (FTRL, dict(lr=0.1, lr_power=-0.3))])
def test_what_the_kernels_do_not_cover_runs_on_torch_ops(cls, kwargs, counting, monkeypatch):
    dtype = torch.float64 if cls is RowWiseAdagrad else torch.float32  # float64; FTRL's lr_power != -0.5
    got, _ = train(cls, (30, 4), kwargs, counting, monkeypatch, dtype=dtype)
    assert counting.calls == 0
    want, _ = train(cls, (30, 4), kwargs, None, monkeypatch, dtype=dtype)
    assert torch.equal(got, want)


def test_reset_rows_of_a_hash_table_still_apply_on_the_kernel_path(counting, monkeypatch):
    p = torch.nn.Parameter(torch.ones(10, 4))
    opt = RowWiseAdagrad([p], lr=0.1, initial_accumulator_value=0.5)
    p.grad = sparse_grad([1, 2], torch.ones(2, 4), p.shape)
    opt.step()
    p.pop_reset_rows = lambda: torch.tensor([2])
    p.grad = sparse_grad([3], torch.ones(1, 4), p.shape)
    opt.step()
    assert counting.calls == 2
    torch.testing.assert_close(opt.state[p]["sum"][[1, 2, 3]], torch.tensor([1.5, 0.5, 1.5]))


def arrays(num_rows=8, dim=4, n=3):
    w = np.zeros(num_rows * dim, np.float32)
    state = np.ones(num_rows, np.float32)
    rows = np.arange(n, dtype=np.int64)
    grad = np.ones(n * dim, np.float32)
    return w, state, rows, grad


@pytest.mark.parametrize("change,error,match", [
    (dict(rows=np.array([0, 8, 1])), ValueError, r"rows\[1\] = 8 is outside the table's 8 rows"),
    (dict(rows=np.array([0, -1, 1])), ValueError, r"rows\[1\] = -1"),
    (dict(grad=np.ones(11, np.float32)), ValueError, "grad holds 11 values, expected 3"),
    (dict(state=np.ones(7, np.float32)), ValueError, "state buffer 1 holds 7 values, expected 8"),
    (dict(dim=3), ValueError, "dim must be > 0 and divide"),
    (dict(dim=0), ValueError, "dim must be > 0"),
    (dict(w=np.zeros(32, np.float64)), TypeError, "weight must be a float32 buffer"),
    (dict(rows=np.arange(3, dtype=np.int32)), TypeError, "rows must be a int64 buffer"),
    (dict(w=np.zeros(64, np.float32)[::2]), TypeError, "weight must be a C-contiguous writable float32"),
    (dict(readonly=True), TypeError, "weight must be a C-contiguous writable float32"),
])
def test_rowwise_adagrad_kernel_refuses_bad_arguments_before_writing(change, error, match, counting):
    w, state, rows, grad = arrays()
    w = change.get("w", w)
    if change.get("readonly"):
        w.flags.writeable = False
    state, rows, grad = change.get("state", state), change.get("rows", rows), change.get("grad", grad)
    before = (w.copy(), state.copy())
    with pytest.raises(error, match=match):
        counting.rowwise_adagrad(w, state, rows, grad, change.get("dim", 4), 0.1, 1e-10, 0.0)
    assert np.array_equal(w, before[0]) and np.array_equal(state, before[1])


def test_ftrl_kernel_refuses_bad_arguments_before_writing(counting):
    w, _, rows, grad = arrays()
    acc, lin = np.ones(32, np.float32), np.zeros(32, np.float32)
    with pytest.raises(ValueError, match="state buffer 2 holds 31 values, expected 32"):
        counting.ftrl(w, acc, lin[:31], rows, grad, 4, 0.1, 0.0, 0.0)
    with pytest.raises(ValueError, match="lr must be > 0"):
        counting.ftrl(w, acc, lin, rows, grad, 4, 0.0, 0.0, 0.0)
    with pytest.raises(ValueError, match=r"rows\[2\] = 9"):
        counting.ftrl(w, acc, lin, np.array([0, 1, 9]), grad, 4, 0.1, 0.0, 0.0)
    assert not w.any() and (acc == 1).all() and not lin.any()


def test_boost_hooks_on_torch_adam_run_the_kernel(counting, monkeypatch):
    """accept_sparse_rows (boost O1 on a user's Adam) steps its row-sparse tables on the kernel."""
    from recstream.optim.sparse_rows import accept_sparse_rows

    def run(kernels):
        monkeypatch.setattr(native, "kernels", kernels)
        torch.manual_seed(0)
        tables = torch.nn.ModuleList(torch.nn.Embedding(40, 8, sparse=True) for _ in range(3))
        opt = torch.optim.Adam(tables.parameters(), lr=0.05)
        accept_sparse_rows(opt, list(tables.parameters()), fuse=True)
        for step in range(4):
            ids = torch.randint(0, 40, (3, 16), generator=torch.Generator().manual_seed(step))
            sum(t(ids[i]).pow(2).sum() for i, t in enumerate(tables)).backward()
            opt.step()
            opt.zero_grad()
        return [t.weight.detach().clone() for t in tables]

    got = run(counting)
    assert counting.calls == 4  # one fused set of three tables, one call per step
    for a, b in zip(got, run(None), strict=True):  # weights ~1 moved by lr 0.05 four times: a few ulps apart
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
