"""arcfmt/layout.py's byte layouts against SPEC.md, structure by structure.

TENS (§7) and BLCK (§8) are defined by hand-written code in arcfmt/layout.py. Here the tables of
§7 and §8 are written out as declarative construct structs — the test's own oracle, used by nothing
else — and the definition must accept and reject exactly what they do (same fields, same checks in
the same order, same messages) and build the same bytes. The fixed structures are construct
definitions whose ``struct`` forms and size constants are derived; those are checked here too.
"""
from __future__ import annotations

import io
import os
import struct

import pytest
from construct import Construct, GreedyBytes, If, Int8ul, Int64ul, Struct, Tell, this
from construct.core import stream_read, stream_write
from hypothesis import given, settings
from hypothesis import strategies as st

from arcfmt import encodings
from arcfmt import layout as L
from arcfmt.dtypes import from_name
from arcfmt.errors import ArcError, CorruptError, InputError, LimitError

# ------------------------------------------------------------------------------------ the oracle

def _read_varint(stream, path) -> int:
    return L.VarInt._parse(stream, None, path)


class _VarIntArray(Construct):
    """``count`` canonical varints, refused past ``limit`` before any is read."""

    def __init__(self, count, limit=None, what="count"):
        super().__init__()
        self.count, self.limit, self.what = count, limit, what

    def _parse(self, stream, context, path):
        count = self.count(context) if callable(self.count) else self.count
        if self.limit is not None and count > self.limit:
            raise LimitError(f"{self.what} {count} exceeds its limit {self.limit}")
        return [_read_varint(stream, path) for _ in range(count)]

    def _build(self, obj, stream, context, path):
        for v in obj:
            L.VarInt._build(v, stream, context, path)
        return obj


class _BlockParams(_VarIntArray):
    """A block's params: the encoding says how many, possibly only after reading the first of them."""

    def _parse(self, stream, context, path):
        out = []
        while len(out) < self.count(context, out):
            out.append(_read_varint(stream, path))
        return out


class _Name(Construct):
    """A tensor name: varint byte length (checked against MAX_NAME_BYTES before reading), then the bytes."""

    def _parse(self, stream, context, path):
        n = _read_varint(stream, path)
        if n > L.MAX_NAME_BYTES:
            raise LimitError(f"tensor name of {n} bytes exceeds MAX_NAME_BYTES ({L.MAX_NAME_BYTES})")
        return stream_read(stream, n, path)

    def _build(self, obj, stream, context, path):
        L.VarInt._build(len(obj), stream, context, path)
        stream_write(stream, obj, len(obj), path)
        return obj


class _StreamTable(Construct):
    """``count`` pairs of (codec ``u8``, stored length varint)."""

    def __init__(self, count):
        super().__init__()
        self.count = count

    def _parse(self, stream, context, path):
        out = []
        for _ in range(self.count(context)):
            codec = stream_read(stream, 1, path)[0]
            out.append((codec, _read_varint(stream, path)))
        return out

    def _build(self, obj, stream, context, path):
        for codec, length in obj:
            stream_write(stream, bytes([codec]), 1, path)
            L.VarInt._build(length, stream, context, path)
        return obj


SPEC_TENS = Struct(  # SPEC.md §7
    "name" / _Name(),
    "dtype" / Int8ul,
    "ndim" / Int8ul,
    "dims" / _VarIntArray(this.ndim, L.MAX_DIMS, "ndim"),
    "block_elems" / L.VarInt,
    "flags" / Int8ul,
    "base_hash" / If(this.flags & L.NEEDS_BASE, Int64ul),
    "target_hash" / Int64ul,
    "_end" / Tell,
)

SPEC_BLCK = Struct(  # SPEC.md §8, up to the stream data
    "tensor" / L.VarInt,
    "block" / L.VarInt,
    "encoding" / Int8ul,
    "params" / _BlockParams(lambda ctx, head: ctx._params.param_count(ctx.encoding, head)),
    "streams" / _StreamTable(lambda ctx: ctx._params.stream_count(ctx.encoding, ctx.params)),
    "_end" / Tell,
)

TENS_FIELDS = ("name", "dtype", "ndim", "dims", "block_elems", "flags", "base_hash", "target_hash", "_end")
BLCK_FIELDS = ("tensor", "block", "encoding", "params", "streams", "_end")


