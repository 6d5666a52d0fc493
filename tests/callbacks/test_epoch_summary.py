"""Results are visible by default: a History comes back and, off a terminal, one line per epoch
(online: a line per interval and one at the end), each figure under History's name for it."""
import io
import re

import pytest
import torch

from recstream import Model, RecModel
from recstream.callbacks import Callback, CallbackParams, EpochSummary, History, PrequentialMonitor, RunContext
from recstream.data.streams import IterableStream


def _model(**kwargs):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 1), torch.nn.Sigmoid())
    data = [(torch.randn(8, 3), torch.rand(8, 1).round()) for _ in range(4)]
    model = Model(net, torch.nn.BCELoss(), torch.optim.SGD(net.parameters(), lr=0.1),
                  metrics={"auc", "loss"}, **kwargs)
    return model, data


def test_fit_returns_history_and_prints_one_line_per_epoch_off_a_terminal(capsys):
    model, data = _model()
    history = model.fit(2, data, data)
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert out == ""  # stdout stays the user's
    assert [line.split(":")[0] for line in lines] == ["epoch 1/2", "epoch 2/2"]
    assert "loss=" in lines[0] and "auc=" in lines[0] and "4 steps in" in lines[0]
    assert isinstance(history, History) and len(history.history["net_output"]) == 2
    assert len(history.history["auc"]) == 2 and history.epoch == {"epoch": [1, 2]}


def test_progress_bar_false_is_silent_and_a_users_history_is_the_one_returned(capsys):
    model, data = _model(progress_bar=False)
    mine = History()
    assert model.train(1, data, callbacks=[mine]) is mine
    assert capsys.readouterr() == ("", "")


def test_a_users_epoch_summary_replaces_the_default(capsys):
    model, data = _model()
    model.train(3, data, callbacks=[EpochSummary(file=__import__("sys").stdout)], initial_epoch=1)
    out, err = capsys.readouterr()
    assert err == "" and [line.split(":")[0] for line in out.splitlines()] == ["epoch 2/3", "epoch 3/3"]


def _labels(line):
    return re.findall(r"(\w+)=", line)


def test_the_training_loss_and_a_loss_metric_never_share_a_label_and_use_historys_names(capsys):
    model, data = _model()  # metrics "auc" and "loss": fit's validation results hold "loss" and "eval_loss"
    history = model.fit(1, data, data)
    line = capsys.readouterr().err.strip()
    labels = _labels(line)
    assert len(labels) == len(set(labels)), line  # each figure under its own name
    assert sorted(labels) == sorted(history.history), line  # the names History's keys have
    assert f"net_output={history.history['net_output'][0]:.4f}," in line
    assert f"loss={history.history['loss'][0]:.4f}," in line


def test_a_result_named_like_the_training_loss_gets_a_name_of_its_own():
    out = io.StringIO()
    summary = EpochSummary(file=out)
    p = CallbackParams(cur_epoch_num=1, epoch_num=1, cur_step_num=0, net_outputs=torch.tensor(0.5))
    summary.on_train_epoch_begin(RunContext(p))
    p.cur_step_num, p.eval_results = 4, {"net_output": 0.25}
    summary.on_train_epoch_end(RunContext(p))
    assert out.getvalue().startswith("epoch 1/1: net_output=0.5000, eval_net_output=0.2500, 4 steps in")


