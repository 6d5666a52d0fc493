"""Load a published version for serving: newest complete one, chain of deltas applied, verified.

`load_latest` tries versions newest first. A version is usable when its manifest is
intact and every file it needs -- its own ``model.safetensors`` and the row files of its
whole chain ``base (full) -> ... -> itself`` -- matches the manifest's size and sha256. An
unusable version is skipped with a logged warning and reported in the returned manifest's
``skipped`` list (``[{"version": N, "reason": "..."}]``); the next older one is tried.

Rebuild steps of version V (chain ``[B, ..., V]``):

1. ``net = build_model(manifest_V, model_factory)`` (see `recstream.serving.snapshot.model_spec`);
2. load V's ``model.safetensors`` (dense weights and HashEmbedding default values, all
   complete in every version); any other missing or unexpected name is an error;
3. for each HashEmbedding: start from B's full rows, apply each delta of the chain (deletes,
   then upserts), sort by key and ``import_`` into the empty table;
4. ``net.eval()``, gradients off.

Loading the next version of a served one (``previous=(network, manifest)``, what `recstream serve`
does on every swap): when V continues the chain of the served version P (P is in V's chain and
P's manifest on disk is still the one loaded), step 3 starts from P's rows, taken from P's network
(already verified when P was loaded), and only the versions after P are read and verified. The
network is the same as a load from the base -- rows sorted by key, one canonical layout -- but
the time is that of the new deltas, not of the whole chain (a delta every fraction of a second
must not cost a chain of ``full_every`` files each time).

Errors from your own ``model_factory`` propagate (a bug there must not look like a corrupt
snapshot), and so does `RebuildError` (no way to rebuild
the network without a factory); data problems are `SnapshotError`.

>>> import tempfile, torch
>>> from recstream.data import Schema, CategoricalFeature
>>> from recstream.models import WideDeep
>>> from recstream.serving.publishing.publish import publish_version
>>> schema = Schema(["x"], [CategoricalFeature("c", vocab_size=5)])
>>> d = tempfile.mkdtemp()
>>> _ = publish_version(d, WideDeep(schema, hidden=(8,)), schema=schema, model_config={"hidden": [8]})
>>> net, manifest = load_latest(d)
>>> type(net).__name__, manifest["version"], manifest["kind"], manifest["skipped"]
('WideDeep', 1, 'full', [])
"""
from __future__ import annotations

import logging
import os
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_bytes
from torch import nn

from ...callbacks.divergence import nonfinite_names
from ...validation import check_int, check_type
from .layout import MODEL_FILE, SnapshotError, chain_of, list_versions, read_manifest, read_verified
from .model_spec import RebuildError, build_model, check_factory
from .state_split import ROW_FIELDS, apply_delta, dense_state, hash_embeddings, hash_file, hash_owned_keys, sort_rows

log = logging.getLogger(__name__)


def _check_source(owner: str, directory, model_factory) -> None:
    check_type(owner, "directory", directory, (str, os.PathLike), allowed="a path")
    check_factory(owner, model_factory)


# What reading, merging and importing digest-valid but wrong data can raise (a dtype or shape that
# does not fit, an absurd size): the version is unusable, the server is fine.
_DATA_ERRORS = (TypeError, ValueError, KeyError, IndexError, RuntimeError, OverflowError, MemoryError)


def _tensors(directory, manifest: dict, relpath: str) -> dict[str, torch.Tensor]:
    data = read_verified(directory, manifest, relpath)
    try:
        tensors = load_bytes(data)
    except (SafetensorError, ValueError) as e:  # checksum matched but content is not safetensors
        raise SnapshotError(f"version {manifest['version']}: {relpath} is not a valid safetensors file ({e})") from None
    # A checksum proves the bytes are the ones written, not that they are a usable model.
    bad = nonfinite_names(tensors)
    if bad:
        raise SnapshotError(f"version {manifest['version']}: {relpath} holds non-finite values in {bad[0]!r}; "
                            "a model with NaN or infinite weights is never served")
    return tensors


