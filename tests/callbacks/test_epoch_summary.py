"""Results are visible by default: a History comes back and, off a terminal, one line per epoch."""
import torch

from recstream import Model
from recstream.callbacks import EpochSummary, History


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
