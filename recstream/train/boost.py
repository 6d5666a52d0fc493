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
- ``fused_tables``: the sparse tables of one Adam/AdamW param group (same dtype, device and row
  width) kept in one storage, each table's weight and moments a view of it
  (`recstream.optim.FusedTables`): one coalesce and one lazy-Adam update per step for all of them,
  as a hand-written single table gets, instead of a dozen small ops per table. What is stored is
  unchanged (each table keeps its own ``Parameter``, keys and shapes). Skipped with several
  processes and for SGD/Adagrad (they step each table natively).
- ``fused_optimizer``: Adam/AdamW's dense parameters stepped by torch's fused kernel (one pass over
  the memory instead of one per operation).
- ``cuda_graphs``: on a GPU, the whole training step (forward, backward, optimizer) captured once
  and replayed (`recstream.train.cuda_graph`): a CTR step is dozens of tiny kernels whose launches
  cost more than their work. Skipped on CPU, with several processes, sharded dynamic (hash) tables,
  optimizers other than SGD/Adam/AdamW and recstream's row-sparse ones, loss scaling with an
  optimizer that skips an overflowing step only after a host read (unfused torch ones; a fused
  Adam/AdamW skips it on the device, the rows ``sparse_embeddings`` updates lazily included), or
  sparse gradients for an optimizer that coalesces them. recstream's own models (`recstream.models`) on a
  GPU get it at every level, O0 included (``{"cuda_graphs": False}`` turns it off).

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
(True, ['sparse_embeddings', 'fused_tables', 'lazy_weight_decay', 'fused_optimizer', 'bf16_autocast', 'cuda_graphs'])
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch
from torch import nn

from ..distributed import is_distributed
from ..optim import CombinedOptimizer, SparseRowOptimizer
from ..optim.sparse_rows import accept_sparse_rows, sparse_rows_refusal, weight_decay_of
from ..validation import check_bool, check_type
from . import amp
from .cuda_graph import WARMUP_STEPS, capture_refusal, make_capturable

log = logging.getLogger(__name__)

ACCELERATIONS = ("sparse_embeddings", "fused_tables", "fused_optimizer", "cuda_graphs", "lazy_weight_decay",
                 "bf16_autocast")
# On a GPU a dense (fused) Adam pass over a table is bandwidth-bound and cheap (100k x 16 values:
# ~15 us on an H100), while a row-sparse update costs a dozen small kernel launches per table
# (~170 us measured there with 26 tables): sparse pays only from about 2**24 values per table,
# when the step runs eagerly (a CUDA graph pays no launches: `_sparse_pays_in_a_graph`).
# On a CPU the dense pass is the expensive one (milliseconds per 100k-row table), so every table goes sparse.
CUDA_SPARSE_MIN_VALUES = 1 << 24
LEVELS = {"O0": (), "O1": ("sparse_embeddings", "fused_tables", "fused_optimizer", "cuda_graphs"), "O2": ACCELERATIONS}


@dataclass
class BoostReport:
    """What `apply_boost` did: one line per acceleration, and what the step plan must apply."""

    lines: list[str] = field(default_factory=list)
    bf16_autocast: bool = False  # the step computes at amp "O1" in bfloat16 (the user's amp_level was "O0")
    graph_optimizers: list | None = None  # set when the step is to be replayed as a CUDA graph

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


def apply_boost(network: nn.Module, optimizer, level: str, config: dict | None, amp_level: str,
                loss_scaled: bool = False) -> BoostReport:
    """Apply `level`'s accelerations (as switched by `config`) to `network` and `optimizer` in place.

    `amp_level` is the level the user asked for (``bf16_autocast`` applies only to "O0");
    `loss_scaled` whether the step scales its loss (a loss-scale manager, or amp "O2"), which rules
    out CUDA graphs unless every optimizer skips an overflowing step on the device. The precision
    itself is resolved by `recstream.train.plan`, once.
    """
    config = check_boost_config(config)
    wanted = {name: config.get(name, name in LEVELS[level]) for name in ACCELERATIONS}
    wanted["cuda_graphs"] = config.get("cuda_graphs", wanted["cuda_graphs"] or _graphs_by_default(network))
    report = BoostReport()
    if level == "O0" and not any(wanted.values()):
        return report
    if optimizer is None:
        for name in ACCELERATIONS:
            report.note(name, False, "no optimizer: the network is its own training step")
        return report
    forced = config.get("sparse_embeddings", False) or _sparse_pays_in_a_graph(network, optimizer, wanted, loss_scaled)
    _sparse_embeddings(network, optimizer, wanted, report, forced=forced)
    _fused_optimizer(optimizer, wanted["fused_optimizer"], report)
    _bf16_autocast(network, wanted["bf16_autocast"], report, amp_level)
    _cuda_graphs(network, optimizer, wanted["cuda_graphs"], report, loss_scaled)
    return report


