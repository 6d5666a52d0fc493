"""HashEmbedding's Triton backend (``recstream.nn.hash_triton``) against the host path (compiled CPU
kernels) and the torch-op device path, on the same key streams: the same keys admitted, counted, aged
and evicted, the same values per key, the same outputs; states and exports move between backends.

Without a GPU the kernels run on CPU tensors in Triton's interpreter (``TRITON_INTERPRET=1``, set here
before triton is imported). Rows start at ``param_init="ones"``; the backends hand out free rows in
the same order (the host path's order), so states are compared per key and per row. Streams are small: the
interpreter runs each kernel lane by lane in Python."""
from __future__ import annotations

import copy
import os

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

if not torch.cuda.is_available():  # the interpreter must be on before triton is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton", reason="the Triton backend's tests need the optional package triton")

from recstream.hostpath import device_path  # noqa: E402
from recstream.nn import HashEmbedding, hash_triton  # noqa: E402
from recstream.nn.hash_embedding import lookup_masked_many, table_entries  # noqa: E402
from recstream.optim import LazyAdam  # noqa: E402
from recstream.testing import SyncCounter  # noqa: E402

# Triton runs on CPU tensors only in its interpreter: where a GPU made this process import it compiled
# (the variable unset above), the checks on CPU tensors give way to the GPU test at the end.
interpreted = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason=(
    "triton was imported for a GPU here (TRITON_INTERPRET unset): the checks on CPU tensors need its interpreter"))


def _stream(steps: int, batch: int, span: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(-span, span, (batch, 3), generator=g) * 7919 + 2 ** 40 for _ in range(steps)]


def _by_key(emb: HashEmbedding) -> dict[str, torch.Tensor]:
    """Every admitted key with its values, count and last-seen step, ordered by key."""
    out = emb.export(reset_delta=False)
    order = out["keys"].argsort()
    return {**{k: v[order] for k, v in out.items()}, "keys_by_row": out["keys"]}


def _train(emb: HashEmbedding, stream, backend: str, device=None):
    """Train on `stream` with `backend` ("host", "torch", "triton"); outputs, final table, sync counter."""
    if backend != "host":
        emb.table_backend = backend
    opt = LazyAdam([emb.values], lr=0.05)
    outs, counter = [], SyncCounter()
    for keys in stream:
        keys = keys if device is None else keys.to(device)
        with (device_path() if backend != "host" else torch.enable_grad()), counter:
            out = emb(keys)
            (out * torch.arange(out.shape[-1], dtype=out.dtype, device=out.device)).sum().backward()
            opt.step()
            opt.zero_grad()
        counter.mark()
        outs.append(out.detach().cpu())
    return outs, _by_key(emb), counter


def _assert_same(a, b) -> None:
    for step, (x, y) in enumerate(zip(a[0], b[0], strict=True)):
        assert torch.allclose(x, y, rtol=1e-5, atol=1e-6), f"step {step}: outputs differ"
    assert torch.equal(a[1]["keys"].cpu(), b[1]["keys"].cpu())
    for name in ("counts", "last_seen", "keys_by_row"):  # every key has the same row on each backend
        assert torch.equal(a[1][name].cpu(), b[1][name].cpu()), name
    assert torch.allclose(a[1]["values"].cpu(), b[1]["values"].cpu(), rtol=1e-5, atol=1e-6)


