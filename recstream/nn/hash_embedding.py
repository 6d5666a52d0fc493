"""Dynamic embedding table for unbounded id spaces: :class:`HashEmbedding`.

The PyTorch counterpart of MindSpore Recommender's ``HashEmbeddingLookup``:
any int64 key (user id, hashed cross feature, ...) maps to a trainable row
without a fixed vocabulary. Everything is tensors (CPU or CUDA):

* keys -> slots: :class:`~recstream.nn.TensorHashTable` (open addressing,
  triangular probing in batched rounds, load factor <= ``max_load``);
* slots -> rows of ``values`` ``[capacity, embedding_size]``;
* admission after ``permit_filter_value`` occurrences, age eviction after
  ``evict_filter_value`` steps, LRU eviction when all ``capacity`` rows are
  used (see :mod:`recstream.nn._hash_embedding_rows`);
* export / incremental export / import for serving
  (see :mod:`recstream.nn._hash_embedding_io`).

Optimizer-state reset protocol: ``values.pop_reset_rows()`` returns the rows
(re)assigned to a new key since the previous call (LongTensor) and clears the
record. Sparse optimizers (recstream.optim) call it before each update and
zero those rows' state, so a new key never inherits the moments of an evicted
one. Optimizers that ignore it still work, with stale state on reused rows.

Memory per admitted row (measure with :meth:`memory_bytes`):
``4*embedding_size`` (values, float32) + 18 (row -> slot 8, free list 8, dirty
and reset flags 2) + 32 bytes per hash slot (key, row, count, last-seen) times
``num_slots / capacity`` (>= 2 at load 0.5; 4 when ``pending_capacity ==
capacity``). Optimizer state comes on top and depends on the optimizer (e.g.
lazy Adam: 2 more rows of ``4*embedding_size``). Pre-admission counts live in
the same hash table (a slot with ``rows == -1``): at most ``pending_capacity``
keys, each one 32-byte slot -- the table is sized for ``capacity +
pending_capacity`` keys at ``max_load``, so they cost no extra structure.

Example:
    >>> import torch
    >>> emb = HashEmbedding(4, capacity=16)
    >>> out = emb(torch.tensor([[10, 2**40], [10, -5]]))
    >>> out.shape, emb.num_rows
    (torch.Size([2, 2, 4]), 3)
    >>> emb.values.pop_reset_rows().tolist()
    [0, 1, 2]
    >>> _ = emb.eval()
    >>> emb(torch.tensor([12345])).abs().sum().item()  # unknown key -> default
    0.0
"""

from __future__ import annotations

import math
from typing import Dict, Optional

import torch
import torch.nn.functional as F
from torch import nn

from ._checks import check_choice, check_float, check_int, check_int_tensor, check_optional_int
from ._hash_embedding_io import _RowIO
from ._hash_embedding_rows import _RowLifecycle
from .tensor_hash_table import DELETED, EMPTY, TensorHashTable, _where

__all__ = ["HashEmbedding"]

# Initial row values per ``param_init`` (std / half-width of the distribution).
_INIT_SCALE = {"normal": 0.01, "uniform": 0.05}
_PARAM_INITS = ("normal", "uniform", "zeros", "ones")


def _after_load(module, incompatible_keys) -> None:
    """load_state_dict post-hook: refresh the python mirrors of the 0-d buffers."""
    module._sync_mirrors()


