"""Row-sparse optimizer updates on a GPU as one Triton launch per table (issue 24, item 4).

On CUDA, a step of [`LazyAdam`][recstream.optim.lazy_adam.LazyAdam],
[`RowWiseAdagrad`][recstream.optim.rowwise_adagrad.RowWiseAdagrad] or [`FTRL`][recstream.optim.ftrl.FTRL]
on a table's row-sparse gradient, and boost's lazy Adam on a
[`FusedTables`][recstream.optim.fused_tables.FusedTables] set, is a choice of one leader entry per
touched row (a scatter into a scratch word per row, no sort), a sum of each row's entries at its
leader (one ``index_add_`` into kept zeros, which the kernel zeroes again: parallel however hot an
id) and one kernel
(`recstream.optim._triton_row_kernels`): each touched row of the table and its state is read,
updated and written once; a dense gradient (a bias) is one launch too. The scratch costs 4 bytes
a table row on the device. The torch-op path it replaces dispatches about 27
ops per table (sort, boundary masks, a segment sum, gathers, the arithmetic, scatters; counted on
a CPU, docs/benchmarks.md). The state (names, shapes, step counts) is the torch-op path's, so
checkpoints load on either path; capturable mode (a step count and a learning rate on the device,
a ``found_inf`` flag skipping an overflowing step) runs in the kernel too, with no host read.

Used on CUDA wherever Triton imports (``ENABLED``; a CPU keeps its compiled C kernels). Triton is
optional: without it every step runs the torch ops. `interpreted` runs the kernels on CPU tensors
with Triton's interpreter (``TRITON_INTERPRET=1`` set before the first launch): how the tests check
them without a GPU.

>>> import torch
>>> from recstream.optim import triton_rows
>>> triton_rows.applies([torch.zeros(3, 2)])   # a CPU table: the C kernels
False
"""
from __future__ import annotations

import math
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor

from ..hostpath import positions

__all__ = ["ENABLED", "applies", "interpreted", "kernels_work", "lazy_adam", "rowwise_adagrad", "ftrl",
           "gradient_entries", "entries_for"]

ENABLED = True
"""Whether CUDA steps use the kernels where Triton imports (read at each step: set False to run the torch ops)."""

_cpu = threading.local()
_kernels: Any = None


def _triton_kernels() -> Any:
    """The kernels module when Triton imports, else None (imported on first use: Triton is optional)."""
    global _kernels
    if _kernels is None:
        from . import _triton_row_kernels
        _kernels = _triton_row_kernels if _triton_row_kernels.triton is not None else False
    return _kernels or None


@contextmanager
def interpreted() -> Iterator[None]:
    """Within the block (this thread), CPU tables take the kernels, run by Triton's interpreter.

    Raises RuntimeError where Triton is missing or ``TRITON_INTERPRET`` was not ``1`` when the kernels
    were first imported (they would be compiled for a GPU)."""
    kernels = _triton_kernels()
    if kernels is None:
        raise RuntimeError("triton_rows.interpreted: Triton is not installed (pip install triton)")
    if os.environ.get("TRITON_INTERPRET") != "1" or type(kernels.lazy_adam).__name__ != "InterpretedFunction":
        raise RuntimeError("triton_rows.interpreted: set TRITON_INTERPRET=1 before recstream.optim's "
                           "Triton kernels are first imported")
    before = getattr(_cpu, "on", False)
    _cpu.on = True
    try:
        yield
    finally:
        _cpu.on = before


def applies(tensors: list[Tensor]) -> bool:
    """Whether an update of `tensors` (the table, its state, the gradient's values) runs on the
    kernels: enabled, Triton importable, all float32, contiguous, on one CUDA device (or on the CPU
    within `interpreted`)."""
    if not ENABLED or not tensors:
        return False
    device = tensors[0].device
    if device.type != "cuda" and not (device.type == "cpu" and getattr(_cpu, "on", False)):
        return False
    if not all(t.device == device and t.dtype == torch.float32 and t.is_contiguous() for t in tensors):
        return False
    if _triton_kernels() is None:
        return False
    return device.type != "cuda" or getattr(_checking, "on", False) or kernels_work(device)


def kernels_work(device: torch.device) -> bool:
    """Whether the kernels step small tables on `device` as the torch ops do
    (`recstream.optim.kernel_check`): checked once per device, before any real table depends on them."""
    return _device_check is None or _device_check(str(device))


# Set by recstream.optim.kernel_check, which steps the optimizers (they import this module).
_device_check: Any = None
_checking = threading.local()


