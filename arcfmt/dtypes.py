"""The dtype table of SPEC.md §2 and its mapping to numpy / ml_dtypes."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
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
    numpy: np.dtype = field(kw_only=True)  # every entry has one: a keyword, after the defaulted bit counts
    # The unsigned integer dtype of the same width: the view every transform works on (made once:
    # the per-block code asks for it many times).
    uint: np.dtype[np.unsignedinteger[Any]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "uint", np.dtype(f"<u{self.itemsize}"))

    @property
    def is_float(self) -> bool:
        return self.kind == "float"


_TABLE = [
    DType(1, "BOOL", 1, "bool", numpy=np.dtype(np.bool_)),
    DType(2, "U8", 1, "uint", numpy=np.dtype("u1")),
    DType(3, "I8", 1, "int", numpy=np.dtype("i1")),
    DType(4, "U16", 2, "uint", numpy=np.dtype("<u2")),
    DType(5, "I16", 2, "int", numpy=np.dtype("<i2")),
    DType(6, "U32", 4, "uint", numpy=np.dtype("<u4")),
    DType(7, "I32", 4, "int", numpy=np.dtype("<i4")),
    DType(8, "U64", 8, "uint", numpy=np.dtype("<u8")),
    DType(9, "I64", 8, "int", numpy=np.dtype("<i8")),
    DType(10, "F16", 2, "float", 5, 10, numpy=np.dtype("<f2")),
    DType(11, "BF16", 2, "float", 8, 7, numpy=np.dtype(ml_dtypes.bfloat16)),
    DType(12, "F32", 4, "float", 8, 23, numpy=np.dtype("<f4")),
    DType(13, "F64", 8, "float", 11, 52, numpy=np.dtype("<f8")),
    DType(14, "F8_E4M3", 1, "float", 4, 3, numpy=np.dtype(ml_dtypes.float8_e4m3fn)),
    DType(15, "F8_E5M2", 1, "float", 5, 2, numpy=np.dtype(ml_dtypes.float8_e5m2)),
]

BY_CODE = {d.code: d for d in _TABLE}
BY_NAME = {d.name: d for d in _TABLE}
_BY_NUMPY = {d.numpy: d for d in _TABLE}
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
    try:
        return _BY_NUMPY[key]
    except KeyError:
        raise InputError(f"unsupported array dtype {dt} (supported: {', '.join(d.name for d in _TABLE)})") from None
