"""Test events: synthetic CTR rows as CSV / JSON / Criteo records with event ids and times.

Every record carries ``event_id`` (its index) and ``event_time`` (``T0 + id``), so a test
can check that a stream delivered exactly the events sent: none lost, none twice.
"""
from __future__ import annotations

import numpy as np
import torch

from recstream.cli.producers import format_records
from recstream.data import SyntheticCTR
from recstream.data.streams import CriteoTSVDecoder, CSVLineDecoder, JSONDecoder

GEN = SyntheticCTR(num_dense=2, num_categorical=3, seed=1, batch_size=1)
SCHEMA = GEN.schema  # label, I1, I2, C1 (100 ids), C2 (1000), C3 (10000)
T0 = 1_700_000_000.0


MAX_EVENTS = 50_000
_ALL: list = []


def rows(n: int, start: int = 0):
    """(labels, dense, ids) of events ``start..start+n-1``: event i is always the same row."""
    if start + n > MAX_EVENTS:
        raise ValueError(f"test events go up to {MAX_EVENTS}")
    if not _ALL:
        features, labels = next(iter(SyntheticCTR(2, 3, seed=1, batch_size=MAX_EVENTS).train_batches(1)))
        _ALL.extend([labels.numpy(), features.dense.numpy(), features.values.view(3, MAX_EVENTS).T.numpy()])
    return tuple(a[start:start + n] for a in _ALL)


def records(n: int, start: int = 0, fmt: str = "csv", meta: bool = True) -> list[bytes]:
    """`n` events with ids ``start..start+n-1`` as records of `fmt` (csv, jsonl, criteo)."""
    labels, dense, ids = rows(n, start)
    if fmt == "criteo":  # Criteo rows: 13 counts, 26 ids
        dense = np.abs(np.tile(dense, (1, 7))[:, :13]) * 100
        ids = np.tile(ids, (1, 9))[:, :26]
    event_ids = np.arange(start, start + n)
    return format_records(fmt, labels, dense, ids, names=None if fmt == "criteo" else list(SCHEMA.columns),
                          event_ids=event_ids if meta else None, times=T0 + event_ids if meta else None)


def decoder(fmt: str = "csv", **kw):
    meta = dict(id_column="event_id", time_column="event_time")
    if fmt == "criteo":
        return CriteoTSVDecoder(1000, **meta, **kw)
    return (JSONDecoder if fmt == "jsonl" else CSVLineDecoder)(SCHEMA, **meta, **kw)


def take_ids(stream, limit: int | None = None) -> list[int]:
    """Event ids of the batches `stream` yields (all, or until `limit` ids)."""
    out: list[int] = []
    for _ in stream:
        out += stream.last_batch_meta()["ids"].tolist()
        if limit is not None and len(out) >= limit:
            break
    return out


def assert_same_batch(a, b) -> None:
    """Two Batches hold the same examples (features and labels)."""
    assert a.batch_size == b.batch_size
    torch.testing.assert_close(a.features.dense, b.features.dense)
    assert torch.equal(a.features.values, b.features.values)
    assert torch.equal(a.features.offsets, b.features.offsets)
    assert torch.equal(a.labels, b.labels)
