"""Every byte layout of SPEC.md in one place, as construct definitions that both parse and build.

Payload bytes (compressed streams) never pass through construct: the block structure parses only
its small header and stream table, and the caller slices the payload as a memoryview.
Construct is used uncompiled, and every count it loops over is bounded by the bytes available.
"""
from __future__ import annotations


from construct import (
    Bytes, Construct, GreedyBytes, If, Int8ul, Int16ul, Int32ul, Int64ul, Struct, Tell, this,
)
import numpy as np
from construct.core import ConstructError, StreamError, stream_read, stream_write

from .errors import CorruptError, InputError, LimitError

MAGIC = b"\x8aARC\r\n\x1a\n"
TRAILER_MAGIC = b"\x8aARCEND\n"
MAJOR = 1
MINOR = 1
HEADER_SIZE = 16
TRAILER_SIZE = 40
RECORD_HEADER_SIZE = 16
NO_STEP = 0xFFFF_FFFF_FFFF_FFFF

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
MAX_WINDOW = 1 << 27
MAX_XZ_MEMORY = 1 << 27

# Record types (SPEC.md §5)
META, TENS, BLCK, INDX, NOTE = b"META", b"TENS", b"BLCK", b"INDX", b"note"

# TENS flags
NEEDS_BASE = 0x01


def read_varint(next_byte) -> int:
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


class CanonicalVarInt(Construct):
    """Unsigned LEB128, at most 10 bytes, value < 2**64, minimal encoding (SPEC.md §1)."""

    def _parse(self, stream, context, path):
        return read_varint(lambda: stream_read(stream, 1, path)[0])

    def _build(self, obj, stream, context, path):
        out = varint_bytes(obj)
        stream_write(stream, out, len(out), path)
        return obj


VarInt = CanonicalVarInt()


def _read_varint(stream, path) -> int:
    return VarInt._parse(stream, None, path)


def _checked_count(con, context) -> int:
    """The element count of a counted construct (``count``, ``limit``, ``what``), refused past its limit."""
    count = con.count(context) if callable(con.count) else con.count
    if con.limit is not None and count > con.limit:
        raise LimitError(f"{con.what} {count} exceeds its limit {con.limit}")
    return count


class VarIntArray(Construct):
    """``count`` canonical varints in one construct (a block's params, a tensor's dims)."""

    def __init__(self, count, limit=None, what="count"):
        super().__init__()
        self.count = count
        self.limit = limit
        self.what = what

    def _parse(self, stream, context, path):
        return [_read_varint(stream, path) for _ in range(_checked_count(self, context))]

    def _build(self, obj, stream, context, path):
        for v in obj:
            VarInt._build(v, stream, context, path)
        return obj


class BlockParams(VarIntArray):
    """A block's params: the encoding says how many, possibly only after reading the first of them."""

    def __init__(self, count):
        super().__init__(count)  # count: (context, params read so far) -> total number of params

    def _parse(self, stream, context, path):
        out = []
        while len(out) < self.count(context, out):
            out.append(_read_varint(stream, path))
        return out


class Name(Construct):
    """A tensor name: varint byte length (checked against MAX_NAME_BYTES before reading), then the bytes."""

    def _parse(self, stream, context, path):
        n = _read_varint(stream, path)
        if n > MAX_NAME_BYTES:
            raise LimitError(f"tensor name of {n} bytes exceeds MAX_NAME_BYTES ({MAX_NAME_BYTES})")
        return stream_read(stream, n, path)

    def _build(self, obj, stream, context, path):
        VarInt._build(len(obj), stream, context, path)
        stream_write(stream, obj, len(obj), path)
        return obj


class StreamTable(Construct):
    """A block's stream table: ``count`` pairs of (codec ``u8``, stored length varint)."""

    def __init__(self, count):
        super().__init__()
        self.count = count

    def _parse(self, stream, context, path):
        count = self.count(context) if callable(self.count) else self.count
        out = []
        for _ in range(count):
            codec = stream_read(stream, 1, path)[0]
            out.append((codec, _read_varint(stream, path)))
        return out

    def _build(self, obj, stream, context, path):
        for codec, length in obj:
            stream_write(stream, bytes([codec]), 1, path)
            VarInt._build(length, stream, context, path)
        return obj

FileHeader = Struct(
    "magic" / Bytes(8),
    "major" / Int16ul,
    "minor" / Int16ul,
    "flags" / Int32ul,
)

RecordHeader = Struct(
    "type" / Bytes(4),
    "length" / Int32ul,
    "checksum" / Int64ul,
)

