"""Pure block transforms of SPEC.md §8: unsigned-integer arrays in, uncompressed byte streams out.

No I/O and no container knowledge: a block is ``m`` elements viewed as unsigned ``W``-byte integers.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import ctx_delta as ctx
from .dtypes import BF16, DType
from .errors import InputError, CorruptError, UnsupportedError
from .planes import _value_dtype, bytes_for, from_planes, gaps, to_planes, ungap

UNCHANGED, XOR, BF16_DELTA, FLOAT_DELTA, KEYFRAME, CTX_DELTA = 0, 1, 2, 3, 4, 5
NAMES = {UNCHANGED: "unchanged", XOR: "xor", BF16_DELTA: "bf16-delta", FLOAT_DELTA: "float-delta",
         KEYFRAME: "keyframe", CTX_DELTA: "ctx-delta"}
NEEDS_BASE = {UNCHANGED: True, XOR: True, BF16_DELTA: True, FLOAT_DELTA: True, KEYFRAME: False, CTX_DELTA: True}
_PARAMS = {UNCHANGED: 0, XOR: 0, BF16_DELTA: 2, FLOAT_DELTA: 2, KEYFRAME: 0}


@dataclass
class EncodedBlock:
    encoding: int
    params: list
    streams: list  # uncompressed bytes-like, one per stream
    changed: int   # changed elements (informational; equals params[0] for the delta encodings)
    dense: tuple = ()  # indices of streams that are already entropy-coded: fast codec trials only


# ----------------------------------------------------------------------------------------- lengths

def check_encoding(dt: DType, encoding: int) -> None:
    if encoding not in NAMES:
        raise UnsupportedError(f"unknown encoding id {encoding}")
    if encoding == BF16_DELTA and dt is not BF16:
        raise UnsupportedError(f"encoding bf16-delta used for dtype {dt.name}")
    if encoding == FLOAT_DELTA and (not dt.is_float or dt is BF16):
        raise UnsupportedError(f"encoding float-delta used for dtype {dt.name}")
    if encoding == CTX_DELTA and not ctx.defined_for(dt):
        raise UnsupportedError(f"encoding ctx-delta used for dtype {dt.name}")


def param_count(encoding: int, head=()) -> int:
    """How many params the block has, given the ones read so far (``head``); SPEC.md §8."""
    if encoding == CTX_DELTA:
        return ctx.param_count(head)
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
    if encoding == CTX_DELTA:
        return ctx.stream_lengths(dt, ctx.Params.unpack(params), m)
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
        to_planes(gaps(positions), bytes_for(m - 1)),
        to_planes(steps, sw),
        to_planes(gaps(exc), bytes_for(c - 1)),
        to_planes(tv[exc], dt.itemsize),
    ]
    return EncodedBlock(BF16_DELTA if dt is BF16 else FLOAT_DELTA, [c, e], streams, c)


BY_NAME = {v: k for k, v in NAMES.items()}


def encode_forced(dt: DType, base: np.ndarray | None, target: np.ndarray, encoding: int) -> EncodedBlock:
    """One given encoding (for tests and conformance vectors); raises if it cannot code this block."""
    check_encoding(dt, encoding)
    if NEEDS_BASE[encoding] and base is None:
        raise InputError(f"encoding {NAMES[encoding]} needs a base")
    if encoding == KEYFRAME:
        return encode_keyframe(dt, target)
    if encoding == XOR:
        return encode_xor(dt, base, target)
    positions = np.flatnonzero(base != target)
    if encoding == UNCHANGED or positions.size == 0:
        if positions.size:
            raise InputError("block changed: it cannot be coded as unchanged")
        return EncodedBlock(UNCHANGED, [], [], 0)
    if encoding == CTX_DELTA:
        return _ctx_block(dt, base, target, positions)
    return encode_float_delta(dt, base, target, positions)


def _ctx_block(dt, base, target, positions, max_classes=4) -> EncodedBlock:
    enc = ctx.encode(dt, base, target, positions, max_classes=max_classes)
    return EncodedBlock(CTX_DELTA, enc.params, enc.streams, positions.size, dense=(0, 1, 2))


def encode_candidates(dt: DType, base: np.ndarray | None, target: np.ndarray,
                      effort="default") -> list[EncodedBlock]:
    """Every encoding worth trying for this block.

    ``ctx-delta`` nearly always beats ``bf16-delta``/``float-delta`` where both are defined, so the
    latter is only tried on blocks with few changes, where fixed overheads decide.
    """
    if base is None:
        return [encode_keyframe(dt, target)]
    positions = ctx.changed_positions(base, target)
    if positions.size == 0:
        return [EncodedBlock(UNCHANGED, [], [], 0)]
    out = []
    has_ctx = ctx.defined_for(dt)
    if has_ctx:
        out.append(_ctx_block(dt, base, target, positions, ctx.CLASS_LIMITS.get(effort, 4)
                              if isinstance(effort, str) else 4))
    if dt.is_float and (not has_ctx or positions.size < 256):
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
    if encoding == CTX_DELTA:
        ctx.decode(dt, ctx.Params.unpack(params), streams, m, base, out)
        return
    raise UnsupportedError(f"unknown encoding id {encoding}")


def _decode_float_delta(dt, params, streams, m, base, out):
    c, e = params
    udt = dt.uint
    pos = ungap(from_planes(streams[0], c, bytes_for(m - 1)))
    if pos[-1] >= m:
        raise CorruptError(f"changed position {int(pos[-1])} beyond block of {m} elements")
    if e:
        xi = ungap(from_planes(streams[2], e, bytes_for(c - 1)))
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
