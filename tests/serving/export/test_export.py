"""Exports round-trip: every model in every format, run by its own runtime, scores the network's.

Each exported file is loaded the way another server would load it (ONNX Runtime's
``InferenceSession``, ``torch.export.load(...).module()``, ``torch.jit.load``) and run on
batches of other sizes than the traced one (4), with multi-hot, mean-pooled and empty bags.
"""
from __future__ import annotations

import os

import numpy as np
import onnxruntime
import pytest
import torch

from recstream.data import CategoricalFeature, Schema
from recstream.features import Features
from recstream.models import DLRM, DCNv2, DeepFM, WideDeep, default_optimizer
from recstream.nn import HashEmbedding
from recstream.serving.export.exporter import (
    FORMATS,
    ExportError,
    export_model,
    export_published,
    find_publish_dir,
    read_signature,
)
from recstream.serving.publishing.publish import publish_version
from recstream.serving.snapshot.layout import MODEL_FILE, SnapshotError, version_path
from tests.serving.helpers import make_batch, new_model, train_step

# Loading TorchScript the way LibTorch users do: its deprecation warning is not this test's concern.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:DeprecationWarning")
SCHEMA = Schema(["x0", "x1", "x2"], [
    CategoricalFeature("user", vocab_size=40, embedding_dim=4),
    CategoricalFeature("item", vocab_size=25, embedding_dim=8),
    CategoricalFeature("tags", vocab_size=30, embedding_dim=4, multi_hot=True, pooling="mean"),
])
# Mixed widths (WideDeep, DCNv2) put the tables in two fused groups with a padding row each.
MODELS = {
    "WideDeep": lambda: WideDeep(SCHEMA, hidden=(8,)),
    "DeepFM": lambda: DeepFM(SCHEMA, hidden=(8,), embedding_dim=4),
    "DCNv2": lambda: DCNv2(SCHEMA, num_cross_layers=2, hidden=(8,), structure="parallel", low_rank=2),
    "DLRM": lambda: DLRM(SCHEMA, bottom=(8,), top=(8,), embedding_dim=4),
}
SUFFIX = {"exported-program": "pt2", "onnx": "onnx", "torchscript": "pt"}


def network(name: str) -> torch.nn.Module:
    """A model with every parameter random, the wide weights and padding rows included (they start
    at zero, where a wrong lookup would go unseen)."""
    torch.manual_seed(1)
    net = MODELS[name]()
    with torch.no_grad():
        for p in net.parameters():
            p.normal_(0.0, 0.3)
    return net.eval()


def batch(batch_size: int, seed: int) -> Features:
    """Ragged bags: 0..3 tags per example (so some are empty), one user and one item."""
    rng = np.random.default_rng(seed)
    n_tags = rng.integers(0, 4, batch_size)
    values = np.concatenate([rng.integers(0, 40, batch_size), rng.integers(0, 25, batch_size),
                             rng.integers(0, 30, int(n_tags.sum()))])
    lengths = np.stack([np.ones(batch_size, np.int64), np.ones(batch_size, np.int64), n_tags])
    dense = torch.from_numpy(rng.standard_normal((batch_size, 3)).astype(np.float32))
    return Features.from_lengths(dense, torch.from_numpy(values.astype(np.int64)), torch.from_numpy(lengths))


def run_file(path: str, fmt: str, x: Features) -> torch.Tensor:
    """Scores of the exported file, run as another server would run it."""
    if fmt == "onnx":
        session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
        feed = {"dense": x.dense.numpy(), "values": x.values.numpy(), "offsets": x.offsets.numpy()}
        return torch.from_numpy(session.run(None, feed)[0])
    module = torch.export.load(path).module() if fmt == "exported-program" else torch.jit.load(path)
    with torch.no_grad():
        return module(x.dense, x.values, x.offsets)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("name", list(MODELS))
def test_export_scores_like_the_network(name, fmt, tmp_path):
    net = network(name)
    path = str(tmp_path / f"model.{SUFFIX[fmt]}")
    sig = export_model(net, SCHEMA, path, format=fmt, verify=False)  # the test is the check here
    assert sig["format"] == fmt and os.listdir(tmp_path) == [os.path.basename(path)]
    for batch_size, seed in ((4, 0), (7, 1), (1, 2), (33, 3)):
        x = batch(batch_size, seed)
        with torch.no_grad():
            want = net(x)
        got = run_file(path, fmt, x)
        assert got.shape == (batch_size,) and got.dtype == torch.float32
        torch.testing.assert_close(got, want, rtol=0.0, atol=1e-5)


