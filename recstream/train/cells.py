"""Training cells: small modules that turn a network into a loss, a step or an eval.

- `WithLossCell(backbone, loss_fn)`: ``loss_fn(backbone(*data), label)``.
- `TrainOneStepCell(network_with_loss, optimizer, sens=1.0)`: forward, backward, update; returns
  the loss (detached). This is the `train_step` extension point: subclass it, or pass any module
  whose forward runs one step, as `Model`'s network with ``loss_fn=None, optimizer=None``.
- `WithEvalCell(network, loss_fn)`: returns ``(loss, outputs, label)`` for metrics.

>>> import torch
>>> net = torch.nn.Linear(4, 2)
>>> step = TrainOneStepCell(WithLossCell(net, torch.nn.CrossEntropyLoss()),
...                         torch.optim.SGD(net.parameters(), lr=0.1))
>>> loss = step(torch.randn(8, 4), torch.randint(0, 2, (8,)))
>>> loss.requires_grad
False
"""
from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Protocol, runtime_checkable

import torch
from torch import nn

from ..data.protocol import split_label
from ..hostpath import one_step
from ..validation import check_callable, check_module, check_type


@runtime_checkable
class OptimizerLike(Protocol):
    """What a step cell needs of an optimizer: any ``torch.optim.Optimizer`` has it."""

    def step(self, *args, **kwargs): ...

    def zero_grad(self, set_to_none: bool = True) -> None: ...


class WithLossCell(nn.Module):
    """Wrap a backbone and a loss: ``forward(*data, label) -> loss_fn(backbone(*data), label)``."""

    def __init__(self, backbone: nn.Module, loss_fn: Callable):
        super().__init__()
        check_module("WithLossCell", "backbone", backbone)
        check_callable("WithLossCell", "loss_fn", loss_fn)
        self._backbone = backbone
        self._loss_fn = loss_fn

    @property
    def backbone_network(self) -> nn.Module:
        return self._backbone

    def forward(self, *inputs, **kwargs):
        data, kwargs, label = split_label(inputs, kwargs)
        return self._loss_fn(self._backbone(*data, **kwargs), label)


class TrainOneStepCell(nn.Module):
    """One optimisation step: ``loss = network(*inputs)``, backward with gradient `sens`, update.

    `sens` scales the gradient seed (MindSpore's sensitivity), e.g. for a static loss scale.
    `autocast` is a zero-argument factory of a context manager wrapping the forward pass (mixed
    precision sets it; default: no autocast).
    """

    def __init__(self, network: nn.Module, optimizer: torch.optim.Optimizer, sens: float = 1.0,
                 autocast: Callable[[], AbstractContextManager] | None = None):
        super().__init__()
        check_module("TrainOneStepCell", "network", network)
        check_type("TrainOneStepCell", "optimizer", optimizer, OptimizerLike,
                   allowed="a torch.optim.Optimizer (an object with step() and zero_grad())")
        self.network = network
        self.optimizer = optimizer
        self.sens = float(sens)
        self.autocast = autocast or nullcontext

    def set_sens(self, value: float) -> None:
        self.sens = float(value)

    def backward(self, loss: torch.Tensor) -> None:
        if not isinstance(loss, torch.Tensor) or not loss.requires_grad:
            got = "a tensor without grad" if isinstance(loss, torch.Tensor) else type(loss).__name__
            raise TypeError(f"TrainOneStepCell: the network must return a loss tensor that requires grad, got {got}")
        if self.sens == 1.0 and loss.dim() == 0:
            loss.backward()
        else:  # a non-scalar loss gets the gradient seed `sens` on every element, like MindSpore's Fill
            loss.backward(torch.full_like(loss, self.sens))

    def forward(self, *inputs, **kwargs):
        self.optimizer.zero_grad(set_to_none=True)
        with self.autocast(), one_step():  # modules reading one batch share its reorderings and checks
            loss = self.network(*inputs, **kwargs)
        self.backward(loss)
        self.optimizer.step()
        return loss.detach()


class WithEvalCell(nn.Module):
    """Evaluation wrapper returning ``(loss, outputs, label)``; `Model` feeds metrics from it.

    With ``add_cast_fp32=True`` outputs and label are cast to float32 (after low-precision runs).
    """

    def __init__(self, network: nn.Module, loss_fn: Callable, add_cast_fp32: bool = False):
        super().__init__()
        self._network = network
        self._loss_fn = loss_fn
        self.add_cast_fp32 = add_cast_fp32

    def forward(self, *inputs, **kwargs):
        data, kwargs, label = split_label(inputs, kwargs)
        with one_step():  # modules reading one batch share its reorderings and checks
            outputs = self._network(*data, **kwargs)
        if self.add_cast_fp32:
            outputs = outputs.float() if isinstance(outputs, torch.Tensor) and outputs.is_floating_point() else outputs
            label = label.float() if isinstance(label, torch.Tensor) and label.is_floating_point() else label
        return self._loss_fn(outputs, label), outputs, label
