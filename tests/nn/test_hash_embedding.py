"""HashEmbedding: lookups, admission, eviction, gradients, reset protocol."""

import time

import pytest
import torch

from recstream.nn import HashEmbedding

from .conftest import colliding_keys

pytestmark = pytest.mark.usefixtures("hash_kernels")  # every test on the compiled kernels and on torch ops


def k(*keys):
    return torch.tensor(keys, dtype=torch.int64)


def row_of(emb, key):
    slot = int(emb.table.find(k(key))[0])
    return -1 if slot < 0 else int(emb.table.rows[slot])


def test_lookup_shape_and_consistency():
    emb = HashEmbedding(3, capacity=32)
    keys = torch.tensor([[5, -9, 2**45], [5, 5, 7]])
    out = emb(keys)
    assert out.shape == (2, 3, 3)
    assert emb.num_rows == 4
    torch.testing.assert_close(out[0, 0], out[1, 1])
    torch.testing.assert_close(out[0, 1], emb.values[row_of(emb, -9)])
    assert not torch.allclose(out[0, 0], out[0, 2])
    assert emb(torch.zeros(0, 4, dtype=torch.int64)).shape == (0, 4, 3)


def test_sparse_gradient_sums_over_occurrences_and_touches_only_rows_used():
    emb = HashEmbedding(2, capacity=16)
    keys = k(10, 20, 10, 30)
    up = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 8.0]])
    (emb(keys) * up).sum().backward()
    g = emb.values.grad
    assert g.layout == torch.sparse_coo
    g = g.coalesce()
    assert sorted(g.indices()[0].tolist()) == sorted(row_of(emb, x) for x in (10, 20, 30))
    dense = g.to_dense()
    torch.testing.assert_close(dense[row_of(emb, 10)], torch.tensor([6.0, 8.0]))
    torch.testing.assert_close(dense[row_of(emb, 30)], torch.tensor([7.0, 8.0]))


def test_admission_threshold_counts_occurrences_and_default_has_no_grad():
    emb = HashEmbedding(2, permit_filter_value=3, capacity=16, param_init="ones")
    out = emb(k(1, 2, 2))  # 1 seen once, 2 twice: both pending
    assert emb.num_rows == 0 and emb.num_pending == 2
    assert out.abs().sum() == 0
    assert not out.requires_grad or out.grad_fn is not None
    out = emb(k(2, 3, 3, 3))  # 2 reaches 3 across calls, 3 within one call
    assert emb.num_rows == 2 and emb.num_pending == 1
    torch.testing.assert_close(out, torch.ones(4, 2))
    out = emb(k(1, 1, 4))  # 1 admitted (1 + 2 = 3), 4 pending -> default
    torch.testing.assert_close(out, torch.tensor([[1.0, 1.0], [1.0, 1.0], [0.0, 0.0]]))
    out.sum().backward()
    g = emb.values.grad.coalesce()
    assert g.indices()[0].tolist() == [row_of(emb, 1)]  # nothing for pending key 4
    torch.testing.assert_close(g.values(), torch.tensor([[2.0, 2.0]]))
    assert row_of(emb, 4) == -1 and emb.num_pending == 1


def test_pending_keys_are_bounded_lru():
    emb = HashEmbedding(2, permit_filter_value=5, capacity=4, pending_capacity=3)
    emb(k(1, 2))
    emb(k(3))
    emb(k(1, 4))  # over budget: drop the least recently seen pending key (2)
    assert emb.num_pending == 3
    found = emb.table.find(k(1, 2, 3, 4)) >= 0
    assert found.tolist() == [True, False, True, True]
    assert int(emb.table.counts[emb.table.find(k(1))]) == 2


def test_eviction_by_age_exact_step():
    emb = HashEmbedding(2, evict_filter_value=2, capacity=8)
    emb(k(1))  # step 1
    emb(k(2))  # step 2
    emb(k(2))  # step 3: key 1 unseen for 2 steps, still kept
    assert row_of(emb, 1) >= 0
    emb(k(2))  # step 4: key 1 unseen for 3 steps -> evicted
    assert row_of(emb, 1) == -1 and emb.num_rows == 1
    assert emb.global_step == 4
    emb.eval()
    assert emb(k(1)).abs().sum() == 0


