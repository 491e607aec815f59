"""The encoding and codec tables (arcfmt/encodings/registry.py, arcfmt/codecs.py).

The container layer (records, reader, writer, pipeline) and the tools that describe files (report,
inspect) know no encoding or codec by itself: they ask the table. The proof here: encodings and a codec
registered by this file alone, under private ids, go through the writer, both readers, in-place
application, ``describe`` and the report without any arcfmt file knowing them; unregistered, the same
file is refused as the spec says (unknown id: ``unsupported``).
"""
from __future__ import annotations

import io

import ml_dtypes
import numpy as np
import pytest

import arcfmt
from arcfmt import codecs, encodings
from arcfmt.dtypes import from_name
from arcfmt.encodings import EncodedBlock, Encoding, StreamRole
from arcfmt.errors import CorruptError, InputError, UnsupportedError
from arcfmt.report import report_figures
from arcfmt.writer import DeltaWriter
from support.data import assert_bit_exact, stream_decode

# ------------------------------------------------------------------------------------ toy encodings

class Sub(Encoding):
    """Needs a base: one param (the changed count, checked against ``m``) and one stream holding
    ``target − base`` modulo 2^(8W), little-endian elements."""
    id = 200
    name = "test-sub"
    param_names = ("changed",)

    def stream_lengths(self, dt, params, m):
        if not params[0] <= m:
            raise CorruptError(f"test-sub: {params[0]} changes in a block of {m}")
        return [m * dt.itemsize]

    def changed(self, params):
        return params[0]

    def stream_roles(self, dt):
        return (StreamRole("differences", "steps"),)

    def encode(self, block):
        d = (block.target - block.base).astype(block.dt.uint)  # unsigned: wraps
        return EncodedBlock(self.id, [int(block.positions.size)], [d.tobytes()], int(block.positions.size))

    def decode(self, dt, params, streams, m, base, out):
        d = np.frombuffer(streams[0], dt.uint, count=m)
        np.add(base, d, out=out)  # in place when ``out`` is ``base``


class Shift(Encoding):
    """Every element moved by one constant: one param, no streams. The writer is offered it first
    (``propose``), and a candidate without streams ends the trials."""
    id = 201
    name = "test-shift"
    param_names = ("k",)
    trial_rank = 5

    def stream_lengths(self, dt, params, m):
        if params[0] >= 1 << (8 * dt.itemsize):
            raise CorruptError("test-shift: constant wider than the element")
        return []

    def changed(self, params):
        return None

    def encode(self, block):
        d = np.unique((block.target - block.base).astype(block.dt.uint))
        if d.size != 1:
            raise InputError("test-shift: the block is not shifted by one constant")
        return EncodedBlock(self.id, [int(d[0])], [], block.m)

    def propose(self, block, tried):
        d = (block.target - block.base).astype(block.dt.uint)
        return self.encode(block) if d.size and (d == d[0]).all() and d[0] else None

    def decode(self, dt, params, streams, m, base, out):
        np.add(base, dt.uint.type(params[0]), out=out)


class Reverse(codecs.Codec):
    """A toy codec: the bytes reversed."""
    id, name = 200, "test-reverse"

    def compress(self, data, setting):
        return bytes(data)[::-1]

    def decode(self, stored, length):
        if len(stored) != length:
            raise CorruptError(f"test-reverse stream holds {len(stored)} bytes, {length} expected")
        return bytes(stored)[::-1]


@pytest.fixture
def toys():
    for e in (Sub, Shift):
        encodings.register(e)
    codecs.register(Reverse)
    try:
        yield
    finally:
        for e in (Sub, Shift):
            encodings.unregister(e.id)
        codecs.unregister(Reverse.id)


def _model():
    rng = np.random.default_rng(3)
    base = {"w": rng.standard_normal((64, 48)).astype(ml_dtypes.bfloat16),
            "i": rng.integers(-1000, 1000, 3000).astype(np.int32)}
    target = {k: v.copy() for k, v in base.items()}
    target["w"].reshape(-1)[::7] = (target["w"].reshape(-1)[::7].astype(np.float32) * 1.01).astype(ml_dtypes.bfloat16)
    target["i"][::5] += 3
    return base, target


def _write(base, target, **kw) -> bytes:
    buf = io.BytesIO()
    with DeltaWriter(buf, block_elems=1000, **kw) as w:
        w.write_tensors((n, base[n], target[n]) for n in target)
    return buf.getvalue()


# ------------------------------------------------------------------------------------ tests

