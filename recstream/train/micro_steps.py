"""`MicroSteps`: a step network that trains each batch as consecutive optimizer steps of a few rows.

`RecModel.online_train(..., micro_batch_size=k)` wraps its training step in it: a scored batch
of 256 rows with ``k=32`` becomes 8 steps of 32 rows, in order (the last slice may be smaller).
On a live stream that learns more per event than one step per batch (docs/online.md, "Micro-steps").

What stays per batch, because the loop around it sees one call per batch: the prequential scoring
(`recstream.callbacks.Prequential` scores the whole batch through ``batch_observers`` before this
runs), the stream position, the step counter (``cur_step_num`` counts batches, not micro-steps),
the callbacks' step hooks and the checkpoints, so exactly-once positions are those of the batches.

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
from torch import nn

from ..data.batch import num_rows, split_rows
from ..validation import check_int, check_module


class MicroSteps(nn.Module):
    """Call `network` (one training step per call) on consecutive slices of `size` rows of its
    inputs (`recstream.data.batch.split_rows`: `Features`, tensors, `WeightedLabel`, in tuples,
    lists, dicts), in order.

    Returns the row-weighted mean of the slices' losses when every slice returns a scalar (a
    device tensor: nothing is read on the host), else the last slice's outputs. ``steps_done``
    counts the optimizer steps taken. ``partial`` is True after a slice other than the first raised:
    the weights then hold part of a batch, a state no stream position describes (`RecModel` marks
    the run so that no exception checkpoint is written of it).
    """

    def __init__(self, network: nn.Module, size: int):
        super().__init__()
        check_module("MicroSteps", "network", network)
        self.network = network
        self.size = check_int("MicroSteps", "size", size, minimum=1)
        self.steps_done = 0
        self.partial = False

    def forward(self, *args, **kwargs):
        self.partial = False
        rows = num_rows((args, kwargs))
        slices = split_rows((args, kwargs), self.size)
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
                total = total + outputs.detach().float() * min(self.size, rows - i * self.size)
        if not scalar or len(slices) == 1:
            return outputs
        return (total / rows).to(outputs.dtype)


def _is_loss(outputs) -> bool:
    return isinstance(outputs, torch.Tensor) and outputs.dim() == 0 and outputs.is_floating_point()
