"""Which code path a tensor's step takes: the host's, or the one a device (CUDA) runs.

A few steps of a training step have two implementations. On a CPU, reading a tensor's values on
the host is free (no device to wait for), so a check can raise a clear error, a single-hot batch
can be recognised by comparing its offsets, and a row-sparse gradient can be coalesced by
`unique` into exactly its touched rows. On a device, each of those reads is a host
synchronisation, so the device path runs static-shape ops instead (device-side asserts, sort and
boundary masks, outputs sized to the input). :func:`host_reads_free` tells which applies.

:func:`device_path` makes CPU tensors take the device path for a while: that is how the test suite
runs the ops CUDA runs on a machine without a GPU, and counts their host synchronisations
(``recstream.testing.SyncCounter``). It changes which (equivalent) ops run, not the results.

>>> import torch
>>> host_reads_free(torch.zeros(1))
True
>>> with device_path():
...     host_reads_free(torch.zeros(1))
False
"""
from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch

__all__ = ["host_reads_free", "device_path"]

_forced = threading.local()


def host_reads_free(t: torch.Tensor) -> bool:
    """Whether reading `t`'s values on the host costs no device synchronisation: `t` is on the CPU
    and :func:`device_path` is not in force (in this thread)."""
    return t.device.type == "cpu" and not getattr(_forced, "on", False)


@contextmanager
def device_path() -> Iterator[None]:
    """Within the block (this thread), CPU tensors take the path a device runs (see the module)."""
    before = getattr(_forced, "on", False)
    _forced.on = True
    try:
        yield
    finally:
        _forced.on = before
