"""Callbacks inside real `Model.train` / `Model.fit` runs: resume exactness, early stop, files."""
import os

import pytest
import torch

from recstream.callbacks import CheckpointConfig, EarlyStopping, History, LambdaCallback, ModelCheckpoint, TensorBoard
from recstream.checkpoint import load_checkpoint
from recstream.train import Model


def _data(n_batches, seed, batch=8):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n_batches * batch, 6, generator=g)
    y = (x[:, 0] - x[:, 1] > 0).long()
    return [(x[i:i + batch], y[i:i + batch]) for i in range(0, len(x), batch)]


def _model(seed=0, lr=0.1, metrics=None):
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Dropout(0.3), torch.nn.Linear(16, 2))
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    return Model(net, loss_fn=torch.nn.CrossEntropyLoss(), optimizer=opt, metrics=metrics), net, opt


def _recorder(out):
    return LambdaCallback(on_train_step_end=lambda ctx: out.append(float(ctx.original_args().net_outputs)))


def test_resume_from_checkpoint_reproduces_uninterrupted_losses(tmp_path):
    data = _data(5, seed=1)
    full = []
    model, _, _ = _model(seed=0)
    torch.manual_seed(42)
    model.train(4, data, callbacks=[_recorder(full)])

    first = []
    model, _, _ = _model(seed=0)
    torch.manual_seed(42)
    ckpt = ModelCheckpoint(prefix="run", directory=tmp_path, config=CheckpointConfig(save_checkpoint_steps=5))
    model.train(2, data, callbacks=[_recorder(first), ckpt])
    assert first == full[:10]
    assert ckpt.latest_ckpt_file_name.endswith("run-2_5.safetensors")

    # A new process, in effect: other weights, other RNG state, fresh optimizer.
    model, net, opt = _model(seed=7)
    torch.manual_seed(1234)
    meta = load_checkpoint(ckpt.latest_ckpt_file_name, net, opt)
    assert (meta["epoch"], meta["cur_step_num"]) == (2, 10)
    rest = []
    model.train(4, data, callbacks=[_recorder(rest)], initial_epoch=meta["epoch"])
    assert rest == full[10:]  # bit-identical, dropout included


def test_resume_without_rng_restore_differs(tmp_path):
    # Guards the test above: dropout makes the losses depend on the restored RNG state.
    data = _data(5, seed=1)
    model, _, _ = _model(seed=0)
    ckpt = ModelCheckpoint(prefix="r", directory=tmp_path, config=CheckpointConfig(save_checkpoint_steps=5))
    model.train(1, data, callbacks=[ckpt])
    after = []
    model.train(2, data, callbacks=[_recorder(after)], initial_epoch=1)
    model, net, opt = _model(seed=7)
    torch.manual_seed(99)
    load_checkpoint(ckpt.latest_ckpt_file_name, net, opt, restore_rng=False)
    other = []
    model.train(2, data, callbacks=[_recorder(other)], initial_epoch=1)
    assert other != after


def test_checkpoint_files_during_train_and_sink(tmp_path):
    data = _data(3, seed=2)
    model, _, _ = _model()
    cb = ModelCheckpoint(prefix="a", directory=tmp_path,
                         config=CheckpointConfig(save_checkpoint_steps=2, keep_checkpoint_max=3))
    model.train(3, data, callbacks=[cb])
    # global steps 2, 4, 6, 8 and the final 9 were saved; the 3 newest remain.
    assert sorted(os.listdir(tmp_path)) == ["a-2_3.safetensors", "a-3_2.safetensors", "a-3_3.safetensors"]

    sink_dir = tmp_path / "sink"
    cb = ModelCheckpoint(prefix="s", directory=sink_dir, config=CheckpointConfig(save_checkpoint_steps=1))
    model.train(2, data, callbacks=[cb], dataset_sink_mode=True, sink_size=2)
    assert sorted(os.listdir(sink_dir)) == ["s-1_2.safetensors", "s-2_2.safetensors"]
    assert load_checkpoint(sink_dir / "s-2_2.safetensors", restore_rng=False)["cur_step_num"] == 4


def test_early_stopping_ends_fit_and_history_records(tmp_path):
    train, valid = _data(2, seed=3), _data(2, seed=4)
    model, _, _ = _model(lr=0.0, metrics={"loss", "accuracy"})  # lr 0: eval_loss never improves
    stop = EarlyStopping(monitor="eval_loss", patience=2)
    history = History()
    with TensorBoard(log_dir=tmp_path) as tb:
        model.fit(20, train, valid, callbacks=[stop, history, tb])
    assert stop.stopped_epoch == 3 and history.epoch == {"epoch": [1, 2, 3]}
    assert len(history.history["net_output"]) == 3 and len(history.history["eval_loss"]) == 3
    assert set(history.history) >= {"loss", "accuracy", "eval_loss"}

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    assert {"train/loss", "train/lr", "eval/loss", "eval/eval_loss", "eval/accuracy"} <= set(acc.Tags()["scalars"])
    assert [e.step for e in acc.Scalars("eval/accuracy")] == [2, 4, 6]


def test_early_stopping_on_accuracy_with_valid_frequency():
    train, valid = _data(2, seed=3), _data(2, seed=4)
    model, _, _ = _model(lr=0.0, metrics={"accuracy"})
    stop = EarlyStopping(monitor="accuracy", patience=1)
    with pytest.warns(RuntimeWarning, match="not available"):  # odd epochs have no evaluation
        model.fit(20, train, valid, valid_frequency=2, callbacks=[stop])
    assert stop.mode == "max" and stop.stopped_epoch == 4
