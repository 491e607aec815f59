"""The numpy backend of ctx-delta (SPEC.md §8.6): the twins of the compiled kernels.

Same public functions as :mod:`arcfmt.kernels` (:mod:`arcfmt.backend` lists them), computing exactly
the same arrays; used where numba is missing or ``ARCFMT_JIT=0``. ``ctx_decode`` returns the status
of the first failed check, as the kernels do, so that one table words it for both
(``ctx_delta.decode``).
"""
from __future__ import annotations

import array

import numpy as np

from .backend import (
    BEYOND,
    M_LONG,
    OK,
    Q_CODES,
    Q_PADDING,
    R_PADDING,
    RANGE,
    S_CODE,
    S_FIRST,
    S_LENGTH,
    S_PADDING,
    S_PAST,
)
from .encodings.ctx_delta import (
    HISTORY_COST_BITS,
    MAX_RICE,
    SIGN_COST,
    SIGN_PROMISING,
    SIGN_SAMPLE,
    Params,
    exponent_field,
    magnitude_bits,
    magnitude_order,
    ordered,
    unordered,
)
from .planes import bytes_for, from_planes, gaps, to_planes

NAME = "numpy"
_CHUNK = 1 << 16


class _Failed(Exception):
    """A check of ``ctx_decode`` failed: its status code (``ctx_decode`` returns it)."""

    def __init__(self, status: int):
        super().__init__(status)
        self.status = status


# ------------------------------------------------------------------------------------ the backend

def changes(base, target):
    """Indices where ``base`` and ``target`` differ (int64, increasing)."""
    return np.flatnonzero(base != target)


def _codes(dt, previous, base):
    """h of §7 per element (uint8): 0 unchanged, 1 up, 2 down in order-preserving integers."""
    out = np.empty(base.size, np.uint8)
    for s in range(0, base.size, 1 << 20):   # the order-preserving integers take 8 bytes an element
        p, b = previous[s:s + (1 << 20)], base[s:s + (1 << 20)]
        h = out[s:s + (1 << 20)]
        h[:] = np.where(ordered(dt, b) < ordered(dt, p), 2, 1)
        h[p == b] = 0
    return out


def history(dt, previous, base, out=None):
    """The history codes of SPEC.md §7 from ``previous`` to ``base``, packed four to a byte (element
    ``i`` in bits ``2 (i mod 4)`` of byte ``i // 4``); into ``out`` when given."""
    from .history import pack
    packed = pack(_codes(dt, previous, base))
    if out is None:
        return packed
    out[...] = packed
    return out


def history_at(dt, packed, offset, positions, previous, base) -> None:
    """Into packed codes (all 0 there before), the codes of the elements at ``positions`` of
    ``previous`` and ``base``, element ``p`` at ``offset + p`` of ``packed``."""
    q = positions.astype(np.int64) + offset
    codes = _codes(dt, previous[positions], base[positions]).astype(np.int64)
    np.bitwise_or.at(packed, q >> 2, (codes << ((q & 3) << 1)).astype(np.uint8))


def scatter(flat, index, values) -> None:
    """``flat[index] = values``."""
    flat[index] = values


def exponent_counts(dt, base, stride, positions):
    """Elements of ``base[::stride]`` and of ``base[positions]`` per exponent field value."""
    sample = base[::stride]
    size = 1 << dt.exp_bits
    ne = np.zeros(size, np.int64)
    for s in range(0, sample.size, _CHUNK):  # in chunks: bincount widens its input to intp (8 B/element)
        ne += np.bincount(exponent_field(dt, sample[s:s + _CHUNK]), minlength=size)
    ce = np.bincount(exponent_field(dt, base[positions]), minlength=size)
    return ne, ce


def class_key(dt, base, history=None, previous=None):
    """The class keys of a ``ctx-delta-rhp`` block (§8.12), as the kernels make them: each element's
    magnitude bits shifted right by one, bit ``B − 2`` set where its history code is not 0 (``previous``:
    where the block's previous value differs, the same)."""
    key = magnitude_bits(dt, base) >> dt.uint.type(1)
    top = dt.uint.type(1 << (8 * dt.itemsize - 2))
    for s in range(0, base.size, _CHUNK):   # in chunks: the codes' positions take 8 bytes an element
        if previous is not None:
            moved = previous[s:s + _CHUNK] != base[s:s + _CHUNK]
        else:
            moved = _history_at(history, np.arange(s, min(s + _CHUNK, base.size), dtype=np.int64)) != 0
        key[s:s + _CHUNK][moved] |= top
    return key


def key_counts(dt, base, previous, stride, positions):
    """:func:`exponent_counts` of the class keys ``previous`` gives (§8.12's ``x'``), without making them."""
    size = 1 << (dt.exp_bits + 1)

    def fields(b, p):
        return exponent_field(dt, b).astype(np.int64) + ((b != p) << dt.exp_bits)
    ne = np.zeros(size, np.int64)
    sb, sp = base[::stride], previous[::stride]
    for s in range(0, sb.size, _CHUNK):
        ne += np.bincount(fields(sb[s:s + _CHUNK], sp[s:s + _CHUNK]), minlength=size)
    ce = np.bincount(fields(base[positions], previous[positions]), minlength=size)
    return ne, ce


