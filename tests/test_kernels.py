"""The two ctx-delta backends, the compiled kernels (arcfmt/kernels.py) and their numpy twins
(arcfmt/twins.py), against each other: same streams out of the encoder, same elements out of the
decoder, same error for every corrupt stream; and the one selection between them (arcfmt/backend.py)."""
from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from test_ctx_delta import CTX_NAMES, _dtype

from arcfmt import backend, twins
from arcfmt.encodings import ctx_delta as ctx
from arcfmt.errors import CorruptError
from support.data import BY_NAME, bits_of, random_values

kernels = backend.compiled()
pytestmark = pytest.mark.skipif(kernels is None, reason="numba not installed or ARCFMT_JIT=0")


def _both(fn):
    """``fn()`` with the kernels, then with the numpy twins; each result or the error it raised."""
    out = []
    for chosen in (kernels, twins):
        with backend.using(chosen):
            try:
                out.append(("ok", fn()))
            except CorruptError as exc:
                out.append(("error", str(exc)))
    return out


def test_one_backend_is_selected_once():
    """The selection is one object, made once: the compiled backend here (numba installed, ARCFMT_JIT
    unset), the same module on every call; both backends define the whole interface."""
    assert backend.selected() is kernels and backend.selected() is backend.selected()
    names = ("changes", "exponent_counts", "key_counts", "class_key", "class_cuts", "ctx_encode", "ctx_decode")
    assert all(callable(getattr(kernels, n)) and callable(getattr(twins, n)) for n in names)
    assert {kernels.NAME, twins.NAME} == set(backend.NAMES)


def _block(name, m, changes, seed):
    dt = _dtype(name)
    rng = np.random.default_rng(seed)
    base = bits_of(random_values(rng, BY_NAME[name], (m,))).astype(dt.uint)
    target = base.copy()
    pos = np.unique(rng.integers(0, m, changes))
    target[pos] = base[pos] + dt.uint.type(1)
    target[pos[::3]] ^= dt.uint.type(0x5)
    return dt, base, target, np.flatnonzero(base != target)


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(CTX_NAMES), m=st.integers(1, 3000), changes=st.integers(1, 400),
       seed=st.integers(0, 2**32 - 1), k=st.integers(1, 16))
def test_encode_and_decode_match_the_numpy_twins(name, m, changes, seed, k):
    dt, base, target, pos = _block(name, m, changes, seed)
    if not pos.size:
        return
    top = (1 << dt.exp_bits) - 1
    rng = np.random.default_rng(seed + 1)
    thresholds = sorted(set(rng.integers(1, top + 1, min(k, top + 1) - 1).tolist()))
    (_, a), (_, b) = _both(lambda: ctx.encode(dt, base, target, pos, thresholds=thresholds))
    assert a.params == b.params and [bytes(s) for s in a.streams] == [bytes(s) for s in b.streams]
    # the threshold choice (exponent histogram) too
    (_, ta), (_, tb) = _both(lambda: ctx.choose_thresholds(dt, base, pos, max_classes=k))
    assert ta == tb
    _rebuilt_alike(dt, ctx.Params.unpack(a.params), a.streams, base, target)


def _rebuilt_alike(dt, p, streams, base, target):
    """Both backends decode the block to ``target``."""
    def dec():
        out = np.empty_like(base)
        ctx.decode(dt, p, streams, base.size, base, out)
        return out
    (sa, da), (sb, db) = _both(dec)
    assert sa == sb == "ok" and np.array_equal(da, target) and np.array_equal(db, target)


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), stream=st.integers(0, 3), flips=st.integers(1, 3))
def test_corrupt_streams_fail_alike(seed, stream, flips):
    """A flipped bit in any stream: same outcome, same message, both ways; decoding in place, a
    rejected block leaves the array untouched."""
    dt, base, target, pos = _block("BF16", 4000, 300, seed)
    enc = ctx.encode(dt, base, target, pos, thresholds=[118, 121, 124])
    p = ctx.Params.unpack(enc.params)
    streams = [bytearray(s) for s in enc.streams]
    rng = np.random.default_rng(seed)
    if not streams[stream]:
        return
    for _ in range(flips):
        bit = int(rng.integers(0, 8 * len(streams[stream])))
        streams[stream][bit >> 3] ^= 1 << (bit & 7)
    _in_place_alike(dt, p, [bytes(s) for s in streams], base)


