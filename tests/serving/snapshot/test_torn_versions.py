"""Torn or corrupt versions are skipped and reported; the loader falls back to the newest good one."""
import json
import logging
import os

import numpy as np
import pytest
import torch

from recstream.serving import SnapshotError, SnapshotWriter, list_versions, load_latest
from recstream.serving.publishing import publish as publish_module
from recstream.serving.publishing.writer import remove_stale_temps

from ..helpers import CONFIG, SCHEMA, build, make_batch, new_model, predict, rows_map, train_step


@pytest.fixture
def published(tmp_path):
    """Versions 1 (full), 2 and 3 (deltas); returns (dir, {version: live predictions on a probe})."""
    net, opt = new_model()
    w = SnapshotWriter(tmp_path, SCHEMA, model_factory=build, model_config=CONFIG, full_every=10)
    rng = np.random.default_rng(5)
    probe = make_batch(rng, batch_size=32).features
    preds = {}
    for _ in range(3):
        train_step(net, opt, make_batch(rng))
        preds[w.publish(net)["version"]] = predict(net, probe)
    return tmp_path, probe, preds


def check_serves(directory, probe, preds, version, skipped):
    net, manifest = load_latest(directory, build)
    assert manifest["version"] == version
    assert [s["version"] for s in manifest["skipped"]] == skipped
    assert torch.equal(predict(net, probe), preds[version])
    return manifest


def test_truncated_file_of_newest_falls_back(published, caplog):
    d, probe, preds = published
    path = d / "v00000003" / "hash" / "emb.safetensors"
    path.write_bytes(path.read_bytes()[:-10])
    with caplog.at_level(logging.WARNING, logger="recstream.serving.snapshot.loader"):
        m = check_serves(d, probe, preds, 2, [3])
    assert "checksum" in m["skipped"][0]["reason"] and "skipping model version 3" in caplog.text


def test_missing_manifest_falls_back(published):
    d, probe, preds = published
    os.remove(d / "v00000003" / "manifest.json")
    m = check_serves(d, probe, preds, 2, [3])
    assert "manifest.json is missing" in m["skipped"][0]["reason"]


def test_edited_manifest_fails_its_digest(published):
    d, probe, preds = published
    path = d / "v00000003" / "manifest.json"
    doc = json.loads(path.read_text())
    doc["step"] = 12345  # valid JSON, wrong content
    path.write_text(json.dumps(doc))
    m = check_serves(d, probe, preds, 2, [3])
    assert "digest mismatch" in m["skipped"][0]["reason"]


def test_bit_flip_in_dense_file(published):
    d, probe, preds = published
    path = d / "v00000003" / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF  # same size, different bytes
    path.write_bytes(bytes(data))
    check_serves(d, probe, preds, 2, [3])


def test_corrupt_link_invalidates_the_versions_built_on_it(published):
    d, probe, preds = published
    (d / "v00000002" / "hash" / "emb.safetensors").write_bytes(b"garbage")
    m = check_serves(d, probe, preds, 1, [3, 2])
    for s in m["skipped"]:
        assert "version 2: hash/emb.safetensors fails its checksum" in s["reason"]


def test_nothing_usable_or_nothing_at_all(published, tmp_path_factory):
    d, _, _ = published
    for v in list_versions(d):
        os.remove(d / f"v{v:08d}" / "manifest.json")
    with pytest.raises(SnapshotError, match="no usable version.*v3.*v2.*v1"):
        load_latest(d, build)
    with pytest.raises(FileNotFoundError, match="no published version"):
        load_latest(tmp_path_factory.mktemp("empty"), build)


def test_temp_dirs_are_invisible_and_cleaned(published):
    d, probe, preds = published
    tmp = d / ".tmp-v00000004-deadbeef"
    (tmp / "hash").mkdir(parents=True)
    (tmp / "model.safetensors").write_bytes(b"half a file")
    check_serves(d, probe, preds, 3, [])
    assert remove_stale_temps(d) == [tmp.name] and not tmp.exists()


def test_failed_publish_forces_a_full_version_and_stays_exact(tmp_path, monkeypatch):
    net, opt = new_model(capacity=40, evict_filter_value=2)
    cfg = {**CONFIG, "capacity": 40, "evict_filter_value": 2}
    w = SnapshotWriter(tmp_path, SCHEMA, model_factory=build, model_config=cfg)
    rng = np.random.default_rng(6)
    train_step(net, opt, make_batch(rng))
    w.publish(net)
    train_step(net, opt, make_batch(rng))
    real = publish_module.write_version

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(publish_module, "write_version", disk_full)
    with pytest.raises(OSError):
        w.publish(net)  # the delta export above already moved the baseline: its rows are lost
    monkeypatch.setattr(publish_module, "write_version", real)
    train_step(net, opt, make_batch(rng))
    m = w.publish(net)
    assert (m["version"], m["kind"]) == (2, "full")
    loaded, _ = load_latest(tmp_path, build)
    assert rows_map(loaded.emb.export(reset_delta=False)) == rows_map(net.emb.export(reset_delta=False))
