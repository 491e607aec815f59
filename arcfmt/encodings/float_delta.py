"""``bf16-delta`` (SPEC.md §8.3) and ``float-delta`` (§8.4): one definition, two ids.

Changed positions (gap-coded), a mantissa step for each element whose sign and exponent are kept, and
the exceptions (indices into the changed list) with their full values.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from ..dtypes import DType
from ..errors import CorruptError
from ..planes import bytes_for, from_planes, gaps, to_planes, ungap
from .base import Block, EncodedBlock, Encoding, StreamRole
from .registry import register

if TYPE_CHECKING:
    from ..layout import BytesLike

_ROLES = tuple(StreamRole(n, n) for n in ("positions", "steps", "exceptions", "values"))
_FEW_CHANGES = 256  # below this many changes it is tried even where ctx-delta is: fixed overheads decide


def _step_width(dt: DType) -> int:
    return bytes_for((1 << (dt.mant_bits + 1)) - 1)


class _FloatDelta(Encoding):
    param_names = ("changed", "exceptions")
    trial_rank = 20

    def stream_lengths(self, dt: DType, params: Sequence[int], m: int) -> list[int]:
        c, e = params
        if not 1 <= c <= m:
            raise CorruptError(f"changed count {c} outside 1..{m}")
        if not e <= c:
            raise CorruptError(f"exception count {e} exceeds changed count {c}")
        return [c * bytes_for(m - 1), (c - e) * _step_width(dt), e * bytes_for(c - 1), e * dt.itemsize]

    def changed(self, params: Sequence[int]) -> int:
        return params[0]

    def stream_roles(self, dt: DType) -> tuple[StreamRole, ...]:
        return _ROLES

    def encode(self, block: Block) -> EncodedBlock | None:
        """None when nothing changed."""
        dt, base, target, positions = block.dt, block.base, block.target, block.positions
        assert base is not None, f"{self.name} needs a base: the registry never offers it a block without"
        m = base.size
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
        return EncodedBlock(self.id, [c, e], streams, c)

    def propose(self, block: Block, tried: list[EncodedBlock]) -> EncodedBlock | None:
        """``ctx-delta`` nearly always beats it where both are defined (it is tried first), so then
        only on blocks with few changes, where fixed overheads decide."""
        if tried and block.positions.size >= _FEW_CHANGES:
            return None
        return self.encode(block)

    def decode(self, dt: DType, params: Sequence[int], streams: Sequence[BytesLike], m: int, base: np.ndarray | None,
               out: np.ndarray) -> None:
        c, e = params
        assert base is not None, f"{self.name} needs a base: the container never decodes one without"
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
        if dt.itemsize < 8:
            out[kpos] = (b.astype(np.int64) + steps).astype(udt)
        else:
            out[kpos] = (b.view(np.int64) + steps).view(udt)
        if epos is not None:
            out[epos] = vals


@register
class Bf16Delta(_FloatDelta):
    id = 2
    name = "bf16-delta"
    dtypes = frozenset({"BF16"})


@register
class FloatDelta(_FloatDelta):
    id = 3
    name = "float-delta"
    dtypes = frozenset({"F16", "F32", "F64", "F8_E4M3", "F8_E5M2"})
