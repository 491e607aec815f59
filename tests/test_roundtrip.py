"""Bit-exact round trips: ``arcfmt.encode`` -> ``arcfmt.decode`` (random access) and the streaming reader.

Every dtype of SPEC.md §2, every special bit pattern (signed zeros, infinities, NaN payloads,
subnormals), every kind of change (mantissa steps, sign flips, exponent changes, all-changed), every
tensor shape case (empty, 0-d, dtype/shape changes, target-only), multi-block tensors, keyframes and
effort levels. Arrays are always compared as bytes / unsigned bit patterns, never with float ``==``.
"""
from __future__ import annotations

import io

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import arcfmt
from support.data import (
    BY_NAME,
    DTYPES,
    FLOAT_DTYPES,
    INT_DTYPES,
    StreamReader,
    assert_bit_exact,
    assert_same_tensor,
    bits_of,
    encodings_of,
    from_bits,
    make_pair,
    random_bits,
    random_values,
    roundtrip,
    stream_decode,
)

EFFORTS = ["fast", "default"]
ALL_ENCODINGS = {"unchanged", "xor", "bf16-delta", "float-delta", "keyframe", "ctx-delta", "dense-delta",
                 "ctx-delta-rc", "ctx-delta-rp"}
CTX_DTYPES = [d for d in FLOAT_DTYPES if d.name != "F64"]


def delta_name(dt) -> str:
    return "bf16-delta" if dt.name == "BF16" else "float-delta"


def delta_names(dt) -> set:
    """The sparse-delta encodings the writer may pick for a float dtype (SPEC.md §8.3, §8.4, §8.6)."""
    return {delta_name(dt)} | ({"ctx-delta", "ctx-delta-rc", "ctx-delta-rp"} if dt.name != "F64" else set())


def encode_forced(base, target, encoding, **kw) -> bytes:
    buf = io.BytesIO()
    with arcfmt.DeltaWriter(buf, force_encoding=encoding, **kw) as w:
        w.write_tensors((n, None if base is None else base.get(n), t) for n, t in target.items())
    return buf.getvalue()


def describe(delta) -> dict:
    return {t["name"]: t for t in arcfmt.DeltaReader(delta).describe()["tensors"]}


def float_specials(dt) -> list[int]:
    """Bit patterns of every special kind of value of a float dtype (SPEC.md §2: bit patterns only)."""
    E, M, bits = dt.E, dt.M, dt.bits
    sign = 1 << (bits - 1)
    expmask = ((1 << E) - 1) << M
    mmask = (1 << M) - 1
    one = ((1 << (E - 1)) - 1) << M
    pats = [
        0, sign,                                            # +0, -0
        expmask, sign | expmask,                            # +inf, -inf (E4M3fn: max-exponent numbers)
        expmask | 1, expmask | mmask,                       # NaN: smallest and largest payload
        expmask | (1 << (M - 1)), expmask | (1 << (M - 1)) | 1,   # quiet NaNs (with a payload)
        sign | expmask | 1, sign | expmask | mmask,         # negative NaNs
        sign | expmask | (1 << (M - 1)),
        1, mmask, sign | 1, sign | mmask,                   # smallest/largest subnormals, both signs
        1 << M, sign | (1 << M),                            # smallest normals
        (expmask - (1 << M)) | mmask, sign | (expmask - (1 << M)) | mmask,  # largest finite
        one, sign | one, one | 1, one | mmask,              # 1.0, -1.0 and neighbours
        int("55" * dt.width, 16), int("aa" * dt.width, 16), (1 << bits) - 1,
    ]
    return sorted(set(p & ((1 << bits) - 1) for p in pats))


# ------------------------------------------------------------------------------ every dtype

