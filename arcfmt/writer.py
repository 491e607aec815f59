"""Streaming writer: tensors in, an arcfmt file out, front to back in one pass (never seeks)."""
from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from . import codecs, encodings, records
from . import layout as L
from .arrays import Stored, as_numpy, as_uint, is_mapped, release
from .dtypes import from_numpy
from .errors import InputError, LimitError
from .history import coded
from .integrity import DigestEntry, KnownBase, model_digest, tensor_hash
from .parallel import default_workers, run_jobs

# An encoded block: the encoding's output and each stream's (codec, stored bytes)
_Coded = tuple[encodings.EncodedBlock, list[tuple[int, bytes]]]
# What write_tensors emits in order: a tensor's header, then each block (header, index, the slot its
# encoding job fills, base block, target block)
_Pending = (tuple[Literal["T"], records.TensorHeader]
            | tuple[Literal["B"], tuple[records.TensorHeader, int, list[_Coded], np.ndarray | None, np.ndarray]])

# 2^21 elements (4 MiB of BF16): measured against 2^20, 0.4-2.2 % smaller files (half the block
# framing) and half the per-block Python that holds the GIL; a block is still far below a tensor of a
# large model, so threads keep every core busy (tools/gil_share.py --block-elems, BENCHMARKS.md).
DEFAULT_BLOCK_ELEMS = 1 << 21
# Input bytes of in-memory (not memory-mapped) tensors encoded between two writes: every flush waits
# for its slowest block, so small batches leave threads idle; the inputs are in memory already, and
# what a batch holds besides them is its blocks' streams.
BATCH_BYTES = 64 << 20
# Tensors given a previous value carry HISTORY (SPEC.md §7, 1.9) from this size on: its 8-byte hash pays
# only where the signs are many (forced ctx-delta-rh: every tensor given one)
HISTORY_MIN_ELEMS = 4096
ON_MISMATCH = ("warn", "error", "ignore")


class KeyframeWarning(UserWarning):
    """A target tensor has no base tensor of the same name, dtype and shape, so it is stored whole (a
    keyframe tensor, as large as the tensor compressed) instead of as a delta. Often a renamed
    parameter, a cast, or the wrong base checkpoint; silence it with ``on_mismatch="ignore"`` (or the
    ``warnings`` module), or make it an error with ``on_mismatch="error"``."""


def keyframe_mismatches(base: Mapping, target: Mapping) -> list[str]:
    """Why each tensor of ``target`` would be a keyframe against ``base``: one short phrase per tensor
    (``'w' (not in the base)``, ``'w' (shape (4,) in the base, (5,) here)``, ``'w' (dtype F32 in the
    base, BF16 here)``), in target order; empty when every tensor has its base. Arrays that are not
    arrays at all are left for the writer to refuse."""
    out = []
    for name, t in target.items():
        b = base.get(name)
        if b is None:
            out.append(f"{name!r} (not in the base)")
            continue
        try:
            (tdt, tshape), (bdt, bshape) = _dtype_shape(t), _dtype_shape(b)
        except (InputError, TypeError, AttributeError):
            continue
        if bdt is not tdt:
            out.append(f"{name!r} (dtype {bdt.name} in the base, {tdt.name} here)")
        elif bshape != tshape:
            out.append(f"{name!r} (shape {bshape} in the base, {tshape} here)")
    return out


def _dtype_shape(x: Any) -> tuple[Any, tuple[int, ...]]:
    """An array's arcfmt dtype and shape without touching its data (a GPU tensor is not copied)."""
    if isinstance(x, Stored):
        return x.dtype, tuple(x.shape)
    if not isinstance(x, np.ndarray) and hasattr(x, "new_empty"):   # torch: an empty one of its dtype
        return from_numpy(as_numpy(x.new_empty((0,))).dtype), tuple(int(d) for d in x.shape)
    a = as_numpy(x)
    return from_numpy(a.dtype), tuple(int(d) for d in a.shape)


