"""What an encoding is (SPEC.md §8): the interface every block encoding implements.

An encoding turns one block of ``m`` elements — viewed as unsigned ``W``-byte integers, the target and
(if it needs one) the base — into params and uncompressed byte streams, and back. Everything the
container needs to know about it is here: its id and name, the dtypes it is defined for, whether it
needs a base, how many params it has and whether they are valid, how many streams it has and their
decoded lengths, what each stream holds (its role), and how many elements a block changes. The
container layer (records, reader, writer, pipeline) asks the registry (:mod:`.registry`) for the
encoding of an id and calls these methods; it knows no encoding by itself.

Pure: no I/O and no container knowledge.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from .. import backend
from ..dtypes import DType
from ..errors import UnsupportedError

if TYPE_CHECKING:
    from ..codecs import Trials
    from ..layout import BytesLike


# A block's history codes (SPEC.md §7, 1.9) as the kernels take them: codes packed four to a byte
# (arcfmt.history.pack) and the offset of the block's element 0 into them
HistoryCodes = tuple[np.ndarray, int]


@dataclass
class EncodedBlock:
    """One block, encoded: what the writer compresses and frames (SPEC.md §8 BLCK fields)."""
    encoding: int
    params: list[int]
    streams: list[bytes]  # uncompressed, one per stream
    changed: int   # changed elements (informational; equals params[0] for the delta encodings)
    # indices of streams that get the fast codec trials only below effort max: already entropy-coded,
    # or of a candidate not worth the strong codecs' time (dense-delta beside a range-coded one)
    dense: tuple[int, ...] = ()


@dataclass(frozen=True)
class StreamRole:
    """What one stream of an encoding holds: its SPEC.md §8 ``name`` and the ``part`` of the block it
    codes (positions, steps, values, ...), for summaries such as ``arcfmt report`` and tools/bench.py."""
    name: str
    part: str


class Block:
    """One block to encode: the encoder's view, shared by every encoding tried on it.

    ``positions`` (the changed elements, int64, increasing) is computed once, on first use, by the
    backend (:mod:`arcfmt.backend`).
    """

    def __init__(self, dt: DType, base: np.ndarray | None, target: np.ndarray,
                 effort: str | Trials = "default", period: int | None = None, offset: int = 0,
                 readers: tuple[int, int] | None = None, previous: np.ndarray | None = None) -> None:
        # as the kernels read them, C-contiguous and aligned: a view of an odd layout (an unaligned tensor
        # of a memory-mapped file) is copied once here, not by each kernel an encoding calls
        self.base = None if base is None else np.require(base, requirements=("C", "A"))
        self.target = np.require(target, requirements=("C", "A"))
        self.dt, self.effort = dt, effort
        # the oldest format version that must read the file (None: this one): newer encodings are not tried
        self.readers = readers
        # where the block lies in its tensor: the last dimension (None for a vector or a scalar) and
        # the block's first flat element (ctx-delta-as's row and column contexts, §8.8)
        self.period, self.offset = period, offset
        # the block's previous value (SPEC.md §7), where the writer was given the previous step and the
        # tensor carries HISTORY; else None (see ``history``)
        self.previous = None if previous is None else np.require(previous, requirements=("C", "A"))
        # candidates one encoding's pass made for another, by its id (ctx-delta's one pass over a block
        # makes both ctx-delta's and ctx-delta-rc's streams), taken by that encoding's propose
        self.made_for: dict[int, EncodedBlock] = {}

    # Computed once, on first use, and kept as plain attributes: functools.cached_property takes one
    # lock per property for every instance on Python 3.11, so blocks encoding on different threads
    # waited for each other's positions (their kernels run outside the GIL, inside that lock).
    _positions: np.ndarray | None = None
    _history: HistoryCodes | None | bool = False   # False: not made yet

    @property
    def positions(self) -> np.ndarray:
        p = self._positions
        if p is None:
            # Only encodings that need a base ask (the registry offers a block without one to no other).
            assert self.base is not None, "changed positions of a block without a base"
            p = self._positions = backend.selected().changes(self.base, self.target)
        return p

    @property
    def history(self) -> HistoryCodes | None:
        """The block's history codes (SPEC.md §7: the direction of each element's last change) as the
        kernels take them, or None without a previous value. Only the changed elements' codes are
        made (the encoder reads no other): a pass over the changes, not over the block."""
        h = self._history
        if h is False:
            h = self._history = self._make_history()
        assert h is not True
        return h

    def _make_history(self) -> HistoryCodes | None:
        if self.previous is None:
            return None
        assert self.base is not None, "a history needs a base"
        packed = np.zeros((self.m + 3) // 4, np.uint8)
        backend.selected().history_at(self.dt, packed, 0, self.positions, self.previous, self.base)
        return packed, 0

    @property
    def m(self) -> int:
        return self.target.size

    def may_use(self, enc: type[Encoding] | Encoding) -> bool:
        """Whether the writer may try ``enc`` here: registered, and known to the file's readers."""
        from .registry import find
        return find(enc.id) is not None and (self.readers is None or enc.since <= self.readers)


