"""``ctx-delta`` (SPEC.md §8.6): change positions coded per context class of the base.

Why: in RL fine-tuning a weight changes with probability of roughly ``lr / ulp(weight)``, so the exponent
of the base value, which the receiver already holds, predicts where the changes are. Positions are
Rice-coded gaps within each exponent class; steps are differences of order-preserving integers (so
crossing a binade or zero is an ordinary step, never an exception), stored as a sign bit and a
magnitude. Pure: arrays in, byte streams out.

The per-element work (changed positions, the exponent histogram and class DP, a whole block's
encoding and decoding) is done by the backend (:mod:`arcfmt.backend`): numba kernels or their numpy
twins, chosen once; this module holds the format (params, their checks, stream lengths, the
order-preserving integers) and the encoder's choices.
"""
from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .. import backend
from .. import layout as L
from ..dtypes import DType
from ..errors import CorruptError, InputError
from .base import Block, EncodedBlock, Encoding, HistoryCodes, StreamRole
from .registry import register

if TYPE_CHECKING:
    from ..layout import BytesLike

MAX_CLASSES = 16      # K
MAX_RICE = 24         # Rice parameter of a class
DTYPES = frozenset({"BF16", "F16", "F32", "F8_E4M3", "F8_E5M2"})
# Encoder tuning (not part of the format).
CLASS_LIMITS = {"fast": 1, "default": 16, "max": 16}  # classes the encoder may use, per effort level
DEFAULT_CLASSES = CLASS_LIMITS["default"]   # 16, not 4: 1.2 % smaller at lr1e-6, encode and decode as fast
_CLASS_OVERHEAD_BITS = 32.0   # one more class: its threshold, count and Rice parameter (about 4 varint bytes)
_MIN_CHANGES_FOR_CLASSES = 64
_CHUNK = 1 << 16
_MIN_ADAPTIVE_SIGNS = 512   # fewer changes: at most a few bytes to gain, against 4 more params
_MIN_RC_CHANGES = 16        # fewer: the range coder's 5-byte start outweighs what it saves
_RC_ALONE = 256   # fewer: ctx-delta-rc's contexts are still learning, ctx-delta is tried beside it
_MIN_SIGNS_FOR_ROWS = 64
SIGN_SAMPLE = 1 << 14    # the signs each axis is sized on (the first, in class order): the choice, not the coding
SIGN_PROMISING = 0.97    # ...and coded only where the best estimate is below this many bits a sign
HISTORY_COST_BITS = 64.0   # ctx-delta-rh only where it saves more than its tensor's previous_hash (§7)
# ctx-delta-rhp below effort max only where the class DP estimates its positions smaller by this share:
# its classes cost a pass over the block to encode and one to decode (the keys), and on the FP32-master
# trajectories they save ~1 % of the positions (Adam: encode 838 -> 534 MB/s for 0.7 % of the file)
RHP_MIN_GAIN = 0.05
_HIST_STRIDE = 8          # blocks of at least _CHUNK elements: the exponent histogram samples every 8th


def _sign_costs() -> np.ndarray:
    """``-log2`` of ctx-delta-as's probability of a 0 sign (row 0) and a 1 sign (row 1), by ``p0``
    (§8.8): what the encoder sizes each sign axis with."""
    p0 = np.arange(4097, dtype=np.float64).clip(1, 4095) / 4096.0
    return np.stack([-np.log2(p0), -np.log2(1.0 - p0)])


