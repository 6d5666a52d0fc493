"""SlotRecency, the LRU order of a tiered table's cache slots, against a brute-force reference: the
victims are the least recently used slots (to the tick), never one of the current tick or a reserved
one, across many ticks (so the queue is rebuilt from stale entries several times)."""
import numpy as np
import pytest

from recstream.nn import tier_lru
from recstream.nn.tier_lru import SlotRecency


@pytest.mark.parametrize("chunk", [4096, 7])  # 7: the queue's entries split, a victim search spans several
def test_victims_are_the_least_recently_used_slots_across_rebuilds(monkeypatch, chunk):
    monkeypatch.setattr(tier_lru, "_CHUNK", chunk)
    g = np.random.default_rng(0)
    n = 50
    r = SlotRecency(n)
    last = np.full(n, -1)  # the reference: tick of each slot's last use (-1 free), reserved ones apart
    reserved = set()
    for tick in range(1, 400):
        r.advance()
        used = np.unique(g.integers(0, n, g.integers(1, 12)))
        used = np.array([s for s in used if s not in reserved], dtype=np.int64)
        r.touch(used)
        last[used] = tick
        k = int(g.integers(0, 8))
        candidates = [s for s in range(n) if last[s] < tick and s not in reserved]
        peek = r.oldest(k)  # the same slots victims() takes next, nothing taken
        victims = r.victims(k)
        if k <= len(candidates):
            assert peek.tolist() == victims.tolist()
        if k > len(candidates):
            assert victims is None
            continue
        assert r.evictable() == len(candidates)
        # the k oldest; among equal ticks any order
        cutoff = sorted(last[candidates])[k - 1] if k else -2
        assert all(last[v] <= cutoff and last[v] < tick and v not in reserved for v in victims)
        assert len(set(victims.tolist())) == k and sum(last[candidates] < cutoff) <= k
        if tick % 3 == 0:  # some victims reserved (a prefetch in flight) until touched a tick later
            r.reserve(victims)
            reserved.update(victims.tolist())
        else:
            r.touch(victims)
            last[victims] = tick
        if tick % 3 == 1 and reserved:
            back = np.array(sorted(reserved), dtype=np.int64)
            r.touch(back)
            last[back] = tick
            reserved.clear()
    assert r._entries <= 2 * n + 4096  # rebuilt rather than grown


def test_a_full_cache_has_no_victims_beside_the_current_tick():
    r = SlotRecency(3)
    r.advance()
    r.touch(r.victims(3))
    assert r.victims(1) is None and r.evictable() == 0
    r.advance()
    assert r.victims(3).tolist() == [0, 1, 2]
