"""Snapshot layout, manifest contents, delta contents, and exact reconstruction through delta chains."""
import hashlib
import json
import os
import shutil

import numpy as np
import pytest
import torch

from recstream.data import CategoricalFeature, Schema
from recstream.models import DeepFM
from recstream.serving import SnapshotWriter, load_latest, load_version, read_latest, read_manifest
from recstream.serving.snapshot.layout import MODEL_FILE, SnapshotError
from recstream.serving.snapshot.model_spec import RebuildError
from recstream.serving.snapshot.state_split import dense_state

from ..helpers import CONFIG, SCHEMA, build, make_batch, new_model, predict, rows_map, train_step


def writer(d, **kw):
    return SnapshotWriter(d, SCHEMA, model_factory=build, model_config=CONFIG, **kw)


def test_layout_manifest_and_checksums(tmp_path):
    net, opt = new_model()
    rng = np.random.default_rng(0)
    w = writer(tmp_path, full_every=3)
    kinds = []
    for step in range(1, 8):
        train_step(net, opt, make_batch(rng))
        m = w.publish(net, step=step, epoch=1, max_event_time=1000.0 + step)
        kinds.append((m["version"], m["kind"], m["base"], m["parent"]))
    assert kinds == [(1, "full", 1, None), (2, "delta", 1, 1), (3, "delta", 1, 2), (4, "full", 4, None),
                     (5, "delta", 4, 4), (6, "delta", 4, 5), (7, "full", 7, None)]
    # keep=5 keeps 3..7, and version 3 (a delta on base 1) pins 1 and 2: nothing removed yet.
    assert sorted(os.listdir(tmp_path)) == ["LATEST"] + [f"v{v:08d}" for v in range(1, 8)]
    assert read_latest(tmp_path) == 7 and open(tmp_path / "LATEST").read() == "v00000007\n"
    m = read_manifest(tmp_path, 6)
    assert (m["step"], m["epoch"], m["max_event_time"]) == (6, 1, 1006.0)
    assert m["schema"] == SCHEMA.to_dict() and m["model"]["config"] == CONFIG
    assert m["model"]["class"].endswith("helpers.HashCTR") and m["model"]["factory"].endswith("helpers:build")
    assert m["model"]["output"] == "logits" and m["created"] > 0
    assert set(m["files"]) == {MODEL_FILE, "hash/emb.safetensors"}
    for rel, entry in m["files"].items():
        data = (tmp_path / "v00000006" / rel).read_bytes()
        assert entry == {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    on_disk = json.loads((tmp_path / "v00000006" / "manifest.json").read_text())
    assert on_disk["manifest_sha256"] == m["manifest_sha256"]


def test_delta_holds_only_changed_rows_and_evictions(tmp_path):
    net, opt = new_model(capacity=16)
    w = SnapshotWriter(tmp_path, SCHEMA, model_factory=build, model_config={**CONFIG, "capacity": 16}, full_every=100)
    rng = np.random.default_rng(1)
    for _ in range(3):
        train_step(net, opt, make_batch(rng, batch_size=8))
    assert net.emb.num_rows == 16  # full: the next new key evicts the least recently seen one
    full = w.publish(net)
    assert full["hash_embeddings"]["emb"]["rows"] == net.emb.num_rows
    # One event touches 3 keys (user, item, no tags); capacity 16 is full, so new keys evict old ones.
    before = set(rows_map(net.emb.export(reset_delta=False)))
    from recstream.data import Batch, Features
    one = Batch(Features.from_lengths(torch.zeros(1, 2), torch.tensor([999, 49]), torch.tensor([[1], [1], [0]])),
                torch.tensor([1.0]))
    train_step(net, opt, one)
    after = set(rows_map(net.emb.export(reset_delta=False)))
    delta = w.publish(net)
    from safetensors.torch import load_file
    t = load_file(str(tmp_path / "v00000002" / "hash" / "emb.safetensors"))
    assert delta["kind"] == "delta"
    assert set(t["keys"].tolist()) == {999, 49 + (1 << 40)}  # only the rows this step touched
    assert set(t["evicted_keys"].tolist()) == before - after and len(before - after) > 0


@pytest.mark.parametrize("evict", [None, 3])
def test_delta_chain_reconstructs_the_live_model_exactly(tmp_path, evict):
    net, opt = new_model(capacity=48, evict_filter_value=evict)
    w = SnapshotWriter(tmp_path, SCHEMA, model_factory=build, full_every=50,
                       model_config={**CONFIG, "capacity": 48, "evict_filter_value": evict})
    rng = np.random.default_rng(2)
    probe = make_batch(rng, batch_size=64).features
    for step in range(1, 13):  # 4 events a step: deltas smaller than the table (else they are written full)
        train_step(net, opt, make_batch(rng, batch_size=4))
        w.publish(net, step=step)
    loaded, manifest = load_latest(tmp_path, build)
    assert manifest["kind"] == "delta" and manifest["base"] == 1 and manifest["version"] == 12
    live = dense_state(net)
    got = dense_state(loaded)
    assert live.keys() == got.keys() and all(torch.equal(live[k], got[k]) for k in live)
    assert rows_map(loaded.emb.export(reset_delta=False)) == rows_map(net.emb.export(reset_delta=False))
    assert torch.equal(predict(loaded, probe), predict(net, probe))
    assert not loaded.training and not any(p.requires_grad for p in loaded.parameters())


def test_chain_and_full_load_bit_identical(tmp_path):
    net, opt = new_model(capacity=40, evict_filter_value=2)
    w = SnapshotWriter(tmp_path, SCHEMA, model_factory=build, full_every=50,
                       model_config={**CONFIG, "capacity": 40, "evict_filter_value": 2})
    rng = np.random.default_rng(3)
    for _ in range(6):
        train_step(net, opt, make_batch(rng, batch_size=4))
        w.publish(net)
    w.publish(net, full=True)  # same state as version 6, written in full
    a, ma = load_version(tmp_path, 6, build)
    b, mb = load_version(tmp_path, 7, build)
    assert (ma["kind"], mb["kind"]) == ("delta", "full")
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_loading_after_a_served_version_reads_only_the_new_deltas_and_is_bit_identical(tmp_path):
    """What the server does on each swap: start from the served version's rows. Same network as a
    load from the base, evictions included; the older links' row files are not read again."""
    net, opt = new_model(capacity=40, evict_filter_value=2)
    w = SnapshotWriter(tmp_path, SCHEMA, model_factory=build, full_every=50,
                       model_config={**CONFIG, "capacity": 40, "evict_filter_value": 2})
    rng = np.random.default_rng(4)
    served = None
    for step in range(1, 10):
        train_step(net, opt, make_batch(rng, batch_size=4))
        version = w.publish(net, step=step)["version"]
        fresh, _ = load_version(tmp_path, version, build)
        served = load_version(tmp_path, version, build, previous=served)
        a, b = fresh.state_dict(), served[0].state_dict()
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), version
    assert served[1]["kind"] == "delta" and served[1]["base"] == 1
    for v in range(1, 10):  # the chain's row files are gone: only a load after version 9 can work
        os.remove(tmp_path / f"v{v:08d}" / "hash" / "emb.safetensors")
    train_step(net, opt, make_batch(rng, batch_size=4))
    w.publish(net, step=10)
    with pytest.raises(SnapshotError, match="missing|emb.safetensors"):
        load_version(tmp_path, 10, build)
    loaded, manifest = load_version(tmp_path, 10, build, previous=served)
    assert manifest["version"] == 10
    assert rows_map(loaded.emb.export(reset_delta=False)) == rows_map(net.emb.export(reset_delta=False))