def _classed(dt, base: np.ndarray, thresholds, key) -> tuple[np.ndarray, list[int]]:
    """What a block's thresholds compare, and their edges: the magnitude bits against ``T · 2^M``, or
    (``key``, §8.12) the class keys against ``T · 2^(M−1)``."""
    if key is None:
        return magnitude_bits(dt, base), [t << dt.mant_bits for t in thresholds]
    return key, [t << (dt.mant_bits - 1) for t in thresholds]


def class_cuts(ne, ce, max_classes, overhead) -> tuple[list, float]:
    """Exponent classes that minimise the estimated position bits (an exact DP over contiguous ranges),
    and that estimate."""
    idx = np.flatnonzero(ne)
    L = idx.size
    if L < 2:   # (the changes of exponents without elements are not counted, as in the DP)
        n1, c1 = float(ne[idx].sum()), float(ce[idx].sum())
        return [], float(_rice_cost(np.float64(n1), np.float64(c1))) if c1 > 0 else 0.0
    N = np.concatenate([[0], np.cumsum(ne[idx])]).astype(np.float64)
    C = np.concatenate([[0], np.cumsum(ce[idx])]).astype(np.float64)
    n = N[None, :] - N[:, None]
    c = C[None, :] - C[:, None]
    cost = np.where(c > 0, _rice_cost(n, c), 0.0)
    ends = np.arange(L + 1)
    cost[ends[:, None] >= ends[None, :]] = np.inf  # a class covers at least one exponent: i < j
    dp = cost[0].copy()                          # one class covering bins [0, j)
    best_k, best_total, back = 1, dp[L], []
    for k in range(2, min(max_classes, L) + 1):
        tot = dp[:, None] + cost
        arg = np.argmin(tot, axis=0)
        dp = tot[arg, np.arange(L + 1)]
        back.append(arg)
        if dp[L] + (k - 1) * overhead < best_total:
            best_k, best_total = k, dp[L] + (k - 1) * overhead
    cuts, j = [], L
    for k in range(best_k, 1, -1):
        j = int(back[k - 2][j])
        cuts.append(j)
    return [int(idx[i]) for i in sorted(cuts)], float(best_total)


def ctx_encode(dt, base, target, positions, thresholds, max_rice, dense=False, sign_axes=(), force_signs=False,
               rc_limit=0, rc_planes=False, rp=0, rp_limit=0, history=None, key=None):
    """A whole changed block: ``(counts, rice, qbits, mw, streams, signs, rp_rice)``. ``dense`` (no thresholds):
    the quotient and remainder streams code the unchanged elements' positions (``dense-delta``, §8.7).
    ``sign_axes``: ``(axis, P, phase)`` sign contexts to size (§8.8); ``signs`` is ``(i, coded)`` for
    the one of least estimated size, range-coded, or None when none is given or (unless ``force_signs``)
    the estimate says the raw bits are about as small (as the kernels decide it). ``rc_limit`` > 0:
    ``coded`` is ctx-delta-rc's changes stream (§8.9), or ``signs`` None where it would pass
    ``rc_limit`` bytes; the magnitude planes are then empty unless ``rc_planes``. ``rp``: ``coded`` is
    ctx-delta-rp's stream (§8.10) where the gaps' estimate is below their Rice bits (1) or always (2),
    and ``rp_rice`` its Rice parameters (else None). ``history`` (with ``rc_limit``, without ``rp``):
    the block's history codes (§7): each axis is sized with §8.11's contexts too, and a choice ``i`` of
    ``len(sign_axes)`` or more is axis ``i - len(sign_axes)`` coded with them (``ctx-delta-rh``).
    ``key``: the block's class keys (:func:`class_key`), which the thresholds split (``ctx-delta-rhp``)."""
    k_count = len(thresholds) + 1
    counts, rice, pos_all = [], [], []
    if dense:
        kept = np.ones(base.size, bool)
        kept[positions] = False
        groups = [(positions, np.flatnonzero(kept))]
    elif k_count == 1:
        groups = [(positions, positions)]
    else:
        a = magnitude_bits(dt, base[positions]) if key is None else key[positions]
        lows = [0, *_classed(dt, base[:0], thresholds, key)[1]]
        sels = [(a >= lo) if k == len(lows) - 1 else ((a >= lo) & (a < lows[k + 1])) for k, lo in enumerate(lows)]
        index = class_indexes(dt, base, thresholds, [k for k, sel in enumerate(sels) if sel.any()], key)
        groups = []
        for k, sel in enumerate(sels):
            pos = positions[sel]
            # rank of each changed element among its class's members
            groups.append((pos, index[k].rank(pos) if pos.size else pos))
    gaps_all = []
    for pos, j in groups:
        counts.append(int(pos.size))
        if not pos.size:
            rice.append(0)
            continue
        g = gaps(j)
        rice.append(_best_rice(g, max_rice) if g.size else 0)
        gaps_all.append(g)
        pos_all.append(pos)
    pos = np.concatenate(pos_all)  # class order
    d = ordered(dt, target[pos]) - ordered(dt, base[pos])
    neg, mag = (d < 0).astype(np.uint8), np.abs(d) - 1
    mw = bytes_for(int(mag.max()))
    mag = mag[magnitude_order(dt, base[pos])]
    g = np.concatenate(gaps_all)
    coded = [g.size] if dense else counts
    r_each = np.repeat(np.asarray(rice, np.int64), coded)
    qbits = int((g >> r_each).sum()) + g.size
    rbits = int(r_each.sum())
    qstream, rstream = _rice_pack(g, np.asarray(coded, np.int64), np.asarray(rice, np.int64), qbits, rbits)
    signs = None
    if len(sign_axes):
        sbits, cpos, m = neg.tolist(), pos.tolist(), base.size
        hist = history if history is not None and rc_limit > 0 and not rp else None
        i, promising = 0, True
        if len(sign_axes) > 1 or hist is not None:
            n = min(len(cpos), SIGN_SAMPLE)
            ests = [_sign_cost(sbits[:n], cpos[:n], m, *axes) for axes in sign_axes]
            if hist is not None:
                ests += [_sign_cost(sbits[:n], cpos[:n], m, ax, pe, ph, hist) for ax, pe, ph in sign_axes]
            first = len(sign_axes) if hist is not None and force_signs else 0   # a forced ctx-delta-rh
            i = first + ests[first:].index(min(ests[first:]))
            if i >= len(sign_axes) and not force_signs:   # the history's contexts must pay for its hash
                best = ests.index(min(ests[:len(sign_axes)]))
                if ests[i] + HISTORY_COST_BITS >= ests[best]:
                    i = best
            promising = force_signs or ests[i] < SIGN_PROMISING * n
        if rc_limit > 0:
            axis, period, phase = sign_axes[i % len(sign_axes)]
            use_rp = False
            rp_rice = list(rice)   # -rp's own Rice parameters: ctx-delta's streams keep ``rice``
            if rp:
                est = _rp_rice(g, counts, rp_rice)   # (forced too: it picks the Rice parameters)
                use_rp = rp == 2 or est < qbits + rbits
            limit = rp_limit if use_rp else rc_limit
            changes = _rc_encode(d, exponent_field(dt, base[pos]), pos, m, axis, period, phase, 1 << dt.exp_bits,
                                 (g, counts, rp_rice) if use_rp else None,
                                 hist if i >= len(sign_axes) else None)
            if len(changes) <= limit:
                planes = to_planes(mag, mw) if rc_planes else b""
                return (counts, rice, qbits, mw, [qstream, rstream, _pack([neg]), planes], (i, changes),
                        rp_rice if use_rp else None)
        elif promising:
            signs = (i, _sign_encode(sbits, cpos, m, *sign_axes[i]))
    return counts, rice, qbits, mw, [qstream, rstream, _pack([neg]), to_planes(mag, mw)], signs, None


