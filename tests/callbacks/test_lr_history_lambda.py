"""LearningRateScheduler, History, LambdaCallback and the package's exports."""
import pytest
import torch

import recstream.callbacks as callbacks
from recstream.callbacks import Callback, History, LambdaCallback, LearningRateScheduler
from recstream.callbacks.base import HOOKS


def _opt(*lrs):
    params = [torch.nn.Parameter(torch.zeros(1)) for _ in lrs]
    return torch.optim.SGD([{"params": [p], "lr": lr} for p, lr in zip(params, lrs, strict=True)])


def _lrs(opt):
    return [g["lr"] for g in opt.param_groups]


# ---------------------------------------------------------------- LearningRateScheduler
def test_function_called_each_step_with_lr_and_global_step(driver):
    opt = _opt(1.0, 0.5)
    calls, seen = [], []
    fn = lambda lr, step: (calls.append((lr, step)), lr * 0.5 if step % 2 == 0 else lr)[1]  # noqa: E731
    driver([LearningRateScheduler(fn)], optimizer=opt, batch_num=2, epoch_num=2).run(
        on_step=lambda p: seen.append(_lrs(opt)))
    assert [s for _, s in calls] == [1, 1, 2, 2, 3, 3, 4, 4]  # per group, global steps
    assert seen == [[1.0, 0.5], [1.0, 0.5], [0.5, 0.25], [0.5, 0.25]]
    assert _lrs(opt) == [0.25, 0.125]


def test_function_in_sink_mode_gets_advanced_step(driver):
    steps = []
    driver([LearningRateScheduler(lambda lr, s: steps.append(s) or lr)], optimizer=_opt(0.1),
           epoch_num=3, sink_size=5).run()
    assert steps == [5, 10, 15]


def test_function_per_epoch(driver):
    opt = _opt(1.0)
    driver([LearningRateScheduler(lambda lr, epoch: 1.0 / (epoch + 1), interval="epoch")], optimizer=opt,
           batch_num=3, epoch_num=3).run()
    assert _lrs(opt) == [0.25]


def test_torch_scheduler_per_step_and_per_sink(driver):
    opt = _opt(1.0)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    driver([LearningRateScheduler(sched)], optimizer=opt, epoch_num=2, sink_size=3).run(
        on_step=lambda p: opt.step())
    assert sched.last_epoch == 6 and _lrs(opt) == [pytest.approx(0.5 ** 6)]


def test_torch_scheduler_per_epoch(driver):
    opt = _opt(1.0)
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.1)
    driver([LearningRateScheduler(sched, interval="epoch")], optimizer=opt, batch_num=4, epoch_num=2).run(
        on_step=lambda p: opt.step())
    assert _lrs(opt) == [pytest.approx(0.01)]


def test_lr_scheduler_rejects():
    with pytest.raises(TypeError, match="learning_rate_function"):
        LearningRateScheduler(0.1)
    with pytest.raises(ValueError, match="interval.*'batch'"):
        LearningRateScheduler(lambda lr, s: lr, interval="batch")
    with pytest.raises(TypeError, match="ReduceLROnPlateau"):
        LearningRateScheduler(torch.optim.lr_scheduler.ReduceLROnPlateau(_opt(0.1)))


def test_lr_function_must_return_number(driver):
    with pytest.raises(TypeError, match="must return a number.*str"):
        driver([LearningRateScheduler(lambda lr, s: "0.1")], optimizer=_opt(0.1), epoch_num=1).run()


# ---------------------------------------------------------------- History
def test_history_records_loss_and_eval_results(driver):
    h = History()
    losses = [[0.9, 0.8], [0.7, 0.6], [0.5, 0.4]]
    driver([h], batch_num=2, epoch_num=3).run(losses=losses, eval_results={
        2: {"auc": 0.7, "eval_loss": 0.65}})
    assert h.epoch == {"epoch": [1, 2, 3]}
    assert h.history["net_output"] == pytest.approx([0.8, 0.6, 0.4])
    assert h.history["auc"] == [0.7] and h.history["eval_loss"] == [0.65]


