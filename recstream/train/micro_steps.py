"""`MicroSteps`: a step network that trains each batch as consecutive optimizer steps of a few rows.

`RecModel.online_train(..., micro_batch_size=k)` wraps its training step in it: a scored batch
of 256 rows with ``k=32`` becomes 8 steps of 32 rows, in order (the last slice may be smaller).
On a live stream that learns more per event than one step per batch (docs/online.md, "Micro-steps").

What stays per batch, because the loop around it sees one call per batch: the prequential scoring
(`recstream.callbacks.Prequential` scores the whole batch through ``batch_observers`` before this
runs), the stream position, the step counter (``cur_step_num`` counts batches, not micro-steps),
the callbacks' step hooks and the checkpoints, so exactly-once positions are those of the batches.

Several ranks (``sync=True``, what `RecModel` sets under torchrun): every optimizer step is a set of
collectives, so all ranks must take the same number of steps per batch although their batches
differ in size. Per batch, one all-reduce (MAX) of the slice count agrees on it; a rank with fewer
slices then steps with *pad slices*: one row, zero dense values, no ids, label weighted 0 (as the
`Lockstep` fill batch: `RecModel`'s loss multiplies by the weight), so it enters the collectives
with zero gradients and touches no embedding row. The gradients are those of the real slices.

>>> import torch
>>> from recstream.train import TrainOneStepCell, WithLossCell
>>> net = torch.nn.Linear(2, 1)
>>> step = TrainOneStepCell(WithLossCell(net, torch.nn.MSELoss()), torch.optim.SGD(net.parameters(), lr=0.1))
>>> micro = MicroSteps(step, 4)
>>> loss = micro(torch.randn(10, 2), torch.randn(10, 1))  # 3 optimizer steps: 4, 4 and 2 rows
>>> micro.steps_done, loss.dim()
(3, 0)
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from ..data.batch import WeightedLabel, num_rows, split_rows
from ..features import Features
from ..validation import check_bool, check_int, check_module


class MicroSteps(nn.Module):
    """Call `network` (one training step per call) on consecutive slices of `size` rows of its
    inputs (`recstream.data.batch.split_rows`: `Features`, tensors, `WeightedLabel`, in tuples,
    lists, dicts), in order.

    Returns the row-weighted mean of the slices' losses when every slice returns a scalar (a
    device tensor: nothing is read on the host), else the last slice's outputs. ``steps_done``
    counts the optimizer steps taken. ``partial`` is True after a slice other than the first raised:
    the weights then hold part of a batch, a state no stream position describes (`RecModel` marks
    the run so that no exception checkpoint is written of it).
    `sync`: agree on the slice count with the other ranks and pad (see the module docstring).
    """

    def __init__(self, network: nn.Module, size: int, *, sync: bool = False):
        super().__init__()
        check_module("MicroSteps", "network", network)
        self.network = network
        self.size = check_int("MicroSteps", "size", size, minimum=1)
        self.sync = check_bool("MicroSteps", "sync", sync)
        self.steps_done = 0
        self.partial = False

    def forward(self, *args, **kwargs):
        self.partial = False
        rows = num_rows((args, kwargs))
        slices = split_rows((args, kwargs), self.size)
        if self.sync:
            slices = slices + [pad_slice(slices[-1])] * (agreed_count(len(slices)) - len(slices))
        scalar, total, outputs = True, 0.0, None
        for i, (part_args, part_kwargs) in enumerate(slices):
            try:
                outputs = self.network(*part_args, **part_kwargs)
            except BaseException:
                self.partial = i > 0
                raise
            self.steps_done += 1
            scalar = scalar and _is_loss(outputs)
            if scalar:  # summed right away: a replayed CUDA graph overwrites its output at the next slice
                total = total + outputs.detach().float() * max(0, min(self.size, rows - i * self.size))
        if not scalar or len(slices) == 1:
            return outputs
        return (total / rows).to(outputs.dtype)


def agreed_count(count: int) -> int:
    """The largest `count` of all ranks (collective: one all-reduce of one integer)."""
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"  # NCCL reduces device tensors only
    n = torch.tensor([count], dtype=torch.int64, device=device)
    dist.all_reduce(n, op=dist.ReduceOp.MAX)
    return int(n.item())  # once per batch: the loop below needs the count on the host


def pad_slice(part):
    """A one-row step input shaped like `part` (``(args, kwargs)`` of a slice) that trains
    nothing: Features with zero dense values and no ids, zero tensors, the label weighted 0.

    >>> (x, y), _ = pad_slice(((torch.ones(3, 2), torch.ones(3)), {}))
    >>> x.tolist(), y.labels.tolist(), y.weight
    ([[0.0, 0.0]], [0.0], 0.0)
    """
    args, kwargs = _zero_row(part)
    if "label" in kwargs:
        kwargs["label"] = _weight0(kwargs["label"])
    elif args:
        args = (*args[:-1], _weight0(args[-1]))
    else:
        raise ValueError("MicroSteps: a step's inputs must hold a label (last argument or 'label') to pad ranks")
    return args, kwargs


def _weight0(label):
    return WeightedLabel(label.labels if isinstance(label, WeightedLabel) else label, 0.0)


def _zero_row(data):
    if isinstance(data, Features):
        dense = data.dense.new_zeros((1,) + tuple(data.dense.shape[1:]))
        sizes = None if data.feature_sizes is None else (0,) * data.num_features
        return Features(dense, data.values.new_zeros(0), data.offsets.new_zeros(data.num_features + 1), 1,
                        data.num_features, data.keys, sizes)
    if isinstance(data, torch.Tensor):
        return data.new_zeros((1,) + tuple(data.shape[1:])) if data.dim() > 0 else data
    if isinstance(data, WeightedLabel):
        return WeightedLabel(_zero_row(data.labels), 0.0)
    if isinstance(data, (tuple, list)):
        parts = [_zero_row(p) for p in data]
        return type(data)(*parts) if hasattr(data, "_fields") else type(data)(parts)
    if isinstance(data, dict):
        return {k: _zero_row(v) for k, v in data.items()}
    return data


def _is_loss(outputs) -> bool:
    return isinstance(outputs, torch.Tensor) and outputs.dim() == 0 and outputs.is_floating_point()
