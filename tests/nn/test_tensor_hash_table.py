"""TensorHashTable: batched open addressing, collisions, tombstones, rehash."""

import pytest
import torch

from recstream.nn.tensor_hash_table import DELETED, EMPTY, TensorHashTable, hash_keys

from .conftest import colliding_keys

pytestmark = pytest.mark.usefixtures("hash_kernels")  # every test on the compiled kernels and on torch ops


def test_insert_then_find_and_miss():
    t = TensorHashTable(64)
    keys = torch.tensor([0, 1, -5, 2**62, -(2**63), 2**63 - 1, 123456789])
    slots = t.insert(keys)
    assert slots.unique().numel() == keys.numel()
    assert torch.equal(t.keys[slots], keys)
    assert torch.equal(t.find(keys), slots)
    assert torch.equal(t.find(torch.tensor([7, 8, -9])), torch.tensor([-1, -1, -1]))
    assert (t.num_live, t.num_used) == (7, 7)


def test_hash_is_well_spread_for_structured_keys():
    # Multiples of the table size all share their low bits; the hash must not.
    keys = torch.arange(4096) * 1024
    starts = hash_keys(keys) & 1023
    assert starts.unique().numel() > 600  # ~1024*(1-e^-4) = 1005 for a random hash


def test_many_keys_multiple_of_table_size():
    t = TensorHashTable(1 << 12)
    keys = torch.arange(1, 1801) * (1 << 12)
    slots = t.insert(keys)
    assert slots.unique().numel() == keys.numel()
    assert torch.equal(t.find(keys), slots)


def test_all_keys_colliding_resolve_one_per_round():
    # Worst case: every key hashes to slot 3, so each round exactly one key wins
    # the contested slot and the others move on along the probe sequence.
    t = TensorHashTable(64)
    keys = colliding_keys(40, 3, 64)
    slots = t.insert(keys)
    assert slots.unique().numel() == 40
    assert torch.equal(t.find(keys), slots)
    # Deterministic winner: the first key in the batch gets the home slot.
    assert int(slots[0]) == 3
    t.delete(slots[:10])
    assert torch.equal(t.find(keys[10:]), slots[10:])  # probing passes tombstones
    assert (t.find(keys[:10]) == -1).all()
    again = t.insert(keys[:5])  # reuses tombstones
    assert torch.equal(t.find(keys[:5]), again)
    assert t.num_used == 40 and t.num_live == 35


def test_probe_limit_raises():
    t = TensorHashTable(64, max_rounds=4)
    with pytest.raises(RuntimeError, match="max_rounds=4"):
        t.insert(colliding_keys(10, 0, 64))
    full = TensorHashTable(64, max_rounds=4)
    full.insert(colliding_keys(4, 0, 64))  # probes 0..3 of slot 0's sequence taken
    with pytest.raises(RuntimeError, match="max_rounds=4"):
        full.find(colliding_keys(5, 0, 64)[4:])  # neither the key nor an EMPTY slot within 4 probes


def test_delete_and_rehash_keep_payload():
    t = TensorHashTable(256)
    keys = torch.randperm(10**6)[:100] - 500_000
    slots = t.insert(keys)
    t.rows[slots] = torch.arange(100)
    t.counts[slots] = torch.arange(100) * 2
    t.delete(slots[::2])
    assert t.keys[slots[::2]].eq(DELETED).all()
    assert (t.num_live, t.num_used) == (50, 100)
    old, new = t.rehash()
    assert (t.num_live, t.num_used) == (50, 50)
    assert not (t.keys == DELETED).any()
    survivors = keys[1::2]
    s = t.find(survivors)
    assert (s >= 0).all()
    assert torch.equal(t.rows[s], torch.arange(1, 100, 2))
    assert torch.equal(t.counts[s], torch.arange(1, 100, 2) * 2)
    assert (t.find(keys[::2]) == -1).all()
    assert int((t.keys == EMPTY).sum()) == 256 - 50


def test_state_dict_restores_counters():
    t = TensorHashTable(32)
    t.delete(t.insert(torch.tensor([1, 2, 3]))[:1])
    fresh = TensorHashTable(32)
    fresh.load_state_dict(t.state_dict())
    assert (fresh.num_live, fresh.num_used) == (2, 3)
    assert torch.equal(fresh.find(torch.tensor([1, 2, 3])), t.find(torch.tensor([1, 2, 3])))


