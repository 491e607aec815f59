"""Bytes-to-bytes codecs of SPEC.md §9: one object per codec, registered in one table; bounded
decoding and smallest-wins encoding.

A codec (:class:`Codec`) has an id (the ``u8`` of a stream table entry and of the INDX codec field), a
name, ``compress(data, setting)`` and ``decode(stored, length)``, which produces exactly ``length``
bytes and never more (SPEC.md §9). The module functions (:func:`decode`, :func:`encode_smallest`,
:func:`encode_with`) look codecs up in the table; :func:`register` adds one.
"""
from __future__ import annotations

import bz2
import lzma
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import ClassVar, TypeAlias, TypeVar

import zstandard

from .errors import CorruptError, InputError, LimitError, UnsupportedError
from .layout import MAX_WINDOW, MAX_XZ_MEMORY, BytesLike
from .tables import TableView

RAW, ZSTD, XZ, BZ2 = 0, 1, 2, 3

Trials: TypeAlias = Sequence[tuple[int, int]]  # (codec, setting) pairs, tried in order
XZ_QUICK = 0x106  # an xz setting: preset 6 with a quicker match finder (_XZ_TUNING)
ZSTD_SMALL = 0x10F  # a zstd setting: level 15's parameters for small inputs, matches of 6 bytes or more

# Codec trials per effort level: (codec, setting). Lower ids win ties.
EFFORTS: dict[str, Trials] = {
    "fast": ((ZSTD, 3),),
    "default": ((ZSTD, ZSTD_SMALL),),
    "max": ((ZSTD, 22), (XZ, 9 | lzma.PRESET_EXTREME), (BZ2, 9)),
}
# Trials for streams of at least LARGE_STREAM bytes, where they differ. Measured on the corpus: zstd-15
# is as small as zstd-19 at half its time; below 16 KiB xz and bz2 win rarely and by a few bytes; above
# it zstd-15/19 cost 4-8x zstd-9's time for less than xz-6 saves, and bz2 no longer wins.
LARGE_STREAM = 16 << 10
LARGE_EFFORTS: dict[str, Trials] = {"default": ((ZSTD, 9), (XZ, XZ_QUICK))}
SMALL_STREAM = 64  # below this many bytes only raw and zstd are tried: xz/bz2 headers alone are larger
_XZ_BZ2_OVERHEAD = 40  # an xz or bz2 stream costs at least this much more than a zstd frame

# LZMA2 options for the streams blocks have (plane-major integers, bit strings): no literal context
# from the previous byte's high bits and no position alignment (lc=lp=pb=0). Measured on the corpus and
# the synthetic trajectories against plain preset 6: 0.2-1.4 % smaller; nice_len 32 makes it 5-18 %
# faster for the same size.
_XZ_PLANES = {"lc": 0, "lp": 0, "pb": 0}
# XZ_QUICK, the default effort's xz trial: preset 6 with a hash-chain match finder that follows two
# chain links and stops at 8-byte matches. The streams xz wins on (magnitudes, position gaps) gain by
# its adaptive range coder, not by long matches: measured on the corpus and the synthetic
# trajectories against the tuned preset 6 below, 0.6 % larger xz output (under 0.1 % of a file) at
# 0.55x its time (the bt4 match finder and the parser's long lookahead were most of xz's cost).
_XZ_TUNING = {6: {**_XZ_PLANES, "nice_len": 32},
              XZ_QUICK: {**_XZ_PLANES, "preset": 6, "mf": lzma.MF_HC3, "nice_len": 8, "depth": 2}}

_local = threading.local()


# ZSTD_SMALL, the default effort's zstd trial below LARGE_STREAM: level 15 as zstd sets it for inputs
# of 8 KiB (btultra), but with a minimum match of 6 bytes instead of 3. Block streams are runs of
# zeros and small integers, where 3-5 byte matches cost as much as the literals they replace: measured
# on the corpus and the synthetic trajectories against level 15, -0.17 to +0.15 % of a file's bytes
# (smaller on most) at 0.6-0.8x its time.
_ZSTD_TUNED = {ZSTD_SMALL: (15, 8 << 10, {"min_match": 6})}


