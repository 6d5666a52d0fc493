"""``boost_level``: named accelerations that `Model` applies to the user's own network and optimizer.

Boost changes *how* a step runs, never *what* is stored: the module tree, ``state_dict`` keys and
the optimizer's state format stay the user's, so a checkpoint written at one level loads at any
other. Each acceleration is switchable by name in ``boost_config_dict`` (``{"fused_optimizer":
False}``) and is logged once (logger ``recstream.train.boost``, INFO) as applied or skipped, with
the reason; `Model.boost_report` holds the same lines.

Level "O1" (same maths, up to floating-point rounding and the lazy moments noted below):

- ``sparse_embeddings``: the network's ``nn.Embedding`` / ``nn.EmbeddingBag`` modules emit
  row-sparse gradients, and the optimizer updates only the rows a batch touched
  (`recstream.optim.sparse_rows`: SGD and Adagrad exactly; Adam/AdamW lazily, untouched rows keep
  their moments). A dense optimizer otherwise reads and writes every row of every table each step:
  this is where a user's idiomatic CTR network loses most of its time. Skipped per table when its
  weight is shared with another module, for ``mode="max"`` bags, and when the optimizer cannot take
  sparse rows (the log says why).
- ``fused_optimizer``: Adam/AdamW's dense parameters stepped by torch's fused kernel (one pass over
  the memory instead of one per operation).

Level "O2" = O1 plus approximations:

- ``lazy_weight_decay``: tables whose optimizer has weight decay become sparse anyway, decaying
  only the rows a step touches.
- ``bf16_autocast``: ``amp_level="O1"`` in bfloat16 when the hardware computes it natively
  (CUDA with bf16, a CPU with AVX512-BF16 or AMX); skipped elsewhere (the casts would cost more
  than they save) and when the user chose an ``amp_level`` themselves.

>>> import torch
>>> from torch import nn
>>> net = nn.Sequential(nn.Embedding(100, 8), nn.Flatten(), nn.Linear(16, 1))
>>> opt = torch.optim.Adam(net.parameters())
>>> report = apply_boost(net, opt, "O1", None, amp_level="O0")
>>> net[0].sparse, [line.split(":")[0] for line in report.lines]
(True, ['sparse_embeddings', 'lazy_weight_decay', 'fused_optimizer', 'bf16_autocast'])
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch
from torch import nn

from ..distributed import is_distributed
from ..optim import CombinedOptimizer
from ..optim.sparse_rows import accept_sparse_rows, sparse_rows_refusal, weight_decay_of
from ..validation import check_bool, check_type
from . import amp

log = logging.getLogger(__name__)

ACCELERATIONS = ("sparse_embeddings", "fused_optimizer", "lazy_weight_decay", "bf16_autocast")
# On a GPU a dense (fused) Adam pass over a table is bandwidth-bound and cheap (100k x 16 values:
# ~15 us on an H100), while a row-sparse update costs a dozen small kernel launches per table
# (~170 us measured there with 26 tables): sparse pays only from about 2**24 values per table.
# On a CPU the dense pass is the expensive one (milliseconds per 100k-row table), so every table goes sparse.
CUDA_SPARSE_MIN_VALUES = 1 << 24
LEVELS = {"O0": (), "O1": ("sparse_embeddings", "fused_optimizer"), "O2": ACCELERATIONS}


@dataclass
class BoostReport:
    """What `apply_boost` did: one line per acceleration, and the precision `Model` must use."""

    lines: list[str] = field(default_factory=list)
    amp_level: str = "O0"
    amp_dtype: torch.dtype | None = None

    def note(self, name: str, applied: bool, detail: str) -> None:
        line = f"{name}: {'applied' if applied else 'skipped'} ({detail})"
        self.lines.append(line)
        log.info("boost %s", line)


def check_boost_config(config) -> dict[str, bool]:
    """``boost_config_dict`` validated: acceleration name -> bool (missing names: the level decides)."""
    check_type("Model", "boost_config_dict", config, dict, allow_none=True, allowed="a dict name -> bool")
    for name, on in (config or {}).items():
        if name not in ACCELERATIONS:
            raise ValueError(f"Model: 'boost_config_dict' has unknown acceleration {name!r}; "
                             f"allowed: {', '.join(ACCELERATIONS)}")
        check_bool("Model", f"boost_config_dict[{name!r}]", on)
    return dict(config or {})


def apply_boost(network: nn.Module, optimizer, level: str, config: dict | None, amp_level: str) -> BoostReport:
    """Apply `level`'s accelerations (as switched by `config`) to `network` and `optimizer` in place."""
    config = check_boost_config(config)
    wanted = {name: config.get(name, name in LEVELS[level]) for name in ACCELERATIONS}
    report = BoostReport(amp_level=amp_level)
    if level == "O0" and not any(wanted.values()):
        return report
    if optimizer is None:
        for name in ACCELERATIONS:
            report.note(name, False, "no optimizer: the network is its own training step")
        return report
    _sparse_embeddings(network, optimizer, wanted, report, forced=config.get("sparse_embeddings", False))
    _fused_optimizer(optimizer, wanted["fused_optimizer"], report)
    _bf16_autocast(network, wanted["bf16_autocast"], report)
    return report


