"""The building blocks against brute-force definitions."""
import pytest
import torch
from torch import nn

from recstream.metrics import Accuracy, LogLoss
from recstream.models import (
    DLRM,
    MLP,
    CrossNetwork,
    DeepFM,
    LinearTerm,
    OnProbabilities,
    WideDeep,
    ctr_metrics,
    default_optimizer,
    fm_interaction,
)
from recstream.optim import FTRL, LazyAdam, RowWiseAdagrad

from .helpers import BUILDERS, MODEL_NAMES, mixed_schema, random_features


def test_fm_interaction_is_the_sum_over_pairs():
    e = torch.randn(5, 4, 3, dtype=torch.float64)
    brute = sum((e[:, i] * e[:, j]).sum(1) for i in range(4) for j in range(i + 1, 4))
    torch.testing.assert_close(fm_interaction(e), brute)


def test_cross_network_full_rank_matches_the_formula():
    torch.manual_seed(0)
    net = CrossNetwork(5, num_layers=2).double()
    with torch.no_grad():
        net.bias.normal_()
    x0 = torch.randn(3, 5, dtype=torch.float64)
    x = x0
    for layer in range(2):
        w, b = net.kernels[0][layer], net.bias[layer]
        x = x0 * (x @ w.T + b) + x
    torch.testing.assert_close(net(x0), x)


def test_cross_network_low_rank_equals_full_rank_with_the_product_matrix():
    torch.manual_seed(0)
    low = CrossNetwork(6, num_layers=3, low_rank=2).double()
    full = CrossNetwork(6, num_layers=3).double()
    with torch.no_grad():
        low.bias.normal_()
        full.bias.copy_(low.bias)
        # full x W^T must equal (x V) U^T: W^T = V U^T, i.e. kernels[0] of full = (V @ U^T)^T.
        full.kernels[0].copy_((low.kernels[0] @ low.kernels[1]).transpose(1, 2))
    x0 = torch.randn(4, 6, dtype=torch.float64)
    torch.testing.assert_close(low(x0), full(x0))
    assert sum(p.numel() for p in low.parameters()) < sum(p.numel() for p in full.parameters())


@pytest.mark.parametrize("self_interaction", [False, True])
def test_dlrm_top_input_is_bottom_output_and_pairwise_dots(self_interaction):
    torch.manual_seed(0)
    schema = mixed_schema()
    net = DLRM(schema, bottom=(8,), top=(4,), embedding_dim=4, self_interaction=self_interaction)
    seen = {}
    net.top.register_forward_hook(lambda m, args, out: seen.update(x=args[0]))
    x = random_features(schema, 5, torch.Generator().manual_seed(0))
    net(x)
    z = net.bottom(x.dense)
    t = torch.cat([z.unsqueeze(1), net.embedding.fields(x)], dim=1)  # n = 5 vectors
    dots = [(t[:, i] * t[:, j]).sum(1) for i in range(5) for j in range(i + 1) if j < i or self_interaction]
    expected = torch.cat([z, torch.stack(dots, dim=1)], dim=1)
    torch.testing.assert_close(seen["x"], expected)
    assert seen["x"].shape[1] == 4 + (15 if self_interaction else 10)


def test_linear_term_is_bias_plus_pooled_id_weights_plus_dense():
    schema = mixed_schema()
    lin = LinearTerm(schema)
    with torch.no_grad():
        for t in lin.ebc.tables:
            lin.ebc.table_weight(t.name).copy_(torch.randn(t.num_embeddings, 1))
        lin.dense.weight.normal_()
        lin.bias.fill_(0.3)
    x = random_features(schema, 4, torch.Generator().manual_seed(2))
    expected = lin.bias + x.dense @ lin.dense.weight[0]
    for f, feat in enumerate(schema.categorical):
        w = lin.ebc.table_weight(feat.name)[:, 0]
        ids, offs = x.bag(f)
        for b in range(4):
            bag = w[ids[offs[b]:offs[b + 1]]]
            expected[b] += bag.mean() if feat.pooling == "mean" and len(bag) else bag.sum()
    torch.testing.assert_close(lin(x), expected)
    assert LinearTerm(schema, use_dense=False).dense is None


