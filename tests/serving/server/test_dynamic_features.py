"""A recstream.models network with dynamic-id features, published (full and delta versions) and served
with no model factory: the server rebuilds it from the manifest and answers never-seen ids."""
import http.client
import json
import signal
import subprocess
import sys
import threading

import pyarrow as pa
import pytest
import torch

from recstream import RecModel
from recstream.data import CategoricalFeature, Features, Schema
from recstream.data.convert import ColumnConverter
from recstream.data.streams import IterableStream
from recstream.models import DeepFM, default_optimizer
from recstream.serving import InstanceParser, ModelHolder, ModelPublisher, RequestError, make_server
from recstream.serving.snapshot.state_split import hash_embeddings

SCHEMA = Schema(["x"], [
    CategoricalFeature("user", dynamic=True, capacity=64, embedding_dim=4),
    CategoricalFeature("item", vocab_size=10, embedding_dim=4),
    CategoricalFeature("tags", dynamic=True, capacity=32, multi_hot=True, embedding_dim=4),
])
CONFIG = {"hidden": [8], "embedding_dim": 4}


def batches(n: int, b: int = 16, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        n_tags = torch.randint(0, 3, (b,), generator=g)
        values = torch.cat([torch.randint(10**9, 10**9 + 30, (b,), generator=g),
                            torch.randint(0, 10, (b,), generator=g),
                            torch.randint(0, 20, (int(n_tags.sum()),), generator=g)])
        lengths = torch.stack([torch.ones(b, dtype=torch.int64), torch.ones(b, dtype=torch.int64), n_tags])
        out.append((Features.from_lengths(torch.randn(b, 1, generator=g), values, lengths),
                    torch.randint(0, 2, (b,), generator=g).float()))
    return out


@pytest.fixture
def published(tmp_path):
    """Online training with a publisher every 4 steps: one full version, then deltas."""
    torch.manual_seed(0)
    net = DeepFM(SCHEMA, **CONFIG)
    publisher = ModelPublisher(tmp_path, every_steps=4, model_config=CONFIG, on_error="raise")
    model = RecModel(net, torch.nn.BCEWithLogitsLoss(), default_optimizer(net, lr=1e-2), progress_bar=False)
    data = batches(12)
    model.online_train(IterableStream(lambda: iter(data)), callbacks=[publisher], dataset_sink_mode=False)
    return tmp_path, net, publisher.manifests


def scores(net, instances):
    net.eval()
    with torch.no_grad():
        return torch.sigmoid(net(InstanceParser(SCHEMA).parse({"instances": instances}))).tolist()


INSTANCES = [{"x": 0.3, "user": 10**9 + 3, "item": 2, "tags": [1, 2]},
             {"x": -1.0, "user": 77777777777, "item": 5, "tags": ["never-seen", 999]},  # unseen keys
             {"x": 0.1, "user": "a-new-user", "item": 0, "tags": []}]


def test_published_deltas_load_into_the_same_model(published):
    directory, net, manifests = published
    kinds = [m["kind"] for m in manifests]
    assert kinds[0] == "full" and "delta" in kinds
    assert set(manifests[-1]["hash_embeddings"]) == set(hash_embeddings(net))
    holder = ModelHolder(directory)  # no model_factory: rebuilt from the manifest
    assert holder.refresh()
    served = holder.current.model
    assert isinstance(served, DeepFM)
    for path, table in hash_embeddings(net).items():
        mine, theirs = table.export(reset_delta=False), hash_embeddings(served)[path].export(reset_delta=False)
        order_a, order_b = torch.argsort(mine["keys"]), torch.argsort(theirs["keys"])
        assert torch.equal(mine["keys"][order_a], theirs["keys"][order_b])
        assert torch.equal(mine["values"][order_a], theirs["values"][order_b])
    assert scores(served, INSTANCES) == pytest.approx(scores(net, INSTANCES), abs=1e-6)


def post(port, body):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("POST", "/predict", body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def test_http_app_answers_a_never_seen_id(published):
    directory, net, _ = published
    holder = ModelHolder(directory)
    assert holder.refresh()
    srv = make_server(holder, port=0)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        status, body = post(srv.server_port, {"instances": INSTANCES})
        assert status == 200, body
        assert body["scores"] == pytest.approx(scores(net, INSTANCES), abs=1e-6)
        status, body = post(srv.server_port, {"instances": [{**INSTANCES[0], "user": None}]})
        assert status == 400 and "user" in body["error"]
    finally:
        srv.shutdown()
        srv.server_close()
        t.join(timeout=10)


def test_recstream_serve_answers_a_never_seen_id(published):
    directory, net, _ = published
    proc = subprocess.Popen([sys.executable, "-m", "recstream", "serve", str(directory), "--port", "0",
                             "--log-level", "ERROR"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert "listening on http://127.0.0.1:" in line, (line, proc.stderr.read())
        port = int(line.split("http://127.0.0.1:")[1].split()[0])
        status, body = post(port, {"instances": INSTANCES})
        assert status == 200, body
        assert body["scores"] == pytest.approx(scores(net, INSTANCES), abs=1e-6)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_request_keys_match_the_training_reader():
    """The parser's direct path and the reader's converter give the same keys; bad values are 400s."""
    parser = InstanceParser(SCHEMA)
    instances = [{"x": 0.5, "user": -1, "item": 1, "tags": ["a", "", 5, "12"]},
                 {"x": 0.5, "user": "bob", "item": 2, "tags": []}, {"x": 0.5, "user": 2 ** 63 - 1, "item": 3,
                                                                   "tags": [2 ** 40]}]
    direct = parser.parse({"instances": instances})
    columns = parser.columns(instances)
    table = pa.table({"label": [0.0] * 3, "x": columns["x"], "user": [str(v) for v in columns["user"]],
                      "item": columns["item"], "tags": [[str(t) for t in v] for v in columns["tags"]]})
    batch, faults = ColumnConverter(SCHEMA).convert(table)
    assert not faults
    assert torch.equal(direct.values, batch.features.values) and torch.equal(direct.offsets, batch.features.offsets)
    for bad, fragment in [(None, "non-empty string"), ("", "non-empty string"), (2 ** 63, "int64"), (1.5, "float")]:
        with pytest.raises(RequestError, match=fragment):
            parser.parse({"instances": [{**instances[0], "user": bad}]})
