"""What a training step of a `HashEmbedding` does on the host, so that a CUDA graph of the step can
be replayed (`recstream.train.cuda_graph`).

A device-path step that needs no host read (the table has room by the host's bounds) changes, besides
its tensors, only host numbers: the step count, and the bounds of free rows, pending keys and used
slots that decide whether a later step must read the counters. A replayed graph runs the tensors'
side alone. So the step that is captured records its host side as `HostEvent`s; before each replay
the graph asks every table whether the same host side holds now (`replay_ready`: the same age-pass
pattern, room by the bounds for the same number of keys) and then applies it (`replay_host`). A step
that needed a read, ran the host path or logged evictions is not replayable: the graph step runs it
eagerly, with its one read, and replays again once the bounds show room.

The tensors' side must not bake a step's host numbers into the captured kernels: the step count
they write is read from ``global_step_t`` on the device (tests/nn/test_hash_replay.py checks that
two steady steps dispatch the same ops with the same arguments).
"""
from __future__ import annotations

from dataclasses import dataclass

from .hash_counters import LOOKAHEAD

__all__ = ["GraphReplay", "HostEvent", "HostSnapshot"]


@dataclass(frozen=True)
class HostEvent:
    """One host-side effect of a training step: ``"step"`` (a `step()` call; `age`: its age pass
    ran on the device), ``"room"`` (a lookup of `n` unique-key slots that the bounds had room for),
    or ``"other"`` (a read of the counters, the host path, logged evictions: not replayable)."""

    kind: str
    n: int = 0
    age: bool = False


@dataclass(frozen=True)
class HostSnapshot:
    """The host mirrors of a table, to undo a capture that CUDA refused (its Python ran, its
    kernels did not)."""

    step: int
    counts: tuple[int, int, int, int]  # free rows, pending keys, and their bounds
    stale: bool
    table: tuple[int, bool]  # used-slot bound and staleness of the hash table's mirrors
    reset_parts: int


class GraphReplay:
    """The replay methods of `HashEmbedding` (a mixin: its state is the module's)."""

    _host_log: list[HostEvent] | None = None

    def record_host(self) -> None:
        """Start recording this table's host events (until `recorded_host`)."""
        self._host_log = []

    def recorded_host(self) -> tuple[HostEvent, ...]:
        """The host events since `record_host`; stops recording."""
        events, self._host_log = self._host_log or [], None
        return tuple(events)

    def _log_host(self, event: HostEvent) -> None:
        if self._host_log is not None:
            self._host_log.append(event)

    def _room(self, n: int, free: int, pending: int, used: int) -> bool:
        """Whether bounds (`free` rows, `pending` keys, `used` slots) show room for `n` keys."""
        return (free >= n and used + n <= self._used_limit() * self.table.num_slots
                and (self.permit_filter_value == 1 or pending + n <= self.pending_capacity))

    def _take_room(self, n: int) -> None:
        """Move the bounds on by a batch of `n` keys' worst case: at most n admitted, n more
        pending, n slots used (the counters on the device are then stale)."""
        self._watch.taken += n
        self._free_bound -= n
        self._pending_bound += n if self.permit_filter_value > 1 else 0
        self.table.mark_stale(n)
        self._stale = True

    def _age_due(self, step: int) -> bool:
        return self.evict_filter_value is not None and step % self.evict_interval == 0

    def _refresh_bounds(self, n: int) -> None:
        """Tighten the bounds by a finished copy of the counters, and queue one when they show room
        for fewer than `LOOKAHEAD` lookups of `n` keys (`recstream.nn.hash_counters`)."""
        if not self._stale:  # the host's numbers are the device's: nothing to tighten
            return
        self._watch.poll(self)
        if not self._room(LOOKAHEAD * n, self._free_bound, self._pending_bound, self.table.num_used_bound()):
            self._watch.post(self)
            self._watch.poll(self)  # done at once on a CPU (and on an idle device)

    def replay_ready(self, events: tuple[HostEvent, ...]) -> bool:
        """Whether a step whose host side was `events` can be replayed now (no read needed)."""
        self._refresh_bounds(sum(e.n for e in events if e.kind == "room"))
        free, pending, used, step = self._free_bound, self._pending_bound, self.table.num_used_bound(), self._step
        for e in events:
            if e.kind == "step":
                step += 1
                if self._age_due(step) != e.age:
                    return False
            elif e.kind == "room" and self._room(e.n, free, pending, used):
                free, used = free - e.n, used + e.n
                pending += e.n if self.permit_filter_value > 1 else 0
            else:
                return False
        return True

    def replay_host(self, events: tuple[HostEvent, ...]) -> None:
        """Apply `events` on the host, as the step's Python would have (after `replay_ready`)."""
        for e in events:
            if e.kind == "step":
                self._step += 1
            else:
                self._take_room(e.n)

    def host_snapshot(self) -> HostSnapshot:
        t = self.table
        return HostSnapshot(self._step, (self._free, self._pending, self._free_bound, self._pending_bound),
                            self._stale, (t.num_used_bound(), t._stale), len(self._reset_parts))

    def restore_host(self, snap: HostSnapshot) -> None:
        self._step = snap.step
        self._free, self._pending, self._free_bound, self._pending_bound = snap.counts
        self._stale = snap.stale
        self.table.used_bound, self.table._stale = snap.table
        self._watch.void()  # the capture's lookups were counted as taken, its kernels never ran
        del self._reset_parts[snap.reset_parts:]
        self._host_log = None

    def device_tensors(self) -> tuple[int, ...]:
        """The addresses of the tensors a captured step reads and writes: a graph holding other
        ones (a load that reallocated the table) must be captured again."""
        return tuple(b.data_ptr() for b in (self.values, *self.buffers(recurse=True)))
