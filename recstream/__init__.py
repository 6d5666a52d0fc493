"""recstream: train recommendation (CTR) models fast on PyTorch, offline and online.

>>> import recstream
>>> recstream.Model  # doctest: +ELLIPSIS
<class 'recstream.train.model.Model'>
>>> recstream.get_auto_parallel_context("parallel_mode")
'stand_alone'
"""
import importlib

__version__ = "0.1.0"
__all__ = ["Model", "RecModel", "set_auto_parallel_context", "get_auto_parallel_context",
           "reset_auto_parallel_context", "__version__"]

# Imported on first use (PEP 562) so that `recstream --help` / `--version` do not load torch.
_LAZY = {"Model": "train", "RecModel": "train", "set_auto_parallel_context": "distributed",
         "get_auto_parallel_context": "distributed", "reset_auto_parallel_context": "distributed"}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'recstream' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
