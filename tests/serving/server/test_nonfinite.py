"""Non-finite numbers at the server, on a real socket (issue 27, item 2): a dense value that is
finite in JSON but ``inf`` in float32 is a 400 naming the field and value; a model whose outputs
are not finite answers a JSON 500 naming the problem, never a plain-text traceback."""
import json
import socket
import threading

import pytest
import torch

from recstream.data import CategoricalFeature, Schema
from recstream.models import WideDeep
from recstream.serving import ModelHolder, make_server, publish_version

SCHEMA = Schema(["I1"], [CategoricalFeature("c", vocab_size=10)])


@pytest.fixture
def server(tmp_path):
    torch.manual_seed(0)
    publish_version(tmp_path, WideDeep(SCHEMA, hidden=(8,)), model_config={"hidden": [8]})
    holder = ModelHolder(tmp_path)
    assert holder.refresh()
    srv = make_server(holder, port=0)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    srv.net = holder.current.model
    yield srv
    srv.shutdown(timeout=30)
    srv.server_close()
    t.join(timeout=30)


def raw_request(port: int, request: bytes) -> tuple[int, bytes, bytes]:
    """(status, headers, body) of one request on a fresh socket, read until the server closes."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        s.sendall(request)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    finally:
        s.close()
    head, _, payload = out.partition(b"\r\n\r\n")
    return int(head.split()[1]), head, payload


def post_raw(port: int, body: bytes, path: str = "/predict") -> tuple[int, bytes, bytes]:
    return raw_request(port, b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                             b"Connection: close\r\nContent-Length: %d\r\n\r\n" % (path.encode(), len(body)) + body)


def predict(port, instances, path="/predict"):
    return post_raw(port, json.dumps({"instances": instances}).encode(), path)


@pytest.mark.parametrize("value", [1e39, -1e39, 3.5e38, 10 ** 39])
def test_a_dense_value_beyond_float32_is_a_json_400_naming_field_and_value(server, value):
    status, head, body = predict(server.server_port, [{"I1": 1.0, "c": 1}, {"I1": value, "c": 2}])
    assert status == 400 and b"application/json" in head.lower(), (head, body)
    answer = json.loads(body)
    assert answer["field"] == "I1" and answer["instance"] == 1 and answer["reason"] == "non_finite"
    assert "'I1'" in answer["error"] and "float32" in answer["error"]
    assert repr(float(value)) in answer["error"]  # as the parser read it
    status, _, body = predict(server.server_port, [{"I1": 3.4e38, "c": 1}])  # the largest finite ones pass
    assert status == 200 and all(map(lambda s: 0 <= s <= 1, json.loads(body)["scores"]))


def get_raw(port: int, path: str) -> tuple[int, bytes, bytes]:
    return raw_request(port, b"GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n" % path.encode())


@pytest.mark.parametrize("path", ["/predict", "/v1/models/recstream:predict"])
def test_a_model_with_non_finite_outputs_answers_a_json_500_naming_the_problem(server, path):
    with torch.no_grad():
        for p in server.net.parameters():
            p.fill_(float("nan"))
    for _ in range(2):  # every request, and the server stays up
        status, head, body = predict(server.server_port, [{"I1": 1.0, "c": 1}, {"I1": 2.0, "c": 2}], path)
        assert status == 500 and b"application/json" in head.lower(), (head, body)
        answer = json.loads(body)
        assert "non-finite" in answer["error"] and answer["reason"] == "non_finite_output", answer
        assert b"Traceback" not in body
    status, _, body = get_raw(server.server_port, "/health")
    assert status == 200 and json.loads(body)["status"] == "ok"


def test_an_unexpected_error_in_any_route_is_a_json_500_without_a_traceback(server, monkeypatch):
    def broken():
        raise RuntimeError("secret internals")
    monkeypatch.setattr(server.app.metrics, "exposition", broken)
    status, head, body = get_raw(server.server_port, "/metrics")
    assert status == 500 and b"application/json" in head.lower(), (head, body)
    answer = json.loads(body)
    assert answer == {"error": "internal error: RuntimeError"}  # the details stay in the server's log
    assert b"Traceback" not in body and b"secret" not in body