def gradient_entries(grad: Tensor) -> tuple[Tensor | None, Tensor] | None:
    """``(row ids, values [n, ...])`` of a row-sparse COO gradient (duplicates kept), ``(None, grad)``
    for a dense one (every row; a 0-d one viewed as one row), or None for any other (the torch
    path checks and refuses it)."""
    if grad.layout == torch.strided:
        return None, grad if grad.dim() > 0 else grad.reshape(1)
    if grad.layout != torch.sparse_coo:
        return None
    indices = grad._indices()  # [sparse_dim, n]: its shape says what sparse_dim() would (one op fewer)
    if indices.shape[0] != 1:
        return None
    return indices[0], grad._values()


def entries_for(weight: Tensor, grad: Tensor, state: list[Tensor]) -> tuple[Tensor | None, Tensor] | None:
    """`gradient_entries` of `grad` where the kernels take the update of `weight` and its `state`
    tensors (`applies` to them all), else None: the optimizer then takes its torch ops."""
    if not applies([weight, *state]):
        return None
    entries = gradient_entries(grad)
    if entries is None or not applies([weight, entries[1]]):
        return None
    return entries


def _leaders(rows: Tensor | None, values: Tensor, weight: Tensor) -> tuple[Tensor, Tensor, Tensor, int, int]:
    """(rows, each entry's leader -- the one entry of its row that writes the row [n], int32 --, each
    leader's row's summed gradient at the leader's position [n, dim], values per row, entries to
    launch); dense (`rows` None): `weight` stands for the unused rows and leaders pointers, `values`
    as they are, an entry a row.

    No sort: every entry writes its position into a scratch word of its row (`_scratch`, one int32
    a table row), so one of a row's entries wins, the leader; every entry reads its row's word
    back and ``index_add_`` sums the entries at their leader's position, parallel however hot a row
    (a run summed by its first program in the kernel was a serial loop: 1.0-1.5 ms of a 5 ms step at
    batch 16,384 on an H200). It replaces a sort of the rows, a cummax for the run starts (27% of a
    WideDeep step's kernel time at batch 4,096 on an H100) and a gather into sorted order. Which
    entry leads is up to the device (CUDA: any one); on a CPU the last one, with the sums in entry
    order."""
    dim = math.prod(weight.shape[1:])
    if rows is None:
        return weight, weight, values if values.is_contiguous() else values.contiguous(), dim, weight.shape[0]
    n = rows.numel()
    if n >= 2 ** 31:  # the words hold an entry's position as int32
        raise ValueError(f"triton_rows: a gradient of {n} entries; the kernels take fewer than 2**31 a step")
    word = _scratch(weight)
    word.scatter_(0, rows, positions(n, rows.device, torch.int32))  # a kept arange: no op a step
    lead = word.index_select(0, rows)
    summed = _zeros(weight, n, dim, values).index_add_(0, lead, values.reshape(n, dim))
    return rows, lead, summed, dim, n


# One int32 word per row of each table the kernels update (`_leaders`): scratch, not state (written
# before it is read in every step), kept between steps so a CUDA graph's replays and eager steps
# reuse it instead of allocating a table's worth each step.
_scratch_words: Any = None


def _scratch(weight: Tensor) -> Tensor:
    global _scratch_words
    if _scratch_words is None:
        from torch.utils.weak import WeakIdKeyDictionary
        _scratch_words = WeakIdKeyDictionary()
    word = _scratch_words.get(weight)
    if word is None or word.shape[0] != weight.shape[0] or word.device != weight.device:
        word = torch.empty(weight.shape[0], dtype=torch.int32, device=weight.device)  # entry positions: int32
        _scratch_words[weight] = word
    return word


# Per table, a kept buffer of zeros that `_leaders` sums a step's entries into (no zeros allocated
# and filled a step: one op fewer): the kernel that reads a leader's sum stores zeros back there
# (`_triton_row_kernels._run_sum`), and ``index_add_`` writes only leaders' positions, so the
# buffer is all zeros again after every launch. Grown (new zeros) when a step has more entries.
_zero_buffers: Any = None


def _zeros(weight: Tensor, n: int, dim: int, like: Tensor) -> Tensor:
    """``[n, dim]`` zeros of `like`'s dtype, a view of `weight`'s kept buffer (see above)."""
    global _zero_buffers
    if _zero_buffers is None:
        from torch.utils.weak import WeakIdKeyDictionary
        _zero_buffers = WeakIdKeyDictionary()
    buf = _zero_buffers.get(weight)
    if buf is None or buf.numel() < n * dim or buf.dtype != like.dtype or buf.device != like.device:
        # a power of two: batches whose entries vary a little (multi-hot ids) grow it rarely
        buf = torch.zeros(1 << max(0, (n * dim - 1).bit_length()), dtype=like.dtype, device=like.device)
        _zero_buffers[weight] = buf
    return buf[:n * dim].view(n, dim)


