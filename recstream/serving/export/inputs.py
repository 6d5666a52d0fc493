"""Raw ``/predict``-style instances -> the inputs of an exported file, exactly as the server builds them.

An export takes three tensors (``dense``, ``values``, ``offsets``: see
`recstream.serving.export.signature`), not raw fields: string ids must be hashed, missing
counts filled, ``log1p`` applied. The file's signature records all of it -- ``schema`` and
``preprocessing`` (``fill_missing_dense``, ``log1p_dense``) -- and `instances_to_inputs`
applies it with the server's own request parser
(`InstanceParser`), so an exported file fed by it
scores what ``recstream serve`` answers for the same instances (after a sigmoid when the
signature's ``output`` is ``"logits"``: the server returns probabilities).

>>> import os, tempfile, torch
>>> from recstream.data import CategoricalFeature, Schema
>>> from recstream.models import WideDeep
>>> from recstream.serving.export import export_model, read_signature
>>> schema = Schema(["clicks"], [CategoricalFeature("user", hash_buckets=100)])
>>> path = os.path.join(tempfile.mkdtemp(), "model.pt")
>>> _ = export_model(WideDeep(schema, hidden=(8,)), schema, path, "torchscript",
...                  preprocessing={"fill_missing_dense": 0.0, "log1p_dense": True})
>>> sig = read_signature(path, "torchscript")
>>> dense, values, offsets = instances_to_inputs(sig, [{"clicks": 3, "user": "alice"}, {"clicks": None, "user": 7}])
>>> dense.flatten().tolist() == [torch.tensor(3.0).log1p().item(), 0.0], offsets.tolist()
(True, [0, 1, 2])
>>> scores = torch.sigmoid(torch.jit.load(path)(dense, values, offsets))  # what /predict answers
>>> scores.shape
torch.Size([2])

For ONNX Runtime: ``session.run(None, {n: t.numpy() for n, t in zip(INPUT_NAMES, inputs, strict=True)})``.
"""
from __future__ import annotations

import torch

from ...data.schema import Schema
from ...validation import check_type
from ..server.request import InstanceParser, RequestError
from .signature import INPUT_NAMES

__all__ = ["INPUT_NAMES", "instances_to_inputs"]


def instances_to_inputs(signature: dict, instances: list) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dense, values, offsets)`` CPU tensors for `instances`, as ``recstream serve`` builds them.

    Args:
        signature: an export's signature (`read_signature`, or
            what `export_model` returned).
        instances: a non-empty list of dicts of raw field values, one per example: the
            ``instances`` of a ``/predict`` body (every feature of the schema, no label).

    Raises ValueError naming the instance and field the server would refuse (400), and for a
    signature that records no ``preprocessing`` (a file exported before it was recorded:
    export it again).
    """
    owner = "instances_to_inputs"
    check_type(owner, "signature", signature, dict, allowed="an export's signature (read_signature)")
    check_type(owner, "instances", instances, list, allowed="a list of dicts of raw field values")
    missing = [k for k in ("schema", "preprocessing") if k not in signature]
    if missing:
        raise ValueError(f"{owner}: 'signature' has no {missing} entry (a file exported before recstream recorded "
                         "its preprocessing); export the model again with `recstream export`")
    parser = InstanceParser(Schema.from_dict(signature["schema"]), signature["preprocessing"],
                            max_instances=max(len(instances), 1))
    try:
        features = parser.parse({"instances": instances})
    except RequestError as e:
        raise ValueError(f"{owner}: {e.message}") from None
    return features.dense.contiguous(), features.values.contiguous(), features.offsets.contiguous()

