"""TimeMonitor, ProgressBar (+ progress_bar_default) and TensorBoard."""
import builtins
import io
import re
import sys
import time

import pytest
import torch

from recstream.callbacks import ProgressBar, TensorBoard, TimeMonitor, progress_bar_default
from recstream.callbacks import progress_bar as pb_module


# ---------------------------------------------------------------- TimeMonitor
def test_time_monitor_prints_mindspore_format(driver, capsys):
    tm = TimeMonitor(data_time=True)
    driver([tm], batch_num=4, epoch_num=2).run(on_step=lambda p: time.sleep(0.005))
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2
    pattern = r"Train epoch time: (\d+\.\d{3}) ms, per step time: (\d+\.\d{3}) ms \(data time: (\d+\.\d{3}) ms\)"
    for line in lines:
        m = re.fullmatch(pattern, line)
        assert m, line
        epoch_ms, step_ms, data_ms = map(float, m.groups())
        assert epoch_ms >= 20 and step_ms == pytest.approx(epoch_ms / 4, abs=1e-3)
        assert data_ms < step_ms  # the sleep happens inside the step, not between steps


def test_time_monitor_eval_inside_fit_keeps_train_clock_and_batch_num(ctx_of, capsys):
    tm = TimeMonitor()
    ctx = ctx_of(mode="train", batch_num=10, cur_step_num=0)
    p = ctx.original_args()
    tm.on_train_epoch_begin(ctx)
    time.sleep(0.02)
    p.batch_num, p.mode = 2, "eval"  # fit's evaluation overwrites these
    tm.on_eval_epoch_begin(ctx)
    tm.on_eval_epoch_end(ctx)
    p.batch_num, p.mode = 10, "train"
    tm.on_train_epoch_end(ctx)
    eval_line, train_line = capsys.readouterr().out.strip().splitlines()
    assert eval_line.startswith("Eval epoch time: ")
    train_ms, step_ms = map(float, re.findall(r"(\d+\.\d+) ms", train_line))
    assert train_ms >= 20 and step_ms == pytest.approx(train_ms / 10, abs=1e-3)


def test_time_monitor_unsized_dataset_counts_steps(ctx_of, capsys):
    tm = TimeMonitor()
    ctx = ctx_of(mode="train", batch_num=None, cur_step_num=0)  # an unsized dataset
    tm.on_train_epoch_begin(ctx)
    ctx.original_args().cur_step_num = 5
    tm.on_train_epoch_end(ctx)
    out = capsys.readouterr().out
    epoch_ms, step_ms = map(float, re.findall(r"(\d+\.\d+) ms", out))
    assert step_ms == pytest.approx(epoch_ms / 5, abs=1e-3)


def test_time_monitor_rejects():
    with pytest.raises(ValueError, match="data_size.*0"):
        TimeMonitor(data_size=0)
    with pytest.raises(TypeError, match="data_time"):
        TimeMonitor(data_time="yes")


# ---------------------------------------------------------------- ProgressBar
def test_progress_bar_reads_loss_only_when_redrawing(driver, monkeypatch):
    out = io.StringIO()
    reads = []
    real = pb_module.loss_value
    monkeypatch.setattr(pb_module, "loss_value", lambda o: reads.append(1) or real(o))
    bar = ProgressBar(refresh_interval=3600, file=out)
    driver([bar], batch_num=50, epoch_num=2).run()
    assert len(reads) == 2  # once per epoch end; never per step with a long interval
    text = out.getvalue()
    assert "Epoch 1/2" in text and "Epoch 2/2" in text and "50/50" in text and "step/s" in text
    assert "loss=0.0100" in text  # the last step's loss (1 / 100)


def test_progress_bar_refreshes_with_loss_eta_and_metrics(driver):
    out = io.StringIO()
    bar = ProgressBar(refresh_interval=0, file=out)
    driver([bar], batch_num=4, epoch_num=1).run(eval_results={1: {"auc": 0.75, "eval_loss": 0.5}})
    text = out.getvalue()
    assert "2/4" in text and "<00:00" in text and "loss=0.5000" in text  # ETA shown for sized data
    assert "auc=0.7500" in text and "eval_loss=0.5000" in text


def test_progress_bar_unknown_total_and_eval(ctx_of):
    out = io.StringIO()
    bar = ProgressBar(refresh_interval=0, file=out)
    ctx = ctx_of(batch_num=None, epoch_num=1, cur_epoch_num=1, cur_step_num=0, net_outputs=torch.tensor(0.25))
    p = ctx.original_args()
    with bar:
        bar.on_train_begin(ctx)
        bar.on_train_epoch_begin(ctx)
        for _ in range(3):
            p.cur_step_num += 1
            bar.on_train_step_end(ctx)
        bar.on_train_epoch_end(ctx)
        p.update(batch_num=2, cur_step_num=0)
        bar.on_eval_begin(ctx)
        for _ in range(2):
            p.cur_step_num += 1
            bar.on_eval_step_end(ctx)
        p.metrics = {"acc": 0.5}
        bar.on_eval_end(ctx)
    text = out.getvalue()
    assert "3step" in text.replace(" ", "") and "Eval" in text and "2/2" in text and "acc=0.5000" in text


