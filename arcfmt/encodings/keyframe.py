"""``keyframe`` (SPEC.md §8.5): no params, no base; the target's fields, plane-major."""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from ..dtypes import DType
from ..errors import CorruptError
from ..planes import _value_dtype, bytes_for, from_planes, to_planes
from .base import Block, EncodedBlock, Encoding, StreamRole
from .registry import register

if TYPE_CHECKING:
    from ..layout import BytesLike

_FLOAT_ROLES = (StreamRole("exponent", "exponent"), StreamRole("sign+mantissa", "sign+mantissa"))
_OTHER_ROLES = (StreamRole("elements", "elements"),)


def _widths(dt: DType) -> tuple[int, int]:
    return bytes_for((1 << dt.exp_bits) - 1), bytes_for((1 << (dt.mant_bits + 1)) - 1)


@register
class Keyframe(Encoding):
    id = 4
    name = "keyframe"
    needs_base = False
    trial_rank = 40

    def stream_lengths(self, dt: DType, params: Sequence[int], m: int) -> list[int]:
        if dt.is_float:
            ew, sw = _widths(dt)
            return [m * ew, m * sw]
        return [m * dt.itemsize]

    def decode(self, dt: DType, params: Sequence[int], streams: Sequence[BytesLike], m: int, base: np.ndarray | None,
               out: np.ndarray) -> None:
        udt = dt.uint
        if not dt.is_float:
            out[:] = from_planes(streams[0], m, dt.itemsize, udt)
            return
        ew, sw = _widths(dt)
        M, E, bits = dt.mant_bits, dt.exp_bits, dt.itemsize * 8
        exp = from_planes(streams[0], m, ew, udt if ew == dt.itemsize else _value_dtype(ew))
        sm = from_planes(streams[1], m, sw, udt if sw == dt.itemsize else _value_dtype(sw))
        if m and (int(exp.max()) >= 1 << E or int(sm.max()) >= 1 << (M + 1)):
            raise CorruptError("keyframe field value out of range")
        exp = exp.astype(udt, copy=False)
        sm = sm.astype(udt, copy=False)
        t = udt.type
        out[:] = ((sm >> t(M)) << t(bits - 1)) | (exp << t(M)) | (sm & t((1 << M) - 1))

    def stream_roles(self, dt: DType) -> tuple[StreamRole, ...]:
        return _FLOAT_ROLES if dt.is_float else _OTHER_ROLES

    def encode(self, block: Block) -> EncodedBlock:
        dt, t = block.dt, block.target
        if not dt.is_float:
            return EncodedBlock(self.id, [], [to_planes(t, dt.itemsize)], t.size)
        ew, sw = _widths(dt)
        M, E, bits = dt.mant_bits, dt.exp_bits, dt.itemsize * 8
        exp = (t >> t.dtype.type(M)) & t.dtype.type((1 << E) - 1)
        sm = ((t >> t.dtype.type(bits - 1)) << t.dtype.type(M)) | (t & t.dtype.type((1 << M) - 1))
        return EncodedBlock(self.id, [], [to_planes(exp, ew), to_planes(sm, sw)], t.size)

    def propose(self, block: Block, tried: list[EncodedBlock]) -> EncodedBlock | None:
        """Without a base, always; with one, when more than half the elements changed."""
        if block.base is None or block.positions.size * 2 > block.m:
            return self.encode(block)
        return None
