"""`recstream.train.cuda_graph`: which steps may be captured, the inputs' structure a graph keeps,
and on a GPU the built-in models replayed exactly like their eager steps (issue 24, item 2)."""
from __future__ import annotations

import collections
import dataclasses

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from recstream import Model
from recstream.checkpoint import load_checkpoint, save_checkpoint
from recstream.data.batch import WeightedLabel
from recstream.features import Features
from recstream.models import default_optimizer
from recstream.optim import CombinedOptimizer
from recstream.train.cuda_graph import _flatten, _signature, _unflatten, capture_refusal
from tests.models.helpers import BUILDERS, mixed_schema
from tests.models.test_dynamic import dynamic_schema

CUDA = torch.device("cuda")  # capture_refusal only compares devices: no GPU needed to ask it
MODELS = ["widedeep", "deepfm", "dcnv2", "dlrm"]


def _leaves(opt):
    return [leaf for child in opt.optimizers.values() for leaf in _leaves(child)] \
        if isinstance(opt, CombinedOptimizer) else [opt]


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("embedding", ["rowwise_adagrad", "lazy_adam"])
def test_the_built_in_models_with_their_optimizers_may_be_captured(name, embedding):
    net = BUILDERS[name](mixed_schema())
    opts = _leaves(default_optimizer(net, embedding=embedding))
    assert capture_refusal(net, opts, CUDA, distributed=False, loss_scaled=False) is None


@pytest.mark.parametrize("name", MODELS)
def test_loss_scaled_steps_may_be_captured_where_every_optimizer_skips_on_the_device(name):
    """default_optimizer's fused Adam and row-sparse tables take the overflow flag on the device."""
    net = BUILDERS[name](mixed_schema())
    assert capture_refusal(net, _leaves(default_optimizer(net)), CUDA, distributed=False, loss_scaled=True) is None


@pytest.mark.parametrize("name", MODELS)
def test_models_with_unsharded_dynamic_tables_may_be_captured(name):
    """Their steps with room replay (recstream.nn.hash_replay); the others run eagerly."""
    net = BUILDERS[name](dynamic_schema())
    assert capture_refusal(net, _leaves(default_optimizer(net)), CUDA, False, False) is None


def test_loss_scaled_steps_may_be_captured_with_boosts_lazy_rows_on_a_fused_adam():
    """The rows boost's hooks update lazily take the overflow flag on the device as the fused Adam
    does (recstream.optim.sparse_rows): no host read to decide a skip, so the step may be captured."""
    from recstream.optim.sparse_rows import accept_sparse_rows, lazy_rows_of

    net = nn.Sequential(nn.Embedding(10, 4, sparse=True), nn.Linear(4, 1))
    opt = torch.optim.Adam(net.parameters(), lr=0.01, fused=True)
    accept_sparse_rows(opt, [net[0].weight], fuse=False)
    assert lazy_rows_of(opt) == {id(net[0].weight)}
    assert capture_refusal(net, [opt], CUDA, distributed=False, loss_scaled=True) is None


def test_what_cannot_be_captured_is_refused_with_the_reason():
    emb = nn.Sequential(nn.Embedding(10, 4, sparse=True))
    why = capture_refusal(emb, [torch.optim.SGD(emb.parameters(), lr=0.1)], CUDA, False, False)
    assert "sparse gradients for an optimizer that coalesces them" in why
    why = capture_refusal(emb, [torch.optim.Adagrad(emb.parameters())], CUDA, False, False)
    assert "Adagrad is not torch.optim.SGD/Adam/AdamW" in why
    net = BUILDERS["dlrm"](mixed_schema())
    mlp = nn.Linear(3, 1)
    why = capture_refusal(mlp, [torch.optim.Adam(mlp.parameters(), fused=False)], CUDA, False, True)
    assert "loss scaling: Adam decides on the host" in why
    assert "not CUDA" in capture_refusal(net, _leaves(default_optimizer(net)), torch.device("cpu"), False, False)


Pair = collections.namedtuple("Pair", "a b")


@dataclasses.dataclass
class Holder:
    x: torch.Tensor
    n: int


