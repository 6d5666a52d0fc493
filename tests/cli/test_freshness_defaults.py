"""The freshness settings of a config (docs/online.md, "Freshness"): `recstream online` cuts a short
batch once its oldest row waited ``stream.max_delay`` (none by default: full batches) and publishes
every 0.25 s when ``publish:`` names no cadence; `recstream train` still publishes only its final version."""
from __future__ import annotations

import pytest

from recstream.cli import build
from recstream.cli.run_command import load_config

CONFIG = """run_dir: run
schema:
  dense: [x]
  categorical:
    - {name: c, vocab_size: 10, embedding_dim: 4}
stream:
  directory: {path: events, format: csv}
  batch_size: 8
STREAM
data:
  train: {format: csv, path: train.csv, batch_size: 2}
model:
  type: widedeep
  hidden: [4]
PUBLISH
"""


def configured(tmp_path, monkeypatch, stream: str = "", publish: str = "publish: {}"):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "events").mkdir(exist_ok=True)
    (tmp_path / "train.csv").write_text("label,x,c\n1,0.5,1\n")
    (tmp_path / "c.yaml").write_text(CONFIG.replace("STREAM", stream).replace("PUBLISH", publish))
    return load_config("c.yaml")


@pytest.mark.parametrize("line, expected", [("", None), ("  max_delay: 0.25", 0.25), ("  max_delay: null", None)])
def test_the_stream_yields_a_short_batch_after_max_delay(tmp_path, monkeypatch, line, expected):
    cfg, doc = configured(tmp_path, monkeypatch, line)
    schema = build._build_schema(cfg, doc)
    with build.build_stream(cfg, doc, schema, str(tmp_path / "run")) as stream:
        assert stream.max_delay == expected


@pytest.mark.parametrize("publish, online, seconds, steps", [
    ("publish: {}", True, build.ONLINE_PUBLISH_SECONDS, None),  # online: fresh versions by default
    ("publish: {}", False, None, None),                          # train: the final version only
    ("publish: {every_seconds: 5}", True, 5, None),
    ("publish: {every_steps: 100}", True, None, 100),           # a cadence given: only that one
])
def test_online_publishes_every_quarter_second_unless_told(tmp_path, monkeypatch, publish, online, seconds, steps):
    cfg, doc = configured(tmp_path, monkeypatch, publish=publish)
    schema = build._build_schema(cfg, doc)
    publisher = build.build_publisher(cfg, doc, schema, str(tmp_path / "run"), online=online)
    assert (publisher.every_seconds, publisher.every_steps) == (seconds, steps)
    assert build.ONLINE_PUBLISH_SECONDS == 0.25