def _sparse_embeddings(network: nn.Module, optimizer, wanted: dict[str, bool], report: BoostReport,
                       forced: bool) -> None:
    if not wanted["sparse_embeddings"]:
        report.note("sparse_embeddings", False, "switched off")
        report.note("lazy_weight_decay", False, "needs sparse_embeddings")
        return
    if is_distributed() and "gloo" not in torch.distributed.get_backend():
        report.note("sparse_embeddings", False, f"the {torch.distributed.get_backend()} backend cannot all-reduce "
                                                "sparse gradients")
        report.note("lazy_weight_decay", False, "needs sparse_embeddings")
        return
    uses: dict[int, int] = {}
    for _, p in network.named_parameters(remove_duplicate=False):
        uses[id(p)] = uses.get(id(p), 0) + 1
    done, skipped, decayed = [], [], []
    for name, module in network.named_modules():
        if not isinstance(module, (nn.Embedding, nn.EmbeddingBag)) or module.sparse:
            continue
        why = _table_refusal(module, uses, optimizer, wanted["lazy_weight_decay"], forced)
        if why:
            skipped.append(f"{name or 'network'}: {why}")
            continue
        if weight_decay_of(optimizer, module.weight):
            decayed.append(name or "network")
        module.sparse = True
        accept_sparse_rows(optimizer, [module.weight])
        done.append(name or "network")
    if not done and not skipped:
        report.note("sparse_embeddings", False, "no dense nn.Embedding / nn.EmbeddingBag in the network")
    else:
        detail = f"{len(done)} of {len(done) + len(skipped)} tables" + "".join(f"; skipped {s}" for s in skipped)
        report.note("sparse_embeddings", bool(done), detail)
    report.note("lazy_weight_decay", bool(decayed),
                f"tables {decayed}" if decayed else "no sparse table has weight decay" if wanted["lazy_weight_decay"]
                else "switched off (level O2 turns it on)")


def _table_refusal(module: nn.Module, uses: dict[int, int], optimizer, lazy_weight_decay: bool,
                   forced: bool) -> str | None:
    """Why this table stays dense, or None. `forced` (sparse_embeddings=True in the config) overrides
    the cost rule, not correctness."""
    weight = module.weight
    if not weight.requires_grad:
        return "frozen"
    if uses.get(id(weight), 0) > 1:
        return "its weight is shared with another module (tied weights get dense gradients there)"
    if isinstance(module, nn.EmbeddingBag) and module.mode == "max":
        return "mode='max' has no sparse gradient"
    if weight.is_cuda and weight.numel() < CUDA_SPARSE_MIN_VALUES and not forced:
        return (f"on CUDA a dense fused update of {weight.numel():,} values is cheaper than a row-sparse one "
                f"(below {CUDA_SPARSE_MIN_VALUES:,}; "
                f"boost_config_dict={{'sparse_embeddings': True}} forces it)")
    return sparse_rows_refusal(optimizer, [weight], lazy_weight_decay=lazy_weight_decay)


def _fused_optimizer(optimizer, wanted: bool, report: BoostReport) -> None:
    name = "fused_optimizer"
    if not wanted:
        report.note(name, False, "switched off")
        return
    adams = [opt for opt in _leaf_optimizers(optimizer) if isinstance(opt, (torch.optim.Adam, torch.optim.AdamW))]
    if not adams:
        report.note(name, False, f"{type(optimizer).__name__} is not (and holds no) torch.optim.Adam/AdamW")
        return
    done, why = [], []
    for opt in adams:
        refusal = _fuse_refusal(opt)
        if refusal:
            why.append(refusal)
            continue
        for g in opt.param_groups:
            g["fused"] = True  # read by Adam at every step(); the state it creates then lives on the device
        opt.defaults["fused"] = True
        done.append(f"{type(opt).__name__} over {sum(len(g['params']) for g in opt.param_groups)} parameters")
    report.note(name, bool(done), "; ".join(done + [f"skipped: {w}" for w in why]))


def _leaf_optimizers(optimizer) -> list:
    if isinstance(optimizer, CombinedOptimizer):
        return [leaf for child in optimizer.optimizers.values() for leaf in _leaf_optimizers(child)]
    return [optimizer]


def _fuse_refusal(opt) -> str | None:
    if any(opt.state.values()):
        return "the optimizer holds state already (its step counters live where the unfused kernel put them)"
    groups = opt.param_groups
    if any(g.get("fused") for g in groups):
        return "already fused"
    blocked = [flag for g in groups for flag in ("differentiable", "foreach") if g.get(flag)]
    if blocked:
        return f"the optimizer sets {blocked[0]}=True"
    if not all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for g in groups for p in g["params"]):
        return "fused kernels need floating-point parameters on CPU or CUDA"
    return None


def _bf16_autocast(network: nn.Module, wanted: bool, report: BoostReport) -> None:
    name = "bf16_autocast"
    if not wanted:
        report.note(name, False, "switched off (level O2 turns it on)")
        return
    if report.amp_level != "O0":
        report.note(name, False, f"amp_level={report.amp_level!r} was chosen explicitly")
        return
    device = next((t.device for t in network.parameters()), torch.device("cpu"))
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        native = "CUDA bf16"
    elif device.type == "cpu" and amp.cpu_has_native_bf16():
        native = "CPU with AVX512-BF16/AMX"
    else:
        report.note(name, False, f"no native bf16 on {device.type}: the casts would cost more than they save")
        return
    report.amp_level, report.amp_dtype = "O1", torch.bfloat16
    report.note(name, True, f"amp_level='O1' in bfloat16 ({native})")
