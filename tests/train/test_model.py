"""Model semantics beyond the recorded reference: stop, initial_epoch, modes, datasets, outputs."""
import pytest
import torch

from recstream import Model
from recstream.callbacks.base import Callback

from .helpers import MSDataset, Recorder, batches, linear_model


def steps(rec):
    return [c for c in rec.calls if c[0] == "step_end"]


def test_request_stop_mid_epoch_runs_epoch_end_and_train_end():
    rec = Recorder(stop_at=("step_end", 2, 7))
    linear_model().train(3, batches(5), callbacks=[rec])
    assert rec.calls[-3:] == [("step_end", 2, 7), ("epoch_end", 2, 7), ("train_end", 2, 7)]


def test_request_stop_at_epoch_end_stops_before_next_epoch():
    rec = Recorder(stop_at=("epoch_end", 1, 5))
    linear_model().train(3, batches(5), callbacks=[rec])
    assert rec.calls[-1] == ("train_end", 1, 5)
    assert ("epoch_begin", 2, 5) not in rec.calls


def test_initial_epoch_runs_remaining_epochs_and_counts_steps_from_zero():
    rec = Recorder()
    linear_model().train(4, batches(3), callbacks=[rec], initial_epoch=2)
    assert [c[1] for c in rec.calls if c[0] == "epoch_begin"] == [3, 4]
    assert [c[2] for c in steps(rec)] == [1, 2, 3, 4, 5, 6]
    assert rec.params.epoch_num == 2


def test_valid_frequency_list_and_eval_before_epoch_end():
    rec = Recorder()
    linear_model({"accuracy"}).fit(4, batches(2), batches(2, seed=1), valid_frequency=[1, 3], callbacks=[rec])
    names = [c[0] for c in rec.calls]
    evals = [rec.calls[i - 1][1] for i, n in enumerate(names) if n == "eval_begin"]
    assert evals == [1, 3]
    for i, n in enumerate(names):
        if n == "eval_end":
            assert names[i + 1] == "epoch_end"


def test_metrics_visible_at_epoch_end_then_cleared():
    seen = {}

    class Probe(Callback):
        def on_train_epoch_end(self, ctx):
            p = ctx.original_args()
            seen[p.cur_epoch_num] = (p.get("metrics"), p.get("eval_results"))

    linear_model({"accuracy", "loss"}).fit(2, batches(2), batches(2, seed=1), valid_frequency=2, callbacks=[Probe()])
    assert seen[1] == (None, None)
    metrics, results = seen[2]
    assert set(metrics) == {"accuracy", "loss"} and set(results) == {"accuracy", "loss", "eval_loss"}


def test_network_mode_eval_during_eval_train_after():
    modes = []

    class Probe(Callback):
        def on_eval_step_begin(self, ctx): modes.append(("eval", ctx.original_args().network.training))
        def on_train_step_begin(self, ctx): modes.append(("train", ctx.original_args().network.training))

    model = linear_model({"accuracy"})
    model.fit(2, batches(1), batches(1, seed=1), callbacks=[Probe()])
    assert modes == [("train", True), ("eval", False), ("train", True), ("eval", False)]
    model.eval(batches(1))
    assert model.train_network.training


def test_cb_params_fields():
    rec = Recorder()
    data = batches(3)
    model = linear_model()
    model.train(1, data, callbacks=[rec])
    p = rec.params
    assert p.train_network is model.train_network and p.network is model._network
    assert p.batch_num == 3 and p.epoch_num == 1 and p.mode == "train"
    assert p.train_dataset is data and p.list_callback == [rec]
    assert p.parallel_mode == "stand_alone" and p.device_number == 1
    assert p.train_dataset_element is data[-1] and p.dataset_sink_mode is False


def test_mindspore_style_dataset_reset_each_epoch():
    ds = MSDataset(batches(3))
    rec = Recorder()
    linear_model().train(3, ds, callbacks=[rec])
    assert ds.resets == 3 and ds.iters == 3 and rec.params.batch_num == 3


def test_unsized_iterable_allowed_in_normal_mode():
    class Stream:
        def __iter__(self):
            return iter(batches(4))

    rec = Recorder()
    linear_model().train(2, Stream(), callbacks=[rec])
    assert [c[2] for c in steps(rec)] == list(range(1, 9)) and rec.params.batch_num is None


