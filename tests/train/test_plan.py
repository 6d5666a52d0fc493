"""The step plan: amp level, boost level and parallel mode resolved once into the train, eval and
predict networks (recstream.train.plan)."""
import dataclasses
import os
import socket

import pytest
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from recstream.train import amp
from recstream.train.amp import CastNetwork
from recstream.train.cells import TrainOneStepCell, WithEvalCell, WithLossCell
from recstream.train.loss_scale import FixedLossScaleManager, TrainOneStepWithLossScaleCell
from recstream.train.plan import BOOST_LEVELS, StepOptions, plan_step


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(50, 4)
        self.fc = nn.Linear(8, 1)

    def forward(self, ids):
        return self.fc(self.emb(ids).flatten(1))


def _plan(amp_level="O0", boost_level="O0", optimizer=True, **options):
    net = Net()
    opt = torch.optim.Adam(net.parameters(), lr=0.01) if optimizer else None
    options.setdefault("parallel_mode", "stand_alone")
    plan = plan_step(net, nn.MSELoss(), opt, StepOptions(amp_level, boost_level, **options), with_metrics=True)
    return net, plan


def _expected_precision(amp_level: str, boost_level: str) -> tuple[str, str]:
    """(amp_level the plan reports, the level it computes at) on this CPU."""
    if boost_level == "O2" and amp_level == "O0" and amp.cpu_has_native_bf16():
        return "O1", "O1"  # boost's bf16_autocast picks O1 where bf16 runs in hardware
    return amp_level, amp.resolve_amp_level(amp_level, "cpu")


@pytest.mark.parametrize("boost_level", BOOST_LEVELS)
@pytest.mark.parametrize("amp_level", amp.AMP_LEVELS)
def test_each_combination_plans_consistent_networks(amp_level, boost_level):
    net, plan = _plan(amp_level, boost_level)
    shown, level = _expected_precision(amp_level, boost_level)
    assert (plan.amp_level, plan.precision.level, plan.boost_level) == (shown, level, boost_level)
    assert plan.parallel_mode == "stand_alone" and plan.precision.device == torch.device("cpu")
    assert plan.precision.dtype == (None if level == "O0" else torch.bfloat16)
    step_type = TrainOneStepWithLossScaleCell if level == "O2" else TrainOneStepCell
    assert type(plan.train_network) is step_type
    assert isinstance(plan.eval_network, WithEvalCell) and plan.eval_indexes == [0, 1, 2]
    predict_type = {"O0": Net, "O1": amp._ContextCell, "O2": CastNetwork, "O3": CastNetwork}[level]
    assert type(plan.predict_network) is predict_type
    names = [line.split(":")[0] for line in plan.accelerations]
    assert len(names) == (0 if boost_level == "O0" else 6)
    assert net.emb.sparse == (boost_level != "O0")  # boost changed the network itself, before the step was built
    ids, y = torch.randint(0, 50, (16, 2)), torch.randn(16, 1)
    out = plan.train_network(ids, y)
    loss = out[0] if isinstance(out, tuple) else out
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.amp_level = "O3"


def test_amp_level_explicitly_chosen_keeps_boost_off_the_precision():
    _, plan = _plan("O3", "O2")
    assert plan.amp_level == "O3" and "bf16_autocast: skipped (amp_level='O3' was chosen explicitly)" in \
        plan.accelerations


def test_loss_scale_manager_at_o0_gets_a_loss_scaled_step():
    _, plan = _plan("O0", "O0", loss_scale_manager=FixedLossScaleManager(8.0))
    assert type(plan.train_network) is TrainOneStepWithLossScaleCell and plan.precision.level == "O0"


def test_without_optimizer_the_network_is_its_own_step():
    net = Net()
    plan = plan_step(net, nn.MSELoss(), None, StepOptions(parallel_mode="stand_alone"))
    assert isinstance(plan.train_network, WithLossCell) and plan.train_network.backbone_network is net
    assert plan.eval_network is None and plan.eval_indexes is None and plan.predict_network is net


def test_custom_eval_network_is_kept():
    net, custom = Net(), WithEvalCell(Net(), nn.MSELoss())
    plan = plan_step(net, None, torch.optim.SGD(net.parameters(), lr=0.1), StepOptions(parallel_mode="stand_alone"),
                     eval_network=custom, eval_indexes=[0, 1, 2], with_metrics=True)
    assert plan.eval_network is custom and plan.eval_indexes == [0, 1, 2]


