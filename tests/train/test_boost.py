"""boost_level on a user's own network: what is applied, that the maths stay, that checkpoints cross levels."""
import logging

import pytest
import torch
from torch import nn

from recstream import Model
from recstream.checkpoint import load_checkpoint, save_checkpoint
from recstream.train import amp

FIELDS, VOCAB, DIM = 4, 50, 8


class Idiomatic(nn.Module):
    """A CTR network as users write it: one nn.Embedding per field, an MLP on top."""

    def __init__(self, vocab: int = VOCAB):
        super().__init__()
        self.tables = nn.ModuleList(nn.Embedding(vocab, DIM) for _ in range(FIELDS))
        self.mlp = nn.Sequential(nn.Linear(FIELDS * DIM, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, ids):
        return self.mlp(torch.cat([t(ids[:, i]) for i, t in enumerate(self.tables)], dim=1)).squeeze(-1)


def _batches(n: int, vocab: int = VOCAB, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randint(0, vocab, (32, FIELDS), generator=g), torch.randint(0, 2, (32,), generator=g).float())
            for _ in range(n)]


def _losses(level: str, make_opt, steps: int = 12, vocab: int = VOCAB, **kwargs):
    torch.manual_seed(0)
    net = Idiomatic(vocab)
    model = Model(net, nn.BCEWithLogitsLoss(), make_opt(net.parameters()), boost_level=level, **kwargs)
    step = model.train_network
    return [float(step(x, y)) for x, y in _batches(steps, vocab)], net, model


@pytest.mark.parametrize("make_opt", [lambda p: torch.optim.SGD(p, lr=0.5),
                                      lambda p: torch.optim.SGD(p, lr=0.5, momentum=0.9),
                                      lambda p: torch.optim.Adagrad(p, lr=0.1)], ids=["sgd", "momentum", "adagrad"])
def test_o1_gives_the_same_losses_as_o0_for_sgd_and_adagrad(make_opt):
    dense, _, _ = _losses("O0", make_opt)
    boosted, net, model = _losses("O1", make_opt)
    assert all(t.sparse for t in net.tables)
    assert model.boost_report[0].startswith("sparse_embeddings: applied (4 of 4 tables")
    torch.testing.assert_close(boosted, dense, rtol=1e-5, atol=1e-6)


def test_o1_adam_is_lazy_adam_same_as_o0_while_every_row_is_touched():
    # A vocabulary of 4 with 32 rows per batch touches every row every step: lazy == dense Adam.
    dense, _, _ = _losses("O0", lambda p: torch.optim.Adam(p, lr=0.01), vocab=4)
    boosted, net, model = _losses("O1", lambda p: torch.optim.Adam(p, lr=0.01), vocab=4)
    assert net.tables[0].sparse and net.tables[0].weight.grad.is_sparse
    assert any(line.startswith("fused_optimizer: applied") for line in model.boost_report)
    torch.testing.assert_close(boosted, dense, rtol=1e-5, atol=1e-6)


def test_o1_adam_stays_close_to_o0_when_rows_go_untouched():
    dense, _, _ = _losses("O0", lambda p: torch.optim.Adam(p, lr=0.01), steps=30)
    boosted, _, _ = _losses("O1", lambda p: torch.optim.Adam(p, lr=0.01), steps=30)
    assert boosted != dense  # lazy moments differ for untouched rows ...
    torch.testing.assert_close(boosted, dense, rtol=2e-2, atol=2e-2)  # ... by little


