"""Every scenario of mindspore_reference.json (recorded from MindSpore 2.10) reproduced to 1e-5."""
import numpy as np
import pytest
import torch

from recstream import Model
from recstream.callbacks.loss_monitor import LossMonitor

from .reference import Trace, load_reference, make_data, make_network

REF = load_reference()
TOL = 1e-5


def _model(metrics=None):
    net = make_network(REF)
    return Model(net, torch.nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), lr=0.1),
                 metrics=metrics, progress_bar=False)


def _assert_events_match(got, expected):
    assert [e["hook"] for e in got] == [e["hook"] for e in expected]
    for g, e in zip(got, expected, strict=True):
        for key in ("epoch", "step", "batch_num", "epoch_num"):
            assert g[key] == e[key], (e["hook"], key, g[key], e[key])
        assert ("loss" in g) == ("loss" in e)
        if "loss" in e:
            assert abs(g["loss"] - e["loss"]) <= TOL, (e, g["loss"])
        for key in ("metrics", "eval_results"):
            assert (key in g) == (key in e), (e["hook"], key)
            if key in e:
                assert g[key].keys() == e[key].keys()
                for name, value in e[key].items():
                    assert abs(g[key][name] - value) <= TOL, (e["hook"], key, name, g[key][name], value)


def test_train_2_epochs():
    trace = Trace()
    _model().train(2, make_data(20, 0), callbacks=[trace])
    _assert_events_match(trace.events, REF["scenarios"]["train_2_epochs"]["events"])


def test_fit_valid_frequency_2():
    trace = Trace()
    _model({"accuracy", "loss"}).fit(3, make_data(12, 0), make_data(8, 1), valid_frequency=2, callbacks=[trace])
    _assert_events_match(trace.events, REF["scenarios"]["fit_valid_frequency_2"]["events"])


def test_eval_untrained():
    trace = Trace()
    scenario = REF["scenarios"]["eval_untrained"]
    result = _model({"accuracy", "loss"}).eval(make_data(16, 2), callbacks=[trace])
    _assert_events_match(trace.events, scenario["events"])
    assert result.keys() == scenario["result"].keys()
    for name, value in scenario["result"].items():
        assert abs(result[name] - value) <= TOL


def test_loss_monitor_per_print_2(capsys):
    _model().train(2, make_data(12, 0), callbacks=[LossMonitor(2)])
    lines = capsys.readouterr().out.splitlines()
    expected = REF["scenarios"]["loss_monitor_per_print_2"]["stdout"]
    assert len(lines) == len(expected)
    for got, want in zip(lines, expected, strict=True):
        prefix, value = want.rsplit(" ", 1)
        got_prefix, got_value = got.rsplit(" ", 1)
        assert got_prefix == prefix
        assert abs(float(got_value) - float(value)) <= TOL
        # a float32 loss printed through Python's float repr, like MindSpore's float(np.mean(...))
        assert float(got_value) == float(np.float32(got_value)) and len(got_value) > 12


def test_predict_initial():
    x = torch.cat([b[0] for b in make_data(4, 3)])
    out = _model().predict(x)
    expected = torch.tensor(REF["scenarios"]["predict_initial"]["output"])
    assert out.shape == expected.shape
    assert torch.allclose(out, expected, atol=TOL, rtol=0)
    assert not out.requires_grad


@pytest.mark.parametrize("sink_size", [-1, 5])
def test_sink_mode_same_losses_as_normal_mode(sink_size):
    """With sink_size equal to the pass length, sink mode trains the same batches in the same order."""
    normal, sink = Trace(), Trace()
    _model().train(2, make_data(20, 0), callbacks=[normal])
    _model().train(2, make_data(20, 0), callbacks=[sink], dataset_sink_mode=True, sink_size=sink_size)
    last_losses = [e["loss"] for e in normal.events if e["hook"] == "on_train_step_end"][4::5]
    sink_steps = [e for e in sink.events if e["hook"] == "on_train_step_end"]
    assert [e["step"] for e in sink_steps] == [5, 10]
    assert [e["loss"] for e in sink_steps] == pytest.approx(last_losses, abs=1e-6)
