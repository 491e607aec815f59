"""The compiled backend of ctx-delta (SPEC.md §8.6): its per-element loops, compiled with numba.

Why: a block's classes come from every element of the base, so encoding and decoding make O(m)
passes whatever the number of changes. In numpy each pass is several full-size temporaries; compiled,
it is one read of the base. :mod:`arcfmt.twins` is the numpy backend: the same public functions
(:mod:`arcfmt.backend` lists them), computing exactly the same arrays (tests/test_kernels.py compares
them); :func:`arcfmt.backend.selected` picks one of the two, once. Importing this module imports
numba; nothing else imports it before a ctx-delta block needs it.

Kernels release the GIL, so the reader's and writer's block threads run them in parallel.
``ctx_encode`` and ``ctx_decode`` do a whole block in one call (the GIL is taken once per block, not
once per step), from the smaller kernels below; ``ctx_decode`` reports a failed check by its status,
which the caller words (``ctx_delta.decode``).
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, cast

import numba
import numpy as np
from numba.core import types
from numba.extending import intrinsic

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
from .encodings.ctx_delta import HISTORY_COST_BITS, SIGN_COST, SIGN_P0, SIGN_PROMISING, SIGN_SAMPLE

NAME = "numba"


def _jit(fn):
    """Compiled on first call, then cached on disk by numba where it finds a writable place."""
    try:
        return numba.njit(nogil=True, cache=True, boundscheck=False)(fn)
    except RuntimeError:  # no cache location (read-only install, no writable home): compile per process
        return numba.njit(nogil=True, cache=False, boundscheck=False)(fn)


def _intrinsic(defn: Callable[[Any, Any], tuple[Any, Any]]) -> Callable[[np.uint64], np.uint64]:
    """``numba.extending.intrinsic``, typed as the kernels call it: one uint64 in, one out. (numba's own
    annotation types a call from Python, which keeps the typing context argument and always raises.)"""
    return cast("Callable[[np.uint64], np.uint64]", intrinsic(defn))


@_intrinsic
def _popcount(typingctx, x):
    """One ``popcnt`` instruction (numba has no np.bitwise_count)."""
    def codegen(context, builder, signature, args):
        return builder.ctpop(args[0])
    return types.uint64(types.uint64), codegen


@_intrinsic
def _trailing_zeros(typingctx, x):
    """One ``tzcnt``: the index of the lowest set bit; 64 for 0 (zero is not poison here, and
    :func:`_rice_decode` relies on it)."""
    def codegen(context, builder, signature, args):
        return builder.cttz(args[0], context.get_constant(types.boolean, False))
    return types.uint64(types.uint64), codegen


def _intrinsic2(defn: Callable[[Any, Any, Any], tuple[Any, Any]]) -> Callable[[np.uint64, np.uint64], np.uint64]:
    """:func:`_intrinsic` for two uint64 arguments."""
    return cast("Callable[[np.uint64, np.uint64], np.uint64]", intrinsic(defn))


def _masked_word(context, builder, aty, arr, start, mask):
    """Codegen of the word intrinsics: the 64 elements of ``arr`` (a C array of type ``aty``) from
    ``start``, one vector load ``and`` ``mask``; and ``splat``, which makes a vector of one scalar."""
    from llvmlite import ir  # type: ignore[import-untyped]
    a = context.make_array(aty)(context, builder, arr)
    elt = context.get_data_type(aty.dtype)
    vec = ir.VectorType(elt, 64)
    ptr = builder.bitcast(builder.gep(a.data, [start]), vec.as_pointer())
    lanes = ir.Constant(ir.VectorType(ir.IntType(32), 64), [0] * 64)
    undef = ir.Constant(vec, ir.Undefined)

    def splat(x):
        return builder.shuffle_vector(builder.insert_element(undef, x, ir.Constant(ir.IntType(32), 0)),
                                      undef, lanes)
    return builder.and_(builder.load(ptr, align=max(1, elt.width // 8)), splat(mask)), splat


def _ge_mask64_typing(typingctx, arr, start, mask, edge):
    """``_ge_mask64(arr, start, mask, edge)``: bit ``b`` set where ``(arr[start + b] & mask) >= edge``
    (unsigned), for the 64 elements from ``start`` (all inside ``arr``, a contiguous 1-D array).

    Written as LLVM vector IR (one load of 64 elements, an ``and``, an unsigned compare and the
    compare's 64 bits as one integer), which LLVM turns into a few vector instructions on any target
    (a compare into a mask register on AVX-512): the loop that shifts each compare into place is
    several times slower in the kernels' surroundings."""
    if not (isinstance(arr, types.Array) and arr.ndim == 1 and arr.layout == "C"
            and isinstance(arr.dtype, types.Integer) and not getattr(arr.dtype, "signed", True)):
        return None

    def codegen(context, builder, signature, args):
        from llvmlite import ir
        v, splat = _masked_word(context, builder, signature.args[0], args[0], args[1], args[2])
        return builder.bitcast(builder.icmp_unsigned(">=", v, splat(args[3])), ir.IntType(64))
    return types.uint64(arr, types.intp, arr.dtype, arr.dtype), codegen


_ge_mask64 = cast("Callable[[np.ndarray, int, Any, Any], np.uint64]", intrinsic(_ge_mask64_typing))


def _ge_masks64_typing(typingctx, arr, start, mask, edges, n, out):
    """``_ge_masks64(arr, start, mask, edges, n, out)``: ``out[k] = _ge_mask64(arr, start, mask, edges[k])``
    for ``k < n`` (``edges`` of ``arr``'s dtype, ``out`` uint64; both contiguous, at least ``n`` long).

    Why: the 64 elements are loaded and masked once for every threshold. Called one threshold at a time
    between stores to the class counts, which LLVM cannot tell from the base, each threshold loaded and
    masked the word again (the class pass of a block with 10 classes: nine loads of the same 128 bytes)."""
    ok = all(isinstance(a, types.Array) and a.ndim == 1 and a.layout == "C" for a in (arr, edges, out))
    if not (ok and isinstance(arr.dtype, types.Integer) and not getattr(arr.dtype, "signed", True)
            and edges.dtype == arr.dtype and out.dtype == types.uint64):
        return None

    def codegen(context, builder, signature, args):
        from llvmlite import ir
        from numba.core import cgutils
        aty, _, _, ety, _, oty = signature.args
        e = context.make_array(ety)(context, builder, args[3])
        o = context.make_array(oty)(context, builder, args[5])
        v, splat = _masked_word(context, builder, aty, args[0], args[1], args[2])
        with cgutils.for_range(builder, args[4]) as loop:
            edge = builder.load(builder.gep(e.data, [loop.index]))
            ge = builder.bitcast(builder.icmp_unsigned(">=", v, splat(edge)), ir.IntType(64))
            builder.store(ge, builder.gep(o.data, [loop.index]))
        return context.get_dummy_value()
    return types.void(arr, types.intp, arr.dtype, edges, types.intp, out), codegen


_ge_masks64 = cast("Callable[[np.ndarray, int, Any, np.ndarray, int, np.ndarray], None]",
                   intrinsic(_ge_masks64_typing))


def _ne_mask64_typing(typingctx, a, b, start):
    """``_ne_mask64(a, b, start)``: bit ``i`` set where ``a[start + i] != b[start + i]``, for the 64
    elements from ``start`` (inside both: contiguous 1-D arrays of one unsigned dtype). As
    :func:`_ge_mask64`, vector IR (two loads, a compare, its 64 bits as one integer): the element loop
    that shifts each compare into place ran at 0.48 ns an element, a third of a step's encode kernels
    on the corpus."""
    if not (isinstance(a, types.Array) and isinstance(b, types.Array) and a.dtype == b.dtype
            and a.ndim == b.ndim == 1 and a.layout == b.layout == "C"
            and isinstance(a.dtype, types.Integer) and not getattr(a.dtype, "signed", True)):
        return None

    def codegen(context, builder, signature, args):
        from llvmlite import ir
        elt = context.get_data_type(signature.args[0].dtype)
        vec = ir.VectorType(elt, 64)

        def load(k):
            arr = context.make_array(signature.args[k])(context, builder, args[k])
            ptr = builder.bitcast(builder.gep(arr.data, [args[2]]), vec.as_pointer())
            return builder.load(ptr, align=max(1, elt.width // 8))
        ne = builder.icmp_unsigned("!=", load(0), load(1))
        return builder.bitcast(ne, ir.IntType(64))
    return types.uint64(a, b, types.intp), codegen


_ne_mask64 = cast("Callable[[np.ndarray, np.ndarray, int], np.uint64]", intrinsic(_ne_mask64_typing))


def _copy_elems_typing(typingctx, dst, src, start, n):
    """``_copy_elems(dst, src, start, n)``: ``dst[start:start + n] = src[start:start + n]`` as one
    ``llvm.memcpy`` (both contiguous 1-D arrays of one dtype, not overlapping). Why: the element loop
    inside a larger kernel is not vectorised (LLVM cannot rule out aliasing there), and numba's slice
    assignment copies through a temporary."""
    if not (isinstance(dst, types.Array) and isinstance(src, types.Array) and dst.dtype == src.dtype
            and dst.ndim == src.ndim == 1 and dst.layout == src.layout == "C"):
        return None

    def codegen(context, builder, signature, args):
        from numba.core import cgutils
        d = context.make_array(signature.args[0])(context, builder, args[0])
        s = context.make_array(signature.args[1])(context, builder, args[1])
        size = context.get_abi_sizeof(context.get_data_type(signature.args[0].dtype))
        cgutils.raw_memcpy(builder, builder.gep(d.data, [args[2]]), builder.gep(s.data, [args[2]]), args[3], size)
        return context.get_dummy_value()
    return types.void(dst, src, types.intp, types.intp), codegen


_copy_elems = cast("Callable[[np.ndarray, np.ndarray, int, int], None]", intrinsic(_copy_elems_typing))


def _load64_typing(typingctx, arr, start):
    """``_load64(arr, start)``: the 8 bytes from element ``start`` of a contiguous unsigned array as one
    little-endian uint64 (one unaligned load; the caller keeps them inside ``arr``)."""
    if not (isinstance(arr, types.Array) and arr.ndim == 1 and arr.layout == "C"
            and isinstance(arr.dtype, types.Integer) and not getattr(arr.dtype, "signed", True)):
        return None

    def codegen(context, builder, signature, args):
        from llvmlite import ir
        a = context.make_array(signature.args[0])(context, builder, args[0])
        ptr = builder.bitcast(builder.gep(a.data, [args[1]]), ir.IntType(64).as_pointer())
        return builder.load(ptr, align=1)
    return types.uint64(arr, types.intp), codegen


_load64 = cast("Callable[[np.ndarray, int], np.uint64]", intrinsic(_load64_typing))


# ------------------------------------------------------------------------------------ the backend

# The kernels (with the argument types that vary) called on the main thread so far (see :func:`_call`).
_loaded: set[tuple[Any, ...]] = set()
_main_ident = [threading.main_thread().ident]   # the main thread's ident, as :func:`_call` last found it


def _ro(a: np.ndarray) -> np.ndarray:
    """``a`` read-only (a view where it is writeable). Why: numba compiles a kernel once per writability
    of each array, so every array a kernel only reads is passed read-only: memory-mapped checkpoints
    and arrays in memory then share one build, the one ``warm_up`` makes."""
    if a.flags.writeable:
        a = a.view()
        a.flags.writeable = False
    return a


def _input(a: np.ndarray) -> np.ndarray:
    """``a`` as the kernels read a block: C-contiguous and aligned (else copied, rather than compiled
    for: only views of odd layouts are either) and read-only (:func:`_ro`)."""
    flags = a.flags   # (a new object at each ``.flags``: read once)
    if not (flags.c_contiguous and flags.aligned):
        a = np.require(a, requirements=("C", "A"))
    return _ro(a)


def _kind(a: np.ndarray) -> tuple[int, int, int]:
    """What numba compiles a kernel for, of an array: its dtype, rank and flags (layout, writability)."""
    return a.dtype.num, a.ndim, a.flags.num


def _call(kernel, key: tuple[Any, ...], *args):
    """``kernel(*args)``; ``key``: the types of those arguments that vary from call to call (the others
    are fixed by the wrapper). A main-thread call of a key not seen yet runs on a helper thread, which
    the main thread waits for (interruptibly).

    Why: such a call loads the kernel from numba's cache or compiles it, holding llvmlite's lock; a
    Ctrl-C (raised only on the main thread) landing inside that left the lock held, and the next block
    thread to load a kernel waited for it forever. Now an interrupt stops the main thread's wait, while
    the load runs to its end and releases the lock. Block threads call directly (signals never interrupt
    them), as does the main thread once a key is loaded. (A key per wrapper, not one built from every
    argument: that cost 4 µs a call, 10 % of a small tensor's decode.)
    """
    ident = threading.get_ident()
    if ident != _main_ident[0]:   # cached: main_thread() is a lookup and a call (a fork's child has a new one)
        if ident != threading.main_thread().ident:
            return kernel(*args)
        _main_ident[0] = ident
    key = (kernel, *key)
    if key in _loaded:
        return kernel(*args)
    done: list[tuple[bool, Any]] = []

    def load() -> None:
        try:
            done.append((True, kernel(*args)))
        except BaseException as e:  # noqa: BLE001 - handed to the caller as it is
            done.append((False, e))
    helper = threading.Thread(target=load, name="arcfmt-kernel-load", daemon=True)
    helper.start()
    helper.join()
    ok, value = done[0]
    if not ok:
        raise value
    _loaded.add(key)
    return value


def changes(base, target):
    """Indices where ``base`` and ``target`` differ (int64, increasing)."""
    if base.dtype.kind == "u" and base.dtype.itemsize <= 4 and base.dtype == target.dtype \
            and base.flags.c_contiguous and target.flags.c_contiguous and base.flags.aligned \
            and target.flags.aligned:   # (blocks of flat views are; the kernel loads 64 at a time)
        base, target = _ro(base), _ro(target)
        return _call(_changes, (_kind(base), _kind(target)), base, target)
    return np.flatnonzero(base != target)


def history(dt, previous, base, out=None):
    """The history codes of SPEC.md §7 from ``previous`` to ``base`` (flat unsigned views of one
    length), packed four to a byte (element ``i`` in bits ``2 (i mod 4)`` of byte ``i // 4``), in one
    pass without the GIL; into ``out`` when given (zeros, contiguous, ``ceil(n / 4)`` bytes)."""
    previous, base = _input(previous), _input(base)
    if out is None:
        out = np.zeros((base.size + 3) // 4, np.uint8)
    _call(_history, (_kind(previous), _kind(base)), previous, base, 1 << (8 * dt.itemsize - 1), out)
    return out


def history_at(dt, packed, offset, positions, previous, base) -> None:
    """Into packed codes (all 0 there before), the codes of the elements at ``positions`` of the flat
    views ``previous`` and ``base`` (a block), element ``p`` of them at ``offset + p`` of ``packed``."""
    positions, previous, base = _ro(positions), _input(previous), _input(base)
    _call(_history_at, (_kind(positions), _kind(previous), _kind(base)), packed, offset, positions, previous, base,
          1 << (8 * dt.itemsize - 1))


def class_key(dt, base, history=None, previous=None):
    """The class keys of a ``ctx-delta-rhp`` block (§8.12; a new read-only array of its dtype): each
    element's magnitude bits shifted right by one, and bit ``B − 2`` set where its history code
    (``history``: ``(packed, offset)``, §7) is not 0 — so ``key ≥ T · 2^(M−1)`` exactly where §8.12's
    ``x'(i) ≥ T``, with the bit above the key clear (the kernels' class bounds stay below the mask).
    ``previous``: the block's previous value, in place of its codes (the same keys)."""
    base = _input(base)
    bits = 8 * dt.itemsize
    mask, top = base.dtype.type((1 << (bits - 1)) - 1), base.dtype.type(1 << (bits - 2))
    if previous is not None:
        out = np.empty(base.size, base.dtype)   # (a writer: codes are not 0 where the previous value differs)
        previous = _input(previous)
        _call(_class_key_of, (_kind(base), _kind(previous)), base, previous, mask, top, out)
    else:
        hist, hoff = _history_args(history)
        buf = np.empty((base.size + 3) & ~3, base.dtype)   # whole words: outw covers out's first m & ~3
        out = buf[:base.size]
        lutw, wmask = _key_words(base.dtype)
        outw = buf[:base.size & ~3].view(np.uint64) if lutw.size else _NO_WORDS
        _call(_class_key, (_kind(base),), base, mask, top, hist, hoff, out, lutw, outw, wmask)
    return _ro(out)


_KEY_WORDS: dict[np.dtype, tuple[np.ndarray, np.uint64]] = {}
_NO_WORDS = np.empty(0, np.uint64)


def _key_words(dtype: np.dtype) -> tuple[np.ndarray, np.uint64]:
    """:func:`_class_key`'s word tables for a dtype of 2 or 4 bytes: each code byte's four elements'
    ``top`` bits as 64-bit words (one or two a byte, in a row), and the mask of each element's key bits
    in a word; none (an empty table) for one-byte elements."""
    got = _KEY_WORDS.get(dtype)
    if got is None:
        bits = 8 * dtype.itemsize
        if dtype.itemsize == 1:
            got = (_ro(np.zeros(0, np.uint64)), np.uint64(0))
        else:
            top = 1 << (bits - 2)
            rows = np.array([[top if (v >> (2 * t)) & 3 else 0 for t in range(4)] for v in range(256)], dtype)
            lane = (1 << (bits - 2)) - 1
            wmask = sum(lane << (bits * i) for i in range(64 // bits))
            got = (_ro(rows.view(np.uint64).reshape(-1)), np.uint64(wmask))
        _KEY_WORDS[dtype] = got
    return got


def scatter(flat, index, values) -> None:
    """``flat[index] = values`` (a live model's staged changes), without the GIL."""
    index, values = _ro(index), _ro(values)
    _call(_scatter, (_kind(flat), _kind(index), _kind(values)), flat, index, values)


def exponent_counts(dt, base, stride, positions):
    """Elements of ``base[::stride]`` and of ``base[positions]`` per exponent field value (the gather runs
    in the kernel: numpy's would hold the GIL). ``positions`` must lie inside ``base`` (the kernel does
    not check: they come from :func:`changes`)."""
    size = 1 << dt.exp_bits
    base, positions = _input(base), _ro(positions)
    return _call(_exponent_counts, (_kind(base), _kind(positions)),
                 base, stride, positions, dt.mant_bits, size - 1, size)


def key_counts(dt, base, previous, stride, positions):
    """:func:`exponent_counts` of the class keys a block's previous value gives (§8.12: ``x'``, ``2^(E+1)``
    values), without making them: what the writer weighs ``ctx-delta-rhp`` by."""
    size = 1 << (dt.exp_bits + 1)
    base, previous, positions = _input(base), _input(previous), _ro(positions)
    return _call(_key_counts, (_kind(base), _kind(previous), _kind(positions)),
                 base, previous, stride, positions, dt.mant_bits, (1 << dt.exp_bits) - 1, size)


def class_cuts(ne, ce, max_classes, overhead) -> tuple[list, float]:
    """The exponent-class thresholds of least estimated position bits, and that estimate."""
    cuts, bits = _call(_class_cuts, (_kind(ne), _kind(ce), type(max_classes), type(overhead)),
                       ne, ce, max_classes, overhead)
    return cuts.tolist(), float(bits)


def _args(dt, thresholds, keyed=False):
    """``edges, mask, shift, emask, half`` of the kernels for this dtype and these thresholds (``keyed``:
    thresholds on the key fields of :func:`class_key`, which hold the magnitude bits less their lowest)."""
    bits = 8 * dt.itemsize
    return (np.asarray([t << (dt.mant_bits - keyed) for t in thresholds], dt.uint), dt.uint.type((1 << (bits - 1)) - 1),
            dt.mant_bits, (1 << dt.exp_bits) - 1, 1 << (bits - 1))


def ctx_encode(dt, base, target, positions, thresholds, max_rice, dense=False, sign_axes=(), force_signs=False,
               rc_limit=0, rc_planes=False, rp=0, rp_limit=0, history=None, key=None):
    """A whole changed block: ``(counts, rice, qbits, mw, streams, signs, rp_rice)``. ``dense`` (no thresholds):
    the quotient and remainder streams code the unchanged elements' positions (``dense-delta``, §8.7).
    ``sign_axes``: ``(axis, P, phase)`` sign contexts to size (§8.8); ``signs`` is ``(i, coded)`` for
    the one of least estimated size, range-coded, or None when none is given or (unless ``force_signs``)
    the estimate says the raw bits are about as small. ``rc_limit`` > 0 (with ``sign_axes``): ``coded``
    is ctx-delta-rc's changes stream (§8.9) instead, or ``signs`` None where it would pass
    ``rc_limit`` bytes; the magnitude planes are then empty unless ``rc_planes``. ``rp`` (with
    ``rc_limit``): 1 where the gaps' model estimate is below the quotient and remainder bits, 2 always:
    ``coded`` is ctx-delta-rp's stream (§8.10; at most ``rp_limit`` bytes) and ``rp_rice`` its Rice
    parameters (else None; ``rice`` stays ctx-delta's, whose streams are returned too). ``history``
    (with ``rc_limit``, without ``rp``): the block's history codes (§7, uint8): each axis is sized with
    §8.11's contexts too, and a choice ``i`` of ``len(sign_axes)`` or more is axis ``i - len(sign_axes)``
    coded with them (``ctx-delta-rh``). ``key`` (with ``history``): the block's class keys
    (:func:`class_key`), whose fields the thresholds split: a ``ctx-delta-rhp`` block (§8.12)."""
    base, target, positions = _input(base), _input(target), _ro(positions)
    hist, hoff = _history_args(history)
    keyed = key is not None
    key = _no_key(base) if key is None else _input(key)
    axes = np.asarray(sign_axes, np.int64).reshape(-1, 3)
    counts, rice, qbits, q, r, s, mw, mag, choice, coded, rp_rice = _call(
        _ctx_encode, (dt.code, _kind(base), _kind(target), _kind(positions), type(max_rice)),
        base, target, positions, *_args(dt, thresholds, keyed), max_rice, dense, axes, force_signs, SIGN_COST,
        SIGN_P0, rc_limit, rc_planes, 8 * dt.itemsize, rp, rp_limit, hist, hoff, key)
    signs = None if choice < 0 else (int(choice), coded.tobytes())
    return (counts.tolist(), rice.tolist(), int(qbits), int(mw), [q.tobytes(), r.tobytes(), s.tobytes(), mag.tobytes()],
            signs, rp_rice.tolist() if rp_rice.size else None)


def ctx_decode(dt, p, streams, m, base, out, positions=None, history=None) -> int:
    """A whole block into ``out``: OK, or the status of the first failed check, having written nothing
    into ``base`` (in place; a separate ``out`` may hold part of the base's copy, see ``_ctx_decode``).
    ``positions`` (int64, ``p.changed`` long): also filled with the positions the block changes.
    ``history``: the block's history codes (§7, uint8), for a ``ctx-delta-rh`` block (§8.11) or a
    ``ctx-delta-rhp`` block (``p.rhp``, §8.12), whose class keys are made from them here."""
    args = _decode_args.get((dt.code, p.rhp, *p.thresholds))
    if args is None:
        if len(_decode_args) >= 4096:
            _decode_args.clear()
        args = _decode_args[(dt.code, p.rhp, *p.thresholds)] = _args(dt, p.thresholds, p.rhp)  # never written to
    out_flags = out.flags
    if not (out_flags.c_contiguous and out_flags.aligned):   # the kernel writes contiguous memory only
        flat = out.copy() if out is base else np.empty(out.shape, out.dtype)
        status = ctx_decode(dt, p, streams, m, flat if out is base else base, flat, positions, history)
        if status == OK:
            out[...] = flat
        return status
    separate = out is not base   # (out is contiguous here: base is too when it is out)
    base = _input(base)   # in place too: the kernel writes through ``out`` only
    key = class_key(dt, base, history) if p.rhp and len(p.counts) > 1 else _no_key(base)
    if positions is None:
        positions = _NO_POSITIONS
    axis, period, phase = p.signs[:3] if p.signs is not None else (-1, 1, 0)
    if p.rp:   # ctx-delta-rp's one stream (§8.10) stands where -rc's changes stream is
        streams = (b"", b"", streams[0])
    # the streams are read-only uint8 (_bytes_array), counts and rice new int64 arrays, the rest by dtype
    return _call(
        _ctx_decode, (dt.code, base.flags.num, out_flags.num, positions.flags.num), base, out,
        _bytes_array(streams[0]), p.qbits, _bytes_array(streams[1]), _bytes_array(streams[2]),
        _NO_BYTES if p.rc else _bytes_array(streams[3]), p.mag_width,
        np.array(p.counts, np.int64), np.array(p.rice, np.int64), *args, separate, positions, p.dense,
        axis, period, phase, SIGN_P0, p.rc, 8 * dt.itemsize, p.rp,
        *_history_args(history), key)


_NO_POSITIONS = np.empty(0, np.int64)
_NO_HISTORY = _ro(np.empty(0, np.uint8))
_NO_KEYS = {np.dtype(t): _ro(np.empty(0, t)) for t in (np.uint8, np.uint16, np.uint32)}


def _no_key(base: np.ndarray) -> np.ndarray:
    """The kernels' "no class keys" (an empty read-only array of the block's dtype: one build serves both)."""
    return _NO_KEYS[base.dtype]



def _history_args(history) -> tuple[np.ndarray, int]:
    """``hist, hoff`` of the kernels for a block's ``(packed codes, offset)``, or none (an empty array)."""
    return (_NO_HISTORY, 0) if history is None else (_input(history[0]), history[1])
# The kernel arguments of a dtype and thresholds (:func:`_args`), by (dtype code, *thresholds): a block's
# per-call Python work holds the GIL, and these repeat from block to block.
_decode_args: dict[tuple[int, ...], tuple[Any, ...]] = {}


def _bytes_array(buf) -> np.ndarray:
    """A read-only uint8 view: numba compiles a kernel once per array layout, and streams arrive as
    bytes, bytearrays or memoryviews, so all are passed alike (one compiled ``ctx_decode`` per type)."""
    a = np.frombuffer(buf, np.uint8)
    if a.flags.writeable:
        a = a.view()
        a.flags.writeable = False
    return a


_NO_BYTES = _bytes_array(b"")   # ctx-delta-rc's absent magnitude stream


# ------------------------------------------------------------------------------------ the kernels

@_jit
def _key_counts(base, previous, stride, positions, shift, emask, size):
    """:func:`_exponent_counts` of §8.12's key fields, ``x' = x + 2^E`` where ``previous`` differs (four
    sub-histograms, no branch on the data)."""
    half = size >> 1
    sub = np.zeros((4, size), np.int64)
    n = (base.size + stride - 1) // stride
    n4 = n - n % 4
    for k in range(0, n4, 4):
        for u in range(4):
            i = (k + u) * stride
            b = base[i]
            sub[u, ((b >> shift) & emask) + half * np.int64(previous[i] != b)] += 1
    for k in range(n4, n):
        i = k * stride
        b = base[i]
        sub[0, ((b >> shift) & emask) + half * np.int64(previous[i] != b)] += 1
    ne = sub[0] + sub[1] + sub[2] + sub[3]
    ce = np.zeros(size, np.int64)
    for p in positions:
        b = base[p]
        ce[((b >> shift) & emask) + half * np.int64(previous[p] != b)] += 1
    return ne, ce


@_jit
def _exponent_counts(base, stride, positions, shift, emask, size):
    """Elements of ``base[::stride]`` and of ``base[positions]`` per exponent field value (four
    sub-histograms: no store stalls)."""
    sub = np.zeros((4, size), np.int64)
    n = (base.size + stride - 1) // stride
    n4 = n - n % 4
    for k in range(0, n4, 4):
        i = k * stride
        sub[0, (base[i] >> shift) & emask] += 1
        sub[1, (base[i + stride] >> shift) & emask] += 1
        sub[2, (base[i + 2 * stride] >> shift) & emask] += 1
        sub[3, (base[i + 3 * stride] >> shift) & emask] += 1
    for k in range(n4, n):
        sub[0, (base[k * stride] >> shift) & emask] += 1
    ne = sub[0] + sub[1] + sub[2] + sub[3]
    ce = np.zeros(size, np.int64)
    for p in positions:
        ce[(base[p] >> shift) & emask] += 1
    return ne, ce


@_jit
def _ordered(u, half):
    """The order-preserving integer of a bit pattern (SPEC.md §8.6): ``u`` below ``half``, else
    ``half − 1 − u``. Without a branch: the sign of weights is a coin toss, and a mispredicted branch
    per changed element was a third of the decoder's step pass."""
    x = np.int64(u)
    return x + np.int64(x >= half) * ((half - 1) - 2 * x)


@_jit
def _code(p, b, half):
    """h of §7: 0 unchanged, 1 up, 2 down in order-preserving integers, without a branch on the direction."""
    return np.uint8(p != b) * (np.uint8(1) + np.uint8(_ordered(b, half) < _ordered(p, half)))


@_jit
def _history(previous, base, half, out):
    n4 = base.size >> 2
    for k in range(n4):   # four codes a byte, written once
        i = k << 2
        out[k] = (_code(previous[i], base[i], half) | (_code(previous[i + 1], base[i + 1], half) << 2)
                  | (_code(previous[i + 2], base[i + 2], half) << 4) | (_code(previous[i + 3], base[i + 3], half) << 6))
    for i in range(n4 << 2, base.size):
        out[i >> 2] |= _code(previous[i], base[i], half) << np.uint8((i & 3) << 1)


@_jit
def _class_key_of(base, previous, mask, top, out):
    """:func:`_class_key` from the previous value itself (its history code is not 0 where it differs)."""
    zero = top ^ top
    for i in range(base.size):
        b = base[i]
        out[i] = ((b & mask) >> 1) | (top if previous[i] != b else zero)


@_jit
def _class_key(base, mask, top, hist, hoff, out, lutw, outw, wmask):
    """Each element's class key (:func:`class_key`): its magnitude bits less the lowest, and ``top``
    where its history code (packed, element 0 at ``hoff``) is not 0. Where ``hoff`` is a multiple of 4
    (a block starting at a code byte: every block the reference writer makes) and elements are 2 or 4
    bytes, a code byte's four elements at a time, as 64-bit words (``wmask``: each element's key bits,
    ``lutw``: each code byte's ``top`` bits, ``outw``: ``out``'s words); elsewhere element by element.
    (An element loop of ``out`` and ``base`` does not vectorise: LLVM cannot rule out their aliasing.)"""
    m = base.size
    start = 0
    k = lutw.size >> 8   # words a code byte's elements take (0: one-byte elements, element by element)
    if hoff & 3 == 0 and k:
        h0 = hoff >> 2
        n4 = m >> 2
        if k == 1:   # (a loop over k words took five times as long as these two)
            for j in range(n4):
                outw[j] = ((_load64(base, j << 2) >> np.uint64(1)) & wmask) | lutw[hist[h0 + j]]
        else:
            for j in range(n4):
                r = np.int64(hist[h0 + j]) << 1
                outw[2 * j] = ((_load64(base, j << 2) >> np.uint64(1)) & wmask) | lutw[r]
                outw[2 * j + 1] = ((_load64(base, (j << 2) + 2) >> np.uint64(1)) & wmask) | lutw[r + 1]
        start = n4 << 2
    for i in range(start, m):
        q = i + hoff
        h = np.int64(hist[q >> 2] >> ((q & 3) << 1)) & 3
        out[i] = ((base[i] & mask) >> 1) | (top * np.int64(h != 0))


@_jit
def _history_at(packed, offset, positions, previous, base, half):
    for t in range(positions.size):
        p = positions[t]
        q = offset + p
        packed[q >> 2] |= _code(previous[p], base[p], half) << np.uint8((q & 3) << 1)


@_jit
def _hcode(hist, hoff, p):
    """The history code of a block's element ``p`` from packed codes whose element 0 is ``hoff`` into
    them; clamped to 2 (codes are 0-2, checked before decoding: never an index past the contexts)."""
    q = p + hoff
    return min(np.int64((hist[q >> 2] >> ((q & 3) << 1)) & 3), 2)


@_jit
def _unordered(v, half):
    """The inverse of :func:`_ordered` (``v`` in ``[-half, half)``), without a branch."""
    return v + np.int64(v < 0) * ((half - 1) - 2 * v)


@_jit
def _rice_decode(qbuf, qbits, rbuf, counts, rice, ranks):
    """Quotient and remainder bit strings → each class's member ranks (concatenated in class order).

    Checks, in the order SPEC.md §8.6 gives: quotient padding, quotient codes, remainder padding.
    Each bit string is read through a 64-bit window: a quotient is the window's trailing zeros (one
    ``tzcnt``, where a loop per bit mispredicts its exit once per code), a remainder its low bits.
    The window is fed 7 or so bytes by one load while 8 remain (a loop per byte mispredicted its
    count), then a byte at a time; the bits it holds above its count are the next bytes' own.
    """
    for b in range(qbits, 8 * qbuf.size):
        if qbuf[b >> 3] >> (b & 7) & 1:
            return Q_PADDING
    rbits = 0
    for k in range(counts.size):
        rbits += counts[k] * rice[k]
    c = ranks.size
    nq = qbuf.size
    nr = rbuf.size
    qacc = np.uint64(0)   # the next qn bits of qbuf, lowest first; qi: the next byte to feed in
    qn = 0
    qi = 0
    racc = np.uint64(0)   # the same for rbuf
    rn = 0
    ri = 0
    qpos = 0
    idx = 0
    for k in range(counts.size):
        r = rice[k]
        low = (np.uint64(1) << np.uint64(r)) - np.uint64(1)
        prev = -1
        for _ in range(counts[k]):
            q = 0
            while True:   # every bit past qbits is 0 (checked above): a 1 found is a code's end
                if qi + 8 <= nq:   # whole bytes up to 56..63 bits, one load; bits above qn are the next bytes'
                    qacc |= _load64(qbuf, qi) << np.uint64(qn)
                    fed = int((63 - qn) >> 3)
                    qi += fed
                    qn += 8 * fed
                else:
                    while qn <= 56 and qi < nq:
                        qacc |= np.uint64(qbuf[qi]) << np.uint64(qn)
                        qi += 1
                        qn += 8
                z = int(_trailing_zeros(qacc))   # 64 when qacc is 0
                if z < qn:
                    q += z
                    qpos += z + 1
                    qacc = (qacc >> np.uint64(z)) >> np.uint64(1)
                    qn -= z + 1
                    break
                if qn == 0:
                    return Q_CODES
                q += qn   # the qn bits held are all 0: drop them (and the look-ahead, fed again from qi)
                qpos += qn
                qn = 0
                qacc = np.uint64(0)
            if qpos > qbits:
                return Q_CODES
            g = q << r
            if r:
                if rn < r:
                    if ri + 8 <= nr:
                        racc |= _load64(rbuf, ri) << np.uint64(rn)
                        fed = int((63 - rn) >> 3)
                        ri += fed
                        rn += 8 * fed
                    else:
                        while rn < r:   # rbuf holds rbits bits: never fed past its end
                            racc |= np.uint64(rbuf[ri]) << np.uint64(rn)
                            ri += 1
                            rn += 8
                g |= np.int64(racc & low)
                racc >>= np.uint64(r)
                rn -= r
            prev += g + 1
            ranks[idx] = prev
            idx += 1
    if idx != c or qpos != qbits:
        return Q_CODES
    for b in range(rbits, 8 * rbuf.size):
        if rbuf[b >> 3] >> (b & 7) & 1:
            return R_PADDING
    return OK


@_jit
def _rice_encode(gaps, counts, rice, qbuf, rbuf):
    """Gaps (class order) → quotient bit string and remainder bit string, into zeroed buffers."""
    qpos = 0
    acc = np.uint64(0)  # remainder bits not yet written (fewer than 8 + 24)
    n_acc = 0
    rbyte = 0
    idx = 0
    for k in range(counts.size):
        r = rice[k]
        low = (np.int64(1) << r) - 1
        for _ in range(counts[k]):
            g = gaps[idx]
            idx += 1
            qpos += g >> r
            qbuf[qpos >> 3] |= np.uint8(1 << (qpos & 7))
            qpos += 1
            if r:
                acc |= np.uint64(g & low) << np.uint64(n_acc)
                n_acc += r
                while n_acc >= 8:
                    rbuf[rbyte] = np.uint8(acc & np.uint64(0xFF))
                    rbyte += 1
                    acc >>= np.uint64(8)
                    n_acc -= 8
    if n_acc:
        rbuf[rbyte] = np.uint8(acc & np.uint64(0xFF))


@_jit
def _ctx_decode(base, out, qbuf, qbits, rbuf, sbuf, mbuf, mw, counts, rice, edges, mask, shift, emask, half,
                copy, pos_out, dense, saxis, speriod, sphase, p0tab, rc, nbits, rp, hist, hoff, key):
    """A whole ctx-delta block (SPEC.md §8.6) in one call: positions, signs, magnitudes, range check,
    then ``out`` = base with the steps applied (``copy`` False: ``out`` is ``base``, in place).
    ``dense`` (one class): a ``dense-delta`` block (§8.7), whose codes are the unchanged elements'
    positions; the changes are the others. ``saxis`` ≥ 0: a ``ctx-delta-as`` block (§8.8), whose
    sign stream is range-coded in the contexts of ``saxis``, ``speriod`` and ``sphase``; with ``rc``
    too, a ``ctx-delta-rc`` block (§8.9), whose stream 2 codes each change's sign and magnitude
    (``nbits``: the dtype's bits); with ``rp`` too, a ``ctx-delta-rp`` block (§8.10), whose one stream
    (``sbuf``) codes the gaps first. ``hist`` (with ``rc``, not ``rp``): the block's history (§7, packed,
    element 0 at ``hoff``), a ``ctx-delta-rh`` block (§8.11); else empty. ``key`` (non-empty, with
    ``hist``): the block's class keys (§8.12), which the thresholds split in place of the magnitude
    bits: a ``ctx-delta-rhp`` block (the base is then copied and gathered apart from the class pass).

    Returns OK, or the first failed check's status, having written nothing to ``base`` (a separate
    ``out`` may hold part of the base's copy: the copy is made in the class pass, which reads the
    base anyway, so the block is read once). Why one call: per block it replaces a dozen numpy calls
    that each hold the GIL, so blocks decode in parallel threads.
    """
    c = 0
    for k in range(counts.size):
        c += counts[k]
    m = base.size
    code, rng, r = np.int64(0), np.int64(0xFFFFFFFF), 5   # the range decoder's state (rc)
    if dense:
        kept = np.empty(m - c, np.int64)   # the unchanged elements' positions
        status = _rice_decode(qbuf, qbits, rbuf, np.full(1, m - c, np.int64), rice, kept)
    elif rp:
        ranks = np.empty(c, np.int64)
        status = _sign_start(sbuf)
        if status == OK:
            status, code, rng, r = _rp_ranks(sbuf, counts, rice, m, ranks, p0tab)
    else:
        ranks = np.empty(c, np.int64)
        status = _rice_decode(qbuf, qbits, rbuf, counts, rice, ranks)
    if status != OK:
        return status
    if saxis < 0:
        for b in range(c, 8 * sbuf.size):
            if sbuf[b >> 3] >> (b & 7) & 1:
                return S_PADDING
    elif not rp:   # (rp: started before the gaps)
        status = _sign_start(sbuf)
        if status != OK:
            return status
    if dense:
        if kept.size and kept[kept.size - 1] >= m:
            return BEYOND
        ranks = _complement(kept, m, c)
    pos = ranks  # select turns each rank into its position in place
    n_classes = counts.size
    bv = np.empty(c, base.dtype)
    keyed = key.size > 0   # ctx-delta-rhp (§8.12): the classes of the keys, the values of the base
    if n_classes == 1:
        if ranks[c - 1] >= m:
            return BEYOND
    elif not _class_select(key if keyed else base, mask, edges, counts, ranks, out, copy and not keyed, bv):
        return BEYOND
    if n_classes == 1 or keyed:   # no class pass read the base: it is copied and gathered here
        if copy:
            _copy_elems(out, base, 0, m)
        for t in range(c):
            bv[t] = base[pos[t]]
    nv = np.empty(c, base.dtype)
    if rc:
        if not rp:
            code = _rc_code(sbuf)
        status = _rc_decode(sbuf, pos, bv, nv, m, saxis, speriod, sphase, shift, emask, half, nbits, p0tab,
                            code, rng, r, hist, hoff)
        if status != OK:
            return status
        return _commit(out, pos, nv, pos_out)
    if saxis < 0:
        sb = np.empty(sbuf.size, np.uint8)
        sb[:] = sbuf
    else:
        sb = np.zeros((c + 7) >> 3, np.uint8)
        status = _sign_decode(sbuf, pos, m, saxis, speriod, sphase, sb, p0tab)
        if status != OK:
            return status
    # The magnitude of the t-th change (class order) sits at its rank in the stable sort by exponent
    # field: the changes of lower fields first, then this field's earlier changes (a counting sort).
    # The changed elements were gathered where each position was found (the class pass had its word
    # in cache; a pass of its own read them all over the block); their fields are counted here, in a
    # pass of their own; every new value is computed and checked before anything is written.
    start = _field_starts(bv, shift, emask)
    for t in range(c):
        b = bv[t]
        x = (b >> shift) & emask
        j = start[x]        # this change's magnitude: the j-th value of the planes
        start[x] = j + 1
        a = np.int64(0)
        for k in range(mw):
            a |= np.int64(mbuf[k * c + j]) << (8 * k)
        negative = np.int64((sb[t >> 3] >> (t & 7)) & 1)  # a factor, not a branch: signs are coin tosses
        v = _ordered(b, half) + (a + 1) * (1 - 2 * negative)
        if v < -half or v >= half:
            return RANGE
        nv[t] = _unordered(v, half)
    return _commit(out, pos, nv, pos_out)


@_jit
def _commit(out, pos, nv, pos_out):
    """The checked new values into ``out`` (and the positions into ``pos_out`` when wanted): OK."""
    for t in range(pos.size):
        out[pos[t]] = nv[t]
    if pos_out.size:   # the caller wants the changed positions too (class order)
        for t in range(pos.size):
            pos_out[t] = pos[t]
    return OK


@_jit
def _complement(kept, m, c):
    """The ``c`` indices of ``[0, m)`` not in ``kept`` (increasing, all below ``m``), in order."""
    out = np.empty(c, np.int64)
    t = 0
    nxt = 0
    for z in kept:
        for i in range(nxt, z):
            out[t] = i
            t += 1
        nxt = z + 1
    for i in range(nxt, m):
        out[t] = i
        t += 1
    return out


@_jit
def _field_starts(bv, shift, emask):
    """Where each exponent field's changes start in the stable sort by field (``start[x]``: the
    changes of lower fields), from four sub-histograms. Why a pass of its own: counted where each
    position was found, an increment of the field just counted (fields repeat) waited on the store
    before it — 8 ns a change, a third of the class pass on dense blocks."""
    n = bv.size
    n4 = n - n % 4
    width = emask + 2
    sub = np.zeros((4, width), np.int64)
    for t in range(0, n4, 4):
        sub[0, ((bv[t] >> shift) & emask) + 1] += 1
        sub[1, ((bv[t + 1] >> shift) & emask) + 1] += 1
        sub[2, ((bv[t + 2] >> shift) & emask) + 1] += 1
        sub[3, ((bv[t + 3] >> shift) & emask) + 1] += 1
    for t in range(n4, n):
        sub[0, ((bv[t] >> shift) & emask) + 1] += 1
    start = np.empty(width, np.int64)
    acc = np.int64(0)
    for x in range(width):
        acc += sub[0, x] + sub[1, x] + sub[2, x] + sub[3, x]
        start[x] = acc
    return start


@_jit
def _word_select(x, r):
    """The bit index of the ``r``-th set bit of ``x`` (``r`` below its popcount): a binary search on
    popcounts of halves."""
    at = 0
    half = 32
    while half:
        low = x & np.uint64((np.uint64(1) << np.uint64(half)) - np.uint64(1))
        p = np.int64(_popcount(low))
        if r >= p:
            r -= p
            x >>= np.uint64(half)
            at += half
        else:
            x = low
        half >>= 1
    return at


def _fast_pdep() -> bool:
    """Whether this CPU has BMI2's ``pdep`` at full speed (x86 since Haswell; AMD since Zen 3 — on
    earlier AMD cores it is microcoded, tens of times slower). Numba caches a build per CPU."""
    try:
        import llvmlite.binding as llvm  # type: ignore[import-untyped]
        name = llvm.get_host_cpu_name()
        return bool(llvm.get_host_cpu_features().get("bmi2")) and not name.startswith(("znver1", "znver2", "bdver"))
    except Exception:  # noqa: BLE001 - any doubt: the portable select
        return False


FAST_PDEP = _fast_pdep()


@_intrinsic2
def _pdep(typingctx, x, m):
    """BMI2 ``pdep``: the low bits of ``x`` deposited at the set bits of ``m`` (only called where
    :data:`FAST_PDEP`)."""
    def codegen(context, builder, signature, args):
        from llvmlite import ir
        i64 = ir.IntType(64)
        fn = builder.module.declare_intrinsic("llvm.x86.bmi.pdep.64", fnty=ir.FunctionType(i64, [i64, i64]))
        return builder.call(fn, args)
    return types.uint64(types.uint64, types.uint64), codegen


@_jit
def _pdep_select(x, r):
    """:func:`_word_select` in two instructions: the ``r``-th set bit of ``x`` deposited, then found."""
    return np.int64(_trailing_zeros(_pdep(np.uint64(1) << np.uint64(r), x)))


_select_bit = _pdep_select if FAST_PDEP else _word_select



_SELECT_CHUNK = 64  # words per chunk: 4096 elements, copied while the chunk's compares read it, then placed
assert _SELECT_CHUNK & (_SELECT_CHUNK - 1) == 0, "_place_chunk's binary search needs a power of two"


@_jit
def _class_select(base, mask, edges, counts, ranks, out, copy, bv):
    """Each class's member ranks (``ranks``: concatenated in class order, increasing within a class)
    → their positions in the block, in place, gathered as :func:`_place` does; False when
    a rank is beyond its class's members. With ``copy``, ``out`` gets the base's elements in the same
    pass (all of them, also when it fails).

    One pass over the base for every class at once, a 64-element word at a time: the word's class
    bitmaps (``_ge_mask64`` against each threshold, a class's members lying between two of them),
    their popcounts added to each class's members so far, and the ranks that fall in this word
    selected from it — no bitmap or count array is stored. Up to 4 classes run :func:`_select4`, with
    the classes' state in registers, more :func:`_select_n`. ``base`` is contiguous."""
    n_classes = edges.size + 1
    if n_classes <= 4:
        e = np.empty(3, edges.dtype)
        for i in range(3):
            if i < edges.size:
                e[i] = edges[i]
            else:     # a threshold no element reaches (mask + 1): the classes after it are empty
                e[i] = mask
                e[i] += 1
        c1 = counts[1] if n_classes > 1 else 0
        c2 = counts[2] if n_classes > 2 else 0
        c3 = counts[3] if n_classes > 3 else 0
        return _select4(base, mask, e[0], e[1], e[2], counts[0], c1, c2, c3, ranks, out, copy, bv)
    return _select_n(base, mask, edges, counts, ranks, out, copy, bv)


@_jit
def _select_n(base, mask, edges, counts, ranks, out, copy, bv):
    """:func:`_select4` for any number of classes, their state in arrays: a chunk of words at a time,
    each class's members through each word counted without a branch, then each class's ranks in the
    chunk placed by :func:`_place_chunk`. (A branch per class and word, as a first version had, cost
    half again the whole decode of a step with 8 to 16 classes.)"""
    n_classes = edges.size + 1
    nt = edges.size
    m = base.size
    full_words = m // 64
    big = np.int64(1) << 62     # the "next rank" of a class with none left
    zero = mask ^ mask
    top = mask
    top += 1
    lo_e = np.empty(n_classes, edges.dtype)   # each class's bounds on the magnitude bits: [lo, hi)
    hi_e = np.empty(n_classes, edges.dtype)
    nxt = np.empty(n_classes, np.int64)   # each class's next rank (index into ranks) and its value
    rk = np.empty(n_classes, np.int64)
    end = np.empty(n_classes, np.int64)
    seen = np.zeros(n_classes, np.int64)  # each class's members before the current word
    before = np.empty(n_classes, np.int64)
    off = 0
    for k in range(n_classes):
        lo_e[k] = edges[k - 1] if k > 0 else zero
        hi_e[k] = edges[k] if k < nt else top
        nxt[k] = off
        off += counts[k]
        end[k] = off
        rk[k] = ranks[nxt[k]] if nxt[k] < end[k] else big
    cum = np.empty((n_classes, _SELECT_CHUNK), np.int64)
    ge = np.empty(max(nt, 1), np.uint64)   # a word's bitmaps of the elements at or above each threshold
    shared = (base, mask, ranks, big, bv)
    w = 0
    while w < full_words:
        we = min(full_words, w + _SELECT_CHUNK)
        nw = we - w
        if copy:
            _copy_elems(out, base, w * 64, nw * 64)
        for k in range(n_classes):
            before[k] = seen[k]
        for i in range(nw):      # the chunk's counts: no branch on the data
            s = (w + i) * 64
            _ge_masks64(base, s, mask, edges, nt, ge)
            lo = ~np.uint64(0)
            for k in range(nt):
                hi = ge[k]
                seen[k] += np.int64(_popcount(lo & ~hi))
                cum[k, i] = seen[k]
                lo = hi
            seen[nt] += np.int64(_popcount(lo))
            cum[nt, i] = seen[nt]
        if nw < _SELECT_CHUNK:
            cum[:, nw:] = big
        for k in range(n_classes):
            if rk[k] < seen[k]:
                rk[k], nxt[k] = _place_chunk(cum[k], before[k], seen[k], w, rk[k], nxt[k], end[k],
                                             lo_e[k], hi_e[k], shared)
        w = we
    if copy:
        _copy_elems(out, base, w * 64, m - w * 64)
    s = full_words * 64
    for k in range(n_classes):   # the last, partial word
        if nxt[k] == end[k]:
            continue
        word = np.uint64(0)
        for b in range(m - s):
            a = base[s + b] & mask
            if a >= lo_e[k] and a < hi_e[k]:
                word |= np.uint64(1) << np.uint64(b)
        t = _place(word, s, seen[k], seen[k] + np.int64(_popcount(word)), rk[k], nxt[k], end[k],
                   ranks, big, base, bv)[1]
        if t != end[k]:
            return False
    return True


@_jit
def _select4(base, mask, e0, e1, e2, n0, n1, n2, n3, ranks, out, copy, bv):
    """:func:`_class_select` for up to 4 classes of ``n0..n3`` ranks, split by thresholds ``e0..e2``
    (a threshold above ``mask`` leaves the classes after it empty). A chunk of words at a time: each
    class's members through each word, counted without a branch, then the chunk's ranks of each
    class placed by :func:`_place_chunk`. (A branch per class and word, taken where a rank fell in
    it, mispredicted about once per change: 13 ns a change, a third of a dense block's decode.)"""
    m = base.size
    full_words = m // 64
    big = np.int64(1) << 62   # the "next rank" of a class with none left
    t0, t1, t2, t3 = 0, n0, n0 + n1, n0 + n1 + n2
    end0, end1, end2, end3 = t1, t2, t3, t3 + n3
    r0 = ranks[t0] if t0 < end0 else big
    r1 = ranks[t1] if t1 < end1 else big
    r2 = ranks[t2] if t2 < end2 else big
    r3 = ranks[t3] if t3 < end3 else big
    s0 = np.int64(0)
    s1 = np.int64(0)
    s2 = np.int64(0)
    s3 = np.int64(0)
    zero = mask ^ mask            # the dtype's 0 and mask + 1: thresholds of no lower / no upper bound
    top = mask
    top += 1
    cum = np.empty((4, _SELECT_CHUNK), np.int64)   # members of each class through each word of the chunk
    shared = (base, mask, ranks, big, bv)   # what every class's placement uses
    w = 0
    while w < full_words:
        we = min(full_words, w + _SELECT_CHUNK)
        nw = we - w
        if copy:
            _copy_elems(out, base, w * 64, nw * 64)
        b0, b1, b2, b3 = s0, s1, s2, s3
        for i in range(nw):      # the chunk's counts: no branch on the data
            s = (w + i) * 64
            h0 = _ge_mask64(base, s, mask, e0)
            h1 = _ge_mask64(base, s, mask, e1)
            h2 = _ge_mask64(base, s, mask, e2)
            s0 += np.int64(_popcount(~h0))
            s1 += np.int64(_popcount(h0 & ~h1))
            s2 += np.int64(_popcount(h1 & ~h2))
            s3 += np.int64(_popcount(h2))
            cum[0, i] = s0
            cum[1, i] = s1
            cum[2, i] = s2
            cum[3, i] = s3
        if nw < _SELECT_CHUNK:
            cum[:, nw:] = big
        if r0 < s0:
            r0, t0 = _place_chunk(cum[0], b0, s0, w, r0, t0, end0, zero, e0, shared)
        if r1 < s1:
            r1, t1 = _place_chunk(cum[1], b1, s1, w, r1, t1, end1, e0, e1, shared)
        if r2 < s2:
            r2, t2 = _place_chunk(cum[2], b2, s2, w, r2, t2, end2, e1, e2, shared)
        if r3 < s3:
            r3, t3 = _place_chunk(cum[3], b3, s3, w, r3, t3, end3, e2, top, shared)
        w = we
    if copy:
        _copy_elems(out, base, w * 64, m - w * 64)
    return _select4_tail(base, mask, e0, e1, e2, ranks, r0, r1, r2, r3, t0, t1, t2, t3, end0, end1, end2, end3,
                         s0, s1, s2, s3, bv)


@_jit
def _place(word, s, seen, top, r, t, end, ranks, big, base, bv):
    """Every rank of a class that falls in this word (``seen`` members before it, ``top`` through it)
    → its position and its base element into ``bv``; returns the class's next rank and its index."""
    while r < top:
        _found(s + _select_bit(word, r - seen), t, ranks, base, bv)
        t += 1
        r = ranks[t] if t < end else big
    return r, t


@_jit
def _found(q, t, ranks, base, bv):
    """The t-th rank is at position ``q``: store it, gather its base element."""
    ranks[t] = q
    bv[t] = base[q]


@_jit
def _place_chunk(cum, before, through, w0, r, t, end, lo, hi, shared):
    """Every rank of one class that falls in a chunk of words (``cum``: the class's members through
    each word, ``before`` ahead of the chunk, ``through`` it; past its last word: ``big``) → its position, as
    :func:`_place`. The word of a rank is found by a binary search over ``cum`` without branches, and
    the class's bitmap of that word (elements in ``[lo, hi)``) compared again from cache: one search
    per rank costs less than the branch per word it replaces, which is a coin toss on dense blocks.
    ``shared``: ``(base, mask, ranks, big, bv)``."""
    base, mask, ranks, big, bv = shared
    while r < through:
        i = np.int64(0)
        step = _SELECT_CHUNK >> 1
        while step:
            i += step * np.int64(cum[i + step - 1] <= r)
            step >>= 1
        seen = cum[i - 1] if i else before
        s = (w0 + i) * 64
        word = _ge_mask64(base, s, mask, lo) & ~_ge_mask64(base, s, mask, hi)
        top = cum[i]
        while True:   # the class's next ranks in the same word (dense classes: several) take no search
            _found(s + _select_bit(word, r - seen), t, ranks, base, bv)
            t += 1
            r = ranks[t] if t < end else big
            if r >= top:
                break
    return r, t


@_jit
def _select4_tail(base, mask, e0, e1, e2, ranks, r0, r1, r2, r3, t0, t1, t2, t3, end0, end1, end2, end3,
                  s0, s1, s2, s3, bv):
    """The ranks of :func:`_select4` left for the last, partial word; False if any is beyond."""
    big = np.int64(1) << 62
    m = base.size
    s = (m // 64) * 64
    if s < m and (r0 < big or r1 < big or r2 < big or r3 < big):
        h0 = np.uint64(0)
        h1 = np.uint64(0)
        h2 = np.uint64(0)
        for b in range(m - s):
            a = base[s + b] & mask
            bit = np.uint64(1) << np.uint64(b)
            if a >= e0:
                h0 |= bit
            if a >= e1:
                h1 |= bit
            if a >= e2:
                h2 |= bit
        valid = (np.uint64(1) << np.uint64(m - s)) - np.uint64(1)
        w0 = valid & ~h0
        w1 = h0 & ~h1
        w2 = h1 & ~h2
        r0, t0 = _place(w0, s, s0, s0 + np.int64(_popcount(w0)), r0, t0, end0, ranks, big, base, bv)
        r1, t1 = _place(w1, s, s1, s1 + np.int64(_popcount(w1)), r1, t1, end1, ranks, big, base, bv)
        r2, t2 = _place(w2, s, s2, s2 + np.int64(_popcount(w2)), r2, t2, end2, ranks, big, base, bv)
        r3, t3 = _place(h2, s, s3, s3 + np.int64(_popcount(h2)), r3, t3, end3, ranks, big, base, bv)
    return t0 == end0 and t1 == end1 and t2 == end2 and t3 == end3


@_jit
def _class_ranks(base, mask, edges, pos, cls):
    """Each change's rank among the members of its class (``cls[t]``) in the block: the members before
    ``pos[t]`` (increasing). One pass over the base, a 64-element word at a time, the class counts so far
    in an array and the word's class bitmaps compared (``_ge_mask64``) and dropped: a stored bitmap per
    class and its running counts (4-16 classes, read and written over the whole block) took twice as long
    on the corpus. ``base`` is contiguous."""
    n_classes = edges.size + 1
    nt = edges.size
    m = base.size
    c = pos.size
    full = m // 64
    seen = np.zeros(n_classes, np.int64)     # each class's members before the current word
    word = np.empty(n_classes, np.uint64)    # the current word's bitmap of each class
    ge = np.empty(max(nt, 1), np.uint64)     # its bitmaps of the elements at or above each threshold
    ranks = np.empty(c, np.int64)
    t = 0
    for w in range(full):
        s = w * 64
        lo = ~np.uint64(0)
        _ge_masks64(base, s, mask, edges, nt, ge)
        if t < c and pos[t] < s + 64:   # a change in this word: its class's bitmap is wanted
            for k in range(nt):
                hi = ge[k]
                word[k] = lo & ~hi
                lo = hi
            word[nt] = lo
            while t < c and pos[t] < s + 64:
                below = word[cls[t]] & ((np.uint64(1) << np.uint64(pos[t] - s)) - np.uint64(1))
                ranks[t] = seen[cls[t]] + np.int64(_popcount(below))
                t += 1
            for k in range(n_classes):
                seen[k] += np.int64(_popcount(word[k]))
        else:   # none: the counts alone, in registers (storing every word's bitmaps took twice as long)
            for k in range(nt):
                hi = ge[k]
                seen[k] += np.int64(_popcount(lo & ~hi))
                lo = hi
            seen[nt] += np.int64(_popcount(lo))
    while t < c:   # the last, partial word: element by element
        k = cls[t]
        r = seen[k]
        for i in range(full * 64, pos[t]):
            b = base[i] & mask
            inside = (k == 0 or b >= edges[k - 1]) and (k == nt or b < edges[k])
            r += np.int64(inside)
        ranks[t] = r
        t += 1
    return ranks


@_jit
def _bit_length(x):
    n = 0
    while x:
        x >>= 1
        n += 1
    return n


@_jit
def _rice_cost(g, lo, hi, r):
    cost = (hi - lo) * r
    for j in range(lo, hi):
        cost += g[j] >> r
    return cost


@_jit
def _best_rice(g, lo, hi, max_rice):
    """The smallest Rice parameter of least total bits for gaps ``g[lo:hi]``: a walk down (or up) the
    convex cost from the estimate ``log2(mean · ln 2)``, as the numpy twin does."""
    n = hi - lo
    gmax = 0
    total = 0
    for j in range(lo, hi):
        gmax = max(gmax, g[j])
        total += g[j]
    top = min(max_rice, _bit_length(gmax))
    mean = total / n
    r = 0
    if mean >= 1:
        r = min(top, max(0, int(np.log2(mean * np.log(2)))))
    c = _rice_cost(g, lo, hi, r)
    moved = False
    while r > 0:
        down = _rice_cost(g, lo, hi, r - 1)
        if down > c:
            break
        r, c, moved = r - 1, down, True
    if not moved:
        while r < top:
            up = _rice_cost(g, lo, hi, r + 1)
            if up >= c:
                break
            r, c = r + 1, up
    return r, c


@_jit
def _ctx_encode(base, target, pos, edges, mask, shift, emask, half, max_rice, dense, sign_axes, force_signs,
                sign_cost, p0tab, rc_limit, rc_planes, nbits, rp, rp_limit, hist, hoff, key):
    """A whole ctx-delta block (SPEC.md §8.6) once its thresholds are chosen: class order, ranks, gaps,
    each class's Rice parameter (the smallest of least cost), and the four streams.

    ``edges``: the thresholds shifted to the magnitude bits (empty array: one class). ``dense`` (one
    class): a ``dense-delta`` block (§8.7), whose Rice codes are the gaps of the unchanged elements.
    ``sign_axes`` (rows of ``axis, P, phase``): sign contexts of ``ctx-delta-as`` (§8.8) to size with
    ``sign_cost``; the one of least estimate is range-coded: the signs alone, or with ``rc_limit`` > 0
    the signs and magnitudes (``ctx-delta-rc``, §8.9; ``nbits``: the dtype's bits), given up (-1) where
    that passes ``rc_limit`` bytes. The magnitude planes are made only where they are used (with the
    range-coded magnitudes, only if ``rc_planes``). ``rp`` (with ``rc_limit``): 1 codes the gaps in
    the same stream first (``ctx-delta-rp``, §8.10, at most ``rp_limit`` bytes) where the model's
    estimate of them is below the Rice bits, 2 always. ``hist`` (with ``rc_limit``, not with ``rp``;
    else empty): the block's history (§7): each sign axis is sized with and without §8.11's history
    contexts too, and a choice of ``n`` axes or more (``n`` rows in ``sign_axes``) is axis
    ``choice - n`` coded with them (``ctx-delta-rh``). ``key`` (non-empty): the block's class keys
    (§8.12), which the thresholds split in place of the magnitude bits (``ctx-delta-rhp``).
    Returns ``(counts, rice, qbits, quotients, remainders, signs, mw, magnitude planes, sign axis
    chosen or -1, range-coded signs, -rp's Rice parameters or an empty array)``.
    """
    c = pos.size
    n_classes = edges.size + 1
    bv = np.empty(c, base.dtype)  # the changed elements, gathered once: later passes stay in cache
    tv = np.empty(c, target.dtype)
    for t in range(c):
        bv[t] = base[pos[t]]
        tv[t] = target[pos[t]]
    counts = np.zeros(n_classes, np.int64)
    cls = np.empty(c, np.uint8)
    keyed = key.size > 0
    for t in range(c):
        a = key[pos[t]] if keyed else bv[t] & mask
        cl: int | np.int64 = 0
        for e in range(n_classes - 1):   # thresholds at or below a (they increase): no data-dependent exit
            cl += np.int64(a >= edges[e])
        cls[t] = cl
        counts[cl] += 1
    first = np.zeros(n_classes + 1, np.int64)
    for k in range(n_classes):
        first[k + 1] = first[k] + counts[k]
    fill = first[:n_classes].copy()
    corder = np.empty(c, np.int64)  # corder[j]: the change (index into pos) j-th in class order
    for t in range(c):
        corder[fill[cls[t]]] = t
        fill[cls[t]] += 1
    g = np.empty(c, np.int64)
    if n_classes == 1:
        ranks = pos
    elif keyed:
        ranks = _class_ranks(key, mask, edges, pos, cls)
    else:
        ranks = _class_ranks(base, mask, edges, pos, cls)
    for k in range(n_classes):
        prev = -1
        for j in range(first[k], first[k + 1]):
            rank = ranks[corder[j]]
            g[j] = rank - prev - 1
            prev = rank
    coded = counts
    if dense:   # the gaps of the elements that did not change, in place of the changes' (one class)
        u = base.size - c
        coded = np.full(1, u, np.int64)
        g = np.empty(u, np.int64)
        prev = -1
        t = 0
        j = 0
        for i in range(base.size):
            if j < c and pos[j] == i:
                j += 1
                continue
            g[t] = i - prev - 1
            prev = i
            t += 1
        first = np.zeros(2, np.int64)
        first[1] = u
    rice = np.zeros(n_classes, np.int64)
    qbits = 0
    rbits = 0
    for k in range(n_classes):
        n = coded[k]
        if n == 0:
            continue
        r, cost = _best_rice(g, first[k], first[k + 1], max_rice)
        rice[k] = r
        qbits += n + cost - n * r
        rbits += n * r
    qbuf = np.zeros((qbits + 7) // 8, np.uint8)
    rbuf = np.zeros((rbits + 7) // 8, np.uint8)
    _rice_encode(g, coded, rice, qbuf, rbuf)
    sbuf = np.zeros((c + 7) // 8, np.uint8)
    top_mag = 0
    start = np.zeros(emask + 2, np.int64)
    for j in range(c):
        t = corder[j]
        d = _ordered(tv[t], half) - _ordered(bv[t], half)
        sbuf[j >> 3] |= np.uint8(np.int64(d < 0) << (j & 7))   # no branch on a coin toss
        top_mag = max(top_mag, abs(d) - 1)
        start[((bv[t] >> shift) & emask) + 1] += 1
    for x in range(emask + 1):
        start[x + 1] += start[x]
    mw = max(1, (_bit_length(top_mag) + 7) // 8)
    choice = -1
    coded = np.empty(0, np.uint8)
    if sign_axes.shape[0]:
        cpos = np.empty(c, np.int64)   # the changes' positions in class order: the order signs are coded in
        for j in range(c):
            cpos[j] = pos[corder[j]]
        choice = 0
        promising = True
        n_axes = sign_axes.shape[0]
        sh = hist if rc_limit > 0 and not rp else hist[:0]
        if n_axes > 1 or sh.size:   # (0, 1, 0), (1, P, phase)[, (2, P, phase)]: sized in one pass
            n = min(c, SIGN_SAMPLE)
            est = _sign_costs(sbuf, cpos[:n], base.size, sign_axes[n_axes - 1, 1], sign_axes[n_axes - 1, 2], n_axes,
                              sign_cost, p0tab, sh, hoff)
            if sh.size and force_signs:   # (a forced ctx-delta-rh: the history contexts)
                choice = n_axes
            for i in range(choice, est.size):
                if est[i] < est[choice]:
                    choice = i
            if choice >= n_axes and not force_signs:   # the history's contexts must pay for its hash
                best = 0
                for i in range(1, n_axes):
                    if est[i] < est[best]:
                        best = i
                if est[choice] + HISTORY_COST_BITS >= est[best]:
                    choice = best
            promising = force_signs or est[choice] < SIGN_PROMISING * n   # else no coding pass
        axis_i = choice % n_axes
        used = sh if choice >= n_axes else hist[:0]
        if rc_limit > 0:
            use_rp = False
            rp_rice = rice.copy()   # -rp's own Rice parameters: ctx-delta's streams keep ``rice``
            if rp:
                est = _rp_rice(g, counts, rp_rice, sign_cost, p0tab)
                use_rp = rp == 2 or est < qbits + rbits
            limit = rp_limit if use_rp else rc_limit
            coded = _rc_encode(bv, tv, corder, cpos, base.size, sign_axes[axis_i, 0], sign_axes[axis_i, 1],
                               sign_axes[axis_i, 2], shift, emask, half, nbits, p0tab, limit, g, counts, rp_rice,
                               use_rp, used, hoff)
            if not use_rp:
                rp_rice = rp_rice[:0]
            if coded.size > limit:
                choice = -1
            elif not rc_planes:
                return counts, rice, qbits, qbuf, rbuf, sbuf, mw, np.empty(0, np.uint8), choice, coded, rp_rice
            else:
                return counts, rice, qbits, qbuf, rbuf, sbuf, mw, _planes(bv, tv, corder, start, c, mw, shift, emask,
                                                                         half), choice, coded, rp_rice
        elif promising:
            coded = _sign_encode(sbuf, cpos, base.size, sign_axes[choice, 0], sign_axes[choice, 1],
                                 sign_axes[choice, 2], p0tab)
        else:
            choice = -1
    planes = _planes(bv, tv, corder, start, c, mw, shift, emask, half)
    return counts, rice, qbits, qbuf, rbuf, sbuf, mw, planes, choice, coded, rice[:0]


@_jit
def _planes(bv, tv, corder, start, c, mw, shift, emask, half):
    """ctx-delta's magnitude planes (``start``: each exponent field's first slot, advanced here)."""
    planes = np.empty(c * mw, np.uint8)
    for j in range(c):  # magnitude order: class order sorted stably by the base's exponent field
        t = corder[j]
        x = (bv[t] >> shift) & emask
        at = start[x]
        start[x] += 1
        v = abs(_ordered(tv[t], half) - _ordered(bv[t], half)) - 1
        for b in range(mw):
            planes[b * c + at] = np.uint8((v >> (8 * b)) & 0xFF)
    return planes


@_jit
def _rp_rice(g, counts, rice, cost, p0tab):
    """Each class's Rice parameter for §8.10, in place: ``ctx-delta``'s (``rice``) or one less, whichever
    the model's estimate makes the smaller (a modelled quotient bit can cost less than the field's
    raw top bit). Returns the estimated bits of the gaps with them."""
    est = 0.0
    lo = 0
    for k in range(counts.size):
        hi = lo + counts[k]
        if hi > lo:
            best = _rp_cost(g, lo, hi, rice[k], cost, p0tab)
            if rice[k] > 0:
                down = _rp_cost(g, lo, hi, rice[k] - 1, cost, p0tab)
                if down < best:
                    best = down
                    rice[k] -= 1
            est += best
        lo = hi
    return est


@_jit
def _rp_cost(g, lo, hi, rk, cost, p0tab):
    """Estimated bits of one class's gaps ``g[lo:hi]`` coded as §8.10 codes them with Rice parameter
    ``rk``: the sum of ``cost`` (``-log2`` of the model's probability) over the modelled bits, one bit
    each for the rest (every class has contexts of its own)."""
    qcounts = np.zeros(2 * RC_LENGTHS, np.uint16)
    fcounts = np.zeros(2, np.uint16)
    est = 0.0
    for i in range(lo, hi):
        gi = g[i]
        q = gi >> rk
        for j in range(q + 1):
            u = min(j, RC_LENGTHS - 1)
            e = np.int64(j == q)
            est += cost[e, _sign_p0(qcounts, u, p0tab)]
            _sign_update(qcounts, u, e)
        if rk:
            e = (gi >> (rk - 1)) & 1
            est += cost[e, _sign_p0(fcounts, 0, p0tab)] + (rk - 1)
            _sign_update(fcounts, 0, e)
    return est


# ---------------------------------------------------------------------- ctx-delta-as signs (§8.8)



@_jit
def _sign_contexts(m, axis, period, phase):
    """How many contexts a block's signs have."""
    if axis == 0:
        return 1
    if axis == 1:
        return (m - 1 + phase) // period + 1
    return period


@_jit
def _sign_context(p, axis, period, phase):
    if axis == 0:
        return 0
    if axis == 1:
        return (p + phase) // period
    return (p + phase) % period


@_jit
def _sign_p0(counts, x, p0tab):
    """The probability (of 4096) that the next sign of context ``x`` is 0 (``p0tab``: by n0 · 256 + n1)."""
    return np.int64(p0tab[(np.int64(counts[2 * x]) << 8) | np.int64(counts[2 * x + 1])])


@_jit
def _sign_update(counts, x, s):
    """After a bit ``s`` in context ``x``: its count grows, both are halved at 256. Counts are uint16
    (a context per element, rows of one element, is 4 bytes an element: an int32 pair took 8)."""
    counts[2 * x + s] += 1
    if counts[2 * x] + counts[2 * x + 1] == 256:
        counts[2 * x] = (counts[2 * x] + 1) >> 1
        counts[2 * x + 1] = (counts[2 * x + 1] + 1) >> 1


@_jit
def _sign_costs(sbuf, cpos, m, period, phase, n_axes, cost, p0tab, hist, hoff):
    """Estimated bits of the signs (class order, bit ``j`` of ``sbuf``) in one context, per row and
    (``n_axes`` 3) per column of ``period``, in one pass (one division a sign gives row and column):
    ``cost[s, p0]`` is ``-log2`` of the model's probability of ``s``. With a history (``hist``, the
    block's, §7), the same ``n_axes`` again, each context split by the element's history (§8.11)."""
    one = np.zeros(2, np.uint16)
    rows = np.zeros(2 * _sign_contexts(m, 1, period, phase) if n_axes > 1 else 2, np.uint16)
    cols = np.zeros(2 * period if n_axes > 2 else 2, np.uint16)
    h = hist.size > 0
    one_h = np.zeros(6 if h else 0, np.uint16)
    rows_h = np.zeros(3 * rows.size if h else 0, np.uint16)
    cols_h = np.zeros(3 * cols.size if h else 0, np.uint16)
    est = np.zeros(2 * n_axes if h else n_axes)
    for j in range(cpos.size):
        q = cpos[j] + phase
        r = q // period
        s = np.int64((sbuf[j >> 3] >> (j & 7)) & 1)
        est[0] += cost[s, _sign_p0(one, 0, p0tab)]
        _sign_update(one, 0, s)
        if n_axes > 1:
            est[1] += cost[s, _sign_p0(rows, r, p0tab)]
            _sign_update(rows, r, s)
        x = q - r * period
        if n_axes > 2:
            est[2] += cost[s, _sign_p0(cols, x, p0tab)]
            _sign_update(cols, x, s)
        if h:
            e = _hcode(hist, hoff, cpos[j])
            est[n_axes] += cost[s, _sign_p0(one_h, e, p0tab)]
            _sign_update(one_h, e, s)
            if n_axes > 1:
                est[n_axes + 1] += cost[s, _sign_p0(rows_h, 3 * r + e, p0tab)]
                _sign_update(rows_h, 3 * r + e, s)
            if n_axes > 2:
                est[n_axes + 2] += cost[s, _sign_p0(cols_h, 3 * x + e, p0tab)]
                _sign_update(cols_h, 3 * x + e, s)
    return est


@_jit
def _sign_encode(sbuf, cpos, m, axis, period, phase, p0tab):
    """The range coder of §8.8 (LZMA's) over the signs: the stream's bytes."""
    c = cpos.size
    out = np.empty(2 * c + 8, np.uint8)   # the most §8.8 allows; the model never spends 9.01 bits on a sign
    counts = np.zeros(2 * _sign_contexts(m, axis, period, phase), np.uint16)
    low, cache, pending, w = np.int64(0), np.int64(0), np.int64(1), np.int64(0)   # low: 33 bits
    rng = np.int64(0xFFFFFFFF)
    for j in range(c):
        x = _sign_context(cpos[j], axis, period, phase)
        s = np.int64((sbuf[j >> 3] >> (j & 7)) & 1)
        bound = (rng >> 12) * _sign_p0(counts, x, p0tab)
        low += s * bound                     # no branch: signs are near coin tosses
        rng = bound + s * (rng - 2 * bound)  # s = 0: bound; s = 1: rng - bound
        _sign_update(counts, x, s)
        while rng < (1 << 24):
            rng <<= 8
            low, cache, pending, w = _rc_shift(low, cache, pending, w, out)
    for _ in range(5):
        low, cache, pending, w = _rc_shift(low, cache, pending, w, out)
    return out[:min(w, out.size)].copy()


@_jit
def _rc_shift(low, cache, pending, w, out):
    """LZMA's shift of the low byte out, carries included: the new ``low, cache, pending, written``
    (bytes past ``out`` are counted, not written)."""
    if low < 0xFF000000 or low >= (1 << 32):
        carry = low >> 32
        temp = cache
        while pending:
            if w < out.size:
                out[w] = np.uint8((temp + carry) & 0xFF)
            w += 1
            temp = np.int64(0xFF)
            pending -= 1
        cache = (low >> 24) & 0xFF
    pending += 1
    low = (low & 0x00FFFFFF) << 8
    return low, cache, pending, w


@_jit
def _rc_code(buf):
    """The range decoder's first code (§8.8): bytes 1-4 of its stream, big-endian."""
    return np.int64(buf[1]) << 24 | np.int64(buf[2]) << 16 | np.int64(buf[3]) << 8 | np.int64(buf[4])


@_jit
def _sign_start(sbuf):
    """The range decoder's start (§8.8, at §8.6 step 2): a 0 byte, then a code below 2^32 − 1."""
    if sbuf[0] != 0:
        return S_FIRST
    if _rc_code(sbuf) == 0xFFFFFFFF:
        return S_CODE
    return OK


@_jit
def _sign_decode(sbuf, pos, m, axis, period, phase, bits, p0tab):
    """The signs of the changes at ``pos`` (class order) into ``bits`` (zeroed), as §8.8 decodes them."""
    n = sbuf.size
    code = _rc_code(sbuf)
    rng = np.int64(0xFFFFFFFF)
    r = 5
    counts = np.zeros(2 * _sign_contexts(m, axis, period, phase), np.uint16)
    for t in range(pos.size):
        x = _sign_context(pos[t], axis, period, phase)
        bound = (rng >> 12) * _sign_p0(counts, x, p0tab)
        s = np.int64(code >= bound)
        code -= s * bound
        rng = bound + s * (rng - 2 * bound)
        while rng < (1 << 24):
            if r >= n:
                return S_PAST
            rng <<= 8
            code = (code << 8) | np.int64(sbuf[r])
            r += 1
        bits[t >> 3] |= np.uint8(s << (t & 7))
        _sign_update(counts, x, s)
    if r != n:
        return S_LENGTH
    return OK


# ------------------------------------------------------------ ctx-delta-rc signs and magnitudes (§8.9)
RC_LENGTHS = 16   # length and bit contexts per exponent field value: U(x, j), V(x, j), j ≤ 15


@_jit
def _rc_encode(bv, tv, corder, cpos, m, axis, period, phase, shift, emask, half, nbits, p0tab, limit, g, counts,
               rice, rp, hist, hoff):
    """§8.9's changes stream: each change's sign (in its context of ``axis``, ``P``, ``phase``), bit
    length (unary, in length contexts of its base's exponent field) and the bits below its top one
    (the first in a bit context, the rest of probability one half), in class order (``corder`` into
    ``bv``/``tv``; ``cpos``: their positions). More than ``limit`` bytes: stops, returning
    ``limit + 1`` of them (the caller writes the block in another encoding). With ``rp``, §8.10's
    stream: first the gaps ``g`` (class order; ``counts`` and ``rice`` per class), each as its Rice
    quotient in unary in contexts G(k, j) and its field, the top bit in F(k). With a history (``hist``,
    the block's, §7: else empty), §8.11's sign contexts, ``3j + h``.

    Two passes per chunk of changes: the first lists each bit with its context, the second codes the
    list. Why: coded as they are found, a bit's context and whether it is coded at all depend on the
    bit lengths, whose branches the CPU mispredicts (55 ns a change; 30 ns in two passes).
    """
    out = np.empty(limit + 1, np.uint8)
    width = RC_LENGTHS * (emask + 1)
    fixed = 2 * width             # a context of p0 = 2048 that is never updated: the bits of one half
    n_classes = counts.size
    first_q = fixed + 1           # G(k, j), then F(k) (§8.10)
    first_f = first_q + RC_LENGTHS * n_classes
    first_sign = first_f + n_classes   # the sign contexts follow
    h = hist.size > 0
    ctx = np.zeros(2 * (first_sign + (3 if h else 1) * _sign_contexts(m, axis, period, phase)), np.uint16)
    chunk = 1024
    bits = np.empty(chunk * (2 * nbits + 2), np.int64)   # (context << 1) | bit; at most 2 B + 1 bits a change
    low, rng, cache, pending, w = np.int64(0), np.int64(0xFFFFFFFF), np.int64(0), np.int64(1), np.int64(0)
    c = corder.size
    n_gaps = c if rp else 0
    kc = 0                     # the class of the next gap, and where the class after it starts
    kc_end = counts[0]
    for lo in range(0, n_gaps + c, chunk):
        hi = min(lo + chunk, n_gaps + c)
        if lo < n_gaps:   # a chunk of gaps: a long quotient can take more bits than the list holds
            need = (hi - min(hi, n_gaps)) * (2 * nbits + 2)
            kk, kk_end = kc, kc_end
            for i in range(lo, min(hi, n_gaps)):
                while i >= kk_end:
                    kk += 1
                    kk_end += counts[kk]
                need += (g[i] >> rice[kk]) + 1 + rice[kk]
            if need > bits.size:
                bits = np.empty(need, np.int64)
        nb = 0
        for i in range(lo, min(hi, n_gaps)):
            while i >= kc_end:
                kc += 1
                kc_end += counts[kc]
            rk = rice[kc]
            gi = g[i]
            q = gi >> rk
            for j in range(q + 1):   # q zeros, then the 1 that ends the quotient
                bits[nb] = ((first_q + kc * RC_LENGTHS + min(j, RC_LENGTHS - 1)) << 1) | np.int64(j == q)
                nb += 1
            if rk:
                bits[nb] = ((first_f + kc) << 1) | ((gi >> (rk - 1)) & 1)
                nb += 1
                for b in range(rk - 2, -1, -1):
                    bits[nb] = (fixed << 1) | ((gi >> b) & 1)
                    nb += 1
        for j in range(max(lo, n_gaps) - n_gaps, hi - n_gaps):
            t = corder[j]
            d = _ordered(tv[t], half) - _ordered(bv[t], half)
            s = np.int64(d < 0)
            a = -d if s else d
            sx = _sign_context(cpos[j], axis, period, phase)
            if h:
                sx = 3 * sx + _hcode(hist, hoff, cpos[j])
            bits[nb] = ((first_sign + sx) << 1) | s
            nb += 1
            x = np.int64((bv[t] >> shift) & emask) * RC_LENGTHS
            n = _bit_length(a)
            for k in range(1, n + 1):   # n - 1 zeros, then the 1 that ends the length
                bits[nb] = ((x + min(k - 1, RC_LENGTHS - 1)) << 1) | np.int64(k == n)
                nb += 1
            if n >= 2:
                bits[nb] = ((width + x + min(n - 2, RC_LENGTHS - 1)) << 1) | ((a >> (n - 2)) & 1)
                nb += 1
                for k in range(n - 3, -1, -1):
                    bits[nb] = (fixed << 1) | ((a >> k) & 1)
                    nb += 1
        for i in range(nb):
            ci = bits[i] >> 1
            e = bits[i] & 1
            n0 = np.int64(ctx[2 * ci])
            n1 = np.int64(ctx[2 * ci + 1])
            live = np.int64(ci != fixed)
            ctx[2 * ci + e] += live
            if n0 + n1 + live == 256:
                ctx[2 * ci] = (ctx[2 * ci] + 1) >> 1
                ctx[2 * ci + 1] = (ctx[2 * ci + 1] + 1) >> 1
            # the coder's step (LZMA's, :func:`_rc_shift` inlined), written out here: through helpers
            # returning its state it took three times as long, calling _rc_shift alone 15-20 % longer
            bound = (rng >> 12) * np.int64(p0tab[(n0 << 8) | n1])
            low += e * bound
            rng = bound + e * (rng - 2 * bound)
            while rng < (1 << 24):
                rng <<= 8
                if low < 0xFF000000 or low >= (1 << 32):
                    carry = low >> 32
                    temp = cache
                    while pending:
                        if w < out.size:
                            out[w] = np.uint8((temp + carry) & 0xFF)
                        w += 1
                        temp = np.int64(0xFF)
                        pending -= 1
                    cache = (low >> 24) & 0xFF
                pending += 1
                low = (low & 0x00FFFFFF) << 8
        if w > limit:
            return out.copy()
    for _ in range(5):
        low, cache, pending, w = _rc_shift(low, cache, pending, w, out)
    return out[:min(w, out.size)].copy()


@_jit
def _rc_bit(buf, code, rng, r, p0):
    """One bit of probability ``p0`` from the range decoder (§8.8): ``(bit, code, range, bytes read)``,
    the bit -1 where it would read past ``buf``."""
    bound = (rng >> 12) * p0
    bit = np.int64(code >= bound)
    if bit:
        code -= bound
        rng -= bound
    else:
        rng = bound
    while rng < (1 << 24):
        if r >= buf.size:
            return np.int64(-1), code, rng, r
        rng <<= 8
        code = (code << 8) | np.int64(buf[r])
        r += 1
    return bit, code, rng, r


@_jit
def _rp_ranks(buf, counts, rice, m, ranks, p0tab):
    """§8.10 step 2: each class's gaps from the range decoder (started: ``buf`` checked by
    :func:`_sign_start`) → member ranks, concatenated in class order. Returns ``status, code, rng, r``:
    the decoder's state for the changes that follow."""
    code = _rc_code(buf)
    rng = np.int64(0xFFFFFFFF)
    r = 5
    n_classes = counts.size
    qcounts = np.zeros(2 * RC_LENGTHS * n_classes, np.uint16)   # G(k, j)
    fcounts = np.zeros(2 * n_classes, np.uint16)                # F(k)
    idx = 0
    for k in range(n_classes):
        rk = rice[k]
        prev = np.int64(-1)
        for _ in range(counts[k]):
            q = np.int64(0)
            while True:
                u = k * RC_LENGTHS + min(int(q), RC_LENGTHS - 1)
                e, code, rng, r = _rc_bit(buf, code, rng, r, _sign_p0(qcounts, u, p0tab))
                if e < 0:
                    return S_PAST, code, rng, r
                _sign_update(qcounts, u, e)
                if e:
                    break
                q += 1
                if prev + 1 + (q << rk) >= m:
                    return BEYOND, code, rng, r
            f = np.int64(0)
            if rk:
                f, code, rng, r = _rc_bit(buf, code, rng, r, _sign_p0(fcounts, k, p0tab))
                if f < 0:
                    return S_PAST, code, rng, r
                _sign_update(fcounts, k, f)
                for _ in range(rk - 1):
                    e, code, rng, r = _rc_bit(buf, code, rng, r, 2048)
                    if e < 0:
                        return S_PAST, code, rng, r
                    f = 2 * f + e
            prev += (q << rk) + f + 1
            if prev >= m:
                return BEYOND, code, rng, r
            ranks[idx] = prev
            idx += 1
    return OK, code, rng, r


@_jit
def _rc_decode(buf, pos, bv, nv, m, axis, period, phase, shift, emask, half, nbits, p0tab, code, rng, r, hist, hoff):
    """§8.9's changes: for each change at ``pos`` (class order, its base value in ``bv``) its sign,
    bit length and magnitude, its new value into ``nv``, checked: OK or the first failed check. The
    range decoder goes on from ``code, rng, r`` (its start, or where §8.10's gaps left it). With a
    history (``hist``, the block's, §7: else empty), §8.11's sign contexts, ``3j + h``."""
    h = hist.size > 0
    scounts = np.zeros(2 * (3 if h else 1) * _sign_contexts(m, axis, period, phase), np.uint16)
    ucounts = np.zeros(2 * RC_LENGTHS * (emask + 1), np.uint16)
    vcounts = np.zeros(2 * RC_LENGTHS * (emask + 1), np.uint16)
    for t in range(pos.size):
        b = bv[t]
        sx = _sign_context(pos[t], axis, period, phase)
        if h:
            sx = 3 * sx + _hcode(hist, hoff, pos[t])
        s, code, rng, r = _rc_bit(buf, code, rng, r, _sign_p0(scounts, sx, p0tab))
        if s < 0:
            return S_PAST
        _sign_update(scounts, sx, s)
        x = np.int64((b >> shift) & emask) * RC_LENGTHS
        n = 1
        while True:
            u = x + min(n - 1, RC_LENGTHS - 1)
            e, code, rng, r = _rc_bit(buf, code, rng, r, _sign_p0(ucounts, u, p0tab))
            if e < 0:
                return S_PAST
            _sign_update(ucounts, u, e)
            if e:
                break
            if n == nbits:
                return M_LONG
            n += 1
        a = np.int64(1)
        if n >= 2:
            u = x + min(n - 2, RC_LENGTHS - 1)
            e, code, rng, r = _rc_bit(buf, code, rng, r, _sign_p0(vcounts, u, p0tab))
            if e < 0:
                return S_PAST
            _sign_update(vcounts, u, e)
            a = 2 + e
            for _ in range(n - 2):
                e, code, rng, r = _rc_bit(buf, code, rng, r, 2048)
                if e < 0:
                    return S_PAST
                a = 2 * a + e
        v = _ordered(b, half) + (-a if s else a)
        if v < -half or v >= half:
            return RANGE
        nv[t] = _unordered(v, half)
    if r != buf.size:
        return S_LENGTH
    return OK


@_jit
def _scatter(flat, index, values):
    for k in range(index.size):
        flat[index[k]] = values[k]


@_jit
def _changes(base, target):
    """Indices where ``base`` and ``target`` differ (``np.flatnonzero(base != target)``), from a
    bitmap built 64 elements at a time (:func:`_ne_mask64`), without the GIL."""
    m = base.size
    full = m // 64
    words = np.empty(full + 1, np.uint64)
    n: int | np.uint64 = 0  # numba unifies it with _popcount's uint64
    for w in range(full):
        x = _ne_mask64(base, target, w * 64)
        words[w] = x
        n += _popcount(x)
    x = np.uint64(0)
    for i in range(full * 64, m):
        x |= np.uint64(base[i] != target[i]) << np.uint64(i - full * 64)
    words[full] = x
    n += _popcount(x)
    out = np.empty(n, np.int64)
    j = 0
    for w in range(full + 1):
        x = words[w]
        while x:
            out[j] = w * 64 + np.int64(_trailing_zeros(x))
            j += 1
            x &= x - np.uint64(1)
    return out


@_jit
def _class_cuts(ne, ce, max_classes, overhead):
    """The exponent-class DP of ``ctx_delta.choose_thresholds``, operation for operation (same float
    expressions in the same order, first minimum on ties), so both give the same thresholds.

    ``ne``/``ce``: elements and changes per exponent field value. Returns the thresholds (field values)
    and the estimated position bits of their classes (with ``overhead`` for each class after the first).
    """
    L = 0
    for x in range(ne.size):
        if ne[x]:
            L += 1
    idx = np.empty(L, np.int64)
    L = 0
    for x in range(ne.size):
        if ne[x]:
            idx[L] = x
            L += 1
    N = np.zeros(L + 1, np.float64)
    C = np.zeros(L + 1, np.float64)
    n_acc = 0
    c_acc = 0
    for i in range(L):
        n_acc += ne[idx[i]]
        c_acc += ce[idx[i]]
        N[i + 1] = n_acc
        C[i + 1] = c_acc
    ln2 = np.log(2.0)
    cost = np.empty((L + 1, L + 1), np.float64)
    for i in range(L + 1):
        for j in range(L + 1):
            if i >= j:
                cost[i, j] = np.inf  # a class covers at least one exponent
                continue
            n = N[j] - N[i]
            c = C[j] - C[i]
            if c > 0:
                mu = max(n - c, 0.0) / c
                r0 = np.floor(np.log2(max(mu * ln2, 1.0)))
                r1 = r0 + 1
                a = c * (1 + r0 + mu / np.exp2(r0))
                b = c * (1 + r1 + mu / np.exp2(r1))
                cost[i, j] = min(a, b)
            else:
                cost[i, j] = 0.0
    dp = cost[0].copy()
    best_k = 1
    best_total = dp[L] if L else 0.0
    if L < 2:
        return np.empty(0, np.int64), best_total
    top = min(max_classes, L)
    back = np.zeros((max(top - 1, 1), L + 1), np.int64)
    new = np.empty(L + 1, np.float64)
    for k in range(2, top + 1):
        for j in range(L + 1):
            bi = 0
            bv = dp[0] + cost[0, j]
            for i in range(1, j):   # (cost[i, j] is infinite from i = j on: a class covers an exponent)
                v = dp[i] + cost[i, j]
                if v < bv:
                    bv = v
                    bi = i
            new[j] = bv
            back[k - 2, j] = bi
        dp[:] = new
        if dp[L] + (k - 1) * overhead < best_total:
            best_k = k
            best_total = dp[L] + (k - 1) * overhead
    cuts = np.empty(best_k - 1, np.int64)
    j = L
    for k in range(best_k, 1, -1):
        j = back[k - 2, j]
        cuts[k - 2] = idx[j]
    return cuts, best_total