def _in_place_alike(dt, p, streams, base):
    """Decode in place with both backends: the same outcome and message; a rejected block leaves the
    array untouched. Returns the outcome (``"ok"`` or the message)."""
    def dec():
        out = base.copy()
        try:
            ctx.decode(dt, p, streams, base.size, out, out)
        except CorruptError:
            assert np.array_equal(out, base)
            raise
        return out
    (sa, a), (sb, b) = _both(dec)
    assert sa == sb
    if sa == "ok":
        assert np.array_equal(a, b)
        return sa
    assert a == b
    return a


def _leaning_block(m, period, seed, by_rows=True):
    """A BF16 block whose changes' signs lean one way per row (or column) of ``period`` elements."""
    dt, base, target, pos = _block("BF16", m, max(1, m // 3), seed)
    rng = np.random.default_rng(seed + 7)
    group = pos // period if by_rows else pos % period
    lean = np.where(rng.random(group.max() + 1) < 0.5, -1, 1)[group]
    o = ctx.ordered(dt, base[pos]) + np.where(rng.random(pos.size) < 0.9, lean, -lean)
    half = 1 << 15
    keep = (o >= -half) & (o < half)
    target = base.copy()
    target[pos[keep]] = ctx.unordered(dt, o[keep])
    return dt, base, target, np.flatnonzero(base != target)


@settings(max_examples=60, deadline=None)
@given(m=st.integers(2, 3000), period=st.integers(1, 64), seed=st.integers(0, 2**32 - 1),
       offset=st.integers(0, 10**6), rows=st.booleans(), k=st.integers(1, 4))
def test_adaptive_signs_match_the_numpy_twins(m, period, seed, offset, rows, k):
    """ctx-delta-as (SPEC.md §8.8): the same axis chosen, the same range-coded bytes, the same elements
    back, whatever the block's place and classes."""
    dt, base, target, pos = _leaning_block(m, period, seed, rows)
    if not pos.size:
        return
    thresholds = [118, 121, 124][:k - 1]
    axes = ctx.sign_axes(period, offset, m)
    (_, a), (_, b) = _both(lambda: ctx.encode(dt, base, target, pos, thresholds=thresholds, axes=axes,
                                              force_signs=True))
    assert a.adaptive_signs and b.adaptive_signs
    assert a.params == b.params and [bytes(s) for s in a.streams] == [bytes(s) for s in b.streams]
    p = ctx.Params.unpack(a.params)
    assert p.signs is not None and len(a.streams[2]) == p.signs[3]
    _rebuilt_alike(dt, p, a.streams, base, target)


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), flips=st.integers(1, 3), cut=st.integers(-2, 2))
def test_corrupt_adaptive_signs_fail_alike(seed, flips, cut):
    """A flipped bit in the range-coded signs, or bytes cut off or added (``sbytes`` following): same
    outcome and message both ways; in place, a rejected block leaves the array untouched."""
    dt, base, target, pos = _leaning_block(4000, 50, seed)
    enc = ctx.encode(dt, base, target, pos, thresholds=[118, 121], axes=[(1, 50, seed % 50)], force_signs=True)
    p = ctx.Params.unpack(enc.params)
    signs = _damaged(enc.streams[2], seed, flips, cut)
    assert p.signs is not None
    p.signs = (*p.signs[:3], len(signs))
    outcome = _in_place_alike(dt, p, [enc.streams[0], enc.streams[1], signs, enc.streams[3]], base)
    assert outcome == "ok" or outcome.startswith("ctx-delta-as")


def _damaged(stream, seed, flips, cut):
    """``stream`` with ``flips`` random bits flipped, then ``cut`` bytes cut off (< 0) or zeros added."""
    rng = np.random.default_rng(seed)
    out = bytearray(stream)
    for _ in range(flips):
        bit = int(rng.integers(0, 8 * len(out)))
        out[bit >> 3] ^= 1 << (bit & 7)
    return bytes(out[:len(out) + cut] if cut < 0 else out + bytes(cut))