@pytest.mark.parametrize("effort", EFFORTS)
@pytest.mark.parametrize("dt", DTYPES, ids=repr)
def test_every_dtype_roundtrip(dt, effort):
    shapes = [(33,), (4, 5), (), (0,), (2, 0, 3), (3, 1, 2)]
    base, target = make_pair(11 + dt.code, dt, shapes, density=0.3)
    roundtrip(base, target, effort=effort, workers=1)
    roundtrip(base, target, effort=effort, block_elems=4, workers=2)
    # Unchanged and all-changed tensors of the same dtype.
    rng = np.random.default_rng(dt.code)
    b = random_bits(rng, dt, (17,))
    roundtrip({"x": b}, {"x": b.copy()}, effort=effort)
    flipped = from_bits(~bits_of(b).astype(np.uint64), dt)
    roundtrip({"x": b}, {"x": flipped}, effort=effort)


@pytest.mark.parametrize("dt", DTYPES, ids=repr)
def test_random_bit_patterns_roundtrip(dt):
    """Arbitrary bit patterns (every NaN payload and subnormal can appear) in base and target."""
    rng = np.random.default_rng(1000 + dt.code)
    for density in (0.0, 0.01, 0.3, 0.7, 1.0):
        b = random_bits(rng, dt, (257,))
        mask = rng.random(257) < density
        t = np.where(mask, bits_of(random_bits(rng, dt, (257,))), bits_of(b)).view(dt.np)
        roundtrip({"a": b}, {"a": t}, effort="fast", block_elems=64)


# ------------------------------------------------------------------------------ exhaustive bit patterns

@pytest.mark.parametrize("name", ["F8_E4M3", "F8_E5M2"])
def test_fp8_every_transition(name):
    """Every (base, target) pair of the 256 x 256 FP8 bit patterns, in one tensor and as keyframes."""
    dt = BY_NAME[name]
    allp = np.arange(256, dtype=np.uint8)
    base = {"x": from_bits(np.repeat(allp, 256), dt)}
    target = {"x": from_bits(np.tile(allp, 256), dt)}
    d = roundtrip(base, target, effort="fast", block_elems=4096)
    assert encodings_of(d) <= ALL_ENCODINGS
    roundtrip(None, {"x": from_bits(allp, dt)}, effort="fast")
    roundtrip(None, target, effort="fast", block_elems=1000)


@pytest.mark.parametrize("name", ["BOOL", "U8", "I8"])
def test_8bit_int_every_transition(name):
    """Every (base, target) byte pair, including BOOL bytes other than 0/1 (carried as is, §2)."""
    dt = BY_NAME[name]
    allp = np.arange(256, dtype=np.uint8)
    base = {"x": from_bits(np.repeat(allp, 256), dt)}
    target = {"x": from_bits(np.tile(allp, 256), dt)}
    roundtrip(base, target, effort="fast", block_elems=8192)
    roundtrip(None, {"x": from_bits(allp, dt)}, effort="fast")
    roundtrip({"x": from_bits(allp, dt)}, {"x": from_bits(allp[::-1], dt)}, effort="fast")


@pytest.mark.parametrize("name", ["F16", "BF16"])
def test_16bit_floats_every_pattern(name):
    """All 65 536 bit patterns of F16 / BF16 as base, under several whole-tensor transformations."""
    dt = BY_NAME[name]
    allp = np.arange(1 << 16, dtype=np.uint16)
    base = {"x": from_bits(allp, dt)}
    perm = np.random.default_rng(5).permutation(allp)
    for tbits in (np.roll(allp, 1), allp ^ 0x8000, allp + np.uint16(1), allp - np.uint16(1), perm, ~allp,
                  allp ^ np.uint16(1 << dt.M)):
        roundtrip(base, {"x": from_bits(tbits, dt)}, effort="fast", block_elems=1 << 14)
    roundtrip(None, base, effort="fast")
    roundtrip(None, base, effort="fast", block_elems=5000)


