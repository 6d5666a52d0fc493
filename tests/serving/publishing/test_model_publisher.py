"""ModelPublisher as a callback: schedules, end-of-training publish, event times, failures, arguments."""
import logging

import pytest
import torch

from recstream import Model
from recstream.data import SyntheticCTR
from recstream.models import DeepFM, default_optimizer
from recstream.serving import ModelPublisher, list_versions, load_latest, read_latest, read_manifest
from recstream.serving.publishing import model_publisher as publisher_module


def test_trains_and_publishes_every_n_steps_with_model_train(tmp_path):
    gen = SyntheticCTR(num_dense=2, num_categorical=3, vocab_sizes=[10, 20, 30], batch_size=32)
    net = DeepFM(gen.schema, hidden=(8,), embedding_dim=4)
    # In the training thread: the exact schedule is what this checks. (A background write still in
    # flight when the next version falls due moves that version to a later step -- seen on a loaded
    # CI box: [3, 8, 10]; the background path has tests of its own.)
    pub = ModelPublisher(tmp_path, every_steps=3, keep=10, model_config={"hidden": [8], "embedding_dim": 4},
                         background=False)
    model = Model(net, torch.nn.BCEWithLogitsLoss(), default_optimizer(net), progress_bar=False)
    model.train(1, gen.train_batches(10), callbacks=[pub])
    assert [m["step"] for m in pub.manifests] == [3, 6, 9, 10]  # and once more at the end
    assert [m["kind"] for m in pub.manifests] == ["full"] * 4  # no HashEmbedding: deltas would be full anyway
    assert list_versions(tmp_path) == [1, 2, 3, 4] and read_latest(tmp_path) == 4
    served, manifest = load_latest(tmp_path)
    assert manifest["version"] == 4 and manifest["epoch"] == 1
    batch = next(iter(gen.train_batches(1)))
    net.eval()
    with torch.no_grad():
        assert torch.equal(served(batch.features), net(batch.features))


def drive(pub, steps, on_step=None, network=None):
    from recstream.callbacks.base import CallbackList, CallbackParams, RunContext
    p = CallbackParams(network=network or torch.nn.Linear(2, 1), cur_step_num=0, cur_epoch_num=1)
    ctx = RunContext(p)
    with CallbackList([pub]) as cbs:
        cbs.on_train_begin(ctx)
        for _ in range(steps):
            p.cur_step_num += 1
            if on_step:
                on_step(p)
            cbs.on_train_step_end(ctx)
        cbs.on_train_end(ctx)
    return p


