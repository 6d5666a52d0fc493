"""Argument checks for `Model`: each error names the argument, the value and what is allowed."""
from __future__ import annotations

import warnings

from torch import nn

AMP_LEVELS = ("O0", "O1", "O2", "O3", "auto")
BOOST_LEVELS = ("O0", "O1", "O2")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_int(name: str, value) -> int:
    if not _is_int(value):
        raise TypeError(f"'{name}' must be an int, got {type(value).__name__}: {value!r}")
    return value


def check_bool(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"'{name}' must be a bool, got {type(value).__name__}: {value!r}")
    return value


def check_optional_bool(name: str, value):
    return None if value is None else check_bool(name, value)


def check_module(name: str, value) -> None:
    if not isinstance(value, nn.Module):
        raise TypeError(f"'{name}' must be a torch.nn.Module, got {type(value).__name__}")


def check_optimizer(optimizer) -> None:
    if optimizer is None:
        return
    if not (callable(getattr(optimizer, "step", None)) and callable(getattr(optimizer, "zero_grad", None))):
        raise TypeError("'optimizer' must be a torch.optim.Optimizer (an object with step() and zero_grad()), "
                        f"got {type(optimizer).__name__}")


def check_kwargs(kwargs: dict, allowed) -> None:
    for key in kwargs:
        if key not in allowed:
            raise ValueError(f"Model got an unknown keyword argument {key!r}; allowed: {', '.join(allowed)}")


def check_amp_level(level, optimizer) -> str:
    if level not in AMP_LEVELS:
        raise ValueError(f"'amp_level' must be one of {', '.join(AMP_LEVELS)}, got {level!r}")
    if level != "O0" and optimizer is None:
        raise ValueError(f"'amp_level'={level!r} needs an 'optimizer' (mixed precision wraps the training step); "
                         "got optimizer=None. Use amp_level='O0' or pass an optimizer")
    return level


def check_boost_level(level, kwargs: dict) -> str:
    if level not in BOOST_LEVELS:
        raise ValueError(f"'boost_level' must be one of {', '.join(BOOST_LEVELS)}, got {level!r}")
    config = kwargs.get("boost_config_dict")
    if config is not None and not isinstance(config, dict):
        raise TypeError(f"'boost_config_dict' must be a dict, got {type(config).__name__}")
    if level != "O0":
        warnings.warn(f"boost_level={level!r} is accepted but enables no acceleration in this version", stacklevel=3)
    return level


def check_progress_bar(value):
    if value not in ("auto", True, False):
        raise ValueError(f"'progress_bar' must be 'auto', True or False, got {value!r}")
    return value


def check_eval_indexes(eval_indexes) -> None:
    if eval_indexes is None:
        return
    if not isinstance(eval_indexes, list) or len(eval_indexes) != 3 or not all(_is_int(i) for i in eval_indexes):
        raise ValueError("'eval_indexes' must be None or a list of 3 ints (positions of loss, outputs and label "
                         f"in the eval network's outputs), got {eval_indexes!r}")


def check_epochs(epoch, initial_epoch) -> None:
    if not _is_int(epoch) or epoch < 1:
        raise ValueError(f"'epoch' must be a positive int, got {epoch!r}")
    if not _is_int(initial_epoch) or not 0 <= initial_epoch < epoch:
        raise ValueError(f"'initial_epoch' must be an int in [0, epoch={epoch}), got {initial_epoch!r}")


def check_valid_frequency(valid_frequency) -> None:
    if _is_int(valid_frequency):
        if valid_frequency < 1:
            raise ValueError(f"'valid_frequency' must be a positive int or a list of positive ints, got {valid_frequency!r}")
        return
    if isinstance(valid_frequency, list) and valid_frequency and all(_is_int(v) and v >= 1 for v in valid_frequency):
        return
    raise ValueError(f"'valid_frequency' must be a positive int or a non-empty list of positive ints (epochs), "
                     f"got {valid_frequency!r}")