@pytest.mark.parametrize("dt", FLOAT_DTYPES, ids=repr)
def test_float_specials_every_transition(dt):
    """±0, ±inf, NaN payloads (quiet, signalling, negative), subnormals, extremes: every pair."""
    s = np.array(float_specials(dt), dtype=np.uint64)
    k = s.size
    base = {"x": from_bits(np.repeat(s, k), dt)}
    target = {"x": from_bits(np.tile(s, k), dt)}
    for effort in EFFORTS:
        roundtrip(base, target, effort=effort)
    roundtrip(base, target, effort="fast", block_elems=7)
    roundtrip(None, target, effort="fast")
    roundtrip(base, target, keyframe=True, effort="fast")


@pytest.mark.parametrize("dt", FLOAT_DTYPES, ids=repr)
def test_float_specials_sparse_delta(dt):
    """The same transitions as sparse changes, so the delta encoding (§8.3/8.4) carries them."""
    s = float_specials(dt)
    pairs = [(a, b) for a in s for b in s if a != b]
    rng = np.random.default_rng(dt.code)
    m = 40 * len(pairs)
    bbits = bits_of(random_values(rng, dt, (m,))).copy()
    tbits = bbits.copy()
    pos = np.sort(rng.choice(m, size=len(pairs), replace=False))
    for p, (a, b) in zip(pos.tolist(), pairs):
        bbits[p] = a
        tbits[p] = b
    base = {"x": bbits.view(dt.np)}
    target = {"x": tbits.view(dt.np)}
    d = roundtrip(base, target, effort="fast")
    assert encodings_of(d) & delta_names(dt)
    for enc in delta_names(dt):  # each sparse-delta encoding carries every transition
        d = encode_forced(base, target, enc)
        assert encodings_of(d) == {enc}
        assert_bit_exact(arcfmt.decode(base, d), target)
        assert_bit_exact(stream_decode(d, base), target)


@pytest.mark.parametrize("dt", FLOAT_DTYPES, ids=repr)
def test_extreme_mantissa_steps(dt):
    """Kept changes with the largest steps (±mask_M), both signs, incl. inf <-> NaN (same exponent)."""
    M, bits = dt.M, dt.bits
    mask = (1 << M) - 1
    sign = 1 << (bits - 1)
    expmask = ((1 << dt.E) - 1) << M
    one = ((1 << (dt.E - 1)) - 1) << M
    pairs = []
    for sg in (0, sign):
        for ex in (0, 1 << M, one, expmask):
            pairs += [(sg | ex, sg | ex | mask), (sg | ex | mask, sg | ex), (sg | ex | 1, sg | ex | mask),
                      (sg | ex | mask, sg | ex | 1), (sg | ex, sg | ex | 1), (sg | ex | 1, sg | ex)]
    m = 2000
    rng = np.random.default_rng(7)
    bbits = bits_of(random_values(rng, dt, (m,))).copy()
    tbits = bbits.copy()
    pos = np.sort(rng.choice(m, size=len(pairs), replace=False))
    for p, (a, b) in zip(pos.tolist(), pairs):
        bbits[p], tbits[p] = a, b
    base, target = {"x": bbits.view(dt.np)}, {"x": tbits.view(dt.np)}
    for effort in EFFORTS:
        d = roundtrip(base, target, effort=effort)
        blocks = describe(d)["x"]["blocks"]
        assert len(blocks) == 1 and blocks[0]["encoding"] in delta_names(dt)
        assert blocks[0]["changed"] == len(pairs)
    for enc in delta_names(dt):
        d = encode_forced(base, target, enc)
        assert encodings_of(d) == {enc}
        assert_bit_exact(arcfmt.decode(base, d), target)


