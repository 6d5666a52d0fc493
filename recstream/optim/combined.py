"""Drive a sparse optimizer (embeddings) and a dense one (the rest) as one.

CTR models mix huge embedding tables, whose gradients are row-sparse, with
small dense networks. Dense optimizers such as ``torch.optim.Adam`` reject
sparse gradients, and sparse optimizers are not the best choice for an MLP,
so the parameters are split and each half gets its own optimizer.

Design: [`CombinedOptimizer`][recstream.optim.combined.CombinedOptimizer] subclasses ``torch.optim.Optimizer`` (LR
schedulers check ``isinstance(opt, Optimizer)``) but owns no parameter groups
of its own. ``param_groups`` is a live property returning the children's group
dicts themselves, concatenated, so a scheduler or ``ReduceLROnPlateau`` that
writes ``group["lr"]`` changes the child that really uses it, and groups added
to a child later are seen at once. ``Optimizer.__init__`` is therefore not
called (it would copy the groups into new dicts); the base class's own
``__setstate__`` initialiser sets up the hook registries instead, so step /
state-dict hooks and profiling work as for any optimizer.

Example:
    >>> import torch
    >>> from torch import nn
    >>> from recstream.optim import RowWiseAdagrad, sparse_and_dense
    >>> model = nn.Sequential(nn.EmbeddingBag(1000, 8, sparse=True), nn.Linear(8, 1))
    >>> opt = sparse_and_dense(model, sparse=RowWiseAdagrad, dense=torch.optim.Adam)
    >>> sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    >>> model(torch.tensor([[1, 2], [3, 4]])).sum().backward()
    >>> opt.step(); sched.step(); opt.zero_grad(set_to_none=True)
    >>> [g["lr"] for g in opt.param_groups]
    [0.005, 0.0005]
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

import torch
from torch import Tensor, nn
from torch.optim import Optimizer

from recstream.validation import check_callable, check_choice, check_module, check_type

from .lazy_adam import LazyAdam

__all__ = ["CombinedOptimizer", "sparse_and_dense", "split_sparse_dense"]


class CombinedOptimizer(Optimizer):
    """Several optimizers over disjoint parameters behaving as one.

    Args:
        optimizers: a mapping ``name -> Optimizer`` or a sequence of
            optimizers (named ``"0"``, ``"1"``, ...). Names key the state dict
            and select the target of `add_param_group`.

    ``step(closure)`` evaluates the closure once, then steps every child.
    ``state_dict()`` is ``{"optimizers": {name: child.state_dict()}}``.
    ``defaults`` is empty: hyper-parameters live in each child's groups (so
    e.g. ``OneCycleLR`` needs ``cycle_momentum=False`` unless every group has
    momentum/betas).
    """

    def __init__(self, optimizers: Mapping[str, Optimizer] | Sequence[Optimizer]) -> None:
        owner = "CombinedOptimizer"
        check_type(owner, "optimizers", optimizers, (Mapping, list, tuple),
                   allowed="a mapping name -> Optimizer or a list of optimizers")
        if isinstance(optimizers, Mapping):
            named = dict(optimizers)
        else:
            named = {str(i): o for i, o in enumerate(optimizers)}
        if not named:
            raise ValueError(f"{owner}: 'optimizers' must hold at least one optimizer, got none")
        seen: dict[int, str] = {}
        for name, opt in named.items():
            check_type(owner, "optimizer name", name, str)
            check_type(owner, f"optimizers[{name!r}]", opt, Optimizer, allowed="a torch.optim.Optimizer")
            for group in opt.param_groups:
                for p in group["params"]:
                    if id(p) in seen and seen[id(p)] != name:
                        raise ValueError(f"{owner}: a parameter of shape {tuple(p.shape)} is in both "
                                         f"optimizers {seen[id(p)]!r} and {name!r}; each "
                                         "parameter must belong to exactly one optimizer")
                    seen[id(p)] = name
        # See module docstring: the base initialiser for unpickled optimizers
        # creates every registry the base class methods need.
        Optimizer.__setstate__(self, {"defaults": {}, "_optimizers": named})

    def __getstate__(self) -> dict[str, Any]:
        return {"defaults": self.defaults, "_optimizers": self._optimizers}

    @property
    def optimizers(self) -> Mapping[str, Optimizer]:
        """The child optimizers by name (read-only view)."""
        return MappingProxyType(self._optimizers)

    @property
    def param_groups(self) -> list[dict[str, Any]]:  # type: ignore[override]
        """The children's group dicts (the same objects), concatenated."""
        return [g for opt in self._optimizers.values() for g in opt.param_groups]

    @property
    def state(self) -> dict[Tensor, Any]:  # type: ignore[override]
        """Merged per-parameter state of all children (inner dicts are shared)."""
        merged: dict[Tensor, Any] = {}
        for opt in self._optimizers.values():
            merged.update(opt.state)
        return merged

    @property
    def _step_supports_amp_scaling(self) -> bool:
        """Whether every child skips an overflowing step itself from a ``found_inf`` flag (see `step`)."""
        return all(getattr(opt, "_step_supports_amp_scaling", False) for opt in self._optimizers.values())

    def step(self, closure: Callable[[], Any] | None = None) -> Any:  # type: ignore[override]
        """Step every child. A ``found_inf`` attribute set by a loss-scaled step (with `grad_scale`,
        as torch's GradScaler sets them) is handed to each child for its step."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        flags = {k: getattr(self, k) for k in ("found_inf", "grad_scale") if hasattr(self, k)}
        for opt in self._optimizers.values():
            for k, v in flags.items():
                setattr(opt, k, v)
            try:
                opt.step()
            finally:
                for k in flags:
                    delattr(opt, k)
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self._optimizers.values():
            opt.zero_grad(set_to_none=set_to_none)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group to one child, chosen by the group's ``"optimizer"`` key.

        The key may be omitted when there is a single child.
        """
        owner = "CombinedOptimizer.add_param_group"
        check_type(owner, "param_group", param_group, dict)
        group = dict(param_group)
        name = group.pop("optimizer", None)
        if name is None and len(self._optimizers) == 1:
            name = next(iter(self._optimizers))
        if name is None:
            raise ValueError(f"{owner}: 'param_group' must name the target optimizer under the key "
                             f"'optimizer', one of {sorted(self._optimizers)}, got None")
        check_choice(owner, "param_group['optimizer']", name, sorted(self._optimizers))
        params = group.get("params")
        params = [params] if isinstance(params, Tensor) else list(params or [])
        owned = {id(p): n for n, o in self._optimizers.items() if n != name
                 for g in o.param_groups for p in g["params"]}
        for p in params:
            if id(p) in owned:
                raise ValueError(f"{owner}: a parameter of shape {tuple(p.shape)} already belongs to "
                                 f"optimizer {owned[id(p)]!r}; cannot add it to {name!r}")
        self._optimizers[name].add_param_group(group)

    def state_dict(self) -> dict[str, Any]:  # type: ignore[override]
        for pre_hook in self._optimizer_state_dict_pre_hooks.values():
            pre_hook(self)
        sd: dict[str, Any] = {
            "optimizers": {n: o.state_dict() for n, o in self._optimizers.items()}}
        for post_hook in self._optimizer_state_dict_post_hooks.values():
            out = post_hook(self, sd)
            sd = sd if out is None else out
        return sd

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:  # type: ignore[override]
        owner = "CombinedOptimizer.load_state_dict"
        check_type(owner, "state_dict", state_dict, dict)
        if not isinstance(state_dict.get("optimizers"), dict):
            raise ValueError(f"{owner}: 'state_dict' must be a dict {{'optimizers': {{name: state}}}} as "
                             f"returned by CombinedOptimizer.state_dict(), got keys {sorted(state_dict)}")
        for pre_hook in self._optimizer_load_state_dict_pre_hooks.values():
            out = pre_hook(self, state_dict)
            state_dict = state_dict if out is None else out
        got, want = sorted(state_dict["optimizers"]), sorted(self._optimizers)
        if got != want:
            raise ValueError(f"{owner}: state_dict['optimizers'] has optimizers {got}, "
                             f"this CombinedOptimizer has {want}")
        for name, opt in self._optimizers.items():
            opt.load_state_dict(state_dict["optimizers"][name])
        for post_hook in self._optimizer_load_state_dict_post_hooks.values():
            post_hook(self)

    def __repr__(self) -> str:
        inner = "\n".join(f"  {n}: " + repr(o).replace("\n", "\n  ")
                          for n, o in self._optimizers.items())
        return f"{type(self).__name__}(\n{inner}\n)"


