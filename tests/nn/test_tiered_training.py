"""A disk-tiered EmbeddingBagCollection table trains as the in-memory table does: same data, same initial
rows, same optimizer -> the same rows and losses to float rounding, with a cache far smaller than the ids
an epoch reads (rows evicted and read back with their optimizer state). Checkpoints commit the store and
restore to that commit; a store from another table or a later commit is refused."""
import copy
import threading
import time

import numpy as np
import pytest
import torch
from torch import nn

from recstream.features import Features
from recstream.nn import DiskTier, EmbeddingBagCollection, EmbeddingTableConfig
from recstream.nn.tier_store import TierStore
from recstream.optim import FTRL, LazyAdam, RowWiseAdagrad

ROWS, BATCH = 3000, 16


class _Net(nn.Module):
    def __init__(self, tier=None, wide_tier=None):
        super().__init__()
        self.ebc = EmbeddingBagCollection([
            EmbeddingTableConfig("user", 200, 8),
            EmbeddingTableConfig("item", ROWS, 8, pooling="mean", feature_names=("item", "hist"), tier=tier),
            EmbeddingTableConfig("wide", ROWS, 1, tier=wide_tier),
        ])
        self.head = nn.Linear(self.ebc.output_dim, 1)

    def forward(self, x):
        return self.head(self.ebc(x)).squeeze(1)


def _batches(n, seed=0):
    """Zipf-ish ids: a few hot rows and a long tail, so a small cache both hits and evicts."""
    g = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        user = g.integers(0, 200, BATCH)
        item = np.minimum(g.zipf(1.3, BATCH) - 1, ROWS - 1)
        hist_len = g.integers(0, 4, BATCH)
        hist = np.minimum(g.zipf(1.3, hist_len.sum()) - 1, ROWS - 1)
        wide = g.integers(0, ROWS, BATCH)
        values = torch.from_numpy(np.concatenate([user, item, hist, wide]).astype(np.int64))
        ones = np.ones(BATCH)
        lengths = torch.from_numpy(np.stack([ones, ones, hist_len, ones]).astype(np.int64))
        x = Features.from_lengths(torch.zeros(BATCH, 0), values, lengths, keys=("user", "item", "hist", "wide"))
        out.append((x, torch.from_numpy(g.integers(0, 2, BATCH).astype(np.float32))))
    return out


def _optimizer(kind, net):
    embeddings = [p for n, p in net.named_parameters() if n.startswith("ebc.")]
    dense = torch.optim.SGD(net.head.parameters(), lr=0.05)
    sparse = {"lazy_adam": lambda: LazyAdam(embeddings, lr=0.05),
              "adagrad": lambda: RowWiseAdagrad(embeddings, lr=0.1, initial_accumulator_value=0.1),
              "ftrl": lambda: FTRL(embeddings, lr=0.1, l1=0.001)}[kind]()
    return sparse, dense


def _train(net, opts, batches):
    losses = []
    for x, y in batches:
        loss = nn.functional.binary_cross_entropy_with_logits(net(x), y)
        for o in opts:
            o.zero_grad(set_to_none=True)
        loss.backward()
        for o in opts:
            o.step()
        losses.append(loss.item())
    return losses


def _pair(tmp_path, cache_rows=64, wide_cache=64):
    torch.manual_seed(0)
    memory = _Net()
    tiered = _Net(DiskTier(tmp_path / "item", cache_rows), DiskTier(tmp_path / "wide", wide_cache))
    tiered.load_state_dict(memory.state_dict())  # in-memory tables' rows into the stores
    return memory, tiered