def _sparse_embeddings(network: nn.Module, optimizer, wanted: dict[str, bool], report: BoostReport,
                       forced: bool) -> None:
    if not wanted["sparse_embeddings"]:
        report.note("sparse_embeddings", False, "switched off")
        for name in ("fused_tables", "lazy_weight_decay"):
            report.note(name, False, "needs sparse_embeddings")
        return
    if is_distributed() and "gloo" not in torch.distributed.get_backend():
        report.note("sparse_embeddings", False, f"the {torch.distributed.get_backend()} backend cannot all-reduce "
                                                "sparse gradients")
        for name in ("fused_tables", "lazy_weight_decay"):
            report.note(name, False, "needs sparse_embeddings")
        return
    uses: dict[int, int] = {}
    for _, p in network.named_parameters(remove_duplicate=False):
        uses[id(p)] = uses.get(id(p), 0) + 1
    done, skipped, decayed, tables = [], [], [], []
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
        tables.append(module.weight)
        done.append(name or "network")
    # Several processes: DDP's gradient hooks and buckets are set up per parameter; views of one
    # storage are not a case it is built or tested for.
    fuse = wanted["fused_tables"] and not is_distributed()
    # One set of step hooks for all the tables (per-table hooks would each walk every param group).
    fused = accept_sparse_rows(optimizer, tables, fuse=fuse).fused
    if not done and not skipped:
        report.note("sparse_embeddings", False, "no dense nn.Embedding / nn.EmbeddingBag in the network")
    else:
        detail = f"{len(done)} of {len(done) + len(skipped)} tables" + "".join(f"; skipped {s}" for s in skipped)
        report.note("sparse_embeddings", bool(done), detail)
    _note_fused_tables(report, wanted["fused_tables"], fused)
    report.note("lazy_weight_decay", bool(decayed),
                f"tables {decayed}" if decayed else "no sparse table has weight decay" if wanted["lazy_weight_decay"]
                else "switched off (level O2 turns it on)")


def _note_fused_tables(report: BoostReport, wanted: bool, fused: list) -> None:
    if fused:
        sizes = ", ".join(str(len(f.params)) for f in fused)
        report.note("fused_tables", True, f"{sum(len(f.params) for f in fused)} tables in {len(fused)} "
                                          f"storage(s) of {sizes}")
    else:
        report.note("fused_tables", False, "switched off" if not wanted else "several processes" if is_distributed()
                    else "no two sparse tables share an Adam/AdamW param group, dtype, device and row width "
                         "(SGD and Adagrad step each table themselves)")


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
        pin_flags(opt, {"fused": True})
        for g in opt.param_groups:
            g["fused"] = True  # read by Adam at every step(); the state it creates then lives on the device
        opt.defaults["fused"] = True
        # What Adam(fused=True) declares: its step takes a loss-scaled step's found_inf / grad_scale
        # (the rows its lazy hooks update too), so loss scaling skips an overflow with no host read.
        opt._step_supports_amp_scaling = True
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


def _bf16_autocast(network: nn.Module, wanted: bool, report: BoostReport, amp_level: str) -> None:
    name = "bf16_autocast"
    if not wanted:
        report.note(name, False, "switched off (level O2 turns it on)")
        return
    if amp_level != "O0":
        report.note(name, False, f"amp_level={amp_level!r} was chosen explicitly")
        return
    device = next((t.device for t in network.parameters()), torch.device("cpu"))
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        native = "CUDA bf16"
    elif device.type == "cpu" and amp.cpu_has_native_bf16():
        native = "CPU with AVX512-BF16/AMX"
    else:
        report.note(name, False, f"no native bf16 on {device.type}: the casts would cost more than they save")
        return
    report.bf16_autocast = True
    report.note(name, True, f"amp_level='O1' in bfloat16 ({native})")


