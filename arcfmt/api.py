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


def apply_in_place(arrays: Mapping, delta, *, workers=None, names=None):
    """Apply a delta straight into live arrays (numpy, or CPU torch tensors), without a full copy.

    Yields ``(name, array)`` for every tensor that changed — the pairs a vLLM-style
    ``load_weights`` takes — after it has been updated. All-or-nothing per tensor: each tensor's new
    bytes are rebuilt block by block and verified against the file's hash *before* any byte of the
    live array is overwritten (blocks whose encoding is ``unchanged`` are never touched). A tensor
    whose dtype or shape changes, or that is new, is yielded as a fresh array instead (the caller
    must install it). Raises a subclass of :class:`arcfmt.ArcError`; tensors already yielded stay
    updated, the failing one and those after it are untouched.
    """
    import numpy as np

    from .arrays import as_numpy
    from .transforms import UNCHANGED

    reader = DeltaReader(delta, workers=workers)
    wanted = reader.names if names is None else list(names)
    live = {}
    for n in wanted:  # every base is checked before anything is written (SPEC.md §12.3)
        th = reader.header(n)
        if th.needs_base:
            arr = arrays.get(n)
            u = reader.check_base(n, arr)
            view = as_numpy(arr)
            if not (view.flags.c_contiguous and view.flags.writeable):
                raise InputError(f"tensor {n!r}: the live array must be C-contiguous and writeable")
            live[n] = (view, u)
    for n in wanted:
        th = reader.header(n)
        entry = reader.entries[n]
        if n not in live:
            yield n, reader.to_array(n, reader.decode_tensor(n, None))
            continue
        view, u = live[n]
        changed = [b for b, ref in enumerate(entry.blocks) if ref.encoding != UNCHANGED]
        if not changed:
            continue
        flat = view.reshape(-1).view(th.dtype.uint)
        staged = {}
        import xxhash

        h = xxhash.xxh3_64()
        for b in range(th.block_count):
            s, e = th.block_range(b)
            if b in changed:
                out = np.empty(e - s, th.dtype.uint)
                reader.decode_block_into_buffer(n, b, u[s:e], out)
                staged[b] = out
                h.update(memoryview(out).cast("B"))
            else:
                h.update(memoryview(np.ascontiguousarray(u[s:e])).cast("B"))
        if h.intdigest() != th.target_hash:
            from .errors import VerificationError
            raise VerificationError(f"tensor {n!r}: reconstructed bytes do not match the target hash")
        for b, out in staged.items():
            s, e = th.block_range(b)
            flat[s:e] = out
        yield n, arrays[n]