def _wide_block(name, m, seed, lengths):
    """A block whose steps have random bit lengths up to ``lengths`` (capped by the dtype's range), both
    signs, over random exponents: every length and bit context of ctx-delta-rc (§8.9) in use."""
    dt = _dtype(name)
    rng = np.random.default_rng(seed)
    base = bits_of(random_values(rng, BY_NAME[name], (m,))).astype(dt.uint)
    pos = np.unique(rng.integers(0, m, max(1, m // 3)))
    bits = 8 * dt.itemsize
    n = rng.integers(1, min(lengths, bits) + 1, pos.size)
    d = (np.int64(1) << (n - 1)) + (rng.integers(0, 1 << 62, pos.size) & ((np.int64(1) << (n - 1)) - 1))
    d = np.where(rng.random(pos.size) < 0.5, -d, d)
    half = 1 << (bits - 1)
    o = ctx.ordered(dt, base[pos]) + d
    keep = (o >= -half) & (o < half)
    target = base.copy()
    target[pos[keep]] = ctx.unordered(dt, o[keep])
    return dt, base, target, np.flatnonzero(base != target)


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(CTX_NAMES), m=st.integers(1, 3000), seed=st.integers(0, 2**32 - 1),
       lengths=st.integers(1, 32), period=st.integers(1, 64), offset=st.integers(0, 10**6), k=st.integers(1, 4))
def test_range_coded_changes_match_the_numpy_twins(name, m, seed, lengths, period, offset, k):
    """ctx-delta-rc (SPEC.md §8.9): the same sign axis chosen, the same changes stream, the same elements
    back, for every dtype, bit length (up to the dtype's), sign context and class count."""
    dt, base, target, pos = _wide_block(name, m, seed, lengths)
    if not pos.size:
        return
    top = (1 << dt.exp_bits) - 1
    thresholds = sorted({max(1, top * j // k) for j in range(1, k)})
    axes = ctx.sign_axes(period, offset, m)
    (_, a), (_, b) = _both(lambda: ctx.encode(dt, base, target, pos, thresholds=thresholds, rc_axes=axes,
                                              force_rc=True))
    assert a.rc and b.rc
    assert a.params == b.params and [bytes(s) for s in a.streams] == [bytes(s) for s in b.streams]
    p = ctx.Params.unpack_rc(a.params)
    assert p.signs is not None and len(a.streams[2]) == p.signs[3] <= ctx.rc_limit(dt, pos.size)
    _rebuilt_alike(dt, p, a.streams, base, target)


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), flips=st.integers(1, 3), cut=st.integers(-2, 2),
       name=st.sampled_from(CTX_NAMES))
def test_corrupt_range_coded_changes_fail_alike(seed, flips, cut, name):
    """A flipped bit in ctx-delta-rc's changes stream, or bytes cut off or added (``nbytes`` following):
    the same outcome and message both ways (a bit length past the dtype's bits included); in place, a
    rejected block leaves the array untouched."""
    dt, base, target, pos = _wide_block(name, 3000, seed, 12)
    enc = ctx.encode(dt, base, target, pos, thresholds=[1], rc_axes=[(1, 50, seed % 50)], force_rc=True)
    p = ctx.Params.unpack_rc(enc.params)
    coded = _damaged(enc.streams[2], seed, flips, cut)
    assert p.signs is not None
    p.signs = (*p.signs[:3], len(coded))
    outcome = _in_place_alike(dt, p, [enc.streams[0], enc.streams[1], coded], base)
    assert outcome == "ok" or outcome.startswith("ctx-delta-rc")


def test_a_bit_length_past_the_dtype_fails_alike():
    """SPEC.md §8.9 (b): sixteen 0 bits in a BF16 change's length contexts are corrupt, by the
    kernels and by the twins, before the magnitude's bits are read."""
    dt, base, target, pos = _wide_block("BF16", 500, 3, 4)
    d = ctx.ordered(dt, target[pos]) - ctx.ordered(dt, base[pos])
    d[0] = 1 << 16
    coded = twins._rc_encode(d, ctx.exponent_field(dt, base[pos]), pos, base.size, 0, 1, 0, 1 << dt.exp_bits)
    enc = ctx.encode(dt, base, target, pos, rc_axes=[(0, 1, 0)], force_rc=True)
    p = ctx.Params.unpack_rc(enc.params)
    p.signs = (0, 1, 0, len(coded))
    outcome = _in_place_alike(dt, p, [enc.streams[0], enc.streams[1], coded], base)
    assert "longer than" in outcome


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(CTX_NAMES), m=st.integers(1, 3000), seed=st.integers(0, 2**32 - 1),
       lengths=st.integers(1, 32), period=st.integers(1, 64), offset=st.integers(0, 10**6), k=st.integers(1, 16),
       rp=st.sampled_from([1, 2]))
def test_range_coded_gaps_match_the_numpy_twins(name, m, seed, lengths, period, offset, k, rp):
    """ctx-delta-rp (SPEC.md §8.10): the same choice (auto or forced), Rice parameters and stream, the
    same elements back, for every dtype and up to 16 classes."""
    dt, base, target, pos = _wide_block(name, m, seed, lengths)
    if not pos.size:
        return
    top = (1 << dt.exp_bits) - 1
    rng = np.random.default_rng(seed + 1)
    thresholds = sorted(set(rng.integers(1, top + 1, min(k, top + 1) - 1).tolist()))
    axes = ctx.sign_axes(period, offset, m)
    (_, a), (_, b) = _both(lambda: ctx.encode(dt, base, target, pos, thresholds=thresholds, rc_axes=axes,
                                              force_rc=True, rp=rp))
    assert a.rp == b.rp and (a.rp or rp == 1)
    assert a.params == b.params and [bytes(s) for s in a.streams] == [bytes(s) for s in b.streams]
    if a.rp:
        p = ctx.Params.unpack_rp(a.params)
        assert p.signs is not None and len(a.streams[0]) == p.signs[3] <= ctx.rp_limit(dt, pos.size, m)
        _rebuilt_alike(dt, p, a.streams, base, target)


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), flips=st.integers(1, 3), cut=st.integers(-2, 2),
       name=st.sampled_from(CTX_NAMES))
