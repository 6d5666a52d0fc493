"""Stable, vectorized 64-bit hashing of integer and string ids into embedding buckets.

The hash values are part of a trained model's meaning (they decide which embedding row an
id reads), so they must never change between versions, platforms or processes: no
Python ``hash()`` (salted per process), only fixed arithmetic on fixed constants.

* integers: splitmix64 (Steele et al.), a bijective 64-bit mixer.
* strings: the UTF-8 bytes read as 8-byte words, each word mixed with splitmix64 and its
  position, XOR-combined, then mixed with the length (see `hash_strings`); a
  handful of numpy passes over the Arrow data buffer, no per-string Python loop.

>>> import numpy as np, pyarrow as pa
>>> to_buckets(hash_int64(np.array([0, 1, 123456789])), 1000).tolist()
[737, 546, 558]
>>> to_buckets(hash_strings(pa.array(["68fd1e64", None])), 1000).tolist()  # null hashes as ""
[372, 737]
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from ..validation import check_int

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def splitmix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finalizer of a uint64 array (wrap-around arithmetic), as a new array.

    >>> int(splitmix64(np.array([0], dtype=np.uint64))[0])
    16294208416658607535
    """
    z = np.asarray(x, dtype=np.uint64) + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def hash_int64(ids: np.ndarray) -> np.ndarray:
    """Stable 64-bit hash of integer ids (any integer dtype; negative ids are fine)."""
    ids = np.asarray(ids)
    if ids.dtype.kind not in "iu":
        raise TypeError(f"hash_int64: 'ids' must be an integer array, got dtype {ids.dtype}")
    return splitmix64(ids.astype(np.int64, copy=False).view(np.uint64))


_WORD_SALT = np.uint64(0xD6E8FEB86659FD93)
# _MASKS[r] keeps the first r bytes of a little-endian 8-byte word (r = 0..8)
_MASKS = np.array([0] + [(1 << (8 * r)) - 1 for r in range(1, 8)] + [2**64 - 1], dtype=np.uint64)


def hash_strings(arr: pa.Array) -> np.ndarray:
    """Stable 64-bit hash of every value of an Arrow string/binary array (nulls hash as "").

    Each string is read as little-endian 8-byte words (the tail word zero-masked); word k
    contributes ``splitmix64(word + k * salt)``, the contributions are XOR-ed (through a
    prefix-XOR over all words of the array, so there is no per-string loop) and the result
    is mixed once more with the length. Memory is O(total bytes).
    """
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    t = arr.type
    if not (pa.types.is_string(t) or pa.types.is_large_string(t)
            or pa.types.is_binary(t) or pa.types.is_large_binary(t)):
        raise TypeError(f"hash_strings: expected a string or binary array, got {t}")
    large = pa.types.is_large_string(t) or pa.types.is_large_binary(t)
    _, off_buf, data_buf = arr.buffers()
    offsets = np.frombuffer(off_buf, dtype=np.int64 if large else np.int32)
    offsets = offsets[arr.offset: arr.offset + len(arr) + 1].astype(np.int64)
    lens = np.diff(offsets)
    if arr.null_count:  # Arrow lets a null slot span bytes: hash it as ""
        lens = np.where(np.asarray(arr.is_valid()), lens, 0)
    base, end = int(offsets[0]), int(offsets[-1])
    padded = np.zeros(end - base + 8, dtype=np.uint8)  # 8 spare bytes: tail words never overrun
    if data_buf is not None and end > base:
        padded[: end - base] = np.frombuffer(data_buf, dtype=np.uint8)[base:end]
    # unaligned little-endian uint64 view starting at every byte
    words = np.ndarray(shape=(len(padded) - 7,), dtype="<u8", buffer=padded, strides=(1,))
    starts = offsets[:-1] - base
    n_words = (lens + 7) // 8
    if n_words.max(initial=0) <= 1:  # fast path: every string fits one word
        w = words[starts] & _MASKS[np.minimum(lens, 8)]
        h = np.where(lens > 0, splitmix64(w), np.uint64(0))
    else:
        first = np.cumsum(n_words) - n_words  # index of each string's first word
        k = np.arange(int(n_words.sum()), dtype=np.int64) - np.repeat(first, n_words)
        owner_start, owner_len = np.repeat(starts, n_words), np.repeat(lens, n_words)
        w = words[owner_start + 8 * k] & _MASKS[np.minimum(owner_len - 8 * k, 8)]
        contrib = splitmix64(w + k.astype(np.uint64) * _WORD_SALT)
        prefix = np.zeros(len(contrib) + 1, dtype=np.uint64)
        np.bitwise_xor.accumulate(contrib, out=prefix[1:])
        h = prefix[first + n_words] ^ prefix[first]
    return splitmix64(h ^ (lens.astype(np.uint64) * _GOLDEN))


def to_buckets(hashes: np.ndarray, hash_buckets: int) -> np.ndarray:
    """Map 64-bit hashes to ids in ``[1, hash_buckets)`` (id 0 stays free for missing values)."""
    hash_buckets = check_int("to_buckets", "hash_buckets", hash_buckets, minimum=2)
    h = np.asarray(hashes, dtype=np.uint64)
    return (h % np.uint64(hash_buckets - 1)).astype(np.int64) + 1
