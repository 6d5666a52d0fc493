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


# --- a loss-scaled step's overflow flag (found_inf) and scale (grad_scale), honoured on the device ---

def _flagged_run(path, fuse: bool, overflow_at: int | None, make=None, steps: int = 3, scale: float | None = None):
    """Three tables (two of width 4: a fusable set; one of width 1) and a dense head under a fused
    Adam with boost's lazy rows, `steps` clean batches, each step handed ``found_inf`` (0); an
    overflowing batch (NaN gradients, ``found_inf`` 1) inserted before clean step `overflow_at`.
    `scale`: gradients multiplied by it and handed as ``grad_scale`` (GradScaler without unscale_).
    Returns (tables, head, optimizer, snapshots before and after the overflowing step)."""
    from recstream.hostpath import device_path

    torch.manual_seed(0)
    tables = [torch.nn.Embedding(12, d, sparse=True) for d in (4, 4, 1)]
    head = torch.nn.Linear(4, 1)
    make = make or (lambda ps: torch.optim.Adam(ps, lr=0.05, fused=True))
    opt = make([*(t.weight for t in tables), *head.parameters()])
    handle = accept_sparse_rows(opt, [t.weight for t in tables], fuse=fuse)
    assert len(handle.fused) == (1 if fuse else 0)
    gen = torch.Generator().manual_seed(3)
    batches = [torch.randint(0, 12, (10,), generator=gen) for _ in range(steps)]
    order = [(ids, False) for ids in batches]
    if overflow_at is not None:
        order.insert(overflow_at, (batches[overflow_at], True))
    snaps = []
    for ids, bad in order:
        opt.zero_grad(set_to_none=True)
        loss = head(tables[0](ids) + tables[1](ids)).sum() + tables[2](ids).sum()
        (loss * (float("nan") if bad else 1.0) * (scale or 1.0)).backward()
        if bad:
            snaps.append(_snapshot(tables, head, opt))
        opt.found_inf = torch.tensor(float(bad))
        if scale is not None:
            opt.grad_scale = torch.tensor(scale)
        with device_path() if path == "device" else torch.enable_grad():
            opt.step()
        del opt.found_inf
        if scale is not None:
            del opt.grad_scale
        if bad:
            snaps.append(_snapshot(tables, head, opt))
    return tables, head, opt, snaps


def _snapshot(tables, head, opt) -> dict[str, torch.Tensor]:
    out = {}
    for i, p in enumerate([*(t.weight for t in tables), *head.parameters()]):
        out[f"{i}.weight"] = p.detach().clone()
        for key, value in opt.state[p].items():
            out[f"{i}.{key}"] = torch.as_tensor(value).detach().clone()
    return out


def _assert_equal(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for key in a:
        assert torch.equal(a[key].float(), b[key].float()), key


@pytest.mark.parametrize("path", ["device", "host"])
@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "per_table"])
def test_an_overflow_flag_leaves_lazy_rows_moments_and_counts_and_the_next_step_as_if_never_seen(path, fuse):
    """The lazy rows take the flag as fused Adam's own parameters do: an overflowing step (NaN
    gradients) changes no weight, moment or step count, and the steps after it equal those of a run
    that never saw it (the same bits)."""
    tables, head, opt, (before, after) = _flagged_run(path, fuse, overflow_at=1)
    _assert_equal(before, after)
    clean = _flagged_run(path, fuse, overflow_at=None)
    _assert_equal(_snapshot(tables, head, opt), _snapshot(*clean[:3]))
    assert all(float(opt.state[t.weight]["step"]) == 3.0 for t in tables)
    assert all(torch.isfinite(t.weight).all() for t in tables)


def test_an_overflow_flag_keeps_adamws_lazy_weight_decay_off_the_rows():
    """AdamW (boost O2's lazy weight decay) shrinks the touched rows before the update: not where the
    step overflowed."""
    adamw = lambda ps: torch.optim.AdamW(ps, lr=0.05, weight_decay=0.1, fused=True)  # noqa: E731
    for fuse in (True, False):
        tables, head, opt, (before, after) = _flagged_run("device", fuse, overflow_at=2, make=adamw)
        _assert_equal(before, after)
        _assert_equal(_snapshot(tables, head, opt), _snapshot(*_flagged_run("device", fuse, None, make=adamw)[:3]))


@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "per_table"])
def test_a_grad_scale_divides_the_lazy_rows_gradient_as_fused_adam_divides_its_own(fuse):
    """torch's GradScaler without unscale_ hands a fused Adam ``grad_scale`` with the gradients still
    scaled: the lazy rows are divided by it too (a power of two: the same bits as unscaled)."""
    scaled = _flagged_run("device", fuse, overflow_at=None, scale=2.0 ** 7)
    plain = _flagged_run("device", fuse, overflow_at=None)
    _assert_equal(_snapshot(*scaled[:3]), _snapshot(*plain[:3]))
    for t in scaled[0]:
        assert not t.weight.grad._values().abs().lt(1e-3).all()  # the user still sees backward's (scaled) gradient


def test_a_step_with_the_overflow_flag_reads_nothing_on_the_device_path():
    from recstream.hostpath import device_path
    from recstream.testing import SyncCounter

    tables = [torch.nn.Embedding(12, 4, sparse=True) for _ in range(3)]
    opt = torch.optim.Adam([t.weight for t in tables], lr=0.05, fused=True)
    accept_sparse_rows(opt, [t.weight for t in tables], fuse=True)
    ids = torch.tensor([1, 1, 5])
    for i in range(3):
        opt.zero_grad(set_to_none=True)
        sum(t(ids).sum() for t in tables).backward()
        opt.found_inf = torch.tensor(float(i == 2))
        with device_path(), SyncCounter() as counter:
            opt.step()
        del opt.found_inf
        if i:
            assert counter.syncs == 0, dict(counter.sync_ops)


def test_torchs_grad_scaler_drives_the_lazy_rows_like_fused_adams_own():
    """The real protocol: ``torch.amp.GradScaler`` hands a fused Adam ``grad_scale`` and ``found_inf``
    (no unscale_ by the user): the lazy rows are unscaled, and an infinite loss's step is skipped for
    them (weights finite, count not advanced) while the scale halves."""
    def run(scaled: bool, overflow_at: int | None = None):
        torch.manual_seed(0)
        emb, head = torch.nn.Embedding(12, 4, sparse=True), torch.nn.Linear(4, 1)
        opt = torch.optim.Adam([emb.weight, *head.parameters()], lr=0.05, fused=True)
        accept_sparse_rows(opt, [emb.weight])
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8, enabled=scaled)
        gen = torch.Generator().manual_seed(1)
        for i in range(4):
            ids = torch.randint(0, 12, (10,), generator=gen)
            opt.zero_grad()
            loss = head(emb(ids)).sum() * (float("inf") if i == overflow_at else 1.0)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        return emb.weight.detach(), float(opt.state[emb.weight]["step"]), scaler.get_scale() if scaled else None

    scaled, plain = run(True), run(False)
    torch.testing.assert_close(scaled[0], plain[0], rtol=1e-5, atol=1e-6)
    weight, step, scale = run(True, overflow_at=2)
    assert torch.isfinite(weight).all() and step == 3.0 and scale == 2.0 ** 7