def _check_fits(manifest: dict, dense: dict[str, torch.Tensor]) -> None:
    """Build the network on the ``meta`` device (no memory) and compare its dense state with the file.

    A digest-valid manifest may ask for a 40 GB layer or a 10**12-row table: refused here, before
    anything is allocated, because the weights file does not hold such tensors.
    """
    try:
        with torch.device("meta"):
            net = build_model(manifest)
    except SnapshotError:
        raise
    except Exception as e:  # noqa: BLE001 - only a pre-check; the real build below decides
        log.debug("version %s: no meta-device pre-check (%s: %s)", manifest["version"], type(e).__name__, e)
        return
    want = {k: tuple(v.shape) for k, v in dense_state(net).items()}
    got = {k: tuple(v.shape) for k, v in dense.items()}
    if want != got:
        diff = sorted(set(want.items()) ^ set(got.items()))[:4]
        raise SnapshotError(f"version {manifest['version']}: the network its manifest describes does not fit "
                            f"{MODEL_FILE} (first differences, name and shape: {diff})"[:600])


def _rows(directory, manifests: list[dict], path: str, rows: dict | None = None) -> dict[str, torch.Tensor]:
    """The rows of `path` after the `manifests` of a chain, starting from `rows` (None: the first is full)."""
    for m in manifests:
        rel = hash_file(path)
        t = _tensors(directory, m, rel)
        need = ROW_FIELDS + (("evicted_keys",) if m["kind"] == "delta" else ())
        missing = [f for f in need if f not in t]
        if missing:
            raise SnapshotError(f"version {m['version']}: {rel} lacks {missing}")
        rows = {f: t[f] for f in ROW_FIELDS} if m["kind"] == "full" else apply_delta(rows, t)
    return sort_rows(rows)


def _load_dense(net: nn.Module, manifest: dict, state: dict[str, torch.Tensor]) -> None:
    owned = hash_owned_keys(net)
    try:
        result = net.load_state_dict(state, strict=False)
    except RuntimeError as e:  # shape mismatch
        raise SnapshotError(f"version {manifest['version']}: {MODEL_FILE} does not fit the rebuilt network: "
                            f"{e}") from None
    missing = sorted(set(result.missing_keys) - owned)
    if missing or result.unexpected_keys:
        raise SnapshotError(f"version {manifest['version']}: {MODEL_FILE} does not fit the rebuilt network "
                            f"(missing {missing[:5]}, unexpected {sorted(result.unexpected_keys)[:5]})")


def load_version(directory: str | os.PathLike, version: int, model_factory: Any = None, *,
                 previous: tuple[nn.Module, dict] | None = None) -> tuple[nn.Module, dict]:
    """Load exactly `version` (and its chain); SnapshotError if it is unusable.

    `previous`: the ``(network, manifest)`` of a version loaded before (left unchanged); when
    `version` continues its delta chain, only the versions after it are read (module docstring).
    """
    _check_source("load_version", directory, model_factory)
    check_int("load_version", "version", version, minimum=1)
    if previous is not None and not (isinstance(previous, tuple) and len(previous) == 2
                                     and isinstance(previous[0], nn.Module) and isinstance(previous[1], dict)):
        raise TypeError(f"load_version: 'previous' must be a (network, manifest) pair as load_version returns, "
                        f"got {type(previous).__name__}")
    try:
        return _load(directory, version, model_factory, previous)
    except (SnapshotError, RebuildError):
        raise
    except _DATA_ERRORS as e:
        if getattr(e, "from_factory", False):
            raise
        raise SnapshotError(f"version {version}: unusable ({type(e).__name__}: {e})"[:600]) from None