def test_corrupt_range_coded_gaps_fail_alike(seed, flips, cut, name):
    """A flipped bit in ctx-delta-rp's stream (its gaps or its changes), or bytes cut off or added:
    the same outcome and message both ways; in place, a rejected block leaves the array untouched."""
    dt, base, target, pos = _wide_block(name, 3000, seed, 12)
    enc = ctx.encode(dt, base, target, pos, thresholds=[1, 3], rc_axes=[(1, 50, seed % 50)], force_rc=True, rp=2)
    p = ctx.Params.unpack_rp(enc.params)
    coded = _damaged(enc.streams[0], seed, flips, cut)
    assert p.signs is not None
    p.signs = (*p.signs[:3], len(coded))
    outcome = _in_place_alike(dt, p, [coded], base)
    assert outcome == "ok" or outcome.startswith("ctx-delta-rp")


def test_a_quotient_past_the_block_fails_alike():
    """SPEC.md §8.10 step 2 (a): a quotient whose next 0 bit takes the rank to m is corrupt as soon as
    that bit is read, by the kernels and by the twins (the decoder never runs on through the stream)."""
    dt, base, target, pos = _wide_block("BF16", 500, 4, 4)
    d = ctx.ordered(dt, target[pos]) - ctx.ordered(dt, base[pos])
    g = np.diff(pos, prepend=-1) - 1
    g[0] = 10 * base.size   # one class, Rice parameter 0: quotient 5000 in a block of 500
    coded = twins._rc_encode(d, ctx.exponent_field(dt, base[pos]), pos, base.size, 0, 1, 0, 1 << dt.exp_bits,
                             (g, [pos.size], [0]))
    p = ctx.Params([], [pos.size], [0], 0, 0, signs=(0, 1, 0, len(coded)), rc=True, rp=True)
    assert "beyond" in _in_place_alike(dt, p, [coded], base)