class Encoding(ABC):
    """A block encoding of SPEC.md §8. Subclass it, set the class attributes, and register an instance
    with :func:`arcfmt.encodings.register` (or the ``@register`` decorator on the class).

    Reading a block: :meth:`defined_for` (from ``dtypes``), :meth:`param_count` (from ``param_names``),
    :meth:`stream_lengths` (checks the params) and :meth:`decode`.
    Describing it: :meth:`changed`, :meth:`stream_roles`.
    Writing it: :meth:`encode` (one given block, e.g. ``force_encoding``) and :meth:`propose` (whether
    the writer should try it on a block, and the candidate; an encoding that never proposes is only
    used when forced). ``stream_lengths``, ``decode`` and ``encode`` are abstract.
    """

    id: ClassVar[int]             # the u8 of the BLCK record and the index's blk_encodings (§8, §10)
    name: ClassVar[str]           # its SPEC.md name (what inspect, reports and force_encoding use)
    needs_base: ClassVar[bool] = True   # decoding reads the base (§7: not allowed without NEEDS_BASE)
    needs_history: ClassVar[bool] = False   # decoding reads the history (§7: not allowed without HISTORY);
    # its decode and decode_changes then take ``history=``, the block's history codes
    keeps_base: ClassVar[bool] = False  # the target is the base itself: decoding in place has nothing to do
    dtypes: ClassVar[frozenset[str] | None] = None  # dtype names it is defined for; None: all
    param_names: ClassVar[tuple[str, ...]] = ()  # its fixed params, in order (their number is the param count)
    trial_rank: ClassVar[int] = 100  # encoder: order in which candidates are tried (ties go to the first)
    since: ClassVar[tuple[int, int]] = (1, 0)  # the format version that added it (SPEC.md §16)

    # -- reading

    def defined_for(self, dt: DType) -> bool:
        return self.dtypes is None or dt.name in self.dtypes

    def check_dtype(self, dt: DType) -> None:
        """UnsupportedError unless the encoding is defined for ``dt`` (SPEC.md §8 check 1)."""
        if not self.defined_for(dt):
            raise UnsupportedError(f"encoding {self.name} used for dtype {dt.name}")

    def param_count(self, head: Sequence[int]) -> int:
        """How many params the block has, given the ones read so far (``head``): fixed by default; an
        encoding whose count depends on a first param reads it from ``head`` (and checks it)."""
        return len(self.param_names)

    @abstractmethod
    def stream_lengths(self, dt: DType, params: Sequence[int], m: int) -> list[int]:
        """Check the params (CorruptError) and return the decoded length of every stream of a block of
        ``m`` elements; their number is the stream count (SPEC.md §8: neither is stored)."""
        raise NotImplementedError

    @abstractmethod
    def decode(self, dt: DType, params: Sequence[int], streams: Sequence[BytesLike], m: int, base: np.ndarray | None,
               out: np.ndarray) -> None:
        """Write the block's target into ``out`` (which may be ``base`` itself, for in-place updates),
        making the encoding's own checks (CorruptError) before any element is written to ``base``.
        ``streams`` are the decoded streams, of exactly the lengths :meth:`stream_lengths` gave;
        ``base`` is None when the encoding does not need one."""
        raise NotImplementedError

    # -- describing

    def changed(self, params: Sequence[int]) -> int | None:
        """Changed elements of a block, from its params alone; None when they do not say."""
        return None

    def stream_roles(self, dt: DType) -> tuple[StreamRole, ...]:
        """A :class:`StreamRole` for every stream a block of this dtype has (SPEC.md §8 names)."""
        return ()

    # Optional: ``changed_in_streams(dt, streams) -> int``, the changed elements of a block counted from
    # its decoded streams alone, for encodings whose params do not say but whose streams do (xor).
    changed_in_streams: Callable[[DType, Sequence[BytesLike]], int] | None = None

    # -- writing

    @abstractmethod
    def encode(self, block: Block) -> EncodedBlock | None:
        """This encoding of ``block``; None when it cannot code it because nothing changed (the
        writer then writes the block as ``unchanged``). InputError when it cannot code it at all."""
        raise NotImplementedError

    def propose(self, block: Block, tried: list[EncodedBlock]) -> EncodedBlock | None:
        """The candidate the writer should try for ``block``, or None to skip it. ``tried``: the
        candidates of the encodings of lower ``trial_rank`` so far. Default: never (forced use only)."""
        return None

    def __repr__(self) -> str:
        return f"<encoding {self.id} {self.name}>"
