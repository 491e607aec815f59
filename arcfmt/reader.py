"""Readers: random access through a tiny byte-range interface, and front-to-back streaming.

Parsing never touches I/O directly: everything goes through a ``ByteSource`` (``size`` and
``read(offset, length)``), so the same reader serves memory, local files and fsspec range reads.
"""
from __future__ import annotations

import os
import threading
from collections import deque
from dataclasses import dataclass

import numpy as np

from . import layout as L, records, transforms
import xxhash

from .arrays import as_uint, release
from .errors import (
    ArcError, CorruptError, InputError, LimitError, TruncatedError, VerificationError, WrongBaseError,
)
from .integrity import model_digest, tensor_hash
from .parallel import run_jobs


# --------------------------------------------------------------------------------------- sources

class BufferSource:
    """Byte ranges of an in-memory buffer (bytes, bytearray, memoryview, mmap)."""

    def __init__(self, data):
        self._mv = memoryview(data).cast("B")
        self.size = len(self._mv)

    def read(self, offset: int, length: int):
        if offset < 0 or length < 0 or offset + length > self.size:
            raise TruncatedError(f"read of {length} bytes at offset {offset} runs past the end of the "
                                 f"{self.size}-byte input")
        return self._mv[offset: offset + length]


class FileSource:
    """Byte ranges of a seekable binary file object (local or fsspec); reads are serialised."""

    def __init__(self, fileobj, size: int | None = None):
        self._f = fileobj
        self._lock = threading.Lock()
        if size is None:
            with self._lock:
                size = fileobj.seek(0, os.SEEK_END)
        self.size = size

    def read(self, offset: int, length: int):
        if offset < 0 or length < 0 or offset + length > self.size:
            raise TruncatedError(f"read of {length} bytes at offset {offset} runs past the end of the "
                                 f"{self.size}-byte input")
        with self._lock:
            self._f.seek(offset)
            data = self._f.read(length)
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


# --------------------------------------------------------------------------------------- memory

def physical_memory() -> int:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 1 << 40


def allocate_all(headers: list, budget: list) -> list:
    """Output buffers for several tensors, each refused (LimitError) past the caller's budget.

    They are 64-byte aligned views into one allocation: the kernel maps (and zeroes) one region, with
    huge pages where it can, instead of one per tensor — page faults are a large share of decoding.
    """
    need, offsets, total, used = [], [], 0, 0  # used: tensor bytes, counted against the budget
    for th in headers:
        n = th.size * th.dtype.itemsize
        if n > budget[0] - used:
            raise LimitError(f"tensor {th.name!r} needs {n} bytes of output, more than the {budget[0] - used} "
                             f"left of this decoder's output budget (max_output_bytes)")
        offsets.append(total)
        need.append(n)
        used += n
        total += n + (-n % 64)  # alignment padding is not output
    try:
        arena = np.empty(max(total, 1), np.uint8)
    except MemoryError:
        raise LimitError(f"cannot allocate {total} bytes of output") from None
    budget[0] -= used
    return [arena[o:o + n].view(th.dtype.uint) for th, o, n in zip(headers, offsets, need)]


def allocate(th: records.TensorHeader, budget: list) -> np.ndarray:
    """The output buffer of a tensor, refused (LimitError) when it would exceed the caller's memory budget.

    A file can declare tensors far larger than itself (unchanged or highly compressible blocks), so the
    bound is the memory the caller allows, never what the file says (SPEC.md §17).
    """
    return allocate_all([th], budget)[0]


# --------------------------------------------------------------------------------------- reader

@dataclass
class LoadedBlock:
    info: records.BlockInfo
    payload: memoryview