@settings(max_examples=100, deadline=None)
@given(name=st.sampled_from(CTX_NAMES), m=st.integers(1, 5000), changes=st.integers(0, 400),
       k=st.integers(2, 16), seed=st.integers(0, 2**32 - 1))
@example(name="BF16", m=64 * 9 + 37, changes=300, k=16, seed=1)   # changes in the last, partial word
@example(name="F32", m=128, changes=128, k=3, seed=2)              # every element, whole words only
def test_class_ranks_match_numpy(name, m, changes, k, seed):
    """The encoder's rank of each change among its class's members (one pass, no stored bitmaps) is
    numpy's count of the class's members before it."""
    dt, base, _, _ = _block(name, m, 1, seed)
    rng = np.random.default_rng(seed)
    pos = np.unique(rng.integers(0, m, changes)).astype(np.int64)
    top = (1 << dt.exp_bits) - 1
    thresholds = sorted(set(rng.integers(1, top + 1, k - 1).tolist()))
    edges = np.asarray([t << dt.mant_bits for t in thresholds], dt.uint)
    mask = dt.uint.type((1 << (8 * dt.itemsize - 1)) - 1)
    cls_all = np.searchsorted(edges, base & mask, side="right")   # class k: edges[k-1] <= a < edges[k]
    cls = cls_all[pos].astype(np.uint8)
    want = np.array([np.count_nonzero(cls_all[:p] == cls_all[p]) for p in pos], np.int64)
    assert np.array_equal(kernels._class_ranks(base, mask, edges, pos, cls), want)


@settings(max_examples=80, deadline=None)
@given(name=st.sampled_from(CTX_NAMES), m=st.integers(1, 20000), density=st.floats(0.0005, 1.0),
       k=st.integers(2, 16), beyond=st.booleans(), seed=st.integers(0, 2**32 - 1))
# a whole chunk of words (4096 elements), a partial one and a partial word, changes in each; 2 to 16 classes
@example(name="BF16", m=4096 + 64 * 5 + 17, density=0.3, k=4, beyond=False, seed=1)
@example(name="BF16", m=4096 + 64 * 5 + 17, density=0.3, k=4, beyond=True, seed=2)
@example(name="F32", m=2 * 4096 + 63, density=0.02, k=3, beyond=False, seed=3)
@example(name="F8_E4M3", m=4096 * 3, density=0.9, k=2, beyond=True, seed=4)
@example(name="BF16", m=4096 * 2 + 64 * 3 + 5, density=0.05, k=16, beyond=False, seed=5)
@example(name="F16", m=4096 * 2, density=0.4, k=12, beyond=True, seed=6)
def test_class_select_variants_agree(name, m, density, k, beyond, seed):
    """The decoder's class pass (rank within a class → position, the changed base elements gathered,
    and the base's copy in the same pass; then their exponent fields counted) against numpy, in both
    its forms: the dispatch, ``_select_n`` (any number of classes) and ``_select4``; with the select of a set bit
    this CPU uses (pdep where fast) and the portable one."""
    dt, base, _, _ = _block(name, m, 1, seed)
    rng = np.random.default_rng(seed)
    top = (1 << dt.exp_bits) - 1
    thresholds = sorted(set(rng.integers(1, top + 1, k - 1).tolist()))
    mask = dt.uint.type((1 << (8 * dt.itemsize - 1)) - 1)
    edges = np.asarray([t << dt.mant_bits for t in thresholds], dt.uint)
    cls = np.searchsorted(edges, base & mask, side="right")
    ranks, want = [], []
    for c in range(len(thresholds) + 1):
        members = np.flatnonzero(cls == c)
        pick = np.flatnonzero(rng.random(members.size) < density)
        ranks.append(pick)
        want.append(members[pick])
    counts = np.array([r.size for r in ranks], np.int64)
    if not counts.sum():
        return
    if beyond:   # a rank past its class's members: the pass must say so
        c = int(rng.integers(0, counts.size))
        ranks[c] = np.append(ranks[c], (np.flatnonzero(cls == c).size + int(rng.integers(0, 3))))
        counts[c] += 1
    flat = np.concatenate(ranks).astype(np.int64)
    n = len(thresholds) + 1
    emask = (1 << dt.exp_bits) - 1
    forms = [("dispatch", lambda r, o, cp, bv: kernels._class_select(base, mask, edges, counts, r, o, cp, bv)),
             ("_select_n", lambda r, o, cp, bv: kernels._select_n(base, mask, edges, counts, r, o, cp, bv))]
    if n <= 4:
        pad = int(mask) + 1
        e = [int(x) for x in edges] + [pad] * (3 - len(edges))
        c4 = [int(x) for x in counts] + [0] * (4 - n)
        forms.append(("_select4", lambda r, o, cp, bv: kernels._select4(
            base, mask, *(dt.uint.type(x) for x in e), *c4, r, o, cp, bv)))
    words = rng.integers(0, 2**64, 64, dtype=np.uint64)   # the select of a set bit, both ways
    for x in words[words != 0]:
        rank = int(rng.integers(0, bin(int(x)).count("1")))
        want_bit = [i for i in range(64) if int(x) >> i & 1][rank]
        assert kernels._word_select(x, rank) == want_bit
        if kernels.FAST_PDEP:
            assert kernels._pdep_select(x, rank) == want_bit
    for what, run in forms:
        for copy in (False, True):
            r = np.empty(flat.size + 1, np.int64)
            r[:-1] = flat
            out = np.zeros_like(base)
            gathered = np.zeros(flat.size + 1, base.dtype)
            ok = run(r, out, copy, gathered)
            assert ok is not beyond, what
            if copy:
                assert np.array_equal(out, base), what
            if not beyond:
                pos = np.concatenate(want)
                assert np.array_equal(r[:-1], pos), what
                assert np.array_equal(gathered[:-1], base[pos]), what
                fields = (base[pos] >> dt.mant_bits) & emask
                starts = kernels._field_starts(gathered[:-1], dt.mant_bits, emask)
                below = np.cumsum(np.bincount(fields.astype(np.int64) + 1, minlength=emask + 2))
                assert np.array_equal(starts, below), what


