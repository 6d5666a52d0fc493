"""Argument checks shared by :mod:`recstream.nn`.

Every helper raises ``TypeError`` (wrong kind of value) or ``ValueError``
(right kind, wrong value) with a message naming the argument, the value that
was given and what is allowed, so a misconfigured model fails at construction
time with an actionable message instead of deep inside a kernel.

Example:
    >>> check_int("capacity", 8, min_value=1)
    8
"""

from __future__ import annotations

import numbers
from typing import Iterable, Optional

import torch

__all__ = [
    "check_int",
    "check_optional_int",
    "check_float",
    "check_choice",
    "check_int_tensor",
]


def check_int(name: str, value, *, min_value: Optional[int] = None) -> int:
    """Return ``value`` as ``int``; ``bool`` is rejected (``True`` is not a size)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    value = int(value)
    if min_value is not None and value < min_value:
        raise ValueError(f"{name} must be an int >= {min_value}, got {value}")
    return value


def check_optional_int(name: str, value, *, min_value: Optional[int] = None) -> Optional[int]:
    """Like :func:`check_int` but ``None`` passes through (feature disabled)."""
    return None if value is None else check_int(name, value, min_value=min_value)


def check_float(name: str, value, *, min_value: float = 0.0, strict: bool = False) -> float:
    """Return ``value`` as ``float``; require ``value > min_value`` if ``strict`` else ``>=``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {value!r} ({type(value).__name__})")
    value = float(value)
    if value != value or (value <= min_value if strict else value < min_value):
        op = ">" if strict else ">="
        raise ValueError(f"{name} must be a finite number {op} {min_value}, got {value}")
    return value


def check_choice(name: str, value, choices: Iterable[str]) -> str:
    """Return ``value`` if it is one of ``choices`` (strings)."""
    choices = tuple(choices)
    if not isinstance(value, str):
        raise TypeError(f"{name} must be one of {choices}, got {value!r} ({type(value).__name__})")
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")
    return value


def check_int_tensor(name: str, value, *, ndim: Optional[int] = None,
                     dtypes: Optional[tuple] = None) -> torch.Tensor:
    """Require an integer tensor (optionally of given ``ndim`` / ``dtypes``)."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    allowed = dtypes or (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)
    if value.dtype not in allowed:
        raise TypeError(f"{name} must have dtype in {tuple(str(d) for d in allowed)}, got {value.dtype}")
    if ndim is not None and value.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(value.shape)}")
    return value
