"""The server never stays on an old version and never lets a bad version escape (issue 27, item 4).

A version number that failed once is retried when its contents (or its chain's) change on disk; every
manifest or version problem is a skip with a reason, never an exception out of ``load_latest``, the
holder, ``recstream serve`` start-up or ``/metrics``; a version with non-finite weights is never loaded.
Real files, a real server process and socket.
"""
import hashlib
import http.client
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from recstream.data import CategoricalFeature, Schema
from recstream.models import WideDeep
from recstream.serving import ModelHolder, SnapshotError, SnapshotWriter, load_latest, load_version, publish_version
from recstream.serving.snapshot.layout import manifest_digest

from ..helpers import CONFIG, SCHEMA, build, make_batch, new_model, train_step

REPO = Path(__file__).resolve().parents[3]
WD_SCHEMA = Schema(["x"], [CategoricalFeature("c", vocab_size=5)])


def publish(d, seed):
    torch.manual_seed(seed)
    return publish_version(d, WideDeep(WD_SCHEMA, hidden=(8,)), model_config={"hidden": [8]})["version"]


def manifest_path(d, version):
    return Path(d) / f"v{version:08d}" / "manifest.json"


def reseal(d, version, edit):
    """Edit a manifest and recompute its digest: it passes the digest check, its content is bad."""
    path = manifest_path(d, version)
    doc = edit(json.loads(path.read_text()))
    doc["manifest_sha256"] = manifest_digest(doc)
    path.write_text(json.dumps(doc))


def with_model(edit):
    return lambda m: {**m, "model": {**m["model"], "config": edit(m["model"]["config"])}}


def big_vocab(m):
    schema = json.loads(json.dumps(m["schema"]))
    for f in schema["categorical"] if "categorical" in schema else schema["features"]:
        if isinstance(f, dict) and "vocab_size" in f:
            f["vocab_size"] = 10 ** 12
    return {**m, "schema": schema}


BAD_MANIFESTS = {
    "version true": lambda m: {**m, "version": True},
    "40 GB hidden": with_model(lambda c: {**c, "hidden": [100_000, 100_000]}),
    "vocab 10**12": big_vocab,
    "created yesterday": lambda m: {**m, "created": "yesterday"},
    "step a string": lambda m: {**m, "step": "ten"},
    "event time a list": lambda m: {**m, "max_event_time": [1]},
    "files a list": lambda m: {**m, "files": []},
}


def test_big_vocab_edit_reaches_the_schema(tmp_path):
    publish(tmp_path, 0)
    doc = big_vocab(json.loads(manifest_path(tmp_path, 1).read_text()))
    assert "1000000000000" in json.dumps(doc["schema"])  # the case below really tests a 10**12 table


@pytest.mark.parametrize("case", sorted(BAD_MANIFESTS))
def test_a_digest_valid_bad_manifest_is_skipped(tmp_path, case):
    for seed in range(3):
        publish(tmp_path, seed)
    reseal(tmp_path, 3, BAD_MANIFESTS[case])
    _, manifest = load_latest(tmp_path)
    assert manifest["version"] == 2 and manifest["skipped"][0]["version"] == 3, manifest["skipped"]
    holder = ModelHolder(tmp_path)
    assert holder.refresh() and holder.current.version == 2 and holder.load_failures == 1
    with pytest.raises(SnapshotError):
        load_version(tmp_path, 3)


def test_version_true_on_version_1_is_refused_not_a_type_error(tmp_path):
    publish(tmp_path, 0)
    reseal(tmp_path, 1, lambda m: {**m, "version": True})  # True == 1 in Python
    with pytest.raises(SnapshotError, match="version"):
        load_latest(tmp_path)


def test_a_manifest_with_1e400_is_skipped(tmp_path):
    publish(tmp_path, 0)
    publish(tmp_path, 1)
    path = manifest_path(tmp_path, 2)
    path.write_text(path.read_text().replace('"max_event_time": null', '"max_event_time": 1e400'))
    assert "1e400" in path.read_text()
    _, manifest = load_latest(tmp_path)
    assert manifest["version"] == 1 and "not finite" in manifest["skipped"][0]["reason"]


def test_a_delta_whose_parent_is_true_is_skipped(tmp_path):
    net, opt = new_model()
    w = SnapshotWriter(tmp_path, SCHEMA, model_factory=build, model_config=CONFIG, full_every=10)
    rng = np.random.default_rng(0)
    for _ in range(3):
        train_step(net, opt, make_batch(rng))
        w.publish(net)
    reseal(tmp_path, 3, lambda m: {**m, "parent": True, "base": True})
    _, manifest = load_latest(tmp_path, build)
    assert manifest["version"] == 2 and "base" in manifest["skipped"][0]["reason"]


