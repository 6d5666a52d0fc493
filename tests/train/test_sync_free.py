"""A steady training step on the path CUDA runs forces no host synchronisation (issue 24, item 1).

Each case trains with ``Model.train`` on CPU tensors under ``recstream.hostpath.device_path`` (the
ops a device runs, the compiled CPU kernels off) and counts, with ``recstream.testing.SyncCounter``,
the sync-forcing ops of every step after the first ``WARM`` (the first steps create optimizer state,
caches and layouts). Each case prints its dispatched ops per step (``pytest -s`` shows them).
"""
from __future__ import annotations

import pytest
import torch
from torch import nn

from recstream import Model
from recstream.callbacks.base import Callback
from recstream.hostpath import device_path
from recstream.models import default_optimizer
from recstream.optim import FTRL, LazyAdam, RowWiseAdagrad
from recstream.testing import SyncCounter
from tests.models.helpers import BUILDERS, LogisticData, mixed_schema

WARM, STEPS = 3, 3


class _Steps(Callback):
    """Marks the counter at each step's beginning: a step's counts run from its beginning to the next's."""

    def __init__(self, counter: SyncCounter):
        self.counter = counter

    def on_train_step_begin(self, ctx):
        self.counter.mark()


def _count(model: Model, data, label: str) -> tuple[int, float]:
    """(sync-forcing ops per steady step, dispatched ops per steady step) of one epoch over `data`."""
    counter = SyncCounter(trace=True)
    with device_path(), counter:
        model.train(1, data, callbacks=[_Steps(counter)])
    steady = counter.per_step[1 + WARM:]  # [0]: before the first step; [i]: step i up to step i+1's beginning
    assert len(steady) == STEPS, len(counter.per_step)
    syncs = max(s.syncs for s in steady)
    ops = sum(s.ops for s in steady) / len(steady)
    print(f"\n{label}: {syncs} sync-forcing ops / {ops:.0f} dispatched ops per step {dict(steady[-1].sync_ops)}")
    if syncs:
        for packet, stack in counter.where[:3]:
            print(packet, stack)
    return syncs, ops


def test_the_counter_sees_each_kind_of_host_read_and_not_static_ops():
    x = torch.arange(8)
    original = torch.Tensor.tolist
    with SyncCounter() as counter:
        x.sum().item()
        x.nonzero()
        torch.unique(x)
        x[x > 3]
        torch.repeat_interleave(x, x)
        x.tolist()
        x.numpy()
        torch.repeat_interleave(x, x, output_size=28)  # static: the size is given
        torch.zeros(8).index_put_((x,), x.float())  # a write by index: static
        torch.sort(x)
    assert dict(counter.sync_ops) == {"aten._local_scalar_dense": 1, "aten.nonzero": 1, "aten._unique2": 1,
                                      "aten.index": 1, "aten.repeat_interleave": 1, "Tensor.tolist": 1,
                                      "Tensor.numpy": 1}, dict(counter.sync_ops)
    assert torch.Tensor.tolist is original


MODELS = ["widedeep", "deepfm", "dcnv2", "dlrm"]


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("embedding", ["rowwise_adagrad", "lazy_adam"])
def test_fixed_table_models_step_without_host_syncs(name, embedding):
    schema = mixed_schema()
    torch.manual_seed(0)
    net = BUILDERS[name](schema)
    model = Model(net, nn.BCEWithLogitsLoss(), default_optimizer(net, lr=1e-2, embedding=embedding),
                  metrics={"auc", "loss"}, progress_bar=False)
    syncs, _ = _count(model, LogisticData(schema, WARM + STEPS + 1, 16), f"{name} ({embedding})")
    assert syncs == 0


FIELDS, VOCAB = 4, 50


