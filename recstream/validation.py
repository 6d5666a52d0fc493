"""Argument validation for every recstream package: one signature style, one rule.

Every check takes ``(owner, name, value, ...)`` and returns the value (normalised where that is
free, e.g. a numpy integer becomes an ``int``). The rule, everywhere in recstream:

- the value has the wrong *type* -> ``TypeError``;
- the value has the right type but is out of range or not one of the choices -> ``ValueError``;
- both messages name the owner (class or function), the argument, the value given and what is
  allowed, e.g. ``EmbeddingTableConfig: 'dim' must be an int >= 1, got 0``.

``bool`` is never accepted where a number is expected (``True`` is not a size), and numbers must
be finite. Validate an argument once, where it enters the public API; internal helpers trust
their callers.

>>> check_int("MLP", "width", 64, minimum=1)
64
>>> check_int("MLP", "width", 0, minimum=1)
Traceback (most recent call last):
    ...
ValueError: MLP: 'width' must be an int >= 1, got 0
>>> check_choice("Model", "amp_level", "O1", ("O0", "O1", "O2"))
'O1'
>>> check_bool("Model.train", "dataset_sink_mode", "yes")
Traceback (most recent call last):
    ...
TypeError: Model.train: 'dataset_sink_mode' must be a bool, got 'yes' (str)
"""
from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping
from typing import Any

import torch

__all__ = ["check_bool", "check_callable", "check_choice", "check_int", "check_int_tensor", "check_kwargs",
           "check_module", "check_number", "check_sizes", "check_str", "check_type", "describe"]


def describe(value: Any) -> str:
    """``repr`` of `value` with its type name, short enough for an error message."""
    text = repr(value)
    if len(text) > 80:
        text = text[:77] + "..."
    return f"{text} ({type(value).__name__})"


def _type_error(owner: str, name: str, allowed: str, value: Any) -> TypeError:
    return TypeError(f"{owner}: '{name}' must be {allowed}, got {describe(value)}")


def _value_error(owner: str, name: str, allowed: str, value: Any) -> ValueError:
    return ValueError(f"{owner}: '{name}' must be {allowed}, got {value!r}")


def _or_none(allowed: str, allow_none: bool) -> str:
    return f"{allowed} or None" if allow_none else allowed


def _bounds(minimum, maximum, min_open: bool = False, max_open: bool = False) -> str:
    parts = []
    if minimum is not None:
        parts.append(f"{'>' if min_open else '>='} {minimum}")
    if maximum is not None:
        parts.append(f"{'<' if max_open else '<='} {maximum}")
    return " and ".join(parts)


def check_type(owner: str, name: str, value: Any, types: type | tuple[type, ...], *, allowed: str | None = None,
               allow_none: bool = False) -> Any:
    """`value` if it is an instance of `types` (or None when `allow_none`); else ``TypeError``.

    `allowed` describes the accepted types in the message (default: their names).
    """
    if value is None and allow_none:
        return None
    if not isinstance(value, types):
        if allowed is None:
            names = [t.__name__ for t in (types if isinstance(types, tuple) else (types,))]
            allowed = "a " + " or ".join(names)
        raise _type_error(owner, name, _or_none(allowed, allow_none), value)
    return value


def check_bool(owner: str, name: str, value: Any, *, allow_none: bool = False) -> bool | None:
    """A ``bool`` (not merely truthy: ``1`` and ``"yes"`` are rejected)."""
    if value is None and allow_none:
        return None
    if not isinstance(value, bool):
        raise _type_error(owner, name, _or_none("a bool", allow_none), value)
    return value


def check_int(owner: str, name: str, value: Any, *, minimum: int | None = None, maximum: int | None = None,
              allow_none: bool = False) -> int | None:
    """An integer (python or numpy, never bool) in ``[minimum, maximum]``, returned as ``int``."""
    if value is None and allow_none:
        return None
    bounds = _bounds(minimum, maximum)
    allowed = _or_none("an int" + (f" {bounds}" if bounds else ""), allow_none)
    if isinstance(value, torch.SymInt):  # a size traced by torch.export: int() would fix it to one value
        if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
            raise _value_error(owner, name, allowed, value)
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise _type_error(owner, name, allowed, value)
    value = int(value)
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise _value_error(owner, name, allowed, value)
    return value


