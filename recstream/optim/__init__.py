"""Optimizers for recommendation models.

Row-sparse optimizers (accept sparse COO or dense gradients, update only the
rows present in the gradient, honour ``param.pop_reset_rows``):

* [`RowWiseAdagrad`][recstream.optim.rowwise_adagrad.RowWiseAdagrad] - one accumulator per row, for embedding tables;
* [`LazyAdam`][recstream.optim.lazy_adam.LazyAdam] - Adam moving only touched rows (TF LazyAdam semantics);
* [`FTRL`][recstream.optim.ftrl.FTRL] - FTRL-Proximal with L1/L2, for the wide part.

[`CombinedOptimizer`][recstream.optim.combined.CombinedOptimizer] / `sparse_and_dense` pair a sparse optimizer
for embeddings with a dense one for the rest as a single ``Optimizer``.
`FusedTables` keeps several tables of one torch Adam in one storage (boost's
``fused_tables``).

Example:
    >>> import torch
    >>> from torch import nn
    >>> from recstream.optim import sparse_and_dense
    >>> model = nn.Sequential(nn.EmbeddingBag(50, 4, sparse=True), nn.Linear(4, 1))
    >>> opt = sparse_and_dense(model)       # LazyAdam + torch.optim.Adam
    >>> sorted(opt.optimizers)
    ['dense', 'sparse']
"""

from . import kernel_check  # noqa: F401 -- registers the per-device check of the Triton kernels
from ._base import SparseRowOptimizer
from .combined import CombinedOptimizer, sparse_and_dense, split_sparse_dense
from .ftrl import FTRL
from .fused_tables import FusedTables
from .lazy_adam import LazyAdam
from .rowwise_adagrad import RowWiseAdagrad

__all__ = [
    "CombinedOptimizer",
    "FTRL",
    "FusedTables",
    "LazyAdam",
    "RowWiseAdagrad",
    "SparseRowOptimizer",
    "sparse_and_dense",
    "split_sparse_dense",
]
