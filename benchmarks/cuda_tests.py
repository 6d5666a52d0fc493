"""A pytest plugin that keeps only the suite's CUDA tests (used by ``gpu_check.sh`` on a GPU machine).

The suite has no ``cuda`` marker: a CUDA test is skipped off CUDA by a ``skipif`` (on the test, its
class or module, or a parameter), is parametrized with a ``cuda`` device, or reaches CUDA in its
body. So a test is kept when any of these mentions CUDA: its node id (name and parameter ids), the
``skipif``/``xfail`` markers that apply to it (their conditions and reasons), a ``cuda`` marker, or
the source of its function (decorators included: a test parametrized over ``cpu`` and ``cuda`` is
kept whole). Doctests and other non-function items are dropped. Everything dropped
is reported as deselected, so pytest's summary line counts both.

    python -m pytest -p cuda_tests tests/...   # with benchmarks/ on PYTHONPATH
"""
from __future__ import annotations

import inspect


def mentions_cuda(item) -> bool:
    """Whether `item` (a collected pytest item) is a CUDA test in the sense above."""
    function = getattr(item, "function", None)
    if function is None:  # a doctest or a non-Python item
        return False
    if "cuda" in item.nodeid.lower():
        return True
    for mark in item.iter_markers():
        if mark.name == "cuda":
            return True
        if mark.name in ("skipif", "xfail") and "cuda" in f"{mark.args!r} {mark.kwargs!r}".lower():
            return True
    try:
        return "cuda" in inspect.getsource(function).lower()
    except (OSError, TypeError):  # no source (a generated test): the checks above decide
        return False


def pytest_collection_modifyitems(config, items):
    keep = [item for item in items if mentions_cuda(item)]
    dropped = [item for item in items if not mentions_cuda(item)]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = keep
