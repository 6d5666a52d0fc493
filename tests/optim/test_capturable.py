"""Capturable mode of the row-sparse optimizers (issue 24): step counts and rates on the device, the
same updates as the plain mode, a state dict that loads either way, and no host read in a step."""
from __future__ import annotations

import copy
from contextlib import nullcontext

import pytest
import torch

from recstream.hostpath import device_path
from recstream.optim import FTRL, LazyAdam, RowWiseAdagrad
from recstream.testing import SyncCounter

OPTIMIZERS = {
    "lazy_adam": lambda ps: LazyAdam(ps, lr=0.05),
    "rowwise_adagrad": lambda ps: RowWiseAdagrad(ps, lr=0.1, weight_decay=0.01),
    "ftrl": lambda ps: FTRL(ps, lr=0.1, l1=0.001, l2=0.01),
    "ftrl_power": lambda ps: FTRL(ps, lr=0.1, lr_power=-0.3),
}
IDS = [torch.tensor([[1, 3, 3], [7, 1, 0]]), torch.tensor([[2, 2, 9], [3, 5, 5]]), torch.tensor([[0, 9, 4], [4, 4, 8]])]


def _capturable(opt) -> None:
    """What `recstream.train.cuda_graph.make_capturable` does to a row-sparse optimizer."""
    for group in opt.param_groups:
        group["capturable"] = True
        group["lr"] = torch.tensor(float(group["lr"]))


def _train(bag: torch.nn.EmbeddingBag, opt, steps: int, start: int = 0) -> None:
    for i in range(start, start + steps):
        opt.zero_grad(set_to_none=True)
        out = bag(IDS[i % len(IDS)])
        (out * torch.arange(1.0, 1.0 + out.numel()).view_as(out)).sin().sum().backward()
        opt.step()


def _pair(name: str, sparse: bool):
    torch.manual_seed(0)
    plain = torch.nn.EmbeddingBag(10, 4, mode="sum", sparse=sparse)
    graphed = copy.deepcopy(plain)
    return plain, OPTIMIZERS[name]([plain.weight]), graphed, OPTIMIZERS[name]([graphed.weight])