def test_progress_bar_closes_on_exception(driver):
    out = io.StringIO()
    bar = ProgressBar(file=out)

    def boom(p):
        raise KeyError("x")

    with pytest.raises(KeyError):
        driver([bar], batch_num=3, epoch_num=1).run(on_step=boom)
    assert bar._train is None and bar._eval is None


def test_progress_bar_rejects():
    with pytest.raises(ValueError, match="refresh_interval.*-1"):
        ProgressBar(refresh_interval=-1)
    with pytest.raises(TypeError, match="leave"):
        ProgressBar(leave="no")
    with pytest.raises(TypeError, match="file"):
        ProgressBar(file=3)


def test_progress_bar_default(monkeypatch):
    class Tty(io.StringIO):
        def isatty(self):
            return True

    for var in pb_module._CI_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TERM", "xterm")
    monkeypatch.setattr(sys, "stderr", Tty())
    assert progress_bar_default() is True
    monkeypatch.setenv("CI", "true")
    assert progress_bar_default() is False
    monkeypatch.setenv("CI", "false")
    assert progress_bar_default() is True
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    monkeypatch.delitem(sys.modules, "ipykernel", raising=False)
    assert progress_bar_default() is False
    monkeypatch.setitem(sys.modules, "ipykernel", object())  # a Jupyter kernel: no tty, a widget bar
    assert progress_bar_default() is True
    monkeypatch.setenv("CI", "true")
    assert progress_bar_default() is False


# ---------------------------------------------------------------- TensorBoard
def _scalars(log_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return {tag: [(e.step, round(e.value, 6)) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_tensorboard_epoch_frequency(driver, tmp_path):
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.5)
    losses = [[0.9, 0.8], [0.7, 0.6]]
    with TensorBoard(log_dir=tmp_path) as tb:
        driver([tb], optimizer=opt, batch_num=2, epoch_num=2).run(
            losses=losses, eval_results={2: {"auc": 0.7, "eval_loss": 0.65}})
    assert _scalars(tmp_path) == {"train/loss": [(2, 0.8), (4, 0.6)], "train/lr": [(2, 0.5), (4, 0.5)],
                                  "eval/auc": [(4, 0.7)], "eval/eval_loss": [(4, 0.65)]}


def test_tensorboard_step_frequency_groups_and_eval(driver, tmp_path, ctx_of):
    params = [torch.nn.Parameter(torch.zeros(1)) for _ in range(2)]
    opt = torch.optim.SGD([{"params": [params[0]], "lr": 0.1}, {"params": [params[1]], "lr": 0.2}])
    tb = TensorBoard(log_dir=tmp_path, update_freq=3)
    driver([tb], optimizer=opt, batch_num=4, epoch_num=2).run()
    tb.on_eval_end(ctx_of(metrics={"acc": 0.9}))  # standalone eval after training
    tb.close()
    got = _scalars(tmp_path)
    assert got["train/loss"] == [(3, round(1 / 3, 6)), (6, round(1 / 6, 6))]
    assert got["train/lr/group0"] == [(3, 0.1), (6, 0.1)] and got["train/lr/group1"] == [(3, 0.2), (6, 0.2)]
    assert got["eval/acc"] == [(8, 0.9)]


def test_tensorboard_missing_package_and_bad_args(monkeypatch, tmp_path):
    with pytest.raises(ValueError, match="update_freq.*'batch'"):
        TensorBoard(log_dir=tmp_path, update_freq="batch")
    with pytest.raises(ValueError, match="update_freq.*0"):
        TensorBoard(log_dir=tmp_path, update_freq=0)
    real_import = builtins.__import__

    def no_tensorboard(name, *args, **kwargs):
        if name.startswith("torch.utils.tensorboard") or name.startswith("tensorboard"):
            raise ImportError("No module named 'tensorboard'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tensorboard)
    with pytest.raises(ImportError, match="pip install tensorboard"):
        TensorBoard(log_dir=tmp_path)


def test_progress_bar_shows_the_prequential_auc_online(ctx_of):
    out = io.StringIO()
    bar = ProgressBar(refresh_interval=0, file=out)
    ctx = ctx_of(batch_num=None, epoch_num=1, cur_epoch_num=1, cur_step_num=0, net_outputs=torch.tensor(0.25))
    p = ctx.original_args()
    with bar:
        bar.on_train_begin(ctx)
        bar.on_train_epoch_begin(ctx)
        p.cur_step_num = 1
        p.prequential = {"auc": 0.7123, "logloss": 0.5}
        bar.on_train_step_end(ctx)
    assert "preq_auc=0.7123" in out.getvalue()