MetaPayload = Struct(
    "flags" / Int32ul,
    "base_step" / Int64ul,
    "target_step" / Int64ul,
)

TensorPayload = Struct(
    "name" / Name(),
    "dtype" / Int8ul,
    "ndim" / Int8ul,
    "dims" / VarIntArray(this.ndim, MAX_DIMS, "ndim"),
    "block_elems" / VarInt,
    "flags" / Int8ul,
    "base_hash" / If(this.flags & NEEDS_BASE, Int64ul),
    "target_hash" / Int64ul,
    "_end" / Tell,
)

# A block's params and streams are counted by its encoding and dtype (SPEC.md §8): the caller passes
# ``param_count(encoding, head)`` and ``stream_count(encoding, params)`` as parse keywords; both reject unknown ids
# before any field that depends on them is read.
BlockPayload = Struct(
    "tensor" / VarInt,
    "block" / VarInt,
    "encoding" / Int8ul,
    "params" / BlockParams(lambda ctx, head: ctx._params.param_count(ctx.encoding, head)),
    "streams" / StreamTable(lambda ctx: ctx._params.stream_count(ctx.encoding, ctx.params)),
    "_end" / Tell,
)


IndexPayload = Struct(
    "codec" / Int8ul,
    "body_length" / VarInt,
    "body" / GreedyBytes,
)

class NumpyColumn(Construct):
    """``count`` fixed-width little-endian values read in one step as a read-only numpy view.

    Keeps large index columns out of per-element construct parsing; the byte count is checked
    against what the stream holds before anything is allocated.
    """

    def __init__(self, count, dtype, limit=None, what="count"):
        super().__init__()
        self.count = count
        self.dtype = np.dtype(dtype)
        self.limit = limit
        self.what = what

    def _parse(self, stream, context, path):
        count = _checked_count(self, context)
        nbytes = count * self.dtype.itemsize
        here = stream.tell()
        stream.seek(0, 2)
        available = stream.tell() - here
        stream.seek(here)
        if nbytes > available:
            raise StreamError(f"column of {count} values needs {nbytes} bytes, {available} left", path=path)
        return np.frombuffer(stream_read(stream, nbytes, path), self.dtype)

    def _build(self, obj, stream, context, path):
        data = np.ascontiguousarray(obj, dtype=self.dtype).tobytes()
        stream_write(stream, data, len(data), path)
        return obj


IndexBody = Struct(
    "base_digest" / Bytes(16),
    "target_digest" / Bytes(16),
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
    "other_types" / NumpyColumn(this.other_count, "S4"),
    "_end" / Tell,
)

Trailer = Struct(
    "index_offset" / Int64ul,
    "index_size" / Int64ul,
    "major" / Int16ul,
    "minor" / Int16ul,
    "flags" / Int32ul,
    "checksum" / Int64ul,
    "magic" / Bytes(8),
)


def parse(struct: Construct, data, what: str, **params):
    """Parse with construct, turning its exceptions into CorruptError that names the structure."""
    try:
        return struct.parse(data, **params)
    except StreamError as exc:
        raise CorruptError(f"{what}: structure runs past the end of its bytes") from exc
    except ConstructError as exc:
        raise CorruptError(f"{what}: {exc}") from exc


# ------------------------------------------------------------------------------------ hot path
# Hand-unrolled parsers for the three structures met once per record or block. Each accepts and
# rejects exactly what its construct struct above does (same fields, checks, order and messages);
# tests/test_layout_fast.py checks that on random inputs. The structs stay the definition and build.

_RECORD_HEAD = __import__("struct").Struct("<4sIQ")
_U64 = __import__("struct").Struct("<Q")


class _Fields:
    def __init__(self, **kw):
        self.__dict__.update(kw)


def parse_record_header(data) -> _Fields:
    """``RecordHeader.parse`` for a 16-byte (or longer) buffer."""
    if len(data) < 16:
        return RecordHeader.parse(bytes(data[:16]))
    rtype, length, checksum = _RECORD_HEAD.unpack_from(data, 0)
    return _Fields(type=rtype, length=length, checksum=checksum)


