"""Shared machinery for the row-sparse optimizers.

All optimizers in this package treat dimension 0 of a parameter as the *row*
dimension (one embedding vector per row) and update only the rows present in
the current gradient:

* a sparse COO gradient (``nn.Embedding(sparse=True)`` and friends) is
  coalesced first, so duplicate row indices are summed, and only its rows are
  read, updated and written back (``index_select`` / ``index_copy_``);
* a dense gradient counts as touching every row, and the update then runs
  in place on the whole tensors, which is exactly the dense optimizer.

Example:
    >>> import torch
    >>> from recstream.optim import LazyAdam
    >>> emb = torch.nn.Embedding(10, 4, sparse=True)
    >>> opt = LazyAdam(emb.parameters(), lr=0.1)
    >>> before = emb.weight.detach().clone()
    >>> emb(torch.tensor([1, 1, 3])).sum().backward()
    >>> opt.step()
    >>> changed = (emb.weight != before).any(dim=1).nonzero().flatten().tolist()
    >>> changed
    [1, 3]
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor
from torch.optim import Optimizer

from recstream.hostpath import host_reads_free
from recstream.sorting import unique
from recstream.validation import check_number, check_type

__all__ = ["SparseRowOptimizer"]


def _one_value_rows(t: Tensor) -> bool:
    """Whether each row of `t` holds one value (``[n]``, ``[n, 1]``): a width-1 table, a per-row
    accumulator. Those gather and scatter as a flat vector: on a CPU ``index_select`` of ``[n, 1]``
    runs a generic strided loop, 3.5x the time of the same rows of ``[n]`` (19k of 2.6M rows:
    0.17 vs 0.05 ms), and there 1-D ``scatter_`` takes half the time of ``index_copy_``."""
    return t.dim() > 1 and t.numel() == t.shape[0] and t.is_contiguous()


def take_rows(t: Tensor, rows: Tensor | None) -> Tensor:
    """Rows ``rows`` of ``t`` (a copy), or ``t`` itself when every row counts.

    Returning the tensor itself on the dense path lets the kernels update
    optimizer state in place with no gather/scatter cost.
    """
    if rows is None:
        return t
    if _one_value_rows(t):
        return t.view(-1).index_select(0, rows).view(-1, *t.shape[1:])
    return t.index_select(0, rows)


def put_rows(t: Tensor, rows: Tensor | None, values: Tensor) -> None:
    """Write ``values`` back into rows ``rows`` of ``t`` (no-op if in place).

    The rows are unique (a coalesced gradient's), or repeated with equal values (the device path of
    `_rows_and_values`), so the write is deterministic."""
    if rows is None:
        if values is not t:
            t.copy_(values)
    elif host_reads_free(t) and (t.dim() == 1 or _one_value_rows(t)):
        t.view(-1).scatter_(0, rows, values.reshape(-1))
    else:
        t.index_copy_(0, rows, values)


def addcdiv_rows(t: Tensor, rows: Tensor | None, numerator: Tensor, denominator: Tensor,
                 value: float | Tensor) -> None:
    """``t[rows] += value * numerator / denominator`` (``rows`` None: every row, in place).

    `value` may be a 0-d tensor on `t`'s device (a capturable optimizer's step size): the update
    is then ``numerator / denominator * value`` (same maths, another rounding order than addcdiv).

    On a CPU the step goes in with one ``index_add_`` (rows unique: each gets one addition):
    no gather of the old rows, and a faster scatter than ``index_copy_`` -- 19k rows of a
    ``[2.6M, 16]`` table: gather 0.23-0.30 ms + index_copy_ 0.60-0.72 ms against index_add_
    0.54 ms. Elsewhere (CUDA's ``index_add_`` is atomics, refused in deterministic mode) the
    rows are gathered, updated and written back.
    """
    if isinstance(value, Tensor):
        step = numerator.div(denominator).mul_(value)
        if rows is None:
            t.add_(step)
        else:
            put_rows(t, rows, take_rows(t, rows).add_(step))
        return
    if rows is None:
        t.addcdiv_(numerator, denominator, value=value)
    elif host_reads_free(t) and not _one_value_rows(t):  # unique rows there (`_rows_and_values`)
        t.index_add_(0, rows, numerator.div(denominator).mul_(value))
    else:
        w = take_rows(t, rows)
        w.addcdiv_(numerator, denominator, value=value)
        put_rows(t, rows, w)


def row_broadcast(v: Tensor, like: Tensor) -> Tensor:
    """View a per-row vector ``[n]`` so it broadcasts against ``like`` ``[n, ...]``."""
    return v.view(-1, *([1] * (like.dim() - 1)))


class SparseRowOptimizer(Optimizer):
    """Base class: row extraction, row-reset protocol, validation.

    Subclasses implement:

    * ``_validate_group(group)`` - raise on bad hyper-parameters (with
      `recstream.validation`, the class name as owner);
    * ``_init_state(p, state, group)`` - allocate per-parameter state;
    * ``_reset_rows(state, rows, group)`` - restore rows of the state to
      their initial value (used by the row-reset protocol);
    * ``_update(p, rows, grad, state, group)`` - apply one step to the rows
      ``rows`` (``None`` = all rows) of ``p`` with row gradients ``grad``.
      ``p`` and ``grad`` always have at least one dimension (0-d parameters
      are viewed as a single row).

    Row-reset protocol: if a parameter carries a callable attribute
    ``pop_reset_rows`` (e.g. the weight of ``recstream.nn.HashEmbedding``,
    which reassigns rows to new keys), it is called once per step before the
    parameter is updated and the returned rows get fresh optimizer state, so
    a new key does not inherit the moments/accumulators of the evicted one.

    Capturable mode (a group's ``"capturable"`` set, as ``torch.optim.Adam``'s; set by
    `recstream.train.cuda_graph.make_capturable`): a step launches kernels only - the step count is
    a 0-d tensor on the parameter's device, ``lr`` may be one, and every quantity derived from them
    is computed there - so a CUDA graph that captured one step replays it with the right counts
    and rates. A state dict is the same in both modes (counts as ints, rates as floats), so a
    checkpoint loads either way.
    """

    def __init__(self, params: Iterable[Any], defaults: dict[str, Any]) -> None:
        self._validate_group(defaults)
        super().__init__(params, defaults)
        self.register_state_dict_post_hook(_portable_state_dict)

    # ------------------------------------------------------------ hooks
    def _validate_group(self, group: dict[str, Any]) -> None:
        check_number(type(self).__name__, "lr", group["lr"], minimum=0.0)

    def _init_state(self, p: Tensor, state: dict[str, Any], group: dict[str, Any]) -> None:
        raise NotImplementedError

    def _reset_rows(self, state: dict[str, Any], rows: Tensor, group: dict[str, Any]) -> None:
        raise NotImplementedError

    def _update(self, p: Tensor, rows: Tensor | None, grad: Tensor,
                state: dict[str, Any], group: dict[str, Any]) -> None:
        raise NotImplementedError

    def _kernel_step(self, p: Tensor, grad: Tensor, state: dict[str, Any], group: dict[str, Any],
                     found_inf: Tensor | None) -> bool:
        """One step of `p` from its raw gradient `grad` as one fused GPU kernel (duplicate rows
        summed inside, `found_inf` honoured there), the step count advanced; False (nothing done)
        where no kernel applies (`recstream.optim.triton_rows`): the torch ops or C kernels run."""
        return False

    # ------------------------------------------------------------ API
    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group, validating its hyper-parameters before it is stored."""
        check_type(f"{type(self).__name__}.add_param_group", "param_group", param_group, dict)
        merged = {**self.defaults, **{k: v for k, v in param_group.items() if k != "params"}}
        self._validate_group(merged)
        super().add_param_group(param_group)

    @property
    def _step_supports_amp_scaling(self) -> bool:
        """Whether a loss-scaled step may hand this optimizer a device ``found_inf`` flag to skip
        an overflowing step itself, as torch's fused optimizers do (`step`): in capturable mode,
        where the step count is a device tensor too."""
        return all(group.get("capturable") for group in self.param_groups)

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Update the touched rows of every parameter that has a gradient.

        Adds no host synchronisation: on a device the gradient's rows are summed
        into fixed-size outputs (`_rows_and_values`), not coalesced. A ``found_inf``
        attribute (a 0-d device flag set by a loss-scaled step, see
        `_step_supports_amp_scaling`) makes the step a no-op where it is 1: each update is
        computed, then its rows, their state and the step count put back as they were.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        found_inf = getattr(self, "found_inf", None)
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.is_sparse:
                    raise TypeError("sparse parameters are not supported; the parameter "
                                    "must be dense (only its gradient may be sparse)")
                state = self.state[p]
                reset = self._pop_reset_rows(p)
                if not state:
                    # Fresh state is already "reset"; popping above still
                    # clears the pending list on the module.
                    self._init_state(p, state, group)
                elif reset is not None:
                    self._reset_rows(state, reset, group)
                _align_step(p, state, group)
                # 0-d parameters are treated as a single row; unsqueeze is a
                # view, so in-place updates still land in ``p``.
                target = p if p.dim() > 0 else p.unsqueeze(0)
                if self._kernel_step(target, p.grad, state, group, found_inf):
                    continue
                rows, grad = _rows_and_values(p, p.grad)
                if found_inf is None:
                    self._update(target, rows, grad, state, group)
                else:
                    self._update_unless(found_inf, target, rows, grad, state, group)
        return loss

    def _update_unless(self, found_inf: Tensor, p: Tensor, rows: Tensor | None, grad: Tensor,
                       state: dict[str, Any], group: dict[str, Any]) -> None:
        """`_update`, undone on the device where `found_inf` is set: the touched rows of the
        parameter and of its per-row state are saved before and chosen after by the flag (no host
        read; an overflowing step leaves weights, state and count as they were)."""
        # A 0-d parameter (`p` is its one-row view, see `step`) has 0-d state: viewed as one row too.
        tensors = [t for k, t in state.items() if k != "step" and isinstance(t, Tensor)]
        per_row = [t if t.dim() > 0 else t.unsqueeze(0) for t in tensors
                   if (t.dim() > 0 and t.shape[0] == p.shape[0]) or (t.dim() == 0 and tuple(p.shape) == (1,))]
        tensors = [p, *per_row]
        before = [take_rows(t, rows).clone() for t in tensors]
        self._update(p, rows, grad, state, group)
        skip = found_inf.reshape(()).to(torch.bool)
        for t, old in zip(tensors, before, strict=True):
            put_rows(t, rows, torch.where(skip, old, take_rows(t, rows)))
        if isinstance(state.get("step"), Tensor):
            state["step"] -= skip.to(state["step"].dtype)

    @staticmethod
    def _pop_reset_rows(p: Tensor) -> Tensor | None:
        pop = getattr(p, "pop_reset_rows", None)
        if pop is None:
            return None
        if not callable(pop):
            raise TypeError(f"param.pop_reset_rows must be callable, got {type(pop).__name__}")
        rows = pop()
        if not isinstance(rows, Tensor) or rows.is_floating_point() or rows.is_complex() \
                or rows.dtype == torch.bool:
            raise TypeError("param.pop_reset_rows() must return an integer tensor of row "
                            f"indices, got {rows!r}")
        return rows.reshape(-1).to(device=p.device, dtype=torch.long)


def kernel_step_done(state: dict[str, Any], found_inf: Tensor | None) -> None:
    """After a fused kernel's step (`SparseRowOptimizer._kernel_step`), which wrote nothing where
    `found_inf` is set: take the step count back there too (a device tensor; an int count is
    advanced regardless, as `_update_unless` does)."""
    if found_inf is not None and isinstance(state.get("step"), Tensor):
        state["step"] -= found_inf.reshape(()).to(state["step"].dtype)


def _align_step(p: Tensor, state: dict[str, Any], group: dict[str, Any]) -> None:
    """Keep ``state["step"]`` in the group's mode: a device tensor when capturable, else an int.
    A state loaded from a checkpoint (ints) or switched mode converts here once, not per step."""
    step = state.get("step")
    if step is None:
        return
    if group.get("capturable"):
        if not isinstance(step, Tensor) or step.device != p.device:
            state["step"] = torch.as_tensor(step, dtype=torch.float32).to(p.device)
    elif isinstance(step, Tensor):
        state["step"] = int(step)  # one read, when a capturable state meets a plain optimizer


def _portable_state_dict(optimizer: Optimizer, state_dict: dict) -> dict:
    """A capturable optimizer's state dict as a plain one's: step counts ints, rates floats, no
    ``capturable`` flag (one host read per checkpoint, none per step)."""
    for group in state_dict["param_groups"]:
        group.pop("capturable", None)
        if isinstance(group.get("lr"), Tensor):
            group["lr"] = float(group["lr"])
    for key, entry in state_dict["state"].items():
        if isinstance(entry.get("step"), Tensor):  # a copy: the entries are the live state's dicts
            state_dict["state"][key] = {**entry, "step": int(entry["step"])}
    return state_dict


VECTORIZED_COALESCE_MIN = 8192  # gradient entries from which a CPU gradient is summed by unique + index_add_


def _rows_and_values(p: Tensor, grad: Tensor) -> tuple[Tensor | None, Tensor]:
    """Split a gradient into (touched rows or None, per-row values).

    On the host path the rows are unique (duplicates summed). On a device (`host_reads_free` false)
    the number of unique rows is data a host would have to read, so the output keeps one entry per
    gradient entry instead (`_static_rows`): rows sorted, duplicates kept, each carrying its row's
    summed values; an update computed on such entries gives equal values for equal rows, so writing
    them back is the same as writing each row once."""
    if grad.layout == torch.strided:
        return None, (grad if grad.dim() > 0 else grad.unsqueeze(0))
    if grad.layout != torch.sparse_coo:
        raise TypeError(f"gradient layout must be torch.strided or torch.sparse_coo, "
                        f"got {grad.layout}")
    if grad.sparse_dim() != 1:
        raise ValueError("sparse gradients must be row-sparse (sparse_dim() == 1, as "
                         f"produced by embeddings), got sparse_dim()={grad.sparse_dim()} "
                         f"for a parameter of shape {tuple(p.shape)}")
    if grad.is_coalesced():
        return grad._indices()[0], grad._values()
    rows, values = grad._indices()[0], grad._values()
    if not host_reads_free(rows):
        return _static_rows(rows, values)
    # Rows sorted and unique, duplicates summed: needed for a correct read-modify-write of per-row
    # state. That is what coalesce() does; on a CPU, for a large gradient, unique + index_add_ does it
    # faster (coalesce sums duplicates in a per-entry loop): measured 5-30% less time from 8192
    # entries on (26 fields x batch 1024: 4.1 -> 1.8 ms for dim 16, 1.9 -> 1.3 ms for dim 1), and as
    # fast or slower below, so small gradients keep coalesce().
    if rows.numel() >= VECTORIZED_COALESCE_MIN:
        rows, inverse = unique(rows, return_inverse=True, bound=p.shape[0] if p.dim() > 0 else 1)
        return rows, values.new_zeros((rows.numel(), *values.shape[1:])).index_add_(0, inverse, values)
    g = grad.coalesce()
    return g._indices()[0], g._values()


def _static_rows(rows: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
    """``(rows sorted, each entry's row's summed values)``, both sized to the input: sort, a mask of
    each run's first entry, its cumsum numbering the runs, the runs summed into the first
    ``runs`` slots and read back per entry. No size is data, so no host sync. The sums use
    ``index_put_(accumulate=True)``, deterministic on CUDA (sorted), in entry order on a CPU."""
    rows, order = torch.sort(rows, stable=True)
    values = values.index_select(0, order)
    first = torch.ones_like(rows, dtype=torch.bool)
    first[1:] = rows[1:] != rows[:-1]
    run = first.cumsum(0).sub_(1)
    summed = torch.zeros_like(values).index_put_((run,), values, accumulate=True)
    return rows, summed.index_select(0, run)


def coalesce_rows(params: list[Tensor], grads: list[Tensor]) -> list[tuple[Tensor | None, Tensor]]:
    """``(unique touched rows, summed values)`` of each parameter's gradient: `_rows_and_values`
    of each.

    On a CPU, several uncoalesced row-sparse gradients are coalesced together: their rows shifted
    into one index space and coalesced as one gradient (`coalesce_joined`), the result split
    back. One sort of 26k ids instead of 26 calls on 1k each: for a user's network with a table per
    field the per-call cost, not the sorting, is what many small tables pay.
    """
    joinable = [i for i, g in enumerate(grads) if host_reads_free(g) and g.layout == torch.sparse_coo
                and g.sparse_dim() == 1 and not g.is_coalesced()]
    out: list = [None] * len(grads)
    # Only gradients of one dtype and row shape can be laid end to end (a width-4 and a width-1 table
    # cannot share one values tensor): one joint coalesce per such set.
    sets: dict[tuple, list[int]] = {}
    for i in joinable:
        sets.setdefault((grads[i].dtype, tuple(grads[i].shape[1:])), []).append(i)
    for joint in sets.values():
        if len(joint) > 1:
            _coalesce_set(params, grads, joint, out)
    return [_rows_and_values(p, g) if r is None else r for p, g, r in zip(params, grads, out, strict=True)]


def _coalesce_set(params: list[Tensor], grads: list[Tensor], joint: list[int], out: list) -> None:
    """`coalesce_rows` of the gradients at `joint` (one dtype and row shape), into `out`."""
    starts = [0]
    for i in joint:
        starts.append(starts[-1] + params[i].shape[0])
    rows, summed = coalesce_joined([grads[i] for i in joint], starts)
    cuts = torch.searchsorted(rows, torch.tensor(starts)).tolist()  # where each table's rows begin
    for k, i in enumerate(joint):
        out[i] = (rows[cuts[k]:cuts[k + 1]] - starts[k], summed[cuts[k]:cuts[k + 1]])


def coalesce_joined(grads: list[Tensor], starts: list[int]) -> tuple[Tensor, Tensor]:
    """``(unique rows, summed values)`` of row-sparse gradients laid end to end: gradient ``i``'s
    rows shifted by ``starts[i]``, ``starts[-1]`` rows in all (`coalesce_rows`, `FusedTables`)."""
    rows = torch.cat([g._indices()[0] + a for g, a in zip(grads, starts[:-1], strict=True)])
    values = torch.cat([g._values() for g in grads])
    joined = torch.sparse_coo_tensor(rows.unsqueeze(0), values, (starts[-1], *values.shape[1:]),
                                     check_invariants=False)
    return _rows_and_values(joined, joined)