@interpreted
@pytest.mark.parametrize("permit,capacity,evict_after", [
    (1, 512, None),  # room for every key (4 steps x 48 ids): no eviction
    (3, 512, 2),  # admission after 3 sightings, age eviction
    (1, 48, None),  # more keys than rows: LRU passes
    (2, 40, 2),  # LRU passes with pending keys, age eviction
])
def test_triton_admits_counts_and_evicts_as_the_host_path_and_the_torch_ops(permit, capacity, evict_after):
    stream = _stream(4, 16, 40)
    emb = HashEmbedding(4, capacity=capacity, permit_filter_value=permit, param_init="ones",
                        evict_filter_value=evict_after)
    host = _train(copy.deepcopy(emb), stream, "host")
    torch_ops = _train(copy.deepcopy(emb), stream, "torch")
    before = hash_triton.launches
    triton = _train(emb, stream, "triton")
    _assert_same(host, triton)
    _assert_same(torch_ops, triton)
    assert emb.num_rows == host[1]["keys"].numel() > 0
    syncs = [s.syncs for s in triton[2].per_step]
    if capacity == 512:  # the host's bounds show room: nothing read, nothing that waits for the device
        assert syncs == [0] * len(stream), syncs
        # a step: 2 for the unique keys, probe (round 0 bids), 4 claim launches, carry out, the batch's vectors; age
        # eviction one more; far fewer ops than the torch path
        assert hash_triton.launches - before == len(stream) * (9 if evict_after is None else 10)
        assert triton[2].per_step[-1].ops < torch_ops[2].per_step[-1].ops / 2
    else:  # full: the step reads the counters once, then the LRU pass
        assert max(syncs) == 1, syncs


@interpreted
@pytest.mark.parametrize("permit,capacity", [(2, 1024), (1, 120)])
def test_keys_spread_over_many_programs_get_the_host_paths_rows(monkeypatch, permit, capacity):
    """Tiny blocks (8 keys a program, counts summed 16 programs at a time) put a step's ~150 keys in
    about 20 programs and the per-program count sums in a loop: ranks of admitted keys across
    programs, the paddings' first key with a row, the unique keys' runs across blocks, and an LRU
    pass (capacity 120) give what the host path gives."""
    from recstream.nn import hash_triton_unique

    monkeypatch.setattr(hash_triton, "BLOCK", 8)
    monkeypatch.setattr(hash_triton, "PBLOCK_MAX", 16)
    monkeypatch.setattr(hash_triton_unique, "BLOCK", 8)
    stream = _stream(3, 60, 90, seed=5)  # 180 ids a step, ~150 distinct, half seen before
    emb = HashEmbedding(4, capacity=capacity, permit_filter_value=permit, param_init="ones")
    host = _train(copy.deepcopy(emb), stream, "host")
    _assert_same(host, _train(emb, stream, "triton"))
    assert emb.num_rows == host[1]["keys"].numel() > 100


def _contending_keys(num_slots: int) -> torch.Tensor:
    """16 keys in key order (two programs of 8): keys 0 and 1 start at one slot ``h``, key 8 starts at
    ``h + 1`` -- key 1's next probe; the other 13 start apart from these and from each other."""
    from recstream.nn.tensor_hash_table import hash_keys

    cand = torch.arange(1, 200_000, dtype=torch.int64)
    start = hash_keys(cand) & (num_slots - 1)
    h = int(start[0])
    pair = cand[start == h][:2].tolist()  # keys 0 and 1: the same start
    b = int(cand[(start == (h + 1) % num_slots) & (cand > 10 ** 5)][0])  # key 8: at key 1's next probe
    used = {(h + d) % num_slots for d in range(-4, 8)}
    low, high = [], []  # keys 2-7 (between key 1 and 10**5) and 9-15 (above key 8)
    for k, s in zip(cand.tolist(), start.tolist(), strict=True):
        side = low if pair[1] < k < 10 ** 5 and len(low) < 6 else high if k > b and len(high) < 7 else None
        if side is not None and s not in used:
            side.append(k)
            used.add(s)
    keys = torch.tensor([*pair, *low, b, *high])
    assert keys.numel() == 16 and torch.equal(keys, keys.sort().values)
    return keys