def ctx_decode(dt, p: Params, streams, m: int, base: np.ndarray, out: np.ndarray,
               positions: np.ndarray | None = None, history: tuple | None = None) -> int:
    """The block into ``out``, one step at a time: OK, or the status of the first failed check, having
    written nothing (every check runs before any element is). ``history``: the block's history codes
    (§7), for a ``ctx-delta-rh`` block (§8.11)."""
    try:
        return _ctx_decode(dt, p, streams, m, base, out, positions, history)
    except _Failed as exc:
        return exc.status


def _ctx_decode(dt, p: Params, streams, m: int, base: np.ndarray, out: np.ndarray,
                positions: np.ndarray | None, history: tuple | None = None) -> int:
    c = p.changed
    if p.dense:
        kept = _ranks(p, streams, [m - c])
        sbits = _unpack(streams[2], c, S_PADDING)
        pos = _complement(kept, m)
    elif p.signs is None:
        ranks = _ranks(p, streams, p.counts)
        sbits = _unpack(streams[2], c, S_PADDING)
        pos = _positions(dt, p, ranks, m, base)
    elif p.rp:   # ctx-delta-rp (§8.10): the gaps, then the changes, from one range decoder
        assert p.signs is not None
        dec = _RangeDecoder(streams[0], _sign_start(streams[0]))
        pos = _positions(dt, p, _rp_ranks(dec, p.counts, p.rice, m), m, base)
        v = _rc_decode(dec, pos, ordered(dt, base[pos]), exponent_field(dt, base[pos]), m,
                       p.signs[0], p.signs[1], p.signs[2], 8 * dt.itemsize, 1 << dt.exp_bits)
        return _commit(dt, pos, v, base, out, positions)
    else:   # ctx-delta-as (§8.8), -rc (§8.9): the range coder starts at step 2, after the positions
        ranks = _ranks(p, streams, p.counts)
        code = _sign_start(streams[2])
        pos = _positions(dt, p, ranks, m, base, history)
        if p.rc:
            assert p.signs is not None
            v = _rc_decode(_RangeDecoder(streams[2], code), pos, ordered(dt, base[pos]),
                           exponent_field(dt, base[pos]), m, p.signs[0], p.signs[1], p.signs[2], 8 * dt.itemsize,
                           1 << dt.exp_bits, history)
            return _commit(dt, pos, v, base, out, positions)
        sbits = np.array(_sign_decode(streams[2], code, pos.tolist(), m, *p.signs[:3]), np.uint8)
    # In place where numpy allows: a block of 2^24 changes took ~60 bytes of scratch per element with
    # a fresh array per step of the arithmetic.
    b = base[pos]
    vals = from_planes(streams[3], c, p.mag_width, np.uint64).view(np.int64)   # widths <= 4 bytes: no wrap
    vals += 1
    mag = np.empty(c, np.int64)
    mag[magnitude_order(dt, b)] = vals
    del vals
    np.negative(mag, out=mag, where=sbits.astype(bool))
    del sbits
    v = ordered(dt, b)
    del b
    v += mag
    del mag
    half = 1 << (8 * dt.itemsize - 1)
    if c and (v.min() < -half or v.max() >= half):
        raise _Failed(RANGE)
    return _commit(dt, pos, v, base, out, positions)


