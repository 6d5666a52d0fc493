"""The recommended optimizer of a model: `default_optimizer`.

Three kinds of parameters want three optimizers:

* embedding tables (sparse COO gradients, a few rows touched per step): a row-sparse
  optimizer, [`RowWiseAdagrad`][recstream.optim.rowwise_adagrad.RowWiseAdagrad] (default: one accumulator per row, the
  least memory) or [`LazyAdam`][recstream.optim.lazy_adam.LazyAdam]; the
  [`HashEmbedding`][recstream.nn.hash_embedding.HashEmbedding] rows of ``dynamic=True`` features too (both optimizers,
  and FTRL, zero the state of a row the table hands to a new key, via ``pop_reset_rows``);
* the wide part of [`WideDeep`][recstream.models.wide_deep.WideDeep]: [`FTRL`][recstream.optim.ftrl.FTRL]
  (per-coordinate rates, L1 keeps rare ids at exactly zero), as in the paper;
* everything else (MLPs, cross layers, biases): ``torch.optim.Adam`` (its fused kernel where torch has one: CPU, CUDA).

They are driven as one ``torch.optim.Optimizer`` by a
[`CombinedOptimizer`][recstream.optim.combined.CombinedOptimizer] (children ``"wide"``, ``"embedding"``,
``"dense"``; a child with no parameter is left out), usable as ``Model(optimizer=...)``
and by LR schedulers.

>>> from recstream.data import CategoricalFeature, Schema
>>> from recstream.models import WideDeep
>>> net = WideDeep(Schema(["x"], [CategoricalFeature("c", vocab_size=5)]), hidden=(8,))
>>> sorted(default_optimizer(net).optimizers)
['dense', 'embedding', 'wide']
"""
from __future__ import annotations

import functools

import torch
from torch import nn

from ..optim import FTRL, CombinedOptimizer, LazyAdam, RowWiseAdagrad, split_sparse_dense
from ..validation import check_choice, check_module, check_number
from .linear import LinearTerm

EMBEDDING_OPTIMIZERS = ("lazy_adam", "rowwise_adagrad")
WIDE_OPTIMIZERS = ("ftrl", "same")
# RowWiseAdagrad's step is lr / sqrt(accumulated mean g^2): it needs a much larger lr than Adam.
# 0.05, measured both ways. Offline (benchmarks/bench_boost.py's workload: 26 fields x 100,000 ids, 2^20
# rows, one epoch, test AUC; CPU and an H200 agree): DeepFM 0.7602 at 0.05 against 0.7355 at 0.1, WideDeep
# 0.7764 / 0.7763. Online (benchmarks/bench_anchors.py, one step per batch of 256) 0.1 gained +0.0002 to
# +0.0022 prequential AUC over 0.05 in all four cases (WideDeep and DeepFM on DriftingCTR and ColdStartCTR)
# and 0.2 lost in all four: an online run may pass embedding_lr=0.1; a default must not cost 0.025 offline.
_DEFAULT_EMBEDDING_LR = {"lazy_adam": None, "rowwise_adagrad": 0.05}
# FTRL's starting accumulator for the wide part: 1e-6, not FTRL's (TF's) 0.1. With a batch-mean loss a
# rare id's (or cross's) gradient is ~1/batch_size, so a 0.1 start dominates sqrt(n) and its first steps
# are ~alpha * g / 0.32: measured, user x genre cross weights stayed below 0.0023 (row-wise Adagrad's, the
# same run: up to 0.31). Online, WideDeep, tables lr 0.1, one step per batch of 256 (bench_anchors
# streams): 0.1 / 1e-2 / 1e-4 / 1e-6 gave DriftingCTR 0.7216 / 0.7217 / 0.7218 / 0.7219 (with its crosses
# 0.7215 / 0.7217 / 0.7220 / 0.7220) and ColdStartCTR 0.7082 / 0.7083 / 0.7084 / 0.7085 (with its crosses
# 0.7128 / 0.7171 / 0.7231 / 0.7241).
_WIDE_INITIAL_ACCUMULATOR = 1e-6
# RowWiseAdagrad's starting accumulator for the tables: 1e-6, not 0. From 0 a fresh row's first step is
# ~lr whatever its gradient (the step is normalised by that gradient alone): a new id's first, noisiest
# gradient moves its row fully. With a batch-mean loss a row's gradient is ~1/batch_size: 1e-6 is below
# most rows' own sums after training (DeepFM with crosses, ColdStartCTR, seed
# 0, from 0: users' rows end at 2.1e-6 / 7.7e-6 / 2.2e-5, 10/50/90%; items' 4.0e-5 median): first steps
# scale with the gradient, later ones barely change. Measured (docs/online.md "Cold start for unseen
# ids"; bench_anchors streams, seeds 0 and 1; WideDeep and DeepFM, with and without crosses, tables lr
# 0.05 and 0.1): prequential AUC +0.0002 to +0.0024 in 15 of 16 cases, -0.0001 in one (DeepFM, tables lr
# 0.05, no crosses, ColdStartCTR seed 1: 0.70598 -> 0.70583); offline (bench_boost's data, 2^18 rows, one
# epoch, test AUC) DeepFM 0.7507 -> 0.7674, WideDeep 0.7711 -> 0.7727. 1e-5 is already mixed, 1e-4 and
# above damp every row's whole life (the sums above) and lost everywhere, 0.1 by 0.04 to 0.16.
_EMBEDDING_INITIAL_ACCUMULATOR = 1e-6