def outcome(fn, fields):
    try:
        h = fn()
        return ("ok",) + tuple(list(v) if isinstance(v, list) else v for v in (getattr(h, f) for f in fields))
    except ArcError as exc:
        return ("error", type(exc).__name__, str(exc))


def varint(n):
    return L.VarInt.build(n)


_BF16 = from_name("BF16")


def _pc(e, head=()):  # the callbacks records.parse_block gives, for a BF16 block of 64 elements
    enc = encodings.get(e)
    if not head:
        enc.check_dtype(_BF16)
    return enc.param_count(head)


def _sc(e, params):
    return len(encodings.get(e).stream_lengths(_BF16, params, 64))


# ------------------------------------------------------------------------------------ BLCK

@given(st.binary(max_size=40), st.sampled_from([0, 1, 2, 3, 4, 5]), st.binary(max_size=3))
@settings(max_examples=500, deadline=None)
def test_block_head(tail, encoding, prefix):
    payload = (prefix or b"\x00\x00") + bytes([encoding]) + tail
    spec = outcome(lambda: L.parse(SPEC_BLCK, payload, "BLCK", param_count=_pc, stream_count=_sc), BLCK_FIELDS)
    assert outcome(lambda: L.parse_block_head(payload, "BLCK", _pc, _sc), BLCK_FIELDS) == spec
    assert outcome(lambda: L.parse_block_head(memoryview(payload), "BLCK", _pc, _sc), BLCK_FIELDS) == spec
    if spec[0] == "ok":  # the construct form of the definition parses the same
        assert outcome(lambda: L.BlockPayload.parse(payload, param_count=_pc, stream_count=_sc), BLCK_FIELDS) == spec


@given(st.integers(0, 2**40), st.integers(0, 2**30), st.integers(0, 255),
       st.lists(st.integers(0, 2**64 - 1), max_size=50),
       st.lists(st.tuples(st.integers(0, 255), st.integers(0, 2**40)), max_size=8))
@settings(max_examples=300, deadline=None)
def test_build_block_head(tensor, block, encoding, params, streams):
    fields = dict(tensor=tensor, block=block, encoding=encoding, params=params, streams=streams)
    spec = SPEC_BLCK.build(fields, param_count=lambda e, head: len(params), stream_count=lambda e, p: len(streams))
    assert L.build_block_head(tensor, block, encoding, params, streams) == spec
    assert L.BlockPayload.build(fields) == spec
    back = L.parse_block_head(spec, "BLCK", lambda e, head: len(params), lambda e, p: len(streams))
    assert (back.tensor, back.block, back.encoding, back.params, back.streams, back._end) == \
        (tensor, block, encoding, params, streams, len(spec))


# ------------------------------------------------------------------------------------ TENS

def _tens(name_len, name, dtype, ndim, dims, block_elems, flags, hashes):
    return varint(name_len) + name + bytes([dtype, ndim]) + b"".join(varint(d) for d in dims) + \
        varint(block_elems) + bytes([flags]) + hashes


@given(st.integers(0, 1100), st.binary(max_size=20), st.integers(0, 255), st.integers(0, 20),
       st.lists(st.integers(0, 2**70), max_size=20), st.integers(0, 2**30), st.integers(0, 255),
       st.binary(max_size=20), st.integers(0, 200))
@settings(max_examples=500, deadline=None)
def test_tensor_payload(name_len, name, dtype, ndim, dims, block_elems, flags, hashes, cut):
    dims = [d for d in dims if d < 2**64]
    payload = _tens(name_len if name_len < 1100 else len(name), name, dtype, ndim, dims, block_elems, flags, hashes)
    payload = payload[:cut] if cut < 100 else payload
    spec = outcome(lambda: L.parse(SPEC_TENS, payload, "TENS"), TENS_FIELDS)
    assert outcome(lambda: L.parse_tensor_payload(payload, "TENS"), TENS_FIELDS) == spec
    assert outcome(lambda: L.parse_tensor_payload(memoryview(payload), "TENS"), TENS_FIELDS) == spec
    if spec[0] == "ok":
        assert outcome(lambda: L.TensorPayload.parse(payload), TENS_FIELDS) == spec


@given(st.binary(max_size=40), st.integers(0, 255), st.lists(st.integers(0, 2**64 - 1), max_size=8),
       st.integers(0, 2**40), st.sampled_from([0, L.NEEDS_BASE]), st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1))
