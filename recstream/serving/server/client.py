"""`PredictionClient`: a small Python client for ``recstream serve`` (standard library only).

One keep-alive HTTP connection per client (not shared between threads); each `predict` is one
``POST /predict``. An error answer raises `PredictionError` with the server's status and reason;
a dropped keep-alive connection (the server restarted, or closed an idle one) is reconnected once.

>>> import tempfile, threading
>>> from recstream.data import Schema, CategoricalFeature
>>> from recstream.models import WideDeep
>>> from recstream.serving import ModelHolder, make_server, publish_version
>>> schema = Schema(["x"], [CategoricalFeature("c", vocab_size=5)])
>>> d = tempfile.mkdtemp()
>>> _ = publish_version(d, WideDeep(schema, hidden=(8,)), model_config={"hidden": [8]})
>>> holder = ModelHolder(d); _ = holder.refresh()
>>> server = make_server(holder, port=0); t = threading.Thread(target=server.serve_forever); t.start()
>>> client = PredictionClient(f"http://127.0.0.1:{server.server_port}")
>>> scores, version = client.predict([{"x": 1.0, "c": 2}, {"x": 0.0, "c": 4}])
>>> len(scores), version, client.health()["status"]
(2, 1, 'ok')
>>> client.schema()["example"]  # an instance the server takes
{'x': 0.0, 'c': 0}
>>> client.close(); server.shutdown(); server.server_close(); t.join()
"""
from __future__ import annotations

import http.client
import json
from urllib.parse import urlsplit

from ...validation import check_number, check_str, check_type


class PredictionError(RuntimeError):
    """The server answered with an error: ``status`` and the ``reason`` it gave."""

    def __init__(self, status: int, reason: str):
        super().__init__(f"HTTP {status}: {reason}")
        self.status, self.reason = status, reason


class PredictionClient:
    """Client of one ``recstream serve`` at `url` (``http://host:port``); see the module docstring."""

    def __init__(self, url: str, timeout: float = 30.0):
        owner = "PredictionClient"
        check_str(owner, "url", url)
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"{owner}: 'url' must be http://host[:port], got {url!r} (put a proxy in front for TLS)")
        self.host, self.port = parts.hostname, parts.port or 80
        self.timeout = check_number(owner, "timeout", timeout, minimum=0, min_open=True)
        self._conn: http.client.HTTPConnection | None = None

    def predict(self, instances: list[dict]) -> tuple[list[float], int]:
        """Scores (click probabilities) of `instances` and the model version that computed them."""
        check_type("PredictionClient.predict", "instances", instances, list, allowed="a list of dicts")
        answer = self._request("POST", "/predict", json.dumps({"instances": instances}))
        return answer["scores"], answer["version"]

    def health(self) -> dict:
        return self._request("GET", "/health", None, ok=(200, 503))

    def version(self) -> dict:
        return self._request("GET", "/version", None)

    def schema(self) -> dict:
        """``GET /schema``: the fields an instance holds (name, type, nullable, ...), an example
        instance and the preprocessing of the served version."""
        return self._request("GET", "/schema", None)

    def _request(self, method: str, path: str, body: str | None, ok=(200,)) -> dict:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        for attempt in (1, 2):
            conn = self._conn or http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            try:
                conn.request(method, path, body, headers)
                response = conn.getresponse()
                data = response.read()
            except (ConnectionError, http.client.RemoteDisconnected, http.client.BadStatusLine):
                conn.close()
                self._conn = None
                if attempt == 2:
                    raise
                continue  # a keep-alive connection the server had closed: once more on a new one
            self._conn = None if response.getheader("Connection", "").lower() == "close" else conn
            answer = json.loads(data) if data else {}
            if response.status not in ok:
                raise PredictionError(response.status, answer.get("error", response.reason))
            return answer
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
