"""OnlineCommitter: position -> durable checkpoint -> commit -> publish, whatever the order of the callbacks."""
import os

import pytest
import torch

from recstream import Model, RecModel
from recstream.callbacks import (
    Callback,
    CallbackList,
    CallbackParams,
    CheckpointConfig,
    ModelCheckpoint,
    Publisher,
    RunContext,
    load_checkpoint,
)
from recstream.callbacks.run_state import RunState
from recstream.serving import ModelPublisher
from recstream.train.committer import OnlineCommitter

from .helpers import Recorder
from .streams import CountingStream, SeenNet, batch


def _saved_position(path):
    return load_checkpoint(path, SeenNet())["train_position"]


class CommitsSeen(Callback):
    """At each step end, what the source had been told by then (a callback cannot see a commit
    of this step's checkpoint: it follows every callback)."""

    def __init__(self, stream):
        self.stream, self.seen = stream, []

    def on_train_step_end(self, ctx):
        self.seen.append((ctx.run_state.step, len(self.stream.commits)))


def _drive(committer, params, steps):
    ctx = RunContext(params)
    committer.on_train_begin(ctx)
    for step in range(1, steps + 1):
        params.run_state.step, params.run_state.position = step, {"next": step}
        committer.on_train_step_end(ctx)
    committer.on_train_end(ctx)


def test_only_positions_of_durable_checkpoints_are_committed_once_each(tmp_path):
    stream, net = CountingStream(), SeenNet()
    ckpt = ModelCheckpoint("c", tmp_path, CheckpointConfig(save_checkpoint_steps=2))
    params = CallbackParams.view(RunState(epoch=1, step=0, batch_num=None), network=net, train_dataset=stream)
    with CallbackList([ckpt]) as cbs:
        _drive(OnlineCommitter(cbs, stream), params, 5)
    # saves at steps 2 and 4 (periodic) and 5 (final): each committed once, after it was written
    assert stream.commits == [{"next": 2}, {"next": 4}, {"next": 5}]
    assert params.last_save_ckpt_step == 5 and params.run_state.checkpoint_position == {"next": 5}


def test_a_checkpoint_that_fails_to_write_commits_nothing(tmp_path):
    stream, net = CountingStream(), SeenNet()
    ckpt = ModelCheckpoint("c", tmp_path, CheckpointConfig(save_checkpoint_steps=1))
    params = CallbackParams.view(RunState(epoch=1, step=0), network=net, train_dataset=stream)
    (tmp_path / "c-1_1.safetensors").mkdir()  # the file's name is taken by a directory: the write fails
    with CallbackList([ckpt]) as cbs:
        committer = OnlineCommitter(cbs, stream)
        params.run_state.step, params.run_state.position = 1, {"next": 1}
        with pytest.raises(OSError, match="could not write checkpoint"):
            committer.on_train_step_end(RunContext(params))
    assert stream.commits == []


@pytest.mark.parametrize("checkpoint_first", [True, False])
def test_the_commit_follows_every_callback_in_either_order(tmp_path, checkpoint_first):
    stream = CountingStream()
    net = SeenNet()
    model = RecModel(net, torch.nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), lr=0.1),
                     progress_bar=False)
    ckpt = ModelCheckpoint("online", tmp_path, CheckpointConfig(save_checkpoint_steps=1))
    seen = CommitsSeen(stream)
    stop = Recorder(stop_at=("step_end", 3, 3))  # sink mode: an epoch per sink
    callbacks = [ckpt, seen, stop] if checkpoint_first else [seen, stop, ckpt]
    model.online_train(stream, callbacks=callbacks, sink_size=1)
    # at step s the callbacks see the commits of steps before s, never this step's: commit is step 3
    assert seen.seen == [(1, 0), (2, 1), (3, 2)]
    assert stream.commits == [{"next": 1}, {"next": 2}, {"next": 3}]
    assert _saved_position(ckpt.latest_ckpt_file_name) == {"next": 3}


def test_offline_training_on_a_committable_source_commits_through_the_committer(tmp_path):
    class FiniteCounting(CountingStream):
        def __len__(self):
            return 4

        def reset(self):
            self.next = 0

    stream = FiniteCounting(limit=4)
    net = SeenNet()
    model = Model(net, torch.nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), lr=0.1), progress_bar=False)
    model.train(1, stream, callbacks=[ModelCheckpoint("off", tmp_path, CheckpointConfig(save_checkpoint_steps=2))])
    assert stream.commits == [{"next": 2}, {"next": 4}]


def test_a_run_without_checkpoints_commits_nothing():
    stream = CountingStream()
    net = SeenNet()
    model = RecModel(net, torch.nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), lr=0.1),
                     progress_bar=False)
    model.online_train(stream, callbacks=[Recorder(stop_at=("step_end", 4, 4))], sink_size=1)
    assert stream.commits == []


# --- 5. publish: after the step's durable checkpoint and its commit (issue 23, item 1) -----------
class OrderedPublisher(ModelPublisher):
    """A real ModelPublisher that notes, as it publishes, what was durable and committed by then."""

    def __init__(self, directory, stream, **kwargs):
        super().__init__(directory, model_factory="torch.nn:Linear", verify_rebuild=False, background=False,
                         **kwargs)
        self.stream, self.seen = stream, []

    def publish(self, cb_params, background=False):
        state = cb_params.run_state
        ckpt = cb_params.latest_ckpt_file
        durable = ckpt is not None and os.path.exists(ckpt)
        self.seen.append((state.step, state.checkpoint_step, durable, len(self.stream.commits)))
        return super().publish(cb_params, background)


