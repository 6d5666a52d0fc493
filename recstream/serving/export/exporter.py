"""Export a trained or published network for other servers: ONNX, TorchScript, ``torch.export``.

[`export_model`][recstream.serving.export.exporter.export_model] writes one file that runs without recstream:

=====================  ============================  ==========================================
``format``             load it with                  serve it with (for example)
=====================  ============================  ==========================================
``"exported-program"``  ``torch.export.load(p)``      PyTorch, AOTInductor (``.pt2``)
``"onnx"``             ``onnxruntime``               ONNX Runtime, Triton (onnxruntime backend)
``"torchscript"``      ``torch.jit.load(p)``         LibTorch (C++), Triton (pytorch backend)
=====================  ============================  ==========================================

The exported model takes three plain tensors -- ``dense`` float32 ``[B, n_dense]``,
``values`` int64 ``[N]``, ``offsets`` int64 ``[F*B + 1]`` (the flat feature-major layout of
`Features`) -- and returns float32 ``[B]``, logits or
probabilities as the network does (see `recstream.serving.export.signature`). Any batch
size >= 1 works, not only the one traced. Every file carries this signature as JSON (read it
with `read_signature`): ONNX metadata ``recstream.signature``, or the archive entry
``recstream_signature.json`` of the other two.

The file is self-contained: its signature records the schema (hash buckets, vocabularies) and
the ``preprocessing`` of dense values (``fill_missing_dense``, ``log1p_dense``: a published
version's, or `preprocessing`), and `instances_to_inputs`
turns raw ``/predict``-style instances into the three tensors exactly as ``recstream serve`` does.

The export reads ids without checking them against the vocabulary sizes (that check needs
data-dependent control flow, which the formats do not carry): an id past its table reads a
row of the next table. Check ids before calling (the signature's ``schema`` has every size).

Dynamic-id features (``dynamic=True``, a [`HashEmbedding`][recstream.nn.hash_embedding.HashEmbedding] each) export
too: the copy that is exported has each table frozen into its admitted keys and rows
(`FrozenHashLookup`: a binary search of fixed
depth, which every format carries). Any int64 id is valid for such a feature: an admitted key
reads its row, any other -- never seen, pending, evicted -- the table's default vector, as
the eval-mode network does (``max_norm`` applied to the rows). The file is a snapshot: keys
admitted after the export are not in it. A key-sharded table (each rank holds some keys)
is refused; export the published snapshot instead, loaded whole in one process.

`export_published` exports the newest usable version of a publish directory (or of
the one publish directory inside a run directory), rebuilt as ``recstream serve`` does; on
the command line: ``recstream export DIR --format onnx --output model.onnx``.

Each export is checked before it replaces `path`: the written file is loaded and run on
two batches of different sizes, and must match the eager network within 1e-5.

>>> import os, tempfile, torch
>>> from recstream.data import CategoricalFeature, Schema
>>> from recstream.features import Features
>>> from recstream.models import WideDeep
>>> schema = Schema(["x"], [CategoricalFeature("c", vocab_size=5)])
>>> net = WideDeep(schema, hidden=(8,)).eval()
>>> path = os.path.join(tempfile.mkdtemp(), "model.pt")
>>> export_model(net, schema, path, format="torchscript")["inputs"][2]
{'name': 'offsets', 'dtype': 'int64', 'shape': ['1*batch+1']}
>>> x = Features.from_lengths(torch.randn(3, 1), torch.tensor([0, 4, 2]), torch.ones(1, 3))
>>> torch.allclose(torch.jit.load(path)(x.dense, x.values, x.offsets), net(x))
True
"""
from __future__ import annotations

import contextlib
import json
import os
import tempfile
import warnings
from typing import Any

import torch
from torch import nn

from ...data.schema import Schema
from ...models.dynamic import DynamicTables
from ...nn import EmbeddingBagCollection, HashEmbedding
from ...nn.tier_export import untiered_copy
from ...validation import check_bool, check_choice, check_module, check_type
from ..server.request import InstanceParser
from ..snapshot.layout import list_versions
from ..snapshot.loader import load_latest
from ..snapshot.model_spec import OUTPUTS
from .frozen_dynamic_tables import FrozenDynamicTables
from .frozen_hash_lookup import FrozenHashLookup
from .signature import FlatInputs, dynamic_shapes, example_inputs, signature