@settings(max_examples=300, deadline=None)
def test_build_tensor_payload(name, dtype, dims, block_elems, flags, base_hash, target_hash):
    fields = dict(name=name, dtype=dtype, ndim=len(dims), dims=dims, block_elems=block_elems, flags=flags,
                  base_hash=base_hash, target_hash=target_hash)
    spec = SPEC_TENS.build(fields)
    assert L.build_tensor_payload(name, dtype, dims, block_elems, flags, base_hash, target_hash) == spec
    assert L.TensorPayload.build(fields) == spec
    back = L.parse_tensor_payload(spec, "TENS")
    assert (back.name, back.dims, back.base_hash, back.target_hash, back._end) == \
        (name, dims, base_hash if flags else None, target_hash, len(spec))


@given(st.binary(max_size=12), st.binary(max_size=12), st.binary(max_size=6))
@settings(max_examples=300, deadline=None)
def test_prefixed_names_round_trip(prev, name, tail):
    """PREFIXED_NAMES (§7, 1.3): a name built after the previous one parses back whole, from the
    longest shared prefix; names sharing a prefix that ends inside a UTF-8 sequence included."""
    full = prev[:len(tail)] + name
    tens = L.build_tensor_payload(full, 11, [3], 12, 0, None, 7, prev)
    k = len(os.path.commonprefix((prev, full)))
    assert tens[:len(varint(k))] == varint(k)
    back = L.parse_tensor_payload(tens, "TENS", prev)
    assert (back.name, back.dims, back.target_hash, back._end) == (full, [3], 7, len(tens))


def test_prefixed_name_checks_come_in_their_order():
    """prefix_length beyond the previous name: corrupt, before name_length is read; prefix_length +
    name_length over MAX_NAME_BYTES: limit, before the name is read (a truncated payload is not reached)."""
    rest = bytes([11, 1]) + varint(3) + varint(12) + b"\x00" + (7).to_bytes(8, "little")
    ok = varint(3) + varint(1) + b"x" + rest
    assert L.parse_tensor_payload(ok, "TENS", b"abcd").name == b"abcx"
    with pytest.raises(CorruptError, match="shares 5 bytes with the previous tensor's name, which has 4"):
        L.parse_tensor_payload(varint(5) + b"\xff", "TENS", b"abcd")
    with pytest.raises(CorruptError, match="shares 1 bytes"):
        L.parse_tensor_payload(varint(1) + varint(1) + b"x" + rest, "TENS", b"")
    with pytest.raises(LimitError, match="name of 1025 bytes"):
        L.parse_tensor_payload(varint(4) + varint(L.MAX_NAME_BYTES - 3), "TENS", b"abcd")
    with pytest.raises(CorruptError, match="runs past the end"):   # at the limit: read on, and found short
        L.parse_tensor_payload(varint(4) + varint(L.MAX_NAME_BYTES - 4), "TENS", b"abcd")


def test_defined_constructs_compose():
    """The construct forms consume exactly their structure, so they compose with other fields."""
    tens = L.build_tensor_payload(b"w", 11, [3, 4], 12, 0, None, 7)
    s = Struct("t" / L.TensorPayload, "rest" / GreedyBytes)
    got = s.parse(tens + b"tail")
    assert (got.t.name, got.t.dims, got.rest) == (b"w", [3, 4], b"tail")
    blk = L.build_block_head(1, 2, 4, [], [(1, 5)])
    s = Struct("b" / L.BlockPayload, "rest" / GreedyBytes)
    got = s.parse(blk + b"data!", param_count=lambda e, h: 0, stream_count=lambda e, p: 1)
    assert (got.b.tensor, got.b.block, got.b.streams, got.rest) == (1, 2, [(1, 5)], b"data!")


# ------------------------------------------------------------------------------------ record header

@given(st.binary(min_size=16, max_size=24))
@settings(max_examples=200, deadline=None)
def test_record_header(data):
    spec = L.RecordHeader.parse(data[:16])
    fast = L.parse_record_header(data)
    assert (spec.type, spec.length, spec.checksum) == (fast.type, fast.length, fast.checksum)
    assert struct.unpack("<4sIQ", data[:16]) == (fast.type, fast.length, fast.checksum)
    built = L.build_record_header(fast.type, fast.length, fast.checksum)
    assert built == L.RecordHeader.build(dict(type=spec.type, length=spec.length, checksum=spec.checksum)) == data[:16]
    assert L.record_checked_bytes(fast.type, fast.length) == data[:L.RECORD_CHECKED_SIZE]


