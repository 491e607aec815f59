"""The ctx-delta encoding (SPEC.md §8.6): round trips over every dtype it covers, its rank/select index,
the encoder's class choice, and every decoder check, through whole files and both read modes."""
from __future__ import annotations

import contextlib
import io

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_bad_input import READERS, _raw, _w_block_file, blck_payload, expect

import arcfmt
from arcfmt import twins
from arcfmt.dtypes import BF16
from arcfmt.encodings import ctx_delta as ctx
from arcfmt.errors import CorruptError
from support.data import BY_NAME, assert_bit_exact, bits_of, from_bits, make_pair, random_values, stream_decode

CTX_NAMES = ["BF16", "F16", "F32", "F8_E4M3", "F8_E5M2"]


def forced(base, target, **kw) -> bytes:
    buf = io.BytesIO()
    with arcfmt.DeltaWriter(buf, force_encoding="ctx-delta", **kw) as w:
        w.write_tensors((n, base[n], t) for n, t in target.items())
    return buf.getvalue()


def check_file(base, target, delta):
    assert_bit_exact(arcfmt.decode(base, delta), target)
    assert_bit_exact(stream_decode(delta, base), target)
    live = {k: v.copy() for k, v in base.items()}
    for _ in arcfmt.apply_in_place(live, delta):
        pass
    assert_bit_exact(live, target)


# ------------------------------------------------------------------------------ order-preserving map

@pytest.mark.parametrize("name", CTX_NAMES)
def test_ordered_is_a_monotone_bijection(name):
    dt = _dtype(name)
    w = 8 * dt.itemsize
    if w <= 16:
        u = np.arange(1 << w, dtype=np.uint64).astype(dt.uint)
    else:
        u = np.random.default_rng(1).integers(0, 1 << w, 1 << 16, dtype=np.uint64).astype(dt.uint)
        u[:4] = [0, 0x80000000, 0x7FFFFFFF, 0xFFFFFFFF]
    v = ctx.ordered(dt, u)
    assert np.array_equal(ctx.unordered(dt, v), u)
    assert v.min() >= -(1 << (w - 1)) and v.max() < 1 << (w - 1)
    assert np.unique(v).size == np.unique(u).size
    # the order of the (non-NaN) float values follows the integers; -0 sits just below +0
    with np.errstate(invalid="ignore"):
        f = from_bits(u, BY_NAME[name]).astype(np.float64)
    ok = ~np.isnan(f)
    order = np.argsort(v[ok], kind="stable")
    assert np.all(np.diff(f[ok][order]) >= 0)


def _dtype(name):
    from arcfmt.dtypes import from_name
    return from_name(name)


# ------------------------------------------------------------------------------ rank / select

