"""The step plan: amp level, boost level and parallel mode resolved once into the networks `Model` runs.

Why one function: the three choices depend on each other. Boost may pick the precision
(``bf16_autocast`` turns amp "O0" into "O1" in bfloat16); the precision decides whether the loss is
scaled ("O2" scales by default); a scaled loss rules out boost's CUDA graphs; and the parallel
mode wraps the training step only, while evaluation and prediction call the network itself.
`plan_step` settles them in that order, once, and returns a frozen `StepPlan` that the train, eval
and predict networks all come from, so no part of `Model` resolves a level again.

>>> import torch
>>> net = torch.nn.Linear(4, 1)
>>> plan = plan_step(net, torch.nn.MSELoss(), torch.optim.SGD(net.parameters(), lr=0.1),
...                  StepOptions(amp_level="O2", parallel_mode="stand_alone"), with_metrics=True)
>>> plan.precision.level, plan.precision.dtype, type(plan.train_network).__name__
('O2', torch.bfloat16, 'TrainOneStepWithLossScaleCell')
>>> type(plan.eval_network).__name__, plan.eval_indexes, type(plan.predict_network).__name__
('WithEvalCell', [0, 1, 2], 'CastNetwork')
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from ..distributed import PARALLEL_MODES, data_parallel, hybrid_parallel, parallel_mode, rank, sharding_plan, world_size
from ..validation import check_bool, check_choice, check_type
from . import amp, boost
from .amp import Precision
from .cells import TrainOneStepCell, WithEvalCell, WithLossCell
from .cuda_graph import CUDAGraphStep
from .loss_scale import LossScaleManager

BOOST_LEVELS = ("O0", "O1", "O2")


@dataclass(frozen=True)
class StepOptions:
    """What a `Model` was asked for, its values checked when built (owner "Model" in the errors);
    what depends on the optimizer, and the loss-scale manager's type after that, by `plan_step`.

    ``parallel_mode`` None: the parallel context's (`recstream.distributed.parallel_mode`), read when
    the plan is made, as MindSpore reads it when a Model is built.
    """

    amp_level: str = "O0"
    boost_level: str = "O0"
    boost_config: dict | None = None
    keep_batchnorm_fp32: bool | None = None
    loss_scale_manager: LossScaleManager | None = None
    parallel_mode: str | None = None

    def __post_init__(self):
        check_choice("Model", "amp_level", self.amp_level, amp.AMP_LEVELS)
        check_choice("Model", "boost_level", self.boost_level, BOOST_LEVELS)
        boost.check_boost_config(self.boost_config)
        check_bool("Model", "keep_batchnorm_fp32", self.keep_batchnorm_fp32, allow_none=True)
        if self.parallel_mode is not None:
            check_choice("Model", "parallel_mode", self.parallel_mode, PARALLEL_MODES)


@dataclass(frozen=True)
class StepPlan:
    """The networks `Model` runs and the accelerations applied to get them."""

    train_network: nn.Module  # what each training step calls
    eval_network: nn.Module | None  # None: no metrics to evaluate
    eval_indexes: list[int] | None  # positions of (loss, outputs, label) in the eval network's outputs
    predict_network: nn.Module
    amp_level: str  # as asked for, or "O1" where boost's bf16_autocast chose it (what cb_params shows)
    precision: Precision  # amp_level resolved for the network's device
    boost_level: str
    parallel_mode: str
    accelerations: tuple[str, ...]  # boost's lines: each acceleration applied or skipped, and why


def plan_step(network: nn.Module, loss_fn: Callable | None, optimizer, options: StepOptions,
              eval_network: nn.Module | None = None, eval_indexes: list[int] | None = None,
              with_metrics: bool = False) -> StepPlan:
    """Resolve `options` for `network` and build the train, eval and predict networks (see the
    module docstring). Boost changes `network` and `optimizer` in place; "O3" casts the weights."""
    check_type("plan_step", "options", options, StepOptions)
    _check_needs(loss_fn, optimizer, options, eval_network, with_metrics)
    device = network_device(network)
    mode = options.parallel_mode or parallel_mode()
    precision = amp.resolve_precision(options.amp_level, device, None, options.keep_batchnorm_fp32)
    # Boost first: it switches embedding gradients to sparse (DDP must see that) and may pick the precision.
    report = boost.apply_boost(network, optimizer, options.boost_level, options.boost_config, options.amp_level,
                               loss_scaled=options.loss_scale_manager is not None or precision.level == "O2")
    amp_level = options.amp_level
    if report.bf16_autocast:
        amp_level = "O1"
        precision = amp.resolve_precision("O1", device, torch.bfloat16, options.keep_batchnorm_fp32)
    train = _train_step(network, loss_fn, optimizer, precision, options.loss_scale_manager, mode)
    if report.graph_optimizers:
        train = CUDAGraphStep(train, report.graph_optimizers)
    if eval_network is None:  # the default one, where there are metrics to evaluate
        eval_network = _eval_network(network, loss_fn, precision) if with_metrics else None
        eval_indexes = [0, 1, 2] if with_metrics else None
    predict = network if precision.level == "O0" else amp.precision_predict_network(network, precision)
    return StepPlan(train, eval_network, eval_indexes, predict, amp_level, precision, options.boost_level, mode,
                    tuple(report.lines))


def network_device(network: nn.Module) -> torch.device:
    """The device of the network's first parameter or buffer (CPU for a network without either)."""
    for t in network.parameters():
        return t.device
    for t in network.buffers():
        return t.device
    return torch.device("cpu")


