"""Automatic mixed precision (MindSpore's ``amp_level``) for PyTorch networks.

Levels: "O0" unchanged; "O1" ``torch.autocast`` (its op lists pick the precision per op);
"O2" low-precision compute with fp32 master weights, batch norm in fp32, dynamic loss scale by
default; "O3" the network itself cast to low precision, no loss scale; "auto" per device.
Low precision is bfloat16 on CPU and float16 on CUDA (``dtype="bfloat16"`` asks for bf16 there).

O2 design: parameters stay fp32 in the module (they are the master weights: the optimizer, the
checkpoints and ``state_dict`` see fp32). Each forward runs the network through
``torch.func.functional_call`` with bf16/fp16 copies of the weights, so autograd returns fp32
gradients to the masters, and per-module hooks (present only during that forward) cast each
module's floating inputs to its compute dtype. Batch norm keeps fp32 weights, statistics and
inputs; embedding tables stay fp32 (casting a large table every step would cost more than the
lookup) and their lookups are cast. O3 casts the weights in place (no master copy); the same
wrapper casts the inputs, and outputs go back to fp32 before the loss.

>>> import torch
>>> net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 1))
>>> step = build_train_network(net, torch.optim.SGD(net.parameters(), lr=0.1), torch.nn.MSELoss(),
...                            level="O2", device="cpu")
>>> loss, overflow, scale = step(torch.randn(16, 4), torch.randn(16, 1))
>>> net[0].weight.dtype, loss.dtype, bool(overflow)
(torch.float32, torch.float32, False)
"""
from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from ..nn import EmbeddingBagCollection, HashEmbedding
from ..validation import check_bool, check_callable, check_choice, check_kwargs, check_module, check_type
from .cells import OptimizerLike, TrainOneStepCell, WithEvalCell, WithLossCell
from .loss_scale import DynamicLossScaleManager, LossScaleManager, TrainOneStepWithLossScaleCell

AMP_LEVELS = ("O0", "O1", "O2", "O3", "auto")
_DTYPES = {"float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
           "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}
# A lookup module reads its table as stored under O2: recstream.nn's own tables, torch's, and any class
# marked by `register_lookup_module` (the mark is an attribute of the class, not an entry in a registry).
_LOOKUP_TYPES = (nn.Embedding, nn.EmbeddingBag, EmbeddingBagCollection, HashEmbedding)
_LOOKUP_MARK = "recstream_amp_lookup"


def register_lookup_module(cls: type) -> type:
    """Mark `cls` as a table lookup: under O2 its tables stay as stored (no per-step cast of a
    large table) and only its floating outputs are cast. Works as a class decorator.
    recstream.nn's EmbeddingBagCollection and HashEmbedding are lookups already."""
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise TypeError(f"'cls' must be a torch.nn.Module subclass, got {cls!r}")
    setattr(cls, _LOOKUP_MARK, True)
    return cls


def is_lookup_module(module: nn.Module) -> bool:
    """Whether `module` is a table lookup (see `register_lookup_module`)."""
    return isinstance(module, _LOOKUP_TYPES) or getattr(type(module), _LOOKUP_MARK, False) is True


def check_amp_level(level, owner: str = "amp") -> str:
    """Return `level` if it is one of `AMP_LEVELS`, else raise."""
    return check_choice(owner, "amp_level", level, AMP_LEVELS)


def _as_device(device, network: nn.Module | None = None) -> torch.device:
    if device is None:
        param = next(network.parameters(), None) if network is not None else None
        return param.device if param is not None else torch.device("cpu")
    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"'device' must be a torch.device or a device string like 'cpu' or 'cuda:0', "
                         f"got {device!r}") from err


