"""The table of block encodings: id → :class:`~.base.Encoding`, one entry per encoding (SPEC.md §8).

Shaped like numcodecs' ``registry`` and zarr's ``register_codec``: an encoding is an object registered
once under its id and name; everything else — records checking a BLCK header, the reader describing
a file, the writer choosing a candidate, the report naming streams — looks it up here. The built-in
encodings register themselves when :mod:`arcfmt.encodings` is imported; another one (a test's, an
experiment's) is added with :func:`register` and removed with :func:`unregister`, touching no file of
the package.
"""
from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, TypeVar

import numpy as np

from ..dtypes import DType
from ..errors import InputError, UnsupportedError
from ..tables import TableView
from .base import Block, EncodedBlock, Encoding, HistoryCodes

if TYPE_CHECKING:
    from ..codecs import Trials
    from ..layout import BytesLike

_EncodingT = TypeVar("_EncodingT", bound="Encoding | type[Encoding]")
_K = TypeVar("_K")
_V = TypeVar("_V")

_lock = threading.Lock()
_by_id: dict[int, Encoding] = {}
_by_name: dict[str, Encoding] = {}
# The writer's trial order, replaced as a whole (one assignment) when the table changes: every
# encoding sorted by (trial_rank, id), and a cache (dtype code, has a base) → the ones that apply.
_trials: tuple[tuple[Encoding, ...], dict[tuple[int, bool], tuple[Encoding, ...]]] = ((), {})


def _retrial() -> None:
    global _trials
    _trials = (tuple(sorted(_by_id.values(), key=lambda e: (e.trial_rank, e.id))), {})


def register(encoding: _EncodingT) -> _EncodingT:
    """Add an encoding (an :class:`Encoding` instance, or a subclass: it is instantiated) to the table;
    returns what it was given, so it can decorate a class. ValueError if its id or name is taken."""
    enc = encoding() if isinstance(encoding, type) else encoding
    if not isinstance(enc, Encoding):
        raise TypeError(f"{encoding!r} is not an Encoding")
    if not isinstance(enc.id, int) or not 0 <= enc.id <= 255:
        raise InputError(f"encoding id {enc.id!r} is not a u8")
    with _lock:
        if enc.id in _by_id:
            raise InputError(f"encoding id {enc.id} is taken by {_by_id[enc.id].name}")
        if enc.name in _by_name:
            raise InputError(f"encoding name {enc.name!r} is taken by id {_by_name[enc.name].id}")
        _by_id[enc.id] = enc
        _by_name[enc.name] = enc
        _retrial()
    return encoding


def unregister(encoding: str | int | Encoding | type[Encoding]) -> None:
    """Remove an encoding (given by id, name or object) from the table."""
    with _lock:
        enc = (_by_name.get(encoding) if isinstance(encoding, str)
               else _by_id.get(encoding if isinstance(encoding, int) else encoding.id))
        if enc is None:
            raise KeyError(encoding)
        del _by_id[enc.id], _by_name[enc.name]
        _retrial()


def get(encoding_id: int) -> Encoding:
    """The encoding of an id; UnsupportedError for an unknown one (SPEC.md §8 check 1)."""
    try:
        return _by_id[encoding_id]
    except KeyError:
        raise UnsupportedError(f"unknown encoding id {encoding_id}") from None


def find(encoding_id: int) -> Encoding | None:
    """The encoding of an id, or None (an id not yet checked, e.g. from an index entry)."""
    return _by_id.get(encoding_id)


def by_name(name: str) -> Encoding:
    """The encoding of a SPEC.md name; KeyError for an unknown one."""
    return _by_name[name]


def for_dtype(encoding_id: int, dt: DType) -> Encoding:
    """The encoding of an id, checked to be defined for ``dt`` (UnsupportedError otherwise)."""
    enc = get(encoding_id)
    enc.check_dtype(dt)
    return enc


def registered() -> Iterator[Encoding]:
    """Every registered encoding, by id."""
    return iter(sorted(_by_id.values(), key=lambda e: e.id))


