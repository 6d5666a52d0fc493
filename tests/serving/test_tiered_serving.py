"""A network with disk-tiered tables publishes and exports what the in-memory network would: every row
(stored rows overlaid by the cache's trained ones), served by a real server on a socket with the scores
of the training network; publishing commits nothing of the stores (a checkpoint's generation stays
restorable); a table that cannot fit in memory is refused up front, naming it."""
from __future__ import annotations

import http.client
import json
import threading

import numpy as np
import pytest
import torch

from recstream.data import CategoricalFeature, Features, Schema
from recstream.models import WideDeep
from recstream.nn import TierPlan, tier_export
from recstream.optim import LazyAdam
from recstream.serving import ModelHolder, SnapshotWriter, make_server
from recstream.serving.export import export_model, instances_to_inputs, read_signature

SCHEMA = Schema(["x0"], [CategoricalFeature("a", vocab_size=400, embedding_dim=4),
                         CategoricalFeature("b", vocab_size=30, embedding_dim=4)])
CONFIG = {"hidden": [8]}


def _instances(rng, n):
    return [{"x0": float(rng.standard_normal()), "a": int(rng.integers(0, 400)), "b": int(rng.integers(0, 30))}
            for _ in range(n)]


def _features(instances) -> Features:
    values = torch.tensor([i["a"] for i in instances] + [i["b"] for i in instances])
    dense = torch.tensor([[i["x0"]] for i in instances])
    return Features.from_lengths(dense, values, torch.ones(2, len(instances), dtype=torch.int64))


def _train(net, opt, rng, steps):
    for _ in range(steps):
        x = _features(_instances(rng, 16))
        opt.zero_grad()
        torch.nn.functional.binary_cross_entropy_with_logits(net(x), torch.from_numpy(
            rng.integers(0, 2, 16).astype(np.float32))).backward()
        opt.step()


def _scores(net, instances) -> list[float]:
    net.eval()
    try:
        with torch.no_grad():
            # 16 at a time: a batch's distinct rows must fit the 24-row cache
            return [s for i in range(0, len(instances), 16)
                    for s in torch.sigmoid(net(_features(instances[i:i + 16]))).tolist()]
    finally:
        net.train()


def _tiered(tmp_path):
    """WideDeep whose 'a' tables (deep and wide) are on disk behind 12-row caches: training evicts
    rows (written back) and leaves trained rows only in the cache."""
    torch.manual_seed(0)
    net = WideDeep(SCHEMA, hidden=(8,), disk_tier=TierPlan(str(tmp_path / "tiers"), {"a": 24}))
    return net, LazyAdam(net.parameters(), lr=0.05)


def _generations(net) -> list[int]:
    return [c.store.generation for ebc in tier_export.tiered_collections(net) for c in ebc._tiers if c is not None]


