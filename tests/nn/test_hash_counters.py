"""`recstream.nn.hash_counters`: a dynamic table's counters copied to the host without a sync, so its
bounds follow the table instead of every lookup's worst case -- and never claim more room than it has.

Runs on CPU tensors under ``recstream.hostpath.device_path`` (the ops CUDA runs), where a copy is done
at once; a copy still in flight on a GPU is stood in for by an event that is not done yet."""
from __future__ import annotations

import copy
import dataclasses
import pickle

import pytest
import torch

from recstream.hostpath import device_path
from recstream.nn import HashEmbedding, hash_counters
from recstream.testing import SyncCounter


def _keys(step: int, batch: int = 16, span: int = 40) -> torch.Tensor:
    g = torch.Generator().manual_seed(step)
    return torch.randint(0, span, (batch,), generator=g) * 7919 + 2 ** 40


def _train(emb: HashEmbedding, steps, span: int = 40, batch: int = 16) -> SyncCounter:
    counter = SyncCounter()
    for i in steps:
        with device_path(), counter:
            emb(_keys(i, batch, span)).sum().backward()
            emb.pop_reset_rows()
            emb.values.grad = None
        counter.mark()
    return counter


def _truth(emb: HashEmbedding) -> tuple[int, int, int]:
    """The device's counters, read without touching the host's numbers."""
    return int(emb.num_free_t), int(emb.num_pending_t), int(emb.table.num_used_t)


@pytest.mark.parametrize("watch", [True, False])
def test_a_table_with_room_left_reads_nothing_once_its_worst_case_bounds_run_out(monkeypatch, watch):
    """40 distinct keys in batches of 16 against 256 rows: the worst case (16 new keys a step) runs
    out after 16 steps, the table never fills. Without the copies a step reads the counters then."""
    if not watch:
        monkeypatch.setattr(hash_counters.CounterWatch, "post", lambda self, emb: None)
    emb = HashEmbedding(4, capacity=256, param_init="ones")
    syncs = [s.syncs for s in _train(emb, range(40)).per_step]
    assert emb.num_rows == 40
    if watch:
        assert syncs == [0] * 40, syncs
    else:
        assert sum(syncs) >= 2 and max(syncs) == 1, syncs


class _Delayed:
    """A CUDA event done at its `delay`-th query: a copy that lands steps after it was queued."""

    def __init__(self, delay: int):
        self.left = delay

    def query(self) -> bool:
        self.left -= 1
        return self.left < 0


@pytest.mark.parametrize("delay", [0, 3])
@pytest.mark.parametrize("capacity,permit,evict_after", [
    (256, 1, None),  # room throughout
    (48, 1, None),  # full: LRU passes after reads
    (40, 2, 2),  # pending keys over budget, admission, age eviction
    (64, 3, None),  # admission after 3 sightings
])
def test_the_bounds_never_claim_more_room_than_the_table_has(monkeypatch, capacity, permit, evict_after, delay):
    """After every step the bounds hold against the device's counters, with copies done at once and
    copies that land a few steps later (reads, LRU passes and age passes in between)."""
    post = hash_counters.CounterWatch.post

    def delayed(self, emb):
        post(self, emb)
        if self._flight is not None and self._flight.event is None:
            self._flight = dataclasses.replace(self._flight, event=_Delayed(delay))

    monkeypatch.setattr(hash_counters.CounterWatch, "post", delayed)
    emb = HashEmbedding(4, capacity=capacity, permit_filter_value=permit, evict_filter_value=evict_after,
                        param_init="ones", pending_capacity=24 if permit > 1 else None)
    twin = copy.deepcopy(emb)
    for step in range(60):
        _train(emb, [step], span=120)
        free, pending, used = _truth(emb)
        assert emb._free_bound <= free, (step, emb._free_bound, free)
        assert permit == 1 or emb._pending_bound >= pending, (step, emb._pending_bound, pending)
        assert emb.table.num_used_bound() >= used, (step, emb.table.num_used_bound(), used)
    # and the table is the host path's, step for step
    for step in range(60):
        with torch.enable_grad():
            twin(_keys(step, 16, 120)).sum().backward()
            twin.pop_reset_rows()
            twin.values.grad = None
    ours, theirs = (t.export(reset_delta=False) for t in (emb, twin))
    assert torch.equal(ours["keys"].sort().values, theirs["keys"].sort().values)


