"""Which cache slots of a disk-tiered table were used least recently: `SlotRecency`.

Recency is counted in steps (ticks): a slot's ``last_use`` is the tick of the last step (or prefetch)
that read it, ``-1`` for a free slot. The victims of an eviction are the slots of the oldest ticks,
free ones first. Finding them must not scan the cache -- a table's cache holds millions of slots, a
step touches thousands (``np.argpartition`` over 400,000 slots took 3 ms a step) -- so each touch
appends ``(tick, slots)`` to a queue, oldest first, and victims are taken from its head. A slot
touched again later leaves a stale entry behind (its ``last_use`` is no longer the entry's tick),
skipped when reached; when stale entries outnumber the slots, the queue is rebuilt without them
(one pass, paid once per that many touches). A slot `reserve` d (a prefetch filling it
outside the cache's lock) is out of the order until touched.

Example:
    >>> r = SlotRecency(4)
    >>> r.touch(r.victims(2))  # two free slots used at tick 0 (touch counts those not used at it yet)
    2
    >>> r.advance(); r.touch(np.array([0]))
    1
    >>> r.victims(3).tolist()  # the free slots, then slot 1 (used a tick before slot 0)
    [2, 3, 1]
"""

from __future__ import annotations

from collections import deque

import numpy as np

__all__ = ["SlotRecency"]

_RESERVED = np.iinfo(np.int64).max
_CHUNK = 4096  # slots per queue entry at most: taking a few victims reads one entry, not the cache


def _entries(tick: int, slots: np.ndarray) -> list[tuple[int, np.ndarray]]:
    return [(tick, slots[i:i + _CHUNK]) for i in range(0, slots.size, _CHUNK)]


class SlotRecency:
    """Least-recently-used order of `slots` cache slots, to the tick (see the module docstring)."""

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self.tick = 0
        self.last_use = np.full(slots, -1, dtype=np.int64)
        self._queue: deque[tuple[int, np.ndarray]] = deque()
        self._entries = 0
        self._current = 0  # distinct slots used at the current tick: they are never victims
        self._reserved = 0  # slots reserved (never victims) until touched
        self.clear()

    def clear(self) -> None:
        """Every slot free (the tick goes on)."""
        self.last_use[:] = -1
        self._queue = deque(_entries(-1, np.arange(self.slots, dtype=np.int64)))
        self._entries = self.slots
        self._current = self._reserved = 0

    def advance(self) -> None:
        """A new step: the slots of the last one may be evicted from now on."""
        self.tick += 1
        self._current = 0

    def touch(self, slots: np.ndarray) -> int:
        """`slots` (distinct) were used at the current tick; returns how many were not yet."""
        fresh = slots[self.last_use[slots] != self.tick]
        if fresh.size == 0:
            return 0
        if self._reserved:
            self._reserved -= int(np.count_nonzero(self.last_use[fresh] == _RESERVED))
        self.last_use[fresh] = self.tick
        self._enqueue(fresh)
        return fresh.size

    def touched(self, fresh: np.ndarray) -> None:
        """`touch` of slots whose ``last_use`` the caller set to the current tick, `fresh` those it
        changed (distinct, none reserved): they join the order (a lookup made in one compiled pass)."""
        if fresh.size:
            self._enqueue(fresh.copy())

    def _enqueue(self, fresh: np.ndarray) -> None:
        """Slots `fresh` (just set to the current tick) at the tail of the order."""
        self._current += fresh.size
        self._queue.append((self.tick, fresh))
        self._entries += fresh.size
        if self._entries > 2 * self.slots + 4096:
            self._rebuild()

    def reserve(self, slots: np.ndarray) -> None:
        """Take `slots` (distinct, just returned by `victims`) out of the order until `touch` ed."""
        self.last_use[slots] = _RESERVED
        self._reserved += slots.size

    def evictable(self) -> int:
        """How many slots are neither used at the current tick nor reserved."""
        return self.slots - self._current - self._reserved

    def victims(self, n: int) -> np.ndarray | None:
        """The `n` least recently used slots not used at the current tick (free ones first), or None
        (nothing changed) if there are fewer. The caller touches them next (until then they have no
        place in the order)."""
        if n > self.evictable():
            return None
        if n == 0:
            return np.empty(0, dtype=np.int64)
        taken: list[np.ndarray] = []
        need = n
        while need > 0:
            tick, slots = self._queue.popleft()
            live = slots[self.last_use[slots] == tick]
            self._entries -= slots.size
            if live.size > need:  # the rest stays at the head, still the oldest
                self._queue.appendleft((tick, live[need:]))
                self._entries += live.size - need
                live = live[:need]
            taken.append(live)
            need -= live.size
        return np.concatenate(taken) if len(taken) != 1 else taken[0]

    def oldest(self, n: int) -> np.ndarray:
        """Up to `n` slots in least-recently-used order (free ones first), not taken: the victims of the
        evictions to come, if nothing is touched meanwhile. Reserved slots are left out."""
        taken: list[np.ndarray] = []
        need = n
        for tick, slots in self._queue:
            if need <= 0:
                break
            live = slots[self.last_use[slots] == tick][:need]
            taken.append(live)
            need -= live.size
        return np.concatenate(taken) if taken else np.empty(0, dtype=np.int64)

    def _rebuild(self) -> None:
        """The queue without its stale entries. No sort: the queue is in tick order already (each
        touch appends at the current tick, victims come off the head), so dropping the entries whose
        slot was touched again since is one pass (an argsort of ``last_use`` took 100 ms on 400,000
        slots, in the step that happened to pass the threshold)."""
        if not self._queue:
            return
        ticks = np.repeat(np.fromiter((t for t, _ in self._queue), dtype=np.int64, count=len(self._queue)),
                          np.fromiter((s.size for _, s in self._queue), dtype=np.int64, count=len(self._queue)))
        slots = np.concatenate([s for _, s in self._queue])
        live = self.last_use[slots] == ticks  # a reserved slot's last_use matches no tick: out of the order
        slots, ticks = slots[live], ticks[live]
        cuts = np.flatnonzero(ticks[1:] != ticks[:-1]) + 1
        self._queue = deque(entry for part, part_ticks in zip(np.split(slots, cuts), np.split(ticks, cuts), strict=True)
                            if part.size for entry in _entries(int(part_ticks[0]), part))
        self._entries = slots.size
