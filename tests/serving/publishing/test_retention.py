"""Retention keeps the newest `keep` versions and every version their delta chains need."""
import numpy as np
import pytest
import torch

from recstream.serving import SnapshotWriter, list_versions, load_version, prune
from recstream.serving.snapshot.layout import read_manifest

from ..helpers import CONFIG, SCHEMA, build, make_batch, new_model, train_step


def publish_n(directory, n, keep, full_every):
    """Publish n versions; returns the version list seen after each publish."""
    net, opt = new_model()
    w = SnapshotWriter(directory, SCHEMA, model_factory=build, model_config=CONFIG, keep=keep, full_every=full_every)
    rng = np.random.default_rng(7)
    kept_after = []
    for _ in range(n):
        train_step(net, opt, make_batch(rng, batch_size=8))
        w.publish(net)
        kept_after.append(list_versions(directory))
    return kept_after


def test_keeps_chains_of_kept_deltas(tmp_path):
    # 1F 2D 3D 4F 5D 6D 7F 8D with keep=2: a kept delta pins its base and every link up to it.
    assert publish_n(tmp_path, 8, keep=2, full_every=3) == [
        [1], [1, 2], [1, 2, 3], [1, 2, 3, 4], [4, 5], [4, 5, 6], [4, 5, 6, 7], [7, 8]]


@pytest.mark.parametrize("keep,full_every", [(1, 1), (2, 3), (3, 4), (5, 10)])
def test_every_kept_version_loads(tmp_path, keep, full_every):
    kept = publish_n(tmp_path, 9, keep=keep, full_every=full_every)
    for n, versions in enumerate(kept, start=1):
        assert versions[-keep:] == list(range(max(1, n - keep + 1), n + 1))
    final = list_versions(tmp_path)
    for v in final[-keep:]:
        load_version(tmp_path, v, build)
    bases = [read_manifest(tmp_path, v)["base"] for v in final[-keep:]]
    assert min(final) == min(bases)  # nothing older than the oldest needed base survives


def test_torn_versions_do_not_count_towards_keep(tmp_path):
    publish_n(tmp_path, 4, keep=10, full_every=2)        # 1F 2D 3F 4D
    (tmp_path / "v00000004" / "manifest.json").unlink()  # the newest is torn
    assert prune(tmp_path, keep=1) == [1, 2]             # 3 is the newest usable one: kept, 4 kept as is
    assert list_versions(tmp_path) == [3, 4]
    load_version(tmp_path, 3, build)
    with pytest.raises(ValueError, match="keep"):
        prune(tmp_path, keep=0)


def publish_new_ids(directory, n, keep, full_every, users_per_step):
    """Publish n versions, each after a step whose users were never seen before; returns the kinds and,
    after each publish, (versions on disk, bytes of their safetensors files)."""
    net, opt = new_model(capacity=96, evict_filter_value=1)  # unseen for a step: evicted
    w = SnapshotWriter(directory, SCHEMA, model_factory=build, model_config={**CONFIG, "evict_filter_value": 1},
                       keep=keep, full_every=full_every)
    rng = np.random.default_rng(3)
    kinds, disk = [], []
    for i in range(n):
        batch = make_batch(rng, batch_size=users_per_step, users=10**6)
        batch.features.values[:users_per_step] = torch.arange(users_per_step) + 1 + i * users_per_step  # all new
        train_step(net, opt, batch)
        kinds.append(w.publish(net)["kind"])
        disk.append((len(list_versions(directory)), sum(p.stat().st_size for p in directory.rglob("*.safetensors"))))
    return kinds, disk


def test_a_delta_not_smaller_than_a_full_version_is_written_full(tmp_path):
    # Every id new at every step, the table at capacity: a delta holds every row plus the evicted keys,
    # more than a full version. Before: 1 full + 9 such deltas, all kept (a kept delta pins its chain).
    kinds, disk = publish_new_ids(tmp_path, 12, keep=3, full_every=10, users_per_step=90)
    assert kinds == ["full"] * 12
    assert [n for n, _ in disk][2:] == [3] * 10
    load_version(tmp_path, 12, build)


def test_retention_bounds_versions_and_bytes(tmp_path):
    # Some ids new, some seen: deltas smaller than a full version. At most keep + full_every - 1 versions
    # are on disk (the newest keep and the chain of the oldest of them), none larger than a full version.
    keep, full_every = 3, 10
    kinds, disk = publish_new_ids(tmp_path, 40, keep=keep, full_every=full_every, users_per_step=12)
    assert "delta" in kinds
    fulls = [read_manifest(tmp_path, v) for v in list_versions(tmp_path)]
    full_bytes = max(sum(e["bytes"] for e in m["files"].values()) for m in fulls if m["kind"] == "full")
    for versions, size in disk:
        assert versions <= keep + full_every - 1
        assert size <= (keep + full_every - 1) * full_bytes
    for v in list_versions(tmp_path)[-keep:]:
        load_version(tmp_path, v, build)
