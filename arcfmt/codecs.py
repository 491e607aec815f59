"""Bytes-to-bytes codecs of SPEC.md §9: bounded decoding and smallest-wins encoding."""
from __future__ import annotations

import bz2
import lzma
import threading

import zstandard

from .errors import CorruptError, LimitError, UnsupportedError
from .layout import MAX_WINDOW, MAX_XZ_MEMORY

RAW, ZSTD, XZ, BZ2 = 0, 1, 2, 3
NAMES = {RAW: "raw", ZSTD: "zstd", XZ: "xz", BZ2: "bz2"}
BY_NAME = {v: k for k, v in NAMES.items()}

# Codec trials per effort level: (codec, setting). Lower ids win ties.
EFFORTS = {
    "fast": ((ZSTD, 3),),
    "default": ((ZSTD, 15),),
    "max": ((ZSTD, 22), (XZ, 9 | lzma.PRESET_EXTREME), (BZ2, 9)),
}
# Trials for streams of at least LARGE_STREAM bytes, where they differ. Measured on the corpus: zstd-15
# is as small as zstd-19 at half its time; below 16 KiB xz and bz2 win rarely and by a few bytes; above
# it zstd-15/19 cost 4-8x zstd-9's time for less than xz-6 saves, and bz2 no longer wins.
LARGE_STREAM = 16 << 10
LARGE_EFFORTS = {"default": ((ZSTD, 9), (XZ, 6))}
SMALL_STREAM = 64  # below this many bytes only raw and zstd are tried: xz/bz2 headers alone are larger
_XZ_BZ2_OVERHEAD = 40  # an xz or bz2 stream costs at least this much more than a zstd frame

# LZMA2 options for the streams blocks have (plane-major integers, bit strings): no literal context
# from the previous byte's high bits and no position alignment (lc=lp=pb=0). Measured on the corpus and
# the synthetic trajectories against plain preset 6: 0.2-1.4 % smaller; nice_len 32 makes it 5-18 %
# faster for the same size.
_XZ_PLANES = {"lc": 0, "lp": 0, "pb": 0}
_XZ_TUNING = {6: {**_XZ_PLANES, "nice_len": 32}}

_local = threading.local()


def _zstd_compressor(level: int) -> zstandard.ZstdCompressor:
    cache = getattr(_local, "zc", None)
    if cache is None:
        cache = _local.zc = {}
    c = cache.get(level)
    if c is None:
        c = cache[level] = zstandard.ZstdCompressor(level=level, write_content_size=True, write_checksum=False,
                                                     write_dict_id=False)
    return c


def _zstd_decompressor() -> zstandard.ZstdDecompressor:
    d = getattr(_local, "zd", None)
    if d is None:
        d = _local.zd = zstandard.ZstdDecompressor(max_window_size=MAX_WINDOW)
    return d


def compress(codec: int, data, setting: int):
    if codec == RAW:
        return data
    if codec == ZSTD:
        return _zstd_compressor(setting).compress(data)
    if codec == XZ:
        # The dictionary need not exceed the input: same output size, far cheaper to set up (and to
        # decode) than the preset's 8-64 MiB for the small streams a block has.
        dict_size = max(1 << 12, 1 << max(0, len(data) - 1).bit_length())
        filters = [{"id": lzma.FILTER_LZMA2, "preset": setting,
                    "dict_size": min(dict_size, 1 << 26), **_XZ_TUNING.get(setting, _XZ_PLANES)}]
        return lzma.compress(data, format=lzma.FORMAT_XZ, check=lzma.CHECK_NONE, filters=filters)
    if codec == BZ2:
        return bz2.compress(data, setting)
    raise UnsupportedError(f"unknown codec id {codec}")


def encode_smallest(data, effort="default") -> tuple[int, bytes]:
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
        if codec in (XZ, BZ2) and (len(data) < SMALL_STREAM or len(best) < _XZ_BZ2_OVERHEAD):
            continue  # cannot win: its container overhead alone exceeds the best so far
        out = compress(codec, data, setting)
        if len(out) < len(best):
            best_codec, best = codec, out
    return best_codec, best


DEFAULT_SETTING = {RAW: 0, ZSTD: 19, XZ: 6, BZ2: 9}


def encode_with(codec: int, data) -> tuple[int, bytes]:
    """Compress with one given codec (empty streams stay raw, as SPEC.md §9 requires)."""
    data = bytes(data)
    if not data:
        return RAW, b""
    return codec, compress(codec, data, DEFAULT_SETTING[codec])


def decode(codec: int, stored, length: int):
    """Decode one stream to exactly ``length`` bytes, never producing more (SPEC.md §9)."""
    if codec == RAW:
        if len(stored) != length:
            raise CorruptError(f"raw stream holds {len(stored)} bytes, {length} expected")
        return stored
    if length == 0:
        raise CorruptError(f"empty stream must use codec raw, not {NAMES.get(codec, codec)}")
    if codec == ZSTD:
        return _decode_zstd(stored, length)
    if codec == XZ:
        try:
            dec = lzma.LZMADecompressor(format=lzma.FORMAT_XZ, memlimit=MAX_XZ_MEMORY)
            out = dec.decompress(stored, max_length=length + 1)
        except lzma.LZMAError as exc:
            if "memory" in str(exc).lower():
                raise LimitError(f"xz stream needs more than {MAX_XZ_MEMORY} bytes of decoder memory") from exc
            raise CorruptError(f"xz stream: {exc}") from exc
        return _check_end(out, length, dec.eof, dec.unused_data, "xz")
    if codec == BZ2:
        try:
            dec = bz2.BZ2Decompressor()
            out = dec.decompress(stored, max_length=length + 1)
        except (OSError, ValueError) as exc:
            raise CorruptError(f"bz2 stream: {exc}") from exc
        return _check_end(out, length, dec.eof, dec.unused_data, "bz2")
    raise UnsupportedError(f"unknown codec id {codec}")


def _check_end(out, length, eof, unused, name):
    if len(out) > length:
        raise CorruptError(f"{name} stream decodes to more than the {length} bytes declared")
    if len(out) < length or not eof:
        raise CorruptError(f"{name} stream decodes to fewer than the {length} bytes declared")
    if unused:
        raise CorruptError(f"{name} stream: {len(unused)} bytes after the end of the stream")
    return out


def _decode_zstd(stored, length):
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
