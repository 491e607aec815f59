"""Tensor names and shapes at the edge of what the format can carry (SPEC.md §7, §10, §12.3, §14).

- Names from a caller (``arcfmt.encode``, ``DeltaWriter``) that break §7 are the caller's mistake:
  ``InputError``, never ``CorruptError`` or a bare ``UnicodeEncodeError`` (R-WRITER-NAMES).
- Names read from a file: the reserved name ``__metadata__`` is ``corrupt`` wherever it is read, in a
  ``TENS`` record and in the index, by both readers (R-NAME-RESERVED).
- Shapes: the product of the non-zero dimensions is bounded by MAX_TENSOR_ELEMS, checked on every
  partial product, also for a tensor with a zero dimension (R-ELEMS-ZERO-DIM, R-ELEMS-PARTIAL): a
  ``limit`` error from every reader, never numpy's ``ValueError``.
- No reader hands out a tensor before its hash matched (R-NO-UNVERIFIED-BYTES).

Malformed files are made with the record surgery of ``support.records`` (``parse_file``, ``assemble``).
"""
from __future__ import annotations

import io
import json
import os
import struct

import numpy as np
import pytest

import arcfmt
from arcfmt import layout as L
from arcfmt import records
from arcfmt.errors import ArcError, CorruptError, InputError, LimitError, VerificationError
from arcfmt.integrity import model_digest
from support.data import StreamReader, assert_bit_exact, stream_decode
from support.records import Rec, assemble, index_fields, parse_file, raw_index_payload

RESERVED = "__metadata__"


# ------------------------------------------------------------------------------------- readers

def random_access(data, base=None):
    return arcfmt.DeltaReader(data, workers=1).decode_all(base or {})


def streaming(data, base=None):
    return stream_decode(data, base)


def api_decode(data, base=None):
    return arcfmt.decode(base, data, workers=1)


READERS = [pytest.param(random_access, id="DeltaReader"), pytest.param(streaming, id="StreamReader"),
           pytest.param(api_decode, id="arcfmt.decode")]


def raises(cls, reader, data, base=None) -> ArcError:
    """``reader`` must fail with exactly ``cls`` (a SPEC.md §15 class); any other exception escapes."""
    with pytest.raises(ArcError) as info:
        reader(data, base)
    assert type(info.value) is cls, f"{reader.__name__}: {type(info.value).__name__}: {info.value}"
    return info.value


# ------------------------------------------------------------------------------------- surgery

def keyframe_file(name="w", arr=None):
    """A one-tensor keyframe file (no base needed) and its parsed records."""
    arr = np.arange(6, dtype=np.float32).reshape(2, 3) if arr is None else arr
    data = arcfmt.encode(None, {name: arr}, workers=1, effort="fast")
    return data, parse_file(data)


def tens_index(p) -> int:
    return next(i for i, r in enumerate(p.recs) if r.type == L.TENS)


def with_tensor(p, *, payload_name: bytes | None = None, index_name: str | None = None, dims=None) -> bytes:
    """The file of ``p`` with its (only) TENS record's name and/or dims changed in the record
    (``payload_name``, ``dims``) and/or in the index (``index_name``); the target digest is recomputed
    from the record, so the change is the file's only fault."""
    i = tens_index(p)
    rec = p.recs[i]
    th = records.parse_tensor(rec.payload, "test", None, p.index.inline_blocks)
    raw = th.name.encode() if payload_name is None else payload_name
    shape = th.shape if dims is None else tuple(dims)
    inline = b"" if th.inline_at is None else rec.payload[th.inline_at:]   # its inline block (SPEC §7), kept
    payload = L.build_tensor_payload(raw, th.dtype.code, shape, th.block_elems, L.INLINE_BLOCK if inline else 0,
                                     None, th.target_hash) + inline
    recs = list(p.recs)
    recs[i] = Rec(L.TENS, payload, rec.offset, name=rec.name if index_name is None else index_name,
                  encoding=rec.encoding)
    digest = model_digest([(raw, th.dtype.code, shape, th.target_hash)])
    return assemble(p, recs, target_digest=digest)