def check_mismatches(base: Mapping, target: Mapping, on_mismatch: str, *, stacklevel: int = 2) -> None:
    """Act on :func:`keyframe_mismatches` before anything is encoded: ``"warn"`` (one
    :class:`KeyframeWarning` naming up to five tensors), ``"error"`` (:class:`~arcfmt.InputError`,
    nothing written) or ``"ignore"``. ``stacklevel`` as for :func:`warnings.warn`, counted from the
    caller of this function."""
    if on_mismatch not in ON_MISMATCH:
        raise InputError(f"on_mismatch must be one of {', '.join(ON_MISMATCH)}, not {on_mismatch!r}")
    if on_mismatch == "ignore":
        return
    found = keyframe_mismatches(base, target)
    if not found:
        return
    more = f", and {len(found) - 5} more" if len(found) > 5 else ""
    what = "tensor has" if len(found) == 1 else "tensors have"
    msg = (f"{len(found)} target {what} no base tensor of the same name, dtype and shape and will be stored "
           f"whole (keyframe): {', '.join(found[:5])}{more}")
    if on_mismatch == "error":
        raise InputError(msg.replace("will be stored", "would be stored") +
                         " (on_mismatch='error'; pass keyframe=True for a full snapshot)")
    warnings.warn(msg, KeyframeWarning, stacklevel=stacklevel + 1)


@dataclass
class BlockStats:
    encoding: str
    changed: int | None
    size: int                      # record bytes, header included (inline: the bytes it adds to its TENS record)
    streams: list = field(default_factory=list)  # (codec name, stored bytes, decoded bytes)


@dataclass
class TensorStats:
    name: str
    dtype: str
    shape: tuple
    header_size: int
    blocks: list = field(default_factory=list)

    @property
    def size(self) -> int:
        return self.header_size + sum(b.size for b in self.blocks)


# the largest block carried in its TENS record (SPEC §7, §18): 18 bytes saved matter on small blocks
# only, and a follower short of memory fetches every TENS record for its header before any block
INLINE_MAX_BYTES = 1 << 16
_SCREEN_MARGIN = 1.15  # stronger codecs gain under 15 % over zstd-3 on a block's streams (corpus)


def _hash_into(th: records.TensorHeader, base: np.ndarray | None, target: np.ndarray,
               previous: np.ndarray | None = None) -> None:
    """A tensor header's hashes (xxh3 releases the GIL on large tensors: a job like a block's)."""
    if base is not None:
        th.base_hash = tensor_hash(base)
    if previous is not None:
        th.previous_hash = tensor_hash(previous)
    th.target_hash = tensor_hash(target)


def _known_hash(value: object, name: str) -> int | None:
    """The tensor hash a KnownBase value comes with (checked: a u64), else None."""
    if not isinstance(value, KnownBase):
        return None
    h = value.hash
    if not isinstance(h, int) or isinstance(h, bool) or not 0 <= h < 1 << 64:
        raise InputError(f"tensor {name!r}: a KnownBase hash must be an int of 64 bits, not {h!r}")
    return h


def _encode_into(slot: list[_Coded], *args: Any) -> None:
    slot.append(_encode_block(*args))


OLDEST_READERS = (1, 4)   # the oldest format version whose decoders the writer can serve (a full index)


def check_readers(readers: object) -> tuple[int, int] | None:
    """A ``readers=`` value (the oldest format version a file's decoders have): None or ``(1, minor)``
    from 1.4 (prefixed names, which every file has, are 1.3; a full index serves 1.4) to this one."""
    if readers is None:
        return None
    if (not isinstance(readers, tuple) or len(readers) != 2 or readers[0] != L.MAJOR
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in readers)
            or not OLDEST_READERS[1] <= readers[1] <= L.MINOR):
        raise InputError(f"readers must be a format version from {OLDEST_READERS[0]}.{OLDEST_READERS[1]} to "
                         f"{L.MAJOR}.{L.MINOR}, not {readers!r}")
    return (readers[0], readers[1])


