"""HashEmbedding's device path (``recstream.nn.hash_static``: static shapes, no host sync) against its
host path on the same key streams: the same keys admitted to the same rows with the same values,
counts and last-seen steps, the same pending keys and evictions, the same optimizer state.

The device path runs on CPU tensors under ``recstream.hostpath.device_path`` (the ops CUDA runs);
rows start at ``param_init="ones"`` (the two paths draw random initial rows in different amounts).
Keys, rows, counts and steps are compared exactly; values and optimizer state to float rounding (the
optimizer's device path sums a row's gradient entries in another order than its host path)."""
from __future__ import annotations

import copy

import pytest
import torch

from recstream.hostpath import device_path
from recstream.nn import HashEmbedding, hash_counters
from recstream.nn.hash_static import Scatter, claim, probe, static_unique
from recstream.nn.tensor_hash_table import TensorHashTable
from recstream.optim import LazyAdam
from recstream.testing import SyncCounter


def _stream(steps: int, batch: int, span: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(-span, span, (batch, 3), generator=g) * 7919 + 2 ** 40 for _ in range(steps)]


def _state(emb: HashEmbedding) -> dict:
    out = emb.export(reset_delta=False)
    return {"rows": emb.num_rows, "pending": emb.num_pending, "free": emb.free_rows[: emb.capacity - emb.num_rows],
            **out}


def _train(emb: HashEmbedding, stream, on_device: bool, masks=None, every_step: bool = True, opt=None):
    """Train on `stream`; the outputs, the table's state (after every step, or at the end: reading
    it makes the counters exact, which spares the next steps' reads), the optimizer, the counts."""
    opt = opt or LazyAdam([emb.values], lr=0.05)
    outs, states, counter = [], [], SyncCounter()
    for i, keys in enumerate(stream):
        with (device_path() if on_device else torch.enable_grad()), counter:
            out = emb(keys) if masks is None else emb.lookup_masked(keys.reshape(-1), masks[i])
            (out * torch.arange(out.shape[-1], dtype=out.dtype, device=out.device)).sum().backward()
            opt.step()
            opt.zero_grad()
        counter.mark()
        outs.append(out.detach())
        if every_step or i == len(stream) - 1:
            states.append(_state(emb))
    return outs, states, opt, counter


def _same(a, b) -> bool:
    if not isinstance(a, torch.Tensor):
        return a == b
    if a.is_floating_point():
        return a.shape == b.shape and torch.allclose(a, b, rtol=1e-5, atol=1e-6)
    return torch.equal(a, b)


def _compare(host, device):
    for step, (a, b) in enumerate(zip(host[0], device[0], strict=True)):
        assert _same(a, b), f"step {step}: outputs differ"
    for step, (a, b) in enumerate(zip(host[1], device[1], strict=True)):
        assert a.keys() == b.keys()
        for k in a:
            assert _same(a[k], b[k]), (step, k, a[k], b[k])
    sa, sb = (run[2].state[run[2].param_groups[0]["params"][0]] for run in (host, device))
    assert _same(sa["exp_avg"], sb["exp_avg"]) and _same(sa["exp_avg_sq"], sb["exp_avg_sq"])


@pytest.mark.parametrize("permit", [1, 3])
@pytest.mark.parametrize("capacity", [4096, 48])  # room for every key; LRU eviction
@pytest.mark.parametrize("evict_after", [None, 2])  # age eviction
def test_the_device_path_admits_counts_and_evicts_as_the_host_path(permit, capacity, evict_after):
    stream = _stream(12, 16, 40)
    torch.manual_seed(0)
    emb = HashEmbedding(4, capacity=capacity, permit_filter_value=permit, param_init="ones",
                        evict_filter_value=evict_after)
    host = _train(copy.deepcopy(emb), stream, on_device=False)
    device = _train(emb, stream, on_device=True)
    _compare(host, device)
    assert host[1][-1]["rows"] > 0
    syncs = [s.syncs for s in device[3].per_step]
    if capacity == 4096:  # room for every key all along: the bounds show it, nothing is read
        assert syncs == [0] * len(stream), syncs
    else:  # more keys than rows: LRU passes, each after the step's one read
        assert torch.cat([s.reshape(-1) for s in stream]).unique().numel() > capacity
        assert max(syncs) == 1, syncs


def test_a_step_that_logs_evictions_takes_the_host_path_and_agrees():
    stream = _stream(8, 16, 40)
    emb = HashEmbedding(4, capacity=48, param_init="ones", evict_filter_value=2)
    emb.export()  # the baseline: evictions are logged from here on
    other = copy.deepcopy(emb)
    host = _train(other, stream, on_device=False)
    device = _train(emb, stream, on_device=True)
    _compare(host, device)
    assert torch.equal(other.export_delta()["evicted_keys"], emb.export_delta()["evicted_keys"])