def test_built_in_table_is_the_spec_table():
    """SPEC.md §8 and §9: ids, names, base, dtypes."""
    floats = {"F16", "F32", "F64", "F8_E4M3", "F8_E5M2"}
    want = {0: ("unchanged", True, None), 1: ("xor", True, None), 2: ("bf16-delta", True, {"BF16"}),
            3: ("float-delta", True, floats), 4: ("keyframe", False, None),
            5: ("ctx-delta", True, {"BF16", "F16", "F32", "F8_E4M3", "F8_E5M2"}),
            6: ("dense-delta", True, {"BF16", "F16", "F32", "F8_E4M3", "F8_E5M2"}),
            7: ("ctx-delta-as", True, {"BF16", "F16", "F32", "F8_E4M3", "F8_E5M2"}),
            8: ("ctx-delta-rc", True, {"BF16", "F16", "F32", "F8_E4M3", "F8_E5M2"}),
            9: ("ctx-delta-rp", True, {"BF16", "F16", "F32", "F8_E4M3", "F8_E5M2"}),
            10: ("ctx-delta-rh", True, {"BF16", "F16", "F32", "F8_E4M3", "F8_E5M2"}),
            11: ("ctx-delta-rhp", True, {"BF16", "F16", "F32", "F8_E4M3", "F8_E5M2"})}
    got = {e.id: (e.name, e.needs_base, None if e.dtypes is None else set(e.dtypes)) for e in encodings.registered()}
    assert got == want
    assert [(c.id, c.name) for c in codecs.registered()] == [(0, "raw"), (1, "zstd"), (2, "xz"), (3, "bz2")]
    assert encodings.by_name("ctx-delta") is encodings.get(5) and encodings.find(99) is None
    with pytest.raises(UnsupportedError):
        encodings.get(99)
    bf16 = from_name("BF16")
    assert [r.name for r in encodings.get(5).stream_roles(bf16)] == ["quotients", "remainders", "signs", "magnitudes"]
    assert [r.name for r in encodings.get(4).stream_roles(from_name("I8"))] == ["elements"]


def test_taken_ids_and_names_are_refused(toys):
    class Again(Sub):
        name = "test-sub-2"
    with pytest.raises(InputError):
        encodings.register(Again)  # id 200 is taken
    class Renamed(Sub):
        id = 210
        name = "xor"
    with pytest.raises(InputError):
        encodings.register(Renamed)
    with pytest.raises(InputError):
        codecs.register(Reverse)


def test_a_registered_encoding_and_codec_round_trip_through_the_container(toys):
    base, target = _model()
    delta = _write(base, target, force_encoding="test-sub", force_codec="test-reverse")
    # random access and streaming, both verified against the tensor hashes and the digests
    assert_bit_exact(arcfmt.decode(base, delta), target)
    assert_bit_exact(stream_decode(delta, base), target)
    # in place, into live arrays
    live = {k: v.copy() for k, v in base.items()}
    done = dict(arcfmt.apply_in_place(live, delta))
    assert set(done) == set(target)
    assert_bit_exact(live, target)
    # described by the table's names and params
    d = arcfmt.DeltaReader(delta).describe()
    blocks = [b for t in d["tensors"] for b in t["blocks"]]
    assert {b["encoding"] for b in blocks} == {"test-sub"}
    assert {s["codec"] for b in blocks for s in b["streams"]} == {"test-reverse"}
    want_changed = sum(int(np.count_nonzero(base[n].view(f"u{v.itemsize}") != v.view(f"u{v.itemsize}")))
                       for n, v in target.items())
    assert sum(t["changed"] for t in d["tensors"]) == want_changed
    fig = report_figures(delta)
    assert fig["bytes_by_role"]["differences"] == sum(s["stored"] for b in blocks for s in b["streams"])
    # the compatibility views of the tables are live
    assert encodings.NAMES[200] == "test-sub" and codecs.NAMES[200] == "test-reverse"


def test_the_writer_asks_every_registered_encoding(toys):
    base, target = _model()
    target = {"w": base["w"].copy(), "i": base["i"] + np.int32(7)}  # "i": every element + 7
    delta = _write(base, target)
    d = arcfmt.DeltaReader(delta).describe()
    enc = {t["name"]: t["encodings"] for t in d["tensors"]}
    assert enc == {"w": ["unchanged"], "i": ["test-shift"]}
    assert_bit_exact(arcfmt.decode(base, delta), target)
    assert_bit_exact(stream_decode(delta, base), target)


def test_unregistered_the_same_file_is_unsupported(toys):
    base, target = _model()
    delta = _write(base, target, force_encoding="test-sub")
    encodings.unregister("test-sub")
    try:
        with pytest.raises(UnsupportedError, match="unknown encoding id 200"):
            arcfmt.decode(base, delta)
        with pytest.raises(UnsupportedError, match="unknown encoding id 200"):
            stream_decode(delta, base)
    finally:
        encodings.register(Sub)
    coded = _write(base, target, force_codec="test-reverse")
    codecs.unregister(Reverse.id)
    try:
        with pytest.raises(UnsupportedError, match="unknown codec id 200"):
            arcfmt.decode(base, coded)
    finally:
        codecs.register(Reverse)
