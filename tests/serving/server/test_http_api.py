"""The HTTP API on a real socket (server thread on 127.0.0.1): scores, metadata, and every rejection."""
import http.client
import json
import threading

import numpy as np
import pyarrow as pa
import pytest
import torch

from recstream.data import Features
from recstream.data.hashing import hash_strings, to_buckets
from recstream.serving import ModelHolder, SnapshotWriter, make_server

from ..helpers import CONFIG, SCHEMA, build, make_batch, new_model, predict, train_step

GOOD = {"x0": 0.5, "x1": -1, "user": "alice", "item": 7, "tags": [1, 2]}


@pytest.fixture
def server(tmp_path):
    net, opt = new_model()
    rng = np.random.default_rng(11)
    for _ in range(3):
        train_step(net, opt, make_batch(rng))
    SnapshotWriter(tmp_path, SCHEMA, model_factory=build, model_config=CONFIG).publish(net, step=3)
    holder = ModelHolder(tmp_path, build)
    assert holder.refresh()
    srv = make_server(holder, port=0, max_body_bytes=4096)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv, net
    srv.shutdown()
    srv.server_close()
    t.join(timeout=10)


def call(srv, method, path, body=None, headers=None, raw=None):
    conn = http.client.HTTPConnection("127.0.0.1", srv.server_port, timeout=10)
    try:
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        conn.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read()), resp.getheader("Connection")
    finally:
        conn.close()


def expected_scores(net, instances):
    """Scores computed without the server: hashing and feature layout done by hand."""
    users = to_buckets(hash_strings(pa.array([str(i["user"]) for i in instances])), 1000)
    tags = [t for i in instances for t in i["tags"][:3]]
    values = torch.tensor(np.concatenate([users, [i["item"] for i in instances], tags]).astype(np.int64))
    lengths = torch.tensor([[1] * len(instances), [1] * len(instances), [min(len(i["tags"]), 3) for i in instances]])
    dense = torch.tensor([[float(i["x0"]), float(i["x1"])] for i in instances])
    return torch.sigmoid(predict(net, Features.from_lengths(dense, values, lengths))).tolist()


def test_predict_matches_the_model(server):
    srv, net = server
    instances = [GOOD, {**GOOD, "user": 12345, "tags": []}, {**GOOD, "tags": [3, 4, 5, 6, 7]}, {**GOOD, "x0": 3}]
    status, body, _ = call(srv, "POST", "/predict", {"instances": instances})
    assert status == 200 and body["version"] == 1
    assert body["scores"] == pytest.approx(expected_scores(net, instances), abs=1e-6)
    assert len(set(body["scores"])) > 1 and all(0 < s < 1 for s in body["scores"])


def test_health_and_version(server):
    srv, _ = server
    assert call(srv, "GET", "/health")[:2] == (200, {"status": "ok", "version": 1})
    status, info, _ = call(srv, "GET", "/version")
    assert status == 200 and info["version"] == 1 and info["kind"] == "full" and info["step"] == 3
    assert info["loaded_at"] >= info["created"] and info["skipped"] == []


def test_schema_lists_every_field_with_its_type_and_an_example_the_server_takes(server):
    srv, _ = server
    status, body, _ = call(srv, "GET", "/schema")
    assert status == 200 and body["version"] == 1
    assert body["fields"] == [
        {"name": "x0", "kind": "dense", "type": "number", "nullable": False},
        {"name": "x1", "kind": "dense", "type": "number", "nullable": False},
        {"name": "user", "kind": "categorical", "type": "string or integer (the raw value)", "nullable": True},
        {"name": "item", "kind": "categorical", "type": "integer", "min": 0, "max": 49, "nullable": False},
        {"name": "tags", "kind": "categorical", "type": "integer", "min": 0, "max": 19, "nullable": False,
         "list": True, "max_len": 3}]
    assert body["preprocessing"] == {"fill_missing_dense": None, "log1p_dense": False}
    status, answer, _ = call(srv, "POST", "/predict", {"instances": [body["example"]]})
    assert status == 200 and len(answer["scores"]) == 1
    # a request missing fields points to it
    status, answer, _ = call(srv, "POST", "/predict", {"instances": [{}]})
    assert status == 400 and answer["error"] == ("instance 0: missing 5 field(s): 'item', 'tags', 'user', 'x0', "
                                                 "'x1' (GET /schema lists every field with its type)")
    assert answer["missing"] == 5


