"""Table backends of `HashEmbedding`: who runs its table operations on a given batch.

`HashEmbedding` is the module users see (constructor, forward, state, export, sharding); its
table -- find-or-insert, admission counting, rows from the free stack, LRU and age eviction,
rehash -- is run by one backend per execution path, all on the module's own tensors (so a
checkpoint or an export does not depend on the backend that wrote it):

* `HostBackend` (``"host"``) -- a CPU tensor outside ``recstream.hostpath.device_path``, a
  sharded table, or a step that logs evictions: compaction by ``nonzero``, the compiled
  kernels of ``_hash_kernels.c`` (`hash_host_path`);
* ``StaticBackend`` (``"torch"``, `hash_device_path`) -- the static-shape torch ops of
  `hash_static`: no host sync while the table has room, one read when it must evict;
* ``TritonBackend`` (``"triton"``, `hash_triton`) -- the same plan carried out by Triton
  kernels (find-or-insert by atomic compare-and-swap, rows from the free stack by an atomic
  counter, age eviction): a handful of launches per step instead of hundreds of ops.

A device backend is chosen by ``HashEmbedding.table_backend``: ``"auto"`` (the default) takes
Triton on CUDA tensors when it imports, the torch ops otherwise; ``"torch"`` or ``"triton"``
force one (``"triton"`` on CPU tensors runs Triton's interpreter, ``TRITON_INTERPRET=1``:
how the tests check the kernels without a GPU).

``HashEmbedding._backend_for`` picks the backend of a batch:

>>> import torch
>>> from recstream.hostpath import device_path
>>> from recstream.nn import HashEmbedding
>>> emb = HashEmbedding(2, capacity=8)
>>> emb._backend_for(torch.zeros(1, dtype=torch.int64)).name
'host'
>>> with device_path():
...     emb._backend_for(torch.zeros(1, dtype=torch.int64)).name
'torch'
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import torch

from ..sorting import unique
from .tensor_hash_table import _where

__all__ = ["TableBackend", "HostBackend", "HOST", "BACKENDS", "triton_available"]

BACKENDS = ("auto", "torch", "triton")
"""The values of ``HashEmbedding.table_backend`` (the device path's backend; see the module doc)."""


class TableBackend(ABC):
    """What runs one `HashEmbedding`'s table operations on a batch. Stateless: every method takes
    the module (``emb``), whose tensors hold the table."""

    name: ClassVar[str]

    @abstractmethod
    def lookup(self, emb, flat: torch.Tensor, mutate: bool) -> torch.Tensor:
        """The vectors of the 1-D int64 `flat` keys ``[len(flat), embedding_size]`` of an unsharded
        table; with `mutate` (training) they are counted, admitted, and evict what they must."""

    @abstractmethod
    def evict_stale(self, emb, stale: torch.Tensor) -> None:
        """Evict the keys of every slot in the bool mask `stale` (age eviction of `emb.step`)."""


class HostBackend(TableBackend):
    """The host path (`hash_host_path.HostPath`): compaction and compiled CPU kernels."""

    name = "host"

    def lookup(self, emb, flat: torch.Tensor, mutate: bool) -> torch.Tensor:
        uniq, inverse, counts = unique(flat, return_inverse=True, return_counts=True)
        return emb._lookup_unique(uniq, counts, mutate, inverse)

    def evict_stale(self, emb, stale: torch.Tensor) -> None:
        emb._evict_slots(_where(stale))


HOST = HostBackend()


def triton_available() -> bool:
    """Whether ``triton`` imports (an optional dependency: without it the torch ops run)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True
