"""CombinedOptimizer / sparse_and_dense: splitting, delegation, schedulers, state."""

import copy
import functools
import io

import pytest
import torch
from torch import nn

from recstream.optim import CombinedOptimizer, LazyAdam, RowWiseAdagrad, sparse_and_dense, split_sparse_dense


class WithSparseParams(nn.Module):
    """A module that declares its own sparse-gradient parameter."""

    def __init__(self):
        super().__init__()
        self.table = nn.Parameter(torch.randn(20, 4))

    def sparse_parameters(self):
        yield self.table

    def forward(self, ids):
        return nn.functional.embedding(ids, self.table, sparse=True).sum(1)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.bag = nn.EmbeddingBag(50, 4, mode="sum", sparse=True)
        self.custom = WithSparseParams()
        self.dense_emb = nn.Embedding(10, 4)  # sparse=False -> dense optimizer
        self.frozen = nn.Linear(4, 4)
        self.frozen.requires_grad_(False)
        self.head = nn.Linear(4, 1)

    def forward(self, ids):
        x = self.bag(ids) + self.custom(ids % 20) + self.dense_emb(ids % 10).sum(1)
        return self.head(torch.relu(self.frozen(x))).squeeze(1)


def _batches(n, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randint(0, 50, (32, 3), generator=gen),
             torch.randint(0, 2, (32,), generator=gen).float()) for _ in range(n)]


def _train(model, opt, batches, sched=None):
    losses = []
    for ids, y in batches:
        loss = nn.functional.binary_cross_entropy_with_logits(model(ids), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if sched is not None:
            sched.step()
        losses.append(loss.item())
    return losses


def test_split_finds_sparse_modules_and_skips_frozen():
    net = Net()
    sparse, dense = split_sparse_dense(net)
    assert [id(p) for p in sparse] == [id(net.bag.weight), id(net.custom.table)]
    dense_ids = {id(p) for p in dense}
    assert dense_ids == {id(net.dense_emb.weight), id(net.head.weight), id(net.head.bias)}


def test_is_an_optimizer_and_trains_end_to_end():
    torch.manual_seed(0)
    net = Net()
    opt = sparse_and_dense(net, sparse=functools.partial(LazyAdam, lr=0.05),
                           dense=functools.partial(torch.optim.Adam, lr=0.01))
    assert isinstance(opt, torch.optim.Optimizer)
    assert isinstance(opt.optimizers["sparse"], LazyAdam)
    assert isinstance(opt.optimizers["dense"], torch.optim.Adam)
    batches = _batches(8) * 15  # memorise 8 batches
    losses = _train(net, opt, batches)
    assert sum(losses[-8:]) < 0.7 * sum(losses[:8])
    assert net.bag.weight.grad is not None and net.head.weight.grad is not None
    opt.zero_grad(set_to_none=True)  # delegated to both children
    assert net.bag.weight.grad is None and net.head.weight.grad is None


def test_param_groups_are_the_children_dicts_and_schedulers_drive_both():
    net = Net()
    opt = sparse_and_dense(net, sparse=functools.partial(RowWiseAdagrad, lr=0.1),
                           dense=functools.partial(torch.optim.SGD, lr=0.01))
    groups = opt.param_groups
    assert groups[0] is opt.optimizers["sparse"].param_groups[0]
    assert groups[1] is opt.optimizers["dense"].param_groups[0]
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.1)
    _train(net, opt, _batches(4), sched)
    assert opt.optimizers["sparse"].param_groups[0]["lr"] == pytest.approx(0.001)
    assert opt.optimizers["dense"].param_groups[0]["lr"] == pytest.approx(0.0001)
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=0)
    plateau.step(1.0)
    plateau.step(2.0)  # no improvement -> halve every group
    assert opt.optimizers["sparse"].param_groups[0]["lr"] == pytest.approx(0.0005)
    assert opt.optimizers["dense"].param_groups[0]["lr"] == pytest.approx(0.00005)


def test_state_dict_round_trip_with_scheduler_resumes_identically():
    def build(model):
        opt = sparse_and_dense(model, sparse=functools.partial(LazyAdam, lr=0.05),
                               dense=functools.partial(torch.optim.Adam, lr=0.01))
        return opt, torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.9)

    torch.manual_seed(0)
    net = Net()
    opt, sched = build(net)
    batches = _batches(6)
    _train(net, opt, batches[:3], sched)
    buf = io.BytesIO()
    torch.save({"model": net.state_dict(), "opt": opt.state_dict(),
                "sched": sched.state_dict()}, buf)
    buf.seek(0)
    ckpt = torch.load(buf, weights_only=True)
    net2 = Net()
    net2.load_state_dict(ckpt["model"])
    opt2, sched2 = build(net2)
    opt2.load_state_dict(ckpt["opt"])
    sched2.load_state_dict(ckpt["sched"])
    assert _train(net, opt, batches[3:], sched) == _train(net2, opt2, batches[3:], sched2)
    for a, b in zip(net.parameters(), net2.parameters(), strict=True):
        assert torch.equal(a, b)
    assert opt2.param_groups[0]["lr"] == pytest.approx(0.05 * 0.9 ** 6)


