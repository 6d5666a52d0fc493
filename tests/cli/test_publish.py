"""The config's ``publish:`` section: `recstream online` and `recstream train` in subprocesses publish
model versions that `recstream.serving` loads (the layout `recstream serve` reads), and the newest
version scores a raw row exactly as the final checkpoint's network scores that row as read for
training (same weights, same preprocessing, same ids)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
import yaml

from recstream.checkpoint import load_checkpoint
from recstream.cli.errors import EXIT_USAGE
from recstream.cli.main import main
from recstream.data import CriteoReader, Schema
from recstream.data.streams import CSVLineDecoder
from recstream.models import DeepFM
from recstream.serving import InstanceParser, list_versions, load_latest, read_manifest

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}

ONLINE = """run_dir: run
schema:
  dense: [I1, I2]
  categorical:
    - {name: C1, vocab_size: 100, embedding_dim: 4}
    - {name: C2, dynamic: true, capacity: 2000, embedding_dim: 4}   # a HashEmbedding: delta versions
stream:
  directory: {path: events, format: csv}
  batch_size: 50
  id_column: event_id
  time_column: event_time
  idle_timeout: 0.5
model:
  type: deepfm
  hidden: [8]
train:
  sink_mode: true
  sink_size: 1
  threads: 1
publish:
  every_steps: 5
  keep: 3
  full_every: 3
"""

TRAIN = """run_dir: run
schema:
  criteo: {hash_buckets: 1000, embedding_dim: 4}
data:
  train: {format: criteo, path: data/part-00000000.tsv, batch_size: 100}
model:
  type: widedeep
  hidden: [8]
train:
  threads: 1
publish:
  directory: models