FORMATS = ("exported-program", "onnx", "torchscript")
SIGNATURE_FILE = "recstream_signature.json"  # archive entry of .pt2 and TorchScript files
ATOL = 1e-5


class ExportError(RuntimeError):
    """The network could not be exported, or the written file does not compute what it does."""


def _check_path(owner: str, path: Any, fmt: str) -> str:
    path = os.fspath(check_type(owner, "path", path, (str, os.PathLike), allowed="a file path"))
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise FileNotFoundError(f"{owner}: the directory of 'path' does not exist: {parent!r} (create it first)")
    if os.path.isdir(path):
        raise IsADirectoryError(f"{owner}: 'path' must be a file path, got the directory {path!r}")
    if fmt == "exported-program" and not path.endswith(".pt2"):
        raise ValueError(f"{owner}: 'path' of an exported-program must end in .pt2 (torch.export.load "
                         f"expects it), got {path!r}")
    return path


def _check_extra(fmt: str) -> None:
    if fmt != "onnx":
        return
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
        import onnxscript  # noqa: F401
    except ImportError as e:
        raise ImportError(f"ONNX export needs the export extra: pip install 'recstream[export]' ({e})") from e


def _check_preprocessing(owner: str, schema: Schema, preprocessing: dict | None) -> dict:
    """`preprocessing` as a dict the request parser accepts (the one that will apply it)."""
    preprocessing = dict(check_type(owner, "preprocessing", preprocessing, dict, allow_none=True) or {})
    allowed = ("fill_missing_dense", "log1p_dense")
    unknown = sorted(set(preprocessing) - set(allowed))
    if unknown:
        raise ValueError(f"{owner}: 'preprocessing' has unknown option(s) {unknown}; allowed {list(allowed)}")
    InstanceParser(schema, preprocessing)  # TypeError / ValueError for a bad value
    return preprocessing


def _check_not_sharded(owner: str, network: nn.Module) -> None:
    sharded = [n for n, m in network.named_modules() if isinstance(m, HashEmbedding) and m.sharded]
    if sharded:  # each rank holds some keys only; a published snapshot holds them all
        raise ValueError(f"{owner}: 'network' holds key-sharded HashEmbeddings {sharded} (each rank has only "
                         "its own keys); export a published snapshot instead: export_published / recstream export")


def _prepared(network: nn.Module) -> nn.Module:
    """A CPU inference copy of `network` whose embedding lookups do not check ids (see module doc)
    and whose hash tables are frozen snapshots (`FrozenDynamicTables`, `FrozenHashLookup`)."""
    net = untiered_copy(network).to("cpu").eval().requires_grad_(False)  # disk-tiered tables in memory
    for module in net.modules():
        if isinstance(module, EmbeddingBagCollection):
            module.validate = False  # its checks branch on tensor values: not exportable
    # Hash tables probe in data-dependent rounds: frozen into fixed-depth searches. A model's
    # DynamicTables first (they also slice bags by data-dependent bounds), then any other table.
    for kind, freeze in ((DynamicTables, FrozenDynamicTables.from_dynamic_tables),
                         (HashEmbedding, FrozenHashLookup.from_hash_embedding)):
        found = [(name, m) for name, m in net.named_modules() if name and isinstance(m, kind)]
        for name, module in found:
            parent, _, attr = name.rpartition(".")
            net.get_submodule(parent)._modules[attr] = freeze(module)  # ModuleDict / Sequential children too
    return net


def _trace(wrapper: nn.Module, schema: Schema) -> torch.export.ExportedProgram:
    try:
        return torch.export.export(wrapper, example_inputs(schema), dynamic_shapes=dynamic_shapes(schema))
    except Exception as e:  # torch.export raises many types; the caller wants one
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise ExportError(f"torch.export cannot export {type(wrapper.network).__name__}: "
                          f"{type(e).__name__}: {first}") from e


