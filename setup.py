"""Build of the compiled parts of recstream; everything else is configured in pyproject.toml.

Three optional C extensions (the comment atop each C file says why it is C): the hash tables' CPU
kernels (lookup, insert, admission, LRU select), the row-sparse optimizers' CPU row updates
(RowWiseAdagrad, FTRL) and the disk tier's row copies and cached lookup. Where no C compiler is found
the install goes on and the same algorithms run as torch ops or numpy (``recstream.nn.native.AVAILABLE``
/ ``recstream.optim.native.AVAILABLE`` / ``recstream.nn.tier_kernels.AVAILABLE`` tell which).
"""
from setuptools import Extension, setup

setup(ext_modules=[
    Extension("recstream.nn._hash_kernels", ["recstream/nn/_hash_kernels.c"], optional=True),
    Extension("recstream.optim._row_kernels", ["recstream/optim/_row_kernels.c"], optional=True),
    Extension("recstream.nn._tier_kernels", ["recstream/nn/_tier_kernels.c"], optional=True),
])
