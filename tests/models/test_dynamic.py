"""Dynamic-id (HashEmbedding) features in every model: mixed with fixed tables, trained, checkpointed,
restored; unseen keys read the default vector; reused rows get fresh optimizer state."""
import copy
import dataclasses

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from recstream import RecModel
from recstream.callbacks import CheckpointConfig, ModelCheckpoint
from recstream.data import Batch, CategoricalFeature, Features, Schema
from recstream.data.streams import IterableStream
from recstream.models import WideDeep, ctr_metrics, default_optimizer
from recstream.models.dynamic import DynamicTables, table_key
from recstream.nn import HashEmbedding

from .helpers import BUILDERS, MODEL_NAMES


def dynamic_schema(capacity: int = 64) -> Schema:
    """A dynamic user id and dynamic multi-hot tags among fixed-vocabulary features."""
    return Schema(["d0", "d1"], [
        CategoricalFeature("item", vocab_size=20, embedding_dim=4),
        CategoricalFeature("user", dynamic=True, capacity=capacity, embedding_dim=4),
        CategoricalFeature("tags", dynamic=True, capacity=capacity, multi_hot=True, pooling="mean",
                           embedding_dim=4, permit_filter_value=2),
        CategoricalFeature("genre", vocab_size=5, multi_hot=True, embedding_dim=4),
    ])


