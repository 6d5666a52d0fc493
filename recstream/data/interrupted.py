"""A read interrupted by the user is not a corrupt file.

pyarrow answers a SIGINT that arrives during one of its reads with ``pyarrow.ArrowCancelled``, an
``ArrowException`` like a corrupt page's. The readers and streams skip or dead-letter data whose read
raised an ``ArrowException`` (the rest of a file, a row group, a run of records): for a cancelled read
that would drop good rows, and the checkpoint after it would make the loss permanent. So every such
handler first calls `reraise_interrupt`, which turns a cancellation into the ``KeyboardInterrupt``
it stands for (nothing is skipped, the position stays before the interrupted read).

>>> import pyarrow as pa
>>> reraise_interrupt(pa.ArrowInvalid("bad page"))  # a data error: the caller handles it
>>> try:
...     reraise_interrupt(pa.ArrowCancelled("Operation cancelled"))
... except KeyboardInterrupt as e:
...     print(e)
interrupted during a read: Operation cancelled
"""
from __future__ import annotations

import pyarrow as pa

__all__ = ["reraise_interrupt"]


def reraise_interrupt(error: BaseException) -> None:
    """Raise ``KeyboardInterrupt`` if `error` is pyarrow's cancellation of a read; else return."""
    if isinstance(error, pa.ArrowCancelled):
        raise KeyboardInterrupt(f"interrupted during a read: {error}") from error
