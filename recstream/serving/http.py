"""The prediction HTTP server: ``POST /predict``, ``GET /health``, ``GET /version``.

Built on the standard library's :class:`http.server.ThreadingHTTPServer` (one thread per
connection, HTTP/1.1 keep-alive): no dependency to install or pin, and enough here because
the work per request is a torch forward that releases the GIL, so threads do run in
parallel where it matters. An asyncio framework would not make a CPU-bound forward faster;
put a reverse proxy in front for TLS or many thousands of idle connections.

Responses are JSON. Errors: ``{"error": "<reason>", ...details}`` with 400 (bad JSON, schema
violations, too many instances), 404 (unknown path), 405 (wrong method), 411 (no
Content-Length), 413 (body over ``max_body_bytes``, refused before it is read), 415 (not
JSON), 503 (no version loaded yet).

``POST /predict`` -> ``{"scores": [p, ...], "version": N}``: click probabilities (sigmoid
applied when the manifest says the network outputs logits).

>>> import json, tempfile, threading, urllib.request
>>> from recstream.data import Schema, CategoricalFeature
>>> from recstream.models import WideDeep
>>> from recstream.serving import ModelHolder, publish_version
>>> schema = Schema(["x"], [CategoricalFeature("c", vocab_size=5)])
>>> d = tempfile.mkdtemp()
>>> _ = publish_version(d, WideDeep(schema, hidden=(8,)), model_config={"hidden": [8]})
>>> holder = ModelHolder(d); _ = holder.refresh()
>>> server = make_server(holder, port=0); t = threading.Thread(target=server.serve_forever); t.start()
>>> req = urllib.request.Request(f"http://127.0.0.1:{server.server_port}/predict",
...                              data=json.dumps({"instances": [{"x": 1.0, "c": 2}]}).encode())
>>> json.loads(urllib.request.urlopen(req).read())["version"]
1
>>> server.shutdown(); server.server_close(); t.join()
"""
from __future__ import annotations

import json
import logging
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import torch

from ..validation import check_int, check_str, check_type
from .model_holder import ModelHolder
from .request import RequestError

log = logging.getLogger(__name__)
DEFAULT_MAX_BODY_BYTES = 1 << 20


def _reject_constant(name: str):
    raise RequestError(400, f"invalid JSON: {name} is not a number")


def _scores(served, features) -> list[float]:
    with torch.inference_mode():
        out = served.model(features)
        out = out.reshape(-1).float()
        if (served.manifest.get("model") or {}).get("output", "logits") == "logits":
            out = torch.sigmoid(out)
    if out.numel() != features.batch_size:
        raise RuntimeError(f"network returned {out.numel()} scores for {features.batch_size} instances")
    return out.tolist()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: clients reuse connections
    server: PredictionServer
    timeout = 30  # seconds a connection may stall mid-request before its thread gives up

    def log_message(self, fmt, *args):  # route the access log through logging, quietly
        log.debug("%s - " + fmt, self.address_string(), *args)

    def _send(self, status: int, body: dict, close: bool = False) -> None:
        data = json.dumps(body, allow_nan=False).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(data)

    def _route(self) -> str:
        return urlsplit(self.path).path  # ignore a query string: "/health?probe=1" is /health

    def do_GET(self):
        served = self.server.holder.current
        path = self._route()
        if path == "/health":
            if served is None:
                self._send(503, {"status": "no_model", "error": self.server.holder.last_error})
            else:
                self._send(200, {"status": "ok", "version": served.version})
        elif path == "/version":
            if served is None:
                self._send(503, {"error": "no model version loaded yet"})
            else:
                self._send(200, served.info())
        elif path == "/predict":
            self._send(405, {"error": "use POST for /predict"})
        else:
            self._send(404, {"error": f"unknown path {self.path!r}; have /predict, /health, /version"})

    def _read_json(self):
        if self.headers.get("Transfer-Encoding", "").lower() not in ("", "identity"):
            raise RequestError(411, "chunked bodies are not supported; send Content-Length")
        length = self.headers.get("Content-Length")
        if length is None:
            raise RequestError(411, "Content-Length is required")
        try:
            n = int(length)
        except ValueError:
            raise RequestError(400, f"bad Content-Length {length!r}") from None
        if n < 0:
            raise RequestError(400, f"bad Content-Length {length!r}")
        limit = self.server.max_body_bytes
        if n > limit:
            raise RequestError(413, f"body of {n} bytes exceeds the limit of {limit} bytes", max_body_bytes=limit)
        ctype = self.headers.get("Content-Type", "application/json").split(";")[0].strip().lower()
        # form-urlencoded too: it is what `curl -d` and urllib send by default for a JSON body.
        if ctype not in ("application/json", "application/x-www-form-urlencoded", ""):
            self.rfile.read(n)  # drain, so the connection stays usable
            self._body_read = True
            raise RequestError(415, f"Content-Type must be application/json, got {ctype!r}")
        body = self.rfile.read(n)
        self._body_read = True
        if len(body) != n:
            raise RequestError(400, f"body ended after {len(body)} of {n} bytes")
        try:
            return json.loads(body.decode("utf-8"), parse_constant=_reject_constant)
        except RequestError:
            raise
        except (ValueError, UnicodeDecodeError) as e:
            raise RequestError(400, f"invalid JSON: {e}") from None

    def do_POST(self):
        path = self._route()
        if path != "/predict":
            # The body is not read: close so leftover bytes are not taken for a next request.
            status = 405 if path in ("/health", "/version") else 404
            self._send(status, {"error": f"no POST handler for {self.path!r}; POST /predict"}, close=True)
            return
        self._body_read = False
        try:
            payload = self._read_json()
            served = self.server.holder.current  # read ONCE: this request stays on this version
            if served is None:
                raise RequestError(503, "no model version loaded yet")
            features = served.parser.parse(payload)
            self._send(200, {"scores": _scores(served, features), "version": served.version})
        except RequestError as e:
            # An unread body would be parsed as the next request: close the connection then.
            self._send(e.status, e.body(), close=not self._body_read)
        except Exception as e:  # a bug or a model error: report it, keep serving
            log.exception("prediction failed")
            self._send(500, {"error": f"internal error: {type(e).__name__}: {e}"})


class PredictionServer(ThreadingHTTPServer):
    """ThreadingHTTPServer serving `holder`'s current version (see module docstring); made by `make_server`."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address, holder: ModelHolder, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES):
        self.holder = holder
        self.max_body_bytes = max_body_bytes
        super().__init__(address, _Handler)


def make_server(holder: ModelHolder, host: str = "127.0.0.1", port: int = 8080,
                max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> PredictionServer:
    """A bound (not yet running) server; call ``serve_forever()``. ``port=0`` picks a free port."""
    owner = "make_server"
    check_type(owner, "holder", holder, ModelHolder)
    check_str(owner, "host", host)
    check_int(owner, "port", port, minimum=0, maximum=65535)
    check_int(owner, "max_body_bytes", max_body_bytes, minimum=1)
    return PredictionServer((host, port), holder, max_body_bytes)
