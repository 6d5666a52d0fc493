"""The server under hostile or heavy traffic, on real sockets: framing attacks, malformed JSON,
slow bodies, bursts of connections, micro-batching, metrics, graceful stop (issue 12, items 8-9)."""
import asyncio
import http.client
import json
import logging
import re
import shutil
import socket
import subprocess
import threading
import time

import pytest
import torch

from recstream.data import CategoricalFeature, Schema
from recstream.models import WideDeep
from recstream.serving import ModelHolder, make_server, publish_version

SCHEMA = Schema(["x"], [CategoricalFeature("c", vocab_size=50), CategoricalFeature("h", hash_buckets=100)])


def body_of(instances) -> bytes:
    return json.dumps({"instances": instances}).encode()


def inst(i: int) -> dict:
    return {"x": i / 7, "c": i % 50, "h": f"u{i}"}


@pytest.fixture
def start(tmp_path):
    """start(**make_server kwargs) -> running server on 127.0.0.1; stopped at teardown."""
    torch.manual_seed(0)
    net = WideDeep(SCHEMA, hidden=(8,))
    publish_version(tmp_path, net, model_config={"hidden": [8]})
    running = []

    def run(**kwargs):
        holder = ModelHolder(tmp_path)
        assert holder.refresh()
        srv = make_server(holder, port=0, **kwargs)
        t = threading.Thread(target=srv.serve_forever, daemon=True)
        t.start()
        running.append((srv, t))
        srv.net = holder.current.model
        return srv

    yield run
    for srv, t in running:
        srv.shutdown(timeout=30)
        srv.server_close()
        t.join(timeout=30)


