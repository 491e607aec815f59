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