def test_a_served_version_rewritten_on_disk_is_not_reused(tmp_path):
    """A wiped and restarted directory reuses version numbers: the served rows are not a base then."""
    net, opt = new_model(capacity=40)
    w = SnapshotWriter(tmp_path, SCHEMA, model_factory=build, full_every=50,
                       model_config={**CONFIG, "capacity": 40})
    rng = np.random.default_rng(5)
    for _ in range(2):
        train_step(net, opt, make_batch(rng, batch_size=4))
        w.publish(net)
    served = load_version(tmp_path, 2, build)
    other, other_opt = new_model(seed=1, capacity=40)
    w2 = SnapshotWriter(tmp_path / "new", SCHEMA, model_factory=build, full_every=50,
                        model_config={**CONFIG, "capacity": 40})
    for _ in range(3):
        train_step(other, other_opt, make_batch(rng, batch_size=4))
        w2.publish(other)
    for v in (1, 2, 3):  # the new run's versions 1-3 replace the old 1-2
        target = tmp_path / f"v{v:08d}"
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(tmp_path / "new" / f"v{v:08d}", target)
    loaded, _ = load_version(tmp_path, 3, build, previous=served)
    assert rows_map(loaded.emb.export(reset_delta=False)) == rows_map(other.emb.export(reset_delta=False))
    with pytest.raises(TypeError, match="'previous' must be a \\(network, manifest\\) pair"):
        load_version(tmp_path, 3, build, previous=served[0])


def test_builtin_model_rebuilds_without_factory(tmp_path):
    schema = Schema(["x"], [CategoricalFeature("a", vocab_size=7), CategoricalFeature("b", hash_buckets=30)])
    net = DeepFM(schema, hidden=(8,), embedding_dim=4)
    SnapshotWriter(tmp_path, model_config={"hidden": [8], "embedding_dim": 4}).publish(net)
    loaded, manifest = load_latest(tmp_path)
    assert type(loaded) is DeepFM and manifest["model"]["rebuild"] == "recstream.models"
    s1, s2 = net.state_dict(), loaded.state_dict()
    assert all(torch.equal(s1[k], s2[k]) for k in s1)


def test_wrong_model_config_fails_at_publish_time(tmp_path):
    schema = Schema(["x"], [CategoricalFeature("a", vocab_size=7)])
    with pytest.raises(ValueError, match="differs from the trained one"):
        SnapshotWriter(tmp_path, model_config={"hidden": [16]}).publish(DeepFM(schema, hidden=(8,), embedding_dim=4))
    with pytest.raises(TypeError, match="JSON-able"):
        SnapshotWriter(tmp_path, model_config={"act": object()})


def test_custom_network_needs_a_factory(tmp_path):
    net, _ = new_model()
    SnapshotWriter(tmp_path, SCHEMA, model_config=CONFIG).publish(net)  # no factory recorded: still publishes
    with pytest.raises(RebuildError, match="pass model_factory"):
        load_latest(tmp_path)
    loaded, _ = load_latest(tmp_path, "tests.serving.helpers:build")  # by name, as the CLI passes it
    assert rows_map(loaded.emb.export(reset_delta=False)) == rows_map(net.emb.export(reset_delta=False))