def test_deepfm_dense_fields_scale_their_vectors():
    schema = mixed_schema()
    net = DeepFM(schema, hidden=(4,), embedding_dim=4)
    x = random_features(schema, 3, torch.Generator().manual_seed(0))
    fields = net.fields(x)
    assert fields.shape == (3, 4 + 3, 4)
    torch.testing.assert_close(fields[:, 4 + 1], x.dense[:, 1:2] * net.dense_fields[1])


def test_mlp_layers():
    mlp = MLP(6, (5, 4), out_features=1, dropout=0.1, batch_norm=True, activation="gelu")
    kinds = [type(m).__name__ for m in mlp.layers]
    assert kinds == ["Linear", "BatchNorm1d", "GELU", "Dropout", "Linear", "BatchNorm1d", "GELU", "Dropout", "Linear"]
    assert mlp.layers[0].bias is None  # BatchNorm re-centres: no redundant bias
    assert MLP(6, (), out_features=None).out_features == 6
    assert MLP(6, (3,)).out_features == 3


def test_ctr_metrics_on_logits():
    logits = torch.tensor([-1.0, 2.0, 0.5, -3.0, 1.0])
    labels = torch.tensor([0.0, 1.0, 0.0, 0.0, 1.0])
    m = ctr_metrics()
    probs = torch.sigmoid(logits)
    assert m["auc"](logits, labels) == pytest.approx(1.0)
    assert m["logloss"](logits, labels) == pytest.approx(LogLoss()(probs, labels))
    acc = OnProbabilities(Accuracy())
    assert acc(logits, labels.long()) == pytest.approx(Accuracy()(probs, labels.long()))
    with pytest.raises(TypeError, match="'metric' must be a recstream.metrics.Metric"):
        OnProbabilities(torch.nn.BCELoss())


def _ids(params):
    return {id(p) for p in params}


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_default_optimizer_partitions_every_parameter(name):
    net = BUILDERS[name](mixed_schema())
    opt = default_optimizer(net)
    groups = {n: _ids(p for g in o.param_groups for p in g["params"]) for n, o in opt.optimizers.items()}
    everything = _ids(net.parameters())
    assert set().union(*groups.values()) == everything
    assert sum(len(g) for g in groups.values()) == len(everything)  # disjoint
    assert groups["embedding"] >= _ids(net.embedding.parameters())
    assert isinstance(opt.optimizers["embedding"], RowWiseAdagrad)  # the measured default
    assert all(g["initial_accumulator_value"] == 1e-6 for g in opt.optimizers["embedding"].param_groups)
    assert isinstance(opt.optimizers["dense"], torch.optim.Adam)
    if name == "widedeep":
        assert isinstance(opt.optimizers["wide"], FTRL) and groups["wide"] == _ids(net.wide.parameters())
    else:
        assert "wide" not in opt.optimizers


def test_default_optimizer_options():
    net = WideDeep(mixed_schema(), hidden=(4,), embedding_dim=4)
    opt = default_optimizer(net, embedding="lazy_adam", wide="same", lr=0.01)
    assert sorted(opt.optimizers) == ["dense", "embedding"]
    emb = opt.optimizers["embedding"]
    assert isinstance(emb, LazyAdam) and emb.param_groups[0]["lr"] == 0.01  # LazyAdam: the dense lr
    assert _ids(p for g in emb.param_groups for p in g["params"]) >= _ids([net.wide.ebc.fused_weight_dim1])
    assert opt.optimizers["dense"].param_groups[0]["lr"] == 0.01
    for kwargs, exc, match in [
        (dict(embedding="sgd"), ValueError, "'embedding' must be one of"),
        (dict(wide="adam"), ValueError, "'wide' must be one of"),
        (dict(lr=-1.0), ValueError, "'lr' must be a finite number >= 0.0, got -1.0"),
        (dict(wide_lr=0.0), ValueError, "'wide_lr' must be a finite number > 0.0, got 0.0"),
        (dict(embedding_lr="high"), TypeError, "'embedding_lr' must be a finite number"),
        (dict(embedding_initial_accumulator=-0.1), ValueError,
         "'embedding_initial_accumulator' must be a finite number >= 0.0, got -0.1"),
        (dict(embedding_initial_accumulator="0.1"), TypeError, "'embedding_initial_accumulator' must be a finite"),
        (dict(embedding_initial_accumulator=0.1, embedding="lazy_adam"), ValueError,
         "embedding_initial_accumulator=0.1 needs embedding='rowwise_adagrad'"),
    ]:
        with pytest.raises(exc, match=match):
            default_optimizer(net, **kwargs)
    with pytest.raises(TypeError, match="'model' must be a torch.nn.Module"):
        default_optimizer([nn.Linear(2, 1)])


