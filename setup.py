"""Build of the one compiled part of recstream; everything else is configured in pyproject.toml.

The hash tables' CPU kernels (lookup, insert, admission, LRU select; the comment atop the C file says
why they are C). The extension is optional: where no C compiler is found the install goes on and the
tables run their torch ops (``recstream.nn.native.AVAILABLE`` tells which).
"""
from setuptools import Extension, setup

setup(ext_modules=[Extension("recstream.nn._hash_kernels", ["recstream/nn/_hash_kernels.c"], optional=True)])
