"""The two calls most users need: ``encode`` a delta to bytes, ``decode`` it back against the base."""
from __future__ import annotations

import io
from collections.abc import Mapping

from .errors import InputError
from .reader import DeltaReader
from .writer import DEFAULT_BLOCK_ELEMS, DeltaWriter


def encode(base: Mapping | None, target: Mapping, *, base_step=None, target_step=None,
           block_elems: int = DEFAULT_BLOCK_ELEMS, effort: str = "default", workers=None,
           keyframe: bool = False) -> bytes:
    """Encode ``target`` as a delta from ``base`` (name → array). ``base=None`` or ``keyframe=True``
    writes a full lossless snapshot that needs no base."""
    if not isinstance(target, Mapping) or (base is not None and not isinstance(base, Mapping)):
        raise InputError("base and target must be mappings of tensor name to array")
    buf = io.BytesIO()
    with DeltaWriter(buf, base_step=base_step, target_step=target_step, block_elems=block_elems,
                     effort=effort, workers=workers) as w:
        w.write_tensors(((name, None if base is None else base.get(name), arr) for name, arr in target.items()),
                        keyframe=keyframe)
    return buf.getvalue()


def decode(base: Mapping | None, delta, *, names=None, workers=None) -> dict:
    """Rebuild the target (name → numpy array) from ``base`` and an arcfmt file (bytes or file object).

    Bit-exact and verified: every tensor against its hash, the model against its digest. Raises a
    subclass of :class:`arcfmt.ArcError` on any bad input or wrong base.
    """
    reader = DeltaReader(delta, workers=workers)
    return reader.decode_all({} if base is None else base, names)
