"""`GeneratedStream`: what the generated, time-ordered click streams share (`DriftingCTR`,
`ColdStartCTR`): ids as the readers would key them, the true click probabilities and the Bayes
AUC they give, and the dataset protocol (a batch per time step, in order).

A subclass sets ``num_batches``, ``batch_size``, ``seed``, ``table``, ``table_size``, its
population (``initial_users``, ``users_per_batch``, ``initial_items``, ``items_per_batch``) and
``_SCATTER`` (how user and item numbers scatter into raw ids: a multiplier and an addend each, so
two streams never share ids), and defines ``batch(t)`` and ``_truth(t)`` (batch `t`'s true
probabilities and labels, in event order).
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

import numpy as np
import pyarrow as pa

from ..validation import check_choice, check_int
from .batch import Batch
from .hashing import hash_strings, to_buckets
from .synthetic import roc_auc

_KEY_SPACE = np.uint64(1 << 62)  # raw ids stay positive int64s

class GeneratedStream:
    """Base of the generated streams (see the module docstring)."""

    num_batches: int
    batch_size: int
    seed: int
    table: str
    table_size: int
    initial_users: int
    users_per_batch: int
    initial_items: int
    items_per_batch: int
    _SCATTER: ClassVar[dict[str, tuple[int, int]]]

    # --- population ------------------------------------------------------------------------
    def num_users(self, t: int) -> int:
        """Users that exist at batch `t`."""
        return self.initial_users + self.users_per_batch * t

    def num_items(self, t: int) -> int:
        """Items that exist at batch `t`."""
        return self.initial_items + self.items_per_batch * t

    def raw_ids(self, kind: str, index: np.ndarray) -> np.ndarray:
        """The raw int64 ids of users or items number `index` (`kind` "user" or "item")."""
        owner = f"{type(self).__name__}.raw_ids"
        mult, add = self._SCATTER[check_choice(owner, "kind", kind, tuple(self._SCATTER))]
        idx = np.asarray(index, dtype=np.uint64)
        return ((idx * np.uint64(mult) + np.uint64(add)) % _KEY_SPACE).astype(np.int64)

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