def test_eviction_applies_to_pending_keys_and_interval():
    emb = HashEmbedding(2, permit_filter_value=2, evict_filter_value=1, capacity=8, evict_interval=2)
    emb(k(7))  # step 1: pending
    emb(k(8))  # step 2: scan, 7 unseen for 1 step -> kept
    emb(k(8))  # step 3: no scan (interval 2)
    assert emb.num_pending == 1 and row_of(emb, 8) >= 0
    emb(k(8))  # step 4: scan evicts 7, its count restarts
    assert emb.num_pending == 0
    emb(k(7))
    assert row_of(emb, 7) == -1


def test_capacity_eviction_is_lru_and_rows_are_reused_with_reset_report():
    emb = HashEmbedding(2, capacity=4)
    for key in (1, 2, 3, 4):
        emb(k(key))
    assert emb.values.pop_reset_rows().tolist() == [0, 1, 2, 3]
    assert emb.values.pop_reset_rows().tolist() == []  # popping clears
    emb(k(1))  # refresh 1: now 2 is the least recently seen
    row2 = row_of(emb, 2)
    emb(k(5, 6))  # needs 2 rows: evicts 2 and 3
    assert row_of(emb, 2) == -1 and row_of(emb, 3) == -1
    assert {row_of(emb, 1), row_of(emb, 4)} == {0, 3}
    assert sorted(emb.values.pop_reset_rows().tolist()) == sorted([row_of(emb, 5), row_of(emb, 6)])
    assert row2 in (row_of(emb, 5), row_of(emb, 6))


def test_capacity_eviction_never_takes_a_key_of_the_current_batch():
    """The LRU pass must skip keys looked up in the step that triggers it (they would read the
    default vector and lose their row). It used to see their previous step and take them."""
    emb = HashEmbedding(2, capacity=3, param_init="ones", evict_low_watermark=1.0)
    for key in (1, 2, 3):
        emb(k(key))
    out = emb(k(1, 4))  # full: one row needed; 1 is the oldest but in this batch -> 2 goes
    assert row_of(emb, 1) >= 0 and row_of(emb, 2) == -1 and row_of(emb, 4) >= 0
    assert out.abs().sum(1).tolist() == [2.0, 2.0]


def test_lru_eviction_exact_when_ages_span_many_steps():
    # Ages spread over > 2**16 steps exercise the coarse-bucket path of the LRU select.
    emb = HashEmbedding(2, capacity=5)
    sd = emb.state_dict()
    sd["global_step_t"] = torch.tensor(300_000)
    emb.load_state_dict(sd)
    emb.load_rows(k(100, 101, 102, 103, 104), torch.zeros(5, 2),
                  last_seen=k(10, 200_000, 70_000, 250_000, 70_001))
    emb(k(7, 8, 9))  # step 300001: needs 3 rows
    gone = [key for key in (100, 101, 102, 103, 104) if row_of(emb, key) == -1]
    assert gone == [100, 102, 104]


def test_batch_larger_than_capacity_admits_what_fits():
    emb = HashEmbedding(2, capacity=3, param_init="ones")
    out = emb(k(10, 11, 12, 13, 14))
    assert emb.num_rows == 3
    assert out.sum(1).tolist() == [2.0, 2.0, 2.0, 0.0, 0.0]  # the rest read the default


def test_reserved_keys_rejected():
    emb = HashEmbedding(2, capacity=8)
    with pytest.raises(ValueError, match=r"must not contain -1 or -2.*keys.flatten\(\)\[1\]=-2"):
        emb(k(3, -2, 4))
    with pytest.raises(ValueError, match="-1"):
        emb.eval()(k(-1))
    with pytest.raises(TypeError, match="'keys' must have a dtype"):
        emb(torch.tensor([1.0]))
    emb32 = HashEmbedding(2, key_dtype=torch.int32, capacity=8)
    with pytest.raises(ValueError, match="int32"):
        emb32(k(2**40))
    emb32(torch.tensor([-(2**31), 2**31 - 1], dtype=torch.int32))
    assert emb32.table.keys.dtype == torch.int32 and emb32.num_rows == 2


