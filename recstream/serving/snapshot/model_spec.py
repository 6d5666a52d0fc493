"""How a server rebuilds the network of a published version: the manifest's ``model`` spec.

Supported, in this order:

1. ``model_factory(manifest) -> nn.Module`` passed to the loader (a callable, or a
   ``"package.module:function"`` string, e.g. from ``recstream serve --model-factory``).
   Needed for any network that is not a `recstream.models` class, e.g. one holding a
   [`HashEmbedding`][recstream.nn.hash_embedding.HashEmbedding]. The factory gets the manifest (with ``schema`` and
   ``model.config``) and must build the same architecture as the trained network.
2. Without a factory: a class exported by `recstream.models` (``WideDeep``, ``DeepFM``,
   ``DCNv2``, ``DLRM``, ...) is rebuilt as ``cls(Schema.from_dict(manifest["schema"]),
   **manifest["model"]["config"])``. ``config`` is the JSON-able keyword arguments the
   publisher was given (``ModelPublisher(model_config=...)``); they must match the ones the
   network was built with.

A factory name recorded in the manifest (``model.factory``) is a hint only: the loader never
imports code named by a data file on its own (the same reason snapshots hold no pickles), the
caller must pass it.

>>> from recstream.data import Schema, CategoricalFeature
>>> from recstream.models import WideDeep
>>> schema = Schema(["x"], [CategoricalFeature("c", vocab_size=5)])
>>> spec = describe_model(WideDeep(schema, hidden=(8,)), schema, {"hidden": [8]})
>>> spec["class"], spec["rebuild"]
('recstream.models.wide_deep.WideDeep', 'recstream.models')
>>> type(build_model({"schema": schema.to_dict(), "model": spec})).__name__
'WideDeep'
"""
from __future__ import annotations

import importlib
import json
import logging
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ...data.schema import Schema
from ...validation import check_choice, check_module, check_type, describe
from .layout import SnapshotError
from .state_split import dense_state, hash_embeddings

log = logging.getLogger(__name__)
OUTPUTS = ("logits", "probabilities")


class RebuildError(ValueError):
    """The manifest alone cannot rebuild the network: a ``model_factory`` is needed.

    Not a `SnapshotError`: the snapshot is fine, the caller lacks code, so loaders
    raise it at once instead of skipping version after version.
    """


def _builtin(cls: type) -> bool:
    import recstream.models as models
    return cls.__module__.startswith("recstream.models") and getattr(models, cls.__name__, None) is cls


def check_factory(owner: str, factory: Any) -> Any:
    """`factory` if it is None, a callable or a ``"package.module:function"`` string."""
    if factory is None or callable(factory):
        return factory
    if not isinstance(factory, str):
        raise TypeError(f"{owner}: 'model_factory' must be a callable, a 'package.module:function' str or None, "
                        f"got {describe(factory)}")
    if factory.count(":") != 1 or not all(factory.split(":")):
        raise ValueError(f"{owner}: 'model_factory' must be a callable or a 'package.module:function' str, "
                         f"got {factory!r}")
    return factory


def check_model_config(owner: str, config: Any) -> dict | None:
    """`config` if it is None or a dict that JSON can store (the keyword arguments servers rebuild with)."""
    check_type(owner, "model_config", config, dict, allowed="a dict of constructor keyword arguments",
               allow_none=True)
    try:
        json.dumps(config, allow_nan=False)
    except TypeError as e:
        raise TypeError(f"{owner}: 'model_config' must be JSON-able (numbers, strings, lists, dicts): {e}") from None
    except ValueError as e:  # NaN or infinity
        raise ValueError(f"{owner}: 'model_config' must be JSON-able (finite numbers): {e}") from None
    return config


def factory_name(factory: Any) -> str | None:
    """``"module:qualname"`` of an importable callable (or the string itself), else None."""
    if factory is None:
        return None
    if isinstance(factory, str):
        return factory
    module, qualname = getattr(factory, "__module__", None), getattr(factory, "__qualname__", "")
    return f"{module}:{qualname}" if module and "<" not in qualname else None


def resolve_factory(factory: Any) -> Callable[[dict], nn.Module]:
    """A callable, or a ``"package.module:function"`` string imported here (caller-supplied only)."""
    check_factory("resolve_factory", factory)
    if callable(factory):
        return factory
    module_name, attr = factory.split(":")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"resolve_factory: 'model_factory' {factory!r} names {describe(obj)}, which is not callable")
    return obj


