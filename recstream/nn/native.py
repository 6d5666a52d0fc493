"""The hash tables' compiled CPU kernels, where this install built them.

``kernels`` is the extension module ``recstream.nn._hash_kernels`` (``_hash_kernels.c``; the
comment atop it says what it does and why it is C), or None where it was not built (no C compiler
at install time): `TensorHashTable`, [`HashEmbedding`][recstream.nn.hash_embedding.HashEmbedding]
and `lru_select` then run the same algorithms on torch ops, which leave the
same state. ``AVAILABLE`` says which. Callers read ``native.kernels`` at call time, so a test can
switch the kernels off for a run.

>>> isinstance(AVAILABLE, bool)
True
"""

try:
    from . import _hash_kernels as kernels
except ImportError:  # pragma: no cover - depends on the install having had a C compiler
    kernels = None

__all__ = ["kernels", "AVAILABLE"]

AVAILABLE = kernels is not None
