"""Boost's sparse rows for torch's Adam: tables coalesced together and stepped together give what
each table alone gives (recstream.optim.sparse_rows, _base.coalesce_rows, lazy_adam.lazy_adam_tables)."""
import pytest
import torch

from recstream import sorting
from recstream.optim import LazyAdam
from recstream.optim._base import _rows_and_values, coalesce_rows
from recstream.optim.lazy_adam import lazy_adam_rows, lazy_adam_tables
from recstream.optim.sparse_rows import accept_sparse_rows

from ._optim_helpers import sparse_grad


@pytest.fixture(params=["default sizes", "numpy at every size"])
def numpy_from(request, monkeypatch):
    if request.param != "default sizes":
        monkeypatch.setattr(sorting, "UNIQUE_NUMPY_MIN", 2)


def _grads(gen, sizes, entries=40, dim=3):
    return [sparse_grad(torch.randint(0, n, (entries,), generator=gen), torch.randn(entries, dim, generator=gen),
                        (n, dim)) for n in sizes]


def test_coalesce_rows_equals_coalescing_each_gradient(numpy_from):
    gen = torch.Generator().manual_seed(0)
    sizes = [7, 50, 1, 300]
    grads = _grads(gen, sizes)
    grads[1] = grads[1].coalesce()  # already coalesced: used as it is
    grads.append(torch.randn(5, 3, generator=gen))  # dense: every row
    params = [torch.zeros(n, 3) for n in sizes] + [torch.zeros(5, 3)]
    got = coalesce_rows(params, grads)
    for (rows, values), p, g in zip(got, params, grads, strict=True):
        want_rows, want_values = _rows_and_values(p, g)
        if want_rows is None:
            assert rows is None and values is g
            continue
        assert torch.equal(rows, want_rows)
        torch.testing.assert_close(values, want_values)


def test_lazy_adam_tables_gives_each_table_the_bits_it_gets_alone():
    gen = torch.Generator().manual_seed(1)
    tables, alone = [], []
    for n in (9, 4, 20):
        p, m, v = torch.randn(n, 2, generator=gen), torch.rand(n, 2, generator=gen), torch.rand(n, 2, generator=gen)
        rows = torch.randperm(n, generator=gen)[: n // 2].sort().values
        grad = torch.randn(rows.numel(), 2, generator=gen)
        tables.append((p, rows, grad, m, v))
        alone.append((p.clone(), rows, grad, m.clone(), v.clone()))
    lazy_adam_tables(tables, 3, 0.1, 0.9, 0.99, 1e-8)
    for together, (p, rows, grad, m, v) in zip(tables, alone, strict=True):
        lazy_adam_rows(p, rows, grad, m, v, 3, 0.1, 0.9, 0.99, 1e-8)
        for a, b in zip((together[0], together[3], together[4]), (p, m, v), strict=True):
            assert torch.equal(a, b)


def test_adam_with_sparse_rows_steps_many_tables_like_lazy_adam_on_each(numpy_from):
    """Five tables in one Adam (one joint coalesce, one joint update per step; a table that sits a
    step out has another step count and is updated apart) against LazyAdam on each table."""
    gen = torch.Generator().manual_seed(2)
    sizes = [30, 5, 64, 1, 12]
    ours = [torch.nn.Parameter(torch.randn(n, 4, generator=gen)) for n in sizes]
    ref = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    adam = torch.optim.Adam(ours, lr=0.05, betas=(0.8, 0.95))
    accept_sparse_rows(adam, ours)
    lazy = [LazyAdam([p], lr=0.05, betas=(0.8, 0.95)) for p in ref]
    for step in range(6):
        grads = _grads(gen, sizes, entries=25, dim=4)
        for i, g in enumerate(grads):
            sits_out = step == 2 and i == 3
            ours[i].grad = None if sits_out else g
            ref[i].grad = None if sits_out else g.clone()
        adam.step()
        for opt in lazy:
            opt.step()
    for a, b, opt in zip(ours, ref, lazy, strict=True):
        torch.testing.assert_close(a.detach(), b.detach(), rtol=1e-6, atol=1e-7)
        assert float(adam.state[a]["step"]) == opt.state[b]["step"]
        torch.testing.assert_close(adam.state[a]["exp_avg_sq"], opt.state[b]["exp_avg_sq"])
    assert float(adam.state[ours[3]]["step"]) == 5


def test_adam_with_sparse_rows_steps_tables_of_different_widths():
    """A user's network with a width-4 and a width-1 table under boost: their gradients cannot be
    joined into one values tensor (it raised 'Sizes of tensors must match'); each width gets its own."""
    torch.manual_seed(0)
    wide, narrow, other = (torch.nn.Embedding(20, d, sparse=True) for d in (4, 1, 4))
    params = [wide.weight, narrow.weight, other.weight]
    adam = torch.optim.Adam(params, lr=0.1)
    accept_sparse_rows(adam, params)
    ref = [torch.nn.Parameter(p.detach().clone()) for p in params]
    ref_opt = LazyAdam(ref, lr=0.1)
    ids = torch.tensor([1, 3, 3, 7])
    for tables, opt in ((params, adam), (ref, ref_opt)):
        sum(torch.nn.functional.embedding(ids, t, sparse=True).sum() * (k + 1) for k, t in enumerate(tables)).backward()
        opt.step()
    for p, r in zip(params, ref, strict=True):
        torch.testing.assert_close(p.detach(), r.detach())
