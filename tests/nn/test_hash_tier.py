"""A disk-tiered HashEmbedding (``tier=DiskTier``) trains as the in-memory one does: same keys, same
optimizer -> the same outputs, keys and rows, bit for bit, with a cache far smaller than the live rows
(rows evicted and read back with their optimizer state, keys evicted by age and by capacity and their
rows reused). Checkpoints commit the store and restore to that commit; export and untiered copies read
every row; what the tier does not support is refused, naming it."""
import copy
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from recstream.checkpoint import load_checkpoint
from recstream.distributed import hybrid_parallel
from recstream.nn import DiskTier, HashEmbedding, tier_export
from recstream.optim import FTRL, LazyAdam, RowWiseAdagrad

from .hash_tier_worker import STEPS, initial_net, train_net

WORKER = Path(__file__).with_name("hash_tier_worker.py")
OPTIMIZERS = {"lazy_adam": lambda p: LazyAdam(p, lr=0.05),
              "adagrad": lambda p: RowWiseAdagrad(p, lr=0.1, initial_accumulator_value=0.1),
              "ftrl": lambda p: FTRL(p, lr=0.1, l1=0.001)}


def _keys(step, n=24, hot=1.1, top=5000):
    g = np.random.default_rng(step)
    return torch.from_numpy(np.minimum(g.zipf(hot, n), top).astype(np.int64) * 7919 + 2 ** 40)


def _build(tier=None, **kw):
    torch.manual_seed(0)
    return HashEmbedding(4, tier=tier, **{"capacity": 120, **kw})


def _train(emb, opt, start, stop):
    outs = []
    for step in range(start, stop):
        torch.manual_seed(step)  # new keys' initial rows: by step, whatever else ran in between
        out = emb(_keys(step))
        outs.append(out.detach().clone())
        opt.zero_grad(set_to_none=True)
        (out.sum(1) ** 2).mean().backward()
        opt.step()
    return outs


def _same_table(a, b):
    ea, eb = a.export(reset_delta=False), b.export(reset_delta=False)
    for field in ("keys", "counts", "last_seen", "values"):
        assert torch.equal(ea[field], eb[field]), field


@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
@pytest.mark.parametrize("config", [{}, {"permit_filter_value": 2}, {"evict_filter_value": 3, "max_norm": 0.05}],
                         ids=["lru", "admission", "age_max_norm"])
def test_tiered_training_equals_in_memory_under_cache_pressure(tmp_path, kind, config):
    memory = _build(**config)
    tiered = _build(DiskTier(str(tmp_path / "t"), cache_rows=25), **config)
    want = _train(memory, OPTIMIZERS[kind]([memory.values]), 0, 60)
    got = _train(tiered, OPTIMIZERS[kind]([tiered.values]), 0, 60)
    for step, (x, y) in enumerate(zip(want, got, strict=True)):
        assert torch.equal(x, y), f"step {step}"
    _same_table(memory, tiered)
    stats = tiered.tier_stats()
    assert tiered.num_rows > 25 and stats.misses > 4 * 25 and stats.bytes_written > 0  # evicted, read back
    assert tuple(tiered.values.shape) == (25, 4)  # the Parameter is the cache


def test_keys_evicted_by_the_table_free_their_rows_without_a_write_back(tmp_path):
    emb = _build(DiskTier(str(tmp_path), cache_rows=24), capacity=32, evict_filter_value=1)
    opt = LazyAdam([emb.values], lr=0.05)
    _train(emb, opt, 0, 1)
    tier = emb._tier
    rows = emb.row_slots.ge(0).nonzero().squeeze(1).numpy()
    assert rows.size and (tier.row2slot[rows] >= 0).all() and tier.dirty[tier.row2slot[rows]].all()
    written = tier.store.bytes_written
    for _ in range(3):  # unseen for more than evict_filter_value steps: evicted by age
        emb.step()
    assert emb.num_rows == 0
    assert (tier.row2slot[rows] == -1).all() and not tier.dirty.any()  # out of the cache, unwritten
    assert tier.store.bytes_written == written
    # The freed rows go to new keys with fresh values and fresh optimizer state, as in memory.
    memory = _build(capacity=32, evict_filter_value=1)
    mem_opt = LazyAdam([memory.values], lr=0.05)
    _train(memory, mem_opt, 0, 1)
    for _ in range(3):
        memory.step()
    want, got = _train(memory, mem_opt, 1, 8), _train(emb, opt, 1, 8)
    assert all(torch.equal(x, y) for x, y in zip(want, got, strict=True))
    _same_table(memory, emb)


