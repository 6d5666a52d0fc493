"""CosineSimilarity: the pairwise similarity matrix of a set of vectors, as ``mindspore.train``'s."""
from __future__ import annotations

import numpy as np
import torch

from recstream.metrics._inputs import check_num_inputs, to_float, to_tensor
from recstream.metrics.base import Metric
from recstream.validation import check_bool, check_choice


class CosineSimilarity(Metric):
    """Similarity of every pair of rows: e.g. checking that a two-tower model's item embeddings
    of related items are close.

    Args:
        similarity: ``"cosine"`` (rows scaled to unit length first) or ``"dot"``.
        reduction: ``"none"`` (the (N, N) matrix), ``"sum"`` or ``"mean"`` (over the last axis).
        zero_diagonal: set each row's similarity with itself to 0.

    ``update(x)`` adds the rows of a (N, D) matrix. Unlike MindSpore, which keeps only the last
    ``update``, all rows since ``clear()`` take part (the matrix grows as N squared).

    Example:
        >>> from recstream.metrics import CosineSimilarity
        >>> metric = CosineSimilarity()
        >>> metric.update([[1, 3, 4, 7], [2, 4, 2, 5], [3, 1, 5, 8]])
        >>> metric.eval().round(4)
        array([[0.    , 0.9403, 0.9516],
               [0.9403, 0.    , 0.8615],
               [0.9516, 0.8615, 0.    ]])
    """

    _state_names = ("rows",)

    def __init__(self, similarity: str = "cosine", reduction: str = "none", zero_diagonal: bool = True):
        super().__init__()
        self.similarity = check_choice("CosineSimilarity", "similarity", similarity, ("cosine", "dot"))
        self.reduction = check_choice("CosineSimilarity", "reduction", reduction, ("none", "sum", "mean"))
        self.zero_diagonal = check_bool("CosineSimilarity", "zero_diagonal", zero_diagonal)
        self.clear()

    def clear(self):
        """Forget all rows."""
        self._rows = []  # per-batch (N, D) tensors on their device
        self._reset_invalid()

    def update(self, *inputs):
        """Add the rows of one (N, D) matrix."""
        inputs = self._select(inputs)
        check_num_inputs(inputs, 1, "CosineSimilarity", "(x,)")
        x = to_float(to_tensor(inputs[0], "x", "CosineSimilarity"))
        if x.ndim != 2:
            raise ValueError(f"CosineSimilarity.update: x must be a (N, D) matrix, got shape {tuple(x.shape)}.")
        if self._rows and x.shape[1] != self._rows[0].shape[1]:
            raise ValueError(f"CosineSimilarity.update: rows must keep their length {self._rows[0].shape[1]}, "
                             f"got {x.shape[1]}.")
        self._rows.append(x)

    def eval(self) -> np.ndarray:
        """The similarity matrix (or its row sums/means) as float64."""
        if not self._rows:
            raise RuntimeError("CosineSimilarity can not be calculated, because update() was not called "
                               "since clear().")
        x = torch.cat([r.to(self._rows[0].device) for r in self._rows]).double()
        if self.similarity == "cosine":
            x = x / torch.linalg.vector_norm(x, dim=1, keepdim=True)
        matrix = x @ x.T
        if self.zero_diagonal:
            matrix.fill_diagonal_(0)
        if self.reduction == "mean":
            matrix = matrix.mean(dim=-1)
        elif self.reduction == "sum":
            matrix = matrix.sum(dim=-1)
        return matrix.cpu().numpy()
