"""The loss figures of the CLI's metrics rows are means: the training loss over the epoch's
examples (it was the last batch's, and the last batch of 20,000 rows / 512 has 32), the evaluation
loss over the whole set (fit's eval_loss is the last batch's, MindSpore's rule, and is left out)."""
from __future__ import annotations

import io

import torch

from recstream.callbacks import Callback
from recstream.cli.run_log import EvalLossMean, LossMean, MetricsLog
from recstream.data.protocol import batch_rows
from recstream.train import Model


class Losses(Callback):
    """Each step's loss and rows, as the run saw them (normal mode: one batch per step)."""

    def __init__(self):
        self.steps: list[tuple[float, int]] = []
        self._rows = None

    def on_train_begin(self, run_context):
        run_context.original_args().batch_observers.append(self._observe)

    def _observe(self, batch):
        self._rows = batch_rows(batch)

    def on_train_step_end(self, run_context):
        self.steps.append((float(run_context.original_args().net_outputs), self._rows))


def data(rows: int, batch: int):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(rows, 3, generator=g)
    y = (x[:, :1] + 0.3 * torch.randn(rows, 1, generator=g) > 0).float()
    return [(x[i:i + batch], y[i:i + batch]) for i in range(0, rows, batch)]


def test_the_epoch_row_holds_the_mean_training_loss_and_the_whole_sets_eval_loss(tmp_path):
    net = torch.nn.Linear(3, 1)
    model = Model(net, torch.nn.BCEWithLogitsLoss(), torch.optim.SGD(net.parameters(), lr=0.5),
                  progress_bar=False)
    train = data(1000, 96)  # 10 batches of 96 and one of 40
    losses, echo = Losses(), io.StringIO()
    log = MetricsLog(str(tmp_path), echo=echo)
    model.train(2, train, callbacks=[losses, log])
    first = losses.steps[:11]
    mean = sum(loss * rows for loss, rows in first) / sum(rows for _, rows in first)
    assert abs(log.rows[0]["loss"] - mean) < 1e-6, (log.rows[0], mean)
    assert abs(log.rows[0]["loss"] - first[-1][0]) > 1e-3  # not the last batch's
    assert [line.split(":")[0] for line in echo.getvalue().splitlines()] == ["epoch 1/2", "epoch 2/2"]


def test_fits_last_batch_eval_loss_becomes_the_whole_sets():
    from recstream.callbacks import CallbackParams, RunContext
    p = CallbackParams(eval_results={"auc": 0.7, "logloss": 0.52, "eval_loss": 0.9})
    EvalLossMean().on_train_epoch_end(RunContext(p))
    assert p.eval_results == {"auc": 0.7, "logloss": 0.52, "eval_loss": 0.52}


def test_a_sink_of_several_batches_names_its_column_for_what_it_is():
    mean = LossMean()
    for _ in range(3):
        mean.observe((torch.zeros(4, 1), torch.zeros(4)))
    mean.add(torch.tensor(0.5))
    assert mean.sampled and mean.take() == 0.5
