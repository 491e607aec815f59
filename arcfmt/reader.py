"""Readers: random access through a tiny byte-range interface, and front-to-back streaming.

Parsing never touches I/O directly: everything goes through a ``ByteSource`` (``size`` and
``read(offset, length)``), so the same reader serves memory, local files and fsspec range reads.
"""
from __future__ import annotations

import functools
import io
import operator
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from . import codecs, encodings, pipeline, records
from . import layout as L
from .errors import (
    CorruptError,
    InputError,
    LimitError,
    MissingPreviousError,
    MissingTensorError,
    TruncatedError,
    os_error,
)
from .parallel import SHARED_MIN_ELEMS, Batch, Job, default_workers

DECODE_WINDOW_PER_WORKER = 8  # shared blocks in flight per thread in a decode into new arrays

# --------------------------------------------------------------------------------------- sources

class BufferSource:
    """Byte ranges of an in-memory buffer (bytes, bytearray, memoryview, mmap)."""

    def __init__(self, data):
        self._mv = memoryview(data).cast("B")
        self.size = len(self._mv)

    def read(self, offset: int, length: int):
        """``length`` bytes at ``offset`` (a memoryview, no copy); TruncatedError past the end."""
        if offset < 0 or length < 0 or offset + length > self.size:
            raise TruncatedError(f"read of {length} bytes at offset {offset} runs past the end of the "
                                 f"{self.size}-byte input")
        return self._mv[offset: offset + length]


class FileSource:
    """Byte ranges of a seekable binary file object (local or fsspec); reads are serialised."""

    def __init__(self, fileobj, size: int | None = None):
        self._f = fileobj
        self._lock = threading.Lock()
        name = getattr(fileobj, "name", None)
        self._name = name if isinstance(name, str) else "the input"   # an OS error names the user's file
        if size is None:
            with self._lock:
                try:
                    size = fileobj.seek(0, os.SEEK_END)
                except OSError as exc:
                    raise os_error(exc, "read", self._name) from None
        self.size = size

    def read(self, offset: int, length: int):
        """``length`` bytes at ``offset`` (seek and read, under a lock); TruncatedError past the end."""
        if offset < 0 or length < 0 or offset + length > self.size:
            raise TruncatedError(f"read of {length} bytes at offset {offset} runs past the end of the "
                                 f"{self.size}-byte input")
        with self._lock:
            try:
                self._f.seek(offset)
                data = self._f.read(length)
            except OSError as exc:
                raise os_error(exc, "read", self._name) from None
        if len(data) != length:
            raise TruncatedError(f"input ended after {len(data)} of {length} bytes at offset {offset}")
        return data


def open_source(obj):
    if hasattr(obj, "read") and hasattr(obj, "size") and callable(obj.read) and not hasattr(obj, "seek"):
        return obj
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return BufferSource(obj)
    if hasattr(obj, "seek") and hasattr(obj, "read"):
        return FileSource(obj)
    raise InputError(f"cannot read an arcfmt file from {type(obj).__name__}")


# --------------------------------------------------------------------------------------- reader

@dataclass
class LoadedBlock:
    info: records.BlockInfo
    payload: memoryview