def test_num_slots_must_be_power_of_two():
    with pytest.raises(ValueError, match="power of two, got 48"):
        TensorHashTable(48)


@pytest.mark.parametrize("with_tombstones", [False, True])
@pytest.mark.parametrize("n_keys", [300, 5000])  # a probe window of 8, and one slot per round
def test_locate_reports_the_slot_insert_gives_each_new_key(with_tombstones, n_keys):
    t = TensorHashTable(1 << 14)
    old = torch.randperm(10**6, generator=torch.Generator().manual_seed(0))[:6000] * 7
    slots = t.insert(old)
    if with_tombstones:  # every other key deleted: probes run over tombstones
        t.delete(slots[::2])
        assert t.num_used > t.num_live
    queried = torch.cat([old[1::2][: n_keys // 2], torch.arange(n_keys - n_keys // 2) * 7 + 1])  # half absent
    found, free = t.locate(queried)
    assert torch.equal(found, t.find(queried))
    absent = found < 0
    assert bool((free[~absent] == -1).all())
    assert bool(((t.keys[free[absent]] == EMPTY) | (t.keys[free[absent]] == DELETED)).all())
    # free = the first free slot of each key's probe sequence: what insert() picks for a key alone
    for key, slot in list(zip(queried[absent].tolist(), free[absent].tolist(), strict=True))[:40]:
        alone = TensorHashTable(t.num_slots)
        alone.load_state_dict(t.state_dict())
        assert alone.insert(torch.tensor([key])).item() == slot


def test_insert_at_places_keys_findably_and_falls_back_on_a_shared_slot():
    t = TensorHashTable(1 << 12)
    old = torch.arange(1500) * 3
    slots = t.insert(old)
    t.delete(slots[:50])
    # The deleted keys again: every slot before their old one was taken when they went in, so the
    # first free slot of each is a tombstone (theirs or an earlier one): all 50 reuse one.
    back = old[:50]
    _, free = t.locate(back)
    assert free.unique().numel() == 50  # no two want the same slot (true for these keys)
    used, live = t.num_used, t.num_live
    got = t.insert_at(back, free)
    assert torch.equal(got, free) and torch.equal(t.find(old), torch.cat([got, slots[50:]]))
    assert (t.num_used, t.num_live) == (used, live + 50)
    assert bool((t.rows[got] == -1).all() and (t.counts[got] == 0).all())
    # Two new keys with one start slot: locate gives both the same free slot; insert_at must not
    # write one over the other.
    u = TensorHashTable(64)
    keys = colliding_keys(3, 5, 64)
    _, free = u.locate(keys)
    assert free.unique().numel() == 1
    slots = u.insert_at(keys, free)
    assert slots.unique().numel() == 3 and torch.equal(u.find(keys), slots) and u.num_live == 3


@pytest.mark.parametrize("with_tombstones", [False, True])
@pytest.mark.parametrize("n_new", [200, 3000])  # a probe window of 8 and (over 4096 keys in the call) of 1
def test_locate_then_insert_at_places_many_keys_wanting_shared_slots(with_tombstones, n_new):
    """Many new keys at once: some want the same slot. Every key must end up findable in a slot of
    its own, the table's counters must match its contents, and nothing else may change."""
    t = TensorHashTable(1 << 13)
    slots = t.insert(torch.arange(3000) * 5)
    if with_tombstones:
        t.delete(slots[::3])
    before = t.keys.clone()
    new = torch.randperm(10**6, generator=torch.Generator().manual_seed(1))[:n_new] * 5 + 2
    new = torch.cat([new, torch.arange(3000) * 5])  # the old keys too: locate must skip the present ones
    found, free = t.locate(new)
    absent = (found < 0).nonzero().squeeze(1)
    assert absent.numel() == n_new + (1000 if with_tombstones else 0)
    wanted = free[absent]
    assert wanted.unique().numel() < wanted.numel()  # the case under test: shared wanted slots
    got = t.insert_at(new[absent], wanted)
    assert got.unique().numel() == absent.numel() and torch.equal(t.find(new[absent]), got)
    assert torch.equal(t.find(new), torch.where(found >= 0, found, torch.zeros_like(found)).index_put_(
        (absent,), got))
    changed = (t.keys != before).nonzero().squeeze(1)
    assert torch.equal(changed.sort()[0], got.sort()[0])  # only the new keys' slots were written
    assert t.num_live == int(t.occupied().sum()) and t.num_used == int((t.keys != EMPTY).sum())