def test_history_tuple_outputs_use_first_element(ctx_of):
    h = History()
    ctx = ctx_of(cur_epoch_num=1, net_outputs=(torch.tensor([1.0, 3.0]), torch.tensor(False), torch.tensor(1024.0)))
    h.on_train_begin(ctx)
    h.on_train_epoch_end(ctx)
    assert h.history == {"net_output": [2.0]}


# ---------------------------------------------------------------- LambdaCallback
def test_lambda_callback_all_hooks(driver):
    calls = []
    cb = LambdaCallback(**{h: (lambda name: lambda ctx: calls.append(name))(h) for h in HOOKS})
    d = driver([cb], batch_num=1, epoch_num=1).run()
    assert calls == ["on_train_begin", "on_train_epoch_begin", "on_train_step_begin", "on_train_step_end",
                     "on_train_epoch_end", "on_train_end"]
    calls.clear()
    for hook in HOOKS[6:]:
        getattr(d.cbs, hook)(d.ctx)
    assert calls == list(HOOKS[6:])


def test_lambda_callback_unset_hooks_do_nothing_and_bad_args(ctx_of):
    cb = LambdaCallback(on_train_end=lambda ctx: ctx.request_stop())
    ctx = ctx_of()
    cb.on_train_step_end(ctx)
    assert not ctx.get_stop_requested()
    cb.on_train_end(ctx)
    assert ctx.get_stop_requested()
    with pytest.raises(TypeError, match="on_eval_end"):
        LambdaCallback(on_eval_end="print")


# ---------------------------------------------------------------- package
def test_exports():
    for name in ["Callback", "CallbackList", "RunContext", "CallbackParams", "LossMonitor", "TimeMonitor",
                 "ModelCheckpoint", "CheckpointConfig", "save_checkpoint", "load_checkpoint", "CheckpointError",
                 "EarlyStopping", "ReduceLROnPlateau", "LearningRateScheduler", "History", "LambdaCallback",
                 "ProgressBar", "TensorBoard", "progress_bar_default", "PrequentialMonitor"]:
        assert hasattr(callbacks, name), name
        assert name in callbacks.__all__, name
    import recstream.checkpoint as checkpoint
    for name in ["save_checkpoint", "load_checkpoint", "CheckpointError"]:
        assert getattr(callbacks, name) is getattr(checkpoint, name)  # re-exported, one object
    assert not hasattr(callbacks, "BUILTIN_CALLBACK_NAMES")


BUILTINS_SKIPPED_IN_FIT_EVAL = ["LossMonitor", "ModelCheckpoint", "EarlyStopping", "ReduceLROnPlateau",
                                "LearningRateScheduler", "History", "LambdaCallback", "ProgressBar", "TensorBoard"]


@pytest.mark.parametrize("name", BUILTINS_SKIPPED_IN_FIT_EVAL)
def test_builtin_callbacks_are_skipped_in_fit_eval(name):
    cls = getattr(callbacks, name)
    assert issubclass(cls, Callback) and cls.called_in_fit_eval is False


def test_callbacks_called_in_fit_eval():
    from recstream.serving import ModelPublisher
    # As in MindSpore, TimeMonitor also times fit's evaluation; user callbacks always see it.
    # PrequentialMonitor and ModelPublisher have no evaluation hooks: they keep the default.
    for cls in (Callback, callbacks.TimeMonitor, callbacks.PrequentialMonitor, ModelPublisher):
        assert cls.called_in_fit_eval is True, cls

    class History(Callback):  # a user's class that happens to share a built-in's name
        pass

    assert History.called_in_fit_eval is True and History().called_in_fit_eval is True

    class Quiet(Callback):
        called_in_fit_eval = False

    class MyLossMonitor(callbacks.LossMonitor):  # a subclass inherits the built-in's choice
        pass

    assert Quiet().called_in_fit_eval is False and MyLossMonitor().called_in_fit_eval is False