def test_arcfmt_jit_0_turns_the_kernels_off():
    """ARCFMT_JIT=0 turns the kernels off, leaving the work to the numpy twins; .ci/run has a stage that
    runs the ctx-delta tests and every conformance vector that way."""
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, ARCFMT_JIT="0")
    check = subprocess.run([sys.executable, "-c", "from arcfmt import backend, twins; "
                            "assert backend.selected() is twins and backend.compiled() is None"], env=env, cwd=root)
    assert check.returncode == 0


def test_kernels_work_where_numba_cannot_cache():
    """A read-only install with no writable home: numba refuses cache=True; the kernels still compile."""
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = """
import numba, numpy as np
real = numba.njit
def refusing(*a, **k):
    if k.get("cache"):
        raise RuntimeError("cannot cache function: no locator available")
    return real(*a, **k)
numba.njit = refusing
from arcfmt import backend, kernels
from arcfmt.encodings import ctx_delta as ctx
from arcfmt.dtypes import BF16
base = np.arange(5000, dtype=np.uint16)
target = base.copy(); target[::7] += 1
pos = np.flatnonzero(base != target)
enc = ctx.encode(BF16, base, target, pos, thresholds=[3, 20])
out = np.empty_like(base)
ctx.decode(BF16, ctx.Params.unpack(enc.params), enc.streams, base.size, base, out)
assert backend.selected() is kernels and np.array_equal(out, target)
"""
    p = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-2000:]


@pytest.mark.parametrize("in_place", [False, True])
def test_step_out_of_range_fails_alike_and_writes_nothing(in_place):
    dt = _dtype("BF16")
    base = np.arange(0, 5000, dtype=np.uint16)
    base[4000] = 0x7FFE  # ord 32766: one step below the top
    target = base.copy()
    target[[5, 4000]] += np.uint16(1)
    pos = np.flatnonzero(base != target)
    enc = ctx.encode(dt, base, target, pos, thresholds=[1])
    p = ctx.Params.unpack(enc.params)
    mags = bytearray(enc.streams[3])
    mags[:] = bytes([5] * len(mags))  # every step now +6: 0x7FFE's leaves the range
    streams = enc.streams[:3] + [bytes(mags)]

    def dec():
        out = base.copy()
        ctx.decode(dt, p, streams, base.size, out if in_place else base, out)
        return out
    (sa, a), (sb, b) = _both(dec)
    assert sa == sb == "error" and a == b and "range" in a
    out = base.copy()
    with pytest.raises(CorruptError):
        ctx.decode(dt, p, streams, base.size, out, out)
    assert np.array_equal(out, base)


