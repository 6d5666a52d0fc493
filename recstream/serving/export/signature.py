"""The plain-tensor signature of an exported model, and the module that takes it.

Exporters (``torch.export``, ONNX, TorchScript) take tensors, not a
`Features` dataclass, so an export flattens the batch at the
boundary: `FlatInputs` wraps the network and rebuilds the Features inside the graph.

Inputs (all on CPU; ``B`` = batch size, dynamic; ``F`` = the schema's categorical features):

* ``dense``   float32 ``[B, n_dense]``: dense values in schema order (``[B, 0]`` without any);
* ``values``  int64 ``[N]``: every id of the batch, flat, FEATURE-MAJOR (``N`` dynamic);
* ``offsets`` int64 ``[F * B + 1]``: the ids of feature ``f`` for example ``b`` are
  ``values[offsets[f * B + b] : offsets[f * B + b + 1]]`` (``offsets[0] == 0``,
  ``offsets[-1] == N``), i.e. `Features.offsets`.

A ``dynamic=True`` feature (the signature's ``schema`` says ``"dynamic": true``) takes any
int64 id in ``values``; an id its frozen table does not hold reads the table's default vector.

Output: float32 ``[B]``, named ``logits`` or ``probabilities`` after what the network returns
(the published manifest's ``model.output``; recstream models return logits).

The signature also records what turns raw fields into these inputs: the ``schema`` (hash buckets,
vocabularies, dynamic features) and the ``preprocessing`` of dense values (``fill_missing_dense``,
``log1p_dense``; ``{}`` for none), which
`instances_to_inputs` applies as the server does.

>>> from recstream.data import CategoricalFeature, Schema
>>> sig = signature(Schema(["x"], [CategoricalFeature("a", vocab_size=5), CategoricalFeature("b", vocab_size=7)]))
>>> [(i["name"], i["dtype"], i["shape"]) for i in sig["inputs"]]
[('dense', 'float32', ['batch', 1]), ('values', 'int64', ['num_ids']), ('offsets', 'int64', ['2*batch+1'])]
>>> sig["outputs"]
[{'name': 'logits', 'dtype': 'float32', 'shape': ['batch']}]
>>> sig["preprocessing"]
{}
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from ...data.schema import Schema
from ...features import Features

INPUT_NAMES = ("dense", "values", "offsets")
LAYOUT = ("feature-major: the ids of feature f for example b are "
          "values[offsets[f*batch+b]:offsets[f*batch+b+1]]")


class FlatInputs(nn.Module):
    """``network`` called on ``(dense, values, offsets)`` tensors instead of a Features.

    The features are in schema order (categorical, then crosses). Given `names` (the schema's
    ``feature_names``; a schema with dynamic features or crosses needs them: their tables read
    bags by name) they are named, else
    unnamed and the network reads them by position.
    """

    def __init__(self, network: nn.Module, num_features: int, names: Sequence[str] | None = None) -> None:
        super().__init__()
        self.network = network
        self.num_features = num_features
        self.names = None if names is None else tuple(names)

    def forward(self, dense: torch.Tensor, values: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        # dense.shape[0] stays symbolic under torch.export: the batch size is not fixed.
        return self.network(Features(dense, values, offsets, dense.shape[0], self.num_features, self.names))


def signature(schema: Schema, output: str = "logits", preprocessing: dict | None = None) -> dict:
    """The JSON-able description of an export's inputs, output and preprocessing (see the module doc)."""
    nf = schema.num_features  # categorical features, then crosses
    return {
        "inputs": [
            {"name": "dense", "dtype": "float32", "shape": ["batch", schema.num_dense]},
            {"name": "values", "dtype": "int64", "shape": ["num_ids"]},
            {"name": "offsets", "dtype": "int64", "shape": [f"{nf}*batch+1"]},
        ],
        "outputs": [{"name": output, "dtype": "float32", "shape": ["batch"]}],
        "output": output,
        "layout": LAYOUT,
        "schema": schema.to_dict(),
        "preprocessing": dict(preprocessing or {}),
    }


def example_inputs(schema: Schema, batch_size: int = 4) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Deterministic valid inputs to trace with: ragged bags (0 to 2 ids), ids within each table
    (below ``capacity`` for a dynamic feature: any int64 is valid there).

    Bags of different lengths keep the tracer from relating ``N`` to ``B`` (single-hot
    examples would have ``N == F * B``, which an export could then require).
    """
    nf = schema.num_features
    lengths = (torch.arange(nf * batch_size, dtype=torch.int64) % 3).view(nf, batch_size)
    sizes = torch.tensor(schema.table_sizes() + [t.num_embeddings for t in schema.cross_tables()], dtype=torch.int64)
    feature_of_id = torch.repeat_interleave(torch.arange(nf), lengths.sum(dim=1))
    values = torch.arange(feature_of_id.numel(), dtype=torch.int64) % sizes[feature_of_id]
    dense = torch.linspace(-1.0, 1.0, batch_size * schema.num_dense).view(batch_size, schema.num_dense)
    features = Features.from_lengths(dense, values, lengths)
    return features.dense, features.values, features.offsets


def dynamic_shapes(schema: Schema) -> dict:
    """``torch.export`` dynamic shapes: any batch size >= 1, any number of ids."""
    batch = torch.export.Dim("batch", min=1)
    return {"dense": {0: batch}, "values": {0: torch.export.Dim("num_ids", min=0)},
            "offsets": {0: schema.num_features * batch + 1}}
