"""Published versions that are digest-valid but must not be served, or that must not hang the server:
unloadable manifests, FIFOs, symlinks out of the publish directory, a wiped directory (issue 12, item 10)."""
import json
import os
import shutil
import threading

import pytest
import torch

from recstream.data import CategoricalFeature, Schema
from recstream.models import WideDeep
from recstream.serving import ModelHolder, load_latest, prune, publish_version, read_latest
from recstream.serving.snapshot.layout import manifest_digest

SCHEMA = Schema(["x"], [CategoricalFeature("c", vocab_size=5)])
PROBE = {"instances": [{"x": 0.5, "c": 3}, {"x": -1.0, "c": 0}]}


def publish(d, seed):
    torch.manual_seed(seed)
    return publish_version(d, WideDeep(SCHEMA, hidden=(8,)), model_config={"hidden": [8]})["version"]


def rewrite_manifest(d, version, edit):
    """Edit a manifest and re-seal its digest: valid to every check, but not loadable."""
    path = d / f"v{version:08d}" / "manifest.json"
    doc = edit(json.loads(path.read_text()))
    doc["manifest_sha256"] = manifest_digest(doc)
    path.write_text(json.dumps(doc))


def bounded(fn, seconds=20):
    """Run fn in a thread; fail (instead of hanging the test run) if it does not return in time."""
    box = {}
    t = threading.Thread(target=lambda: box.update(result=fn()), daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"{fn} hung for {seconds} s"
    return box.get("result")


def scores(holder):
    served = holder.current
    with torch.no_grad():
        return served.model(served.parser.parse(PROBE)).tolist()


def test_unknown_model_argument_skips_the_version(tmp_path):
    publish(tmp_path, 0)
    publish(tmp_path, 1)
    rewrite_manifest(tmp_path, 2, lambda m: {**m, "model": {**m["model"], "config": {"hidden": [8], "wings": 2}}})
    net, manifest = load_latest(tmp_path)
    assert manifest["version"] == 1 and "unexpected keyword argument 'wings'" in manifest["skipped"][0]["reason"]
    holder = ModelHolder(tmp_path)
    assert holder.refresh() and holder.current.version == 1 and holder.load_failures == 1


def test_a_very_deep_manifest_skips_the_version(tmp_path):
    publish(tmp_path, 0)
    publish(tmp_path, 1)
    (tmp_path / "v00000002" / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)
    _, manifest = load_latest(tmp_path)
    assert manifest["version"] == 1 and "nested too deeply" in manifest["skipped"][0]["reason"]


def test_a_bad_schema_in_the_manifest_skips_the_version(tmp_path):
    publish(tmp_path, 0)
    publish(tmp_path, 1)
    rewrite_manifest(tmp_path, 2, lambda m: {**m, "preprocessing": {"log1p_dense": "yes please"}})
    holder = ModelHolder(tmp_path)
    assert holder.refresh() and holder.current.version == 1
    skipped = holder.current.manifest["skipped"]
    assert skipped[0]["version"] == 2 and "cannot validate requests" in skipped[0]["reason"]


@pytest.mark.parametrize("name", ["manifest.json", "model.safetensors"])
def test_a_fifo_in_a_version_does_not_hang(tmp_path, name):
    publish(tmp_path, 0)
    publish(tmp_path, 1)
    path = tmp_path / "v00000002" / name
    path.unlink()
    os.mkfifo(path)
    _, manifest = bounded(lambda: load_latest(tmp_path))
    assert manifest["version"] == 1 and "not a regular file" in manifest["skipped"][0]["reason"]
    holder = ModelHolder(tmp_path, poll_seconds=0.05).start()
    bounded(holder.stop)
    assert bounded(lambda: prune(tmp_path, keep=1)) in ([], [1])  # retention reads manifests too


def test_a_fifo_named_latest_does_not_hang(tmp_path):
    publish(tmp_path, 0)
    (tmp_path / "LATEST").unlink()
    os.mkfifo(tmp_path / "LATEST")
    assert bounded(lambda: read_latest(tmp_path)) is None


def test_symlinks_out_of_the_publish_directory_are_refused(tmp_path):
    pub, elsewhere = tmp_path / "pub", tmp_path / "elsewhere"
    publish(pub, 0)
    publish(elsewhere, 5)
    publish(elsewhere, 6)  # a complete, valid version 2 outside the publish directory
    os.symlink(elsewhere / "v00000002", pub / "v00000002")
    _, manifest = load_latest(pub)
    assert manifest["version"] == 1 and "outside the publish directory" in manifest["skipped"][0]["reason"]
    shutil.rmtree(elsewhere / "v00000001")
    os.unlink(pub / "v00000002")
    publish(pub, 7)  # now a real version 2 whose weights file points outside
    model = pub / "v00000002" / "model.safetensors"
    shutil.copy(model, elsewhere / "stolen.safetensors")
    model.unlink()
    os.symlink(elsewhere / "stolen.safetensors", model)
    holder = ModelHolder(pub)
    assert holder.refresh() and holder.current.version == 1
    assert "outside the publish directory" in holder.current.manifest["skipped"][0]["reason"]


def test_a_wiped_directory_restarting_at_version_1_is_noticed(tmp_path):
    for seed in range(3):
        publish(tmp_path, seed)
    holder = ModelHolder(tmp_path)
    assert holder.refresh() and holder.current.version == 3
    before = scores(holder)
    for entry in tmp_path.iterdir():  # the operator wipes the directory ...
        shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    assert holder.refresh() is False and holder.current.version == 3  # nothing there: keep serving
    assert publish(tmp_path, 42) == 1  # ... and a new trainer starts over at version 1
    assert holder.refresh() and holder.current.version == 1
    assert scores(holder) != before
    assert holder.refresh() is False  # and it does not reload it at every poll


def test_a_replaced_version_under_the_same_number_is_noticed(tmp_path):
    publish(tmp_path, 0)
    holder = ModelHolder(tmp_path)
    assert holder.refresh()
    before = scores(holder)
    shutil.rmtree(tmp_path / "v00000001")
    assert publish(tmp_path, 9) == 1
    assert holder.refresh() and holder.current.version == 1 and scores(holder) != before
    assert holder.refresh() is False