def split_sparse_dense(model: nn.Module) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
    """Split ``model``'s trainable parameters into (sparse-grad, dense-grad).

    A submodule's parameters count as sparse when it has a
    ``sparse_parameters()`` method (what it yields), or else when its
    ``sparse`` attribute is ``True`` (its own, non-recursive parameters): the
    convention of ``nn.Embedding`` / ``nn.EmbeddingBag(sparse=True)``,
    ``recstream.nn.EmbeddingBagCollection`` and ``recstream.nn.HashEmbedding``.
    A dense parameter misfiled as sparse still trains (the sparse optimizers
    accept dense gradients); the reverse would make e.g. ``Adam`` raise.
    Dense: every other parameter with ``requires_grad``. Order follows
    discovery, so it is deterministic.
    """
    check_module("split_sparse_dense", "model", model)
    return _split(model)


def _split(model: nn.Module) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
    """`split_sparse_dense` for a model already checked to be a module."""
    sparse: dict[int, nn.Parameter] = {}
    for module in model.modules():
        provider = getattr(module, "sparse_parameters", None)
        if callable(provider):
            found = list(provider())
            for p in found:
                if not isinstance(p, Tensor):
                    raise TypeError(f"{type(module).__name__}.sparse_parameters() must yield "
                                    f"tensors, got {type(p).__name__}")
        elif getattr(module, "sparse", False) is True:
            found = list(module.parameters(recurse=False))
        else:
            continue
        for p in found:
            sparse.setdefault(id(p), p)
    sparse_params = [p for p in sparse.values() if p.requires_grad]
    dense_params = [p for p in model.parameters() if p.requires_grad and id(p) not in sparse]
    return sparse_params, dense_params


