"""The divergence guard: a non-finite loss or weight stops training with a clear error, and a
non-finite model is never checkpointed or published.

One ``NaN``/``inf`` in a step (a learning rate like ``1e308``, an exploding gradient) turns every
weight non-finite a step later, and such a model predicts nothing. So:

* `LossWatch` (run by the training loop after every step) accumulates ON THE DEVICE
  whether a loss was non-finite and the step and epoch of the first one: no host sync per step
  (a step may be one CUDA graph). The flag is read where the loop reads values to the host
  anyway (the end of an offline epoch, the end of training) and raises `DivergenceError`.
* `check_finite_model` is the last line of defence in ``ModelCheckpoint`` and the model
  publisher: it reads every floating tensor of the state once, at save time, and refuses to
  write a non-finite one.

Nothing rolls back on its own: the newest checkpoint on disk is the last good one (a non-finite
state is never written); restore it (``RecModel.restore``, or rerun ``recstream online``, which
resumes from it) after lowering the learning rate.

>>> watch = LossWatch()
>>> for step, loss in enumerate([0.7, 0.6, float("inf"), float("nan")], start=1):
...     watch.observe(torch.tensor(loss), step=step, epoch=1)  # no host read here
>>> try:
...     watch.check()
... except DivergenceError as e:
...     print(e.step, e.epoch)
3 1
>>> check_finite_model(torch.nn.Linear(2, 1), what="checkpoint 'a.safetensors'")  # finite: no error
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch
from torch import nn

from ..nn.tier_shard import flagged_ranks

ROLLBACK = ("the newest checkpoint on disk is the last good one (a non-finite state is never written): "
            "restore it and lower the learning rate")


class DivergenceError(RuntimeError):
    """Training diverged: a loss or weight is no longer finite. Names what, and where.

    Attributes: ``step`` and ``epoch`` of the first non-finite loss (None where unknown),
    ``tensors``: names of the non-finite tensors (empty for a loss).
    """

    def __init__(self, message: str, step: int | None = None, epoch: int | None = None,
                 tensors: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.step, self.epoch, self.tensors = step, epoch, tensors


def _floating(items: Iterable[tuple[str, object]]) -> list[tuple[str, torch.Tensor]]:
    return [(k, v) for k, v in items if isinstance(v, torch.Tensor) and v.is_floating_point() and v.numel()]


def nonfinite_names(tensors: Mapping[str, object]) -> list[str]:
    """Names of the floating tensors of `tensors` holding a NaN or inf (ONE host read for all)."""
    floats = _floating(tensors.items())
    if not floats:
        return []
    flags = [(~torch.isfinite(t.detach())).any() for _, t in floats]
    by_device: dict[torch.device, list[int]] = {}
    for i, f in enumerate(flags):
        by_device.setdefault(f.device, []).append(i)
    bad = [False] * len(flags)
    for idx in by_device.values():  # one read per device
        for i, b in zip(idx, torch.stack([flags[i] for i in idx]).tolist(), strict=True):
            bad[i] = b
    return [name for (name, _), b in zip(floats, bad, strict=True) if b]


def _optimizer_tensors(optimizer) -> dict[str, object]:
    if not isinstance(optimizer, torch.optim.Optimizer):
        return {}
    return {f"optimizer.state[{i}].{k}": v for i, state in enumerate(optimizer.state.values())
            for k, v in state.items()}


def check_finite_model(network: nn.Module, optimizer=None, *, what: str, sharded: bool = False) -> None:
    """Raise `DivergenceError` unless every floating tensor of `network`'s state (and of
    `optimizer`'s state) is finite; `what` names what was about to be written.

    `sharded` (a network whose tables are split over the ranks, hybrid_parallel; collective): each
    rank checks the tensors it holds, its own rows, and the ranks agree, so every rank raises if any
    holds a non-finite value. ``state_dict()`` would gather every sharded table on every rank, a
    whole table's memory per rank at each checkpoint, which is what sharding the table avoids.
    """
    if not sharded:
        state = dict(network.state_dict(keep_vars=False))
        state.update(_optimizer_tensors(optimizer))
        check_finite_tensors(state, what=what)
        return
    local = dict(_local_tensors(network))
    local.update(_optimizer_tensors(optimizer))
    bad = nonfinite_names(local)
    ranks = flagged_ranks(bool(bad))  # every rank joins, whatever it found: the save after this is a collective
    if bad:
        _refuse(bad, what)
    if ranks:
        raise DivergenceError(f"training diverged: non-finite values (NaN or inf) in the tensors of rank(s) {ranks}; "
                              f"refusing to write {what}; {ROLLBACK}")


def _local_tensors(network: nn.Module) -> Iterable[tuple[str, torch.Tensor]]:
    """The parameters and persistent buffers `network` holds on this rank (no gather)."""
    yield from network.named_parameters()
    for prefix, module in network.named_modules():
        for name, b in module.named_buffers(recurse=False):
            if b is not None and name not in module._non_persistent_buffers_set:
                yield (f"{prefix}.{name}" if prefix else name), b


def check_finite_tensors(tensors: Mapping[str, object], *, what: str) -> None:
    """`check_finite_model` for a flat mapping of named tensors (e.g. a version's files)."""
    bad = nonfinite_names(tensors)
    if bad:
        _refuse(bad, what)


def _refuse(bad: list[str], what: str) -> None:
    """Raise `DivergenceError` naming the non-finite tensors `bad` (the first five)."""
    shown = ", ".join(repr(b) for b in bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
    raise DivergenceError(f"training diverged: non-finite values (NaN or inf) in {shown}; refusing to write "
                          f"{what}; {ROLLBACK}", tensors=tuple(bad))


class LossWatch:
    """Accumulates on the loss's device whether a step's loss was non-finite (see module doc).

    A step skipped for overflow by a loss-scale cell (outputs ``(loss, overflow, scale)``)
    does not count: its update was dropped and the weights are unchanged.
    """

    def __init__(self) -> None:
        self._first_step: torch.Tensor | None = None  # -1: every loss so far was finite
        self._first_epoch: torch.Tensor | None = None

    def observe(self, outputs, step: int, epoch: int | None) -> None:
        """Record one step's `outputs` (the train network's); device ops only, no host read."""
        loss = outputs[0] if isinstance(outputs, (tuple, list)) and outputs else outputs
        if not isinstance(loss, torch.Tensor) or not loss.is_floating_point():
            return
        # x * 0 is NaN exactly where x is inf or NaN: two elementwise ops (isfinite dispatches six)
        bad = loss.detach() * 0 != 0
        bad = bad.any() if bad.dim() else bad
        if isinstance(outputs, (tuple, list)) and len(outputs) == 3 and isinstance(outputs[1], torch.Tensor) \
                and outputs[1].dtype == torch.bool and outputs[1].numel() == 1:
            bad = bad > outputs[1].reshape(())  # bad and not an overflow step the cell skipped (one op)
        if self._first_step is None or self._first_step.device != bad.device:
            self._first_step = torch.full((), -1, dtype=torch.int64, device=bad.device)
            self._first_epoch = torch.full((), -1, dtype=torch.int64, device=bad.device)
        new = bad & (self._first_step < 0)
        self._first_step.masked_fill_(new, step)  # in place: no scalar tensor made per step
        self._first_epoch.masked_fill_(new, -1 if epoch is None else epoch)

    def check(self) -> None:
        """Raise `DivergenceError` if any observed loss was non-finite (one host read)."""
        if self._first_step is None:
            return
        step, epoch = torch.stack([self._first_step, self._first_epoch]).tolist()
        if step < 0:
            return
        epoch = None if epoch < 0 else epoch
        where = f"step {step}" + (f" (epoch {epoch})" if epoch is not None else "")
        raise DivergenceError(f"training diverged: the loss became non-finite (NaN or inf) at {where}; "
                              f"training stopped and no later checkpoint or version was written; {ROLLBACK}",
                              step=step, epoch=epoch)
