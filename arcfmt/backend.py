"""The backend of ctx-delta's per-element work (SPEC.md §8.6), chosen once.

Two backends implement the same functions with the same signatures and give the same results:

- :mod:`arcfmt.kernels`: compiled with numba (whole blocks per call, without the GIL);
- :mod:`arcfmt.twins`: plain numpy, used where numba is missing or ``ARCFMT_JIT=0``.

The encodings call ``backend.selected().fn(...)``; they never test which backend runs. The choice is
made on the first call of :func:`selected` (not at import: importing numba costs ~0.35 s, which a
command that never reaches a ctx-delta block should not pay), as python-zstandard picks its cext or
cffi backend, and is kept for the life of the process. :func:`using` swaps it for a ``with`` block
(tests compare the two backends with it).

The interface (what both modules define):

``changes(base, target) -> int64 array``
    indices where the two unsigned arrays differ, increasing (``np.flatnonzero(base != target)``).
``scatter(flat, index, values)``
    ``flat[index] = values`` (the live follower writes a step's staged changes with it).
``exponent_counts(dt, base, stride, positions) -> (ne, ce)``
    elements of ``base[::stride]`` and of ``base[positions]`` per exponent field value (int64 arrays of ``2^E``).
``class_key(dt, base, history=None, previous=None) -> array``
    a ``ctx-delta-rhp`` block's class keys (§8.12; ``history``: its codes as ``(packed, offset)``, or
    ``previous``: its previous value): each element's magnitude bits shifted right by one, bit ``B − 2``
    set where its history code is not 0, so that ``key ≥ T · 2^(M−1)`` exactly where ``x' ≥ T``.
``key_counts(dt, base, previous, stride, positions) -> (ne, ce)``
    ``exponent_counts`` of the key fields ``x'`` (§8.12) that ``previous`` gives, without the keys.
``class_cuts(ne, ce, max_classes, overhead) -> (list, float)``
    the exponent-class thresholds of least estimated position bits (the DP of
    ``ctx_delta.choose_thresholds``), and that estimate (with ``overhead`` per class after the first).
``ctx_encode(dt, base, target, positions, thresholds, max_rice, dense=False, sign_axes=(), force_signs=False,
rc_limit=0, rc_planes=False, rp=0, rp_limit=0, history=None, key=None)``
    ``-> (counts, rice, qbits, mw, streams, signs, rp_rice)``:
    a whole changed block once its thresholds are chosen: the params it needs and its four streams;
    with ``sign_axes`` (ctx-delta-as's ``(axis, P, phase)`` contexts, §8.8), ``signs`` is the index of
    the one of least estimated size and the signs range-coded under it (else None, also where the
    estimate says raw bits are about as small, unless ``force_signs``). ``rc_limit`` > 0: ``signs``
    holds ctx-delta-rc's changes stream (§8.9) instead, or None where it would pass ``rc_limit`` bytes;
    with ``rp`` (1: where the gaps' estimate is below their Rice bits, 2: always) ctx-delta-rp's one
    stream (§8.10, the gaps first) and ``rp_rice`` its Rice parameters (else None: ``rice`` and the
    streams are always ctx-delta's own, which a block of few changes is offered as too). ``key``: the
    class keys the thresholds split (a ctx-delta-rhp block, §8.12).
``ctx_decode(dt, p, streams, m, base, out, positions=None) -> status``
    a whole block into ``out`` (which may be ``base``); returns ``OK``, or the status of the first
    failed check having written nothing; fills ``positions`` (when given) with the positions changed.
    Every backend returns the status (none raises), so one table words it (``ctx_delta.decode``).
    ``p.signs`` set: a ctx-delta-as block, its sign stream range-coded (§8.8); ``p.rc`` too: a
    ctx-delta-rc block, its stream 2 the signs and magnitudes range-coded (§8.9).
"""
from __future__ import annotations

import contextlib
import os
import threading
import warnings
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Protocol

import numpy as np

if TYPE_CHECKING:
    from .dtypes import DType
    from .encodings.base import HistoryCodes
    from .encodings.ctx_delta import Params
    from .layout import BytesLike

# Status codes of ``ctx_decode`` (the compiled kernels cannot raise our exception types).
OK, Q_PADDING, Q_CODES, R_PADDING, S_PADDING, BEYOND, RANGE = 0, 1, 2, 3, 4, 5, 6
S_FIRST, S_CODE, S_PAST, S_LENGTH = 7, 8, 9, 10   # ctx-delta-as's range-coded signs (§8.8), and -rc's
M_LONG = 11   # ctx-delta-rc (§8.9): a bit length beyond the dtype's bits

NAMES = ("numba", "numpy")

# What a process that is about to compile the kernels says, once (issue 19, "first use"): the command
# line prints it before the command starts, the Python API warns with it (FirstCompileWarning).
FIRST_COMPILE = ("compiling the ctx-delta kernels, once per install (15-25 s on 2 cores; cached for every "
                 "later run; 'arcfmt warm-up' does it ahead of time)")


class FirstCompileWarning(UserWarning):
    """The kernels compile now, inside this call: once per install (numba caches them), seconds long.
    ``arcfmt warm-up`` (or :func:`arcfmt.warm_up`) at install or image-build time does it beforehand."""


