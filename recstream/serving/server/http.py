"""The prediction HTTP server: ``POST /predict``, ``GET /health``, ``GET /version``, ``GET /schema``, ``GET /metrics``.

An ASGI application (`recstream.serving.server.app`, Starlette) on uvicorn (httptools and uvloop
when installed): ``pip install "recstream[serve]"``. What that stack brings, and why it is
used instead of the standard library's ``http.server``:

* a strict HTTP/1.1 parser: duplicate or non-numeric ``Content-Length``, ``Content-Length``
  together with ``Transfer-Encoding``, and other request-smuggling shapes are refused (400,
  connection closed); a body is always consumed by its own request, whatever the method;
* ``TCP_NODELAY`` on every connection (no Nagle / delayed-ACK stall of ~40 ms per answer),
  a real listen backlog (``backlog``, default 2048) and a bound on open connections
  (``max_connections``: beyond, 503);
* one event loop for all connections, and `MicroBatcher`
  coalescing concurrent requests into one forward pass on a worker thread (dynamic
  micro-batching: at most ``max_batch_rows`` rows, at most ``max_batch_wait`` seconds of
  waiting, and only for requests already being received);
* deadlines (``request_timeout``): headers or a body not received in time is 408 (a silent
  new connection is closed), an answer not ready in time 503; idle keep-alive connections
  close after ``keep_alive_timeout``;
* graceful stop: ``shutdown()`` stops accepting, lets in-flight requests finish, then returns.

Responses are JSON. Errors: ``{"error": "<reason>", ...details}`` with 400 (bad JSON, schema
violations, too many instances, bad ``Content-Length``), 404 (unknown path), 405 (wrong
method), 408 (body too slow), 411 (no ``Content-Length``), 413 (body over ``max_body_bytes``,
refused before it is read), 415 (not ``application/json``), 503 (no version loaded yet,
overloaded, deadline exceeded; with ``Retry-After``). ``/health`` and ``/version`` never show
local file paths.

``POST /predict`` -> ``{"scores": [p, ...], "version": N}``: click probabilities (sigmoid
applied when the manifest says the network outputs logits), one per instance, in order.

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
...                              data=json.dumps({"instances": [{"x": 1.0, "c": 2}]}).encode(),
...                              headers={"Content-Type": "application/json"})
>>> json.loads(urllib.request.urlopen(req).read())["version"]
1
>>> server.shutdown(); server.server_close(); t.join()
"""
from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import socket
import threading

import uvicorn

from ...validation import check_choice, check_int, check_number, check_str, check_type
from .app import PredictionApp
from .batcher import MicroBatcher
from .model_holder import ModelHolder
from .prometheus import ServingMetrics

log = logging.getLogger(__name__)
DEFAULT_MAX_BODY_BYTES = 1 << 20
HTTP_PARSERS = ("auto", "httptools", "h11")


class _Uvicorn(uvicorn.Server):
    """uvicorn's server without its signal handling: the owner of the process decides (the CLI
    calls ``shutdown()`` from its handlers; a server in a thread must not touch signals)."""

    @contextlib.contextmanager
    def capture_signals(self):
        yield

    def install_signal_handlers(self) -> None:  # uvicorn < 0.29 calls this instead
        pass


_BAD_REQUEST = json.dumps({"error": "malformed HTTP request (invalid or ambiguous framing: e.g. several or a "
                                   "non-numeric Content-Length, or Content-Length with Transfer-Encoding)"}).encode()


def _response(status_line: bytes, default_headers, body: bytes) -> bytes:
    head = [status_line]
    for name, value in default_headers:
        head.extend([name, b": ", value, b"\r\n"])
    head.append(b"content-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n" % len(body))
    return b"".join(head) + body


def _httptools_protocol(header_timeout: float):
    """uvicorn's httptools protocol, hardened: the parser's 400 in JSON like every other error, and
    a deadline on the request HEAD (uvicorn has none): a connection that sends nothing, or stalls
    inside its headers, for `header_timeout` seconds is closed (408 when a request had begun)."""
    from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

    too_slow = json.dumps({"error": f"request headers not received within {header_timeout:g} s"}).encode()

    class HardenedProtocol(HttpToolsProtocol):
        _head_timer = None
        _began = False

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._began = True
            self._arm()

        def on_headers_complete(self) -> None:
            self._disarm()
            super().on_headers_complete()

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._disarm()
            self._head_timer = self.loop.call_later(header_timeout, self._head_too_slow)

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_too_slow(self) -> None:
            self._head_timer = None
            if self.transport.is_closing():
                return
            if self._began:
                self.transport.write(_response(STATUS_LINE[408], self.server_state.default_headers, too_slow))
            self.transport.close()

        def send_400_response(self, msg: str) -> None:
            self._disarm()
            self.transport.write(_response(STATUS_LINE[400], self.server_state.default_headers, _BAD_REQUEST))
            self.transport.close()

    return HardenedProtocol


