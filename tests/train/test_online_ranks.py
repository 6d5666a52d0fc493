"""RecModel.restore with the job positions of several ranks (online training under torchrun), in one
process: a DirectoryStream refuses positions of another number of ranks, naming both; one saved by
a single process restores as before; fill batches weigh nothing."""
from __future__ import annotations

import pytest
import torch

from recstream import RecModel
from recstream.checkpoint import save_checkpoint
from recstream.data import Schema
from recstream.data.streams import DirectoryStream
from recstream.distributed import fill_batch
from recstream.distributed.lockstep import is_job_position


def _model():
    net = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    return net, optimizer, RecModel(net, torch.nn.MSELoss(), optimizer, progress_bar=False)


def test_restore_refuses_positions_of_another_number_of_ranks(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "part-0.csv").write_text("1,0.5\n")
    net, optimizer, model = _model()
    job = {"step": 4, "ranks": [{"file": "part-0.csv", "offset": 6}, {"file": None, "offset": 0}]}
    assert is_job_position(job)
    save_checkpoint(tmp_path / "ckpt.safetensors", net, optimizer,
                    extra={"epoch": 1, "cur_step_num": 4, "train_position": job})
    stream = DirectoryStream(tmp_path / "data", Schema(["x"]), batch_size=1, idle_timeout=0.1)
    with pytest.raises(ValueError, match=r"positions of 2 rank\(s\) but this job has 1.*restart with 2"):
        model.restore(tmp_path / "ckpt.safetensors", stream)

    single = {"file": "part-0.csv", "offset": 6}  # a single process's position restores unchanged
    save_checkpoint(tmp_path / "one.safetensors", net, optimizer,
                    extra={"epoch": 1, "cur_step_num": 4, "train_position": single})
    assert model.restore(tmp_path / "one.safetensors", stream)["cur_step_num"] == 4
    assert stream.position() == single


def test_fill_batch_has_one_row_and_no_ids(tmp_path):
    (tmp_path / "part-0.csv").write_text("1,0.5\n")
    stream = DirectoryStream(tmp_path, Schema(["x"]), batch_size=1, idle_timeout=0.1)
    fill = fill_batch(stream.empty_batch())
    assert fill.batch_size == 1 and fill.features.values.numel() == 0
    assert fill.features.dense.tolist() == [[0.0]] and fill.labels.tolist() == [0.0]


def test_the_fill_weight_reaches_the_loss_with_the_batch_and_no_observer_sees_it():
    from recstream.data.batch import with_loss_weight
    from recstream.train.rec_model import _FillWeightedLoss
    from recstream.train.sink import BatchStep

    net = torch.nn.Linear(1, 1)
    loss = _FillWeightedLoss(torch.nn.MSELoss())
    x, y = torch.ones(1, 1), torch.full((1, 1), 3.0)
    fill = with_loss_weight((x, y), 0.0)
    assert loss(net(x), fill[1]).item() == 0.0 and loss(net(x), y).item() > 0
    loss(net(x), fill[1]).backward()
    assert net.weight.grad.abs().sum().item() == 0.0  # weighted 0: no gradient at all
    seen = []
    step = lambda *batch: loss(net(batch[0]), batch[1])  # noqa: E731
    BatchStep(fill).run(step, [seen.append])
    BatchStep((x, y)).run(step, [seen.append])
    assert len(seen) == 1 and seen[0][1] is y  # the fill batch is no event: observers skip it
