"""An optional keyed digest (HMAC-SHA256) of a checkpoint, for deployments that need tamper evidence.

The CRC32s a checkpoint carries (per tensor, and over its metadata) catch *accidents*: a flipped
bit, a truncated copy, a torn write. They do not catch *edits*: anyone who can write the file can
change a stream position or a weight and recompute the CRCs (or delete them). A keyed digest can
only be computed with the key, so an edited file fails it.

Set ``RECSTREAM_CHECKPOINT_KEY`` (any non-empty string; keep it out of the run directory) in the
environment of the processes that write and read checkpoints: every checkpoint written is signed
(metadata entry ``hmac_sha256``), and every checkpoint read must carry a digest that verifies with
that key; a file without one, or with a wrong one, is refused with `CheckpointError` (and
`RecModel.restore` falls back to the next older checkpoint). Without the variable nothing is
signed and digests present in files are not checked.

The digest covers every metadata entry but the digest itself and the metadata CRC, and every stored
tensor's name, dtype, shape and bytes (so verifying reads the whole file once).

>>> import os
>>> key = b"k"
>>> a = digest(key, {"meta": "{}"}, {})
>>> len(a), a == digest(key, {"meta": "{ }"}, {})
(64, False)
"""
from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Iterable

import torch

__all__ = ["KEY_ENV", "DIGEST_ENTRY", "checkpoint_key", "digest", "verify"]

KEY_ENV = "RECSTREAM_CHECKPOINT_KEY"
DIGEST_ENTRY = "hmac_sha256"


def checkpoint_key() -> bytes | None:
    """The key from ``RECSTREAM_CHECKPOINT_KEY`` (UTF-8), or None when the variable is unset."""
    value = os.environ.get(KEY_ENV)
    if value is None:
        return None
    if not value:
        raise ValueError(f"the environment variable {KEY_ENV} is set but empty; set it to a secret (any non-empty "
                         "string) to sign checkpoints, or unset it")
    return value.encode("utf-8", "surrogatepass")


def _part(mac, data: bytes) -> None:
    mac.update(len(data).to_bytes(8, "little"))  # length-prefixed: no two layouts hash alike
    mac.update(data)


def digest(key: bytes, metadata: dict[str, str], tensors: dict[str, torch.Tensor] | Iterable,
           unsigned: Iterable[str] = ()) -> str:
    """Hex HMAC-SHA256 of `metadata` (without the digest and the `unsigned` entries) and `tensors`."""
    skip = {DIGEST_ENTRY, *unsigned}
    mac = hmac.new(key, digestmod=hashlib.sha256)
    for name in sorted(k for k in metadata if k not in skip):
        _part(mac, name.encode())
        _part(mac, metadata[name].encode("utf-8", "surrogatepass"))
    items = sorted(tensors.items()) if isinstance(tensors, dict) else sorted(tensors)
    for name, t in items:
        _part(mac, name.encode())
        _part(mac, f"{t.dtype}{tuple(t.shape)}".encode())
        flat = t.detach().reshape(-1).contiguous()
        _part(mac, memoryview(flat.view(torch.uint8).numpy()) if flat.numel() else b"")
    return mac.hexdigest()


def verify(key: bytes, metadata: dict[str, str], tensors: dict[str, torch.Tensor],
           unsigned: Iterable[str] = ()) -> str | None:
    """None when the file's digest verifies with `key`, else why not."""
    stored = metadata.get(DIGEST_ENTRY)
    if stored is None:
        return f"it carries no keyed digest, and {KEY_ENV} is set (an unsigned or stripped file)"
    expected = digest(key, metadata, tensors, unsigned)
    if not hmac.compare_digest(stored.encode("utf-8", "surrogatepass"), expected.encode()):
        return f"its keyed digest does not verify with the key in {KEY_ENV} (the file was edited, or signed " \
               "with another key)"
    return None