@pytest.mark.parametrize("copies_land", [False, True])
def test_the_device_path_reads_the_counters_once_when_the_bounds_do_not_show_room(monkeypatch, copies_land):
    # 48 ids a step, at most 120 distinct keys, 500 rows: the bound of the free rows (48 fewer a step)
    # no longer shows room at step 11; one read shows ~380 free rows, good for 7 more steps. Where the
    # counters' asynchronous copies land (recstream.nn.hash_counters), they show that room first.
    if not copies_land:
        monkeypatch.setattr(hash_counters.CounterWatch, "post", lambda self, emb: None)
    stream = _stream(14, 16, 60)
    emb = HashEmbedding(4, capacity=500, param_init="ones")
    host = _train(copy.deepcopy(emb), stream, on_device=False, every_step=False)
    device = _train(emb, stream, on_device=True, every_step=False)
    _compare(host, device)
    syncs = [s.syncs for s in device[3].per_step]
    assert syncs == ([0] * 14 if copies_land else [0] * 10 + [1] + [0] * 3), syncs


def test_a_masked_lookup_leaves_the_masked_out_keys_alone_on_both_paths():
    stream = _stream(5, 8, 30)
    g = torch.Generator().manual_seed(1)
    masks = [torch.rand(s.numel(), generator=g) < 0.6 for s in stream]
    emb = HashEmbedding(3, capacity=256, permit_filter_value=2, param_init="ones")
    host = _train(copy.deepcopy(emb), stream, on_device=False, masks=masks)
    device = _train(emb, stream, on_device=True, masks=masks)
    _compare(host, device)
    assert all(s.syncs == 0 for s in device[3].per_step)


def test_eval_reads_on_the_device_path_change_nothing_and_match_the_host():
    emb = HashEmbedding(4, capacity=64, permit_filter_value=2, max_norm=0.5)
    emb(torch.tensor([1, 2, 2, 3, 3, 3]))
    emb.eval()
    keys = torch.tensor([[3, 2, 1, 99], [2, 2, 3, 7]])
    before = copy.deepcopy(emb.state_dict())
    expected = emb(keys)
    with device_path(), SyncCounter() as counter:
        got = emb(keys)
    assert counter.syncs == 0 and torch.equal(got, expected)
    assert all(torch.equal(before[k], v) for k, v in emb.state_dict().items())


def test_static_unique_and_probe_match_their_host_counterparts():
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        keys = torch.randint(-50, 50, (int(torch.randint(1, 60, (1,), generator=g)),), generator=g)
        u, inv, c, valid = static_unique(keys)
        eu, einv, ec = torch.unique(keys, return_inverse=True, return_counts=True)
        assert torch.equal(u[valid], eu) and torch.equal(inv, einv) and torch.equal(c[valid], ec)
    t = TensorHashTable(64)
    t.insert(torch.tensor([5, 17, 29, 1000]))
    t.delete(t.find(torch.tensor([17])))
    keys = torch.tensor([5, 17, 29, 1000, 41, 77])
    slots, free = t.locate(keys)
    got_slots, got_free = probe(t, keys, torch.ones(6, dtype=torch.bool))
    assert torch.equal(got_slots, slots) and torch.equal(got_free, free)


def test_claim_gives_keys_competing_for_one_slot_the_next_free_ones_and_find_reaches_them():
    t = TensorHashTable(16)
    keys = torch.arange(100, 110)
    _, free = probe(t, keys, torch.ones(10, dtype=torch.bool))
    assert free.unique().numel() < 10  # some keys want one slot
    slots, reused = claim(t, keys, torch.ones(10, dtype=torch.bool), free)
    assert (slots >= 0).all() and slots.unique().numel() == 10 and int(reused) == 0
    t.record_inserts(10, 0)
    assert torch.equal(t.find(keys), slots)


def test_scatter_writes_only_the_masked_entries_and_nothing_when_none_is():
    buf = torch.arange(6.0)
    Scatter(torch.tensor([4, 1, 1]), torch.tensor([False, True, False])).put(buf, torch.tensor([9.0, 8.0, 7.0]))
    assert buf.tolist() == [0.0, 8.0, 2.0, 3.0, 4.0, 5.0]
    Scatter(torch.tensor([4, -1]), torch.tensor([False, False])).put(buf, 5.0)
    assert buf.tolist() == [0.0, 8.0, 2.0, 3.0, 4.0, 5.0]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("capacity", [4096, 48])