def _commit(dt, pos: np.ndarray, v: np.ndarray, base: np.ndarray, out: np.ndarray,
            positions: np.ndarray | None) -> int:
    """The checked new values (order-preserving integers) into ``out``: OK."""
    c = pos.size
    if out is not base:
        out[:] = base
    out[pos] = unordered(dt, v)
    if positions is not None:
        positions[:c] = pos
    return OK


# ------------------------------------------------------------------------- ctx-delta-as signs (§8.8)
# One sign at a time, in Python: the model's counts change after every sign, so nothing vectorises.

def _contexts(m: int, axis: int, period: int, phase: int) -> int:
    return 1 if axis == 0 else (m - 1 + phase) // period + 1 if axis == 1 else period


def _context(p: int, axis: int, period: int, phase: int) -> int:
    return 0 if axis == 0 else (p + phase) // period if axis == 1 else (p + phase) % period


def _count_model(n: int):
    """``(p0, update)`` over ``n`` fresh contexts of §8.8: the probability (of 4096) of a 0 bit in a
    context, and the count update after a bit (halved at 256)."""
    counts = array.array("H", bytes(4 * n))   # two uint16 a context: a list took 16 bytes

    def p0(x: int) -> int:
        n0, n1 = counts[2 * x], counts[2 * x + 1]
        return ((2 * n0 + 1) * 4096) // (2 * (n0 + n1) + 2)

    def update(x: int, s: int) -> None:
        counts[2 * x + s] += 1
        if counts[2 * x] + counts[2 * x + 1] == 256:
            counts[2 * x] = (counts[2 * x] + 1) >> 1
            counts[2 * x + 1] = (counts[2 * x + 1] + 1) >> 1
    return p0, update


class _RangeEncoder:
    """LZMA's range coder (§8.8's informative encoder)."""

    def __init__(self) -> None:
        self.out = bytearray()
        self.low, self.rng, self.cache, self.pending = 0, 0xFFFFFFFF, 0, 1

    def _shift(self) -> None:
        low = self.low
        if low < 0xFF000000 or low >= 1 << 32:
            carry = low >> 32
            self.out.append((self.cache + carry) & 0xFF)
            self.out.extend([(0xFF + carry) & 0xFF] * (self.pending - 1))
            self.cache, self.pending = (low >> 24) & 0xFF, 0
        self.pending += 1
        self.low = (low & 0x00FFFFFF) << 8

    def put(self, p0: int, s: int) -> None:
        bound = (self.rng >> 12) * p0
        if s:
            self.low += bound
            self.rng -= bound
        else:
            self.rng = bound
        while self.rng < 1 << 24:
            self.rng <<= 8
            self._shift()

    def put_modelled(self, model, x: int, s: int) -> None:
        p0, update = model
        self.put(p0(x), s)
        update(x, s)

    def finish(self) -> bytes:
        for _ in range(5):
            self._shift()
        return bytes(self.out)


class _RangeDecoder:
    """§8.8's range decoder, from its first code (:func:`_sign_start`)."""

    def __init__(self, buf, code: int) -> None:
        self.data, self.code, self.rng, self.r = bytes(buf), code, 0xFFFFFFFF, 5

    def get(self, p0: int) -> int:
        bound = (self.rng >> 12) * p0
        s = int(self.code >= bound)
        if s:
            self.code -= bound
            self.rng -= bound
        else:
            self.rng = bound
        while self.rng < 1 << 24:
            if self.r >= len(self.data):
                raise _Failed(S_PAST)
            self.rng <<= 8
            self.code = (self.code << 8) | self.data[self.r]
            self.r += 1
        return s

    def get_modelled(self, model, x: int) -> int:
        p0, update = model
        s = self.get(p0(x))
        update(x, s)
        return s

    def finish(self) -> None:
        """Every byte read (after the last bit), or ``S_LENGTH``."""
        if self.r != len(self.data):
            raise _Failed(S_LENGTH)