def _build(manifest: dict, model_factory: Any) -> nn.Module:
    """The network; errors of a caller's factory are marked, so they propagate instead of skipping."""
    try:
        return build_model(manifest, model_factory)
    except Exception as e:
        if model_factory is not None:
            e.from_factory = True
        raise


def _reusable(directory, chain: list[int], previous) -> tuple[dict, dict[str, dict]] | None:
    """``(manifest, {path: rows})`` of `previous` when the version of `chain` continues its chain
    unchanged on disk (same manifest digest), else None: then the whole chain is read."""
    if previous is None:
        return None
    net, old = previous
    if old.get("version") not in chain[:-1]:
        return None
    try:
        if read_manifest(directory, old["version"])["manifest_sha256"] != old.get("manifest_sha256"):
            return None  # rewritten since it was loaded (a wiped, restarted directory)
    except (SnapshotError, OSError):
        return None
    tables = hash_embeddings(net)
    if sorted(tables) != sorted(old.get("hash_embeddings") or {}):
        return None
    rows = {p: {f: t for f, t in emb.export(reset_delta=False).items() if f in ROW_FIELDS}
            for p, emb in tables.items()}
    return old, rows


def _load(directory, version: int, model_factory: Any, previous=None) -> tuple[nn.Module, dict]:
    chain = chain_of(directory, version)
    reuse = _reusable(directory, chain, previous)
    if reuse is not None:
        chain = chain[chain.index(reuse[0]["version"]) + 1:]
    manifests = [read_manifest(directory, v) for v in chain]
    manifest = manifests[-1]
    recorded = sorted(manifest.get("hash_embeddings", {}))
    for m in manifests + ([reuse[0]] if reuse else []):
        if sorted(m.get("hash_embeddings", {})) != recorded:
            raise SnapshotError(f"version {version}: HashEmbedding modules change along the chain "
                                f"({sorted(m.get('hash_embeddings', {}))} at {m['version']}, {recorded} at {version})")
    dense = _tensors(directory, manifest, MODEL_FILE)
    if model_factory is None and (reuse is None or reuse[0].get("model") != manifest.get("model")):
        _check_fits(manifest, dense)  # (a network built before from the same description fits)
    net = _build(manifest, model_factory)
    tables = hash_embeddings(net)
    if sorted(tables) != recorded:
        raise SnapshotError(f"version {version}: the rebuilt network's HashEmbedding modules {sorted(tables)} "
                            f"differ from the published {recorded}")
    _load_dense(net, manifest, dense)
    for path, emb in tables.items():
        rows = _rows(directory, manifests, path, reuse[1][path] if reuse else None)
        try:
            emb.import_(rows)
        except (ValueError, RuntimeError) as e:  # e.g. the rebuilt table's capacity is too small
            raise SnapshotError(f"version {version}: cannot import rows of HashEmbedding {path!r}: {e}") from None
    net.eval()
    net.requires_grad_(False)
    return net, manifest


def load_latest(directory: str | os.PathLike, model_factory: Any = None) -> tuple[nn.Module, dict]:
    """``(network, manifest)`` of the newest usable version (see module docstring).

    Raises FileNotFoundError when `directory` holds no version at all, SnapshotError when
    none is usable (the message lists why each was skipped).
    """
    _check_source("load_latest", directory, model_factory)
    versions = list_versions(directory)
    if not versions:
        raise FileNotFoundError(f"no published version in {os.fspath(directory)!r}")
    skipped = []
    for v in reversed(versions):
        try:
            net, manifest = load_version(directory, v, model_factory)
        except SnapshotError as e:
            log.warning("skipping model version %d in %s: %s", v, os.fspath(directory), e)
            skipped.append({"version": v, "reason": str(e)})
            continue
        return net, dict(manifest, skipped=skipped)
    raise SnapshotError(f"no usable version in {os.fspath(directory)!r}: "
                        + "; ".join(f"v{s['version']}: {s['reason']}" for s in skipped))
