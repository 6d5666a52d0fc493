"""Loss-scale managers and the scaled step: skip on overflow, scale updates, unscaling."""
import copy

import pytest
import torch
from torch import nn

from recstream.train import loss_scale as ls
from recstream.train.amp import CastNetwork, build_train_network
from recstream.train.loss_scale import (
    DynamicLossScaleManager,
    DynamicLossScaleUpdateCell,
    FixedLossScaleManager,
    FixedLossScaleUpdateCell,
    TrainOneStepWithLossScaleCell,
    unscale_grads_,
)

INF = float("inf")


class Scaled(nn.Module):
    """loss = mean((w * x - 1)^2): an inf in x makes the gradient of w non-finite."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.tensor([0.5, -1.0, 2.0]))

    def forward(self, x):
        return ((self.w * x - 1) ** 2).mean()


def setup(scale_sense, opt=torch.optim.Adam):
    net = Scaled()
    optimizer = opt(net.parameters(), lr=0.1)
    return net, optimizer, TrainOneStepWithLossScaleCell(net, optimizer, scale_sense)


CLEAN, BAD = torch.ones(3), torch.tensor([1.0, INF, 1.0])


def snapshot(net, optimizer):
    return copy.deepcopy(net.state_dict()), copy.deepcopy(optimizer.state_dict())


def assert_same(a, b):
    (pa, oa), (pb, ob) = a, b
    assert all(torch.equal(pa[k], pb[k]) for k in pa)
    for i, state in oa["state"].items():
        assert all(torch.equal(v, ob["state"][i][k]) for k, v in state.items())


def test_overflow_skips_step_bit_identical_and_halves_scale():
    manager = DynamicLossScaleManager(init_loss_scale=2 ** 10, scale_window=100)
    net, opt, step = setup(manager.get_update_cell())
    for _ in range(3):  # Adam state (moments, step count) exists before the overflow
        step(CLEAN * 0.3)
    before = snapshot(net, opt)
    loss, overflow, scale = step(BAD)
    assert overflow.dtype == torch.bool and overflow.item() is True
    assert scale.item() == 2 ** 10  # the scale used in this step
    assert manager.get_loss_scale() == 2 ** 9 and step.loss_scale.item() == 2 ** 9
    assert_same(before, snapshot(net, opt))
    _, overflow, _ = step(CLEAN * 0.3)
    assert not overflow and not torch.equal(before[0]["w"], net.w)


def test_scale_floor_and_growth_window():
    cell = DynamicLossScaleUpdateCell(2.0, scale_factor=4, scale_window=3)
    cell(torch.tensor(True))
    assert cell.loss_scale.item() == 1.0  # 2 / 4 would be 0.5: floored at 1
    cell(torch.tensor(True))
    assert cell.loss_scale.item() == 1.0
    for expected in (1.0, 1.0, 4.0, 4.0, 4.0, 16.0):  # x4 after every 3 consecutive clean steps
        cell(torch.tensor(False))
        assert cell.loss_scale.item() == expected
    cell(torch.tensor(False)), cell(torch.tensor(False)), cell(torch.tensor(True))  # overflow resets the count
    cell(torch.tensor(False)), cell(torch.tensor(False))
    assert cell.loss_scale.item() == 4.0 and cell.good_steps.item() == 2
    big = DynamicLossScaleUpdateCell(3e38, 2, 1)
    big(torch.tensor(False))
    assert big.loss_scale.item() == pytest.approx(3e38, rel=1e-6)  # never grows into inf


def test_dynamic_doubles_after_window_through_the_step():
    manager = DynamicLossScaleManager(init_scale=8, scale_window=2)
    _, _, step = setup(manager)
    scales = [step(CLEAN * 0.3)[2].item() for _ in range(5)]
    assert scales == [8, 8, 16, 16, 32] and manager.get_loss_scale() == 32


def test_fixed_scale_with_and_without_drop():
    net, opt, step = setup(FixedLossScaleManager(128.0).get_update_cell())
    before = snapshot(net, opt)
    loss, overflow, scale = step(BAD)
    assert overflow and scale.item() == 128.0 and step.loss_scale.item() == 128.0
    assert_same(before, snapshot(net, opt))
    manager = FixedLossScaleManager(128.0, drop_overflow_update=False)
    assert manager.get_drop_overflow_update() is False
    net, opt, step = setup(manager.get_update_cell(), opt=torch.optim.SGD)
    loss, overflow, _ = step(CLEAN * 2)  # clean: the step uses the unscaled gradient
    ref = Scaled()
    ref_loss = ref(CLEAN * 2)
    ref_loss.backward()
    assert torch.allclose(net.w.grad, ref.w.grad) and torch.allclose(net.w, ref.w - 0.1 * ref.w.grad)
    assert loss.item() == pytest.approx(ref_loss.item()) and not loss.requires_grad
    _, overflow, _ = step(BAD)  # overflow, but no drop: the step is taken anyway
    assert overflow and not torch.isfinite(net.w).all()


def test_float_or_tensor_scale_sense_and_set_sense_scale():
    for sense in (32.0, torch.tensor(32.0)):
        net, opt, step = setup(sense)
        before = snapshot(net, opt)
        _, overflow, scale = step(BAD)
        assert overflow and scale.item() == 32.0
        assert_same(before, snapshot(net, opt))
    step.set_sense_scale(4.0)
    assert step(CLEAN)[2].item() == 4.0
    with pytest.raises(TypeError, match="'scale_sense' must be"):
        setup("128")
    with pytest.raises(ValueError, match="'scale_sense' tensor must hold one floating value"):
        setup(torch.ones(2))
    with pytest.raises(ValueError, match="'value' must be a finite number >= 1.0, got 0.5"):
        step.set_sense_scale(0.5)


def test_unscaled_grad_matches_fp32_within_bf16_tolerance():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    x, y = torch.randn(64, 8), torch.randn(64, 1)
    # Reference: fp32 gradient of the function O2 computes, i.e. at bf16-rounded weights and
    # inputs (the rounding of the inputs alone moves this small gradient by several percent).
    ref = copy.deepcopy(net)
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(p.bfloat16().float())
    nn.MSELoss()(ref(x.bfloat16().float()), y).backward()
    plain = copy.deepcopy(net)  # O2 without loss scaling
    nn.MSELoss()(CastNetwork(plain)(x), y).backward()
    step = build_train_network(net, torch.optim.SGD(net.parameters(), lr=0.0), nn.MSELoss(), level="O2",
                               loss_scale_manager=FixedLossScaleManager(2.0 ** 12))
    step(x, y)
    for p, r, q in zip(net.parameters(), ref.parameters(), plain.parameters(), strict=True):
        assert p.grad.dtype == torch.float32
        assert torch.equal(p.grad, q.grad)  # a power-of-two scale unscales exactly
        assert (p.grad - r.grad).norm() <= 2e-2 * r.grad.norm()  # a few bf16 epsilons (2**-8)


def test_unscale_fused_and_fallback_agree(monkeypatch):
    def run():
        grads = [torch.tensor([2.0, 4.0]), torch.tensor([8.0], dtype=torch.bfloat16)]
        found = torch.zeros(1)
        unscale_grads_(grads, torch.tensor([0.5]), found)
        bad = [torch.tensor([1.0, float("nan")])]
        found_bad = torch.zeros(1)
        unscale_grads_(bad, torch.tensor([0.5]), found_bad)
        return grads, found.item(), found_bad.item()

    fused = run()
    monkeypatch.delattr(torch, "_amp_foreach_non_finite_check_and_unscale_")
    fallback = run()
    for res in (fused, fallback):
        assert torch.equal(res[0][0], torch.tensor([1.0, 2.0])) and res[0][1].item() == 4.0
        assert res[1] == 0.0 and res[2] == 1.0


def test_sparse_embedding_gradients():
    emb = nn.Embedding(10, 3, sparse=True)
    opt = torch.optim.SGD(emb.parameters(), lr=0.1)
    step = TrainOneStepWithLossScaleCell(lambda ids, t: (emb(ids) * t).sum(), opt, 64.0)
    before = emb.weight.detach().clone()
    _, overflow, _ = step(torch.tensor([1, 1, 2]), torch.ones(3, 3))
    assert not overflow and torch.allclose(before[1] - emb.weight[1].detach(), torch.full((3,), 0.2))
    before = emb.weight.detach().clone()
    _, overflow, _ = step(torch.tensor([3]), torch.full((1, 3), INF))
    assert overflow and torch.equal(before, emb.weight.detach())


def test_manager_state_dict_and_python_update():
    manager = DynamicLossScaleManager(2 ** 4, scale_factor=2, scale_window=2)
    manager.update_loss_scale(False)
    state = manager.state_dict()
    assert state == {"loss_scale": 16.0, "good_steps": 1, "scale_factor": 2.0, "scale_window": 2}
    manager.update_loss_scale(True)
    assert manager.get_loss_scale() == 8.0 and manager.get_drop_overflow_update() is True
    manager.load_state_dict(state)
    manager.update_loss_scale(torch.tensor(False))
    assert manager.get_loss_scale() == 32.0
    fixed = FixedLossScaleManager(4.0)
    fixed.load_state_dict({"loss_scale": 8.0, "drop_overflow_update": False})
    assert fixed.get_loss_scale() == 8.0 and not fixed.get_drop_overflow_update()
    assert isinstance(fixed.get_update_cell(), FixedLossScaleUpdateCell)
    with pytest.raises(ValueError, match="load_state_dict: 'state' must be a dict with keys"):
        manager.load_state_dict({"loss_scale": 2.0})


@pytest.mark.parametrize("make, exc, msg", [
    (lambda: FixedLossScaleManager(0.5), ValueError, r"'loss_scale' must be a finite number >= 1.0, got 0.5"),
    (lambda: FixedLossScaleManager("128"), TypeError,
     r"'loss_scale' must be a finite number >= 1.0, got '128' \(str\)"),
    (lambda: FixedLossScaleManager(128, drop_overflow_update=1), TypeError, "'drop_overflow_update' must be a bool"),
    (lambda: DynamicLossScaleManager(float("inf")), ValueError, "'init_loss_scale' must be a finite number"),
    (lambda: DynamicLossScaleManager(scale_factor=1), ValueError, r"'scale_factor' must be a finite number > 1.0"),
    (lambda: DynamicLossScaleManager(scale_window=0), ValueError, "'scale_window' must be an int >= 1, got 0"),
    (lambda: DynamicLossScaleManager(scale_window=True), TypeError, "'scale_window' must be an int >= 1"),
    (lambda: DynamicLossScaleManager(4, init_scale=8), ValueError, "'init_loss_scale'.*'init_scale'.*not both"),
    (lambda: TrainOneStepWithLossScaleCell(Scaled(), "sgd", 2.0), TypeError, "'optimizer' must be"),
])
def test_bad_arguments(make, exc, msg):
    with pytest.raises(exc, match=msg):
        make()


def test_non_loss_output_rejected():
    net = Scaled()
    step = TrainOneStepWithLossScaleCell(lambda x: 1.0, torch.optim.SGD(net.parameters(), lr=0.1), 2.0)
    with pytest.raises(TypeError, match="must return a loss tensor that requires grad, got float"):
        step(CLEAN)
    assert ls.LossScaleManager.__abstractmethods__ == frozenset({"state_dict", "load_state_dict"})


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (float16 overflow path)")
def test_cuda_float16_o2_backs_off_from_overflow():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1)).cuda()
    x, y = torch.randn(256, 8, device="cuda"), torch.randn(256, 1, device="cuda")
    manager = DynamicLossScaleManager(init_loss_scale=2 ** 24, scale_window=1000)
    step = build_train_network(net, torch.optim.SGD(net.parameters(), lr=0.05), nn.MSELoss(), level="O2",
                               loss_scale_manager=manager)
    results = [step(x, y) for _ in range(40)]
    assert results[0][1].item() is True  # 2**24 overflows float16 gradients
    assert manager.get_loss_scale() < 2 ** 24 and not results[-1][1].item()
    assert results[-1][0].item() < results[0][0].item() and results[-1][2].device.type == "cuda"


def test_an_overflow_on_the_device_path_leaves_boosts_lazy_adam_rows_untouched():
    """A fused Adam skips an overflowing step from the device flag, but the rows it updates lazily
    (boost's row-sparse embeddings, `recstream.optim.sparse_rows`) are stepped by its hooks: the
    skip must reach them too (or the step must branch on the host)."""
    from recstream.hostpath import device_path
    from recstream.optim.sparse_rows import accept_sparse_rows, lazy_rows_of

    torch.manual_seed(0)
    emb = nn.Embedding(10, 3, sparse=True)
    lin = nn.Linear(3, 1)
    opt = torch.optim.Adam([*emb.parameters(), *lin.parameters()], lr=0.1, fused=True)
    accept_sparse_rows(opt, [emb.weight])
    assert id(emb.weight) in lazy_rows_of(opt)
    step = TrainOneStepWithLossScaleCell(lambda ids, t: (lin(emb(ids)) * t).sum(), opt,
                                         DynamicLossScaleManager(2 ** 8, scale_window=100).get_update_cell())
    ids = torch.tensor([1, 1, 2])
    with device_path():
        for _ in range(2):
            step(ids, torch.ones(3, 1))
        before = snapshot(emb, opt)
        _, overflow, _ = step(ids, torch.full((3, 1), INF))
    assert bool(overflow)
    assert_same(before, snapshot(emb, opt))