@pytest.mark.parametrize("dt", FLOAT_DTYPES, ids=repr)
@pytest.mark.parametrize("change", ["step", "sign", "exponent", "nan_payload", "zero_sign"])
def test_float_change_kinds(dt, change):
    """Each kind of float change on its own, sparse and dense."""
    rng = np.random.default_rng(dt.code * 10 + len(change))
    for density in (0.01, 1.0):
        b = random_values(rng, dt, (300,))
        u = bits_of(b).copy()
        expmask = ((1 << dt.E) - 1) << dt.M
        if change == "nan_payload":
            u[:] = u.dtype.type(expmask | 1)
            b = u.view(dt.np).copy()
        if change == "zero_sign":
            u[:] = 0
            b = u.view(dt.np).copy()
        n = max(1, int(300 * density))
        pos = np.sort(rng.choice(300, size=n, replace=False))
        t = u.copy()
        for p in pos.tolist():
            v = int(t[p])
            if change == "step":
                mant = v & ((1 << dt.M) - 1)
                v = v + 1 if mant < (1 << dt.M) - 1 else v - 1
            elif change == "sign" or change == "zero_sign":
                v ^= 1 << (dt.bits - 1)
            elif change == "exponent":
                v ^= 1 << dt.M
            else:
                v = expmask | ((p % ((1 << dt.M) - 1)) + 1)
                if v == int(u[p]):
                    v ^= 2 if dt.M > 1 else 1 << (dt.bits - 1)
            t[p] = u.dtype.type(v)
        roundtrip({"x": b}, {"x": t.view(dt.np)}, effort="fast", block_elems=128)


# ------------------------------------------------------------------------------ integers

@pytest.mark.parametrize("dt", INT_DTYPES, ids=repr)
def test_integer_extremes(dt):
    bits = dt.bits
    pats = sorted({0, 1, (1 << bits) - 1, 1 << (bits - 1), (1 << (bits - 1)) - 1, 2, (1 << bits) - 2})
    s = np.array(pats, dtype=np.uint64)
    k = s.size
    base = {"x": from_bits(np.repeat(s, k), dt)}
    target = {"x": from_bits(np.tile(s, k), dt)}
    for effort in EFFORTS:
        roundtrip(base, target, effort=effort)
    roundtrip(None, target)
    rng = np.random.default_rng(3)
    b = random_bits(rng, dt, (1000,))
    t = bits_of(b).copy()
    t[rng.choice(1000, 5, replace=False)] ^= t.dtype.type(1 << (bits - 1))
    d = roundtrip({"x": b}, {"x": t.view(dt.np)})
    assert encodings_of(d) == {"xor"}


# ------------------------------------------------------------------------------ shapes and tensor sets

@pytest.mark.parametrize("dt", DTYPES, ids=repr)
def test_empty_and_scalar_tensors(dt):
    rng = np.random.default_rng(dt.code)
    shapes = [(0,), (3, 0), (0, 0, 5), (5, 0, 2, 1)]
    base = {f"e{i}": random_bits(rng, dt, s) for i, s in enumerate(shapes)}
    target = {f"e{i}": random_bits(rng, dt, s) for i, s in enumerate(shapes)}
    base["s"] = random_bits(rng, dt, ())
    target["s"] = from_bits(bits_of(base["s"]) ^ 1, dt).reshape(())
    base["s2"] = random_bits(rng, dt, ())
    target["s2"] = base["s2"].copy()
    target["only_empty"] = random_bits(rng, dt, (0, 4))
    target["only_scalar"] = random_bits(rng, dt, ())
    d = roundtrip(base, target, effort="fast")
    desc = describe(d)
    for name in ("e0", "e1", "e2", "e3", "only_empty"):
        assert desc[name]["blocks"] == [] and desc[name]["elements"] == 0
    assert desc["s"]["shape"] == [] and desc["s"]["elements"] == 1
    assert desc["s2"]["encodings"] == ["unchanged"]
    roundtrip(None, target, effort="fast")
    roundtrip(base, target, keyframe=True, effort="fast")


@pytest.mark.parametrize("pair", [("F32", "BF16"), ("BF16", "F16"), ("I32", "U32"), ("I64", "F64"),
                                  ("U8", "BOOL"), ("F8_E4M3", "F8_E5M2"), ("I16", "BF16")])
