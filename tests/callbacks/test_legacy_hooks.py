"""MindSpore's two hook name sets work in both directions, on the built-in callbacks and on a
`CallbackList`; `LossMonitor` prints `fit`'s evaluation results. Cases from MindSpore's callback
tests, driven by hand as those tests do."""
import re
from unittest import mock

import pytest
import torch

from recstream import Model
from recstream.callbacks import (
    Callback,
    CallbackList,
    CallbackParams,
    CheckpointConfig,
    History,
    LambdaCallback,
    LossMonitor,
    ModelCheckpoint,
    RunContext,
)

LEGACY = ("begin", "epoch_begin", "step_begin", "step_end", "epoch_end", "end")


def _context(**fields):
    return RunContext(CallbackParams(**fields))


def test_loss_monitor_legacy_names(capsys):
    ctx = _context(cur_epoch_num=4, epoch_num=4, cur_step_num=1, batch_num=1, net_outputs=torch.tensor(2.0))
    monitor = LossMonitor(1)
    for name in LEGACY:
        getattr(monitor, name)(ctx)
    assert capsys.readouterr().out == "epoch: 4 step: 1, loss is 2.0\n"


def test_loss_monitor_through_a_callback_list_by_legacy_names(capsys):
    ctx = _context(cur_epoch_num=4, epoch_num=4, cur_step_num=2, batch_num=2, net_outputs=torch.tensor(2.0))
    with CallbackList([LossMonitor(1)]) as cbs:
        for name in LEGACY:
            getattr(cbs, name)(ctx)
    assert capsys.readouterr().out == "epoch: 4 step: 2, loss is 2.0\n"


def _params(tmp_path, epoch, step):
    net = torch.nn.Linear(3, 2)
    return CallbackParams(train_network=net, optimizer=torch.optim.SGD(net.parameters(), lr=0.1),
                          epoch_num=10, cur_epoch_num=epoch, cur_step_num=step, batch_num=32)


def test_model_checkpoint_legacy_names_save_by_steps(tmp_path):
    config = CheckpointConfig(save_checkpoint_steps=16, save_checkpoint_seconds=0, keep_checkpoint_max=5,
                              keep_checkpoint_per_n_minutes=0)
    ctx = RunContext(_params(tmp_path, epoch=5, step=160))
    first = ModelCheckpoint(directory=tmp_path, config=config)
    first.begin(ctx)
    first.step_end(ctx)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["CKP-5_32.safetensors"]
    second = ModelCheckpoint(directory=tmp_path, config=config)  # a second run: prefix CKP_1
    ctx.original_args().update(cur_epoch_num=1, cur_step_num=15)
    second.begin(ctx)
    second.step_end(ctx)  # 15 steps < 16: nothing to save yet
    assert sorted(p.name for p in tmp_path.iterdir()) == ["CKP-5_32.safetensors"]


def test_model_checkpoint_legacy_names_keep_per_minutes(tmp_path):
    config = CheckpointConfig(save_checkpoint_steps=16, save_checkpoint_seconds=100, keep_checkpoint_max=0,
                              keep_checkpoint_per_n_minutes=1)
    ctx = RunContext(_params(tmp_path, epoch=4, step=128))
    first = ModelCheckpoint(directory=tmp_path, config=config)
    first.begin(ctx)
    first.step_end(ctx)
    second = ModelCheckpoint(directory=tmp_path, config=config)
    ctx.original_args().update(cur_epoch_num=1, cur_step_num=16)
    second.begin(ctx)
    second.step_end(ctx)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["CKP-4_32.safetensors", "CKP_1-1_16.safetensors"]


def test_model_checkpoint_new_names_still_count_from_the_begin_step(tmp_path):
    """A resumed run begins at its checkpoint's step: the next save comes `steps` steps later."""
    ckpt = ModelCheckpoint(directory=tmp_path, config=CheckpointConfig(save_checkpoint_steps=4))
    p = _params(tmp_path, epoch=1, step=100)
    ckpt.on_train_begin(RunContext(p))
    for step in (101, 102, 103, 104):
        p.cur_step_num = step
        ckpt.on_train_step_end(RunContext(p))
    assert [f.name for f in tmp_path.iterdir()] == ["CKP-1_8.safetensors"]  # step 104 = step 8 of epoch 1