def test_closure_hooks_state_and_deepcopy():
    net = Net()
    opt = sparse_and_dense(net)
    calls = []
    opt.register_step_post_hook(lambda o, args, kwargs: calls.append("post"))

    def closure():
        calls.append("closure")
        ids, y = _batches(1)[0]
        loss = nn.functional.binary_cross_entropy_with_logits(net(ids), y)
        loss.backward()
        return loss

    assert opt.step(closure).requires_grad
    assert calls == ["closure", "post"]
    assert set(map(id, opt.state)) >= {id(net.bag.weight), id(net.head.weight)}
    clone = copy.deepcopy(opt)
    assert clone.param_groups[0]["lr"] == opt.param_groups[0]["lr"]
    assert "sparse:" in repr(opt) and "dense:" in repr(opt)


def test_zero_grad_without_set_to_none_zeroes_in_place():
    net = Net()
    opt = sparse_and_dense(net)
    ids, y = _batches(1)[0]
    nn.functional.binary_cross_entropy_with_logits(net(ids), y).backward()
    opt.zero_grad(set_to_none=False)
    assert net.head.weight.grad is not None and not net.head.weight.grad.any()


def test_add_param_group_routes_by_name():
    a, b = nn.Parameter(torch.zeros(3)), nn.Parameter(torch.zeros(3))
    opt = CombinedOptimizer({"sparse": LazyAdam([a]), "dense": torch.optim.SGD([b], lr=0.1)})
    extra = nn.Parameter(torch.zeros(2))
    opt.add_param_group({"params": [extra], "lr": 0.5, "optimizer": "dense"})
    assert opt.optimizers["dense"].param_groups[-1]["params"][0] is extra
    assert opt.param_groups[-1]["lr"] == 0.5
    with pytest.raises(ValueError, match=r"one of \['dense', 'sparse'\], got None"):
        opt.add_param_group({"params": [nn.Parameter(torch.zeros(1))]})
    with pytest.raises(ValueError, match=r"'param_group\['optimizer'\]' must be one of \['dense', 'sparse'\], "
                                         "got 'wide'"):
        opt.add_param_group({"params": [nn.Parameter(torch.zeros(1))], "optimizer": "wide"})
    with pytest.raises(TypeError, match=r"'param_group\['optimizer'\]' must be one of .*got 0 \(int\)"):
        opt.add_param_group({"params": [nn.Parameter(torch.zeros(1))], "optimizer": 0})
    with pytest.raises(ValueError, match="already belongs to optimizer 'sparse'"):
        opt.add_param_group({"params": [a], "optimizer": "dense"})


def test_bad_arguments():
    p = nn.Parameter(torch.zeros(2))
    with pytest.raises(TypeError, match=r"CombinedOptimizer: 'optimizers\['0'\]' must be a torch.optim.Optimizer"):
        CombinedOptimizer([object()])
    with pytest.raises(TypeError, match=r"'optimizers' must be a mapping name -> Optimizer .*got 3 \(int\)"):
        CombinedOptimizer(3)
    with pytest.raises(TypeError, match=r"'optimizer name' must be a str, got 0 \(int\)"):
        CombinedOptimizer({0: LazyAdam([p])})
    with pytest.raises(ValueError, match="at least one"):
        CombinedOptimizer([])
    with pytest.raises(ValueError, match="in both optimizers '0' and '1'"):
        CombinedOptimizer([LazyAdam([p]), torch.optim.SGD([p], lr=0.1)])
    opt = CombinedOptimizer({"a": LazyAdam([p])})
    with pytest.raises(ValueError, match=r"has optimizers \['b'\], this CombinedOptimizer has"):
        opt.load_state_dict({"optimizers": {"b": {}}})
    with pytest.raises(ValueError, match=r"'state_dict' must be a dict \{'optimizers'.*got keys \['param_groups'"):
        opt.load_state_dict({"state": {}, "param_groups": []})
    with pytest.raises(TypeError, match=r"CombinedOptimizer.load_state_dict: 'state_dict' must be a dict, got \[\]"):
        opt.load_state_dict([])
    with pytest.raises(TypeError, match="sparse_and_dense: 'model' must be a torch.nn.Module"):
        sparse_and_dense("not a model")
    with pytest.raises(TypeError, match="split_sparse_dense: 'model' must be a torch.nn.Module"):
        split_sparse_dense(None)
    with pytest.raises(TypeError, match=r"sparse_and_dense: 'sparse' must be callable, got 0\.1 \(float\)"):
        sparse_and_dense(Net(), sparse=0.1)
    with pytest.raises(TypeError, match=r"dense\(params\) must return"):
        sparse_and_dense(Net(), dense=lambda ps: None)
    with pytest.raises(ValueError, match="no parameters with requires_grad"):
        sparse_and_dense(nn.Linear(2, 2).requires_grad_(False))


def test_only_one_side_present():
    opt = sparse_and_dense(nn.Linear(3, 1))
    assert list(opt.optimizers) == ["dense"]
    opt.add_param_group({"params": [nn.Parameter(torch.zeros(1))]})  # single child: implicit
    assert len(opt.param_groups) == 2


def test_modules_with_sparse_attribute_count_as_sparse():
    class Custom(nn.Module):
        sparse = True

        def __init__(self):
            super().__init__()
            self.rows = nn.Parameter(torch.zeros(5, 2))
            self.inner = nn.Linear(2, 2)  # not its own parameter: stays dense

    m = Custom()
    sparse, dense = split_sparse_dense(m)
    assert [id(p) for p in sparse] == [id(m.rows)]
    assert {id(p) for p in dense} == {id(m.inner.weight), id(m.inner.bias)}