@pytest.mark.parametrize("publisher_first", [True, False])
def test_publishing_follows_the_durable_checkpoint_and_its_commit_in_either_order(tmp_path, publisher_first):
    stream, net = CountingStream(), SeenNet()
    model = RecModel(net, torch.nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), lr=0.1),
                     progress_bar=False)
    ckpt = ModelCheckpoint("online", tmp_path / "ckpt", CheckpointConfig(save_checkpoint_steps=1))
    pub = OrderedPublisher(tmp_path / "pub", stream, every_steps=1)
    stop = Recorder(stop_at=("step_end", 3, 3))  # sink mode: an epoch per sink
    callbacks = [pub, stop, ckpt] if publisher_first else [ckpt, stop, pub]
    model.online_train(stream, callbacks=callbacks, sink_size=1)
    # at step s the publisher sees step s's checkpoint on disk, and its position committed
    assert pub.seen == [(1, 1, True, 1), (2, 2, True, 2), (3, 3, True, 3)]
    assert [m["step"] for m in pub.manifests] == [1, 2, 3]


@pytest.mark.parametrize("publisher_first", [True, False])
def test_the_last_version_follows_the_final_checkpoint_and_its_commit(tmp_path, publisher_first):
    stream, net = CountingStream(), SeenNet()
    model = RecModel(net, torch.nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), lr=0.1),
                     progress_bar=False)
    # no periodic checkpoint or version: the run's end writes both, the checkpoint first
    ckpt = ModelCheckpoint("online", tmp_path / "ckpt", CheckpointConfig(save_checkpoint_steps=100))
    pub = OrderedPublisher(tmp_path / "pub", stream, every_steps=100)
    stop = Recorder(stop_at=("step_end", 4, 4))
    callbacks = [pub, stop, ckpt] if publisher_first else [ckpt, stop, pub]
    model.online_train(stream, callbacks=callbacks, sink_size=1)
    assert pub.seen == [(4, 4, True, 1)] and stream.commits == [{"next": 4}]
    assert [m["step"] for m in pub.manifests] == [4]


def test_offline_training_publishes_after_the_checkpoint_without_a_source(tmp_path):
    """A plain offline run (nothing to commit to) goes through the same phases: publishing last."""
    net = SeenNet()
    model = Model(net, torch.nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), lr=0.1), progress_bar=False)
    ckpt = ModelCheckpoint("off", tmp_path / "ckpt", CheckpointConfig(save_checkpoint_steps=2))
    stream = CountingStream()  # only to count commits: the dataset below takes none
    pub = OrderedPublisher(tmp_path / "pub", stream, every_steps=2)
    model.train(1, [batch(i) for i in range(4)], callbacks=[pub, ckpt])
    assert pub.seen == [(2, 2, True, 0), (4, 4, True, 0)]  # the end: nothing new since step 4


class Events(list):
    """One log of what happened, in order: the checkpoint, the commit, the publish."""

    def commit(self, position):  # the source
        self.append(("commit", position["next"]))


class Save(Callback):
    def __init__(self, events):
        self.events = events

    def on_train_step_end(self, ctx):
        state = ctx.run_state
        state.checkpoint_step, state.checkpoint_position = state.step, state.position
        self.events.append(("checkpoint", state.step))

    def on_train_end(self, ctx):
        self.events.append(("final checkpoint", ctx.run_state.step))


class Announce(Publisher):
    def __init__(self, events):
        self.events = events

    def after_step_commit(self, ctx):
        self.events.append(("publish", ctx.run_state.checkpoint_step))

    def after_train_commit(self, ctx):
        self.events.append(("last version", ctx.run_state.step))


@pytest.mark.parametrize("nested", [False, True])
def test_the_committer_runs_each_publisher_once_after_the_commit(nested):
    events = Events()
    inner = [Announce(events), Save(events)]
    members = [CallbackList(inner)] if nested else inner  # a list inside the list: deferred as well
    committer = OnlineCommitter(CallbackList(members), events)
    _drive(committer, CallbackParams.view(RunState(epoch=1, step=0)), 2)
    assert events == [("checkpoint", 1), ("commit", 1), ("publish", 1),
                      ("checkpoint", 2), ("commit", 2), ("publish", 2),
                      ("final checkpoint", 2), ("last version", 2)]


def test_without_a_committer_a_list_runs_its_publishers_after_its_other_callbacks():
    events = Events()
    cbs = CallbackList([Announce(events), Save(events)])
    ctx = RunContext(CallbackParams.view(RunState(epoch=1, step=1, position={"next": 1})))
    cbs.on_train_step_end(ctx)
    cbs.on_train_end(ctx)
    assert events == [("checkpoint", 1), ("publish", 1), ("final checkpoint", 1), ("last version", 1)]
    events.clear()
    cbs.step_end(ctx)  # a legacy call reaches the publisher too (in list order, as legacy calls go)
    assert events == [("publish", 1), ("checkpoint", 1)]