def test_constructor_validation():
    with pytest.raises(ValueError, match="'embedding_size' must be an int >= 1, got 0"):
        HashEmbedding(0)
    with pytest.raises(ValueError, match="'param_init' must be one of"):
        HashEmbedding(2, param_init="xavier")
    with pytest.raises(ValueError, match="'permit_filter_value' must be an int >= 1, got 0"):
        HashEmbedding(2, permit_filter_value=0)
    with pytest.raises(ValueError, match="'max_norm' must be a finite number > 0.0"):
        HashEmbedding(2, max_norm=0)
    with pytest.raises(ValueError, match="'key_dtype' must be"):
        HashEmbedding(2, key_dtype=torch.float32)
    with pytest.raises(TypeError, match="'capacity' must be an int"):
        HashEmbedding(2, capacity=True)


def test_max_norm_renormalises_stored_rows():
    emb = HashEmbedding(2, max_norm=1.0, capacity=8)
    emb.load_rows(k(1, 2), torch.tensor([[3.0, 4.0], [0.3, 0.4]]))
    out = emb(k(1, 2))
    torch.testing.assert_close(out, torch.tensor([[0.6, 0.8], [0.3, 0.4]]), atol=1e-5, rtol=0)
    torch.testing.assert_close(emb.values[row_of(emb, 1)].detach(), torch.tensor([0.6, 0.8]),
                               atol=1e-5, rtol=0)


def test_eval_mode_reads_without_inserting_or_counting():
    emb = HashEmbedding(2, permit_filter_value=2, capacity=8)
    emb(k(1, 1))
    emb.eval()
    before = {n: b.clone() for n, b in emb.named_buffers()}
    out = emb(k(1, 99, 99, 99))
    torch.testing.assert_close(out[0], emb.values[row_of(emb, 1)].detach())
    assert out[1:].abs().sum() == 0
    assert emb.global_step == 1 and emb.num_pending == 0
    for n, b in emb.named_buffers():
        assert torch.equal(b, before[n]), n


def test_manual_step_when_called_several_times_per_step():
    emb = HashEmbedding(2, capacity=8, evict_filter_value=1, auto_step=False)
    emb.step()
    emb(k(1))
    emb(k(2))  # same step
    assert emb.global_step == 1
    emb.step()
    emb.step()  # key 1 and 2 unseen for 2 steps
    assert emb.num_rows == 0


def test_optimizer_trains_admitted_rows_only():
    emb = HashEmbedding(2, permit_filter_value=2, capacity=8)
    opt = torch.optim.SGD(emb.parameters(), lr=0.5)
    emb(k(1, 1)).sum().backward()
    opt.step()
    emb.values.grad = None
    snapshot = emb.values.detach().clone()
    emb(k(1, 2)).sum().backward()  # 2 is pending
    opt.step()
    changed = (emb.values.detach() != snapshot).any(1).nonzero().flatten().tolist()
    assert changed == [row_of(emb, 1)]


def test_many_colliding_keys_multiples_of_table_size():
    emb = HashEmbedding(4, capacity=4096)
    keys = torch.arange(1, 4001) * emb.num_slots
    out = emb(keys)
    assert emb.num_rows == 4000
    rows = emb.table.rows[emb.table.find(keys)]
    assert rows.unique().numel() == 4000
    torch.testing.assert_close(out, emb.values.detach()[rows])
    emb.eval()
    torch.testing.assert_close(emb(keys.flip(0)), out.flip(0).detach())


def test_fully_colliding_hash_still_correct():
    emb = HashEmbedding(2, capacity=48)
    keys = colliding_keys(48, 0, emb.num_slots)
    out = emb(keys)
    rows = emb.table.rows[emb.table.find(keys)]
    assert rows.unique().numel() == 48
    torch.testing.assert_close(out, emb.values.detach()[rows])


def test_churn_with_tombstones_triggers_rehash_and_stays_consistent(monkeypatch):
    emb = HashEmbedding(2, capacity=128, evict_filter_value=1)
    rehashes = []
    real = emb.table.rehash
    monkeypatch.setattr(emb.table, "rehash", lambda: rehashes.append(1) or real())
    for step in range(30):  # each step brings 50 new keys, keys older than 1 step expire
        keys = torch.arange(50) + 1000 * step
        out = emb(keys)
        rows = emb.table.rows[emb.table.find(keys)]
        torch.testing.assert_close(out, emb.values.detach()[rows])
        prev = keys - 1000
        if step:  # last step's keys survive (unseen for only 1 step)
            assert (emb.table.find(prev) >= 0).all()
    assert emb.num_rows == 100 and len(rehashes) >= 5
    live = emb.row_slots >= 0
    assert torch.equal(emb.table.rows[emb.row_slots[live]], live.nonzero().flatten())
    assert emb.table.num_live <= emb.max_load * emb.num_slots
    assert emb.table.num_used <= 0.75 * emb.num_slots  # tombstones bounded by rebuilds