@settings(max_examples=100, deadline=None)
@given(width=st.sampled_from([1, 2, 4]), m=st.integers(0, 700), density=st.floats(0.0, 1.0),
       seed=st.integers(0, 2**32 - 1))
def test_changed_positions_match_numpy(width, m, density, seed):
    rng = np.random.default_rng(seed)
    dtype = np.dtype(f"u{width}")
    base = rng.integers(0, 1 << (8 * width), m, dtype=np.uint64).astype(dtype)
    target = base.copy()
    flip = rng.random(m) < density
    target[flip] ^= dtype.type(1 << int(rng.integers(0, 8 * width)))
    (_, a), (_, b) = _both(lambda: ctx.changed_positions(base, target))
    assert a.dtype == b.dtype == np.int64 or a.size == b.size == 0
    assert np.array_equal(a, b) and np.array_equal(a, np.flatnonzero(base != target))


@settings(max_examples=200, deadline=None)
@given(name=st.sampled_from(CTX_NAMES), m=st.integers(64, 1 << 17), scale=st.floats(-12, 2),
       density=st.floats(0.001, 1.0), k=st.integers(2, 16), seed=st.integers(0, 2**32 - 1))
def test_class_thresholds_match_numpy(name, m, scale, density, k, seed):
    """The compiled exponent-class DP gives the numpy DP's thresholds, on weight-like bases whose small
    values change more often (as under Adam), sampled histograms included (m ≥ 2^16)."""
    dt = _dtype(name)
    rng = np.random.default_rng(seed)
    vals = rng.standard_normal(m) * 2.0 ** scale
    base = bits_of(vals.astype(BY_NAME[name].np)).astype(dt.uint)
    p = np.minimum(1.0, density / (np.abs(vals) / 2.0 ** scale + 0.05))
    pos = np.flatnonzero(rng.random(m) < p)
    (_, a), (_, b) = _both(lambda: ctx.choose_thresholds(dt, base, pos, max_classes=k))
    assert a == b


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(["BF16", "F16", "F32", "F8_E4M3", "F8_E5M2"]), m=st.integers(1, 3000),
       unchanged=st.integers(0, 3000), seed=st.integers(0, 2**32 - 1), flip=st.integers(-1, 3))
def test_dense_delta_matches_the_numpy_twins(name, m, unchanged, seed, flip):
    """dense-delta (§8.7): the same bytes from both encoders; the same target, or the same error, from
    both decoders, also after a flipped bit in stream ``flip`` (-1: none)."""
    dt, base, target, pos = _block(name, m, 0, seed)
    rng = np.random.default_rng(seed)
    target = base + dt.uint.type(1)
    keep = rng.choice(m, min(unchanged, m), replace=False)
    target[keep] = base[keep]
    pos = np.flatnonzero(base != target)
    if not pos.size:
        return
    (_, a), (_, b) = _both(lambda: ctx.encode(dt, base, target, pos, dense=True))
    assert a.params == b.params and [bytes(s) for s in a.streams] == [bytes(s) for s in b.streams]
    p = ctx.dense_unpack(a.params)
    streams = [bytearray(s) for s in a.streams]
    if flip >= 0 and streams[flip]:
        bit = int(rng.integers(0, 8 * len(streams[flip])))
        streams[flip][bit >> 3] ^= 1 << (bit & 7)

    def dec():
        out = base.copy()
        try:
            ctx.decode(dt, p, [bytes(s) for s in streams], m, out, out)
        except CorruptError:
            assert np.array_equal(out, base)
            raise
        return out
    (sa, da), (sb, db) = _both(dec)
    assert sa == sb and (np.array_equal(da, db) if sa == "ok" else da == db)
    if flip < 0:
        assert np.array_equal(da, target)