@interpreted
def test_a_claim_round_never_bids_for_a_slot_an_earlier_round_gave_another_program(monkeypatch):
    """The claim launches write round r's winners and bid round r + 1 at once (`_round_fn`): a key
    that lost round 0 must not bid for a slot another program's key won in round 0 but (in this
    launch) has not written yet. Here key 1 loses its start slot to key 0, and its next probe is
    key 8's (the second program's) round-0 slot: the interpreter runs program 0 first, so without
    the claim words' check key 1 would bid for that slot too, outbid key 8 before key 8 reads its
    win, and the two keys would sit in other slots than on the host path."""
    from recstream.nn import hash_triton_unique

    monkeypatch.setattr(hash_triton, "BLOCK", 8)
    monkeypatch.setattr(hash_triton_unique, "BLOCK", 8)
    emb = HashEmbedding(4, capacity=64, param_init="ones")
    keys = _contending_keys(emb.table.num_slots)
    stream = [keys.flip(0).reshape(4, 4), keys.reshape(4, 4)]
    on_host = copy.deepcopy(emb)
    host = _train(on_host, stream, "host")
    triton = _train(emb, stream, "triton")
    _assert_same(host, triton)
    assert torch.equal(triton[1]["keys"], keys)
    assert torch.equal(emb.table.keys, on_host.table.keys)  # every key in the host path's slot


@interpreted
@pytest.mark.parametrize("param_init", ["normal", "uniform", "zeros", "ones"])
def test_the_carry_out_kernel_scales_the_same_draws_into_the_same_initial_rows(param_init):
    """The kernel does `_init_rows`' float32 arithmetic on the generator's draw itself (one op a
    table fewer): with one seed the Triton and torch-op tables start every admitted row bit for bit
    alike, for each ``param_init``."""
    stream = _stream(2, 16, 40, seed=7)
    tables = {}
    for backend in ("torch", "triton"):
        torch.manual_seed(11)
        emb = HashEmbedding(4, capacity=512, param_init=param_init)
        emb.table_backend = backend
        with device_path(), torch.no_grad():
            for keys in stream:
                emb(keys)
        tables[backend] = _by_key(emb)
    assert torch.equal(tables["torch"]["keys"], tables["triton"]["keys"])
    assert torch.equal(tables["torch"]["values"], tables["triton"]["values"])
    assert tables["triton"]["values"].abs().sum() > 0 or param_init == "zeros"


def _churn(steps: int) -> list[torch.Tensor]:
    """Many more distinct keys than rows: evictions leave tombstones until the table is rebuilt."""
    g = torch.Generator().manual_seed(3)
    return [torch.randint(0, 400, (16, 2), generator=g) * 7919 + 11 for _ in range(steps)]


def _assert_sound(emb: HashEmbedding) -> None:
    """The table's invariants: every key at a slot its probe finds, rows and slots pointing at each
    other, the free stack holding exactly the free rows, the counters counting what is there."""
    t = emb.table
    live = t.occupied()
    slots = live.nonzero().squeeze(1)
    assert torch.equal(t.find(t.keys[slots].to(torch.int64)), slots)
    rows = t.rows[slots]
    admitted = rows >= 0
    assert torch.equal(emb.row_slots[rows[admitted]], slots[admitted])
    free = emb.free_rows[: emb.num_free_t.item()]
    assert torch.equal(free.sort().values, (emb.row_slots < 0).nonzero().squeeze(1))
    assert emb.num_pending_t.item() == int((~admitted).sum()) and t.num_live_t.item() == slots.numel()
    assert t.num_used_t.item() == slots.numel() + int((t.keys == -2).sum())


def _count_rebuilds(monkeypatch) -> list[int]:
    """The live keys of every rebuild the Triton backend runs (the calls, recorded)."""
    calls, rebuild = [], hash_triton.TritonBackend.rebuild

    def spy(self, emb, live):
        calls.append(live)
        rebuild(self, emb, live)
    monkeypatch.setattr(hash_triton.TritonBackend, "rebuild", spy)
    return calls


@interpreted
def test_a_rebuild_runs_on_the_device_with_one_read_and_keeps_the_semantics(monkeypatch):
    rebuilds = _count_rebuilds(monkeypatch)
    stream = _churn(4)  # a rebuild at step 3
    emb = HashEmbedding(4, capacity=40, param_init="ones")
    host = _train(copy.deepcopy(emb), stream, "host")
    torch_ops = _train(copy.deepcopy(emb), stream, "torch")
    triton = _train(emb, stream, "triton")
    _assert_same(host, triton)  # no age eviction: nothing depends on the slot layout
    assert max(s.syncs for s in torch_ops[2].per_step) > 10  # the torch ops rebuild on the host path
    assert max(s.syncs for s in triton[2].per_step) == 1  # the kernels rebuild after the step's one read
    assert rebuilds
    _assert_sound(emb)