def test_export_leaves_the_network_alone(tmp_path):
    net = network("WideDeep").train()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    export_model(net, SCHEMA, str(tmp_path / "m.pt"), format="torchscript")
    assert net.training and net.embedding.ebc.validate and net.wide.ebc.validate
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())
    assert next(net.parameters()).requires_grad


@pytest.mark.parametrize("fmt", FORMATS)
def test_signature_is_recorded_in_the_file(fmt, tmp_path):
    path = str(tmp_path / f"m.{SUFFIX[fmt]}")
    sig = export_model(network("DLRM"), SCHEMA, path, format=fmt, output="probabilities", metadata={"note": "x"})
    stored = read_signature(path, fmt)
    assert stored == sig
    assert [(i["name"], i["dtype"], i["shape"]) for i in stored["inputs"]] == [
        ("dense", "float32", ["batch", 3]), ("values", "int64", ["num_ids"]), ("offsets", "int64", ["3*batch+1"])]
    assert stored["outputs"] == [{"name": "probabilities", "dtype": "float32", "shape": ["batch"]}]
    assert Schema.from_dict(stored["schema"]) == SCHEMA and stored["note"] == "x"
    if fmt == "onnx":  # the output tensor itself carries the name
        session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
        assert [o.name for o in session.get_outputs()] == ["probabilities"]
        assert [i.name for i in session.get_inputs()] == ["dense", "values", "offsets"]


def test_argument_errors(tmp_path):
    net = network("DeepFM")
    with pytest.raises(ValueError, match=r"export_model: 'format' must be one of .*'onnx'.*got 'tflite'"):
        export_model(net, SCHEMA, str(tmp_path / "m.x"), format="tflite")
    with pytest.raises(FileNotFoundError, match="export_model: the directory of 'path' does not exist"):
        export_model(net, SCHEMA, str(tmp_path / "missing" / "m.pt"), format="torchscript")
    with pytest.raises(IsADirectoryError, match="must be a file path"):
        export_model(net, SCHEMA, str(tmp_path), format="torchscript")
    with pytest.raises(ValueError, match=r"must end in \.pt2"):
        export_model(net, SCHEMA, str(tmp_path / "m.pt"), format="exported-program")
    with pytest.raises(ValueError, match=r"export_model: 'metadata' must not redefine .*\['inputs'\]"):
        export_model(net, SCHEMA, str(tmp_path / "m.pt"), format="torchscript", metadata={"inputs": []})
    with pytest.raises(TypeError, match="export_model: 'schema' must be a recstream.data.Schema"):
        export_model(torch.nn.Linear(2, 1), None, str(tmp_path / "m.pt"), format="torchscript")
    assert os.listdir(tmp_path) == []


def test_a_network_that_cannot_be_exported_leaves_no_file(tmp_path):
    class Branchy(torch.nn.Module):  # control flow on tensor VALUES: no export format carries it
        schema = SCHEMA

        def forward(self, features):
            return features.dense.sum(1) if bool(features.values.sum() > 10) else features.dense.mean(1)

    with pytest.raises(ExportError, match="torch.export cannot export Branchy"):
        export_model(Branchy(), SCHEMA, str(tmp_path / "m.pt"), format="torchscript")
    assert os.listdir(tmp_path) == []


def publish(directory, name: str = "DLRM", **kwargs) -> torch.nn.Module:
    net = network(name)
    config = {"bottom": [8], "top": [8], "embedding_dim": 4}
    publish_version(directory, net, schema=SCHEMA, model_config=config, **kwargs)
    return net


def test_export_published_takes_the_newest_usable_version(tmp_path):
    pub = tmp_path / "run" / "publish"
    first = publish(pub, step=10)
    with torch.no_grad():
        for p in first.parameters():
            p.add_(1.0)
    publish(pub, step=20)  # a different network (seed is the same: shift it to tell them apart)
    with open(os.path.join(version_path(pub, 2), MODEL_FILE), "r+b") as f:  # corrupt version 2
        f.truncate(10)
    out = str(tmp_path / "m.pt")
    sig = export_published(tmp_path / "run", out, "torchscript")  # a run directory holding one publish dir
    assert sig["source"]["version"] == 1 and sig["source"]["step"] == 10
    assert sig["source"]["directory"] == os.path.abspath(pub)
    x = batch(5, 7)
    with torch.no_grad():
        want = network("DLRM")(x)  # version 1: the network as first built
    torch.testing.assert_close(run_file(out, "torchscript", x), want, rtol=0.0, atol=1e-5)


