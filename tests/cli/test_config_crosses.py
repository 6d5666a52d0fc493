"""``schema.crosses`` in a config: built into the run's schema (the network gets the cross tables), and
each mistake reported at its entry's file:line like the other keys."""
from __future__ import annotations

import pytest

from recstream.cli.errors import EXIT_USAGE
from recstream.cli.main import main

CONFIG = """run_dir: run
schema:
  dense: [x]
  categorical:
    - {name: c, vocab_size: 10, embedding_dim: 4}
    - {name: d, hash_buckets: 10, embedding_dim: 4}
  crosses:
    - {name: c_x_d, features: [c, d], hash_buckets: 64}
data:
  train: {format: csv, path: train.csv, batch_size: 2}
model:
  type: widedeep
  hidden: [4]
train:
  threads: 1
"""


def run(tmp_path, monkeypatch, text: str) -> int:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.csv").write_text("label,x,c,d\n1,0.5,1,a\n0,0.1,2,b\n1,0.3,1,b\n0,0.2,2,a\n")
    (tmp_path / "c.yaml").write_text(text)
    return main(["train", "c.yaml"])


def test_crosses_of_the_config_reach_the_network(tmp_path, monkeypatch):
    from recstream.cli import build
    from recstream.cli.run_command import load_config
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.csv").write_text("label,x,c,d\n1,0.5,1,a\n")
    (tmp_path / "c.yaml").write_text(CONFIG)
    cfg, doc = load_config("c.yaml")
    schema = build._build_schema(cfg, doc)
    assert [x.to_dict() for x in schema.crosses] == [
        {"name": "c_x_d", "features": ["c", "d"], "hash_buckets": 64, "embedding_dim": 16, "deep": False}]
    assert run(tmp_path, monkeypatch, CONFIG) == 0
    assert (tmp_path / "run" / "checkpoints").is_dir()


@pytest.mark.parametrize("old, new, words", [
    ("features: [c, d]", "features: [c, zz]", ["schema.crosses[0]", "got 'c_x_d'", "['zz'] (unknown)",
                                               "categorical features ['c', 'd']"]),
    ("features: [c, d]", "features: [c, x]", ["schema.crosses[0]", "['x'] (dense features, not categorical)"]),
    ("features: [c, d]", "features: [c]", ["schema.crosses[0]", "at least 2"]),
    ("features: [c, d]", "features: [c, c]", ["schema.crosses[0]", "more than once"]),
    ("name: c_x_d", "name: d", ["schema.crosses[0]", "'d' is already taken"]),
    ("hash_buckets: 64", "hash_buckets: 1", ["schema.crosses[0].hash_buckets", "greater than or equal to 2"]),
    ("hash_buckets: 64", "hash_buckets: 2147483647, embedding_dim: 4096, deep: true",
     ["schema.crosses[0]", "table of 'c_x_d' (2,147,483,647 rows x 4097 float32)", "GiB; this machine has"]),
    ("hash_buckets: 64", "hash_buckets: 64, dynamic: true",
     ["schema.crosses[0].dynamic", "unknown key", "allowed keys: name, features"]),
])
def test_a_cross_mistake_is_named_at_its_entry(old, new, words, tmp_path, monkeypatch, capsys):
    text = CONFIG.replace(old, new)
    assert text != CONFIG
    assert run(tmp_path, monkeypatch, text) == EXIT_USAGE
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("recstream train: c.yaml:8: "), line
    assert all(w in line for w in words), line


def test_crosses_need_categorical_columns(tmp_path, monkeypatch, capsys):
    text = CONFIG.replace("  categorical:\n    - {name: c, vocab_size: 10, embedding_dim: 4}\n"
                          "    - {name: d, hash_buckets: 10, embedding_dim: 4}\n", "")
    assert run(tmp_path, monkeypatch, text) == EXIT_USAGE
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "crosses: cross the columns of categorical:" in line, line