def test_memory_per_row_matches_formula():
    emb = HashEmbedding(16, capacity=1024)
    mem = emb.memory_bytes()
    assert emb.num_slots == 2048  # (1024 + 0 pending) / 0.5
    assert mem["values"] == 1024 * 16 * 4
    assert mem["row_metadata"] == 1024 * (8 + 8 + 8 + 1 + 1)  # row_last_seen: the LRU pass scans rows
    assert mem["hash_slots"] == 2048 * 32 + 2 * 8
    assert mem["per_row"] == pytest.approx(64 + 26 + 64, abs=0.2)  # + a few 0-d counters


def test_one_million_inserts_are_vectorized():
    emb = HashEmbedding(8, capacity=2**20)
    keys = torch.randint(-(2**62), 2**62, (1_000_000,), generator=torch.Generator().manual_seed(0))
    start = time.perf_counter()
    out = emb(keys)
    elapsed = time.perf_counter() - start
    n = keys.unique().numel()
    assert emb.num_rows == n and out.shape == (1_000_000, 8)
    assert elapsed < 20.0, elapsed  # ~1 s on one idle core; a Python loop would take minutes
    emb.eval()
    torch.testing.assert_close(emb(keys[:1000]), out[:1000].detach())


def test_max_norm_does_not_write_in_eval_mode_or_under_inference_mode():
    """A served model must not change: eval-mode and inference_mode lookups renormalise the
    returned vectors only (they used to rescale the stored rows in place)."""
    emb = HashEmbedding(2, max_norm=1.0, capacity=8)
    emb.load_rows(k(1, 2), torch.tensor([[3.0, 4.0], [0.3, 0.4]]))
    before = {n: t.clone() for n, t in emb.state_dict().items()}
    want = torch.tensor([[0.6, 0.8], [0.3, 0.4]])
    emb.eval()
    torch.testing.assert_close(emb(k(1, 2)), want, atol=1e-5, rtol=0)
    emb.train()
    with torch.inference_mode():
        torch.testing.assert_close(emb(k(1, 2, 3)), torch.cat([want, torch.zeros(1, 2)]), atol=1e-5, rtol=0)
    for name, value in emb.state_dict().items():
        assert torch.equal(value, before[name]), name
    assert emb.global_step == 0 and emb.num_rows == 2  # no step, key 3 not counted
    emb(k(1))  # a training forward still renormalises in place
    torch.testing.assert_close(emb.values[row_of(emb, 1)].detach(), want[0], atol=1e-5, rtol=0)


def test_full_table_evicts_down_to_the_low_watermark_in_one_pass():
    """One LRU pass frees (1 - evict_low_watermark) * capacity rows beyond the step's need, so the
    next admissions take free rows without a scan. (Before: exactly the rows needed, every step.)"""
    emb = HashEmbedding(2, capacity=100, evict_low_watermark=0.9)
    emb.load_rows(torch.arange(100), torch.zeros(100, 2), last_seen=torch.arange(100) - 100)
    scans = []
    real = emb._oldest
    emb._oldest = lambda *a: scans.append(1) or real(*a)
    emb(k(1000))  # needs 1 row: evicts 1 + 10, the 11 least recently seen
    assert emb.num_rows == 90 and len(scans) == 1
    assert [key for key in range(100) if row_of(emb, key) == -1] == list(range(11))
    for step in range(10):  # 10 more new keys: free rows, no scan
        emb(k(2000 + step))
    assert emb.num_rows == 100 and len(scans) == 1
    exact = HashEmbedding(2, capacity=100, evict_low_watermark=1.0)
    exact.load_rows(torch.arange(100), torch.zeros(100, 2), last_seen=torch.arange(100) - 100)
    exact(k(1000))
    assert exact.num_rows == 100 and row_of(exact, 0) == -1 and row_of(exact, 1) >= 0