class Backend(Protocol):
    """The interface above, as :mod:`arcfmt.kernels` and :mod:`arcfmt.twins` define it (a module is one)."""

    def changes(self, base: np.ndarray, target: np.ndarray) -> np.ndarray: ...

    def scatter(self, flat: np.ndarray, index: np.ndarray, values: np.ndarray) -> None: ...

    def history(self, dt: DType, previous: np.ndarray, base: np.ndarray,
                out: np.ndarray | None = None) -> np.ndarray: ...

    def history_at(self, dt: DType, packed: np.ndarray, offset: int, positions: np.ndarray, previous: np.ndarray,
                   base: np.ndarray) -> None: ...

    def exponent_counts(self, dt: DType, base: np.ndarray, stride: int,
                        positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]: ...

    def class_key(self, dt: DType, base: np.ndarray, history: HistoryCodes | None = None,
                  previous: np.ndarray | None = None) -> np.ndarray: ...

    def key_counts(self, dt: DType, base: np.ndarray, previous: np.ndarray, stride: int,
                   positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]: ...

    def class_cuts(self, ne: np.ndarray, ce: np.ndarray, max_classes: int,
                   overhead: float) -> tuple[list[int], float]: ...

    def ctx_encode(self, dt: DType, base: np.ndarray, target: np.ndarray, positions: np.ndarray,
                   thresholds: Sequence[int], max_rice: int, dense: bool = False,
                   sign_axes: Sequence[tuple[int, int, int]] = (), force_signs: bool = False, rc_limit: int = 0,
                   rc_planes: bool = False, rp: int = 0, rp_limit: int = 0, history: HistoryCodes | None = None,
                   key: np.ndarray | None = None,
                   ) -> tuple[list[int], list[int], int, int, list[bytes], tuple[int, bytes] | None,
                              list[int] | None]: ...

    def ctx_decode(self, dt: DType, p: Params, streams: Sequence[BytesLike], m: int, base: np.ndarray,
                   out: np.ndarray, positions: np.ndarray | None = None,
                   history: HistoryCodes | None = None) -> int: ...


class _Selection:
    """The one place the backend is chosen: ``chosen`` is set once, on first use, under a lock."""

    def __init__(self) -> None:
        self.chosen: Backend | None = None
        self.announced: set[str] = set()   # kernels whose first compile was said (or found cached)
        self._lock = threading.Lock()

    def get(self) -> Backend:
        b = self.chosen
        if b is None:
            with self._lock:
                if self.chosen is None:
                    self.chosen = compiled() or twins()
                b = self.chosen
        return b


_selection = _Selection()


def selected() -> Backend:
    """The backend in use: compiled when numba is installed and ``ARCFMT_JIT`` is not ``0``, else numpy."""
    b = _selection.chosen
    return b if b is not None else _selection.get()


def compiled() -> Backend | None:
    """The numba backend, or None where numba is missing or ``ARCFMT_JIT=0``."""
    if os.environ.get("ARCFMT_JIT", "1") == "0":
        return None
    try:
        from . import kernels
    except ImportError:  # pragma: no cover - exercised where numba is not installed
        return None
    return kernels


def cache_dir() -> str:
    """Where numba caches the compiled kernels: ``NUMBA_CACHE_DIR``, else the package's ``__pycache__``."""
    here = os.path.dirname(os.path.abspath(__file__))
    return os.environ.get("NUMBA_CACHE_DIR") or os.path.join(here, "__pycache__")


def first_compile_pending(kernel: str) -> bool:
    """Whether the compiled backend will be chosen and numba has no cached build of ``kernel`` yet:
    the first call then compiles it (seconds, once per install), which a command says beforehand.
    Looks for numba's cache index files only; imports nothing."""
    if os.environ.get("ARCFMT_JIT", "1") == "0":
        return False
    import importlib.util
    if importlib.util.find_spec("numba") is None:
        return False
    start = f"kernels._{kernel}-"
    for _root, _dirs, files in os.walk(cache_dir()):
        if any(f.startswith(start) and f.endswith(".nbi") for f in files):
            return False
    return True


ENCODE, DECODE = "ctx_encode", "ctx_decode"   # the kernels a first call compiles (with what they call)


def announce_first_compile(kernels: Sequence[str] = (ENCODE, DECODE)) -> str | None:
    """:data:`FIRST_COMPILE` when one of ``kernels`` will be compiled in this process and nobody has
    said so yet (it counts as said then: later calls give None); None where numba has them cached or
    numpy is the backend. The command line calls it before a command starts; the encoder and the
    decoder through :func:`warn_first_compile` before their first kernel call."""
    new = [k for k in kernels if k not in _selection.announced]
    if not new:
        return None
    _selection.announced.update(new)
    if _selection.chosen is not None and _selection.chosen is twins():   # numpy in use (tests: using())
        return None
    return FIRST_COMPILE if any(first_compile_pending(k) for k in new) else None


def warn_first_compile(kernel: str) -> None:
    """Warn (:class:`FirstCompileWarning`) before ``kernel`` compiles inside a user's call, once."""
    if kernel not in _selection.announced:
        line = announce_first_compile((kernel,))
        if line is not None:
            warnings.warn(line, FirstCompileWarning, stacklevel=3)


def compiled_specializations() -> int:
    """How many (kernel, argument types) pairs this process has compiled or loaded from numba's cache so
    far (0 on numpy). Why: a tool that times single calls (the fuzzer, the conformance runner) tells
    a call that waited for numba, once per install, from one that was slow on its input."""
    import sys
    kernels = sys.modules.get(__package__ + ".kernels")   # never imported: nothing compiled yet
    if kernels is None:
        return 0
    return sum(len(f.signatures) for f in vars(kernels).values() if hasattr(f, "signatures") and hasattr(f, "py_func"))


def twins() -> Backend:
    """The numpy backend (always available)."""
    from . import twins as t
    return t


@contextlib.contextmanager
def using(backend: Backend) -> Iterator[Backend]:
    """Run a ``with`` block on ``backend`` (tests: the same call on both backends). Not thread-safe:
    it changes the selection for the whole process while the block runs."""
    was = selected()
    _selection.chosen = backend
    try:
        yield backend
    finally:
        _selection.chosen = was
