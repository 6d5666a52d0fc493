"""RecModel.online_train: endless epochs, clean stops, positions of trained batches, restore."""
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from recstream import RecModel
from recstream.callbacks import CheckpointConfig, ModelCheckpoint, load_checkpoint

from .helpers import Recorder
from .streams import CountingStream, SeenNet, batch

REPO = Path(__file__).resolve().parents[2]


def _model(net=None):
    net = net or SeenNet()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    return net, RecModel(net, torch.nn.CrossEntropyLoss(), optimizer, progress_bar=False)


def test_sink_epochs_never_run_out_and_hooks_once_per_sink():
    net, model = _model()
    rec = Recorder(stop_at=("step_end", 7, 21))
    model.online_train([batch(i) for i in range(4)], callbacks=[rec], sink_size=3)
    assert [c[2] for c in rec.calls if c[0] == "step_end"] == [3 * k for k in range(1, 8)]
    assert rec.params.batch_num == 3 and rec.params.epoch_num is None
    assert net.seen[:4].tolist() == [6, 5, 5, 5]  # 21 batches cycling over 4
    assert rec.calls[-1][0] == "train_end"


def test_online_runs_keep_no_history_that_grows_with_every_sink(monkeypatch):
    """online_train returns nothing: a default History would only hold one record per sink, forever."""
    from recstream.callbacks import History

    recorded = []
    monkeypatch.setattr(History, "on_train_epoch_end", lambda self, ctx: recorded.append(self))
    _, model = _model()
    model.online_train([batch(i) for i in range(4)], callbacks=[Recorder(stop_at=("step_end", 5, 5))], sink_size=1)
    assert recorded == []
    model.train(1, [batch(i) for i in range(4)])  # offline runs still get theirs
    assert len(recorded) == 1


def test_non_sink_epoch_is_one_pass_then_reset():
    class Resettable(list):
        resets = 0

        def reset(self):
            Resettable.resets += 1

    _, model = _model()
    rec = Recorder(stop_at=("step_end", 3, 6))
    model.online_train(Resettable(batch(i) for i in range(2)), callbacks=[rec], dataset_sink_mode=False)
    assert [c[1] for c in rec.calls if c[0] == "epoch_begin"] == [1, 2, 3]
    assert Resettable.resets == 3 and rec.params.train_dataset_element is not None


@pytest.mark.parametrize("sink_size,exc", [(0, ValueError), (-1, ValueError), (1.5, TypeError), (True, TypeError)])
def test_sink_size_must_be_positive(sink_size, exc):
    _, model = _model()
    with pytest.raises(exc, match="'sink_size'"):
        model.online_train([batch(0)], sink_size=sink_size)


@pytest.mark.parametrize("sink_mode", [True, False])
def test_checkpoint_records_the_trained_position_not_the_prefetched_one(tmp_path, sink_mode):
    net, model = _model()
    stream = CountingStream()
    ckpt = ModelCheckpoint("online", str(tmp_path), CheckpointConfig(save_checkpoint_steps=1000))
    stop = Recorder(stop_at=("step_end", 5 if sink_mode else 1, 5))  # non-sink: one endless epoch
    model.online_train(stream, callbacks=[stop, ckpt],
                       dataset_sink_mode=sink_mode, sink_size=1)
    meta = load_checkpoint(ckpt.latest_ckpt_file_name, SeenNet())
    assert meta["train_position"] == {"next": 5}
    assert net.seen[:8].tolist() == [1, 1, 1, 1, 1, 0, 0, 0]
    assert stream.commits == [{"next": 5}]  # committed once, after the final save
    if sink_mode:
        assert stream.next > 5  # the channel had prefetched beyond what was trained


def test_restore_seeks_and_continues_exactly_once(tmp_path):
    net1, model1 = _model()
    stream = CountingStream()
    model1.online_train(stream, callbacks=[Recorder(stop_at=("step_end", 4, 4)),
                                           ModelCheckpoint("online", str(tmp_path))], sink_size=1)
    net2, model2 = _model()
    stream2 = CountingStream()
    meta = model2.restore(tmp_path, stream2)
    assert meta["train_position"] == {"next": 4} and stream2.next == 4
    rec = Recorder(stop_at=("step_end", 7, 7))
    model2.online_train(stream2, callbacks=[rec, ModelCheckpoint("online", str(tmp_path))], sink_size=1)
    assert [c[2] for c in rec.calls if c[0] == "step_end"] == [5, 6, 7]  # numbering continues
    assert net2.seen[:9].tolist() == [1] * 7 + [0, 0]  # restored counts + the rest, each once


