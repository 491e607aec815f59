"""Pure block transforms of SPEC.md §8: unsigned-integer arrays in, uncompressed byte streams out.

No I/O and no container knowledge: a block is ``m`` elements viewed as unsigned ``W``-byte integers.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .dtypes import BF16, DType
from .errors import CorruptError, UnsupportedError

UNCHANGED, XOR, BF16_DELTA, FLOAT_DELTA, KEYFRAME = 0, 1, 2, 3, 4
NAMES = {UNCHANGED: "unchanged", XOR: "xor", BF16_DELTA: "bf16-delta", FLOAT_DELTA: "float-delta",
         KEYFRAME: "keyframe"}
NEEDS_BASE = {UNCHANGED: True, XOR: True, BF16_DELTA: True, FLOAT_DELTA: True, KEYFRAME: False}
_PARAMS = {UNCHANGED: 0, XOR: 0, BF16_DELTA: 2, FLOAT_DELTA: 2, KEYFRAME: 0}


@dataclass
class EncodedBlock:
    encoding: int
    params: list
    streams: list  # uncompressed bytes-like, one per stream
    changed: int   # changed elements (informational; equals params[0] for the delta encodings)


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


def from_planes(buf, n: int, w: int, dtype=None) -> np.ndarray:
    """Inverse of :func:`to_planes`: ``n`` values of width ``w`` as unsigned integers."""
    dtype = np.dtype(dtype) if dtype is not None else _value_dtype(w)
    planes = np.frombuffer(buf, np.uint8, count=n * w).reshape(w, n)
    if w == dtype.itemsize:
        return np.ascontiguousarray(planes.T).view(dtype).reshape(n)
    out = planes[0].astype(dtype)
    for k in range(1, w):
        out |= planes[k].astype(dtype) << dtype.type(8 * k)
    return out


def _gaps(positions: np.ndarray) -> np.ndarray:
    g = np.empty(positions.size, np.int64)
    if positions.size:
        g[0] = positions[0]
        np.subtract(positions[1:], positions[:-1], out=g[1:])
        g[1:] -= 1
    return g


def _ungap(gaps: np.ndarray) -> np.ndarray:
    return np.cumsum(gaps.astype(np.int64) + 1) - 1


# ----------------------------------------------------------------------------------------- lengths

def check_encoding(dt: DType, encoding: int) -> None:
    if encoding not in NAMES:
        raise UnsupportedError(f"unknown encoding id {encoding}")
    if encoding == BF16_DELTA and dt is not BF16:
        raise UnsupportedError(f"encoding bf16-delta used for dtype {dt.name}")
    if encoding == FLOAT_DELTA and (not dt.is_float or dt is BF16):
        raise UnsupportedError(f"encoding float-delta used for dtype {dt.name}")


def param_count(encoding: int) -> int:
    return _PARAMS[encoding]


def _step_width(dt: DType) -> int:
    return bytes_for((1 << (dt.mant_bits + 1)) - 1)


def _keyframe_widths(dt: DType) -> tuple[int, int]:
    return bytes_for((1 << dt.exp_bits) - 1), bytes_for((1 << (dt.mant_bits + 1)) - 1)


def stream_lengths(dt: DType, encoding: int, params, m: int) -> list[int]:
    """Decoded length of every stream of a block (SPEC.md §8); checks the params."""
    if encoding == UNCHANGED:
        return []
    if encoding == XOR:
        return [m] * dt.itemsize
    if encoding in (BF16_DELTA, FLOAT_DELTA):
        c, e = params
        if not 1 <= c <= m:
            raise CorruptError(f"changed count {c} outside 1..{m}")
        if not e <= c:
            raise CorruptError(f"exception count {e} exceeds changed count {c}")
        return [c * bytes_for(m - 1), (c - e) * _step_width(dt), e * bytes_for(c - 1), e * dt.itemsize]
    if encoding == KEYFRAME:
        if dt.is_float:
            ew, sw = _keyframe_widths(dt)
            return [m * ew, m * sw]
        return [m * dt.itemsize]
    raise UnsupportedError(f"unknown encoding id {encoding}")


# ----------------------------------------------------------------------------------------- encode

def encode_xor(dt: DType, base: np.ndarray, target: np.ndarray) -> EncodedBlock:
    x = base ^ target
    raw = np.ascontiguousarray(x).view(np.uint8).reshape(x.size, dt.itemsize)
    streams = [np.ascontiguousarray(raw[:, k]).tobytes() for k in range(dt.itemsize)]
    return EncodedBlock(XOR, [], streams, int(np.count_nonzero(x)))


def encode_keyframe(dt: DType, target: np.ndarray) -> EncodedBlock:
    if not dt.is_float:
        return EncodedBlock(KEYFRAME, [], [to_planes(target, dt.itemsize)], target.size)
    ew, sw = _keyframe_widths(dt)
    M, E, bits = dt.mant_bits, dt.exp_bits, dt.itemsize * 8
    t = target
    exp = (t >> t.dtype.type(M)) & t.dtype.type((1 << E) - 1)
    sm = ((t >> t.dtype.type(bits - 1)) << t.dtype.type(M)) | (t & t.dtype.type((1 << M) - 1))
    return EncodedBlock(KEYFRAME, [], [to_planes(exp, ew), to_planes(sm, sw)], target.size)


def encode_float_delta(dt: DType, base: np.ndarray, target: np.ndarray, positions=None) -> EncodedBlock | None:
    """The bf16-delta / float-delta transform; None when nothing changed."""
    m = base.size
    if positions is None:
        positions = np.flatnonzero(base != target)
    c = positions.size
    if c == 0:
        return None
    bv = base[positions]
    tv = target[positions]
    mask = bv.dtype.type((1 << dt.mant_bits) - 1)
    kept = ((bv ^ tv) & ~mask) == 0
    exc = np.flatnonzero(~kept)
    e = exc.size
    sw = _step_width(dt)
    steps = tv[kept].astype(np.int64) - bv[kept].astype(np.int64)
    steps = steps.view(np.uint64) & np.uint64((1 << (8 * sw)) - 1)
    streams = [
        to_planes(_gaps(positions), bytes_for(m - 1)),
        to_planes(steps, sw),
        to_planes(_gaps(exc), bytes_for(c - 1)),
        to_planes(tv[exc], dt.itemsize),
    ]
    return EncodedBlock(BF16_DELTA if dt is BF16 else FLOAT_DELTA, [c, e], streams, c)


BY_NAME = {v: k for k, v in NAMES.items()}


def encode_forced(dt: DType, base: np.ndarray | None, target: np.ndarray, encoding: int) -> EncodedBlock:
    """One given encoding (for tests and conformance vectors); raises if it cannot code this block."""
    check_encoding(dt, encoding)
    if NEEDS_BASE[encoding] and base is None:
        raise ValueError(f"encoding {NAMES[encoding]} needs a base")
    if encoding == KEYFRAME:
        return encode_keyframe(dt, target)
    if encoding == XOR:
        return encode_xor(dt, base, target)
    positions = np.flatnonzero(base != target)
    if encoding == UNCHANGED or positions.size == 0:
        if positions.size:
            raise ValueError("block changed: it cannot be coded as unchanged")
        return EncodedBlock(UNCHANGED, [], [], 0)
    return encode_float_delta(dt, base, target, positions)


def encode_candidates(dt: DType, base: np.ndarray | None, target: np.ndarray) -> list[EncodedBlock]:
    """Every encoding worth trying for this block, cheapest-to-decode first."""
    if base is None:
        return [encode_keyframe(dt, target)]
    positions = np.flatnonzero(base != target)
    if positions.size == 0:
        return [EncodedBlock(UNCHANGED, [], [], 0)]
    out = []
    if dt.is_float:
        out.append(encode_float_delta(dt, base, target, positions))
    if not dt.is_float or positions.size * 4 > base.size:
        out.append(encode_xor(dt, base, target))
    if positions.size * 2 > base.size:
        out.append(encode_keyframe(dt, target))
    return out


# ----------------------------------------------------------------------------------------- decode

def decode_block(dt: DType, encoding: int, params, streams, m: int, base: np.ndarray | None,
                 out: np.ndarray) -> None:
    """Write the block's target into ``out`` (which may be ``base`` itself, for in-place updates).

    ``streams`` are the decoded byte streams, of exactly the lengths :func:`stream_lengths` gives.
    """
    udt = dt.uint
    if encoding == UNCHANGED:
        if out is not base:
            out[:] = base
        return
    if encoding == XOR:
        x = np.empty((m, dt.itemsize), np.uint8)
        for k, s in enumerate(streams):
            x[:, k] = np.frombuffer(s, np.uint8, count=m)
        np.bitwise_xor(base, x.view(udt).reshape(m), out=out)
        return
    if encoding == KEYFRAME:
        if not dt.is_float:
            out[:] = from_planes(streams[0], m, dt.itemsize, udt)
            return
        ew, sw = _keyframe_widths(dt)
        M, E, bits = dt.mant_bits, dt.exp_bits, dt.itemsize * 8
        exp = from_planes(streams[0], m, ew, udt if ew == dt.itemsize else _value_dtype(ew))
        sm = from_planes(streams[1], m, sw, udt if sw == dt.itemsize else _value_dtype(sw))
        if m and (int(exp.max()) >= 1 << E or int(sm.max()) >= 1 << (M + 1)):
            raise CorruptError("keyframe field value out of range")
        exp = exp.astype(udt, copy=False)
        sm = sm.astype(udt, copy=False)
        t = udt.type
        out[:] = ((sm >> t(M)) << t(bits - 1)) | (exp << t(M)) | (sm & t((1 << M) - 1))
        return
    if encoding in (BF16_DELTA, FLOAT_DELTA):
        _decode_float_delta(dt, params, streams, m, base, out)
        return
    raise UnsupportedError(f"unknown encoding id {encoding}")


def _decode_float_delta(dt, params, streams, m, base, out):
    c, e = params
    udt = dt.uint
    pos = _ungap(from_planes(streams[0], c, bytes_for(m - 1)))
    if pos[-1] >= m:
        raise CorruptError(f"changed position {int(pos[-1])} beyond block of {m} elements")
    if e:
        xi = _ungap(from_planes(streams[2], e, bytes_for(c - 1)))
        if xi[-1] >= c:
            raise CorruptError(f"exception index {int(xi[-1])} beyond {c} changed elements")
        kept = np.ones(c, bool)
        kept[xi] = False
        kpos = pos[kept]
        epos = pos[xi]
    else:
        kpos = pos
        epos = None
    mask = (1 << dt.mant_bits) - 1
    sw = _step_width(dt)
    raw = from_planes(streams[1], c - e, sw, np.uint64).view(np.int64)
    sign = np.int64(1 << (8 * sw - 1))
    steps = (raw ^ sign) - sign  # sign-extend from sw bytes
    b = base[kpos]
    mant = (b & udt.type(mask)).astype(np.int64) + steps
    if steps.size and (not np.all(steps) or mant.min() < 0 or mant.max() > mask):
        raise CorruptError("mantissa step is zero or leaves the mantissa range")
    if epos is not None:
        vals = from_planes(streams[3], e, dt.itemsize, udt)
        bexc = base[epos]
        if np.any(((vals ^ bexc) & udt.type(~mask & ((1 << (8 * dt.itemsize)) - 1))) == 0):
            raise CorruptError("exception value keeps sign and exponent (or equals the base)")
    if out is not base:
        out[:] = base
    out[kpos] = (b.astype(np.int64) + steps).astype(udt) if dt.itemsize < 8 else (b.view(np.int64) + steps).view(udt)
    if epos is not None:
        out[epos] = vals