@interpreted
def test_with_age_eviction_the_triton_table_stays_sound_through_rebuilds(monkeypatch):
    rebuilds = _count_rebuilds(monkeypatch)
    # Age eviction frees rows in slot order, so after a rebuild laid keys out otherwise than the host
    # path (on a GPU: the atomics' order), rows (and the LRU pass's ties) may differ: what must hold is
    # the table itself.
    emb = HashEmbedding(4, capacity=40, param_init="ones", evict_filter_value=1)
    emb.table_backend = "triton"
    counter = SyncCounter()
    for keys in _churn(5):  # a rebuild at step 3
        with device_path(), counter:
            emb(keys)
        counter.mark()
        _assert_sound(emb)
    assert max(s.syncs for s in counter.per_step) == 1 and rebuilds


@interpreted
def test_a_state_saved_on_one_backend_loads_and_trains_on_the_others():
    stream = _stream(4, 8, 30)
    emb = HashEmbedding(4, capacity=64, permit_filter_value=2, param_init="ones", evict_filter_value=3)
    _train(emb, stream[:2], "triton")
    for target in ("host", "torch"):  # the Triton table's tensors as the host path's and back
        other = HashEmbedding(4, capacity=64, permit_filter_value=2, param_init="ones", evict_filter_value=3)
        other.load_state(emb.state())
        again = copy.deepcopy(emb)
        a, b = _train(other, stream[2:], target), _train(again, stream[2:], "triton")
        _assert_same(a, b)
    host = HashEmbedding(4, capacity=64, permit_filter_value=2, param_init="ones", evict_filter_value=3)
    _train(host, stream[:2], "host")
    back = HashEmbedding(4, capacity=64, permit_filter_value=2, param_init="ones", evict_filter_value=3)
    back.load_state_dict(host.state_dict())
    _assert_same(_train(host, stream[2:], "host"), _train(back, stream[2:], "triton"))


@interpreted
def test_an_export_of_the_triton_table_imports_into_a_host_table_and_reads_alike():
    emb = HashEmbedding(3, capacity=32, param_init="ones")
    _train(emb, _stream(3, 8, 20), "triton")
    served = HashEmbedding(3, capacity=32)
    served.import_(emb.export())
    keys = torch.cat([emb.export(reset_delta=False)["keys"], torch.tensor([12345])])
    emb.eval(), served.eval()
    with device_path():
        on_triton = emb(keys)
    assert torch.equal(on_triton, served(keys))
    assert on_triton[-1].abs().sum() == 0  # an unknown key reads the default


@interpreted
def test_masked_lookups_of_several_tables_on_triton_match_the_host_path():
    # DynamicTables' device path: the whole batch's ids, one mask per table, at most one read for all
    stream = _stream(4, 8, 30)
    masks = [torch.rand(k.numel(), generator=torch.Generator().manual_seed(i)) < 0.5 for i, k in enumerate(stream)]
    kw = dict(capacity=24, param_init="ones", permit_filter_value=2)
    on_host = [HashEmbedding(3, **kw), HashEmbedding(2, **kw)]
    on_triton = [HashEmbedding(3, **kw), HashEmbedding(2, **kw)]
    for t in on_triton:
        t.table_backend = "triton"
    for keys, mask in zip(stream, masks, strict=True):
        keys = keys.reshape(-1)
        want = [t.lookup_masked(keys, m) for t, m in zip(on_host, (mask, ~mask), strict=True)]
        with device_path(), SyncCounter() as counter:
            got = lookup_masked_many([(t, keys, m) for t, m in zip(on_triton, (mask, ~mask), strict=True)])
        assert counter.syncs <= 1
        assert all(torch.equal(a, b) for a, b in zip(want, got, strict=True))
    for a, b in zip(on_host, on_triton, strict=True):
        assert torch.equal(_by_key(a)["keys"], _by_key(b)["keys"]) and a.num_pending == b.num_pending


