"""Fused pooled lookup of many embedding tables: :class:`EmbeddingBagCollection`.

Storage: all tables with the same ``embedding_dim`` live in ONE Parameter
(``fused_weight_dim<D>``), their rows concatenated; table ``t`` starts at a
per-table row offset. A feature's ids are shifted by its table's offset, so a
single ``F.embedding_bag`` call per dim-group pools every feature of a batch
(one kernel and, with ``sparse=True``, one sparse COO gradient per group
instead of one per table).

Input layout (recstream.data contract, FEATURE-MAJOR): ``values`` int64 flat
ids, ``offsets`` int64 of length ``F*B+1``; feature ``f`` of example ``b`` is
``values[offsets[f*B+b] : offsets[f*B+b+1]]``. Features are ordered as the
tables' ``feature_names``, table by table.

Pooling: the kernel always runs in ``mode="sum"``; mean bags get
``per_sample_weights = 1/len(bag)``, so sum and mean tables share one call.

Checkpoints hold one entry per table (``tables.<name>.weight``), not the fused
storage, so they stay readable and survive adding a table of another dim.

Example:
    >>> import torch
    >>> ebc = EmbeddingBagCollection([
    ...     EmbeddingTableConfig("user", 10, 4),
    ...     EmbeddingTableConfig("item", 20, 8, pooling="mean", feature_names=("item", "hist")),
    ... ])
    >>> B = 2  # 3 features (user, item, hist) x 2 examples = 6 bags
    >>> values = torch.tensor([1, 7, 3, 4, 5, 6, 19])
    >>> offsets = torch.tensor([0, 1, 2, 3, 4, 7, 7])  # hist of example 1 is empty
    >>> ebc(values, offsets, B).shape
    torch.Size([2, 20])
    >>> ebc.forward_dict(values, offsets, B)["hist"].shape
    torch.Size([2, 8])
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ._checks import check_int, check_int_tensor
from .embedding_config import EmbeddingTableConfig

__all__ = ["EmbeddingBagCollection"]


class EmbeddingBagCollection(nn.Module):
    """Pooled embedding lookups for many sparse features with fused storage.

    Args:
        tables: table configs; table and feature names must be unique.
        sparse: produce sparse COO gradients on the fused weights (use a sparse
            optimizer such as ``torch.optim.SparseAdam`` or recstream.optim).
        device: where the weights live.
        validate: check offsets and id ranges on every call (see ``forward``).
    """

    def __init__(self, tables: Sequence[EmbeddingTableConfig], sparse: bool = True,
                 device=None, validate: bool = True) -> None:
        super().__init__()
        tables = list(tables)
        if not tables:
            raise ValueError("tables must contain at least one EmbeddingTableConfig, got []")
        for t in tables:
            if not isinstance(t, EmbeddingTableConfig):
                raise TypeError(f"tables must contain EmbeddingTableConfig, got {type(t).__name__}")
        for kind, names in (("table", [t.name for t in tables]),
                            ("feature", [f for t in tables for f in t.feature_names])):
            dup = sorted({n for n in names if names.count(n) > 1})
            if dup:
                raise ValueError(f"{kind} names must be unique, got duplicates {dup}")
        self.tables = tables
        self.sparse = bool(sparse)
        self.validate = bool(validate)

        dims = list(dict.fromkeys(t.embedding_dim for t in tables))  # groups, first-seen order
        self._group_dims = dims
        group_rows = [0] * len(dims)
        self._table_loc: Dict[str, tuple] = {}  # name -> (group, first row, rows)
        for t in tables:
            g = dims.index(t.embedding_dim)
            self._table_loc[t.name] = (g, group_rows[g], t.num_embeddings)
            group_rows[g] += t.num_embeddings
        # With several groups each call sees the ids of ALL features; ids of other
        # groups are redirected to one extra zero "padding" row that embedding_bag
        # skips (no output, no sparse-grad entry), so the other groups cost no
        # optimizer work. A single group needs no padding row.
        self._pad = len(dims) > 1
        self._group_param_names = []
        for g, dim in enumerate(dims):
            w = torch.zeros(group_rows[g] + int(self._pad), dim, device=device)
            name = f"fused_weight_dim{dim}"
            self.register_parameter(name, nn.Parameter(w))
            self._group_param_names.append(name)
        self.reset_parameters()

        feats = [(f, t) for t in tables for f in t.feature_names]
        self.feature_names: List[str] = [f for f, _ in feats]
        self.feature_dims: List[int] = [t.embedding_dim for _, t in feats]
        self.feature_table: Dict[str, str] = {f: t.name for f, t in feats}
        f_group = [self._table_loc[t.name][0] for _, t in feats]
        self._buf("_f_shift", [self._table_loc[t.name][1] for _, t in feats], device)
        self._buf("_f_rows", [t.num_embeddings for _, t in feats], device)
        self._buf("_f_group", f_group, device)
        self.register_buffer("_f_mean", torch.tensor([t.pooling == "mean" for _, t in feats],
                                                     device=device), persistent=False)
        self._any_mean = any(t.pooling == "mean" for t in tables)
        self._group_feats = []
        for g in range(len(dims)):
            self._buf(f"_group_feats_{g}", [i for i, fg in enumerate(f_group) if fg == g], device)
        # Output columns are produced group by group; `_col_perm` restores feature order.
        col_start, start = [], 0
        for d in self.feature_dims:
            col_start.append(start)
            start += d
        order = [i for g in range(len(dims)) for i, fg in enumerate(f_group) if fg == g]
        perm = [c for i in order for c in range(col_start[i], col_start[i] + self.feature_dims[i])]
        self._needs_perm = perm != sorted(perm)
        if self._needs_perm:
            inverse = [0] * len(perm)
            for pos, c in enumerate(perm):
                inverse[c] = pos
            self._buf("_col_perm", inverse, device)
        self.output_dim = start

    def _buf(self, name: str, data: list, device) -> None:
        # Lookup metadata, derived from the configs: not part of the checkpoint.
        self.register_buffer(name, torch.tensor(data, dtype=torch.int64, device=device),
                             persistent=False)

    @property
    def num_features(self) -> int:
        return len(self.feature_names)

    def reset_parameters(self) -> None:
        """Re-draw every table from ``N(0, init_std**2)``; padding rows stay zero."""
        with torch.no_grad():
            for t in self.tables:
                self.table_weight(t.name).normal_(0.0, t.init_std)
            if self._pad:
                for name in self._group_param_names:
                    getattr(self, name)[-1].zero_()

    def table_weight(self, name: str) -> torch.Tensor:
        """View ``[num_embeddings, dim]`` of table ``name`` inside the fused storage.

        Writes through the view (under ``torch.no_grad()``) change the table.
        """
        if name not in self._table_loc:
            raise ValueError(f"name must be one of the tables {list(self._table_loc)}, got {name!r}")
        g, start, rows = self._table_loc[name]
        return getattr(self, self._group_param_names[g])[start:start + rows]

    def forward(self, values: torch.Tensor, offsets: torch.Tensor, batch_size: int,
                validate: Optional[bool] = None) -> torch.Tensor:
        """Pooled embeddings ``[batch_size, output_dim]``, features concatenated in order.

        ``validate`` (default: the constructor's) checks ``offsets`` (starts at 0,
        non-decreasing, ends at ``len(values)``) and that every id lies in its
        table. Cost: a few elementwise passes over ``values``/``offsets`` plus TWO
        host syncs (deciding whether to raise needs the answer on the host) --
        cheap on CPU, a pipeline stall on CUDA; pass ``validate=False`` once the
        input pipeline is trusted.
        """
        check_int_tensor("values", values, ndim=1, dtypes=(torch.int64,))
        check_int_tensor("offsets", offsets, ndim=1, dtypes=(torch.int64,))
        B = check_int("batch_size", batch_size, min_value=1)
        nf = self.num_features
        if offsets.numel() != nf * B + 1:
            raise ValueError(
                f"offsets must have num_features*batch_size+1 = {nf}*{B}+1 = {nf * B + 1} "
                f"entries (feature-major layout), got {offsets.numel()}"
            )
        n = values.numel()
        check = self.validate if validate is None else validate
        if check:  # before repeat_interleave, which would fail obscurely on bad offsets
            self._check_offsets(offsets, n)
        # Values per feature (feature-major => each feature is one contiguous run).
        f_len = offsets[B::B] - offsets[:-1:B]
        # output_size keeps repeat_interleave free of a device->host sync.
        fid = torch.repeat_interleave(torch.arange(nf, device=values.device), f_len, output_size=n)
        if check:
            self._check_ids(values, fid)
        ids = values + self._f_shift[fid]
        psw = None
        if self._any_mean:
            bag_len = offsets[1:] - offsets[:-1]
            w_dtype = getattr(self, self._group_param_names[0]).dtype
            inv = 1.0 / bag_len.clamp(min=1).to(w_dtype)
            is_mean = self._f_mean.repeat_interleave(B)
            bag_w = torch.where(is_mean, inv, torch.ones_like(inv))
            psw = torch.repeat_interleave(bag_w, bag_len, output_size=n)
        outs = []
        for g, pname in enumerate(self._group_param_names):
            w = getattr(self, pname)
            if self._pad:
                pad_row = w.shape[0] - 1
                ids_g = torch.where(self._f_group[fid] == g, ids, pad_row)
                pooled = F.embedding_bag(ids_g, w, offsets, mode="sum", sparse=self.sparse,
                                         per_sample_weights=psw, include_last_offset=True,
                                         padding_idx=pad_row)
                pooled = pooled.view(nf, B, -1).index_select(0, getattr(self, f"_group_feats_{g}"))
            else:
                pooled = F.embedding_bag(ids, w, offsets, mode="sum", sparse=self.sparse,
                                         per_sample_weights=psw, include_last_offset=True)
                pooled = pooled.view(nf, B, -1)
            # [F_g, B, D] -> [B, F_g * D]: each example's features side by side.
            outs.append(pooled.transpose(0, 1).reshape(B, -1))
        out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)
        if self._needs_perm:
            out = out.index_select(1, self._col_perm)
        return out

    @staticmethod
    def _check_offsets(offsets: torch.Tensor, n: int) -> None:
        bad = (offsets[0] != 0) | (offsets[-1] != n) | (offsets[1:] < offsets[:-1]).any()
        if bool(bad):  # host sync #1 of validation
            raise ValueError(
                f"offsets must start at 0, be non-decreasing and end at len(values)={n}, "
                f"got offsets[0]={int(offsets[0])}, offsets[-1]={int(offsets[-1])}"
            )

    def _check_ids(self, values: torch.Tensor, fid: torch.Tensor) -> None:
        limit = self._f_rows[fid]
        bad_ids = (values < 0) | (values >= limit)
        if bool(bad_ids.any()):  # host sync #2 of validation
            i = int(bad_ids.nonzero()[0, 0])
            f = int(fid[i])
            raise ValueError(
                f"values[{i}]={int(values[i])} (feature {self.feature_names[f]!r}, table "
                f"{self.feature_table[self.feature_names[f]]!r}) must be in [0, {int(limit[i])})"
            )

    def split(self, pooled: torch.Tensor) -> Dict[str, torch.Tensor]:
        """Per-feature ``[B, dim]`` views of a ``forward`` output."""
        if pooled.dim() != 2 or pooled.shape[1] != self.output_dim:
            raise ValueError(f"pooled must have shape [B, {self.output_dim}], got {tuple(pooled.shape)}")
        return dict(zip(self.feature_names, pooled.split(self.feature_dims, dim=1)))

    def forward_dict(self, values: torch.Tensor, offsets: torch.Tensor, batch_size: int,
                     validate: Optional[bool] = None) -> Dict[str, torch.Tensor]:
        """``forward`` followed by :meth:`split`: ``{feature: [B, dim]}``."""
        return self.split(self.forward(values, offsets, batch_size, validate))

    # ----- checkpoint format: one tensor per table, not the fused storage -----
    def _table_key(self, prefix: str, name: str) -> str:
        return f"{prefix}tables.{name}.weight"

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        for t in self.tables:
            w = self.table_weight(t.name)
            # Cloned: views of one storage would make torch.save write the whole
            # fused storage per table, and safetensors rejects shared storage.
            destination[self._table_key(prefix, t.name)] = w if keep_vars else w.detach().clone()

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict,
                              missing_keys, unexpected_keys, error_msgs):
        expected = {self._table_key(prefix, t.name): t.name for t in self.tables}
        for key, name in expected.items():
            if key not in state_dict:
                missing_keys.append(key)
                continue
            src, dst = state_dict[key], self.table_weight(name)
            if not isinstance(src, torch.Tensor):
                error_msgs.append(f'While copying "{key}", expected a tensor, got {type(src).__name__}.')
            elif src.shape != dst.shape:
                error_msgs.append(f"size mismatch for {key}: copying a param with shape "
                                  f"{tuple(src.shape)}, the shape in current model is {tuple(dst.shape)}.")
            else:
                with torch.no_grad():
                    dst.copy_(src)
        if strict:
            unexpected_keys.extend(k for k in state_dict if k.startswith(prefix) and k not in expected)

    def extra_repr(self) -> str:
        tabs = ", ".join(f"{t.name}:{t.num_embeddings}x{t.embedding_dim}/{t.pooling}" for t in self.tables)
        return f"tables=[{tabs}], features={self.num_features}, sparse={self.sparse}"
