"""The ``ctx-delta`` block transform (SPEC.md §8.6): change positions coded per context class of the base.

Why: in RL fine-tuning a weight changes with probability of roughly ``lr / ulp(weight)``, so the exponent
of the base value, which the receiver already holds, predicts where the changes are. Positions are
Rice-coded gaps within each exponent class; steps are differences of order-preserving integers (so
crossing a binade or zero is an ordinary step, never an exception), stored as a sign bit and a
magnitude. Pure: arrays in, byte streams out.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import kernels
from .dtypes import DType
from .errors import CorruptError
from .planes import bytes_for, from_planes, gaps, to_planes

MAX_CLASSES = 16      # K
MAX_RICE = 24         # Rice parameter of a class
DTYPES = frozenset({"BF16", "F16", "F32", "F8_E4M3", "F8_E5M2"})
# Encoder tuning (not part of the format).
CLASS_LIMITS = {"fast": 1, "default": 4, "max": 8}  # classes the encoder may use, per effort level
_CLASS_OVERHEAD_BITS = 96.0   # params, stream-table entry and codec framing of one more class
_MIN_CHANGES_FOR_CLASSES = 64
_CHUNK = 1 << 16
_HIST_STRIDE = 8          # blocks of at least _CHUNK elements: the exponent histogram samples every 8th


def defined_for(dt: DType) -> bool:
    return dt.name in DTYPES


@dataclass
class Params:
    thresholds: list   # K-1 exponent-field thresholds, strictly increasing
    counts: list       # K changed counts, one per class
    rice: list         # K Rice parameters
    qbits: int         # bits in the quotient stream
    mag_width: int     # bytes per magnitude

    @property
    def classes(self) -> int:
        return len(self.counts)

    @property
    def changed(self) -> int:
        return sum(self.counts)

    def pack(self) -> list:
        return [len(self.counts), *self.thresholds, *self.counts, *self.rice, self.qbits, self.mag_width]

    @classmethod
    def unpack(cls, p) -> "Params":
        k = p[0]
        return cls(list(p[1:k]), list(p[k:2 * k]), list(p[2 * k:3 * k]), p[3 * k], p[3 * k + 1])


def param_count(head) -> int:
    """Params are ``K``, then ``3K + 1`` more; ``K`` is checked as soon as it is read."""
    if not head:
        return 1
    k = head[0]
    if not 1 <= k <= MAX_CLASSES:
        raise CorruptError(f"ctx-delta class count {k} outside 1..{MAX_CLASSES}")
    return 3 * k + 2


def stream_lengths(dt: DType, p: Params, m: int) -> list:
    """Check the params (SPEC.md §8.6) and return the decoded length of each of the 4 streams."""
    top = (1 << dt.exp_bits) - 1
    prev = 0
    for t in p.thresholds:
        if not prev < t <= top:
            raise CorruptError(f"ctx-delta thresholds {p.thresholds} not strictly increasing within 1..{top}")
        prev = t
    c = p.changed
    if not 1 <= c <= m:
        raise CorruptError(f"ctx-delta changed count {c} outside 1..{m}")
    if any(r > MAX_RICE for r in p.rice):
        raise CorruptError(f"ctx-delta Rice parameter above {MAX_RICE}")
    if not c <= p.qbits <= m:
        raise CorruptError(f"ctx-delta quotient bit count {p.qbits} outside {c}..{m}")
    if not 1 <= p.mag_width <= dt.itemsize:
        raise CorruptError(f"ctx-delta magnitude width {p.mag_width} outside 1..{dt.itemsize}")
    rbits = sum(ck * r for ck, r in zip(p.counts, p.rice))
    return [(p.qbits + 7) // 8, (rbits + 7) // 8, (c + 7) // 8, c * p.mag_width]


# ----------------------------------------------------------------------------------------- shared

def _bits(dt: DType) -> int:
    return 8 * dt.itemsize


def ordered(dt: DType, u: np.ndarray) -> np.ndarray:
    """Order-preserving integer of each bit pattern: ``u`` if the sign is clear, else ``2^(B-1)-1-u``."""
    half = 1 << (_bits(dt) - 1)
    v = u.astype(np.int64)
    return np.where(v >= half, (half - 1) - v, v)


def unordered(dt: DType, v: np.ndarray) -> np.ndarray:
    half = 1 << (_bits(dt) - 1)
    return np.where(v >= 0, v, (half - 1) - v).astype(dt.uint)


def class_bounds(dt: DType, thresholds) -> list:
    """``(lo, hi)`` bounds on the magnitude bits ``u AND (2^(B-1)-1)`` of each class (hi None: no bound)."""
    edges = [t << dt.mant_bits for t in thresholds]
    return list(zip([0] + edges, edges + [None]))


def magnitude_bits(dt: DType, base: np.ndarray) -> np.ndarray:
    return base & dt.uint.type((1 << (_bits(dt) - 1)) - 1)


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


def class_indexes(dt: DType, base: np.ndarray, thresholds, wanted) -> dict:
    """A :class:`ClassIndex` for each class in ``wanted``, from one compare per threshold it needs
    (the numpy twin of the kernels' ``class_words``).

    Class ``k`` is ``{a >= lo_k} AND NOT {a >= hi_k}`` on the magnitude bits ``a``, so the bitmaps of
    ``a >= T·2^M`` are computed once and combined word by word.
    """
    m = base.size
    edges = [t << dt.mant_bits for t in thresholds]
    a = magnitude_bits(dt, base)
    ge = {}

    def at_least(i):  # packed bitmap of a >= edges[i]
        if i not in ge:
            ge[i] = _pack_words(a >= dt.uint.type(edges[i]))
        return ge[i]

    out = {}
    for k in wanted:
        if k == 0:
            words = ~at_least(0) & _all_words(m)
        else:
            words = at_least(k - 1) if k == len(edges) else at_least(k - 1) & ~at_least(k)
        out[k] = ClassIndex(words, m=m)
    return out


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


def choose_thresholds(dt: DType, base: np.ndarray, positions: np.ndarray, max_classes: int = 4) -> list:
    """Exponent classes that minimise the estimated position bits: an exact DP over contiguous ranges."""
    if positions.size < _MIN_CHANGES_FOR_CLASSES or max_classes <= 1:
        return []
    size = 1 << dt.exp_bits
    stride = _HIST_STRIDE if base.size >= _CHUNK else 1
    sample = base[::stride]
    if kernels.ENABLED:
        ne, ce = kernels.exponent_counts(sample, base[positions], dt.mant_bits, size - 1, size)
    else:
        ne = np.zeros(size, np.int64)
        for s in range(0, sample.size, _CHUNK):  # in chunks: bincount widens its input to intp (8 B/element)
            ne += np.bincount(exponent_field(dt, sample[s:s + _CHUNK]), minlength=size)
        ce = np.bincount(exponent_field(dt, base[positions]), minlength=size)
    ne = np.maximum(ne * stride, ce)  # a sampled count never falls below the changes seen
    if kernels.ENABLED:
        return kernels.class_cuts(ne, ce, max_classes, _CLASS_OVERHEAD_BITS).tolist()
    idx = np.flatnonzero(ne)
    L = idx.size
    if L < 2:
        return []
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
        if dp[L] + (k - 1) * _CLASS_OVERHEAD_BITS < best_total:
            best_k, best_total = k, dp[L] + (k - 1) * _CLASS_OVERHEAD_BITS
    cuts, j = [], L
    for k in range(best_k, 1, -1):
        j = int(back[k - 2][j])
        cuts.append(j)
    return [int(idx[i]) for i in sorted(cuts)]


def changed_positions(base: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Indices of the elements that differ (int64, increasing)."""
    if kernels.ENABLED and base.dtype.itemsize <= 4:
        return kernels.changes(base, target)
    return np.flatnonzero(base != target)


def exponent_field(dt: DType, u: np.ndarray) -> np.ndarray:
    return (u >> dt.uint.type(dt.mant_bits)) & dt.uint.type((1 << dt.exp_bits) - 1)


def magnitude_order(dt: DType, b: np.ndarray) -> np.ndarray:
    """Where each change's magnitude is stored: changes sorted by their base's exponent field, stably.

    Why: the size of a step in ulps scales with 1/ulp, so grouping by exponent hands the codec runs of
    like-sized magnitudes.
    """
    return np.argsort(exponent_field(dt, b), kind="stable")


_MAG_MASK = {1: 0x7F, 2: 0x7FFF, 4: 0x7FFFFFFF}


def _rice_pack(g, counts, rice, qbits: int, rbits: int) -> tuple:
    """Quotient and remainder bit strings of the gaps ``g`` (class order); numpy twin of the kernels'
    ``rice_encode``."""
    r_each = np.repeat(rice, counts)
    term = np.cumsum((g >> r_each) + 1) - 1
    qb = np.zeros(qbits, np.uint8)
    qb[term] = 1
    rems = [((gk[:, None] >> np.arange(r)) & 1).astype(np.uint8).ravel()
            for gk, r in zip(np.split(g, np.cumsum(counts)[:-1]), rice) if r]
    return _pack([qb]), _pack(rems)


def _best_rice(g: np.ndarray) -> int:
    """The smallest Rice parameter of least total bits. The cost ``sum(g >> r) + n·r`` is convex in r
    (each gap's ``(g >> r) − (g >> r+1)`` falls as r grows), so a walk from the estimate finds it."""
    top = min(MAX_RICE, int(g.max()).bit_length())

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


def _unpack(buf, nbits: int, what: str) -> np.ndarray:
    bits = np.unpackbits(np.frombuffer(buf, np.uint8), bitorder="little")
    if bits[nbits:].any():
        raise CorruptError(f"ctx-delta {what} stream: padding bits are not zero")
    return bits[:nbits]


# ----------------------------------------------------------------------------------------- encode

@dataclass
class Encoded:
    params: list
    streams: list


def encode(dt: DType, base: np.ndarray, target: np.ndarray, positions: np.ndarray,
           thresholds=None, max_classes: int = 4) -> Encoded:
    """Encode one changed block; ``positions`` are its changed elements (non-empty, increasing)."""
    if thresholds is None:
        thresholds = choose_thresholds(dt, base, positions, max_classes)
    if kernels.ENABLED:
        counts, rice, qbits, q, r, s, mw, mag = kernels.ctx_encode(
            base, target, positions, np.asarray([t << dt.mant_bits for t in thresholds], dt.uint),
            dt.uint.type(_MAG_MASK[dt.itemsize]), dt.mant_bits, (1 << dt.exp_bits) - 1, 1 << (_bits(dt) - 1),
            MAX_RICE)
        params = Params(list(thresholds), counts.tolist(), rice.tolist(), int(qbits), int(mw))
        return Encoded(params.pack(), [q.tobytes(), r.tobytes(), s.tobytes(), mag.tobytes()])
    # the numpy twin of ctx_encode
    k_count = len(thresholds) + 1
    counts, rice, pos_all = [], [], []
    if k_count == 1:
        groups = [(positions, positions)]
    else:
        a = magnitude_bits(dt, base[positions])
        sels = [(a >= lo) if hi is None else ((a >= lo) & (a < hi)) for lo, hi in class_bounds(dt, thresholds)]
        index = class_indexes(dt, base, thresholds, [k for k, sel in enumerate(sels) if sel.any()])
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
        rice.append(_best_rice(g))
        gaps_all.append(g)
        pos_all.append(pos)
    pos = np.concatenate(pos_all)  # class order
    d = ordered(dt, target[pos]) - ordered(dt, base[pos])
    neg, mag = (d < 0).astype(np.uint8), np.abs(d) - 1
    mag = mag[magnitude_order(dt, base[pos])]
    g = np.concatenate(gaps_all)
    r_each = np.repeat(np.asarray(rice, np.int64), counts)
    qbits = int((g >> r_each).sum()) + g.size
    rbits = int(r_each.sum())
    qstream, rstream = _rice_pack(g, np.asarray(counts, np.int64), np.asarray(rice, np.int64), qbits, rbits)
    mw = bytes_for(int(mag.max()))
    params = Params(list(thresholds), counts, rice, qbits, mw)
    streams = [qstream, rstream, _pack([neg]), to_planes(mag, mw)]
    return Encoded(params.pack(), streams)


# ----------------------------------------------------------------------------------------- decode

def _ranks(p: Params, streams) -> np.ndarray:
    """Each class's member ranks (concatenated in class order) from the quotient and remainder bit
    strings, with their checks in the order of SPEC.md §8.6: quotient padding, codes, remainder padding."""
    c = p.changed
    qb = _unpack(streams[0], p.qbits, "quotient")
    term = np.flatnonzero(qb)
    if term.size != c or term[-1] != p.qbits - 1:
        raise CorruptError(f"ctx-delta quotient stream holds {term.size} codes ending at bit "
                           f"{int(term[-1]) if term.size else -1}, expected {c} ending at bit {p.qbits - 1}")
    quot = np.diff(term, prepend=-1) - 1
    rbits = _unpack(streams[1], sum(ck * r for ck, r in zip(p.counts, p.rice)), "remainder")
    out = []
    off = roff = 0
    for ck, r in zip(p.counts, p.rice):
        if not ck:
            continue
        g = quot[off:off + ck].astype(np.int64) << r
        if r:
            g |= rbits[roff:roff + ck * r].reshape(ck, r).astype(np.int64) @ (np.int64(1) << np.arange(r, dtype=np.int64))
        out.append(np.cumsum(g + 1) - 1)
        off += ck
        roff += ck * r
    return np.concatenate(out)


def _positions(dt: DType, p: Params, ranks: np.ndarray, m: int, base: np.ndarray) -> np.ndarray:
    """Changed element indices in class order, from each class's member ranks."""
    if p.classes == 1:
        if ranks[-1] >= m:
            raise CorruptError(f"ctx-delta position {int(ranks[-1])} beyond block of {m} elements")
        return ranks
    index = class_indexes(dt, base, p.thresholds, [k for k, ck in enumerate(p.counts) if ck])
    pos = np.empty(p.changed, np.int64)
    off = 0
    for k, ck in enumerate(p.counts):
        if not ck:
            continue
        j = ranks[off:off + ck]
        if j[-1] >= index[k].size:
            raise CorruptError(f"ctx-delta class {k}: index {int(j[-1])} beyond its {index[k].size} elements")
        pos[off:off + ck] = index[k].select(j)
        off += ck
    return pos


def decode(dt: DType, p: Params, streams, m: int, base: np.ndarray, out: np.ndarray) -> None:
    """Rebuild the block into ``out`` (may be ``base``); every check runs before any element is written."""
    if kernels.ENABLED:
        status = kernels.ctx_decode(
            base, out, _bytes_array(streams[0]), p.qbits, _bytes_array(streams[1]), _bytes_array(streams[2]),
            _bytes_array(streams[3]), p.mag_width, np.asarray(p.counts, np.int64), np.asarray(p.rice, np.int64),
            np.asarray([t << dt.mant_bits for t in p.thresholds], dt.uint),
            dt.uint.type(_MAG_MASK[dt.itemsize]), dt.mant_bits, (1 << dt.exp_bits) - 1, 1 << (_bits(dt) - 1),
            out is not base)
        if status == kernels.OK:
            return
        # A check failed: the step-by-step path finds it again and raises it with its message. It
        # writes to scratch, so even if the two paths disagreed (a bug) ``out`` stays untouched.
        _decode_steps(dt, p, streams, m, base, np.empty_like(base))
        raise CorruptError(f"ctx-delta: block fails check {status} of the compiled decoder only")
    _decode_steps(dt, p, streams, m, base, out)


def _bytes_array(buf) -> np.ndarray:
    """A read-only uint8 view: numba compiles a kernel once per array layout, and streams arrive as
    bytes, bytearrays or memoryviews, so all are passed alike (one compiled ``ctx_decode`` per type)."""
    a = np.frombuffer(buf, np.uint8)
    if a.flags.writeable:
        a = a.view()
        a.flags.writeable = False
    return a


def _decode_steps(dt: DType, p: Params, streams, m: int, base: np.ndarray, out: np.ndarray) -> None:
    """The numpy twin of the kernels' ``ctx_decode``, one step at a time; it also words the error when
    the kernel reports a failed check."""
    c = p.changed
    ranks = _ranks(p, streams)
    sbits = _unpack(streams[2], c, "sign")
    pos = _positions(dt, p, ranks, m, base)
    b = base[pos]
    order = magnitude_order(dt, b)
    vals = from_planes(streams[3], c, p.mag_width, np.uint64)
    half = 1 << (_bits(dt) - 1)
    mag = np.empty(c, np.int64)
    mag[order] = vals.astype(np.int64) + 1
    v = ordered(dt, b) + np.where(sbits.astype(bool), -mag, mag)
    if v.min() < -half or v.max() >= half:
        raise CorruptError(f"ctx-delta: a step leaves the range of {dt.name} bit patterns")
    if out is not base:
        out[:] = base
    out[pos] = unordered(dt, v)


def warm_up() -> None:
    """Compile every kernel for every ctx-delta type now (or load them from numba's cache).

    Why: the first block of a type otherwise pays the compilation (seconds, once per install) — wrong
    for anything that times single calls, such as the fuzzer's per-case limit.
    """
    if not kernels.ENABLED:
        return
    from .dtypes import from_name
    rng = np.random.default_rng(0)
    for name in sorted(DTYPES):
        dt = from_name(name)
        m = 1 << 17  # large enough for the sampled histogram and several classes
        base = rng.integers(0, 1 << (8 * dt.itemsize), m, dtype=np.uint64).astype(dt.uint)
        target = base.copy()
        target[::97] ^= dt.uint.type(1)
        frozen = base.copy()
        frozen.setflags(write=False)  # numba compiles read-only arrays separately
        frozen_target = target.copy()
        frozen_target.setflags(write=False)
        pos = changed_positions(base, target)
        changed_positions(frozen, frozen_target)  # memory-mapped checkpoints are read-only
        top = (1 << dt.exp_bits) - 1
        for thresholds in (None, [max(1, top // 2)]):
            enc = encode(dt, base, target, pos, thresholds=thresholds, max_classes=4)
            p = Params.unpack(enc.params)
            for b, streams in ((base, enc.streams), (frozen, [bytearray(x) for x in enc.streams])):
                decode(dt, p, streams, m, b, np.empty_like(base))