def reseal_file(d, version, relpath, tensors):
    """Replace one file of a version and re-seal the manifest: every checksum holds, the content is bad."""
    path = Path(d) / f"v{version:08d}" / relpath
    save_file(tensors, str(path))
    data = path.read_bytes()
    reseal(d, version, lambda m: {**m, "files": {**m["files"], relpath: {
        "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}}})


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_dense_weights_are_never_loaded(tmp_path, value):
    publish(tmp_path, 0)
    publish(tmp_path, 1)
    state = load_file(str(tmp_path / "v00000002" / "model.safetensors"))
    name = sorted(k for k, t in state.items() if t.is_floating_point())[0]
    state[name] = state[name].clone()
    state[name].view(-1)[0] = value
    reseal_file(tmp_path, 2, "model.safetensors", state)
    _, manifest = load_latest(tmp_path)
    assert manifest["version"] == 1 and "non-finite" in manifest["skipped"][0]["reason"]
    holder = ModelHolder(tmp_path)
    assert holder.refresh() and holder.current.version == 1


def test_non_finite_hash_rows_are_never_loaded(tmp_path):
    net, opt = new_model()
    w = SnapshotWriter(tmp_path, SCHEMA, model_factory=build, model_config=CONFIG, full_every=10)
    rng = np.random.default_rng(0)
    for _ in range(2):
        train_step(net, opt, make_batch(rng))
        w.publish(net)
    rows = load_file(str(tmp_path / "v00000002" / "hash" / "emb.safetensors"))
    rows["values"] = rows["values"].clone()
    rows["values"][0, 0] = float("-inf")
    reseal_file(tmp_path, 2, "hash/emb.safetensors", rows)
    _, manifest = load_latest(tmp_path, build)
    assert manifest["version"] == 1 and "non-finite" in manifest["skipped"][0]["reason"]


def test_an_incomplete_copy_is_retried_once_complete(tmp_path):
    src, pub = tmp_path / "src", tmp_path / "pub"
    publish(src, 0)
    publish(src, 1)
    pub.mkdir()
    shutil.copytree(src / "v00000001", pub / "v00000001")
    holder = ModelHolder(pub)
    assert holder.refresh() and holder.current.version == 1
    (pub / "v00000002").mkdir()  # `cp -r` half way: the manifest is there, the weights are not yet
    shutil.copy(src / "v00000002" / "manifest.json", pub / "v00000002" / "manifest.json")
    assert holder.refresh() is False and holder.current.version == 1 and holder.load_failures == 1
    assert holder.refresh() is False and holder.load_failures == 1  # nothing changed: not retried
    weights = (src / "v00000002" / "model.safetensors").read_bytes()
    (pub / "v00000002" / "model.safetensors").write_bytes(weights[: len(weights) // 2])  # still copying
    assert holder.refresh() is False and holder.load_failures == 2
    (pub / "v00000002" / "model.safetensors").write_bytes(weights)  # the copy completes
    assert holder.refresh() and holder.current.version == 2
    assert holder.refresh() is False


def test_a_fixed_manifest_under_the_same_number_is_retried(tmp_path):
    publish(tmp_path, 0)
    publish(tmp_path, 1)
    good = manifest_path(tmp_path, 2).read_text()
    reseal(tmp_path, 2, lambda m: {**m, "created": "yesterday"})
    holder = ModelHolder(tmp_path)
    assert holder.refresh() and holder.current.version == 1
    manifest_path(tmp_path, 2).write_text(good)
    assert holder.refresh() and holder.current.version == 2


def test_a_served_version_replaced_by_a_symlink_is_not_rolled_back_and_is_retried(tmp_path):
    pub, elsewhere = tmp_path / "pub", tmp_path / "elsewhere"
    net, opt = new_model()
    w = SnapshotWriter(pub, SCHEMA, model_factory=build, model_config=CONFIG, full_every=10)
    rng = np.random.default_rng(0)
    for _ in range(3):  # 1 full, 2 and 3 deltas
        train_step(net, opt, make_batch(rng))
        w.publish(net)
    holder = ModelHolder(pub, build)
    assert holder.refresh() and holder.current.version == 3
    elsewhere.mkdir()
    shutil.move(str(pub / "v00000003"), str(elsewhere / "v00000003"))
    os.symlink("/etc", pub / "v00000003")  # the served version now points out of the directory
    assert holder.refresh() is False and holder.current.version == 3  # no rollback to version 2
    train_step(net, opt, make_batch(rng))
    assert w.publish(net)["kind"] == "delta"  # version 4 needs version 3
    assert holder.refresh() is False and holder.current.version == 3
    assert "outside the publish directory" in holder.last_error
    os.unlink(pub / "v00000003")
    shutil.move(str(elsewhere / "v00000003"), str(pub / "v00000003"))  # the operator repairs it
    assert holder.refresh() and holder.current.version == 4


def scrape(port, path):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    finally:
        conn.close()


def test_serve_starts_on_the_good_version_past_bad_manifests(tmp_path):
    for seed in range(6):
        publish(tmp_path, seed)
    path = manifest_path(tmp_path, 4)
    path.write_text(path.read_text().replace('"max_event_time": null', '"max_event_time": 1e400'))
    reseal(tmp_path, 5, BAD_MANIFESTS["40 GB hidden"])
    reseal(tmp_path, 6, BAD_MANIFESTS["created yesterday"])
    proc = subprocess.Popen([sys.executable, "-m", "recstream", "serve", str(tmp_path), "--port", "0",
                             "--log-level", "ERROR"], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = queue.Queue()
    threading.Thread(target=lambda: lines.put(proc.stdout.readline()), daemon=True).start()
    try:
        line = lines.get(timeout=120)
        assert "listening on http://127.0.0.1:" in line and "version 3)" in line, (line, proc.stderr.read())
        port = int(line.split("127.0.0.1:")[1].split()[0])
        status, text = scrape(port, "/metrics")
        assert status == 200 and "recstream_serving_model_version 3.0" in text
        assert "recstream_serving_model_load_failures_total 3.0" in text
        status, text = scrape(port, "/version")
        assert status == 200 and [s["version"] for s in json.loads(text)["skipped"]] == [6, 5, 4]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        assert "Traceback" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
