"""Retention keeps the newest `keep` versions and every version their delta chains need."""
import numpy as np
import pytest

from recstream.serving import SnapshotWriter, list_versions, load_version, prune
from recstream.serving.layout import read_manifest

from .helpers import CONFIG, SCHEMA, build, make_batch, new_model, train_step


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