def empty_tensor_file():
    """A file whose only tensor is an empty F32 keyframe tensor (no blocks, no base)."""
    return keyframe_file("e", np.zeros((0, 5), np.float32))


# ------------------------------------------------------------------------------------- caller names

BAD_NAMES = {
    "reserved": RESERVED,
    "empty": "",
    "lone surrogate": "w\ud800",
    "lone low surrogate": "\udc80w",
    "newline": "w\n",
    "NUL": "w\x00x",
    "DEL": "w\x7f",
    "too long": "n" * (L.MAX_NAME_BYTES + 1),
    "too long in UTF-8": "é" * (L.MAX_NAME_BYTES // 2 + 1),
    "bytes": b"w",
    "int": 3,
    "None": None,
}


@pytest.mark.parametrize("what", list(BAD_NAMES))
def test_encode_refuses_bad_names_as_input_error(what):
    name = BAD_NAMES[what]
    with pytest.raises(InputError) as info:
        arcfmt.encode(None, {name: np.zeros(2, np.float32)}, workers=1)
    assert not isinstance(info.value, (CorruptError, LimitError))  # a caller's mistake, not a bad file
    assert type(info.value) is InputError


@pytest.mark.parametrize("what", ["reserved", "empty", "lone surrogate", "newline", "DEL", "too long", "bytes"])
def test_writer_refuses_bad_names_before_writing_anything(what):
    buf = io.BytesIO()
    w = arcfmt.DeltaWriter(buf, workers=1)
    start = buf.tell()
    with pytest.raises(InputError):
        w.write_tensor(BAD_NAMES[what], np.zeros(2, np.float32))
    assert buf.tell() == start  # no TENS record for it
    w.write_tensor("ok", np.ones(2, np.float32))  # the writer is still usable
    w.close()
    assert list(arcfmt.decode(None, buf.getvalue())) == ["ok"]


def test_near_reserved_names_are_valid():
    """Only the exact bytes ``__metadata__`` are reserved (SPEC.md §7)."""
    target = {n: np.full(2, i, np.float32) for i, n in enumerate(
        ["__metadata", "_metadata__", "__METADATA__", " __metadata__", "__metadata__.weight", "metadata",
         "naïve/ß", "\u0085c1-control", "\ufffe"])}
    d = arcfmt.encode(None, target, workers=1, effort="fast")
    assert_bit_exact(arcfmt.decode(None, d), target)
    assert_bit_exact(stream_decode(d), target)


def test_check_name_and_check_input_name_agree():
    """One rule set, two error families: file bytes -> Corrupt/Limit, caller strings -> Input."""
    for name in [RESERVED, "", "a\n", "a\x7f", "x" * 1025]:
        raw = name.encode()
        with pytest.raises((CorruptError, LimitError)):
            records.check_name(raw, "file")
        with pytest.raises(InputError):
            records.check_input_name(name)
    for raw in [b"\xff", b"\xed\xa0\x80", b"\xc0\xaf"]:  # invalid UTF-8, a surrogate, an overlong form
        with pytest.raises(CorruptError):
            records.check_name(raw, "file")
    assert records.check_name("naïve".encode(), "file") == "naïve"
    assert records.check_input_name("naïve") == "naïve".encode()


def test_cli_encode_with_a_surrogate_name_is_an_input_error(tmp_path, capsys):
    """A safetensors key holding a lone surrogate escape: exit 1 (input refused), not 3 (internal)."""
    from arcfmt.cli import main

    h = json.dumps({"w\ud800": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    src = tmp_path / "t.safetensors"
    src.write_bytes(struct.pack("<Q", len(h)) + h + bytes(8))
    assert main(["encode", "--keyframe", str(src), "-o", str(tmp_path / "o.arc")]) == 1
    assert "(input)" in capsys.readouterr().err
    assert not (tmp_path / "o.arc").exists()


# ------------------------------------------------------------------------------------- names in a file

@pytest.mark.parametrize("reader", READERS)
def test_reserved_name_in_tens_and_index_is_corrupt(reader):
    _, p = keyframe_file()
    data = with_tensor(p, payload_name=RESERVED.encode(), index_name=RESERVED)
    err = raises(CorruptError, reader, data)
    assert "reserved" in str(err)


@pytest.mark.parametrize("reader", READERS)
def test_reserved_name_in_index_only_is_corrupt(reader):
    """The TENS record says ``w``, the index ``__metadata__``: the index's own name check fires (§10
    check 8), before any comparison with the record."""
    _, p = keyframe_file()
    err = raises(CorruptError, reader, with_tensor(p, index_name=RESERVED))
    assert "reserved" in str(err) and "INDX" in str(err)


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize(("name", "says"), [("a\x01b", "control character"), ("", "empty"),
                                            ("ok\x7f", "control character")])
def test_bad_name_in_index_only_is_refused_by_the_index(reader, name, says):
    """The index's names are checked as the index is read (§10 check 8), not only through the TENS
    record they must match: a control character or an empty name there is the index's fault."""
    _, p = keyframe_file()
    err = raises(CorruptError, reader, with_tensor(p, index_name=name))
    assert says in str(err) and "INDX" in str(err)


@pytest.mark.parametrize("reader", READERS)
def test_reserved_name_in_tens_only_is_corrupt(reader):
    _, p = keyframe_file()
    err = raises(CorruptError, reader, with_tensor(p, payload_name=RESERVED.encode()))
    assert "reserved" in str(err)


def test_stream_reader_never_yields_a_reserved_name():
    """The streaming reader refuses the TENS record itself, before it could hand the tensor out."""
    data, p = keyframe_file()
    bad = with_tensor(p, payload_name=RESERVED.encode(), index_name=RESERVED)
    got = []
    with pytest.raises(CorruptError):
        for name, _arr in StreamReader(io.BytesIO(bad)):
            got.append(name)
    assert got == []


def test_reserved_name_in_a_multi_tensor_file():
    """A reserved name after valid tensors: DeltaReader refuses at open (the index), and StreamReader
    hands out the tensors before it but never the reserved one."""
    target = {"a": np.ones(3, np.float32), "b": np.arange(4, dtype=np.int16)}
    p = parse_file(arcfmt.encode(None, target, workers=1, effort="fast"), block_records=True)
    i = [j for j, r in enumerate(p.recs) if r.type == L.TENS][1]
    th = records.parse_tensor(p.recs[i].payload, "test")
    recs = list(p.recs)
    recs[i] = Rec(L.TENS, L.build_tensor_payload(RESERVED.encode(), th.dtype.code, th.shape, th.block_elems, 0,
                                                 None, th.target_hash), name=RESERVED)
    data = assemble(p, recs)
    with pytest.raises(CorruptError):
        arcfmt.DeltaReader(data)
    got = []
    with pytest.raises(CorruptError):
        for name, _ in StreamReader(io.BytesIO(data)):
            got.append(name)
    assert got == ["a"]


# ------------------------------------------------------------------------------------- shapes

LIMIT_SHAPES = {
    "[0, 2^64-1]": [0, 2**64 - 1],
    "[2^64-1, 0]": [2**64 - 1, 0],
    "[0, 2^41]": [0, 2**41],
    "[2^41, 0]": [2**41, 0],
    "[0, 2^32, 2^32] (wraps to 0)": [0, 2**32, 2**32],
    "[2^32, 2^32] (wraps to 0)": [2**32, 2**32],
    "[2^63, 2, 0] (wraps to 0)": [2**63, 2, 0],
    "[2^21, 0, 2^20] (partial product)": [2**21, 0, 2**20],
    "[1]*15 + [0, 2^41]": [1] * 14 + [0, 2**41],
}


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("what", list(LIMIT_SHAPES))
def test_shape_beyond_the_element_limit_is_limit(reader, what):
    _, p = empty_tensor_file()
    err = raises(LimitError, reader, with_tensor(p, dims=LIMIT_SHAPES[what]))
    assert "MAX_TENSOR_ELEMS" in str(err)


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("dims", [[0, 5], [5, 0], [0], [2**40, 0], [0, 2**20, 2**20], [2**20, 0, 2**20],
                                  [1] * 15 + [0]], ids=str)
def test_empty_tensor_within_the_limit_decodes(reader, dims):
    _, p = empty_tensor_file()
    out = reader(with_tensor(p, dims=dims))
    assert out["e"].shape == tuple(dims) and out["e"].size == 0 and out["e"].dtype == np.float32


def test_element_count_checks_partial_products():
    assert records.element_count([], "t") == 1
    assert records.element_count([0, 2**40], "t") == 0
    assert records.element_count([2**20, 2**20], "t") == 2**40
    for dims in ([2**40 + 1], [2**20, 2**20 + 1], [0, 2**40 + 1], [2**64 - 1, 2**64 - 1, 0], [2**32, 2**32]):
        with pytest.raises(LimitError):
            records.element_count(dims, "t")


@pytest.mark.parametrize("shape", [(1 << 41, 0), (0, 1 << 41), (1 << 21, 0, 1 << 20)], ids=str)
def test_writer_refuses_shapes_a_decoder_must_refuse(shape):
    """R-WRITER-LIMITS: numpy holds these empty arrays, the format must not carry them: InputError."""
    with pytest.raises(InputError) as info:
        arcfmt.encode(None, {"z": np.zeros(shape, np.float32)}, workers=1)
    assert type(info.value) is InputError


def test_writer_refuses_too_many_dims_and_blocks():
    with pytest.raises(InputError):
        arcfmt.encode(None, {"d": np.zeros((1,) * (L.MAX_DIMS + 1), np.float32)}, workers=1)
    with pytest.raises(InputError):  # 2^24 + 1 blocks of one element
        arcfmt.encode(None, {"b": np.zeros(L.MAX_BLOCKS_PER_TENSOR + 1, np.uint8)}, block_elems=1, workers=1)
    d = arcfmt.encode(None, {"z": np.zeros((1 << 20, 0, 1 << 20), np.float32)}, workers=1)  # at the limit
    assert arcfmt.decode(None, d)["z"].shape == (1 << 20, 0, 1 << 20)


# ------------------------------------------------------------------------------------- index sums

@pytest.mark.parametrize("reader", READERS)
def test_index_block_counts_that_wrap_are_corrupt(reader):
    """Counts of 2^63 + B each: their 64-bit sum wraps to block_count. Exact sums say `corrupt` (§10
    check 3), where a wrapped sum would pass and the per-tensor limit would say `limit`."""
    base = {"a": np.zeros(8, np.float32), "b": np.zeros(8, np.float32)}
    target = {"a": np.ones(8, np.float32), "b": np.ones(8, np.float32)}
    data = arcfmt.encode(base, target, block_elems=4, workers=1)
    p = parse_file(data)
    fields = index_fields(records.build_index(p.index), p.index.compact)
    fields["tens_block_counts"] = [c + (1 << 63) for c in fields["tens_block_counts"]]
    bad = assemble(p, index_payload=raw_index_payload(L.index_body(p.index.compact).build(fields)))
    raises(CorruptError, reader, bad, base)


# ------------------------------------------------------------------------------------- exposure

def test_no_reader_hands_out_a_tensor_before_its_hash_matched():
    """R-NO-UNVERIFIED-BYTES: a tensor whose target_hash does not match is never returned or yielded,
    and apply_in_place leaves its live array untouched."""
    base = {"a": np.zeros(8, np.float32), "b": np.zeros(8, np.float32)}
    target = {"a": np.ones(8, np.float32), "b": np.full(8, 2, np.float32)}
    p = parse_file(arcfmt.encode(base, target, block_elems=4, workers=1))
    i = [j for j, r in enumerate(p.recs) if r.type == L.TENS][1]
    th = records.parse_tensor(p.recs[i].payload, "test")
    recs = list(p.recs)
    recs[i] = Rec(L.TENS, L.build_tensor_payload(b"b", th.dtype.code, th.shape, th.block_elems, L.NEEDS_BASE,
                                                 th.base_hash, th.target_hash ^ 1), name="b")
    heads = [records.parse_tensor(r.payload, "test") for r in recs if r.type == L.TENS]
    digest = model_digest([(h.name.encode(), h.dtype.code, h.shape, h.target_hash) for h in heads])
    bad = assemble(p, recs, target_digest=digest)  # the wrong hash is the file's only fault
    got = []
    with pytest.raises(VerificationError):
        for name, _ in StreamReader(io.BytesIO(bad), base):
            got.append(name)
    assert got == ["a"]
    reader = arcfmt.DeltaReader(bad, workers=1)
    assert_bit_exact({"a": reader.to_array("a", reader.decode_tensor("a", reader.check_base("a", base["a"])))},
                     {"a": target["a"]})
    with pytest.raises(VerificationError):
        reader.decode_tensor("b", reader.check_base("b", base["b"]))
    with pytest.raises(VerificationError):
        arcfmt.decode(base, bad, workers=1)
    live = {n: a.copy() for n, a in base.items()}
    done = []
    with pytest.raises(VerificationError):
        for name, _ in arcfmt.apply_in_place(live, bad, workers=1):
            done.append(name)
    assert "b" not in done
    assert_bit_exact({"b": live["b"]}, {"b": base["b"]})  # the failing tensor's live array is untouched
    if "a" in done:  # a tensor handed out was verified and stays updated
        assert_bit_exact({"a": live["a"]}, {"a": target["a"]})


# ------------------------------------------------------------------------------------- prefixed names

@pytest.mark.parametrize("reader", READERS)
def test_names_travel_after_the_prefix_they_share(reader):
    """The writer sets PREFIXED_NAMES (SPEC.md §6, §7, 1.3) and stores each name after the bytes it shares
    with the previous one: its TENS records are smaller by those bytes (less a varint each), and every reader
    rebuilds the same tensors from it as from the file with every name whole."""
    names = ["model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight",
             "model.layers.0.self_attn", "lm_head.weight", "a\u00e9", "a\u00e8"]
    rng = np.random.default_rng(5)
    base = {n: rng.standard_normal(6).astype(np.float32) for n in names}
    target = {n: v + np.float32(1) for n, v in base.items()}
    d = arcfmt.encode(base, target, workers=1)
    p = parse_file(d)
    assert p.prefixed and records.parse_meta(d[32:52]).prefixed_names
    whole = assemble(p, prefixed=False)
    shared = [len(os.path.commonprefix((a.encode(), b.encode()))) for a, b in zip([""] + names, names)]
    tens_bytes = [sum(r.size for r in parse_file(x).recs if r.type == L.TENS) for x in (whole, d)]
    assert tens_bytes[0] - tens_bytes[1] == sum(shared) - len(names)   # each: k bytes fewer, a varint more
    assert shared[5] == 2  # "a\xc3" of a\xc3\xa9: the prefix ends inside a UTF-8 sequence
    for data in (d, whole):
        got = reader(data, base)
        assert list(got) == names
        assert_bit_exact(got, target)


def test_a_stream_remembers_no_more_names_than_an_index_holds(monkeypatch):
    """Streaming (SPEC.md §12.2 step 3): the TENS record whose name brings the names read past
    MAX_INDEX_BYTES is `limit` where it is met — with prefixed names a 35-byte record carries a
    1024-byte name, and the names the reader keeps grew 30x faster than the input until the index.
    (The limit is lowered here; conformance has the vector at MAX_INDEX_BYTES.)"""
    limit = "MAX_INDEX_BYTES"
    names = [f"{'n' * 40}.{i:03d}" for i in range(30)]
    target = {n: np.zeros(0, np.float32) for n in names}
    d = arcfmt.encode(None, target, workers=1)
    assert stream_decode(d).keys() == target.keys()
    recs = parse_file(d).recs
    assert [r.type for r in recs[:31]] == [L.META] + [L.TENS] * 30
    monkeypatch.setattr(L, limit, 20 * 44 + 10)   # names of 44 bytes: the 21st passes it
    err = raises(LimitError, streaming, d)
    assert f"TENS at offset {recs[21].offset}" in str(err) and limit in str(err)
    raises(LimitError, streaming, d[:recs[22].offset])   # the stream ends after the 21st tensor: limit first
