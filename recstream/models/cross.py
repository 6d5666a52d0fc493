"""The cross network of DCN-V2 (Wang et al., 2021), full-rank or low-rank.

Each layer ``l`` computes explicit feature crosses of bounded degree::

    x_{l+1} = x_0 * (W_l x_l + b_l) + x_l                 (full rank, W_l: d x d)
    x_{l+1} = x_0 * (U_l (V_l^T x_l) + b_l) + x_l         (low rank r: U_l, V_l are d x r)

``*`` is elementwise. After ``L`` layers the output holds polynomial crosses of the
input up to degree ``L + 1``; the residual ``+ x_l`` keeps lower degrees. Low rank cuts
parameters and FLOPs from ``d^2`` to ``2 d r`` per layer (the paper finds ``r ~ d/4``
loses little).

>>> import torch
>>> net = CrossNetwork(6, num_layers=2, low_rank=2)
>>> net(torch.randn(4, 6)).shape
torch.Size([4, 6])
"""
from __future__ import annotations

import torch
from torch import nn

from ..validation import check_int


class CrossNetwork(nn.Module):
    """``num_layers`` cross layers on ``[B, in_features]``; output has the same shape.

    Args:
        in_features: width ``d`` of ``x_0``.
        num_layers: number of cross layers (>= 1).
        low_rank: None for full ``d x d`` matrices, else the rank ``r`` (1 <= r < d makes sense;
            ``r >= d`` is allowed but only costs more).
    """

    def __init__(self, in_features: int, num_layers: int = 3, low_rank: int | None = None) -> None:
        super().__init__()
        d = self.in_features = check_int("CrossNetwork", "in_features", in_features, minimum=1)
        self.num_layers = check_int("CrossNetwork", "num_layers", num_layers, minimum=1)
        self.low_rank = check_int("CrossNetwork", "low_rank", low_rank, minimum=1, allow_none=True)
        shapes = [(d, d)] if low_rank is None else [(d, low_rank), (low_rank, d)]
        # One stacked tensor per factor ([L, ...]): fewer Parameters, same math per layer.
        self.kernels = nn.ParameterList(nn.Parameter(torch.empty(self.num_layers, *s)) for s in shapes)
        self.bias = nn.Parameter(torch.zeros(self.num_layers, d))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # Xavier keeps W x_l at the scale of x_l, so x_0 * (W x_l) does not blow up with depth;
        # a zero bias makes every layer start as a pure (small) cross plus the identity.
        for k in self.kernels:
            for layer in k.data:
                nn.init.xavier_normal_(layer)
        nn.init.zeros_(self.bias)

    def forward(self, x0: torch.Tensor) -> torch.Tensor:
        x = x0
        for layer in range(self.num_layers):
            if self.low_rank is None:
                wx = x @ self.kernels[0][layer].t()
            else:  # (x V) U^T  with V = kernels[0][l] (d x r) and U^T = kernels[1][l] (r x d)
                wx = (x @ self.kernels[0][layer]) @ self.kernels[1][layer]
            x = x0 * (wx + self.bias[layer]) + x
        return x
