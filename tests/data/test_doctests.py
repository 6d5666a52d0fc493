"""Run the examples in every docstring of recstream.data: they are part of the docs."""
import doctest
import importlib
import pkgutil

import pytest

import recstream.data

MODULES = sorted(m.name for m in pkgutil.iter_modules(recstream.data.__path__, "recstream.data.")
                 if not m.name.startswith("recstream.data.streams"))


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