def _call(srv, instances):
    conn = http.client.HTTPConnection("127.0.0.1", srv.server_port, timeout=10)
    try:
        conn.request("POST", "/predict", body=json.dumps({"instances": instances}),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def test_published_versions_of_a_tiered_network_serve_its_scores(tmp_path):
    net, opt = _tiered(tmp_path)
    rng = np.random.default_rng(3)
    _train(net, opt, rng, 12)
    assert any(s.misses > 24 for s in _stats(net))  # rows were evicted and read back
    writer = SnapshotWriter(tmp_path / "pub", SCHEMA, model_config=CONFIG)
    before = _generations(net)
    assert writer.publish(net, step=12)["kind"] == "full"
    assert _generations(net) == before  # a publish commits no store: the last checkpoint stays restorable
    holder = ModelHolder(tmp_path / "pub")  # rebuilt from the manifest: an in-memory WideDeep
    assert holder.refresh()
    srv = make_server(holder, port=0)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        probe = _instances(np.random.default_rng(9), 40)
        status, body = _call(srv, probe)
        assert status == 200 and body["version"] == 1
        assert body["scores"] == pytest.approx(_scores(net, probe), abs=1e-6)
        _train(net, opt, rng, 6)  # a second version: every row again (tables are published in full)
        assert writer.publish(net, step=18)["kind"] == "full"
        assert holder.refresh()
        status, body = _call(srv, probe)
        assert status == 200 and body["version"] == 2
        assert body["scores"] == pytest.approx(_scores(net, probe), abs=1e-6)
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join(timeout=10)


def _stats(net):
    return [s for ebc in tier_export.tiered_collections(net) for s in ebc.tier_stats().values()]


def test_an_export_of_a_tiered_network_scores_as_it(tmp_path):
    net, opt = _tiered(tmp_path)
    _train(net, opt, np.random.default_rng(4), 10)
    path = str(tmp_path / "m.pt")
    export_model(net, SCHEMA, path, format="torchscript")  # verified against the network too
    probe = _instances(np.random.default_rng(5), 30)
    scores = torch.sigmoid(torch.jit.load(path)(*instances_to_inputs(read_signature(path, "torchscript"), probe)))
    assert scores.tolist() == pytest.approx(_scores(net, probe), abs=1e-6)
    memory = tier_export.untiered_copy(net)  # the in-memory twin: the tiered tables' rows, no store
    assert tier_export.tiered_collections(memory) == [] and len(tier_export.tiered_collections(net)) == 2
    assert _scores(memory, probe) == pytest.approx(_scores(net, probe), abs=1e-6)


def test_materializing_a_table_that_does_not_fit_is_refused_naming_it(tmp_path, monkeypatch):
    net, _ = _tiered(tmp_path)
    with pytest.raises(ValueError, match=r"table 'a' \(400 x 1 float32, 1600 bytes .* but 1000 bytes .* available"):
        tier_export.check_tiers_fit(net, "export", available=1000)
    # Through publish and export: a machine whose available memory is smaller than the table.
    monkeypatch.setattr(tier_export, "available_memory", lambda: 1000)
    with pytest.raises(ValueError, match=r"disk-tiered table 'a'"):
        SnapshotWriter(tmp_path / "pub", SCHEMA, model_config=CONFIG).publish(net)
    assert not list((tmp_path / "pub").glob("*/manifest.json"))  # nothing written
    with pytest.raises(ValueError, match=r"disk-tiered table 'a'"):
        export_model(net, SCHEMA, str(tmp_path / "m.pt"), format="torchscript")


def test_model_publisher_in_the_background_publishes_a_tiered_network_during_model_train(tmp_path):
    """`Model.train` with a background ModelPublisher: each version is taken (the tiered rows read once,
    not copied again) while training goes on, and the last one loads to the trained network's scores."""
    from recstream import Model
    from recstream.data import SyntheticCTR
    from recstream.models import DeepFM, default_optimizer
    from recstream.serving import ModelPublisher, load_latest
    from recstream.serving.snapshot.state_split import dense_state
    gen = SyntheticCTR(num_dense=2, num_categorical=2, vocab_sizes=[300, 20], batch_size=16)
    net = DeepFM(gen.schema, hidden=(8,), embedding_dim=4, disk_tier=TierPlan(str(tmp_path / "t"), {"C1": 40}))
    pub = ModelPublisher(tmp_path / "pub", every_steps=4, model_config={"hidden": [8], "embedding_dim": 4})
    Model(net, torch.nn.BCEWithLogitsLoss(), default_optimizer(net), progress_bar=False).train(
        1, gen.train_batches(12), callbacks=[pub])
    assert [m["step"] for m in pub.manifests][-1] == 12 and all(m["kind"] == "full" for m in pub.manifests)
    keys = tier_export.tiered_keys(net)  # the entries the publisher does not copy again: its tables' names
    assert len(keys) == 2 and keys <= set(dense_state(net, shapes_only=True))
    served, manifest = load_latest(tmp_path / "pub")
    batch = next(iter(gen.train_batches(1)))
    net.eval()
    with torch.no_grad():
        assert torch.equal(served(batch.features), net(batch.features))


def test_a_tiered_hash_embedding_publishes_full_and_delta_versions_that_serve_its_scores(tmp_path):
    """A HashEmbedding on disk (``tier=``) publishes through ``export()`` / ``export_delta()``: its keys'
    rows read from the store overlaid by the cache, no commit; a server rebuilds it in memory."""
    from recstream.nn import DiskTier, HashEmbedding
    from recstream.serving import load_latest

    from .helpers import CONFIG, HashCTR, build, make_batch, predict, train_step
    from .helpers import SCHEMA as HASH_SCHEMA
    torch.manual_seed(0)
    net = HashCTR(HASH_SCHEMA, **CONFIG)
    net.emb = HashEmbedding(4, capacity=CONFIG["capacity"], tier=DiskTier(str(tmp_path / "tier"), cache_rows=40))
    opt = LazyAdam(net.parameters(), lr=0.05)
    rng = np.random.default_rng(0)
    writer = SnapshotWriter(tmp_path / "pub", HASH_SCHEMA, model_factory=build, model_config=CONFIG)
    probe = make_batch(np.random.default_rng(7), batch_size=8).features
    for version, kind, steps in ((1, "full", 15), (2, "delta", 2)):  # (a delta: a few rows changed)
        for _ in range(steps):
            train_step(net, opt, make_batch(rng, batch_size=8))
        generation = net.emb._tier.store.generation
        assert writer.publish(net, step=steps * version)["kind"] == kind
        assert net.emb._tier.store.generation == generation  # a publish commits nothing
        served, manifest = load_latest(tmp_path / "pub", model_factory=build)
        assert manifest["version"] == version and served.emb.disk_tier is None
        assert torch.allclose(predict(served, probe), predict(net, probe), rtol=0, atol=1e-6)
    assert net.emb.tier_stats().misses > 40 and net.emb.num_rows > 40  # the cache held part of the rows


def test_an_export_of_a_model_with_a_tiered_dynamic_feature_scores_as_it(tmp_path):
    from recstream.models import DeepFM, default_optimizer
    schema = Schema(["x0"], [CategoricalFeature("user", dynamic=True, capacity=64, embedding_dim=4),
                             CategoricalFeature("b", vocab_size=30, embedding_dim=4)])
    torch.manual_seed(0)
    net = DeepFM(schema, hidden=(8,), disk_tier=TierPlan(str(tmp_path / "tiers"), {"user": 20}))
    assert net.embedding.dynamic.tables["user"].disk_tier is not None
    opt = default_optimizer(net)
    rng = np.random.default_rng(0)

    def features(n):
        values = torch.from_numpy(np.concatenate([rng.integers(0, 200, n) * 7919, rng.integers(0, 30, n)]))
        return Features.from_lengths(torch.from_numpy(rng.standard_normal((n, 1)).astype(np.float32)), values,
                                     torch.ones(2, n, dtype=torch.int64), keys=("user", "b"))

    for _ in range(10):
        opt.zero_grad()
        torch.nn.functional.binary_cross_entropy_with_logits(net(features(16)), torch.ones(16)).backward()
        opt.step()
    assert net.embedding.dynamic.tables["user"].tier_stats().misses > 20  # rows went to disk and came back
    path = str(tmp_path / "m.pt")
    export_model(net, schema, path, format="torchscript")  # verified against the network too
    x = features(12)
    net.eval()
    with torch.no_grad():
        scores = torch.jit.load(path)(*instances_to_inputs(read_signature(path, "torchscript"), [
            {"x0": float(x.dense[i, 0]), "user": int(x.values[i]), "b": int(x.values[12 + i])} for i in range(12)]))
        torch.testing.assert_close(scores, net(x), rtol=0.0, atol=1e-5)