SIGN_COST = _sign_costs()
# p0 of §8.8 for every count pair (n0 · 256 + n1; n0 + n1 ≤ 255): the kernels look it up, not divide
_n0, _n1 = np.divmod(np.arange(1 << 16, dtype=np.int64), 256)
SIGN_P0 = (((2 * _n0 + 1) * 4096) // (2 * (_n0 + _n1) + 2)).astype(np.uint16)
del _n0, _n1


def defined_for(dt: DType) -> bool:
    return dt.name in DTYPES


def _as_list(p: Sequence[int]) -> list[int]:
    """``p`` as a list, copied only where it is not one: its slices are new lists, the Params' own."""
    return p if isinstance(p, list) else list(p)


@dataclass
class Params:
    thresholds: list[int]  # K-1 exponent-field thresholds, strictly increasing
    counts: list[int]      # K changed counts, one per class
    rice: list[int]        # K Rice parameters
    qbits: int         # bits in the quotient stream
    mag_width: int     # bytes per magnitude
    dense: bool = False  # a dense-delta block (§8.7): one class, its codes the unchanged elements'
    signs: tuple[int, int, int, int] | None = None  # ctx-delta-as (§8.8): axis, P, phase, sbytes; -rc: nbytes last
    rc: bool = False     # a ctx-delta-rc block (§8.9): signs and magnitudes in stream 2, no mag_width
    rp: bool = False     # with rc: a ctx-delta-rp block (§8.10): gaps, signs, magnitudes in stream 0, no qbits
    rh: bool = False     # with rc: a ctx-delta-rh block (§8.11): -rc's params, signs in history contexts too
    rhp: bool = False    # with rh: a ctx-delta-rhp block (§8.12): the thresholds split class keys (history too)

    @property
    def classes(self) -> int:
        return len(self.counts)

    @property
    def changed(self) -> int:
        return sum(self.counts)

    def pack(self) -> list[int]:
        head = [len(self.counts), *self.thresholds, *self.counts, *self.rice, self.qbits]
        if self.rp:
            assert self.signs is not None
            return [*head[:-1], *self.signs]
        if self.rc:
            assert self.signs is not None
            return [*head, *self.signs]
        head.append(self.mag_width)
        return head if self.signs is None else [*head, *self.signs]

    @classmethod
    def unpack(cls, p: Sequence[int]) -> Params:
        """ctx-delta's params, or ctx-delta-as's (four more: the sign coding, §8.8)."""
        q = _as_list(p)
        k = q[0]
        signs = (q[3 * k + 2], q[3 * k + 3], q[3 * k + 4], q[3 * k + 5]) if len(q) > 3 * k + 2 else None
        return cls(q[1:k], q[k:2 * k], q[2 * k:3 * k], q[3 * k], q[3 * k + 1], signs=signs)

    @classmethod
    def unpack_rc(cls, p: Sequence[int]) -> Params:
        """ctx-delta-rc's params (§8.9): ctx-delta's without ``mw``, then ``axis, P, phase, nbytes``."""
        q = _as_list(p)
        k = q[0]
        return cls(q[1:k], q[k:2 * k], q[2 * k:3 * k], q[3 * k], 0,
                   signs=(q[3 * k + 1], q[3 * k + 2], q[3 * k + 3], q[3 * k + 4]), rc=True)

    @classmethod
    def unpack_rp(cls, p: Sequence[int]) -> Params:
        """ctx-delta-rp's params (§8.10): ctx-delta-rc's without ``qbits``."""
        q = _as_list(p)
        k = q[0]
        return cls(q[1:k], q[k:2 * k], q[2 * k:3 * k], 0, 0,
                   signs=(q[3 * k], q[3 * k + 1], q[3 * k + 2], q[3 * k + 3]), rc=True, rp=True)


def param_count(head: Sequence[int]) -> int:
    """Params are ``K``, then ``3K + 1`` more; ``K`` is checked as soon as it is read."""
    if not head:
        return 1
    k = head[0]
    if not 1 <= k <= MAX_CLASSES:
        raise CorruptError(f"ctx-delta class count {k} outside 1..{MAX_CLASSES}")
    return 3 * k + 2


def stream_lengths(dt: DType, p: Params, m: int) -> list[int]:
    """Check the params (SPEC.md §8.6) and return the decoded length of each of the 4 streams."""
    top = (1 << (dt.exp_bits + p.rhp)) - 1   # ctx-delta-rhp: the key field's values (§8.12)
    prev = 0
    for t in p.thresholds:
        if not prev < t <= top:
            raise CorruptError(f"ctx-delta thresholds {p.thresholds} not strictly increasing within 1..{top}")
        prev = t
    c = sum(p.counts)
    if not 1 <= c <= m:
        raise CorruptError(f"ctx-delta changed count {c} outside 1..{m}")
    if max(p.rice, default=0) > MAX_RICE:
        raise CorruptError(f"ctx-delta Rice parameter above {MAX_RICE}")
    if p.rp:
        assert p.signs is not None
        _check_sign_axis(p.signs, m, "ctx-delta-rp")
        nbytes, top = p.signs[3], rp_limit(dt, c, m)
        if not 5 <= nbytes <= top:
            raise CorruptError(f"ctx-delta-rp stream of {nbytes} bytes outside 5..{top}")
        return [nbytes]
    if not c <= p.qbits <= m:
        raise CorruptError(f"ctx-delta quotient bit count {p.qbits} outside {c}..{m}")
    rbits = sum(map(operator.mul, p.counts, p.rice))
    if p.rc:
        assert p.signs is not None
        return [(p.qbits + 7) // 8, (rbits + 7) // 8, rc_stream_length(dt, p.signs, c, m)]
    if not 1 <= p.mag_width <= dt.itemsize:
        raise CorruptError(f"ctx-delta magnitude width {p.mag_width} outside 1..{dt.itemsize}")
    sbytes = (c + 7) // 8 if p.signs is None else sign_stream_length(p.signs, c, m)
    return [(p.qbits + 7) // 8, (rbits + 7) // 8, sbytes, c * p.mag_width]


def sign_stream_length(signs: Sequence[int], c: int, m: int) -> int:
    """Check ctx-delta-as's sign params (SPEC.md §8.8, in its order); the sign stream's decoded length."""
    _check_sign_axis(signs, m, "ctx-delta-as")
    sbytes = signs[3]
    if not 5 <= sbytes <= 2 * c + 8:
        raise CorruptError(f"ctx-delta-as sign stream of {sbytes} bytes outside 5..{2 * c + 8}")
    return sbytes


def rc_limit(dt: DType, c: int) -> int:
    """The most bytes ctx-delta-rc's changes stream may take (§8.9): ctx-delta's raw signs and
    magnitudes at their widest, plus the range coder's start."""
    return (dt.itemsize + 1) * c + 8


def rp_limit(dt: DType, c: int, m: int) -> int:
    """The most bytes ctx-delta-rp's stream may take (§8.10): ctx-delta-rc's bound plus the most
    §8.6's quotient and remainder streams hold (``qbits ≤ m``, ``R ≤ 24c``)."""
    return (dt.itemsize + 4) * c + (m + 7) // 8 + 9


def rc_stream_length(dt: DType, signs: Sequence[int], c: int, m: int) -> int:
    """Check ctx-delta-rc's last four params (SPEC.md §8.9, in its order); stream 2's decoded length."""
    _check_sign_axis(signs, m, "ctx-delta-rc")
    nbytes, top = signs[3], rc_limit(dt, c)
    if not 5 <= nbytes <= top:
        raise CorruptError(f"ctx-delta-rc changes stream of {nbytes} bytes outside 5..{top}")
    return nbytes


def _check_sign_axis(signs: Sequence[int], m: int, name: str) -> None:
    """``axis``, ``P`` and ``phase`` (§8.8), in that order."""
    axis, period, phase = signs[:3]
    if axis > 2:
        raise CorruptError(f"{name} sign axis {axis} above 2")
    if axis == 0:
        if period != 1 or phase != 0:
            raise CorruptError(f"{name} with one sign context has P = {period}, phase = {phase} (not 1, 0)")
    elif not 1 <= period <= m:
        raise CorruptError(f"{name} sign period {period} outside 1..{m}")
    elif phase >= period:
        raise CorruptError(f"{name} sign phase {phase} not below the period {period}")


def sign_axes(period: int | None, offset: int, m: int) -> list[tuple[int, int, int]]:
    """The sign contexts the encoder sizes for a block of ``m`` elements starting at flat element
    ``offset`` of a tensor whose last dimension is ``period`` (None: a vector, one context only).
    Columns only where each sees several changes' worth of elements (8 rows or more)."""
    axes = [(0, 1, 0)]
    if period is not None and 1 < period <= m and m >= _MIN_SIGNS_FOR_ROWS:
        axes.append((1, period, offset % period))
        if 8 * period <= m:
            axes.append((2, period, offset % period))
    return axes


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


def class_bounds(dt: DType, thresholds: Sequence[int]) -> list[tuple[int, int | None]]:
    """``(lo, hi)`` bounds on the magnitude bits ``u AND (2^(B-1)-1)`` of each class (hi None: no bound)."""
    edges = [t << dt.mant_bits for t in thresholds]
    his: list[int | None] = [*edges, None]
    return list(zip([0] + edges, his))


def magnitude_bits(dt: DType, base: np.ndarray) -> np.ndarray:
    bits: np.ndarray = base & dt.uint.type((1 << (_bits(dt) - 1)) - 1)  # numpy types ``&`` of an array as Any
    return bits


def exponent_field(dt: DType, u: np.ndarray) -> np.ndarray:
    field: np.ndarray = (u >> dt.uint.type(dt.mant_bits)) & dt.uint.type((1 << dt.exp_bits) - 1)
    return field


def magnitude_order(dt: DType, b: np.ndarray) -> np.ndarray:
    """Where each change's magnitude is stored: changes sorted by their base's exponent field, stably.

    Why: the size of a step in ulps scales with 1/ulp, so grouping by exponent hands the codec runs of
    like-sized magnitudes.
    """
    return np.argsort(exponent_field(dt, b), kind="stable")


# ----------------------------------------------------------------------------------------- encode

def changed_positions(base: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Indices of the elements that differ (int64, increasing)."""
    return backend.selected().changes(base, target)


def choose_thresholds(dt: DType, base: np.ndarray, positions: np.ndarray,
                      max_classes: int = DEFAULT_CLASSES) -> list[int]:
    """Exponent classes that minimise the estimated position bits: an exact DP over contiguous ranges
    of the exponent histogram (sampled on large blocks)."""
    return _thresholds(dt, base, positions, max_classes)[0]


def _thresholds(dt: DType, base: np.ndarray, positions: np.ndarray, max_classes: int) -> tuple[list[int], float]:
    """:func:`choose_thresholds` and the estimated position bits of its classes (their Rice codes and
    the params of each class after the first)."""
    if positions.size < _MIN_CHANGES_FOR_CLASSES or max_classes <= 1:
        return [], float("inf")
    be = backend.selected()
    stride = _HIST_STRIDE if base.size >= _CHUNK else 1
    ne, ce = be.exponent_counts(dt, base, stride, positions)
    return be.class_cuts(np.maximum(ne * stride, ce), ce, max_classes, _CLASS_OVERHEAD_BITS)


def _key_thresholds(dt: DType, base: np.ndarray, previous: np.ndarray, positions: np.ndarray,
                    max_classes: int) -> tuple[tuple[list[int], float], tuple[list[int], float]]:
    """:func:`_thresholds` on the exponent fields, then on the key fields of §8.12 (ctx-delta-rhp's
    classes, from the block's ``previous`` value), from one pass over the block."""
    if positions.size < _MIN_CHANGES_FOR_CLASSES or max_classes <= 1:
        return ([], float("inf")), ([], float("inf"))
    be = backend.selected()
    stride = _HIST_STRIDE if base.size >= _CHUNK else 1
    ne, ce = be.key_counts(dt, base, previous, stride, positions)
    half = ne.size >> 1   # x' = x + 2^E z: an exponent field's counts are its two key fields' added
    found = [be.class_cuts(np.maximum(n * stride, c), c, max_classes, _CLASS_OVERHEAD_BITS)
             for n, c in ((ne[:half] + ne[half:], ce[:half] + ce[half:]), (ne, ce))]
    return found[0], found[1]


@dataclass
class Encoded:
    params: list[int]
    streams: list[bytes]
    adaptive_signs: bool = False   # a ctx-delta-as block (§8.8)
    rc: bool = False               # a ctx-delta-rc block (§8.9)
    rp: bool = False               # with rc: a ctx-delta-rp block (§8.10)
    rh: bool = False               # with rc: a ctx-delta-rh block (§8.11)
    rhp: bool = False              # with rh: a ctx-delta-rhp block (§8.12)
    other: Encoded | None = None   # the block as ctx-delta too, where its codec may make that the smaller


def _varints(values: Sequence[int]) -> int:
    return sum(len(L.varint_bytes(v)) for v in values)


def encode(dt: DType, base: np.ndarray, target: np.ndarray, positions: np.ndarray,
           thresholds: Sequence[int] | None = None, max_classes: int = DEFAULT_CLASSES, dense: bool = False,
           axes: Sequence[tuple[int, int, int]] = (), force_signs: bool = False,
           rc_axes: Sequence[tuple[int, int, int]] = (), force_rc: bool = False, rp: int = 0,
           history: HistoryCodes | None = None, force_rh: bool = False, rhp: int = 0,
           previous: np.ndarray | None = None, rhp_gain: float = RHP_MIN_GAIN) -> Encoded:
    """Encode one changed block; ``positions`` are its changed elements (non-empty, increasing).
    ``dense``: as ``dense-delta`` (§8.7; one class, the unchanged elements' positions coded).
    ``rc_axes``: sign contexts to try for ``ctx-delta-rc`` (§8.9), tried first: the block is that
    where its changes stream is smaller than ctx-delta's raw signs and magnitudes (with ``force_rc``,
    wherever it stays within §8.9's bound); on a block of few changes, where a codec may still make
    ctx-delta the smaller, with ctx-delta as ``other``. Otherwise ``axes``: sign contexts
    (:func:`sign_axes`) to try: the block is ``ctx-delta-as`` (§8.8) where the best of them codes the
    signs in fewer bytes than the raw bits and the extra params, or always with ``force_signs``.
    ``rp`` (with ``rc_axes``): 1 makes a ctx-delta-rc block ``ctx-delta-rp`` (§8.10) where the model's
    estimate of its gaps is below their Rice bits, 2 always. ``history`` (with ``rc_axes``, without
    ``rp``): the block's history codes (§7) as ``(packed, offset)``, element 0 at ``offset`` into the
    codes packed four to a byte (:func:`arcfmt.history.pack`); a ctx-delta-rc block is ``ctx-delta-rh`` (§8.11) where
    the history contexts size its signs smaller (``force_rh``: always, the axis still chosen).
    ``rhp`` (with ``history`` and the block's ``previous`` value): 1 makes the block ``ctx-delta-rhp``
    (§8.12: classes of the history too, signs in its contexts) where the class DP estimates its positions
    smaller by a share ``rhp_gain`` and by more than the tensor's ``previous_hash``; 2 always
    (``thresholds`` are then on the key fields)."""
    backend.warn_first_compile(backend.ENCODE)
    key = None
    if dense:
        thresholds = []
    elif rhp and history is not None and previous is not None and rc_axes:
        be = backend.selected()
        if thresholds is None:
            (thresholds, bits), (keyed, keyed_bits) = _key_thresholds(dt, base, previous, positions, max_classes)
            if rhp == 2 or keyed_bits + HISTORY_COST_BITS < bits * (1 - rhp_gain):
                thresholds = keyed
                key = be.class_key(dt, base, previous=previous)
        else:
            key = be.class_key(dt, base, previous=previous)
    elif thresholds is None:
        thresholds = choose_thresholds(dt, base, positions, max_classes)
    c = positions.size
    if rc_axes and not dense:
        both = not force_rc and c < _RC_ALONE
        assert history is None or not rp, "ctx-delta-rh is ctx-delta-rc's, never -rp's"
        # (force_signs with a history: the history contexts, whichever axis)
        counts, rice, qbits, mw, streams, signs, rp_rice = backend.selected().ctx_encode(
            dt, base, target, positions, thresholds, MAX_RICE, False, rc_axes, force_rh or key is not None,
            rc_limit(dt, c), both, rp, rp_limit(dt, c, base.size), history, key)
        if signs is not None:
            i, coded = signs
            used_rh = history is not None and i >= len(rc_axes)
            assert used_rh or key is None, "a ctx-delta-rhp block codes its signs in the history's contexts"
            rc_params = (*rc_axes[i % len(rc_axes)], len(coded))
            # ctx-delta's signs and magnitudes as they are before any codec, with its one more param;
            # -rp's stream holds the positions too
            used_rp = rp_rice is not None
            raw = (c + 7) // 8 + c * mw + 1 + (len(streams[0]) + len(streams[1]) if used_rp else 0)
            if force_rc or len(coded) + _varints(rc_params) < raw:
                p = Params(list(thresholds), counts, rp_rice or rice, qbits, 0, signs=rc_params, rc=True,
                           rp=used_rp, rh=used_rh, rhp=key is not None)
                other = None
                if both and key is None:   # (ctx-delta's classes are the base's alone)
                    other = Encoded(Params(list(thresholds), counts, rice, qbits, mw).pack(), streams)
                coded_streams = [coded] if used_rp else [streams[0], streams[1], coded]
                return Encoded(p.pack(), coded_streams, rc=True, rp=used_rp, rh=used_rh, rhp=key is not None,
                               other=other)
        if key is not None:   # not range-coded after all: ctx-delta's classes are the exponent fields' alone
            return encode(dt, base, target, positions, None, max_classes, dense, axes, force_signs, rc_axes, force_rc,
                          rp, history, force_rh)
    counts, rice, qbits, mw, streams, signs, _ = backend.selected().ctx_encode(
        dt, base, target, positions, thresholds, MAX_RICE, dense, axes, force_signs)
    p = Params(list(thresholds), counts, rice, qbits, mw, dense)
    if dense:
        return Encoded(dense_pack(p), streams)
    if signs is not None:
        i, coded = signs
        extra = [*axes[i], len(coded)]
        assert 5 <= len(coded) <= 2 * p.changed + 8, "the range coder wrote more than §8.8 allows"
        if force_signs or len(coded) + _varints(extra) < len(streams[2]):
            p.signs = (extra[0], extra[1], extra[2], extra[3])
            return Encoded(p.pack(), [streams[0], streams[1], coded, streams[3]], True)
    return Encoded(p.pack(), streams)


def dense_pack(p: Params) -> list[int]:
    """``dense-delta``'s four params (§8.7): ``c, r, qbits, mw``."""
    return [p.changed, p.rice[0], p.qbits, p.mag_width]


def dense_unpack(params: Sequence[int]) -> Params:
    return Params([], [params[0]], [params[1]], params[2], params[3], True)


def dense_stream_lengths(dt: DType, p: Params, m: int) -> list[int]:
    """Check ``dense-delta``'s params (SPEC.md §8.7, in its order) and return its streams' decoded lengths."""
    c, r = p.changed, p.rice[0]
    if not 1 <= c <= m:
        raise CorruptError(f"dense-delta changed count {c} outside 1..{m}")
    if r > MAX_RICE:
        raise CorruptError(f"dense-delta Rice parameter {r} above {MAX_RICE}")
    u = m - c
    if not u <= p.qbits <= m:
        raise CorruptError(f"dense-delta quotient bit count {p.qbits} outside {u}..{m}")
    if not 1 <= p.mag_width <= dt.itemsize:
        raise CorruptError(f"dense-delta magnitude width {p.mag_width} outside 1..{dt.itemsize}")
    return [(p.qbits + 7) // 8, (u * r + 7) // 8, (c + 7) // 8, c * p.mag_width]


# ----------------------------------------------------------------------------------------- decode

def decode(dt: DType, p: Params, streams: Sequence[BytesLike], m: int, base: np.ndarray, out: np.ndarray,
           positions: np.ndarray | None = None, history: HistoryCodes | None = None) -> None:
    """Rebuild the block into ``out`` (may be ``base``); every check runs before any element of ``base``
    is written (in place), and before any changed value reaches a separate ``out`` (which, being the
    decoder's private buffer, may already hold part of the base's copy when a check fails).
    ``positions`` (int64, ``p.changed`` long): also gets the positions the block changes.
    ``history``: the block's history codes (§7) as ``(packed, offset)``, which a ctx-delta-rh block
    (``p.rh``) needs."""
    backend.warn_first_compile(backend.DECODE)
    assert p.rh == (history is not None), "a ctx-delta-rh block, and only one, decodes with its history"
    status = backend.selected().ctx_decode(dt, p, streams, m, base, out, positions, history)
    if status != backend.OK:
        # Worded from the status, the same for every backend: re-running the numpy twin to find the
        # check again cost ~60 bytes of scratch per element (a 1 KB file made 1 GB, per worker).
        name = ("dense-delta" if p.dense else "ctx-delta" if p.signs is None else "ctx-delta-rp" if p.rp
                else "ctx-delta-rhp" if p.rhp else "ctx-delta-rh" if p.rh else "ctx-delta-rc" if p.rc
                else "ctx-delta-as")
        failed = _FAILED_RP if p.rp else _FAILED_RC if p.rc else _FAILED
        raise CorruptError(f"{name}{failed[status].format(dt=dt.name, m=m)}")


# What each failed check of a backend's ctx_decode is (its status codes, in SPEC.md §8.6 order)
_FAILED = {
    backend.Q_PADDING: " quotient stream: padding bits are not zero",
    backend.Q_CODES: " quotient stream: not exactly the block's codes, ending at its last bit",
    backend.R_PADDING: " remainder stream: padding bits are not zero",
    backend.S_PADDING: " sign stream: padding bits are not zero",
    backend.BEYOND: ": a position beyond the block of {m} elements",
    backend.RANGE: ": a step leaves the range of {dt} bit patterns",
    backend.S_FIRST: " sign stream: the range coder's first byte is not 0",
    backend.S_CODE: " sign stream: the range coder's first code is 2^32 - 1",
    backend.S_PAST: " sign stream: the signs read past the end of the stream",
    backend.S_LENGTH: " sign stream: bytes left after the last sign",
}
_FAILED_RC = {**_FAILED,   # ctx-delta-rc's stream 2 codes the magnitudes too (§8.9)
              backend.S_FIRST: " changes stream: the range coder's first byte is not 0",
              backend.S_CODE: " changes stream: the range coder's first code is 2^32 - 1",
              backend.S_PAST: " changes stream: the changes read past the end of the stream",
              backend.S_LENGTH: " changes stream: bytes left after the last change",
              backend.M_LONG: " changes stream: a magnitude longer than the {dt} bit pattern"}
_FAILED_RP = {**_FAILED_RC,   # ctx-delta-rp's one stream codes the gaps first (§8.10)
              backend.BEYOND: ": a position beyond its class of the block of {m} elements",
              backend.S_PAST: " changes stream: the gaps or changes read past the end of the stream"}


def warm_up() -> None:
    """Compile every kernel for every ctx-delta type now (or load them from numba's cache).

    Why: the first block of a type otherwise pays the compilation (seconds, once per install) — wrong
    for anything that times single calls, such as the fuzzer's per-case limit. Nothing to do on the
    numpy backend.
    """
    be = backend.selected()
    if be is backend.twins():
        return
    from ..dtypes import from_name
    rng = np.random.default_rng(0)
    for name in sorted(DTYPES):
        dt = from_name(name)
        m = 1 << 17  # large enough for the sampled histogram and several classes
        base = rng.integers(0, 1 << (8 * dt.itemsize), m, dtype=np.uint64).astype(dt.uint)
        target = base.copy()
        target[::97] ^= dt.uint.type(1)
        # one build per dtype serves memory-mapped and in-memory arrays alike: the kernels take every
        # array they only read as read-only (kernels._ro)
        pos = changed_positions(base, target)
        top = (1 << dt.exp_bits) - 1
        for thresholds in (None, [max(1, top // 2)]):
            enc = encode(dt, base, target, pos, thresholds=thresholds, max_classes=4)
            decode(dt, Params.unpack(enc.params), enc.streams, m, base, np.empty_like(base))
        # ctx-delta-rh (§8.11): the history of a previous step, and a block coded with it
        previous = base.copy()
        previous[::89] ^= dt.uint.type(1)
        packed = be.history(dt, previous, base)
        enc = encode(dt, base, target, pos, rc_axes=sign_axes(256, 0, m), force_rc=True, history=(packed, 0),
                     force_rh=True)
        p = Params.unpack_rc(enc.params)
        p.rh = True
        decode(dt, p, enc.streams, m, base, np.empty_like(base), None, (packed, 0))
        # ctx-delta-rhp (§8.12): its classes of the history too, chosen, coded and decoded
        encode(dt, base, target, pos, rc_axes=sign_axes(256, 0, m), force_rc=True, history=(packed, 0),
               rhp=1, previous=previous)   # (the choice: both class estimates)
        enc = encode(dt, base, target, pos, [top + 1], rc_axes=sign_axes(256, 0, m), force_rc=True,
                     history=(packed, 0), rhp=2, previous=previous)   # two classes: moved or not
        p = Params.unpack_rc(enc.params)
        p.rh = p.rhp = enc.rhp
        if enc.rhp:
            decode(dt, p, enc.streams, m, base, np.empty_like(base), None, (packed, 0))
        be.history_at(dt, np.zeros_like(packed), 0, pos, previous, base)   # a follower's record of its changes
    for width in (1, 2, 4, 8):   # a live model's staged changes (pipeline.Changes), of any dtype
        flat = np.zeros(64, f"u{width}")
        for index in (np.int32, np.int64):
            be.scatter(flat, np.arange(0, 64, 7, dtype=index), np.ones(10, flat.dtype))


# ----------------------------------------------------------------------------------------- the encoding

_ROLES = (StreamRole("quotients", "positions"), StreamRole("remainders", "positions"),
          StreamRole("signs", "steps"), StreamRole("magnitudes", "steps"))
_RC_ROLES = (*_ROLES[:2], StreamRole("changes", "steps"))
_RP_ROLES = (StreamRole("changes", "positions+steps"),)


@register
class CtxDelta(Encoding):
    id = 5
    name = "ctx-delta"
    since = (1, 1)
    dtypes = DTYPES
    codes_unchanged = False   # the Rice codes list the changes (dense-delta: the unchanged elements)
    trial_rank = 10  # nearly always the smallest where it is defined

    def unpack(self, params: Sequence[int]) -> Params:
        return Params.unpack(params)

    def param_count(self, head: Sequence[int]) -> int:
        return param_count(head)

    def stream_lengths(self, dt: DType, params: Sequence[int], m: int) -> list[int]:
        return stream_lengths(dt, Params.unpack(params), m)

    def decode(self, dt: DType, params: Sequence[int], streams: Sequence[BytesLike], m: int, base: np.ndarray | None,
               out: np.ndarray, history: HistoryCodes | None = None) -> None:
        assert base is not None, "ctx-delta needs a base: the container never decodes one without"
        decode(dt, self.unpack(params), streams, m, base, out, None, history)

    def decode_changes(self, dt: DType, params: Sequence[int], streams: Sequence[BytesLike], m: int,
                       base: np.ndarray | None, out: np.ndarray, history: HistoryCodes | None = None) -> np.ndarray:
        """:meth:`decode`, returning the positions it changed (unsorted; every one differs from the base,
        as a step's magnitude is at least 1): a live model's sparse update needs them, and the decoder
        has them already."""
        assert base is not None, "ctx-delta needs a base: the container never decodes one without"
        p = self.unpack(params)
        positions = np.empty(p.changed, np.int64)
        decode(dt, p, streams, m, base, out, positions, history)
        return positions

    def changed(self, params: Sequence[int]) -> int:
        return self.unpack(params).changed

    def stream_roles(self, dt: DType) -> tuple[StreamRole, ...]:
        return _ROLES

    def encode(self, block: Block, max_classes: int = DEFAULT_CLASSES, signs: str = "never", rc: str = "never",
               rp: str = "never", rh: str = "never", rhp: str = "never",
               rhp_gain: float = 0.0) -> EncodedBlock | None:
        """None when nothing changed. ``signs``: ``"never"`` (this encoding), ``"auto"`` (ctx-delta-as
        where its range-coded signs are smaller, §8.8), ``"always"`` (ctx-delta-as). ``rc``: likewise
        for ctx-delta-rc (§8.9), tried first; ``rp``: likewise for ctx-delta-rp (§8.10) in its place;
        ``rh``: likewise for ctx-delta-rh (§8.11, the block's history given; never with ``rp``);
        ``rhp``: likewise for ctx-delta-rhp (§8.12) in ctx-delta-rh's place, ``"auto"`` where the
        class DP estimates its positions smaller by the share ``rhp_gain``."""
        positions = block.positions
        c = positions.size
        if c == 0:
            return None
        assert block.base is not None, f"{self.name} needs a base: the registry never offers it a block without"
        if rc == "auto" and c < _MIN_RC_CHANGES:
            rc = "never"
        as_wanted = signs == "always" or (signs == "auto" and c >= _MIN_ADAPTIVE_SIGNS)
        axes = sign_axes(block.period, block.offset, block.m) if as_wanted or rc != "never" else []
        enc = encode(block.dt, block.base, block.target, positions, max_classes=max_classes, dense=self.codes_unchanged,
                     axes=axes if as_wanted else (), force_signs=signs == "always",
                     rc_axes=axes if rc != "never" else (), force_rc=rc == "always",
                     rp=("never", "auto", "always").index(rp),
                     history=block.history if rh != "never" else None, force_rh=rh == "always",
                     rhp=("never", "auto", "always").index(rhp), previous=block.previous, rhp_gain=rhp_gain)
        # what the block came out as: a forced -rc or -rp whose changes passed the bound comes out as
        # ctx-delta (never under its own id: those params are not its), which the caller refuses
        plain = self.id if self.codes_unchanged else CtxDelta.id
        kind = (CtxDeltaRp.id if enc.rp else CtxDeltaRhp.id if enc.rhp else CtxDeltaRh.id if enc.rh
                else CtxDeltaRc.id if enc.rc
                else CtxDeltaAs.id if enc.adaptive_signs else plain)
        out = EncodedBlock(kind, enc.params, enc.streams, c, dense=(0, 1, 2))
        if enc.other is None:
            return out
        block.made_for[CtxDeltaRc.id] = out   # tried beside ctx-delta's own: CtxDeltaRc.propose hands it on
        # (a ctx-delta-rp candidate too: it stands where -rc's would)
        return EncodedBlock(self.id, enc.other.params, enc.other.streams, c, dense=(0, 1, 2))

    def propose(self, block: Block, tried: list[EncodedBlock]) -> EncodedBlock | None:
        """ctx-delta-rc where its coded signs and magnitudes are smaller than ctx-delta's raw ones, else
        ctx-delta, or ctx-delta-as where its signs come out smaller (one candidate: they share every
        other stream, so trying each would run the codec trials again for a few bytes)."""
        effort = block.effort
        signs = "auto" if block.may_use(CtxDeltaAs) else "never"   # (unregistered: bench.py --without)
        rc = "auto" if block.may_use(CtxDeltaRc) else "never"   # (or a file for readers of 1.6 or older)
        # ctx-delta-rp at effort max only: 1.2-2.2 % smaller, but its gaps' coder took pure-BF16 encode
        # from 519 to 375 MB/s and decode from 877 to 706 (tools/bench.py, BENCHMARKS 2026-12-07)
        # ctx-delta-rh where the block's history is given: the signs it saves (up to 62 % on pure-BF16
        # training) are worth more than -rp's gaps, and the two do not combine
        rh = "auto" if rc == "auto" and block.previous is not None and block.may_use(CtxDeltaRh) else "never"
        rp = "auto" if rc == "auto" and rh == "never" and effort == "max" and block.may_use(CtxDeltaRp) else "never"
        # ctx-delta-rhp where the history's classes make the positions smaller too (pure-BF16 training:
        # a weight that just moved is far likelier to move again)
        rhp = "auto" if rh == "auto" and block.may_use(CtxDeltaRhp) else "never"
        classes = CLASS_LIMITS.get(effort, DEFAULT_CLASSES) if isinstance(effort, str) else DEFAULT_CLASSES
        return self.encode(block, classes, signs, rc, rp, rh, rhp, 0.0 if effort == "max" else RHP_MIN_GAIN)


@register
class CtxDeltaAs(CtxDelta):
    """``ctx-delta-as`` (SPEC.md §8.8): ``ctx-delta`` whose sign bits are range-coded, each in the
    context of its row or column (or one context). Why: a row or column of a weight matrix often moves
    one way in a step, so its signs are not coin tosses given the position. ``ctx-delta`` proposes it
    (``signs="auto"``); forced, it always codes the signs."""

    id = 7
    name = "ctx-delta-as"
    since = (1, 4)
    trial_rank = 12

    def param_count(self, head: Sequence[int]) -> int:
        return param_count(head) + (4 if head else 0)

    def encode(self, block: Block, max_classes: int = DEFAULT_CLASSES, signs: str = "always", rc: str = "never",
               rp: str = "never", rh: str = "never", rhp: str = "never",
               rhp_gain: float = 0.0) -> EncodedBlock | None:
        return super().encode(block, max_classes, signs)

    def propose(self, block: Block, tried: list[EncodedBlock]) -> EncodedBlock | None:
        return None


@register
class CtxDeltaRc(CtxDelta):
    """``ctx-delta-rc`` (SPEC.md §8.9): ``ctx-delta`` whose signs and magnitudes are range-coded
    together, change by change: signs in ctx-delta-as's position contexts, magnitudes as a bit length
    and low bits in contexts of the base's exponent field. Why: the magnitude's size in ulps depends on
    the exponent, which a byte codec of sorted magnitudes never sees (xz on pure-BF16 training was the
    slowest part of encoding). ``ctx-delta`` proposes it (``rc="auto"``); forced, it codes every block
    that stays within §8.9's bound."""

    id = 8
    name = "ctx-delta-rc"
    since = (1, 7)
    trial_rank = 13
    _more_params = 3           # after ctx-delta's 3K + 2, less mw: axis, P, phase, nbytes
    _roles: tuple[StreamRole, ...] = _RC_ROLES
    _rp = "never"              # the forced encoding's ctx-delta-rp setting
    _rh = "never"              # ... its ctx-delta-rh setting
    _rhp = "never"             # ... and its ctx-delta-rhp setting

    def unpack(self, params: Sequence[int]) -> Params:
        if self._rp == "always":
            return Params.unpack_rp(params)
        p = Params.unpack_rc(params)
        p.rh = self._rh == "always"
        p.rhp = self._rhp == "always"
        return p

    def param_count(self, head: Sequence[int]) -> int:
        return param_count(head) + (self._more_params if head else 0)

    def stream_lengths(self, dt: DType, params: Sequence[int], m: int) -> list[int]:
        return stream_lengths(dt, self.unpack(params), m)

    def stream_roles(self, dt: DType) -> tuple[StreamRole, ...]:
        return self._roles

    def encode(self, block: Block, max_classes: int = DEFAULT_CLASSES, signs: str = "never", rc: str = "always",
               rp: str = "never", rh: str = "never", rhp: str = "never",
               rhp_gain: float = 0.0) -> EncodedBlock | None:
        if self._rh == "always" and block.previous is None:
            raise InputError(f"{self.name} needs the previous step (its history, SPEC.md §7), which was not given")
        out = CtxDelta.encode(self, block, max_classes, "never", "always", self._rp, self._rh, self._rhp)
        if out is not None and out.encoding != self.id:
            top = rp_limit(block.dt, out.changed, block.m) if self._rp == "always" else rc_limit(block.dt, out.changed)
            raise InputError(f"{self.name}: this block's changes take more than {top} bytes range-coded "
                             f"(SPEC.md {'§8.10' if self._rp == 'always' else '§8.9'})")
        return out

    def propose(self, block: Block, tried: list[EncodedBlock]) -> EncodedBlock | None:
        """The candidate ctx-delta's pass made beside its own (a block of few changes), if any."""
        return block.made_for.pop(CtxDeltaRc.id, None)


@register
class CtxDeltaRp(CtxDeltaRc):
    """``ctx-delta-rp`` (SPEC.md §8.10): ``ctx-delta-rc`` whose gaps are range-coded too, first in its one
    stream: each Rice quotient in unary in contexts of its class and place, each field's top bit in a
    context of its class. Why: a class mixes exponents of different change rates and its Rice parameter
    is a whole power of two, so those bits are not the fair coins a static code pays one bit each for.
    ``ctx-delta`` proposes it in ctx-delta-rc's place (``rp="auto"``, at effort max); forced, it codes
    every block that stays within §8.10's bound."""

    id = 9
    name = "ctx-delta-rp"
    since = (1, 8)
    trial_rank = 14
    _more_params = 2           # -rc's, less qbits
    _roles = _RP_ROLES
    _rp = "always"

    def propose(self, block: Block, tried: list[EncodedBlock]) -> EncodedBlock | None:
        return None   # ctx-delta's pass makes it, in ctx-delta-rc's place


@register
class CtxDeltaRh(CtxDeltaRc):
    """``ctx-delta-rh`` (SPEC.md §8.11): ``ctx-delta-rc`` whose signs are coded in contexts of each
    element's history too: the direction of its change at the previous step (§7). Why: weights keep
    moving the way they moved (momentum), and on pure-BF16 training a one-ulp move is often undone;
    the receiver of a stream holds the previous step anyway. ``ctx-delta`` proposes it in -rc's place
    where the block's history is given (``rh="auto"``); forced, it codes every block with a history."""

    id = 10
    name = "ctx-delta-rh"
    since = (1, 9)
    trial_rank = 15
    needs_history = True
    _rh = "always"

    def propose(self, block: Block, tried: list[EncodedBlock]) -> EncodedBlock | None:
        return None   # ctx-delta's pass makes it, in ctx-delta-rc's place


@register
class CtxDeltaRhp(CtxDeltaRh):
    """``ctx-delta-rhp`` (SPEC.md §8.12): ``ctx-delta-rh`` whose classes split each element's history
    too: the thresholds divide class keys, the exponent field and, above it, whether the element moved
    at the previous step. Why: on pure-BF16 training a weight that just moved is far likelier to move
    again than its exponent says (a third fewer position bits); elsewhere it gains a little where the
    class DP says so. ``ctx-delta`` proposes it in -rh's place (``rhp="auto"``); forced, it codes
    every block with a history."""

    id = 11
    name = "ctx-delta-rhp"
    since = (1, 10)
    trial_rank = 16
    _rhp = "always"


@register
class DenseDelta(CtxDelta):
    """``dense-delta`` (SPEC.md §8.7): ``ctx-delta`` with one class whose Rice codes are the positions
    of the elements that did not change. Why: a prefix code spends a bit or more on every coded
    position, so where nearly every element changes (a bias that moves each step) the few unchanged
    ones are the cheap ones to list."""

    id = 6
    name = "dense-delta"
    since = (1, 2)
    param_names = ("c", "r", "qbits", "mw")
    trial_rank = 11  # right after ctx-delta, on the same blocks
    codes_unchanged = True

    def unpack(self, params: Sequence[int]) -> Params:
        return dense_unpack(params)

    def encode(self, block: Block, max_classes: int = DEFAULT_CLASSES, signs: str = "never", rc: str = "never",
               rp: str = "never", rh: str = "never", rhp: str = "never",
               rhp_gain: float = 0.0) -> EncodedBlock | None:
        return super().encode(block, max_classes, "never")

    def param_count(self, head: Sequence[int]) -> int:
        return len(self.param_names)

    def stream_lengths(self, dt: DType, params: Sequence[int], m: int) -> list[int]:
        return dense_stream_lengths(dt, dense_unpack(params), m)

    def propose(self, block: Block, tried: list[EncodedBlock]) -> EncodedBlock | None:
        """Only where most elements changed: elsewhere listing the changes is the smaller. Beside a
        range-coded candidate already proposed (``ctx-delta-rc``/``-rp``: ctx-delta proposes one
        itself on blocks of 256 changes or more) its streams get the fast codec trials only (below
        effort max): where it wins it wins by far (a bias moving one unit), and its xz trial on the
        corpus's dense bias was 5-15 % of a step's encode time for a candidate that lost there in 72 of
        75 steps, and won the other 3 by 0.01-0.6 % of the file (BENCHMARKS 2026-12-07, day). Smaller
        blocks have streams under 16 KiB, which get no xz trial anyway."""
        if 2 * block.positions.size <= block.m:
            return None
        out = self.encode(block)
        if out is not None and any(t.encoding in _RANGE_CODED for t in tried):
            out.dense = tuple(range(len(out.streams)))
        return out


# the candidates DenseDelta.propose defers to
_RANGE_CODED = frozenset((CtxDeltaRc.id, CtxDeltaRp.id, CtxDeltaRh.id, CtxDeltaRhp.id))
