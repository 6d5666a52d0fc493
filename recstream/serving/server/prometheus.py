"""``GET /metrics``: the prediction server's Prometheus metrics (text exposition format).

Each server has its own registry (several servers may run in one process, e.g. in tests):

* ``recstream_serving_requests_total{route, status}`` -- answered requests by route
  (``/predict``, ``/health``, ``/version``, ``/schema``, ``/metrics``, ``other``) and HTTP status;
* ``recstream_serving_request_seconds{route}`` -- latency histogram, first byte of the
  request handed to the application to the response sent;
* ``recstream_serving_batch_rows`` -- rows per forward pass (what micro-batching coalesced);
* ``recstream_serving_model_version`` -- the version served (0: none yet);
* ``recstream_serving_model_age_seconds`` -- now minus the served version's ``created``;
* ``recstream_serving_model_staleness_seconds`` -- now minus its ``max_event_time`` (the
  newest event it was trained on; absent when the trainer recorded none): its freshness;
* ``recstream_serving_model_swaps_total`` / ``recstream_serving_model_load_failures_total``.

>>> from recstream.serving import ModelHolder
>>> import tempfile
>>> m = ServingMetrics(ModelHolder(tempfile.mkdtemp()))
>>> m.observe("/health", 503, 0.001)
>>> text = m.exposition().decode()
>>> 'recstream_serving_requests_total{route="/health",status="503"} 1.0' in text
True
>>> "recstream_serving_model_version 0.0" in text
True
"""
from __future__ import annotations

import math
import time

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily

from .model_holder import ModelHolder

ROUTES = ("/predict", "/health", "/version", "/schema", "/metrics")
# Latency buckets (seconds) from 0.5 ms: a one-instance forward is well under a millisecond.
LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)


def _seconds(value) -> float | None:
    """A manifest's unix time, or None: a scrape must never fail on what a manifest holds (the
    loader checks these fields; this is the second line)."""
    if type(value) not in (int, float) or not math.isfinite(value):
        return None
    return float(value)


class _ModelCollector:
    """Computes the model gauges at scrape time from the holder's served version."""

    def __init__(self, holder: ModelHolder):
        self.holder = holder

    def collect(self):
        served, now = self.holder.current, time.time()
        version = GaugeMetricFamily("recstream_serving_model_version", "Model version served (0: none yet).")
        version.add_metric([], served.version if served else 0)
        yield version
        swaps = GaugeMetricFamily("recstream_serving_model_swaps_total", "Versions swapped in since start.")
        swaps.add_metric([], self.holder.swaps)
        yield swaps
        failures = GaugeMetricFamily("recstream_serving_model_load_failures_total",
                                     "Published versions that could not be loaded (skipped).")
        failures.add_metric([], self.holder.load_failures)
        yield failures
        if served is None:
            return
        created = _seconds(served.manifest.get("created"))
        if created is not None:
            age = GaugeMetricFamily("recstream_serving_model_age_seconds",
                                    "Seconds since the served version was created.")
            age.add_metric([], now - created)
            yield age
        newest = _seconds(served.manifest.get("max_event_time"))
        if newest is not None:
            stale = GaugeMetricFamily("recstream_serving_model_staleness_seconds",
                                      "Seconds since the newest event the served version was trained on.")
            stale.add_metric([], now - newest)
            yield stale


class ServingMetrics:
    """The metrics of one server (see module docstring)."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, holder: ModelHolder):
        self.registry = CollectorRegistry(auto_describe=False)
        self.requests = Counter("recstream_serving_requests", "Answered HTTP requests by route and status.",
                                ("route", "status"), registry=self.registry)
        self.latency = Histogram("recstream_serving_request_seconds", "Request latency in seconds.", ("route",),
                                 buckets=LATENCY_BUCKETS, registry=self.registry)
        self.batch_rows = Histogram("recstream_serving_batch_rows", "Instances per forward pass.",
                                    buckets=BATCH_BUCKETS, registry=self.registry)
        self.registry.register(_ModelCollector(holder))
        # label children cached: .labels() costs a lock and a dict lookup per call otherwise
        self._latency = {r: self.latency.labels(r) for r in ROUTES + ("other",)}
        self._requests: dict[tuple[str, int], object] = {}

    def observe(self, route: str, status: int, seconds: float) -> None:
        """Count one answered request and its latency."""
        route = route if route in ROUTES else "other"
        child = self._requests.get((route, status))
        if child is None:
            child = self._requests[(route, status)] = self.requests.labels(route, str(status))
        child.inc()
        self._latency[route].observe(seconds)

    def exposition(self) -> bytes:
        """The registry in the Prometheus text format."""
        return generate_latest(self.registry)
