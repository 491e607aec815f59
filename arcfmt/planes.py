"""Plane-major integer sequences and gap coding (SPEC.md §1), shared by the block transforms."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from .layout import BytesLike


def bytes_for(x: int) -> int:
    return max(1, (int(x).bit_length() + 7) // 8)


def _value_dtype(w: int) -> np.dtype:
    return np.dtype("<u4") if w <= 4 else np.dtype("<u8")


def to_planes(values: np.ndarray, w: int) -> bytes:
    """Plane-major bytes of ``values`` at width ``w`` (SPEC.md §1); values must fit in ``w`` bytes."""
    n = values.size
    if n == 0:
        return b""
    if values.dtype.itemsize == w and w in (1, 2, 4, 8):
        src = np.ascontiguousarray(values).view(np.uint8).reshape(n, w)
    else:
        wide = values.astype("<u8" if w > 4 else "<u4", copy=False)
        src = np.ascontiguousarray(wide).view(np.uint8).reshape(n, wide.dtype.itemsize)[:, :w]
    if w == 1:
        return src.tobytes()
    return np.ascontiguousarray(src.T).tobytes()


def from_planes(buf: BytesLike, n: int, w: int, dtype: npt.DTypeLike | None = None) -> np.ndarray:
    """Inverse of :func:`to_planes`: ``n`` values of width ``w`` as unsigned integers."""
    dtype = np.dtype(dtype) if dtype is not None else _value_dtype(w)
    planes = np.frombuffer(buf, np.uint8, count=n * w).reshape(w, n)
    if w == dtype.itemsize:
        return np.ascontiguousarray(planes.T).view(dtype).reshape(n)
    out: np.ndarray = planes[0].astype(dtype)
    for k in range(1, w):
        out |= planes[k].astype(dtype) << dtype.type(8 * k)
    return out


def gaps(positions: np.ndarray) -> np.ndarray:
    g = np.empty(positions.size, np.int64)
    if positions.size:
        g[0] = positions[0]
        np.subtract(positions[1:], positions[:-1], out=g[1:])
        g[1:] -= 1
    return g


def ungap(gaps: np.ndarray) -> np.ndarray:
    return np.cumsum(gaps.astype(np.int64) + 1) - 1