def keeps_base(encoding_id: int | None) -> bool:
    """Whether blocks of this id are the base itself (``unchanged``): nothing to decode in place.
    False for None or an unknown id."""
    enc = None if encoding_id is None else _by_id.get(encoding_id)
    return enc is not None and enc.keeps_base


NAMES: Mapping[int, str] = TableView(registered, lambda e: e.id, lambda e: e.name)            # id → name
BY_NAME: Mapping[str, int] = TableView(registered, lambda e: e.name, lambda e: e.id)          # name → id
NEEDS_BASE: Mapping[int, bool] = TableView(registered, lambda e: e.id, lambda e: e.needs_base)  # id → needs a base


# ------------------------------------------------------------------------------------ writing

def candidates(dt: DType, base: np.ndarray | None, target: np.ndarray,
               effort: str | Trials = "default", period: int | None = None, offset: int = 0,
               readers: tuple[int, int] | None = None, previous: np.ndarray | None = None) -> list[EncodedBlock]:
    """Every encoding worth trying for this block, in trial order: each registered encoding defined for
    ``dt`` (and needing no base when there is none) proposes a candidate or declines. A candidate with
    no streams ends the trials: nothing is smaller. ``readers``: the oldest format version that must
    read the file; encodings added after it are not tried. ``previous``: the block's previous value
    (SPEC.md §7), where the tensor carries HISTORY."""
    every, cache = _trials
    key = (dt.code, base is not None)
    trials = cache.get(key)
    if trials is None:
        trials = cache[key] = tuple(e for e in every if (base is not None or not e.needs_base) and e.defined_for(dt))
    block = Block(dt, base, target, effort, period, offset, readers, previous)
    out: list[EncodedBlock] = []
    for enc in trials:
        if readers is not None and enc.since > readers:
            continue
        cand = enc.propose(block, out)
        if cand is not None:
            out.append(cand)
            if not cand.streams:
                break
    return out


def encode_forced(dt: DType, base: np.ndarray | None, target: np.ndarray, encoding_id: int,
                  period: int | None = None, offset: int = 0, previous: np.ndarray | None = None) -> EncodedBlock:
    """One given encoding (``force_encoding``: tests and conformance vectors); raises if it cannot
    code this block. A block without changes is written with the encoding that keeps the base."""
    enc = for_dtype(encoding_id, dt)
    if enc.needs_base and base is None:
        raise InputError(f"encoding {enc.name} needs a base")
    block = Block(dt, base, target, period=period, offset=offset, previous=previous)
    out = enc.encode(block)
    if out is not None and out.encoding != enc.id:   # its params are another encoding's: never written as its
        raise InputError(f"encoding {enc.name} cannot code this block (it came out as {get(out.encoding).name})")
    if out is None:
        keeper = next(e for e in registered() if e.keeps_base)
        out = keeper.encode(block)
        assert out is not None, f"{keeper.name} did not code a block without changes"
    return out


# ------------------------------------------------------------------------------------ reading

def decode_block(dt: DType, encoding_id: int, params: Sequence[int], streams: Sequence[BytesLike], m: int,
                 base: np.ndarray | None,
                 out: np.ndarray, *, changes: bool = False, history: HistoryCodes | None = None) -> np.ndarray | None:
    """Write a block's target into ``out`` (which may be ``base`` itself, for in-place updates). With
    ``changes``, also return the positions it changed where the encoding knows them for free
    (``decode_changes``: exactly the positions whose value differs from the base, unsorted), else None.
    ``history``: the block's history codes (SPEC.md §7), handed to an encoding that needs them (the
    container checked the tensor's previous step first)."""
    enc = get(encoding_id)
    more = {}
    if enc.needs_history:
        assert history is not None, f"{enc.name} needs a history: the container never decodes one without"
        more["history"] = history
    fast = getattr(enc, "decode_changes", None) if changes else None
    if fast is not None:
        result: np.ndarray = fast(dt, params, streams, m, base, out, **more)
        return result
    enc.decode(dt, params, streams, m, base, out, **more)
    return None