def batches(n: int, b: int = 32, seed: int = 0, users=(10**12, 10**12 + 40)) -> list[Batch]:
    """Users are huge raw ids (no vocabulary could hold them); label = user parity + d0."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        user = torch.randint(*users, (b,), generator=g)
        n_tags, n_genre = torch.randint(0, 4, (b,), generator=g), torch.randint(0, 3, (b,), generator=g)
        values = torch.cat([torch.randint(0, 20, (b,), generator=g), user,
                            torch.randint(-3, 50, (int(n_tags.sum()),), generator=g),
                            torch.randint(0, 5, (int(n_genre.sum()),), generator=g)])
        lengths = torch.stack([torch.ones(b, dtype=torch.int64), torch.ones(b, dtype=torch.int64), n_tags, n_genre])
        dense = torch.randn(b, 2, generator=g)
        p = torch.sigmoid(2.0 * (user % 2).float() - 1.0 + dense[:, 0])
        out.append(Batch(Features.from_lengths(dense, values, lengths), (torch.rand(b, generator=g) < p).float()))
    return out


def tables(net) -> dict[str, HashEmbedding]:
    return {n: m for n, m in net.named_modules() if isinstance(m, HashEmbedding)}


def rec_model(net, optimizer=None) -> RecModel:
    return RecModel(net, torch.nn.BCEWithLogitsLoss(), optimizer or default_optimizer(net, lr=1e-2),
                    metrics=ctr_metrics(), progress_bar=False)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_every_model_trains_dynamic_features_and_serves_unseen_keys(name):
    torch.manual_seed(0)
    net = BUILDERS[name](dynamic_schema())
    hashed = tables(net)
    assert hashed and all(m.sparse for m in hashed.values())
    # One hash table per dynamic feature: WideDeep and DeepFM keep the linear weight in column 0.
    assert set(hashed) == {"embedding.dynamic.tables.user", "embedding.dynamic.tables.tags"}
    if name in ("widedeep", "deepfm"):
        assert hashed["embedding.dynamic.tables.user"].embedding_size == net.embedding.dims[0] + 1
    assert net.embedding.ebc is not None and set(net.embedding.ebc.feature_names) == {"item", "genre"}
    model = rec_model(net)
    model.train(2, batches(12))
    assert hashed["embedding.dynamic.tables.user"].num_rows == 40  # every user got a row
    assert 0 < hashed["embedding.dynamic.tables.tags"].num_rows <= 53
    assert model.eval(batches(8, seed=1))["auc"] > 0.65  # the parity of the huge user ids was learnt

    x = batches(1, b=4, seed=2, users=(5 * 10**15, 5 * 10**15 + 1))[0].features  # never-seen users
    net.eval()
    before = {n: (m.num_rows, m.global_step) for n, m in hashed.items()}
    with torch.no_grad():
        out = net(x)
        other = Features(x.dense, x.values.clone(), x.offsets, x.batch_size, x.num_features)
        other.values[4:8] = -2  # another unseen key: the same default vector
        assert torch.equal(net(other), out)
    assert {n: (m.num_rows, m.global_step) for n, m in hashed.items()} == before  # serving does not mutate


def shared_schema(capacity: int = 32) -> Schema:
    """dynamic_schema with user and tags in one table "ids" (tags admitted at first sight, as users)."""
    return Schema(["d0", "d1"], [
        CategoricalFeature("item", vocab_size=20, embedding_dim=4),
        CategoricalFeature("user", dynamic=True, capacity=capacity, embedding_dim=4, table="ids"),
        CategoricalFeature("tags", dynamic=True, capacity=capacity, multi_hot=True, pooling="mean",
                           embedding_dim=4, table="ids"),
        CategoricalFeature("genre", vocab_size=5, multi_hot=True, embedding_dim=4),
    ])


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_features_of_one_table_train_with_one_lookup_and_checkpoint(tmp_path, name, monkeypatch):
    torch.manual_seed(0)
    net = BUILDERS[name](shared_schema(capacity=24))  # 40 users + ~50 tags in 48 rows: evictions
    assert set(tables(net)) == {"embedding.dynamic.tables.ids"}
    table = tables(net)["embedding.dynamic.tables.ids"]
    assert table.capacity == 48
    calls = []
    forward = HashEmbedding.forward
    monkeypatch.setattr(HashEmbedding, "forward", lambda self, keys: calls.append(keys.numel()) or forward(self, keys))
    model = rec_model(net)
    ckpt = ModelCheckpoint("shared", tmp_path, CheckpointConfig(save_checkpoint_steps=12))
    data = batches(12)
    model.online_train(IterableStream(lambda: iter(data)), callbacks=[ckpt], dataset_sink_mode=False)
    # one lookup per step for both features: the 32 users' ids and the tags' ids together
    assert len(calls) == 12 and all(n > 32 for n in calls)
    assert table.num_rows > 40  # the users' rows and the tags' rows share the table's 48
    saved = table.export(reset_delta=False)
    model.train(2, batches(12, seed=4))
    assert model.eval(batches(8, seed=1))["auc"] > 0.65

    torch.manual_seed(1)
    restored = BUILDERS[name](shared_schema(capacity=24))
    assert rec_model(restored).restore(tmp_path)["cur_step_num"] == 12
    got = tables(restored)["embedding.dynamic.tables.ids"].export(reset_delta=False)
    assert torch.equal(got["keys"], saved["keys"]) and torch.equal(got["values"], saved["values"])


def test_the_same_id_in_two_features_of_one_table_has_two_rows():
    schema = Schema([], [CategoricalFeature("u", dynamic=True, capacity=8, embedding_dim=2, table="t"),
                         CategoricalFeature("v", dynamic=True, capacity=8, embedding_dim=2, table="t")])
    net = WideDeep(schema, hidden=(2,))
    x = Features.from_lengths(torch.zeros(2, 0), torch.tensor([7, 9, 7, 7]), torch.ones(2, 2), keys=["u", "v"])
    net(x)
    table = net.embedding.dynamic.table_of("u")
    assert table is net.embedding.dynamic.table_of("v") and table.num_rows == 3  # u:7, u:9, v:7
    looked_up = net.embedding.dynamic(x)
    assert not torch.equal(looked_up["u"][0], looked_up["v"][0])
    assert torch.equal(looked_up["v"][0], looked_up["v"][1])


def test_a_shared_table_named_like_another_features_own_table_is_refused():
    features = [CategoricalFeature("user", dynamic=True, capacity=8, table="item"),
                CategoricalFeature("item", dynamic=True, capacity=8)]
    with pytest.raises(ValueError, match=r"also a dynamic feature's own table: \['item'\]"):
        DynamicTables(features, [4, 4])
    with pytest.raises(ValueError, match=r"features of table 'ids' need one width"):
        DynamicTables([CategoricalFeature(n, dynamic=True, capacity=8, table="ids") for n in "ab"], [4, 5])


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_named_features_in_any_order_match_positional_ones(name):
    torch.manual_seed(0)
    net = BUILDERS[name](dynamic_schema()).eval()
    x = batches(1, b=8)[0].features
    named = Features(x.dense, x.values, x.offsets, x.batch_size, x.num_features, dynamic_schema().categorical_names)
    shuffled = named.select(["genre", "user", "item", "tags"])
    with torch.no_grad():
        assert torch.allclose(net(x), net(shuffled))


def test_only_dynamic_features_and_reserved_keys():
    schema = Schema([], [CategoricalFeature("u", dynamic=True, capacity=8, embedding_dim=4),
                         CategoricalFeature("v", dynamic=True, capacity=8, embedding_dim=4)])
    net = WideDeep(schema, hidden=(4,))
    assert net.embedding.ebc is None and net.wide.ebc is None
    x = Features.from_lengths(torch.zeros(3, 0), torch.tensor([-1, -2, 5, -1, 7, 8]), torch.ones(2, 3))
    net(x).sum().backward()  # -1 / -2 are the hash table's markers: stored under other keys, no error
    assert tables(net)["embedding.dynamic.tables.u"].num_rows == 3
    assert table_key(torch.tensor([-1, -2])).tolist() == [-(2 ** 63) + 1, -(2 ** 63)]


def test_init_std_other_than_the_hash_tables_is_refused():
    with pytest.raises(ValueError, match="init_std.*0.01"):
        WideDeep(dynamic_schema(), hidden=(4,), init_std=0.1)


@pytest.mark.parametrize("embedding", ["lazy_adam", "rowwise_adagrad"])
def test_default_optimizer_resets_the_state_of_reused_rows(embedding):
    """Capacity 2: a third user evicts the least recent one and takes its row with zero state."""
    schema = Schema([], [CategoricalFeature("u", dynamic=True, capacity=2, embedding_dim=2, evict_filter_value=None)])
    net = WideDeep(schema, hidden=(2,))
    opt = default_optimizer(net, embedding=embedding)
    table = net.embedding.dynamic.tables["u"]
    emb_opt = opt.optimizers["embedding"]

    def step(keys):
        x = Features.from_lengths(torch.zeros(len(keys), 0), torch.tensor(keys), torch.ones(1, len(keys)))
        opt.zero_grad()
        net(x).sum().backward()
        opt.step()

    step([1, 2])
    step([2])
    state = emb_opt.state[table.values]
    rows = {k: int(table.table.rows[table.table.find(torch.tensor([k]))]) for k in (1, 2)}
    name = "exp_avg" if embedding == "lazy_adam" else "sum"
    assert bool(state[name][rows[1]].abs().sum() > 0)
    step([3])  # evicts 1 (least recently seen): 3 reuses its row
    row3 = int(table.table.rows[table.table.find(torch.tensor([3]))])
    assert row3 == rows[1]
    fresh = WideDeep(schema, hidden=(2,))
    fresh_opt = default_optimizer(fresh, embedding=embedding)
    x = Features.from_lengths(torch.zeros(1, 0), torch.tensor([3]), torch.ones(1, 1))
    fresh_opt.zero_grad()
    fresh(x).sum().backward()
    fresh_opt.step()
    fresh_state = fresh_opt.optimizers["embedding"].state[fresh.embedding.dynamic.tables["u"].values]
    # one update from zero state: the same magnitude as a never-used row's first update
    got = state[name][row3].abs()
    want = fresh_state[name][int(fresh.embedding.dynamic.tables["u"].table.rows[
        fresh.embedding.dynamic.tables["u"].table.find(torch.tensor([3]))])].abs()
    assert got.shape == want.shape and bool((got > 0).all())
    assert float(got.max()) <= 1.5 * float(want.max()) + 1e-12


@pytest.mark.parametrize("name", ["deepfm", "widedeep"])
def test_checkpoint_and_restore_keep_tables_and_optimizer_state(tmp_path, name):
    torch.manual_seed(0)
    data = batches(10)
    trained = BUILDERS[name](dynamic_schema(capacity=24))  # 40 users in 24 rows: evictions too
    opt_a = default_optimizer(trained, lr=1e-2)
    model = rec_model(trained, opt_a)
    ckpt = ModelCheckpoint("dyn", tmp_path, CheckpointConfig(save_checkpoint_steps=5, keep_checkpoint_max=2))
    model.online_train(IterableStream(lambda: iter(data)), callbacks=[ckpt], dataset_sink_mode=False)
    assert 20 <= tables(trained)["embedding.dynamic.tables.user"].num_rows <= 24  # full: LRU evicted some

    torch.manual_seed(1)
    restored = BUILDERS[name](dynamic_schema(capacity=24))
    opt_b = default_optimizer(restored, lr=1e-2)
    again = rec_model(restored, opt_b)
    assert again.restore(tmp_path)["cur_step_num"] == 10
    for (n, a), (_, b) in zip(tables(trained).items(), tables(restored).items(), strict=True):
        assert (a.num_rows, a.global_step) == (b.num_rows, b.global_step), n
        ea, eb = a.export(reset_delta=False), b.export(reset_delta=False)
        assert torch.equal(ea["keys"], eb["keys"]) and torch.equal(ea["values"], eb["values"]), n
    x = batches(1, seed=3)[0].features
    trained.eval()
    restored.eval()
    with torch.no_grad():
        assert torch.equal(trained(x), restored(x))
    for child in opt_a.optimizers:
        sa, sb = (o.optimizers[child].state_dict()["state"] for o in (opt_a, opt_b))
        assert sa.keys() == sb.keys() and sa
        for k in sa:
            for field, value in sa[k].items():
                assert torch.equal(torch.as_tensor(value), torch.as_tensor(sb[k][field])), (child, k, field)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_dynamic_features_train_on_cuda_and_checkpoints_cross_devices(tmp_path, name):
    """The hash tables on CUDA (probing, admission, LRU eviction: 40 users in 24 rows) admit and evict
    the keys the CPU does, into the same rows; the sink's side-stream copies train like the plain loop
    (new rows draw their initial values from the device's generator, so CPU and CUDA values differ:
    values are compared CUDA to CUDA); a checkpoint written on CUDA restores onto the CPU."""
    data = batches(10)
    nets = {}
    for run, dev, sink in (("cpu", "cpu", False), ("cuda", "cuda", False), ("cuda_sink", "cuda", True)):
        torch.manual_seed(0)
        net = BUILDERS[name](dynamic_schema(capacity=24)).to(dev)
        callbacks = [ModelCheckpoint("dyn", tmp_path, CheckpointConfig(save_checkpoint_steps=10))] if sink else []
        rec_model(net).online_train(IterableStream(lambda: iter(data)), callbacks=callbacks, dataset_sink_mode=sink)
        nets[run] = net.eval()
    assert 20 <= tables(nets["cpu"])["embedding.dynamic.tables.user"].num_rows <= 24  # full: evictions ran

    def same_tables(a, b, values=True):
        for (n, ta), (_, tb) in zip(tables(a).items(), tables(b).items(), strict=True):
            assert (ta.num_rows, int(ta.global_step)) == (tb.num_rows, int(tb.global_step)), n
            ea, eb = ta.export(reset_delta=False), tb.export(reset_delta=False)
            assert torch.equal(ea["keys"].cpu(), eb["keys"].cpu()), n
            if values:
                torch.testing.assert_close(ea["values"].cpu(), eb["values"].cpu(), rtol=1e-4, atol=1e-5)

    same_tables(nets["cpu"], nets["cuda"], values=False)
    same_tables(nets["cuda"], nets["cuda_sink"])
    x = batches(1, seed=3)[0].features
    with torch.no_grad():
        torch.testing.assert_close(nets["cuda_sink"](x.to("cuda")), nets["cuda"](x.to("cuda")), rtol=1e-4, atol=1e-5)

    torch.manual_seed(1)
    restored = BUILDERS[name](dynamic_schema(capacity=24))
    assert rec_model(restored).restore(tmp_path)["cur_step_num"] == 10
    same_tables(nets["cuda_sink"], restored)
    with torch.no_grad():
        torch.testing.assert_close(restored.eval()(x), nets["cuda_sink"](x.to("cuda")).cpu(), rtol=1e-4, atol=1e-5)


def test_on_a_device_a_table_looks_up_only_its_features_ids_when_their_counts_are_known():
    """Batches moved to a device carry their ids per feature (``feature_sizes``): each table then
    looks up a slice of its own features' ids (no mask over the whole batch's); the same keys,
    rows, counts and pooled vectors as the masked lookups, with fewer keys per table (a table's
    bounds lose its own ids a step, not the batch's)."""
    import copy
    import dataclasses

    from recstream.hostpath import device_path

    schema = dynamic_schema()
    tables = DynamicTables([f for f in schema.categorical if f.dynamic], [4, 4], init_std=0.01)
    for t in tables.tables.values():
        t.param_init = "ones"
    masked_tables = copy.deepcopy(tables)
    names = tuple(f.name for f in schema.categorical)
    for step, batch in enumerate(batches(6)):
        x = dataclasses.replace(batch.features, keys=names).to("cpu")  # `to` counts the ids per feature
        assert x.feature_sizes is not None
        if step == 0:
            for t in [*tables.tables.values(), *masked_tables.tables.values()]:
                t.record_host()
        with device_path():
            sized = tables(x)
            masked = masked_tables(dataclasses.replace(x, feature_sizes=None))
        for name in sized:
            torch.testing.assert_close(sized[name], masked[name])
        if step == 0:  # the keys a table looked up (its bounds lose that many): its own ids, not the batch's
            assert tables.tables["user"].recorded_host()[1].n == x.feature_sizes[1] == 32
            assert masked_tables.tables["user"].recorded_host()[1].n == x.values.numel() > 64
    for name, t in tables.tables.items():
        m = masked_tables.tables[name]
        assert t.export(reset_delta=False)["keys"].tolist() == m.export(reset_delta=False)["keys"].tolist()
        assert (t.num_rows, t.num_pending) == (m.num_rows, m.num_pending)
    # A sized table looks up every key of its slice without a mask: one sort fewer per table than the
    # masked lookup's (which sorts its keys, then the masked-out ones to the end)
    with device_path(), _Sorts() as sorts:
        tables(x)
    with device_path(), _Sorts() as masked_sorts:
        masked_tables(dataclasses.replace(x, feature_sizes=None))
    assert masked_sorts.n - sorts.n == len(tables.tables) == 2


def test_a_sized_lookup_pools_multi_hot_features_alone_with_no_index_vector_a_step():
    """A single-hot feature's looked-up rows are its vectors: no offsets are made for it; a multi-hot
    one pools over a kept arange (`hostpath.positions`): one offsets op, no arange, a step."""
    from recstream.hostpath import device_path

    schema = dynamic_schema()
    tables = DynamicTables([f for f in schema.categorical if f.dynamic], [4, 4], init_std=0.01)
    names = tuple(f.name for f in schema.categorical)
    xs = [dataclasses.replace(b.features, keys=names).to("cpu") for b in batches(2)]
    ops = []
    for x in xs:
        with device_path(), _Named() as named:
            tables(x)
        ops.append(named.counts)
    multi_hot = sum(f.multi_hot for f in tables.features)
    assert ops[-1].get("arange", 0) == 0 and ops[-1].get("sub", 0) == multi_hot == 1, ops[-1]


def test_a_sized_lookup_moves_the_reserved_keys_of_the_whole_batch_once(monkeypatch):
    """`table_key` is elementwise: on the device path a sized lookup applies it once to the batch's
    ids and gives each unsalted table a slice (4 ops a step, not 4 per table); a salted shared
    table still keys its own ids, and the tables look up what they did."""
    from recstream.hostpath import device_path
    from recstream.models import dynamic

    calls = []
    monkeypatch.setattr(dynamic, "table_key", lambda keys: calls.append(keys.numel()) or table_key(keys))
    features = [f for f in dynamic_schema().categorical if f.dynamic]
    shared = [dataclasses.replace(f, table="ids") for f in features]
    names = tuple(f.name for f in dynamic_schema().categorical)
    x = dataclasses.replace(batches(1)[0].features, keys=names).to("cpu")
    for feats, expected in ((features, [x.values.numel()]), (shared, list(x.feature_sizes[1:3]))):
        tables = DynamicTables(feats, [4, 4], init_std=0.01)
        for t in tables.tables.values():
            t.param_init = "ones"
        host = copy.deepcopy(tables)
        calls.clear()
        with device_path():
            out = tables(x)
        assert calls == expected
        for name, pooled in host(x).items():
            torch.testing.assert_close(out[name], pooled)


class _Sorts(TorchDispatchMode):
    """Counts the sorts dispatched inside it."""
    n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += func.overloadpacket is torch.ops.aten.sort
        return func(*args, **(kwargs or {}))


def test_default_optimizer_resets_a_reused_row_to_the_initial_accumulator():
    """embedding_initial_accumulator is where every new id starts, a reused hash-table row included."""
    schema = Schema([], [CategoricalFeature("u", dynamic=True, capacity=2, embedding_dim=2, evict_filter_value=None)])
    net = WideDeep(schema, hidden=(2,))
    opt = default_optimizer(net, embedding_initial_accumulator=0.5)
    table = net.embedding.dynamic.tables["u"]
    acc = opt.optimizers["embedding"].state

    def step(keys):
        x = Features.from_lengths(torch.zeros(len(keys), 0), torch.tensor(keys), torch.ones(1, len(keys)))
        opt.zero_grad()
        net(x).sum().backward()
        opt.step()
        return {k: int(table.table.rows[table.table.find(torch.tensor([k]))]) for k in keys}

    row1 = step([1, 2])[1]
    for _ in range(5):
        step([1])
    grown = float(acc[table.values]["sum"][row1])
    step([2])
    row3 = step([3])[3]  # evicts 1 (least recently seen): 3 reuses its row
    assert row3 == row1
    first = float(acc[table.values]["sum"][row3]) - 0.5  # this row's one step since its reset: mean(g^2)
    assert 0 < first < (grown - 0.5) / 3  # from 0.5, not from 1's accumulator (6 steps) nor from 0


class _Named(TorchDispatchMode):
    """Counts by name the ops that recstream/models/dynamic.py itself dispatches inside it (not the
    tables' own)."""

    def __init__(self):
        super().__init__()
        self.counts = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        import traceback

        frames = [f.filename for f in traceback.extract_stack(limit=30) if "/recstream/" in f.filename]
        if frames and frames[-1].endswith("models/dynamic.py"):
            name = func.overloadpacket.__name__
            self.counts[name] = self.counts.get(name, 0) + 1
        return func(*args, **(kwargs or {}))
