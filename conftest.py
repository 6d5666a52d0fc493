"""Root of the test run (tests/ and the docstring examples under recstream/): docstring examples
that need a missing optional extra are skipped with its install line; without a GPU, Triton's
kernels are run by its interpreter."""
import doctest
import os

import pytest
import torch

# Without a GPU the Triton kernels (recstream/nn/hash_triton.py, recstream/optim/_triton_row_kernels.py)
# are checked by Triton's interpreter on CPU tensors. It is chosen when a kernel is decorated, i.e. when
# its module is first imported -- by the doctest collection of recstream/, before any test module could
# set it: so here, before collection. With a GPU the kernels are compiled and the GPU tests check them.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """A docstring example of an optional extra (MLflow, Kafka, serving, ...) where that extra is not
    installed: skipped, naming the install line, as the tests of those extras are (importorskip). Only
    recstream's own ImportError that names an extra counts; any other failure stays a failure."""
    try:
        return (yield)
    except doctest.UnexpectedException as e:
        error = e.exc_info[1]
        if isinstance(error, ImportError) and "pip install 'recstream[" in str(error):
            pytest.skip(f"needs an optional extra: {error}")
        raise