def _sign_cost(sbits: list, cpos: list, m: int, axis: int, period: int, phase: int,
               hist: tuple | None = None) -> float:
    """Estimated bits of the signs in these contexts (with ``hist``: split by history, §8.11)."""
    p0, update = _count_model((1 if hist is None else 3) * _contexts(m, axis, period, phase))
    cost0, cost1 = SIGN_COST[0].tolist(), SIGN_COST[1].tolist()
    hs = _history_at(hist, np.asarray(cpos, np.int64)).tolist()
    total = 0.0
    for p, s, e in zip(cpos, sbits, hs):
        x = _context(p, axis, period, phase) if hist is None else 3 * _context(p, axis, period, phase) + e
        total += cost1[p0(x)] if s else cost0[p0(x)]
        update(x, s)
    return total


def _sign_encode(sbits: list, cpos: list, m: int, axis: int, period: int, phase: int) -> bytes:
    """LZMA's range coder over the signs (§8.8)."""
    model = _count_model(_contexts(m, axis, period, phase))
    coder = _RangeEncoder()
    for p, s in zip(cpos, sbits):
        coder.put_modelled(model, _context(p, axis, period, phase), s)
    return coder.finish()


def _sign_start(buf) -> int:
    """The range decoder's start (§8.8, at §8.6 step 2): its first code."""
    if buf[0] != 0:
        raise _Failed(S_FIRST)
    code = int.from_bytes(bytes(buf[1:5]), "big")
    if code == 0xFFFFFFFF:
        raise _Failed(S_CODE)
    return code


def _sign_decode(buf, code: int, cpos: list, m: int, axis: int, period: int, phase: int) -> list:
    """The signs of the changes at ``cpos`` (class order), as §8.8 decodes them."""
    model = _count_model(_contexts(m, axis, period, phase))
    dec = _RangeDecoder(buf, code)
    bits = [dec.get_modelled(model, _context(p, axis, period, phase)) for p in cpos]
    dec.finish()
    return bits


# ----------------------------------------------------------- ctx-delta-rc signs and magnitudes (§8.9)
_RC_LENGTHS = 16
_RC_CHUNK = 4096


def _rc_models(m: int, axis: int, period: int, phase: int, n_fields: int, history: bool = False):
    """The sign, length and bit models of §8.9, each ``(p0, update)`` over fresh counts (with
    ``history``, §8.11's three sign contexts for each of §8.8's)."""
    lengths = _count_model(n_fields * _RC_LENGTHS)
    bits = _count_model(n_fields * _RC_LENGTHS)
    return _count_model((3 if history else 1) * _contexts(m, axis, period, phase)), lengths, bits


def _history_at(hist: tuple | None, cpos: np.ndarray) -> np.ndarray:
    """The history codes of the changes at ``cpos`` (zeros without a history): from packed codes
    whose element 0 is ``hist[1]`` into ``hist[0]``, clamped to 2."""
    if hist is None:
        return np.zeros(cpos.size, np.int64)
    packed, off = hist
    q = np.asarray(cpos, np.int64) + off
    return np.minimum((packed[q >> 2].astype(np.int64) >> ((q & 3) << 1)) & 3, 2)


def _chunks(*arrays: np.ndarray):
    """The elements of equal-length arrays as Python ints, zipped, a chunk of lists at a time (whole
    lists of a large block took ~100 bytes per change)."""
    for k in range(0, arrays[0].size, _RC_CHUNK):
        yield from zip(*(a[k:k + _RC_CHUNK].tolist() for a in arrays))


def _rc_encode(d: np.ndarray, fields: np.ndarray, cpos: np.ndarray, m: int, axis: int, period: int, phase: int,
               n_fields: int, gaps: tuple | None = None, hist: tuple | None = None) -> bytes:
    """§8.9's changes stream: for each change (class order) its sign, bit length and low bits. With
    ``gaps`` (``g, counts, rice``, class order): §8.10's stream, those gaps coded first. With ``hist``
    (the block's history codes, §7): §8.11's sign contexts."""
    signs, lengths, low = _rc_models(m, axis, period, phase, n_fields, hist is not None)
    hs = _history_at(hist, cpos)
    coder = _RangeEncoder()
    if gaps is not None:
        g, counts, rice = gaps
        quotients, fields_top = _count_model(_RC_LENGTHS * len(counts)), _count_model(len(counts))
        for k, gk in _class_gaps(g, counts):
            rk = rice[k]
            for gi in gk:
                q = gi >> rk
                for j in range(q + 1):
                    coder.put_modelled(quotients, k * _RC_LENGTHS + min(j, _RC_LENGTHS - 1), int(j == q))
                if rk:
                    coder.put_modelled(fields_top, k, (gi >> (rk - 1)) & 1)
                    for b in range(rk - 2, -1, -1):
                        coder.put(2048, (gi >> b) & 1)
    for step, x, p, e in _chunks(d, fields, cpos, hs):
        s, a = int(step < 0), abs(step)
        coder.put_modelled(signs, _context(p, axis, period, phase) * (3 if hist is not None else 1) + e, s)
        n = a.bit_length()
        for k in range(1, n + 1):
            coder.put_modelled(lengths, x * _RC_LENGTHS + min(k - 1, _RC_LENGTHS - 1), int(k == n))
        if n >= 2:
            coder.put_modelled(low, x * _RC_LENGTHS + min(n - 2, _RC_LENGTHS - 1), (a >> (n - 2)) & 1)
            for k in range(n - 3, -1, -1):
                coder.put(2048, (a >> k) & 1)
    return coder.finish()


