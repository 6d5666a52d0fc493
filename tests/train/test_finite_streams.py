"""Finite streams end `online_train` cleanly, idle streams cost no CPU, and a stop is prompt.

A stream that reports its end (an exhausted `IterableStream`, a `DirectoryStream` past its
`idle_timeout`) finishes the last sink, gets its final checkpoint and `on_train_end`, and
`online_train` returns, in sink and normal mode. A stream with nothing new (resumed at its end,
or empty from the start) ends the run after 0 steps and changes nothing: no checkpoint, no
commit, the same position; an empty first pass of a dataset that is not a stream is still an
error that says so, online and offline. While the stream is idle the trainer sleeps (CPU time
checked), and SIGTERM then stops it within 0.5 s.
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


class Lifecycle(Record):
    def __init__(self):
        super().__init__()
        self.began = self.end_step = None

    def on_train_begin(self, ctx):
        self.began = ctx.original_args().cur_step_num

    def on_train_end(self, ctx):
        super().on_train_end(ctx)
        self.end_step = ctx.original_args().cur_step_num


def _files(directory):
    """Every file of `directory` with its size and mtime: what a run with nothing to do must not touch."""
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in directory.iterdir()}


def _directory_trainer(data, ckpt_dir, sink):
    """One life of a scheduled trainer: resume from `ckpt_dir`, train until the directory is idle."""
    stream = DirectoryStream(data, SCHEMA, batch_size=20, idle_timeout=0.2, commit_path=data.parent / "committed")
    model, record = _model(), Lifecycle()
    meta = model.restore(ckpt_dir, stream)
    resumed_at = stream.position()
    model.online_train(stream, callbacks=[record, ModelCheckpoint("o", ckpt_dir)], dataset_sink_mode=sink, sink_size=2)
    return meta, record, resumed_at, stream.position()


@pytest.mark.parametrize("sink", [True, False])
def test_a_resumed_directory_stream_with_nothing_new_ends_after_0_steps_and_changes_nothing(tmp_path, sink):
    data, ckpt_dir = tmp_path / "data", tmp_path / "ckpt"
    data.mkdir()
    _write_csv(data, "a.csv", 50)
    _, first, _, _ = _directory_trainer(data, ckpt_dir, sink)
    assert first.ended and first.end_step == 3  # 20, 20 and the remainder of 10: all of a.csv
    checkpoints, committed = _files(ckpt_dir), _files(tmp_path)["committed"]

    meta, second, resumed_at, end_at = _directory_trainer(data, ckpt_dir, sink)  # the next scheduled run
    assert meta["cur_step_num"] == 3 and resumed_at == {"file": "a.csv", "offset": (data / "a.csv").stat().st_size}
    assert second.began == 3 and second.steps == [] and second.ended and second.end_step == 3  # 0 steps
    assert _files(ckpt_dir) == checkpoints  # no new file, none rewritten or pruned
    assert _files(tmp_path)["committed"] == committed and end_at == resumed_at  # nothing committed, not moved


@pytest.mark.parametrize("sink", [True, False])
def test_a_resumed_kafka_stream_at_the_end_of_its_partition_ends_after_0_steps_without_a_commit(
        broker, topic, tmp_path, sink):  # noqa: F811
    name, ckpt_dir = topic(1), tmp_path / "ckpt"
    broker.produce(name, [b"1,0.5,1.0"] * 40, partition=0)

    def trainer():
        with KafkaStream(name, broker.bootstrap_servers, f"g-{name}", SCHEMA, batch_size=20,
                         assignment=[(name, 0)], idle_timeout=0.3) as stream:
            commits, commit = [], stream.commit
            stream.commit = lambda position: commits.append(position) or commit(position)
            model, record = _model(), Lifecycle()
            model.restore(ckpt_dir, stream)
            model.online_train(stream, callbacks=[record, ModelCheckpoint("o", ckpt_dir)], dataset_sink_mode=sink)
            return record, commits, stream.committed()

    first, commits, committed = trainer()
    assert first.end_step == 2 and commits[-1] == {f"{name}:0": 40} == committed
    checkpoints = _files(ckpt_dir)
    second, commits, committed = trainer()  # the next scheduled run: nothing new in the partition
    assert second.began == second.end_step == 2 and second.steps == [] and second.ended
    assert commits == [] and committed == {f"{name}:0": 40} and _files(ckpt_dir) == checkpoints


@pytest.mark.parametrize("sink", [True, False])
def test_an_exhausted_iterable_stream_trained_again_ends_after_0_steps(tmp_path, sink):
    stream = IterableStream(iter(_batches(5)))
    _model_on(stream, sink)
    record = Lifecycle()
    _model_on(stream, sink, record)
    assert record.began == record.end_step == 0 and record.steps == [] and record.ended
    assert stream.position() == {"batches": 5}


def _model_on(stream, sink, *callbacks):
    net = Linear()
    model = RecModel(net, torch.nn.BCEWithLogitsLoss(), torch.optim.SGD(net.parameters(), lr=0.1), progress_bar=False)
    model.online_train(stream, callbacks=list(callbacks), dataset_sink_mode=sink, sink_size=2)


@pytest.mark.parametrize("sink", [True, False])
def test_a_fresh_stream_empty_from_the_start_ends_after_0_steps_without_a_checkpoint(tmp_path, sink):
    data, ckpt_dir = tmp_path / "data", tmp_path / "ckpt"
    data.mkdir()  # no file has arrived yet, and the stream's idle_timeout passes
    stream = DirectoryStream(data, SCHEMA, batch_size=20, idle_timeout=0.2)
    record = Lifecycle()
    start = time.monotonic()
    _model().online_train(stream, callbacks=[record, ModelCheckpoint("o", ckpt_dir)], dataset_sink_mode=sink)
    assert time.monotonic() - start < 5
    assert record.began == record.end_step == 0 and record.steps == [] and record.ended
    assert list(ckpt_dir.iterdir()) == [] and stream.position() == {"file": None, "offset": 0}


@pytest.mark.parametrize("sink", [True, False])
@pytest.mark.parametrize("dataset", [[], iter([])], ids=["empty-list", "consumed-generator"])
def test_an_empty_first_pass_of_a_dataset_that_is_not_a_stream_is_an_error_that_says_so(sink, dataset):
    with pytest.raises(ValueError, match="'train_dataset' yielded no batch at all: it is empty"):
        _model().online_train(dataset, dataset_sink_mode=sink)


@pytest.mark.parametrize("make", [list, lambda: IterableStream(iter([]))], ids=["empty-list", "empty-stream"])
def test_offline_training_on_an_empty_dataset_is_still_an_error_that_says_so(make):
    # offline training wants its epochs: an empty pass is never "nothing new" there, not even a stream's
    with pytest.raises(ValueError, match="'train_dataset' yielded no batch in a pass: it is empty"):
        _model().train(2, make(), dataset_sink_mode=True, sink_size=2)


@pytest.mark.parametrize("make, mode", [
    (list, {}), (lambda: IterableStream(iter([])), {}), (list, {"dataset_sink_mode": True, "sink_size": -1}),
], ids=["empty-list", "empty-stream", "empty-list-sink-whole-pass"])
def test_offline_training_on_an_empty_dataset_fails_in_every_mode(make, mode):
    """Normal mode and whole-pass sinks used to train 0 steps in silence, which looks like a finished run."""
    with pytest.raises(ValueError, match="'train_dataset' yielded no batch at all: it is empty"):
        _model().train(2, make(), **mode)


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
    # The idle timeout is only a backstop, far past the SIGTERM at 1.5 s: a signal that never stops
    # the run fails the test at 60 s instead of hanging the suite (seen once on a loaded machine).
    stream = DirectoryStream(tmp_path, SCHEMA, batch_size=20, idle_timeout=60)
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
