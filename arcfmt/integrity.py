"""Tensor hashes and model digests of SPEC.md §13."""
from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, TypeAlias

import numpy as np
import xxhash

if TYPE_CHECKING:
    from typing_extensions import Buffer

# One tensor's part of a model digest: (name bytes, dtype code, shape, tensor hash)
DigestEntry: TypeAlias = tuple[bytes, int, Sequence[int], int]


HASH_CHUNK = 64 << 20


def tensor_hash(u: np.ndarray) -> int:
    """xxh3-64 of a tensor's row-major little-endian bytes.

    Memory-mapped tensors are hashed chunk by chunk and their pages released as it goes, so hashing a
    checkpoint larger than RAM keeps a small resident set.
    """
    from .arrays import is_mapped, release

    flat = np.ascontiguousarray(u).reshape(-1)
    if not is_mapped(flat):
        return xxhash.xxh3_64_intdigest(flat.data.cast("B"))
    raw = flat.view(np.uint8)
    h = xxhash.xxh3_64()
    for start in range(0, raw.size, HASH_CHUNK):
        part = raw[start: start + HASH_CHUNK]
        h.update(part.data)
        release(part)
    return h.intdigest()


def record_checksum(header8: bytes, payload: Buffer) -> int:
    h = xxhash.xxh3_64(header8)
    h.update(payload)
    return h.intdigest()


def model_digest(entries: Iterable[DigestEntry]) -> bytes:
    """xxh3-128 over (name, dtype code, shape, tensor hash) of each tensor, sorted by name bytes.

    ``entries`` is an iterable of ``(name_bytes, dtype_code, shape, hash)``.
    """
    h = xxhash.xxh3_128()
    for name, code, shape, th in sorted(entries, key=lambda e: e[0]):
        h.update(struct.pack("<I", len(name)))
        h.update(name)
        h.update(struct.pack("<BB", code, len(shape)))
        h.update(struct.pack(f"<{len(shape)}Q", *shape))
        h.update(struct.pack("<Q", th))
    return h.digest()