def test_record_header_short_and_bad_type():
    with pytest.raises(CorruptError, match="runs past the end"):
        L.parse_record_header(b"TENS\0\0\0")
    for bad in (b"abc", b"abcde", b""):
        with pytest.raises(InputError):
            L.record_checked_bytes(bad, 0)


def test_record_types():
    """§5: four ASCII letters; critical = an upper-case first letter."""
    for b in range(256):
        t = bytes([b]) + b"abc"
        letter = chr(b).isascii() and chr(b).isalpha()
        assert bool(L.RECORD_TYPE_RE.match(t)) == letter
        assert L.is_critical(t) == (ord("A") <= b <= ord("Z"))
    for t in (b"abc", b"abcde", b"ab1d", b"ab d", b"abc\n"):
        assert not L.RECORD_TYPE_RE.match(t)
    assert all(L.is_critical(t) for t in (L.META, L.TENS, L.BLCK, L.INDX)) and not L.is_critical(L.NOTE)


# ------------------------------------------------------------------------------------ fixed structures

def test_sizes():
    """Every size constant is the number SPEC.md gives (§4, §5, §6, §10, §11, §12.1)."""
    assert (L.HEADER_SIZE, L.RECORD_HEADER_SIZE, L.RECORD_CHECKED_SIZE, L.RECORD_TYPE_SIZE) == (16, 16, 8, 4)
    assert (L.META_PAYLOAD_SIZE, L.META_RECORD_SIZE, L.FIRST_RECORD_OFFSET) == (20, 36, 52)
    assert (L.TRAILER_SIZE, L.TRAILER_CHECKED_SIZE, L.MIN_FILE_SIZE) == (40, 24, 108)
    assert L.DIGEST_SIZE == 16 and L.NO_BASE_DIGEST == bytes(16)


@pytest.mark.parametrize("con", [L.FileHeader, L.RecordHeader, L.MetaPayload, L.Trailer],
                         ids=["header", "record", "meta", "trailer"])
@given(data=st.data())
@settings(max_examples=50, deadline=None)
def test_packed_forms(con, data):
    """The ``struct`` form derived from a fixed construct definition parses and builds the same bytes."""
    packed = L._packed(con)
    assert packed.size == con.sizeof()
    raw = data.draw(st.binary(min_size=con.sizeof(), max_size=con.sizeof()))
    parsed = con.parse(raw)
    names = [sc.name for sc in con.subcons]
    assert packed.unpack(raw) == tuple(parsed[n] for n in names)
    assert packed.pack(*packed.unpack(raw)) == con.build(parsed) == raw


def test_trailer_and_record_framing():
    """The checksummed prefixes: a record's checksum covers header bytes 0–7 and the payload, the
    trailer's its bytes 0–23 (§5, §11)."""
    from arcfmt import records
    from arcfmt.integrity import record_checksum
    rec = records.build_record(b"note", b"hello")
    assert rec[:L.RECORD_CHECKED_SIZE] == b"note" + (5).to_bytes(4, "little")
    assert L.parse_record_header(rec).checksum == record_checksum(rec[:8], b"hello")
    t = records.build_trailer(52, 30, L.COMPACT_INDEX)
    assert len(t) == L.TRAILER_SIZE and t[32:] == L.TRAILER_MAGIC
    assert int.from_bytes(t[24:32], "little") == record_checksum(t[:24], b"")
    assert records.check_trailer(t, 52 + 30 + L.TRAILER_SIZE).index_size == 30


# ------------------------------------------------------------------------------------ varints

@given(st.integers(0, 2**64 - 1))
def test_varint_bytes(n):
    from support.records import varint as reference  # the test suite's own LEB128 writer
    out = L.varint_bytes(n)
    assert out == reference(n) == L.VarInt.build(n)
    it = iter(out)
    assert L.read_varint(lambda: next(it)) == n
    assert L._varint_at(out, 0, "x") == (n, len(out))
    assert L.VarInt.parse_stream(io.BytesIO(out)) == n


def test_varint_bytes_range():
    for bad in (-1, 2**64):
        with pytest.raises(InputError):  # a value a caller cannot write
            L.varint_bytes(bad)