def parse_tensor_payload(payload, what: str) -> _Fields:
    """``parse(TensorPayload, payload, what)``."""
    buf = payload if isinstance(payload, (bytes, bytearray)) else bytes(payload)
    short = f"{what}: structure runs past the end of its bytes"
    n, pos = _varint_at(buf, 0, what)
    if n > MAX_NAME_BYTES:
        raise LimitError(f"tensor name of {n} bytes exceeds MAX_NAME_BYTES ({MAX_NAME_BYTES})")
    if pos + n + 2 > len(buf):
        raise CorruptError(short)
    name = bytes(buf[pos:pos + n])
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
        raise CorruptError(short)
    flags = buf[pos]
    pos += 1
    base_hash = None
    if flags & NEEDS_BASE:
        if pos + 8 > len(buf):
            raise CorruptError(short)
        base_hash = _U64.unpack_from(buf, pos)[0]
        pos += 8
    if pos + 8 > len(buf):
        raise CorruptError(short)
    target_hash = _U64.unpack_from(buf, pos)[0]
    pos += 8
    return _Fields(name=name, dtype=dtype, ndim=ndim, dims=dims, block_elems=block_elems, flags=flags,
                   base_hash=base_hash, target_hash=target_hash, _end=pos)


class _BlockHead:
    __slots__ = ("tensor", "block", "encoding", "params", "streams", "_end")

    def __init__(self, tensor, block, encoding, params, streams, end):
        self.tensor, self.block, self.encoding, self.params, self.streams, self._end = \
            tensor, block, encoding, params, streams, end


def _varint_at(buf, pos: int, what: str) -> tuple[int, int]:
    n = len(buf)
    if pos < n:
        b = buf[pos]
        if b < 0x80:  # one-byte varints: most of them
            return b, pos + 1
        value, shift, p = b & 0x7F, 7, pos + 1
        while p < n and shift < 63:  # up to 9 bytes: no overflow possible
            b = buf[p]
            p += 1
            value |= (b & 0x7F) << shift
            if b < 0x80:
                if b:
                    return value, p
                break  # non-minimal: the checked reader below says so
            shift += 7
    at = [pos]

    def next_byte():
        if at[0] >= len(buf):
            raise CorruptError(f"{what}: structure runs past the end of its bytes")
        at[0] += 1
        return buf[at[0] - 1]
    return read_varint(next_byte), at[0]


def parse_block_head(payload, what: str, param_count, stream_count) -> _BlockHead:
    """``BlockPayload`` parsed by hand: the hot path of every block read.

    Same fields, same checks in the same order, same keyword callbacks as ``parse(BlockPayload, ...)``
    (construct costs ~150 µs per block, this ~10 µs); the tests check that both agree on every input.
    """
    buf = payload if isinstance(payload, (bytes, bytearray)) else bytes(payload)
    tensor, pos = _varint_at(buf, 0, what)
    block, pos = _varint_at(buf, pos, what)
    if pos >= len(buf):
        raise CorruptError(f"{what}: structure runs past the end of its bytes")
    encoding = buf[pos]
    pos += 1
    params = []
    while len(params) < param_count(encoding, params):
        v, pos = _varint_at(buf, pos, what)
        params.append(v)
    streams = []
    for _ in range(stream_count(encoding, params)):
        if pos >= len(buf):
            raise CorruptError(f"{what}: structure runs past the end of its bytes")
        codec = buf[pos]
        length, pos = _varint_at(buf, pos + 1, what)
        streams.append((codec, length))
    return _BlockHead(tensor, block, encoding, params, streams, pos)



# Fast builders: byte-identical to building the structs above (tests/test_layout_fast.py), for the
# records the writer makes per tensor and per block.

def varint_bytes(v: int) -> bytes:
    if not 0 <= v < 1 << 64:
        raise InputError(f"value {v} does not fit a varint (0..2**64-1)")
    out = bytearray()
    while v > 0x7F:
        out.append(v & 0x7F | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def build_tensor_payload(name: bytes, dtype: int, dims, block_elems: int, flags: int, base_hash, target_hash) -> bytes:
    """``TensorPayload.build`` of these fields."""
    parts = [varint_bytes(len(name)), name, bytes((dtype, len(dims)))]
    parts += [varint_bytes(d) for d in dims]
    parts += [varint_bytes(block_elems), bytes((flags,))]
    if flags & NEEDS_BASE:
        parts.append(base_hash.to_bytes(8, "little"))
    parts.append(target_hash.to_bytes(8, "little"))
    return b"".join(parts)


def build_block_head(tensor: int, block: int, encoding: int, params, streams) -> bytes:
    """``BlockPayload.build`` of these fields (params and stream table as given)."""
    parts = [varint_bytes(tensor), varint_bytes(block), bytes((encoding,))]
    parts += [varint_bytes(p) for p in params]
    for codec, length in streams:
        parts += [bytes((codec,)), varint_bytes(length)]
    return b"".join(parts)