def test_ctrl_c_while_the_main_thread_loads_a_kernel_leaves_no_lock_held(monkeypatch):
    """A Ctrl-C landing while the main thread's first call of a kernel loads it (numba holds llvmlite's
    lock meanwhile, released only when the load returns) stops the main thread, and the load still
    ends and frees the lock. It used to land inside the load: the lock stayed held and the next block
    thread to load a kernel hung (``arcfmt encode`` interrupted ~1 s in, 1 run in 40)."""
    lock, inside = threading.Lock(), threading.Event()

    def loading(flat, index, values):  # as llvmlite's loader: the lock is released on return only
        lock.acquire()
        inside.set()
        time.sleep(0.5)   # where the interrupt lands
        lock.release()

    def ctrl_c() -> None:
        inside.wait(10)
        os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(kernels, "_scatter", loading)
    threading.Thread(target=ctrl_c).start()
    with pytest.raises(KeyboardInterrupt):
        kernels.scatter(np.zeros(4), np.arange(2), np.ones(2))
        time.sleep(5)   # the interrupt may also come just after the call: never past here
    assert lock.acquire(timeout=10), "the interrupted load left its lock held"


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(CTX_NAMES), m=st.integers(1, 3000), seed=st.integers(0, 2**32 - 1),
       hoff=st.integers(0, 9), moved=st.floats(0.0, 1.0), k=st.integers(1, 6), stride=st.integers(1, 9))
def test_class_keys_match_the_numpy_twins(name, m, seed, hoff, moved, k, stride):
    """ctx-delta-rhp (SPEC.md §8.12): the class keys from a block's history codes (at any offset into
    them: a block may start mid-byte) or its previous value, their key-field counts, the DP's thresholds
    and estimate on them, the block coded on them and decoded again: the same both ways."""
    from arcfmt.history import pack
    dt = _dtype(name)
    rng = np.random.default_rng(seed)
    base = bits_of(random_values(rng, BY_NAME[name], (m,))).astype(dt.uint)
    previous = base.copy()
    previous[rng.random(m) < moved] ^= dt.uint.type(1)
    codes = np.concatenate([rng.integers(0, 3, hoff), np.where(previous == base, 0, 1 + (rng.random(m) < 0.5))])
    history = (pack(codes.astype(np.uint8)), hoff)
    (_, ka), (_, kb) = _both(lambda: backend.selected().class_key(dt, base, history))
    (_, pa), (_, pb) = _both(lambda: backend.selected().class_key(dt, base, previous=previous))
    assert np.array_equal(ka, kb) and np.array_equal(ka, pa) and np.array_equal(pa, pb)
    target = base.copy()
    pos = np.unique(rng.integers(0, m, max(1, m // 7)))
    target[pos] = base[pos] + dt.uint.type(1)
    pos = np.flatnonzero(base != target)
    (_, ca), (_, cb) = _both(lambda: backend.selected().key_counts(dt, base, previous, stride, pos))
    assert all(np.array_equal(x, y) for x, y in zip(ca, cb))
    (_, da), (_, db) = _both(lambda: backend.selected().class_cuts(ca[0], ca[1], k, 32.0))
    assert da[0] == db[0] and np.isclose(da[1], db[1])
    if not pos.size:
        return
    axes = ctx.sign_axes(None, 0, m)
    (_, a), (_, b) = _both(lambda: ctx.encode(dt, base, target, pos, thresholds=da[0], rc_axes=axes, force_rc=True,
                                              history=history, rhp=2, previous=previous))
    assert a.params == b.params and [bytes(s) for s in a.streams] == [bytes(s) for s in b.streams]
    if not a.rhp:   # its changes passed §8.9's bound: written in another encoding
        return
    p = ctx.Params.unpack_rc(a.params)
    p.rh = p.rhp = True

    def dec():
        out = np.empty_like(base)
        ctx.decode(dt, p, a.streams, m, base, out, None, history)
        return out
    (sa, oa), (sb, ob) = _both(dec)
    assert sa == sb == "ok" and np.array_equal(oa, target) and np.array_equal(ob, target)
