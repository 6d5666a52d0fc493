"""Freshness: lag from an event to the first published/served version that trained on it."""
import math

import numpy as np
import pytest
import torch

from recstream.callbacks.base import CallbackList, CallbackParams, RunContext
from recstream.serving import ModelPublisher, event_freshness, read_manifest, staleness

MANIFESTS = [
    {"version": 1, "step": 10, "max_event_time": 100.0, "created": 110.0},
    {"version": 2, "step": 20, "max_event_time": 200.0, "created": 230.0},
    {"version": 3, "step": 30, "max_event_time": None, "created": 330.0},  # trainer gave no event time
]


def test_by_event_time():
    r = event_freshness(MANIFESTS, [50.0, 100.0, 100.5, 199.0, 250.0])
    assert r.versions.tolist() == [1, 1, 2, 2, 0]
    assert r.lags[:4].tolist() == [60.0, 10.0, 129.5, 31.0] and math.isnan(r.lags[4])
    s = r.summary(quantiles=(0.5,))
    assert s == {"events": 5, "covered": 4, "mean": pytest.approx(57.625), "max": 129.5, "p50": pytest.approx(45.5)}


def test_by_training_step_handles_late_events_and_serve_times():
    # The event at t=90 arrived late and was trained at step 15: it is only in version 2.
    r = event_freshness(MANIFESTS, [90.0, 95.0, 150.0], steps=[15, 5, 25], served_at={2: 240.0, 3: 331.0})
    assert r.versions.tolist() == [2, 1, 3]
    assert r.lags.tolist() == [150.0, 15.0, 181.0]


def test_running_max_and_validation():
    # A version whose max_event_time went backwards still contains what older versions did.
    ms = [{"version": 1, "max_event_time": 100.0, "created": 101.0},
          {"version": 2, "max_event_time": 90.0, "created": 102.0}]
    assert event_freshness(ms, [95.0]).versions.tolist() == [1]
    with pytest.raises(ValueError, match="'steps' has 1 entries"):
        event_freshness(ms, [1.0, 2.0], steps=[1])
    with pytest.raises(ValueError, match="finite"):
        event_freshness([{"version": 1, "max_event_time": float("nan"), "created": 1.0}], [1.0])
    assert event_freshness([], [1.0]).summary()["covered"] == 0
    assert staleness(MANIFESTS[1], now=260.0) == 60.0 and staleness(MANIFESTS[2]) is None


def test_publisher_records_running_max_event_time(tmp_path):
    """End to end: trainer-supplied cb_params.max_event_time -> manifests -> freshness."""
    net = torch.nn.Linear(2, 1)
    pub = ModelPublisher(tmp_path, every_steps=2, model_factory="torch.nn:Linear", verify_rebuild=False,
                         background=False)  # versions exactly at the due steps
    p = CallbackParams(network=net, cur_step_num=0, cur_epoch_num=1)
    ctx = RunContext(p)
    event_times = [1000.0, 1003.0, 1001.0, 1007.0, 1002.0]  # out of order; running max per step
    with CallbackList([pub]) as cbs:
        cbs.on_train_begin(ctx)
        for t in event_times:
            p.cur_step_num += 1
            p.max_event_time = np.float64(t) if t > 1005 else torch.tensor(t)
            cbs.on_train_step_begin(ctx)
            cbs.on_train_step_end(ctx)
        cbs.on_train_end(ctx)
    recorded = [(m["step"], m["max_event_time"]) for m in pub.manifests]
    assert recorded == [(2, 1003.0), (4, 1007.0), (5, 1007.0)]
    assert read_manifest(tmp_path, 2)["max_event_time"] == 1007.0
    r = event_freshness(pub.manifests, event_times, steps=[1, 2, 3, 4, 5])
    assert r.versions.tolist() == [1, 1, 2, 2, 3]
    created = {m["version"]: m["created"] for m in pub.manifests}
    assert r.lags.tolist() == [created[v] - t for v, t in zip(r.versions.tolist(), event_times, strict=True)]


def test_the_server_swaps_each_delta_in_from_the_served_rows(tmp_path):
    """`recstream serve`'s holder along a chain of deltas: each swap reads only the new version (the
    older row files are gone here), the network equals a load from the base, and ``/version`` says
    how long the load took, when the version was taken and which checkpoint it is past."""
    import os

    import numpy as np

    from recstream.serving import SnapshotWriter, load_version
    from recstream.serving.server.model_holder import ModelHolder

    from ..helpers import CONFIG, SCHEMA, build, make_batch, new_model, train_step
    net, opt = new_model(capacity=40, evict_filter_value=2)
    writer = SnapshotWriter(tmp_path, SCHEMA, model_factory=build, full_every=50,
                            model_config={**CONFIG, "capacity": 40, "evict_filter_value": 2})
    holder = ModelHolder(tmp_path, build)
    rng = np.random.default_rng(6)
    for step in range(1, 6):
        train_step(net, opt, make_batch(rng, batch_size=4))
        writer.publish(net, step=step, checkpoint_step=step - step % 2)
        assert holder.refresh()
        if step > 1:  # the links before the served version are not read again
            os.remove(tmp_path / f"v{step - 1:08d}" / "hash" / "emb.safetensors")
    served = holder.current
    info = served.info()
    assert (info["version"], info["kind"], info["step"], info["checkpoint_step"]) == (5, "delta", 5, 4)
    assert info["load_seconds"] > 0 and info["taken"] <= info["created"] <= info["loaded_at"]
    os.remove(tmp_path / "v00000005" / "hash" / "emb.safetensors")
    writer.publish(net, step=6, full=True)  # the same weights, whole: what a load from a base gives
    full, _ = load_version(tmp_path, 6, build)
    a, b = full.state_dict(), served.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
