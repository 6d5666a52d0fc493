"""recstream: train recommendation (CTR) models fast on PyTorch, offline and online.

>>> import recstream
>>> recstream.Model  # doctest: +ELLIPSIS
<class 'recstream.train.model.Model'>
"""
from .train import Model, RecModel

__version__ = "0.1.0"
__all__ = ["Model", "RecModel", "__version__"]