def _encode_block(dt, base, target, effort, force_encoding=None, force_codec=None, where=(None, 0), readers=None,
                  previous=None):
    """Every candidate encoding, each stream with its smallest codec; keep the smallest total.
    ``where``: the tensor's last dimension (None for a vector) and the block's first flat element;
    ``readers``: the oldest format version that must read the file (None: this one); ``previous``:
    the block's previous value, for a tensor with HISTORY (§7)."""
    if force_encoding is not None:
        cands = [encodings.encode_forced(dt, base, target, force_encoding, where[0], where[1], previous)]
    else:
        cands = encodings.candidates(dt, base, target, effort, where[0], where[1], readers, previous)
    if len(cands) > 1 and force_codec is None and effort != "fast":
        # A fast estimate orders the candidates; each then gets the full codec trials only while its
        # estimate is within reach of the smallest full result so far (strong codecs gain < 15 %).
        # The fast codings are kept: a dense stream's full trial is the same one, and every other
        # stream keeps the smaller of its fast and full results.
        coded_fast = [[codecs.encode_smallest(s, "fast") for s in c.streams] for c in cands]
        sized = [sum(len(x[1]) for x in f) for f in coded_fast]
        order = sorted(range(len(cands)), key=sized.__getitem__)
        cands = [cands[i] for i in order]
        est: list[int] | None = [sized[i] for i in order]
        fast: list[list[tuple[int, bytes]]] | None = [coded_fast[i] for i in order]
    else:
        est = fast = None
    best = None
    for i, cand in enumerate(cands):
        if best is not None and est is not None and est[i] > best[2] * _SCREEN_MARGIN:
            break
        if force_codec is not None:
            coded = [codecs.encode_with(force_codec, s) for s in cand.streams]
        else:
            coded = [_full_trial(s, j in cand.dense and effort != "max", effort, None if fast is None else fast[i][j])
                     for j, s in enumerate(cand.streams)]
        total = sum(len(s) for _, s in coded)
        if best is None or total < best[2]:
            best = (cand, coded, total)
    assert best is not None, "no encoding proposed a candidate for this block"
    return best[0], best[1]


def _full_trial(data, dense: bool, effort, fast: tuple[int, bytes] | None) -> tuple[int, bytes]:
    """A stream's codec trials: the fast ones for a dense stream (reusing ``fast``, their result, when
    given), else the effort's, keeping ``fast`` where it is smaller (ties: the full trial's)."""
    if dense:
        return fast if fast is not None else codecs.encode_smallest(data, "fast")
    full = codecs.encode_smallest(data, effort)
    return fast if fast is not None and len(fast[1]) < len(full[1]) else full