def _assert_same_tables(a, b):
    ta, tb = a.ebc.gather_tables(), b.ebc.gather_tables()
    for name in ta:
        torch.testing.assert_close(tb[name], ta[name], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("kind", ["lazy_adam", "adagrad", "ftrl"])
def test_training_with_a_small_cache_equals_the_in_memory_table(tmp_path, kind):
    memory, tiered = _pair(tmp_path)
    batches = _batches(60)
    distinct = len(np.unique(np.concatenate([x.values.numpy() for x, _ in batches])))
    assert distinct > 4 * 64  # the cache holds a fraction of the rows the run reads
    lm = _train(memory, _optimizer(kind, memory), batches)
    lt = _train(tiered, _optimizer(kind, tiered), batches)
    np.testing.assert_allclose(lt, lm, rtol=1e-5)
    _assert_same_tables(memory, tiered)
    stats = tiered.ebc.tier_stats()
    assert stats["item"].misses > 64 and stats["item"].bytes_written > 0 and stats["item"].hits > 0
    # the optimizer state travelled: the stored state of a row trained and evicted is the in-memory one
    tier = tiered.ebc._tiers[tiered.ebc._table_loc["item"][0]]
    key = {"lazy_adam": "exp_avg_sq", "adagrad": "sum", "ftrl": "accumulator"}[kind]
    assert key in tier.store.files and len(tier.store.groups) == 1  # (rows loaded, then the state met: merged)


def test_a_fresh_tables_optimizer_state_joins_its_weights_records(tmp_path):
    """A table created tiered and trained: its optimizer's states, met at the first step before any row
    was written, join the weights' file (one record a row); training equals the in-memory table's
    through evictions, and a reopened store holds the one file."""
    tiered = EmbeddingBagCollection([EmbeddingTableConfig("t", 1000, 4, tier=DiskTier(tmp_path, 16))])
    memory = EmbeddingBagCollection([EmbeddingTableConfig("t", 1000, 4)])
    memory.load_state_dict({"tables.t.weight": tiered.gather_tables()["t"]})
    opts = [LazyAdam(memory.parameters(), lr=0.1), LazyAdam(tiered.parameters(), lr=0.1)]
    rng = np.random.default_rng(3)
    for _ in range(30):
        ids = torch.from_numpy(rng.integers(0, 1000, 12))
        for net, opt in zip((memory, tiered), opts, strict=True):
            opt.zero_grad()
            net(ids, torch.arange(5) * 3, 4).square().sum().backward()
            opt.step()
    store = tiered._tiers[0].store
    assert len(store.groups) == 1 and set(store.files) == {"weight", "exp_avg", "exp_avg_sq"}
    assert tiered.tier_stats()["t"].bytes_written > 0  # rows were evicted and written back
    torch.testing.assert_close(tiered.gather_tables()["t"], memory.gather_tables()["t"], rtol=1e-6, atol=1e-7)
    tiered.state_dict()  # a commit
    directory = store.directory
    store.close()
    reopened = TierStore.open(directory)
    assert [spec.arrays for spec in reopened.specs] == [(("weight", 4), ("exp_avg", 4), ("exp_avg_sq", 4))]
    reopened.close()


def test_a_batch_wider_than_the_cache_is_refused_with_the_sizes(tmp_path):
    net = EmbeddingBagCollection([EmbeddingTableConfig("t", 100, 4, tier=DiskTier(tmp_path, 3))])
    with pytest.raises(ValueError, match=r"table 't' caches 3 rows, a batch reads 4 distinct.*cache_rows"):
        net(torch.tensor([1, 2, 3, 4]), torch.tensor([0, 1, 2, 3, 4]), 4)
    with pytest.raises(ValueError, match=r"must be in \[0, 100\)"):
        net(torch.tensor([100]), torch.tensor([0, 1]), 1)


def test_a_tiered_table_needs_sparse_gradients(tmp_path):
    with pytest.raises(ValueError, match=r"disk-tiered tables \['t'\] need sparse=True"):
        EmbeddingBagCollection([EmbeddingTableConfig("t", 100, 4, tier=DiskTier(tmp_path, 8))], sparse=False)


def test_a_store_of_another_shape_is_refused(tmp_path):
    EmbeddingBagCollection([EmbeddingTableConfig("t", 100, 4, tier=DiskTier(tmp_path, 8))])
    with pytest.raises(ValueError, match=r"table 't' is 100x8, its tier store .* holds \(100, 4\)"):
        EmbeddingBagCollection([EmbeddingTableConfig("t", 100, 8, tier=DiskTier(tmp_path, 8))])


@pytest.mark.parametrize("later_commit", [False, True])
def test_a_checkpoint_restores_the_committed_rows_and_state(tmp_path, later_commit):
    """state_dict commits the store; training on, then loading that state_dict (model and optimizer)
    and training the same batches again gives the same result as the first time -- also after one
    later commit (a checkpoint whose file was never written, or load_checkpoint's own state_dict)."""
    _, tiered = _pair(tmp_path)
    opts = _optimizer("lazy_adam", tiered)
    batches = _batches(40, seed=1)
    _train(tiered, opts, batches[:20])
    model_state = {k: v.clone() for k, v in tiered.state_dict().items()}
    opt_states = copy.deepcopy([o.state_dict() for o in opts])
    assert "ebc.tables.item.tier" in model_state and "ebc.tables.item.weight" not in model_state
    first = _train(tiered, opts, batches[20:])
    after_first = tiered.ebc.gather_tables()
    if later_commit:
        tiered.state_dict()
    tiered.load_state_dict(model_state)
    for o, s in zip(opts, opt_states, strict=True):
        o.load_state_dict(s)
    second = _train(tiered, opts, batches[20:])
    np.testing.assert_allclose(second, first, rtol=1e-6)
    for name, w in tiered.ebc.gather_tables().items():
        torch.testing.assert_close(w, after_first[name])


def test_a_checkpoint_older_than_the_store_or_of_another_store_is_refused(tmp_path):
    _, tiered = _pair(tmp_path)
    opts = _optimizer("adagrad", tiered)
    batches = _batches(4)
    _train(tiered, opts, batches[:1])
    old = tiered.state_dict()
    assert tiered.state_dict()["ebc.tables.item.tier"].tolist() == old["ebc.tables.item.tier"].tolist()  # no change
    _train(tiered, opts, batches[1:3])
    tiered.state_dict()
    _train(tiered, opts, batches[3:])
    tiered.state_dict()  # two commits later
    with pytest.raises(RuntimeError, match=r"tier generation 1: .*cannot return to generation 1; it is at "
                                           r"generation 3 and can return only to it or the one before"):
        tiered.load_state_dict(old)
    other = _Net(DiskTier(tmp_path / "other_item", 64), DiskTier(tmp_path / "other_wide", 64))
    with pytest.raises(RuntimeError, match=r"is a commit of tier store \d+, table 'item' uses store"):
        other.load_state_dict(old)


def test_prefetch_on_a_thread_keeps_training_equal(tmp_path):
    """Each step's next batch is prefetched on a background thread while the step trains."""
    memory, tiered = _pair(tmp_path, cache_rows=96)
    batches = _batches(40, seed=2)
    lm = _train(memory, _optimizer("lazy_adam", memory), batches)
    opts = _optimizer("lazy_adam", tiered)
    lt = []
    for i, (x, y) in enumerate(batches):
        worker = None
        if i + 1 < len(batches):
            worker = threading.Thread(target=tiered.ebc.prefetch, args=(batches[i + 1][0],))
            worker.start()
        lt += _train(tiered, opts, [(x, y)])
        if worker is not None:
            worker.join()
    np.testing.assert_allclose(lt, lm, rtol=1e-5)
    _assert_same_tables(memory, tiered)
    assert tiered.ebc.tier_stats()["item"].prefetched > 0


def test_a_prefetch_on_another_thread_during_each_step_fills_its_slots_and_training_stays_equal(tmp_path):
    """Each step's next batch is prefetched on another thread while the step runs (as the data
    channel's thread does): the prefetch reads its rows, writes the evicted ones back and copies the
    rows into their slots itself, and training equals the in-memory table's."""
    memory, tiered = _pair(tmp_path, cache_rows=96)
    batches = _batches(12, seed=3)
    lm = _train(memory, _optimizer("lazy_adam", memory), batches)
    opts = _optimizer("lazy_adam", tiered)
    tier = tiered.ebc._tiers[tiered.ebc._table_loc["item"][0]]
    lt = []
    for i, (x, y) in enumerate(batches):
        ahead = batches[i + 1][0] if i + 1 < len(batches) else None
        worker = None if ahead is None else threading.Thread(target=tiered.ebc.prefetch, args=(ahead,))
        if worker is not None:
            worker.start()
        lt += _train(tiered, opts, [(x, y)])
        if worker is not None:
            worker.join()
    assert tier.stats.prefetched > 0
    np.testing.assert_allclose(lt, lm, rtol=1e-5)
    _assert_same_tables(memory, tiered)


def test_a_prefetch_that_fails_to_fill_its_slots_leaves_them_empty_and_training_equal(tmp_path):
    """A prefetch whose copy into the slots fails (after writing the evicted rows back) raises, and
    leaves those slots empty: the rows it moved are read from the store when asked, training equal."""
    memory, tiered = _pair(tmp_path, cache_rows=96)
    batches = _batches(12, seed=3)
    lm = _train(memory, _optimizer("lazy_adam", memory), batches)
    opts = _optimizer("lazy_adam", tiered)
    tier = tiered.ebc._tiers[tiered.ebc._table_loc["item"][0]]
    lt = _train(tiered, opts, batches[:6])
    fill = tier._fill

    def failing(*args):
        raise MemoryError("no memory for the copy")

    tier._fill = failing
    with pytest.raises(MemoryError, match="no memory"):
        tiered.ebc.prefetch(batches[6][0])
    tier._fill = fill
    assert not tier._in_flight and (tier.row2slot >= -1).all()  # nothing left moving
    lt += _train(tiered, opts, batches[6:])
    np.testing.assert_allclose(lt, lm, rtol=1e-5)
    _assert_same_tables(memory, tiered)


def test_reading_every_row_waits_for_a_prefetch_filling_its_slots(tmp_path):
    """A prefetch copies its rows into their slots outside the cache's lock; meanwhile another
    thread's read of every row (`gather_tables`) waits for it rather than reading slots half filled."""
    torch.manual_seed(0)
    memory = EmbeddingBagCollection([EmbeddingTableConfig("t", 1000, 4)])
    ebc = EmbeddingBagCollection([EmbeddingTableConfig("t", 1000, 4, tier=DiskTier(tmp_path, 4))])
    ebc.load_state_dict(memory.state_dict())
    opt = LazyAdam(ebc.parameters(), lr=0.1)
    for ids in (torch.tensor([1, 2]), torch.tensor([3, 4])):
        opt.zero_grad()
        ebc(ids, torch.arange(3), 2).square().sum().backward()
        opt.step()
    tier = ebc._tiers[0]
    filling, fill = threading.Event(), tier._fill

    def slow_fill(*args):
        filling.set()
        time.sleep(0.3)  # the slots still hold the evicted rows' values meanwhile
        fill(*args)

    tier._fill = slow_fill
    features = Features.from_lengths(torch.zeros(2, 0), torch.tensor([5, 6]), torch.ones(1, 2, dtype=torch.int64))
    worker = threading.Thread(target=ebc.prefetch, args=(features,))
    worker.start()
    assert filling.wait(10)
    rows = ebc.gather_tables()["t"][5:7]
    worker.join()
    assert (tier.row2slot[[5, 6]] >= 0).all()
    torch.testing.assert_close(rows, memory.gather_tables()["t"][5:7], rtol=0, atol=0)  # untrained rows


def test_prefetches_that_write_rows_back_sync_the_undo_log_once_every_few(tmp_path, monkeypatch):
    """A prefetch writing trained rows back must make their pre-images durable first (an fsync); it logs
    those of the next prefetches' victims too, so most write-backs sync nothing (before: one fsync each).
    Training still equals the in-memory table's."""
    import os
    memory, tiered = _pair(tmp_path, cache_rows=96)
    batches = _batches(40, seed=3)
    lm = _train(memory, _optimizer("lazy_adam", memory), batches)
    opts = _optimizer("lazy_adam", tiered)
    tier = tiered.ebc._tiers[tiered.ebc._table_loc["item"][0]]
    fsyncs, writing = [], []
    real_fsync, write_many = os.fsync, tier.store.write_many
    monkeypatch.setattr(os, "fsync", lambda fd: fsyncs.append(fd) or real_fsync(fd))
    monkeypatch.setattr(tier.store, "write_many", lambda writes, **kw: writing.append(1) or write_many(writes, **kw))
    lt = _train(tiered, opts, batches[:1])
    for i in range(1, len(batches)):
        fsyncs.clear() if i == 10 else None  # the cache is full (every prefetch evicts) from here on
        writing.clear() if i == 10 else None
        tiered.ebc.prefetch(batches[i][0])
        lt += _train(tiered, opts, [batches[i]])
    assert len(writing) > 20 and len(fsyncs) < len(writing) / 2, (len(fsyncs), len(writing))
    np.testing.assert_allclose(lt, lm, rtol=1e-5)
    _assert_same_tables(memory, tiered)


@pytest.mark.parametrize("boost_level", ["O0", "O1"])
def test_model_with_combined_optimizer_and_checkpoints_trains_a_tiered_net_as_an_in_memory_one(tmp_path,
                                                                                                 boost_level):
    """The Model API, sparse_and_dense (a CombinedOptimizer: LazyAdam for the tables, Adam for the head),
    ModelCheckpoint every 4 steps (each a commit of the stores): same tables as in memory."""
    from recstream import Model
    from recstream.callbacks import CheckpointConfig, ModelCheckpoint
    from recstream.optim import sparse_and_dense
    memory, tiered = _pair(tmp_path)
    data = _batches(12, seed=3)
    for net in (memory, tiered):
        callbacks = [ModelCheckpoint("m", str(tmp_path / "ckpt"), CheckpointConfig(save_checkpoint_steps=4))] \
            if net is tiered else []
        model = Model(net, nn.BCEWithLogitsLoss(), sparse_and_dense(net), boost_level=boost_level,
                      progress_bar=False)
        model.train(2, data, callbacks=callbacks)
    _assert_same_tables(memory, tiered)
    assert tiered.ebc.tier_stats()["wide"].misses > 64


def test_an_optimizer_without_a_row_state_adapter_is_named(tmp_path):
    class MyOpt(torch.optim.Optimizer):
        def __init__(self, params):
            super().__init__(params, {})

        def step(self, closure=None):
            pass

    net = EmbeddingBagCollection([EmbeddingTableConfig("t", 100, 4, tier=DiskTier(tmp_path, 8))])
    opt = MyOpt(net.parameters())
    net(torch.tensor([1]), torch.tensor([0, 1]), 1).sum().backward()
    opt.step()
    with pytest.raises(TypeError, match=r"table \('t'\) is trained by MyOpt, which has no row-state adapter"):
        net(torch.tensor([1]), torch.tensor([0, 1]), 1)
    with pytest.raises(TypeError, match="cannot be deep-copied"):
        copy.deepcopy(net)


def test_a_step_on_cached_rows_goes_on_while_a_prefetch_waits_on_the_disk(tmp_path):
    """A slow store (its reads held until released): a prefetch of batch B on a thread must not hold
    the step of a batch whose rows are cached behind its disk reads; then B's step finds every row
    prefetched (no miss), and training equals the in-memory table's (the row B's prefetch evicted was
    written back with its state)."""
    torch.manual_seed(0)
    memory = EmbeddingBagCollection([EmbeddingTableConfig("t", 1000, 4)])
    ebc = EmbeddingBagCollection([EmbeddingTableConfig("t", 1000, 4, tier=DiskTier(tmp_path, 8))])
    ebc.load_state_dict(memory.state_dict())
    opts = [LazyAdam(memory.parameters(), lr=0.1), LazyAdam(ebc.parameters(), lr=0.1)]
    batches = [torch.tensor([4, 5, 6]), torch.tensor([1, 2, 3]), torch.tensor([1, 2, 3]), torch.tensor([7, 8, 9])]

    def step(net, opt, ids):
        opt.zero_grad()
        net(ids, torch.arange(4), 3).square().sum().backward()
        opt.step()

    tier = ebc._tiers[0]
    step(ebc, opts[1], batches[0])
    step(ebc, opts[1], batches[1])  # 6 of 8 slots held, all trained: B's prefetch evicts one of A's
    release, reading = threading.Event(), threading.Event()
    store_read = tier.store.read_many

    def slow_read(names, rows):
        reading.set()
        assert release.wait(10)
        return store_read(names, rows)

    tier.store.read_many = slow_read
    ahead = threading.Thread(target=ebc.prefetch, args=(Features.from_lengths(torch.zeros(3, 0), batches[3],
                                                                              torch.ones(1, 3, dtype=torch.int64)),))
    ahead.start()
    assert reading.wait(10)  # the prefetch holds its slots and waits on the disk
    done = threading.Thread(target=step, args=(ebc, opts[1], batches[2]))
    done.start()
    done.join(5)
    finished_while_reading = not done.is_alive()
    release.set()
    ahead.join(10)
    done.join(10)
    tier.store.read_many = store_read
    assert finished_while_reading  # before: the prefetch held the cache's lock through its reads
    misses = tier.stats.misses
    step(ebc, opts[1], batches[3])
    assert tier.stats.misses == misses and tier.stats.prefetched == 3
    for ids in batches:
        step(memory, opts[0], ids)
    torch.testing.assert_close(ebc.gather_tables()["t"], memory.gather_tables()["t"], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("failing", ["read_many", "write_many"])
def test_a_prefetch_whose_disk_access_fails_leaves_the_cache_as_it_was(tmp_path, failing):
    """The prefetch's read of the rows it loads fails (a disk error: before it plans anything), or its
    write-back of a trained row it evicts (after planning): the error reaches the prefetch's caller,
    the cache maps what it mapped before (the evicted row again, with its trained values), and
    training goes on equal to the in-memory table."""
    torch.manual_seed(0)
    memory = EmbeddingBagCollection([EmbeddingTableConfig("t", 1000, 4)])
    ebc = EmbeddingBagCollection([EmbeddingTableConfig("t", 1000, 4, tier=DiskTier(tmp_path, 4))])
    ebc.load_state_dict(memory.state_dict())
    opts = [LazyAdam(memory.parameters(), lr=0.1), LazyAdam(ebc.parameters(), lr=0.1)]
    batches = [torch.tensor([1, 2]), torch.tensor([3, 4]), torch.tensor([5, 6]), torch.tensor([1, 2])]

    def step(net, opt, ids):
        opt.zero_grad()
        net(ids, torch.arange(3), 2).square().sum().backward()
        opt.step()

    tier = ebc._tiers[0]
    step(ebc, opts[1], batches[0])
    step(ebc, opts[1], batches[1])
    setattr(tier.store, failing, lambda *a, **k: (_ for _ in ()).throw(OSError("disk gone")))
    with pytest.raises(OSError, match="disk gone"):
        ebc.prefetch(Features.from_lengths(torch.zeros(2, 0), batches[2], torch.ones(1, 2, dtype=torch.int64)))
    delattr(tier.store, failing)
    assert tier.stats.prefetched == 0 and sorted(tier.slot2row.tolist()) == [1, 2, 3, 4]
    assert tier._in_flight == 0 and (tier.row2slot[[1, 2, 3, 4]] >= 0).all() and (tier.row2slot[[5, 6]] == -1).all()
    for ids in batches[2:]:
        step(ebc, opts[1], ids)
    for ids in batches:
        step(memory, opts[0], ids)
    torch.testing.assert_close(ebc.gather_tables()["t"], memory.gather_tables()["t"], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("sink", [False, True])
def test_model_train_prefetches_each_batch_before_its_step(tmp_path, sink):
    """Model.train (normal and sink mode) readies every batch's rows on the data channel's thread
    before its step, from a slow store (each read 3 ms): no step misses a row, though the caches hold
    a fraction of the rows read (rows evicted and read back), and training equals the in-memory run."""
    from recstream import Model
    from recstream.optim import sparse_and_dense
    from recstream.train.sink import batch_prefetch
    memory, tiered = _pair(tmp_path, cache_rows=512, wide_cache=128)
    assert batch_prefetch(memory) is None and batch_prefetch(tiered) is not None  # no tier: no hook, no thread
    for tier in tiered.ebc._tiers:
        if tier is not None:
            read = tier.store.read_many
            tier.store.read_many = lambda names, rows, read=read: (time.sleep(0.003), read(names, rows))[1]
    data = _batches(50, seed=4)
    for net in (memory, tiered):
        model = Model(net, nn.BCEWithLogitsLoss(), sparse_and_dense(net), progress_bar=False)
        model.train(1, data, dataset_sink_mode=sink)
    _assert_same_tables(memory, tiered)
    stats = tiered.ebc.tier_stats()
    assert stats["wide"].prefetched > 2 * 128 and stats["item"].prefetched > 0
    assert stats["wide"].misses == 0 and stats["item"].misses == 0


def _train_accumulating(net, opts, batches, k):
    """Gradients of `k` batches (k forwards and backwards) summed into each optimizer step."""
    for i in range(0, len(batches), k):
        for o in opts:
            o.zero_grad(set_to_none=True)
        for x, y in batches[i:i + k]:
            nn.functional.binary_cross_entropy_with_logits(net(x), y).backward()
        for o in opts:
            o.step()


@pytest.mark.parametrize("kind", ["lazy_adam", "adagrad"])
def test_several_lookups_before_one_step_keep_their_rows_cached_until_it(tmp_path, kind):
    """Gradient accumulation: the rows of every training lookup since the optimizer's last step stay
    in their slots until it, so each gradient reaches its own row. A cache too small for them all is
    refused with the sizes: before, a later lookup evicted an earlier one's rows and left their
    gradients on slots holding other rows (with a 40-row cache and 6 batches a step, 36-45% of the
    table's values ended unlike the in-memory table's, silently)."""
    memory, tiered = _pair(tmp_path, cache_rows=72, wide_cache=128)  # 4 batches read <= 71 distinct rows
    batches = _batches(24)
    _train_accumulating(memory, _optimizer(kind, memory), batches, k=4)
    _train_accumulating(tiered, _optimizer(kind, tiered), batches, k=4)
    _assert_same_tables(memory, tiered)
    assert tiered.ebc.tier_stats()["item"].bytes_written > 0  # rows were evicted and written back between steps

    memory, tiered = _pair(tmp_path / "small", cache_rows=40, wide_cache=128)
    with pytest.raises(ValueError, match="since the optimizer's last step"):
        _train_accumulating(tiered, _optimizer(kind, tiered), _batches(24), k=6)
