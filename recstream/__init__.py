"""recstream: train recommendation (CTR) models fast on PyTorch, offline and online.

>>> import recstream
>>> recstream.Model  # doctest: +ELLIPSIS
<class 'recstream.train.model.Model'>
>>> recstream.get_auto_parallel_context("parallel_mode")
'stand_alone'
"""
from .distributed import get_auto_parallel_context, reset_auto_parallel_context, set_auto_parallel_context
from .train import Model, RecModel

__version__ = "0.1.0"
__all__ = ["Model", "RecModel", "set_auto_parallel_context", "get_auto_parallel_context",
           "reset_auto_parallel_context", "__version__"]