def test_inputs_flatten_to_their_tensors_and_rebuild_with_others():
    features = Features(torch.zeros(2, 3), torch.arange(4), torch.tensor([0, 1, 2, 3, 4]), 2, 2, keys=("u", "i"))
    named = {"p": Pair(torch.ones(1), 7), "h": Holder(torch.ones(3), 2)}
    inputs = ((features, WeightedLabel(torch.ones(2), 0.5)), named)
    flat: list[torch.Tensor] = []
    spec = _flatten(inputs, flat)
    assert len(flat) == 6 and flat[0] is features.dense and flat[3] is inputs[0][1].labels
    rebuilt = _unflatten(spec, iter([t + 1 for t in flat]))
    (f2, w2), named = rebuilt
    assert isinstance(f2, Features) and f2.keys == ("u", "i") and f2.batch_size == 2
    torch.testing.assert_close(f2.values, features.values + 1)
    assert isinstance(w2, WeightedLabel) and w2.weight == 0.5
    assert isinstance(named["p"], Pair) and named["p"].b == 7 and isinstance(named["h"], Holder) and named["h"].n == 2
    # Constants are part of what a graph was captured for; CPU tensors are not captured at all.
    assert _signature(spec, flat) is None
    other: list[torch.Tensor] = []
    assert _flatten(((features, WeightedLabel(torch.ones(2), 0.0)), inputs[1]), other) != spec


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@needs_cuda
@pytest.mark.parametrize("name", MODELS)
def test_built_in_models_replay_their_steps_like_eager_ones(name, tmp_path):
    """Default on CUDA at O0: captured after the warm-up, replayed for equal shapes (single-hot
    features), eager for others, an LR schedule and a checkpoint reload (recapture) on the way."""
    from recstream.data import CategoricalFeature, Schema, SyntheticCTR

    gen = SyntheticCTR(num_dense=3, num_categorical=6, vocab_sizes=[40] * 6, batch_size=128, seed=0)
    schema = Schema(gen.schema.dense, [CategoricalFeature(f.name, vocab_size=40, embedding_dim=4)
                                       for f in gen.schema.categorical])
    batches = [b.to("cuda") for b in gen.train_batches(14)]
    batches.insert(9, batches[9].slice(0, 37))  # other shapes: runs eagerly between replays

    def run(graphs: bool, reload_at=None):
        torch.manual_seed(0)
        net = BUILDERS[name](schema).cuda()
        opt = default_optimizer(net)
        model = Model(net, nn.BCEWithLogitsLoss(), opt, boost_config_dict={"cuda_graphs": graphs})
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.9)
        losses = []
        for i, batch in enumerate(batches):
            if i == reload_at:
                path = save_checkpoint(tmp_path / f"{name}.safetensors", net, opt)
                load_checkpoint(path, net, opt, restore_rng=False)
            losses.append(float(model.train_network(batch.features, batch.labels)))
            sched.step()
        return losses, model, net

    eager, _, eager_net = run(False)
    graphed, model, graphed_net = run(True)
    assert "cuda_graphs: applied" in " ".join(model.boost_report), model.boost_report
    assert model.train_network.captured
    torch.testing.assert_close(graphed, eager, rtol=1e-4, atol=1e-5)
    for (key, a), b in zip(graphed_net.state_dict().items(), eager_net.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=key)
    reloaded, model, _ = run(True, reload_at=11)
    assert model.train_network.captured  # recaptured after one eager step (a failed capture would run eagerly)
    torch.testing.assert_close(reloaded, eager, rtol=1e-4, atol=1e-5)


@needs_cuda
@pytest.mark.parametrize("name", ["widedeep", "dlrm"])
def test_loss_scaled_steps_replay_like_eager_ones_and_skip_an_overflow(name):
    """Under a dynamic loss scale the skip of an overflowing step is part of the graph: a batch with
    a NaN label (every gradient non-finite) leaves weights and optimizer state as they were, in the
    replayed step as in the eager one, and the scale shrinks in both."""
    from recstream.data import CategoricalFeature, Schema, SyntheticCTR
    from recstream.train.loss_scale import DynamicLossScaleManager

    gen = SyntheticCTR(num_dense=3, num_categorical=6, vocab_sizes=[40] * 6, batch_size=128, seed=0)
    schema = Schema(gen.schema.dense, [CategoricalFeature(f.name, vocab_size=40, embedding_dim=4)
                                       for f in gen.schema.categorical])
    batches = [b.to("cuda") for b in gen.train_batches(10)]
    poisoned = batches[7].labels.clone()
    poisoned[0] = float("nan")

    def run(graphs: bool):
        torch.manual_seed(0)
        net = BUILDERS[name](schema).cuda()
        manager = DynamicLossScaleManager(init_loss_scale=2.0 ** 16, scale_factor=2, scale_window=1000)
        model = Model(net, nn.BCEWithLogitsLoss(), default_optimizer(net), loss_scale_manager=manager,
                      boost_config_dict={"cuda_graphs": graphs})
        out, before_poison = [], None
        for i, batch in enumerate(batches):
            if i == 7:
                before_poison = {k: v.clone() for k, v in net.state_dict().items()}
            labels = poisoned if i == 7 else batch.labels
            loss, overflow, scale = model.train_network(batch.features, labels)
            out.append((float(loss), bool(overflow), float(scale)))
            if i == 7:
                for key, value in net.state_dict().items():
                    torch.testing.assert_close(value, before_poison[key], rtol=0, atol=0, msg=key)
        return out, model, net, manager

    eager, _, eager_net, eager_manager = run(False)
    graphed, model, graphed_net, manager = run(True)
    assert "cuda_graphs: applied" in " ".join(model.boost_report), model.boost_report
    assert model.train_network.captured
    assert [o for _, o, _ in graphed] == [o for _, o, _ in eager] == [i == 7 for i in range(10)]
    assert manager.get_loss_scale() == eager_manager.get_loss_scale() == 2.0 ** 15
    torch.testing.assert_close([x for x, _, _ in graphed if x == x], [x for x, _, _ in eager if x == x],
                               rtol=1e-4, atol=1e-5)
    for (key, a), b in zip(graphed_net.state_dict().items(), eager_net.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=key)