def _listen(host: str, port: int, backlog: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(backlog)
        sock.set_inheritable(True)
    except BaseException:
        sock.close()
        raise
    return sock


class PredictionServer:
    """A bound prediction server (see module docstring); made by `make_server`.

    ``serve_forever()`` runs it in the calling thread until ``shutdown()`` (from another
    thread or a signal handler's thread); ``server_close()`` releases the socket and the
    batcher's worker. ``server_address`` / ``server_port`` tell where it listens.
    """

    def __init__(self, holder: ModelHolder, sock: socket.socket, app: PredictionApp, config: dict):
        self.holder, self.socket, self.app = holder, sock, app
        self.server_address = sock.getsockname()
        self.server_port = self.server_address[1]
        self._config = config
        self._uvicorn: _Uvicorn | None = None
        self._lock = threading.Lock()
        self._stop = False
        self._done = threading.Event()
        self._done.set()  # not running

    @property
    def max_body_bytes(self) -> int:
        return self.app.max_body_bytes

    def serve_forever(self) -> None:
        """Serve until `shutdown` is called (in-flight requests finish first)."""
        with self._lock:
            if self._stop:
                return
            config = uvicorn.Config(self.app, log_config=None, access_log=False, lifespan="off", **self._config)
            self._uvicorn = _Uvicorn(config)
            self._done.clear()
        try:
            self._uvicorn.run(sockets=[self.socket])
        finally:
            self._done.set()

    def shutdown(self, timeout: float | None = None) -> None:
        """Stop serving and wait (at most `timeout` seconds) until ``serve_forever`` returned."""
        with self._lock:
            self._stop = True
            if self._uvicorn is not None:
                self._uvicorn.should_exit = True
        self._done.wait(timeout)

    def server_close(self) -> None:
        self.socket.close()
        self.app.batcher.close()


def _auto(choice: str, module: str, fallback: str) -> str:
    if choice != "auto":
        return choice
    return module if importlib.util.find_spec(module) is not None else fallback


def make_server(holder: ModelHolder, host: str = "127.0.0.1", port: int = 8080,
                max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, *, max_batch_rows: int = 256,
                max_batch_wait: float = 0.002, request_timeout: float = 30.0, max_connections: int = 4096,
                backlog: int = 2048, keep_alive_timeout: float = 5.0, http: str = "auto",
                graceful_timeout: float = 30.0, model_name: str = "recstream") -> PredictionServer:
    """A bound (not yet running) server; call ``serve_forever()``. ``port=0`` picks a free port.

    Args:
        holder: the versions to serve (start its watcher for hot swap).
        max_body_bytes: largest ``/predict`` body (413 beyond).
        max_batch_rows: micro-batching bound: instances per forward pass.
        max_batch_wait: micro-batching bound: seconds a batch may wait for requests still arriving.
        request_timeout: total seconds per request, body to answer (408 / 503 beyond).
        max_connections: open connections (and in-flight requests) served at once; beyond, 503.
        backlog: listen queue of connections not yet accepted.
        keep_alive_timeout: seconds an idle keep-alive connection stays open.
        http: HTTP parser, ``"httptools"``, ``"h11"`` or ``"auto"`` (httptools when installed).
        graceful_timeout: seconds ``shutdown`` lets in-flight requests finish.
        model_name: the ``<name>`` of the KServe v1 routes (``/v1/models/<name>:predict``).
    """
    owner = "make_server"
    check_type(owner, "holder", holder, ModelHolder)
    check_str(owner, "host", host)
    check_int(owner, "port", port, minimum=0, maximum=65535)
    check_int(owner, "max_body_bytes", max_body_bytes, minimum=1)
    check_int(owner, "max_batch_rows", max_batch_rows, minimum=1)
    check_number(owner, "max_batch_wait", max_batch_wait, minimum=0)
    check_number(owner, "request_timeout", request_timeout, minimum=0, min_open=True)
    check_int(owner, "max_connections", max_connections, minimum=1)
    check_int(owner, "backlog", backlog, minimum=1)
    check_number(owner, "keep_alive_timeout", keep_alive_timeout, minimum=0, min_open=True)
    check_choice(owner, "http", http, HTTP_PARSERS)
    check_str(owner, "model_name", model_name)
    check_number(owner, "graceful_timeout", graceful_timeout, minimum=0)
    metrics = ServingMetrics(holder)
    batcher = MicroBatcher(holder, max_batch_rows, max_batch_wait, on_batch=metrics.batch_rows.observe)
    app = PredictionApp(holder, max_body_bytes, request_timeout, batcher, metrics, model_name)
    parser = _auto(http, "httptools", "h11")
    config = {"http": _httptools_protocol(request_timeout) if parser == "httptools" else parser,
              "loop": _auto("auto", "uvloop", "asyncio"),
              "backlog": backlog, "limit_concurrency": max_connections, "timeout_keep_alive": keep_alive_timeout,
              "timeout_graceful_shutdown": graceful_timeout}
    return PredictionServer(holder, _listen(host, port, backlog), app, config)