def test_dataloader_and_dict_batches():
    x = torch.randn(16, 4)
    ds = torch.utils.data.TensorDataset(x, (x[:, 0] > 0).long())
    linear_model().train(1, torch.utils.data.DataLoader(ds, batch_size=4))

    class DictNet(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 2)

        def forward(self, features):
            return self.lin(features)

    net = DictNet()
    model = Model(net, torch.nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), lr=0.1),
                  metrics={"accuracy"}, progress_bar=False)
    data = [{"features": b[0], "label": b[1]} for b in batches(2)]
    model.train(1, data)
    assert 0.0 <= model.eval(data)["accuracy"] <= 1.0


def test_network_computing_its_own_loss_and_custom_eval_network():
    class WithLoss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 1)

        def forward(self, x, y):
            return torch.nn.functional.mse_loss(self.lin(x).squeeze(1), y)

    class Eval(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x, y):
            pred = self.inner.lin(x).squeeze(1)
            return torch.nn.functional.mse_loss(pred, y), pred, y

    net = WithLoss()
    data = [(b[0], b[0][:, 0] * 2) for b in batches(4)]
    model = Model(net, optimizer=torch.optim.SGD(net.parameters(), lr=0.1), metrics={"mae", "loss"},
                  eval_network=Eval(net), eval_indexes=[0, 1, 2], progress_bar=False)
    before = model.eval(data)
    model.train(5, data)
    after = model.eval(data)
    assert after["loss"] < before["loss"] and after["mae"] < before["mae"]


def test_eval_indexes_none_passes_all_outputs():
    got = []

    class Probe(torch.nn.Module):
        def forward(self, x, y):
            return x.sum(1), y

    class Counting:
        pass

    from recstream.metrics import Metric

    class AllOutputs(Metric):
        def clear(self): got.clear()
        def update(self, *inputs): got.append(len(inputs))
        def eval(self): return len(got)

    model = Model(torch.nn.Linear(4, 2), metrics={"n": AllOutputs()}, eval_network=Probe(), progress_bar=False)
    assert model.eval(batches(3)) == {"n": 3} and got == [2, 2, 2]


def test_predict_no_grad_restores_mode():
    model = linear_model()
    model.predict_network.train()
    out = model.predict(torch.randn(3, 4))
    assert out.shape == (3, 2) and not out.requires_grad and model.predict_network.training


def test_build_materialises_lazy_modules():
    net = torch.nn.Sequential(torch.nn.LazyLinear(2))
    model = Model(net, torch.nn.CrossEntropyLoss(), progress_bar=False)
    model.build(batches(1))
    assert net[0].weight.shape == (2, 4)


def test_infer_layouts_describe_every_parameter():
    model = linear_model()
    layout = model.infer_train_layout(batches(1))
    assert set(layout) == {"weight", "bias"}
    assert layout["weight"]["shape"] == [2, 4] and layout["weight"]["placement"] == "replicated"
    assert model.infer_predict_layout(torch.randn(1, 4)) == layout


def test_legacy_hook_names_still_called():
    calls = []

    class Old(Callback):
        def begin(self, ctx): calls.append("begin")
        def step_end(self, ctx): calls.append("step_end")
        def end(self, ctx): calls.append("end")

    linear_model().train(1, batches(2), callbacks=Old())
    assert calls == ["begin", "step_end", "step_end", "end"]


@pytest.mark.parametrize("level", ["O1", "O2", "O3", "auto"])
def test_model_trains_under_mixed_precision(level):
    from recstream.train.loss_scale import DynamicLossScaleManager
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    kwargs = {"loss_scale_manager": DynamicLossScaleManager(2 ** 8)} if level == "O2" else {}
    model = Model(net, torch.nn.CrossEntropyLoss(), torch.optim.Adam(net.parameters(), lr=0.02),
                  metrics={"loss"}, amp_level=level, progress_bar=False, **kwargs)
    data = batches(8)
    before = model.eval(data)["loss"]
    model.train(10, data)
    assert model.eval(data)["loss"] < 0.7 * before
    assert model.predict(data[0][0]).dtype == torch.float32
