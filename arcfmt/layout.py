"""Every byte layout of SPEC.md in one place, each defined once, and every size derived from it.

- **Fixed structures** — the file header (§4), the record header (§5), META (§6), the trailer (§11) —
  and the index (§10) are construct definitions. The size constants below are computed from them.
  The record header (met once per record) is parsed and built, and the file header, META and the
  trailer (met on every file open) are parsed, through their ``struct`` forms, which are derived from
  the construct definitions (:func:`_packed`), not written out a second time.
- **TENS (§7) and BLCK (§8)**, met once per tensor and once per block, are defined by the hand-written
  functions of this module (:func:`parse_tensor_payload`, :func:`build_tensor_payload`,
  :func:`parse_block_head`, :func:`build_block_head`): that code is their only definition.
  ``TensorPayload`` and ``BlockPayload`` are constructs that call it, for code that composes constructs
  (``TensorPayload``: the whole-name form, a file without PREFIXED_NAMES; a prefixed TENS record needs
  the previous name, which only :func:`parse_tensor_payload` takes).
  Why not construct for these two: uncompiled it costs 4–7× the hand-written code per record; compiled
  (``.compile()``, even with every custom field given an emitted parser) still 2–4.5×, and compiled
  fields no longer check that their bytes are there (``Bytes`` emits an unchecked ``io.read`` and
  returns fewer bytes; integers raise ``struct.error``, not a construct error). tests/test_layout_fast.py
  keeps the tables of §7 and §8 as declarative construct structs and checks the definition against
  them on random inputs, field by field and error by error.

Payload bytes (compressed streams) never pass through construct: a block's structure ends with its
stream table, and the caller slices the payload as a memoryview. Construct is used uncompiled, and
every count it loops over is bounded by the bytes available.
"""
from __future__ import annotations

import re
import struct as _struct
from collections import namedtuple
from collections.abc import Callable, Iterable, Sequence
from typing import Any, BinaryIO, TypeAlias

import numpy as np
import numpy.typing as npt
from construct import (
    Adapter,
    Bytes,
    Construct,
    Container,
    FormatField,
    GreedyBytes,
    Int8ul,
    Int16ul,
    Int32ul,
    Int64ul,
    Struct,
    Tell,
    this,
)
from construct.core import (
    ConstructError,
    StreamError,
    stream_read,
    stream_read_entire,
    stream_seek,
    stream_tell,
    stream_write,
)

from .errors import CorruptError, InputError, LimitError

# What the parsers read: a record's bytes as a source gives them (bytes, or a view of a buffer or mmap).
BytesLike: TypeAlias = bytes | bytearray | memoryview

MAGIC = b"\x8aARC\r\n\x1a\n"
TRAILER_MAGIC = b"\x8aARCEND\n"
MAJOR = 1
MINOR = 10
NO_STEP = 0xFFFF_FFFF_FFFF_FFFF
RECORD_TYPE_SIZE = 4   # a record type: four ASCII letters (§5)
DIGEST_SIZE = 16       # a model digest, xxh3-128 (§13.2), as the index holds it (§10)

# Limits (SPEC.md §14)
MAX_NAME_BYTES = 1024
MAX_DIMS = 16
MAX_TENSOR_ELEMS = 1 << 40
MAX_BLOCK_ELEMS = 1 << 24
MAX_BLOCKS_PER_TENSOR = 1 << 24
MAX_TENSORS = 1 << 20
MAX_OTHER_RECORDS = 1 << 20
MAX_RECORD_PAYLOAD = 1 << 28
MAX_INDEX_BYTES = 1 << 26
MAX_BLOCKS = MAX_INDEX_BYTES // 21   # block_count of a compact index: what a full one's columns can hold (§14)
MAX_WINDOW = 1 << 27
MAX_XZ_MEMORY = 1 << 27

