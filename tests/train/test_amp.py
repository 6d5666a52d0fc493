"""Mixed-precision levels: which dtypes each level computes in, what it returns, bad arguments."""
import pytest
import torch
from torch import nn

from recstream import Model
from recstream.train import amp
from recstream.train.amp import (
    AMP_LEVELS,
    CastNetwork,
    build_eval_network,
    build_predict_network,
    build_train_network,
    check_amp_level,
    resolve_amp_dtype,
    resolve_amp_level,
)
from recstream.train.cells import TrainOneStepCell
from recstream.train.loss_scale import FixedLossScaleManager, TrainOneStepWithLossScaleCell

BF16, FP32 = torch.bfloat16, torch.float32


def mlp(bn=True):
    torch.manual_seed(0)
    layers = [nn.Linear(6, 16)] + ([nn.BatchNorm1d(16)] if bn else []) + [nn.ReLU(), nn.Linear(16, 1)]
    return nn.Sequential(*layers)


def data(n=64):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, 6, generator=g)
    return x, x[:, :1] * 2 - x[:, 1:2] + 0.5


def record(net):
    """Forward hooks recording (input dtype, weight dtype, output dtype) per submodule name."""
    seen = {}
    for name, m in net.named_modules():
        if name:
            m.register_forward_hook(lambda m, a, out, name=name: seen.__setitem__(
                name, (a[0].dtype, getattr(m, "weight", None) is not None and m.weight.dtype, out.dtype)))
    return seen


def sgd(net, lr=0.05):
    return torch.optim.SGD(net.parameters(), lr=lr)


def test_check_amp_level():
    assert AMP_LEVELS == ("O0", "O1", "O2", "O3", "auto")
    for level in AMP_LEVELS:
        assert check_amp_level(level) == level
    with pytest.raises(ValueError, match=r"'amp_level'.*'O0', 'O1', 'O2', 'O3', 'auto'.*'O4'"):
        check_amp_level("O4")
    with pytest.raises(TypeError, match="'amp_level' must be one of"):
        check_amp_level(2)


def test_resolve_amp_level_and_dtype(monkeypatch):
    assert resolve_amp_level("O3", "cpu") == "O3"
    assert resolve_amp_level("auto", "cuda:0") == "O2"
    monkeypatch.setattr(amp, "cpu_has_native_bf16", lambda: True)
    assert resolve_amp_level("auto", "cpu") == "O1"
    monkeypatch.setattr(amp, "cpu_has_native_bf16", lambda: False)
    assert resolve_amp_level("auto", torch.device("cpu")) == "O0"
    with pytest.raises(ValueError, match="'device'"):
        resolve_amp_level("auto", "not-a-device")
    assert resolve_amp_dtype("cpu") == BF16 and resolve_amp_dtype("cpu", "bf16") == BF16
    assert resolve_amp_dtype("cuda") == torch.float16
    with pytest.raises(ValueError, match="float16 is not supported on CPU"):
        resolve_amp_dtype("cpu", torch.float16)
    with pytest.raises(ValueError, match="'dtype' must be one of"):
        resolve_amp_dtype("cpu", "int8")
    with pytest.raises(ValueError, match="'dtype' must be torch.float16"):
        resolve_amp_dtype("cpu", torch.float64)
    if not torch.cuda.is_available():  # a machine without CUDA cannot promise bf16 there
        with pytest.raises(ValueError, match="bfloat16 was asked for"):
            resolve_amp_dtype("cuda", "bfloat16")


def test_o0_unchanged():
    net = mlp()
    seen = record(net)
    step = build_train_network(net, sgd(net), nn.MSELoss(), level="O0", device="cpu")
    assert type(step) is TrainOneStepCell
    step(*data())
    assert all(v == (FP32, FP32, FP32) for v in seen.values() if v[1] is not False)
    assert seen["0"][2] == FP32


def test_o1_autocast_runs_linear_in_bf16():
    net = mlp()
    seen = record(net)
    step = build_train_network(net, sgd(net), nn.MSELoss(), level="O1", device="cpu")
    assert type(step) is TrainOneStepCell
    loss = step(*data())
    assert seen["0"] == (FP32, FP32, BF16)  # autocast casts inside linear: weights stay fp32
    assert seen["3"][2] == BF16
    assert loss.dtype == FP32 and all(p.dtype == FP32 for p in net.parameters())


def test_o2_low_precision_compute_fp32_masters_and_batchnorm():
    net = mlp()
    seen = record(net)
    step = build_train_network(net, sgd(net), nn.MSELoss(), level="O2", device="cpu")
    assert isinstance(step, TrainOneStepWithLossScaleCell)  # dynamic loss scale by default
    assert step.loss_scale.item() == 2.0 ** 24
    loss, overflow, scale = step(*data())
    assert seen["0"] == (BF16, BF16, BF16)  # linear sees bf16 weights and inputs
    assert seen["1"] == (FP32, FP32, FP32)  # batch norm stays fp32
    assert seen["3"] == (BF16, BF16, BF16)  # cast back to bf16 after batch norm
    assert all(p.dtype == FP32 and p.grad.dtype == FP32 for p in net.parameters())  # masters
    assert loss.dtype == FP32 and overflow.dtype == torch.bool and not overflow
    assert not net[0]._forward_pre_hooks  # the cast hooks only live during the forward
    assert net(data()[0]).dtype == FP32