def test_checkpoints_cross_boost_levels_both_ways(tmp_path):
    """An O1 checkpoint (network + Adam state) loads into an O0 model and back, and training goes on
    exactly as if it had never been saved."""
    def make(level):
        torch.manual_seed(0)
        net = Idiomatic(vocab=4)
        opt = torch.optim.Adam(net.parameters(), lr=0.01)
        return net, opt, Model(net, nn.BCEWithLogitsLoss(), opt, boost_level=level).train_network

    batches = _batches(8, vocab=4)
    for first, second in (("O1", "O0"), ("O0", "O1")):
        net, opt, step = make(first)
        for x, y in batches[:4]:
            step(x, y)
        path = save_checkpoint(tmp_path / f"{first}.safetensors", net, opt)
        reference = [float(step(x, y)) for x, y in batches[4:]]
        net2, opt2, step2 = make(second)
        load_checkpoint(path, net2, opt2, restore_rng=False)
        resumed = [float(step2(x, y)) for x, y in batches[4:]]
        torch.testing.assert_close(resumed, reference, rtol=1e-5, atol=1e-6)
        assert set(net2.state_dict()) == set(net.state_dict())
        # What is stored is the user's optimizer; what runs after a load is the level's.
        assert opt.state_dict()["param_groups"][0]["fused"] is None
        assert opt2.param_groups[0]["fused"] is (True if second == "O1" else None)


def test_each_acceleration_is_switched_by_name_and_logged(caplog):
    with caplog.at_level(logging.INFO, logger="recstream.train.boost"):
        _, net, model = _losses("O1", lambda p: torch.optim.Adam(p), steps=1,
                                boost_config_dict={"sparse_embeddings": False})
    assert not net.tables[0].sparse
    assert "sparse_embeddings: skipped (switched off)" in model.boost_report
    assert "boost sparse_embeddings: skipped (switched off)" in caplog.text
    _, net, model = _losses("O0", lambda p: torch.optim.Adam(p), steps=1, boost_config_dict={"sparse_embeddings": True})
    assert net.tables[0].sparse  # a single acceleration at O0
    assert not any(line.startswith("fused_optimizer") and "applied" in line for line in model.boost_report)


def test_fused_tables_put_the_tables_of_one_adam_in_one_storage_unless_switched_off():
    def storages(net):
        return {t.weight.untyped_storage().data_ptr() for t in net.tables}

    fused_losses, net, model = _losses("O1", lambda p: torch.optim.Adam(p, lr=0.01), steps=6)
    assert "fused_tables: applied (4 tables in 1 storage(s) of 4)" in model.boost_report
    assert len(storages(net)) == 1
    apart_losses, net, model = _losses("O1", lambda p: torch.optim.Adam(p, lr=0.01), steps=6,
                                       boost_config_dict={"fused_tables": False})
    assert "fused_tables: skipped (switched off)" in model.boost_report
    assert len(storages(net)) == FIELDS
    torch.testing.assert_close(fused_losses, apart_losses, rtol=1e-5, atol=1e-6)
    _, _, model = _losses("O1", lambda p: torch.optim.SGD(p, lr=0.1), steps=1)
    assert any(line.startswith("fused_tables: skipped (no two sparse tables share an Adam")
               for line in model.boost_report)


def test_boost_config_dict_is_validated():
    net = Idiomatic()
    with pytest.raises(ValueError, match="unknown acceleration 'fast'.*allowed: sparse_embeddings"):
        Model(net, nn.BCEWithLogitsLoss(), torch.optim.Adam(net.parameters()), boost_level="O1",
              boost_config_dict={"fast": True})
    with pytest.raises(TypeError, match="boost_config_dict\\['fused_optimizer'\\]"):
        Model(net, nn.BCEWithLogitsLoss(), torch.optim.Adam(net.parameters()), boost_level="O1",
              boost_config_dict={"fused_optimizer": "yes"})


def test_tables_that_cannot_be_sparse_are_skipped_with_the_reason():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(10, 4)
            self.out = nn.Linear(4, 10, bias=False)
            self.out.weight = self.emb.weight  # tied: also used densely
            self.bag = nn.EmbeddingBag(10, 4, mode="max")

        def forward(self, ids):
            return self.out(self.emb(ids) + self.bag(ids.view(-1, 1))).sum(-1)

    net = Tied()
    model = Model(net, nn.MSELoss(), torch.optim.Adam(net.parameters()), boost_level="O1")
    line = model.boost_report[0]
    assert line.startswith("sparse_embeddings: skipped (0 of 2 tables")
    assert "emb: its weight is shared" in line and "bag: mode='max'" in line
    assert not net.emb.sparse and not net.bag.sparse