def test_every_seconds_uses_the_clock(tmp_path, monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(publisher_module.time, "monotonic", lambda: clock[0])
    pub = ModelPublisher(tmp_path, every_seconds=10, model_factory="torch.nn:Linear", verify_rebuild=False,
                         publish_on_end=False, background=False)  # the schedule, step by step

    def tick(p):
        clock[0] += 4.0  # steps at t=4, 8, 12, 16, 20, 24: due at 12 and 24

    p = drive(pub, 6, tick)
    assert [m["step"] for m in pub.manifests] == [3, 6]
    assert p.published_manifest["version"] == 2


def test_no_publish_at_end_when_nothing_new(tmp_path):
    pub = ModelPublisher(tmp_path, every_steps=2, model_factory="torch.nn:Linear", verify_rebuild=False)
    drive(pub, 4)
    assert [m["step"] for m in pub.manifests] == [2, 4]
    pub2 = ModelPublisher(tmp_path / "b", model_factory="torch.nn:Linear", verify_rebuild=False)
    drive(pub2, 3)  # no schedule: one version at the end of training
    assert [m["step"] for m in pub2.manifests] == [3]


def test_new_run_starts_with_a_full_version_after_the_existing_ones(tmp_path):
    from recstream.nn import HashEmbedding
    net = torch.nn.ModuleDict({"emb": HashEmbedding(2, capacity=8)})
    net["emb"](torch.tensor([1, 2]))
    kw = dict(every_steps=1, model_factory="torch.nn:Linear", verify_rebuild=False)
    drive(ModelPublisher(tmp_path, **kw), 2, network=net)
    pub = ModelPublisher(tmp_path, **kw)
    drive(pub, 2, network=net)
    assert [(m["version"], m["kind"]) for m in pub.manifests] == [(3, "full"), (4, "delta")]


def test_stale_temp_dirs_removed_on_train_begin(tmp_path):
    (tmp_path / ".tmp-v00000001-0000abcd").mkdir()
    drive(ModelPublisher(tmp_path, model_factory="torch.nn:Linear", verify_rebuild=False), 1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["LATEST", "v00000001"]


def test_unusable_directory_fails_at_train_begin(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(OSError):
        drive(ModelPublisher(blocker, every_steps=1, model_factory="torch.nn:Linear", verify_rebuild=False), 1)


def test_failure_is_logged_training_goes_on_and_next_version_is_full(tmp_path, monkeypatch, caplog):
    from recstream.nn import HashEmbedding
    net = torch.nn.ModuleDict({"emb": HashEmbedding(2, capacity=8)})
    pub = ModelPublisher(tmp_path, every_steps=1, model_factory="torch.nn:Linear", verify_rebuild=False,
                         background=False)
    real = publisher_module.SnapshotWriter.write
    calls = []

    def flaky(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(publisher_module.SnapshotWriter, "write", flaky)
    with caplog.at_level(logging.ERROR, logger="recstream.serving.publishing.model_publisher"):
        drive(pub, 5, lambda p: net["emb"](torch.tensor([p.cur_step_num])), network=net)
    assert pub.failures == 1 and "publishing to" in caplog.text and "No space" in caplog.text
    assert [(m["step"], m["kind"]) for m in pub.manifests] == [(1, "full"), (2, "delta"), (4, "full"), (5, "delta")]


def test_failure_raises_when_asked(tmp_path, monkeypatch):
    pub = ModelPublisher(tmp_path, every_steps=1, model_factory="torch.nn:Linear", verify_rebuild=False,
                         on_error="raise", background=False)

    def boom(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pub.writer, "write", boom)
    with pytest.raises(OSError, match="No space"):
        drive(pub, 1)
    assert pub.failures == 1


def test_bad_event_time_is_a_clear_error(tmp_path):
    pub = ModelPublisher(tmp_path, every_steps=5, model_factory="torch.nn:Linear", verify_rebuild=False)
    with pytest.raises(ValueError, match="max_event_time must be finite unix seconds"):
        drive(pub, 1, lambda p: setattr(p, "max_event_time", "yesterday"))


@pytest.mark.parametrize("kwargs,match", [
    (dict(every_steps=0), "every_steps"), (dict(every_seconds=-1), "every_seconds"),
    (dict(every_steps=True), "every_steps"), (dict(keep=0), "keep"), (dict(full_every=0), "full_every"),
    (dict(output="odds"), "output"), (dict(on_error="ignore"), "on_error"),
    (dict(preprocessing={"scale": 2}), "unknown option"), (dict(schema="s"), "Schema"),
])
def test_argument_errors(tmp_path, kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        ModelPublisher(tmp_path, **kwargs)


def test_manifest_records_preprocessing_and_output(tmp_path):
    pub = ModelPublisher(tmp_path, model_factory="torch.nn:Linear", verify_rebuild=False, output="probabilities",
                         preprocessing={"log1p_dense": True, "fill_missing_dense": 0.0})
    drive(pub, 1)
    m = read_manifest(tmp_path, 1)
    assert m["model"]["output"] == "probabilities"
    assert m["preprocessing"] == {"log1p_dense": True, "fill_missing_dense": 0.0}


def test_background_writes_do_not_block_the_step_and_report_at_a_later_one(tmp_path, monkeypatch, caplog):
    """A slow disk: the step that takes a version returns at once; versions falling due meanwhile are
    taken after the write finished; a failed write is reported (and the next version full) later."""
    import threading
    import time

    pub = ModelPublisher(tmp_path, every_steps=1, model_factory="torch.nn:Linear", verify_rebuild=False,
                         publish_on_end=True)
    release, calls = threading.Event(), []
    real = publisher_module.SnapshotWriter.write

    def slow(self, prepared):
        calls.append(prepared.manifest["step"])
        assert release.wait(10)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real(self, prepared)

    monkeypatch.setattr(publisher_module.SnapshotWriter, "write", slow)
    net = torch.nn.Linear(2, 1)
    initial = net.weight.detach().clone()
    step_times = []

    def on_step(p):
        if p.cur_step_num == 3:
            release.set()  # the disk catches up
            time.sleep(0.2)
        with torch.no_grad():
            net.weight.add_(1.0)  # training goes on while the first version is written

    def timed_step(p):
        start = time.perf_counter()
        on_step(p)
        step_times.append(time.perf_counter() - start)

    with caplog.at_level(logging.ERROR, logger="recstream.serving.publishing.model_publisher"):
        drive(pub, 5, timed_step, network=net)
    # step 1 took a version (its write waited for the disk); steps 2-3 did not wait for it
    assert calls[0] == 1 and max(step_times[:2]) < 1.0
    assert pub.failures == 1 and "No space" in caplog.text
    steps = [m["step"] for m in pub.manifests]
    assert steps[0] == 1 and steps[-1] == 5  # the end of training waited and wrote a last version
    from safetensors.torch import load_file

    from recstream.serving.snapshot.layout import MODEL_FILE, version_path
    version_1 = load_file(f"{version_path(tmp_path, 1)}/{MODEL_FILE}")
    # taken at step 1 (weights + 1 by then), written while training went on: it holds step 1's weights
    torch.testing.assert_close(version_1["weight"], initial + 1.0)
    assert read_manifest(tmp_path, read_latest(tmp_path))["step"] == 5


# --- divergence guard (issue 27, item 2): a non-finite model is never published ----------------
def _nan_in_state(net):
    """A non-finite value the forward pass does not read: the loss stays finite, the state does not."""
    net.register_buffer("stale", torch.tensor([0.0, float("inf")]))
    return net


@pytest.mark.parametrize("background", [False, True])
def test_a_model_with_non_finite_weights_is_never_published_whatever_on_error(tmp_path, background):
    from recstream.callbacks import DivergenceError
    gen = SyntheticCTR(num_dense=2, num_categorical=3, vocab_sizes=[10, 20, 30], batch_size=32)
    net = _nan_in_state(DeepFM(gen.schema, hidden=(8,), embedding_dim=4))
    pub = ModelPublisher(tmp_path, every_steps=2, model_config={"hidden": [8], "embedding_dim": 4},
                         on_error="log", background=background, verify_rebuild=False)
    model = Model(net, torch.nn.BCEWithLogitsLoss(), default_optimizer(net), progress_bar=False)
    with pytest.raises(DivergenceError, match=r"'model.safetensors:stale'.*refusing to write version 1"):
        model.train(1, gen.train_batches(6), callbacks=[pub])
    assert list_versions(tmp_path) == [] and pub.manifests == []


def test_a_diverged_loss_publishes_nothing(tmp_path):
    from recstream.callbacks import DivergenceError
    gen = SyntheticCTR(num_dense=2, num_categorical=3, vocab_sizes=[10, 20, 30], batch_size=32)
    net = DeepFM(gen.schema, hidden=(8,), embedding_dim=4)
    pub = ModelPublisher(tmp_path, every_steps=1, model_config={"hidden": [8], "embedding_dim": 4}, background=False)
    model = Model(net, torch.nn.BCEWithLogitsLoss(), torch.optim.SGD(net.parameters(), lr=3e38), progress_bar=False)
    with pytest.raises(DivergenceError, match="the loss became non-finite"):
        model.train(1, gen.train_batches(6), callbacks=[pub])
    from safetensors.torch import load_file
    written = [load_file(f) for f in tmp_path.rglob("*.safetensors")]  # versions before the first bad loss
    assert all(torch.isfinite(t).all() for tensors in written for t in tensors.values() if t.is_floating_point())


def test_publish_version_refuses_a_non_finite_network(tmp_path):
    from recstream.callbacks import DivergenceError
    from recstream.data import CategoricalFeature, Schema
    from recstream.models import WideDeep
    from recstream.serving import publish_version
    net = WideDeep(Schema(["x"], [CategoricalFeature("c", vocab_size=5)]), hidden=(4,))
    with torch.no_grad():
        next(net.parameters()).fill_(float("nan"))
    with pytest.raises(DivergenceError, match="non-finite"):
        publish_version(tmp_path, net, model_config={"hidden": [4]})
    assert list_versions(tmp_path) == []


def test_each_manifest_says_when_it_was_taken_and_which_checkpoint_it_is_past(tmp_path):
    """Publishing runs on its own cadence, fresher than the checkpoints: a manifest's checkpoint_step
    is the newest durable, committed checkpoint when it was taken (``step`` above it: training a
    restart redoes), and ``taken`` when its weights were copied (``created - taken``: the write)."""
    import time
    pub = ModelPublisher(tmp_path, every_steps=2, model_factory="torch.nn:Linear", verify_rebuild=False,
                         background=False)

    def checkpoint_every_3(p):
        if p.cur_step_num % 3 == 0:  # what ModelCheckpoint records once its file is durable
            p.run_state.checkpoint_step = p.cur_step_num

    before = time.time()
    drive(pub, 5, checkpoint_every_3)
    assert [(m["step"], m["checkpoint_step"]) for m in pub.manifests] == [(2, None), (4, 3), (5, 3)]
    assert all(before <= m["taken"] <= m["created"] for m in pub.manifests)
    assert read_manifest(tmp_path, 2)["checkpoint_step"] == 3