def _class_gaps(g, counts):
    """``(k, gaps of class k as Python ints)`` for each class with changes, in class order."""
    off = 0
    for k, ck in enumerate(counts):
        if ck:
            yield k, g[off:off + ck].tolist() if isinstance(g, np.ndarray) else g[off:off + ck]
            off += ck


def _rp_rice(g: np.ndarray, counts: list, rice: list) -> float:
    """The kernels' choice of §8.10's Rice parameters (in place: ``rice`` or one less per class) and
    their estimate of its gap bits, operation for operation (the same float sums)."""
    est = 0.0
    for k, gk in _class_gaps(g, counts):
        best = _rp_cost(gk, rice[k])
        if rice[k] > 0:
            down = _rp_cost(gk, rice[k] - 1)
            if down < best:
                best = down
                rice[k] -= 1
        est += best
    return est


def _rp_cost(gk: list, rk: int) -> float:
    """The estimated bits of one class's gaps coded with Rice parameter ``rk`` (§8.10)."""
    p0, update = _count_model(_RC_LENGTHS)
    f0, fupdate = _count_model(1)
    cost0, cost1 = SIGN_COST[0].tolist(), SIGN_COST[1].tolist()
    est = 0.0
    for gi in gk:
        q = gi >> rk
        for j in range(q + 1):
            u = min(j, _RC_LENGTHS - 1)
            est += cost1[p0(u)] if j == q else cost0[p0(u)]
            update(u, int(j == q))
        if rk:
            e = (gi >> (rk - 1)) & 1
            est += (cost1[f0(0)] if e else cost0[f0(0)]) + (rk - 1)
            fupdate(0, e)
    return est


def _rp_ranks(dec: _RangeDecoder, counts: list, rice: list, m: int) -> np.ndarray:
    """§8.10 step 2: each class's member ranks (class order) from the gaps at the stream's start."""
    quotients, fields_top = _count_model(_RC_LENGTHS * len(counts)), _count_model(len(counts))
    ranks = np.empty(sum(counts), np.int64)
    t = 0
    for k, ck in enumerate(counts):
        rk, prev = rice[k], -1
        for _ in range(ck):
            q = 0
            while not dec.get_modelled(quotients, k * _RC_LENGTHS + min(q, _RC_LENGTHS - 1)):
                q += 1
                if prev + 1 + (q << rk) >= m:
                    raise _Failed(BEYOND)
            f = 0
            if rk:
                f = dec.get_modelled(fields_top, k)
                for _ in range(rk - 1):
                    f = 2 * f + dec.get(2048)
            prev += (q << rk) + f + 1
            if prev >= m:
                raise _Failed(BEYOND)
            ranks[t] = prev
            t += 1
    return ranks


def _rc_decode(dec: _RangeDecoder, cpos: np.ndarray, ords: np.ndarray, fields: np.ndarray, m: int, axis: int,
               period: int, phase: int, nbits: int, n_fields: int, hist: tuple | None = None) -> np.ndarray:
    """The new values (order-preserving integers) of the changes at ``cpos`` (class order), as §8.9
    decodes them from their bases' ``ords`` and exponent ``fields``, ``dec`` going on from where it is.
    With ``hist`` (the block's history codes, §7): §8.11's sign contexts."""
    signs, lengths, low = _rc_models(m, axis, period, phase, n_fields, hist is not None)
    half = 1 << (nbits - 1)
    out = np.empty(cpos.size, np.int64)
    t = 0
    for p, o, x, e in _chunks(cpos, ords, fields, _history_at(hist, cpos)):
        s = dec.get_modelled(signs, _context(p, axis, period, phase) * (3 if hist is not None else 1) + e)
        n = 1
        while not dec.get_modelled(lengths, x * _RC_LENGTHS + min(n - 1, _RC_LENGTHS - 1)):
            if n == nbits:
                raise _Failed(M_LONG)
            n += 1
        a = 1
        if n >= 2:
            a = 2 + dec.get_modelled(low, x * _RC_LENGTHS + min(n - 2, _RC_LENGTHS - 1))
            for _ in range(n - 2):
                a = 2 * a + dec.get(2048)
        v = o - a if s else o + a
        if not -half <= v < half:
            raise _Failed(RANGE)
        out[t] = v
        t += 1
    dec.finish()
    return out


# ------------------------------------------------------------------------------------ class index

def _pack_words(mask: np.ndarray) -> np.ndarray:
    packed = np.packbits(mask, bitorder="little")
    if packed.size % 8:
        packed = np.concatenate([packed, np.zeros(8 - packed.size % 8, np.uint8)])
    return packed.view("<u8")