def _launch(kernel: Any, n: int, *args: Any, **meta: Any) -> None:
    """One launch of `kernel` over `n` entries, ``BLOCK_N`` a program (a separate function: the
    op-counting tests count it as one op)."""
    kernel[(-(-n // meta["BLOCK_N"]),)](*args, **meta)


def _block(dim: int) -> dict[str, int]:
    """A program's block: the row's width rounded up to a power of two, and entries enough for about
    1,024 values (at least one entry)."""
    block = 1 << max(0, (dim - 1).bit_length())
    return {"BLOCK_N": max(1, 1024 // block), "BLOCK_D": block, "num_warps": 4}


def _lr_args(lr: float | Tensor, like: Tensor) -> tuple[Tensor, float, bool]:
    """(the lr pointer argument, the lr scalar argument, whether the kernel reads the pointer)."""
    if isinstance(lr, Tensor):
        return lr.reshape(()) if lr.dim() else lr, 0.0, True
    return like, float(lr), False


def lazy_adam(weight: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor, rows: Tensor | None, values: Tensor,
              t: int | float | Tensor, lr: float | Tensor, beta1: float, beta2: float, eps: float,
              found_inf: Tensor | None = None) -> None:
    """Lazy Adam (`recstream.optim.lazy_adam`) of the rows `rows` (duplicates allowed: their
    `values` are summed; None: every row, `values` the dense gradient) of `weight` and its moments,
    at step `t` (the count after this step; a device tensor in capturable mode, then `lr` may be one
    too). `found_inf` non-zero: nothing is written. The caller advances the step count."""
    rows, lead, values, dim, n = _leaders(rows, values, weight)
    if n == 0:
        return
    capturable = isinstance(t, Tensor)
    lr_ptr, lr_value, lr_on_device = _lr_args(lr, weight)
    if capturable:
        step_size = bias2_sqrt = 0.0
    else:
        step_size = float(lr) / (1.0 - beta1 ** t)
        bias2_sqrt = math.sqrt(1.0 - beta2 ** t)
    ln = [math.log(b) if b > 0 else -math.inf for b in (beta1, beta2)]
    _launch(_triton_kernels().lazy_adam, n, weight, exp_avg, exp_avg_sq, rows, lead, values,
            weight if found_inf is None else found_inf, t if capturable else weight, lr_ptr, n, dim,
            step_size, bias2_sqrt, lr_value, 1.0 - beta1, beta2, 1.0 - beta2, eps, ln[0], ln[1],
            HAS_FOUND=found_inf is not None, DENSE=rows is weight, CAPTURABLE=capturable, LR_ON_DEVICE=lr_on_device,
            **_block(dim))


def rowwise_adagrad(weight: Tensor, acc: Tensor, rows: Tensor | None, values: Tensor, lr: float | Tensor, eps: float,
                    weight_decay: float, found_inf: Tensor | None = None) -> None:
    """Row-wise Adagrad (`recstream.optim.rowwise_adagrad`) of the rows `rows` (duplicates summed; None: all)
    of `weight` and its per-row accumulator `acc`; `found_inf` non-zero: nothing is written."""
    rows, lead, values, dim, n = _leaders(rows, values, weight)
    if n == 0:
        return
    lr_ptr, lr_value, lr_on_device = _lr_args(lr, weight)
    _launch(_triton_kernels().rowwise_adagrad, n, weight, acc, rows, lead, values,
            weight if found_inf is None else found_inf, lr_ptr, n, dim, lr_value, eps, weight_decay,
            HAS_FOUND=found_inf is not None, DENSE=rows is weight, LR_ON_DEVICE=lr_on_device, **_block(dim))


def ftrl(weight: Tensor, accumulator: Tensor, linear: Tensor, rows: Tensor | None, values: Tensor, lr: float | Tensor,
         lr_power: float, l1: float, l2: float, found_inf: Tensor | None = None) -> None:
    """FTRL-Proximal (`recstream.optim.ftrl`) of the rows `rows` (duplicates summed; None: all) of `weight` and
    its ``n`` / ``z`` state; `found_inf` non-zero: nothing is written."""
    rows, lead, values, dim, n = _leaders(rows, values, weight)
    if n == 0:
        return
    lr_ptr, lr_value, lr_on_device = _lr_args(lr, weight)
    power = -float(lr_power)
    _launch(_triton_kernels().ftrl, n, weight, accumulator, linear, rows, lead, values,
            weight if found_inf is None else found_inf, lr_ptr, n, dim, lr_value, power,
            1.0 if power == 0 else 0.0, l1, l2, HAS_FOUND=found_inf is not None, DENSE=rows is weight,
            LR_ON_DEVICE=lr_on_device, HALF=power == 0.5, **_block(dim))