def test_a_cuda_table_admits_counts_and_evicts_as_the_cpu_host_path(capacity):
    stream = _stream(10, 16, 40)
    make = dict(embedding_size=4, capacity=capacity, permit_filter_value=2, param_init="ones", evict_filter_value=3)
    host = _train(HashEmbedding(**make), stream, on_device=False)
    cuda = _train(HashEmbedding(**make, device="cuda"), [s.cuda() for s in stream], on_device=False)
    cpu = lambda run: ([o.cpu() for o in run[0]],  # noqa: E731
                       [{k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in s.items()} for s in run[1]],
                       run[2])
    for step, (a, b) in enumerate(zip(host[1], cpu(cuda)[1], strict=True)):
        for k in a:
            assert _same(a[k], b[k]), (step, k)
    for a, b in zip(host[0], cpu(cuda)[0], strict=True):
        assert _same(a, b)


def test_a_table_trained_on_the_device_path_goes_on_on_the_host_path_as_if_it_had_been_there():
    stream = _stream(8, 16, 40)
    make = dict(embedding_size=4, capacity=48, permit_filter_value=2, param_init="ones")
    host = _train(HashEmbedding(**make), stream, on_device=False)
    mixed = HashEmbedding(**make)
    first = _train(mixed, stream[:4], on_device=True, every_step=False)
    then = _train(mixed, stream[4:], on_device=False, opt=first[2])
    for a, b in zip(host[1][4:], then[1], strict=True):
        for k in a:
            assert _same(a[k], b[k]), k
    assert all(_same(a, b) for a, b in zip(host[0], first[0] + then[0], strict=True))


def test_lookup_masked_refuses_a_mask_of_another_shape_or_type():
    emb = HashEmbedding(2, capacity=8)
    with pytest.raises(ValueError, match="'mask' must be a bool tensor shaped like 'keys'"):
        emb.lookup_masked(torch.tensor([1, 2]), torch.tensor([1, 0]))
    with pytest.raises(ValueError, match="'mask' must be a bool tensor shaped like 'keys'"):
        emb.lookup_masked(torch.tensor([1, 2]), torch.tensor([True]))


def _same_home(table: TensorHashTable, n: int) -> torch.Tensor:
    """`n` keys whose probe sequences are one and the same (same first slot)."""
    cand = torch.arange(10 ** 6, 10 ** 6 + 50000)
    home = table.start_of(cand)
    return cand[home == home[0]][:n]


def test_claim_leaves_out_a_chain_longer_than_its_rounds_and_the_table_stays_sound():
    from recstream.nn.hash_static import CLAIM_ROUNDS
    t = TensorHashTable(64)
    keys = _same_home(t, CLAIM_ROUNDS + 2)  # each round places one of them
    _, free = probe(t, keys, torch.ones(keys.numel(), dtype=torch.bool))
    slots, _ = claim(t, keys, torch.ones(keys.numel(), dtype=torch.bool), free)
    assert (slots[:CLAIM_ROUNDS] >= 0).all() and (slots[CLAIM_ROUNDS:] == -1).all()
    t.record_inserts(CLAIM_ROUNDS, 0)
    found = t.find(keys)
    assert torch.equal(found[:CLAIM_ROUNDS], slots[:CLAIM_ROUNDS]) and (found[CLAIM_ROUNDS:] == -1).all()


def test_keys_left_out_by_claim_read_the_default_and_are_admitted_when_next_seen():
    from recstream.nn.hash_static import CLAIM_ROUNDS
    emb = HashEmbedding(2, capacity=16, param_init="ones")
    keys = _same_home(emb.table, CLAIM_ROUNDS + 2)
    with device_path():
        first = emb(keys)
        assert emb.num_rows == CLAIM_ROUNDS and first[CLAIM_ROUNDS:].abs().sum() == 0
        again = emb(keys[CLAIM_ROUNDS:])
    assert emb.num_rows == CLAIM_ROUNDS + 2 and bool((again == 1).all())


@pytest.mark.parametrize("capacity", [4096, 32])
def test_pending_keys_over_budget_are_dropped_alike_with_one_read_a_step(capacity):
    """A long tail: most keys stay pending (permit 3) and overflow ``pending_capacity`` every step."""
    stream = _stream(10, 16, 150)
    make = dict(embedding_size=4, capacity=capacity, permit_filter_value=3, pending_capacity=20, param_init="ones")
    host = _train(HashEmbedding(**make), stream, on_device=False)
    emb = HashEmbedding(**make)
    device = _train(emb, stream, on_device=True)
    _compare(host, device)
    syncs = [s.syncs for s in device[3].per_step]
    assert host[1][-1]["pending"] <= 20
    if capacity == 4096:
        assert max(syncs) == 1, syncs
    else:  # churn fills the slots with tombstones: one step rebuilds the table (the host path's step)
        assert sorted(syncs)[-2] == 1 and sorted(syncs)[-1] > 1, syncs