def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bf16 in hardware (AVX512-BF16 or AMX); False if torch cannot tell."""
    checks = [getattr(torch.cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
    return any(check() for check in checks if check is not None)


def resolve_amp_level(level, device=None) -> str:
    """Map "auto" to a concrete level for `device`; other levels are returned unchanged.

    CUDA -> "O2" (MindSpore's choice for GPUs). CPU -> "O1" where bf16 runs in hardware, else
    "O0": with bf16 hardware O1 made train steps faster and O2 was no faster than O1 while adding
    loss scaling, which bf16 (fp32's exponent range) does not need; O1 also keeps every weight in
    fp32. Without bf16 hardware the casts are pure overhead, hence "O0" (figures:
    docs/benchmarks.md).
    """
    level = check_amp_level(level)
    if level != "auto":
        return level
    kind = _as_device(device).type
    if kind == "cuda":
        return "O2"
    return "O1" if kind == "cpu" and cpu_has_native_bf16() else "O0"


def resolve_amp_dtype(device, dtype=None) -> torch.dtype:
    """Low-precision dtype: bf16 on CPU; fp16 on CUDA unless bf16 is asked for (and supported)."""
    if isinstance(dtype, str):
        if dtype.lower() not in _DTYPES:
            raise ValueError(f"'dtype' must be one of {sorted(_DTYPES)} or a torch dtype, got {dtype!r}")
        dtype = _DTYPES[dtype.lower()]
    if dtype is not None and dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"'dtype' must be torch.float16, torch.bfloat16 or None, got {dtype!r}")
    kind = _as_device(device).type
    if kind == "cpu":
        if dtype == torch.float16:
            raise ValueError("'dtype' float16 is not supported on CPU (CPU mixed precision uses bfloat16), "
                             "got torch.float16")
        return torch.bfloat16
    if kind == "cuda":
        if dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
            raise ValueError("'dtype' bfloat16 was asked for but this CUDA device does not support it; "
                             "use None or 'float16'")
        return dtype or torch.float16
    raise ValueError(f"mixed precision supports 'device' types 'cpu' and 'cuda', got {str(device)!r}")


@dataclass(frozen=True)
class Precision:
    """An amp level resolved for one device: what the train, eval and predict networks compute in.

    >>> resolve_precision("O2", "cpu")
    Precision(level='O2', device=device(type='cpu'), dtype=torch.bfloat16, keep_batchnorm_fp32=None)
    """

    level: str  # "O0" | "O1" | "O2" | "O3", never "auto"
    device: torch.device
    dtype: torch.dtype | None  # the low-precision dtype; None at "O0"
    keep_batchnorm_fp32: bool | None = None  # None: the level's default (True at O2, False at O3)


def resolve_precision(level, device=None, dtype=None, keep_batchnorm_fp32=None) -> Precision:
    """`level` ("auto" included) and `dtype` resolved for `device` (default: CPU), once."""
    device = _as_device(device)
    level = resolve_amp_level(level, device)
    return Precision(level, device, None if level == "O0" else resolve_amp_dtype(device, dtype), keep_batchnorm_fp32)


def autocast_factory(level: str, device=None, dtype=None) -> Callable[[], AbstractContextManager]:
    """Zero-argument factory of the forward's context: ``torch.autocast`` for "O1", else a no-op."""
    return _autocast(resolve_precision(level, device, dtype))


def _autocast(precision: Precision) -> Callable[[], AbstractContextManager]:
    if precision.level != "O1":
        return nullcontext
    kind, low = precision.device.type, precision.dtype
    # No cast cache on CUDA: a captured CUDA graph must not keep a cast from the capture (and a
    # CTR network uses each weight once per forward, so the cache saves nothing).
    return lambda: torch.autocast(device_type=kind, dtype=low, cache_enabled=kind != "cuda")


def _cast_floats(obj, dtype: torch.dtype):
    """Cast floating tensors inside tuples/lists/dicts to `dtype`; ids and other values pass through."""
    if isinstance(obj, torch.Tensor):
        return obj.to(dtype) if obj.is_floating_point() and obj.dtype != dtype else obj
    if isinstance(obj, tuple):
        items = [_cast_floats(x, dtype) for x in obj]
        return type(obj)(*items) if hasattr(obj, "_fields") else tuple(items)
    if isinstance(obj, list):
        return [_cast_floats(x, dtype) for x in obj]
    if isinstance(obj, dict):
        return {k: _cast_floats(v, dtype) for k, v in obj.items()}
    return obj


class CastNetwork(nn.Module):
    """Run `network` in low precision (O2/O3 compute), casting floating outputs back to fp32.

    Weights are cast to the low dtype for the forward only (fp32 masters keep receiving fp32
    gradients); batch norm computes in fp32 when `keep_batchnorm_fp32`, else on low-precision
    inputs with its stored weights; lookups (`register_lookup_module`) read their tables as
    stored and their results are cast.
    """

    def __init__(self, network: nn.Module, dtype: torch.dtype = torch.bfloat16,
                 keep_batchnorm_fp32: bool = True, cast_outputs: bool = True):
        super().__init__()
        if dtype not in (torch.float16, torch.bfloat16):
            raise ValueError(f"CastNetwork: 'dtype' must be torch.float16 or torch.bfloat16, got {dtype!r}")
        self.network, self.dtype = network, dtype
        self.keep_batchnorm_fp32, self.cast_outputs = keep_batchnorm_fp32, cast_outputs

    def compute_dtypes(self, module: nn.Module, stored: torch.dtype) -> tuple[torch.dtype, torch.dtype | None]:
        """(dtype of the module's floating inputs, dtype its weights are cast to; None: as stored)."""
        if isinstance(module, _BatchNorm):
            # Not kept: low-precision inputs with weights and statistics as stored; PyTorch's
            # mixed batch-norm kernels accept that, and the running statistics keep updating.
            return (torch.float32, torch.float32) if self.keep_batchnorm_fp32 else (self.dtype, None)
        if is_lookup_module(module):  # e.g. per-sample weights must match the table
            return stored, None
        return self.dtype, self.dtype

    def forward(self, *inputs, **kwargs):
        inputs, kwargs = _cast_floats(inputs, self.dtype), _cast_floats(kwargs, self.dtype)
        low_weights, handles = {}, []
        try:
            # Hooks are registered for this call only, so the user's network is left untouched
            # (it still runs in fp32 on its own, and pickles/deep-copies without our closures).
            for prefix, module in self.network.named_modules():
                own = [(n, p) for n, p in module.named_parameters(recurse=False) if p.is_floating_point()]
                if not own:
                    continue
                target, weights = self.compute_dtypes(module, own[0][1].dtype)
                for name, p in own:
                    if weights is not None and p.dtype != weights:
                        low_weights[f"{prefix}.{name}" if prefix else name] = p.to(weights)
                handles.append(module.register_forward_pre_hook(
                    lambda m, a, kw, t=target: (_cast_floats(a, t), _cast_floats(kw, t)),
                    prepend=True, with_kwargs=True))  # first, so user hooks see what the module computes on
                if target != self.dtype:  # fp32 island (batch norm, embedding): back to low precision after
                    handles.append(module.register_forward_hook(lambda m, a, out: _cast_floats(out, self.dtype)))
            if low_weights:
                out = torch.func.functional_call(self.network, low_weights, inputs, kwargs, strict=False)
            else:
                out = self.network(*inputs, **kwargs)
        finally:
            for handle in handles:
                handle.remove()
        return _cast_floats(out, torch.float32) if self.cast_outputs else out


class _ContextCell(nn.Module):
    """Run `network` inside ``context()``, with floating outputs cast back to fp32 (O1 eval/predict)."""

    def __init__(self, network: nn.Module, context: Callable[[], AbstractContextManager]):
        super().__init__()
        self.network, self.context = network, context

    def forward(self, *inputs, **kwargs):
        with self.context():
            out = self.network(*inputs, **kwargs)
        return _cast_floats(out, torch.float32)


def cast_network_(network: nn.Module, dtype: torch.dtype, keep_batchnorm_fp32: bool = False) -> nn.Module:
    """O3: cast floating weights and buffers in place (Parameter objects are kept, so an optimizer
    built on them stays valid); batch norm goes back to fp32 if `keep_batchnorm_fp32`."""
    network.to(dtype)
    if keep_batchnorm_fp32:
        for module in network.modules():
            if isinstance(module, _BatchNorm):
                module.float()
    return network


def _check_common(owner: str, network, loss_fn, keep_batchnorm_fp32) -> None:
    check_module(owner, "network", network)
    check_callable(owner, "loss_fn", loss_fn, allow_none=True)
    check_bool(owner, "keep_batchnorm_fp32", keep_batchnorm_fp32, allow_none=True)


def _precision_network(network: nn.Module, precision: Precision) -> nn.Module:
    """`network` wrapped to compute at `precision`, floating outputs in fp32."""
    if precision.level == "O0":
        return network
    if precision.level == "O1":
        return _ContextCell(network, _autocast(precision))
    keep = (precision.level == "O2") if precision.keep_batchnorm_fp32 is None else precision.keep_batchnorm_fp32
    return CastNetwork(network, precision.dtype, keep_batchnorm_fp32=keep)


def build_train_network(network: nn.Module, optimizer, loss_fn: Callable | None = None, level: str = "O0",
                        boost_level: str = "O0", **kwargs) -> nn.Module:
    """Return the module that runs one training step at `level` (MindSpore's argument order).

    `TrainOneStepCell` (returns the loss) unless a loss-scale manager applies (given, or the
    default dynamic one of "O2"): then `TrainOneStepWithLossScaleCell` (returns
    ``(loss, overflow, scale)``). Keyword arguments: ``keep_batchnorm_fp32`` (default True for O2,
    False for O3, ignored at O0/O1), ``loss_scale_manager``, ``device`` (default: the network's)
    and ``dtype`` (bf16 on CUDA, see `resolve_amp_dtype`). As in MindSpore, O1 has no default loss
    scale: with float16 on CUDA, pass a `loss_scale_manager`. With ``optimizer=None`` (only at
    "O0") `network` is itself the step (with `loss_fn` attached). "O3" casts the network's weights
    in place. `boost_level` ("O0" | "O1" | "O2") is validated for MindSpore's signature; boost's
accelerations change the network and optimizer themselves, so `Model` applies them
(`recstream.train.boost`), not this function.
    """
    owner = "build_train_network"
    check_kwargs(owner, kwargs, ("keep_batchnorm_fp32", "loss_scale_manager", "device", "dtype"))
    keep_batchnorm_fp32, loss_scale_manager = kwargs.get("keep_batchnorm_fp32"), kwargs.get("loss_scale_manager")
    device, dtype = kwargs.get("device"), kwargs.get("dtype")
    # The optimizer first: a call in the old (network, loss_fn, optimizer) order fails on it, clearly.
    check_type(owner, "optimizer", optimizer, OptimizerLike, allow_none=True,
               allowed="a torch.optim.Optimizer (an object with step() and zero_grad())")
    _check_common(owner, network, loss_fn, keep_batchnorm_fp32)
    check_amp_level(level, owner)
    check_choice(owner, "boost_level", boost_level, ("O0", "O1", "O2"))
    check_type(owner, "loss_scale_manager", loss_scale_manager, LossScaleManager, allow_none=True,
               allowed="a LossScaleManager (FixedLossScaleManager or DynamicLossScaleManager)")
    if optimizer is None:
        if level != "O0":
            raise ValueError(f"Auto mixed precision will not work because 'optimizer' is None (amp_level={level!r}); "
                             "pass an optimizer or use amp_level='O0'")
        if loss_scale_manager is not None:
            raise ValueError("'loss_scale_manager' was given but 'optimizer' is None; loss scaling needs an optimizer")
        return network if loss_fn is None else WithLossCell(network, loss_fn)
    precision = resolve_precision(level, _as_device(device, network), dtype, keep_batchnorm_fp32)
    return precision_train_step(network, loss_fn, optimizer, precision, loss_scale_manager)


def precision_train_step(network: nn.Module, loss_fn: Callable | None, optimizer, precision: Precision,
                         loss_scale_manager: LossScaleManager | None) -> nn.Module:
    """`build_train_network` for arguments validated and a precision resolved already (by it, or by
    `recstream.train.plan`)."""
    level, device = precision.level, precision.device
    if loss_scale_manager is None and level == "O2":
        loss_scale_manager = DynamicLossScaleManager()
    if level == "O3":
        if any(optimizer.state.values()):  # non-empty per-parameter state (moments, ...)
            raise ValueError("amp_level 'O3' casts the weights in place, but 'optimizer' already holds state; "
                             "build the train network before the first optimizer step")
        cast_network_(network, precision.dtype, keep_batchnorm_fp32=bool(precision.keep_batchnorm_fp32))
    net = _precision_network(network, precision) if level != "O1" else network
    if loss_fn is not None:
        net = WithLossCell(net, loss_fn)  # O2/O3 outputs are fp32 by then, so the loss runs in fp32
    context = _autocast(precision)
    if loss_scale_manager is None:
        return TrainOneStepCell(net, optimizer, autocast=context)
    update_cell = loss_scale_manager.get_update_cell().to(device)
    return TrainOneStepWithLossScaleCell(net, optimizer, update_cell, autocast=context)


def build_eval_network(network: nn.Module, loss_fn: Callable | None, level: str = "O0", device=None,
                       keep_batchnorm_fp32: bool | None = None, dtype=None) -> nn.Module:
    """`WithEvalCell` returning ``(loss, outputs, label)`` with the network at `level` and fp32
    outputs; with ``loss_fn=None`` just the wrapped network. Weights are not modified."""
    _check_common("build_eval_network", network, loss_fn, keep_batchnorm_fp32)
    precision = resolve_precision(level, _as_device(device, network), dtype, keep_batchnorm_fp32)
    return precision_eval_network(network, loss_fn, precision)


def precision_eval_network(network: nn.Module, loss_fn: Callable | None, precision: Precision) -> nn.Module:
    """`build_eval_network` for a precision resolved already."""
    net = _precision_network(network, precision)
    return net if loss_fn is None else WithEvalCell(net, loss_fn, add_cast_fp32=precision.level != "O0")


def build_predict_network(network: nn.Module, level: str = "O0", device=None,
                          keep_batchnorm_fp32: bool | None = None, dtype=None) -> nn.Module:
    """`network` at `level` for inference, floating outputs cast back to fp32."""
    _check_common("build_predict_network", network, None, keep_batchnorm_fp32)
    return _precision_network(network, resolve_precision(level, _as_device(device, network), dtype,
                                                         keep_batchnorm_fp32))


def precision_predict_network(network: nn.Module, precision: Precision) -> nn.Module:
    """`build_predict_network` for a precision resolved already."""
    return _precision_network(network, precision)
