"""save_checkpoint / load_checkpoint: one safetensors file with everything needed to resume.

File layout (format version 1):

- tensors ``network.<name>``: the network's ``state_dict()`` (parameters and persistent buffers,
  e.g. a hash table's variable-size rows);
- tensors ``optimizer.state.<pid>.<key>`` (and ``optimizer.param_groups.<i>.<key>`` for tensor
  hyper-parameters such as a tensor ``lr``): the optimizer's tensors;
- tensors ``rng.torch_cpu``, ``rng.torch_cuda.<i>``, ``rng.numpy.1``: RNG states (so dropout and
  sampling continue exactly as in an uninterrupted run);
- tensors ``extra.<key>``: tensor values given in `extra`;
- metadata (safetensors' ``str -> str`` map): ``format`` = ``recstream.checkpoint``,
  ``format_version``, and JSON documents ``network``, ``optimizer`` (param_groups, python scalars),
  ``rng`` (python/numpy scalars), ``meta`` (``format_version``, ``time`` and the `extra` entries,
  e.g. epoch, step_in_epoch, cur_step_num, batch_num), ``aliases`` (tied tensors stored once) and
  ``checksums`` (CRC32 per tensor) and ``metadata_checksum`` (CRC32 of all the other metadata
  entries, so that a flipped bit in a position or counter fails the load). In the JSON
  documents tensors appear as references ``{"__tensor__": "<name>"}``. Nothing is ever pickled;
- with ``RECSTREAM_CHECKPOINT_KEY`` set, ``hmac_sha256``: a keyed digest of the metadata and every
  tensor (`recstream.checkpoint.keyed_digest`). The CRC32s catch accidents (bit flips,
  truncation), not edits: whoever can write the file can recompute them; the keyed digest cannot
  be recomputed without the key.

Loading reads and verifies everything (checksums, digest, structure, shapes, optimizer groups,
RNG states) before it modifies the network, the optimizer or an RNG; every way a file can be bad
is a `CheckpointError` naming the file.

Writes are atomic (temp file, fsync, rename, fsync dir): a crash leaves the previous file intact.

>>> import os, tempfile, torch
>>> net = torch.nn.Linear(3, 1)
>>> opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
>>> path = os.path.join(tempfile.mkdtemp(), "ckpt.safetensors")
>>> _ = save_checkpoint(path, net, opt, extra={"epoch": 3})
>>> load_checkpoint(path, torch.nn.Linear(3, 1), restore_rng=False)["epoch"]
3
"""
from __future__ import annotations

import json
import os
import random
import time
import warnings
import zlib
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from ..atomic import atomic_write
from ..validation import check_bool, check_module, check_type, describe
from .keyed_digest import DIGEST_ENTRY, checkpoint_key, verify
from .keyed_digest import digest as keyed_digest
from .state_codec import checksum, decode, encode, prepare_for_save, tensor_refs

FORMAT = "recstream.checkpoint"
FORMAT_VERSION = 1
RESERVED_META = frozenset({"format_version"})
META_CHECKSUM = "metadata_checksum"  # CRC32 of the other metadata entries (with crc=True)


class CheckpointError(ValueError):
    """A checkpoint file is unreadable, corrupt, or does not match the network/optimizer."""


class CheckpointMismatch(CheckpointError):
    """A sound checkpoint written by another model: its tensors or optimizer groups do not fit."""


def _check_optimizer(owner: str, optimizer) -> None:
    # Duck-typed: wrappers that combine several torch optimizers are not Optimizer subclasses.
    if optimizer is None:
        return
    if not (callable(getattr(optimizer, "state_dict", None)) and callable(getattr(optimizer, "load_state_dict", None))):
        raise TypeError(f"{owner}: 'optimizer' must be a torch.optim.Optimizer (or an object with state_dict and "
                        f"load_state_dict) or None, got {describe(optimizer)}")


def _check_path(owner: str, path) -> str:
    return os.fspath(check_type(owner, "path", path, (str, os.PathLike), allowed="a path"))