def _check_needs(loss_fn, optimizer, options: StepOptions, eval_network, with_metrics: bool) -> None:
    if options.amp_level != "O0" and optimizer is None:
        raise ValueError(f"Model: 'amp_level'={options.amp_level!r} needs an 'optimizer' (mixed precision wraps "
                         "the training step); got optimizer=None. Use amp_level='O0' or pass an optimizer")
    if options.loss_scale_manager is not None and optimizer is None:
        raise ValueError("Model: 'optimizer' must be set when 'loss_scale_manager' is given (got optimizer=None)")
    check_type("Model", "loss_scale_manager", options.loss_scale_manager, LossScaleManager, allow_none=True,
               allowed="a LossScaleManager (FixedLossScaleManager or DynamicLossScaleManager)")
    if with_metrics and eval_network is None and loss_fn is None:
        raise ValueError("Model: 'metrics' needs either 'loss_fn' (to build the eval network) or "
                         "'eval_network'; got loss_fn=None and eval_network=None")


def _train_step(network: nn.Module, loss_fn, optimizer, precision: Precision,
                loss_scale_manager: LossScaleManager | None, mode: str) -> nn.Module:
    if optimizer is None:  # the network is its own step: it synchronises itself, if at all
        return network if loss_fn is None else WithLossCell(network, loss_fn)
    backbone = _parallel_backbone(network, mode)
    if precision.level == "O0" and loss_scale_manager is None:
        return TrainOneStepCell(backbone if loss_fn is None else WithLossCell(backbone, loss_fn), optimizer)
    # Mixed precision builds its own step cell (autocast, casts, loss scale).
    return amp.precision_train_step(backbone, loss_fn, optimizer, precision, loss_scale_manager)


def _parallel_backbone(network: nn.Module, mode: str) -> nn.Module:
    """The network as the training step calls it in this parallel mode.

    Only training goes through DDP: evaluation and prediction call the network itself. Under
    data_parallel ranks may then evaluate uneven shares of data; under hybrid_parallel the
    sharded tables route lookups through every rank, so all ranks must evaluate in step.
    """
    if mode == "data_parallel":
        return data_parallel(network)
    if mode == "hybrid_parallel":
        backbone = hybrid_parallel(network)
        if rank() == 0:  # the plan, once, where a user reads it
            plan = sharding_plan(network) or ["no table to shard: every parameter replicated"]
            print(f"hybrid_parallel on {world_size()} ranks:", *plan, sep="\n  ", flush=True)
        return backbone
    return network


def _eval_network(network: nn.Module, loss_fn, precision: Precision) -> nn.Module:
    if precision.level == "O0":
        return WithEvalCell(network, loss_fn)
    return amp.precision_eval_network(network, loss_fn, precision)