def raw(port: int, data: bytes, timeout: float = 3.0) -> bytes:
    """Send `data` on a fresh connection; everything received until the server closes (or `timeout`)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    out = b""
    try:
        s.sendall(data)
        while chunk := s.recv(65536):
            out += chunk
    except TimeoutError:
        out += b"<open>"
    finally:
        s.close()
    return out


def post_head(length, ctype="application/json", extra=b"") -> bytes:
    return (b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: " + ctype.encode() + b"\r\n" + extra
            + (b"Content-Length: %d\r\n" % length if length is not None else b"") + b"\r\n")


def post(port, body: bytes, ctype="application/json", conn=None):
    own = conn is None
    conn = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("POST", "/predict", body=body, headers={"Content-Type": ctype} if ctype else {})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        if own:
            conn.close()


def expected(net, instances):
    from recstream.serving.server.request import InstanceParser
    with torch.no_grad():
        return torch.sigmoid(net(InstanceParser(SCHEMA).parse({"instances": instances})).reshape(-1)).tolist()


# --- item 9: framing, smuggling, content types, malformed JSON -------------------------------------
BODY = body_of([inst(1)])
SMUGGLING = {
    "two equal Content-Length": post_head(len(BODY), extra=b"Content-Length: %d\r\n" % len(BODY)) + BODY,
    "two different Content-Length": post_head(len(BODY), extra=b"Content-Length: 5\r\n") + BODY,
    "non-numeric Content-Length": post_head(None, extra=b"Content-Length: 1x\r\n") + BODY,
    "signed Content-Length": post_head(None, extra=b"Content-Length: +%d\r\n" % len(BODY)) + BODY,
    "Content-Length and chunked": post_head(4, extra=b"Transfer-Encoding: chunked\r\n")
    + b"0\r\n\r\nGET /version HTTP/1.1\r\nHost: x\r\n\r\n",
}


@pytest.mark.parametrize("case", sorted(SMUGGLING))
def test_ambiguous_framing_is_refused_with_one_answer(start, case):
    srv = start()
    out = raw(srv.server_port, SMUGGLING[case])
    assert out.count(b"HTTP/1.1 ") == 1, out  # never a second (smuggled) request
    assert out.startswith(b"HTTP/1.1 400 ") and b"<open>" not in out, out  # refused, connection closed
    assert b'"error": "malformed HTTP request' in out


@pytest.mark.parametrize("parser", ["httptools", "h11"])
def test_a_get_body_is_not_parsed_as_a_second_request(start, parser):
    srv = start(http=parser)
    smuggled = b"GET /version HTTP/1.1\r\nHost: x\r\n\r\n"
    out = raw(srv.server_port, b"GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(smuggled)
              + smuggled, timeout=1.5)
    assert out.count(b"HTTP/1.1 ") == 1 and b'"status": "ok"' in out and b'"kind"' not in out, out


@pytest.mark.parametrize("parser", ["httptools", "h11"])
def test_chunked_bodies_are_411_and_close(start, parser):
    srv = start(http=parser)
    out = raw(srv.server_port, post_head(None, extra=b"Transfer-Encoding: chunked\r\n")
              + b"%x\r\n" % len(BODY) + BODY + b"\r\n0\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 411 ") and out.count(b"HTTP/1.1 ") == 1 and b"<open>" not in out


@pytest.mark.parametrize("ctype,status", [("application/x-www-form-urlencoded", 415), ("text/plain", 415),
                                          ("", 415), ("application/json; charset=utf-8", 200),
                                          ("Application/JSON", 200)])
def test_only_json_bodies_are_accepted(start, ctype, status):
    srv = start()
    got, body = post(srv.server_port, BODY, ctype=ctype)
    assert got == status, body
    if status == 415:
        assert "Content-Type must be application/json" in body["error"]


DEEP = b'{"instances": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"


@pytest.mark.parametrize("raw_body,fragment", [
    (DEEP, "nested too deeply"),
    (b'{"instances": [{"x": 1' + b"0" * 400 + b', "c": 1, "h": "a"}]}', "'x' must be finite"),
    (b'{"instances": [{"x": 1e99999, "c": 1, "h": "a"}]}', "'x' must be finite"),
    (b'{"instances": [{"x": 1, "c": 1' + b"0" * 5000 + b', "h": "a"}]}', "invalid JSON"),
    (b'{"instances": [{"x": 1, "c": 1, "h": "\\ud800"}]}', "'h' is not valid Unicode text"),
    (b'{"instances": [{"x": 1, "c": 1, "h": "a", "\\udfff": 2}]}', "unknown field(s)"),
])
def test_hostile_json_is_400_without_a_traceback(start, raw_body, fragment, caplog):
    srv = start(max_body_bytes=1 << 20)
    with caplog.at_level(logging.DEBUG):
        status, body = post(srv.server_port, raw_body)
        assert post(srv.server_port, BODY)[0] == 200  # and the server goes on
    assert status == 400 and fragment in body["error"], body
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info], caplog.text


def test_health_and_version_do_not_disclose_paths(tmp_path):
    d = tmp_path / "secret-place"
    d.mkdir()
    holder = ModelHolder(d)
    publish_version(d, WideDeep(SCHEMA, hidden=(8,)), model_config={"hidden": [8]})
    publish_version(d, WideDeep(SCHEMA, hidden=(8,)), model_config={"hidden": [8]})
    (d / "v00000002" / "model.safetensors").write_bytes(b"torn")
    os_dir = str(d)
    assert holder.refresh()
    srv = make_server(holder, port=0)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", srv.server_port, timeout=10)
        conn.request("GET", "/version")
        text = conn.getresponse().read().decode()
        assert '"version": 1' in text and "fails its checksum" in text and os_dir not in text
        for v in (1, 2):  # now nothing is usable: /health explains why, without the path
            (d / f"v0000000{v}" / "manifest.json").unlink()
        holder._served = None
        holder._attempted = (0, None)
        holder.refresh()
        conn.request("GET", "/health")
        resp = conn.getresponse()
        text = resp.read().decode()
        assert resp.status == 503 and "manifest.json is missing" in text and "secret-place" not in text, text
    finally:
        srv.shutdown(timeout=30)
        srv.server_close()


# --- item 8: deadlines, Nagle, backlog, bursts, micro-batching --------------------------------------
def test_a_stalled_body_gets_408_and_the_connection_closes(start):
    srv = start(request_timeout=0.5)
    t0 = time.monotonic()
    out = raw(srv.server_port, post_head(100) + b'{"instances": [', timeout=10)
    assert out.startswith(b"HTTP/1.1 408 ") and b"not received within 0.5 s" in out, out
    assert b"<open>" not in out and time.monotonic() - t0 < 5
    assert post(srv.server_port, BODY)[0] == 200


def test_stalled_headers_and_silent_connections_are_closed(start):
    srv = start(request_timeout=0.5)
    t0 = time.monotonic()
    out = raw(srv.server_port, b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Ty", timeout=10)  # slowloris
    assert out.startswith(b"HTTP/1.1 408 ") and b"headers not received within 0.5 s" in out, out
    assert raw(srv.server_port, b"", timeout=10) == b""  # connected, never sent a byte: closed, no answer
    assert time.monotonic() - t0 < 8
    assert post(srv.server_port, BODY)[0] == 200


def test_keep_alive_answers_are_not_delayed_by_nagle(start):
    """Headers and body written separately without TCP_NODELAY wait ~40 ms for a delayed ACK."""
    srv = start()
    conn = http.client.HTTPConnection("127.0.0.1", srv.server_port, timeout=10)
    times = []
    for i in range(40):
        t0 = time.perf_counter()
        assert post(srv.server_port, body_of([inst(i)]), conn=conn)[0] == 200
        times.append(time.perf_counter() - t0)
    conn.close()
    assert sorted(times)[len(times) // 2] < 0.02, times  # median: a few ms, not 40


def test_listen_backlog_is_not_five(start):
    if shutil.which("ss") is None:
        pytest.skip("needs ss (iproute2) to read a listening socket's backlog")
    srv = start(backlog=1024)
    out = subprocess.run(["ss", "-ltnH", f"sport = :{srv.server_port}"], capture_output=True, text=True, timeout=10)
    if out.returncode != 0 or not out.stdout.strip():
        pytest.skip(f"ss cannot list listening sockets here: {out.stderr}")
    send_q = int(out.stdout.split()[2])  # for a listening socket: the backlog (capped by somaxconn)
    somaxconn = int(open("/proc/sys/net/core/somaxconn").read())
    assert send_q == min(1024, somaxconn) and send_q > 5


async def _burst(port: int, n: int) -> list:
    async def one(i):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        body = body_of([inst(i), inst(i + 1000)] if i % 3 == 0 else [inst(i)])
        writer.write(post_head(len(body)) + body)
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(re.search(rb"content-length: (\d+)", head, re.I).group(1))
        payload = json.loads(await reader.readexactly(length))
        writer.close()
        return i, int(head.split()[1]), payload

    return await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(n))), 60)


def test_a_burst_of_connections_is_batched_and_each_gets_its_own_scores(start):
    srv = start(max_batch_wait=0.005)
    results = asyncio.run(_burst(srv.server_port, 300))
    assert [s for _, s, _ in results] == [200] * 300
    for i, _, payload in results:
        instances = [inst(i), inst(i + 1000)] if i % 3 == 0 else [inst(i)]
        assert payload["scores"] == pytest.approx(expected(srv.net, instances), abs=1e-6), i
    conn = http.client.HTTPConnection("127.0.0.1", srv.server_port, timeout=10)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    forwards = float(re.search(r"^recstream_serving_batch_rows_count (\S+)", text, re.M).group(1))
    rows = float(re.search(r"^recstream_serving_batch_rows_sum (\S+)", text, re.M).group(1))
    assert rows == 400 and forwards < 300  # requests were coalesced into fewer forward passes


def test_a_bad_request_in_a_batch_fails_alone(start):
    srv = start(max_batch_wait=0.05)

    async def mixed():
        async def one(body):
            reader, writer = await asyncio.open_connection("127.0.0.1", srv.server_port)
            writer.write(post_head(len(body)) + body)
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(re.search(rb"content-length: (\d+)", head, re.I).group(1))
            out = int(head.split()[1]), json.loads(await reader.readexactly(length))
            writer.close()
            return out
        bodies = [body_of([inst(i)]) if i != 5 else body_of([inst(1), {**inst(2), "c": 99}]) for i in range(12)]
        return await asyncio.gather(*(one(b) for b in bodies))

    results = asyncio.run(mixed())
    assert results[5][0] == 400 and "instance 1: 'c' id 99 is outside [0, 50)" in results[5][1]["error"]
    for i, (status, payload) in enumerate(results):
        if i != 5:
            assert status == 200 and payload["scores"] == pytest.approx(expected(srv.net, [inst(i)]), abs=1e-6)


def test_metrics_in_prometheus_text_format(start):
    srv = start()
    for i in range(3):
        post(srv.server_port, body_of([inst(i)]))
    post(srv.server_port, b"{bad")
    conn = http.client.HTTPConnection("127.0.0.1", srv.server_port, timeout=10)
    conn.request("GET", "/metrics")
    resp = conn.getresponse()
    text = resp.read().decode()
    assert resp.status == 200 and resp.getheader("Content-Type").startswith("text/plain; version=")
    assert 'recstream_serving_requests_total{route="/predict",status="200"} 3.0' in text
    assert 'recstream_serving_requests_total{route="/predict",status="400"} 1.0' in text
    assert 'recstream_serving_request_seconds_bucket{le="+Inf",route="/predict"} 4.0' in text
    assert "recstream_serving_model_version 1.0" in text
    age = float(re.search(r"^recstream_serving_model_age_seconds (\S+)", text, re.M).group(1))
    assert 0 <= age < 600


def test_shutdown_lets_an_in_flight_request_finish(start):
    srv = start()
    s = socket.create_connection(("127.0.0.1", srv.server_port), timeout=10)
    s.sendall(post_head(len(BODY)) + BODY[:10])  # in flight: the body is still arriving
    time.sleep(0.2)
    stopper = threading.Thread(target=srv.shutdown)
    stopper.start()
    time.sleep(0.3)
    s.sendall(BODY[10:])
    out = b""
    while chunk := s.recv(65536):
        out += chunk
    s.close()
    stopper.join(timeout=30)
    assert out.startswith(b"HTTP/1.1 200 ") and b'"scores"' in out, out
    assert not stopper.is_alive()
    with pytest.raises(OSError):  # and it accepts no more connections
        socket.create_connection(("127.0.0.1", srv.server_port), timeout=2)
