"""The compiled CPU kernels of TensorHashTable (recstream/nn/_hash_kernels.c): built, the same table
layout as the torch ops after every kind of call, and arguments checked before any write."""

import numpy as np
import pytest
import torch

from recstream.nn import HashEmbedding, lru_select, native
from recstream.nn import tensor_hash_table as tht
from recstream.nn.tensor_hash_table import EMPTY, TensorHashTable, hash_keys

from .conftest import colliding_keys


def test_the_kernels_are_built():
    # An install with a C compiler builds them (setup.py); without, tables fall back to torch ops.
    assert native.AVAILABLE, "recstream.nn._hash_kernels was not built (pip install -e . needs a C compiler)"


def _random_keys(gen: torch.Generator, n: int) -> torch.Tensor:
    keys = torch.randint(-(2**63), 2**63 - 1, (n,), generator=gen)
    return keys[(keys | 1) != EMPTY].unique()  # the two sentinels are not keys


def test_a_key_alone_goes_to_its_hash_slot():
    keys = torch.cat([torch.tensor([0, 1, -3, 2**31, 2**32 + 7, 2**62, -(2**63), 2**63 - 1]),
                      _random_keys(torch.Generator().manual_seed(3), 200)])
    for k in keys.tolist():
        t = TensorHashTable(1 << 16)
        assert t.insert(torch.tensor([k])).item() == (hash_keys(torch.tensor([k])) & 0xFFFF).item()


def _run(ops, kernels: bool, monkeypatch) -> list:
    """Apply `ops` to a fresh table with or without the kernels; every result and state after each op."""
    with monkeypatch.context() as m:
        if not kernels:
            m.setattr(native, "kernels", None)
        t, seen = TensorHashTable(1 << 12, max_rounds=64), []
        for op, keys in ops:
            if op == "insert":
                out = t.insert(keys)
            elif op == "locate_insert_at":
                found, free = t.locate(keys)
                absent = (found < 0).nonzero().squeeze(1)
                out = torch.cat([found, free, t.insert_at(keys[absent], free[absent])])
            elif op == "delete":
                out = t.find(keys)
                t.delete(out[out >= 0])
            else:
                out = torch.cat(t.rehash())
            seen.append((op, out.clone(), {k: v.clone() for k, v in t.state_dict().items()}))
        return seen


def test_every_call_leaves_the_layout_the_torch_ops_leave(monkeypatch):
    gen = torch.Generator().manual_seed(0)
    pool = _random_keys(gen, 3000)
    crowd = colliding_keys(30, 17, 1 << 12)  # one start slot: contested claims in every round
    ops = [
        ("insert", pool[:900]),  # over nothing: most keys at their start slot
        ("insert", crowd[:20]),  # one after another along one probe sequence
        ("delete", torch.cat([pool[:900:3], crowd[:20:2]])),  # tombstones everywhere
        ("locate_insert_at", torch.cat([pool[:1200], crowd])),  # reuse of tombstones, shared wanted slots
        ("locate_insert_at", pool[1200:1500]),  # a small call: a probe window of 8
        ("insert", crowd[20:] + 2**40),
        ("delete", pool[1000:1400]),
        ("rehash", None),
        ("locate_insert_at", pool[1000:2000]),  # no tombstones left: the stop slot is the free one
    ]
    compiled, torch_ops = _run(ops, True, monkeypatch), _run(ops, False, monkeypatch)
    for (op, a, sa), (_, b, sb) in zip(compiled, torch_ops, strict=True):
        assert torch.equal(a, b), op
        for name in sa:
            assert torch.equal(sa[name], sb[name]), (op, name)


def test_many_keys_wanting_one_slot_in_a_large_call(monkeypatch):
    # Over WIDE_WINDOW_MAX_KEYS keys: the rounds probe one slot each, on both implementations.
    keys = torch.cat([_random_keys(torch.Generator().manual_seed(1), 6000), colliding_keys(25, 3, 1 << 14)])
    layouts = []
    for kernels in (True, False):
        with monkeypatch.context() as m:
            if not kernels:
                m.setattr(native, "kernels", None)
            t = TensorHashTable(1 << 14)
            slots = t.insert(keys)
            assert torch.equal(t.find(keys), slots)
            layouts.append(t.keys.clone())
    assert torch.equal(*layouts)


@pytest.mark.parametrize("span", [50, 2**16, 2**16 + 1, 10**6, 2**40])  # one step per bucket (up to 2**16), or several
@pytest.mark.parametrize("with_rows", [False, True])
def test_oldest_selects_what_the_torch_ops_select(span, with_rows):
    gen = torch.Generator().manual_seed(span)
    n, step = 20_000, 7
    last_seen = step - 1 - torch.randint(0, span, (n,), generator=gen)
    last_seen[torch.randperm(n, generator=gen)[:3000]] = step  # seen this step: never evicted
    last_seen[:500] = tht.NEVER_SEEN  # free rows
    rows = torch.randint(-1, 2, (n,), generator=gen) if with_rows else None  # rows < 0: pending keys
    candidate = (last_seen < step) & (rows < 0 if with_rows else True)
    n_cand = int(candidate.sum())
    for k in (0, 1, 37, 2000, n_cand - 1, n_cand, n_cand + 5):
        got = lru_select.oldest(last_seen, step, k, rows)
        want = lru_select._select(last_seen, candidate, step, k)
        assert torch.equal(got, want), k
        assert got.numel() == min(k, n_cand) and bool(candidate[got].all())