def test_checkpoint_commits_the_store_and_restores_its_commit(tmp_path):
    tiered = _build(DiskTier(str(tmp_path / "t"), cache_rows=25))
    opt = LazyAdam([tiered.values], lr=0.05)
    _train(tiered, opt, 0, 20)
    state = tiered.state_dict()
    assert "values" not in state and state["tier"].tolist() == [tiered._tier.store.uid, 1]
    saved = {k: v.clone() for k, v in state.items()}
    opt_state = copy.deepcopy(opt.state_dict())  # (its step count: the rows' moments are the store's)
    reference = {k: v.clone() for k, v in tiered.export(reset_delta=False).items()}
    _train(tiered, opt, 20, 30)  # trains on: rows evicted and written back past the commit
    tiered.load_state_dict(saved)
    opt.load_state_dict(opt_state)
    for field, value in tiered.export(reset_delta=False).items():
        assert torch.equal(value, reference[field]), field
    # Resumed, it goes on as an uninterrupted in-memory run does.
    memory = _build()
    mem_opt = LazyAdam([memory.values], lr=0.05)
    _train(memory, mem_opt, 0, 20)
    assert all(torch.equal(x, y) for x, y in zip(_train(memory, mem_opt, 20, 30), _train(tiered, opt, 20, 30),
                                                 strict=True))
    _same_table(memory, tiered)


def test_a_commit_of_another_store_is_refused(tmp_path):
    a = _build(DiskTier(str(tmp_path / "a"), cache_rows=25))
    b = _build(DiskTier(str(tmp_path / "b"), cache_rows=25))
    a(_keys(0))
    with pytest.raises(RuntimeError, match=r'"tier" is a commit of tier store \d+, this HashEmbedding uses store'):
        b.load_state_dict(a.state_dict())


def test_an_in_memory_tables_state_loads_into_a_tiered_one_and_back(tmp_path):
    memory = _build()
    opt = LazyAdam([memory.values], lr=0.05)
    _train(memory, opt, 0, 10)
    tiered = _build(DiskTier(str(tmp_path), cache_rows=25))
    tiered.load_state_dict(memory.state_dict())
    _same_table(memory, tiered)
    twin = tier_export.untiered_copy(torch.nn.ModuleDict({"emb": tiered}))["emb"]
    assert twin.disk_tier is None and twin is not tiered
    _same_table(memory, twin)
    assert torch.equal(twin(_keys(3)), tiered(_keys(3)))


def test_materialized_state_and_export_read_every_row_and_commit_nothing(tmp_path):
    memory = _build()
    tiered = _build(DiskTier(str(tmp_path), cache_rows=25))
    _train(memory, LazyAdam([memory.values], lr=0.05), 0, 15)
    _train(tiered, LazyAdam([tiered.values], lr=0.05), 0, 15)
    net = torch.nn.ModuleDict({"emb": tiered})
    generation = tiered._tier.store.generation
    with tier_export.materialized_tiers(net):
        rows = net.state_dict()["emb.values"]
    with tier_export.materialized_tiers(net, meta=True):
        assert net.state_dict()["emb.values"].is_meta
    assert tier_export.tiered_keys(net) == {"emb.values"}
    live = memory.row_slots >= 0
    assert torch.equal(rows[live], memory.values.detach()[live])
    _same_table(memory, tiered)  # export(): the keys' rows, stored overlaid by cached
    assert tiered._tier.store.generation == generation  # nothing committed
    with pytest.raises(ValueError, match=r"disk-tiered table 'emb' \(120 x 4 float32, 1920 bytes"):
        tier_export.check_tiers_fit(net, "export", available=1000)


