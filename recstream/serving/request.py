"""Turn a ``/predict`` JSON body into model inputs, validated against the version's schema.

Body: ``{"instances": [{"<dense>": 1.5, "<categorical>": value_or_list, ...}, ...]}``. Every
instance must have exactly the schema's features (no label):

* dense features: a JSON number (finite; ``null`` only when the publisher recorded
  ``fill_missing_dense``);
* categorical features with ``vocab_size``: an integer id in ``[0, vocab_size)``;
* ``hash_buckets`` / ``vocabulary`` features: the RAW value, a string or an integer, hashed or
  looked up exactly as the training reader does (``null``: missing, id 0);
* ``multi_hot`` features take a list of such values (cut to ``max_len`` like the reader);
  single-valued ones a scalar.

Values go through the training readers' own :class:`~recstream.data.convert.ColumnConverter`
(with the manifest's ``preprocessing``), so serving sees the exact ids and dense transform
training saw. Problems raise :class:`RequestError` (HTTP status + JSON-able reason).

>>> from recstream.data import Schema, CategoricalFeature
>>> p = InstanceParser(Schema(["x"], [CategoricalFeature("c", vocab_size=5)]))
>>> p.parse({"instances": [{"x": 0.5, "c": 3}]}).values.tolist()
[3]
>>> try:
...     p.parse({"instances": [{"x": 0.5, "c": 7}]})
... except RequestError as e:
...     print(e.status, e.body()["error"])
400 instance 0: 'c' id 7 is outside [0, 5)
"""
from __future__ import annotations

import math
from typing import Any

import pyarrow as pa

from ..data.batch import Features
from ..data.convert import ColumnConverter
from ..data.schema import CategoricalFeature, Schema
from ..validation import check_int, check_type


class RequestError(Exception):
    """A rejected request: HTTP `status` and a reason (plus optional details) for the JSON body."""

    def __init__(self, status: int, message: str, **details: Any):
        super().__init__(message)
        self.status, self.message, self.details = status, message, details

    def body(self) -> dict:
        return {"error": self.message, **self.details}


def _bad(message: str, **details) -> RequestError:
    return RequestError(400, message, **details)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


class InstanceParser:
    """Validates and converts instances for one schema (see module docstring).

    Args:
        schema: the served version's schema.
        preprocessing: the manifest's ``preprocessing`` (``fill_missing_dense``, ``log1p_dense``).
        max_instances: most instances per request (400 beyond).
    """

    def __init__(self, schema: Schema, preprocessing: dict | None = None, max_instances: int = 1024):
        owner = "InstanceParser"
        self.schema = check_type(owner, "schema", schema, Schema, allowed="a recstream.data.Schema")
        check_type(owner, "preprocessing", preprocessing, dict, allow_none=True)
        self.max_instances = check_int(owner, "max_instances", max_instances, minimum=1)
        self.converter = ColumnConverter(schema, **(preprocessing or {}))
        self.allow_null_dense = self.converter.fill_missing_dense is not None
        self.fields = set(schema.dense_names) | set(schema.categorical_names)

    def _check_fields(self, i: int, inst: Any) -> None:
        if not isinstance(inst, dict):
            raise _bad(f"instance {i}: must be a JSON object of feature values, got {type(inst).__name__}",
                       instance=i)
        unknown, missing = sorted(set(inst) - self.fields), sorted(self.fields - set(inst))
        if unknown:
            raise _bad(f"instance {i}: unknown field(s) {unknown}", instance=i, fields=unknown)
        if missing:
            raise _bad(f"instance {i}: missing field(s) {missing}", instance=i, fields=missing)

    def _dense(self, i: int, name: str, v: Any) -> float | None:
        if v is None and self.allow_null_dense:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise _bad(f"instance {i}: {name!r} must be a number, got {type(v).__name__}", instance=i, field=name)
        v = float(v)
        if not math.isfinite(v):
            raise _bad(f"instance {i}: {name!r} must be finite, got {v}", instance=i, field=name)
        return v

    def _scalar(self, i: int, f: CategoricalFeature, v: Any):
        if f.hashed or f.vocabulary is not None:  # raw values: hashed / looked up by their text
            if v is None:
                return None
            if isinstance(v, str) or _is_int(v):
                return str(v)
            raise _bad(f"instance {i}: {f.name!r} values must be strings or integers, got {type(v).__name__}",
                       instance=i, field=f.name)
        if not _is_int(v):
            raise _bad(f"instance {i}: {f.name!r} must be an integer id, got {type(v).__name__}",
                       instance=i, field=f.name)
        if not 0 <= v < f.vocab_size:
            raise _bad(f"instance {i}: {f.name!r} id {v} is outside [0, {f.vocab_size})", instance=i, field=f.name)
        return v

    def _categorical(self, i: int, f: CategoricalFeature, v: Any):
        if not f.multi_hot:
            if isinstance(v, list):
                raise _bad(f"instance {i}: {f.name!r} takes one value, got a list", instance=i, field=f.name)
            return self._scalar(i, f, v)
        if not isinstance(v, list):
            raise _bad(f"instance {i}: {f.name!r} is multi-hot and takes a list, got {type(v).__name__}",
                       instance=i, field=f.name)
        out = [self._scalar(i, f, x) for x in v]
        if any(x is None for x in out):
            raise _bad(f"instance {i}: {f.name!r} list must not contain null", instance=i, field=f.name)
        return out

    def _arrow_type(self, f: CategoricalFeature) -> pa.DataType:
        t = pa.string() if (f.hashed or f.vocabulary is not None) else pa.int64()
        return pa.list_(t) if f.multi_hot else t

    def parse(self, payload: Any) -> Features:
        """``Features`` for the instances of `payload` (the decoded JSON body)."""
        if not isinstance(payload, dict) or "instances" not in payload:
            raise _bad('body must be a JSON object {"instances": [...]}')
        extra = sorted(set(payload) - {"instances"})
        if extra:
            raise _bad(f"unknown top-level field(s) {extra}; expected only 'instances'")
        instances = payload["instances"]
        if not isinstance(instances, list) or not instances:
            raise _bad("'instances' must be a non-empty list")
        if len(instances) > self.max_instances:
            raise _bad(f"too many instances: {len(instances)} > {self.max_instances}",
                       max_instances=self.max_instances)
        columns: dict[str, list] = {d: [] for d in self.schema.dense_names}
        columns.update({c: [] for c in self.schema.categorical_names})
        for i, inst in enumerate(instances):
            self._check_fields(i, inst)
            for name in self.schema.dense_names:
                columns[name].append(self._dense(i, name, inst[name]))
            for f in self.schema.categorical:
                columns[f.name].append(self._categorical(i, f, inst[f.name]))
        arrays = {self.schema.label: pa.array([0.0] * len(instances), pa.float64())}
        arrays.update({d: pa.array(columns[d], pa.float64()) for d in self.schema.dense_names})
        arrays.update({f.name: pa.array(columns[f.name], self._arrow_type(f)) for f in self.schema.categorical})
        batch, faults = self.converter.convert(pa.table(arrays))
        if faults:  # what the reader would have dropped as a bad row
            fault = faults[0]
            raise _bad(f"instance {fault.index}: {fault.column!r}: {fault.detail}", instance=fault.index,
                       field=fault.column, reason=fault.reason)
        return batch.features