@pytest.mark.parametrize("instance,fragment", [
    ({**GOOD, "color": 1}, "unknown field(s) ['color']"),
    ({k: v for k, v in GOOD.items() if k != "item"}, "missing 1 field(s): 'item' (GET /schema lists"),
    ({**GOOD, "x0": "1.5"}, "'x0' must be a number"),
    ({**GOOD, "x0": True}, "'x0' must be a number"),
    ({**GOOD, "item": 50}, "'item' id 50 is outside [0, 50)"),
    ({**GOOD, "item": -1}, "'item' id -1 is outside [0, 50)"),
    ({**GOOD, "item": 2.0}, "'item' must be an integer id"),
    ({**GOOD, "item": [1]}, "'item' takes one value"),
    ({**GOOD, "tags": 3}, "'tags' is multi-hot and takes a list"),
    ({**GOOD, "tags": [1, 20]}, "'tags' id 20 is outside [0, 20)"),
    ({**GOOD, "user": 1.5}, "'user' values must be strings or integers"),
    ([1, 2], "must be a JSON object"),
])
def test_bad_instances_are_400_with_a_reason(server, instance, fragment):
    srv, _ = server
    status, body, _ = call(srv, "POST", "/predict", {"instances": [GOOD, instance]})
    assert status == 400 and fragment in body["error"] and body["error"].startswith("instance 1")


@pytest.mark.parametrize("raw,fragment", [
    (b"{not json", "invalid JSON"),
    (b'{"instances": [{"x0": NaN}]}', "NaN is not a number"),
    (b'{"instances": []}', "non-empty list"),
    (b'{"rows": []}', '{"instances": [...]}'),
    (b'{"instances": [], "debug": 1}', "unknown top-level field(s) ['debug']"),
    (b"\xff\xfe", "invalid JSON"),
    (json.dumps({"instances": [{**GOOD, "x1": 1.0}]}).replace("1.0", "1e400").encode(), "'x1' must be finite"),
])
def test_bad_bodies_are_400(server, raw, fragment):
    srv, _ = server
    status, body, _ = call(srv, "POST", "/predict", raw=raw)
    assert status == 400 and fragment in body["error"]


def test_limits_and_protocol_errors(server):
    srv, _ = server
    status, body, _ = call(srv, "POST", "/predict", {"instances": [GOOD] * 1025})
    assert status == 413 and body["max_body_bytes"] == 4096  # the body limit (4 KiB here) comes first
    srv.holder.current.parser.max_instances = 3
    status, body, _ = call(srv, "POST", "/predict", {"instances": [GOOD] * 4})
    assert status == 400 and "too many instances: 4 > 3" in body["error"]
    status, body, conn = call(srv, "POST", "/predict", raw=b"x" * 5000)
    assert status == 413 and "exceeds the limit of 4096" in body["error"] and conn == "close"
    status, body, _ = call(srv, "POST", "/predict", raw=b"{}", headers={"Content-Type": "text/csv"})
    assert status == 415
    assert call(srv, "GET", "/nope")[0] == 404
    assert call(srv, "GET", "/predict")[0] == 405
    assert call(srv, "POST", "/health", raw=b"{}")[0] == 405


def test_missing_content_length_is_411(server):
    srv, _ = server
    conn = http.client.HTTPConnection("127.0.0.1", srv.server_port, timeout=10)
    conn.putrequest("POST", "/predict")
    conn.endheaders()
    resp = conn.getresponse()
    assert resp.status == 411 and "Content-Length" in json.loads(resp.read())["error"]
    conn.close()


def test_keep_alive_serves_many_requests_on_one_connection(server):
    srv, _ = server
    conn = http.client.HTTPConnection("127.0.0.1", srv.server_port, timeout=10)
    for i in range(5):
        conn.request("POST", "/predict", body=json.dumps({"instances": [{**GOOD, "item": i}]}),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200 and len(json.loads(resp.read())["scores"]) == 1
    conn.close()


def test_no_model_yet_is_503(tmp_path):
    holder = ModelHolder(tmp_path)
    assert holder.refresh() is False
    srv = make_server(holder, port=0)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        assert call(srv, "GET", "/health")[:2] == (503, {"status": "no_model", "error": None})
        assert call(srv, "POST", "/predict", {"instances": [GOOD]})[0] == 503
    finally:
        srv.shutdown()
        srv.server_close()
