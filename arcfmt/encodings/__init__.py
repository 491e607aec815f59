"""The block encodings of SPEC.md §8: one object per encoding, registered in one table.

    from arcfmt import encodings
    enc = encodings.get(5)                 # <encoding 5 ctx-delta>
    enc.stream_lengths(dt, params, m)      # checks the params, gives each stream's decoded length
    encodings.by_name("xor").id            # 1

:mod:`.base` defines the interface (:class:`Encoding`), :mod:`.registry` the table; each built-in
encoding is one module here and registers itself on import. The container layer (records, reader,
writer, pipeline) and the tools that describe files (report, inspect) only ever go through this table.
"""
from __future__ import annotations

from . import ctx_delta, float_delta, keyframe, unchanged, xor  # noqa: E402,F401  (the built-ins register)
from .base import Block, EncodedBlock, Encoding, StreamRole
from .registry import (
    BY_NAME,
    NAMES,
    NEEDS_BASE,
    by_name,
    candidates,
    decode_block,
    encode_forced,
    find,
    for_dtype,
    get,
    keeps_base,
    register,
    registered,
    unregister,
)

UNCHANGED = unchanged.Unchanged.id
XOR = xor.Xor.id
BF16_DELTA = float_delta.Bf16Delta.id
FLOAT_DELTA = float_delta.FloatDelta.id
KEYFRAME = keyframe.Keyframe.id
CTX_DELTA = ctx_delta.CtxDelta.id
DENSE_DELTA = ctx_delta.DenseDelta.id
CTX_DELTA_AS = ctx_delta.CtxDeltaAs.id
CTX_DELTA_RC = ctx_delta.CtxDeltaRc.id
CTX_DELTA_RP = ctx_delta.CtxDeltaRp.id

__all__ = [
    "Block", "EncodedBlock", "Encoding", "StreamRole", "BY_NAME", "NAMES", "NEEDS_BASE", "by_name",
    "candidates", "decode_block", "encode_forced", "find", "for_dtype", "get", "keeps_base", "register",
    "registered", "unregister", "UNCHANGED", "XOR", "BF16_DELTA", "FLOAT_DELTA", "KEYFRAME", "CTX_DELTA",
    "DENSE_DELTA", "CTX_DELTA_AS", "CTX_DELTA_RC", "CTX_DELTA_RP",
]
