"""The two calls most users need: ``encode`` a delta to bytes, ``decode`` it back against the base."""
from __future__ import annotations

import io
from collections.abc import Mapping

from . import pipeline
from .arrays import as_numpy
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


def decode(base: Mapping | None, delta, *, names=None, workers=None, max_output_bytes: int | None = None) -> dict:
    """Rebuild the target (name → numpy array) from ``base`` and an arcfmt file (bytes or file object).

    Bit-exact and verified: every tensor against its hash, the model against its digest. Raises a
    subclass of :class:`arcfmt.ArcError` on any bad input or wrong base. ``max_output_bytes`` bounds
    the memory the rebuilt tensors may take (by default: what the bases back, plus a bound scaled to
    the file, so a small file cannot make gigabytes).
    """
    reader = DeltaReader(delta, workers=workers, max_output_bytes=max_output_bytes)
    return reader.decode_all({} if base is None else base, names)


def apply_in_place(arrays: Mapping, delta, *, workers=None, names=None, max_output_bytes: int | None = None):
    """Apply a delta straight into live arrays (numpy, or CPU torch tensors), without a full copy.

    Yields ``(name, array)`` for every tensor that changed — the pairs a vLLM-style
    ``load_weights`` takes — after it has been updated. Every base tensor (and, for the whole file,
    both digests) is checked before anything is decoded; then each tensor's changed blocks are
    rebuilt into private memory and verified against the file's hash *before* any byte of the live
    array is overwritten (blocks whose encoding is ``unchanged`` are never touched). A tensor whose
    dtype or shape changes, or that is new, is yielded as a fresh array instead (the caller must
    install it). Raises a subclass of :class:`arcfmt.ArcError`; tensors already yielded stay
    updated, the failing one and those after it are untouched.
    """
    reader = DeltaReader(delta, workers=workers, max_output_bytes=max_output_bytes)
    wanted, bases, _ = reader.selection(arrays, names)
    live = {}
    for n in wanted:
        if bases[n] is None:
            continue
        view = as_numpy(arrays[n])
        if not (view.flags.c_contiguous and view.flags.writeable):
            raise InputError(f"tensor {n!r}: the live array must be C-contiguous and writeable")
        live[n] = view.reshape(-1).view(reader.header(n).dtype.uint)
    fresh = [reader.header(n) for n in wanted if n not in live]
    sink = pipeline.LiveSink(live, arrays, pipeline.ArraySink(reader.output_budget(fresh)))
    items = []
    for n in wanted:
        if n in live and not reader.changes(n):
            # its bytes are the base's, whose hash was just checked: the target hash must be that one
            base_hash = reader.header(n).base_hash
            assert base_hash is not None  # it is live: it has a checked base
            pipeline.verify_hash(reader.header(n), base_hash)
            continue
        items.append(reader.item(n, bases[n]))
    yield from pipeline.run(items, sink, workers=reader.workers)