def test_keys_free_of_reserved_markers_skip_that_check_but_not_the_int32_range():
    """`lookup_masked_many(..., reserved_free=True)` (keys through `table_key`): an int64-keyed table
    dispatches no check of its keys (the same vectors), an int32-keyed one still refuses a key
    outside int32, on the device path as without the flag."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from recstream.nn.hash_device_path import lookup_masked_many

    class Asserts(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.n += func.overloadpacket is torch.ops.aten._assert_async
            return func(*args, **(kwargs or {}))

    keys = torch.tensor([5, 7, 5, 2 ** 40])
    a, b = (HashEmbedding(4, capacity=16, param_init="ones") for _ in range(2))
    with device_path():
        with Asserts() as checked:
            plain = lookup_masked_many([(a, keys, None)])[0]
        with Asserts() as trusted:
            free = lookup_masked_many([(b, keys, None)], reserved_free=True)[0]
        torch.testing.assert_close(free, plain)
        assert checked.n - trusted.n == 1  # the reserved-marker check's device assert
        narrow = HashEmbedding(4, capacity=16, key_dtype=torch.int32)
        with pytest.raises(RuntimeError, match="must fit in int32"):
            lookup_masked_many([(narrow, keys, None)], reserved_free=True)


def test_a_training_lookups_sparse_gradient_is_autograds_where_and_embedding(monkeypatch):
    """The device path's training lookup builds its sparse gradient itself (`_MaskedRows`: no zero
    scalar made a step): the same output, and the same gradient -- indices, values, zeros (not the
    incoming NaN) at keys without a row -- as autograd's ``where`` of a sparse ``embedding``."""
    import torch.nn.functional as F

    from recstream.nn import hash_device_path

    seen = {}
    apply = hash_device_path._MaskedRows.apply

    def spy(values, index, mask, default):
        seen.update(index=index, mask=mask, default=default)
        return apply(values, index, mask, default)

    monkeypatch.setattr(hash_device_path._MaskedRows, "apply", spy)
    emb = HashEmbedding(3, capacity=16, permit_filter_value=2)  # a key seen once has no row yet
    emb.default_value.fill_(0.5)
    with device_path():
        emb(torch.tensor([5, 6, 5, 7, 5]))
        out = emb(torch.tensor([5, 9, 6, 5, 8, 7]))  # 9 and 8 pending; 6 and 7 admitted now
    mask = seen["mask"]
    assert mask.squeeze(1).tolist() == [True, False, True, True, False, True]
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(0))
    grad[1] = float("nan")  # a key without a row: its gradient names a padded row, with zeros
    out.backward(grad)
    values = emb.values.detach().clone().requires_grad_()
    ref = torch.where(mask, F.embedding(seen["index"], values, sparse=True), seen["default"])
    ref.backward(grad)
    assert torch.equal(out, ref)
    ours, theirs = emb.values.grad, values.grad
    assert ours.is_sparse and torch.equal(ours._indices(), theirs._indices())
    assert torch.equal(ours._values(), theirs._values()) and torch.isfinite(ours._values()).all()


@pytest.mark.parametrize("watermark", [0.95, 0.5])
def test_a_full_table_whose_pass_frees_less_than_a_batch_warns_once_how_to_fix_it(caplog, watermark):
    """48 keys a step into 200 rows: at 0.95 a pass frees 10 rows beyond the step's need, so the host's
    bounds (every key new) never show room again and the device path reads at every step: one warning,
    naming the watermark that leaves two batches' room (1 - 2 * 48 / 200 = 0.52). At 0.5 (100 rows) none."""
    emb = HashEmbedding(4, capacity=200, param_init="ones", evict_low_watermark=watermark)
    stream = _stream(12, 16, 10_000)
    with caplog.at_level("WARNING", logger="recstream.nn.hash_device_path"):
        device = _train(emb, stream, on_device=True, every_step=False)
    warned = [r.getMessage() for r in caplog.records if "evict_low_watermark" in r.getMessage()]
    syncs = [s.syncs for s in device[3].per_step]
    first = next(i for i, n in enumerate(syncs) if n)
    if watermark == 0.5:
        assert warned == [] and 0 in syncs[first:], syncs  # two batches' room: steps without a read
        return
    assert len(warned) == 1, warned
    assert "capacity=200 frees 10" in warned[0] and "a batch's 48 keys" in warned[0], warned[0]
    assert "evict_low_watermark to at most 0.52 " in warned[0], warned[0]
    assert 0 not in syncs[first:], syncs  # what it says: once full, a read at every step (or the host path's)
