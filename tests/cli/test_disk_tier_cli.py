"""`model: disk_tier:` in a config: the named features' tables (DeepFM's embedding and linear tables)
train on disk behind a cache, checkpoint as commits of their stores, and `eval` restores them."""
from __future__ import annotations

import json

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
    assert manifest["generation"] >= 1 and {"weight", "exp_avg", "exp_avg_sq"} <= set(manifest["files"])
    evaluated = json_result(cli(tmp_path, "eval", "tiered.yaml", "--json", timeout=300))
    assert abs(evaluated["metrics"]["auc"] - train["metrics"]["auc"]) < 1e-9  # the restored commit


def test_a_disk_tier_naming_an_unknown_feature_is_refused():
    from recstream.data import criteo_schema
    from recstream.models import DeepFM
    from recstream.nn import TierPlan
    with pytest.raises(ValueError, match=r"disk_tier names \['nope'\], which are not fixed-vocabulary features"):
        DeepFM(criteo_schema(100, 4), disk_tier=TierPlan("t", {"nope": 10}))