def test_default_optimizer_keeps_adams_fused_kernel_across_a_load():
    """The dense Adam runs fused; a state saved without the flag (an older checkpoint) does not turn it
    off, and the loaded state is the saved one."""
    net = WideDeep(mixed_schema(), hidden=(4,), embedding_dim=4)
    opt = default_optimizer(net)
    assert opt.optimizers["dense"].param_groups[0]["fused"] is True
    net(random_features(mixed_schema(), 8, torch.Generator().manual_seed(0))).sum().backward()
    opt.step()
    saved = opt.state_dict()
    for group in saved["optimizers"]["dense"]["param_groups"]:
        group["fused"] = None
    again = default_optimizer(net)
    again.load_state_dict(saved)
    dense = again.optimizers["dense"]
    assert all(g["fused"] is True for g in dense.param_groups)
    first = next(iter(opt.optimizers["dense"].state.values()))
    assert torch.equal(next(iter(dense.state.values()))["exp_avg"], first["exp_avg"])


def test_default_optimizers_initial_accumulator_damps_a_fresh_rows_first_step():
    """From 0 a fresh row's first row-wise Adagrad step is ~lr whatever its gradient; from
    embedding_initial_accumulator=a it is lr * g / sqrt(a + mean(g^2)): smaller for a small gradient."""
    from recstream.data import CategoricalFeature, Schema
    from recstream.features import Features
    ids = torch.ones(256, dtype=torch.int64)
    ids[0] = 7  # the rare id: one event of 256, a gradient of ~1/256
    features = Features.from_lengths(torch.zeros(256, 0), ids, torch.ones(1, 256, dtype=torch.int64))
    moved, sums = {}, {}
    for acc in (0.0, 0.1):
        torch.manual_seed(0)
        net = DeepFM(Schema([], [CategoricalFeature("c", vocab_size=1000)]), hidden=(4,), embedding_dim=4)
        opt = default_optimizer(net, embedding_initial_accumulator=acc)
        emb = opt.optimizers["embedding"]
        assert all(g["initial_accumulator_value"] == acc for g in emb.param_groups)
        table = net.embedding.ebc.table_weight("c")
        before = table[7].detach().clone()
        opt.zero_grad()
        nn.BCEWithLogitsLoss()(net(features), torch.ones(256)).backward()
        opt.step()
        moved[acc] = float((table[7].detach() - before).abs().max())
        sums[acc] = torch.stack([s["sum"] for s in emb.state.values()])
    assert moved[0.0] > 0.02  # ~lr (0.05)
    assert 0 < moved[0.1] < moved[0.0] / 20
    assert float(sums[0.1].min()) >= 0.1  # every row starts at the value, touched ones above it


def test_default_optimizers_ftrl_moves_a_rare_wide_weight_by_a_step_not_a_gradient():
    """A batch-mean loss gives an id seen once in a batch of 256 a gradient of ~1/256: FTRL started at
    TF's accumulator 0.1 moved its weight by ~alpha * g / 0.32 (~3e-4, measured: crosses barely
    learned online), from 1e-6 by ~alpha, scale-free like row-wise Adagrad's step."""
    from recstream.data import CategoricalFeature, Schema
    from recstream.features import Features
    torch.manual_seed(0)
    net = WideDeep(Schema([], [CategoricalFeature("c", vocab_size=1000)]), hidden=(4,), embedding_dim=4)
    opt = default_optimizer(net)
    ids = torch.ones(256, dtype=torch.int64)
    ids[0] = 7  # the rare id: one event of 256
    features = Features.from_lengths(torch.zeros(256, 0), ids, torch.ones(1, 256, dtype=torch.int64))
    opt.zero_grad()
    nn.BCEWithLogitsLoss()(net(features), torch.ones(256)).backward()
    opt.step()
    assert float(net.wide.ebc.table_weight("c")[7].abs().max()) > 0.02