def check_number(owner: str, name: str, value: Any, *, minimum: float | None = None, maximum: float | None = None,
                 min_open: bool = False, max_open: bool = False, allow_none: bool = False,
                 finite: bool = True) -> float | None:
    """A real number (never bool) within the bounds (open ends with `min_open`/`max_open`), as float.

    NaN is always rejected; infinities unless ``finite=False``.
    """
    if value is None and allow_none:
        return None
    bounds = _bounds(minimum, maximum, min_open, max_open)
    allowed = _or_none(("a finite number" if finite else "a number") + (f" {bounds}" if bounds else ""), allow_none)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise _type_error(owner, name, allowed, value)
    number = float(value)
    if math.isnan(number) or (finite and math.isinf(number)):
        raise _value_error(owner, name, allowed, value)
    low_bad = minimum is not None and (number <= minimum if min_open else number < minimum)
    high_bad = maximum is not None and (number >= maximum if max_open else number > maximum)
    if low_bad or high_bad:
        raise _value_error(owner, name, allowed, value)
    return number


def check_choice(owner: str, name: str, value: Any, choices: Iterable[Any], *, allow_none: bool = False) -> Any:
    """`value` if it is one of `choices`; ``TypeError`` when its type matches none of theirs."""
    choices = tuple(choices)
    if value is None and allow_none:
        return None
    allowed = _or_none(f"one of {list(choices)}", allow_none)
    # bool is its own kind here: True must not pass as the int 1 (or vice versa).
    kinds = {bool if isinstance(c, bool) else type(c) for c in choices}
    kind = bool if isinstance(value, bool) else type(value)
    if not any(issubclass(kind, k) and (k is bool) == (kind is bool) for k in kinds):
        raise _type_error(owner, name, allowed, value)
    if not any(value == c and isinstance(value, bool) == isinstance(c, bool) for c in choices):
        raise _value_error(owner, name, allowed, value)
    return value


def check_str(owner: str, name: str, value: Any, *, non_empty: bool = True, allow_none: bool = False) -> str | None:
    """A ``str`` (non-empty unless ``non_empty=False``)."""
    if value is None and allow_none:
        return None
    allowed = _or_none("a non-empty str" if non_empty else "a str", allow_none)
    if not isinstance(value, str):
        raise _type_error(owner, name, allowed, value)
    if non_empty and not value:
        raise _value_error(owner, name, allowed, value)
    return value


def check_callable(owner: str, name: str, value: Any, *, allow_none: bool = False) -> Any:
    """Anything callable (a function, an ``nn.Module``, an object with ``__call__``)."""
    if value is None and allow_none:
        return None
    if not callable(value):
        raise _type_error(owner, name, _or_none("callable", allow_none), value)
    return value


def check_module(owner: str, name: str, value: Any, *, allow_none: bool = False) -> torch.nn.Module | None:
    """A ``torch.nn.Module``."""
    return check_type(owner, name, value, torch.nn.Module, allowed="a torch.nn.Module", allow_none=allow_none)


def check_sizes(owner: str, name: str, value: Any, *, allow_empty: bool = True) -> tuple[int, ...]:
    """A sequence of positive ints (layer widths, table sizes), as a tuple."""
    allowed = "a sequence of positive ints" + ("" if allow_empty else " (at least one)")
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
        raise _type_error(owner, name, allowed, value)
    sizes = tuple(value)
    for size in sizes:
        if isinstance(size, bool) or not isinstance(size, numbers.Integral):
            raise _type_error(owner, name, allowed, value)
        if size < 1:
            raise _value_error(owner, name, allowed, value)
    if not sizes and not allow_empty:
        raise _value_error(owner, name, allowed, value)
    return tuple(int(s) for s in sizes)


_INT_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def check_int_tensor(owner: str, name: str, value: Any, *, ndim: int | None = None,
                     dtypes: tuple[torch.dtype, ...] = _INT_DTYPES) -> torch.Tensor:
    """An integer ``torch.Tensor`` (of one of `dtypes`; with `ndim` dimensions when given).

    A tensor of the wrong dtype is a wrong type (``TypeError``); a wrong shape is a wrong value.
    """
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{owner}: '{name}' must be a torch.Tensor, got {type(value).__name__}")
    if value.dtype not in dtypes:
        raise TypeError(f"{owner}: '{name}' must have a dtype in {[str(d) for d in dtypes]}, got {value.dtype}")
    if ndim is not None and value.dim() != ndim:
        raise ValueError(f"{owner}: '{name}' must be {ndim}-D, got shape {tuple(value.shape)}")
    return value


def check_kwargs(owner: str, kwargs: Mapping[str, Any], allowed: Iterable[str]) -> None:
    """Reject keyword arguments not in `allowed` (``ValueError``, as MindSpore's Model does)."""
    allowed = tuple(allowed)
    for key in kwargs:
        if key not in allowed:
            raise ValueError(f"{owner}: unknown keyword argument {key!r}; allowed: {', '.join(allowed)}")