class DeltaReader:
    """Random access to an arcfmt file: trailer → index → only the records asked for."""

    def __init__(self, source, *, workers: int | None = None, max_output_bytes: int | None = None,
                 index: records.Index | None = None):
        """``index``: this file's index as :func:`records.parse_index` gave it to the caller (a follower
        reads each shard's index with its trailer to plan a step): used, not parsed a second time, only
        if it was parsed from the very INDX payload and offset this reader reads and checks."""
        self.source = open_source(source)
        self.max_output_bytes = max_output_bytes
        self.workers = workers or default_workers()
        size = self.source.size
        if size < L.HEADER_SIZE:
            records.check_header(self.source.read(0, size))
        header = records.check_header(self.source.read(0, L.HEADER_SIZE))
        self.version = header.version
        if size < L.MIN_FILE_SIZE:
            raise TruncatedError(f"file of {size} bytes is shorter than the smallest arcfmt file ({L.MIN_FILE_SIZE})")
        trailer = records.check_trailer(self.source.read(size - L.TRAILER_SIZE, L.TRAILER_SIZE), size)
        records.trailer_agrees(trailer, header)
        self.index_offset = trailer.index_offset
        head, payload = self._read_record(trailer.index_offset, trailer.index_size, L.INDX)
        if index is None or not index.parsed_from(payload, trailer.index_offset, header.compact_index,
                                                  header.inline_blocks):
            index = records.parse_index(payload, trailer.index_offset, header.compact_index, header.inline_blocks)
        self.index = index
        self._inline_blocks = header.inline_blocks
        for o in self.index.others:  # learn the true type of every record the index lists (§12.1 step 4)
            head = records.parse_record_head(self.source.read(o.offset, L.RECORD_HEADER_SIZE), o.offset)
            if head.type != o.type or head.length != o.size - L.RECORD_HEADER_SIZE:
                raise CorruptError(f"record at offset {o.offset} is {head.type!r} of {head.length} bytes; "
                                   f"the index says {o.type!r} of {o.size - L.RECORD_HEADER_SIZE}")
        _, meta = self._read_record(L.HEADER_SIZE, L.META_RECORD_SIZE, L.META)
        self.meta = records.parse_meta(meta)
        self.entries = {e.name: e for e in self.index.entries}
        self._ordinal = {e.name: i for i, e in enumerate(self.index.entries)}
        self._headers: dict[str, records.TensorHeader] = {}
        self._inline: dict[str, memoryview] = {}   # TENS payloads ending in an inline block, until it is checked
        self._checked: dict[str, LoadedBlock] = {}   # inline blocks checked (by selection), until loaded
        self._histories: dict[str, Any] = {}   # where the codes of a tensor with HISTORY come from, once checked

    # -- identity
    @property
    def base_step(self):
        """The step the delta applies to (None: not given)."""
        return self.meta.base_step

    @property
    def target_step(self):
        """The step the delta rebuilds (None: not given)."""
        return self.meta.target_step

    @property
    def base_digest(self) -> bytes:
        """The model digest (SPEC.md §11) of the tensors the delta needs as base."""
        return self.index.base_digest

    @property
    def target_digest(self) -> bytes:
        """The model digest (SPEC.md §11) of the rebuilt target."""
        return self.index.target_digest

    @property
    def names(self) -> list[str]:
        """Every tensor name, in file order."""
        return [e.name for e in self.index.entries]

    # -- records
    def _read_record(self, offset, size, rtype, checksum=None):
        if size < L.RECORD_HEADER_SIZE:
            raise CorruptError(f"record at offset {offset}: size {size} is smaller than a record header")
        data = self.source.read(offset, size)
        head = records.parse_record_head(data, offset)
        if head.type != rtype:
            raise CorruptError(f"record at offset {offset}: expected {rtype.decode()}, found {head.type!r}")
        if head.length != size - L.RECORD_HEADER_SIZE:
            raise CorruptError(f"record {rtype.decode()} at offset {offset}: length {head.length} does not "
                               f"match the {size - L.RECORD_HEADER_SIZE} bytes the index gives")
        if checksum is not None and head.checksum != checksum:
            raise CorruptError(f"record {rtype.decode()} at offset {offset}: checksum field differs from the index")
        payload = memoryview(data)[L.RECORD_HEADER_SIZE:]
        records.verify_record(head, data, payload, offset)
        return head, payload

    def header(self, name: str) -> records.TensorHeader:
        """The tensor's header (TENS record): ``name``, ``dtype``, ``shape``, ``block_elems``,
        ``needs_base``, ``base_hash``, ``target_hash``; read and checked on first use, then cached.
        MissingTensorError for a name the file does not have."""
        th = self._headers.get(name)
        if th is None:
            th, payload = self._read_tensor(name)
            if th.inline_at is not None:
                self._inline[name] = payload   # its block is checked by :meth:`_inline_block`
            self._headers[name] = th
        return th

    def _read_tensor(self, name: str) -> tuple[records.TensorHeader, memoryview]:
        """The tensor's TENS record, read and checked (§7, §10 "Later"), all but its inline block."""
        e = self._entry(name)
        _, payload = self._read_record(e.tens_offset, e.tens_size, L.TENS, e.tens_checksum)
        t = self._ordinal[name]
        where = f"TENS at offset {e.tens_offset}"
        th = records.parse_tensor(payload, where, self.meta.prev_name(self.index.entries, t), self._inline_blocks,
                                  self.meta.history)
        if th.name != name:
            raise CorruptError(f"{where} names {th.name!r}, the index {name!r}")
        if th.block_count != len(e.blocks):
            raise CorruptError(f"tensor {name!r} has {th.block_count} blocks, the index lists {len(e.blocks)}")
        if self._inline_blocks and (th.inline_at is not None) != (len(e.blocks) == 1 and e.blocks[0].size == 0):
            raise CorruptError(f"{where}: INLINE_BLOCK is {int(th.inline_at is not None)}, but the index "
                               f"{'does not give' if th.inline_at is not None else 'gives'} its block the size 0")
        return th, payload

    def _inline_block(self, name: str, th: records.TensorHeader | None = None) -> LoadedBlock:
        """The tensor's inline block (§7), checked: the last of its TENS record's checks (``th``: its
        header, where the caller has it)."""
        th = th or self.header(name)
        payload = self._inline.pop(name, None)
        if payload is None:   # loaded before: read again
            payload = self._read_tensor(name)[1]
        e = self._entry(name)
        where = f"TENS at offset {e.tens_offset} (tensor {name!r} inline block)"
        return LoadedBlock(records.parse_block(payload, th, self._ordinal[name], 0, where, e.blocks[0].encoding),
                           payload)

    def _check_inline_block(self, name: str, th: records.TensorHeader | None = None) -> None:
        """Check the tensor's inline block now, if it has one not yet checked (it is held until loaded)."""
        th = th or self.header(name)
        if th.inline_at is not None and name not in self._checked:
            self._checked[name] = self._inline_block(name, th)

    def release_blocks(self, names) -> None:
        """Forget the inline blocks read (and checked) with these tensors' headers; each is read again
        when it is loaded. For a caller that bounds memory by dropping the bytes they came from."""
        for n in names:
            self._inline.pop(n, None)
            self._checked.pop(n, None)

    def _entry(self, name):
        try:
            return self.entries[name]
        except KeyError:
            raise MissingTensorError(f"no tensor {name!r} in this file") from None

    def load_block(self, name: str, b: int) -> LoadedBlock:
        """Block ``b`` of a tensor, read and checked (checksum, header fields), not decoded."""
        e = self._entry(name)
        th = self.header(name)
        try:
            b = operator.index(b)
        except TypeError:
            b = -1
        if not 0 <= b < th.block_count:
            raise InputError(f"tensor {name!r} has {th.block_count} blocks; there is no block {b!r}")
        if th.inline_at is not None:   # checked by selection (held until first loaded), or now
            return self._checked.pop(name, None) or self._inline_block(name)
        ref = e.blocks[b]
        _, payload = self._read_record(ref.offset, ref.size, L.BLCK, ref.checksum)
        where = f"BLCK at offset {ref.offset} (tensor {name!r} block {b})"
        info = records.parse_block(payload, th, self._ordinal[name], b, where, ref.encoding)
        return LoadedBlock(info, payload)

    # -- decoding (every path goes through arcfmt.pipeline)
    def check_base(self, name: str, base, previous=None) -> np.ndarray | None:
        """The base tensor's unsigned flat view, after checking it is the one the file names (and,
        first, the tensor's inline block: the last of its TENS record's checks, SPEC §7); for a tensor
        with HISTORY (1.9), then its ``previous`` value or :class:`~arcfmt.history.History`."""
        self._check_inline_block(name)
        return self._check_inputs(self.header(name), base, previous)

    def _check_inputs(self, th: records.TensorHeader, base, previous, missing=None) -> np.ndarray | None:
        """§12.3 step 1: the base, then the previous step (kept for :meth:`item`). ``missing``: where a
        previous step that was not given is noted (by name), not raised — :meth:`selection` raises it
        once every base has passed, so that a lost history never hides a wrong base (the same
        category either way, §15)."""
        base_u = pipeline.check_base(th, base)
        try:
            history = pipeline.check_previous(th, base_u, previous)
        except MissingPreviousError as exc:
            if missing is None:
                raise
            missing[th.name] = exc
            return base_u
        if history is not None:
            self._histories[th.name] = history
        return base_u

    def item(self, name: str, base_u) -> pipeline.Item:
        """The pipeline item of one tensor (``base_u`` from :meth:`check_base` or :meth:`selection`)."""
        th = self.header(name)
        refs = self._entry(name).blocks
        return pipeline.Item(th, base_u, [functools.partial(self._load, name, b) for b in range(th.block_count)],
                             [r.encoding for r in refs], self._ordinal[name], self._histories.get(name))

    def _load(self, name: str, b: int):
        lb = self.load_block(name, b)
        return lb.info, lb.payload

    def selection(self, base, names=None, *, workers: int = 1, keyframe: bool = False,
                  previous: Mapping | None = None,
                  early: Callable[[list[records.TensorHeader]], None] | None = None) -> tuple[list, dict, bool]:
        """``(names, checked bases, whole)`` for ``names`` (all when None): every wanted tensor's
        header and base are checked (§12.1 step 6), and — when every tensor is wanted — the digests
        (§12.3 step 4), all before any block is decoded; ``previous`` (name → previous value or
        :class:`~arcfmt.history.History`) serves tensors with HISTORY (1.9). ``workers`` threads hash the bases (xxhash
        and a memory map's page faults run outside the GIL); the first failure in file order wins
        (§12.1 step 6, R-CHECK-ORDER); ``names`` come back in the caller's order. ``early``: called
        with the wanted headers (file order) once every one is read and the large bases are queued
        for the helpers, while the rest of the checks are still to be made (see :class:`pipeline.Early`);
        it must raise nothing."""
        wanted = self.names if names is None else list(dict.fromkeys(names))
        for n in wanted:
            self._entry(n)
        base = {} if base is None else base
        # §12.1 step 6 checks tensor by tensor, its header then its base. The same first failure is
        # found in two passes: every header in file order up to the first that fails, then the bases
        # before it — the large ones spread over the threads, largest first, so the calling thread's
        # first step is a long hash outside the GIL and the helpers start at once (handing them bases
        # one by one between headers left them waiting for the GIL) — and a base failure before the
        # failed header wins, the earliest in file order.
        in_file_order = wanted if names is None else sorted(wanted, key=self._ordinal.__getitem__)
        headers: list[records.TensorHeader] = []
        failed: Exception | None = None
        for n in in_file_order:
            try:
                headers.append(self.header(n))
            except Exception as exc:  # noqa: BLE001 - raised once the bases before it are checked
                failed = exc
                break
        # a keyframe object's tensors need no base (a stream's rule, S9.4 step 2), checked where a base is
        prev = {} if previous is None else previous
        if not isinstance(prev, Mapping):
            raise InputError("previous must be a mapping of tensor name to array or History")
        missing: dict[str, Exception] = {}
        if keyframe:
            jobs = [Job(_needs_no_base, (th, None)) for th in headers]
        else:
            jobs = [Job(self._check_inputs, (th, base.get(th.name) if th.needs_base else None,
                                             prev.get(th.name) if th.needs_history else None, missing))
                    for th in headers]
        batch = Batch(workers)
        inline_failed: tuple[int, Exception] | None = None
        try:
            shared = sorted((i for i, th in enumerate(headers) if batch.shared and th.needs_base
                             and th.size >= SHARED_MIN_ELEMS), key=lambda i: -headers[i].size)
            for i in shared:
                batch.submit(jobs[i])
            if shared:
                batch.handoff()   # the checks below are Python: let a helper take the GIL and start now
            if early is not None and failed is None:   # behind the bases' hashes in the helpers' queue
                early(headers)
            # while the helpers hash the large bases, this thread checks the inline blocks: the last of
            # each TENS record's checks, before its base (§7, §12.1 step 6)
            for i, th in enumerate(headers):
                try:
                    self._check_inline_block(th.name, th)
                except Exception as exc:  # noqa: BLE001 - raised in file order below
                    inline_failed = (i, exc)
                    break
            for job in [jobs[i] for i in shared] + jobs:  # the large ones (this thread takes any left), then the rest
                batch.wait(job)
        finally:
            batch.close()
        bases: dict[str, np.ndarray | None] = {}
        # A previous step not given (wrong_base) is raised where the next failure of another category
        # would be, or at the end: a wrong base after it is reported first (the same category), so a
        # follower never mistakes a folder changed by hand for a lost history.
        first_missing: Exception | None = None
        for i, (th, job) in enumerate(zip(headers, jobs)):
            if inline_failed is not None and inline_failed[0] == i:
                raise first_missing or inline_failed[1]
            if job.error is not None:
                raise job.error
            if first_missing is None:
                first_missing = missing.get(th.name)
            bases[th.name] = cast("np.ndarray | None", job.result)
        if first_missing is not None:
            raise first_missing
        if failed is not None:
            raise failed
        whole = set(wanted) == set(self.names)
        if whole:
            self.check_digests()
        return wanted, bases, whole

    def changes(self, name: str) -> bool:
        """Whether the tensor's bytes differ from its base: it needs none, or a block is not the base's."""
        return not self.header(name).needs_base or not all(
            encodings.keeps_base(r.encoding) for r in self._entry(name).blocks)

    def check_digests(self) -> None:
        """§12.3 step 4, from the tensor headers (see :func:`arcfmt.pipeline.check_digests`)."""
        pipeline.check_digests([self.header(n) for n in self.names], self.index)

    def output_budget(self, headers) -> int:
        """Bytes of output this reader may allocate for ``headers``: ``max_output_bytes`` when the
        caller gave it; by default the tensors backed by a base of the same size (the caller holds
        that much already) plus a bound scaled to the file (:func:`pipeline.default_output_budget`)."""
        if self.max_output_bytes is not None:
            return self.max_output_bytes
        backed = sum(h.size * h.dtype.itemsize for h in headers if h.needs_base)
        return backed + pipeline.default_output_budget(self.source.size)

    def decode_tensor(self, name: str, base_u: np.ndarray | None, out: np.ndarray | None = None) -> np.ndarray:
        """Rebuild and verify one tensor as a flat unsigned view, into ``out`` when given.

        ``base_u`` must come from :meth:`check_base`. ``out`` is written before the tensor is
        verified: give a buffer nobody reads until this returns (for live arrays use
        :func:`arcfmt.apply_in_place`, which stages).
        """
        th = self.header(name)
        if out is None:
            out = pipeline.allocate_all([th], [self.output_budget([th])])[0]
        sink = _IntoSink(out)
        for _ in pipeline.run([self.item(name, base_u)], sink, workers=self.workers):
            pass
        return out

    def to_array(self, name: str, flat_u: np.ndarray) -> np.ndarray:
        """The flat unsigned view :meth:`decode_tensor` returns, as the tensor's dtype and shape (a view,
        no copy). :meth:`decode` does check, decode and this in one call."""
        th = self.header(name)
        return flat_u.view(th.dtype.numpy).reshape(th.shape)

    def decode_all(self, base, names=None, *, framework: str | None = None, device: Any = None,
                   previous: Mapping | None = None) -> dict:
        """Rebuild the tensors (all, or ``names``) against ``base`` (a mapping); every check of SPEC §12.3.
        ``previous``: the previous step (name → array or :class:`~arcfmt.history.History`), which the
        tensors with HISTORY need (1.9, §7).

        All base tensors (and, for the whole file, the digests) are checked before any block's
        result is used; meanwhile the helpers start on the largest tensors' blocks, and nothing of
        them is exposed or reported unless every check passes. Blocks decode in parallel threads.
        Torch base tensors give torch tensors back;
        ``framework``/``device`` as for :func:`arcfmt.decode`.
        """
        given = {} if base is None else base
        # more shared blocks in flight than run's default: their buffers are the arena, allocated
        # already, so this costs only their loaded payloads, and the helpers never wait for this
        # thread to hand them the next block (measured against twice ``workers``: decodes of the
        # small models 3-11 % faster); as many are started early, while the checks are made
        window = DECODE_WINDOW_PER_WORKER * self.workers
        started: list[pipeline.Early] = []

        def start_early(headers: list[records.TensorHeader]) -> None:
            # outputs allocated now are backed by what the caller holds: every base of its tensor's size
            # (not yet checked), or none of it starts (a base missing or of another shape is the
            # error these checks will report: nothing to start for)
            views = {}
            for th in headers:
                u = pipeline.base_structure(th, given.get(th.name)) if th.needs_base else None
                if th.needs_base and u is None:
                    return
                views[th.name] = u
            try:
                sink = pipeline.ArraySink(self.output_budget(headers), headers)
            except (LimitError, MemoryError):   # raised after the checks, if they pass
                return
            started.append(pipeline.Early(sink, self.workers, window))   # closed below, whatever happens next
            self.start_early(started[-1], headers, views)

        try:
            wanted, bases, _ = self.selection(base, names, workers=self.workers, previous=previous,
                                              early=start_early if self.workers > 1 else None)
            headers = [self.header(n) for n in wanted]
            early = started[0] if started else None
            sink = early.sink if early is not None else pipeline.ArraySink(self.output_budget(headers), headers)
            order = [h.name for h in sorted(headers, key=lambda h: -h.size)]  # largest first: threads finish together
            done = dict(pipeline.run([self.item(n, bases[n]) for n in order], sink, workers=self.workers,
                                     window=window, early=early))
        finally:
            for e in started:
                e.close()
        from .api import as_framework

        return as_framework({n: done[n] for n in wanted}, base, framework, device)

    def start_early(self, early: pipeline.Early, headers: list[records.TensorHeader],
                    views: Mapping[str, np.ndarray | None]) -> None:
        """The largest tensors' first blocks started by ``early`` (as many as it may), for
        :func:`pipeline.run` to complete, while :meth:`selection` checks the rest (its ``early``
        callback). ``views``: the tensors to start, each with its base's flat view of its dtype and
        shape (:func:`pipeline.base_structure`, its hash still being checked; None: it needs none).
        One with history or an inline block (checked with its header by selection) is not started.
        The caller holds ``early`` before this is called, and closes it whatever this raises (a
        Ctrl-C while a block loads)."""
        for th in sorted(headers, key=lambda h: -h.size):
            if early.left <= 0 or th.size < SHARED_MIN_ELEMS:   # (a tensor's first blocks, at the end)
                break
            if th.name in views and th.inline_at is None and not th.needs_history:
                early.start(self.item(th.name, views[th.name]))

    def decode(self, name: str, base=None, *, framework: str | None = None, device: Any = None, previous=None):
        """One tensor, rebuilt and verified: random access to a single tensor of the file.

        ``base``: that tensor's base (an array), or the whole base mapping (its ``name`` entry is
        used); None for a tensor that needs no base. Checks the base against the file's hash,
        decodes only this tensor's blocks and verifies the result; the model digests, which cover
        every tensor, are checked by :meth:`decode_all`. Returns an array of the tensor's dtype and
        shape (numpy; torch for a torch base or ``framework="pt"``, as :func:`arcfmt.decode`).
        ``previous``: likewise, its previous value or history (a tensor with HISTORY, 1.9)."""
        from .api import as_framework

        one = base.get(name) if isinstance(base, Mapping) else base
        prev = previous.get(name) if isinstance(previous, Mapping) else previous
        out = self.decode_all({} if one is None else {name: one}, [name], framework="np",
                              previous=None if prev is None else {name: prev})
        return as_framework(out, base, framework, device)[name]

    # -- description
    def describe(self) -> dict:
        """Everything ``arcfmt inspect`` shows: identity, and per tensor its blocks and streams."""
        tensors = []
        for _i, name in enumerate(self.names):
            th = self.header(name)
            e = self.entries[name]
            blocks: list[dict[str, Any]] = []  # JSON-like, as describe() returns it
            for b in range(th.block_count):
                lb = self.load_block(name, b)
                blocks.append(dict(
                    encoding=encodings.get(lb.info.encoding).name, changed=lb.info.changed,
                    inline=th.inline_at is not None,
                    # an inline block's bytes are those it takes of its TENS record
                    record_bytes=len(lb.payload) - th.inline_at if th.inline_at is not None else e.blocks[b].size,
                    streams=[dict(codec=codecs.get(s.codec).name, stored=s.stored, decoded=s.decoded)
                             for s in lb.info.streams]))
            changed = [b["changed"] for b in blocks]
            tensors.append(dict(
                name=name, dtype=th.dtype.name, shape=list(th.shape), elements=th.size,
                needs_base=th.needs_base, block_elems=th.block_elems,
                changed=None if any(c is None for c in changed) else sum(changed),
                bytes=e.tens_size + sum(r.size for r in e.blocks),
                encodings=sorted({b["encoding"] for b in blocks}), blocks=blocks))
        return dict(
            format_version=f"{self.version[0]}.{self.version[1]}", file_bytes=self.source.size,
            prefixed_names=self.meta.prefixed_names, compact_index=self.index.compact,
            inline_blocks=self.index.inline_blocks,
            base_step=self.base_step, target_step=self.target_step,
            base_digest=self.base_digest.hex(), target_digest=self.target_digest.hex(),
            index_bytes=self.source.size - L.TRAILER_SIZE - self.index_offset, tensors=tensors)