def test_export_published_errors(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="no published version in"):
        export_published(empty, str(tmp_path / "m.pt"), "torchscript")
    pub = tmp_path / "pub"
    publish(pub)
    with open(os.path.join(version_path(pub, 1), MODEL_FILE), "r+b") as f:
        f.truncate(10)
    with pytest.raises(SnapshotError, match="no usable version"):
        export_published(pub, str(tmp_path / "m.pt"), "torchscript")
    publish(tmp_path / "two" / "a")
    publish(tmp_path / "two" / "b")
    with pytest.raises(ValueError, match=r"several publish directories \['a', 'b'\]"):
        find_publish_dir(tmp_path / "two")
    assert not os.path.exists(tmp_path / "m.pt")


def test_a_user_network_holding_a_hash_embedding_exports(tmp_path):
    net, opt = new_model()  # one HashEmbedding for all features, called with the network's own keys
    rng = np.random.default_rng(0)
    for _ in range(3):
        train_step(net, opt, make_batch(rng))
    net.eval()
    path = str(tmp_path / "m.pt")
    export_model(net, net.schema, path, format="torchscript")
    x = make_batch(np.random.default_rng(1), batch_size=9, users=600).features  # half the users never seen
    with torch.no_grad():
        torch.testing.assert_close(run_file(path, "torchscript", x), net(x), rtol=0.0, atol=1e-5)


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_model_whose_dynamic_features_share_a_table_exports(fmt, tmp_path):
    schema = Schema(["x0", "x1", "x2"], [
        CategoricalFeature("user", dynamic=True, capacity=64, embedding_dim=4, table="ids"),
        CategoricalFeature("item", vocab_size=25, embedding_dim=4),
        CategoricalFeature("tags", dynamic=True, capacity=64, embedding_dim=4, multi_hot=True, table="ids"),
    ])
    torch.manual_seed(0)
    net = DeepFM(schema, hidden=(8,))
    opt = default_optimizer(net)
    for seed in range(3):  # rows for the ids of a few batches (users 0..39, tags 0..29: the same ids)
        x = batch(16, seed)
        opt.zero_grad()
        net(x).sum().backward()
        opt.step()
    net.eval()
    path = str(tmp_path / f"model.{SUFFIX[fmt]}")
    export_model(net, schema, path, format=fmt, verify=False)
    for batch_size, seed in ((4, 5), (9, 6)):
        x = batch(batch_size, seed)
        with torch.no_grad():
            torch.testing.assert_close(run_file(path, fmt, x), net(x), rtol=0.0, atol=1e-5)


def test_onnx_keeps_the_stock_translation_for_other_pooling_modes(tmp_path):
    class MaxPooled(torch.nn.Module):  # a user network: nn.EmbeddingBag in "max" mode, not the collection's "sum"
        def __init__(self):
            super().__init__()
            self.bag = torch.nn.EmbeddingBag(40, 3, mode="max", include_last_offset=True)

        def forward(self, features):
            pooled = self.bag(features.values, features.offsets).view(features.num_features, features.batch_size, 3)
            return pooled.sum((0, 2)) + features.dense[:, 0]

    schema = Schema(["x0", "x1", "x2"], [CategoricalFeature(n, vocab_size=40) for n in ("a", "b", "c")])
    torch.manual_seed(3)
    net = MaxPooled().eval()
    path = str(tmp_path / "m.onnx")
    export_model(net, schema, path, format="onnx", verify=False)
    rng = np.random.default_rng(4)
    x = Features.from_lengths(torch.randn(6, 3), torch.from_numpy(rng.integers(0, 25, 18)), torch.ones(3, 6))
    with torch.no_grad():
        torch.testing.assert_close(run_file(path, "onnx", x), net(x), rtol=0.0, atol=1e-5)


# Dynamic-id features (a HashEmbedding each) mixed with fixed ones. WideDeep's mixed widths give its
# deep collection two groups (the ids of the dynamic features go to a padding row); DeepFM's one
# width makes its collection select its own features out of the batch (a data-dependent size).
DYN_SCHEMA = Schema(["x0", "x1"], [
    CategoricalFeature("user", dynamic=True, capacity=64, embedding_dim=4, permit_filter_value=2),
    CategoricalFeature("item", vocab_size=25, embedding_dim=8),
    CategoricalFeature("tags", dynamic=True, capacity=64, embedding_dim=4, multi_hot=True, pooling="mean"),
    CategoricalFeature("city", vocab_size=10, embedding_dim=4),
])
DYN_MODELS = {
    "WideDeep": lambda: WideDeep(DYN_SCHEMA, hidden=(8,)),
    "DeepFM": lambda: DeepFM(DYN_SCHEMA, hidden=(8,), embedding_dim=4),  # first-order weights in the tables
}
ADMITTED = [-1, -2, *range(10**12, 10**12 + 10)]  # seen twice in training (-1/-2: the reserved ids)
PENDING = list(range(10**12 + 100, 10**12 + 105))  # seen once: permit_filter_value=2 keeps them pending
UNSEEN = [10**13, 2**62, -5, 0, 2**63 - 1]
TAGS = [-1, *range(12)]


