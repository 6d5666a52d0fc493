"""An export is self-contained: its signature records the preprocessing, and `instances_to_inputs` turns
raw ``/predict`` instances into its inputs so that each format, run by its own runtime, answers what the
server answers for the same instances (a real server on a socket, the same published version)."""
from __future__ import annotations

import http.client
import json
import threading

import onnxruntime
import pytest
import torch

from recstream.data import CategoricalFeature, Schema
from recstream.models import WideDeep
from recstream.serving import ModelHolder, make_server, publish_version
from recstream.serving.export import export_published, instances_to_inputs, read_signature
from recstream.serving.export.exporter import FORMATS
from recstream.serving.export.signature import INPUT_NAMES

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:DeprecationWarning")
SCHEMA = Schema(["clicks", "views"], [
    CategoricalFeature("user", hash_buckets=1000, embedding_dim=4),
    CategoricalFeature("item", vocab_size=50, embedding_dim=4),
    CategoricalFeature("tags", hash_buckets=64, embedding_dim=4, multi_hot=True, max_len=3),
])
PREPROCESSING = {"fill_missing_dense": 0.0, "log1p_dense": True}
SUFFIX = {"exported-program": "pt2", "onnx": "onnx", "torchscript": "pt"}
INSTANCES = [
    {"clicks": 3, "views": 120.5, "user": "alice", "item": 7, "tags": ["sports", "news"]},
    {"clicks": None, "views": 0, "user": 12345, "item": 0, "tags": []},
    {"clicks": 40, "views": None, "user": "bob", "item": 49, "tags": ["a", "b", "c", "d", "e"]},
    {"clicks": 0.5, "views": 9e6, "user": None, "item": 3, "tags": ["news"]},
]


def run(path: str, fmt: str, inputs: tuple) -> torch.Tensor:
    """The export run by its own runtime, as another server would."""
    if fmt == "onnx":
        session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
        return torch.from_numpy(session.run(None, {n: t.numpy() for n, t in zip(INPUT_NAMES, inputs, strict=True)})[0])
    module = torch.export.load(path).module() if fmt == "exported-program" else torch.jit.load(path)
    with torch.no_grad():
        return module(*inputs)


@pytest.fixture
def served(tmp_path):
    torch.manual_seed(3)
    net = WideDeep(SCHEMA, hidden=(8,))
    with torch.no_grad():
        for p in net.parameters():
            p.normal_(0.0, 0.3)
    publish_version(tmp_path / "pub", net, model_config={"hidden": [8]}, preprocessing=PREPROCESSING)
    holder = ModelHolder(tmp_path / "pub")
    assert holder.refresh()
    srv = make_server(holder, port=0)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv, tmp_path
    srv.shutdown()
    srv.server_close()
    thread.join(timeout=10)


def predict(srv, instances) -> list[float]:
    conn = http.client.HTTPConnection("127.0.0.1", srv.server_port, timeout=10)
    try:
        conn.request("POST", "/predict", body=json.dumps({"instances": instances}),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        body = json.loads(resp.read())
        assert resp.status == 200, body
        return body["scores"]
    finally:
        conn.close()


@pytest.mark.parametrize("fmt", [pytest.param(f, marks=[] if f == "torchscript" else pytest.mark.e2e)  # tier 2:
                                 for f in FORMATS])  # torch.export takes seconds (as in test_export.py)
def test_each_format_fed_by_the_helper_answers_what_the_server_answers(fmt, served):
    srv, tmp = served
    path = str(tmp / f"model.{SUFFIX[fmt]}")
    export_published(tmp / "pub", path, fmt)
    sig = read_signature(path, fmt)
    assert sig["preprocessing"] == PREPROCESSING and sig["output"] == "logits"
    want = predict(srv, INSTANCES)
    got = torch.sigmoid(run(path, fmt, instances_to_inputs(sig, INSTANCES)))
    assert got.tolist() == pytest.approx(want, abs=1e-6)
    assert len(set(want)) == len(want)  # the instances differ, and so do their scores
    # Without the log1p the scores are not the server's.
    raw = dict(sig, preprocessing={"fill_missing_dense": 0.0})
    assert torch.sigmoid(run(path, fmt, instances_to_inputs(raw, INSTANCES))).tolist() != pytest.approx(want, abs=1e-6)


def test_the_helper_refuses_what_the_server_refuses(served):
    srv, tmp = served
    sig = export_published(tmp / "pub", str(tmp / "m.pt"), "torchscript")
    with pytest.raises(ValueError, match=r"instances_to_inputs: instance 1: 'item' id 50 is outside \[0, 50\)"):
        instances_to_inputs(sig, [INSTANCES[0], {**INSTANCES[0], "item": 50}])
    with pytest.raises(ValueError, match=r"no \['preprocessing'\] entry .* export the model again"):
        instances_to_inputs({k: v for k, v in sig.items() if k != "preprocessing"}, INSTANCES)
    with pytest.raises(TypeError, match="instances_to_inputs: 'instances' must be"):
        instances_to_inputs(sig, INSTANCES[0])


def test_preprocessing_is_checked_when_exporting(tmp_path):
    from recstream.serving.export import export_model
    net = WideDeep(SCHEMA, hidden=(8,))
    with pytest.raises(ValueError, match=r"export_model: 'preprocessing' has unknown option\(s\) \['log1p'\]"):
        export_model(net, SCHEMA, str(tmp_path / "m.pt"), "torchscript", preprocessing={"log1p": True})
    with pytest.raises(TypeError, match="log1p_dense"):
        export_model(net, SCHEMA, str(tmp_path / "m.pt"), "torchscript", preprocessing={"log1p_dense": "yes"})