def _zstd_compressor(level: int) -> zstandard.ZstdCompressor:
    cache = getattr(_local, "zc", None)
    if cache is None:
        cache = _local.zc = {}
    c = cache.get(level)
    if c is None:
        tuned = _ZSTD_TUNED.get(level)
        if tuned is None:
            c = zstandard.ZstdCompressor(level=level, write_content_size=True, write_checksum=False,
                                         write_dict_id=False)
        else:
            lvl, size, extra = tuned
            params = zstandard.ZstdCompressionParameters.from_level(
                lvl, source_size=size, write_content_size=1, write_checksum=0, write_dict_id=0, **extra)
            c = zstandard.ZstdCompressor(compression_params=params)
        cache[level] = c
    return c


def _zstd_decompressor() -> zstandard.ZstdDecompressor:
    d = getattr(_local, "zd", None)
    if d is None:
        d = _local.zd = zstandard.ZstdDecompressor(max_window_size=MAX_WINDOW)
    return d


# ------------------------------------------------------------------------------------ the table

class Codec:
    """A codec of SPEC.md §9. Subclass it, set ``id`` and ``name``, and :func:`register` an instance."""

    id: ClassVar[int]
    name: ClassVar[str]
    default_setting: ClassVar[int] = 0  # the setting of ``encode_with`` (force_codec)
    overhead: ClassVar[int] = 0  # bytes it costs at least beyond a zstd frame: not tried where it cannot win

    def compress(self, data: bytes, setting: int) -> bytes:
        raise NotImplementedError

    def decode(self, stored: BytesLike, length: int) -> BytesLike:
        """Exactly ``length`` bytes from ``stored``, never producing more (CorruptError, LimitError)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<codec {self.id} {self.name}>"


_by_id: dict[int, Codec] = {}
_by_name: dict[str, Codec] = {}

_CodecT = TypeVar("_CodecT", bound="Codec | type[Codec]")
_K = TypeVar("_K")
_V = TypeVar("_V")


def register(codec: _CodecT) -> _CodecT:
    """Add a codec (instance, or subclass: instantiated) to the table; returns what it was given."""
    c = codec() if isinstance(codec, type) else codec
    if not isinstance(c.id, int) or not 0 <= c.id <= 255:
        raise InputError(f"codec id {c.id!r} is not a u8")
    if c.id in _by_id or c.name in _by_name:
        raise InputError(f"codec id {c.id} or name {c.name!r} is taken")
    _by_id[c.id] = c
    _by_name[c.name] = c
    return codec


def unregister(codec: str | int | Codec | type[Codec]) -> None:
    c = _by_name.get(codec) if isinstance(codec, str) else _by_id.get(codec if isinstance(codec, int) else codec.id)
    if c is None:
        raise KeyError(codec)
    del _by_id[c.id], _by_name[c.name]


def get(codec_id: int) -> Codec:
    """The codec of an id; UnsupportedError for an unknown one (SPEC.md §8 check 5)."""
    try:
        return _by_id[codec_id]
    except KeyError:
        raise UnsupportedError(f"unknown codec id {codec_id}") from None


def find(codec_id: int) -> Codec | None:
    return _by_id.get(codec_id)


def by_name(name: str) -> Codec:
    """The codec of a SPEC.md name; KeyError for an unknown one."""
    return _by_name[name]


def registered() -> Iterator[Codec]:
    """Every registered codec, by id."""
    return iter(sorted(_by_id.values(), key=lambda c: c.id))


NAMES: Mapping[int, str] = TableView(registered, lambda c: c.id, lambda c: c.name)    # id → name
BY_NAME: Mapping[str, int] = TableView(registered, lambda c: c.name, lambda c: c.id)  # name → id


# ------------------------------------------------------------------------------------ the codecs

@register
class Raw(Codec):
    id, name = RAW, "raw"

    def compress(self, data: bytes, setting: int) -> bytes:
        return data

    def decode(self, stored: BytesLike, length: int) -> BytesLike:
        if len(stored) != length:
            raise CorruptError(f"raw stream holds {len(stored)} bytes, {length} expected")
        return stored


@register
class Zstd(Codec):
    id, name, default_setting = ZSTD, "zstd", 19

    def compress(self, data: bytes, setting: int) -> bytes:
        return _zstd_compressor(setting).compress(data)

    def decode(self, stored: BytesLike, length: int) -> bytes:
        try:
            params = zstandard.get_frame_parameters(stored)
        except zstandard.ZstdError as exc:
            raise CorruptError(f"zstd stream: bad frame header: {exc}") from exc
        if params.content_size != length:
            raise CorruptError(f"zstd frame declares {params.content_size} bytes, {length} expected")
        if params.dict_id:
            raise CorruptError("zstd frame uses a dictionary")
        if params.window_size > MAX_WINDOW:
            raise LimitError(f"zstd window {params.window_size} exceeds {MAX_WINDOW}")
        try:
            obj = _zstd_decompressor().decompressobj()
            out = obj.decompress(stored)
        except zstandard.ZstdError as exc:
            raise CorruptError(f"zstd stream: {exc}") from exc
        return _check_end(out, length, obj.eof, obj.unused_data, "zstd")


_XZ_STATE_SLACK = 1 << 24  # liblzma's memory beyond the dictionary (about 1 MiB for LZMA2), with room


def _xz_int(b: BytesLike, pos: int, end: int) -> tuple[int, int]:
    """An .xz multibyte integer (at most 9 bytes, minimal) at ``pos``; (value, next position)."""
    value = 0
    for i in range(9):
        if pos >= end:
            raise CorruptError("xz stream: an integer runs past its field")
        byte = b[pos]
        pos += 1
        value |= (byte & 0x7F) << (7 * i)
        if not byte & 0x80:
            if i and not byte:
                raise CorruptError("xz stream: an integer is not minimal")
            return value, pos
    raise CorruptError("xz stream: an integer is longer than 9 bytes")


def xz_dictionary_sizes(stored: BytesLike) -> list[int]:
    """SPEC §9 xz: the LZMA2 dictionary size every block header declares, read from the stream's own
    structure (stream header and footer, index, block headers) before anything is decompressed.
    A structure that does not parse is `corrupt`; CRCs are left to the decoder."""
    b = memoryview(stored).cast("B") if not isinstance(stored, bytes) else stored
    n = len(b)
    if n < 24 or bytes(b[0:6]) != b"\xfd7zXZ\x00" or bytes(b[n - 2:n]) != b"YZ":
        raise CorruptError("xz stream: no stream header and footer at its ends")
    index_size = (int.from_bytes(b[n - 8:n - 4], "little") + 1) * 4
    istart = n - 12 - index_size
    if istart < 12 or b[istart] != 0:
        raise CorruptError("xz stream: the footer's backward size does not locate the index")
    count, pos = _xz_int(b, istart + 1, n - 12)
    if count > (index_size // 2):
        raise CorruptError("xz stream: the index lists more blocks than it can hold")
    sizes, block = [], 12
    for _ in range(count):
        unpadded, pos = _xz_int(b, pos, n - 12)
        _, pos = _xz_int(b, pos, n - 12)
        if block >= istart:
            raise CorruptError("xz stream: a block starts past the index")
        hsize = (b[block] + 1) * 4
        flags = b[block + 1]
        if b[block] == 0 or flags & 0x3C or block + hsize > istart or unpadded < hsize:
            raise CorruptError("xz stream: a block header is not valid")
        hp, hend = block + 2, block + hsize - 4
        for bit in (0x40, 0x80):
            if flags & bit:
                _, hp = _xz_int(b, hp, hend)
        for _ in range((flags & 3) + 1):
            fid, hp = _xz_int(b, hp, hend)
            psize, hp = _xz_int(b, hp, hend)
            if hp + psize > hend:
                raise CorruptError("xz stream: filter properties run past the block header")
            if fid == 0x21:
                if psize != 1 or b[hp] > 40:
                    raise CorruptError("xz stream: LZMA2 properties are not valid")
                d = b[hp]
                sizes.append(0xFFFFFFFF if d == 40 else (2 | (d & 1)) << (d // 2 + 11))
            hp += psize
        block += (unpadded + 3) & ~3
    if block != istart:
        raise CorruptError("xz stream: the blocks the index lists do not end at the index")
    return sizes


@register
class Xz(Codec):
    id, name, default_setting, overhead = XZ, "xz", 6, _XZ_BZ2_OVERHEAD

    def compress(self, data: bytes, setting: int) -> bytes:
        # The dictionary need not exceed the input: same output size, far cheaper to set up (and to
        # decode) than the preset's 8-64 MiB for the small streams a block has.
        dict_size = max(1 << 12, 1 << max(0, len(data) - 1).bit_length())
        filters = [{"id": lzma.FILTER_LZMA2, "preset": setting,
                    "dict_size": min(dict_size, 1 << 26), **_XZ_TUNING.get(setting, _XZ_PLANES)}]
        return lzma.compress(data, format=lzma.FORMAT_XZ, check=lzma.CHECK_NONE, filters=filters)

    def decode(self, stored: BytesLike, length: int) -> bytes:
        biggest = max(xz_dictionary_sizes(stored), default=0)
        if biggest > MAX_XZ_MEMORY:
            raise LimitError(f"xz stream declares an LZMA2 dictionary of {biggest} bytes, more than {MAX_XZ_MEMORY}")
        try:
            # the limit is the declared dictionary size (SPEC §9); liblzma's own accounting adds its state
            dec = lzma.LZMADecompressor(format=lzma.FORMAT_XZ, memlimit=MAX_XZ_MEMORY + _XZ_STATE_SLACK)
            out = dec.decompress(stored, max_length=length + 1)
        except lzma.LZMAError as exc:
            if "memory" in str(exc).lower():
                raise LimitError(f"xz stream needs more than {MAX_XZ_MEMORY} bytes of decoder memory") from exc
            raise CorruptError(f"xz stream: {exc}") from exc
        return _check_end(out, length, dec.eof, dec.unused_data, "xz")


@register
class Bz2(Codec):
    id, name, default_setting, overhead = BZ2, "bz2", 9, _XZ_BZ2_OVERHEAD

    def compress(self, data: bytes, setting: int) -> bytes:
        return bz2.compress(data, setting)

    def decode(self, stored: BytesLike, length: int) -> bytes:
        try:
            dec = bz2.BZ2Decompressor()
            out = dec.decompress(stored, max_length=length + 1)
        except (OSError, ValueError) as exc:
            raise CorruptError(f"bz2 stream: {exc}") from exc
        return _check_end(out, length, dec.eof, dec.unused_data, "bz2")


def _check_end(out: bytes, length: int, eof: bool, unused: bytes, name: str) -> bytes:
    if len(out) > length:
        raise CorruptError(f"{name} stream decodes to more than the {length} bytes declared")
    if len(out) < length or not eof:
        raise CorruptError(f"{name} stream decodes to fewer than the {length} bytes declared")
    if unused:
        raise CorruptError(f"{name} stream: {len(unused)} bytes after the end of the stream")
    return out


# ------------------------------------------------------------------------------------ through the table

def compress(codec: int, data: bytes, setting: int) -> bytes:
    return get(codec).compress(data, setting)


def decode(codec: int, stored: BytesLike, length: int) -> BytesLike:
    """Decode one stream to exactly ``length`` bytes, never producing more (SPEC.md §9). An empty
    stream must be ``raw`` (checked before the codec's own rules)."""
    c = _by_id.get(codec)
    if length == 0 and codec != RAW:
        raise CorruptError(f"empty stream must use codec raw, not {c.name if c is not None else codec}")
    if c is None:
        raise UnsupportedError(f"unknown codec id {codec}")
    return c.decode(stored, length)


def encode_smallest(data: BytesLike, effort: str | Trials = "default") -> tuple[int, bytes]:
    """Compress ``data`` with every codec of the effort level and keep the smallest (raw included).

    ``effort`` is a level name or a tuple of ``(codec, setting)`` trials.
    """
    data = bytes(data) if not isinstance(data, bytes) else data
    if not data:
        return RAW, b""
    best_codec, best = RAW, data
    if isinstance(effort, str):
        effort = LARGE_EFFORTS.get(effort, EFFORTS[effort]) if len(data) >= LARGE_STREAM else EFFORTS[effort]
    for codec, setting in effort:
        c = _by_id[codec]
        if c.overhead and (len(data) < SMALL_STREAM or len(best) < c.overhead):
            continue  # cannot win: its container overhead alone exceeds the best so far
        out = c.compress(data, setting)
        if len(out) < len(best):
            best_codec, best = codec, out
    return best_codec, best


def encode_with(codec: int, data: BytesLike) -> tuple[int, bytes]:
    """Compress with one given codec (empty streams stay raw, as SPEC.md §9 requires)."""
    data = bytes(data)
    if not data:
        return RAW, b""
    c = get(codec)
    return codec, c.compress(data, c.default_setting)
