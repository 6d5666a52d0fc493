"""The runnable examples in the docstrings of the core modules are tested."""
import doctest
import importlib

import pytest

MODULES = ["recstream", "recstream.train.model", "recstream.train.rec_model", "recstream.train.cells",
           "recstream.train.sink", "recstream.data.channel", "recstream.callbacks.base",
           "recstream.callbacks.loss_monitor"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
