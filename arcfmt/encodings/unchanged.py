"""``unchanged`` (SPEC.md §8.1): no params, no streams; the target is the base."""
from __future__ import annotations

from ..errors import InputError
from .base import Block, EncodedBlock, Encoding
from .registry import register


@register
class Unchanged(Encoding):
    id = 0
    name = "unchanged"
    keeps_base = True
    trial_rank = 0  # tried first: a block without changes needs nothing else

    def stream_lengths(self, dt, params, m):
        return []

    def decode(self, dt, params, streams, m, base, out):
        if out is not base:
            out[:] = base

    def changed(self, params):
        return 0

    def encode(self, block: Block) -> EncodedBlock:
        if block.positions.size:
            raise InputError("block changed: it cannot be coded as unchanged")
        return EncodedBlock(self.id, [], [], 0)

    def propose(self, block, tried):
        return EncodedBlock(self.id, [], [], 0) if block.positions.size == 0 else None