@interpreted
def test_a_triton_table_rebuilds_from_its_entries_into_another_geometry():
    emb = HashEmbedding(3, capacity=32, param_init="ones", permit_filter_value=2)
    _train(emb, _stream(3, 8, 20), "triton")
    bigger = HashEmbedding(3, capacity=64, param_init="ones", permit_filter_value=2)
    bigger.load_entries_(64, 64, table_entries(emb.state().tensors), emb.evicted_keys)
    for name, values in _by_key(emb).items():
        if name != "keys_by_row":
            assert torch.equal(values, _by_key(bigger)[name]), name
    assert bigger.num_pending == emb.num_pending


@interpreted
def test_an_eval_read_on_triton_changes_nothing_and_syncs_nothing():
    emb = HashEmbedding(2, capacity=16, param_init="ones")
    _train(emb, _stream(2, 4, 10), "triton")
    emb.eval()
    before = {k: v.clone() for k, v in emb.state_dict().items()}
    with device_path(), SyncCounter() as counter:
        emb(torch.tensor([5, 2 ** 40]))
    assert counter.syncs == 0
    assert all(torch.equal(before[k], v) for k, v in emb.state_dict().items())


class _Ops(TorchDispatchMode):
    """Counts the non-view torch ops dispatched inside it (what a GPU runs as kernels; the Triton
    backend's launches run outside any dispatch mode), by the innermost recstream function."""

    def __init__(self):
        super().__init__()
        self.by = {}

    @property
    def n(self) -> int:
        return sum(self.by.values())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view and func.overloadpacket is not torch.ops.aten.detach:
            import traceback
            frames = [f.name for f in traceback.extract_stack(limit=30) if "/recstream/" in f.filename]
            self.by[frames[-1] if frames else "?"] = self.by.get(frames[-1] if frames else "?", 0) + 1
        return func(*args, **(kwargs or {}))


@interpreted
def test_a_triton_training_lookup_leaves_ranks_padding_and_unique_keys_to_its_kernels():
    """The carry-out kernel ranks the admitted keys (per-program counts of the last claim round, no
    cumsum launched), pads the rows looked up and the rows to reset, and the claim rounds set up their
    own buffers; the unique keys are a sort and two launches; each kernel family's buffers are one
    allocation; the kernel writes the initial rows; the probe writes its assert's word; one launch
    gathers the batch's vectors: a steady lookup with room dispatches 13 torch ops, not 73 (20 of them
    ranks and counters, 10 the paddings, 17 `static_unique`'s), 6 of them allocations."""
    emb = HashEmbedding(4, capacity=512, param_init="ones")
    emb.table_backend = "triton"
    for keys in _stream(3, 16, 40):
        before = hash_triton.launches
        with device_path(), _Ops() as ops:
            emb(keys)
        assert hash_triton.launches - before == 9
    assert "carry_out" not in ops.by and "_padded" not in ops.by and "_insert" not in ops.by, ops.by
    assert "_init_rows" not in ops.by, ops.by  # ones: the kernel writes them
    assert "static_unique" not in ops.by and ops.by["_runs"] == 1, ops.by  # the sort
    assert ops.by["scratch"] == 4, ops.by  # unique, probe, carry-out, gather: one allocation each
    assert ops.by["forward"] == 1, ops.by  # the vectors' allocation; two gathers, embedding and where: one launch
    assert ops.n <= 13, ops.by