def test_stop_request_interrupts_a_wait_for_data():
    """The source goes idle after 3 batches; a stop requested meanwhile ends the run promptly."""
    import threading

    from recstream.callbacks import Callback

    class StopLater(Callback):
        def on_train_begin(self, ctx):
            threading.Timer(1.0, ctx.request_stop).start()

    _, model = _model()
    rec = Recorder()
    start = time.monotonic()
    model.online_train(CountingStream(idle_after=3), callbacks=[rec, StopLater()], sink_size=1)
    assert time.monotonic() - start < 10
    assert [c[2] for c in rec.calls if c[0] == "step_end"] == [1, 2, 3]
    assert rec.calls[-1][0] == "train_end"


WORKER = textwrap.dedent("""
    import sys, torch
    sys.path.insert(0, {tests!r})
    from recstream import RecModel
    from recstream.callbacks import Callback, ModelCheckpoint, CheckpointConfig
    from train.streams import CountingStream, SeenNet

    class Progress(Callback):
        def on_train_step_end(self, ctx):
            print("step", ctx.original_args().cur_step_num, flush=True)
        def on_train_end(self, ctx):
            print("train_end", ctx.original_args().cur_step_num, flush=True)

    net = SeenNet(100000)
    model = RecModel(net, torch.nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), lr=0.01), progress_bar=False)
    model.online_train(CountingStream(), callbacks=[Progress(), ModelCheckpoint("w", {ckpt!r},
                       CheckpointConfig(save_checkpoint_steps=10**9))], sink_size=1)
    print("returned", flush=True)
""")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_cleanly_with_a_final_checkpoint(tmp_path, signum):
    script = tmp_path / "worker.py"
    script.write_text(WORKER.format(tests=str(REPO / "tests"), ckpt=str(tmp_path / "ckpt")))
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    lines = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        lines.append(line.strip())
        if line.startswith("step 20"):
            break
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=60)
    lines += out.splitlines()
    assert proc.returncode == 0, err
    end = next(line for line in lines if line.startswith("train_end"))
    assert lines[-1] == "returned"
    steps = int(end.split()[1])
    files = list((tmp_path / "ckpt").glob("*.safetensors"))
    assert len(files) == 1
    meta = load_checkpoint(files[0], SeenNet(100000))
    assert meta["cur_step_num"] == steps and meta["train_position"] == {"next": steps}


def test_max_event_time_tracks_the_newest_trained_event():
    class Timed(CountingStream):
        def last_batch_meta(self):
            return {"ids": None, "event_time": torch.tensor([100.0 + self.next, 50.0])}

    seen = []
    rec = Recorder(stop_at=("step_end", 3, 3))
    rec.on_train_step_end = lambda ctx: (seen.append(ctx.original_args().max_event_time),
                                         Recorder.on_train_step_end(rec, ctx))
    _model()[1].online_train(Timed(), callbacks=[rec], sink_size=1)
    assert seen == [101.0, 102.0, 103.0]


def test_bad_record_counts_reach_cb_params_and_the_log(caplog):
    from collections import Counter

    class Dirty(CountingStream):
        def __init__(self):
            super().__init__()
            self.bad_records = Counter()

        def last_batch_meta(self):
            self.bad_records["unparsable"] += 2  # the stream skipped two records around this batch
            return {"ids": None, "event_time": None}

    counts = []
    rec = Recorder(stop_at=("step_end", 3, 3))
    rec.on_train_step_end = lambda ctx: (counts.append(dict(ctx.original_args().bad_records)),
                                         Recorder.on_train_step_end(rec, ctx))
    with caplog.at_level("WARNING", logger="recstream.train"):
        _model()[1].online_train(Dirty(), callbacks=[rec], sink_size=1)
    assert counts[-1]["unparsable"] >= 6 and all(c["unparsable"] >= 2 for c in counts)
    assert any("malformed records skipped" in r.message for r in caplog.records)


def test_the_missing_checkpoint_warning_only_where_it_matters(tmp_path):
    import warnings

    from recstream.data import Schema
    from recstream.data.streams import DirectoryStream, IterableStream

    net = torch.nn.Linear(1, 1)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = net

        def forward(self, features):
            return self.lin(features.dense).squeeze(1)

    model = RecModel(Net(), torch.nn.BCEWithLogitsLoss(), torch.optim.SGD(net.parameters(), lr=0.1),
                     progress_bar=False)
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.csv").write_text("1,0.5\n0,-0.5\n")
    schema = Schema(["x"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        batches = list(DirectoryStream(tmp_path / "in", schema, batch_size=2, format="csv", idle_timeout=0.2))
        model.online_train(IterableStream(lambda: iter(batches)), dataset_sink_mode=False)  # nothing to commit
        assert not [w for w in caught if "ModelCheckpoint" in str(w.message)]
        stream = DirectoryStream(tmp_path / "in", schema, batch_size=2, format="csv", idle_timeout=0.2,
                                 commit_path=tmp_path / "committed.json")
        model.online_train(stream, dataset_sink_mode=False)
    assert [w for w in caught if "committing stream" in str(w.message)]