def test_o2_keep_batchnorm_fp32_false():
    net = mlp()
    seen = record(net)
    build_train_network(net, sgd(net), nn.MSELoss(), level="O2", keep_batchnorm_fp32=False, device="cpu")(*data())
    assert seen["1"] == (BF16, FP32, BF16)  # bf16 in and out; weights and statistics as stored
    assert net[1].weight.dtype == FP32 and net[1].running_mean.dtype == FP32


def test_o3_casts_network_no_loss_scale_and_override():
    net = mlp()
    seen = record(net)
    step = build_train_network(net, sgd(net), nn.MSELoss(), level="O3", device="cpu")
    assert type(step) is TrainOneStepCell
    loss = step(*data())
    assert all(t.dtype == BF16 for t in list(net.parameters()) + [net[1].running_mean, net[1].running_var])
    assert seen["1"] == (BF16, BF16, BF16) and loss.dtype == FP32
    net = mlp()
    seen = record(net)
    build_train_network(net, sgd(net), nn.MSELoss(), level="O3", keep_batchnorm_fp32=True, device="cpu")(*data())
    assert net[0].weight.dtype == BF16 and net[1].weight.dtype == FP32
    assert seen["1"] == (FP32, FP32, FP32) and seen["3"] == (BF16, BF16, BF16)