def _rng_state() -> dict:
    np_state = np.random.get_state()  # legacy global generator: ('MT19937', keys, pos, has_gauss, gauss)
    state = {
        "torch_cpu": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": (np_state[0], np_state[1].astype(np.int64), *np_state[2:]),
    }
    # Only when CUDA is already in use: querying its RNG would otherwise initialise a CUDA
    # context (seconds, GPU memory) in a CPU-only run, and nothing consumed CUDA randomness yet.
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["torch_cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch_cpu"])
    random.setstate(state["python"])
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), *rest))
    cuda = state.get("torch_cuda")
    if cuda and torch.cuda.is_available():
        for i, s in enumerate(cuda[: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(s, i)


def _check_rng_state(path: str, state: dict) -> None:
    """Apply `state` to throw-away generators: a bad state fails here, before the network, the
    optimizer or any global RNG was touched (the global setters would fail half-way)."""
    try:
        random.Random().setstate(state["python"])
        name, keys, *rest = state["numpy"]
        np.random.RandomState().set_state((name, keys.numpy().astype(np.uint32), *rest))
        torch.Generator().set_state(state["torch_cpu"])
        cuda = state.get("torch_cuda") or []
        if not isinstance(cuda, list) or not all(isinstance(s, torch.Tensor) and s.dtype == torch.uint8 for s in cuda):
            raise TypeError("CUDA RNG states must be a list of uint8 tensors")
    except (KeyError, TypeError, ValueError, AttributeError, RuntimeError, OverflowError) as e:
        raise CheckpointError(f"load_checkpoint: '{path}' has a bad RNG state: {e!r}") from e


def save_checkpoint(path: str | os.PathLike, network: torch.nn.Module, optimizer=None, extra: dict | None = None,
                    *, rng: bool = True, crc: bool = True) -> str:
    """Write network (+ optimizer, RNG states, `extra`) to `path` atomically; return the path.

    `extra` maps str keys to JSON values (None/bool/int/float/str, lists, tuples, dicts) or
    tensors; `load_checkpoint` returns them. `crc` stores a CRC32 per tensor so that silent data
    corruption is detected at load time.
    """
    owner = "save_checkpoint"
    path = _check_path(owner, path)
    check_module(owner, "network", network)
    _check_optimizer(owner, optimizer)
    extra = {} if extra is None else check_type(owner, "extra", extra, dict, allowed="a dict with str keys")
    bad_keys = [k for k in extra if not isinstance(k, str)]
    if bad_keys:
        raise TypeError(f"{owner}: 'extra' must be a dict with str keys or None, got the keys {bad_keys!r}")
    if RESERVED_META & extra.keys():
        raise ValueError(f"{owner}: 'extra' must not use the reserved keys {sorted(RESERVED_META)}, "
                         f"got {sorted(extra)}")
    check_bool(owner, "rng", rng)
    check_bool(owner, "crc", crc)
    key = checkpoint_key()

    tensors: dict[str, torch.Tensor] = {}
    docs = {"network": encode(dict(network.state_dict()), "network", tensors)}
    if optimizer is not None:
        docs["optimizer"] = encode(optimizer.state_dict(), "optimizer", tensors)
    docs["meta"] = encode({"format_version": FORMAT_VERSION, "time": time.time(), **extra}, "extra", tensors)
    if rng:
        docs["rng"] = encode(_rng_state(), "rng", tensors)
    stored, aliases = prepare_for_save(tensors)
    metadata = {"format": FORMAT, "format_version": str(FORMAT_VERSION), "aliases": json.dumps(aliases)}
    metadata.update({k: json.dumps(v, allow_nan=False) for k, v in docs.items()})
    if crc:
        metadata["checksums"] = json.dumps({k: checksum(v) for k, v in stored.items()})
    if key is not None:  # signs the CRCs too; the metadata CRC (next) covers the digest
        metadata[DIGEST_ENTRY] = keyed_digest(key, metadata, stored, unsigned=(META_CHECKSUM,))
    if crc:
        metadata[META_CHECKSUM] = str(_metadata_crc(metadata))
    atomic_write(path, lambda tmp: save_file(stored, tmp, metadata=metadata))
    return path


def _metadata_crc(metadata: dict[str, str]) -> int:
    """CRC32 of every metadata entry but the checksum itself (sorted, length-prefixed): one
    flipped bit in a stream position or a counter must fail the load, not move training."""
    crc = 0
    for key in sorted(k for k in metadata if k != META_CHECKSUM):
        for part in (key, metadata[key]):
            data = part.encode()
            crc = zlib.crc32(data, zlib.crc32(len(data).to_bytes(8, "little"), crc))
    return crc


class _Reader:
    """Header parsing, tensor lookup (aliases, checksums) and error wrapping for one open file."""

    def __init__(self, path: str, handle, key: bytes | None):
        self.path, self.handle = path, handle
        self.cache: dict[str, torch.Tensor] = {}
        meta = handle.metadata() or {}
        if meta.get("format") != FORMAT:
            raise CheckpointError(f"load_checkpoint: '{path}' is not a recstream checkpoint "
                                  f"(metadata 'format' is {meta.get('format')!r}, expected {FORMAT!r})")
        stored_crc = meta.get(META_CHECKSUM)
        if stored_crc is not None and stored_crc != str(_metadata_crc(meta)):
            raise CheckpointError(f"load_checkpoint: '{path}' is corrupt: its metadata fails its checksum")
        version = meta.get("format_version", "")
        if not version.isdigit() or int(version) > FORMAT_VERSION:
            raise CheckpointError(f"load_checkpoint: '{path}' has format_version {version!r}; this recstream "
                                  f"reads versions 1..{FORMAT_VERSION} (upgrade recstream)")
        if key is not None:  # before any JSON is parsed: an unsigned document is not trusted with the parser
            self.cache = {name: handle.get_tensor(name) for name in handle.keys()}
            problem = verify(key, meta, self.cache, unsigned=(META_CHECKSUM,))
            if problem:
                raise CheckpointError(f"load_checkpoint: '{path}' is refused: {problem}")
        try:
            self.docs = {k: json.loads(meta[k]) for k in ("network", "optimizer", "meta", "rng") if k in meta}
            self.aliases = json.loads(meta.get("aliases", "{}"))
            self.checksums = json.loads(meta.get("checksums", "{}"))
        except (json.JSONDecodeError, RecursionError) as e:  # RecursionError: JSON nested too deep
            raise CheckpointError(f"load_checkpoint: '{path}' has corrupt metadata: {e}") from e
        if "network" not in self.docs or "meta" not in self.docs:
            raise CheckpointError(f"load_checkpoint: '{path}' is corrupt: metadata lacks 'network' or 'meta'")
        names = set(handle.keys())
        for doc in self.docs.values():
            missing = [r for r in tensor_refs(doc) if self.aliases.get(r, r) not in names]
            if missing:
                raise CheckpointError(f"load_checkpoint: '{path}' is corrupt: tensors {missing[:5]} are referenced "
                                      "in the metadata but absent from the file")

    def tensor(self, name: str) -> torch.Tensor:
        stored = self.aliases.get(name, name)
        t = self.cache[stored] if stored in self.cache else self.handle.get_tensor(stored)
        expected = self.checksums.get(stored)
        if expected is not None and checksum(t) != expected:
            raise CheckpointError(f"load_checkpoint: '{self.path}' is corrupt: tensor {stored!r} fails its checksum")
        return t

    def value(self, doc_name: str) -> Any:
        return decode(self.docs[doc_name], self.tensor)


def _group_sizes(state: dict, prefix: str = "") -> dict[str, list[int]]:
    """Parameter-group sizes wherever ``param_groups`` appear in an optimizer state dict
    (nested ones too, e.g. a CombinedOptimizer's per-child states)."""
    sizes = {}
    if "param_groups" in state:
        sizes[prefix] = [len(g["params"]) for g in state["param_groups"]]
    for key, value in state.items():
        if key not in ("state", "param_groups") and isinstance(value, dict):
            sizes.update(_group_sizes(value, f"{prefix}{key}."))
    return sizes


def _check_optimizer_shape(path: str, optimizer, state: dict) -> None:
    # torch validates groups only inside load_state_dict; checking first keeps loading all-or-nothing.
    have, saved = _group_sizes(optimizer.state_dict()), _group_sizes(state)
    if have != saved:
        raise CheckpointMismatch(f"load_checkpoint: '{path}': optimizer has parameter groups of sizes {have}, "
                              f"the checkpoint has {saved}")


def _shape_mismatches(network: torch.nn.Module, state: dict) -> list[str]:
    """Tensors whose shape cannot load. Modules with their own loading logic (e.g. a hash table
    that resizes its buffers, lazy modules) are trusted; plain modules would fail half-way."""
    modules = dict(network.named_modules())
    bad = []
    for name, t in network.state_dict().items():
        saved = state.get(name)
        if not (isinstance(t, torch.Tensor) and isinstance(saved, torch.Tensor)):
            continue
        if isinstance(t, torch.nn.parameter.UninitializedTensorMixin) or t.shape == saved.shape:
            continue
        owner = modules.get(name.rpartition(".")[0])
        if owner is not None and type(owner)._load_from_state_dict is torch.nn.Module._load_from_state_dict \
                and not owner._load_state_dict_pre_hooks:
            bad.append(f"{name}: file {tuple(saved.shape)} vs network {tuple(t.shape)}")
    return bad


def load_checkpoint(path: str | os.PathLike, network: torch.nn.Module | None = None, optimizer=None,
                    strict: bool = True, restore_rng: bool = True) -> dict:
    """Load `path` into `network` / `optimizer` (when given), restore RNG states; return the metadata.

    The returned dict holds ``format_version``, ``time`` and the saved `extra` entries (for files
    written by `ModelCheckpoint`: ``epoch``, ``step_in_epoch``, ``cur_step_num``, ``batch_num`` and
    the ``append_info`` entries). Everything is read and verified before anything is modified.
    `strict=False` tolerates network key mismatches (with a warning). Raises `CheckpointError` (a
    ValueError) naming the file when it is truncated, corrupt or does not match.
    """
    owner = "load_checkpoint"
    path = _check_path(owner, path)
    check_module(owner, "network", network, allow_none=True)
    _check_optimizer(owner, optimizer)
    check_bool(owner, "strict", strict)
    check_bool(owner, "restore_rng", restore_rng)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"load_checkpoint: no checkpoint file at '{path}'")
    meta, net_state, opt_state, rng_state = _read(path, network is not None, optimizer, restore_rng)
    # Everything is read and verified; check the fit before modifying anything.
    missing, unexpected = _check_fit(path, network, optimizer, strict, net_state, opt_state, rng_state)
    if network is not None:
        try:
            network.load_state_dict(net_state, strict=strict)
        except (RuntimeError, ValueError, TypeError, KeyError) as e:
            raise CheckpointMismatch(f"load_checkpoint: '{path}' does not fit the network: {e}") from e
        if missing or unexpected:
            warnings.warn(f"load_checkpoint: '{path}': missing keys {missing}, unexpected keys {unexpected}",
                          RuntimeWarning, stacklevel=2)
    if optimizer is not None:
        try:
            optimizer.load_state_dict(opt_state)
        except (ValueError, KeyError, RuntimeError, TypeError, IndexError) as e:
            raise CheckpointMismatch(f"load_checkpoint: '{path}': optimizer state does not fit: {e}") from e
    if rng_state is not None:
        _set_rng_state(rng_state)
    return meta


def _read(path: str, with_network: bool, optimizer, restore_rng: bool) -> tuple:
    """(meta, network state, optimizer state, RNG state) read and verified; CheckpointError else."""
    key = checkpoint_key()
    try:
        with safe_open(path, framework="pt", device="cpu") as handle:
            reader = _Reader(path, handle, key)
            meta = reader.value("meta")
            net_state = reader.value("network") if with_network else None
            opt_state = None
            if optimizer is not None:
                if "optimizer" not in reader.docs:
                    raise CheckpointError(f"load_checkpoint: '{path}' holds no optimizer state; pass optimizer=None")
                opt_state = reader.value("optimizer")
            rng_state = reader.value("rng") if restore_rng and "rng" in reader.docs else None
    except CheckpointError:
        raise
    except SafetensorError as e:
        raise CheckpointError(f"load_checkpoint: '{path}' is truncated or corrupt: {e}") from e
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, RecursionError) as e:
        # well-formed JSON with a broken structure (or nested too deep to decode)
        raise CheckpointError(f"load_checkpoint: '{path}' has corrupt metadata: {e!r}") from e
    if not isinstance(meta, dict):
        raise CheckpointError(f"load_checkpoint: '{path}' has corrupt metadata: 'meta' is a {type(meta).__name__}")
    return meta, net_state, opt_state, rng_state


def _check_fit(path: str, network, optimizer, strict: bool, net_state, opt_state, rng_state) -> tuple[list, list]:
    """Everything that can refuse the file, before anything is modified; (missing, unexpected) keys."""
    if rng_state is not None:
        _check_rng_state(path, rng_state)
    try:
        if optimizer is not None:
            _check_optimizer_shape(path, optimizer, opt_state)
        if network is None:
            return [], []
        expected, found = set(network.state_dict()), set(net_state)
        missing, unexpected = sorted(expected - found), sorted(found - expected)
        bad = _shape_mismatches(network, net_state)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        if isinstance(e, CheckpointError):
            raise
        raise CheckpointError(f"load_checkpoint: '{path}' has a corrupt network or optimizer state: {e!r}") from e
    if (missing or unexpected) and strict:
        raise CheckpointMismatch(f"load_checkpoint: '{path}' does not match the network: missing keys "
                              f"{missing[:10]}, unexpected keys {unexpected[:10]} (strict=True)")
    if bad:
        raise CheckpointMismatch(f"load_checkpoint: '{path}' does not fit the network: shape mismatch {bad[:10]}")
    return missing, unexpected