@interpreted
@pytest.mark.parametrize("dim,sparse", [(5, True), (200, True), (5, False)])
def test_the_vectors_launch_gives_the_torch_ops_outputs_and_gradients(dim, sparse):
    """`_KernelRows` (one launch) against the torch ops' `_MaskedRows`: the vectors of keys with a row,
    of pending keys (``default_value``, not zeros here) and of repeated keys, and the table's gradient;
    for a width past one block of columns (200 > 128), and for a table with dense gradients (which
    keeps the torch ops)."""
    g = torch.Generator().manual_seed(dim)
    emb = HashEmbedding(dim, capacity=256, permit_filter_value=2, sparse=sparse)
    emb.default_value.fill_(0.25)
    stream = [torch.randint(0, 30, (40,), generator=g) * 7919 + 2 ** 40 for _ in range(3)]
    weights = torch.linspace(-1.0, 1.0, dim)
    results = []
    for backend in ("torch", "triton"):
        table = copy.deepcopy(emb)
        table.table_backend = backend
        torch.manual_seed(0)  # new rows' draws: the same on both
        before, outs, grads = hash_triton.launches, [], []
        for keys in stream:
            with device_path():
                out = table(keys)
                (out * weights).sum().backward()
            outs.append(out.detach())
            grads.append(table.values.grad.to_dense() if sparse else table.values.grad.clone())
            table.values.grad = None
        results.append((outs, grads, hash_triton.launches - before))
    (torch_outs, torch_grads, _), (outs, grads, launches) = results
    assert launches == len(stream) * (9 if sparse else 8)  # the vectors' launch: sparse gradients only
    for step, (a, b, ga, gb) in enumerate(zip(torch_outs, outs, torch_grads, grads, strict=True)):
        assert torch.equal(a, b), f"step {step}: vectors differ"
        assert torch.equal(ga, gb), f"step {step}: gradients differ"
    assert (outs[0] == 0.25).all(dim=1).any() and (outs[-1] != 0.25).all(dim=1).any()  # pending and admitted keys


@interpreted
@pytest.mark.parametrize("n", [1, 2, 255, 256, 257, 700])
@pytest.mark.parametrize("span", [1, 3, 40, 10 ** 6])
def test_the_triton_unique_matches_static_unique_padding_included(n, span):
    """A sort and three launches (the probe's computing the counts) give `static_unique`'s four
    tensors exactly: runs across program blocks, one key throughout, all keys distinct, padding past
    the distinct keys. On an empty table a key's total count is its count in the batch."""
    from recstream.nn.hash_static import static_unique

    g = torch.Generator().manual_seed(n * 31 + span)
    keys = torch.randint(-span, span, (n,), generator=g) * 7919 + 2 ** 40
    before = hash_triton.launches
    plan, inverse = hash_triton.TRITON.unique_plan(HashEmbedding(2, capacity=1024), keys, None)
    assert hash_triton.launches - before == 3
    for ours, theirs, name in zip((plan.uniq, inverse, plan.total, plan.valid), static_unique(keys),
                                  ("uniq", "inverse", "counts", "valid"), strict=True):
        assert ours.dtype == theirs.dtype and torch.equal(ours, theirs), name


def test_triton_on_cpu_tensors_without_the_interpreter_is_refused_with_the_fix(monkeypatch):
    emb = HashEmbedding(2, capacity=16)
    emb.table_backend = "triton"
    kernels = hash_triton._kernels()
    monkeypatch.setattr(hash_triton, "_kernels", lambda: tuple(k.fn if hasattr(k, "fn") else k for k in kernels))
    with device_path(), pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        emb(torch.tensor([1, 2]))


def test_table_backend_names_the_allowed_values(monkeypatch):
    emb = HashEmbedding(2, capacity=4)
    with pytest.raises(ValueError, match="table_backend"):
        emb.table_backend = "cuda"
    assert HashEmbedding(2, capacity=4).table_backend == "auto"
    monkeypatch.setattr("recstream.nn.hash_embedding.triton_available", lambda: False)  # as without triton
    with pytest.raises(ValueError, match="needs the optional package triton"):
        emb.table_backend = "triton"
    with device_path():  # CPU tensors on the device path: the torch ops, unless Triton is asked for
        assert emb._backend_for(torch.zeros(1, dtype=torch.int64)).name == "torch"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_cuda_table_on_triton_matches_the_cpu_host_path():
    stream = _stream(8, 16, 40)
    kw = dict(capacity=48, permit_filter_value=2, param_init="ones", evict_filter_value=3)
    host = _train(HashEmbedding(4, **kw), stream, "host")
    cuda = _train(HashEmbedding(4, device="cuda", **kw), stream, "triton", device="cuda")
    _assert_same(host, cuda)