def test_what_the_tier_does_not_support_is_refused_naming_it(tmp_path):
    tier = DiskTier(str(tmp_path / "t"), cache_rows=8)
    with pytest.raises(ValueError, match=r"tier=DiskTier\(\.\.\.\)\) needs sparse=True.*got sparse=False"):
        HashEmbedding(4, capacity=16, sparse=False, tier=tier)
    with pytest.raises(ValueError, match=r"runs on the CPU .* device='meta'; allowed with tier=: device=None or 'cpu'"):
        HashEmbedding(4, capacity=16, device="meta", tier=tier)
    with pytest.raises(TypeError, match=r"HashEmbedding: 'tier' must be a recstream.nn.DiskTier or None"):
        HashEmbedding(4, capacity=16, tier=str(tmp_path))
    emb = HashEmbedding(4, capacity=16, tier=tier)
    with pytest.raises(ValueError, match=r"stays float32 on the CPU .* got a move to meta torch.float32; allowed"):
        torch.nn.Sequential(emb).to("meta")
    with pytest.raises(ValueError, match=r"got a move to cpu torch.float16"):
        emb.half()
    assert emb.values.device.type == "cpu" and emb.values.dtype == torch.float32 and emb.to("cpu") is emb
    with pytest.raises(ValueError, match=r"HashEmbedding.load_entries_: a disk-tiered table"):
        emb.load_entries_(16, 0, {}, torch.empty(0, dtype=torch.int64))
    # state() and save_sharded commit the store (tests/distributed/test_hash_tier_sharding.py); hybrid_parallel
    # key-shards a tiered table built on its ranks, not one built in one process (its store holds every key)
    with pytest.raises(ValueError, match=r"hybrid_parallel \(emb\): the disk-tiered HashEmbedding .* was built in a "
                                         r"single process"):
        hybrid_parallel(torch.nn.ModuleDict({"emb": emb}))
    with pytest.raises(ValueError, match=r"the disk tier .* caches 8 rows, a batch reads 12 distinct admitted keys"):
        emb(torch.arange(12))
    first = HashEmbedding(4, capacity=32, tier=DiskTier(str(tmp_path / "u"), 8))
    first._tier.store.close()  # (its lock: one table per store)
    with pytest.raises(ValueError, match=r"is 16x4 \(capacity x embedding_size\), its tier store .* holds \(32, 4\)"):
        HashEmbedding(4, capacity=16, tier=DiskTier(str(tmp_path / "u"), 8))


@pytest.mark.e2e
def test_sigkill_mid_training_then_resume_equals_an_uninterrupted_run(tmp_path):
    def run(kill_after=None):
        env = {**os.environ, "PYTHONPATH": str(WORKER.parents[2])}
        proc = subprocess.Popen([sys.executable, str(WORKER), str(tmp_path)], stdout=subprocess.PIPE, text=True,
                                env=env)
        if kill_after is None:
            assert proc.wait(timeout=300) == 0
            return
        while int(proc.stdout.readline()) < kill_after:
            pass
        os.kill(proc.pid, signal.SIGKILL)  # steps past the checkpoint wrote evicted rows back
        proc.wait()

    run(kill_after=13)  # 3 steps past the checkpoint of step 10
    run(kill_after=29)  # resumed from 10, killed 4 steps past the one of step 25
    run()
    tiered, opt = initial_net(tmp_path, resume=True)
    assert load_checkpoint(tmp_path / "ckpt.safetensors", tiered, opt, restore_rng=False)["step"] == STEPS
    reference, ref_opt = initial_net(None)
    train_net(reference, ref_opt, 0, STEPS)
    _same_table(reference.emb, tiered.emb)
    torch.testing.assert_close(tiered.head.weight, reference.head.weight, rtol=0, atol=0)
    for f in tiered.emb._tier.store.files.values():
        f.verify_all()


