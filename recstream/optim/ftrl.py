"""FTRL-Proximal (McMahan et al., 2013, "Ad Click Prediction: a View from the
Trenches"), per coordinate, for the wide / linear part of CTR models.

State per coordinate: accumulator ``n`` (sum of squared gradients, starts at
``initial_accumulator_value``) and linear term ``z`` (starts at 0). For every
coordinate of a touched row, with ``p = -lr_power`` (0.5 in the paper)::

    n_new = n + g**2
    sigma = (n_new**p - n**p) / lr
    z     = z + g - sigma * w
    n     = n_new
    w     = 0                                               if |z| <= l1
          = -(z - sign(z) * l1) / (n**p / lr + l2)          otherwise

This is the paper's closed form with ``beta = 0`` (``initial_accumulator_value``
plays the role of the smoothing term). Conventions, stated because libraries
differ: ``l1``/``l2`` are the paper's lambda1/lambda2, i.e. the objective is
``loss + l1*|w|_1 + (l2/2)*|w|^2``. TensorFlow's Ftrl adds ``2*l2`` to the
denominator, so TF's ``l2_regularization_strength=x`` equals ``l2=2*x`` here;
TF's ``l1`` is the same. Untouched rows keep ``w``, ``n`` and ``z``.

On a CPU, a float32 table's touched rows are updated in one compiled pass
(`recstream.optim.native`), equal to the torch ops to float32 rounding;
on CUDA with Triton, in one fused launch (`recstream.optim.triton_rows`, any ``lr_power``);
other devices and dtypes, and on a CPU ``lr_power`` other than -0.5, run the torch ops.

Example:
    >>> import torch
    >>> from recstream.optim import FTRL
    >>> wide = torch.nn.EmbeddingBag(1000, 1, mode="sum", sparse=True)
    >>> _ = torch.nn.init.zeros_(wide.weight)
    >>> opt = FTRL(wide.parameters(), lr=0.1, l1=1.0)
    >>> wide(torch.tensor([[1, 2]])).sum().backward()   # |g| = 1 <= l1
    >>> opt.step()
    >>> float(wide.weight.detach().abs().sum())         # L1 keeps it sparse
    0.0
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor

from recstream.validation import check_number

from . import native, triton_rows
from ._base import SparseRowOptimizer, kernel_step_done, put_rows, take_rows

__all__ = ["FTRL"]


class FTRL(SparseRowOptimizer):
    """FTRL-Proximal with L1/L2 regularisation; updates only touched rows.

    Args:
        params: iterable of parameters or parameter-group dicts.
        lr: the paper's alpha (> 0; the update divides by it).
        lr_power: exponent of the per-coordinate learning rate schedule
            (``<= 0``; -0.5 is the paper's ``1/sqrt(n)``, 0 is a fixed rate).
        l1: L1 strength (>= 0); coordinates with ``|z| <= l1`` are exactly 0.
        l2: L2 strength (>= 0), paper convention (see module docstring).
        initial_accumulator_value: starting ``n`` (>= 0; 0.1 as in TF);
            also what ``pop_reset_rows`` resets a row's ``n`` to.

    State per parameter: ``"step"`` (int), ``"accumulator"`` (n) and
    ``"linear"`` (z), both shaped like the parameter.
    """

    def __init__(self, params: Iterable[Any], lr: float = 0.05, lr_power: float = -0.5,
                 l1: float = 0.0, l2: float = 0.0,
                 initial_accumulator_value: float = 0.1) -> None:
        defaults = dict(lr=lr, lr_power=lr_power, l1=l1, l2=l2,
                        initial_accumulator_value=initial_accumulator_value)
        super().__init__(params, defaults)

    def _validate_group(self, group: dict[str, Any]) -> None:
        owner = type(self).__name__
        check_number(owner, "lr", group["lr"], minimum=0.0, min_open=True)
        check_number(owner, "lr_power", group["lr_power"], maximum=0.0)
        for name in ("l1", "l2", "initial_accumulator_value"):
            check_number(owner, name, group[name], minimum=0.0)

    def _init_state(self, p: Tensor, state: dict[str, Any], group: dict[str, Any]) -> None:
        state["step"] = 0
        state["accumulator"] = torch.full_like(
            p, float(group["initial_accumulator_value"]), memory_format=torch.contiguous_format)
        state["linear"] = torch.zeros_like(p, memory_format=torch.contiguous_format)

    def _reset_rows(self, state: dict[str, Any], rows: Tensor, group: dict[str, Any]) -> None:
        acc, lin = state["accumulator"], state["linear"]
        if acc.dim() == 0:
            acc, lin = acc.unsqueeze(0), lin.unsqueeze(0)
        acc.index_fill_(0, rows, float(group["initial_accumulator_value"]))
        lin.index_fill_(0, rows, 0.0)

    def _update(self, p: Tensor, rows: Tensor | None, grad: Tensor,
                state: dict[str, Any], group: dict[str, Any]) -> None:
        lr, power = group["lr"], -group["lr_power"]
        l1, l2 = group["l1"], group["l2"]
        state["step"] += 1
        acc_t, lin_t = state["accumulator"], state["linear"]
        if acc_t.dim() == 0:
            acc_t, lin_t = acc_t.unsqueeze(0), lin_t.unsqueeze(0)
        if power == 0.5 and not isinstance(lr, Tensor) and native.runs_on_kernels(rows, [p, grad, acc_t, lin_t]):
            # One pass over the touched rows instead of ~15 torch ops (see _row_kernels.c).
            native.update_rows("ftrl", [p, acc_t, lin_t], rows, grad, lr, l1, l2)
            return

        n = take_rows(acc_t, rows)
        z = take_rows(lin_t, rows)
        w = take_rows(p, rows)
        n_new = n.addcmul(grad, grad)
        # sqrt is both faster and exact-er than pow(0.5) for the usual case.
        root = torch.sqrt if power == 0.5 else (lambda x: x.pow(power))
        n_new_pow = root(n_new)
        sigma = (n_new_pow - root(n)).div_(lr)
        z.add_(grad).sub_(sigma * w)
        put_rows(lin_t, rows, z)
        put_rows(acc_t, rows, n_new)
        # Closed-form minimiser of the per-coordinate proximal objective.
        quadratic = n_new_pow.div_(lr).add_(l2)
        new_w = (torch.sign(z) * l1 - z).div_(quadratic)
        new_w = torch.where(z.abs() > l1, new_w, torch.zeros_like(new_w))
        put_rows(p, rows, new_w)

    def _kernel_step(self, p: Tensor, grad: Tensor, state: dict[str, Any], group: dict[str, Any],
                     found_inf: Tensor | None) -> bool:
        entries = triton_rows.entries_for(p, grad, [state["accumulator"], state["linear"]])
        if entries is None:
            return False
        acc, lin = (t if t.dim() else t.unsqueeze(0) for t in (state["accumulator"], state["linear"]))  # 0-d: as `p`
        state["step"] += 1
        triton_rows.ftrl(p, acc, lin, *entries, group["lr"], group["lr_power"], group["l1"], group["l2"], found_inf)
        kernel_step_done(state, found_inf)
        return True