# Record types (SPEC.md §5)
META, TENS, BLCK, INDX, NOTE = b"META", b"TENS", b"BLCK", b"INDX", b"note"
RECORD_TYPE_RE = re.compile(rb"[A-Za-z]{%d}\Z" % RECORD_TYPE_SIZE)  # a valid type: four ASCII letters
_CRITICAL_FIRST, _CRITICAL_LAST = ord("A"), ord("Z")


def is_critical(rtype: bytes) -> bool:
    """A critical record type — its first letter is upper case — which a decoder must know (§5)."""
    return _CRITICAL_FIRST <= rtype[0] <= _CRITICAL_LAST


# Header flags
COMPACT_INDEX = 0x01   # (1.5) the index lists sizes only: TENS/BLCK offsets derived, no checksum columns (§10.1)
INLINE_BLOCKS = 0x02   # (1.6, only with COMPACT_INDEX) a tensor of one block carries it in its TENS record (§7)
HEADER_FLAGS = COMPACT_INDEX | INLINE_BLOCKS   # the header's and the trailer's defined flag bits (§4, §11)
# TENS flags
NEEDS_BASE = 0x01
INLINE_BLOCK = 0x02   # (1.6, with the header's INLINE_BLOCKS) the tensor's only block ends its payload (§7)
TENS_HISTORY = 0x04   # (1.9, with META's HISTORY) the tensor needs its previous step: previous_hash follows (§7)
# META flags
PREFIXED_NAMES = 0x01  # (1.3) each TENS name is stored after the bytes it shares with the previous name
META_HISTORY = 0x02    # (1.9) TENS records may carry HISTORY (§6, §7)
META_FLAGS = PREFIXED_NAMES | META_HISTORY


# ------------------------------------------------------------------------------------ varints

def read_varint(next_byte: Callable[[], int]) -> int:
    """One canonical varint (SPEC.md §1) from ``next_byte()``; the checks every varint reader shares."""
    value = 0
    for i in range(10):
        byte = next_byte()
        value |= (byte & 0x7F) << (7 * i)
        if not byte & 0x80:
            if i > 0 and byte == 0:
                raise CorruptError("non-minimal varint")
            if value >= 1 << 64:
                raise CorruptError("varint value beyond 2**64-1")
            return value
    raise CorruptError("varint longer than 10 bytes")


def _short(what: str) -> str:
    """The message of a structure cut short (made only when raised: a reader parses records by the thousand)."""
    return f"{what}: structure runs past the end of its bytes"


def _varint_at(buf: BytesLike, pos: int, what: str) -> tuple[int, int]:
    """The varint at ``buf[pos]`` and the position after it: ``read_varint``'s checks and messages.

    Varints of one to three bytes (nearly all of a file's: counts, lengths, params) are read here
    without a loop; anything else — longer, non-minimal, or cut short — goes through the checked reader.
    """
    try:
        b = buf[pos]
        if b < 0x80:
            return b, pos + 1
        c = buf[pos + 1]
        if 0 < c < 0x80:
            return (b & 0x7F) | c << 7, pos + 2
        if c >= 0x80:
            d = buf[pos + 2]
            if 0 < d < 0x80:
                return (b & 0x7F) | (c & 0x7F) << 7 | d << 14, pos + 3
    except IndexError:
        pass
    at = [pos]

    def next_byte() -> int:
        if at[0] >= len(buf):
            raise CorruptError(_short(what))
        at[0] += 1
        return buf[at[0] - 1]
    return read_varint(next_byte), at[0]


_ONE_BYTE_VARINTS = [bytes((v,)) for v in range(0x80)]