def test_a_models_dynamic_feature_is_tiered_by_its_disk_tier_and_trains_as_in_memory(tmp_path):
    from recstream.data import CategoricalFeature, Features, Schema
    from recstream.models import WideDeep
    from recstream.nn import TierPlan

    schema = Schema(["x"], [CategoricalFeature("user", dynamic=True, capacity=200, embedding_dim=4),
                            CategoricalFeature("item", vocab_size=50, embedding_dim=4)])

    def build(plan):
        torch.manual_seed(0)
        net = WideDeep(schema, hidden=(8,), disk_tier=plan)
        return net, LazyAdam(net.parameters(), lr=0.05)

    memory, tiered = build(None), build(TierPlan(str(tmp_path), {"user": 40, "item": 16}))
    table = tiered[0].embedding.dynamic.tables["user"]
    assert table.disk_tier == DiskTier(str(tmp_path / "embedding" / "user"), 40)
    assert memory[0].embedding.dynamic.tables["user"].disk_tier is None
    for step in range(25):
        g = np.random.default_rng(step)
        users = np.minimum(g.zipf(1.2, 16), 10 ** 6) * 104729
        values = torch.from_numpy(np.concatenate([users, g.integers(0, 50, 16)]).astype(np.int64))
        x = Features.from_lengths(torch.from_numpy(g.standard_normal((16, 1)).astype(np.float32)), values,
                                  torch.ones(2, 16, dtype=torch.int64), keys=("user", "item"))
        y = torch.from_numpy(g.integers(0, 2, 16).astype(np.float32))
        outs = []
        for net, opt in (memory, tiered):
            torch.manual_seed(step)
            opt.zero_grad(set_to_none=True)
            out = net(x)
            torch.nn.functional.binary_cross_entropy_with_logits(out, y).backward()
            opt.step()
            outs.append(out.detach())
        assert torch.equal(*outs), step
    assert table.tier_stats().misses > 40 and table.num_rows > 40  # the cache was too small for the keys
    _same_table(memory[0].embedding.dynamic.tables["user"], table)


def test_several_lookups_before_one_optimizer_step_keep_their_slots(tmp_path):
    """Two lookups of one table per step (``auto_step=False``): the second must not evict the slots the
    first one's gradients will update; their rows stay pinned until the optimizer steps."""
    def run(tier):
        torch.manual_seed(0)
        emb = HashEmbedding(4, capacity=150, auto_step=False, tier=tier)
        opt = LazyAdam([emb.values], lr=0.05)
        outs = []
        for step in range(30):
            emb.step()
            torch.manual_seed(step)
            a, b = emb(_keys(2 * step, n=12)), emb(_keys(2 * step + 1, n=12))
            outs.append(torch.cat([a, b]).detach())
            opt.zero_grad(set_to_none=True)
            (a.sum(1) ** 2).mean().add((b.sum(1) ** 3).mean()).backward()
            opt.step()
        return emb, outs

    memory, want = run(None)
    tiered, got = run(DiskTier(str(tmp_path / "t"), cache_rows=26))
    assert all(torch.equal(x, y) for x, y in zip(want, got, strict=True))
    _same_table(memory, tiered)
    assert tiered.tier_stats().misses > 100
    small = HashEmbedding(4, capacity=150, auto_step=False, tier=DiskTier(str(tmp_path / "s"), cache_rows=14))
    opt = LazyAdam([small.values], lr=0.05)
    small(torch.arange(10)).sum().backward()
    opt.step()  # from now on the lookups between two steps are pinned together
    small(torch.arange(10, 20))
    with pytest.raises(ValueError, match=r"caches 14 rows, fewer than the distinct admitted keys looked up since "
                                         r"the optimizer's last step \(this lookup: 10\)"):
        small(torch.arange(20, 30))


def test_import_of_more_rows_than_the_cache_goes_to_the_store(tmp_path):
    memory = _build()
    opt = LazyAdam([memory.values], lr=0.05)
    _train(memory, opt, 0, 20)
    rows = memory.export(reset_delta=False)
    assert rows["keys"].numel() > 25
    tiered = _build(DiskTier(str(tmp_path), cache_rows=25))
    tiered.import_(rows)  # more rows than the cache: written to the store
    got = tiered.export(reset_delta=False)
    order, want = torch.argsort(got["keys"]), torch.argsort(rows["keys"])
    for field in ("keys", "values", "counts", "last_seen"):
        assert torch.equal(got[field][order], rows[field][want]), field
    few = {k: v[:5] for k, v in rows.items()}
    few["values"] = few["values"] + 1.0
    tiered.load_rows(few["keys"], few["values"])  # a few: through the cache, overwriting known keys
    assert torch.equal(tiered(few["keys"]).detach(), few["values"])