def test_dtype_changes_between_base_and_target(pair):
    bdt, tdt = BY_NAME[pair[0]], BY_NAME[pair[1]]
    rng = np.random.default_rng(bdt.code * 16 + tdt.code)
    base = {"x": random_bits(rng, bdt, (6, 5)), "y": random_values(rng, bdt, (4,))}
    target = {"x": random_bits(rng, tdt, (6, 5)), "y": random_values(rng, tdt, (4,))}
    d = roundtrip(base, target, effort="fast")
    desc = describe(d)
    for name in ("x", "y"):
        assert desc[name]["needs_base"] is False
        assert desc[name]["dtype"] == tdt.name
        assert desc[name]["encodings"] == ["keyframe"]
    assert_bit_exact(arcfmt.decode(None, d), target)  # needs no base at all


@pytest.mark.parametrize("shapes", [((4, 6), (6, 4)), ((24,), (4, 6)), ((3,), ()), ((), (1,)), ((0,), (0, 0)),
                                    ((5,), (0,)), ((2, 3), (2, 4)), ((1, 1, 1), (1,))])
def test_shape_changes_between_base_and_target(shapes):
    dt = BY_NAME["BF16"]
    rng = np.random.default_rng(len(shapes[0]) * 7 + len(shapes[1]))
    base = {"x": random_values(rng, dt, shapes[0])}
    target = {"x": random_values(rng, dt, shapes[1])}
    d = roundtrip(base, target, effort="fast")
    assert describe(d)["x"]["needs_base"] is False
    assert describe(d)["x"]["shape"] == list(shapes[1])


def test_tensors_only_in_target_or_only_in_base():
    base, target = make_pair(21, "BF16", [(10,), (12,)], 0.2, names=["a", "b"])
    base["gone"] = np.ones(4, np.float32)
    target["new"] = np.arange(7, dtype=np.int64)
    target["new_f"] = np.float16([np.inf, -0.0, np.nan])
    d = roundtrip(base, target, effort="fast")
    desc = describe(d)
    assert set(desc) == {"a", "b", "new", "new_f"}
    assert desc["new"]["needs_base"] is False and desc["a"]["needs_base"] is True
    # A base missing the target-only tensors is fine; one carrying extra tensors too.
    got = arcfmt.decode({k: v for k, v in base.items() if k in ("a", "b")}, d)
    assert_bit_exact(got, target)


