"""Root of the test run (tests/ and the docstring examples under recstream/): docstring examples
that need a missing optional extra are skipped with its install line."""
import doctest

import pytest


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