class _Clock:
    """A clock the test moves: `Tick` adds `seconds` at every step, before EpochSummary looks at it."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


class _Tick(Callback):
    def __init__(self, clock, seconds):
        self.clock, self.seconds = clock, seconds

    def on_train_step_end(self, run_context):
        self.clock.now += self.seconds


def _online(batches=10):
    torch.manual_seed(0)
    net = torch.nn.Linear(3, 1)
    model = RecModel(net, torch.nn.BCEWithLogitsLoss(), torch.optim.SGD(net.parameters(), lr=0.1))
    data = [(torch.randn(8, 3), torch.rand(8, 1).round()) for _ in range(batches)]
    return model, IterableStream(iter(data))  # one-shot: online_train ends when it is exhausted


def test_online_training_prints_a_line_per_interval_then_one_final_line():
    model, stream = _online(10)
    clock, out = _Clock(), io.StringIO()
    summary = EpochSummary(file=out, every_seconds=25, clock=clock)
    model.online_train(stream, callbacks=[_Tick(clock, 10.0), summary], sink_size=1)  # 10 sinks of 1 batch
    lines = out.getvalue().splitlines()
    # steps end at 10, 20, ... 100 s: a line once 25 s have passed since the last one (30, 60, 90 s)
    assert [line.split(":")[0] for line in lines] == ["online step 3", "online step 6", "online step 9",
                                                      "online training ended at step 10"], lines
    assert lines[0].startswith("online step 3: net_output=") and ", 3 steps, 24 events in 30.0 s, 0.8 events/s" \
        in lines[0]
    assert lines[1].endswith(", 3 steps, 24 events in 30.0 s, 0.8 events/s")
    assert lines[-1].startswith("online training ended at step 10: 10 steps, 80 events in 100.0 s, 0.8 events/s, "
                                "net_output="), lines[-1]
    assert not any(" 0 steps" in line for line in lines)


class _IdleEnd(_Tick):
    """The stream waits `seconds` for events that never come before it ends (its idle_timeout)."""

    def on_train_step_end(self, run_context):
        pass

    def on_train_end(self, run_context):
        self.clock.now += self.seconds


def test_the_final_online_line_leaves_the_wait_for_the_stream_to_end_out_of_the_rates():
    """events/s counted the idle timeout as training (480 events/s of a run that trained at 2,000)."""
    model, stream = _online(10)
    clock, out = _Clock(), io.StringIO()
    summary = EpochSummary(file=out, every_seconds=1000, clock=clock)
    model.online_train(stream, callbacks=[_Tick(clock, 1.0), _IdleEnd(clock, 10.0), summary], sink_size=1)
    line = out.getvalue().splitlines()[-1]
    assert line.startswith("online training ended at step 10: 10 steps, 80 events in 10.0 s, 8.0 events/s, "), line
    assert line.endswith("; then 10.0 s waiting for new events"), line


@pytest.mark.parametrize("sink_size", [2, 3])
def test_online_training_off_a_terminal_prints_no_line_per_sink_and_no_0_step_line(capsys, sink_size):
    model, stream = _online(10)
    # sinks of 2: five full ones, then one that finds the end (0 steps); of 3: 3, 3, 3 and a short 1
    model.online_train(stream, sink_size=sink_size)
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("online training ended at step 10: 10 steps, 80 events in "), err
    assert "epoch" not in err


@pytest.mark.parametrize("verbose", [False, True])
def test_the_final_online_line_adds_prequential_figures_only_where_the_monitor_did_not_print_them(capsys, verbose):
    model, stream = _online(6)
    out = io.StringIO()
    monitor = PrequentialMonitor(window=100, log_every=100, verbose=verbose)
    model.online_train(stream, callbacks=[monitor, EpochSummary(file=out)], sink_size=2)
    final = out.getvalue().splitlines()[-1]
    shown = "prequential step 6:" in capsys.readouterr().err
    assert shown == verbose
    totals = monitor.last
    expected = f"auc_total={totals['auc_total']:.4f}, logloss_total={totals['logloss_total']:.4f}"
    assert (expected in final) != verbose, final


@pytest.mark.parametrize("kwargs,exc", [({"every_seconds": -1}, ValueError), ({"every_seconds": "30"}, TypeError),
                                        ({"clock": 3}, TypeError), ({"file": "log.txt"}, TypeError)])
def test_wrong_arguments_are_refused_with_their_name(kwargs, exc):
    with pytest.raises(exc, match=f"EpochSummary: '{next(iter(kwargs))}'"):
        EpochSummary(**kwargs)
