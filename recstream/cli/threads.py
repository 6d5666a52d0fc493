"""`default_threads`: how many torch threads the commands use when the user says nothing.

torch's default is one thread per core, which is best on an idle machine and worst on a busy one:
OpenMP threads spin-wait for each other, and on a busy machine one of them keeps losing its core,
so every step waits for it (figures: docs/benchmarks.md). So: all cores when the machine is idle,
else the cores that are free (at least 1), judged by the 1-minute load average.

>>> default_threads(cores=2, load=0.1), default_threads(cores=2, load=1.2), default_threads(cores=8, load=3.0)
(2, 1, 5)
"""
from __future__ import annotations

import os

from ..data.channel import available_cores


def default_threads(cores: int | None = None, load: float | None = None) -> int:
    """Cores minus the load (rounded), at least 1; `cores`/`load` default to this machine's."""
    cores = available_cores() if cores is None else cores
    if load is None:
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    return max(1, min(cores, cores - int(load + 0.5)))