def dyn_batch(users, rng, tags=TAGS) -> Features:
    b = len(users)
    n_tags = rng.integers(0, 4, b)  # some bags empty
    values = np.concatenate([np.asarray(users, np.int64), rng.integers(0, 25, b),
                             rng.choice(np.asarray(tags, np.int64), int(n_tags.sum())), rng.integers(0, 10, b)])
    lengths = np.stack([np.ones(b, np.int64), np.ones(b, np.int64), n_tags, np.ones(b, np.int64)])
    dense = torch.from_numpy(rng.standard_normal((b, 2)).astype(np.float32))
    return Features.from_lengths(dense, torch.from_numpy(values.astype(np.int64)), torch.from_numpy(lengths))


def user_table(net) -> HashEmbedding:
    return next(m for n, m in net.named_modules() if isinstance(m, HashEmbedding) and n.endswith("user")
                and m.embedding_size > 1)  # the embedding's table, not the wide term's


def dyn_network(name: str, max_norm: bool = False) -> torch.nn.Module:
    """Trained 3 steps: ADMITTED users admitted, PENDING pending, every tag admitted."""
    torch.manual_seed(2)
    net = DYN_MODELS[name]()
    opt = default_optimizer(net, lr=0.05)
    rng = np.random.default_rng(5)
    users = rng.permutation(np.array(ADMITTED * 2 + PENDING, np.int64))
    for part in np.array_split(users, 3):
        x = dyn_batch(part, rng)
        net.train()
        opt.zero_grad()
        torch.nn.functional.binary_cross_entropy_with_logits(net(x), torch.ones(len(part))).backward()
        opt.step()
    table = user_table(net)
    assert table.num_rows == len(ADMITTED) and table.num_pending == len(PENDING)
    if max_norm:  # about half the rows get scaled in eval mode
        table.max_norm = float(table.export(reset_delta=False)["values"].norm(dim=1).median())
    return net.eval()


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("name, max_norm", [("WideDeep", False), ("DeepFM", True)])
def test_dynamic_features_export_scores_like_the_network(name, max_norm, fmt, tmp_path):
    net = dyn_network(name, max_norm)
    path = str(tmp_path / f"model.{SUFFIX[fmt]}")
    export_model(net, DYN_SCHEMA, path, format=fmt, verify=False)  # the test is the check here
    rng = np.random.default_rng(11)
    pool = np.array(ADMITTED + PENDING + UNSEEN, np.int64)
    for users in (pool, rng.choice(pool, 7), pool[:1], rng.choice(pool, 33)):
        x = dyn_batch(users, rng, tags=TAGS + [-2, 99, 2**40])  # unseen tags too
        with torch.no_grad():
            want = net(x)
        got = run_file(path, fmt, x)
        assert got.shape == want.shape and got.dtype == torch.float32
        torch.testing.assert_close(got, want, rtol=0.0, atol=1e-5)


def test_a_dynamic_export_is_a_snapshot_and_says_which_features_are_dynamic(tmp_path):
    net = dyn_network("WideDeep")
    path = str(tmp_path / "m.pt")
    sig = export_model(net, DYN_SCHEMA, path, format="torchscript")  # verified on example inputs too
    stored = read_signature(path, "torchscript")["schema"]["categorical"]
    assert stored == sig["schema"]["categorical"]
    assert [c["name"] for c in stored if c.get("dynamic")] == ["user", "tags"]
    new_user = 10**12 + 100  # pending at export time; admitted by one more training forward
    x = dyn_batch([new_user, ADMITTED[0]], np.random.default_rng(3))
    before = run_file(path, "torchscript", x)
    net.train()(x)
    net.eval()
    assert user_table(net).num_pending == len(PENDING) - 1
    with torch.no_grad():
        now = net(x)
    assert run_file(path, "torchscript", x)[0] == before[0] != now[0]  # the file still reads the default
    torch.testing.assert_close(run_file(path, "torchscript", x)[1], now[1], rtol=0.0, atol=1e-5)


def test_a_key_sharded_table_is_refused(tmp_path, monkeypatch):
    net = dyn_network("WideDeep")
    monkeypatch.setattr(HashEmbedding, "sharded", property(lambda self: True))
    refused = r"export_model: 'network' holds key-sharded HashEmbeddings \['embedding\.dynamic"
    with pytest.raises(ValueError, match=refused):
        export_model(net, DYN_SCHEMA, str(tmp_path / "m.pt"), format="torchscript")
    assert os.listdir(tmp_path) == []
