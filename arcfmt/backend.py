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
``exponent_counts(dt, sample, changed) -> (ne, ce)``
    elements of ``sample`` and of ``changed`` per exponent field value (int64 arrays of ``2^E``).
``class_cuts(ne, ce, max_classes, overhead) -> list``
    the exponent-class thresholds of least estimated position bits (the DP of
    ``ctx_delta.choose_thresholds``).
``ctx_encode(dt, base, target, positions, thresholds, max_rice) -> (counts, rice, qbits, mw, streams)``
    a whole changed block once its thresholds are chosen: the params it needs and its four streams.
``ctx_decode(dt, p, streams, m, base, out) -> status``
    a whole block into ``out`` (which may be ``base``); returns ``OK``, or the status of the first
    failed check having written nothing. A backend that can word the failure raises
    :class:`~arcfmt.errors.CorruptError` instead (the numpy twins do).
"""
from __future__ import annotations

import contextlib
import os
import threading
from types import ModuleType

# Status codes of ``ctx_decode`` (the compiled kernels cannot raise our exception types).
OK, Q_PADDING, Q_CODES, R_PADDING, S_PADDING, BEYOND, RANGE = 0, 1, 2, 3, 4, 5, 6

NAMES = ("numba", "numpy")


class _Selection:
    """The one place the backend is chosen: ``chosen`` is set once, on first use, under a lock."""

    def __init__(self):
        self.chosen: ModuleType | None = None
        self._lock = threading.Lock()

    def get(self) -> ModuleType:
        b = self.chosen
        if b is None:
            with self._lock:
                if self.chosen is None:
                    self.chosen = compiled() or twins()
                b = self.chosen
        return b


_selection = _Selection()


def selected() -> ModuleType:
    """The backend in use: compiled when numba is installed and ``ARCFMT_JIT`` is not ``0``, else numpy."""
    b = _selection.chosen
    return b if b is not None else _selection.get()


def compiled() -> ModuleType | None:
    """The numba backend, or None where numba is missing or ``ARCFMT_JIT=0``."""
    if os.environ.get("ARCFMT_JIT", "1") == "0":
        return None
    try:
        from . import kernels
    except ImportError:  # pragma: no cover - exercised where numba is not installed
        return None
    return kernels


def twins() -> ModuleType:
    """The numpy backend (always available)."""
    from . import twins as t
    return t


@contextlib.contextmanager
def using(backend: ModuleType):
    """Run a ``with`` block on ``backend`` (tests: the same call on both backends). Not thread-safe:
    it changes the selection for the whole process while the block runs."""
    was = selected()
    _selection.chosen = backend
    try:
        yield backend
    finally:
        _selection.chosen = was