def _sparse_pays_in_a_graph(network: nn.Module, optimizer, wanted: dict[str, bool], loss_scaled: bool) -> bool:
    """Whether the step will be a CUDA graph with Adam/AdamW alone, so that small tables go
    row-sparse too: `CUDA_SPARSE_MIN_VALUES` weighs the sparse update's launches, which a replayed
    graph does not pay (measured on an H200, 26 tables of 100,000 x 16, batch 4,096: a step of
    4.99 ms with dense tables, 2.22 ms with sparse fused ones). SGD/Adagrad coalesce sparse
    gradients, which no graph can hold: for them the cost rule stands. Under loss scaling the graph
    needs fused Adams (they and their lazy rows skip an overflow on the device)."""
    if not (wanted["cuda_graphs"] and wanted["sparse_embeddings"]) or is_distributed():
        return False
    leaves = _leaf_optimizers(optimizer)
    adams = all(isinstance(opt, (torch.optim.Adam, torch.optim.AdamW)) for opt in leaves)
    if loss_scaled and not all(getattr(opt, "_step_supports_amp_scaling", False)
                               or (wanted["fused_optimizer"] and _fuse_refusal(opt) is None) for opt in leaves):
        return False
    return adams and any(p.is_cuda for p in network.parameters())


def _graphs_by_default(network: nn.Module) -> bool:
    """Whether `network` is one of recstream's models on a GPU: their steps are made to be captured
    (static shapes, no host reads), so they replay as a CUDA graph at every level, O0 included."""
    on_cuda = any(p.is_cuda for p in network.parameters())
    return on_cuda and type(network).__module__.startswith("recstream.models.")


def _cuda_graphs(network: nn.Module, optimizer, wanted: bool, report: BoostReport, loss_scaled: bool) -> None:
    name = "cuda_graphs"
    if not wanted:
        report.note(name, False, "switched off")
        return
    device = next((t.device for t in network.parameters()), torch.device("cpu"))
    optimizers = _leaf_optimizers(optimizer)
    why = capture_refusal(network, optimizers, device, is_distributed(), loss_scaled)
    if why:
        report.note(name, False, why)
        return
    for opt in optimizers:
        if isinstance(opt, (torch.optim.Adam, torch.optim.AdamW, SparseRowOptimizer)):
            pin_flags(opt, {"capturable": True})  # a checkpoint load keeps the step capturable
    make_capturable(optimizers, device)
    report.graph_optimizers = optimizers
    report.note(name, True, f"the training step is captured after {WARMUP_STEPS} eager steps and replayed")


def pin_flags(optimizer, flags: dict[str, bool]) -> None:
    """Keep boost's optimizer flags out of its checkpoints and in force after a load (call it
    before setting them).

    A checkpoint stores the optimizer as the user built it (the flags as they were, learning rates
    as floats), so it loads at any boost level; `load_state_dict` copies the saved groups' flags
    back, so they are set again after it (with device step counters and tensor learning rates
    where the optimizer is capturable).
    """
    pinned = getattr(optimizer, "_recstream_pinned_flags", None)
    if pinned is None:
        pinned = optimizer._recstream_pinned_flags = {}
        originals = [{} for _ in optimizer.param_groups]
        optimizer._recstream_original_flags = originals
        optimizer.register_state_dict_post_hook(_portable_state_dict)
        optimizer.register_load_state_dict_post_hook(_reapply_flags)
    for group, originals in zip(optimizer.param_groups, optimizer._recstream_original_flags, strict=True):
        for key in flags:  # called before boost sets them: these are the user's values
            originals.setdefault(key, group.get(key))
    pinned.update(flags)


def _portable_state_dict(optimizer, state_dict: dict) -> dict:
    for group, originals in zip(state_dict["param_groups"], optimizer._recstream_original_flags, strict=True):
        group.update(originals)
        if isinstance(group.get("lr"), torch.Tensor):
            group["lr"] = float(group["lr"])  # one read per checkpoint, not per step
    for key, entry in state_dict["state"].items():
        if isinstance(entry.get("step"), torch.Tensor) and entry["step"].device.type != "cpu":
            # Where the unfused, uncapturable optimizer keeps it; in a copy of the entry, which is
            # the live state's dict (moving the live counter off the device would break the next step).
            state_dict["state"][key] = {**entry, "step": entry["step"].cpu()}
    return state_dict


def _reapply_flags(optimizer) -> None:
    flags = optimizer._recstream_pinned_flags
    for group in optimizer.param_groups:
        group.update(flags)
        if flags.get("capturable"):
            device = group["params"][0].device
            if not isinstance(group["lr"], torch.Tensor):
                group["lr"] = torch.tensor(float(group["lr"]), device=device)
            for p in group["params"]:
                state = optimizer.state.get(p)
                if state and isinstance(state.get("step"), torch.Tensor):
                    state["step"] = state["step"].to(device)
