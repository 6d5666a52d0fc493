"""Argument checks of :mod:`recstream.models`.

Each helper raises ``TypeError`` (wrong kind of value) or ``ValueError`` (right kind,
wrong value) naming the owner, the argument, the value given and what is allowed, so a
misconfigured model fails when it is built, not inside a kernel on the first batch.

>>> check_sizes("MLP", "hidden", [64, 32])
(64, 32)
"""
from __future__ import annotations

import numbers
from typing import Any, Iterable

from ..data.schema import Schema


def check_int(owner: str, arg: str, value: Any, minimum: int = 1) -> int:
    """``value`` as an int ``>= minimum``; bool is rejected (``True`` is not a size)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{owner}: '{arg}' must be an int >= {minimum}, got {value!r} ({type(value).__name__})")
    if value < minimum:
        raise ValueError(f"{owner}: '{arg}' must be an int >= {minimum}, got {value!r}")
    return int(value)


def check_optional_int(owner: str, arg: str, value: Any, minimum: int = 1) -> int | None:
    return None if value is None else check_int(owner, arg, value, minimum)


def check_float(owner: str, arg: str, value: Any, low: float, high: float, high_open: bool = True) -> float:
    """A real number in ``[low, high)`` (or ``[low, high]`` with ``high_open=False``)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{owner}: '{arg}' must be a real number, got {value!r} ({type(value).__name__})")
    value = float(value)
    ok = low <= value < high if high_open else low <= value <= high
    if not ok:
        bracket = ")" if high_open else "]"
        raise ValueError(f"{owner}: '{arg}' must be in [{low}, {high}{bracket}, got {value!r}")
    return value


def check_choice(owner: str, arg: str, value: Any, choices: Iterable[str]) -> str:
    choices = tuple(choices)
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{owner}: '{arg}' must be one of {choices}, got {value!r}")
    return value


def check_bool(owner: str, arg: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{owner}: '{arg}' must be a bool, got {value!r} ({type(value).__name__})")
    return value


def check_sizes(owner: str, arg: str, value: Any, allow_empty: bool = True) -> tuple[int, ...]:
    """A sequence of positive layer widths, as a tuple."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise TypeError(f"{owner}: '{arg}' must be a sequence of positive ints, got {value!r}")
    sizes = tuple(value)
    for s in sizes:
        if isinstance(s, bool) or not isinstance(s, numbers.Integral) or s < 1:
            raise ValueError(f"{owner}: '{arg}' must hold positive ints, got {value!r}")
    if not sizes and not allow_empty:
        raise ValueError(f"{owner}: '{arg}' needs at least one layer width, got {value!r}")
    return tuple(int(s) for s in sizes)


def check_schema(owner: str, schema: Any, need_categorical: bool = True) -> Schema:
    if not isinstance(schema, Schema):
        raise TypeError(f"{owner}: 'schema' must be a recstream.data.Schema, got {type(schema).__name__}")
    if need_categorical and schema.num_categorical == 0:
        raise ValueError(f"{owner}: 'schema' must have at least one categorical feature, got {schema!r}")
    return schema
