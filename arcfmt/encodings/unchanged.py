"""``unchanged`` (SPEC.md §8.1): no params, no streams; the target is the base."""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from ..dtypes import DType
from ..errors import InputError
from .base import Block, EncodedBlock, Encoding
from .registry import register

if TYPE_CHECKING:
    from ..layout import BytesLike


@register
class Unchanged(Encoding):
    id = 0
    name = "unchanged"
    keeps_base = True
    trial_rank = 0  # tried first: a block without changes needs nothing else

    def stream_lengths(self, dt: DType, params: Sequence[int], m: int) -> list[int]:
        return []

    def decode(self, dt: DType, params: Sequence[int], streams: Sequence[BytesLike], m: int, base: np.ndarray | None,
               out: np.ndarray) -> None:
        if out is not base:
            assert base is not None, "unchanged needs a base: the container never decodes one without"
            np.copyto(out, base)

    def changed(self, params: Sequence[int]) -> int:
        return 0

    def encode(self, block: Block) -> EncodedBlock:
        if block.positions.size:
            raise InputError("block changed: it cannot be coded as unchanged")
        return EncodedBlock(self.id, [], [], 0)

    def propose(self, block: Block, tried: list[EncodedBlock]) -> EncodedBlock | None:
        return EncodedBlock(self.id, [], [], 0) if block.positions.size == 0 else None
