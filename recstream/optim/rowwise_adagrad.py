"""Row-wise Adagrad: one accumulator scalar per embedding row.

Update for every touched row ``r`` with row gradient ``g_r`` (``D`` values)::

    g_r   <- g_r + weight_decay * w_r            (L2, touched rows only)
    acc_r <- acc_r + mean(g_r ** 2)              (one scalar per row)
    w_r   <- w_r - lr * g_r / (sqrt(acc_r) + eps)

This is the optimizer large-scale recommenders use for embedding tables
(e.g. FBGEMM's ``EXACT_ROWWISE_ADAGRAD``): keeping one scalar per row instead
of one per coordinate cuts optimizer memory from ``D`` floats per row to one,
with quality close to full Adagrad because coordinates of an embedding row
see gradients of similar scale. For a 1-D parameter every element is its own
row, so the update is exactly ``torch.optim.Adagrad``.

On a CPU, a float32 table's touched rows are updated in one compiled pass
(`recstream.optim.native`), equal to the torch ops to float32 rounding;
on CUDA with Triton, in one fused launch (`recstream.optim.triton_rows`);
other devices and dtypes run the torch ops.

Example:
    >>> import torch
    >>> from recstream.optim import RowWiseAdagrad
    >>> emb = torch.nn.EmbeddingBag(100, 8, mode="sum", sparse=True)
    >>> opt = RowWiseAdagrad(emb.parameters(), lr=0.1)
    >>> emb(torch.tensor([[1, 2], [2, 3]])).sum().backward()
    >>> opt.step()
    >>> tuple(opt.state[emb.weight]["sum"].shape)
    (100,)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor

from recstream.validation import check_number

from . import native, triton_rows
from ._base import SparseRowOptimizer, addcdiv_rows, kernel_step_done, put_rows, row_broadcast, take_rows

__all__ = ["RowWiseAdagrad"]


class RowWiseAdagrad(SparseRowOptimizer):
    """Adagrad with a per-row accumulator that updates only touched rows.

    Args:
        params: iterable of parameters or parameter-group dicts.
        lr: learning rate (>= 0).
        eps: added to ``sqrt(acc)`` for numerical stability (>= 0).
        initial_accumulator_value: starting value of every row accumulator
            (>= 0); also the value a row is reset to by ``pop_reset_rows``.
        weight_decay: L2 coefficient added to the gradient of touched rows
            only (lazy decay: rows absent from the batch are not shrunk).

    State per parameter: ``"sum"`` of shape ``[num_rows]`` (the accumulator)
    and ``"step"`` (int, number of updates, kept for introspection).
    """

    def __init__(self, params: Iterable[Any], lr: float = 0.01, eps: float = 1e-10,
                 initial_accumulator_value: float = 0.0, weight_decay: float = 0.0) -> None:
        defaults = dict(lr=lr, eps=eps, initial_accumulator_value=initial_accumulator_value,
                        weight_decay=weight_decay)
        super().__init__(params, defaults)

    def _validate_group(self, group: dict[str, Any]) -> None:
        for name in ("lr", "eps", "initial_accumulator_value", "weight_decay"):
            check_number(type(self).__name__, name, group[name], minimum=0.0)

    def _init_state(self, p: Tensor, state: dict[str, Any], group: dict[str, Any]) -> None:
        num_rows = p.shape[0] if p.dim() > 0 else 1
        state["step"] = 0
        state["sum"] = torch.full((num_rows,), float(group["initial_accumulator_value"]),
                                  dtype=p.dtype, device=p.device)

    def _reset_rows(self, state: dict[str, Any], rows: Tensor, group: dict[str, Any]) -> None:
        state["sum"].index_fill_(0, rows, float(group["initial_accumulator_value"]))

    def _update(self, p: Tensor, rows: Tensor | None, grad: Tensor,
                state: dict[str, Any], group: dict[str, Any]) -> None:
        lr, eps, wd = group["lr"], group["eps"], group["weight_decay"]
        state["step"] += 1
        if not isinstance(lr, Tensor) and native.runs_on_kernels(rows, [p, grad, state["sum"]]):
            # One pass over the touched rows instead of ~10 torch ops (see _row_kernels.c).
            native.update_rows("rowwise_adagrad", [p, state["sum"]], rows, grad, lr, eps, wd)
            return
        if wd != 0:
            # Out of place: never modify the caller's .grad.
            grad = grad.add(take_rows(p, rows), alpha=wd)
        acc = take_rows(state["sum"], rows)
        # Mean over every dim but the row's (not reshape(n, -1): no -1 to infer when n == 0, i.e. a
        # HashEmbedding step whose keys are all still pending).
        sq = grad.square()
        acc.add_(sq.mean(dim=tuple(range(1, sq.dim()))) if sq.dim() > 1 else sq)
        put_rows(state["sum"], rows, acc)
        std = row_broadcast(acc.sqrt().add_(eps), grad)
        addcdiv_rows(p, rows, grad, std, -lr)

    def _kernel_step(self, p: Tensor, grad: Tensor, state: dict[str, Any], group: dict[str, Any],
                     found_inf: Tensor | None) -> bool:
        entries = triton_rows.entries_for(p, grad, [state["sum"]])
        if entries is None:
            return False
        state["step"] += 1
        triton_rows.rowwise_adagrad(p, state["sum"], *entries, group["lr"], group["eps"], group["weight_decay"],
                                    found_inf)
        kernel_step_done(state, found_inf)
        return True