class _Pending:
    """A CUDA event that is not done until told (none runs on a CPU)."""

    def __init__(self):
        self.done = False

    def query(self) -> bool:
        return self.done


def _in_flight(emb: HashEmbedding) -> _Pending:
    """Queue a copy as a GPU would: its values known, its event not done."""
    emb._watch.post(emb)
    event = _Pending()
    emb._watch._flight = dataclasses.replace(emb._watch._flight, event=event)
    return event


def test_a_copy_in_flight_changes_nothing_until_done_then_counts_the_lookups_since():
    emb = HashEmbedding(4, capacity=256, param_init="ones")
    _train(emb, range(3))
    event = _in_flight(emb)
    free_then = int(emb.num_free_t)
    _train(emb, range(3, 5))  # two more lookups, 16 keys each, taken while the copy is in flight
    bound = emb._free_bound
    emb._watch.poll(emb)
    assert emb._free_bound == bound  # not done: the worst-case bounds stand
    event.done = True
    emb._watch.poll(emb)
    assert emb._free_bound == max(bound, free_then - 2 * 16) and emb._free_bound > bound
    assert emb._free_bound <= int(emb.num_free_t)


def test_a_copy_queued_before_the_host_set_the_counters_is_void():
    """Loading rows (as a read's decision, or the host path's step) sets the counters from the host:
    the lookups the copy counted as taken since are no longer all that changed them."""
    emb = HashEmbedding(4, capacity=256, param_init="ones")
    _train(emb, range(3))
    event = _in_flight(emb)
    emb.load_rows(torch.arange(100, 160), torch.zeros(60, 4))  # 60 rows taken, by the host
    _train(emb, range(3, 5))
    bound = emb._free_bound
    event.done = True
    emb._watch.poll(emb)
    assert emb._free_bound == bound <= int(emb.num_free_t) and emb._watch._flight is None


def test_a_copy_is_void_once_the_hash_tables_own_counters_were_set_by_the_host():
    """Slots taken by a host-side insert into the hash table (as `load_rows` makes) are no lookup's:
    a copy queued before them cannot bound the used slots now."""
    emb = HashEmbedding(4, capacity=256, param_init="ones")
    _train(emb, range(3))
    event = _in_flight(emb)
    bound = emb.table.num_used_bound()
    emb.table.insert(torch.arange(500, 530) * 7919)
    emb.table.mark_stale(0)  # the device path's view: counters it did not read since
    event.done = True
    emb._watch.poll(emb)
    assert emb._watch._flight is None and emb.table.num_used_bound() >= int(emb.table.num_used_t) > bound


def test_a_copied_or_pickled_table_starts_with_no_copy_in_flight():
    emb = HashEmbedding(4, capacity=256, param_init="ones")
    _train(emb, range(3))
    _in_flight(emb)
    for other in (copy.deepcopy(emb), pickle.loads(pickle.dumps(emb))):
        assert other._watch._flight is None and other._watch.taken == 0
        _train(other, range(3, 6))  # and trains on


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: the copy into pinned memory and its event")
@pytest.mark.parametrize("copies", [False, True])
def test_on_cuda_a_landed_copy_spares_the_read_and_the_bounds_hold(monkeypatch, copies):
    """On a GPU: a non-blocking copy into pinned memory, an event, its query. The device synchronised
    after each step (as an idle GPU is), every copy has landed by the next step."""
    if not copies:
        monkeypatch.setattr(hash_counters.CounterWatch, "post", lambda self, emb: None)
    emb = HashEmbedding(4, capacity=256, param_init="ones", device="cuda")
    counter = SyncCounter()
    for i in range(40):
        with counter:
            emb(_keys(i).cuda()).sum().backward()
            emb.pop_reset_rows()
            emb.values.grad = None
        counter.mark()
        torch.cuda.synchronize()
        free, _, used = _truth(emb)
        assert emb._free_bound <= free and emb.table.num_used_bound() >= used
    syncs = [s.syncs for s in counter.per_step]
    assert (sum(syncs) == 0) if copies else (sum(syncs) >= 2), syncs