def _check_shape(name: str, shape: tuple, block_elems: int) -> None:
    """A shape the format can carry (SPEC.md §7, §14), else InputError: the writer never produces a file
    that a decoder must refuse (R-WRITER-LIMITS)."""
    if len(shape) > L.MAX_DIMS:
        raise InputError(f"tensor {name!r} has {len(shape)} dimensions, more than MAX_DIMS ({L.MAX_DIMS})")
    try:
        n = records.element_count(shape, f"tensor {name!r}")
    except LimitError as exc:
        raise InputError(str(exc)) from None
    if -(-n // block_elems) > L.MAX_BLOCKS_PER_TENSOR:
        raise InputError(f"tensor {name!r}: {n} elements in blocks of {block_elems} make more than "
                         f"MAX_BLOCKS_PER_TENSOR ({L.MAX_BLOCKS_PER_TENSOR}) blocks; use larger blocks")


class DeltaWriter:
    """Write an arcfmt file to a binary file-like object (local file, fsspec file, BytesIO).

    Usage::

        with DeltaWriter(f, base_step=3, target_step=4) as w:
            w.write_tensors((name, base[name], target[name]) for name in target)

    The file is written front to back and never seeked (a pipe or an upload stream works); it is
    complete once :meth:`close` (or leaving the ``with`` block) has written the index and trailer.
    After that, ``size`` is the file's size and ``stats`` lists per tensor its blocks' encodings and
    sizes. For whole checkpoints on disk use :func:`arcfmt.encode_files`.
    """

    def __init__(self, fileobj, *, base_step=None, target_step=None, block_elems=DEFAULT_BLOCK_ELEMS,
                 effort="default", workers=None, note: str | None = None, force_encoding: str | None = None,
                 force_codec: str | None = None, compact_index: bool = True, inline_blocks: bool = True,
                 previous=None, readers: tuple[int, int] | None = None):
        """Start a file: its header and META record (``base_step`` → ``target_step``) are written now.

        ``block_elems``: elements per block (the unit of parallelism and of random access);
        ``effort``: ``"fast"``, ``"default"`` or ``"max"`` (codec trials per stream); ``workers``:
        encoding threads (default: up to 8); ``note``: a free-text ``NOTE`` record.
        ``force_encoding`` / ``force_codec`` (names from SPEC.md §8/§9) pin every changed block to one
        encoding and every stream to one codec: for tests and conformance vectors, not for size.
        ``compact_index=False`` writes the index with its offset and checksum columns, as before 1.5
        (SPEC.md §10), no inline blocks and no encoding added after 1.4: a file readers of 1.4 read.
        ``inline_blocks=False`` (with a compact index) writes a one-block tensor's block as a BLCK
        record, as before 1.6 (§7), and no encoding added after 1.5: for vectors and for readers of
        1.5. (``force_encoding`` is obeyed either way.)
        ``previous``: the step before the base (name → array), as a follower of a stream holds it:
        tensors of the ctx-delta dtypes with a previous value of their dtype and shape carry HISTORY
        (1.9, §7) and may code their signs in its contexts (``ctx-delta-rh``, §8.11), and the file then
        needs that previous step to be read. Ignored in the modes for older readers.
        ``readers``: the oldest format version, ``(1, minor)`` from 1.4, whose decoders must read the file (a
        fleet not upgraded yet): no encoding added after it is written (e.g. ``(1, 9)``: no
        ``ctx-delta-rhp``, §8.12), and none is forced; before 1.9 no previous step is used, before 1.6 no
        block inline, before 1.5 a full index.
        A base or previous value may be given as :class:`arcfmt.integrity.KnownBase` (array, tensor
        hash) where its holder hashed it already (a publisher's own copy of a step it wrote): the file
        names it by that hash, unhashed again; a wrong one makes a file every reader refuses."""
        for what, step in (("base_step", base_step), ("target_step", target_step)):
            if step is not None and (not isinstance(step, int) or isinstance(step, bool)
                                     or not 0 <= step < L.NO_STEP):
                raise InputError(f"{what} must be an integer in 0..2**64-2 or None, not {step!r}")
        if not isinstance(block_elems, int) or not 1 <= block_elems <= L.MAX_BLOCK_ELEMS:
            raise InputError(f"block_elems must be in 1..{L.MAX_BLOCK_ELEMS}")
        if workers is not None and (not isinstance(workers, int) or workers < 1):
            raise InputError(f"workers must be a positive integer, not {workers!r}")
        if not isinstance(effort, str) or effort not in codecs.EFFORTS:
            raise InputError(f"effort must be one of {', '.join(codecs.EFFORTS)}, not {effort!r}")
        try:   # checked before the header is written, as every argument is
            note_bytes = None if note is None else note.encode("utf-8")
        except (AttributeError, UnicodeEncodeError):
            raise InputError(f"note must be a str of Unicode text, not {note!r:.80}") from None
        try:
            self._force_encoding = None if force_encoding is None else encodings.by_name(force_encoding).id
            self._force_codec = None if force_codec is None else codecs.by_name(force_codec).id
        except KeyError as exc:
            raise InputError(f"unknown encoding or codec name {exc}") from None
        self._f = fileobj
        self._pos = 0
        self._block_elems = block_elems
        self._effort = effort
        self._workers = workers or default_workers()
        self._entries: list[records.IndexEntry] = []
        self._others: list[records.OtherRecord] = []
        self._names: set[bytes] = set()
        self._base_entries: list[DigestEntry] = []
        self._target_entries: list[DigestEntry] = []
        self.stats: list[TensorStats] = []
        self.closed = False
        self.size: int | None = None  # the file's, once closed
        readers = check_readers(readers)
        if readers is not None:   # the framing those readers read: a full index before 1.5, no inline blocks before 1.6
            compact_index = compact_index and readers >= (1, 5)
            inline_blocks = inline_blocks and readers >= (1, 6)
        self._flags = records.header_flags(compact_index, inline_blocks)
        self._inline = bool(self._flags & L.INLINE_BLOCKS)
        self._readers = (1, 4) if not compact_index else (1, 5) if not inline_blocks else None
        if readers is not None and readers < (L.MAJOR, L.MINOR):
            self._readers = min(readers, self._readers or readers)
        if previous is not None and not isinstance(previous, Mapping):
            raise InputError("previous must be a mapping of tensor name to array")
        history = self._readers is None or self._readers >= encodings.by_name("ctx-delta-rh").since
        self._previous = previous if history else None
        forced = None if self._force_encoding is None else encodings.get(self._force_encoding)
        if forced is not None and forced.needs_history and not history:
            raise InputError(f"{forced.name} needs the previous step (format 1.9): the modes for older readers "
                             f"(a full index, no inline blocks, readers= before 1.9) write none")
        if forced is not None and readers is not None and forced.since > readers:
            raise InputError(f"{forced.name} is format {forced.since[0]}.{forced.since[1]}: readers of "
                             f"{readers[0]}.{readers[1]} cannot read it")
        self._held: records.TensorHeader | None = None   # an inline tensor's header, until its block is coded
        self._blocks = 0                  # blocks of the tensors accepted so far (§14 MAX_BLOCKS)
        self._added: list[bytes] = []     # names reserved by the write_tensors call under way
        # why the file cannot be finished: a call failed after writing part of a tensor (set once)
        self._broken: str | None = None
        self._write(records.build_header(self._flags))
        self._meta = records.Meta(base_step, target_step, prefixed_names=True, history=self._previous is not None)
        self._record(L.META, records.build_meta(self._meta))
        if note_bytes:
            self.write_record(L.NOTE, note_bytes)

    # -- low level
    def _write(self, data) -> None:
        self._f.write(data)
        self._pos += len(data)

    def _record(self, rtype, payload) -> tuple[int, int, int]:
        rec = records.build_record(rtype, payload)
        offset = self._pos
        self._write(rec)
        return offset, len(rec), L.parse_record_header(rec).checksum

    def write_record(self, rtype: bytes, payload: bytes) -> None:
        """Write an ancillary record (lower-case type, SPEC.md §5) between tensors."""
        self._check_open()
        if not isinstance(rtype, (bytes, bytearray)) or not L.RECORD_TYPE_RE.match(rtype) or L.is_critical(rtype):
            raise InputError(f"extra records must have an ancillary (lower-case first letter) type, not {rtype!r}")
        if len(self._others) >= L.MAX_OTHER_RECORDS:   # R-WRITER-LIMITS: the index lists every one (§14)
            raise InputError(f"a file holds at most MAX_OTHER_RECORDS ({L.MAX_OTHER_RECORDS}) ancillary records")
        if len(payload) > L.MAX_RECORD_PAYLOAD:
            raise InputError(f"a record's payload is at most MAX_RECORD_PAYLOAD ({L.MAX_RECORD_PAYLOAD}) bytes")
        off, size, _ = self._record(rtype, payload)
        self._others.append(records.OtherRecord(off, size, rtype))

    # -- tensors
    def _prepare(self, name, base, target, keyframe):
        raw = records.check_input_name(name)  # InputError: a caller's name, not damaged input
        if raw in self._names:
            raise InputError(f"tensor {name!r} written twice")
        if len(self._names) >= L.MAX_TENSORS:   # R-WRITER-LIMITS, file-wide (§14)
            raise InputError(f"a file holds at most MAX_TENSORS ({L.MAX_TENSORS}) tensors")
        dt, shape, t = as_uint(target)
        block_elems = min(self._block_elems, max(1, t.size))
        _check_shape(name, shape, block_elems)
        blocks = -(-t.size // block_elems)
        if self._blocks + blocks > L.MAX_BLOCKS:
            raise InputError(f"tensor {name!r}: the file's blocks would pass MAX_BLOCKS ({L.MAX_BLOCKS}); "
                             "use larger blocks or another file")
        self._blocks += blocks
        self._names.add(raw)
        self._added.append(raw)
        b = None
        known_b = _known_hash(base, name)
        if base is not None and not keyframe:
            bdt, bshape, b = as_uint(base.array if isinstance(base, KnownBase) else base)
            if bdt is not dt or bshape != shape:
                b = None  # dtype or shape changed: the tensor travels as a keyframe
        p, known_p = self._previous_of(name, dt, shape, b, t.size)
        # the hashes are filled in by a job of write_tensors (_hash_into), in parallel with the blocks,
        # but for a base or previous value given with its hash (KnownBase)
        th = records.TensorHeader(name, dt, tuple(int(d) for d in shape), block_elems,
                                  None if b is None else known_b if known_b is not None else 0, 0,
                                  None if p is None else known_p if known_p is not None else 0)
        return th, b, t, p, (b is not None and known_b is None, p is not None and known_p is None)

    def _previous_of(self, name, dt, shape, base, size) -> tuple[np.ndarray | None, int | None]:
        """The tensor's previous value (flat unsigned view) where it will carry HISTORY, else None; and
        its hash where it was given with one (KnownBase)."""
        if self._previous is None or base is None:
            return None, None
        forced = self._force_encoding is not None and encodings.get(self._force_encoding).needs_history
        if not coded(dt) or not size or (size < HISTORY_MIN_ELEMS and not forced):
            return None, None
        prev = self._previous.get(name)
        if prev is None:
            return None, None
        known = _known_hash(prev, name)
        pdt, pshape, p = as_uint(prev.array if isinstance(prev, KnownBase) else prev)
        return (p, known) if pdt is dt and pshape == shape else (None, None)

    def write_tensor(self, name: str, target, base=None, *, keyframe: bool = False) -> None:
        """Write one tensor: ``target`` (numpy, ml_dtypes or CPU torch array) as a delta from ``base``.

        ``base=None``, ``keyframe=True``, or a base of another dtype or shape stores the tensor whole (a
        keyframe tensor; the writer does not warn — :func:`arcfmt.encode` does). Names must be unique
        within the file. Prefer :meth:`write_tensors` for many tensors: it encodes blocks of several
        tensors in parallel."""
        self.write_tensors([(name, base, target)], keyframe=keyframe)

    def write_tensors(self, items, *, keyframe: bool = False) -> None:
        """Write ``(name, base_or_None, target)`` items in order, blocks encoded in parallel threads.

        Each item is handled as by :meth:`write_tensor`; ``items`` may be a generator (it is consumed
        a few blocks ahead, so memory-mapped inputs stream). ``keyframe``: store every tensor whole.

        A call that raises having written nothing leaves the writer as it was (its items are not in the
        file; they may be written again); one that raises after writing part of its tensors leaves the
        file unfinishable: :meth:`close` then refuses, so no index ever lists a half-written tensor."""
        self._check_open()
        start, blocks = self._pos, self._blocks
        self._added = []
        try:
            self._write_items(items, keyframe)
        except BaseException as exc:
            if self._pos == start:   # nothing of this call is in the file: as if it had not been made
                self._names.difference_update(self._added)
                self._blocks = blocks
                self._held = None    # an inline tensor's header, never written
            else:
                self._broken = (f"writing tensors failed after part of them was written ({type(exc).__name__}: "
                                f"{exc}); the file cannot be finished, start a new one")
            raise

    def _check_open(self) -> None:
        if self.closed:
            raise InputError("writer is closed")
        if self._broken is not None:
            raise InputError(self._broken)

    def _write_items(self, items, keyframe: bool) -> None:
        # blocks encoded between two writes: bounds the pages of mapped inputs held at once (4 blocks of
        # base and target per worker: 32 MiB of BF16 at the default block; a byte cap measured 13 % slower)
        batch = 4 * self._workers
        pending: list[_Pending] = []
        jobs: list[tuple[Any, ...]] = []  # (fn, *args) for run_jobs
        sizes: list[int] = []  # elements each job reads
        held = [0, False, 0]  # the batch's block input bytes, whether any input is memory-mapped, its blocks

        def flush():
            run_jobs(jobs, self._workers, elems=sizes)
            for item in pending:
                self._emit(item)
            pending.clear()
            jobs.clear()
            sizes.clear()
            held[:] = [0, False, 0]

        for name, base, target in items:
            th, b, t, p, (hash_b, hash_p) = self._prepare(name, base, target, keyframe)
            pending.append(("T", th))
            # before the tensor's first emit: same flush or an earlier one
            jobs.append((_hash_into, th, b if hash_b else None, t, p if hash_p else None))
            sizes.append(t.size * (1 + hash_b + hash_p))
            held[1] = held[1] or is_mapped(t) or is_mapped(b)
            for blk in range(th.block_count):
                s, e = th.block_range(blk)
                bb = None if b is None else b[s:e]
                slot: list[_Coded] = []
                jobs.append((_encode_into, slot, th.dtype, bb, t[s:e], self._effort, self._force_encoding,
                             self._force_codec, (th.shape[-1] if len(th.shape) >= 2 else None, s), self._readers,
                             None if p is None else p[s:e]))
                sizes.append(e - s)
                pending.append(("B", (th, blk, slot, bb, t[s:e])))
                held[0] += (e - s) * th.dtype.itemsize * (1 if bb is None else 2)
                held[2] += 1
                # mapped inputs: a few blocks at a time bound the pages held; others: enough bytes
                # (counted as they come: a scan of ``pending`` per block was quadratic in small tensors)
                if held[2] >= batch and (held[1] or held[0] >= BATCH_BYTES):
                    flush()
        flush()

    def _emit(self, item: _Pending) -> None:
        if item[0] == "T":
            th = item[1]
            if self._inline and th.block_count == 1:
                self._held = th   # written with its block, the next item (same flush, §7)
                return
            self._emit_tensor(th)
            return
        th, blk, slot, bb, tb = item[1]
        enc, coded = slot[0]
        release(bb)  # memory-mapped inputs: this block's pages are done with
        release(tb)
        held, self._held = self._held, None
        if held is not None and held.needs_history and not encodings.get(enc.encoding).needs_history:
            held.previous_hash = None   # its one block does not use the history: the record need not name it
        # sized before it is built: a large block's streams are joined once, into its own record
        head = records.block_head(None, None, enc, coded)
        inline_size = len(head) + sum(len(s) for _, s in coded)
        if held is not None and inline_size <= INLINE_MAX_BYTES:
            off = self._emit_tensor(held, records.build_block(None, None, enc, coded, head))
            ref, size = records.BlockRef(off, 0, None, enc.encoding), inline_size
            self.stats[-1].header_size -= size
        else:
            if held is not None:
                self._emit_tensor(held)   # a large block is its own record (SPEC §18)
            off, size, ck = self._record(L.BLCK, records.build_block(self._tensor_ordinal, blk, enc, coded))
            ref = records.BlockRef(off, size, ck, enc.encoding)
        self._entries[-1].blocks.append(ref)
        self.stats[-1].blocks.append(BlockStats(
            encodings.get(enc.encoding).name, enc.changed, size,
            [(codecs.get(c).name, len(s), len(raw)) for (c, s), raw in zip(coded, enc.streams)]))

    def _emit_tensor(self, th: records.TensorHeader, block: bytes | None = None) -> int:
        """Write a TENS record (with its inline ``block``, §7); its offset."""
        prev = self._meta.prev_name(self._entries, len(self._entries))   # as the readers take it
        off, size, ck = self._record(L.TENS, records.build_tensor(th, prev, block))
        self._entries.append(records.IndexEntry(th.name, off, size, ck, []))
        self.stats.append(TensorStats(th.name, th.dtype.name, th.shape, size))
        name_b = th.name.encode("utf-8")
        self._target_entries.append((name_b, th.dtype.code, th.shape, th.target_hash))
        if th.base_hash is not None:  # th.needs_base
            self._base_entries.append((name_b, th.dtype.code, th.shape, th.base_hash))
        self._tensor_ordinal = len(self._entries) - 1
        return off

    def close(self) -> int:
        """Write the index and trailer; returns the file size. The file object is left open."""
        if self.closed:
            assert self.size is not None
            return self.size
        if self._broken is not None:
            raise InputError(self._broken)
        base_digest = model_digest(self._base_entries) if self._base_entries else L.NO_BASE_DIGEST
        index = records.Index(base_digest, model_digest(self._target_entries), self._entries, self._others,
                              bool(self._flags & L.COMPACT_INDEX), self._inline)
        payload = records.build_index(index)
        if records.index_body_length(payload) > L.MAX_INDEX_BYTES:   # R-WRITER-LIMITS: long names, many tensors
            self._broken = (f"the index would pass MAX_INDEX_BYTES ({L.MAX_INDEX_BYTES}); the file cannot be "
                            "finished: write fewer tensors (or shorter names) per file")
            raise InputError(self._broken)
        off, size, _ = self._record(L.INDX, payload)
        self._write(records.build_trailer(off, size, self._flags))
        self.closed = True
        self.size = self._pos
        return self._pos

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
