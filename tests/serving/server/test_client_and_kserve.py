"""PredictionClient against a real server, and KServe's v1 routes."""
import json
import threading
import urllib.error
import urllib.request

import pytest

from recstream.data import CategoricalFeature, Schema
from recstream.models import WideDeep
from recstream.serving import ModelHolder, PredictionClient, PredictionError, make_server, publish_version


@pytest.fixture
def server(tmp_path):
    schema = Schema(["x"], [CategoricalFeature("c", vocab_size=5)])
    publish_version(tmp_path, WideDeep(schema, hidden=(8,)), model_config={"hidden": [8]})
    holder = ModelHolder(tmp_path)
    holder.refresh()
    srv = make_server(holder, port=0, model_name="ctr")
    thread = threading.Thread(target=srv.serve_forever)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()
    thread.join()


def _post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_client_predicts_reuses_its_connection_and_raises_the_servers_reason(server):
    client = PredictionClient(f"http://127.0.0.1:{server.server_port}")
    first, version = client.predict([{"x": 1.0, "c": 2}])
    conn = client._conn
    again, _ = client.predict([{"x": 1.0, "c": 2}, {"x": 0.5, "c": 1}])
    assert client._conn is conn and again[0] == pytest.approx(first[0]) and version == 1  # keep-alive
    with pytest.raises(PredictionError) as e:
        client.predict([{"x": 1.0, "c": 9}])
    assert e.value.status == 400 and "c" in e.value.reason
    assert client.version()["version"] == 1
    client.close()
    with pytest.raises(ValueError, match="'url' must be http://host"):
        PredictionClient("https://example.com")


def test_kserve_v1_routes(server):
    base = f"http://127.0.0.1:{server.server_port}"
    status, body = _post(f"{base}/v1/models/ctr:predict", {"instances": [{"x": 1.0, "c": 2}]})
    assert status == 200 and len(body["predictions"]) == 1 and body["model_version"] == "1"
    native = PredictionClient(base).predict([{"x": 1.0, "c": 2}])[0]
    assert body["predictions"][0] == pytest.approx(native[0])
    status, body = _post(f"{base}/v1/models/other:predict", {"instances": [{"x": 1.0, "c": 2}]})
    assert status == 404 and "this server serves 'ctr'" in body["error"]
    with urllib.request.urlopen(f"{base}/v1/models/ctr", timeout=10) as r:
        assert json.loads(r.read()) == {"name": "ctr", "ready": True}