class DeltaReader:
    """Random access to an arcfmt file: trailer → index → only the records asked for."""

    def __init__(self, source, *, workers: int | None = None, max_output_bytes: int | None = None):
        self.source = open_source(source)
        self.max_output_bytes = physical_memory() if max_output_bytes is None else max_output_bytes
        self.workers = workers or min(8, os.cpu_count() or 1)
        size = self.source.size
        if size < L.HEADER_SIZE:
            records.check_header(self.source.read(0, size))
        self.version = records.check_header(self.source.read(0, L.HEADER_SIZE))
        min_size = L.HEADER_SIZE + records.META_RECORD_SIZE + L.RECORD_HEADER_SIZE + L.TRAILER_SIZE
        if size < min_size:
            raise TruncatedError(f"file of {size} bytes is shorter than the smallest arcfmt file ({min_size})")
        trailer = records.check_trailer(self.source.read(size - L.TRAILER_SIZE, L.TRAILER_SIZE), size)
        if (trailer.major, trailer.minor) != self.version:
            raise CorruptError(f"header says version {self.version[0]}.{self.version[1]}, trailer "
                               f"{trailer.major}.{trailer.minor}")
        self.index_offset = trailer.index_offset
        head, payload = self._read_record(trailer.index_offset, trailer.index_size, L.INDX)
        self.index = records.parse_index(payload, trailer.index_offset)
        for o in self.index.others:  # learn the true type of every record the index lists (§12.1 step 4)
            head = records.parse_record_head(self.source.read(o.offset, L.RECORD_HEADER_SIZE), o.offset)
            if head.type != o.type or head.length != o.size - L.RECORD_HEADER_SIZE:
                raise CorruptError(f"record at offset {o.offset} is {head.type!r} of {head.length} bytes; "
                                   f"the index says {o.type!r} of {o.size - L.RECORD_HEADER_SIZE}")
        _, meta = self._read_record(L.HEADER_SIZE, records.META_RECORD_SIZE, L.META)
        self.meta = records.parse_meta(meta)
        self.entries = {e.name: e for e in self.index.entries}
        self._ordinal = {e.name: i for i, e in enumerate(self.index.entries)}
        self._headers = {}

    # -- identity
    @property
    def base_step(self):
        return self.meta.base_step

    @property
    def target_step(self):
        return self.meta.target_step

    @property
    def base_digest(self) -> bytes:
        return self.index.base_digest

    @property
    def target_digest(self) -> bytes:
        return self.index.target_digest

    @property
    def names(self) -> list[str]:
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
        th = self._headers.get(name)
        if th is None:
            e = self._entry(name)
            _, payload = self._read_record(e.tens_offset, e.tens_size, L.TENS, e.tens_checksum)
            th = records.parse_tensor(payload, f"TENS at offset {e.tens_offset}")
            if th.name != name:
                raise CorruptError(f"TENS at offset {e.tens_offset} names {th.name!r}, the index {name!r}")
            if th.block_count != len(e.blocks):
                raise CorruptError(f"tensor {name!r} has {th.block_count} blocks, the index lists {len(e.blocks)}")
            self._headers[name] = th
        return th

    def _entry(self, name):
        try:
            return self.entries[name]
        except KeyError:
            raise KeyError(f"no tensor {name!r} in this file") from None

    def load_block(self, name: str, b: int) -> LoadedBlock:
        e = self._entry(name)
        th = self.header(name)
        ref = e.blocks[b]
        _, payload = self._read_record(ref.offset, ref.size, L.BLCK, ref.checksum)
        where = f"BLCK at offset {ref.offset} (tensor {name!r} block {b})"
        info = records.parse_block(payload, th, self._ordinal[name], b, where, ref.encoding)
        return LoadedBlock(info, payload)

    # -- decoding
    def check_base(self, name: str, base) -> np.ndarray | None:
        """The base tensor's unsigned flat view, after checking it is the one the file names."""
        th = self.header(name)
        if not th.needs_base:
            return None
        if base is None:
            raise WrongBaseError(f"tensor {name!r} needs its base, which was not given")
        dt, shape, u = as_uint(base)
        if dt is not th.dtype or tuple(shape) != th.shape:
            raise WrongBaseError(f"base tensor {name!r} is {dt.name}{list(shape)}, the file expects "
                                 f"{th.dtype.name}{list(th.shape)}")
        if tensor_hash(u) != th.base_hash:
            raise WrongBaseError(f"base tensor {name!r} does not match the base this delta was made from "
                                 f"(hash {tensor_hash(u):016x}, expected {th.base_hash:016x})")
        return u

    def decode_block_into(self, name: str, b: int, base_u, out: np.ndarray) -> None:
        """Decode block ``b`` of a tensor into the matching slice of the flat ``out``."""
        s, e = self.header(name).block_range(b)
        self.decode_block_into_buffer(name, b, None if base_u is None else base_u[s:e], out[s:e])

    def decode_block_into_buffer(self, name: str, b: int, base_block, out_block: np.ndarray) -> None:
        """Decode block ``b`` given only that block of the base, into a block-sized buffer."""
        th = self.header(name)
        lb = self.load_block(name, b)
        s, e = th.block_range(b)
        where = f"tensor {name!r} block {b}"
        streams = records.decode_block_streams(lb.payload, lb.info, where)
        try:
            transforms.decode_block(th.dtype, lb.info.encoding, lb.info.params, streams, e - s, base_block, out_block)
        except ArcError as exc:
            raise type(exc)(f"{where}: {exc}") from None

    def _decode_verify_block(self, name: str, b: int, base_u, out: np.ndarray) -> None:
        """Decode a block; a tensor of one block is verified right away, in the same thread."""
        self.decode_block_into(name, b, base_u, out)
        if self.header(name).block_count == 1:
            self.verify_tensor(name, out)

    def verify_tensor(self, name: str, out: np.ndarray) -> None:
        if tensor_hash(out) != self.header(name).target_hash:
            raise VerificationError(f"tensor {name!r}: reconstructed bytes do not match the target hash")

    def decode_tensor(self, name: str, base_u: np.ndarray | None, out: np.ndarray | None = None,
                      pool=None) -> np.ndarray:
        """Rebuild and verify one tensor as a flat unsigned view (``out`` may be ``base_u``: in place).

        ``base_u`` must come from :meth:`check_base`. Blocks are decoded in parallel when a pool is
        given, hashed in order as they complete, and — for memory-mapped inputs and outputs — their
        pages are released as soon as they are done, so a tensor larger than RAM streams through.
        """
        th = self.header(name)
        if out is None:
            out = allocate(th, [self.max_output_bytes])
        h = xxhash.xxh3_64()
        window = max(2, 2 * self.workers)
        pending = deque()

        def finish(b):
            s, e = th.block_range(b)
            h.update(memoryview(out[s:e]).cast("B"))
            release(out[s:e])
            if base_u is not None and base_u is not out:
                release(base_u[s:e])

        for b in range(th.block_count):
            if pool is None or th.block_count == 1:
                self.decode_block_into(name, b, base_u, out)
                finish(b)
                continue
            pending.append((b, pool.submit(self.decode_block_into, name, b, base_u, out)))
            while len(pending) >= window:
                pb, f = pending.popleft()
                f.result()
                finish(pb)
        while pending:
            pb, f = pending.popleft()
            f.result()
            finish(pb)
        if h.intdigest() != th.target_hash:
            raise VerificationError(f"tensor {name!r}: reconstructed bytes do not match the target hash")
        return out

    def to_array(self, name: str, flat_u: np.ndarray) -> np.ndarray:
        th = self.header(name)
        return flat_u.view(th.dtype.numpy).reshape(th.shape)

    def decode_all(self, base, names=None) -> dict:
        """Rebuild the tensors (all, or ``names``) against ``base`` (a mapping); every check of SPEC §12.3.

        All base tensors are checked before any block is decoded; blocks decode in parallel threads.
        """
        wanted = self.names if names is None else list(names)
        bases = {n: self.check_base(n, base.get(n) if self.header(n).needs_base else None) for n in wanted}
        budget = [self.max_output_bytes]
        outs = dict(zip(wanted, allocate_all([self.header(n) for n in wanted], budget)))
        # largest first, so the threads finish together
        order = sorted(wanted, key=lambda n: -self.header(n).size)
        jobs = [(self._decode_verify_block, n, b, bases[n], outs[n])
                for n in order for b in range(self.header(n).block_count)]
        run_jobs(jobs, self.workers, elems=[self.header(job[1]).block_len(job[2]) for job in jobs])
        run_jobs([(self.verify_tensor, n, outs[n]) for n in order if self.header(n).block_count > 1], self.workers)
        result = {n: self.to_array(n, outs[n]) for n in wanted}
        if names is None:
            self.check_target_digest(result)
            self.check_base_digest()
        return result

    def check_target_digest(self, tensors: dict) -> None:
        entries = []
        for n, a in tensors.items():
            th = self.header(n)
            entries.append((n.encode("utf-8"), th.dtype.code, th.shape, th.target_hash))
        if model_digest(entries) != self.index.target_digest:
            raise VerificationError("the rebuilt model does not match the target digest in the index")

    def check_base_digest(self) -> None:
        entries = []
        for n in self.names:
            th = self.header(n)
            if th.needs_base:
                entries.append((n.encode("utf-8"), th.dtype.code, th.shape, th.base_hash))
        expect = model_digest(entries) if entries else bytes(16)
        if expect != self.index.base_digest:
            raise CorruptError("the base digest in the index does not match the tensors' base hashes")

    # -- description
    def describe(self) -> dict:
        """Everything ``arcfmt inspect`` shows: identity, and per tensor its blocks and streams."""
        tensors = []
        for i, name in enumerate(self.names):
            th = self.header(name)
            e = self.entries[name]
            blocks = []
            for b in range(th.block_count):
                lb = self.load_block(name, b)
                blocks.append(dict(
                    encoding=transforms.NAMES[lb.info.encoding], changed=lb.info.changed,
                    record_bytes=e.blocks[b].size,
                    streams=[dict(codec=codecs_names[s.codec], stored=s.stored, decoded=s.decoded)
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
            base_step=self.base_step, target_step=self.target_step,
            base_digest=self.base_digest.hex(), target_digest=self.target_digest.hex(),
            index_bytes=self.source.size - L.TRAILER_SIZE - self.index_offset, tensors=tensors)


codecs_names = {0: "raw", 1: "zstd", 2: "xz", 3: "bz2"}


# --------------------------------------------------------------------------------------- streaming

class StreamReader:
    """Front-to-back reading without the index (SPEC.md §12.2): yields ``(name, array)`` per tensor.

    Each tensor is verified before it is yielded, but the file as a whole is only valid once the
    iteration has finished (index cross-checked, trailer checked): commit nothing before that.
    """

    def __init__(self, fileobj, base=None, *, max_output_bytes: int | None = None):
        self._f = fileobj
        self._budget = physical_memory() if max_output_bytes is None else max_output_bytes
        self._base = {} if base is None else base
        self._pos = 0
        self.meta = None
        self.index = None
        self.version = None

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
        head = self._f.read(L.HEADER_SIZE)
        while 0 < len(head) < L.HEADER_SIZE:
            more = self._f.read(L.HEADER_SIZE - len(head))
            if not more:
                break
            head += more
        self._pos = len(head)
        self.version = records.check_header(head)  # a short header is `truncated` or `bad_magic` (§12.1)
        offset, head, payload = self._record()
        if head.type != L.META:
            raise CorruptError(f"first record at offset {offset} is {head.type!r}, not META")
        self.meta = records.parse_meta(payload)
        seen = []          # IndexEntry per tensor, as found
        names = set()
        current = None     # (TensorHeader, base_u, out, next block)
        others = []        # ancillary records seen
        target_entries = []
        base_hashes = []
        while True:
            offset, head, payload = self._record()
            if not head.critical:
                others.append(records.OtherRecord(offset, head.length + 16, head.type))
                continue
            if head.type == L.META:
                raise CorruptError(f"second META record at offset {offset}")
            if current is not None and head.type != L.BLCK:
                th = current[0]
                raise CorruptError(f"record {head.type.decode()} at offset {offset}: tensor {th.name!r} "
                                   f"still needs blocks {current[3]}..{th.block_count - 1}")
            if head.type == L.TENS:
                th = records.parse_tensor(payload, f"TENS at offset {offset}")
                raw = th.name.encode("utf-8")
                if raw in names:
                    raise CorruptError(f"TENS at offset {offset}: duplicate tensor name {th.name!r}")
                names.add(raw)
                seen.append(records.IndexEntry(th.name, offset, head.length + 16, head.checksum, []))
                target_entries.append((raw, th.dtype.code, th.shape, th.target_hash))
                base_hashes.append(th.base_hash)
                base_u = self._check_base(th)
                out = allocate(th, [self._budget])
                current = (th, base_u, out, 0)
                if th.block_count == 0:
                    yield self._finish(current)
                    current = None
            elif head.type == L.BLCK:
                if current is None:
                    raise CorruptError(f"BLCK at offset {offset} before any TENS record")
                th, base_u, out, b = current
                where = f"BLCK at offset {offset} (tensor {th.name!r} block {b})"
                info = records.parse_block(payload, th, len(seen) - 1, b, where)
                seen[-1].blocks.append(records.BlockRef(offset, head.length + 16, head.checksum, info.encoding))
                streams = records.decode_block_streams(payload, info, where)
                s, e = th.block_range(b)
                transforms.decode_block(th.dtype, info.encoding, info.params, streams, e - s,
                                        None if base_u is None else base_u[s:e], out[s:e])
                current = (th, base_u, out, b + 1)
                if b + 1 == th.block_count:
                    yield self._finish(current)
                    current = None
            elif head.type == L.INDX:
                index = records.parse_index(payload, offset)
                break
        trailer_bytes = self._read(L.TRAILER_SIZE, "the trailer")
        end = self._pos
        if self._f.read(1):
            raise CorruptError(f"data after the trailer at offset {end}")
        trailer = records.check_trailer(trailer_bytes, end)
        if (trailer.major, trailer.minor) != self.version or trailer.index_offset != offset:
            raise CorruptError("trailer does not match the header version or the index position")
        if [(e.name, e.tens_offset, e.tens_size, e.tens_checksum, e.blocks) for e in index.entries] != \
                [(e.name, e.tens_offset, e.tens_size, e.tens_checksum, e.blocks) for e in seen] \
                or index.others != others:
            raise CorruptError("the index does not describe the records of the file")
        if model_digest(target_entries) != index.target_digest:
            raise VerificationError("the rebuilt model does not match the target digest in the index")
        base_entries = [(n, c, sh, bh) for (n, c, sh, _), bh in zip(target_entries, base_hashes) if bh is not None]
        if (model_digest(base_entries) if base_entries else bytes(16)) != index.base_digest:
            raise CorruptError("the base digest in the index does not match the tensors' base hashes")
        self.index = index

    def _check_base(self, th):
        if not th.needs_base:
            return None
        base = self._base.get(th.name)
        if base is None:
            raise WrongBaseError(f"tensor {th.name!r} needs its base, which was not given")
        dt, shape, u = as_uint(base)
        if dt is not th.dtype or tuple(shape) != th.shape or tensor_hash(u) != th.base_hash:
            raise WrongBaseError(f"base tensor {th.name!r} does not match the base this delta was made from")
        return u

    @staticmethod
    def _finish(current):
        th, _, out, _ = current
        if tensor_hash(out) != th.target_hash:
            raise VerificationError(f"tensor {th.name!r}: reconstructed bytes do not match the target hash")
        return th.name, out.view(th.dtype.numpy).reshape(th.shape)