class IdsAndDense(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(20, 4)
        self.fc = nn.Linear(4 + 3, 1)
        self.seen = []

    def forward(self, ids, dense):
        self.seen.append((ids.dtype, dense.dtype))
        return self.fc(torch.cat([self.emb(ids).flatten(1), dense], 1))


@pytest.mark.parametrize("level, table", [("O2", FP32), ("O3", BF16)])
def test_inputs_cast_but_not_ids(level, table):
    net = IdsAndDense()
    seen = record(net)
    step = build_train_network(net, sgd(net), nn.MSELoss(), level=level, device="cpu")
    out = step(torch.randint(0, 20, (8, 1)), torch.randn(8, 3), torch.randn(8, 1))
    assert net.seen == [(torch.int64, BF16)]
    assert seen["emb"] == (torch.int64, table, table)  # the lookup reads the table as stored
    assert seen["fc"][:2] == (BF16, BF16)  # ... and its result is cast for the next layer
    assert net.emb.weight.dtype == table  # O2 keeps the table fp32 (lookup cast), O3 casts it
    assert (out[0] if isinstance(out, tuple) else out).dtype == FP32


def test_register_lookup_module_keeps_custom_table():
    class Table(nn.Module):
        def __init__(self):
            super().__init__()
            self.table = nn.Parameter(torch.randn(10, 4))

        def forward(self, ids):
            self.seen = self.table.dtype
            return nn.functional.embedding(ids, self.table)

    net = nn.Sequential(Table(), nn.Flatten(), nn.Linear(8, 1))
    run = CastNetwork(net)
    assert run(torch.tensor([[1, 2]])).dtype == FP32 and net[0].seen == BF16  # unregistered: cast
    assert amp.register_lookup_module(Table) is Table
    run(torch.tensor([[1, 2]]))
    assert net[0].seen == FP32
    with pytest.raises(TypeError, match="'cls' must be a torch.nn.Module subclass"):
        amp.register_lookup_module(int)


@pytest.mark.parametrize("level", ["O1", "O2", "O3"])
def test_training_lowers_loss(level):
    net = mlp()
    x, y = data(256)
    opt = torch.optim.Adam(net.parameters(), lr=0.01)
    step = build_train_network(net, opt, nn.MSELoss(), level=level, device="cpu")
    losses = []
    for _ in range(60):
        out = step(x, y)
        losses.append(float(out[0] if isinstance(out, tuple) else out))
    assert losses[-1] < 0.5 * losses[0]


@pytest.mark.parametrize("level", ["O0", "O1", "O2", "O3"])
def test_eval_and_predict_networks_fp32_outputs_weights_untouched(level):
    net = mlp().eval()
    x, y = data()
    ref = net(x)
    loss, out, label = build_eval_network(net, nn.MSELoss(), level, "cpu")(x, y)
    assert out.dtype == FP32 and loss.dtype == FP32 and torch.equal(label, y)
    assert torch.allclose(out, ref, atol=0.1)  # same numbers, bf16 precision
    assert all(p.dtype == FP32 for p in net.parameters())
    assert build_predict_network(net, level, "cpu")(x).dtype == FP32


def test_loss_scale_manager_at_other_levels():
    net = mlp()
    step = build_train_network(net, sgd(net), nn.MSELoss(), level="O1", loss_scale_manager=FixedLossScaleManager(64.0))
    loss, overflow, scale = step(*data())
    assert isinstance(step, TrainOneStepWithLossScaleCell) and scale.item() == 64.0


def test_bad_arguments():
    net = mlp()
    with pytest.raises(ValueError, match="Auto mixed precision will not work because 'optimizer' is None"):
        build_train_network(net, None, nn.MSELoss(), level="O2")
    with pytest.raises(ValueError, match="'loss_scale_manager' was given but 'optimizer' is None"):
        build_train_network(net, None, nn.MSELoss(), loss_scale_manager=FixedLossScaleManager())
    with pytest.raises(TypeError, match="'loss_scale_manager' must be a LossScaleManager.*float"):
        build_train_network(net, sgd(net), nn.MSELoss(), level="O2", loss_scale_manager=128.0)
    with pytest.raises(TypeError, match="'keep_batchnorm_fp32' must be a bool or None, got 'yes'"):
        build_train_network(net, sgd(net), nn.MSELoss(), level="O2", keep_batchnorm_fp32="yes")
    with pytest.raises(TypeError, match="'network' must be a torch.nn.Module"):
        build_train_network(lambda x: x, sgd(net), nn.MSELoss(), level="O1")
    with pytest.raises(TypeError, match="'loss_fn' must be callable"):
        build_eval_network(net, "mse", "O1", "cpu")
    with pytest.raises(ValueError, match="float16 is not supported on CPU"):
        build_train_network(net, sgd(net), nn.MSELoss(), level="O2", device="cpu", dtype="float16")
    with pytest.raises(ValueError, match="'amp_level'"):
        build_train_network(net, sgd(net), nn.MSELoss(), level="o2")
    with pytest.raises(ValueError, match="'dtype' must be torch.float16 or torch.bfloat16"):
        CastNetwork(net, torch.float32)
    opt = torch.optim.Adam(net.parameters())
    nn.MSELoss()(net(data()[0]), data()[1]).backward()
    opt.step()
    with pytest.raises(ValueError, match="'O3' casts the weights in place"):
        build_train_network(net, opt, nn.MSELoss(), level="O3")
    # O0 without an optimizer: the network itself is the step
    assert build_train_network(net, None) is net


class _NetWithLoss(nn.Module):
    """A network that returns its own loss, as in MindSpore's mixed-precision tests."""

    def __init__(self):
        super().__init__()
        self.dense = nn.Linear(16, 16)

    def forward(self, x, label):
        return nn.functional.mse_loss(self.dense(x), label)


@pytest.mark.parametrize("level", ["O0", "O2"])
def test_mindspore_argument_order(level):
    """MindSpore's order: (network, optimizer, loss_fn=None, level=..., boost_level=...)."""
    x, label = torch.ones(16, 16), torch.zeros(16, 16)
    net = _NetWithLoss()  # no loss_fn: the network returns the loss
    out = build_train_network(net, torch.optim.SGD(net.parameters(), lr=0.1), level=level, device="cpu")(x, label)
    loss = out[0] if isinstance(out, tuple) else out
    assert loss.ndim == 0 and torch.isfinite(loss)
    backbone = nn.Linear(16, 16)
    step = build_train_network(backbone, torch.optim.SGD(backbone.parameters(), lr=0.1), nn.MSELoss(),
                               level=level, boost_level="O0", device="cpu")
    before = backbone.weight.detach().clone()
    step(x, label)
    assert not torch.equal(before, backbone.weight)


def test_old_argument_order_is_rejected():
    net = mlp()
    with pytest.raises(TypeError, match="'optimizer' must be a torch.optim.Optimizer.*MSELoss"):
        build_train_network(net, nn.MSELoss(), sgd(net))
    with pytest.raises(ValueError, match="'boost_level'"):
        build_train_network(net, sgd(net), nn.MSELoss(), boost_level="O4")
    with pytest.raises(ValueError, match="unknown keyword argument 'amp_level'"):
        build_train_network(net, sgd(net), nn.MSELoss(), amp_level="O2")


@pytest.mark.parametrize("level", ["O0", "O2"])
def test_model_trains_then_refuses_labels_that_are_not_one_hot(level):
    """MindSpore's mixed-precision Model test: training runs; evaluating "acc" on all-ones labels of
    the prediction's shape fails with ValueError, since they are not one-hot."""
    net = nn.Linear(16, 16)
    model = Model(net, nn.MSELoss(), torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9), metrics={"acc"},
                  amp_level=level)
    data = [(torch.ones(16, 16), torch.ones(16, 16))] * 2
    model.train(2, data)
    with pytest.raises(ValueError, match="one-hot"):
        model.eval(data)
