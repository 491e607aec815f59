"""A tensor's history (SPEC.md §7, 1.9): the direction of each element's change at the previous step.

A file written with the previous step may code a tensor's signs in contexts of its history
(``ctx-delta-rh``, §8.11); its ``TENS`` record then names the previous value by ``previous_hash``. A
decoder needs, for such a tensor, either the previous value itself or a :class:`History` kept from the
step before (a follower has both the previous value and the base when it applies a step, and can keep
the history instead of a second copy of the model). Either is checked against the record before any
block is decoded: a wrong previous step is refused (``wrong_base``), never misread.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from . import backend
from .arrays import as_uint
from .dtypes import DType
from .integrity import tensor_hash


def codes(dt: DType, previous_u: np.ndarray, base_u: np.ndarray) -> np.ndarray:
    """``h`` of §7 for every element (flat uint8): 0 where ``previous == base`` (bit patterns), 1 where
    the base is above the previous value in ``ord`` (§8.6), 2 where below."""
    return backend.selected().history(dt, previous_u, base_u)


@dataclass(frozen=True)
class History:
    """What a decoder keeps of a tensor's previous step instead of its value: the codes of §7 between
    the value of hash ``previous_hash`` and the one of hash ``base_hash`` (the base of the next file),
    for a tensor of ``dtype`` and ``shape``. A ``TENS`` record with HISTORY accepts it only where both
    hashes and the dtype and shape are the record's."""

    dtype: DType
    shape: tuple[int, ...]
    previous_hash: int
    base_hash: int
    codes: np.ndarray   # flat uint8, one per element

    @classmethod
    def between(cls, previous: object, base: object) -> History:
        """The history from ``previous`` to ``base`` (arrays of one dtype and shape; InputError else)."""
        from .errors import InputError
        pdt, pshape, pu = as_uint(previous)
        bdt, bshape, bu = as_uint(base)
        if pdt is not bdt or tuple(pshape) != tuple(bshape):
            raise InputError(f"previous value {pdt.name}{list(pshape)} and base {bdt.name}{list(bshape)} differ "
                             f"in dtype or shape")
        return cls(bdt, tuple(int(d) for d in bshape), tensor_hash(pu), tensor_hash(bu), codes(bdt, pu, bu))


class Recorder:
    """A pipeline sink around another (:mod:`arcfmt.pipeline`) that keeps the history of every tensor
    it rebuilds from a base: what a follower needs for the next step's file (SPEC.md S9.4). Each
    block's codes come from its base block and its rebuilt block as they pass; ``histories`` holds a
    tensor's :class:`History` once the inner sink has committed it (verified)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.histories: dict[str, History] = {}

    def __getattr__(self, name: str) -> Any:   # the inner sink's other hooks (needs_drain, ...)
        return getattr(self.inner, name)

    def open(self, th: Any) -> Any:
        out = self.inner.open(th)
        if th.base_hash is None or not kept_for(th.dtype):
            return out
        return _Recording(out, th, self.histories)


def kept_for(dt: DType) -> bool:
    """Whether a tensor of ``dt`` can carry HISTORY (the dtypes of ``ctx-delta-rh``, §8.11)."""
    from .encodings import registry
    return registry.by_name("ctx-delta-rh").defined_for(dt)


class _Recording:
    """One tensor's output, its history noted block by block."""

    def __init__(self, out: Any, th: Any, into: dict[str, History]) -> None:
        self.out, self.th, self.into = out, th, into
        self.codes = np.zeros(th.size, np.uint8)
        self.bases: dict[int, np.ndarray | None] = {}

    def __getattr__(self, name: str) -> Any:   # the inner output's per-block hook (``decoded``), if any
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
        if base is not None and arr is not base:   # (the base itself: an unchanged block, codes 0)
            s, e = self.th.block_range(b)
            if changed is None:
                self.codes[s:e] = backend.selected().history(self.th.dtype, base, arr)
            elif changed.size:
                up = backend.selected().history(self.th.dtype, base[changed], arr[changed])
                self.codes[s:e][changed] = up
        inner = getattr(self.out, "decoded", None)
        if inner is not None:
            inner(b, arr, changed)

    def done(self, b: int, arr: np.ndarray) -> None:
        self.bases.pop(b, None)
        self.out.done(b, arr)

    def commit(self) -> Any:
        result = self.out.commit()
        self.into[self.th.name] = History(self.th.dtype, tuple(self.th.shape), self.th.base_hash,
                                          self.th.target_hash, self.codes)
        return result


def unchanged(th: Any) -> History:
    """The history of a tensor the step left as it was (every code 0)."""
    return History(th.dtype, tuple(th.shape), th.base_hash, th.target_hash, np.zeros(th.size, np.uint8))
