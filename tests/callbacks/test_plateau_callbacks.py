"""EarlyStopping and ReduceLROnPlateau driven by scripted eval results and losses."""
import warnings

import pytest
import torch

from recstream.callbacks import EarlyStopping, ReduceLROnPlateau


def _evals(key, values):
    return {e + 1: {key: v} for e, v in enumerate(values)}


# ---------------------------------------------------------------- EarlyStopping
def test_early_stopping_min_mode_with_patience(driver):
    stop = EarlyStopping(monitor="eval_loss", patience=2)
    d = driver([stop], epoch_num=10, batch_num=1).run(eval_results=_evals("eval_loss", [5, 4, 4.5, 4.2, 1, 0.5]))
    # best 4 at epoch 2; epochs 3 and 4 do not improve -> wait 2 >= patience at epoch 4.
    assert stop.stopped_epoch == 4 and d.p.cur_epoch_num == 4 and stop.best == 4


def test_early_stopping_auto_mode_max_for_metrics_and_min_delta(driver):
    stop = EarlyStopping(monitor="auc", patience=1, min_delta=0.01)
    assert stop.mode == "max"
    driver([stop], epoch_num=10, batch_num=1).run(eval_results=_evals("auc", [0.70, 0.75, 0.755, 0.9]))
    assert stop.stopped_epoch == 3  # +0.005 is below min_delta


def test_early_stopping_patience_zero_stops_after_first_epoch_like_mindspore(driver):
    stop = EarlyStopping(monitor="loss")
    d = driver([stop], epoch_num=5, batch_num=2).run()
    assert stop.stopped_epoch == 1 and d.p.cur_epoch_num == 1


def test_early_stopping_on_training_loss_reads_net_outputs(driver):
    stop = EarlyStopping(monitor="loss", patience=1, mode="min")
    losses = [[3, 2], [3, 1.5], [3, 1.7], [3, 0.1]]  # the epoch's last step counts
    driver([stop], epoch_num=4, batch_num=2).run(losses=losses)
    assert stop.stopped_epoch == 3 and stop.best == 1.5


def test_early_stopping_baseline(driver):
    stop = EarlyStopping(monitor="acc", patience=2, baseline=0.9)
    driver([stop], epoch_num=10, batch_num=1).run(eval_results=_evals("acc", [0.5, 0.6, 0.7, 0.95]))
    assert stop.stopped_epoch == 2  # improving but never beyond the baseline


def test_early_stopping_restores_best_weights(driver):
    net = torch.nn.Linear(1, 1, bias=False)

    def set_weight(p):  # the weight after epoch e is e
        with torch.no_grad():
            net.weight.fill_(p.cur_epoch_num)

    stop = EarlyStopping(monitor="eval_loss", patience=2, restore_best_weights=True)
    driver([stop], network=net, epoch_num=10, batch_num=1).run(
        on_step=set_weight, eval_results=_evals("eval_loss", [3, 1, 2, 2]))
    assert stop.stopped_epoch == 4 and net.weight.item() == 2.0


def test_early_stopping_missing_monitor_warns_once(driver):
    stop = EarlyStopping(monitor="auc", patience=0)
    with pytest.warns(RuntimeWarning, match="'auc', which is not available.*eval_loss") as record:
        d = driver([stop], epoch_num=3, batch_num=1).run(eval_results=_evals("eval_loss", [1, 1, 1]))
    assert len([w for w in record if "not available" in str(w.message)]) == 1
    assert stop.stopped_epoch == 0 and d.p.cur_epoch_num == 3


@pytest.mark.parametrize("kwargs, exc", [
    ({"monitor": 3}, TypeError), ({"mode": "up"}, ValueError), ({"patience": -1}, ValueError),
    ({"min_delta": "0"}, TypeError), ({"verbose": 1}, TypeError), ({"baseline": "x"}, TypeError),
])
def test_early_stopping_rejects(kwargs, exc):
    with pytest.raises(exc, match=next(iter(kwargs))):
        EarlyStopping(**kwargs)


