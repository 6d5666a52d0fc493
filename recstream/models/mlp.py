"""A plain multi-layer perceptron, the "deep" tower of every model here.

>>> import torch
>>> mlp = MLP(8, hidden=(16, 4), out_features=1)
>>> mlp(torch.randn(3, 8)).shape
torch.Size([3, 1])
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from ..validation import check_bool, check_choice, check_int, check_number, check_sizes

_ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU, "silu": nn.SiLU, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid}


class MLP(nn.Module):
    """``Linear -> [BatchNorm] -> activation -> [Dropout]`` per hidden width, then an
    optional plain ``Linear(out_features)`` head (no activation: it produces logits).

    Args:
        in_features: input width.
        hidden: hidden layer widths (may be empty: then the MLP is the head alone, or
            the identity without a head).
        out_features: width of the final linear layer, or None for no head (the output
            is then the last hidden activation, e.g. DLRM's bottom MLP).
        activation: one of ``relu, gelu, silu, tanh, sigmoid``.
        dropout: drop probability after each hidden activation, in [0, 1).
        batch_norm: BatchNorm1d after each hidden linear layer.
    """

    def __init__(self, in_features: int, hidden: Sequence[int] = (256, 128), out_features: int | None = None,
                 *, activation: str = "relu", dropout: float = 0.0, batch_norm: bool = False) -> None:
        super().__init__()
        self.in_features = check_int("MLP", "in_features", in_features, minimum=1)
        self.hidden = check_sizes("MLP", "hidden", hidden)
        out = check_int("MLP", "out_features", out_features, minimum=1, allow_none=True)
        check_choice("MLP", "activation", activation, _ACTIVATIONS)
        dropout = check_number("MLP", "dropout", dropout, minimum=0.0, maximum=1.0, max_open=True)
        check_bool("MLP", "batch_norm", batch_norm)
        layers: list[nn.Module] = []
        width = self.in_features
        for h in self.hidden:
            # With BatchNorm right after it, the linear bias is redundant (BN re-centres).
            layers.append(nn.Linear(width, h, bias=not batch_norm))
            if batch_norm:
                layers.append(nn.BatchNorm1d(h))
            layers.append(_ACTIVATIONS[activation]())
            if dropout > 0:
                layers.append(nn.Dropout(dropout))
            width = h
        if out is not None:
            layers.append(nn.Linear(width, out))
            width = out
        self.layers = nn.Sequential(*layers)
        self.out_features = width

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)