class _Counting:
    """native.kernels, counting the calls of each kernel."""

    def __init__(self, kernels):
        self.kernels, self.calls = kernels, {}

    def __getattr__(self, name):
        def call(*args):
            self.calls[name] = self.calls.get(name, 0) + 1
            return getattr(self.kernels, name)(*args)
        return call


@pytest.mark.parametrize("max_norm", [None, 0.5])
def test_hash_embedding_training_leaves_the_state_the_torch_ops_leave(monkeypatch, max_norm):
    """Growth, steps whose new keys fit the free rows (the admission kernel), LRU evictions and
    rehashes (the general path around the kernels), a batch with more new keys than rows."""
    gen = torch.Generator().manual_seed(5)
    sizes = torch.randint(1, 200, (80,), generator=gen)
    batches = [torch.randint(0, 700, (int(n),), generator=gen) * 7919 for n in sizes]
    batches.append(torch.arange(10**6, 10**6 + 700))  # more new keys than rows
    runs = []
    for kernels in (True, False):
        with monkeypatch.context() as m:
            counting = _Counting(native.kernels)
            m.setattr(native, "kernels", counting if kernels else None)
            torch.manual_seed(0)
            emb = HashEmbedding(4, capacity=512, evict_low_watermark=0.8, max_norm=max_norm)
            outs = [emb(b) for b in batches]
            outs.append(emb.values.detach().clone())
            state = {**emb.state_dict(), "row_last_seen": emb.row_last_seen.clone()}
            runs.append((outs, state, emb.values.pop_reset_rows()))
        if kernels:
            assert counting.calls.get("admit", 0) > 40 and counting.calls.get("oldest", 0) > 0
    (a_out, a_state, a_reset), (b_out, b_state, b_reset) = runs
    for a, b in zip(a_out, b_out, strict=True):
        assert torch.equal(a, b)
    assert a_state.keys() == b_state.keys()
    for name in a_state:
        assert torch.equal(a_state[name], b_state[name]), name
    assert torch.equal(a_reset.sort()[0], b_reset.sort()[0])


def test_bad_arguments_raise_before_any_write():
    k = native.kernels
    table = np.full(64, EMPTY, dtype=np.int64)
    payload = [np.zeros(64, dtype=np.int64) for _ in range(3)]
    keys, out = np.arange(3, dtype=np.int64), np.empty(3, dtype=np.int64)
    with pytest.raises(ValueError, match="power of two"):
        k.locate(np.full(48, EMPTY, dtype=np.int64), keys, out, None, 8)
    with pytest.raises(ValueError, match="slots: length 2, expected 3"):
        k.locate(table, keys, out[:2], None, 8)
    with pytest.raises(TypeError, match="C-contiguous"):
        k.locate(table, np.arange(6, dtype=np.int64)[::2], out, None, 8)
    with pytest.raises(TypeError, match="writable"):
        k.locate(table, keys, b"\0" * 24, None, 8)
    with pytest.raises(ValueError, match=r"free\[1\]=64 is not a slot"):
        k.insert(table, *payload, keys, np.array([5, 64, 6], dtype=np.int64), out, 8, 8, 4096)
    with pytest.raises(ValueError, match="max_rounds"):
        k.insert(table, *payload, keys, None, out, 0, 8, 4096)
    assert (table[[0, 5, 6]] == EMPTY).all()  # the claims come after the check of every free slot
    rows_of_rows = [np.full(4, -1, dtype=np.int64), np.zeros(4, dtype=np.int64), np.zeros(4, dtype=bool)]
    free_rows, slots, free = np.array([0, 1, 2, 9], dtype=np.int64), np.full(3, -1, dtype=np.int64), keys.copy()
    with pytest.raises(ValueError, match=r"free_rows\[3\] is not a row of 4"):  # the top of the stack: row 9
        k.admit(table, *payload, *rows_of_rows, free_rows, 4, keys, keys, slots, free, 1, 8, 8, 4096, out,
                np.empty(3, dtype=np.int64))
    with pytest.raises(ValueError, match="3 keys are absent, new_rows_out has room for 2"):
        k.admit(table, *payload, *rows_of_rows, free_rows, 4, keys, keys, slots, free, 1, 8, 8, 4096, out,
                np.empty(2, dtype=np.int64))
    assert (table == EMPTY).all() and (rows_of_rows[0] == -1).all() and not rows_of_rows[2].any()
    with pytest.raises(ValueError, match="expected at least k=4"):
        k.oldest(np.zeros(8, dtype=np.int64), None, 1, 4, 16, out)
