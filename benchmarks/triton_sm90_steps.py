"""The device-path steps `triton_sm90` records the Triton launches of: the project's real launch
sites, on small CPU tensors in Triton's interpreter (``TRITON_INTERPRET=1``, set by the caller
before triton is imported). Each function reaches its kernels through the public path a GPU step
takes (`HashEmbedding` on ``table_backend="triton"``, `Model.train`, the optimizers' ``step``), so
the arguments recorded are the ones a GPU launch gets: dtypes, views (their alignment), scalars,
constexprs.
"""
from __future__ import annotations

import torch

from benchmarks import dynamic_ops  # the dynamic model tests' batches (one copy)
from recstream.hostpath import device_path
from recstream.nn import HashEmbedding
from recstream.optim import FTRL, LazyAdam, RowWiseAdagrad, triton_rows


def _keys(steps: int, batch: int, span: int, seed: int, offset: int = 2 ** 40) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(-span, span, (batch, 3), generator=g) * 7919 + offset for _ in range(steps)]


def _churn(steps: int, seed: int = 3) -> list[torch.Tensor]:
    """Far more distinct keys than rows: LRU passes leave tombstones until the table is rebuilt."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 400, (16, 2), generator=g) * 7919 + 11 for _ in range(steps)]


def _train_table(emb: HashEmbedding, stream: list[torch.Tensor]) -> None:
    emb.table_backend = "triton"
    opt = LazyAdam([emb.values], lr=0.05)
    for keys in stream:
        with device_path(), triton_rows.interpreted():
            out = emb(keys)
            out.sum().backward()
            opt.step()
            opt.zero_grad()


def hash_tables() -> None:
    """Admission with and without a threshold, LRU passes, pending keys over budget dropped, age
    eviction, rebuilds, every ``param_init`` (the carry-out's three init modes), int64 and int32
    keys, several widths (the carry-out's DIM block), then an eval read."""
    for key_dtype in (torch.int64, torch.int32):
        for permit, capacity, evict, init, dim, pending in [
                (1, 512, None, "ones", 4, None), (3, 512, 2, "normal", 8, None), (1, 48, None, "uniform", 16, None),
                (2, 40, 2, "zeros", 1, None), (1, 256, None, "normal", 100, None), (3, 64, None, "ones", 4, 8)]:
            torch.manual_seed(0)
            emb = HashEmbedding(dim, key_dtype=key_dtype, capacity=capacity, permit_filter_value=permit,
                                evict_filter_value=evict, param_init=init,
                                **({} if pending is None else {"pending_capacity": pending}))
            offset = 2 ** 40 if key_dtype == torch.int64 else 2 ** 20  # int32 keys fit in int32
            _train_table(emb, _keys(3, 16, 40, seed=capacity + permit, offset=offset))
        for evict in (None, 1):  # rebuilds, without and with age eviction
            emb = HashEmbedding(4, key_dtype=key_dtype, capacity=40, param_init="ones", evict_filter_value=evict)
            _train_table(emb, _churn(5))
        emb.eval()
        with device_path(), torch.no_grad():
            emb(torch.tensor([5, 2 ** 20]))


def large_batch(keys: int = 16_384) -> None:
    """One training lookup of `keys` distinct keys (a GPU-sized batch): the kernels' programs in the
    hundreds, so the per-program count sums take their wider blocks (``PBLOCK`` 64 and 128)."""
    emb = HashEmbedding(16, capacity=2 * keys)
    emb.table_backend = "triton"
    with device_path(), torch.no_grad():
        emb(torch.randperm(4 * keys, generator=torch.Generator().manual_seed(0))[:keys] * 7919 + 2 ** 40)


def _dynamic_schema():
    from recstream.data import CategoricalFeature, Schema

    return Schema(["d0", "d1"], [
        CategoricalFeature("item", vocab_size=20, embedding_dim=8),
        CategoricalFeature("user", dynamic=True, capacity=64, embedding_dim=8),
        CategoricalFeature("tags", dynamic=True, capacity=64, multi_hot=True, pooling="mean",
                           embedding_dim=8, permit_filter_value=2),
        CategoricalFeature("genre", vocab_size=5, multi_hot=True, embedding_dim=8),
    ])


def dynamic_models() -> None:
    """Steps of dynamic WideDeep and DeepFM through `Model` with `default_optimizer` (FTRL for the
    wide part, row-wise Adagrad for the tables) and with LazyAdam tables: every table on Triton,
    every row update fused."""
    from torch import nn

    from recstream import Model
    from recstream.models import DeepFM, WideDeep, default_optimizer

    names = tuple(f.name for f in _dynamic_schema().categorical)
    for build in (WideDeep, DeepFM):
        for embedding in ("rowwise_adagrad", "lazy_adam"):
            torch.manual_seed(0)
            net = build(_dynamic_schema(), hidden=(16, 8), embedding_dim=8)
            for m in net.modules():
                if isinstance(m, HashEmbedding):
                    m.table_backend = "triton"
            model = Model(net, nn.BCEWithLogitsLoss(), default_optimizer(net, lr=1e-2, embedding=embedding),
                          progress_bar=False)
            with device_path(), triton_rows.interpreted():
                model.train(1, dynamic_ops._batches(3, names))


def _sparse_grad(w: torch.Tensor, rows: torch.Tensor, step: int) -> torch.Tensor:
    values = torch.full((rows.numel(), *w.shape[1:]), step + 0.5)
    return torch.sparse_coo_tensor(rows.view(1, -1), values, w.shape, check_invariants=False)


def row_optimizers() -> None:
    """The fused row updates of each optimizer: plain and with a ``found_inf`` flag and a device
    learning rate (LazyAdam capturable too), on sparse gradients (duplicate rows) and dense ones,
    of widths 1, 4, 16 and 33 (the kernels' column blocks), 2-d and 1-d parameters."""
    cases = [(LazyAdam, {}), (LazyAdam, {"capturable": True}), (RowWiseAdagrad, {}), (FTRL, {}),
             (FTRL, {"lr_power": -0.3})]
    rows = torch.tensor([1, 3, 1, 6])
    with device_path(), triton_rows.interpreted():
        for cls, flags in cases:
            for shape in [(8, 1), (8, 4), (8, 16), (8, 33), (8,)]:
                for sparse in (True, False):
                    for flagged in (False, True):
                        if len(shape) == 1 and sparse:
                            continue  # a 1-d parameter (a bias) has a dense gradient
                        w = torch.nn.Parameter(torch.linspace(-1, 1, 8 * (shape[1] if len(shape) > 1 else 1))
                                               .view(shape))
                        opt = cls([w], lr=0.1, **{k: v for k, v in flags.items() if k == "lr_power"})
                        if flagged or flags.get("capturable"):
                            opt.param_groups[0].update({k: v for k, v in flags.items() if k == "capturable"},
                                                       lr=torch.tensor(0.1))
                            opt.found_inf = torch.zeros(())
                        for step in range(2):
                            w.grad = _sparse_grad(w, rows, step) if sparse else torch.full_like(w, step + 0.5)
                            opt.step()


def adam_tables() -> None:
    """torch's Adam on row-sparse tables (`accept_sparse_rows`): per table and as one `FusedTables`
    set, plain and capturable with ``found_inf``."""
    from recstream.optim.sparse_rows import accept_sparse_rows

    with device_path(), triton_rows.interpreted():
        for fuse in (False, True):
            for capturable in (False, True):
                torch.manual_seed(0)
                tables = [torch.nn.Embedding(12, 4, sparse=True) for _ in range(3)]
                params = [t.weight for t in tables]
                opt = torch.optim.Adam(params, lr=0.05, capturable=capturable)
                accept_sparse_rows(opt, params, fuse=fuse)
                if capturable:
                    opt.found_inf = torch.zeros(())
                ids = torch.tensor([1, 3, 1, 6, 11])
                for _ in range(2):
                    sum(t(ids).sum() for t in tables).backward()
                    opt.step()
                    opt.zero_grad()


def run_all() -> None:
    hash_tables()
    large_batch()
    dynamic_models()
    row_optimizers()
    adam_tables()
