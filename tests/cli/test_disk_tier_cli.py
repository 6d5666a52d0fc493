"""`model: disk_tier:` in a config: the named features' tables (DeepFM's embedding and linear tables)
train on disk behind a cache, checkpoint as commits of their stores, and `eval` restores them."""
from __future__ import annotations

import json
import re

import pytest

from recstream.cli import templates

from .test_config_commands import EXAMPLES, cli, json_result, make_data, produce_line


@pytest.mark.e2e
def test_train_then_eval_with_disk_tiered_tables(tmp_path):
    text = (EXAMPLES / "criteo_offline.yaml").read_text().replace(
        "  dropout: 0.0\n", "  dropout: 0.0\n  disk_tier: {directory: tiers, cache_rows: {C1: 4096, C2: 4096}}\n")
    assert "disk_tier" in text
    (tmp_path / "tiered.yaml").write_text(text)
    make_data(tmp_path, produce_line(templates.OFFLINE))
    train = json_result(cli(tmp_path, "train", "tiered.yaml", "--json", timeout=300))
    assert 0.6 < train["metrics"]["auc"] <= 1.0
    tiers = tmp_path / "runs" / "criteo_offline" / "tiers"  # under run_dir, with the checkpoints
    stores = sorted(p.parent.relative_to(tiers).as_posix() for p in tiers.rglob("manifest.json"))
    assert stores == ["embedding/C1", "embedding/C2", "wide/C1", "wide/C2"]
    manifest = json.loads((tiers / "embedding" / "C1" / "manifest.json").read_text())
    # the weights and the example's table optimizer's per-row state (row-wise Adagrad's accumulator)
    assert manifest["generation"] >= 1 and {"weight", "sum"} <= set(manifest["files"])
    evaluated = json_result(cli(tmp_path, "eval", "tiered.yaml", "--json", timeout=300))
    assert abs(evaluated["metrics"]["auc"] - train["metrics"]["auc"]) < 1e-9  # the restored commit
    # The checkpoint exports with its tiered tables in memory (every row, from the restored commit).
    exported = cli(tmp_path, "export", "--checkpoint", "runs/criteo_offline/checkpoints", "--config", "tiered.yaml",
                   "--format", "torchscript", "--output", "model.pt", timeout=300)
    assert exported.returncode == 0, exported.stderr
    assert (tmp_path / "model.pt").stat().st_size > 0  # checked against the network before it was written


def test_a_disk_tier_naming_an_unknown_feature_is_refused():
    from recstream.data import criteo_schema
    from recstream.models import DeepFM
    from recstream.nn import TierPlan
    with pytest.raises(ValueError, match=r"disk_tier names \['nope'\], which are not categorical features"):
        DeepFM(criteo_schema(100, 4), disk_tier=TierPlan("t", {"nope": 10}))


def test_the_published_model_config_leaves_the_disk_tier_out(tmp_path, monkeypatch):
    """A server rebuilds the published network in memory: `disk_tier` (a path on the training machine)
    is not among the model arguments a version records."""
    from recstream.cli import build
    from recstream.cli.run_command import load_config
    from recstream.serving.snapshot.model_spec import build_model
    text = (EXAMPLES / "criteo_offline.yaml").read_text().replace(
        "  dropout: 0.0\n", "  dropout: 0.0\n  disk_tier: {directory: tiers, cache_rows: {C1: 64}}\n")
    text = text.replace("# publish: {}", "publish: {}", 1)
    assert "disk_tier" in text and "\npublish: {}" in text
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiered.yaml").write_text(text)
    for path in re.findall(r"path: (data/\S+)", text):  # the config is checked, not run: files need only exist
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).touch()
    cfg, doc = load_config("tiered.yaml")
    schema = build.build_schema(cfg, doc)
    publisher = build.build_publisher(cfg, doc, schema, str(tmp_path / "run"), online=False)
    config = publisher.writer.model_config
    assert "disk_tier" not in config and config == cfg.model.args(exclude=("type", "disk_tier"))
    rebuilt = build_model({"schema": schema.to_dict(), "model": {"class": "recstream.models.deepfm.DeepFM",
                                                                 "rebuild": "recstream.models", "config": config}})
    assert type(rebuilt).__name__ == "DeepFM" and not (tmp_path / "tiers").exists()