@contextlib.contextmanager
def _no_jit_deprecation():
    """TorchScript is deprecated upstream but still what LibTorch and Triton's pytorch backend load;
    its warning on every save and load would only be noise for someone who asked for it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        yield


def _write(program: torch.export.ExportedProgram, fmt: str, path: str, sig: dict) -> None:
    try:
        _convert(program, fmt, path, sig)
    except OSError:  # disk full, permissions: the file system's problem, not the network's
        raise
    except Exception as e:  # an operator the ONNX or TorchScript converter does not handle
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise ExportError(f"cannot convert the exported program to {fmt}: {type(e).__name__}: {first}") from e


def _convert(program: torch.export.ExportedProgram, fmt: str, path: str, sig: dict) -> None:
    meta = json.dumps(sig, sort_keys=True)
    if fmt == "exported-program":
        torch.export.save(program, path, extra_files={SIGNATURE_FILE: meta})
    elif fmt == "torchscript":
        from .torchscript import to_torchscript
        with _no_jit_deprecation():
            torch.jit.save(to_torchscript(program), path, _extra_files={SIGNATURE_FILE: meta})
    else:
        from .onnx import save_onnx
        save_onnx(program, path, sig)


def load_export(path: str | os.PathLike, format: str):
    """A callable ``(dense, values, offsets) -> Tensor [B]`` running the exported file `path`."""
    check_choice("load_export", "format", format, FORMATS)
    path = os.fspath(path)
    if format == "exported-program":
        return torch.export.load(path).module()
    if format == "torchscript":
        with _no_jit_deprecation():
            return torch.jit.load(path)
    from .onnx import load_onnx
    return load_onnx(path)


def read_signature(path: str | os.PathLike, format: str) -> dict:
    """The signature (inputs, output, schema, ...) recorded in an exported file."""
    check_choice("read_signature", "format", format, FORMATS)
    path = os.fspath(path)
    if format == "onnx":
        import onnx
        props = {p.key: p.value for p in onnx.load(path, load_external_data=False).metadata_props}
        return json.loads(props["recstream.signature"])
    files = {SIGNATURE_FILE: ""}
    if format == "torchscript":
        with _no_jit_deprecation():
            torch.jit.load(path, _extra_files=files)
    else:
        torch.export.load(path, extra_files=files)
    return json.loads(files[SIGNATURE_FILE])


def _verify(wrapper: nn.Module, schema: Schema, fmt: str, path: str) -> None:
    """Run the written file on two batch sizes; it must match the eager network."""
    run = load_export(path, fmt)
    for batch_size in (4, 3):  # the traced size and another one
        inputs = example_inputs(schema, batch_size)
        with torch.no_grad():
            want, got = wrapper(*inputs), run(*inputs)
        if got.shape != want.shape or not torch.allclose(got, want, rtol=0.0, atol=ATOL):
            error = (got - want).abs().max().item() if got.shape == want.shape else f"shape {tuple(got.shape)}"
            raise ExportError(f"the {fmt} export of {type(wrapper.network).__name__} does not match the network at "
                              f"batch size {batch_size} (max abs error {error}, allowed {ATOL})")


def export_model(network: nn.Module, schema: Schema | None, path: str | os.PathLike, format: str = "exported-program",
                 *, output: str = "logits", verify: bool = True, metadata: dict | None = None,
                 preprocessing: dict | None = None) -> dict:
    """Write `network` to `path` in `format` (one of `FORMATS`); returns its signature.

    Args:
        network: takes a `Features` (all recstream models do).
        schema: its features; None takes ``network.schema``.
        path: the file to write; its directory must exist. Written under a temporary name and
            renamed into place once verified, so a server polling `path` never reads half a file.
        format: "exported-program", "onnx" (needs ``recstream[export]``) or "torchscript".
        output: what `network` returns, "logits" or "probabilities"; names the output.
        verify: load the written file and compare it with the network (see module doc).
        metadata: JSON-able entries added to the recorded signature (e.g. the published version).
        preprocessing: what the training reader did to raw dense values, ``fill_missing_dense``
            and/or ``log1p_dense`` (`ColumnConverter`'s options),
            recorded in the signature for `instances_to_inputs`.

    Raises ExportError when the network cannot be exported or the file does not match it.
    """
    owner = "export_model"
    check_module(owner, "network", network)
    schema = check_type(owner, "schema", schema if schema is not None else getattr(network, "schema", None), Schema,
                        allowed="a recstream.data.Schema (or a network with a .schema)")
    check_choice(owner, "format", format, FORMATS)
    check_choice(owner, "output", output, OUTPUTS)
    check_bool(owner, "verify", verify)
    check_type(owner, "metadata", metadata, dict, allow_none=True)
    path = _check_path(owner, path, format)
    if schema.num_categorical == 0:
        raise ValueError(f"{owner}: 'schema' must have a categorical feature to export, got {schema!r}")
    preprocessing = _check_preprocessing(owner, schema, preprocessing)
    _check_extra(format)
    sig = dict(signature(schema, output, preprocessing), format=format)
    clash = sorted(set(metadata or {}) & set(sig))
    if clash:
        raise ValueError(f"{owner}: 'metadata' must not redefine the signature's own entries, got {clash}")
    sig.update(metadata or {})
    _check_not_sharded(owner, network)
    wrapper = FlatInputs(_prepared(network), schema.num_features,
                         schema.feature_names if schema.dynamic_names or schema.crosses else None)
    program = _trace(wrapper, schema)
    directory, name = os.path.split(os.path.abspath(path))
    # The file gets its final name inside a temporary directory beside `path` (the archive
    # formats name their root folder after the file), then one rename puts it in place.
    with tempfile.TemporaryDirectory(prefix=".tmp-export-", dir=directory) as tmp_dir:
        tmp = os.path.join(tmp_dir, name)
        _write(program, format, tmp, sig)
        if verify:
            _verify(wrapper, schema, format, tmp)
        os.replace(tmp, path)
    return sig


def find_publish_dir(directory: str | os.PathLike) -> str:
    """`directory` if it holds published versions, else its one sub-directory that does (a run directory).

    FileNotFoundError when neither holds a version; ValueError when several sub-directories do.
    """
    owner = "find_publish_dir"
    directory = os.fspath(check_type(owner, "directory", directory, (str, os.PathLike), allowed="a path"))
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"{owner}: {directory!r} is not a directory")
    if list_versions(directory):
        return directory
    subs = [os.path.join(directory, n) for n in sorted(os.listdir(directory)) if not n.startswith(".")]
    found = [s for s in subs if os.path.isdir(s) and list_versions(s)]
    if len(found) > 1:
        names = [os.path.basename(f) for f in found]
        shown = names[:5] + ([f"... {len(names) - 5} more"] if len(names) > 5 else [])
        raise ValueError(f"{owner}: {directory!r} holds several publish directories {shown}; name one")
    if not found:
        raise FileNotFoundError(f"no published version in {directory!r} (nor in a sub-directory of it)")
    return found[0]


def export_published(directory: str | os.PathLike, path: str | os.PathLike, format: str = "exported-program", *,
                     model_factory: Any = None, verify: bool = True) -> dict:
    """Export the newest usable version of a publish (or run) directory; returns the signature.

    The network is rebuilt as ``recstream serve`` does (`load_latest`:
    the manifest's class and config, or `model_factory`); the signature records the version
    (``source``), the manifest's ``output`` and its ``preprocessing``.
    """
    check_choice("export_published", "format", format, FORMATS)
    _check_path("export_published", path, format)
    publish_dir = find_publish_dir(directory)
    network, manifest = load_latest(publish_dir, model_factory)
    if manifest.get("schema") is None:
        raise ExportError(f"version {manifest['version']} of {publish_dir!r} has no schema to export with")
    source = {"directory": os.path.abspath(publish_dir), "version": manifest["version"], "step": manifest.get("step")}
    return export_model(network, Schema.from_dict(manifest["schema"]), path, format,
                        output=(manifest.get("model") or {}).get("output", "logits"), verify=verify,
                        metadata={"source": source}, preprocessing=manifest.get("preprocessing"))
