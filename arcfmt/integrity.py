"""Tensor hashes and model digests of SPEC.md §13."""
from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias

import numpy as np
import xxhash

from .arrays import PAGE, is_mapped, release

if TYPE_CHECKING:
    from typing_extensions import Buffer

# One tensor's part of a model digest: (name bytes, dtype code, shape, tensor hash)
DigestEntry: TypeAlias = tuple[bytes, int, Sequence[int], int]


HASH_CHUNK = 64 << 20


@dataclass(frozen=True)
class KnownBase:
    """An array whose tensor hash its holder already knows, because it made every byte of it itself
    (a live follower's model, which it verified; a publisher's own copy of a step it hashed when it
    wrote it): a decoder checks it by that hash, a writer names it by that hash, neither hashes it
    again. A wrong hash is never a misread: a file named by it is refused (``wrong_base``)."""

    array: object
    hash: int


def tensor_hash(u: np.ndarray) -> int:
    """xxh3-64 of a tensor's row-major little-endian bytes.

    Memory-mapped tensors are hashed chunk by chunk and their pages released as it goes, so hashing a
    checkpoint larger than RAM keeps a small resident set.
    """
    flat = np.ascontiguousarray(u).reshape(-1)
    if flat.nbytes < PAGE or not is_mapped(flat):   # less than a page: none to hand back
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
    parts = []  # hashed in one call: the same digest as updating entry by entry, without a call per field
    for name, code, shape, th in sorted(entries, key=lambda e: e[0]):
        parts.append(struct.pack(f"<I{len(name)}sBB{len(shape)}QQ", len(name), name, code, len(shape), *shape, th))
    return xxhash.xxh3_128_digest(b"".join(parts))