def test_history_driven_by_legacy_names():
    history = History()
    p = CallbackParams(cur_epoch_num=1, net_outputs=torch.tensor(0.5), mode="train")
    ctx = RunContext(p)
    history.begin(ctx)
    history.epoch_end(ctx)
    p.update(cur_epoch_num=2, net_outputs=torch.tensor(0.25), metrics={"auc": 0.75})
    history.epoch_end(ctx)
    assert history.epoch == {"epoch": [1, 2]}
    assert history.history == {"net_output": [0.5, 0.25], "auc": [0.75]}


def test_legacy_names_follow_the_run_mode():
    calls = []
    cb = LambdaCallback(on_train_step_end=lambda ctx: calls.append("train"),
                        on_eval_step_end=lambda ctx: calls.append("eval"))
    cb.step_end(_context(mode="train"))
    cb.step_end(_context(mode="eval"))
    cb.step_end(_context())  # no mode: training, as a run begins
    assert calls == ["train", "eval", "train"]


def test_callback_list_begin_reaches_every_member():
    context = {}
    with mock.patch.object(Callback, "begin", return_value=None) as patched:
        cb1, cb2 = Callback(), Callback()
        with CallbackList([cb1, cb2]) as cbs:
            cbs.begin(context)
    assert patched.call_args_list == [mock.call(context), mock.call(context)]


def test_old_style_and_new_style_callbacks_in_one_list():
    calls = []

    class Old(Callback):
        def begin(self, ctx): calls.append("old begin")
        def step_end(self, ctx): calls.append("old step_end")

    class New(Callback):
        def on_train_begin(self, ctx): calls.append("new begin")
        def on_train_step_end(self, ctx): calls.append("new step_end")

    cbs = CallbackList([Old(), New(), CallbackList([New()])])
    ctx = _context(mode="train")
    cbs.begin(ctx)
    cbs.on_train_step_end(ctx)
    cbs.step_end(ctx)
    assert calls == ["old begin", "new begin", "new begin"] + ["old step_end", "new step_end", "new step_end"] * 2
    # the loop's dispatch table calls the old-style method directly, not the base class's forwarder
    assert cbs._active["on_train_step_end"][0].__func__ is Old.step_end


def test_super_calls_do_not_recurse():
    calls = []

    class Polite(Callback):
        def on_train_begin(self, ctx):
            super().on_train_begin(ctx)
            calls.append("on_train_begin")

        def step_end(self, ctx):
            super().step_end(ctx)
            calls.append("step_end")

    cb = Polite()
    cb.begin(_context())
    cb.on_train_step_end(_context())
    assert calls == ["on_train_begin", "step_end"]


def _mse_model():
    torch.manual_seed(0)
    net = torch.nn.Linear(2, 1)
    return Model(net, torch.nn.MSELoss(), torch.optim.SGD(net.parameters(), lr=0.01), metrics={"mse", "mae"})


def test_loss_monitor_prints_fit_evaluations(capsys):
    data = [(torch.randn(8, 2), torch.randn(8, 1)) for _ in range(2)]
    model = _mse_model()
    model.fit(4, data, data, valid_frequency=2, callbacks=[LossMonitor(per_print_times=2)])
    out = capsys.readouterr().out.splitlines()
    evals = [line for line in out if line.startswith("Eval result")]
    assert [re.match(r"Eval result: epoch (\d+), metrics: ", line).group(1) for line in evals] == ["2", "4"]
    results = model.eval(data)
    assert evals[-1] == f"Eval result: epoch 4, metrics: {results}"
    assert out[out.index(evals[0]) - 1].startswith("epoch: 2 step: 2, loss is ")  # after the epoch's last loss


def test_loss_monitor_prints_no_evaluation_line_in_train(capsys):
    data = [(torch.randn(8, 2), torch.randn(8, 1))]
    _mse_model().train(2, data, callbacks=[LossMonitor()])
    assert "Eval result" not in capsys.readouterr().out


def test_unknown_metric_name_in_model_is_a_key_error():
    net = torch.nn.Linear(2, 1)
    with pytest.raises(KeyError, match="unknown metric name 'top1'"):
        Model(net, torch.nn.MSELoss(), metrics={"top1"})