"""


def cli(cwd, *argv: str) -> dict:
    result = subprocess.run([sys.executable, "-m", "recstream", *argv, "--json"], capture_output=True, text=True,
                            timeout=120, env=ENV, cwd=cwd)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    return json.loads(result.stdout)


def checkpoint_network(path, net):
    load_checkpoint(path, net, restore_rng=False)
    return net.eval()


def score(net, features) -> float:
    with torch.no_grad():
        return torch.sigmoid(net(features)).item()


def test_online_publishes_versions_that_serving_loads(tmp_path):
    assert main(["produce", "--synthetic", "--num-dense", "2", "--num-categorical", "2", "--rows", "2000",
                 "--directory", str(tmp_path / "events"), "--file-records", "1000"]) == 0
    (tmp_path / "c.yaml").write_text(ONLINE)
    result = cli(tmp_path, "online", "c.yaml")
    published = tmp_path / "run" / "published"  # the default: inside the run directory
    assert result["steps"] == 40
    assert result["published"]["directory"] == os.path.join("run", "published")
    versions = list_versions(published)
    manifests = [read_manifest(published, v) for v in versions]
    # every 5 steps (a write still in flight when the next falls due moves it on: on a loaded box fewer
    # versions, never fewer than the first and the final one), and the final version at the last step;
    # the newest 3 kept, and the versions their delta chain needs (a full one at least every 3)
    assert versions[-1] == result["published"]["version"] >= 2 and manifests[-1]["step"] == 40
    assert "delta" in [m["kind"] for m in manifests] and len(versions) <= 3 + 2
    assert not [n for n in os.listdir(published) if n.startswith(".")]  # no temporary leftovers

    served, manifest = load_latest(published)
    schema = Schema.from_dict(manifest["schema"])
    assert manifest["version"] == versions[-1] and manifest["preprocessing"] == {}
    trained = checkpoint_network(result["checkpoint"], DeepFM(schema, hidden=[8]))
    line = (tmp_path / "events" / "part-00000001.csv").read_bytes().splitlines()[-1]
    label, i1, i2, c1, c2 = line.decode().split(",")[:5]
    instance = {"I1": float(i1), "I2": float(i2), "C1": int(c1), "C2": int(c2)}
    row = CSVLineDecoder(schema, ",", id_column="event_id", time_column="event_time").decode([line]).batch
    expected = score(trained, row.features)
    assert score(served, InstanceParser(schema, manifest["preprocessing"]).parse({"instances": [instance]})) \
        == pytest.approx(expected, abs=1e-6)


def test_train_publishes_the_final_model_with_the_readers_preprocessing(tmp_path):
    assert main(["produce", "--synthetic", "--format", "criteo", "--no-meta", "--rows", "600",
                 "--directory", str(tmp_path / "data"), "--file-records", "600"]) == 0
    (tmp_path / "c.yaml").write_text(TRAIN)
    result = cli(tmp_path, "train", "c.yaml")
    assert result["published"] == {"directory": "models", "version": 1, "step": 6}
    served, manifest = load_latest(tmp_path / "models")
    # the Criteo reader fills empty counts with 0 and takes log1p: a server must do the same
    assert manifest["preprocessing"] == {"fill_missing_dense": 0.0, "log1p_dense": True}
    schema = Schema.from_dict(manifest["schema"])
    from recstream.models import WideDeep
    trained = checkpoint_network(result["checkpoint"], WideDeep(schema, hidden=[8]))
    path = tmp_path / "data" / "part-00000000.tsv"
    fields = path.read_text().splitlines()[0].split("\t")
    instance = {f"I{i}": float(fields[i]) if fields[i] else None for i in range(1, 14)}
    instance |= {f"C{i}": fields[13 + i] or None for i in range(1, 27)}
    row = next(iter(CriteoReader(str(path), 1, 1000, embedding_dim=4)))
    assert score(served, InstanceParser(schema, manifest["preprocessing"]).parse({"instances": [instance]})) \
        == pytest.approx(score(trained, row.features), abs=1e-6)


@pytest.mark.parametrize("old, new, words", [
    ("  directory: models\n", "  directory: models\n  every_step: 5\n",
     ["publish.every_step: unknown key (value 5); allowed keys: directory, every_steps"]),
    ("  directory: models\n", "  directory: models\n  every_seconds: 0\n",
     ["publish.every_seconds: got 0; must be greater than 0"]),
    ("  directory: models\n", "  directory: c.yaml\n",
     ["publish.directory: got 'c.yaml'; must be a directory (or a path to create), it is a file"]),
    ("  directory: models\n", "  directory: models\n  on_error: ignore\n",
     ["publish.on_error: got 'ignore'; must be 'log' or 'raise'"]),
])
def test_publish_mistakes_name_the_field_and_line(tmp_path, old, new, words):
    text = TRAIN.replace(old, new)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "part-00000000.tsv").write_text("")
    (tmp_path / "c.yaml").write_text(text)
    result = subprocess.run([sys.executable, "-m", "recstream", "train", "c.yaml"], capture_output=True, text=True,
                            timeout=60, env=ENV, cwd=tmp_path)
    assert result.returncode == EXIT_USAGE and "Traceback" not in result.stderr, result.stderr
    line = next(i for i, t in enumerate(text.splitlines(), 1) if t == new.splitlines()[-1])
    assert result.stderr.strip().startswith(f"recstream train: c.yaml:{line}: "), result.stderr
    for word in words:
        assert word in result.stderr, result.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("name", ["OFFLINE", "ONLINE"])
def test_the_init_templates_publish_section_works_uncommented(name):
    from recstream.cli import templates
    from recstream.cli.config_schema import Config
    lines, inside = [], False
    for line in getattr(templates, name).splitlines():
        inside = line.startswith("# publish") or (inside and line.startswith("#   "))
        lines.append(line[2:] if inside else line)
    data = yaml.safe_load("\n".join(lines))
    data.pop("data", None), data.pop("stream", None)  # their files do not exist here
    publish = Config.model_validate(data).publish
    assert publish is not None
    assert (publish.every_seconds, publish.keep) == ((30, 5) if name == "ONLINE" else (None, 5))