def test_weight_decay_is_kept_at_o1_and_made_lazy_at_o2():
    def build(level, opt_cls):
        net = Idiomatic()
        return net, Model(net, nn.BCEWithLogitsLoss(), opt_cls(net.parameters(), weight_decay=0.01),
                          boost_level=level, boost_config_dict={"bf16_autocast": False})

    net, model = build("O1", torch.optim.AdamW)
    assert not net.tables[0].sparse and "weight_decay=0.01" in model.boost_report[0]
    net, model = build("O2", torch.optim.AdamW)
    assert net.tables[0].sparse
    assert model.boost_report[2].startswith("lazy_weight_decay: applied (tables ['tables.0'")
    assert model.boost_report[1] == "fused_tables: applied (4 tables in 1 storage(s) of 4)"
    net, model = build("O2", torch.optim.RMSprop)
    assert not net.tables[0].sparse and "RMSprop has no row-sparse update" in model.boost_report[0]


def test_lazy_weight_decay_decays_only_touched_rows():
    emb = nn.Embedding(6, 2)
    opt = torch.optim.AdamW(emb.parameters(), lr=0.1, weight_decay=0.5)
    Model(emb, lambda out, y: out.sum(), opt, boost_level="O2", boost_config_dict={"bf16_autocast": False})
    before = emb.weight.detach().clone()
    emb(torch.tensor([1])).sum().backward()
    opt.step()
    changed = (emb.weight.detach() != before).any(dim=1)
    assert changed.tolist() == [False, True, False, False, False, False]


def test_o2_autocasts_in_bf16_only_where_the_hardware_has_it():
    _, _, model = _losses("O2", lambda p: torch.optim.Adam(p), steps=2)
    line = next(line for line in model.boost_report if line.startswith("bf16_autocast"))
    if amp.cpu_has_native_bf16():
        assert line.startswith("bf16_autocast: applied") and model._amp_level == "O1"
    else:
        assert "no native bf16 on cpu" in line and model._amp_level == "O0"
    _, _, model = _losses("O2", lambda p: torch.optim.Adam(p), steps=1, amp_level="O3")
    assert "amp_level='O3' was chosen explicitly" in " ".join(model.boost_report)


def test_without_an_optimizer_nothing_is_applied():
    net = Idiomatic()
    model = Model(nn.Sequential(net), boost_level="O1")
    assert all("no optimizer" in line for line in model.boost_report)
    assert not net.tables[0].sparse


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("make_opt", [lambda p: torch.optim.SGD(p, lr=0.5), lambda p: torch.optim.Adam(p, lr=0.01)],
                         ids=["sgd", "adam"])
def test_o1_on_cuda_gives_the_same_losses_as_o0(make_opt):
    def run(level):
        torch.manual_seed(0)
        net = Idiomatic(vocab=4).cuda()
        model = Model(net, nn.BCEWithLogitsLoss(), make_opt(net.parameters()), boost_level=level,
                      boost_config_dict={"sparse_embeddings": level != "O0"})  # small tables: forced
        # float() at once: a replayed CUDA graph returns the same output tensor every step
        losses = [float(model.train_network(x.cuda(), y.cuda())) for x, y in _batches(10, vocab=4)]
        return losses, net, model

    dense, _, _ = run("O0")
    boosted, net, model = run("O1")
    assert net.tables[0].weight.grad.is_sparse and net.tables[0].weight.grad.is_cuda
    torch.testing.assert_close(boosted, dense, rtol=1e-4, atol=1e-5)
    _, _, model = run("O2")
    assert any(line.startswith("bf16_autocast: applied") for line in model.boost_report) == \
        torch.cuda.is_bf16_supported()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_small_cuda_tables_stay_dense_by_cost_unless_forced_or_in_a_graph():
    net = Idiomatic().cuda()
    model = Model(net, nn.BCEWithLogitsLoss(), torch.optim.Adam(net.parameters()), boost_level="O1",
                  boost_config_dict={"cuda_graphs": False})
    assert not net.tables[0].sparse and "dense fused update of 400 values is cheaper" in model.boost_report[0]
    net = Idiomatic().cuda()
    model = Model(net, nn.BCEWithLogitsLoss(), torch.optim.Adam(net.parameters()), boost_level="O1")
    assert net.tables[0].sparse and "cuda_graphs: applied" in " ".join(model.boost_report), model.boost_report
    net = Idiomatic().cuda()  # SGD coalesces sparse gradients: no graph could hold them, the cost rule stands
    model = Model(net, nn.BCEWithLogitsLoss(), torch.optim.SGD(net.parameters(), lr=0.1), boost_level="O1")
    assert not net.tables[0].sparse and "cuda_graphs: applied" in " ".join(model.boost_report), model.boost_report