def test_pending_keys_are_dropped_down_to_the_low_watermark():
    emb = HashEmbedding(2, permit_filter_value=5, capacity=4, pending_capacity=20, evict_low_watermark=0.8)
    for key in range(20):
        emb(k(key))
    assert emb.num_pending == 20
    emb(k(100))  # over budget by 1: drops 1 + 4 of the least recently seen
    assert emb.num_pending == 16
    assert [key for key in range(20) if emb.table.find(k(key))[0] < 0] == [0, 1, 2, 3, 4]


def test_lru_ties_are_spread_over_the_table_and_negative_steps_work():
    """Keys seen in the same step (here a bulk load, at a negative step) are evicted evenly across
    the slots; lowest slots first used to empty one end of the table and crowd the other until
    probes there exceeded max_rounds."""
    emb = HashEmbedding(2, capacity=4096)
    keys = torch.arange(4096) * 7919
    emb.load_rows(keys, torch.zeros(4096, 2), last_seen=torch.full((4096,), -5))
    emb(torch.arange(2048) + 10**9)  # evicts 2048 + 204 of the bulk-loaded keys
    left = emb.table.find(keys)
    left = left[left >= 0]
    low = int((left < emb.num_slots // 2).sum())
    assert left.numel() == 4096 - 2048 - 204
    assert abs(low / left.numel() - 0.5) < 0.05, low / left.numel()


def test_lru_order_survives_a_state_dict_round_trip():
    """row_last_seen (what the LRU pass scans) is rebuilt from the table after loading."""
    src = HashEmbedding(2, capacity=6, evict_low_watermark=1.0)
    for key in (1, 2, 3, 4, 5, 6):
        src(k(key))
    src(k(1, 2))
    dst = HashEmbedding(2, capacity=6, evict_low_watermark=1.0)
    dst.load_state_dict(src.state_dict())
    dst(k(7, 8))  # evicts the two least recently seen: 3 and 4
    assert [key for key in range(1, 9) if row_of(dst, key) == -1] == [3, 4]


def test_admit_at_first_sight_path_matches_the_general_admission_path(monkeypatch):
    """permit_filter_value=1 takes a shorter path (no pending state); it must leave the table,
    rows and outputs exactly as the general path does, through growth, LRU eviction and a batch
    with more new keys than capacity."""
    gen = torch.Generator().manual_seed(3)
    batches = [torch.randint(0, 400, (int(n),), generator=gen) for n in torch.randint(1, 60, (120,), generator=gen)]
    batches.append(torch.arange(1000, 1300))  # more new keys than capacity
    runs = []
    for general in (False, True):
        if general:
            monkeypatch.setattr(HashEmbedding, "_admit_all",
                                lambda self, uniq, counts: (HashEmbedding._count_and_admit(self, uniq, counts), None))
        torch.manual_seed(0)
        emb = HashEmbedding(3, capacity=200, evict_low_watermark=0.9)
        outs = [emb(b) for b in batches]
        runs.append((outs, emb.state_dict()))
    (fast_out, fast_sd), (gen_out, gen_sd) = runs
    for a, b in zip(fast_out, gen_out, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert fast_sd.keys() == gen_sd.keys()
    for name in fast_sd:
        assert torch.equal(fast_sd[name], gen_sd[name]), name


def test_the_training_gradient_arrives_coalesced_and_equals_the_plain_gathers():
    """On a CPU the lookup hands autograd its sorted unique rows: the optimizer gets a coalesced
    gradient (no sort of all the ids again) with the sums a plain F.embedding gradient coalesces to."""
    emb = HashEmbedding(3, capacity=64)
    keys = torch.tensor([[40, 7, 40, 13], [7, 7, 99, -5]])
    emb(keys)  # admit the keys: the next call takes the every-key-has-a-row path
    emb.values.grad = None
    up = torch.randn(2, 4, 3, generator=torch.Generator().manual_seed(0))
    (emb(keys) * up).sum().backward()
    grad = emb.values.grad
    assert grad.is_coalesced()
    rows = torch.tensor([row_of(emb, int(x)) for x in keys.reshape(-1)])
    plain = torch.nn.Parameter(emb.values.detach().clone())
    (torch.nn.functional.embedding(rows, plain, sparse=True).view(2, 4, 3) * up).sum().backward()
    want = plain.grad.coalesce()
    assert torch.equal(grad.indices(), want.indices())
    torch.testing.assert_close(grad.values(), want.values())
