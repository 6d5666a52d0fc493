"""A frozen, exportable copy of a [`HashEmbedding`][recstream.nn.hash_embedding.HashEmbedding]'s eval-mode lookup.

``HashEmbedding.forward`` probes a hash table in data-dependent rounds (``torch.unique``,
``nonzero``, a check of the keys that may raise): no export format carries that. An export
instead replaces each table by `FrozenHashLookup`, built from the table's admitted
keys and rows at export time (`HashEmbedding.export`): the keys sorted ascending with
their rows in the same order, and a lookup that is a binary search UNROLLED to the fixed
depth ``ceil(log2(n + 1))`` -- a known number of gather / compare / where steps, which
``torch.export``, TorchScript and ONNX (no ``searchsorted`` translation there) all carry.

Semantics are those of the table's eval forward: an admitted key reads its row, any other
key (never seen, pending, evicted) reads ``default_value``; with ``max_norm`` the rows are
scaled once here as eval mode scales the vectors it returns. It is a snapshot: keys admitted
after the export are not in it.

>>> import torch
>>> from recstream.nn import HashEmbedding
>>> table = HashEmbedding(2, capacity=8, param_init="ones")
>>> _ = table(torch.tensor([30, 10, 20]))  # training forward: admits the three keys
>>> frozen = FrozenHashLookup.from_hash_embedding(table.eval())
>>> frozen.num_keys, frozen.depth
(3, 2)
>>> frozen(torch.tensor([[20, 5], [10, 31]])).sum(-1).tolist()  # 5 and 31 are unknown
[[2.0, 0.0], [2.0, 0.0]]
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ...nn import HashEmbedding
from ...validation import check_type

_PAD = torch.iinfo(torch.int64).max  # sorts after every key: the search never steps onto a pad


class FrozenHashLookup(nn.Module):
    """Eval-mode lookup of a fixed set of int64 keys: ``forward(keys)`` -> ``[*keys.shape, dim]``.

    Args:
        keys: int64 ``[n]``, unique (any order).
        rows: ``[n, dim]``, row ``i`` belongs to ``keys[i]``.
        default_value: ``[dim]``, read by every key not in `keys`.

    Buffers: ``sorted_keys`` (padded with ``2**63 - 1`` to ``2**depth - 1`` entries so each
    search step gathers without a bound check), ``rows`` (sorted like the keys) and
    ``default_value``.
    """

    def __init__(self, keys: torch.Tensor, rows: torch.Tensor, default_value: torch.Tensor) -> None:
        super().__init__()
        owner = type(self).__name__
        check_type(owner, "keys", keys, torch.Tensor)
        check_type(owner, "rows", rows, torch.Tensor)
        check_type(owner, "default_value", default_value, torch.Tensor)
        if keys.dim() != 1 or rows.dim() != 2 or rows.shape[0] != keys.numel() or default_value.shape != rows.shape[1:]:
            raise ValueError(f"{owner}: needs keys [n], rows [n, dim] and default_value [dim], got shapes "
                             f"{tuple(keys.shape)}, {tuple(rows.shape)} and {tuple(default_value.shape)}")
        keys = keys.detach().to("cpu", torch.int64)
        order = torch.argsort(keys)
        self.num_keys = keys.numel()
        self.depth = self.num_keys.bit_length()  # == ceil(log2(n + 1))
        padded = torch.full(((1 << self.depth) - 1,), _PAD, dtype=torch.int64)
        padded[: self.num_keys] = keys[order]
        self.register_buffer("sorted_keys", padded)
        self.register_buffer("rows", rows.detach().cpu()[order].clone())
        self.register_buffer("default_value", default_value.detach().cpu().to(rows.dtype).clone())

    @classmethod
    @torch.no_grad()
    def from_hash_embedding(cls, table: HashEmbedding) -> FrozenHashLookup:
        """The admitted keys and rows of `table` now, with its ``max_norm`` applied to the rows."""
        check_type(cls.__name__, "table", table, HashEmbedding)
        if table.sharded:  # export() would hold this rank's keys only
            raise ValueError(f"{cls.__name__}: 'table' is key-sharded (it holds only this rank's keys); export a "
                             "published snapshot instead (recstream export DIR), which loads every key in one process")
        exported = table.export(reset_delta=False)  # leaves the table's delta baseline alone
        rows = exported["values"]
        if table.max_norm is not None:  # the same rule and arithmetic as the table's eval forward
            rows = rows * table.renorm_scale(rows.norm(dim=1)).unsqueeze(1)
        return cls(exported["keys"], rows, table.default_value)

    def forward(self, keys: torch.Tensor) -> torch.Tensor:
        flat = keys.reshape(-1).to(torch.int64)
        dim = self.default_value.shape[0]
        if self.num_keys == 0:  # decided at export time: every key reads the default
            out = self.default_value.expand(flat.shape[0], dim)
            return out.reshape(*keys.shape, dim)
        # Branchless lower bound: after the steps, pos = how many keys are < key (<= n, as the
        # pads sort after every key). Step sizes 2**(depth-1) .. 1 sum to len(sorted_keys).
        pos = torch.zeros_like(flat)
        for step in (1 << s for s in reversed(range(self.depth))):
            probe = self.sorted_keys[pos + (step - 1)]
            pos = torch.where(probe < flat, pos + step, pos)
        pos = pos.clamp(max=self.num_keys - 1)  # pos == n: bigger than every key, a miss below
        hit = self.sorted_keys[pos] == flat
        out = torch.where(hit.unsqueeze(1), F.embedding(pos, self.rows), self.default_value)
        return out.reshape(*keys.shape, dim)

    def extra_repr(self) -> str:
        return f"num_keys={self.num_keys}, dim={self.default_value.shape[0]}, depth={self.depth}"