@interpreted
def test_auto_takes_triton_only_where_a_trained_table_matches_the_torch_ops(monkeypatch, caplog):
    """`triton_works` trains a small table with each device backend once per device: a kernel that
    fails (e.g. one this machine's Triton cannot compile) or disagrees sends "auto" to the torch ops,
    with a warning, before any real table has used it."""
    from recstream.nn import hash_embedding

    hash_embedding._triton_matches_torch.cache_clear()
    assert hash_embedding.triton_works(torch.device("cpu"))  # the interpreter stands in for a GPU
    hash_embedding._triton_matches_torch.cache_clear()

    def broken(*args, **kwargs):
        raise RuntimeError("PassManager::run failed")

    monkeypatch.setattr(hash_triton.TRITON, "carry_out", broken)
    assert not hash_embedding.triton_works(torch.device("cpu"))
    assert "Triton backend failed on cpu (RuntimeError: PassManager::run failed)" in caplog.text
    hash_embedding._triton_matches_torch.cache_clear()


@interpreted
def test_a_lookup_of_several_tables_that_raises_leaves_no_claim_behind():
    """`lookup_masked_many` probes every table before it finishes any, and a Triton probe makes its
    table's first claim round. When a later table's probe raises (its assert: at once on a CPU), the
    earlier tables' bids are voided: the next step places a new key where the torch ops place it,
    not around a bid nobody carries out. A call with a bad argument changes no table at all."""
    from recstream.nn.tensor_hash_table import hash_keys

    tri, tch, full = (HashEmbedding(4, capacity=64, param_init="ones") for _ in range(3))
    tri.table_backend, tch.table_backend, full.table_backend = "triton", "torch", "triton"
    cand = torch.arange(1, 50_000, dtype=torch.int64) * 7919 + 2 ** 40
    start = hash_keys(cand) & (tri.table.num_slots - 1)
    x, y = cand[start == start[5]][:2]  # one start slot: the failed step's key bids for Y's slot
    w = cand[:5][start[:5] != start[5]][0]  # a smaller key: Y's index in its step is 1, X's was 0
    first, clash = cand[start == start[6]][:2]
    with device_path():
        full(first.reshape(1))
        full.table.max_rounds = 1  # the clash's probe finds its one slot taken: the assert raises
        for emb in (tri, tch):
            with pytest.raises(RuntimeError, match="max_rounds=1"):
                lookup_masked_many([(emb, x.reshape(1), None), (full, clash.reshape(1), None)])
            lookup_masked_many([(emb, torch.stack([w, y]), None)])
        assert torch.equal(tri.table.keys, tch.table.keys)  # Y in its first free slot on both
        assert int(tri.table.find(y.reshape(1))) == int(start[5])  # the slot X's void bid was for
        step = tri._step
        with pytest.raises(ValueError, match="'mask' must be a bool tensor"):
            lookup_masked_many([(tri, y.reshape(1), None), (tch, y.reshape(1), torch.ones(2, dtype=torch.bool))])
        assert tri._step == step


@interpreted
def test_a_training_probe_that_passes_max_rounds_fails_its_device_assert():
    """With the first round's bids the probe launch also writes the assert's word (no ``all`` op a
    step): a key whose probe sequence has no empty slot within ``max_rounds`` still fails the step;
    the steps before it pass (the carry-out sets the word back)."""
    from recstream.nn.tensor_hash_table import hash_keys

    emb = HashEmbedding(4, capacity=64, param_init="ones")
    emb.table_backend = "triton"
    cand = torch.arange(1, 50_000, dtype=torch.int64) * 7919 + 2 ** 40
    start = hash_keys(cand) & (emb.table.num_slots - 1)
    first, clash = cand[start == start[0]][:2]  # two keys with one start slot
    others = cand[1:40][start[1:40] != start[0]]
    with device_path():
        emb(torch.stack([first, *others[:8]]))
        emb(others[8:16])  # a second step: the word was set back to 1
        emb.table.max_rounds = 1  # one probe a key: the clash finds its start slot taken
        with pytest.raises(RuntimeError, match="max_rounds=1"):
            emb(torch.stack([clash, *others[16:20]]))
        emb.table.max_rounds = 128
        emb(torch.stack([clash, *others[16:20]]))  # where the assert raised at once (a CPU), the word is reset
