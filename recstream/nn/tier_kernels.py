"""The disk tier's row copies and cached lookup, on compiled kernels where this install built them.

``kernels`` is the extension module ``recstream.nn._tier_kernels`` (``_tier_kernels.c``; the comment
atop it says what it does and why it is C), or None where it was not built (no C compiler at install
time): numpy then does the same. ``AVAILABLE`` says which; callers read ``kernels`` at call time, so a
test can switch it off for a run.

Example:
    >>> import numpy as np
    >>> table = np.arange(12, dtype=np.float32).reshape(6, 2)
    >>> gather_rows(table, np.array([4, 1])).tolist()
    [[8.0, 9.0], [2.0, 3.0]]
    >>> put_rows(table, np.array([0]), np.array([[-1.0, -2.0]], dtype=np.float32)); table[0].tolist()
    [-1.0, -2.0]
"""
from __future__ import annotations

import numpy as np

try:
    from . import _tier_kernels as kernels
except ImportError:  # pragma: no cover - depends on the install having had a C compiler
    kernels = None

__all__ = ["AVAILABLE", "gather_rows", "kernels", "put_rows"]

AVAILABLE = kernels is not None


def _rows_contiguous(a: np.ndarray) -> bool:
    return a.ndim == 2 and a.strides[1] == a.itemsize


def gather_rows(src: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Rows `rows` (int64) of the 2-D `src`, copied (``np.take(src, rows, axis=0)``). Not ``src[rows]``:
    advanced indexing copies element by element (4.6x the CPU on 3,800 scattered rows of a 4M-row file)."""
    rows = np.asarray(rows, dtype=np.int64)
    if kernels is not None and _rows_contiguous(src):
        out = np.empty((rows.size, src.shape[1]), dtype=src.dtype)
        kernels.copy_rows(out, None, src, np.ascontiguousarray(rows))
        return out
    return np.take(src, rows, axis=0)


def put_rows(dst: np.ndarray, rows: np.ndarray, values: np.ndarray) -> None:
    """``dst[rows] = values`` for a 2-D `dst` whose rows are contiguous (`rows` int64, distinct)."""
    rows = np.asarray(rows, dtype=np.int64)
    if (kernels is not None and _rows_contiguous(dst) and _rows_contiguous(values) and values.dtype == dst.dtype
            and values.shape == (rows.size, dst.shape[1])):
        kernels.copy_rows(dst, np.ascontiguousarray(rows), values, None)
        return
    # Through one-item-per-row views of both: advanced indexing then copies a row at a time, not each
    # element (half the CPU of ``index_copy_`` on the ~3,800 scattered rows of a cache-full step).
    if not dst.flags.c_contiguous:
        dst[rows] = values
        return
    row = np.dtype((np.void, dst.itemsize * dst.shape[1]))
    dst.view(row)[rows, 0] = np.ascontiguousarray(values, dtype=dst.dtype).view(row)[:, 0]