def default_optimizer(model: nn.Module, *, lr: float = 1e-3, embedding: str = "rowwise_adagrad",
                      embedding_lr: float | None = None, embedding_initial_accumulator: float | None = None,
                      wide: str = "ftrl", wide_lr: float = 0.05,
                      wide_l1: float = 0.0, wide_l2: float = 0.0, weight_decay: float = 0.0) -> CombinedOptimizer:
    """A [`CombinedOptimizer`][recstream.optim.combined.CombinedOptimizer] for `model` (see the module doc).

    Args:
        model: any module; sparse-gradient parameters are found by
            `recstream.optim.split_sparse_dense`.
        lr: Adam learning rate of the dense parameters.
        embedding: "rowwise_adagrad" (default) or "lazy_adam", for the embedding tables. Chosen by
            ``benchmarks/defaults_experiment.py``: online (DeepFM on a drifting stream with dynamic
            tables, prequential AUC) row-wise Adagrad reached 0.737 at every dense lr tried
            (1e-3 .. 1e-2) against LazyAdam's 0.710 at lr 1e-3 and 0.731 at 1e-2; offline (WideDeep
            on Adult, 3 epochs) both reached a test AUC of 0.912-0.913. And it keeps 4 bytes of
            state per row instead of 2 floats per value.
        embedding_lr: their learning rate; None: ``lr`` for LazyAdam, 0.05 for RowWiseAdagrad (0.1
            learns a live stream slightly better, docs/benchmarks.md "Anchors", but cost DeepFM 0.025
            test AUC offline).
        embedding_initial_accumulator: RowWiseAdagrad's starting accumulator per row (>= 0), also the
            value a reused hash-table row is reset to; None: 1e-6. From 0 a fresh row's first step
            moves it by about ``embedding_lr`` whatever its gradient's size; from 1e-6 (below most
            rows' own sums after training, with batches of 256) a small first gradient takes a
            proportionally smaller step. Measured better online and offline (docs/online.md "Cold
            start for unseen ids"); 1e-4 and above slow every row and cost AUC. Only with
            ``embedding="rowwise_adagrad"``: LazyAdam has no accumulator.
        wide: "ftrl" trains a ``model.wide`` `LinearTerm` (WideDeep) with FTRL;
            "same" trains it like the rest (tables with ``embedding``, weights with Adam).
        wide_lr: FTRL's alpha (paper convention). FTRL starts its accumulators at 1e-6 here (FTRL's
            own default is 0.1): measured online, rare ids and crosses learn (docs/benchmarks.md "Anchors").
        wide_l1: FTRL's L1 strength.
        wide_l2: FTRL's L2 strength.
        weight_decay: Adam's (coupled L2) weight decay on the dense parameters.
    """
    owner = "default_optimizer"
    check_module(owner, "model", model)
    lr = check_number(owner, "lr", lr, minimum=0.0)
    check_choice(owner, "embedding", embedding, EMBEDDING_OPTIMIZERS)
    check_choice(owner, "wide", wide, WIDE_OPTIMIZERS)
    if embedding_lr is None:
        embedding_lr = _DEFAULT_EMBEDDING_LR[embedding] or lr
    embedding_lr = check_number(owner, "embedding_lr", embedding_lr, minimum=0.0)
    if embedding_initial_accumulator is not None and embedding != "rowwise_adagrad":
        raise ValueError(f"{owner}: embedding_initial_accumulator={embedding_initial_accumulator!r} needs "
                         f"embedding='rowwise_adagrad' (got embedding={embedding!r}: LazyAdam has no accumulator)")
    if embedding_initial_accumulator is None:
        embedding_initial_accumulator = _EMBEDDING_INITIAL_ACCUMULATOR
    embedding_initial_accumulator = check_number(owner, "embedding_initial_accumulator",
                                                 embedding_initial_accumulator, minimum=0.0)
    wide_lr = check_number(owner, "wide_lr", wide_lr, minimum=0.0, min_open=True)  # FTRL divides by it
    wide_l1 = check_number(owner, "wide_l1", wide_l1, minimum=0.0)
    wide_l2 = check_number(owner, "wide_l2", wide_l2, minimum=0.0)
    weight_decay = check_number(owner, "weight_decay", weight_decay, minimum=0.0)

    wide_part = getattr(model, "wide", None)
    wide_params: list[nn.Parameter] = []
    if wide == "ftrl" and isinstance(wide_part, LinearTerm):
        wide_params = [p for p in wide_part.parameters() if p.requires_grad]
    taken = {id(p) for p in wide_params}
    sparse, dense = split_sparse_dense(model)
    sparse = [p for p in sparse if id(p) not in taken]
    dense = [p for p in dense if id(p) not in taken]
    if not (wide_params or sparse or dense):
        raise ValueError(f"{owner}: model {type(model).__name__} has no parameter with requires_grad")

    children: dict[str, torch.optim.Optimizer] = {}
    if wide_params:
        children["wide"] = FTRL(wide_params, lr=wide_lr, l1=wide_l1, l2=wide_l2,
                                initial_accumulator_value=_WIDE_INITIAL_ACCUMULATOR)
    if sparse:
        if embedding == "lazy_adam":
            children["embedding"] = LazyAdam(sparse, lr=embedding_lr)
        else:
            children["embedding"] = RowWiseAdagrad(sparse, lr=embedding_lr,
                                                   initial_accumulator_value=embedding_initial_accumulator)
    if dense:
        # torch's fused Adam kernel: one pass over all the dense parameters instead of a chain of ops
        # per tensor (CPU step of WideDeep/DLRM with a (256, 128) MLP: 6-10% less; on CUDA fewer
        # launches). Same update up to float rounding; where it has no kernel, the default Adam.
        fused = all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in dense) or None
        children["dense"] = adam = torch.optim.Adam(dense, lr=lr, weight_decay=weight_decay, fused=fused)
        # load_state_dict copies the saved groups' flags back: a state saved unfused (before this
        # default, or elsewhere) would otherwise turn the kernel off for good.
        adam.register_load_state_dict_post_hook(functools.partial(_set_fused, fused=fused))
    return CombinedOptimizer(children)


def _set_fused(optimizer: torch.optim.Optimizer, fused: bool | None) -> None:
    for group in optimizer.param_groups:
        group["fused"] = fused