def test_cuda_graphs_are_skipped_off_cuda_with_the_reason():
    _, _, model = _losses("O1", lambda p: torch.optim.Adam(p), steps=1)
    assert "cuda_graphs: skipped (the network is on cpu, not CUDA)" in model.boost_report


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_graph_replays_train_exactly_like_eager_steps(tmp_path):
    """Capture after the warm-up, replays, a partial batch (eager), an LR schedule and an optimizer
    reload (recapture) give the eager losses of the same O1 step. (Not O0's: under a graph, O1 makes
    these small tables row-sparse, and lazy Adam leaves the moments of rows a batch skips.)"""
    batches = [(x.cuda(), y.cuda()) for x, y in _batches(14)]
    batches.insert(9, (batches[9][0][:7], batches[9][1][:7]))  # another shape: runs eagerly

    def run(level, reload_at=None, graphs=True):
        torch.manual_seed(0)
        net = Idiomatic().cuda()
        opt = torch.optim.Adam(net.parameters(), lr=0.01)
        model = Model(net, nn.BCEWithLogitsLoss(), opt, boost_level=level,
                      boost_config_dict={"sparse_embeddings": True, "cuda_graphs": graphs})
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.9)
        losses = []
        for i, (x, y) in enumerate(batches):
            if i == reload_at:
                path = save_checkpoint(tmp_path / f"{level}.safetensors", net, opt)
                load_checkpoint(path, net, opt, restore_rng=False)
            losses.append(float(model.train_network(x, y)))
            sched.step()
        return losses, model

    eager, eager_model = run("O1", graphs=False)
    assert "cuda_graphs: applied" not in " ".join(eager_model.boost_report)
    graphed, model = run("O1")
    assert "cuda_graphs: applied" in " ".join(model.boost_report)
    assert model.train_network._graph is not None
    torch.testing.assert_close(graphed, eager, rtol=1e-5, atol=1e-5)
    reloaded, _ = run("O1", reload_at=11)
    torch.testing.assert_close(reloaded, eager, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("optimizer", ["adam", "adamw"])
def test_cuda_graph_captures_sparse_fused_tables_with_lazy_adam(optimizer, tmp_path):
    """O1 with every table row-sparse (forced): the fused tables' lazy-Adam updates run in the
    graph (device step counter, tensor lr) and give the eager O1 losses, across a checkpoint reload."""
    batches = [(x.cuda(), y.cuda()) for x, y in _batches(14)]
    make = {"adam": torch.optim.Adam, "adamw": lambda p, lr: torch.optim.AdamW(p, lr=lr, weight_decay=0.01)}[optimizer]

    def run(graphs: bool, reload_at=None):
        torch.manual_seed(0)
        net = Idiomatic().cuda()
        opt = make(net.parameters(), lr=0.01)
        model = Model(net, nn.BCEWithLogitsLoss(), opt, boost_level="O2" if optimizer == "adamw" else "O1",
                      boost_config_dict={"sparse_embeddings": True, "cuda_graphs": graphs, "bf16_autocast": False})
        losses = []
        for i, (x, y) in enumerate(batches):
            if i == reload_at:
                path = save_checkpoint(tmp_path / f"{optimizer}.safetensors", net, opt)
                load_checkpoint(path, net, opt, restore_rng=False)
            losses.append(float(model.train_network(x, y)))
        return losses, model, net

    eager, _, _ = run(False)
    graphed, model, net = run(True)
    assert net.tables[0].sparse and "cuda_graphs: applied" in " ".join(model.boost_report), model.boost_report
    assert model.train_network.captured
    torch.testing.assert_close(graphed, eager, rtol=1e-4, atol=1e-5)
    reloaded, model, _ = run(True, reload_at=9)
    assert model.train_network.captured  # recaptured after the reload's eager step
    torch.testing.assert_close(reloaded, eager, rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_o1_with_loss_scaling_is_captured_and_skips_an_overflow_like_eager_steps():
    """O1 on a user's Adam under a dynamic loss scale: the lazy rows (fused tables) take the overflow
    flag on the device as the fused Adam does, so the step is captured; a batch with a NaN label
    (every gradient non-finite) leaves weights, moments and step counts as they were, in the
    replayed step as in the eager one, and the scale shrinks in both."""
    from recstream.train.loss_scale import DynamicLossScaleManager

    batches = [(x.cuda(), y.cuda()) for x, y in _batches(10)]
    poisoned = batches[7][1].clone()
    poisoned[0] = float("nan")

    def tensors(net, opt):
        out = {k: v.clone() for k, v in net.state_dict().items()}
        for i, p in enumerate(net.parameters()):
            out.update({f"{i}.{k}": torch.as_tensor(v).clone() for k, v in opt.state[p].items()})
        return out

    def run(graphs: bool):
        torch.manual_seed(0)
        net = Idiomatic().cuda()
        opt = torch.optim.Adam(net.parameters(), lr=0.01)
        manager = DynamicLossScaleManager(init_loss_scale=2.0 ** 16, scale_factor=2, scale_window=1000)
        model = Model(net, nn.BCEWithLogitsLoss(), opt, boost_level="O1", loss_scale_manager=manager,
                      boost_config_dict={"sparse_embeddings": True, "cuda_graphs": graphs})
        out = []
        for i, (x, y) in enumerate(batches):
            before = tensors(net, opt) if i == 7 else None
            loss, overflow, scale = model.train_network(x, poisoned if i == 7 else y)
            out.append((float(loss), bool(overflow), float(scale)))
            if before is not None:
                after = tensors(net, opt)
                for key, value in before.items():
                    torch.testing.assert_close(after[key], value, rtol=0, atol=0, msg=key)
        return out, model, net, manager

    eager, _, eager_net, eager_manager = run(False)
    graphed, model, net, manager = run(True)
    assert net.tables[0].sparse and "cuda_graphs: applied" in " ".join(model.boost_report), model.boost_report
    assert model.train_network.captured
    assert [o for _, o, _ in graphed] == [o for _, o, _ in eager] == [i == 7 for i in range(10)]
    assert manager.get_loss_scale() == eager_manager.get_loss_scale() == 2.0 ** 15
    torch.testing.assert_close([x for x, _, _ in graphed if x == x], [x for x, _, _ in eager if x == x],
                               rtol=1e-4, atol=1e-5)
    for (key, a), b in zip(net.state_dict().items(), eager_net.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=key)
    # Unforced, the small tables go row-sparse under loss scaling too: the graph holds their updates.
    net = Idiomatic().cuda()
    model = Model(net, nn.BCEWithLogitsLoss(), torch.optim.Adam(net.parameters()), boost_level="O1",
                  loss_scale_manager=DynamicLossScaleManager())
    assert net.tables[0].sparse and "cuda_graphs: applied" in " ".join(model.boost_report), model.boost_report


def test_a_graph_step_is_freed_by_reference_counting_not_left_to_the_cyclic_gc():
    """A graph freed by the cyclic GC can be destroyed while another one is being captured, which
    CUDA refuses (seen on an H100: the second capture failed). So no reference cycle may hold one."""
    import gc
    import weakref

    from recstream.train.cuda_graph import CUDAGraphStep

    net = nn.Linear(2, 1)
    opt = torch.optim.Adam(net.parameters())
    step = CUDAGraphStep(net, [opt])
    ref = weakref.ref(step)
    gc.disable()
    try:
        del step
        assert ref() is None
    finally:
        gc.enable()
    opt.load_state_dict(opt.state_dict())  # the load hook outlives the step harmlessly
