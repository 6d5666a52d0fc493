"""Checkpoints under faults: a flipped bit in the metadata fails the load; `restore` takes the
newest checkpoint that loads; online restarts do not grow the directory; a sink's exception
checkpoint records what the weights hold; a second SIGTERM cannot kill the final write.
"""
import os
import signal

import pytest
import torch

from recstream import RecModel
from recstream.callbacks import Callback, CheckpointConfig, ModelCheckpoint
from recstream.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from recstream.data.streams import IterableStream


class Net(torch.nn.Module):
    def __init__(self, fail_at=None):
        super().__init__()
        self.lin = torch.nn.Linear(2, 1)
        self.fail_at, self.calls = fail_at, 0

    def forward(self, x):
        self.calls += 1
        if self.calls == self.fail_at:
            raise RuntimeError("bad batch")
        return self.lin(x).squeeze(1)


def _batches(n=12):
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(4, 2, generator=g), torch.randint(0, 2, (4,), generator=g).float()) for _ in range(n)]


def _model(net=None):
    net = net or Net()
    return RecModel(net, torch.nn.BCEWithLogitsLoss(), torch.optim.SGD(net.lin.parameters(), lr=0.1),
                    progress_bar=False)


def _stream(n=12):
    data = _batches(n)
    return IterableStream(lambda: iter(data))


def _online(ckpt_dir, n=12, keep=5, **kw):
    model, stream = _model(), _stream(n)
    model.restore(ckpt_dir, stream)
    ckpt = ModelCheckpoint("online", ckpt_dir, CheckpointConfig(save_checkpoint_steps=2, keep_checkpoint_max=keep))
    model.online_train(stream, callbacks=[ckpt], **kw)
    return model


def test_a_flipped_digit_in_the_stream_position_fails_the_load(tmp_path):
    path = tmp_path / "c.safetensors"
    save_checkpoint(path, torch.nn.Linear(2, 1), extra={"train_position": {"clicks:0": 123456}})
    raw = path.read_bytes()
    assert raw.count(b"123456") == 1
    path.write_bytes(raw.replace(b"123456", b"023456"))  # 100k offsets back: events trained twice
    with pytest.raises(CheckpointError, match="metadata fails its checksum"):
        load_checkpoint(path, torch.nn.Linear(2, 1), restore_rng=False)


def test_restore_takes_the_newest_checkpoint_that_loads(tmp_path):
    _online(tmp_path, n=8)  # checkpoints at steps 2, 4, 6, 8
    files = sorted(tmp_path.glob("*.safetensors"), key=os.path.getmtime)
    assert len(files) == 4
    newest = files[-1]
    newest.write_bytes(newest.read_bytes()[:100])  # truncated
    save_checkpoint(tmp_path / "zz-foreign.safetensors", torch.nn.Linear(5, 5))  # stray, newest of all
    model, stream = _model(), _stream()
    meta = model.restore(tmp_path, stream)
    assert meta["cur_step_num"] == 6 and stream.position() == {"batches": 6}


def test_restore_fails_clearly_when_no_checkpoint_loads(tmp_path):
    (tmp_path / "a.safetensors").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="no checkpoint .* loads: a.safetensors"):
        _model().restore(tmp_path, _stream())


def test_online_restarts_keep_at_most_keep_checkpoint_max_files(tmp_path):
    for n in (4, 8, 12, 16):  # a first run and three restarts, each a little further
        _online(tmp_path, n=n, keep=2)
    files = sorted(p.name for p in tmp_path.glob("*.safetensors"))
    assert len(files) == 2, files
    meta = _model().restore(tmp_path, _stream(16))
    assert meta["cur_step_num"] == 16


def test_a_sink_exception_checkpoint_records_the_batches_trained_in_it(tmp_path):
    net = Net(fail_at=6)  # the 2nd batch of the 2nd sink of 4
    ckpt = ModelCheckpoint("x", tmp_path, CheckpointConfig(save_checkpoint_steps=100, exception_save=True))
    with pytest.raises(RuntimeError, match="bad batch"):
        _model(net).online_train(_stream(), callbacks=[ckpt], sink_size=4)
    (path,) = tmp_path.glob("*breakpoint*")
    meta = load_checkpoint(path, restore_rng=False)
    assert meta["train_position"] == {"batches": 5} and meta["cur_step_num"] == 5


def test_a_second_sigterm_during_the_final_checkpoint_does_not_kill_it(tmp_path):
    class SecondSignal(Callback):  # runs just before ModelCheckpoint's final save
        def on_train_step_end(self, ctx):
            if ctx.original_args().cur_step_num == 3:
                os.kill(os.getpid(), signal.SIGTERM)

        def on_train_end(self, ctx):
            os.kill(os.getpid(), signal.SIGTERM)  # would kill the process with the default handler

    ckpt = ModelCheckpoint("s", tmp_path, CheckpointConfig(save_checkpoint_steps=100))
    _model().online_train(_stream(), callbacks=[SecondSignal(), ckpt], sink_size=1)
    (path,) = tmp_path.glob("*.safetensors")
    assert load_checkpoint(path, restore_rng=False)["cur_step_num"] == 3
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # restored afterwards
