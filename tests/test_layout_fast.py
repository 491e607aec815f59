"""The hand-unrolled parsers of arcfmt/layout.py accept and reject exactly what the construct structs do."""
from __future__ import annotations

import struct

from hypothesis import given, settings, strategies as st

from arcfmt import layout as L, transforms
from arcfmt.dtypes import from_name
from arcfmt.errors import ArcError


def outcome(fn, fields):
    try:
        h = fn()
        return ("ok",) + tuple(getattr(h, f) for f in fields)
    except ArcError as exc:
        return ("error", type(exc).__name__, str(exc))


def varint(n):
    return L.VarInt.build(n)


@given(st.binary(max_size=40), st.sampled_from([0, 1, 2, 3, 4, 5]), st.binary(max_size=3))
@settings(max_examples=500, deadline=None)
def test_block_head(tail, encoding, prefix):
    dt = from_name("BF16")
    payload = (prefix or b"\x00\x00") + bytes([encoding]) + tail

    def pc(e, head=()):
        if not head:
            transforms.check_encoding(dt, e)
        return transforms.param_count(e, head)

    def sc(e, params):
        return len(transforms.stream_lengths(dt, e, params, 64))

    fields = ("tensor", "block", "encoding", "params", "streams", "_end")
    slow = outcome(lambda: L.parse(L.BlockPayload, payload, "BLCK", param_count=pc, stream_count=sc), fields)
    fast = outcome(lambda: L.parse_block_head(payload, "BLCK", pc, sc), fields)
    assert slow == fast


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
    fields = ("name", "dtype", "ndim", "dims", "block_elems", "flags", "base_hash", "target_hash", "_end")
    slow = outcome(lambda: L.parse(L.TensorPayload, payload, "TENS"), fields)
    fast = outcome(lambda: L.parse_tensor_payload(payload, "TENS"), fields)
    if slow[0] == "ok":
        slow = slow[:4] + (list(slow[4]),) + slow[5:]
    assert slow == fast


@given(st.binary(min_size=16, max_size=24))
@settings(max_examples=200, deadline=None)
def test_record_header(data):
    slow = L.RecordHeader.parse(data[:16])
    fast = L.parse_record_header(data)
    assert (slow.type, slow.length, slow.checksum) == (fast.type, fast.length, fast.checksum)
    assert struct.unpack("<4sIQ", data[:16]) == (fast.type, fast.length, fast.checksum)


# ------------------------------------------------------------------------------------ fast builders

@given(st.integers(0, 2**64 - 1))
def test_varint_bytes(n):
    from conftest import varint as reference  # the test suite's own LEB128 writer
    out = L.varint_bytes(n)
    assert out == reference(n)
    it = iter(out)
    assert L.read_varint(lambda: next(it)) == n


def test_varint_bytes_range():
    import pytest
    for bad in (-1, 2**64):
        with pytest.raises(ValueError):
            L.varint_bytes(bad)


@given(st.binary(max_size=40), st.integers(0, 255), st.lists(st.integers(0, 2**64 - 1), max_size=8),
       st.integers(0, 2**40), st.sampled_from([0, L.NEEDS_BASE]), st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1))
@settings(max_examples=300, deadline=None)
def test_build_tensor_payload(name, dtype, dims, block_elems, flags, base_hash, target_hash):
    slow = L.TensorPayload.build(dict(name=name, dtype=dtype, ndim=len(dims), dims=dims, block_elems=block_elems,
                                      flags=flags, base_hash=base_hash, target_hash=target_hash))
    assert L.build_tensor_payload(name, dtype, dims, block_elems, flags, base_hash, target_hash) == slow


@given(st.integers(0, 2**40), st.integers(0, 2**30), st.integers(0, 255), st.lists(st.integers(0, 2**64 - 1), max_size=50),
       st.lists(st.tuples(st.integers(0, 255), st.integers(0, 2**40)), max_size=8))
@settings(max_examples=300, deadline=None)
def test_build_block_head(tensor, block, encoding, params, streams):
    slow = L.BlockPayload.build(dict(tensor=tensor, block=block, encoding=encoding, params=params, streams=streams),
                                param_count=lambda e, head: len(params), stream_count=lambda e, p: len(streams))
    assert L.build_block_head(tensor, block, encoding, params, streams) == slow