@pytest.mark.parametrize("sparse", [True, False], ids=["sparse", "dense"])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
@pytest.mark.parametrize("path", ["host", "device"])
def test_capturable_mode_makes_the_same_updates(name, sparse, path):
    plain, plain_opt, graphed, graphed_opt = _pair(name, sparse)
    _capturable(graphed_opt)
    with device_path() if path == "device" else nullcontext():
        _train(plain, plain_opt, 5)
        _train(graphed, graphed_opt, 5)
    # Not bit-equal: capturable step sizes are float32 device tensors, the plain ones Python floats.
    torch.testing.assert_close(graphed.weight, plain.weight, rtol=1e-5, atol=1e-5)
    step = graphed_opt.state[graphed.weight]["step"]
    assert isinstance(step, torch.Tensor) and int(step) == 5 == plain_opt.state[plain.weight]["step"]


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_a_capturable_step_reads_nothing_back_on_the_device_path(name):
    _, _, graphed, opt = _pair(name, sparse=True)
    _capturable(opt)
    _train(graphed, opt, 1)  # state created
    with device_path(), SyncCounter() as counter:
        _train(graphed, opt, 2, start=1)
    assert counter.syncs == 0, dict(counter.sync_ops)


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_the_state_dict_is_the_plain_one_and_loads_either_way(name):
    plain, plain_opt, graphed, graphed_opt = _pair(name, sparse=True)
    _capturable(graphed_opt)
    _train(plain, plain_opt, 3)
    _train(graphed, graphed_opt, 3)
    saved = graphed_opt.state_dict()
    assert saved["state"][0]["step"] == 3 and isinstance(saved["state"][0]["step"], int)
    assert isinstance(saved["param_groups"][0]["lr"], float) and "capturable" not in saved["param_groups"][0]
    assert isinstance(graphed_opt.state[graphed.weight]["step"], torch.Tensor)  # the live state is untouched
    assert isinstance(graphed_opt.param_groups[0]["lr"], torch.Tensor)

    # capturable -> plain, and plain -> capturable: both continue exactly as the plain run does
    to_plain = OPTIMIZERS[name]([graphed.weight])
    to_plain.load_state_dict(saved)
    to_graphed = OPTIMIZERS[name]([plain.weight])
    # Deep copies: a load keeps the saved tensors themselves, and the three runs must not share them.
    to_graphed.load_state_dict(copy.deepcopy(plain_opt.state_dict()))
    _capturable(to_graphed)
    reference = copy.deepcopy(plain)
    reference_opt = OPTIMIZERS[name]([reference.weight])
    reference_opt.load_state_dict(copy.deepcopy(plain_opt.state_dict()))
    _train(reference, reference_opt, 2, start=3)
    _train(graphed, to_plain, 2, start=3)
    _train(plain, to_graphed, 2, start=3)
    torch.testing.assert_close(graphed.weight, reference.weight, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(plain.weight, reference.weight, rtol=1e-5, atol=1e-5)
    assert to_plain.state[graphed.weight]["step"] == 5 and int(to_graphed.state[plain.weight]["step"]) == 5


def _tables(fuse: bool, capturable: bool):
    """Four sparse tables under Adam with boost's lazy row updates (`accept_sparse_rows`)."""
    from recstream.optim.sparse_rows import accept_sparse_rows

    torch.manual_seed(0)
    tables = torch.nn.ModuleList(torch.nn.Embedding(12, 3, sparse=True) for _ in range(4))
    adam = torch.optim.Adam(tables.parameters(), lr=0.05)
    handles = accept_sparse_rows(adam, list(tables.parameters()), fuse=fuse)
    if capturable:  # what make_capturable does (Adam itself steps no parameter here: all are sparse)
        adam.param_groups[0]["capturable"] = True
        adam.param_groups[0]["lr"] = torch.tensor(0.05)
    return tables, adam, handles


def _train_tables(tables, adam, steps: int, start: int = 0) -> None:
    for i in range(start, start + steps):
        adam.zero_grad(set_to_none=True)
        ids = IDS[i % len(IDS)].view(-1)
        sum((t((ids + k) % 12) * torch.arange(1.0, 4.0)).sin().sum() for k, t in enumerate(tables)).backward()
        adam.step()


@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "per_table"])
def test_lazy_adam_hooks_in_capturable_mode_make_the_same_updates_and_read_nothing(fuse):
    from recstream.optim.sparse_rows import lazy_rows_of

    plain, plain_adam, _ = _tables(fuse, capturable=False)
    graphed, adam, handles = _tables(fuse, capturable=True)
    assert lazy_rows_of(adam) == {id(p) for p in graphed.parameters()}
    with device_path():
        _train_tables(plain, plain_adam, 3)
        _train_tables(graphed, adam, 1)
        with SyncCounter() as counter:
            _train_tables(graphed, adam, 2, start=1)
    assert counter.syncs == 0, dict(counter.sync_ops)
    for a, b in zip(graphed.parameters(), plain.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    steps = [adam.state[p]["step"] for p in graphed.parameters()]
    assert all(float(s) == 3.0 for s in steps)
    if fuse:  # one device counter for the fused set: advanced once per step, compared by identity
        assert all(s is steps[0] for s in steps)
    handles.remove()
    assert lazy_rows_of(adam) == set()


@pytest.mark.parametrize("mode", ["capturable", "found_inf"])
def test_a_fused_set_stepped_one_by_one_counts_each_tables_own_steps(mode):
    """A step where one table of a fused set has no gradient steps the others one by one: their
    shared device counter (capturable mode, or a loss-scaled step's flag) is split first, or it
    would advance once per table (every count 4 after three steps, the bias corrections with it)."""
    runs = []
    for fuse in (True, False):
        tables, adam, _ = _tables(fuse, capturable=mode == "capturable")
        with device_path():
            for i in range(4):
                adam.zero_grad(set_to_none=True)
                ids = IDS[i % len(IDS)].view(-1)
                used = list(tables)[:3] if i == 1 else list(tables)  # step 1: the last table unused
                sum((t((ids + k) % 12) * torch.arange(1.0, 4.0)).sin().sum() for k, t in enumerate(used)).backward()
                if mode == "found_inf":
                    adam.found_inf = torch.tensor(0.0)
                adam.step()
        runs.append((tables, adam))
    (fused, fused_adam), (alone, alone_adam) = runs
    assert [float(fused_adam.state[p]["step"]) for p in fused.parameters()] == [4.0, 4.0, 4.0, 3.0]
    assert [float(alone_adam.state[p]["step"]) for p in alone.parameters()] == [4.0, 4.0, 4.0, 3.0]
    for a, b in zip(fused.parameters(), alone.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_fused_tables_share_one_counter_again_after_a_load_once_an_eager_step_reads_them():
    tables, adam, _ = _tables(fuse=True, capturable=True)
    _train_tables(tables, adam, 2)
    saved = copy.deepcopy(adam.state_dict())
    for entry in saved["state"].values():  # as read from a file: a counter per table
        entry["step"] = entry["step"].cpu().clone()
    adam.load_state_dict(saved)
    adam.param_groups[0]["capturable"], adam.param_groups[0]["lr"] = True, torch.tensor(0.05)
    steps = [adam.state[p]["step"] for p in tables.parameters()]
    assert len({id(s) for s in steps}) == 4
    _train_tables(tables, adam, 1, start=2)  # the eager step after a load (CUDAGraphStep.reset) reads them once
    steps = [adam.state[p]["step"] for p in tables.parameters()]
    assert all(s is steps[0] for s in steps) and float(steps[0]) == 3.0


@pytest.mark.parametrize("name", list(OPTIMIZERS))
@pytest.mark.parametrize("shape", [(), (5, 3)], ids=["0-d", "table"])
def test_a_found_inf_flag_undoes_the_step_and_a_clear_one_does_not(name, shape):
    """A loss-scaled step hands the optimizer `found_inf` (torch's GradScaler protocol): set, the
    weights, every state tensor (a 0-d parameter's too) and the count stay; clear, the step is the
    plain one."""
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(shape))
    plain_w = torch.nn.Parameter(w.detach().clone())
    opt, plain = OPTIMIZERS[name]([w]), OPTIMIZERS[name]([plain_w])
    _capturable(opt)
    for step in range(3):
        for param in (w, plain_w):
            param.grad = torch.full(shape, 0.5 + step)
        opt.found_inf = torch.tensor(float(step == 1))  # the middle step overflowed
        opt.step()
        del opt.found_inf
        if step != 1:
            plain.step()
        if step == 1:
            torch.testing.assert_close(w.detach(), plain_w.detach())
            for key, value in opt.state[w].items():
                ref = plain.state[plain_w][key]
                assert float(value) == ref if key == "step" else torch.equal(value, ref), key
    torch.testing.assert_close(w.detach(), plain_w.detach(), rtol=1e-5, atol=1e-5)
    assert int(opt.state[w]["step"]) == 2 == plain.state[plain_w]["step"]