@pytest.mark.parametrize("options, error, match", [
    (dict(amp_level="O4"), ValueError, r"Model: 'amp_level' must be one of \['O0', 'O1', 'O2', 'O3', 'auto'\].*'O4'"),
    (dict(amp_level=2), TypeError, r"Model: 'amp_level' must be one of .*got 2"),
    (dict(boost_level="O3"), ValueError, r"Model: 'boost_level' must be one of \['O0', 'O1', 'O2'\].*'O3'"),
    (dict(boost_level=1), TypeError, r"Model: 'boost_level' must be one of .*got 1"),
    (dict(boost_config={"warp_drive": True}), ValueError, r"'boost_config_dict' has unknown acceleration "
                                                          r"'warp_drive'; allowed: sparse_embeddings"),
    (dict(boost_config={"fused_optimizer": 1}), TypeError, r"'boost_config_dict\['fused_optimizer'\]'.*got 1"),
    (dict(boost_config=["fused_optimizer"]), TypeError, r"'boost_config_dict' must be a dict"),
    (dict(keep_batchnorm_fp32="yes"), TypeError, r"'keep_batchnorm_fp32'.*'yes'"),
    (dict(parallel_mode="model_parallel"), ValueError,
     r"'parallel_mode' must be one of \['stand_alone', 'data_parallel', 'hybrid_parallel'\].*'model_parallel'"),
    (dict(parallel_mode=0), TypeError, r"'parallel_mode' must be one of .*got 0"),
])
def test_bad_options_are_refused(options, error, match):
    with pytest.raises(error, match=match):
        StepOptions(**options)


def test_bad_combinations_are_refused_before_anything_changes():
    net = Net()
    with pytest.raises(ValueError, match=r"'amp_level'='O2' needs an 'optimizer'.*got optimizer=None"):
        plan_step(net, nn.MSELoss(), None, StepOptions(amp_level="O2"))
    with pytest.raises(ValueError, match=r"'optimizer' must be set when 'loss_scale_manager' is given"):
        plan_step(net, nn.MSELoss(), None, StepOptions(loss_scale_manager=FixedLossScaleManager()))
    opt = torch.optim.Adam(net.parameters())
    with pytest.raises(TypeError, match=r"'loss_scale_manager' must be a LossScaleManager.*got 8"):
        plan_step(net, nn.MSELoss(), opt, StepOptions(boost_level="O1", loss_scale_manager=8))
    with pytest.raises(ValueError, match=r"'metrics' needs either 'loss_fn'.*got loss_fn=None"):
        plan_step(net, None, opt, StepOptions(boost_level="O1"), with_metrics=True)
    with pytest.raises(TypeError, match=r"plan_step: 'options' must be a StepOptions.*'O1'"):
        plan_step(net, nn.MSELoss(), opt, "O1")
    assert not net.emb.sparse  # boost was not applied by any refused plan


@pytest.fixture
def one_rank_group(tmp_path):
    with socket.socket() as s:  # a free port for the rank's TCP store
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=0, world_size=1)
    yield
    torch.distributed.destroy_process_group()


@pytest.mark.parametrize("mode", ["data_parallel", "hybrid_parallel"])
def test_parallel_mode_wraps_the_training_step_only(one_rank_group, mode, capsys):
    net = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 1))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    plan = plan_step(net, nn.MSELoss(), opt, StepOptions(amp_level="O1", parallel_mode=mode), with_metrics=True)
    assert plan.parallel_mode == mode
    assert plan.train_network.network.backbone_network.module is net
    assert isinstance(plan.train_network.network.backbone_network, DistributedDataParallel)
    for network in (plan.eval_network, plan.predict_network):  # they call the network itself
        assert not any(isinstance(m, DistributedDataParallel) for m in network.modules())
        assert any(m is net for m in network.modules())
    printed = capsys.readouterr().out
    assert ("hybrid_parallel on 1 ranks:" in printed) == (mode == "hybrid_parallel")
    loss = plan.train_network(torch.randn(8, 4), torch.randn(8, 1))
    assert torch.isfinite(loss)