def sparse_and_dense(model: nn.Module,
                     sparse: Callable[[list[nn.Parameter]], Optimizer] = LazyAdam,
                     dense: Callable[[list[nn.Parameter]], Optimizer] = torch.optim.Adam,
                     ) -> CombinedOptimizer:
    """Build ``CombinedOptimizer({"sparse": ..., "dense": ...})`` for ``model``.

    ``sparse`` / ``dense`` are factories called with a list of parameters:
    an optimizer class or e.g. ``functools.partial(RowWiseAdagrad, lr=0.05)``.
    A side with no parameters is left out.
    """
    owner = "sparse_and_dense"
    check_module(owner, "model", model)
    check_callable(owner, "sparse", sparse)
    check_callable(owner, "dense", dense)
    sparse_params, dense_params = _split(model)
    if not sparse_params and not dense_params:
        raise ValueError(f"{owner}: 'model' {type(model).__name__} has no parameters with requires_grad")
    children: dict[str, Optimizer] = {}
    for name, fn, params in (("sparse", sparse, sparse_params), ("dense", dense, dense_params)):
        if params:
            opt = fn(params)
            if not isinstance(opt, Optimizer):
                raise TypeError(f"{owner}: {name}(params) must return a torch.optim.Optimizer, "
                                f"got {type(opt).__name__}")
            children[name] = opt
    return CombinedOptimizer(children)