def _single_hot_dynamic(n: int, b: int = 64, device: str = "cuda"):
    """Batches of equal shapes (single-hot features: a graph replays them): huge dynamic user ids
    (300 of them into 1,024 rows, then, from batch 40, 2,000 new ones: the table fills and LRU passes
    run), dynamic items admitted at their second sight, a fixed feature and dense values. Each table
    looks up its own 64 ids a step (the batch's ids per feature are counted as it moves): its
    bounds lose 64 rows a step, so a read comes every dozen steps or so (on a CPU, the same checks
    find 44 of the 57 steps after the warm-up replayable)."""
    from recstream.data import Batch, CategoricalFeature, Features, Schema
    schema = Schema(["d0", "d1"], [
        CategoricalFeature("user", dynamic=True, capacity=1024, embedding_dim=4),
        CategoricalFeature("item", dynamic=True, capacity=1024, embedding_dim=4, permit_filter_value=2),
        CategoricalFeature("hour", vocab_size=24, embedding_dim=4)])
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(n):
        users = torch.randint(0, 300, (b,), generator=g) if i < 40 else torch.randint(300, 2300, (b,), generator=g)
        ids = torch.cat([users + 10 ** 12, torch.randint(0, 200, (b,), generator=g),
                         torch.randint(0, 24, (b,), generator=g)])
        x = Features.from_lengths(torch.randn(b, 2, generator=g), ids, torch.ones(3, b, dtype=torch.int64))
        out.append(Batch(x, torch.randint(0, 2, (b,), generator=g).float()).to(device))
    return schema, out


@needs_cuda
@pytest.mark.parametrize("name", ["widedeep", "deepfm"])
def test_dynamic_tables_replay_like_eager_steps_through_reads_and_evictions(name):
    """Steps whose tables have room by their bounds replay the graph; a step that must read the
    counters (the bounds used up, or the user table full: LRU passes) runs eagerly, and replays
    resume: the same losses, tables, rows and optimizer state as eager steps all along."""
    from recstream.nn import HashEmbedding

    schema, batches = _single_hot_dynamic(60)

    def run(graphs: bool):
        torch.manual_seed(0)
        net = BUILDERS[name](schema).cuda()
        for m in net.modules():
            if isinstance(m, HashEmbedding):
                m.param_init = "ones"  # the graph's and eager steps' random draws differ
        model = Model(net, nn.BCEWithLogitsLoss(), default_optimizer(net), boost_config_dict={"cuda_graphs": graphs})
        losses = [float(model.train_network(b.features, b.labels)) for b in batches]
        return losses, model, net

    eager, _, eager_net = run(False)
    graphed, model, graphed_net = run(True)
    assert "cuda_graphs: applied" in " ".join(model.boost_report), model.boost_report
    step = model.train_network
    # eager steps between replays (the user table's LRU passes read; the counters' asynchronous copies
    # spare most other reads: recstream.nn.hash_counters)
    assert step.captured and 10 <= step.replays <= 56, step.replays
    torch.testing.assert_close(graphed, eager, rtol=1e-4, atol=1e-5)
    for (key, a), b in zip(graphed_net.state_dict().items(), eager_net.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=key)
    tables = {n: m for n, m in graphed_net.named_modules() if isinstance(m, HashEmbedding)}
    assert tables and all(t.global_step == len(batches) for t in tables.values())
    users = [m for n, m in tables.items() if n.endswith("user")]
    assert users and all(m.num_rows >= 960 for m in users)  # full by the end (1,300 users): LRU passes ran


class _HostData(TorchDispatchMode):
    """Counts tensors made from host data (``torch.tensor(list)``): on a GPU each is a copy to the
    device, which a CUDA graph cannot record (its capture fails)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func in (torch.ops.aten.lift_fresh.default, torch.ops.aten.lift_fresh_copy.default)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("name", MODELS)
def test_steady_steps_of_mixed_dynamic_models_make_no_tensor_from_host_data(name):
    """On the path CUDA runs (CPU tensors under device_path): the collections' subset of a batch's
    features was permuted with a fresh torch.tensor(list) every step (the capture of WideDeep and
    DeepFM failed on an H200 for it)."""
    from recstream.hostpath import device_path

    schema, batches = _single_hot_dynamic(6, device="cpu")
    torch.manual_seed(0)
    net = BUILDERS[name](schema)
    model = Model(net, nn.BCEWithLogitsLoss(), default_optimizer(net), progress_bar=False)
    with device_path():
        for b in batches[:5]:
            model.train_network(b.features, b.labels)
        with _HostData() as mode:
            model.train_network(batches[5].features, batches[5].labels)
    assert mode.count == 0
