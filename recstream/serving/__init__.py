"""recstream.serving: publish fresh model versions from training and serve them over HTTP.

Four sub-packages, imports pointing down the list: `snapshot` (the
on-disk version format both sides share: layout, state split, model spec, loading),
`publishing` (writing versions from training, retention),
`server` (the HTTP prediction server, its metrics and client) and
`export` (self-contained files for other runtimes). The names below
are the public API.

* Publishing: `ModelPublisher`, a training callback, publishes the network every N steps
  or seconds through a `SnapshotWriter`, which writes versioned, checksummed snapshots --
  full, or HashEmbedding deltas on a full base -- atomically into a directory (layout:
  `recstream.serving.snapshot.layout`); `publish_version` publishes once.
* Loading: `load_latest` returns the newest usable version with its manifest, skipping
  (and reporting) torn or corrupt ones; `load_version` loads one exactly.
* Serving: `ModelHolder` hot-swaps new versions; `make_server` /
  ``recstream serve DIR --port P`` answer ``POST /predict``, ``GET /health``, ``GET /version``
  and ``GET /metrics`` (Starlette on uvicorn: ``pip install "recstream[serve]"``; imported
  on first use, so publishing needs none of it); KServe's v1 routes too
  (``/v1/models/<name>:predict``). `PredictionClient` is a small Python client.
* Freshness: `event_freshness`, `staleness`.

>>> import tempfile
>>> from recstream.data import Schema, CategoricalFeature
>>> from recstream.models import WideDeep
>>> schema = Schema(["x"], [CategoricalFeature("c", vocab_size=5)])
>>> d = tempfile.mkdtemp()
>>> _ = publish_version(d, WideDeep(schema, hidden=(8,)), model_config={"hidden": [8]})
>>> net, manifest = load_latest(d)
>>> manifest["version"], manifest["schema"] == schema.to_dict()
(1, True)
"""
from .publishing.model_publisher import ModelPublisher
from .publishing.publish import SnapshotWriter, publish_version
from .publishing.retention import prune
from .server.client import PredictionClient, PredictionError
from .server.freshness import FreshnessReport, event_freshness, staleness
from .server.model_holder import ModelHolder, Served
from .server.request import InstanceParser, RequestError
from .snapshot.layout import SnapshotError, list_versions, read_latest, read_manifest
from .snapshot.loader import load_latest, load_version


def __getattr__(name: str):
    # The HTTP stack is an optional extra: load it only when a server is asked for.
    if name in ("make_server", "PredictionServer"):
        try:
            from .server import http
        except ImportError as e:
            raise ImportError(f"recstream.serving.{name} needs the serving extra: pip install 'recstream[serve]' "
                              f"({e})") from e
        return getattr(http, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ModelPublisher", "SnapshotWriter", "publish_version", "load_latest", "load_version", "SnapshotError",
    "list_versions", "read_latest", "read_manifest", "prune", "ModelHolder", "Served",
    "InstanceParser", "RequestError", "make_server", "PredictionServer", "event_freshness", "staleness",
    "FreshnessReport", "PredictionClient", "PredictionError",
]
