"""The prediction API as an ASGI application (Starlette): routes, request checks, errors, metrics.

Routes: ``POST /predict``, ``GET /health``, ``GET /version``, ``GET /schema`` (the fields an
instance holds, their types and a valid example instance), ``GET /metrics`` (see
`recstream.serving.server.http` for the contract and `recstream.serving.server.prometheus`), and
KServe's v1 protocol for clients written against it: ``POST /v1/models/<name>:predict``
(the same request, answered ``{"predictions": [...], "model_version": "N"}``) and
``GET /v1/models/<name>`` (``{"name", "ready"}``), ``<name>`` being the server's ``model_name``.

``POST /predict`` is checked in this order, each failure a JSON ``{"error": reason}``:

* ``Transfer-Encoding`` (chunked) -> 411, no ``Content-Length`` -> 411, several or a
  non-numeric one -> 400 (the HTTP parser refuses most of these before: belt and braces);
* ``Content-Length`` over ``max_body_bytes`` -> 413, before a byte of the body is read;
* a ``Content-Type`` other than ``application/json`` -> 415: a browser may send a form or
  text body cross-origin without asking first (no CORS preflight), never a JSON one;
* the body not received within ``request_timeout`` of the request's start -> 408;
* JSON that does not decode (bad UTF-8, NaN, nesting too deep, digits beyond the
  interpreter's limit) or instances that do not fit the schema -> 400;
* no version loaded -> 503; more instances waiting than the batcher admits -> 503
  (``overloaded``); no answer within ``request_timeout`` of the request's start -> 503.

Errors that leave an unread body on the connection close it (``Connection: close``), so no
leftover byte is ever taken for a next request.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from .batcher import MicroBatcher
from .model_holder import ModelHolder
from .prometheus import ServingMetrics
from .request import RequestError, decode_json

log = logging.getLogger(__name__)
ROUTES = "/predict, /health, /version, /schema, /metrics, /v1/models/<name>[:predict]"


def json_response(status: int, body: dict, close: bool = False, headers: dict | None = None) -> Response:
    data = json.dumps(body, allow_nan=False).encode("utf-8")  # ensure_ascii: lone surrogates are escaped
    headers = dict(headers or {})
    if close:
        headers["Connection"] = "close"
    return Response(data, status_code=status, media_type="application/json", headers=headers)


def _error(e: RequestError, close: bool = False) -> Response:
    headers = {"Retry-After": str(e.details["retry_after"])} if "retry_after" in e.details else None
    return json_response(e.status, e.body(), close=close, headers=headers)


def _content_length(request: Request, limit: int) -> int:
    headers = request.headers
    if "transfer-encoding" in headers:
        raise RequestError(411, "chunked bodies are not supported; send Content-Length")
    values = headers.getlist("content-length")
    if not values:
        raise RequestError(411, "Content-Length is required")
    if len(values) > 1:
        raise RequestError(400, "several Content-Length headers")
    text = values[0].strip()
    if not (text.isascii() and text.isdigit()):
        raise RequestError(400, f"bad Content-Length {text[:40]!r}")
    n = int(text)
    if n > limit:
        raise RequestError(413, f"body of {n} bytes exceeds the limit of {limit} bytes", max_body_bytes=limit)
    media = headers.get("content-type", "").split(";")[0].strip().lower()
    if media != "application/json":
        raise RequestError(415, f"Content-Type must be application/json, got {media[:60]!r}")
    return n


async def _read_body(request: Request, n: int) -> bytes:
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > n:  # the parser enforces Content-Length; never trust it alone
            raise RequestError(400, "body longer than its Content-Length")
        chunks.append(chunk)
    return b"".join(chunks)


class PredictionApp:
    """Builds the Starlette application over a holder, a batcher and the metrics."""

    def __init__(self, holder: ModelHolder, max_body_bytes: int, request_timeout: float, batcher: MicroBatcher,
                 metrics: ServingMetrics, model_name: str = "recstream"):
        self.holder, self.max_body_bytes, self.request_timeout = holder, max_body_bytes, request_timeout
        self.batcher, self.metrics, self.model_name = batcher, metrics, model_name
        routes = [Route("/predict", self.predict, methods=["POST"]), Route("/health", self.health, methods=["GET"]),
                  Route("/version", self.version, methods=["GET"]), Route("/schema", self.schema, methods=["GET"]),
                  Route("/metrics", self.metrics_text, methods=["GET"]),
                  Route("/v1/models/{name}:predict", self.kserve_predict, methods=["POST"]),
                  Route("/v1/models/{name}", self.kserve_model, methods=["GET"])]
        self.starlette = Starlette(routes=routes, exception_handlers={HTTPException: self.http_error,
                                                                       Exception: self.internal_error})

    async def __call__(self, scope, receive, send):
        """The ASGI entry: the Starlette app, timed and counted for ``/metrics``."""
        if scope["type"] != "http":
            return await self.starlette(scope, receive, send)
        start, status, started = time.perf_counter(), [500], [False]

        async def send_observed(message):
            if message["type"] == "http.response.start":
                status[0], started[0] = message["status"], True
            await send(message)

        try:
            await self.starlette(scope, receive, send_observed)
        except Exception:
            if not started[0]:
                raise
            # answered (internal_error sent the JSON 500 and logged it); Starlette re-raises only
            # for the server's log, which would print the traceback a second time
        finally:
            self.metrics.observe(scope["path"], status[0], time.perf_counter() - start)

    async def http_error(self, request: Request, exc: HTTPException) -> Response:
        """404 / 405 as JSON; a body nobody reads closes the connection."""
        has_body = "transfer-encoding" in request.headers or request.headers.get("content-length", "0") != "0"
        if exc.status_code == 404:
            return json_response(404, {"error": f"unknown path {request.url.path[:200]!r}; have {ROUTES}"},
                                 close=has_body)
        if exc.status_code == 405:
            allowed = (exc.headers or {}).get("Allow", "")
            return json_response(405, {"error": f"use {allowed} for {request.url.path}"}, close=has_body,
                                 headers={"Allow": allowed})
        return json_response(exc.status_code, {"error": exc.detail}, close=has_body)

    async def internal_error(self, request: Request, exc: Exception) -> Response:
        """Any other exception out of a route (a bug): a JSON 500 naming its type, never the
        framework's plain-text page; the traceback goes to the server's log only."""
        log.error("%s %s failed", request.method, request.url.path[:200], exc_info=exc)
        return json_response(500, {"error": f"internal error: {type(exc).__name__}"}, close=True)

    async def health(self, request: Request) -> Response:
        served = self.holder.current
        if served is None:
            return json_response(503, {"status": "no_model", "error": self.holder.public_error})
        return json_response(200, {"status": "ok", "version": served.version})

    async def version(self, request: Request) -> Response:
        served = self.holder.current
        if served is None:
            return json_response(503, {"error": "no model version loaded yet"})
        return json_response(200, served.info())

    async def schema(self, request: Request) -> Response:
        """The served version's request schema: every field with its type, an example instance."""
        served = self.holder.current
        if served is None:
            return json_response(503, {"error": "no model version loaded yet"})
        return json_response(200, {"version": served.version, **served.parser.describe()})

    async def metrics_text(self, request: Request) -> Response:
        return Response(self.metrics.exposition(), media_type=self.metrics.content_type)

    async def _body(self, request: Request, deadline: float) -> bytes:
        n = _content_length(request, self.max_body_bytes)
        self.batcher.arriving += 1  # worth waiting for: its rows may join the next batch
        try:
            return await asyncio.wait_for(_read_body(request, n), max(deadline - time.monotonic(), 0))
        except asyncio.TimeoutError:
            raise RequestError(408, f"request body not received within {self.request_timeout:g} s") from None
        finally:
            self.batcher.arriving -= 1

    async def predict(self, request: Request) -> Response:
        result = await self._predict(request)
        if isinstance(result, Response):
            return result
        scores, version = result
        return json_response(200, {"scores": scores, "version": version})

    async def kserve_predict(self, request: Request) -> Response:
        if request.path_params["name"] != self.model_name:  # its body is unread: the connection closes
            return json_response(404, {"error": f"unknown model {request.path_params['name'][:100]!r}; "
                                                f"this server serves {self.model_name!r}"}, close=True)
        result = await self._predict(request)
        if isinstance(result, Response):
            return result
        scores, version = result
        return json_response(200, {"predictions": scores, "model_version": str(version)})

    async def kserve_model(self, request: Request) -> Response:
        if request.path_params["name"] != self.model_name:
            return json_response(404, {"error": f"unknown model {request.path_params['name'][:100]!r}"})
        served = self.holder.current
        return json_response(200 if served is not None else 503,
                             {"name": self.model_name, "ready": served is not None})

    async def _predict(self, request: Request):
        """``(scores, version)`` for a predict request, or the error Response."""
        deadline = time.monotonic() + self.request_timeout
        body_read = False
        try:
            body = await self._body(request, deadline)
            body_read = True
            payload = decode_json(body)
            served = self.holder.current
            if served is None:
                raise RequestError(503, "no model version loaded yet")
            instances = served.parser.instances(payload)  # shape and count: cheap, before queueing
            scores, version = await self.batcher.predict(instances, deadline)
        except RequestError as e:
            return _error(e, close=not body_read)  # an unread body must not be parsed as a request
        except ClientDisconnect:
            return json_response(400, {"error": "client disconnected"}, close=True)
        except Exception as e:  # a bug: report it once, keep serving
            log.exception("prediction failed")
            return json_response(500, {"error": f"internal error: {type(e).__name__}"}, close=not body_read)
        return scores, version
