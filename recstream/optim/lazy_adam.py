"""LazyAdam: Adam whose moments and weights move only for touched rows.

For every touched row ``r`` (``t`` = the parameter's global step count)::

    m_r <- beta1 * m_r + (1 - beta1) * g_r
    v_r <- beta2 * v_r + (1 - beta2) * g_r ** 2
    w_r <- w_r - lr / (1 - beta1**t) * m_r / (sqrt(v_r) / sqrt(1 - beta2**t) + eps)

Rows absent from the batch keep their weights *and* moments unchanged (plain
Adam would decay their moments and keep moving them). This is the semantics
of TF's ``LazyAdamOptimizer`` and ``torch.optim.SparseAdam``; unlike
``SparseAdam`` it also accepts dense gradients (then every row is touched and
the update is exactly ``torch.optim.Adam`` without weight decay). On a CPU, a float32 table's
touched rows are updated in one compiled pass (`recstream.optim.native`), equal to the
torch ops to float32 rounding; on CUDA with Triton, in one fused launch (`recstream.optim.triton_rows`).

Bias correction uses a *global* step count ``t`` per parameter, incremented
on every ``step()`` in which the parameter has a gradient - not a per-row
count. This is what TF LazyAdam and SparseAdam do, keeps state at two floats
per coordinate (no per-row counters) and makes a rarely seen row take steps
of the same order as a frequent one (its correction terms are ~1 once ``t``
is large). Rows reset through ``pop_reset_rows`` get zero moments and also
follow the global ``t``.

Example:
    >>> import torch
    >>> from recstream.optim import LazyAdam
    >>> emb = torch.nn.Embedding(1000, 16, sparse=True)
    >>> opt = LazyAdam(emb.parameters(), lr=1e-2)
    >>> emb(torch.tensor([3, 7])).pow(2).sum().backward()
    >>> opt.step()
    >>> opt.state[emb.weight]["step"]
    1
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor

from recstream.validation import check_number, check_type

from . import native, triton_rows
from ._base import SparseRowOptimizer, addcdiv_rows, kernel_step_done, put_rows, take_rows

__all__ = ["LazyAdam"]


class LazyAdam(SparseRowOptimizer):
    """Adam for row-sparse gradients (also accepts dense gradients).

    Args:
        params: iterable of parameters or parameter-group dicts.
        lr: learning rate (>= 0).
        betas: ``(beta1, beta2)``, each in ``[0, 1)``.
        eps: added to the bias-corrected ``sqrt(v)`` (>= 0).

    State per parameter: ``"step"`` (int; a device tensor in capturable mode, see
    `SparseRowOptimizer`), ``"exp_avg"`` and ``"exp_avg_sq"`` (same shape as the parameter).
    """

    def __init__(self, params: Iterable[Any], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> None:
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps))

    def _validate_group(self, group: dict[str, Any]) -> None:
        owner = type(self).__name__
        check_number(owner, "lr", group["lr"], minimum=0.0)
        check_number(owner, "eps", group["eps"], minimum=0.0)
        betas = check_type(owner, "betas", group["betas"], (tuple, list), allowed="a pair (beta1, beta2)")
        if len(betas) != 2:
            raise ValueError(f"{owner}: 'betas' must be a pair (beta1, beta2), got {betas!r}")
        for i, beta in enumerate(betas):
            check_number(owner, f"betas[{i}]", beta, minimum=0.0, maximum=1.0, max_open=True)

    def _init_state(self, p: Tensor, state: dict[str, Any], group: dict[str, Any]) -> None:
        state["step"] = 0
        state["exp_avg"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
        state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.contiguous_format)

    def _reset_rows(self, state: dict[str, Any], rows: Tensor, group: dict[str, Any]) -> None:
        for key in ("exp_avg", "exp_avg_sq"):
            buf = state[key]
            (buf if buf.dim() > 0 else buf.unsqueeze(0)).index_fill_(0, rows, 0.0)

    def _update(self, p: Tensor, rows: Tensor | None, grad: Tensor,
                state: dict[str, Any], group: dict[str, Any]) -> None:
        state["step"] += 1
        beta1, beta2 = group["betas"]
        lazy_adam_rows(p, rows, grad, state["exp_avg"], state["exp_avg_sq"], state["step"],
                       group["lr"], beta1, beta2, group["eps"])

    def _kernel_step(self, p: Tensor, grad: Tensor, state: dict[str, Any], group: dict[str, Any],
                     found_inf: Tensor | None) -> bool:
        if isinstance(group["lr"], Tensor) and not isinstance(state["step"], Tensor):
            return False
        entries = triton_rows.entries_for(p, grad, [state["exp_avg"], state["exp_avg_sq"]])
        if entries is None:
            return False
        m, v = (t if t.dim() else t.unsqueeze(0) for t in (state["exp_avg"], state["exp_avg_sq"]))  # 0-d: as `p`
        state["step"] += 1
        beta1, beta2 = group["betas"]
        triton_rows.lazy_adam(p, m, v, *entries, state["step"], group["lr"],
                              beta1, beta2, group["eps"], found_inf)
        kernel_step_done(state, found_inf)
        return True


def lazy_adam_rows(p: Tensor, rows: Tensor | None, grad: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor,
                   t: int | float | Tensor, lr: float | Tensor, beta1: float, beta2: float, eps: float,
                   found_inf: Tensor | None = None) -> None:
    """One lazy-Adam update of rows `rows` (None: every row) of `p` and its moments, at step `t`.

    `grad` holds the gradient of those rows only. Shared by `LazyAdam` and by boost's sparse-row
    hooks on `torch.optim.Adam` (which keep Adam's own state entries, so its state dict is Adam's).
    `found_inf` (see `lazy_adam_tables`): non-zero, nothing changes.
    """
    lazy_adam_tables([(p, rows, grad, exp_avg, exp_avg_sq)], t, lr, beta1, beta2, eps, found_inf)


def lazy_adam_tables(tables: list[tuple[Tensor, Tensor | None, Tensor, Tensor, Tensor]], t: int | float | Tensor,
                     lr: float | Tensor, beta1: float, beta2: float, eps: float,
                     found_inf: Tensor | None = None) -> None:
    """`lazy_adam_rows` of several tables ``(p, rows, grad, exp_avg, exp_avg_sq)`` that share
    hyper-parameters and step `t`: their rows' moments are gathered into one tensor, so the
    arithmetic runs once for all of them (a user's network has a table per field: 26 small
    updates cost their number of ops, not their size). Each element gets the same operations as
    alone, so the results are the same bits.

    `found_inf` (a loss-scaled step's overflow flag, a device tensor): where it is non-zero the
    touched rows of the weights and moments are written back as they were, chosen on the device
    (``torch.where``), so skipping an overflowing step reads nothing on the host. The caller takes
    the step count back (it is the caller's to advance)."""
    # Python floats where the step count lives on the host (no device sync). In capturable mode
    # (SparseRowOptimizer) `t` and `lr` are device tensors, and so is what derives from them: a
    # replayed CUDA graph recomputes them each step.
    step_size = lr / (1.0 - beta1 ** t)
    correction2 = 1.0 - beta2 ** t
    bias_correction2_sqrt = correction2.sqrt() if isinstance(correction2, Tensor) else math.sqrt(correction2)
    tables = [(p, rows, grad, *(s.unsqueeze(0) if s.dim() == 0 else s for s in (m, v)))
              for p, rows, grad, m, v in tables]
    if not isinstance(step_size, Tensor) and found_inf is None and \
            all(native.runs_on_kernels(rows, [p, grad, m, v]) for p, rows, grad, m, v in tables):
        # One pass over each table's touched rows instead of a dozen torch ops (see _row_kernels.c).
        for p, rows, grad, m, v in tables:
            native.update_rows("lazy_adam", [p, m, v], rows, grad, 1.0 - beta1, beta2, 1.0 - beta2, eps, step_size,
                               bias_correction2_sqrt)
        return

    def joined(tensors: list[Tensor]) -> Tensor:
        return tensors[0] if len(tensors) == 1 else torch.cat(tensors)

    # Same op sequence as torch.optim.Adam so dense results match it.
    skip = None if found_inf is None else found_inf.reshape(()) != 0
    m = joined([take_rows(exp_avg, rows) for _, rows, _, exp_avg, _ in tables])
    m_old = None if skip is None else m.clone()  # `m` may be the state itself (rows None): updated in place
    grad = joined([grad for _, _, grad, _, _ in tables])
    m.lerp_(grad, 1.0 - beta1)
    v = joined([take_rows(exp_avg_sq, rows) for _, rows, _, _, exp_avg_sq in tables])
    v_old = None if skip is None else v.clone()
    v.mul_(beta2).addcmul_(grad, grad, value=1.0 - beta2)
    if skip is not None:
        m, v = torch.where(skip, m_old, m), torch.where(skip, v_old, v)
    denom = v.sqrt().div_(bias_correction2_sqrt).add_(eps)
    sizes = [grad.shape[0] for _, _, grad, _, _ in tables]
    parts = zip(tables, m.split(sizes), v.split(sizes), denom.split(sizes), strict=True) if len(tables) > 1 \
        else [(tables[0], m, v, denom)]
    for (p, rows, _, exp_avg, exp_avg_sq), m_rows, v_rows, denom_rows in parts:
        put_rows(exp_avg, rows, m_rows)
        put_rows(exp_avg_sq, rows, v_rows)
        if skip is None:
            addcdiv_rows(p, rows, m_rows, denom_rows, -step_size)
        else:  # the old rows kept where the step overflowed (the step itself may be NaN there)
            w = take_rows(p, rows)
            put_rows(p, rows, torch.where(skip, w, w + m_rows.div(denom_rows).mul_(-step_size)))
