"""The row-sparse optimizers' compiled CPU row updates, where this install built them.

``kernels`` is the extension module ``recstream.optim._row_kernels`` (``_row_kernels.c``; the
comment atop it says what it does and why it is C), or None where it was not built (no C compiler
at install time): [`LazyAdam`][recstream.optim.lazy_adam.LazyAdam] (and boost's lazy Adam on a user's Adam),
[`RowWiseAdagrad`][recstream.optim.rowwise_adagrad.RowWiseAdagrad] and [`FTRL`][recstream.optim.ftrl.FTRL] then
update their rows with torch ops, which compute the same formulas (equal to float32 rounding).
``AVAILABLE`` says which. Callers read ``native.kernels`` at call time, so a test can switch the
kernels off for a run; `runs_on_kernels` says whether an update's tensors qualify, and
`update_rows` runs one.

>>> isinstance(AVAILABLE, bool)
True
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from recstream.hostpath import host_reads_free

try:
    from . import _row_kernels as kernels
except ImportError:  # pragma: no cover - depends on the install having had a C compiler
    kernels = None

__all__ = ["kernels", "AVAILABLE", "runs_on_kernels", "update_rows"]

AVAILABLE = kernels is not None


def runs_on_kernels(rows: Tensor | None, values: list[Tensor]) -> bool:
    """Whether a row update of `rows` (None: every row, which stays on torch ops) over the tensors
    `values` (weight, state, gradient) runs on the kernels: built, CPU (and not `recstream.hostpath.device_path`),
    float32, contiguous, int64 rows."""
    return (kernels is not None and rows is not None and host_reads_free(rows) and rows.dtype == torch.long
            and rows.is_contiguous()
            and all(t.device.type == "cpu" and t.dtype == torch.float32 and t.is_contiguous() for t in values))


def update_rows(name: str, tables: list[Tensor], rows: Tensor, grad: Tensor, *hyper: float) -> None:
    """Kernel `name` on `tables` (weight, then state; flattened) for the unique `rows` and their
    gradient `grad` (``[len(rows), ...]``), with hyper-parameters `hyper`.

    One thread: split over two threads (chunks of the rows, the GIL released) it measured no faster
    on a 2-core CPU (19k random rows of 2.6M: 3.75 vs 4.0 ms for lazy Adam, 1.62 vs 1.44 for
    row-wise Adagrad), the misses on random rows being the limit either way.
    """
    arrays = [t.detach().view(-1).numpy() for t in tables]
    dim = math.prod(tables[0].shape[1:])  # values per row (1 for a vector)
    getattr(kernels, name)(*arrays, rows.numpy(), grad.reshape(-1).numpy(), dim, *hyper)
