"""``xor`` (SPEC.md §8.2): no params; stream ``k`` holds byte ``k`` of ``base XOR target``."""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from ..dtypes import DType
from .base import Block, EncodedBlock, Encoding, StreamRole
from .registry import register

if TYPE_CHECKING:
    from ..layout import BytesLike

_ROLES = tuple(StreamRole(f"xor plane {k}", "xor planes") for k in range(8))


@register
class Xor(Encoding):
    id = 1
    name = "xor"
    trial_rank = 30

    def stream_lengths(self, dt: DType, params: Sequence[int], m: int) -> list[int]:
        return [m] * dt.itemsize

    def decode(self, dt: DType, params: Sequence[int], streams: Sequence[BytesLike], m: int, base: np.ndarray | None,
               out: np.ndarray) -> None:
        assert base is not None, "xor needs a base: the container never decodes one without"
        x = np.empty((m, dt.itemsize), np.uint8)
        for k, s in enumerate(streams):
            x[:, k] = np.frombuffer(s, np.uint8, count=m)
        np.bitwise_xor(base, x.view(dt.uint).reshape(m), out=out)

    def stream_roles(self, dt: DType) -> tuple[StreamRole, ...]:
        return _ROLES[:dt.itemsize]

    def changed_in_streams(self, dt: DType, streams: Sequence[BytesLike]) -> int:
        """An element changed iff one of its bytes of ``base XOR target`` is not zero."""
        acc = None
        for s in streams:
            nz = np.frombuffer(s, np.uint8) != 0
            acc = nz if acc is None else (acc | nz)
        return 0 if acc is None else int(np.count_nonzero(acc))

    def encode(self, block: Block) -> EncodedBlock:
        x = block.base ^ block.target
        raw = np.ascontiguousarray(x).view(np.uint8).reshape(x.size, block.dt.itemsize)
        streams = [np.ascontiguousarray(raw[:, k]).tobytes() for k in range(block.dt.itemsize)]
        return EncodedBlock(self.id, [], streams, int(np.count_nonzero(x)))

    def propose(self, block: Block, tried: list[EncodedBlock]) -> EncodedBlock | None:
        """Integers always; floats only when dense (a quarter of the elements changed or more)."""
        if not block.dt.is_float or block.positions.size * 4 > block.m:
            return self.encode(block)
        return None