@given(st.integers(1, 5000), st.floats(0.0, 1.0), st.integers(0, 2**32 - 1))
@settings(max_examples=60, deadline=None)
def test_class_index_matches_flatnonzero(m, density, seed):
    rng = np.random.default_rng(seed)
    mask = rng.random(m) < density
    members = np.flatnonzero(mask)
    ix = twins.ClassIndex(twins._pack_words(mask), m=m)
    assert ix.size == members.size
    if members.size:
        j = np.sort(rng.choice(members.size, size=min(members.size, 1 + members.size // 3), replace=False))
        assert np.array_equal(ix.select(j), members[j])
        assert np.array_equal(ix.rank(members[j]), j)


# ------------------------------------------------------------------------------ round trips

@pytest.mark.parametrize("name", CTX_NAMES)
@pytest.mark.parametrize("density", [0.001, 0.02, 0.3, 1.0])
def test_roundtrip_every_dtype(name, density):
    base, target = make_pair(hash((name, density)) % 1000, name, [(3000,), (40, 50)], density)
    for effort in ("fast", "default", "max"):
        d = forced(base, target, effort=effort, block_elems=1000)
        check_file(base, target, d)


@given(st.sampled_from(CTX_NAMES), st.integers(1, 3000), st.integers(1, 200), st.integers(0, 2**32 - 1),
       st.integers(1, 16))
@settings(max_examples=120, deadline=None)
def test_any_classes_roundtrip(name, m, changes, seed, k):
    """Any thresholds a writer may choose decode to the same target, including specials and wraps."""
    dt = _dtype(name)
    rng = np.random.default_rng(seed)
    top = (1 << dt.exp_bits) - 1
    w = 8 * dt.itemsize
    base = rng.integers(0, 1 << w, m, dtype=np.uint64).astype(dt.uint)
    if seed % 3 == 0:  # realistic values instead of random bit patterns
        base = bits_of(random_values(rng, BY_NAME[name], (m,))).astype(dt.uint)
    target = base.copy()
    pos = np.unique(rng.integers(0, m, changes))
    target[pos] = rng.integers(0, 1 << w, pos.size, dtype=np.uint64).astype(dt.uint)
    target[pos[::2]] = base[pos[::2]] + dt.uint.type(1)  # ±1 steps, wrapping at the ends of the range
    pos = np.flatnonzero(base != target)
    if not pos.size:
        return
    thresholds = sorted(set(rng.integers(1, top + 1, min(k, top + 1) - 1).tolist()))
    enc = ctx.encode(dt, base, target, pos, thresholds=thresholds)
    p = ctx.Params.unpack(enc.params)
    lengths = ctx.stream_lengths(dt, p, m)
    assert [len(s) for s in enc.streams] == lengths
    out = np.empty_like(base)
    ctx.decode(dt, p, enc.streams, m, base, out)
    assert np.array_equal(out, target)
    inplace = base.copy()
    ctx.decode(dt, p, enc.streams, m, inplace, inplace)
    assert np.array_equal(inplace, target)


def test_special_values_and_zero_crossings():
    """±0, ±inf, NaN payloads and steps through zero are ordinary changes: no exceptions exist."""
    specials = np.array([0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0xFFC1, 0x0001, 0x8001, 0x3F80, 0xBF80,
                         0x7F7F, 0xFF7F], np.uint16)
    base = np.repeat(specials, specials.size)
    target = np.tile(specials, specials.size)
    b = {"x": base.view(BY_NAME["BF16"].np)}
    t = {"x": target.view(BY_NAME["BF16"].np)}
    check_file(b, t, forced(b, t))


def test_writer_prefers_ctx_delta_on_rl_like_data():
    """Few changes (200) of random size: ctx-delta, or ctx-delta-rc where that is the smaller (on blocks
    of fewer than 256 changes both are tried); a 1.6 writer (no ctx-delta-rc) writes ctx-delta, never
    a smaller file."""
    base, target = make_pair(3, "BF16", [(200_000,)], 0.001)
    d = arcfmt.encode(base, target)
    blocks = arcfmt.DeltaReader(d).describe()["tensors"][0]["blocks"]
    assert {b["encoding"] for b in blocks} <= {"ctx-delta", "ctx-delta-rc"}
    with _without("ctx-delta-rc"):
        older = arcfmt.encode(base, target)
    blocks = arcfmt.DeltaReader(older).describe()["tensors"][0]["blocks"]
    assert {b["encoding"] for b in blocks} == {"ctx-delta"}
    assert len(d) <= len(older)


def _ulp_scaled_pair(seed, m, lr=2e-3):
    """BF16 weights moved by updates of about ``lr`` (relative to 1), as RL steps move them: the step
    in ulps, and whether there is one, follow the exponent (what ctx-delta-rc's contexts hold)."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal(m) * 0.05).astype(np.float32)
    upd = (rng.standard_normal(m) * lr * 0.05).astype(np.float32)
    b = (w.view(np.uint32) >> 16).astype(np.uint16)
    t = ((w + upd).view(np.uint32) >> 16).astype(np.uint16)
    return {"w": from_bits(b, BY_NAME["BF16"])}, {"w": from_bits(t, BY_NAME["BF16"])}


def test_writer_codes_steps_by_exponent_where_that_is_smaller():
    """SPEC.md §8.9: on steps whose size in ulps follows the exponent, with many changes, the writer
    picks ctx-delta-rc alone (no ctx-delta trial), and the file is smaller than a 1.6 writer's
    (ctx-delta with the best codec on its magnitudes); every reader rebuilds it."""
    base, target = _ulp_scaled_pair(5, 1 << 19)
    d = arcfmt.encode(base, target)
    blocks = arcfmt.DeltaReader(d).describe()["tensors"][0]["blocks"]
    assert {b["encoding"] for b in blocks} <= {"ctx-delta-rc", "ctx-delta-rp"}
    assert sum(b["changed"] for b in blocks) > ctx._RC_ALONE
    with _without("ctx-delta-rc"):
        older = arcfmt.encode(base, target)
    assert len(d) < 0.97 * len(older), (len(d), len(older))
    check_file(base, target, d)


# ------------------------------------------------------------------------------ encoder's class choice

def test_choose_thresholds_separates_hot_and_cold_exponents():
    """Small weights change often, large ones rarely: the DP puts a boundary between them."""
    rng = np.random.default_rng(0)
    m = 1 << 18
    small = (rng.standard_normal(m // 2) * 1e-4).astype(np.float32)
    large = (rng.standard_normal(m // 2) * 1.0).astype(np.float32)
    vals = np.concatenate([small, large])
    rng.shuffle(vals)
    base = (vals.view(np.uint32) >> 16).astype(np.uint16)
    exp = (base >> 7) & 0xFF
    p = np.where(exp < 110, 0.3, 0.001)
    pos = np.flatnonzero(rng.random(m) < p)
    for k in (2, 4, 8):
        th = ctx.choose_thresholds(BF16, base, pos, max_classes=k)
        assert 1 <= len(th) <= k - 1 and th == sorted(set(th)) and all(1 <= t <= 255 for t in th)
    flat = ctx.encode(BF16, base, base ^ np.isin(np.arange(m), pos).astype(np.uint16), pos, thresholds=[])
    split = ctx.encode(BF16, base, base ^ np.isin(np.arange(m), pos).astype(np.uint16), pos)
    assert sum(map(len, split.streams)) < 0.8 * sum(map(len, flat.streams))


def test_few_changes_use_one_class():
    base = np.arange(1000, dtype=np.uint16)
    assert ctx.choose_thresholds(BF16, base, np.array([3, 500])) == []


# ------------------------------------------------------------------------------ decoder checks (§8.6)

def _valid_payload():
    """One change at index 1 of a 4-element BF16 block: +1 order-preserving step, K = 1, r = 0."""
    return blck_payload(0, 0, 5, [1, 1, 0, 2, 1], [(0, b"\x02"), (0, b""), (0, b"\x00"), (0, b"\x00")])


def test_hand_built_block_is_read(small_file):
    f, _ = _w_block_file(small_file, _valid_payload())
    r = arcfmt.DeltaReader(f)
    info = r.describe()["tensors"][0]
    assert info["blocks"][0]["encoding"] == "ctx-delta" and info["blocks"][0]["changed"] == 1


@pytest.mark.parametrize("reader", READERS)
def test_corrupt_ctx_blocks(small_file, reader):
    q1 = b"\x02"  # one code: Q = 1 (gap 1 -> index 1), qbits = 2
    cases = {
        "K=0": blck_payload(0, 0, 5, [0], []),
        "K=17": blck_payload(0, 0, 5, [17] + [0] * 53, []),
        "threshold 0": blck_payload(0, 0, 5, [2, 0, 1, 0, 0, 0, 2, 1], _raw(q1, b"", b"\x00", b"\x00")),
        "threshold > 2^E-1": blck_payload(0, 0, 5, [2, 256, 1, 0, 0, 0, 2, 1], _raw(q1, b"", b"\x00", b"\x00")),
        "thresholds not increasing": blck_payload(0, 0, 5, [3, 120, 120, 1, 0, 0, 0, 0, 0, 2, 1],
                                                  _raw(q1, b"", b"\x00", b"\x00")),
        "c=0": blck_payload(0, 0, 5, [1, 0, 0, 0, 1], _raw(b"", b"", b"", b"")),
        "c>m": blck_payload(0, 0, 5, [1, 5, 0, 5, 1], _raw(b"\x1f", b"", b"\x00", b"\x00" * 5)),
        "r>24": blck_payload(0, 0, 5, [1, 1, 25, 1, 1], _raw(b"\x01", b"\x00" * 4, b"\x00", b"\x00")),
        "qbits<c": blck_payload(0, 0, 5, [1, 2, 0, 1, 1], _raw(b"\x01", b"", b"\x00", b"\x00\x00")),
        "qbits>m": blck_payload(0, 0, 5, [1, 1, 0, 5, 1], _raw(b"\x10", b"", b"\x00", b"\x00")),
        "mw=0": blck_payload(0, 0, 5, [1, 1, 0, 2, 0], _raw(q1, b"", b"\x00", b"")),
        "mw>W": blck_payload(0, 0, 5, [1, 1, 0, 2, 3], _raw(q1, b"", b"\x00", b"\x00\x00\x00")),
        "quotient padding": blck_payload(0, 0, 5, [1, 1, 0, 2, 1], _raw(b"\x06", b"", b"\x00", b"\x00")),
        "too many codes": blck_payload(0, 0, 5, [1, 1, 0, 2, 1], _raw(b"\x03", b"", b"\x00", b"\x00")),
        "last bit not a terminator": blck_payload(0, 0, 5, [1, 1, 0, 3, 1], _raw(b"\x02", b"", b"\x00", b"\x00")),
        "remainder padding": blck_payload(0, 0, 5, [1, 1, 1, 1, 1], _raw(b"\x01", b"\x03", b"\x00", b"\x00")),
        "sign padding": blck_payload(0, 0, 5, [1, 1, 0, 2, 1], _raw(q1, b"", b"\x02", b"\x00")),
        "index beyond block": blck_payload(0, 0, 5, [1, 1, 0, 5, 1], _raw(b"\x10", b"", b"\x00", b"\x00")),
        "rank beyond class": blck_payload(0, 0, 5, [2, 255, 0, 1, 0, 0, 1, 1], _raw(b"\x01", b"", b"\x00", b"\x00")),
        "step out of range": blck_payload(0, 0, 5, [1, 1, 0, 2, 2], _raw(q1, b"", b"\x00", b"\xff\xff")),
        "stream table short": _valid_payload()[:-1],
    }
    for what, payload in cases.items():
        f, base = _w_block_file(small_file, payload)
        got = expect(CorruptError, reader, f, base)
        assert str(got), what


def test_decode_checks_before_writing():
    """A failed check leaves an in-place output untouched (every check precedes the first write)."""
    dt = BF16
    base = np.arange(64, dtype=np.uint16) + np.uint16(0x3F00)
    target = base.copy()
    target[[3, 40]] += np.uint16(1)
    pos = np.flatnonzero(base != target)
    enc = ctx.encode(dt, base, target, pos, thresholds=[])
    p = ctx.Params.unpack(enc.params)
    streams = list(enc.streams)
    mags = bytearray(streams[3])
    p.mag_width = 2
    streams[3] = bytes([mags[0], mags[1], 0xFF, 0xFF])  # second step far out of range
    live = base.copy()
    with pytest.raises(CorruptError):
        ctx.decode(dt, p, streams, base.size, live, live)
    assert np.array_equal(live, base)


# ------------------------------------------------------------------------------ memory per block

@pytest.mark.parametrize("effort", ["fast", "default", "max"])
@pytest.mark.parametrize("compiled", [False, True])
def test_block_memory_within_four_times_its_bytes(effort, compiled):
    """Issue 3: encoding or decoding one block needs at most ~4x its BF16 bytes beyond its inputs.

    tracemalloc sees numpy's allocations, not those made inside the numba kernels; with the kernels
    on, their largest possible allocations are added (bitmaps, counts, per-change arrays).
    """
    import tracemalloc

    from arcfmt import backend, codecs, encodings
    chosen = backend.compiled() if compiled else backend.twins()
    if chosen is None:
        pytest.skip("numba not installed or ARCFMT_JIT=0")
    rng = np.random.default_rng(5)
    m = 1 << 20
    vals = (rng.standard_normal(m) * np.exp2(rng.uniform(-10, 0, m))).astype(np.float32)
    base = (vals.view(np.uint32) >> 16).astype(np.uint16)
    target = base.copy()
    small = (base & 0x7FFF) < (118 << 7)
    changed = rng.random(m) < np.where(small, 0.2, 0.01)
    target[changed] += np.uint16(1)
    with backend.using(chosen):
        warm = encodings.candidates(BF16, base[:4096], target[:4096], effort)[0]  # compiles the kernels
        encodings.decode_block(BF16, warm.encoding, warm.params, warm.streams, 4096, base[:4096],
                               np.empty(4096, np.uint16))
        tracemalloc.start()
        try:
            tracemalloc.reset_peak()
            cands = encodings.candidates(BF16, base, target, effort)
            enc = cands[0]
            for i, s in enumerate(enc.streams):
                codecs.encode_smallest(s, "fast" if i in enc.dense else effort)
            enc_peak = tracemalloc.get_traced_memory()[1]
            out = np.empty_like(base)
            tracemalloc.reset_peak()
            encodings.decode_block(BF16, enc.encoding, enc.params, enc.streams, m, base, out)
            dec_peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    if compiled:  # what the kernels allocate at most (arcfmt/kernels.py: ctx_encode, ctx_decode)
        classes = len(encodings.get(enc.encoding).unpack(enc.params).counts)
        c = int(changed.sum())
        bitmaps = (classes - 1 + 1 + 4) * 8 * (m // 64)  # thresholds, class words, two pairs of counts
        outputs = sum(len(s) for s in enc.streams)
        enc_peak += 17 * c + bitmaps + outputs  # class ids, class order, gaps; the streams it returns
        dec_peak += 8 * c + bitmaps              # ranks, turned into positions in place
    assert enc.encoding in (encodings.CTX_DELTA, encodings.CTX_DELTA_RC, encodings.CTX_DELTA_RP)
    assert np.array_equal(out, target)
    assert enc_peak <= 4 * base.nbytes, enc_peak / base.nbytes
    assert dec_peak <= 4 * base.nbytes, dec_peak / base.nbytes


@pytest.mark.parametrize("dense", [False, True])
def test_a_block_failing_its_last_check_costs_no_second_decode(dense):
    """A block whose steps leave the dtype's range fails the last check, after the decoder built all its
    scratch. The error is worded from the kernel's status: the numpy twin used to decode the block
    again to find it (~60 bytes per element: 1 GB for a 1 KB file of one 16 Mi-element block, per
    worker). Both backends word it alike."""
    import tracemalloc

    from arcfmt import backend
    dt = _dtype("F8_E4M3")
    m = 1 << 20
    base = np.full(m, 0x10, np.uint8)
    enc = ctx.encode(dt, base, base + np.uint8(1), np.arange(m), dense=dense)
    p = ctx.dense_unpack(enc.params) if dense else ctx.Params.unpack(enc.params)
    streams = [bytes(s) for s in enc.streams[:3]] + [b"\xff" * len(enc.streams[3])]   # every step +256
    messages = []
    for chosen in (backend.compiled(), backend.twins()):
        if chosen is None:
            continue
        out = base.copy()
        with backend.using(chosen):
            ctx.decode(dt, p, [bytes(s) for s in enc.streams], m, base, np.empty_like(base))  # compiled, warm
            tracemalloc.start()
            try:
                with pytest.raises(CorruptError, match="leaves the range of F8_E4M3") as info:
                    ctx.decode(dt, p, streams, m, out, out)
                peak = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
        messages.append(str(info.value))
        assert np.array_equal(out, base)
        if chosen is backend.compiled():   # the kernel's scratch: int64 ranks, old and new values
            assert peak < 12 * m, peak / m
    assert len(set(messages)) == 1, messages


# ------------------------------------------------------------------------------ dense-delta (§8.7)

def _dense_block(name, m, unchanged, seed):
    """A block where all but ``unchanged`` elements (at random places) change by a few units."""
    dt = _dtype(name)
    rng = np.random.default_rng(seed)
    base = bits_of(random_values(rng, BY_NAME[name], (m,))).astype(dt.uint)
    v = ctx.ordered(dt, base) + rng.integers(1, 4, m) * rng.choice([-1, 1], m)
    half = 1 << (8 * dt.itemsize - 1)
    target = ctx.unordered(dt, np.clip(v, -half, half - 1))
    keep = rng.choice(m, min(unchanged, m), replace=False)
    target[keep] = base[keep]
    return dt, base, target, np.flatnonzero(base != target)


@given(st.sampled_from(CTX_NAMES), st.integers(1, 3000), st.integers(0, 3000), st.integers(0, 2**32 - 1))
@settings(max_examples=120, deadline=None)
def test_dense_roundtrip_any_block(name, m, unchanged, seed):
    """dense-delta rebuilds any block with a change, from every element changed (u = 0) to one change;
    its stream lengths follow from its four params alone; in place and out of place alike, and the
    positions it reports are exactly the changed ones."""
    dt, base, target, pos = _dense_block(name, m, unchanged, seed)
    if not pos.size:
        return
    enc = ctx.encode(dt, base, target, pos, dense=True)
    assert len(enc.params) == 4 and enc.params[0] == pos.size
    p = ctx.dense_unpack(enc.params)
    assert [len(s) for s in enc.streams] == ctx.dense_stream_lengths(dt, p, m)
    out = np.empty_like(base)
    ctx.decode(dt, p, enc.streams, m, base, out)
    assert np.array_equal(out, target)
    inplace = base.copy()
    changed = np.empty(p.changed, np.int64)
    ctx.decode(dt, p, enc.streams, m, inplace, inplace, changed)
    assert np.array_equal(inplace, target) and np.array_equal(np.sort(changed), pos)


@pytest.mark.parametrize("name", CTX_NAMES)
def test_dense_file_roundtrip_every_reader(name):
    base, target = make_pair(7, name, [(3000,), (40, 50)], 0.9)
    buf = io.BytesIO()
    with arcfmt.DeltaWriter(buf, force_encoding="dense-delta", block_elems=1000) as w:
        w.write_tensors((n, base[n], t) for n, t in target.items())
    check_file(base, target, buf.getvalue())


def test_dense_delta_beside_a_range_coded_candidate_gets_the_fast_trials_below_max():
    """A dense block of 256 changes or more: ctx-delta proposes ctx-delta-rc first, and dense-delta's
    streams are then marked for the fast codec trials only (the writer heeds the mark below effort max
    alone); beside no range-coded candidate its magnitudes get the full trials."""
    from arcfmt.encodings import registry
    dt, b, t, pos = _dense_block("BF16", 30_000, 600, 3)
    for effort, marked in (("default", True), ("fast", True), ("max", True)):
        cands = {c.encoding: c for c in registry.candidates(dt, b, t, effort)}
        assert ctx.CtxDeltaRc.id in cands or ctx.CtxDeltaRp.id in cands, effort
        assert (cands[ctx.DenseDelta.id].dense == (0, 1, 2, 3)) is marked, effort
    with _without("ctx-delta-rc"), _without("ctx-delta-rp"):
        cands = {c.encoding: c for c in registry.candidates(dt, b, t, "default")}
        assert ctx.DenseDelta.id in cands and 3 not in cands[ctx.DenseDelta.id].dense   # its magnitudes


def test_writer_picks_dense_delta_where_most_elements_change():
    """A bias that moves every step: the few unchanged positions are the cheap ones to list; where few
    elements change, dense-delta is not even tried."""
    dt, b, t, _ = _dense_block("BF16", 30_000, 600, 3)
    base, target = {"bias": from_bits(b, BY_NAME["BF16"])}, {"bias": from_bits(t, BY_NAME["BF16"])}
    with _without("ctx-delta-rc"):   # (which codes these magnitudes in fewer bytes: §8.9)
        d = arcfmt.encode(base, target)
    blocks = arcfmt.DeltaReader(d).describe()["tensors"][0]["blocks"]
    assert {x["encoding"] for x in blocks} == {"dense-delta"}
    buf = io.BytesIO()
    with arcfmt.DeltaWriter(buf, force_encoding="ctx-delta") as w:
        w.write_tensors((n, base[n], v) for n, v in target.items())
    assert len(d) < len(buf.getvalue())
    assert_bit_exact(arcfmt.decode(base, d), target)
    sparse_b, sparse_t = make_pair(4, "BF16", [(30_000,)], 0.02)
    blocks = arcfmt.DeltaReader(arcfmt.encode(sparse_b, sparse_t)).describe()["tensors"][0]["blocks"]
    assert {x["encoding"] for x in blocks} <= {"ctx-delta", "ctx-delta-rc", "ctx-delta-rp"}


def test_dense_params_are_checked_in_spec_order():
    """SPEC.md §8.7: 1 ≤ c ≤ m, then r ≤ 24, then u ≤ qbits ≤ m, then 1 ≤ mw ≤ W; each corrupt."""
    m = 100
    good = [90, 2, 20, 1]
    assert ctx.dense_stream_lengths(BF16, ctx.dense_unpack(good), m) == [3, 3, 12, 90]
    for bad, words in (([0, 2, 20, 1], "changed count"), ([101, 2, 20, 1], "changed count"),
                       ([90, 25, 20, 1], "Rice"), ([90, 2, 9, 1], "quotient bit count"),
                       ([90, 2, 101, 1], "quotient bit count"), ([90, 2, 20, 0], "magnitude width"),
                       ([90, 2, 20, 3], "magnitude width"), ([0, 25, 101, 0], "changed count")):
        with pytest.raises(CorruptError, match=words):
            ctx.dense_stream_lengths(BF16, ctx.dense_unpack(bad), m)


def test_a_decoder_without_dense_delta_refuses_it_as_unsupported():
    """SPEC.md §16: a 1.1 decoder meets a dense-delta block as an unknown encoding, never misreads it."""
    from arcfmt.errors import UnsupportedError
    dt, b, t, _ = _dense_block("BF16", 1000, 10, 5)
    base, target = {"x": from_bits(b, BY_NAME["BF16"])}, {"x": from_bits(t, BY_NAME["BF16"])}
    with _without("ctx-delta-rc"):
        d = arcfmt.encode(base, target)
    with _without("dense-delta"):
        with pytest.raises(UnsupportedError, match="unknown encoding id 6"):
            arcfmt.decode(base, d)
    assert_bit_exact(arcfmt.decode(base, d), target)


@contextlib.contextmanager
def _without(name):
    """The registry without one encoding for a ``with`` block: an earlier version's decoder and writer."""
    from arcfmt import encodings
    enc = encodings.by_name(name)
    encodings.unregister(enc)
    try:
        yield
    finally:
        encodings.register(enc)


# ------------------------------------------------------------------------------ ctx-delta-as (§8.8)

def _leaning_pair(seed, shape, by_rows=True, lean=0.9):
    """A BF16 matrix whose changes' signs lean one way per row (or per column), as RL steps often do."""
    rng = np.random.default_rng(seed)
    base = (rng.standard_normal(shape) * 0.02).astype(np.float32).astype(BY_NAME["BF16"].np)
    b = bits_of(base).reshape(-1)
    o = ctx.ordered(BF16, b)
    idx = np.arange(b.size)
    group = idx // shape[-1] if by_rows else idx % shape[-1]
    way = np.where(rng.random(group.max() + 1) < 0.5, -1, 1)[group]
    step = np.where(rng.random(b.size) < lean, way, -way) * (rng.random(b.size) < 0.05)
    return {"w": base}, {"w": from_bits(ctx.unordered(BF16, o + step), BY_NAME["BF16"]).reshape(shape)}


@pytest.mark.parametrize("by_rows", [True, False])
def test_writer_codes_leaning_signs_adaptively(by_rows):
    """Signs that lean per row or column: the writer picks ctx-delta-rc or -rp (a 1.6 writer ctx-delta-as),
    its signs on that axis, and the file is smaller than with raw sign bits; every reader rebuilds it."""
    base, target = _leaning_pair(1, (256, 256), by_rows)
    with _without("ctx-delta-rc"):
        older = arcfmt.encode(base, target)
    for d, names in ((arcfmt.encode(base, target), {"ctx-delta-rc", "ctx-delta-rp"}), (older, {"ctx-delta-as"})):
        info = arcfmt.DeltaReader(d).describe()["tensors"][0]["blocks"]
        got = {b["encoding"] for b in info}
        assert len(got) == 1 and got <= names
        name = got.pop()
        blk = arcfmt.DeltaReader(d).load_block("w", 0)
        params = arcfmt.encodings.by_name(name).unpack(blk.info.params)
        assert params.signs[:2] == ((1, 256) if by_rows else (2, 256))
        assert len(d) < len(forced(base, target))
        check_file(base, target, d)


def test_writer_keeps_raw_signs_where_they_are_coin_tosses():
    base, target = _leaning_pair(2, (256, 256), lean=0.5)
    with _without("ctx-delta-rc"):
        blocks = arcfmt.DeltaReader(arcfmt.encode(base, target)).describe()["tensors"][0]["blocks"]
    assert {b["encoding"] for b in blocks} == {"ctx-delta"}


def test_adaptive_sign_params_are_checked_in_spec_order():
    """SPEC.md §8.8: after ctx-delta's checks, axis ≤ 2; P = 1 and phase = 0 for axis 0, else
    1 ≤ P ≤ m and phase < P; then 5 ≤ sbytes ≤ 2c + 8; each corrupt."""
    m, head = 100, [1, 10, 0, 20, 1]   # K = 1, c = 10, r = 0, qbits = 20, mw = 1
    assert ctx.stream_lengths(BF16, ctx.Params.unpack(head + [1, 10, 3, 7]), m) == [3, 0, 7, 10]
    for signs, words in (([3, 10, 3, 7], "axis"), ([0, 2, 0, 7], "one sign context"),
                         ([0, 1, 1, 7], "one sign context"), ([1, 0, 0, 7], "period"), ([2, 101, 0, 7], "period"),
                         ([1, 10, 10, 7], "phase"), ([1, 10, 3, 4], "5..28"), ([2, 10, 3, 29], "5..28"),
                         ([3, 0, 0, 0], "axis")):
        with pytest.raises(CorruptError, match=words):
            ctx.stream_lengths(BF16, ctx.Params.unpack(head + signs), m)
    with pytest.raises(CorruptError, match="changed count"):   # ctx-delta's own checks come first
        ctx.stream_lengths(BF16, ctx.Params.unpack([1, 0, 0, 20, 1, 3, 0, 0, 0]), m)


def test_adaptive_signs_read_exactly_their_bytes():
    """The range coder's stream holds exactly what the decoder reads: one byte less runs past its end,
    one byte more is left over; both corrupt, and nothing is written in place."""
    base, target = _leaning_pair(3, (64, 64))
    b, t = bits_of(base["w"]).reshape(-1), bits_of(target["w"]).reshape(-1)
    pos = np.flatnonzero(b != t)
    enc = ctx.encode(BF16, b, t, pos, axes=[(1, 64, 0)], force_signs=True)
    p = ctx.Params.unpack(enc.params)
    for signs, words in ((enc.streams[2][:-1], "past the end"), (enc.streams[2] + b"\0", "bytes left"),
                         (b"\1" + enc.streams[2][1:], "first byte"),
                         (enc.streams[2][:1] + b"\xff" * 4 + enc.streams[2][5:], "first code")):
        p.signs = (*p.signs[:3], len(signs))
        out = b.copy()
        with pytest.raises(CorruptError, match=words):
            ctx.decode(BF16, p, [enc.streams[0], enc.streams[1], signs, enc.streams[3]], b.size, out, out)
        assert np.array_equal(out, b)


def test_a_decoder_without_ctx_delta_as_refuses_it_as_unsupported():
    """SPEC.md §16: a 1.3 decoder meets a ctx-delta-as block as an unknown encoding, never misreads it;
    a writer without it writes ctx-delta."""
    from arcfmt.errors import UnsupportedError
    base, target = _leaning_pair(4, (128, 128))
    with _without("ctx-delta-rc"):
        d = arcfmt.encode(base, target)
    with _without("ctx-delta-as"), _without("ctx-delta-rc"):
        with pytest.raises(UnsupportedError, match="unknown encoding id 7"):
            arcfmt.decode(base, d)
        plain = arcfmt.encode(base, target)
        blocks = arcfmt.DeltaReader(plain).describe()["tensors"][0]["blocks"]
        assert {b["encoding"] for b in blocks} == {"ctx-delta"}
    assert_bit_exact(arcfmt.decode(base, d), target)


@pytest.mark.parametrize("kw", [{"compact_index": False}, {"inline_blocks": False}])
def test_files_for_older_readers_never_use_ctx_delta_rc(kw):
    """SPEC.md §16: a file written for 1.4 readers (``compact_index=False``, ``--full-index``) or 1.5
    readers (``inline_blocks=False``) uses no encoding added after them: ctx-delta-rc (1.7) and -rp
    (1.8) are not tried,
    so such readers decode it; ``force_encoding`` is obeyed still."""
    base, target = _ulp_scaled_pair(6, 1 << 17)
    assert {b["encoding"] for b in arcfmt.DeltaReader(arcfmt.encode(base, target)).describe()["tensors"][0][
        "blocks"]} <= {"ctx-delta-rc", "ctx-delta-rp"}
    buf = io.BytesIO()
    with arcfmt.DeltaWriter(buf, **kw) as w:
        w.write_tensors((n, base[n], t) for n, t in target.items())
    blocks = arcfmt.DeltaReader(buf.getvalue()).describe()["tensors"][0]["blocks"]
    assert {b["encoding"] for b in blocks} <= {"ctx-delta", "ctx-delta-as"}
    with _without("ctx-delta-rc"):   # a 1.6 decoder
        assert_bit_exact(arcfmt.decode(base, buf.getvalue()), target)
    forced = io.BytesIO()
    with arcfmt.DeltaWriter(forced, force_encoding="ctx-delta-rc", **kw) as w:
        w.write_tensors((n, base[n], t) for n, t in target.items())
    assert {b["encoding"] for b in arcfmt.DeltaReader(forced.getvalue()).describe()["tensors"][0]["blocks"]} == {
        "ctx-delta-rc"}


# ------------------------------------------------------------------------------ ctx-delta-rp (§8.10)

def test_writer_range_codes_the_gaps_where_that_is_smaller():
    """SPEC.md §8.10: on RL-like steps the writer at effort max puts the gaps in the range coder too
    (the default keeps ctx-delta-rc, the faster), and the file is smaller than a 1.7 writer's; a 1.7
    decoder refuses it as an unknown encoding, never misreads it; every reader rebuilds it."""
    from arcfmt.errors import UnsupportedError
    base, target = _ulp_scaled_pair(8, 1 << 19, lr=5e-4)
    d = arcfmt.encode(base, target, effort="max")
    assert {b["encoding"] for b in arcfmt.DeltaReader(d).describe()["tensors"][0]["blocks"]} == {"ctx-delta-rp"}
    assert {b["encoding"] for b in arcfmt.DeltaReader(arcfmt.encode(base, target)).describe()["tensors"][0][
        "blocks"]} == {"ctx-delta-rc"}
    with _without("ctx-delta-rp"):
        older = arcfmt.encode(base, target, effort="max")
        assert {b["encoding"] for b in arcfmt.DeltaReader(older).describe()["tensors"][0]["blocks"]} == {
            "ctx-delta-rc"}
        with pytest.raises(UnsupportedError, match="unknown encoding id 9"):
            arcfmt.decode(base, d)
    assert len(d) < len(older), (len(d), len(older))
    check_file(base, target, d)


def test_rp_params_are_checked_in_spec_order():
    """SPEC.md §8.10: 3K + 4 params; §8.6's checks without qbits and mw, then axis, P, phase as §8.8,
    then 5 ≤ nbytes ≤ (W + 4)·c + ceil(m / 8) + 9; each corrupt."""
    m, head = 100, [1, 10, 0]   # K = 1, c = 10, r = 0
    rp = arcfmt.encodings.by_name("ctx-delta-rp")
    top = (2 + 4) * 10 + 13 + 9
    assert rp.param_count([1]) == 7 and rp.stream_lengths(BF16, head + [1, 10, 3, top], m) == [top]
    for tail, words in (([3, 10, 3, 7], "axis"), ([0, 2, 0, 7], "one sign context"), ([1, 0, 0, 7], "period"),
                        ([1, 10, 10, 7], "phase"), ([1, 10, 3, 4], f"5..{top}"), ([1, 10, 3, top + 1], f"5..{top}")):
        with pytest.raises(CorruptError, match=words):
            rp.stream_lengths(BF16, head + tail, m)
    for bad, words in (([1, 0, 0], "changed count"), ([1, 101, 0], "changed count"), ([1, 10, 25], "Rice")):
        with pytest.raises(CorruptError, match=words):   # ctx-delta's own checks come first
            rp.stream_lengths(BF16, bad + [3, 0, 0, 0], m)


def test_rp_reads_exactly_its_bytes():
    """The one stream holds exactly what the decoder reads: a byte less runs past its end, a byte more
    is left over, a bad start is refused; all corrupt, nothing written in place."""
    base, target = _ulp_scaled_pair(9, 1 << 14)
    b, t = bits_of(base["w"]).reshape(-1), bits_of(target["w"]).reshape(-1)
    pos = np.flatnonzero(b != t)
    enc = ctx.encode(BF16, b, t, pos, rc_axes=[(0, 1, 0)], force_rc=True, rp=2)
    assert enc.rp and len(enc.streams) == 1
    p = ctx.Params.unpack_rp(enc.params)
    for stream, words in ((enc.streams[0][:-1], "past the end"), (enc.streams[0] + b"\0", "bytes left"),
                          (b"\1" + enc.streams[0][1:], "first byte"),
                          (enc.streams[0][:1] + b"\xff" * 4 + enc.streams[0][5:], "first code")):
        p.signs = (*p.signs[:3], len(stream))
        out = b.copy()
        with pytest.raises(CorruptError, match=words):
            ctx.decode(BF16, p, [stream], b.size, out, out)
        assert np.array_equal(out, b)


def test_ctx_delta_offered_beside_rp_keeps_its_own_rice_parameters():
    """A block of few changes is offered as ctx-delta beside ctx-delta-rp (effort max); where -rp's
    Rice parameter is one less, the ctx-delta candidate keeps the one its streams were written with
    (it took -rp's: a file the reader refused, found by review). Constant steps make a codec pick it."""
    rng = np.random.default_rng(0)
    m = 4096
    base = (rng.standard_normal(m).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    pos = np.arange(5, 5 + 11 * 200, 11)
    target = base.copy()
    target[pos] = ctx.unordered(BF16, ctx.ordered(BF16, base[pos]) + 300)
    enc = ctx.encode(BF16, base, target, pos, rc_axes=[(0, 1, 0)], rp=1)
    assert enc.rp and enc.other is not None
    for params, streams, unpack in ((enc.params, enc.streams, ctx.Params.unpack_rp),
                                    (enc.other.params, enc.other.streams, ctx.Params.unpack)):
        p = unpack(params)
        assert ctx.stream_lengths(BF16, p, m) == [len(s) for s in streams]
        out = np.empty_like(base)
        ctx.decode(BF16, p, streams, m, base, out)
        assert np.array_equal(out, target)
    b, t = {"w": from_bits(base, BY_NAME["BF16"])}, {"w": from_bits(target, BY_NAME["BF16"])}
    assert_bit_exact(arcfmt.decode(b, arcfmt.encode(b, t, effort="max")), t)


@pytest.mark.parametrize("encoding", ["ctx-delta-rc", "ctx-delta-rp", "ctx-delta-as", "ctx-delta", "dense-delta"])
def test_a_forced_encoding_that_cannot_code_a_block_refuses_it(encoding):
    """Found by the fuzzer: a forced ctx-delta-rc whose changes pass §8.9's bound came out as ctx-delta,
    under -rc's id (a file no reader takes: its params are ctx-delta's). Every forced encoding now
    writes a file that decodes, or refuses with InputError."""
    b = np.array([0x194731B6, 0xE00D388C, 0x07C50C05, 0x3EFD49AC, 0x6A05F352, 0x99ABE768, 0x37430E02], np.uint32)
    t = np.array([0x214731B6, 0xE00D36E2, 0x6F0C0C05, 0xCB3049EB, 0x6A779652, 0x2AABE7DD, 0x50430E02], np.uint32)
    base, target = {"x": b.view(np.float32)}, {"x": t.view(np.float32)}
    buf = io.BytesIO()
    try:
        with arcfmt.DeltaWriter(buf, force_encoding=encoding, workers=1) as w:
            w.write_tensors([("x", base["x"], target["x"])])
    except arcfmt.InputError as exc:
        assert encoding == "ctx-delta-rc" and "§8.9" in str(exc)
        return
    assert encoding != "ctx-delta-rc"
    assert arcfmt.decode(base, buf.getvalue())["x"].tobytes() == target["x"].tobytes()