# --------------------------------------------------------------------------------------- streaming

class StreamReader:
    """Front-to-back reading without the index (SPEC.md §12.2): yields ``(name, array)`` per tensor.

    Each tensor is verified before it is yielded, but the file as a whole is only valid once the
    iteration has finished (index cross-checked, trailer checked): commit nothing before that.
    Torch base tensors give torch tensors; ``framework``/``device`` as for :func:`arcfmt.decode`.
    """

    def __init__(self, fileobj, base=None, *, max_output_bytes: int | None = None,
                 framework: str | None = None, device: Any = None, previous: Mapping | None = None):
        """``previous``: the previous step (name → array or :class:`~arcfmt.history.History`), which
        the tensors with HISTORY need (1.9, §7)."""
        from .api import wants_torch

        self._f = fileobj
        self._previous = {} if previous is None else previous
        if not isinstance(self._previous, Mapping):
            raise InputError("previous must be a mapping of tensor name to array or History")
        self._explicit_budget = max_output_bytes
        self._base = {} if base is None else base
        self._torch = wants_torch(self._base, framework)   # checked now: a bad value fails before any read
        if device is not None and not self._torch:
            raise InputError("device= is for torch output: pass framework='pt' (or torch base tensors)")
        self._device = device
        if self._torch:
            from .api import as_framework

            as_framework({}, self._base, "pt", device)        # torch missing: InputError now
            # where each tensor goes: the device of its torch base tensor, else of the first one (once,
            # not per tensor: a model has thousands)
            tb = {k: v for k, v in self._base.items() if type(v).__module__.split(".", 1)[0] == "torch"} \
                if isinstance(self._base, Mapping) else {}
            self._torch_base = tb
            self._torch_first = {next(iter(tb)): next(iter(tb.values()))} if tb else {}
        self._pos = 0
        self.meta: records.Meta | None = None      # each set as the iteration reads it
        self.index: records.Index | None = None
        self.version: tuple[int, int] | None = None

    def _default_budget(self) -> int:
        """Output allowed beyond what bases back: scaled to the file when its size can be learnt."""
        size = None
        try:
            size = os.fstat(self._f.fileno()).st_size
        except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
            getbuffer = getattr(self._f, "getbuffer", None)
            if getbuffer is not None:
                size = getbuffer().nbytes
        return pipeline.DEFAULT_MIN_OUTPUT if not size else pipeline.default_output_budget(size)

    def _read(self, n: int, what: str) -> bytes:
        chunks = []
        got = 0
        while got < n:
            chunk = self._f.read(n - got)
            if not chunk:
                raise TruncatedError(f"input ends inside {what} at offset {self._pos + got} "
                                     f"({got} of {n} bytes)")
            chunks.append(chunk)
            got += len(chunk)
        self._pos += n
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def _record(self):
        offset = self._pos
        head_bytes = self._read(L.RECORD_HEADER_SIZE, "a record header")
        head = records.parse_record_head(head_bytes, offset)
        payload = memoryview(self._read(head.length, f"record {head.type!r}"))
        records.verify_record(head, head_bytes, payload, offset)
        return offset, head, payload

    def __iter__(self):
        budget = pipeline.ArraySink(self._default_budget() if self._explicit_budget is None
                                    else self._explicit_budget)
        self._backed = self._explicit_budget is None
        if not self._torch:
            yield from pipeline.run(self._items(budget), budget, verify_last=False)   # §12.2 step 3
            return
        from .api import as_framework

        for name, arr in pipeline.run(self._items(budget), budget, verify_last=False):
            one = {name: self._torch_base[name]} if name in self._torch_base else self._torch_first
            yield name, as_framework({name: arr}, one, "pt", self._device)[name]

    def _listed(self, head) -> int | None:
        """A record's checksum as its index lists it: none in a compact index (§10.1, §12.2 step 6)."""
        return None if self._compact else head.checksum

    def _critical(self):
        """The next critical record (ancillary ones are noted and skipped, §12.2 step 2)."""
        while True:
            offset, head, payload = self._record()
            if head.critical:
                if head.type == L.META:
                    raise CorruptError(f"second META record at offset {offset}")
                return offset, head, payload
            self._others.append(records.OtherRecord(offset, head.length + L.RECORD_HEADER_SIZE, head.type))

    def _blocks(self, th, entry, ordinal, inline):
        """Loaders of a tensor's blocks, each read from the stream when the pipeline asks for it; an
        inline block (``(info, payload)``, read with the TENS record) needs no read."""
        if inline is not None:
            yield functools.partial(tuple, inline)
            return
        for b in range(th.block_count):
            offset, head, payload = self._critical()
            if head.type != L.BLCK:
                raise CorruptError(f"record {head.type.decode()} at offset {offset}: tensor {th.name!r} "
                                   f"still needs blocks {b}..{th.block_count - 1}")
            where = f"BLCK at offset {offset} (tensor {th.name!r} block {b})"
            info = records.parse_block(payload, th, ordinal, b, where)
            entry.blocks.append(records.BlockRef(offset, head.length + L.RECORD_HEADER_SIZE, self._listed(head),
                                                 info.encoding))
            yield functools.partial(tuple, (info, payload))

    def _items(self, sink):
        head = self._f.read(L.HEADER_SIZE)
        while 0 < len(head) < L.HEADER_SIZE:
            more = self._f.read(L.HEADER_SIZE - len(head))
            if not more:
                break
            head += more
        self._pos = len(head)
        header = records.check_header(head)  # a short header is `truncated` or `bad_magic` (§12.1)
        self.version = header.version
        self._compact = header.compact_index
        offset, head, payload = self._record()
        if head.type != L.META:
            raise CorruptError(f"first record at offset {offset} is {head.type!r}, not META")
        self.meta = records.parse_meta(payload)
        seen: list[records.IndexEntry] = []   # per tensor, as found
        headers = []
        names = set()
        name_bytes = 0
        self._others: list[records.OtherRecord] = []  # ancillary records seen
        while True:
            offset, head, payload = self._critical()
            if head.type == L.BLCK:
                raise CorruptError(f"BLCK at offset {offset} before any TENS record, or after its tensor's "
                                   f"last block")
            if head.type == L.INDX:
                index = records.parse_index(payload, offset, header.compact_index, header.inline_blocks)
                break
            th = records.parse_tensor(payload, f"TENS at offset {offset}", self.meta.prev_name(seen, len(seen)),
                                      header.inline_blocks, self.meta.history)
            raw = th.name.encode("utf-8")
            if raw in names:
                raise CorruptError(f"TENS at offset {offset}: duplicate tensor name {th.name!r}")
            name_bytes += len(raw)
            if name_bytes > L.MAX_INDEX_BYTES:   # §12.2 step 3: the names remembered stay bounded
                raise LimitError(f"TENS at offset {offset}: the names read add up to more than MAX_INDEX_BYTES "
                                 f"({L.MAX_INDEX_BYTES}), more than an index can hold")
            names.add(raw)
            entry = records.IndexEntry(th.name, offset, head.length + L.RECORD_HEADER_SIZE, self._listed(head), [])
            seen.append(entry)
            headers.append(th)
            inline = None
            if th.inline_at is not None:   # §7: checked with its TENS record, before the base
                info = records.parse_block(payload, th, len(seen) - 1, 0,
                                           f"TENS at offset {offset} (tensor {th.name!r} inline block)")
                entry.blocks.append(records.BlockRef(offset, 0, None, info.encoding))
                inline = (info, payload)
            base_u = pipeline.check_base(th, self._base.get(th.name) if th.needs_base else None)
            history = pipeline.check_previous(th, base_u, self._previous.get(th.name) if th.needs_history else None)
            if self._backed and th.needs_base:
                sink.budget[0] += th.size * th.dtype.itemsize  # as large as the base the caller holds
            yield pipeline.Item(th, base_u, self._blocks(th, entry, len(seen) - 1, inline), history=history)
        trailer_bytes = self._read(L.TRAILER_SIZE, "the trailer")
        end = self._pos
        if self._f.read(1):
            raise CorruptError(f"data after the trailer at offset {end}")
        trailer = records.check_trailer(trailer_bytes, end)
        records.trailer_agrees(trailer, header)
        if trailer.index_offset != offset:
            raise CorruptError(f"the trailer places the index at {trailer.index_offset}, not at {offset}")
        if [(e.name, e.tens_offset, e.tens_size, e.tens_checksum, e.blocks) for e in index.entries] != \
                [(e.name, e.tens_offset, e.tens_size, e.tens_checksum, e.blocks) for e in seen] \
                or index.others != self._others:
            raise CorruptError("the index does not describe the records of the file")
        pipeline.check_digests(headers, index)
        self.index = index


def _needs_no_base(th: records.TensorHeader, base: object) -> None:
    """A keyframe object's tensor: ``corrupt`` where it would need a base (SPEC.md S9.4 step 2)."""
    if th.needs_base:
        raise CorruptError(f"tensor {th.name!r} of a keyframe object needs a base")


class _IntoSink:
    """The sink of :meth:`DeltaReader.decode_tensor`: one caller-given flat buffer."""

    def __init__(self, out):
        self.out = out

    def open(self, th):
        return pipeline._ArrayTensor(th, self.out)
