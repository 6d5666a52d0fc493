"""recstream.serving: publish fresh model versions from training and serve them over HTTP.

* Publishing: :class:`ModelPublisher`, a training callback, publishes the network every N steps
  or seconds through a :class:`SnapshotWriter`, which writes versioned, checksummed snapshots --
  full, or HashEmbedding deltas on a full base -- atomically into a directory (layout:
  :mod:`recstream.serving.layout`); :func:`publish_version` publishes once.
* Loading: :func:`load_latest` returns the newest usable version with its manifest, skipping
  (and reporting) torn or corrupt ones; :func:`load_version` loads one exactly.
* Serving: :class:`ModelHolder` hot-swaps new versions; :func:`make_server` /
  ``recstream serve DIR --port P`` answer ``POST /predict``, ``GET /health``, ``GET /version``
  and ``GET /metrics`` (Starlette on uvicorn: ``pip install "recstream[serve]"``; imported
  on first use, so publishing needs none of it); KServe's v1 routes too
  (``/v1/models/<name>:predict``). :class:`PredictionClient` is a small Python client.
* Freshness: :func:`event_freshness`, :func:`staleness`.

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
from .client import PredictionClient, PredictionError
from .freshness import FreshnessReport, event_freshness, staleness
from .layout import SnapshotError, list_versions, read_latest, read_manifest
from .loader import load_latest, load_version
from .model_holder import ModelHolder, Served
from .model_publisher import ModelPublisher
from .publish import SnapshotWriter, publish_version
from .request import InstanceParser, RequestError
from .retention import prune


def __getattr__(name: str):
    # The HTTP stack is an optional extra: load it only when a server is asked for.
    if name in ("make_server", "PredictionServer"):
        try:
            from . import http
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
