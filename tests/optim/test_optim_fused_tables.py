"""FusedTables: tables of one Adam in one storage step exactly like lazy Adam on each table, and
keep doing so when something swaps their tensors."""
import pytest
import torch

from recstream.optim import FusedTables, LazyAdam
from recstream.optim.sparse_rows import accept_sparse_rows

from ._optim_helpers import sparse_grad

SIZES = (6, 1, 40, 13)


def _tables(seed=0, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(n, 3, generator=gen).to(device)) for n in SIZES]


def _grads(gen, entries=12, device="cpu"):
    return [sparse_grad(torch.randint(0, n, (entries,), generator=gen), torch.randn(entries, 3, generator=gen),
                        (n, 3)).to(device) for n in SIZES]


def _train(ours, ref, adam, lazy, steps, gen, skip=None):
    for step in range(steps):
        for i, g in enumerate(_grads(gen, device=ours[0].device)):
            out = skip is not None and (step, i) == skip
            ours[i].grad = None if out else g
            ref[i].grad = None if out else g.clone()
        adam.step()
        for opt in lazy:
            opt.step()


def _check_equal(ours, ref, adam, lazy):
    for a, b, opt in zip(ours, ref, lazy, strict=True):
        # Duplicate ids are summed in another order by the joint coalesce: float rounding only.
        torch.testing.assert_close(a.detach(), b.detach(), rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(adam.state[a]["exp_avg"], opt.state[b]["exp_avg"], rtol=1e-5, atol=1e-7)
        assert float(adam.state[a]["step"]) == opt.state[b]["step"]


def _setup(device="cpu"):
    ours, ref = _tables(device=device), _tables(device=device)
    adam = torch.optim.Adam(ours, lr=0.05)
    handles = accept_sparse_rows(adam, ours, fuse=True)
    lazy = [LazyAdam([p], lr=0.05) for p in ref]
    return ours, ref, adam, lazy, handles.fused


def test_tables_become_views_of_one_storage_and_keep_their_values():
    ours, ref, adam, _, fused = _setup()
    assert len(fused) == 1 and fused[0].weight.shape == (sum(SIZES), 3)
    base = fused[0].weight.untyped_storage().data_ptr()
    for p, r in zip(ours, ref, strict=True):
        assert isinstance(p, torch.nn.Parameter) and p.is_leaf
        assert p.untyped_storage().data_ptr() == base
        assert torch.equal(p, r)


def test_joint_steps_equal_lazy_adam_on_each_table_also_when_one_sits_a_step_out():
    ours, ref, adam, lazy, fused = _setup()
    gen = torch.Generator().manual_seed(1)
    # Step 2: table 1 has no gradient, so the others step one by one; from then on table 1 is a
    # step behind (its bias correction differs), so the set is not ready for a joint step.
    _train(ours, ref, adam, lazy, 5, gen, skip=(2, 1))
    _check_equal(ours, ref, adam, lazy)
    assert fused[0].ready(adam) is False


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA"))])
def test_the_joint_step_is_what_runs_and_moments_are_views_too(device):
    ours, ref, adam, lazy, fused = _setup(device)
    gen = torch.Generator().manual_seed(2)
    _train(ours, ref, adam, lazy, 3, gen)
    _check_equal(ours, ref, adam, lazy)
    moments = fused[0].exp_avg
    assert moments is not None and moments.shape == (sum(SIZES), 3)
    assert all(adam.state[p]["exp_avg"].untyped_storage().data_ptr() == moments.untyped_storage().data_ptr()
               for p in ours)


def test_a_loaded_optimizer_state_is_fused_again_and_training_goes_on_the_same():
    ours, ref, adam, lazy, fused = _setup()
    gen = torch.Generator().manual_seed(3)
    _train(ours, ref, adam, lazy, 2, gen)
    saved = adam.state_dict()
    saved = {"state": {k: {n: t.clone() for n, t in v.items()} for k, v in saved["state"].items()},
             "param_groups": saved["param_groups"]}
    adam.load_state_dict(saved)  # new tensors: no longer slices of the fused moments
    assert adam.state[ours[0]]["exp_avg"].untyped_storage().data_ptr() != fused[0].exp_avg.untyped_storage().data_ptr()
    _train(ours, ref, adam, lazy, 2, gen)
    _check_equal(ours, ref, adam, lazy)
    assert adam.state[ours[0]]["exp_avg"].untyped_storage().data_ptr() == fused[0].exp_avg.untyped_storage().data_ptr()


def test_a_weight_swapped_by_the_user_is_fused_again_with_its_new_values():
    ours, ref, adam, lazy, fused = _setup()
    gen = torch.Generator().manual_seed(4)
    _train(ours, ref, adam, lazy, 1, gen)
    with torch.no_grad():
        new = torch.full_like(ours[2], 0.5)
        ours[2].data = new.clone()
        ref[2].data = new.clone()
    _train(ours, ref, adam, lazy, 2, gen)
    _check_equal(ours, ref, adam, lazy)
    assert ours[2].untyped_storage().data_ptr() == fused[0].weight.untyped_storage().data_ptr()


def test_only_tables_alike_are_fused():
    with pytest.raises(ValueError, match="two or more tables of one dtype"):
        FusedTables([])
    with pytest.raises(ValueError, match="two or more tables of one dtype"):
        FusedTables([torch.nn.Parameter(torch.zeros(3, 2))])
    with pytest.raises(ValueError, match="two or more tables of one dtype"):
        FusedTables([torch.nn.Parameter(torch.zeros(3, 2)), torch.nn.Parameter(torch.zeros(3, 4))])
    mixed = [torch.nn.Parameter(torch.zeros(3, 2)), torch.nn.Parameter(torch.zeros(4, 2, dtype=torch.float64)),
             torch.nn.Parameter(torch.zeros(5, 2))]
    handles = accept_sparse_rows(torch.optim.Adam(mixed), mixed, fuse=True)
    assert [len(f.params) for f in handles.fused] == [2]  # the two float32 tables