def test_rows_loaded_after_training_do_not_pin_the_lookups_that_follow(tmp_path):
    emb = HashEmbedding(4, capacity=150, tier=DiskTier(str(tmp_path), cache_rows=14))
    opt = LazyAdam([emb.values], lr=0.05)
    emb(torch.arange(10)).sum().backward()
    opt.step()
    emb.load_rows(torch.arange(100, 110), torch.ones(10, 4))  # through the cache, not a lookup
    emb.eval()
    for start in range(0, 60, 10):  # eval lookups after the step: each may evict the one before
        assert emb(torch.arange(start, start + 10)).shape == (10, 4)


def test_prefetch_on_a_thread_keeps_training_equal(tmp_path):
    """Each step's next keys are prefetched on a background thread while the step trains: their rows
    (admitted keys') come in beside the step, and training stays the in-memory table's."""
    import threading
    memory = _build()
    want = _train(memory, LazyAdam([memory.values], lr=0.05), 0, 60)
    tiered = _build(DiskTier(str(tmp_path), cache_rows=50))
    opt = LazyAdam([tiered.values], lr=0.05)
    got = []
    for step in range(60):
        worker = threading.Thread(target=tiered.prefetch, args=(_keys(step + 1),))
        worker.start()
        got += _train(tiered, opt, step, step + 1)
        worker.join()
    assert all(torch.equal(x, y) for x, y in zip(want, got, strict=True))
    _same_table(memory, tiered)
    assert tiered.tier_stats().prefetched > 50


@pytest.mark.parametrize("boost_level", ["O0", "O1"])
def test_model_train_prefetches_a_tiered_dynamic_features_keys_and_trains_as_in_memory(tmp_path, boost_level):
    from recstream import Model
    from recstream.data import Batch, CategoricalFeature, Features, Schema
    from recstream.models import WideDeep
    from recstream.nn import TierPlan
    from recstream.train.sink import batch_prefetch

    schema = Schema(["x"], [CategoricalFeature("user", dynamic=True, capacity=300, embedding_dim=4),
                            CategoricalFeature("item", vocab_size=50, embedding_dim=4)])
    data = []
    for step in range(40):
        g = np.random.default_rng(step)
        values = torch.from_numpy(np.concatenate([np.minimum(g.zipf(1.3, 16), 10 ** 6), g.integers(0, 50, 16)]))
        x = Features.from_lengths(torch.from_numpy(g.standard_normal((16, 1)).astype(np.float32)), values,
                                  torch.ones(2, 16, dtype=torch.int64), keys=("user", "item"))
        data.append(Batch(x, torch.from_numpy(g.integers(0, 2, 16).astype(np.float32))))
    nets = []
    for plan in (None, TierPlan(str(tmp_path), {"user": 64})):
        torch.manual_seed(0)
        net = WideDeep(schema, hidden=(8,), disk_tier=plan)
        Model(net, torch.nn.BCEWithLogitsLoss(), LazyAdam(net.parameters(), lr=0.05), progress_bar=False,
              boost_level=boost_level).train(1, data)
        nets.append(net)
    memory, tiered = nets
    assert batch_prefetch(memory) is None and batch_prefetch(tiered) is not None
    table = tiered.embedding.dynamic.tables["user"]
    _same_table(memory.embedding.dynamic.tables["user"], table)
    assert table.tier_stats().prefetched > 0 and table.num_rows > 64


def test_rows_loaded_while_a_step_pins_the_cache_go_to_the_store(tmp_path):
    emb = HashEmbedding(4, capacity=150, tier=DiskTier(str(tmp_path), cache_rows=14))
    opt = LazyAdam([emb.values], lr=0.05)
    emb(torch.arange(10)).sum().backward()
    opt.step()
    out = emb(torch.arange(10, 20))  # pinned until the next step: 4 slots left
    emb.load_rows(torch.arange(100, 110), torch.full((10, 4), 2.0))
    out.sum().backward()
    opt.step()
    assert torch.equal(emb(torch.arange(100, 110)).detach(), torch.full((10, 4), 2.0))
