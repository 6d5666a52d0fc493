"""`GeneratedStream`: what the generated, time-ordered click streams share (`DriftingCTR`,
`ColdStartCTR`): ids as the readers would key them, the true click probabilities and the Bayes
AUC they give, and the dataset protocol (a batch per time step, in order).

A subclass sets ``num_batches``, ``batch_size``, ``seed``, ``table`` and ``table_size`` and defines
``raw_ids(kind, index)``, ``batch(t)`` and ``_truth(t)`` (batch `t`'s true probabilities and
labels, in event order).
"""
from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa

from ..validation import check_int
from .batch import Batch
from .hashing import hash_strings, to_buckets
from .synthetic import roc_auc


class GeneratedStream:
    """Base of the generated streams (see the module docstring)."""

    num_batches: int
    batch_size: int
    seed: int
    table: str
    table_size: int

    def raw_ids(self, kind: str, index: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def batch(self, t: int) -> Batch:
        raise NotImplementedError

    def _truth(self, t: int) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def _keys(self, kind: str, index: np.ndarray) -> np.ndarray:
        raw = self.raw_ids(kind, index)
        if self.table != "hashed":
            return raw
        return to_buckets(hash_strings(pa.array(raw).cast(pa.string())), self.table_size)  # as the readers do

    def probabilities(self, t: int) -> np.ndarray:
        """True click probabilities of batch `t`'s events, in order."""
        t = check_int(f"{type(self).__name__}.probabilities", "t", t, minimum=0, maximum=self.num_batches - 1)
        return self._truth(t)[0]

    def bayes_auc(self, start: int = 0, stop: int | None = None) -> float:
        """AUC of the true probabilities on the events of batches ``start .. stop - 1``."""
        owner = f"{type(self).__name__}.bayes_auc"
        stop = self.num_batches if stop is None else check_int(owner, "stop", stop, minimum=1,
                                                               maximum=self.num_batches)
        start = check_int(owner, "start", start, minimum=0, maximum=stop - 1)
        parts = [self._truth(t) for t in range(start, stop)]
        return roc_auc(np.concatenate([p for p, _ in parts]), np.concatenate([y for _, y in parts]))

    # --- a dataset ---------------------------------------------------------------------------
    def __len__(self) -> int:
        return self.num_batches

    def get_dataset_size(self) -> int:
        return self.num_batches

    def __iter__(self) -> Iterator[Batch]:
        for t in range(self.num_batches):
            yield self.batch(t)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(num_batches={self.num_batches}, batch_size={self.batch_size}, "
                f"seed={self.seed}, table={self.table!r}, table_size={self.table_size})")
