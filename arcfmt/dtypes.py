"""The dtype table of SPEC.md §2 and its mapping to numpy / ml_dtypes.

ml_dtypes (BF16, FP8) is imported only when one of its dtypes is asked for: its import registers
hundreds of ufunc loops and takes 0.55-0.7 s here (ml_dtypes 0.7), which every ``arcfmt`` command
paid at start-up although a file's bytes are only ever handled as unsigned integers.
"""
from __future__ import annotations

import functools
import sys
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from .errors import InputError, UnsupportedError


@dataclass(frozen=True)
class DType:
    code: int
    name: str
    itemsize: int
    kind: str  # "bool", "uint", "int", "float"
    exp_bits: int = 0
    mant_bits: int = 0
    # numpy's name for it ("<f4"), or ml_dtypes' ("bfloat16"): a keyword, after the defaulted bit counts
    numpy_name: str = field(kw_only=True)
    # The unsigned integer dtype of the same width: the view every transform works on (made once:
    # the per-block code asks for it many times).
    uint: np.dtype[np.unsignedinteger[Any]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "uint", np.dtype(f"<u{self.itemsize}"))

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @functools.cached_property
    def numpy(self) -> np.dtype:
        """The numpy dtype of its values (BF16 and FP8: ml_dtypes', imported here on first use)."""
        if self.numpy_name in _EXTENSION:
            import ml_dtypes
            ext: np.dtype = np.dtype(getattr(ml_dtypes, self.numpy_name))
            return ext
        return np.dtype(self.numpy_name)


_EXTENSION = ("bfloat16", "float8_e4m3fn", "float8_e5m2")   # ml_dtypes' types


_TABLE = [
    DType(1, "BOOL", 1, "bool", numpy_name="?"),
    DType(2, "U8", 1, "uint", numpy_name="u1"),
    DType(3, "I8", 1, "int", numpy_name="i1"),
    DType(4, "U16", 2, "uint", numpy_name="<u2"),
    DType(5, "I16", 2, "int", numpy_name="<i2"),
    DType(6, "U32", 4, "uint", numpy_name="<u4"),
    DType(7, "I32", 4, "int", numpy_name="<i4"),
    DType(8, "U64", 8, "uint", numpy_name="<u8"),
    DType(9, "I64", 8, "int", numpy_name="<i8"),
    DType(10, "F16", 2, "float", 5, 10, numpy_name="<f2"),
    DType(11, "BF16", 2, "float", 8, 7, numpy_name="bfloat16"),
    DType(12, "F32", 4, "float", 8, 23, numpy_name="<f4"),
    DType(13, "F64", 8, "float", 11, 52, numpy_name="<f8"),
    DType(14, "F8_E4M3", 1, "float", 4, 3, numpy_name="float8_e4m3fn"),
    DType(15, "F8_E5M2", 1, "float", 5, 2, numpy_name="float8_e5m2"),
]

BY_CODE = {d.code: d for d in _TABLE}
BY_NAME = {d.name: d for d in _TABLE}
_BY_NUMPY = {d.numpy: d for d in _TABLE if d.numpy_name not in _EXTENSION}   # ml_dtypes' join on first use
BF16 = BY_NAME["BF16"]


def from_code(code: int) -> DType:
    try:
        return BY_CODE[code]
    except KeyError:
        raise UnsupportedError(f"unknown dtype code {code}") from None


def from_name(name: str) -> DType:
    try:
        return BY_NAME[name]
    except KeyError:
        raise UnsupportedError(f"unsupported dtype {name!r}") from None


def from_numpy(dt: npt.DTypeLike) -> DType:
    dt = np.dtype(dt)
    if dt.byteorder == ">":
        raise InputError(f"big-endian arrays are not supported ({dt}); "
                         f"convert with .astype('{dt.newbyteorder('<').str}')")
    key = dt.newbyteorder("=") if dt.byteorder in "<>" else dt
    if key not in _BY_NUMPY and sys.modules.get("ml_dtypes") is not None:   # an ml_dtypes array: it is loaded
        _BY_NUMPY.update((d.numpy, d) for d in _TABLE if d.numpy_name in _EXTENSION)
    try:
        return _BY_NUMPY[key]
    except KeyError:
        raise InputError(f"unsupported array dtype {dt} (supported: {', '.join(d.name for d in _TABLE)})") from None
