"""A tensor's history (SPEC.md §7, 1.9): the direction of each element's change at the previous step.

A file written with the previous step may code a tensor's signs in contexts of its history
(``ctx-delta-rh``, §8.11); its ``TENS`` record then names the previous value by ``previous_hash``. A
decoder needs, for such a tensor, either the previous value itself or a :class:`History` kept from the
step before (a follower has both the previous value and the base when it applies a step, and keeps
the history, two bits a weight, instead of a second copy of the model). Either is checked against the
record before any block is decoded (:func:`checked`): a wrong previous step is refused
(``wrong_base``), never misread; a block's codes are made where it is decoded (:meth:`Source.codes`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from . import backend
from .arrays import as_uint
from .dtypes import DType
from .errors import InputError, MissingPreviousError, WrongBaseError
from .integrity import tensor_hash


def packed_codes(dt: DType, previous_u: np.ndarray, base_u: np.ndarray) -> np.ndarray:
    """``h`` of §7 for every element, packed (:func:`pack`): 0 where ``previous == base`` (bit
    patterns), 1 where the base is above the previous value in ``ord`` (§8.6), 2 where below.

    Made chunk by chunk: where a sample of a chunk says few differ, a compare pass plus the codes of
    those (a 2M-element BF16 block at 0.5 % changed: 0.72 ms) beats a code for every element (1.04
    ms); where many differ, the positions' pass costs more than it saves (3.3 against 0.9 ms with
    every element changed) and is skipped."""
    be = backend.selected()
    n = base_u.size
    packed = np.zeros((n + 3) // 4, np.uint8)
    for s in range(0, n, _CODES_CHUNK):
        e = min(n, s + _CODES_CHUNK)
        p, b = previous_u[s:e], base_u[s:e]
        sampled = np.count_nonzero(p[::_SAMPLE] != b[::_SAMPLE])
        if sampled * _SAMPLE * _DENSE_ABOVE > e - s:
            be.history(dt, p, b, packed[s // 4: (e + 3) // 4])   # s is a multiple of 4: whole bytes
        else:
            be.history_at(dt, packed, s, be.changes(p, b), p, b)
    return packed


_CODES_CHUNK = 1 << 18   # elements a chunk (a multiple of 4)
_SAMPLE = 509            # a chunk's density is estimated on every 509th element (a few cache lines)
_DENSE_ABOVE = 32        # a chunk with more than 1/32 of its elements changed gets a code for every element


def pack(c: np.ndarray) -> np.ndarray:
    """Codes (uint8, each 0-2) four to a byte, element ``i`` in bits ``2 (i mod 4)`` of byte ``i // 4``."""
    n = c.size
    padded = np.zeros(-(-n // 4) * 4, np.uint8)
    padded[:n] = c
    q = padded.reshape(-1, 4)
    out: np.ndarray = q[:, 0] | (q[:, 1] << 2) | (q[:, 2] << 4) | (q[:, 3] << 6)
    return out


def unpack(packed: np.ndarray, start: int, end: int) -> np.ndarray:
    """Elements ``start`` to ``end`` of packed codes (:func:`pack`), one uint8 each."""
    p = packed[start // 4: -(-end // 4)]
    out = np.empty((p.size, 4), np.uint8)
    for k in range(4):
        np.bitwise_and(p >> (2 * k), 3, out=out[:, k])
    first = start % 4
    return out.reshape(-1)[first: first + end - start]


def _all_below_three(packed: np.ndarray) -> bool:
    """No 2-bit field of ``packed`` is 3 (the codes are 0, 1 or 2)."""
    return not bool(np.any(packed & (packed >> 1) & 0x55))


@dataclass(frozen=True)
class History:
    """What a decoder keeps of a tensor's previous step instead of its value: the codes of §7 (two bits
    each, :func:`pack`) between the value of hash ``previous_hash`` and the one of hash ``base_hash``
    (the base of the next file), for a tensor of ``dtype`` and ``shape``. A ``TENS`` record with HISTORY
    accepts it only where both hashes and the dtype and shape are the record's."""

    dtype: DType
    shape: tuple[int, ...]
    previous_hash: int
    base_hash: int
    packed: np.ndarray   # uint8, ceil(n / 4) bytes

    @classmethod
    def between(cls, previous: object, base: object) -> History:
        """The history from ``previous`` to ``base`` (arrays of one dtype and shape; InputError else)."""
        pdt, pshape, pu = as_uint(previous)
        bdt, bshape, bu = as_uint(base)
        if pdt is not bdt or tuple(pshape) != tuple(bshape):
            raise InputError(f"previous value {pdt.name}{list(pshape)} and base {bdt.name}{list(bshape)} differ "
                             f"in dtype or shape")
        return cls(bdt, tuple(int(d) for d in bshape), tensor_hash(pu), tensor_hash(bu), packed_codes(bdt, pu, bu))

    @property
    def size(self) -> int:
        """The tensor's element count (the number of codes)."""
        n = 1
        for d in self.shape:
            n *= d
        return n

    def codes(self, start: int = 0, end: int | None = None) -> np.ndarray:
        """The codes of elements ``start`` to ``end`` (all by default), one uint8 each."""
        return unpack(self.packed, start, self.size if end is None else end)

    def block(self, start: int, end: int) -> tuple[np.ndarray, int]:
        """Elements ``start`` to ``end`` as the kernels take them: ``(packed bytes, offset of start)``."""
        return self.packed[start // 4: -(-end // 4)], start % 4


class Source:
    """Where a tensor's block codes come from once its previous step is checked: kept codes, or the
    previous value and the base (computed block by block, on the thread that decodes the block, so a
    whole model's codes are never held at once)."""

    def __init__(self, dt: DType, history: History | None = None, previous_u: np.ndarray | None = None,
                 base_u: np.ndarray | None = None) -> None:
        self.dt, self.history, self.previous_u, self.base_u = dt, history, previous_u, base_u

    def codes(self, start: int, end: int) -> tuple[np.ndarray, int]:
        """Elements ``start`` to ``end``, as the kernels take them (:meth:`History.block`)."""
        if self.history is not None:
            return self.history.block(start, end)
        assert self.previous_u is not None and self.base_u is not None
        return packed_codes(self.dt, self.previous_u[start:end], self.base_u[start:end]), 0


def checked(th: Any, base_u: np.ndarray | None, previous: object) -> Source | None:
    """§12.3 step 1 for a tensor with HISTORY (1.9), after its base: the :class:`Source` of its codes,
    from the previous step it names — a :class:`History` kept for this base, or the previous value
    itself — or None for a tensor without HISTORY (``previous`` is then not looked at). A History made
    by hand is copied and checked before use: the kernels index contexts by its codes."""
    if not th.needs_history:
        return None
    assert base_u is not None, "HISTORY comes with NEEDS_BASE (records.parse_tensor)"
    if previous is None:
        raise MissingPreviousError(f"tensor {th.name!r} needs the previous step (its value before the base), "
                                   f"which was not given")
    if isinstance(previous, History):
        kept = previous if type(previous) is _Kept else _own_copy(previous, th.name)
        dt, shape, got = kept.dtype, kept.shape, kept.previous_hash
    else:
        dt, shape, u = as_uint(previous)
        got = None
    if dt is not th.dtype or tuple(shape) != th.shape:
        raise WrongBaseError(f"previous tensor {th.name!r} is {dt.name}{list(shape)}, the file expects "
                             f"{th.dtype.name}{list(th.shape)}")
    if got is None:
        got = tensor_hash(u)
    if got != th.previous_hash:
        raise WrongBaseError(f"previous tensor {th.name!r} is not the previous step this delta was made with "
                             f"(hash {got:016x}, expected {th.previous_hash:016x})")
    if isinstance(previous, History):
        if kept.base_hash != th.base_hash:
            raise WrongBaseError(f"the history kept for tensor {th.name!r} leads to another base")
        return Source(th.dtype, history=kept)
    return Source(th.dtype, previous_u=u, base_u=base_u)


@dataclass(frozen=True)
class _Kept(History):
    """A History this package made itself, from a verified step (:class:`Recorder`, :func:`unchanged`):
    its codes are 0, 1 or 2 and of its tensor's length by construction, read-only, and held by no
    caller, so a follower's next step uses it as it is. Copying and checking every code of every
    tensor each step (:func:`_own_copy`, for one made by hand) was two passes over a quarter of the
    model's element count a step."""


def _own_copy(h: History, name: str) -> History:
    """``h`` with its fields checked and its codes copied into a private, read-only array."""
    from .dtypes import DType as _DType
    ok_ints = all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 1 << 64
                  for x in (h.previous_hash, h.base_hash))
    ok_shape = isinstance(h.shape, tuple) and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                                  for d in h.shape)
    if not (isinstance(h.dtype, _DType) and ok_ints and ok_shape):
        raise InputError(f"the history of tensor {name!r} is not a History of a dtype, a shape and two 64-bit "
                         f"hashes")
    try:
        packed = np.array(h.packed, dtype=np.uint8, copy=True, subok=False).reshape(-1)
    except (TypeError, ValueError) as exc:
        raise InputError(f"the history of tensor {name!r}: its codes are not bytes ({exc})") from None
    if packed.size != -(-_count(h.shape) // 4) or not _all_below_three(packed):
        raise InputError(f"the history of tensor {name!r} is not {_count(h.shape)} codes of 0, 1 or 2, "
                         f"packed four to a byte")
    packed.flags.writeable = False
    return History(h.dtype, h.shape, h.previous_hash, h.base_hash, packed)


def _count(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


class Recorder:
    """A pipeline sink around another (:mod:`arcfmt.pipeline`) that keeps the history of every tensor
    it rebuilds from a base: what a follower needs for the next step's file (SPEC.md S9.1). Each
    block's codes come from its base block and its rebuilt block as they pass; ``histories`` holds a
    tensor's :class:`History` once the inner sink has committed it (verified)."""

    def __init__(self, inner: Any, record: bool = True) -> None:
        self.inner, self.record = inner, record
        self.histories: dict[str, History] = {}

    def __getattr__(self, name: str) -> Any:   # the inner sink's other hooks (needs_drain, ...)
        return getattr(self.inner, name)

    def open(self, th: Any) -> Any:
        out = self.inner.open(th)
        if th.base_hash is None or not self.record:
            return out
        return _Recording(out, th, self.histories, coded(th.dtype))


def coded(dt: DType) -> bool:
    """Whether a tensor of ``dt`` can have blocks that read its history (those of ``ctx-delta-rh``,
    §8.11). Another may carry HISTORY (§7), whose previous step is then checked by its hashes only: its
    kept history has every code 0."""
    from .encodings import registry
    return registry.by_name("ctx-delta-rh").defined_for(dt)


class _Recording:
    """One tensor's output, its history noted block by block."""

    def __init__(self, out: Any, th: Any, into: dict[str, History], compute: bool) -> None:
        self.out, self.th, self.into, self.compute = out, th, into, compute
        self.packed = np.zeros(-(-th.size // 4), np.uint8)
        self.bases: dict[int, np.ndarray | None] = {}
        # blocks that share a byte of the codes with another (block_elems not a multiple of 4) are noted
        # on the calling thread, in order, not on the decoding threads
        self.later: dict[int, np.ndarray] = {}

    def __getattr__(self, name: str) -> Any:   # the inner output's other hooks, if any
        return getattr(self.out, name)

    def buffer(self, b: int, encoding: int | None, base_block: np.ndarray | None, drain: Any) -> np.ndarray:
        arr: np.ndarray = self.out.buffer(b, encoding, base_block, drain)
        self.bases[b] = base_block
        return arr

    def decoded(self, b: int, arr: np.ndarray, changed: np.ndarray | None) -> None:
        """On the thread that decoded block ``b``: its codes, from the positions it changed where the
        encoding hands them over (``changed``), else from a pass over the block; then the inner
        output's own hook, if it has one."""
        base = self.bases.get(b)
        if self.compute and base is not None and arr is not base:   # (the base itself: unchanged, codes 0)
            be = backend.selected()
            positions = be.changes(base, arr) if changed is None else changed
            if self.th.block_elems % 4 == 0:
                be.history_at(self.th.dtype, self.packed, self.th.block_range(b)[0], positions, base, arr)
            else:
                self.later[b] = positions
        inner = getattr(self.out, "decoded", None)
        if inner is not None:
            inner(b, arr, changed)

    def done(self, b: int, arr: np.ndarray) -> None:
        base = self.bases.pop(b, None)
        positions = self.later.pop(b, None)
        if positions is not None and base is not None:
            backend.selected().history_at(self.th.dtype, self.packed, self.th.block_range(b)[0], positions, base, arr)
        self.out.done(b, arr)

    def commit(self) -> Any:
        result = self.out.commit()
        self.packed.flags.writeable = False
        self.into[self.th.name] = _Kept(self.th.dtype, tuple(self.th.shape), self.th.base_hash, self.th.target_hash,
                                          self.packed)
        return result


def unchanged(th: Any) -> History:
    """The history of a tensor the step left as it was (every code 0)."""
    packed = np.zeros(-(-th.size // 4), np.uint8)
    packed.flags.writeable = False
    return _Kept(th.dtype, tuple(th.shape), th.base_hash, th.target_hash, packed)
