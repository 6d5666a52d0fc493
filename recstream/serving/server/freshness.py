"""Model freshness: how long after an event happened does a served model reflect it?

For one event at time ``t`` (unix seconds), its freshness lag is ``T - t`` where ``T`` is
when the FIRST version containing it was published (manifest ``created``) or, given the
server's swap times, started serving (``served_at[version]``, e.g. ``loaded_at`` from
``GET /version``). An event is "contained" in version V when it was trained before V was
written:

* with ``steps`` (the training step that trained each event): ``step <= manifest["step"]``
  -- exact, also for late, out-of-order events;
* without: ``t <= manifest["max_event_time"]`` (the trainer writes ``cb_params.max_event_time``,
  which the publisher records) -- exact for in-order streams.

`staleness` is the per-version view: ``now - max_event_time`` of what is served.

>>> m = [{"version": 1, "step": 10, "max_event_time": 100.0, "created": 105.0},
...      {"version": 2, "step": 20, "max_event_time": 200.0, "created": 203.0}]
>>> r = event_freshness(m, [90.0, 150.0, 250.0])
>>> r.lags.tolist()[:2], r.versions.tolist(), r.summary()["covered"]
([15.0, 53.0], [1, 2, 0], 2)
>>> staleness(m[1], now=210.0)
10.0
"""
from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from ...validation import check_number


@dataclass
class FreshnessReport:
    """Per-event lags (seconds; NaN for events not in any given version) and the version
    that first contained each event (0: none)."""

    lags: np.ndarray
    versions: np.ndarray

    def summary(self, quantiles: Iterable[float] = (0.5, 0.9, 0.99)) -> dict:
        """``events``, ``covered``, ``mean``, ``max`` and ``p<q>`` of the covered lags (None if none)."""
        covered = self.lags[~np.isnan(self.lags)]
        out = {"events": int(self.lags.size), "covered": int(covered.size)}
        stats = {"mean": np.mean, "max": np.max}
        for name, fn in stats.items():
            out[name] = float(fn(covered)) if covered.size else None
        for q in quantiles:
            out[f"p{round(q * 100, 3):g}"] = float(np.quantile(covered, q)) if covered.size else None
        return out


def _number(owner: str, value, what: str) -> float | None:
    """A time or step read from a manifest (data, not an argument: always ValueError)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{owner}: {what} must be a finite number of seconds or None, got {value!r}")
    return float(value)


def event_freshness(manifests: Iterable[Mapping], event_times, steps=None,
                    served_at: Mapping[int, float] | None = None) -> FreshnessReport:
    """Freshness lag of every event (see module docstring).

    Args:
        manifests: manifests of the published versions (any order; e.g. kept from
            ``ModelPublisher.manifests`` or read with `read_manifest`).
        event_times: event times, unix seconds, any 1-D array-like (flatten batches first).
        steps: optional training step of each event (same length), for exact attribution.
        served_at: optional ``{version: unix time it started serving}``; default ``created``.
    """
    times = np.asarray(event_times, dtype=np.float64).reshape(-1)
    key_name = "step" if steps is not None else "max_event_time"
    keys = times if steps is None else np.asarray(steps, dtype=np.float64).reshape(-1)
    if keys.shape != times.shape:
        raise ValueError(f"event_freshness: 'steps' has {keys.size} entries, 'event_times' {times.size}")
    rows = []
    for m in manifests:
        key = _number("event_freshness", m.get(key_name), f"manifest {m.get('version')} {key_name}")
        if key is not None:
            served = (served_at or {}).get(m["version"], m["created"])
            rows.append((int(m["version"]), key, _number("event_freshness", served, "publish/serve time")))
    rows.sort()
    lags = np.full(times.size, np.nan)
    versions = np.zeros(times.size, dtype=np.int64)
    if rows:
        vers = np.array([r[0] for r in rows], dtype=np.int64)
        # A version contains everything an older one did: use the running max of the keys.
        covered_upto = np.maximum.accumulate(np.array([r[1] for r in rows]))
        when = np.array([r[2] for r in rows])
        idx = np.searchsorted(covered_upto, keys, side="left")  # first version with key >= event key
        hit = idx < len(rows)
        lags[hit] = when[idx[hit]] - times[hit]
        versions[hit] = vers[idx[hit]]
    return FreshnessReport(lags, versions)


def staleness(manifest: Mapping, now: float | None = None) -> float | None:
    """Seconds between the newest event in `manifest`'s version and `now` (None if unknown)."""
    check_number("staleness", "now", now, allow_none=True)
    newest = _number("staleness", manifest.get("max_event_time"), "max_event_time")
    return None if newest is None else (time.time() if now is None else now) - newest
