"""The divergence guard (issue 27, item 2): a non-finite loss or weight stops training with a
`DivergenceError` naming the step and epoch, and nothing non-finite is ever checkpointed; the
guard reads nothing to the host per step."""
import glob
import os

import pytest
import torch
from safetensors.torch import load_file
from torch.utils._python_dispatch import TorchDispatchMode

from recstream import Model
from recstream.callbacks import CheckpointConfig, DivergenceError, ModelCheckpoint
from recstream.train.loss_scale import TrainOneStepWithLossScaleCell
from tests.train.helpers import batches


def model(lr=0.1, net=None):
    torch.manual_seed(0)
    net = net or torch.nn.Linear(4, 2)
    return Model(net, torch.nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), lr=lr), progress_bar=False)


def finite_files(directory) -> list[str]:
    files = sorted(glob.glob(os.path.join(directory, "*.safetensors")))
    for f in files:
        assert all(torch.isfinite(t).all() for t in load_file(f).values() if t.is_floating_point()), f
    return files


def test_a_diverging_learning_rate_stops_training_naming_step_and_epoch():
    m = model(lr=3e38)
    with pytest.raises(DivergenceError) as info:
        m.train(3, batches(5))
    e = info.value
    assert (e.step, e.epoch) == (2, 1)  # step 1 trains on finite weights; its update overflows
    assert "non-finite" in str(e) and "step 2 (epoch 1)" in str(e) and "restore it" in str(e)


def test_no_checkpoint_of_a_diverged_run_not_even_the_exception_checkpoint(tmp_path):
    m = model(lr=3e38)
    ckpt = ModelCheckpoint("m", str(tmp_path), CheckpointConfig(save_checkpoint_steps=1, exception_save=True))
    with pytest.raises(DivergenceError), pytest.warns(RuntimeWarning, match="exception checkpoint.*diverged"):
        m.train(3, batches(5), callbacks=[ckpt])
    assert [os.path.basename(f) for f in finite_files(tmp_path)] == ["m-1_1.safetensors"]  # the last good one


class WithNaNBuffer(torch.nn.Linear):
    """Finite outputs (the loss stays finite) but a non-finite tensor in its state."""

    def __init__(self):
        super().__init__(4, 2)
        self.register_buffer("scale", torch.tensor([1.0, float("nan")]))


def test_checkpoint_refuses_non_finite_weights_even_with_a_finite_loss(tmp_path):
    m = model(net=WithNaNBuffer())
    ckpt = ModelCheckpoint("m", str(tmp_path), CheckpointConfig(save_checkpoint_steps=2, exception_save=False))
    with pytest.raises(DivergenceError, match=r"non-finite values \(NaN or inf\) in 'scale'.*checkpoint") as info:
        m.train(1, batches(5), callbacks=[ckpt])
    assert info.value.tensors == ("scale",)
    assert finite_files(tmp_path) == []


def test_a_step_skipped_for_overflow_by_the_loss_scale_cell_is_no_divergence():
    torch.manual_seed(0)
    net = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)

    class InfOnce(torch.nn.Module):  # the first step's loss overflows (as in float16), then finite
        def __init__(self):
            super().__init__()
            self.calls = 0

        def forward(self, x, y):
            self.calls += 1
            loss = torch.nn.functional.cross_entropy(net(x), y)
            return loss * float("inf") if self.calls == 1 else loss

    cell = TrainOneStepWithLossScaleCell(InfOnce(), opt, scale_sense=1024.0)
    Model(cell, progress_bar=False).train(1, batches(4))  # no DivergenceError: the update was dropped
    assert all(torch.isfinite(p).all() for p in net.parameters())


class CountHostReads(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.reads = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            self.reads += 1
        return func(*args, **(kwargs or {}))


def test_the_guard_reads_the_host_once_per_epoch_not_per_step():
    counts = []
    for n in (4, 16):
        m = model()
        with CountHostReads() as c:
            m.train(2, batches(n))
        counts.append(c.reads)
    assert counts[0] == counts[1], counts  # 24 more steps, not one more host read


def test_the_watch_flags_inf_and_nan_losses_in_a_few_ops_a_step():
    """``x * 0 != 0`` is the non-finite test (2 ops where ``isfinite`` dispatched 6), and the first bad
    step is written in place (no scalar tensors): 6 ops a step for a scalar loss, not 12; the first
    bad step and epoch are kept, a vector loss with one bad entry counts, a finite one does not; a
    step the loss-scale cell skipped for overflow is no divergence (7 ops with its flag, not 8)."""
    from recstream.callbacks.divergence import LossWatch

    class Ops(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.n += not func.is_view and func.overloadpacket is not torch.ops.aten.detach
            return func(*args, **(kwargs or {}))

    watch = LossWatch()
    watch.observe(torch.tensor(0.5), 0, 1)  # the first call makes the two counters
    with Ops() as ops:
        watch.observe(torch.tensor(0.25), 1, 1)
    assert ops.n <= 6, ops.n
    with Ops() as ops:  # a loss-scaled cell's outputs: a skipped (overflow) step's flag is one op more
        watch.observe((torch.tensor(0.25), torch.tensor(False), torch.tensor(1.0)), 1, 1)
    assert ops.n <= 7, ops.n
    watch.check()
    skipped = LossWatch()
    skipped.observe((torch.tensor(float("inf")), torch.tensor(True), torch.tensor(1.0)), 3, 1)
    skipped.check()  # skipped for overflow: no divergence
    skipped.observe((torch.tensor(float("nan")), torch.tensor(False), torch.tensor(1.0)), 4, 1)
    with pytest.raises(DivergenceError, match=r"step 4 \(epoch 1\)"):
        skipped.check()
    watch.observe(torch.tensor([1.0, 2.0]), 2, 1)
    watch.check()
    for bad in (float("inf"), float("-inf"), float("nan")):
        w = LossWatch()
        w.observe(torch.tensor(1.0), 4, 2)
        w.observe(torch.tensor([0.0, bad]), 5, 2)
        w.observe(torch.tensor(bad), 6, 3)  # a later bad step: the first one is reported
        with pytest.raises(DivergenceError, match=r"step 5 \(epoch 2\)"):
            w.check()