def describe_model(network: nn.Module, schema: Schema | None, config: dict | None = None,
                   factory: Any = None, output: str = "logits") -> dict:
    """The manifest's ``model`` entry for `network` (see module docstring)."""
    owner = "describe_model"
    check_module(owner, "network", network)
    check_type(owner, "schema", schema, Schema, allowed="a recstream.data.Schema", allow_none=True)
    check_choice(owner, "output", output, OUTPUTS)
    check_factory(owner, factory)
    config = json.loads(json.dumps(check_model_config(owner, config) or {}))  # tuples become lists, as stored
    cls = type(network)
    rebuild = "recstream.models" if schema is not None and _builtin(cls) else None
    if factory is not None:
        rebuild = "factory"
    return {"class": f"{cls.__module__}.{cls.__qualname__}", "config": config,
            "factory": factory_name(factory), "rebuild": rebuild, "output": output}


def build_model(manifest: dict, model_factory: Any = None) -> nn.Module:
    """A fresh network for `manifest` (see module docstring for what is supported)."""
    spec = manifest.get("model") or {}
    if model_factory is not None:
        net = resolve_factory(model_factory)(manifest)
        if not isinstance(net, nn.Module):
            raise TypeError(f"build_model: 'model_factory' must return a torch.nn.Module, got {describe(net)}")
        return net
    cls_path = spec.get("class", "")
    if spec.get("rebuild") != "recstream.models" or not cls_path.startswith("recstream.models."):
        hint = f" (the publisher recorded factory {spec['factory']!r})" if spec.get("factory") else ""
        raise RebuildError(f"version {manifest.get('version')}: network class {cls_path!r} cannot be rebuilt from "
                           f"the manifest alone; pass model_factory=... (recstream serve --model-factory){hint}")
    import recstream.models as models
    cls = getattr(models, cls_path.rsplit(".", 1)[1], None)
    if cls is None or not _builtin(cls):
        raise RebuildError(f"version {manifest.get('version')}: {cls_path!r} is not a recstream.models class")
    if manifest.get("schema") is None:
        raise RebuildError(f"version {manifest.get('version')}: manifest has no schema to build {cls_path}")
    config = spec.get("config", {})
    try:
        if not isinstance(config, dict):
            raise TypeError(f"'config' must be a JSON object, got {type(config).__name__}")
        return cls(Schema.from_dict(manifest["schema"]), **config)
    except (TypeError, ValueError, KeyError, RuntimeError, MemoryError, OverflowError) as e:
        # The manifest is digest-valid but its arguments do not build this class (an unknown or
        # bad argument, a malformed schema, a size nothing can allocate): that VERSION is
        # unusable; older ones may be fine.
        raise SnapshotError(f"version {manifest.get('version')}: cannot rebuild {cls_path} from the manifest: "
                            f"{type(e).__name__}: {e}") from None


def check_rebuild(network: nn.Module, manifest: dict, model_factory: Any = None) -> None:
    """Fail now, at publish time, if a server could not rebuild `network` from `manifest`.

    Builds the network on the ``meta`` device (no memory for weights) and compares state
    names and shapes. Raises ValueError on a mismatch; logs and skips when the network's
    constructor cannot run on ``meta`` (the real load will still check everything), and
    when the manifest declares no rebuild path (servers must then bring a factory).
    """
    if model_factory is None and (manifest.get("model") or {}).get("rebuild") is None:
        log.warning("%s is not a recstream.models class (or no schema is known): servers will need a "
                    "model_factory to rebuild it", type(network).__qualname__)
        return
    try:
        with torch.device("meta"):
            rebuilt = build_model(manifest, model_factory)
    except (SnapshotError, RebuildError) as e:
        raise ValueError(f"ModelPublisher: {e}") from None
    except Exception as e:  # some constructors touch data; a meta build is only a pre-check
        log.warning("ModelPublisher: could not pre-check the rebuild on the meta device (%s: %s)",
                    type(e).__name__, e)
        return
    want = {k: tuple(v.shape) for k, v in dense_state(network, shapes_only=True).items()}
    got = {k: tuple(v.shape) for k, v in dense_state(rebuilt, shapes_only=True).items()}
    if want != got:
        diff = sorted(set(want.items()) ^ set(got.items()))[:6]
        raise ValueError(f"ModelPublisher: the network rebuilt from the manifest differs from the trained one "
                         f"(first differences, name and shape: {diff}); fix model_config or model_factory")
    mine, theirs = hash_embeddings(network), hash_embeddings(rebuilt)
    # A key-sharded table (hybrid_parallel) holds ceil(capacity / ranks) rows on each rank, a server the whole one
    shards = {k: m.shards for k, m in mine.items()}
    sizes = [{k: (m.embedding_size, m.capacity) for k, m in mine.items()},
             {k: (m.embedding_size, -(-m.capacity // shards.get(k, 1))) for k, m in theirs.items()}]
    if sizes[0] != sizes[1]:
        raise ValueError(f"ModelPublisher: HashEmbedding modules (path: (embedding_size, capacity)) differ after "
                         f"rebuild: trained {sizes[0]}, rebuilt {sizes[1]}")
