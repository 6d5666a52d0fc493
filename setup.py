"""Build of the one compiled part of recstream; everything else is configured in pyproject.toml.

TensorHashTable's CPU kernels (lookup and insert; the comment atop the C file says why they are C).
The extension is optional: where no C compiler is found the install goes on and the table runs its
torch ops (``recstream.nn.native.AVAILABLE`` tells which).
"""
from setuptools import Extension, setup

setup(ext_modules=[Extension("recstream.nn._hash_kernels", ["recstream/nn/_hash_kernels.c"], optional=True)])
