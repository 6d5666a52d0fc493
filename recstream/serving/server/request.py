"""Turn a ``/predict`` JSON body into model inputs, validated against the version's schema.

Body: ``{"instances": [{"<dense>": 1.5, "<categorical>": value_or_list, ...}, ...]}``. Every
instance must have exactly the schema's features (no label):

* dense features: a JSON number, finite in float32 after the manifest's transform
  (``1e39`` is refused: float32 makes it ``inf``); ``null`` only when the publisher recorded
  ``fill_missing_dense``;
* categorical features with ``vocab_size``: an integer id in ``[0, vocab_size)``;
* ``hash_buckets`` / ``vocabulary`` features: the RAW value, a string or an integer, hashed or
  looked up exactly as the training reader does (``null``: missing, id 0);
* ``dynamic`` features: an integer key (int64) or a non-empty string, keyed exactly as the
  training reader does (`to_keys`); a key training never saw is
  no error: the model reads its table's default vector;
* ``multi_hot`` features take a list of such values (cut to ``max_len`` like the reader);
  single-valued ones a scalar.

Cross features (``schema.crosses``) are no fields: they are computed from the instance's
categorical ids by the readers' own `cross_bags`.

Values go through the training readers' own `ColumnConverter`
(with the manifest's ``preprocessing``), so serving sees the exact ids and dense transform
training saw. Problems raise `RequestError` (HTTP status + JSON-able reason).

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

import bisect
import itertools
import json
import math
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from ...data.batch import Features
from ...data.convert import ColumnConverter, cross_bags, to_keys
from ...data.hashing import hash_strings, to_buckets
from ...data.schema import CategoricalFeature, Schema
from ...validation import check_int, check_type

_F32_MAX = float(np.finfo(np.float32).max)
_SHOWN = 5  # missing fields named in an error message


class RequestError(Exception):
    """A rejected request: HTTP `status` and a reason (plus optional details) for the JSON body."""

    def __init__(self, status: int, message: str, **details: Any):
        super().__init__(message)
        self.status, self.message, self.details = status, message, details

    def body(self) -> dict:
        return {"error": self.message, **self.details}


def _bad(message: str, **details) -> RequestError:
    return RequestError(400, message, **details)


def _reject_constant(name: str):
    raise RequestError(400, f"invalid JSON: {name} is not a number")


def decode_json(body: bytes) -> Any:
    """The JSON value of a request body; RequestError 400 (with a reason) for anything else.

    Strict UTF-8 (no BOM sniffing), no NaN/Infinity. Nesting deeper than the interpreter's
    recursion limit is refused as such (the C decoder raises RecursionError there): a
    hostile body must cost one 400, never a traceback or a crash.
    """
    try:
        return json.loads(body.decode("utf-8"), parse_constant=_reject_constant)
    except RequestError:
        raise
    except RecursionError:
        raise _bad("invalid JSON: nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError, integer digit limit, bad UTF-8
        raise _bad(f"invalid JSON: {_short(str(e))}") from None


def _short(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def _names(names: list) -> list[str]:
    """Field names for an error message: at most 10, each cut short (the body is untrusted)."""
    return [_short(str(n), 64) for n in names[:10]] + (["..."] if len(names) > 10 else [])


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _text(v) -> str:
    return str(v) if _is_int(v) else v


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
        # Validated values need no fault search: build tensors directly (the converter costs a few
        # Arrow calls per column, milliseconds per request). Vocabulary lookups keep the converter.
        self.direct = all(f.vocabulary is None for f in schema.categorical)
        self.fields = set(schema.dense_names) | set(schema.categorical_names)

    def _check_fields(self, i: int, inst: Any) -> None:
        if not isinstance(inst, dict):
            raise _bad(f"instance {i}: must be a JSON object of feature values, got {type(inst).__name__}",
                       instance=i)
        unknown, missing = sorted(set(inst) - self.fields), sorted(self.fields - set(inst))
        if unknown:
            raise _bad(f"instance {i}: unknown field(s) {_names(unknown)}", instance=i, fields=_names(unknown))
        if missing:  # a first request often misses all of them: name a few, and where the list is
            shown = ", ".join(repr(m) for m in missing[:_SHOWN]) + (", ..." if len(missing) > _SHOWN else "")
            raise _bad(f"instance {i}: missing {len(missing)} field(s): {shown} (GET /schema lists every field "
                       "with its type)", instance=i, missing=len(missing), fields=_names(missing))

    def describe(self) -> dict:
        """What an instance holds: each field with the JSON values it takes, one valid example
        instance, and the preprocessing (what ``GET /schema`` answers).

        >>> from recstream.data import Schema, CategoricalFeature
        >>> d = InstanceParser(Schema(["x"], [CategoricalFeature("c", vocab_size=5)])).describe()
        >>> d["fields"][1]
        {'name': 'c', 'kind': 'categorical', 'type': 'integer', 'min': 0, 'max': 4, 'nullable': False}
        >>> d["example"]
        {'x': 0.0, 'c': 0}
        """
        fields = [{"name": n, "kind": "dense", "type": "number", "nullable": self.allow_null_dense}
                  for n in self.schema.dense_names]
        example: dict[str, Any] = dict.fromkeys(self.schema.dense_names, 0.0)
        for f in self.schema.categorical:
            field: dict[str, Any] = {"name": f.name, "kind": "categorical"}
            if f.dynamic:
                field.update(type="integer (int64) or non-empty string", nullable=False, dynamic=True)
                value: Any = 1
            elif f.hashed or f.vocabulary is not None:
                field.update(type="string or integer (the raw value)", nullable=True)
                if f.vocabulary is not None:
                    field["vocabulary_size"] = len(f.vocabulary)
                value = f.vocabulary[0] if f.vocabulary is not None else "a"
            else:
                field.update(type="integer", min=0, max=f.vocab_size - 1, nullable=False)
                value = 0
            if f.multi_hot:
                field.update(list=True, max_len=f.max_len, nullable=False)
                value = [value]
            fields.append(field)
            example[f.name] = value
        preprocessing = {"fill_missing_dense": self.converter.fill_missing_dense,
                         "log1p_dense": self.converter.log1p_dense}
        out = {"fields": fields, "example": example, "preprocessing": preprocessing}
        if self.schema.crosses:  # computed from the fields, not sent
            out["crosses"] = [x.to_dict() for x in self.schema.crosses]
        return out

    def _dense(self, i: int, name: str, v: Any) -> float | None:
        if v is None and self.allow_null_dense:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise _bad(f"instance {i}: {name!r} must be a number, got {type(v).__name__}", instance=i, field=name)
        try:
            v = float(v)
        except OverflowError:  # an integer literal with hundreds of digits
            raise _bad(f"instance {i}: {name!r} must be finite, got an integer too large for a float",
                       instance=i, field=name) from None
        if not math.isfinite(v):
            raise _bad(f"instance {i}: {name!r} must be finite, got {v}", instance=i, field=name)
        return v

    def _key(self, i: int, f: CategoricalFeature, v: Any):
        """A dynamic feature's value: an int64 or a non-empty string ("" only inside a list, where
        the reader drops it as an absent element)."""
        if _is_int(v):
            if not -2 ** 63 <= v < 2 ** 63:
                raise _bad(f"instance {i}: {f.name!r} key {v} does not fit in int64", instance=i, field=f.name)
            return v
        if isinstance(v, str) and (v or f.multi_hot):
            if not _utf8(v):
                raise _bad(f"instance {i}: {f.name!r} is not valid Unicode text (lone surrogate)",
                           instance=i, field=f.name)
            return v
        got = "an empty string" if v == "" else type(v).__name__
        raise _bad(f"instance {i}: {f.name!r} takes an integer or a non-empty string id, got {got}",
                   instance=i, field=f.name)

    def _scalar(self, i: int, f: CategoricalFeature, v: Any):
        if f.dynamic:
            return self._key(i, f, v)
        if f.hashed or f.vocabulary is not None:  # raw values: hashed / looked up by their text
            if v is None:
                return None
            if isinstance(v, str):
                if not _utf8(v):  # a lone surrogate ("\\ud800") decodes from JSON but is no text
                    raise _bad(f"instance {i}: {f.name!r} is not valid Unicode text (lone surrogate)",
                               instance=i, field=f.name)
                return v
            if _is_int(v):
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
        t = pa.string() if (f.hashed or f.vocabulary is not None or f.dynamic) else pa.int64()
        return pa.list_(t) if f.multi_hot else t

    def instances(self, payload: Any) -> list:
        """The ``instances`` list of a decoded body, after the top-level checks (shape, count)."""
        if not isinstance(payload, dict) or "instances" not in payload:
            raise _bad('body must be a JSON object {"instances": [...]}')
        extra = sorted(set(payload) - {"instances"})
        if extra:
            raise _bad(f"unknown top-level field(s) {_names(extra)}; expected only 'instances'")
        instances = payload["instances"]
        if not isinstance(instances, list) or not instances:
            raise _bad("'instances' must be a non-empty list")
        if len(instances) > self.max_instances:
            raise _bad(f"too many instances: {len(instances)} > {self.max_instances}",
                       max_instances=self.max_instances)
        return instances

    def columns(self, instances: list) -> dict[str, list]:
        """Validated column lists (feature name -> one value per instance) of `instances`."""
        columns: dict[str, list] = {d: [] for d in self.schema.dense_names}
        columns.update({c: [] for c in self.schema.categorical_names})
        for i, inst in enumerate(instances):
            self._check_fields(i, inst)
            for name in self.schema.dense_names:
                columns[name].append(self._dense(i, name, inst[name]))
            for f in self.schema.categorical:
                columns[f.name].append(self._categorical(i, f, inst[f.name]))
        for name in self.schema.dense_names:
            self._check_float32(name, columns[name])
        return columns

    def _float64(self, values: list) -> np.ndarray:
        fill = self.converter.fill_missing_dense
        return np.asarray([fill if v is None else v for v in values], dtype=np.float64)

    def _check_float32(self, name: str, values: list) -> None:
        """400 for a value that is not finite where the model gets it (float32, after the
        manifest's transform): ``1e39`` is a finite JSON number but ``inf`` in float32."""
        bad = self.converter.dense_float32(self._float64(values))[1]
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise _bad(f"instance {i}: {name!r} value {values[i]!r} is not finite in float32 "
                       f"(|x| <= {_F32_MAX:.8g})", instance=i, field=name, reason="non_finite")

    def _direct_dense(self, parts: list[dict[str, list]], n: int) -> torch.Tensor:
        dense = np.empty((n, self.schema.num_dense), dtype=np.float32)
        for j, name in enumerate(self.schema.dense_names):  # the converter's own transform and cast
            dense[:, j] = self.converter.dense_float32(self._float64([v for p in parts for v in p[name]]))[0]
        return torch.from_numpy(dense)

    def _direct_ids(self, f: CategoricalFeature, values: list) -> np.ndarray:
        if f.dynamic:  # ints are keys; strings keyed (parsed or hashed) as the reader does
            keys = np.fromiter((v if _is_int(v) else 0 for v in values), dtype=np.int64, count=len(values))
            text = [j for j, v in enumerate(values) if not _is_int(v)]
            if text:
                keys[text] = to_keys(pa.array([values[j] for j in text], pa.string()))[0]
            return keys
        if not f.hashed:
            return np.asarray(values, dtype=np.int64)
        text = pa.array(values, pa.string())
        ids = to_buckets(hash_strings(text), f.hash_buckets)
        if text.null_count:
            ids[np.asarray(text.is_null(), dtype=bool)] = 0  # reserved id for missing
        return ids

    def _direct(self, parts: list[dict[str, list]]) -> Features:
        """Features of validated `parts`, equal to what the converter builds (a test checks)."""
        n = sum(len(next(iter(p.values()))) for p in parts)
        ids, lengths = [], []
        for f in self.schema.categorical:
            column = [v for p in parts for v in p[f.name]]
            if not f.multi_hot:
                ids.append(self._direct_ids(f, column))
                lengths.append(np.ones(n, dtype=np.int64))
                continue
            if f.hashed or f.dynamic:  # "" is an absent element for the reader: drop it the same way
                column = [[x for x in row if x != ""] for row in column]
            if f.max_len is not None:
                column = [row[: f.max_len] for row in column]
            ids.append(self._direct_ids(f, [x for row in column for x in row]))
            lengths.append(np.fromiter((len(row) for row in column), dtype=np.int64, count=n))
        for cross_ids, cross_lens in cross_bags(self.schema, list(zip(ids, lengths, strict=True))):
            ids.append(cross_ids)  # the converter's own cross ids (training's)
            lengths.append(cross_lens)
        values = torch.from_numpy(np.concatenate(ids)) if ids else torch.zeros(0, dtype=torch.int64)
        lens = torch.from_numpy(np.stack(lengths)) if lengths else torch.zeros(0, n, dtype=torch.int64)
        keys = tuple(self.schema.feature_names)
        return Features.from_lengths(self._direct_dense(parts, n), values, lens, keys=keys)

    def convert(self, parts: list[dict[str, list]]) -> tuple[Features, list[RequestError | None]]:
        """One ``Features`` for several requests' `parts` (from `columns`), in order.

        Returns the features of the good rows and, per part, None or the 400 for its first
        row the training reader's converter drops as bad: the caller rejects that part and
        skips its rows' outputs (the other parts' rows stay, in order).
        """
        if self.direct:
            return self._direct(parts), [None] * len(parts)
        sizes = [len(next(iter(p.values()))) if p else 0 for p in parts]
        total = sum(sizes)
        arrays = {self.schema.label: pa.array([0.0] * total, pa.float64())}
        for d in self.schema.dense_names:
            arrays[d] = pa.array([v for p in parts for v in p[d]], pa.float64())
        for f in self.schema.categorical:
            column = [v for p in parts for v in p[f.name]]
            if f.dynamic:  # a string column: to_keys reads a decimal int back as the same key
                column = [[_text(x) for x in v] if isinstance(v, list) else _text(v) for v in column]
            arrays[f.name] = pa.array(column, self._arrow_type(f))
        batch, faults = self.converter.convert(pa.table(arrays))
        errors: list[RequestError | None] = [None] * len(parts)
        if faults:  # rare: rows the reader would have dropped as bad
            starts = list(itertools.accumulate(sizes, initial=0))
            for fault in faults:
                part = bisect.bisect_right(starts, fault.index) - 1
                if errors[part] is None:
                    i = fault.index - starts[part]
                    errors[part] = _bad(f"instance {i}: {fault.column!r}: {fault.detail}", instance=i,
                                        field=fault.column, reason=fault.reason)
        return batch.features, errors

    def parse(self, payload: Any) -> Features:
        """``Features`` for the instances of `payload` (the decoded JSON body)."""
        features, errors = self.convert([self.columns(self.instances(payload))])
        if errors[0] is not None:
            raise errors[0]
        return features
