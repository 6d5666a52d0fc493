"""The [`Metric`][recstream.metrics.base.Metric] base class: MindSpore's clear/update/eval protocol on torch tensors."""
from __future__ import annotations

import abc
import functools

import torch

from recstream.metrics._inputs import accumulator_dtype
from recstream.validation import check_int, check_type


def _copy(value):
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, list):
        return [_copy(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_copy(v) for v in value)
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    return value


def select_inputs(metric, inputs: tuple) -> tuple:
    """``inputs`` re-ordered by ``metric.indexes`` (all of them, in order, when it is None or empty)."""
    indexes = getattr(metric, "indexes", None)
    if not indexes:
        return inputs
    if max(indexes) >= len(inputs) or min(indexes) < -len(inputs):
        raise ValueError(
            f"{type(metric).__name__}.update: indexes {indexes} do not fit the "
            f"{len(inputs)} input(s) received."
        )
    return tuple(inputs[i] for i in indexes)


def rearrange_inputs(func):
    """Decorate a custom metric's ``update`` so that it receives the inputs picked by ``set_indexes``.

    As ``mindspore.train.rearrange_inputs``: for a network with several outputs, ``set_indexes([2, 0])``
    makes ``update(a, b, c)`` run as ``update(c, a)``. recstream's built-in metrics apply their
    indexes themselves; decorate only your own ``update``.

    Example:
        >>> from recstream.metrics import Metric, rearrange_inputs
        >>> class Last(Metric):
        ...     def clear(self):
        ...         self.seen = None
        ...     @rearrange_inputs
        ...     def update(self, *inputs):
        ...         self.seen = inputs
        ...     def eval(self):
        ...         return self.seen
        >>> Last().set_indexes([2, 0])("logits", "aux", "label")
        ('label', 'logits')
    """

    @functools.wraps(func)
    def wrapper(self, *inputs):
        return func(self, *select_inputs(self, inputs))

    return wrapper


class Metric(abc.ABC):
    """Base class of all metrics, following ``mindspore.train.Metric``.

    ``clear()`` resets the accumulators, ``update(*inputs)`` adds one batch and
    ``eval()`` returns the result; calling the metric does all three on one batch.

    ``update`` never synchronises with the device: built-in metrics accumulate into
    tensors on the inputs' device and only ``eval`` reads values back. Value checks
    that would need a read-back (labels outside {0, 1}, NaN scores...) are counted on
    the device during ``update`` and raised as ``ValueError`` by ``eval``.

    Subclasses list their accumulator attributes (without the leading underscore)
    in ``_state_names`` to get ``state_dict``/``load_state_dict`` for free.

    Example:
        >>> import torch
        >>> from recstream.metrics import Metric
        >>> class Mean(Metric):
        ...     _state_names = ("total", "count")
        ...     def clear(self):
        ...         self._total, self._count = None, 0
        ...     def update(self, *inputs):
        ...         self._accumulate("_total", inputs[0].sum())
        ...         self._count += inputs[0].numel()
        ...     def eval(self):
        ...         return float(self._total) / self._count
        >>> m = Mean()
        >>> m.clear()
        >>> m.update(torch.tensor([1.0, 2.0]))
        >>> m.update(torch.tensor([6.0]))
        >>> m.eval()
        3.0
        >>> m(torch.tensor([4.0]))
        4.0
    """

    _state_names: tuple[str, ...] = ()

    def __init__(self):
        self._indexes = None
        self._invalid = {}

    # -- MindSpore's input re-ordering -------------------------------------------------
    @property
    def indexes(self):
        """Positions of the network outputs that ``update`` receives (None: all, in order)."""
        return getattr(self, "_indexes", None)

    def set_indexes(self, indexes):
        """Make ``update(*outputs)`` use ``outputs[i] for i in indexes``; returns ``self``."""
        owner = f"{type(self).__name__}.set_indexes"
        check_type(owner, "indexes", indexes, list, allowed="a list of int")
        for position, index in enumerate(indexes):
            check_int(owner, f"indexes[{position}]", index)
        self._indexes = indexes
        return self

    def _select(self, inputs: tuple) -> tuple:
        return select_inputs(self, inputs)

    # -- protocol ----------------------------------------------------------------------
    @abc.abstractmethod
    def clear(self):
        """Reset all accumulated state."""

    @abc.abstractmethod
    def update(self, *inputs):
        """Accumulate one batch (no device synchronisation)."""

    @abc.abstractmethod
    def eval(self):
        """Compute the metric from the accumulated state."""

    def __call__(self, *inputs):
        """Evaluate one batch on its own: ``clear()``, ``update(*inputs)``, ``eval()``."""
        self.clear()
        self.update(*inputs)
        return self.eval()

    # -- helpers for subclasses ----------------------------------------------------------
    def _accumulate(self, attr: str, value: torch.Tensor) -> None:
        current = getattr(self, attr)
        setattr(self, attr, value if current is None else current + value.to(current.device))

    def _reset_invalid(self) -> None:
        self._invalid = {}

    def _flag_invalid(self, key: str, values: torch.Tensor, bad: torch.Tensor, rule: str) -> None:
        """Count ``bad`` entries of ``values`` on the device and keep the first one seen.

        ``rule`` names the argument and what it allows, e.g. "y must be 0 or 1".
        """
        flat_bad = bad.reshape(-1)
        if flat_bad.numel() == 0:
            return
        count = flat_bad.sum()
        # argmax of a 0/1 vector is the first True position (0 when none): no read-back.
        first = flat_bad.to(torch.uint8).argmax().reshape(1)
        example = values.reshape(-1).gather(0, first)[0].to(accumulator_dtype(values.device))
        if key in self._invalid:
            old_count, old_example, _ = self._invalid[key]
            example = torch.where(old_count > 0, old_example, example.to(old_example.device))
            count = old_count + count.to(old_count.device)
        self._invalid[key] = (count, example, rule)

    def _raise_invalid(self) -> None:
        """Raise the ValueError deferred from ``update`` (reads the counters back)."""
        for count, example, rule in self._invalid.values():
            n = int(count)
            if n:
                raise ValueError(
                    f"{type(self).__name__}: {rule}; update() received {n} value(s) that are not, "
                    f"first one: {example.item()!r}."
                )

    # -- checkpointing -------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Copies of the accumulators (tensors stay on their device) and plain values."""
        state = {name: _copy(getattr(self, "_" + name)) for name in self._state_names}
        state["invalid"] = _copy(getattr(self, "_invalid", {}))
        return state

    def load_state_dict(self, state: dict) -> None:
        """Restore accumulators saved by `state_dict` of the same metric type."""
        check_type(f"{type(self).__name__}.load_state_dict", "state", state, dict)
        expected = set(self._state_names) | {"invalid"}
        missing, unexpected = expected - set(state), set(state) - expected
        if missing or unexpected:
            raise ValueError(
                f"{type(self).__name__}.load_state_dict: state keys must be {sorted(expected)}, "
                f"missing {sorted(missing)}, unexpected {sorted(unexpected)}."
            )
        self._check_state(state)
        for name in self._state_names:
            setattr(self, "_" + name, _copy(state[name]))
        self._invalid = _copy(state["invalid"])

    def _check_state(self, state: dict) -> None:  # noqa: B027 - optional hook, not abstract
        """Hook: subclasses reject states that do not fit their configuration (default: accept)."""