def varint_bytes(v: int) -> bytes:
    """The canonical varint of ``v`` (SPEC.md §1); InputError outside 0..2**64-1."""
    if 0 <= v < 0x80:   # most params and lengths of small blocks: a writer builds thousands a step
        return _ONE_BYTE_VARINTS[v]
    if 0 < v < 0x4000:   # most of the rest (class counts, short streams' lengths): two bytes, no loop
        return bytes((v & 0x7F | 0x80, v >> 7))
    if not 0 <= v < 1 << 64:
        raise InputError(f"value {v} does not fit a varint (0..2**64-1)")
    out = bytearray()
    while v > 0x7F:
        out.append(v & 0x7F | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


# construct ships no annotations: to mypy its classes are Any (pyproject.toml: ignore_missing_imports)
class CanonicalVarInt(Construct):  # type: ignore[misc]  # subclassing Construct, which mypy sees as Any
    """Unsigned LEB128, at most 10 bytes, value < 2**64, minimal encoding (SPEC.md §1)."""

    def _parse(self, stream: BinaryIO, context: Container, path: str) -> int:
        return read_varint(lambda: stream_read(stream, 1, path)[0])

    def _build(self, obj: int, stream: BinaryIO, context: Container, path: str) -> int:
        out = varint_bytes(obj)
        stream_write(stream, out, len(out), path)
        return obj


VarInt = CanonicalVarInt()


# ------------------------------------------------------------------------------------ fixed structures

FileHeader = Struct(        # §4
    "magic" / Bytes(len(MAGIC)),
    "major" / Int16ul,
    "minor" / Int16ul,
    "flags" / Int32ul,
)

RecordHeader = Struct(      # §5
    "type" / Bytes(RECORD_TYPE_SIZE),
    "length" / Int32ul,
    "checksum" / Int64ul,   # xxh3-64 of the header bytes before this field, then the payload
)

MetaPayload = Struct(       # §6
    "flags" / Int32ul,          # bit 0 PREFIXED_NAMES (1.3), bit 1 HISTORY (1.9)
    "base_step" / Int64ul,
    "target_step" / Int64ul,
)

Trailer = Struct(           # §11
    "index_offset" / Int64ul,
    "index_size" / Int64ul,
    "major" / Int16ul,
    "minor" / Int16ul,
    "flags" / Int32ul,
    "checksum" / Int64ul,   # xxh3-64 of the trailer bytes before this field
    "magic" / Bytes(len(TRAILER_MAGIC)),
)


def _offset(con: Struct, field: str) -> int:
    """Where ``field`` starts in a fixed-size construct Struct."""
    at = 0
    for sc in con.subcons:
        if sc.name == field:
            return at
        at += sc.sizeof()
    raise KeyError(field)


def _packed(con: Struct, stop: str | None = None) -> _struct.Struct:
    """The ``struct`` form of a construct Struct of fixed-size little-endian fields (up to ``stop``):
    the same layout, parsed and built in one call."""
    fmt = "<"
    for sc in con.subcons:
        if sc.name == stop:
            break
        f = sc.subcon
        if isinstance(f, FormatField) and f.fmtstr[0] == "<":
            fmt += f.fmtstr[1:]
        elif isinstance(f, Bytes) and isinstance(f.length, int):
            fmt += f"{f.length}s"
        else:
            raise TypeError(f"field {sc.name!r} has no fixed little-endian struct form")
    return _struct.Struct(fmt)


def _fixed_parser(con: Struct, kind: str) -> Callable[[BytesLike], Any]:
    """``con.parse`` through its ``struct`` form: the fields by name (a named tuple) from one unpack.
    Why: construct parses a three-field struct in ~8-13 µs, and every file open parses three of them."""
    packed = _packed(con)
    fields = namedtuple(kind, [sc.name for sc in con.subcons])  # type: ignore[misc]  # names from the definition

    def parse(data: BytesLike) -> Any:
        if len(data) < packed.size:
            raise CorruptError(f"{kind}: structure runs past the end of its bytes")
        return fields._make(packed.unpack_from(data, 0))
    parse.__doc__ = f"The fields of ``{kind}`` at the start of ``data`` (as ``{kind}.parse``, in one unpack)."
    return parse


parse_file_header = _fixed_parser(FileHeader, "FileHeader")
parse_meta_payload = _fixed_parser(MetaPayload, "MetaPayload")
parse_trailer = _fixed_parser(Trailer, "Trailer")


# Sizes (SPEC.md §3–§12), computed from the definitions above
HEADER_SIZE = FileHeader.sizeof()                          # 16: the file header (§4)
RECORD_HEADER_SIZE = RecordHeader.sizeof()                 # 16: a record's size is this + its length (§5)
RECORD_CHECKED_SIZE = _offset(RecordHeader, "checksum")    # 8: record header bytes its checksum covers (§5)
META_PAYLOAD_SIZE = MetaPayload.sizeof()                   # 20 (§6)
META_RECORD_SIZE = RECORD_HEADER_SIZE + META_PAYLOAD_SIZE  # 36: the META record, at offset HEADER_SIZE (§3)
# 52: header and META; where the records the index locates start (§10 check 5), the least index_offset (§11)
FIRST_RECORD_OFFSET = HEADER_SIZE + META_RECORD_SIZE
TRAILER_SIZE = Trailer.sizeof()                            # 40: the file's last bytes (§11)
TRAILER_CHECKED_SIZE = _offset(Trailer, "checksum")        # 24: trailer bytes its checksum covers (§11)
# 108: the smallest file — header, META, an INDX record header, trailer (§12.1 step 2)
MIN_FILE_SIZE = FIRST_RECORD_OFFSET + RECORD_HEADER_SIZE + TRAILER_SIZE
NO_BASE_DIGEST = bytes(DIGEST_SIZE)  # the base digest of a file in which no tensor needs a base (§10)


# ------------------------------------------------------------------------------------ record header

_RECORD_HEAD = _packed(RecordHeader)                        # "<4sLQ"
_RECORD_CHECKED = _packed(RecordHeader, stop="checksum")    # "<4sL"
_U64 = _struct.Struct("<Q")


class RecordHeaderFields:
    __slots__ = ("type", "length", "checksum")

    def __init__(self, rtype: bytes, length: int, checksum: int) -> None:
        self.type, self.length, self.checksum = rtype, length, checksum


def parse_record_header(data: BytesLike) -> RecordHeaderFields:
    """``RecordHeader`` of the first ``RECORD_HEADER_SIZE`` bytes of ``data``."""
    if len(data) < RECORD_HEADER_SIZE:
        raise CorruptError("record header: structure runs past the end of its bytes")
    return RecordHeaderFields(*_RECORD_HEAD.unpack_from(data, 0))


def record_checked_bytes(rtype: bytes, length: int) -> bytes:
    """Bytes ``[0, RECORD_CHECKED_SIZE)`` of a record header (type, length): what its checksum covers
    ahead of the payload (§5)."""
    if len(rtype) != RECORD_TYPE_SIZE:
        raise InputError(f"record type {rtype!r} is not {RECORD_TYPE_SIZE} bytes")
    return _RECORD_CHECKED.pack(rtype, length)


def build_record_header(rtype: bytes, length: int, checksum: int) -> bytes:
    """``RecordHeader`` built from these fields."""
    return record_checked_bytes(rtype, length) + _U64.pack(checksum)


def frame_record(rtype: bytes, payload: BytesLike, checksum_of: Callable[[bytes, BytesLike], int]) -> bytes:
    """A whole record: its header, ``checksum_of(checked header bytes, payload)`` in the checksum field,
    then the payload."""
    if len(rtype) != RECORD_TYPE_SIZE:
        raise InputError(f"record type {rtype!r} is not {RECORD_TYPE_SIZE} bytes")
    checked = _RECORD_CHECKED.pack(rtype, len(payload))
    return checked + _U64.pack(checksum_of(checked, payload)) + bytes(payload)


# ------------------------------------------------------------------------------------ TENS (§7)
# The definition of the TENS payload:
#   name_length varint | name | dtype u8 | ndim u8 | dims ndim x varint | block_elems varint | flags u8 |
#   base_hash u64 (only with NEEDS_BASE) | previous_hash u64 (only with HISTORY, in a file whose META has
#   HISTORY: elsewhere bit 2 is reserved and brings no field, 1.9) | target_hash u64
# and, in a file whose META has PREFIXED_NAMES (1.3), the name as prefix_length varint | name_length
# varint | name: the first prefix_length bytes of the previous tensor's name (``prev``), then these.
# Read with the checks §7 makes while reading: prefix_length beyond the previous name (corrupt), the
# name's length > MAX_NAME_BYTES (limit, before the name), ndim > MAX_DIMS (limit, before the dims), a
# field past the end (corrupt). ``_end``: bytes consumed.

class TensorFields:
    __slots__ = ("name", "dtype", "ndim", "dims", "block_elems", "flags", "base_hash", "previous_hash",
                 "target_hash", "_end")

    def __init__(self, name: bytes, dtype: int, ndim: int, dims: list[int], block_elems: int, flags: int,
                 base_hash: int | None, target_hash: int, end: int, previous_hash: int | None = None) -> None:
        self.name, self.dtype, self.ndim, self.dims, self.block_elems = name, dtype, ndim, dims, block_elems
        self.flags, self.base_hash, self.target_hash, self._end = flags, base_hash, target_hash, end
        self.previous_hash = previous_hash


def parse_tensor_payload(payload: BytesLike, what: str, prev: bytes | None = None,
                         history: bool = False) -> TensorFields:
    """The fields of a TENS payload; errors are prefixed with ``what``. ``prev``: the previous tensor's
    name (``b""`` for the first) in a file with PREFIXED_NAMES; None in one without. ``history``: the
    file's META has HISTORY (1.9), so a tensor with the flag has ``previous_hash``."""
    buf = payload if isinstance(payload, (bytes, bytearray)) else bytes(payload)
    k, pos = (0, 0) if prev is None else _varint_at(buf, 0, what)
    if prev is not None and k > len(prev):
        raise CorruptError(f"{what}: name shares {k} bytes with the previous tensor's name, which has "
                           f"{len(prev)}")
    n, pos = _varint_at(buf, pos, what)
    if n > MAX_NAME_BYTES - k:   # as §7 writes it: no sum of two u64 (k <= MAX_NAME_BYTES by now)
        raise LimitError(f"tensor name of {k + n} bytes exceeds MAX_NAME_BYTES ({MAX_NAME_BYTES})")
    if pos + n + 2 > len(buf):
        raise CorruptError(_short(what))
    name = bytes(buf[pos:pos + n])
    if prev is not None and k:
        name = prev[:k] + name
    pos += n
    dtype, ndim = buf[pos], buf[pos + 1]
    pos += 2
    if ndim > MAX_DIMS:
        raise LimitError(f"ndim {ndim} exceeds its limit {MAX_DIMS}")
    dims = []
    for _ in range(ndim):
        v, pos = _varint_at(buf, pos, what)
        dims.append(v)
    block_elems, pos = _varint_at(buf, pos, what)
    if pos >= len(buf):
        raise CorruptError(_short(what))
    flags = buf[pos]
    pos += 1
    base_hash: int | None = None
    if flags & NEEDS_BASE:
        if pos + 8 > len(buf):
            raise CorruptError(_short(what))
        base_hash = _U64.unpack_from(buf, pos)[0]
        pos += 8
    previous_hash: int | None = None
    if history and flags & TENS_HISTORY:
        if pos + 8 > len(buf):
            raise CorruptError(_short(what))
        previous_hash = _U64.unpack_from(buf, pos)[0]
        pos += 8
    if pos + 8 > len(buf):
        raise CorruptError(_short(what))
    target_hash = _U64.unpack_from(buf, pos)[0]
    pos += 8
    return TensorFields(name, dtype, ndim, dims, block_elems, flags, base_hash, target_hash, pos, previous_hash)


def _shared_prefix(a: bytes, b: bytes) -> int:
    """How many first bytes ``a`` and ``b`` share: a binary search of slice compares (a writer asks
    once per tensor; ``os.path.commonprefix`` walks the names a byte at a time in Python)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) >> 1
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def build_tensor_payload(name: bytes, dtype: int, dims: Sequence[int], block_elems: int, flags: int,
                         base_hash: int | None, target_hash: int, prev: bytes | None = None,
                         previous_hash: int | None = None) -> bytes:
    """The TENS payload of these fields (``base_hash`` is written only with ``NEEDS_BASE`` in ``flags``,
    ``previous_hash`` only with HISTORY); with ``prev`` (PREFIXED_NAMES), the name after the bytes it
    shares with ``prev``."""
    if prev is None:
        parts = [varint_bytes(len(name)), name]
    else:
        k = _shared_prefix(prev, name)
        parts = [varint_bytes(k), varint_bytes(len(name) - k), name[k:]]
    parts.append(bytes((dtype, len(dims))))
    parts += [varint_bytes(d) for d in dims]
    parts += [varint_bytes(block_elems), bytes((flags,))]
    if flags & NEEDS_BASE:
        assert base_hash is not None, "NEEDS_BASE in flags without a base_hash"
        parts.append(base_hash.to_bytes(8, "little"))
    if flags & TENS_HISTORY:
        assert previous_hash is not None, "HISTORY in flags without a previous_hash"
        parts.append(previous_hash.to_bytes(8, "little"))
    parts.append(target_hash.to_bytes(8, "little"))
    return b"".join(parts)


# ------------------------------------------------------------------------------------ BLCK (§8)
# The definition of a BLCK payload's head (the stream data follows it):
#   tensor varint | block varint | encoding u8 | params: varints, as many as the encoding says |
#   streams: one (codec u8, stored length varint) per stream, as many as the encoding and dtype say
# An inline block (1.6, §7) is the same from ``encoding`` on, at the end of a TENS payload: read from
# ``start`` with ``ordinals=False`` (``tensor`` and ``block`` are then None).
# The counts come from the caller: ``param_count(encoding, params read so far)`` (called before the
# first param, and again each time as many params as it last gave have been read — so after the
# last, and wherever the count depends on a param just read; it rejects an unknown or unfit encoding
# before any param is read) and ``stream_count(encoding, params)``. ``_end``: where the stream data
# starts.

class BlockFields:
    __slots__ = ("tensor", "block", "encoding", "params", "streams", "_end")

    def __init__(self, tensor: int | None, block: int | None, encoding: int, params: list[int],
                 streams: list[tuple[int, int]], end: int) -> None:
        self.tensor, self.block, self.encoding, self.params, self.streams, self._end = \
            tensor, block, encoding, params, streams, end


def parse_block_head(payload: BytesLike, what: str, param_count: Callable[[int, list[int]], int],
                     stream_count: Callable[[int, list[int]], int], start: int = 0,
                     ordinals: bool = True) -> BlockFields:
    """The head of a BLCK payload (from ``start``; an inline block: ``ordinals=False``), its counts given
    by ``param_count`` and ``stream_count``; errors are prefixed with ``what``."""
    # read in place: a block's payload holds its stream data too (megabytes), which a copy would move
    if isinstance(payload, (bytes, bytearray)):
        buf: BytesLike = payload
    else:
        mv = memoryview(payload)
        buf = mv.cast("B") if mv.c_contiguous else mv.tobytes()
    n = len(buf)
    tensor: int | None = None
    block: int | None = None
    pos = start
    if ordinals:
        tensor, pos = _varint_at(buf, pos, what)
        block, pos = _varint_at(buf, pos, what)
    if pos >= n:
        raise CorruptError(_short(what))
    encoding = buf[pos]
    pos += 1
    params: list[int] = []
    add = params.append
    count = param_count(encoding, params)
    while len(params) < count:
        for _ in range(count - len(params)):
            # one- and two-byte varints (nearly every param): _varint_at's first cases, inline
            b = buf[pos] if pos < n else 0x80
            if b < 0x80:
                add(b)
                pos += 1
                continue
            c = buf[pos + 1] if pos + 1 < n else 0
            if 0 < c < 0x80:
                add((b & 0x7F) | c << 7)
                pos += 2
            else:
                v, pos = _varint_at(buf, pos, what)
                add(v)
        count = param_count(encoding, params)   # as many as it said: ask again (it may depend on these)
    streams = []
    for _ in range(stream_count(encoding, params)):
        if pos >= n:
            raise CorruptError(_short(what))
        codec = buf[pos]
        length, pos = _varint_at(buf, pos + 1, what)
        streams.append((codec, length))
    return BlockFields(tensor, block, encoding, params, streams, pos)


def build_block_head(tensor: int | None, block: int | None, encoding: int, params: Iterable[int],
                     streams: Iterable[tuple[int, int]]) -> bytes:
    """The head of a BLCK payload: these fields, params and ``(codec, stored length)`` streams as given;
    an inline block's (``tensor`` and ``block`` None) starts at ``encoding``."""
    parts = [] if tensor is None or block is None else [varint_bytes(tensor), varint_bytes(block)]
    parts.append(bytes((encoding,)))
    parts += map(varint_bytes, params)
    for codec, length in streams:
        parts += [bytes((codec,)), varint_bytes(length)]
    return b"".join(parts)


class _Defined(Construct):  # type: ignore[misc]  # subclassing Construct, which mypy sees as Any
    """A construct that parses and builds with one of the hand-written definitions above.

    Parsing reads the rest of the stream and leaves it after the bytes the structure consumed; the
    parse keywords (BLCK: ``param_count``, ``stream_count``) reach the definition."""

    def __init__(self, parse_fn: Callable[[bytes, Container], TensorFields | BlockFields],
                 build_fn: Callable[[Container], bytes]) -> None:
        super().__init__()
        self._parse_fn = parse_fn
        self._build_fn = build_fn

    def _parse(self, stream: BinaryIO, context: Container, path: str) -> TensorFields | BlockFields:
        start = stream_tell(stream, path)
        out = self._parse_fn(stream_read_entire(stream, path), context._params)
        stream_seek(stream, start + out._end, 0, path)
        return out

    def _build(self, obj: Container, stream: BinaryIO, context: Container, path: str) -> Container:
        data = self._build_fn(obj)
        stream_write(stream, data, len(data), path)
        return obj


TensorPayload = _Defined(
    lambda data, kw: parse_tensor_payload(data, "TENS"),
    lambda o: build_tensor_payload(o["name"], o["dtype"], o["dims"], o["block_elems"], o["flags"],
                                   o.get("base_hash"), o["target_hash"]))

BlockPayload = _Defined(
    lambda data, kw: parse_block_head(data, "BLCK", kw.param_count, kw.stream_count),
    lambda o: build_block_head(o["tensor"], o["block"], o["encoding"], o["params"], o["streams"]))


# ------------------------------------------------------------------------------------ INDX (§10)

def _checked_count(con: NumpyColumn, context: Container) -> int:
    """The element count of a counted construct (``count``, ``limit``, ``what``), refused past its limit."""
    count = con.count(context) if callable(con.count) else con.count
    if con.limit is not None and count > con.limit:
        raise LimitError(f"{con.what} {count} exceeds its limit {con.limit}")
    return count


class NumpyColumn(Construct):  # type: ignore[misc]  # subclassing Construct, which mypy sees as Any
    """``count`` fixed-width little-endian values read in one step as a read-only numpy view.

    Keeps large index columns out of per-element construct parsing; the byte count is checked
    against what the stream holds before anything is allocated.
    """

    def __init__(self, count: int | Callable[[Container], int], dtype: npt.DTypeLike, limit: int | None = None,
                 what: str = "count") -> None:
        super().__init__()
        self.count = count
        self.dtype = np.dtype(dtype)
        self.limit = limit
        self.what = what

    def _parse(self, stream: BinaryIO, context: Container, path: str) -> np.ndarray:
        count = _checked_count(self, context)
        nbytes = count * self.dtype.itemsize
        here = stream.tell()
        stream.seek(0, 2)
        available = stream.tell() - here
        stream.seek(here)
        if nbytes > available:
            raise StreamError(f"column of {count} values needs {nbytes} bytes, {available} left", path=path)
        return np.frombuffer(stream_read(stream, nbytes, path), self.dtype)

    def _build(self, obj: npt.ArrayLike, stream: BinaryIO, context: Container, path: str) -> npt.ArrayLike:
        data = np.ascontiguousarray(obj, dtype=self.dtype).tobytes()
        stream_write(stream, data, len(data), path)
        return obj


IndexPayload = Struct(
    "codec" / Int8ul,
    "body_length" / VarInt,
    "body" / GreedyBytes,
)

IndexBody = Struct(
    "base_digest" / Bytes(DIGEST_SIZE),
    "target_digest" / Bytes(DIGEST_SIZE),
    "tensor_count" / Int32ul,
    "block_count" / Int64ul,
    "name_lengths" / NumpyColumn(this.tensor_count, "<u4", MAX_TENSORS, "tensor_count"),
    "names" / Bytes(lambda ctx: int(np.sum(ctx.name_lengths, dtype=np.uint64))),
    "tens_offsets" / NumpyColumn(this.tensor_count, "<u8"),
    "tens_sizes" / NumpyColumn(this.tensor_count, "<u4"),
    "tens_checksums" / NumpyColumn(this.tensor_count, "<u8"),
    "tens_block_counts" / NumpyColumn(this.tensor_count, "<u8"),
    "blk_offsets" / NumpyColumn(this.block_count, "<u8"),
    "blk_sizes" / NumpyColumn(this.block_count, "<u4"),
    "blk_checksums" / NumpyColumn(this.block_count, "<u8"),
    "blk_encodings" / NumpyColumn(this.block_count, "u1"),
    "other_count" / Int32ul,
    "other_offsets" / NumpyColumn(this.other_count, "<u8", MAX_OTHER_RECORDS, "other_count"),
    "other_sizes" / NumpyColumn(this.other_count, "<u4"),
    "other_types" / NumpyColumn(this.other_count, f"S{RECORD_TYPE_SIZE}"),
    "_end" / Tell,
)

# The columns a compact index (header flag COMPACT_INDEX, §10.1) leaves out: the offsets it derives
# from the sizes, and the checksums the records carry themselves.
FULL_INDEX_ONLY = ("tens_offsets", "tens_checksums", "blk_offsets", "blk_checksums")


class _AtMost(Adapter):  # type: ignore[misc]  # subclassing Adapter, which mypy sees as Any
    """An integer field refused (``limit``) past ``limit`` as soon as it is read, before what it counts."""

    def __init__(self, subcon: Construct, limit: int, what: str) -> None:
        super().__init__(subcon)
        self.limit, self.what = limit, what

    def _decode(self, obj: int, context: Container, path: str) -> int:
        if obj > self.limit:
            raise LimitError(f"{self.what} {obj} exceeds its limit {self.limit}")
        return obj

    def _encode(self, obj: int, context: Container, path: str) -> int:
        return obj


# Five bytes a block: without a count bound a few KB of compressed body could declare 13M blocks
# (§14 MAX_BLOCKS, R-INDEX-COUNTS.BLOCKS)
CompactIndexBody = Struct(*(
    "block_count" / _AtMost(Int64ul, MAX_BLOCKS, "block_count") if sc.name == "block_count" else sc
    for sc in IndexBody.subcons if sc.name not in FULL_INDEX_ONLY))


def index_body(compact: bool) -> Struct:
    """The index body's layout: full, or compact (header flag ``COMPACT_INDEX``, §10)."""
    return CompactIndexBody if compact else IndexBody


def parse(struct: Construct, data: bytes, what: str, **params: object) -> Container:
    """Parse with construct, turning its exceptions into CorruptError that names the structure."""
    try:
        return struct.parse(data, **params)
    except StreamError as exc:
        raise CorruptError(_short(what)) from exc
    except ConstructError as exc:
        raise CorruptError(f"{what}: {exc}") from exc