class Idiomatic(nn.Module):
    def __init__(self):
        super().__init__()
        self.tables = nn.ModuleList(nn.Embedding(VOCAB, 8) for _ in range(FIELDS))
        self.mlp = nn.Sequential(nn.Linear(FIELDS * 8, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, ids):
        return self.mlp(torch.cat([t(ids[:, i]) for i, t in enumerate(self.tables)], dim=1)).squeeze(-1)


def _idiomatic_batches(n: int):
    g = torch.Generator().manual_seed(0)
    return [(torch.randint(0, VOCAB, (32, FIELDS), generator=g), torch.randint(0, 2, (32,), generator=g).float())
            for _ in range(n)]


OPTIMIZERS = {
    "adam": lambda p: torch.optim.Adam(p, lr=0.01),
    "sgd": lambda p: torch.optim.SGD(p, lr=0.1),
}


@pytest.mark.parametrize("level", ["O1", "O2"])
@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
def test_boost_on_a_users_network_steps_without_host_syncs(level, optimizer):
    torch.manual_seed(0)
    net = Idiomatic()
    model = Model(net, nn.BCEWithLogitsLoss(), OPTIMIZERS[optimizer](net.parameters()), boost_level=level,
                  metrics={"auc", "loss"}, progress_bar=False)
    syncs, _ = _count(model, _idiomatic_batches(WARM + STEPS + 1), f"user's network {level} {optimizer}")
    assert syncs == 0


class Tables(nn.Module):
    """Two sparse tables (one of width 1, as a wide term) and a dense head."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 8, sparse=True)
        self.wide = nn.Embedding(VOCAB, 1, sparse=True)
        self.head = nn.Linear(8, 1)

    def forward(self, ids):
        return (self.head(self.emb(ids).sum(1)) + self.wide(ids).sum(1)).squeeze(-1)


ROW_OPTIMIZERS = {"ftrl": lambda p: FTRL(p, lr=0.1, l1=0.01), "rowwise_adagrad": lambda p: RowWiseAdagrad(p, lr=0.1),
                  "lazy_adam": lambda p: LazyAdam(p, lr=0.01)}


@pytest.mark.parametrize("optimizer", list(ROW_OPTIMIZERS))
def test_row_sparse_optimizers_step_without_host_syncs(optimizer):
    torch.manual_seed(0)
    net = Tables()
    model = Model(net, nn.BCEWithLogitsLoss(), ROW_OPTIMIZERS[optimizer](net.parameters()), progress_bar=False)
    syncs, _ = _count(model, _idiomatic_batches(WARM + STEPS + 1), f"row-sparse {optimizer}")
    assert syncs == 0


def _loss_scaled_model(init_loss_scale: float = 2.0 ** 10):
    from recstream.train.loss_scale import DynamicLossScaleManager
    torch.manual_seed(0)
    net = Idiomatic()
    opt = torch.optim.Adam(net.parameters(), lr=0.01, fused=True)
    return net, opt, Model(net, nn.BCEWithLogitsLoss(), opt, progress_bar=False,
                           loss_scale_manager=DynamicLossScaleManager(init_loss_scale, scale_window=2))


def test_dynamic_loss_scaling_with_a_fused_optimizer_steps_without_host_syncs():
    _, _, model = _loss_scaled_model()
    syncs, _ = _count(model, _idiomatic_batches(WARM + STEPS + 1), "dynamic loss scaling, fused Adam")
    assert syncs == 0


@pytest.mark.parametrize("level", ["O1", "O2"])
def test_boost_with_amp_and_loss_scaling_on_a_users_network_steps_without_host_syncs(level):
    """A user's Adam (O2: AdamW with weight decay, made lazy), boost's lazy rows in fused tables,
    autocast and a dynamic loss scale: the overflow flag reaches the lazy rows on the device, so no
    step reads it (before, the lazy rows made the cell branch on the host: one read a step)."""
    from recstream.train.loss_scale import DynamicLossScaleManager
    torch.manual_seed(0)
    net = Idiomatic()
    opt = torch.optim.Adam(net.parameters(), lr=0.01) if level == "O1" else \
        torch.optim.AdamW(net.parameters(), lr=0.01, weight_decay=0.01)
    model = Model(net, nn.BCEWithLogitsLoss(), opt, boost_level=level, amp_level="O1", metrics={"loss"},
                  loss_scale_manager=DynamicLossScaleManager(2.0 ** 10, scale_window=2), progress_bar=False)
    assert any(line.startswith("fused_tables: applied") for line in model.boost_report), model.boost_report
    assert any(line.startswith("lazy_weight_decay: applied") for line in model.boost_report) == (level == "O2")
    syncs, _ = _count(model, _idiomatic_batches(WARM + STEPS + 1), f"user's network {level}, amp + loss scaling")
    assert syncs == 0


def test_an_overflowing_step_on_the_device_path_leaves_weights_and_adam_untouched():
    net, opt, model = _loss_scaled_model()
    cell = model.train_network
    ids, labels = _idiomatic_batches(1)[0]
    before = [p.detach().clone() for p in net.parameters()]
    with device_path():
        model.train_network(ids, labels)  # a clean step: Adam moves
    moved = [p.detach().clone() for p in net.parameters()]
    assert any(not torch.equal(a, b) for a, b in zip(before, moved, strict=True))
    cell.scale_update.loss_scale.fill_(float("inf"))  # every scaled gradient overflows
    with device_path(), SyncCounter() as counter:
        _, overflow, _ = model.train_network(ids, labels)
    assert bool(overflow) and counter.syncs == 0
    assert [float(opt.state[p]["step"]) for p in net.parameters()] == [1.0] * len(moved)
    for a, b in zip(moved, net.parameters(), strict=True):
        assert torch.equal(a, b.detach())


@pytest.mark.parametrize("name", MODELS)
def test_loss_scaling_with_the_row_sparse_optimizers_steps_without_host_syncs(name):
    """default_optimizer (FTRL / RowWiseAdagrad / fused Adam) under dynamic loss scaling: the
    row-sparse children skip an overflowing step on the device too (capturable mode), so no step
    reads the overflow flag."""
    from recstream.train.loss_scale import DynamicLossScaleManager

    schema = mixed_schema()
    torch.manual_seed(0)
    net = BUILDERS[name](schema)
    opt = default_optimizer(net, lr=1e-2)  # its dense Adam is fused: it takes the flag too
    model = Model(net, nn.BCEWithLogitsLoss(), opt, metrics={"loss"}, progress_bar=False,
                  loss_scale_manager=DynamicLossScaleManager(2.0 ** 10, scale_window=2))
    syncs, _ = _count(model, LogisticData(schema, WARM + STEPS + 1, 16), f"{name}, dynamic loss scaling")
    assert syncs == 0


def test_loss_scaled_steps_on_the_device_path_train_like_the_host_path():
    from recstream.train.loss_scale import DynamicLossScaleManager

    schema = mixed_schema()
    batches = list(LogisticData(schema, 6, 16))

    def run(on_device: bool):
        torch.manual_seed(0)
        net = BUILDERS["deepfm"](schema)
        model = Model(net, nn.BCEWithLogitsLoss(), default_optimizer(net, lr=1e-2, embedding="lazy_adam"),
                      progress_bar=False, loss_scale_manager=DynamicLossScaleManager(2.0 ** 10, scale_window=2))
        with device_path() if on_device else torch.enable_grad():
            model.train(1, batches)
        return net

    host, device = run(False), run(True)
    for (key, a), b in zip(host.state_dict().items(), device.state_dict().values(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5, msg=key)  # capturable: float32 step sizes


def test_an_overflowing_step_leaves_the_row_sparse_optimizers_untouched_on_the_device_path():
    from recstream.train.loss_scale import DynamicLossScaleManager

    schema = mixed_schema()
    torch.manual_seed(0)
    net = BUILDERS["widedeep"](schema)
    opt = default_optimizer(net, lr=1e-2, embedding="lazy_adam")
    model = Model(net, nn.BCEWithLogitsLoss(), opt, progress_bar=False,
                  loss_scale_manager=DynamicLossScaleManager(2.0 ** 10, scale_window=2))
    batch = next(iter(LogisticData(schema, 1, 16)))
    with device_path():
        model.train_network(*batch)  # a clean step: every child moves
    moved = [p.detach().clone() for p in net.parameters()]
    state = {k: v.clone() for child in ("wide", "embedding") for st in opt.optimizers[child].state.values()
             for k, v in st.items() if isinstance(v, torch.Tensor)}
    model.train_network.scale_update.loss_scale.fill_(float("inf"))  # every scaled gradient overflows
    with device_path():
        _, overflow, _ = model.train_network(*batch)
    assert bool(overflow)
    for a, b in zip(moved, net.parameters(), strict=True):
        assert torch.equal(a, b.detach())
    after = {k: v for child in ("wide", "embedding") for st in opt.optimizers[child].state.values()
             for k, v in st.items() if isinstance(v, torch.Tensor)}
    for k, v in state.items():
        assert torch.equal(v, after[k]), k
    assert all(int(st["step"]) == 1 for st in opt.optimizers["embedding"].state.values())


class _EvalSteps(Callback):
    def __init__(self, counter: SyncCounter):
        self.counter = counter

    def on_eval_step_begin(self, ctx):
        self.counter.mark()


@pytest.mark.parametrize("name", MODELS)
def test_metric_accumulation_in_evaluation_steps_without_host_syncs(name):
    from recstream.metrics import Loss
    from recstream.models import ctr_metrics
    schema = mixed_schema()
    torch.manual_seed(0)
    net = BUILDERS[name](schema)
    model = Model(net, nn.BCEWithLogitsLoss(), default_optimizer(net), metrics={**ctr_metrics(), "loss": Loss()},
                  progress_bar=False)
    counter = SyncCounter()
    with device_path(), counter:
        results = model.eval(LogisticData(schema, WARM + STEPS + 1, 16), callbacks=[_EvalSteps(counter)])
    steady = counter.per_step[1 + WARM:]
    assert len(steady) == STEPS
    print(f"\n{name} eval, metrics {sorted(results)}: {max(s.syncs for s in steady)} sync-forcing ops / "
          f"{sum(s.ops for s in steady) / len(steady):.0f} dispatched ops per step")
    assert max(s.syncs for s in steady) == 0, [dict(s.sync_ops) for s in steady]


class _SyncDebugWindow(Callback):
    """`torch.cuda.set_sync_debug_mode("error")` from step `first` to the end of step `last` (0-based)."""

    def __init__(self, first: int, last: int):
        self.first, self.last, self.step = first, last, 0

    def on_train_step_begin(self, ctx):
        if self.step == self.first:
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")

    def on_train_step_end(self, ctx):
        if self.step == self.last:
            torch.cuda.set_sync_debug_mode("default")
        self.step += 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", MODELS)
def test_fixed_table_models_train_on_cuda_without_a_sync(name):
    """The real thing on a GPU: 26 id features (the first GPU run of the built-in models once failed
    at their id check), steady steps under the sync debugger, a finite loss."""
    from recstream.data import SyntheticCTR

    gen = SyntheticCTR(num_dense=13, num_categorical=26, vocab_sizes=[1000] * 26, batch_size=512, seed=0)
    torch.manual_seed(0)
    net = BUILDERS[name](gen.schema).cuda()
    model = Model(net, nn.BCEWithLogitsLoss(), default_optimizer(net), metrics={"auc", "loss"}, progress_bar=False)
    batches = [b.to("cuda") for b in gen.train_batches(WARM + STEPS + 2)]
    try:  # from the step after the CUDA graph's capture (capturing synchronises the device)
        model.train(1, batches, callbacks=[_SyncDebugWindow(WARM + 1, WARM + STEPS)])
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert all(torch.isfinite(p).all() for p in net.parameters())


# --- dynamic (hash) tables: at most one host read a step, none while the tables have room -----------

def _dynamic_schema(capacity: int, fixed: bool):
    """Dynamic huge user ids and dynamic multi-hot tags admitted at their second sight (optionally
    among fixed-vocabulary features, as tests/models/test_dynamic.py has them)."""
    from recstream.data import CategoricalFeature, Schema
    cats = [CategoricalFeature("user", dynamic=True, capacity=capacity, embedding_dim=4),
            CategoricalFeature("tags", dynamic=True, capacity=capacity, multi_hot=True, pooling="mean",
                               embedding_dim=4, permit_filter_value=2)]
    if fixed:
        cats = [CategoricalFeature("item", vocab_size=20, embedding_dim=4), *cats,
                CategoricalFeature("genre", vocab_size=5, multi_hot=True, embedding_dim=4)]
    return Schema(["d0", "d1"], cats)


def _dynamic_batches(schema, n: int, users: int, b: int = 32):
    from recstream.data import Batch, Features
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(n):
        ids, lengths = [], []
        for f in schema.categorical:
            k = torch.randint(0, 4, (b,), generator=g) if f.multi_hot else torch.ones(b, dtype=torch.int64)
            span = users if f.name == "user" else (50 if f.dynamic else f.vocab_size)
            ids.append(torch.randint(0, span, (int(k.sum()),), generator=g) + (10 ** 12 if f.name == "user" else 0))
            lengths.append(k)
        x = Features.from_lengths(torch.randn(b, 2, generator=g), torch.cat(ids), torch.stack(lengths))
        out.append(Batch(x, torch.randint(0, 2, (b,), generator=g).float()))
    return out


def _dynamic_model(name: str, capacity: int, fixed: bool = False, device: str = "cpu"):
    schema = _dynamic_schema(capacity, fixed)
    torch.manual_seed(0)
    net = BUILDERS[name](schema).to(device)
    return schema, net, Model(net, nn.BCEWithLogitsLoss(), default_optimizer(net, lr=1e-2),
                              metrics={"auc", "loss"}, progress_bar=False)


@pytest.mark.parametrize("name", MODELS)
def test_dynamic_table_models_step_without_host_syncs_while_the_tables_have_room(name):
    schema, _, model = _dynamic_model(name, capacity=4096)
    syncs, _ = _count(model, _dynamic_batches(schema, WARM + STEPS + 1, users=1000), f"{name} dynamic, room")
    assert syncs == 0


@pytest.mark.parametrize("name", MODELS)
def test_dynamic_table_models_read_the_host_once_a_step_when_full(name):
    """400 users into 128 rows: the user tables evict every step (an LRU pass after a read of the
    counters); the tags tables (50 keys) need their counters too (their bounds of the free rows lose
    a batch's worth of ids a step): all tables of a model read them together, once."""
    from recstream.nn import HashEmbedding
    schema, net, model = _dynamic_model(name, capacity=128)
    tables = {n: m for n, m in net.named_modules() if isinstance(m, HashEmbedding)}
    syncs, _ = _count(model, _dynamic_batches(schema, WARM + STEPS + 1, users=400), f"{name} dynamic, full")
    assert syncs == 1
    users = [m for n, m in tables.items() if n.endswith("user")]
    assert users and all(m.num_rows >= 128 - 7 for m in users)  # full: rows freed a few at a time (watermark)


@pytest.mark.parametrize("name", ["widedeep", "dlrm"])
def test_mixed_fixed_and_dynamic_models_step_without_host_syncs(name):
    """Their collections take a strict subset of the batch's features (`Features.permute`): its id
    count comes from the sizes counted on the host when the batch was moved (`Features.to`)."""
    schema, _, model = _dynamic_model(name, capacity=4096, fixed=True)
    batches = [b.to("cpu") for b in _dynamic_batches(schema, WARM + STEPS + 1, users=1000)]  # as to(cuda) would
    assert batches[0].features.feature_sizes is not None
    syncs, _ = _count(model, batches, f"{name} mixed, room")
    assert syncs == 0
    unmoved = _dynamic_batches(schema, WARM + STEPS + 1, users=1000)  # sizes unknown: the subset reads them
    schema, _, model = _dynamic_model(name, capacity=4096, fixed=True)
    assert _count(model, unmoved, f"{name} mixed, sizes unknown")[0] >= 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", MODELS)
def test_dynamic_table_models_train_on_cuda_without_a_sync_while_the_tables_have_room(name):
    """The real thing: steady steps of each model with dynamic tables under the sync debugger."""
    schema, net, model = _dynamic_model(name, capacity=1 << 16, device="cuda")
    batches = [b.to("cuda") for b in _dynamic_batches(schema, WARM + STEPS + 1, users=10 ** 4, b=512)]
    try:
        model.train(1, batches, callbacks=[_SyncDebugWindow(WARM, WARM + STEPS - 1)])
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert all(torch.isfinite(p).all() for p in net.parameters())
