"""Turning caller arrays (numpy, ml_dtypes, torch) into the unsigned views transforms work on, and back."""
from __future__ import annotations

import ctypes as _ctypes
import ctypes.util as _ctypes_util
import mmap as _mmap
from collections.abc import Callable
from typing import Any, Literal

import numpy as np

from .dtypes import DType, from_numpy
from .errors import InputError


def _torch_to_numpy(t: Any) -> np.ndarray:  # t: a torch.Tensor (torch is optional, and unannotated)
    import ml_dtypes
    import torch  # only reached when a torch tensor was passed in
    try:
        t = t.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.contiguous()
    except Exception as exc:  # noqa: BLE001 - a tensor with no data here (device "meta"), or none torch can move
        raise InputError(f"cannot read a torch tensor on {t.device} ({type(exc).__name__}: {exc})") from None
    special = {torch.bfloat16: (torch.int16, ml_dtypes.bfloat16)}
    for name, npdt in (("float8_e4m3fn", ml_dtypes.float8_e4m3fn), ("float8_e5m2", ml_dtypes.float8_e5m2)):
        if hasattr(torch, name):
            special[getattr(torch, name)] = (torch.uint8, npdt)
    if t.dtype in special:
        view_dt, npdt = special[t.dtype]
        viewed: np.ndarray = t.view(view_dt).numpy().view(npdt)
        return viewed
    out: np.ndarray = t.numpy()
    return out


class Stored:
    """A tensor as a file stores it: its arcfmt dtype, shape and flat unsigned-integer view (of a
    memory map, say). What :func:`as_uint` would make of it, so a file's BF16 or FP8 tensor reaches the
    transforms without its numpy float dtype ever being built (which imports ml_dtypes: see
    :mod:`arcfmt.dtypes`); :func:`as_numpy` gives the typed view where a caller needs one."""

    __slots__ = ("dtype", "shape", "flat")

    def __init__(self, dtype: DType, shape: tuple[int, ...], flat: np.ndarray) -> None:
        assert flat.dtype == dtype.uint and flat.ndim == 1, "a stored tensor is a flat unsigned view"
        self.dtype, self.shape, self.flat = dtype, shape, flat

    @property
    def nbytes(self) -> int:
        return int(self.flat.nbytes)


def as_numpy(x: object) -> np.ndarray:
    """A numpy array for ``x`` without copying when possible (torch tensors are viewed, not cast)."""
    if isinstance(x, np.ndarray):
        return x
    if isinstance(x, Stored):
        return x.flat.view(x.dtype.numpy).reshape(x.shape)
    if type(x).__module__.startswith("torch"):
        return _torch_to_numpy(x)
    if isinstance(x, (np.generic, int, float, bool)):
        return np.asarray(x)
    raise InputError(f"expected a numpy array or torch tensor, got {type(x).__name__}")


def numpy_view(x: object) -> np.ndarray | None:
    """``x``'s own memory as a numpy array — a numpy array as it is, a contiguous CPU torch tensor
    viewed — or None where :func:`as_numpy` would have to copy (a torch tensor on another device, or
    not contiguous) or for anything else: what may be written through, or read without a copy."""
    if isinstance(x, np.ndarray):
        return x
    if isinstance(x, Stored):
        return as_numpy(x)
    if type(x).__module__.startswith("torch"):
        if x.device.type != "cpu" or not x.is_contiguous():  # type: ignore[attr-defined]
            return None
        return _torch_to_numpy(x)
    return None


def as_uint(x: object) -> tuple[DType, tuple[int, ...], np.ndarray]:
    """(dtype, shape, flat unsigned-integer view in row-major order) of an input array."""
    if isinstance(x, Stored):
        return x.dtype, x.shape, x.flat
    a = x if type(x) is np.ndarray else as_numpy(x)
    dt = from_numpy(a.dtype)
    shape = a.shape  # (Python ints) before ascontiguousarray, which makes 0-d arrays 1-d
    flat = np.ascontiguousarray(a).reshape(-1)
    if flat.dtype.byteorder == ">":
        raise InputError("big-endian arrays are not supported")
    return dt, shape, flat.view(dt.uint)


# ------------------------------------------------------------------------------ memory-mapped input

PAGE = _mmap.PAGESIZE  # a mapped array smaller than this holds no whole page to hand back
_MADV_DONTNEED = 4
_libc: _ctypes.CDLL | Literal[False] | None = None  # None: not looked up yet; False: no libc


def _madvise() -> Callable[..., int] | None:
    global _libc
    if _libc is None:
        name = _ctypes_util.find_library("c")
        _libc = _ctypes.CDLL(name, use_errno=True) if name else False
    return getattr(_libc, "madvise", None) if _libc else None


def is_mapped(a: object) -> bool:
    """Whether ``a`` is a view of a file mapped *shared* (an ``np.memmap`` opened ``r`` or ``r+``), whose
    pages can be handed back and read again from the file.

    Only such a mapping: ``np.memmap.copy()`` is an ``np.memmap`` too but lives in anonymous memory,
    as do ``mmap.mmap(-1, n)`` buffers and copy-on-write (``c``) maps — dropping their pages would
    zero the caller's data (it did: ``encode`` of copied memmap arrays wiped the base).
    """
    x = a
    for _ in range(32):
        if type(x) is np.ndarray:   # a plain array (no memmap itself): what it views decides
            x = x.base
            continue
        if x is None or type(x) is bytes:   # (no base, or a file read into memory)
            return False
        if isinstance(x, np.memmap):
            return getattr(x, "_mmap", None) is not None and x.mode in ("r", "r+", "readonly", "readwrite")
        if isinstance(x, _mmap.mmap):
            return False  # anonymous or of unknown kind: never released
        x = getattr(x, "base", None)
    return False


def release(a: object) -> None:
    """Drop the pages of a memory-mapped array from this process's memory (they stay in the file).

    Lets encode and apply stream through checkpoints larger than RAM with a resident set of a few
    blocks: a page touched once is handed back as soon as its block is done. No-op for other arrays.
    """
    if a is None or not isinstance(a, np.ndarray) or a.nbytes == 0 or not is_mapped(a):
        return
    fn = _madvise()
    if fn is None:
        return
    addr = a.ctypes.data
    start = (addr + PAGE - 1) // PAGE * PAGE
    end = (addr + a.nbytes) // PAGE * PAGE
    if end > start:
        fn(_ctypes.c_void_p(start), _ctypes.c_size_t(end - start), _ctypes.c_int(_MADV_DONTNEED))
