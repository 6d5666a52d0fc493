"""Finite streams end `online_train` cleanly, idle streams cost no CPU, and a stop is prompt.

A stream that reports its end (an exhausted `IterableStream`, a `DirectoryStream` past its
`idle_timeout`) finishes the last sink, gets its final checkpoint and `on_train_end`, and
`online_train` returns, in sink and normal mode. An empty first pass is an error that says so.
While the stream is idle the trainer sleeps (CPU time checked), and SIGTERM then stops it
within 0.5 s.
"""
import os
import signal
import threading
import time

import pytest
import torch

from recstream import RecModel
from recstream.callbacks import Callback, CheckpointConfig, ModelCheckpoint
from recstream.checkpoint import load_checkpoint
from recstream.data import Schema
from recstream.data.streams import DirectoryStream, IterableStream, KafkaStream

from ..data.streams.conftest import broker, tansu_binary, topic  # noqa: F401

SCHEMA = Schema(["x1", "x2"])


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(2, 1)

    def forward(self, features):
        return self.lin(features.dense).squeeze(1)


class Record(Callback):
    def __init__(self):
        self.ended, self.steps = False, []

    def on_train_step_end(self, ctx):
        self.steps.append(ctx.original_args().cur_step_num)

    def on_train_end(self, ctx):
        self.ended = True


def _model():
    net = Net()
    return RecModel(net, torch.nn.BCEWithLogitsLoss(), torch.optim.SGD(net.parameters(), lr=0.01),
                    progress_bar=False)


def _write_csv(directory, name, n):
    lines = "".join(f"{i % 2},{i * 0.1:.1f},1.0\n" for i in range(n))
    (directory / f".{name}.tmp").write_text(lines)
    os.rename(directory / f".{name}.tmp", directory / name)


def _checkpoint(directory):
    files = sorted(directory.glob("*.safetensors"), key=os.path.getmtime)
    assert files, "no final checkpoint"
    return load_checkpoint(files[-1], restore_rng=False)


def _batches(n):
    return [(torch.randn(4, 2), torch.randint(0, 2, (4,)).float()) for _ in range(n)]


class Linear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(2, 1)

    def forward(self, x):
        return self.lin(x).squeeze(1)


@pytest.mark.parametrize("sink", [True, False])
def test_an_exhausted_iterable_stream_ends_online_train_with_a_final_checkpoint(tmp_path, sink):
    net = Linear()
    model = RecModel(net, torch.nn.BCEWithLogitsLoss(), torch.optim.SGD(net.parameters(), lr=0.1), progress_bar=False)
    record = Record()
    stream = IterableStream(iter(_batches(10)))  # one-shot: ends for good when exhausted
    ckpt = ModelCheckpoint("online", tmp_path, CheckpointConfig(save_checkpoint_steps=1000))
    model.online_train(stream, callbacks=[record, ckpt], dataset_sink_mode=sink, sink_size=3)
    assert record.ended
    assert record.steps[-1] == 10  # sinks of 3, 3, 3, then the short last one of 1
    meta = _checkpoint(tmp_path)
    assert meta["train_position"] == {"batches": 10} and meta["cur_step_num"] == 10


@pytest.mark.parametrize("sink", [True, False])
def test_a_directory_stream_past_its_idle_timeout_ends_online_train(tmp_path, sink):
    data, ckpt_dir = tmp_path / "data", tmp_path / "ckpt"
    data.mkdir()
    _write_csv(data, "a.csv", 50)
    _write_csv(data, "b.csv", 25)
    record = Record()
    stream = DirectoryStream(data, SCHEMA, batch_size=20, idle_timeout=0.3)
    _model().online_train(stream, callbacks=[record, ModelCheckpoint("o", ckpt_dir)], dataset_sink_mode=sink,
                          sink_size=2)
    assert record.ended and record.steps[-1] == 4  # 20, 20, 20, and the remainder of 15
    position = _checkpoint(ckpt_dir)["train_position"]
    assert (position["file"], position["offset"]) == ("b.csv", (data / "b.csv").stat().st_size)  # all of it


@pytest.mark.parametrize("sink", [True, False])
def test_an_empty_first_pass_is_an_error_that_says_so(tmp_path, sink):
    stream = DirectoryStream(tmp_path, SCHEMA, batch_size=20, idle_timeout=0.2)
    with pytest.raises(ValueError, match="yielded no batch at all.*ended .*before its first batch"):
        _model().online_train(stream, dataset_sink_mode=sink)


def _run_idle_then_sigterm(model, stream, sink, idle_s=1.5):
    """online_train on `stream` (one batch, then idle); SIGTERM after `idle_s`.
    Returns (CPU seconds used while idle, seconds from the signal to the return)."""
    marks = {}

    def kill():
        marks["cpu_idle"] = time.process_time() - marks["cpu0"]
        marks["kill"] = time.monotonic()
        os.kill(os.getpid(), signal.SIGTERM)

    class Arm(Callback):
        def on_train_step_end(self, ctx):  # the one batch is trained: the stream is idle from now
            if "cpu0" not in marks:
                marks["cpu0"] = time.process_time()
                threading.Timer(idle_s, kill).start()

    model.online_train(stream, callbacks=[Arm()], dataset_sink_mode=sink, sink_size=1)
    return marks["cpu_idle"], time.monotonic() - marks["kill"]


@pytest.mark.parametrize("sink", [True, False])
def test_an_idle_directory_stream_sleeps_and_stops_within_half_a_second(tmp_path, sink):
    _write_csv(tmp_path, "a.csv", 20)
    stream = DirectoryStream(tmp_path, SCHEMA, batch_size=20)  # no idle_timeout: waits forever
    cpu, stop_s = _run_idle_then_sigterm(_model(), stream, sink)
    assert cpu < 0.5, f"{cpu:.2f} s of CPU in 1.5 s idle: a busy loop"
    assert stop_s < 0.5, f"the stop took {stop_s:.2f} s"


@pytest.mark.parametrize("sink", [True, False])
def test_an_idle_kafka_stream_sleeps_and_stops_within_half_a_second(broker, topic, sink):  # noqa: F811
    name = topic(1)
    broker.produce(name, [b"1,0.5,1.0"] * 20, partition=0)
    with KafkaStream(name, broker.bootstrap_servers, f"g-{name}", SCHEMA, batch_size=20,
                     assignment=[(name, 0)]) as stream:
        cpu, stop_s = _run_idle_then_sigterm(_model(), stream, sink)
    assert cpu < 0.5, f"{cpu:.2f} s of CPU in 1.5 s idle: a busy loop"
    assert stop_s < 0.5, f"the stop took {stop_s:.2f} s"