class HashEmbedding(_RowLifecycle, _RowIO, nn.Module):
    """Embedding lookup keyed by arbitrary int64 ids with admission and eviction.

    Args:
        embedding_size: row width.
        key_dtype: key storage dtype, ``torch.int64`` or ``torch.int32`` (halves
            key memory; keys must then fit in int32).
        param_init: initial value of a newly admitted row: ``"normal"``
            (N(0, 0.01^2)), ``"uniform"`` (U(-0.05, 0.05)), ``"zeros"``, ``"ones"``.
        sparse: sparse COO gradients on ``values`` (only the looked-up rows).
        max_norm: if set, looked-up rows with a larger L2 norm are renormalised
            in place to ``max_norm`` (as ``nn.Embedding(max_norm=...)``).
        permit_filter_value: occurrences (counted over training forwards) a key
            needs before it gets its own row; 1 = admitted on first sight.
        evict_filter_value: evict keys unseen for more than this many steps
            (``None``: only capacity-driven LRU eviction).
        capacity: number of rows.
        device: device of all tensors.
        pending_capacity: most not-yet-admitted keys tracked (default
            ``capacity`` if ``permit_filter_value > 1`` else 0); beyond it the
            least recently seen are dropped and restart counting.
        max_load: hash table load bound; the table has the next power of two
            >= ``(capacity + pending_capacity) / max_load`` slots.
        auto_step: a training-mode forward calls :meth:`step` first. Set False
            when one module is called several times per step and call ``step()``
            yourself once per step.
        evict_interval: run the age-eviction scan (O(num_slots)) only every
            this many steps, trading eviction promptness for speed.

    Attributes:
        values: the trainable rows, ``Parameter [capacity, embedding_size]``,
            carrying ``pop_reset_rows``.
        default_value: buffer ``[embedding_size]`` read by unknown and pending
            keys; zeros, write into it for another fixed default.
    """

    def __init__(self, embedding_size: int, key_dtype: torch.dtype = torch.int64,
                 param_init: str = "normal", sparse: bool = True, max_norm: Optional[float] = None,
                 permit_filter_value: int = 1, evict_filter_value: Optional[int] = None,
                 capacity: int = 2 ** 20, device=None, *, pending_capacity: Optional[int] = None,
                 max_load: float = 0.5, auto_step: bool = True, evict_interval: int = 1) -> None:
        super().__init__()
        self.embedding_size = check_int("embedding_size", embedding_size, min_value=1)
        if key_dtype not in (torch.int64, torch.int32):
            raise ValueError(f"key_dtype must be torch.int64 or torch.int32, got {key_dtype!r}")
        self.key_dtype = key_dtype
        self.param_init = check_choice("param_init", param_init, _PARAM_INITS)
        self.sparse = bool(sparse)
        self.max_norm = None if max_norm is None else check_float("max_norm", max_norm, strict=True)
        self.permit_filter_value = check_int("permit_filter_value", permit_filter_value, min_value=1)
        self.evict_filter_value = check_optional_int("evict_filter_value", evict_filter_value,
                                                     min_value=1)
        self.capacity = check_int("capacity", capacity, min_value=1)
        if pending_capacity is None:
            pending_capacity = self.capacity if self.permit_filter_value > 1 else 0
        self.pending_capacity = check_int("pending_capacity", pending_capacity,
                                          min_value=1 if self.permit_filter_value > 1 else 0)
        self.max_load = check_float("max_load", max_load, strict=True)
        if self.max_load > 0.9:
            raise ValueError(f"max_load must be in (0, 0.9], got {self.max_load}")
        self.auto_step = bool(auto_step)
        self.evict_interval = check_int("evict_interval", evict_interval, min_value=1)

        live = self.capacity + self.pending_capacity
        num_slots = 1 << max(1, math.ceil(math.log2(math.ceil(live / self.max_load))))
        self.table = TensorHashTable(num_slots, key_dtype, device=device)
        self.values = nn.Parameter(torch.zeros(self.capacity, self.embedding_size, device=device))
        self._attach_reset_hook()

        i64 = dict(dtype=torch.int64, device=device)
        self.register_buffer("default_value", torch.zeros(self.embedding_size, device=device))
        self.register_buffer("row_slots", torch.full((self.capacity,), -1, **i64))
        # LIFO stack: free_rows[:num_free] are free, top = free_rows[num_free-1].
        self.register_buffer("free_rows", torch.arange(self.capacity - 1, -1, -1, **i64))
        self.register_buffer("dirty", torch.zeros(self.capacity, dtype=torch.bool, device=device))
        self.register_buffer("reset_mask", torch.zeros(self.capacity, dtype=torch.bool, device=device))
        self.register_buffer("evicted_keys", torch.empty(0, dtype=key_dtype, device=device))
        for name in ("num_free_t", "num_pending_t", "global_step_t", "track_evictions_t"):
            self.register_buffer(name, torch.zeros((), **i64))
        # Python mirrors of the 0-d buffers: read on every call without a host sync.
        self._step, self._num_pending, self._track_evictions = 0, 0, False
        self._set_free(self.capacity)
        # A module-level function (not a lambda) keeps the module picklable.
        self.register_load_state_dict_post_hook(_after_load)

    @property
    def num_slots(self) -> int:
        return self.table.num_slots

    def _attach_reset_hook(self) -> None:
        # Protocol hook for sparse optimizers (see module docstring). Re-attached
        # after deepcopy/unpickling and load_state_dict(assign=True), which all
        # produce a Parameter without the attribute.
        self.values.pop_reset_rows = self.pop_reset_rows

    def __setstate__(self, state) -> None:
        super().__setstate__(state)
        self._attach_reset_hook()

    def _sync_mirrors(self) -> None:
        self._attach_reset_hook()
        self._step = int(self.global_step_t)
        self._num_free = int(self.num_free_t)
        self._num_pending = int(self.num_pending_t)
        self._track_evictions = bool(self.track_evictions_t)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # The eviction log has a data-dependent length: size it to the checkpoint.
        src = state_dict.get(prefix + "evicted_keys")
        if isinstance(src, torch.Tensor) and src.shape != self.evicted_keys.shape:
            self.evicted_keys = torch.empty(src.shape, dtype=self.key_dtype,
                                            device=self.evicted_keys.device)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def pop_reset_rows(self) -> torch.Tensor:
        """Rows (re)assigned to a new key since the last call (LongTensor); clears them.

        Also reachable as ``self.values.pop_reset_rows``. One host sync
        (``nonzero``) per call, i.e. per optimizer step.
        """
        rows = self.reset_mask.nonzero().squeeze(1)
        self.reset_mask.zero_()
        return rows

    def _init_rows(self, n: int) -> torch.Tensor:
        shape, kw = (n, self.embedding_size), dict(dtype=self.values.dtype, device=self.values.device)
        if self.param_init == "normal":
            return torch.randn(shape, **kw) * _INIT_SCALE["normal"]
        if self.param_init == "uniform":
            return (torch.rand(shape, **kw) * 2 - 1) * _INIT_SCALE["uniform"]
        return torch.full(shape, 0.0 if self.param_init == "zeros" else 1.0, **kw)

    def _check_keys(self, keys) -> torch.Tensor:
        check_int_tensor("keys", keys)
        keys = keys.to(torch.int64)
        bad = (keys == EMPTY) | (keys == DELETED)
        if self.key_dtype == torch.int32:
            bad |= (keys < -2 ** 31) | (keys >= 2 ** 31)
        if bool(bad.any()):  # host sync: the only way to decide whether to raise
            i = bad.reshape(-1).nonzero()[0, 0]
            allowed = "int32 values" if self.key_dtype == torch.int32 else "int64 values"
            raise ValueError(
                f"keys must not contain {EMPTY} or {DELETED} (reserved EMPTY/DELETED sentinels of "
                f"the hash table); allowed: any other {allowed}; got keys.flatten()[{int(i)}]="
                f"{int(keys.reshape(-1)[i])}"
            )
        return keys

    def forward(self, keys: torch.Tensor) -> torch.Tensor:
        """Rows of ``keys`` (any shape, integer dtype) -> ``[*keys.shape, embedding_size]``.

        Training mode: counts keys, admits/evicts, marks looked-up rows dirty.
        Eval mode: read-only; unknown and pending keys read ``default_value``.
        Host syncs: ``torch.unique``, the sentinel check and one per probe
        round -- inherent to a table whose size changes with the data.
        """
        keys = self._check_keys(keys)
        flat = keys.reshape(-1)
        if self.training and self.auto_step:
            self.step()
        if flat.numel() == 0:
            return self.values.new_zeros(*keys.shape, self.embedding_size)
        uniq, inverse, counts = torch.unique(flat, return_inverse=True, return_counts=True)
        slots = self._train_slots(uniq, counts) if self.training else self.table.find(uniq)
        rows = torch.where(slots >= 0, self.table.rows.index_select(0, slots.clamp(min=0)), -1)
        has_row = _where(rows >= 0)
        r = rows.index_select(0, has_row)
        if self.max_norm is not None:
            self._renorm(r)
        if self.training:
            self.dirty.index_fill_(0, r, True)  # they get gradients: the optimizer changes them
        # Gather only admitted rows (one per unique key): the sparse gradient then
        # holds exactly the touched rows, never a placeholder row for pending keys.
        emb = F.embedding(r, self.values, sparse=self.sparse)
        out = self.default_value.to(emb.dtype).expand(uniq.numel(), -1).clone()
        out = out.index_copy(0, has_row, emb)
        return out.index_select(0, inverse).view(*keys.shape, self.embedding_size)

    @torch.no_grad()
    def _renorm(self, rows: torch.Tensor) -> None:
        w = self.values.index_select(0, rows)
        norm = w.norm(dim=1)
        changed = norm > self.max_norm
        # Same rule as torch.embedding_renorm_: scale = max_norm / (norm + 1e-7).
        scale = torch.where(changed, self.max_norm / (norm + 1e-7), torch.ones_like(norm))
        self.values.index_copy_(0, rows, w * scale.unsqueeze(1))
        self.dirty.index_copy_(0, rows, self.dirty.index_select(0, rows) | changed)

    def memory_bytes(self) -> Dict[str, float]:
        """Measured bytes of the module's tensors, total and per row of capacity."""
        slot = sum(b.numel() * b.element_size() for b in self.table.buffers())
        values = self.values.numel() * self.values.element_size()
        rows = sum(b.numel() * b.element_size() for n, b in self.named_buffers()
                   if not n.startswith("table.") and b.dim() == 1 and b.numel() == self.capacity)
        total = sum(t.numel() * t.element_size() for t in [*self.parameters(), *self.buffers()])
        return {"values": values, "row_metadata": rows, "hash_slots": slot, "total": total,
                "per_row": total / self.capacity}

    def extra_repr(self) -> str:
        return (f"embedding_size={self.embedding_size}, capacity={self.capacity}, "
                f"num_slots={self.num_slots}, rows={self.num_rows}, pending={self._num_pending}, "
                f"permit={self.permit_filter_value}, evict={self.evict_filter_value}, "
                f"sparse={self.sparse}, step={self._step}")
