"""Fused pooled lookup of many embedding tables: `EmbeddingBagCollection`.

Storage: all tables with the same ``embedding_dim`` live in ONE Parameter
(``fused_weight_dim<D>``), their rows concatenated; table ``t`` starts at a
per-table row offset. A feature's ids are shifted by its table's offset, so a
single ``F.embedding_bag`` call per dim-group pools every feature of a batch
(one kernel and, with ``sparse=True``, one sparse COO gradient per group
instead of one per table).

Input: a `Features` (or its raw parts ``values``, ``offsets``,
``batch_size``). Layout, FEATURE-MAJOR: ``values`` int64 flat ids, ``offsets`` int64 of
length ``F*B+1``; feature ``f`` of example ``b`` is ``values[offsets[f*B+b] : offsets[f*B+b+1]]``.
When the Features carry names (``keys``), features are matched to the collection's
``feature_names`` by name: any order works, and features the collection does not read are
ignored. Without names (and for raw input), features are ordered as the tables'
``feature_names``, table by table.

Pooling: the kernel always runs in ``mode="sum"``; mean bags get
``per_sample_weights = 1/len(bag)``, so sum and mean tables share one call.

Checkpoints hold one entry per table (``tables.<name>.weight``), not the fused
storage, so they stay readable and survive adding a table of another dim.

Row sharding (`shard_rows_`): under ``torch.distributed`` each rank can keep only its range of
every fused table's rows; lookups are then routed to the owning ranks (see `row_sharding`).
``state_dict()`` of a sharded collection gathers the full tables, so every rank must call it
together (a disk-tiered table's entry stays its rank's commit, as a checkpoint's: gathering every row
of a table larger than memory at each checkpoint would defeat the tier; `gather_tables` reads them);
``load_state_dict`` of full tables keeps each rank's rows, whatever the number of ranks that wrote them.

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

    By name, from Features whose features come in another order (plus one it does not read):

    >>> from recstream.features import Features
    >>> lengths = torch.tensor([[1, 1], [3, 0], [1, 1], [1, 1]])
    >>> x = Features.from_lengths(torch.zeros(2, 0), torch.tensor([3, 4, 5, 6, 19, 0, 0, 1, 7]), lengths,
    ...                           keys=("item", "hist", "clicks", "user"))
    >>> torch.equal(ebc(x), ebc(values, offsets, B))
    True
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from ..features import Features
from ..hostpath import device_assert, host_reads_free, once_per_step
from ..validation import check_bool, check_choice, check_int, check_int_tensor, check_type
from .embedding_config import EmbeddingTableConfig
from .row_sharding import RowSharding
from .tier_cache import TierCache, TierStats
from .tier_reshard import copy_rows, settled_sources
from .tier_shard import UnopenedTier, flagged_ranks, open_rank_store, process_ranks
from .tier_store import TierStore

__all__ = ["EmbeddingBagCollection"]

_OWNER = "EmbeddingBagCollection"


class _InputLayout(NamedTuple):
    """How the features of an input, in their storage order, map onto the collection.

    One entry per INPUT feature: ``shift`` (first row of its table in the dim group's fused
    storage), ``rows`` (its table's size, the id bound), ``group`` (its dim group; -1 for a
    feature the collection does not read), ``mean`` (mean pooling). ``group_positions[g]``
    lists the input positions of group ``g``'s features in collection order (None: the
    identity). ``names`` names the input features for error messages; ``owned`` masks the
    features the collection reads (None: all of them).
    """

    shift: torch.Tensor
    rows: torch.Tensor
    group: torch.Tensor
    mean: torch.Tensor
    group_positions: list[torch.Tensor | None]
    names: tuple[str, ...]
    owned: torch.Tensor | None


def _open_store(t: EmbeddingTableConfig) -> TierStore:
    """The store of tiered table `t`: opened (a crash's uncommitted writes undone) or created. Rank stores
    may lie beside it (`tier_shard`): a checkpoint of them reshards into this store (`reshard_tier`)."""
    if TierStore.exists(t.tier.directory):
        store = TierStore.open(t.tier.directory)
        weight = store.files.get("weight")
        if weight is None or (weight.rows, weight.cols) != (t.num_embeddings, t.embedding_dim):
            shape = None if weight is None else (weight.rows, weight.cols)
            raise ValueError(f"{_OWNER}: table {t.name!r} is {t.num_embeddings}x{t.embedding_dim}, its tier store "
                             f"{t.tier.directory} holds {shape}; give the table its own directory")
        return store

    def fill(a: int, b: int):  # N(0, init_std**2) from torch's generator, as an in-memory table
        return torch.empty(b - a, t.embedding_dim).normal_(0.0, t.init_std).numpy()

    return TierStore.create(t.tier.directory, {"weight": (t.num_embeddings, t.embedding_dim, fill)})


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
        self._sharding: list[RowSharding] | None = None  # per dim group, once shard_rows_ ran
        self._tier_state = "commit"  # what state_dict holds of a tiered table (see tier_export)
        tables = list(tables)
        if not tables:
            raise ValueError(f"{_OWNER}: 'tables' must contain at least one EmbeddingTableConfig, got []")
        for t in tables:
            check_type(_OWNER, "tables[]", t, EmbeddingTableConfig)
        for kind, names in (("table", [t.name for t in tables]),
                            ("feature", [f for t in tables for f in t.feature_names])):
            dup = sorted({n for n in names if names.count(n) > 1})
            if dup:
                raise ValueError(f"{_OWNER}: {kind} names must be unique, got duplicates {dup}")
        self.tables = tables
        self.sparse = check_bool(_OWNER, "sparse", sparse)
        tiered_names = [t.name for t in tables if t.tier is not None]
        if tiered_names and not self.sparse:  # a dense gradient would update every cached slot, not the batch's
            raise ValueError(f"{_OWNER}: disk-tiered tables {tiered_names} need sparse=True (row-sparse updates)")
        self.validate = check_bool(_OWNER, "validate", validate)

        # Groups: one per dim of the in-memory tables (first-seen order), then one per disk-tiered table,
        # whose Parameter is its cache of slots (see tier_cache).
        dims = list(dict.fromkeys(t.embedding_dim for t in tables if t.tier is None))
        tiered = [t for t in tables if t.tier is not None]
        self._group_dims = dims + [t.embedding_dim for t in tiered]
        group_rows = [0] * len(dims) + [t.tier.cache_rows for t in tiered]
        self._table_loc: dict[str, tuple] = {}  # name -> (group, first row, rows)
        for t in tables:
            if t.tier is not None:
                self._table_loc[t.name] = (len(dims) + tiered.index(t), 0, t.num_embeddings)
                continue
            g = dims.index(t.embedding_dim)
            self._table_loc[t.name] = (g, group_rows[g], t.num_embeddings)
            group_rows[g] += t.num_embeddings
        # With several groups each call sees the ids of ALL features; ids of other
        # groups are redirected to one extra zero "padding" row that embedding_bag
        # skips (no output, no sparse-grad entry), so the other groups cost no
        # optimizer work. A single group needs no padding row.
        self._pad = len(self._group_dims) > 1
        self._group_param_names = []
        for g, dim in enumerate(self._group_dims):
            w = torch.zeros(group_rows[g] + int(self._pad), dim, device=device)
            name = f"fused_weight_dim{dim}" if g < len(dims) else f"tier_cache_{tiered[g - len(dims)].name}"
            self.register_parameter(name, nn.Parameter(w))
            self._group_param_names.append(name)
        self._tier_configs: list[EmbeddingTableConfig | None] = [None] * len(dims) + tiered
        # In a process of several ranks a tiered table's store is this rank's rows: opened by shard_rows_.
        ranks = process_ranks()
        self._tiers: list[TierCache | UnopenedTier | None] = [None] * len(dims) + [
            UnopenedTier(t.name, t.tier.directory, ranks) if ranks > 1 else
            TierCache(t.name, getattr(self, self._group_param_names[len(dims) + i]), _open_store(t),
                      t.tier.cache_rows) for i, t in enumerate(tiered)]
        self.reset_parameters()

        feats = [(f, t) for t in tables for f in t.feature_names]
        self.feature_names: list[str] = [f for f, _ in feats]
        self.feature_dims: list[int] = [t.embedding_dim for _, t in feats]
        self.feature_table: dict[str, str] = {f: t.name for f, t in feats}
        self._feature_keys = tuple(self.feature_names)
        self._position = {f: i for i, f in enumerate(self.feature_names)}
        # Layouts of named inputs whose feature order differs from `feature_names`, per keys
        # tuple: derived once, so matching by name costs a dict lookup per call.
        self._layouts: dict[tuple[str, ...], _InputLayout | list[int]] = {}
        self._any_mean = any(t.pooling == "mean" for t in tables)
        self._register_lookup_buffers(feats, device)
        self.output_dim = sum(self.feature_dims)

    def _register_lookup_buffers(self, feats: list[tuple[str, EmbeddingTableConfig]], device) -> None:
        """Per-feature lookup metadata (the positional input layout) and the output column order."""
        f_group = [self._table_loc[t.name][0] for _, t in feats]
        self._buf("_f_shift", [self._table_loc[t.name][1] for _, t in feats], device)
        self._buf("_f_rows", [t.num_embeddings for _, t in feats], device)
        self._rows_host = {f: t.num_embeddings for f, t in feats}  # `_f_rows` on the host (`_id_bounds`)
        self._shift_host = {f: self._table_loc[t.name][:2] for f, t in feats}  # group, shift (`_id_shifts`)
        self._buf("_f_group", f_group, device)
        self.register_buffer("_f_mean", torch.tensor([t.pooling == "mean" for _, t in feats],
                                                     device=device), persistent=False)
        groups = range(len(self._group_dims))
        self._group_members = [[i for i, fg in enumerate(f_group) if fg == g] for g in groups]
        for g in groups:
            self._buf(f"_group_feats_{g}", self._group_members[g], device)
        # Output columns are produced group by group; `_col_perm` restores feature order.
        col_start, start = [], 0
        for d in self.feature_dims:
            col_start.append(start)
            start += d
        order = [i for members in self._group_members for i in members]
        perm = [c for i in order for c in range(col_start[i], col_start[i] + self.feature_dims[i])]
        self._needs_perm = perm != sorted(perm)
        if self._needs_perm:
            inverse = [0] * len(perm)
            for pos, c in enumerate(perm):
                inverse[c] = pos
            self._buf("_col_perm", inverse, device)

    def _buf(self, name: str, data: list, device) -> None:
        # Lookup metadata, derived from the configs: not part of the checkpoint.
        self.register_buffer(name, torch.tensor(data, dtype=torch.int64, device=device),
                             persistent=False)

    @property
    def num_features(self) -> int:
        return len(self.feature_names)

    # ----- row sharding over torch.distributed -----
    @property
    def sharded(self) -> bool:
        return self._sharding is not None

    def shard_rows_(self, group=None) -> EmbeddingBagCollection:
        """Keep only this rank's rows of each fused table (collective: every rank of `group` calls it).

        Rank 0's tables are broadcast first, so all ranks shard the same weights. The Parameter
        objects stay the same (an optimizer built on them keeps working; build its state after).
        A disk-tiered table is not broadcast: each rank opens (or creates) the store of its own rows,
        ``<directory>/rank-<r>-of-<N>`` (`tier_shard`), and its Parameter stays a cache of
        ``cache_rows`` slots, over that store.
        """
        if self.sharded:
            raise RuntimeError(f"{_OWNER}: the tables are row-sharded already")
        self.check_tiers_shardable(f"{_OWNER}.shard_rows_")
        sharding = []
        for g, name in enumerate(self._group_param_names):
            weight = getattr(self, name)
            if self._tier_configs[g] is not None:
                sharding.append(self._shard_tier(g, weight, group))
                continue
            torch.distributed.broadcast(weight.data, src=torch.distributed.get_global_rank(group, 0)
                                        if group is not None else 0, group=group)
            rows = RowSharding(weight.shape[0], group)
            weight.data = rows.local_rows(weight.data)
            rows.scale_gradient(weight)
            weight.recstream_layout = {  # read by Model.infer_train_layout
                "shape": [rows.rows, weight.shape[1]], "dtype": str(weight.dtype).replace("torch.", ""),
                "device": str(weight.device), "placement": "row_sharded",
                "ranks": list(range(rows.world_size)), "rows": [list(r) for r in rows.ranges()]}
            sharding.append(rows)
        self._sharding = sharding
        return self

    def check_tiers_shardable(self, owner: str) -> None:
        """Refuse (ValueError) to shard disk-tiered tables whose stores hold every row: built in a
        process without a group of several ranks (checked before any collective)."""
        whole = [t.name for g, t in enumerate(self._tier_configs)
                 if t is not None and isinstance(self._tiers[g], TierCache)]
        if whole:
            raise ValueError(f"{owner}: disk-tiered tables {whole} were built in a single process, their stores "
                             "hold every row; build the network after joining the process group (distributed.init"
                             "()), so that each rank opens a store of its own rows")

    def _shard_tier(self, g: int, weight: nn.Parameter, group) -> RowSharding:
        """This rank's store of tiered table group `g`'s rows, behind its cache Parameter `weight`."""
        t = self._tier_configs[g]
        rows = RowSharding(t.num_embeddings, group)
        if rows.start >= rows.stop:
            raise ValueError(f"{_OWNER}: disk-tiered table {t.name!r} has {t.num_embeddings} rows, too few to "
                             f"give each of {rows.world_size} ranks some")
        store = open_rank_store(t.tier.directory, t.name, t.num_embeddings, rows.start, rows.stop, t.embedding_dim,
                                t.init_std, rows.rank, rows.world_size, group=group, reshardable=True)
        self._tiers[g] = TierCache(t.name, weight, store, t.tier.cache_rows)
        rows.scale_gradient(weight)
        weight.recstream_layout = {  # the slots are this rank's own: saved and loaded per rank
            "shape": [rows.world_size * weight.shape[0], weight.shape[1]],
            "dtype": str(weight.dtype).replace("torch.", ""), "device": str(weight.device),
            "placement": "rank_local", "ranks": list(range(rows.world_size)),
            "rows": [list(r) for r in rows.ranges()], "store": store.directory}
        return rows

    def gather_tables(self) -> dict[str, torch.Tensor]:
        """``{table name: full weight}`` assembled from all ranks' shards (collective), or the
        local tables when not sharded."""
        if not self.sharded:
            return {t.name: self.table_weight(t.name).detach().clone() if t.tier is None
                    else self._tiers[self._table_loc[t.name][0]].full_weight() for t in self.tables}
        return self._gather(tiered=True)

    def _gather(self, tiered: bool) -> dict[str, torch.Tensor]:
        """The full tables of a sharded collection (collective); without `tiered`, the in-memory ones only."""
        full = [None if tier is not None and not tiered else
                rows.gather(getattr(self, name) if tier is None else tier.full_weight())
                for rows, name, tier in zip(self._sharding, self._group_param_names, self._tiers, strict=True)]
        return {t.name: full[g][start:start + n].clone() for t in self.tables
                for g, start, n in [self._table_loc[t.name]] if full[g] is not None}

    def _refuse_if_sharded(self, what: str) -> None:
        if self.sharded:
            raise RuntimeError(f"{_OWNER}.{what}: the tables are row-sharded across ranks, this rank holds "
                               "only its rows; use gather_tables() (on every rank) for the full tables")

    def reset_parameters(self) -> None:
        """Re-draw every table from ``N(0, init_std**2)``; padding rows stay zero."""
        self._refuse_if_sharded("reset_parameters")
        with torch.no_grad():
            for t in self.tables:
                if t.tier is None:  # a tiered table's rows are its store's
                    self.table_weight(t.name).normal_(0.0, t.init_std)
            if self._pad:
                for name in self._group_param_names:
                    getattr(self, name)[-1].zero_()

    def table_weight(self, name: str) -> torch.Tensor:
        """View ``[num_embeddings, dim]`` of table ``name`` inside the fused storage.

        Writes through the view (under ``torch.no_grad()``) change the table. A disk-tiered table has
        no such view: `gather_tables` reads it.
        """
        check_choice(f"{_OWNER}.table_weight", "name", name, self._table_loc)
        self._refuse_if_sharded("table_weight")
        if self._tiers[self._table_loc[name][0]] is not None:
            raise ValueError(f"{_OWNER}.table_weight: table {name!r} lives on disk behind a cache (DiskTier); "
                             "gather_tables() reads its rows into memory")
        g, start, rows = self._table_loc[name]
        return getattr(self, self._group_param_names[g])[start:start + rows]

    def forward(self, features: Features | torch.Tensor, offsets: torch.Tensor | None = None,
                batch_size: int | None = None, validate: bool | None = None) -> torch.Tensor:
        """Pooled embeddings ``[batch_size, output_dim]``, features concatenated in order.

        Call it with a `Features` (``ebc(features)``) or with its
        raw parts (``ebc(values, offsets, batch_size)``). Named Features are matched to
        ``feature_names`` by name, in any order, at no extra cost; features the collection
        does not read are skipped (with a single embedding dim they are selected out first,
        which on CUDA costs one host sync). Unnamed ones are matched by position.

        ``validate`` (default: the constructor's) checks ``offsets`` (starts at 0,
        non-decreasing, ends at ``len(values)``) and that every id lies in its
        table. Cost: a few elementwise passes over ``values``/``offsets``. On a CPU a
        failed check raises ``ValueError`` naming the id; on a device it is a device-side
        assert (`recstream.hostpath.device_assert`: no host sync, but a failure is reported by a
        later call and ends the CUDA context), so check ids on the host before the copy
        when the data can be bad, or pass ``validate=False`` once the input pipeline is
        trusted.
        """
        values, offsets, batch_size, layout = self._inputs(features, offsets, batch_size)
        return self._pool(values, offsets, batch_size, layout, self.validate if validate is None else validate)

    def _inputs(self, features, offsets, batch_size) -> tuple[torch.Tensor, torch.Tensor, int, _InputLayout]:
        """``(values, offsets, batch_size, layout)`` of either calling convention, checked."""
        if isinstance(features, Features):
            if offsets is not None or batch_size is not None:
                raise TypeError(f"{_OWNER}: pass either Features or (values, offsets, batch_size), not both "
                                f"(give 'validate' by keyword)")
            if features.keys is not None:
                layout = self._layout_for(features.keys)
                if isinstance(layout, list):  # positions of the features to keep, in collection order
                    features = features.permute(layout)
                    layout = self._positional_layout()
            elif features.num_features != self.num_features:
                raise ValueError(f"{_OWNER}: features has {features.num_features} features but the collection "
                                 f"reads {self.num_features} {self.feature_names}; give the Features keys to "
                                 f"match them by name")
            else:
                layout = self._positional_layout()
            values, offsets, batch_size = features.values, features.offsets, features.batch_size
        else:
            values, layout = features, self._positional_layout()
        check_int_tensor(_OWNER, "values", values, ndim=1, dtypes=(torch.int64,))
        check_int_tensor(_OWNER, "offsets", offsets, ndim=1, dtypes=(torch.int64,))
        batch_size = check_int(_OWNER, "batch_size", batch_size, minimum=1)
        nf = layout.shift.numel()
        if offsets.numel() != nf * batch_size + 1:
            raise ValueError(
                f"{_OWNER}: offsets must have num_features*batch_size+1 = {nf}*{batch_size}+1 = "
                f"{nf * batch_size + 1} entries (feature-major layout), got {offsets.numel()}"
            )
        return values, offsets, batch_size, layout

    def _positional_layout(self) -> _InputLayout:
        """Input features are exactly ``feature_names``, in order."""
        positions = [getattr(self, f"_group_feats_{g}") if self._pad else None for g in range(len(self._group_dims))]
        return _InputLayout(self._f_shift, self._f_rows, self._f_group, self._f_mean, positions,
                            self._feature_keys, None)

    def _layout_for(self, keys: tuple[str, ...]) -> _InputLayout | list[int]:
        """Layout of inputs named `keys` (cached per keys tuple and device).

        A list instead: the positions of the collection's features among `keys`, when the
        input has features the collection does not read and there is no padding row to send
        their ids to (a single dim group); the caller selects those features first (on CUDA
        that costs one host sync: the number of ids kept sizes the result).
        """
        if keys == self._feature_keys:
            return self._positional_layout()
        layout = self._layouts.get(keys)
        if layout is None or (isinstance(layout, _InputLayout) and layout.shift.device != self._f_shift.device):
            layout = self._layouts[keys] = self._build_layout(keys)
        return layout

    def _build_layout(self, keys: tuple[str, ...]) -> _InputLayout | list[int]:
        missing = [f for f in self.feature_names if f not in keys]
        if missing:
            raise ValueError(f"{_OWNER}: the features have no {', '.join(map(repr, missing))} "
                             f"(keys: {list(keys)}); the collection reads {self.feature_names}")
        where = {k: i for i, k in enumerate(keys)}
        extra = len(keys) > self.num_features
        if extra and not self._pad:
            return [where[f] for f in self.feature_names]
        device = self._f_shift.device
        # index[i]: the collection feature of input feature i; extras point at a dummy entry.
        index = torch.tensor([self._position.get(k, self.num_features) for k in keys], device=device)

        def per_input(table: torch.Tensor, dummy) -> torch.Tensor:
            return torch.cat([table, table.new_full((1,), dummy)]).index_select(0, index)

        # Pooling runs in input order; these put each group's features back in collection order.
        positions = [torch.tensor([where[self.feature_names[i]] for i in members], dtype=torch.int64, device=device)
                     for members in self._group_members]
        owned = torch.tensor([k in self._position for k in keys], device=device) if extra else None
        return _InputLayout(per_input(self._f_shift, 0), per_input(self._f_rows, 0), per_input(self._f_group, -1),
                            per_input(self._f_mean, False), positions, keys, owned)

    def _pool(self, values: torch.Tensor, offsets: torch.Tensor, B: int, layout: _InputLayout,
              check: bool) -> torch.Tensor:
        nf = layout.shift.numel()
        n = values.numel()
        if check:  # before repeat_interleave, which would fail obscurely on bad offsets
            # once a step for one batch's offsets, however many collections read them (hostpath.one_step)
            once_per_step(("EmbeddingBagCollection._check_offsets", n), (offsets,),
                          lambda: self._check_offsets(offsets, n) or True)
        # Values per feature (feature-major => each feature is one contiguous run). Read through
        # [nf, B] views rather than strided slices: torch.export cannot prove that a slice with a
        # symbolic step B has nf entries, and would then fix the batch size of an export.
        def feature_of_id() -> torch.Tensor:
            f_len = offsets[1:].reshape(nf, B)[:, -1] - offsets[:-1].reshape(nf, B)[:, 0]
            # output_size keeps repeat_interleave free of a device->host sync.
            return torch.repeat_interleave(torch.arange(nf, device=values.device), f_len, output_size=n)

        # Each id's feature and fused row: once a step for collections that read one batch with the same
        # tables' rows (a wide and a deep part of one schema; hostpath.one_step)
        fid = once_per_step(("EmbeddingBagCollection.fid", nf, B, n), (offsets,), feature_of_id)
        if check:  # once a step per batch and id bounds
            once_per_step(("EmbeddingBagCollection._check_ids", self._id_bounds(layout)), (values, offsets),
                          lambda: self._check_ids(values, fid, layout) or True)
        ids = once_per_step(("EmbeddingBagCollection.ids", self._id_shifts(layout)), (values, offsets),
                            lambda: values + layout.shift[fid])
        single = self._one_id_per_bag(values, offsets, nf * B)
        psw = None
        if self._any_mean and not single:
            bag_len = offsets[1:] - offsets[:-1]
            w_dtype = getattr(self, self._group_param_names[0]).dtype
            inv = 1.0 / bag_len.clamp(min=1).to(w_dtype)
            is_mean = layout.mean.repeat_interleave(B)
            bag_w = torch.where(is_mean, inv, torch.ones_like(inv))
            psw = torch.repeat_interleave(bag_w, bag_len, output_size=n)
        outs = []
        for g, pname in enumerate(self._group_param_names):
            w = getattr(self, pname)
            if self._tiers[g] is not None and self._sharding is not None:  # slots of the rows' owners
                train = self.training and torch.is_grad_enabled()
                pooled = self._pool_sharded(g, w, ids, fid, offsets, psw, layout, nf * B,
                                            slots=lambda local, g=g, train=train: self._tiers[g].map_ids(local, train))
            elif self._tiers[g] is not None:  # table rows -> cache slots (the pad row for other groups' ids)
                ids_g = self._tier_slots(g, w, values, fid, layout)
                pooled = F.embedding(ids_g, w, sparse=self.sparse) if single else F.embedding_bag(
                    ids_g, w, offsets, mode="sum", sparse=self.sparse, per_sample_weights=psw,
                    include_last_offset=True, padding_idx=w.shape[0] - 1 if self._pad else None)
            elif single:
                # Each bag one id: a row gather, the same values and gradient as a sum (or mean) of
                # one at a fraction of the cost on a CPU -- embedding_bag's sparse backward took
                # 2.2 ms for 26,624 ids of dim 16, embedding's 0.35 ms (one thread).
                pooled = F.embedding(ids, w, sparse=self.sparse)
            elif self._sharding is not None:
                pooled = self._pool_sharded(g, w, ids, fid, offsets, psw, layout, nf * B)
            elif self._pad:
                pad_row = w.shape[0] - 1
                ids_g = torch.where(layout.group[fid] == g, ids, pad_row)
                pooled = F.embedding_bag(ids_g, w, offsets, mode="sum", sparse=self.sparse,
                                         per_sample_weights=psw, include_last_offset=True,
                                         padding_idx=pad_row)
            else:
                pooled = F.embedding_bag(ids, w, offsets, mode="sum", sparse=self.sparse,
                                         per_sample_weights=psw, include_last_offset=True)
            pooled = pooled.view(nf, B, -1)
            if layout.group_positions[g] is not None:
                pooled = pooled.index_select(0, layout.group_positions[g])
            # [F_g, B, D] -> [B, F_g * D]: each example's features side by side.
            outs.append(pooled.transpose(0, 1).reshape(B, -1))
        out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)
        if self._needs_perm:
            out = out.index_select(1, self._col_perm)
        return out

    def _tier_slots(self, g: int, w: torch.Tensor, values: torch.Tensor, fid: torch.Tensor,
                    layout: _InputLayout) -> torch.Tensor:
        train = self.training and torch.is_grad_enabled()
        if not self._pad:
            return self._tiers[g].map_ids(values, train)
        mine = layout.group[fid] == g
        slots = torch.full_like(values, w.shape[0] - 1)
        slots[mine] = self._tiers[g].map_ids(values[mine], train)
        return slots

    # ----- disk tiers -----
    def tier_stats(self) -> dict[str, TierStats]:
        """``{table: TierStats}`` of the disk-tiered tables (hits, misses, bytes read and written)."""
        return {t.name: self._tiers[self._table_loc[t.name][0]].stats for t in self.tables if t.tier is not None}

    @property
    def tier_shards(self) -> int:
        """How many stores each disk-tiered table's rows are split over: the ranks once sharded, else 1."""
        return 1 if self._sharding is None else self._sharding[0].world_size

    def tier_commits(self) -> dict[str, torch.Tensor]:
        """Commit every disk-tiered table's store (this rank's, when sharded): ``{table: [store uid,
        generation]}``, what a checkpoint holds of the table (sharded checkpoints, `save_sharded`)."""
        out = {}
        for t in self.tables:
            if t.tier is not None:
                tier = self._tiers[self._table_loc[t.name][0]]
                generation = tier.commit()
                out[t.name] = torch.tensor([tier.store.uid, generation])
        return out

    def restore_tier_commits(self, commits: dict[str, torch.Tensor], where: str) -> None:
        """Return each disk-tiered table's store to the commit `commits` names (`tier_commits` of a
        checkpoint; `where` names it in errors): a ValueError if one names another store or a commit
        it cannot return to."""
        for name, src in commits.items():
            error = self._tiers[self._table_loc[name][0]].restore_commit(
                f"{where} tables.{name}.tier", src, f"table {name!r} (tier store {self.tier_store_directory(name)})")
            if error is not None:
                raise ValueError(error)

    def tier_cache_parameters(self) -> list[nn.Parameter]:
        """The Parameters that are the disk-tiered tables' caches (slots over their stores)."""
        return [getattr(self, n) for n, tier in zip(self._group_param_names, self._tiers, strict=True)
                if tier is not None]

    def reshard_tier(self, name: str, commits: torch.Tensor, where: str) -> None:
        """Fill disk-tiered table `name`'s store (this rank's rows, when sharded) from the stores of the
        ranks that saved a checkpoint, `commits` ``[ranks, 2]`` (their ``[store uid, generation]``; `where`
        names the entry in errors), streamed in chunks (`tier_reshard`; the old stores are read, not
        changed); the cache is emptied. Collective when sharded: the ranks agree on every failure."""
        g, _, _ = self._table_loc[name]
        t, tier = self._tier_configs[g], self._tiers[g]
        rows = None if self._sharding is None else self._sharding[g]
        group, rank, ranks = (None, 0, 1) if rows is None else (rows.group, rows.rank, rows.world_size)
        start, stop = (0, t.num_embeddings) if rows is None else (rows.start, rows.stop)
        sources, error = [], None
        try:
            sources = settled_sources(t.tier.directory, t.name, t.num_embeddings, commits, rank, ranks, where)
        except ValueError as e:  # TierFileError included
            error = e
        self._agree(error, group, name, "read the stores it is resharded from", rank, ranks)
        try:
            with tier.lock:
                tier._quiesce()
                tier._clear()
                copy_rows(sources, tier.store, start, stop)
        except ValueError as e:
            error = e
        self._agree(error, group, name, "fill its store", rank, ranks)

    @staticmethod
    def _agree(error: Exception | None, group, name: str, what: str, rank: int, ranks: int) -> None:
        failed = flagged_ranks(error is not None, group) if ranks > 1 else []
        if error is not None:
            raise ValueError(f"{_OWNER}: table {name!r} resharded on {ranks} rank(s) (this is rank {rank}): "
                             f"{error}") from error
        if failed:
            raise ValueError(f"{_OWNER}: table {name!r} resharded on {ranks} ranks: rank(s) {failed} could not {what} "
                             f"(their errors say why); this is rank {rank}")

    def tier_store_directory(self, name: str) -> str:
        """The directory of tiered table `name`'s store (this rank's, when sharded)."""
        return self._tiers[self._table_loc[name][0]].store.directory

    def prefetch(self, features: Features) -> None:
        """Bring the rows a future batch reads into the tiered tables' caches (thread-safe: call it from
        the thread that prepares batches while the current step trains). A no-op without tiers."""
        if all(t is None for t in self._tiers):
            return
        values, offsets, batch_size, layout = self._inputs(features, None, None)
        if not self._pad:  # one group, the tiered table's: every id is its own (no per-id feature needed)
            self._prefetch_tier(0, values)
            return
        nf = layout.shift.numel()
        f_len = offsets[1:].reshape(nf, batch_size)[:, -1] - offsets[:-1].reshape(nf, batch_size)[:, 0]
        fid = torch.repeat_interleave(torch.arange(nf, device=values.device), f_len, output_size=values.numel())
        for g, tier in enumerate(self._tiers):
            if tier is not None:
                self._prefetch_tier(g, values[layout.group[fid] == g])

    def _prefetch_tier(self, g: int, rows: torch.Tensor) -> None:
        """Prefetch table rows `rows` of tiered group `g`; sharded, those this rank owns (the batch's others
        are read by their owners when asked)."""
        if self._sharding is not None:
            own = self._sharding[g]
            rows = rows[(rows >= own.start) & (rows < own.stop)] - own.start
        self._tiers[g].prefetch(rows)

    def batch_prefetcher(self):
        """For a pipeline that has batches ready ahead of their steps (`recstream.train.sink.batch_prefetch`):
        None without disk-tiered tables; otherwise a function that `prefetch` es the rows of a
        `Features` carrying this collection's features (by name, or all of them by position), and
        passes over one that does not (a network may feed the collection features it derives)."""
        if all(t is None for t in self._tiers):
            return None
        names = set(self.feature_names)

        def prefetch_if_read(features: Features) -> None:
            if features.keys is None and features.num_features != self.num_features:
                return
            if features.keys is not None and not names <= set(features.keys):
                return
            self.prefetch(features)

        return prefetch_if_read

    def _one_id_per_bag(self, values: torch.Tensor, offsets: torch.Tensor, num_bags: int) -> bool:
        """Whether every bag holds exactly one id (single-hot fields, the usual CTR input), on a CPU
        with one dim group and no sharding: then `_pool` gathers rows. One pass over the
        offsets; on CUDA not asked (the answer would cost a host sync), nor while the network is
        traced for export or compiled (a graph must hold for any offsets: the general path)."""
        # Asked first: under export even comparing the sizes would pin num_ids == num_bags in the graph.
        if torch.compiler.is_compiling() or torch.compiler.is_exporting() or torch.jit.is_tracing():
            return False
        if values.numel() != num_bags or self._pad or self._sharding is not None or not host_reads_free(values):
            return False
        return torch.equal(offsets, torch.arange(num_bags + 1))

    def _pool_sharded(self, g: int, w: torch.Tensor, ids: torch.Tensor, fid: torch.Tensor, offsets: torch.Tensor,
                      psw: torch.Tensor | None, layout: _InputLayout, num_bags: int, slots=None) -> torch.Tensor:
        """Group `g`'s bags, looked up on the ranks that own their rows (`slots`: a tiered group's
        mapping of the owner's rows to cache slots, see `RowSharding.pool`)."""
        bag_of_id = torch.repeat_interleave(torch.arange(num_bags, device=ids.device), offsets[1:] - offsets[:-1],
                                            output_size=ids.numel())
        if self._pad or layout.owned is not None:  # only this group's ids (boolean selection: a host sync)
            keep = layout.group[fid] == g
            ids, bag_of_id = ids[keep], bag_of_id[keep]
            psw = None if psw is None else psw[keep]
        return self._sharding[g].pool(w, ids, bag_of_id, num_bags, psw, self.sparse, slots)

    @staticmethod
    def _check_offsets(offsets: torch.Tensor, n: int) -> None:
        bad = (offsets[0] != 0) | (offsets[-1] != n) | (offsets[1:] < offsets[:-1]).any()
        if not host_reads_free(offsets):
            # On a device reading `bad` would stall the step until the device caught up: assert there.
            device_assert(~bad, f"{_OWNER}: offsets must start at 0, be non-decreasing and end at "
                                f"len(values)={n}")
            return
        if bool(bad):
            raise ValueError(
                f"{_OWNER}: offsets must start at 0, be non-decreasing and end at len(values)={n}, "
                f"got offsets[0]={int(offsets[0])}, offsets[-1]={int(offsets[-1])}"
            )

    def _id_bounds(self, layout: _InputLayout) -> tuple:
        """What `_check_ids` checks of an input of `layout`, on the host: each input feature's name and
        row bound (None: a feature the collection does not read)."""
        return tuple((name, self._rows_host.get(name)) for name in layout.names)

    def _id_shifts(self, layout: _InputLayout) -> tuple:
        """What ``values + layout.shift[fid]`` adds to an input of `layout`'s ids, on the host: each input
        feature's name, dim group and first fused row (None: a feature the collection does not read)."""
        return tuple((name, self._shift_host.get(name)) for name in layout.names)

    def _check_ids(self, values: torch.Tensor, fid: torch.Tensor, layout: _InputLayout) -> None:
        limit = layout.rows[fid]
        bad_ids = (values < 0) | (values >= limit)
        if layout.owned is not None:  # ids of features the collection does not read are not its business
            bad_ids &= layout.owned[fid]
        if not host_reads_free(values):  # a device-side assert: no host sync (see _check_offsets)
            # The message must stay short (CUDA's assert buffer): the CPU path names the id and table.
            device_assert(~bad_ids.any(), f"{_OWNER}: an id lies outside [0, rows) of its table; run the batch "
                                          f"on the CPU for the id, feature and table")
            return
        if bool(bad_ids.any()):
            i = int(bad_ids.nonzero()[0, 0])
            name = layout.names[int(fid[i])]
            raise ValueError(
                f"values[{i}]={int(values[i])} (feature {name!r}, table "
                f"{self.feature_table[name]!r}) must be in [0, {int(limit[i])})"
            )

    def split(self, pooled: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per-feature ``[B, dim]`` views of a ``forward`` output."""
        check_type(f"{_OWNER}.split", "pooled", pooled, torch.Tensor)
        if pooled.dim() != 2 or pooled.shape[1] != self.output_dim:
            raise ValueError(f"{_OWNER}.split: 'pooled' must have shape [B, {self.output_dim}], "
                             f"got {tuple(pooled.shape)}")
        return dict(zip(self.feature_names, pooled.split(self.feature_dims, dim=1), strict=True))

    def forward_dict(self, features: Features | torch.Tensor, offsets: torch.Tensor | None = None,
                     batch_size: int | None = None, validate: bool | None = None) -> dict[str, torch.Tensor]:
        """``forward`` followed by `split`: ``{feature: [B, dim]}``."""
        return self.split(self.forward(features, offsets, batch_size, validate))

    # ----- checkpoint format: one tensor per table, not the fused storage -----
    def _table_key(self, prefix: str, name: str) -> str:
        return f"{prefix}tables.{name}.weight"

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        if self.sharded:  # the full tables, gathered from all ranks: a collective, as FSDP's state_dict
            # (a tiered table's only for its rows: below, its commit holds this rank's store, not every row)
            for name, weight in self._gather(tiered=self._tier_state == "rows").items():
                destination[self._table_key(prefix, name)] = weight
        for t in self.tables:
            if self.sharded and (t.tier is None or self._tier_state == "rows"):
                continue  # gathered above
            if t.tier is not None and self._tier_state == "rows":  # for a server (tier_export): the rows
                destination[self._table_key(prefix, t.name)] = self._tiers[self._table_loc[t.name][0]].full_weight()
                continue
            if t.tier is not None and self._tier_state == "meta":
                destination[self._table_key(prefix, t.name)] = torch.empty(t.num_embeddings, t.embedding_dim,
                                                                           device="meta")
                continue
            if t.tier is not None:  # a commit of the store: the checkpoint holds which one
                tier = self._tiers[self._table_loc[t.name][0]]
                generation = tier.commit()
                destination[f"{prefix}tables.{t.name}.tier"] = torch.tensor([tier.store.uid, generation])
                continue
            w = self.table_weight(t.name)
            # Cloned: views of one storage would make torch.save write the whole
            # fused storage per table, and safetensors rejects shared storage.
            destination[self._table_key(prefix, t.name)] = w if keep_vars else w.detach().clone()

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict,
                              missing_keys, unexpected_keys, error_msgs):
        expected = {self._table_key(prefix, t.name): t.name for t in self.tables}
        for t in self.tables:
            tier_key = f"{prefix}tables.{t.name}.tier"
            if t.tier is not None and tier_key in state_dict:
                del expected[self._table_key(prefix, t.name)]
                expected[tier_key] = t.name
                self._load_tier(t.name, tier_key, state_dict[tier_key], error_msgs)
        for key, name in expected.items():
            if key.endswith(".tier"):
                continue
            if key not in state_dict:
                missing_keys.append(key)
                continue
            src = state_dict[key]
            g, start, rows = self._table_loc[name]
            shape = (rows, self._group_dims[g])
            if not isinstance(src, torch.Tensor):
                error_msgs.append(f'While copying "{key}", expected a tensor, got {type(src).__name__}.')
            elif tuple(src.shape) != shape:
                error_msgs.append(f"size mismatch for {key}: copying a param with shape "
                                  f"{tuple(src.shape)}, the shape in current model is {shape}.")
            elif self._tiers[g] is not None:  # an in-memory table's rows into the store (sharded: ours)
                own = None if self._sharding is None else self._sharding[g]
                self._tiers[g].import_rows(src if own is None else src[own.start:own.stop])
            else:
                self._load_table(g, start, src)
        if strict:
            unexpected_keys.extend(k for k in state_dict if k.startswith(prefix) and k not in expected)

    def _load_tier(self, name: str, key: str, src, error_msgs: list) -> None:
        """Return tiered table `name` to the commit a checkpoint names (``[store uid, generation]``)."""
        error = self._tiers[self._table_loc[name][0]].restore_commit(key, src, f"table {name!r}")
        if error is not None:
            error_msgs.append(error)

    def _load_table(self, g: int, start: int, src: torch.Tensor) -> None:
        """Copy a full table (rows ``start..`` of group `g`) into the storage this rank holds."""
        weight = getattr(self, self._group_param_names[g])
        first, last = start, start + src.shape[0]  # the table's rows in the group's numbering
        if self._sharding is not None:  # a full table loads into any number of shards: keep ours
            rows = self._sharding[g]
            first, last = max(first, rows.start), min(last, rows.stop)
            if first >= last:
                return
        offset = self._sharding[g].start if self._sharding is not None else 0
        with torch.no_grad():
            weight[first - offset:last - offset].copy_(src[first - start:last - start])

    def extra_repr(self) -> str:
        tabs = ", ".join(f"{t.name}:{t.num_embeddings}x{t.embedding_dim}/{t.pooling}"
                         + (f"/disk({t.tier.cache_rows} cached)" if t.tier is not None else "") for t in self.tables)
        return f"tables=[{tabs}], features={self.num_features}, sparse={self.sparse}"