def _all_words(m: int) -> np.ndarray:
    """Packed bitmap with bits ``0 … m−1`` set."""
    words = np.full((m + 63) // 64, np.uint64(0xFFFFFFFFFFFFFFFF))
    if m % 64:
        words[-1] = np.uint64((1 << (m % 64)) - 1)
    return words


def class_indexes(dt, base: np.ndarray, thresholds, wanted, key=None) -> _Lazy:
    """A :class:`ClassIndex` for each class in ``wanted``, from one compare per threshold it needs
    (what the kernels compare word by word in one pass: ``_class_ranks``, ``_class_select``).

    Class ``k`` is ``{a >= lo_k} AND NOT {a >= hi_k}`` on the magnitude bits ``a``, so the bitmaps of
    ``a >= T·2^M`` are computed once and combined word by word.
    """
    m = base.size
    a, edges = _classed(dt, base, thresholds, key)   # (``key``: §8.12's class keys)
    # packed bitmaps of a >= edges[i], each threshold the wanted classes need (then ``a`` is dropped)
    ge = {i: _pack_words(a >= dt.uint.type(edges[i])) for i in sorted({j for k in wanted for j in (k - 1, k)
                                                                       if 0 <= j < len(edges)})}
    del a

    def at_least(i):
        return ge[i]

    def index(k: int) -> ClassIndex:
        if k == 0:
            words = ~at_least(0) & _all_words(m)
        else:
            words = at_least(k - 1) if k == len(edges) else at_least(k - 1) & ~at_least(k)
        return ClassIndex(words, m=m)
    return _Lazy(index, wanted)


class _Lazy:
    """Each class's index made when it is asked for and not kept: sixteen at once took 8 bytes an
    element (the 4x-a-block memory bound, tests/test_ctx_delta.py)."""

    def __init__(self, make, wanted) -> None:
        self.make, self.wanted = make, set(wanted)

    def __getitem__(self, k: int) -> ClassIndex:
        if k not in self.wanted:
            raise KeyError(k)
        return self.make(k)

    def __iter__(self):
        return iter(sorted(self.wanted))


_SELECT8 = np.zeros((256, 8), np.uint8)  # [byte, r]: bit position of the r-th set bit of the byte
for _v in range(256):
    _b = [i for i in range(8) if _v >> i & 1]
    _SELECT8[_v, :len(_b)] = _b


class ClassIndex:
    """Rank and select over one class's members, from its membership bitmap packed 64 per word.

    Why: a class's k-th member is found in O(log m) after one cheap O(m / 64) pass, instead of listing
    every member (``flatnonzero`` on a random bitmap is branch-bound and several times slower).
    """

    def __init__(self, words: np.ndarray, *, m: int):
        self.m = m
        self.words = words
        self.pop = np.bitwise_count(words).astype(np.int64)
        self.cum = np.cumsum(self.pop)  # members in words 0..w
        self.size = int(self.cum[-1]) if self.cum.size else 0

    def select(self, j: np.ndarray) -> np.ndarray:
        """Element index of each member rank in ``j`` (all ``< size``)."""
        if 32 * j.size > self.m:  # dense: listing every member is cheaper
            bits = np.unpackbits(self.words.view(np.uint8), count=self.m, bitorder="little")
            return np.flatnonzero(bits)[j]
        w = np.searchsorted(self.cum, j, side="right")
        r = (j - (self.cum[w] - self.pop[w])).astype(np.uint64)  # rank within the word
        x = self.words[w]
        at = w * 64
        for half in (32, 16, 8):  # binary search for the byte that holds the member
            low = x & np.uint64((1 << half) - 1)
            p = np.bitwise_count(low).astype(np.uint64)
            up = r >= p
            r = np.where(up, r - p, r)
            x = np.where(up, x >> np.uint64(half), low)
            at = at + np.where(up, half, 0)
        return at + _SELECT8[x.astype(np.intp), r.astype(np.intp)]

    def rank(self, pos: np.ndarray) -> np.ndarray:
        """Members before each element index in ``pos``."""
        w, bit = pos >> 6, (pos & 63).astype(np.uint64)
        below = self.words[w] & ((np.uint64(1) << bit) - np.uint64(1))
        return self.cum[w] - self.pop[w] + np.bitwise_count(below).astype(np.int64)


# ------------------------------------------------------------------------------------ Rice coding

def _rice_cost(n, c):
    """Estimated Rice bits for ``c`` changes spread over ``n`` elements (arrays)."""
    c = np.maximum(c, 1e-9)
    mu = np.maximum(n - c, 0) / c
    r0 = np.floor(np.log2(np.maximum(mu * np.log(2), 1.0)))
    best = None
    for r in (r0, r0 + 1):
        cost = c * (1 + r + mu / np.exp2(r))
        best = cost if best is None else np.minimum(best, cost)
    return best


def _rice_pack(g, counts, rice, qbits: int, rbits: int) -> tuple:
    """Quotient and remainder bit strings of the gaps ``g`` (class order); numpy twin of the kernels'
    ``_rice_encode``."""
    r_each = np.repeat(rice, counts)
    term = np.cumsum((g >> r_each) + 1) - 1
    qb = np.zeros(qbits, np.uint8)
    qb[term] = 1
    rems = [((gk[:, None] >> np.arange(r)) & 1).astype(np.uint8).ravel()
            for gk, r in zip(np.split(g, np.cumsum(counts)[:-1]), rice) if r]
    return _pack([qb]), _pack(rems)


def _best_rice(g: np.ndarray, max_rice: int = MAX_RICE) -> int:
    """The smallest Rice parameter of least total bits. The cost ``sum(g >> r) + n·r`` is convex in r
    (each gap's ``(g >> r) − (g >> r+1)`` falls as r grows), so a walk from the estimate finds it."""
    top = min(max_rice, int(g.max()).bit_length())

    def cost(r):
        return int((g >> r).sum()) + g.size * r

    mean = float(g.mean())
    r = min(top, max(0, int(np.log2(mean * np.log(2))) if mean >= 1 else 0))
    c = cost(r)
    while r > 0 and (down := cost(r - 1)) <= c:
        r, c = r - 1, down
    while r < top and (up := cost(r + 1)) < c:
        r, c = r + 1, up
    return r


def _pack(bits_list) -> bytes:
    if not bits_list:
        return b""
    bits = np.concatenate(bits_list) if len(bits_list) > 1 else bits_list[0]
    return np.packbits(bits, bitorder="little").tobytes()


def _unpack(buf, nbits: int, padding: int) -> np.ndarray:
    bits = np.unpackbits(np.frombuffer(buf, np.uint8), bitorder="little")
    if bits[nbits:].any():
        raise _Failed(padding)
    return bits[:nbits]


# ------------------------------------------------------------------------------------ decode steps

def _ranks(p: Params, streams, coded) -> np.ndarray:
    """Each class's coded ranks (``coded[k]`` of them; concatenated in class order) from the quotient
    and remainder bit strings, with their checks in the order of SPEC.md §8.6 (§8.7): quotient padding,
    codes, remainder padding."""
    c = sum(coded)
    term = np.flatnonzero(_unpack(streams[0], p.qbits, Q_PADDING))
    if term.size != c or (p.qbits and (not term.size or term[-1] != p.qbits - 1)):
        raise _Failed(Q_CODES)
    nbits = sum(ck * r for ck, r in zip(coded, p.rice))
    if nbits % 8 and streams[1][-1] >> (nbits % 8):
        raise _Failed(R_PADDING)
    # Each code's quotient (the zeros before its end bit), then, class by class and in place, the gap
    # (quotient << r | remainder) and the running sum of gaps + 1 (the rank): one int64 array in all.
    ranks = term.astype(np.int64)   # the first code starts at bit 0: its quotient is its end bit
    ranks[1:] -= term[:-1]
    ranks[1:] -= 1
    del term
    rbuf = np.frombuffer(bytes(streams[1]) + bytes(4), np.uint8)   # fields read 4 bytes at a time
    off = roff = 0
    for ck, r in zip(coded, p.rice):
        if not ck:
            continue
        g = ranks[off:off + ck]
        g <<= r
        if r:
            g |= _fields(rbuf, roff, ck, r)
        g += 1
        np.cumsum(g, out=g)
        g -= 1
        off += ck
        roff += ck * r
    return ranks


_FIELD_CHUNK = 1 << 16


def _fields(rbuf: np.ndarray, start: int, count: int, r: int) -> np.ndarray:
    """``count`` consecutive ``r``-bit fields (``r ≤ 24``) of the bit string ``rbuf`` from bit ``start``,
    in chunks: a field spans at most 4 bytes, so no array of one entry per bit is ever made (a block
    of 2^24 24-bit fields would need gigabytes that way)."""
    out = np.empty(count, np.int64)
    mask = np.uint32((1 << r) - 1)
    for s0 in range(0, count, _FIELD_CHUNK):
        pos = start + np.arange(s0, min(count, s0 + _FIELD_CHUNK), dtype=np.int64) * r
        at = pos >> 3
        word = (rbuf[at].astype(np.uint32) | rbuf[at + 1].astype(np.uint32) << 8
                | rbuf[at + 2].astype(np.uint32) << 16 | rbuf[at + 3].astype(np.uint32) << 24)
        out[s0:s0 + pos.size] = (word >> (pos & 7).astype(np.uint32)) & mask
    return out


def _complement(kept: np.ndarray, m: int) -> np.ndarray:
    """A dense-delta block's changes: the indices of ``[0, m)`` not among the unchanged ones (§8.7)."""
    if kept.size and kept[-1] >= m:
        raise _Failed(BEYOND)
    changed = np.ones(m, bool)
    changed[kept] = False
    return np.flatnonzero(changed)


def _positions(dt, p: Params, ranks: np.ndarray, m: int, base: np.ndarray, history: tuple | None = None) -> np.ndarray:
    """Changed element indices in class order, from each class's member ranks (a ctx-delta-rhp block's
    classes: of its class keys, made from ``history``, §8.12)."""
    if p.classes == 1:
        if ranks[-1] >= m:
            raise _Failed(BEYOND)
        return ranks
    key = class_key(dt, base, history) if p.rhp else None
    index = class_indexes(dt, base, p.thresholds, [k for k, ck in enumerate(p.counts) if ck], key)
    pos = np.empty(p.changed, np.int64)
    off = 0
    for k, ck in enumerate(p.counts):
        if not ck:
            continue
        j = ranks[off:off + ck]
        ix = index[k]
        if j[-1] >= ix.size:
            raise _Failed(BEYOND)
        pos[off:off + ck] = ix.select(j)
        off += ck
    return pos
