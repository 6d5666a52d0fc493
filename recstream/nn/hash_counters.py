"""A dynamic table's counters seen from the host without a sync: `CounterWatch`.

On a device, `HashEmbedding`'s training step reads nothing back while the host's bounds of its free
rows, pending keys and used slots show room for the batch (`hash_replay`). Those bounds take every
lookup's worst case -- each of its n keys new and admitted -- so they run out long before the table
does (a batch of 26 features x 4,096 ids "takes" 106,496 rows, of which a warm table may admit a few
thousand), and then a step reads the counters: a host sync, and under a CUDA graph
(`recstream.train.cuda_graph`) a step run eagerly instead of replayed.

So when the bounds run low, the table copies its counters to host memory asynchronously (a
non-blocking copy into pinned memory, and an event behind it), and a later step that finds the copy
done takes its values as new bounds: the counters as they were when the copy was queued, minus the
worst case of every lookup queued since (`CounterWatch.taken` counts them). A bound is only replaced
by a tighter one, and a copy is void once the host has set the counters itself since (a read and its
decision, a load, the host path's step, a rebuild: `CounterWatch.void`, and the hash table's own
``epoch``), because then the lookups it took are no longer all that changed them. A table whose copy
is not done yet keeps its bounds; it reads only when they truly show no room. On a CPU (the tests,
under ``recstream.hostpath.device_path``) the copy is done at once.

    >>> import torch
    >>> from recstream.hostpath import device_path
    >>> from recstream.nn import HashEmbedding
    >>> emb = HashEmbedding(2, capacity=64)
    >>> emb.table_backend = "torch"
    >>> with device_path():
    ...     for step in range(6):
    ...         _ = emb(torch.tensor([1, 2, 3, 4, 5, 6, 7, 8, 9, 10]))   # the same 10 keys each step
    >>> emb._free_bound   # 6 x 10 taken from 64 would leave 4; the last copy saw 54 free, less this step's 10
    44
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

__all__ = ["CounterWatch", "LOOKAHEAD"]

LOOKAHEAD = 4
"""A copy is queued once the bounds show room for fewer than this many lookups of the current size."""


def _capturing(emb) -> bool:
    """Whether `emb`'s step is being captured into a CUDA graph now."""
    return emb.num_free_t.is_cuda and torch.cuda.is_current_stream_capturing()


def _host_values(host: torch.Tensor) -> list[int]:
    """The int64 values of a contiguous CPU buffer (pinned, or a CPU table's counters), read as host
    memory: no torch call. On a GPU the copy into it is done (its event says so), so this is no device
    read; `recstream.testing.SyncCounter` counts ``Tensor.numpy``/``tolist`` as host copies, which is
    why they are not used here."""
    return list((ctypes.c_int64 * host.numel()).from_address(host.data_ptr()))


@dataclass(frozen=True)
class _Copy:
    """A copy of the counters in flight: where it lands, the event after it (None on a CPU: done at
    once), `CounterWatch.taken` when it was queued, and the hash table it counted (which one, and
    its `epoch`: the table's own counters set by the host since make the copy void)."""

    host: torch.Tensor
    event: torch.cuda.Event | None
    taken: int
    table: tuple[int, int]


class CounterWatch:
    """The asynchronous copy of one table's counters, and what the host took since (module doc).
    Not state: a copied module (deepcopy, pickle) starts with none in flight."""

    def __init__(self) -> None:
        self.taken = 0  # the worst case of every lookup the host has let through (keys, cumulative)
        self._flight: _Copy | None = None  # the copy queued last, until polled done

    def __deepcopy__(self, memo) -> CounterWatch:
        return CounterWatch()

    def __getstate__(self) -> dict:
        return {}

    def __setstate__(self, state: dict) -> None:
        self.__init__()

    def void(self) -> None:
        """The host set the counters: a copy queued before says nothing of the lookups since."""
        self._flight = None

    @staticmethod
    def _table(emb) -> tuple[int, int]:
        return id(emb.table), emb.table.epoch

    def post(self, emb) -> None:
        """Queue a copy of `emb`'s counters (free rows, pending keys, used slots) to the host, unless one
        is in flight. Not while a CUDA graph is captured (the copy would be recorded in it)."""
        if self._flight is not None or _capturing(emb):
            return
        values = torch.stack([emb.num_free_t, emb.num_pending_t, emb.table.num_used_t])
        if values.is_cuda:
            host = torch.empty(3, dtype=torch.int64, pin_memory=True)
            host.copy_(values, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
        else:
            host, event = values, None
        self._flight = _Copy(host, event, self.taken, self._table(emb))

    def poll(self, emb) -> None:
        """Where the copy in flight is done: tighten `emb`'s bounds by it (module doc). Not while a
        CUDA graph is captured (an event's query is not allowed then: the capture would fail)."""
        if self._flight is None or _capturing(emb):
            return
        copy = self._flight
        if copy.event is not None and not copy.event.query():
            return
        self._flight = None
        if copy.table != self._table(emb):
            return
        free, pending, used = _host_values(copy.host)
        since = self.taken - copy.taken
        emb._free_bound = max(emb._free_bound, free - since)
        if emb.permit_filter_value > 1:
            emb._pending_bound = min(emb._pending_bound, pending + since)
        table = emb.table
        if table._stale:
            table.used_bound = min(table.used_bound, used + since)
