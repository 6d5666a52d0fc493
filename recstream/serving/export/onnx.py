"""ONNX from a ``torch.export`` program (the dynamo exporter), and running it with ONNX Runtime.

Needs the export extra: ``pip install "recstream[export]"`` (onnx, onnxscript, onnxruntime);
imported on first use only.

Three operators get their own translations:

* ``aten.repeat_interleave.Tensor`` (which id belongs to which bag or feature). onnxscript's
  version does not take the ``output_size`` argument the embedding collection passes (to
  avoid a host sync) and compares every output position with every repeat, O(N x bags)
  memory; this one is linear: scatter-add a 1 at each run's end, then a cumulative sum
  counts the runs already finished at each position::

      repeats [2, 0, 3] -> ends [2, 2, 5] -> marks [0, 0, 2, 0, 0 | 1] -> cumsum [0, 0, 2, 2, 2]

* ``aten.repeat_interleave.self_int`` (a per-feature flag repeated for every example):
  onnxscript's translation fails at run time for any batch size but 1; this one expands
  ``[n, 1]`` to ``[n, repeats]`` and flattens;

* ``aten.embedding_bag`` in ``sum`` mode (the only mode the embedding collection uses):
  onnxscript loops over the bags, one ONNX ``Loop`` iteration each (about a second per batch
  of 256 Criteo-like examples on ONNX Runtime); this one is ``Gather`` of all rows, times
  the per-id weights, and one ``ScatterND(reduction="add")`` into the bags (about as fast
  as PyTorch). Ids equal to ``padding_idx`` count zero, as in PyTorch. Other modes keep
  onnxscript's translation.

>>> import numpy as np
>>> _repeat_interleave_reference(np.array([2, 0, 3])).tolist()
[0, 0, 2, 2, 2]
"""
from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import warnings

import numpy as np
import torch

OPSET = 18  # ScatterElements(reduction="add") needs 16; ONNX Runtime 1.16+ runs 18


def _repeat_interleave_reference(repeats: np.ndarray) -> np.ndarray:
    """The algorithm of the ONNX translation, in numpy (documents and tests it)."""
    ends = np.cumsum(repeats)
    total = int(repeats.sum())
    marks = np.zeros(total + 1, dtype=np.int64)
    np.add.at(marks, ends, 1)
    return np.cumsum(marks)[:total]


def _translations() -> dict:
    from onnxscript import opset18 as op

    def repeat_interleave(repeats, output_size=None):
        zero = op.Constant(value_ints=[0])
        ends = op.CumSum(repeats, zero)
        total = op.ReduceSum(repeats, keepdims=1)  # [1]
        marks = op.Expand(zero, op.Add(total, op.Constant(value_ints=[1])))
        ones = op.Expand(op.Constant(value_ints=[1]), op.Shape(ends))
        marks = op.ScatterElements(marks, ends, ones, axis=0, reduction="add")
        return op.Slice(op.CumSum(marks, zero), zero, total)

    def embedding_bag(weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
                      per_sample_weights=None, include_last_offset=False, padding_idx=None):
        if mode != 0:  # mean / max: not used by recstream's collections; onnxscript's own loop
            from onnxscript.function_libs.torch_lib.ops.core import aten_embedding_bag_padding_idx
            return aten_embedding_bag_padding_idx(weight, indices, offsets, scale_grad_by_freq, mode, sparse,
                                                  per_sample_weights, include_last_offset, padding_idx)
        zero, one = op.Constant(value_ints=[0]), op.Constant(value_ints=[1])
        bounds = offsets if include_last_offset else op.Concat(offsets, op.Shape(indices), axis=0)
        lengths = op.Sub(op.Slice(bounds, one, op.Constant(value_ints=[2 ** 62])),
                         op.Slice(bounds, zero, op.Constant(value_ints=[-1])))
        bag_of_id = repeat_interleave(lengths)
        rows = op.Gather(weight, indices, axis=0)  # [N, D]
        if per_sample_weights is not None:
            rows = op.Mul(rows, op.Unsqueeze(op.CastLike(per_sample_weights, rows), one))
        if padding_idx is not None and padding_idx >= 0:
            keep = op.Not(op.Equal(indices, op.Constant(value_int=padding_idx)))
            rows = op.Mul(rows, op.Unsqueeze(op.CastLike(keep, rows), one))
        shape = op.Concat(op.Shape(lengths), op.Shape(weight, start=1), axis=0)  # [bags, D]
        zeros = op.Expand(op.CastLike(op.Constant(value_float=0.0), weight), shape)
        pooled = op.ScatterND(zeros, op.Unsqueeze(bag_of_id, one), rows, reduction="add")
        # The other three results (offset2bag, bag_size, max_indices) serve backward only.
        return pooled, bag_of_id, lengths, lengths

    def repeat_interleave_int(self, repeats, dim=None, output_size=None):
        if dim not in (None, 0) or (dim == 0 and len(self.shape) != 1):  # not used by the embedding collection
            from onnxscript.function_libs.torch_lib.ops.core import aten_repeat_interleave_self_int
            return aten_repeat_interleave_self_int(self, repeats, dim)
        flat = op.Reshape(self, op.Constant(value_ints=[-1]))
        times = op.Constant(value_ints=[repeats]) if isinstance(repeats, int) else op.Reshape(repeats, [1])
        tiled = op.Expand(op.Unsqueeze(flat, op.Constant(value_ints=[1])), op.Concat(op.Shape(flat), times, axis=0))
        return op.Reshape(tiled, op.Constant(value_ints=[-1]))

    return {torch.ops.aten.repeat_interleave.Tensor: repeat_interleave,
            torch.ops.aten.repeat_interleave.self_int: repeat_interleave_int,
            torch.ops.aten.embedding_bag.padding_idx: embedding_bag,
            torch.ops.aten.embedding_bag.default: embedding_bag,
            torch.ops.aten._embedding_bag.default: embedding_bag}


def save_onnx(program: torch.export.ExportedProgram, path: str, signature: dict) -> None:
    """Convert `program` and write it to `path`, with `signature` as metadata ``recstream.signature``."""
    names = [i["name"] for i in signature["inputs"]]
    # The exporter prints its progress to stdout, and it and onnxscript's optimizer log notes (a
    # warning per absent torchvision operator, ...); a CLI's output must stay the CLI's own.
    loggers = [logging.getLogger(name) for name in ("torch.onnx", "onnxscript", "onnx_ir")]
    levels = [log.level for log in loggers]
    for log in loggers:
        log.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # the exporter's own use of deprecated torch APIs
            onnx_program = torch.onnx.export(program, dynamo=True, input_names=names,
                                             output_names=[signature["output"]], opset_version=OPSET,
                                             custom_translation_table=_translations(), verbose=False)
            onnx_program.model.metadata_props["recstream.signature"] = json.dumps(signature, sort_keys=True)
            onnx_program.save(os.fspath(path))
    finally:
        for log, level in zip(loggers, levels, strict=True):
            log.setLevel(level)


def load_onnx(path: str):
    """A callable ``(dense, values, offsets) -> torch.Tensor`` running `path` on ONNX Runtime (CPU)."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()  # as torch would; the default is all cores
    session = onnxruntime.InferenceSession(os.fspath(path), options, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]

    def run(*inputs: torch.Tensor) -> torch.Tensor:
        feed = {n: np.ascontiguousarray(t.detach().cpu().numpy()) for n, t in zip(names, inputs, strict=True)}
        return torch.from_numpy(session.run(None, feed)[0])

    return run