def test_early_stopping_non_scalar_metric(driver):
    stop = EarlyStopping(monitor="auc")
    with pytest.raises(ValueError, match="scalar"):
        driver([stop], epoch_num=1, batch_num=1).run(eval_results={1: {"auc": torch.ones(2)}})


# ---------------------------------------------------------------- ReduceLROnPlateau
def _opt(*lrs):
    params = [torch.nn.Parameter(torch.zeros(1)) for _ in lrs]
    return torch.optim.SGD([{"params": [p], "lr": lr} for p, lr in zip(params, lrs, strict=True)])


def test_reduce_lr_patience_factor_cooldown_and_min_lr(driver):
    opt = _opt(1.0, 0.02)
    # As in MindSpore/Keras the cooldown counter is decremented before it is tested, so
    # cooldown=2 leaves one epoch without a reduction.
    reduce = ReduceLROnPlateau(monitor="eval_loss", factor=0.5, patience=1, cooldown=2, min_lr=0.01)
    seen = []
    d = driver([reduce], optimizer=opt, epoch_num=6, batch_num=1)
    # eval_loss never improves after epoch 1.
    d.run(eval_results=_evals("eval_loss", [1, 1, 1, 1, 1, 1]), on_step=lambda p: seen.append(
        [g["lr"] for g in opt.param_groups]))
    # reductions at epochs 2 (wait 1), cooldown epoch 3, epoch 4 again, cooldown 5, epoch 6.
    assert seen == [[1.0, 0.02], [1.0, 0.02], [0.5, 0.01], [0.5, 0.01], [0.25, 0.01], [0.25, 0.01]]
    assert [g["lr"] for g in opt.param_groups] == [0.125, 0.01]


def test_reduce_lr_tensor_lr_stays_tensor(driver):
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.Adam([p], lr=torch.tensor(0.1))
    reduce = ReduceLROnPlateau(monitor="loss", factor=0.1, patience=0)
    driver([reduce], optimizer=opt, epoch_num=1, batch_num=1).run()
    # patience 0: the first epoch is an improvement (from inf), so nothing changes yet.
    assert torch.is_tensor(opt.param_groups[0]["lr"]) and opt.param_groups[0]["lr"].item() == pytest.approx(0.1)
    driver([ReduceLROnPlateau(monitor="loss", factor=0.1, patience=1, mode="max")], optimizer=opt,
           epoch_num=2, batch_num=1).run(losses=[[1.0], [0.5]])
    assert torch.is_tensor(opt.param_groups[0]["lr"]) and opt.param_groups[0]["lr"].item() == pytest.approx(0.01)


def test_reduce_lr_verbose_and_missing_optimizer(driver, capsys):
    reduce = ReduceLROnPlateau(monitor="auc", factor=0.5, patience=1, verbose=True)
    driver([reduce], optimizer=_opt(0.4), epoch_num=2, batch_num=1).run(eval_results=_evals("auc", [0.8, 0.7]))
    assert "Epoch 00002: ReduceLROnPlateau reducing learning rate to 0.2." in capsys.readouterr().out
    with pytest.raises(RuntimeError, match="no optimizer"):
        driver([ReduceLROnPlateau()], epoch_num=1, batch_num=1).run()


@pytest.mark.parametrize("kwargs, exc", [
    ({"factor": 1.0}, ValueError), ({"factor": 0}, ValueError), ({"min_lr": -1}, ValueError),
    ({"cooldown": -2}, ValueError), ({"mode": "best"}, ValueError), ({"min_delta": None}, TypeError),
])
def test_reduce_lr_rejects(kwargs, exc):
    with pytest.raises(exc, match=next(iter(kwargs))):
        ReduceLROnPlateau(**kwargs)


def test_no_warning_when_monitor_present(driver):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        driver([ReduceLROnPlateau(monitor="eval_loss")], optimizer=_opt(0.1), epoch_num=2, batch_num=1).run(
            eval_results=_evals("eval_loss", [1.0, 0.5]))