@pytest.mark.parametrize("block_elems", [1, 2, 3, 7, 64, 129, 130, 131, 1 << 20])
@pytest.mark.parametrize("dtname", ["BF16", "F32", "I8", "F64", "F8_E5M2"])
def test_multi_block_tensors(dtname, block_elems):
    dt = BY_NAME[dtname]
    base, target = make_pair(block_elems + dt.code, dt, [(10, 13), (3,), ()], 0.15)
    d = roundtrip(base, target, block_elems=block_elems, effort="fast", workers=2)
    desc = describe(d)
    t0 = desc["layer.0.weight"]
    assert len(t0["blocks"]) == -(-130 // min(block_elems, 130))
    assert t0["block_elems"] == min(block_elems, 130)
    # Blocks are independent: some unchanged, some with changes, in one tensor.
    if block_elems == 7:
        assert "unchanged" in t0["encodings"] and len(t0["encodings"]) > 1


@pytest.mark.parametrize("m", [1, 2, 255, 256, 257, 65536, 65537, 70000])
def test_position_and_index_widths(m):
    """Position width bytes_for(m-1) and exception-index width bytes_for(c-1) at their boundaries."""
    dt = BY_NAME["BF16"]
    rng = np.random.default_rng(m)
    b = random_values(rng, dt, (m,))
    u = bits_of(b).copy()
    idx = sorted({0, m - 1, m // 2, max(0, m - 2)})
    t = u.copy()
    for p in idx:
        t[p] = t[p] ^ np.uint16(1)  # kept change
    roundtrip({"x": b}, {"x": t.view(dt.np)}, effort="fast")
    if m >= 1000:
        # ~300 changes, half exceptions: exception indices need 2 bytes (c - 1 >= 256).
        pos = np.sort(rng.choice(m, size=300, replace=False))
        t = u.copy()
        t[pos[::2]] ^= np.uint16(0x8000)
        t[pos[1::2]] ^= np.uint16(1)
        d = encode_forced({"x": b}, {"x": t.view(dt.np)}, "bf16-delta", effort="fast", block_elems=m)
        assert_bit_exact(arcfmt.decode({"x": b}, d), {"x": t.view(dt.np)})
        blk = describe(d)["x"]["blocks"][0]
        assert blk["encoding"] == "bf16-delta" and blk["changed"] == 300


# ------------------------------------------------------------------------------ keyframes and efforts

@pytest.mark.parametrize("effort", EFFORTS)
@pytest.mark.parametrize("dt", DTYPES, ids=repr)
def test_keyframes(dt, effort):
    rng = np.random.default_rng(dt.code + 77)
    target = {"a": random_bits(rng, dt, (9, 7)), "b": random_values(rng, dt, (40,)), "c": random_bits(rng, dt, ()),
              "d": random_bits(rng, dt, (0,))}
    base = {k: random_bits(rng, dt, v.shape) for k, v in target.items()}
    for d in (arcfmt.encode(None, target, effort=effort, block_elems=16),
              arcfmt.encode(base, target, effort=effort, block_elems=16, keyframe=True)):
        desc = describe(d)
        for t in desc.values():
            assert t["needs_base"] is False
            assert all(b["encoding"] == "keyframe" for b in t["blocks"])
        assert arcfmt.DeltaReader(d).base_digest == bytes(16)  # §10: no tensor needs a base
        assert_bit_exact(arcfmt.decode(None, d), target)
        assert_bit_exact(arcfmt.decode(base, d), target)
        assert_bit_exact(stream_decode(d, None), target)
        assert_bit_exact(stream_decode(d, base), target)


@pytest.mark.parametrize("effort", EFFORTS)
def test_effort_levels_same_result(effort):
    base, target = make_pair(5, "BF16", [(64, 64), (1000,)], 0.02)
    d = roundtrip(base, target, effort=effort, block_elems=1024)
    assert encodings_of(d) <= ALL_ENCODINGS


def test_effort_levels_agree_on_decoded_data():
    base, target = make_pair(6, "F32", [(50, 20)], 0.3)
    outs = [arcfmt.decode(base, arcfmt.encode(base, target, effort=e)) for e in EFFORTS]
    for o in outs:
        assert_bit_exact(o, target)


# ------------------------------------------------------------------------------ encodings

def _encoding_case(enc):
    rng = np.random.default_rng(len(enc))
    if enc == "unchanged":
        b = random_values(rng, BY_NAME["F32"], (100,))
        return {"x": b}, {"x": b.copy()}
    if enc == "xor":
        b = random_bits(rng, BY_NAME["I32"], (100,))
        t = b.copy()
        t[::10] += 3
        return {"x": b}, {"x": t}
    if enc == "bf16-delta":
        b = random_values(rng, BY_NAME["BF16"], (500,))
        t = bits_of(b).copy()
        t[::50] ^= np.uint16(1)
        return {"x": b}, {"x": t.view(ml_dtypes.bfloat16)}
    if enc == "float-delta":
        b = random_values(rng, BY_NAME["F32"], (500,))
        t = bits_of(b).copy()
        t[::50] ^= np.uint32(1)
        return {"x": b}, {"x": t.view(np.float32)}
    if enc == "keyframe":
        return None, {"x": random_values(rng, BY_NAME["BF16"], (100,))}
    if enc == "ctx-delta":   # too few changes (10) for ctx-delta-rc's range coder to pay its start
        base, target = make_pair(9, "BF16", [(20000,)], 0.0005)
        return base, target
    if enc in ("ctx-delta-rc", "ctx-delta-rp"):   # many changes whose size in ulps follows the exponent (§8.9)
        w = (rng.standard_normal(100_000) * 0.05).astype(np.float32)
        u = (rng.standard_normal(100_000) * 1e-4).astype(np.float32)
        b, t = (w.view(np.uint32) >> 16).astype(np.uint16), ((w + u).view(np.uint32) >> 16).astype(np.uint16)
        return {"x": b.view(ml_dtypes.bfloat16)}, {"x": t.view(ml_dtypes.bfloat16)}
    if enc == "dense-delta":   # a bias that moves every step by one unit, but for a few elements
        b = random_values(rng, BY_NAME["BF16"], (20000,))
        t = bits_of(b) + np.uint16(1)
        t[::97] = bits_of(b)[::97]
        return {"x": b}, {"x": t.view(ml_dtypes.bfloat16)}
    raise AssertionError(enc)


_WRITER_PICKS = {"unchanged", "xor", "keyframe", "ctx-delta", "dense-delta", "ctx-delta-rc"}  # chosen unforced


@pytest.mark.parametrize("enc", sorted(ALL_ENCODINGS))
def test_each_block_encoding_occurs(enc):
    base, target = _encoding_case(enc)
    if enc in _WRITER_PICKS:
        d = roundtrip(base, target, effort="fast")
    else:  # bf16-delta / float-delta (ctx-delta is usually smaller), ctx-delta-rp (effort max): by name
        d = encode_forced(base, target, enc)
        assert_bit_exact(arcfmt.decode(base, d), target)
        assert_bit_exact(stream_decode(d, base), target)
    assert enc in encodings_of(d)


def test_all_block_encodings_covered():
    seen = set()
    for enc in ALL_ENCODINGS:
        base, target = _encoding_case(enc)
        seen |= encodings_of(arcfmt.encode(base, target, effort="fast") if enc in _WRITER_PICKS
                             else encode_forced(base, target, enc))
    # Dense float changes choose xor or keyframe over the delta: also a valid, decodable file.
    base, target = make_pair(8, "BF16", [(400,)], 1.0)
    seen |= encodings_of(roundtrip(base, target, effort="fast"))
    assert seen == ALL_ENCODINGS


@pytest.mark.parametrize("dt", [d for d in FLOAT_DTYPES if d.name != "BF16"], ids=repr)
def test_float_delta_for_every_float_dtype(dt):
    rng = np.random.default_rng(dt.code)
    b = random_values(rng, dt, (400,))
    t = bits_of(b).copy()
    t[::40] ^= t.dtype.type(1)
    t[5] ^= t.dtype.type(1 << (dt.bits - 1))  # plus one exception
    d = roundtrip({"x": b}, {"x": t.view(dt.np)}, effort="fast")
    assert encodings_of(d) <= delta_names(dt) and encodings_of(d)
    d = encode_forced({"x": b}, {"x": t.view(dt.np)}, "float-delta")
    assert encodings_of(d) == {"float-delta"}
    assert_bit_exact(arcfmt.decode({"x": b}, d), {"x": t.view(dt.np)})


# ------------------------------------------------------------------------------ inputs and readers

def test_decode_accepts_buffers_and_file_objects():
    base, target = make_pair(31, "BF16", [(50,), (3, 3)], 0.2)
    d = arcfmt.encode(base, target)
    for src in (d, bytearray(d), memoryview(d), io.BytesIO(d)):
        assert_bit_exact(arcfmt.decode(base, src), target)


def test_non_contiguous_inputs_roundtrip_as_logical_values():
    rng = np.random.default_rng(4)
    b = random_values(rng, BY_NAME["F32"], (8, 6))
    t = b.copy()
    t[2, 3] = np.float32(7.5)
    base = {"x": b.T, "y": b[::2, 1:]}
    target = {"x": t.T, "y": t[::2, 1:]}
    d = roundtrip(base, target)
    assert_bit_exact(arcfmt.decode({k: np.ascontiguousarray(v) for k, v in base.items()}, d), target)


def test_decode_does_not_modify_base():
    base, target = make_pair(32, "BF16", [(100,), (10, 10)], 0.3)
    before = {k: v.tobytes() for k, v in base.items()}
    roundtrip(base, target, block_elems=16)
    assert {k: v.tobytes() for k, v in base.items()} == before


def test_stream_reader_yields_in_file_order_and_checks_index():
    base, target = make_pair(33, "F16", [(5,), (6,), (7,)], 0.5, names=["z", "a", "m"])
    d = arcfmt.encode(base, target)
    reader = StreamReader(io.BytesIO(d), base)
    names = [n for n, _ in reader]
    assert names == ["z", "a", "m"]
    assert reader.index is not None


def test_decode_subset_of_names():
    base, target = make_pair(34, "BF16", [(5,), (6,), (7,)], 0.5, names=["a", "b", "c"])
    d = arcfmt.encode(base, target)
    got = arcfmt.decode(base, d, names=["b"])
    assert list(got) == ["b"]
    assert_same_tensor(got["b"], target["b"])


def test_steps_and_digests_recorded():
    base, target = make_pair(35, "BF16", [(5,)], 0.5)
    d = arcfmt.encode(base, target, base_step=3, target_step=1 << 40)
    r = arcfmt.DeltaReader(d)
    assert (r.base_step, r.target_step) == (3, 1 << 40)
    assert r.version == arcfmt.FORMAT_VERSION == (1, 10)
    d2 = arcfmt.encode(base, target)
    r2 = arcfmt.DeltaReader(d2)
    assert (r2.base_step, r2.target_step) == (None, None)
    assert r.target_digest == r2.target_digest and r.base_digest == r2.base_digest


def test_encoding_is_deterministic():
    base, target = make_pair(36, "BF16", [(300,), (4, 4)], 0.1)
    assert arcfmt.encode(base, target, workers=1) == arcfmt.encode(base, target, workers=3)


# ------------------------------------------------------------------------------ property tests

_dtypes = st.sampled_from(DTYPES)
_shapes = st.lists(st.integers(0, 6), min_size=0, max_size=3).map(tuple)


@st.composite
def _pairs(draw):
    dt = draw(_dtypes)
    shape = draw(_shapes)
    base_bits = draw(hnp.arrays(dt.uint, shape))
    new_bits = draw(hnp.arrays(dt.uint, shape))
    changed = draw(hnp.arrays(np.bool_, shape, elements=st.booleans()))
    target_bits = np.where(changed, new_bits, base_bits).astype(dt.uint)
    return dt, base_bits.view(dt.np), np.ascontiguousarray(target_bits).view(dt.np)


@given(pair=_pairs(), block_elems=st.integers(1, 50), keyframe=st.booleans())
def test_property_roundtrip_raw_bits(pair, block_elems, keyframe):
    dt, b, t = pair
    roundtrip({"x": b}, {"x": t}, block_elems=block_elems, keyframe=keyframe, effort="fast", workers=1)


@st.composite
def _neighbour_pairs(draw):
    """Target = base ± a few units in the bit-pattern domain: crosses binades, inf/NaN and sign edges."""
    dt = draw(st.sampled_from(FLOAT_DTYPES))
    n = draw(st.integers(1, 40))
    base_bits = draw(hnp.arrays(dt.uint, (n,)))
    steps = draw(hnp.arrays(np.int64, (n,), elements=st.integers(-3, 3)))
    t = (base_bits.astype(np.uint64) + steps.astype(np.uint64)).astype(dt.uint)
    return dt, base_bits.view(dt.np), t.view(dt.np)


@given(pair=_neighbour_pairs(), block_elems=st.integers(1, 50))
def test_property_roundtrip_neighbouring_patterns(pair, block_elems):
    dt, b, t = pair
    roundtrip({"x": b}, {"x": t}, block_elems=block_elems, effort="fast", workers=1)


@given(dt=_dtypes, shapes=st.lists(_shapes, min_size=1, max_size=4), density=st.floats(0, 1),
       seed=st.integers(0, 2 ** 32 - 1), block_elems=st.integers(1, 64), effort=st.sampled_from(EFFORTS))
def test_property_roundtrip_models(dt, shapes, density, seed, block_elems, effort):
    base, target = make_pair(seed, dt, shapes, density)
    roundtrip(base, target, block_elems=block_elems, effort=effort, workers=1)
