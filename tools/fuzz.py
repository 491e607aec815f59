#!/usr/bin/env python3
"""Fuzz every entry point that reads untrusted bytes; report anything outside the ArcError tree.

    python tools/fuzz.py --cases 1000000 --workers 2 --seed 1      # the long run (README shows its result)
    python tools/fuzz.py --cases 2000                              # a quick look
    python tools/fuzz.py --cases 500 --engines store,layouts       # some engines only

Engines, interleaved case by case (all seeded, reproducible from --seed, --engines and the case number):
  * ``struct``: build a random valid file (random dtypes, shapes, densities, encodings, codecs, block
    sizes), take it apart into records, change one field or byte *and put the checksums, index and
    trailer right again* so the structural checks behind the checksums are what gets exercised;
  * ``bytes``: raw mutations of valid files (bit flips, byte sets, insertions, deletions, truncations,
    splices, duplicated chunks), checksums left as they fall;
  * ``intact``: the valid files themselves (they must decode to their targets);
  * ``safetensors``: mutated safetensors headers and files (the checkpoint input path);
  * ``names``: random tensor names (``__metadata__``, empty, lone surrogates, C0 controls and U+007F,
    names around 1024 bytes, odd but valid Unicode) through ``arcfmt.encode`` (InputError for a bad
    name, a faithful round trip for a good one), then by record surgery into the TENS record, the
    index entry or both of a valid file (both readers must refuse: CorruptError, or LimitError past
    1024 bytes);
  * ``dims``: TENS dims with zeros and huge values (products near and past 2^40, partial products
    that wrap 64 bits, ``[0, 2^64-1]``, varints past 64 bits or not minimal, more than 16 dims) and odd
    block sizes, by record surgery: the readers must raise the ArcError SPEC.md §7 names (LimitError /
    CorruptError), never ValueError, OverflowError or MemoryError;
  * ``layouts``: base safetensors checkpoints laid out unusually (gaps of garbage, data in another
    order than the header's keys, ``__metadata__`` anywhere, zero-size tensors, folders of shards with
    or without an index); a delta base -> target made with ``checkpoint.encode_checkpoints`` (now and
    then damaged, or applied to a damaged base) is applied with ``checkpoint.apply_delta`` to a new
    path and in place: the output must read back holding exactly the target (and the base's
    ``__metadata__``); a refusal must be an ArcError that leaves the base byte-identical and nothing
    beside it;
  * ``store``: a small model (1-2 shards, 1-3 steps) published with ``arcfmt.Publisher`` (to
    ``memory://``; one stream serves 16 cases), one object of the stream changed (head, manifest,
    descriptor: JSON values made huge, negative, of the wrong type, keys dropped or added, strings
    swapped, object bounds moved; a data object: record or byte mutations; objects deleted, swapped,
    resized) *with the hash chain put right again* (tail hashes, content-addressed names, descriptor
    and manifest digests up to the head), copied to a fresh ``memory://`` root or folder, and followed
    with ``Follower(...).sync()`` into a fresh folder under a small ``memory_budget``: anything but an
    ArcError, a folder that is not absent or one whole published step, a success that is not at the
    head's step, or staging entries left beside it fail the case; a quarter of the cases then repair
    the stream and sync the same folder again, which must reach the head.
Every delta case runs the random-access reader and the streaming reader. A case fails when it raises an
exception that is not an ArcError, takes longer than --max-seconds (not counted where numba compiled a
kernel for new argument types during the case: a first use, not the input's doing; a case still running
after max(30 s, 20 x --max-seconds) is stopped as a hang), returns tensors that differ from the original
target (a corrupted file must never decode to wrong data), or brings the worker's peak RSS past
--max-rss-mib (the decoders run with a bounded output budget). Failing inputs are saved under --out
(default fuzz-failures/) to become regression vectors: ``case-<seed>-<case>.arc`` (a file), or
``.tar`` (a stream's objects; a checkpoint, its target and delta). Cases write their files under
--tmp-dir (default /dev/shm: the writers fsync). The summary gives cases per second of each engine.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import resource
import shutil
import signal
import struct
import sys
import tarfile
import tempfile
import threading
import time
import traceback
from concurrent.futures import ProcessPoolExecutor

import _paths  # noqa: F401  (this checkout's arcfmt, and tests/support: the record toolkit)
import numpy as np

from arcfmt import (
    ArcError,  # noqa: E402
    backend,
    records,
)
from arcfmt import layout as L  # noqa: E402
from arcfmt.errors import CorruptError, LimitError, WrongBaseError  # noqa: E402
from arcfmt.reader import DeltaReader, StreamReader  # noqa: E402
from support.data import BF16, write_delta  # noqa: E402
from support.records import (  # noqa: E402  (the one record toolkit)
    FULL_INDEX_HEADER,
    assemble,
    index_fields,
    raw_index_payload,
    split,
)

DTYPES = [BF16, np.float16, np.float32, np.float64, np.int8, np.uint8, np.int32, np.bool_]
ENCODINGS = [None, None, None, "xor", "keyframe", "ctx-delta", "ctx-delta-as", "ctx-delta-rc", "ctx-delta-rp",
             "ctx-delta-rh", "ctx-delta-rhp"]
HISTORY = ("ctx-delta-rh", "ctx-delta-rhp")   # the encodings that need the previous step (1.9, 1.10)
CODECS = [None, None, "raw", "zstd", "xz", "bz2"]
BUDGET = 64 << 20  # output budget of the decoders under test


def random_model(rng):
    base, target = {}, {}
    for i in range(int(rng.integers(1, 4))):
        dt = DTYPES[int(rng.integers(len(DTYPES)))]
        shape = tuple(int(x) for x in rng.integers(0, 40, int(rng.integers(0, 3))))
        w = np.dtype(dt).itemsize
        n = int(np.prod(shape)) if shape else 1
        u = rng.integers(0, 256, n * w, dtype=np.uint8)
        if dt is np.bool_:
            u &= 1
        b = u.view(dt).reshape(shape)
        t = u.copy()
        if n:
            idx = rng.integers(0, n * w, int(rng.integers(0, n * w + 1) * rng.random() ** 3))
            t[idx] ^= rng.integers(1, 256, idx.size, dtype=np.uint8) if dt is not np.bool_ else 1
        name = f"t{i}" if rng.random() < 0.8 else f"layer.{i}.ß"
        base[name] = b
        target[name] = t.view(dt).reshape(shape)
    return base, target


def _previous_of(rng, base: dict) -> dict:
    """A step before ``base``: some of its bytes changed (format 1.9's previous step, SPEC.md §7)."""
    prev = {}
    for k, b in base.items():
        u = np.ascontiguousarray(b).view(np.uint8).reshape(-1).copy()
        if u.size:
            idx = rng.integers(0, u.size, int(rng.integers(0, u.size + 1) * rng.random() ** 2))
            u[idx] ^= rng.integers(1, 256, idx.size, dtype=np.uint8) if b.dtype != np.bool_ else 1
        prev[k] = u.view(b.dtype).reshape(b.shape)
    return prev


def random_file(rng):
    """``(base, target, data, previous)``: a valid file, its inputs, and the previous step it was
    written with (None: none; the file then needs none)."""
    base, target = random_model(rng)
    previous = None
    enc = ENCODINGS[int(rng.integers(len(ENCODINGS)))]
    kw = dict(block_elems=int(rng.choice([7, 64, 1 << 20])), force_codec=CODECS[int(rng.integers(len(CODECS)))],
              note="fuzz" if rng.random() < 0.2 else None)
    try:
        if enc == "keyframe" or rng.random() < 0.1:
            data = write_delta(None if rng.random() < 0.5 else base, target, keyframe=True, **kw)
        elif enc == "xor":
            data = write_delta(base, target, force_encoding="xor", **kw)
        elif enc in ("ctx-delta", "ctx-delta-as", "ctx-delta-rc", "ctx-delta-rp", *HISTORY):
            # float tensors as ctx-delta* (several classes at effort max), others as chosen; -rh, -rhp
            # (and, a third of the time, the default writer) with a previous step
            ctx_ok = {k for k, v in target.items() if v.dtype in (BF16, np.float16, np.float32)
                      and base[k].dtype == v.dtype and base[k].shape == v.shape}
            if enc in HISTORY or (enc == "ctx-delta-rc" and rng.random() < 0.3):
                previous = _previous_of(rng, {k: base[k] for k in ctx_ok})
                kw["previous"] = previous
                enc = enc if enc in HISTORY else None
            data = write_delta({k: base[k] for k in ctx_ok}, {k: target[k] for k in ctx_ok},
                                  force_encoding=enc, effort="max", **kw) if ctx_ok else \
                write_delta(base, target, **{k: v for k, v in kw.items() if k != "previous"})
            if ctx_ok:
                base, target = {k: base[k] for k in ctx_ok}, {k: target[k] for k in ctx_ok}
        else:
            data = write_delta(base, target, **kw)
    except ArcError:
        data, previous = write_delta(base, target), None
    return base, target, data, previous


def mutate_struct(rng, data):
    p = split(data)
    choice = rng.random()
    if choice < 0.6 and p.recs:
        r = p.recs[int(rng.integers(len(p.recs)))]
        pl = bytearray(r.payload)
        for _ in range(int(rng.integers(1, 4))):
            if pl and rng.random() < 0.8:
                k = int(rng.integers(len(pl)))
                pl[k] = int(rng.integers(256)) if rng.random() < 0.5 else pl[k] ^ (1 << int(rng.integers(8)))
            elif rng.random() < 0.5:
                pl.insert(int(rng.integers(len(pl) + 1)), int(rng.integers(256)))
            elif pl:
                del pl[int(rng.integers(len(pl)))]
        r.payload = bytes(pl)
        return assemble(p)
    if choice < 0.75 and len(p.recs) > 1:
        i, j = sorted(int(x) for x in rng.integers(0, len(p.recs), 2))
        p.recs[i], p.recs[j] = p.recs[j], p.recs[i]
        return assemble(p)
    if choice < 0.85:
        def fn(index):
            blocks = [b for e in index.entries for b in e.blocks]
            if index.others and rng.random() < 0.3:   # what a compact index derives the rest from (§10.1)
                o = index.others[int(rng.integers(len(index.others)))]
                setattr(o, ["offset", "size"][int(rng.integers(2))], int(rng.integers(0, 1 << 12)))
            elif blocks:
                b = blocks[int(rng.integers(len(blocks)))]
                field = ["offset", "size", "encoding"][int(rng.integers(3))]
                setattr(b, field, int(rng.integers(0, 256 if field == "encoding" else 1 << 12)))
        # either index layout (header flag COMPACT_INDEX, §10): a full one carries offsets and checksums
        return assemble(p, index_fn=fn, header=FULL_INDEX_HEADER if rng.random() < 0.5 else None)
    # the index body, bytes changed, codec raw
    body = bytearray(L.index_body(p.index.compact).build(index_fields(records.build_index(p.index), p.index.compact)))
    if body:
        k = int(rng.integers(len(body)))
        body[k] = int(rng.integers(256))
    return assemble(p, index_payload=raw_index_payload(body))


def mutate_bytes(rng, data):
    d = bytearray(data)
    for _ in range(int(rng.integers(1, 6))):
        op = rng.random()
        if not d:
            d += bytes([int(rng.integers(256))])
        elif op < 0.35:
            k = int(rng.integers(len(d)))
            d[k] ^= 1 << int(rng.integers(8))
        elif op < 0.55:
            d[int(rng.integers(len(d)))] = int(rng.choice([0, 0xFF, 0x7F, 0x80, int(rng.integers(256))]))
        elif op < 0.7:
            del d[int(rng.integers(len(d))):][:int(rng.integers(1, 64))]
        elif op < 0.8:
            k = int(rng.integers(len(d) + 1))
            d[k:k] = rng.integers(0, 256, int(rng.integers(1, 32)), dtype=np.uint8).tobytes()
        elif op < 0.9:
            d = d[: int(rng.integers(len(d) + 1))]
        else:
            a = int(rng.integers(len(d)))
            d[a:a] = d[a: a + int(rng.integers(1, 64))]
    return bytes(d)


def check_delta(base, target, data, intact, previous=None):
    """Run both readers (with the ``previous`` step, where the file was written with one); return a
    failure string or None."""
    for mode in ("random", "stream"):
        try:
            if mode == "random":
                out = DeltaReader(data, workers=1, max_output_bytes=BUDGET).decode_all(base, previous=previous)
            else:
                out = dict(StreamReader(io.BytesIO(data), base, max_output_bytes=BUDGET, previous=previous))
        except ArcError as exc:
            if not str(exc):
                return f"{mode}: {type(exc).__name__} without a message"
            if intact:
                return f"{mode}: valid file rejected: {type(exc).__name__}: {exc}"
            continue
        except Exception:  # noqa: BLE001 - exactly what we hunt
            return f"{mode}: non-ArcError exception:\n{traceback.format_exc()}"
        if set(out) != set(target) or any(out[k].tobytes() != np.asarray(target[k]).tobytes()
                                          or out[k].shape != np.asarray(target[k]).shape for k in target):
            return f"{mode}: decoded to tensors that differ from the target"
    return None


def _check_without_previous(base, data, previous) -> str | None:
    """A file written with a previous step, read without it or with another: refused as wrong_base
    (MissingPreviousError without one), or — where no tensor carries HISTORY — rebuilt as before."""
    from arcfmt.errors import MissingPreviousError, WrongBaseError
    reader = DeltaReader(data)
    history = {n for n in reader.names if reader.header(n).needs_history}   # the tensors that read it
    needs = bool(history)
    other = {k: np.ascontiguousarray(v).view(np.uint8).reshape(-1)[::-1].copy().view(v.dtype).reshape(v.shape)
             for k, v in previous.items()}   # bytes reversed: another value (or, rarely, the same)
    for given, want in ((None, MissingPreviousError), (other, WrongBaseError)):
        try:
            DeltaReader(data, workers=1, max_output_bytes=BUDGET).decode_all(base, previous=given)
        except want:
            continue
        except Exception:  # noqa: BLE001 - exactly what we hunt
            return f"previous {'missing' if given is None else 'other'}: wrong error:\n{traceback.format_exc()}"
        if needs and (given is None or any(np.asarray(other[k]).tobytes() != np.asarray(previous[k]).tobytes()
                                           for k in history)):
            return f"previous {'missing' if given is None else 'other'}: a file that needs it was decoded"
    return None


def check_safetensors(rng, tmpdir):
    from arcfmt.safetensors_io import open_checkpoint, write_file

    base, _ = random_model(rng)
    path = os.path.join(tmpdir, "x.safetensors")
    write_file(path, base)
    data = bytearray(open(path, "rb").read())
    data = bytearray(mutate_bytes(rng, bytes(data)))
    n = int.from_bytes(bytes(data[:8]).ljust(8, b"\0"), "little")
    if rng.random() < 0.5 and 8 < len(data):  # a header edit that keeps the JSON length field consistent
        try:
            h = json.loads(bytes(data[8:8 + n]))
            k = next((k for k in h if k != "__metadata__"), None)
            if k is not None:
                field = ["dtype", "shape", "data_offsets"][int(rng.integers(3))]
                h[k][field] = [["F32", "X9", 5, None][int(rng.integers(4))], [-1, 2], [0, 1 << 62],
                               "s"][int(rng.integers(4))]
                hb = json.dumps(h).encode()
                data = bytearray(len(hb).to_bytes(8, "little") + hb + bytes(data[8 + n:]))
        except (ValueError, UnicodeDecodeError):
            pass
    with open(path, "wb") as f:
        f.write(bytes(data))
    try:
        ck = open_checkpoint(path)
        for a in ck.tensors().values():
            np.asarray(a).tobytes()
    except ArcError as exc:
        if not str(exc):
            return "safetensors: ArcError without a message"
    except Exception:  # noqa: BLE001
        return f"safetensors: non-ArcError exception:\n{traceback.format_exc()}"
    return None


# ------------------------------------------------------------------------------------ shared helpers

def _leb128(n: int, pad: int = 0) -> bytes:
    """LEB128 of any non-negative integer (past 64 bits too: the decoders must refuse those);
    ``pad`` extra continuation bytes make a non-minimal encoding of the same value."""
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | 0x80 if n or pad else b)
        if not n:
            break
    for i in range(pad):
        out.append(0x80 if i < pad - 1 else 0x00)
    return bytes(out)


def _read_leb(buf, pos: int):
    n = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        n |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return n, pos


def _same_tensors(got: dict, want: dict) -> str | None:
    """None when ``got`` holds exactly ``want`` (names, dtypes, shapes, bytes); else what differs."""
    if set(got) != set(want):
        return (f"tensor names differ: extra {sorted(set(got) - set(want))[:4]!r}, "
                f"missing {sorted(set(want) - set(got))[:4]!r}")
    for k, w in want.items():
        g, w = np.asarray(got[k]), np.asarray(w)
        if g.dtype != w.dtype or g.shape != w.shape or g.tobytes() != w.tobytes():
            return f"tensor {k!r} differs ({g.dtype}{list(g.shape)} vs {w.dtype}{list(w.shape)})"
    return None


def _arc_fail(what: str, exc: BaseException) -> str | None:
    """A failure string for an exception out of arcfmt: None for an ArcError with a message."""
    if isinstance(exc, ArcError):
        return None if str(exc) else f"{what}: {type(exc).__name__} without a message"
    return f"{what}: non-ArcError exception:\n" + "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))


def _leftovers(folder: str) -> list:
    """Staging entries (``.arcfmt-tmp-``/``.arcfmt-old-``) left in ``folder``."""
    try:
        return sorted(n for n in os.listdir(folder) if n.startswith((".arcfmt-tmp-", ".arcfmt-old-")))
    except FileNotFoundError:
        return []


def _small_array(rng, dt=None, max_elems=24):
    dt = dt or DTYPES[int(rng.integers(len(DTYPES)))]
    shape = tuple(int(x) for x in rng.integers(0, 5, int(rng.integers(0, 3))))
    if int(np.prod(shape)) > max_elems:
        shape = (max_elems,)
    n = int(np.prod(shape)) if shape else 1
    u = rng.integers(0, 256, n * np.dtype(dt).itemsize, dtype=np.uint8)
    if dt is np.bool_:
        u &= 1
    return u.view(dt).reshape(shape)


def _changed(rng, a):
    """A copy of ``a`` with a few bytes changed (maybe none)."""
    u = np.ascontiguousarray(a).reshape(-1).view(np.uint8).copy()
    if u.size and rng.random() < 0.8:
        idx = rng.integers(0, u.size, int(rng.integers(1, u.size + 1)))
        u[idx] ^= 1 if a.dtype == np.bool_ else rng.integers(1, 256, idx.size, dtype=np.uint8)
    return u.view(a.dtype).reshape(a.shape)


# ------------------------------------------------------------------------------------ names

# valid under SPEC.md §7 however odd (C1 controls, noncharacters, paths, 1024 bytes exactly)
VALID_NAMES = ["a", "layer.0.weight", "ß", "日本語", "😀", "\u0080", "\u009f", "\ufffe", "\uffff", "\U0010ffff",
               "/", "..", "../etc/passwd", " ", "\u00a0", "\u2028", "\u202e", "e\u0301", "__metadata", "__metadata__ ",
               "__METADATA__", " __metadata__", "\\", "\"", "%s", "{}", "\\u0000", "null", "\ufeff", "x" * 1024,
               "ß" * 512, "€" * 341 + "a", "😀" * 256, "a/b/../c", "model.safetensors.index.json", "<script>"]
# invalid: empty, reserved, lone surrogates, C0 controls and U+007F, over 1024 bytes
BAD_NAMES = ["", "__metadata__", "\ud800", "a\udfff", "\udc80x", "\udbff\udfff", "x" * 1025, "ß" * 512 + "a",
             "😀" * 256 + "a", "\x00", "a\x7f", "\x1f", "tab\there", "line\nbreak", "\x1b[31mred"]
# invalid UTF-8 byte strings, for record surgery only
BAD_NAME_BYTES = [b"\xff", b"\xc0\x80", b"\xc1\xbf", b"\xed\xa0\x80", b"\xed\xbf\xbf", b"\xe2\x82", b"a\x80",
                  b"\xf4\x90\x80\x80", b"\xf8\x88\x80\x80\x80", b"\xe0\x80\xaf", b"ok\xfe"]
_CHAR_POOLS = [(0x21, 0x7F), (0x80, 0x100), (0x100, 0xD800), (0xE000, 0x10000), (0x10000, 0x110000)]


def random_name(rng):
    """A tensor name: str (valid or not) or, rarely, not a str at all."""
    r = rng.random()
    if r < 0.03:
        return [b"bytes", 7, None, ("t",)][int(rng.integers(4))]
    if r < 0.3:
        return VALID_NAMES[int(rng.integers(len(VALID_NAMES)))]
    if r < 0.55:
        return BAD_NAMES[int(rng.integers(len(BAD_NAMES)))]
    if r < 0.7:  # a valid name with one control character or lone surrogate put in
        s = VALID_NAMES[int(rng.integers(len(VALID_NAMES)))]
        bad = (chr(int(rng.choice(list(range(32)) + [127]))) if rng.random() < 0.6
               else chr(0xD800 + int(rng.integers(0x800))))
        k = int(rng.integers(len(s) + 1))
        return s[:k] + bad + s[k:]
    if r < 0.88:  # random code points, now and then a control character or a surrogate
        out = []
        for _ in range(int(rng.integers(1, 20))):
            if rng.random() < 0.03:
                out.append(chr(int(rng.choice([0, 9, 10, 27, 31, 127, 0xD800, 0xDFFF]))))
            else:
                lo, hi = _CHAR_POOLS[int(rng.integers(len(_CHAR_POOLS)))]
                c = int(rng.integers(lo, hi))
                out.append(chr(c) if not 0xD800 <= c < 0xE000 else "s")
        return "".join(out)
    # around MAX_NAME_BYTES, in characters of 1 to 4 bytes
    target = int(rng.integers(1018, 1031))
    chars, n = [], 0
    while n < target:
        c = ["a", "ß", "€", "😀"][int(rng.integers(4))]
        chars.append(c)
        n += len(c.encode())
    return "".join(chars)


def name_bytes_ok(raw: bytes) -> bool:
    """SPEC.md §7, written out again here: the oracle for names."""
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return 0 < len(raw) <= 1024 and raw != b"__metadata__" and not any(c < 0x20 or c == 0x7F for c in raw)


def name_ok(name) -> bool:
    if not isinstance(name, str):
        return False
    try:
        return name_bytes_ok(name.encode("utf-8"))
    except UnicodeEncodeError:
        return False


class RawName(str):
    """A tensor name for the record toolkit whose UTF-8 form is given bytes (invalid UTF-8 included):
    ``records.build_index`` writes ``name.encode("utf-8")``."""

    def __new__(cls, raw: bytes):
        s = super().__new__(cls, raw.decode("utf-8", "surrogateescape"))
        s.raw = raw
        return s

    def encode(self, *args, **kw):
        return self.raw


def _set_tens_name(payload: bytes, raw: bytes) -> bytes:
    n, pos = _read_leb(payload, 0)
    return _leb128(len(raw)) + raw + payload[pos + n:]


def rename_surgery(rng, good: bytes, raw: bytes):
    """Give one tensor the name ``raw`` in its TENS record, its index entry, or both (or the name of
    another tensor: a duplicate). Returns (file, mode) or None when the file has no tensor."""
    p = split(good)
    tens = [r for r in p.recs if r.type == L.TENS]
    if not tens:
        return None
    r = tens[int(rng.integers(len(tens)))]
    mode = ["both"] * 6 + ["tens", "tens", "indx", "indx", "dup"]
    mode = mode[int(rng.integers(len(mode)))]
    if mode == "dup":
        others = [t for t in tens if t is not r]
        if not others:
            mode = "both"
        else:
            raw = others[int(rng.integers(len(others)))].name.encode("utf-8")
    if mode in ("both", "tens", "dup"):
        r.payload = _set_tens_name(r.payload, raw)
    if mode in ("both", "indx", "dup"):
        r.name = RawName(raw)
    return assemble(p), mode


def _expect_class(exc, cls, mode: str) -> str | None:
    if exc is None:
        return f"{mode}: decoded, expected {getattr(cls, '__name__', cls)}"
    if not isinstance(exc, cls):
        names = " or ".join(c.__name__ for c in (cls if isinstance(cls, tuple) else (cls,)))
        return f"{mode}: {type(exc).__name__} ({exc}), expected {names}"
    return None


def _both_readers(base, data, previous=None):
    """[(mode, exception or None, output)] for the random-access and the streaming reader."""
    out = []
    for mode in ("random", "stream"):
        try:
            if mode == "random":
                res = DeltaReader(data, workers=1, max_output_bytes=BUDGET).decode_all(base, previous=previous)
            else:
                res = dict(StreamReader(io.BytesIO(data), base, max_output_bytes=BUDGET, previous=previous))
            out.append((mode, None, res))
        except Exception as exc:  # noqa: BLE001 - sorted out by the callers
            out.append((mode, exc, None))
    return out


def check_names(rng, tmpdir, cached):
    """Returns (failure or None, data to save or None)."""
    from arcfmt import InputError, decode, encode
    from arcfmt.safetensors_io import read_file, write_file

    name = random_name(rng)
    ok = name_ok(name)
    arr = _small_array(rng)
    target = {name: arr}
    if rng.random() < 0.5 and name != "other":
        target["other"] = _small_array(rng)
    base = None
    if rng.random() < 0.5 and ok:
        base = {k: _changed(rng, v) for k, v in target.items()}
    # 1. through the writer: InputError for a bad name, a faithful round trip for a good one
    try:
        data = encode(base, target, workers=1, keyframe=rng.random() < 0.2)
    except InputError as exc:
        if ok:
            return f"names: encode refused the valid name {name!r}: {exc}", None
        if not str(exc):
            return "names: InputError without a message", None
    except Exception as exc:  # noqa: BLE001
        return (f"names: encode of {name!r} raised {type(exc).__name__}, expected InputError"
                if isinstance(exc, ArcError) else _arc_fail(f"names: encode of {name!r}", exc)), None
    else:
        if not ok:
            return f"names: encode accepted the invalid name {name!r}", data
        fail = check_delta(base or {}, target, data, intact=True)
        if fail:
            return f"names: {name!r}: {fail}", data
        try:
            if decode(base, data, workers=1).keys() != target.keys():
                return f"names: decode of {name!r} gave other names", data
            if rng.random() < 0.3:  # a valid name is a valid safetensors key (SPEC.md §19)
                path = os.path.join(tmpdir, "names.safetensors")
                write_file(path, {name: arr})
                got = read_file(path)
                if got.names != [name]:
                    return f"names: safetensors round trip of {name!r} gave {got.names!r}", data
        except Exception as exc:  # noqa: BLE001
            return (_arc_fail(f"names: round trip of {name!r}", exc)
                    or f"names: round trip of {name!r} refused: {exc}"), data
    # 2. by record surgery into a valid file: both readers must refuse
    if isinstance(name, str):
        raw = name.encode("utf-8", "surrogatepass")
    else:
        raw = BAD_NAME_BYTES[int(rng.integers(len(BAD_NAME_BYTES)))]
    if rng.random() < 0.15:
        raw = BAD_NAME_BYTES[int(rng.integers(len(BAD_NAME_BYTES)))]
    cbase, ctarget, good, cprev = cached
    res = rename_surgery(rng, good, raw)
    if res is None:
        return None, None
    data, mode = res
    fail = check_delta(cbase, ctarget, data, intact=False, previous=cprev)
    if fail:
        return f"names ({mode}, {raw[:40]!r}): {fail}", data
    if not name_bytes_ok(raw) or mode == "dup":
        want = L.MAX_NAME_BYTES < len(raw) and LimitError or CorruptError
        if mode == "dup":
            want = CorruptError
        for rmode, exc, _ in _both_readers(cbase, data, cprev):
            # a streaming reader meets the renamed tensor before its namesake, whose base it may fail on;
            # and, names being prefixed (§7), with only the index's name changed it joins the next TENS
            # name onto the record's own name, not the index's: a name the base may lack (§12.2 step 3
            # checks that base before step 4 reads the index)
            w = (want, WrongBaseError) if mode in ("dup", "indx") and rmode == "stream" else want
            fail = _expect_class(exc, w, f"names ({mode} {rmode}, {raw[:40]!r})")
            if fail:
                return fail, data
    return None, None


# ------------------------------------------------------------------------------------ dims

_BIG_DIMS = [[0], [0, 0], [2 ** 40], [2 ** 40 + 1], [2 ** 20, 2 ** 20], [2 ** 20, 2 ** 20 + 1], [2 ** 40, 1],
             [1, 2 ** 40, 2], [2 ** 32, 2 ** 32], [0, 2 ** 32, 2 ** 32], [2 ** 32, 0, 2 ** 32], [2 ** 63, 2],
             [2 ** 64 - 1], [0, 2 ** 64 - 1], [2 ** 64 - 1, 0], [2 ** 64 - 1, 2 ** 64 - 1], [16] * 16, [2] * 16,
             [1] * 16, [1] * 17, [0] * 17, [2 ** 64], [0, 2 ** 64], [2 ** 70], [3, 2 ** 39], [2 ** 39, 3],
             [0, 2 ** 41], [2 ** 41, 0], [2 ** 24, 2 ** 16], [2 ** 24, 2 ** 16 + 1], [2 ** 30], [2 ** 26, 7]]
_BLOCK_ELEMS = [0, 1, 7, 2 ** 24, 2 ** 24 + 1, 2 ** 32, 2 ** 64 - 1, 2 ** 64]


def random_dims(rng, dims: list) -> list:
    r = rng.random()
    if r < 0.4:
        return list(_BIG_DIMS[int(rng.integers(len(_BIG_DIMS)))])
    if r < 0.55:  # a zero put in, or one dimension made huge
        d = list(dims) or [1]
        k = int(rng.integers(len(d) + 1))
        v = int(rng.choice([0, 0, 2 ** 40, 2 ** 41, 2 ** 63, 2 ** 64 - 1]))
        return d[:k] + [v] + d[k:] if rng.random() < 0.5 else d[:k] + [v] + d[k + 1:]
    if r < 0.7:  # the same element count, another shape (a digest must catch it)
        n = int(np.prod(dims)) if dims else 1
        return [[n], [1, n], [n, 1], list(reversed(dims)), [1] + list(dims), []][int(rng.integers(6))] if n else [0]
    out = []
    for _ in range(int(rng.integers(0, 18))):
        k = rng.random()
        out.append(int(rng.integers(0, 4)) if k < 0.5 else (1 << int(rng.integers(0, 64))) + int(rng.integers(-1, 2))
                   if k < 0.9 else int(rng.integers(0, 2 ** 63)) * 2 + int(rng.integers(2)))
    return [max(0, d) for d in out]


def dims_expect(dims: list, block_elems: int, pad: bool):
    """The error class SPEC.md §7 and §1 name for these fields, in its order of checks; None where
    only 'some ArcError, or the original tensor' can be said."""
    C, Lim = CorruptError, LimitError
    if len(dims) > 16:
        return Lim
    if pad or block_elems >= 2 ** 64 or any(d >= 2 ** 64 for d in dims):
        return C
    p = 1
    for d in dims:
        if d:
            p *= d
            if p > 2 ** 40:
                return Lim
    if block_elems == 0:
        return C
    if block_elems > 2 ** 24:
        return Lim
    n = 0 if 0 in dims else p
    if -(-n // block_elems) > 2 ** 24:
        return Lim
    return None


def dims_surgery(rng, good: bytes):
    p = split(good)
    tens = [r for r in p.recs if r.type == L.TENS]
    if not tens:
        return None
    r = tens[int(rng.integers(len(tens)))]
    history = bool(int.from_bytes(p.recs[0].payload[:4], "little") & L.META_HISTORY)   # 1.9: previous_hash
    t = L.parse_tensor_payload(r.payload, "fuzz", None, history)
    dims = random_dims(rng, list(t.dims)) if rng.random() < 0.9 else list(t.dims)
    be = t.block_elems if rng.random() < 0.75 else int(rng.choice(_BLOCK_ELEMS))
    pad = rng.random() < 0.05 and bool(dims)
    k = int(rng.integers(len(dims))) if pad else -1
    body = _leb128(len(t.name)) + bytes(t.name) + bytes([t.dtype, len(dims)])
    body += b"".join(_leb128(d, pad=int(rng.integers(1, 3)) if i == k else 0) for i, d in enumerate(dims))
    body += _leb128(be) + bytes([t.flags])
    if t.flags & 1:
        body += struct.pack("<Q", t.base_hash)
    if t.previous_hash is not None:
        body += struct.pack("<Q", t.previous_hash)
    r.payload = body + struct.pack("<Q", t.target_hash)
    return assemble(p), dims, be, pad


def check_dims(rng, cached):
    base, target, good, previous = cached
    res = dims_surgery(rng, good)
    if res is None:
        return None, None
    data, dims, be, pad = res
    fail = check_delta(base, target, data, intact=data == good, previous=previous)
    if fail:
        return f"dims {dims} block_elems {be}: {fail}", data
    want = dims_expect(dims, be, pad)
    if want is not None:
        for mode, exc, _ in _both_readers(base, data, previous):
            fail = _expect_class(exc, want, f"dims {dims} block_elems {be} ({mode})")
            if fail:
                return fail, data
    return None, None


# ------------------------------------------------------------------------------------ layouts

def _garbage(rng, lo, hi) -> bytes:
    return rng.integers(0, 256, int(rng.integers(lo, hi + 1)), dtype=np.uint8).tobytes()


def write_odd_safetensors(rng, path: str, tensors: dict, metadata) -> None:
    """A valid safetensors file laid out unusually: data in another order than the header's keys,
    gaps (of garbage) before, between and after tensors, ``__metadata__`` anywhere among the keys,
    zero-size tensors, compact or spaced JSON, padded or not."""
    from arcfmt.arrays import as_uint

    names = list(tensors)
    data = bytearray(_garbage(rng, 1, 16) if rng.random() < 0.3 else b"")
    entries = {}
    for i in rng.permutation(len(names)):
        n = names[int(i)]
        dt, shape, u = as_uint(tensors[n])
        begin = len(data)
        data += memoryview(np.ascontiguousarray(u)).cast("B")
        entries[n] = {"dtype": dt.name, "shape": list(shape), "data_offsets": [begin, len(data)]}
        if rng.random() < 0.4:
            data += _garbage(rng, 1, 16)
    if rng.random() < 0.2:
        data += _garbage(rng, 1, 32)
    keys = [names[int(i)] for i in rng.permutation(len(names))]
    if metadata is not None:
        keys.insert(int(rng.integers(len(keys) + 1)), "__metadata__")
    header = {}
    for k in keys:
        e = entries.get(k, metadata) if k != "__metadata__" else metadata
        if k != "__metadata__" and rng.random() < 0.3:
            e = {f: e[f] for f in ("data_offsets", "shape", "dtype")}   # another field order
        header[k] = e
    seps = [(",", ":"), (", ", ": ")][int(rng.integers(2))]
    hb = json.dumps(header, separators=seps, ensure_ascii=rng.random() < 0.5).encode("utf-8")
    if rng.random() < 0.7:
        hb += b" " * (-len(hb) % 8 + 8 * int(rng.integers(0, 2)))
    with open(path, "wb") as f:
        f.write(len(hb).to_bytes(8, "little") + hb + bytes(data))


def _layout_model(rng):
    names = set()
    base = {}
    for i in range(int(rng.integers(1, 5))):
        n = f"w{i}" if rng.random() < 0.7 else VALID_NAMES[int(rng.integers(len(VALID_NAMES)))]
        if n in names:
            n = f"w{i}"
        names.add(n)
        a = _small_array(rng)
        if rng.random() < 0.15:
            a = np.zeros((0,) if rng.random() < 0.5 else (3, 0), a.dtype)
        base[n] = a
    target = {}
    for n, a in base.items():
        r = rng.random()
        if r < 0.4:
            target[n] = a
        elif r < 0.8:
            target[n] = _changed(rng, a)
        elif r < 0.88:
            target[n] = _small_array(rng)   # dtype or shape changes
        # else: dropped
    if rng.random() < 0.15 or not target and rng.random() < 0.9:
        target["new.ß"] = _small_array(rng)
    return base, target


def _metadata(rng):
    return [None, {"format": "pt"}, {"format": "pt", "note": "ß ☃", "": ""}, {}][int(rng.integers(4))]


def _snapshot(path: str) -> dict:
    """relative name -> bytes of a file or of a folder's tree."""
    if os.path.isfile(path):
        with open(path, "rb") as f:
            return {"": f.read()}
    out = {}
    for root, _, files in os.walk(path):
        for n in files:
            p = os.path.join(root, n)
            with open(p, "rb") as f:
                out[os.path.relpath(p, path)] = f.read()
    return out


def _make_base(rng, folder: str, base: dict):
    """The base checkpoint under ``folder``: one file, or a folder of shards (with or without an index,
    with a config file beside them). Returns (path, metadata of its single file or None)."""
    from arcfmt.safetensors_io import INDEX_NAME

    os.makedirs(folder)
    if rng.random() < 0.75 or len(base) < 2:
        path = os.path.join(folder, "model.safetensors")
        meta = _metadata(rng)
        write_odd_safetensors(rng, path, base, meta)
        return path, meta
    path = os.path.join(folder, "model")
    os.makedirs(path)
    names = list(base)
    cut = int(rng.integers(1, len(names)))
    shards = [("model-00001-of-00002.safetensors", names[:cut]), ("model-00002-of-00002.safetensors", names[cut:])]
    for fname, ns in shards:
        write_odd_safetensors(rng, os.path.join(path, fname), {n: base[n] for n in ns}, _metadata(rng))
    if rng.random() < 0.5:
        with open(os.path.join(path, INDEX_NAME), "w") as f:
            json.dump({"metadata": {"total_size": 0}, "weight_map": {n: fn for fn, ns in shards for n in ns}}, f)
    if rng.random() < 0.5:
        with open(os.path.join(path, "config.json"), "w") as f:
            f.write('{"hidden": 8}')
    return path, None


def _read_back(path: str, target: dict, meta, what: str) -> str | None:
    from arcfmt.safetensors_io import open_checkpoint, read_file

    try:
        got = open_checkpoint(path).tensors()
        bad = _same_tensors(got, target)
        if bad:
            return f"{what}: the output does not hold the target: {bad}"
        if os.path.isfile(path) and read_file(path).metadata != meta:
            return f"{what}: the output's __metadata__ is {read_file(path).metadata!r}, the base's {meta!r}"
    except Exception as exc:  # noqa: BLE001
        return f"{what}: the output does not read back: {type(exc).__name__}: {exc}"
    return None


def check_layouts(rng, tmpdir, case, timed=None):
    """Returns (failure or None, {name: bytes} to save or None); adds the seconds the two applies
    took to ``timed[0]``."""
    from arcfmt.checkpoint import apply_delta, encode_checkpoints
    from arcfmt.safetensors_io import write_file

    work = os.path.join(tmpdir, f"layouts-{case}")
    os.makedirs(work)
    saved = {}
    try:
        base, target = _layout_model(rng)
        src, meta = _make_base(rng, os.path.join(work, "src"), base)
        tpath = os.path.join(work, "target.safetensors")
        if rng.random() < 0.6:
            write_file(tpath, target)
        else:
            write_odd_safetensors(rng, tpath, target, _metadata(rng))
        dpath = os.path.join(work, "delta.arc")
        encode_checkpoints(src, tpath, dpath, base_step=int(rng.integers(0, 3)), target_step=3,
                           block_elems=int(rng.choice([7, 64, 1 << 20])),
                           effort=["fast", "default"][int(rng.integers(2))], workers=1, keyframe=rng.random() < 0.1)
        clean = True
        if rng.random() < 0.12:  # a damaged delta: refused, or (if the damage is harmless) the target
            with open(dpath, "rb") as f:
                good = f.read()
            bad = mutate_struct(rng, good) if rng.random() < 0.5 else mutate_bytes(rng, good)
            clean = bad == good
            with open(dpath, "wb") as f:
                f.write(bad)
        tamper = rng.random() < 0.1
        saved = {"target.safetensors": _snapshot(tpath)[""], "delta.arc": _snapshot(dpath)[""]}
        saved.update({f"base/{k}": v for k, v in _snapshot(src).items()})
        for mode in ("new", "in-place"):
            side = os.path.join(work, mode)
            shutil.copytree(os.path.dirname(src), side)
            bpath = os.path.join(side, os.path.basename(src))
            if tamper:  # the wrong base: one byte of the data section of one file changed
                f = bpath if os.path.isfile(bpath) else os.path.join(bpath, min(
                    n for n in os.listdir(bpath) if n.endswith(".safetensors")))
                with open(f, "r+b") as fh:
                    d = bytearray(fh.read())
                    n = int.from_bytes(d[:8], "little")
                    if len(d) > 8 + n:
                        k = 8 + n + int(rng.integers(len(d) - 8 - n))
                        d[k] ^= 1 << int(rng.integers(8))
                        fh.seek(0)
                        fh.write(d)
                        clean = False
            before, listing = _snapshot(bpath), sorted(os.listdir(side))
            t0 = time.perf_counter()
            out_dir = os.path.join(work, f"{mode}-out")
            os.makedirs(out_dir)
            dest = os.path.join(out_dir, "out" + ("" if os.path.isdir(bpath) else ".safetensors"))
            try:
                if mode == "new":
                    apply_delta(bpath, dpath, dest, workers=1)
                else:
                    apply_delta(bpath, dpath, in_place=True, workers=1)
                exc = None
            except Exception as e:  # noqa: BLE001
                exc = e
            if timed is not None:
                timed[0] += time.perf_counter() - t0
            where = f"layouts ({mode})"
            if exc is not None:
                fail = _arc_fail(where, exc)
                if fail:
                    return fail, saved
                if clean:
                    return f"{where}: a valid delta was refused: {type(exc).__name__}: {exc}", saved
                if _snapshot(bpath) != before:
                    return f"{where}: refused ({type(exc).__name__}) but the base changed", saved
                if mode == "new" and os.listdir(out_dir):
                    return f"{where}: refused ({type(exc).__name__}) but left {os.listdir(out_dir)} behind", saved
            else:
                if mode == "new" and _snapshot(bpath) != before:
                    return f"{where}: the base changed", saved
                fail = _read_back(bpath if mode == "in-place" else dest, target, meta, where)
                if fail:
                    return fail, saved
                if mode == "in-place" and os.path.isdir(bpath) and "config.json" in before and \
                        _snapshot(bpath).get("config.json") != before["config.json"]:
                    return f"{where}: config.json beside the weights was lost", saved
            if sorted(os.listdir(side)) != listing or _leftovers(out_dir):
                return (f"{where}: left {sorted(set(os.listdir(side)) - set(listing))} "
                        f"{_leftovers(out_dir)} beside the checkpoint"), saved
        return None, None
    finally:
        shutil.rmtree(work, ignore_errors=True)


# ------------------------------------------------------------------------------------ store

_STREAM_SEQ = [0]


def _memfs():
    import fsspec
    return fsspec.filesystem("memory")


def _stream_objects(url: str) -> dict:
    fs = _memfs()
    root = url.split("://", 1)[1]
    root = "/" + root.strip("/")
    out = {p[len(root) + 1:]: fs.cat_file(p) for p in fs.find(root)}
    fs.rm(root, recursive=True)
    return out


def build_stream(rng):
    """Publish a small random model (1-2 shards, 1-3 steps) with arcfmt.Publisher into memory://.
    Returns {"objects": {name: bytes}, "published": {step: {tensor: array}}, ...}."""
    from arcfmt import Publisher
    from arcfmt.store import names as N

    _STREAM_SEQ[0] += 1
    url = f"memory://arcfz-build-{os.getpid()}-{_STREAM_SEQ[0]}"
    n = 1 if rng.random() < 0.5 else 2
    start = int(rng.choice([0, 1, 7])) if rng.random() < 0.95 else N.MAX_STEP - 5
    steps = [start]
    for _ in range(int(rng.integers(0, 3))):
        steps.append(steps[-1] + int(rng.integers(1, 3)))
    writer = None if rng.random() < 0.7 else "job-7"
    pubs = [Publisher(url, shard=i, num_shards=n, keyframe_every=int(rng.choice([0, 1, 2, 3])), workers=1,
                      writer=writer, block_elems=int(rng.choice([7, 64, 1 << 20])), effort="fast") for i in range(n)]
    cur = []
    for i in range(n):
        t = {}
        for j in range(int(rng.integers(1, 3))):
            nm = f"s{i}.w{j}" if rng.random() < 0.8 else f"s{i}.{VALID_NAMES[int(rng.integers(len(VALID_NAMES) - 10))]}"
            t[nm] = _small_array(rng)
        cur.append(t)
    if rng.random() < 0.04:  # a shard with no tensors (with one shard: an empty model)
        cur[int(rng.integers(n))] = {}
    published = {}
    for step in steps:
        for i in range(n):
            pubs[i].publish(step, cur[i], keyframe=True if rng.random() < 0.15 else None)
        published[step] = {k: v for t in cur for k, v in t.items()}
        cur = [{k: (_changed(rng, v) if rng.random() < 0.7 else v) if rng.random() < 0.95 else _small_array(rng)
                for k, v in t.items()} for t in cur]
    return dict(objects=_stream_objects(url), published=published, shards=n, steps=steps)


_JSON_VALUES = [2 ** 63 - 1, 2 ** 63, 2 ** 64 - 1, 2 ** 64 - 2, 2 ** 64, 2 ** 70, -1, -(2 ** 63), 0, 1, 52, 56, 107,
                108, 4096, 10 ** 30, True, False, None, "", "x", "0" * 32, "f" * 16, "F" * 32, [], {}, [1, 0], [2, 0],
                [1], [0, 0, 0], "head.json", "../x", "steps/../head.json", "model.safetensors",
                "model.safetensors.index.json", "a" * 300 + ".safetensors", "BF16", "\ud800", "\x00"]


def _json_paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _json_paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _json_paths(v, prefix + (i,))


def _get(obj, path):
    for k in path:
        obj = obj[k]
    return obj


def _refs(obj):
    """Every object reference (a dict with "size" and "index_offset") inside a JSON value."""
    out = []
    for p in _json_paths(obj):
        v = _get(obj, p)
        if isinstance(v, dict) and "size" in v and "index_offset" in v:
            out.append(v)
    return out


def _odd_value(rng, cur, strings):
    pool = list(_JSON_VALUES)
    if isinstance(cur, int) and not isinstance(cur, bool):
        pool += [cur + 1, cur - 1, cur * 2, cur // 2, cur + 2 ** 32, -cur] * 3
    if isinstance(cur, str):
        pool += [cur.upper(), cur[:-1], cur + "0", cur[::-1], cur.replace("0", "1", 1)] * 2
    if strings and rng.random() < 0.2:
        return strings[int(rng.integers(len(strings)))]
    return pool[int(rng.integers(len(pool)))]


def mutate_json_obj(rng, obj, stream) -> None:
    """Change one thing in a decoded JSON object, in place."""
    paths = list(_json_paths(obj))[1:]
    strings = [_get(obj, p) for p in paths if isinstance(_get(obj, p), str)]
    r = rng.random()
    refs = _refs(obj)
    if r < 0.3 and refs:  # an object reference's bounds and kind
        ref = refs[int(rng.integers(len(refs)))]
        size, io_ = ref.get("size"), ref.get("index_offset")
        if not isinstance(size, int) or not isinstance(io_, int):
            return
        k = int(rng.integers(9))
        if k == 0:
            ref["size"] = 2 ** 63 - 1
        elif k == 1:
            ref["size"] = size + int(rng.choice([-1, 1, 2, -56, 4096]))
        elif k == 2:
            ref["index_offset"] = int(rng.choice([size - 56, size - 55, size, size + 1, 52, 51, io_ + 1, io_ - 1,
                                                  2 ** 63 - 1]))
        elif k == 3:
            ref["size"], ref["index_offset"] = 2 ** 63 - 1, 2 ** 63 - 1 - 56
        elif k == 4:
            ref["size"], ref["index_offset"] = 2 ** 63 - 1, io_
        elif k == 5:
            ref["base_step"] = int(rng.choice(stream["steps"] + [0, 2 ** 64 - 2, -1]))
        elif k == 6:
            ref.pop(["base_step", "base_digest", "tail_xxh3_64", "xxh3_128", "name"][int(rng.integers(5))], None)
        elif k == 7:
            ref["index_offset"] = 52 + int(rng.integers(max(1, size - 52)))
        else:
            ref["size"] = 108 + int(rng.integers(max(1, size)))
        return
    if not paths:
        return
    path = paths[int(rng.integers(len(paths)))]
    parent, key = _get(obj, path[:-1]), path[-1]
    spaths = [p for p in paths if isinstance(_get(obj, p), str)]
    if r < 0.62 or (r < 0.7 and len(spaths) < 2):
        parent[key] = _odd_value(rng, parent[key], strings)
    elif r < 0.7:  # two strings swapped (names, digests, hashes, file names)
        a, b = (spaths[int(i)] for i in rng.choice(len(spaths), 2, replace=False))
        pa, pb = _get(obj, a[:-1]), _get(obj, b[:-1])
        pa[a[-1]], pb[b[-1]] = pb[b[-1]], pa[a[-1]]
    elif r < 0.82:
        del parent[key]
    elif r < 0.9 and isinstance(parent, dict):  # an unknown key: must be ignored
        parent[f"zz_unknown_{int(rng.integers(3))}"] = _odd_value(rng, None, strings)
    elif isinstance(parent, list) and len(parent) > 1:
        parent.reverse() if rng.random() < 0.5 else parent.append(parent[0])
    else:
        obj["step"] = int(rng.choice(stream["steps"] + [2 ** 64 - 2]))


def _encode_json(rng, obj) -> bytes:
    from arcfmt.store.objects import canonical
    r = rng.random()
    try:
        if r < 0.85:
            return canonical(obj)
        if r < 0.95:
            return json.dumps(obj, indent=int(rng.integers(0, 3)),
                              ensure_ascii=rng.random() < 0.5).encode("utf-8", "surrogatepass")
        text = canonical(obj).decode()
        k = int(rng.integers(5))
        if k == 0:
            return text.replace("{", '{"step":0,', 1).encode()          # a duplicate key (or a new one)
        if k == 1:
            return text.replace(":1,", ":1.0,", 1).replace(":0,", ":NaN,", 1).encode()
        if k == 2:
            return (text[:-2] + ',"deep":' + "[" * 100 + "]" * 100 + "}\n").encode()       # nesting past the cap
        if k == 3:
            return b"\xef\xbb\xbf" + text.encode()
        return text.encode() + b"\x00"
    except (TypeError, ValueError):
        return b"{}"


def _rechain_manifest(objs, name, new_raw, _seen=None) -> None:
    """Put a changed manifest in, and point its successors' ``base_manifest`` and the head at it."""
    from arcfmt.store.objects import canonical, digest128
    seen = _seen if _seen is not None else set()
    seen.add(name)
    old_d = digest128(objs[name])
    objs[name] = new_raw
    new_d = digest128(new_raw)
    if old_d == new_d:
        return
    try:
        h = json.loads(objs["head.json"])
        if h.get("manifest") == old_d:
            h["manifest"] = new_d
            objs["head.json"] = canonical(h)
    except (KeyError, ValueError, AttributeError):
        pass
    for other in [n for n in objs if n.endswith("/manifest.json") and n not in seen]:
        try:
            m = json.loads(objs[other])
        except ValueError:
            continue
        if isinstance(m, dict) and m.get("base_manifest") == old_d:
            m["base_manifest"] = new_d
            _rechain_manifest(objs, other, canonical(m), seen)


def _step_dir(name: str) -> str:
    return name.rsplit("/", 1)[0]


def _rechain_descriptor(objs, name, new_raw) -> None:
    from arcfmt.store.objects import canonical, digest128
    old_d = digest128(objs[name])
    objs[name] = new_raw
    mname = _step_dir(name) + "/manifest.json"
    try:
        m = json.loads(objs[mname])
        for s in m["shards"]:
            if s.get("descriptor") == old_d:
                s["descriptor"] = digest128(new_raw)
        _rechain_manifest(objs, mname, canonical(m))
    except (KeyError, ValueError, TypeError, AttributeError):
        pass


def _fix_tails(objs, obj) -> None:
    """Recompute every reference's tail hash over the bytes its (maybe changed) bounds name."""
    import xxhash
    for ref in _refs(obj):
        data = objs.get(ref.get("name")) if isinstance(ref.get("name"), str) else None
        s, io_ = ref.get("size"), ref.get("index_offset")
        if data is not None and isinstance(s, int) and isinstance(io_, int) and 0 <= io_ <= s:
            ref["tail_xxh3_64"] = xxhash.xxh3_64_hexdigest(data[io_:s])


def _replace_data(rng, objs, name, new) -> None:
    """Replace data object ``name`` by ``new`` and update every reference to it (and the chain)."""
    import re

    import xxhash

    from arcfmt import records
    from arcfmt.store import names as N
    from arcfmt.store.objects import canonical

    del objs[name]
    m = re.match(r"steps/(\d{20})/shard-(\d{5})-of-(\d{5})-(delta|keyframe)-([0-9a-f]{32})\.arc\Z", name)
    digest = xxhash.xxh3_128_hexdigest(new)
    rename = rng.random() < 0.7
    new_name = N.object_name(int(m.group(1)), int(m.group(2)), int(m.group(3)), m.group(4), digest) if rename else name
    objs[new_name] = new
    try:
        io_ = records.check_trailer(new[-40:], len(new)).index_offset
    except Exception:  # noqa: BLE001 - a damaged trailer: keep the old offset
        io_ = None
    sdir = _step_dir(name)

    def update(obj) -> bool:
        hit = False
        for ref in _refs(obj):
            if ref.get("name") == name:
                hit = True
                ref.update(name=new_name, size=len(new))
                if rename:
                    ref["xxh3_128"] = digest
                if io_ is not None:
                    ref["index_offset"] = io_
        if hit:
            _fix_tails(objs, obj)
        return hit

    # the descriptors first (their new digests go into the manifest), then the manifest itself
    mname = sdir + "/manifest.json"
    for jname in [n for n in objs if n.startswith(sdir + "/shard-") and n.endswith(".json")]:
        try:
            obj = json.loads(objs[jname])
        except ValueError:
            continue
        if update(obj):
            _rechain_descriptor(objs, jname, canonical(obj))
    try:
        obj = json.loads(objs[mname])
    except (KeyError, ValueError):
        return
    if update(obj):
        _rechain_manifest(objs, mname, canonical(obj))


def mutate_stream(rng, objs: dict, stream) -> str:
    """Change one object of a published stream, then re-chain the hashes above it (manifest digests
    in successors and the head, descriptor digests, tail hashes, content-addressed names) so that the
    follower's deeper checks are what catch it. Returns what was done."""
    from arcfmt.store.objects import canonical, digest128

    names = sorted(objs)
    manifests = [n for n in names if n.endswith("/manifest.json")]
    descs = [n for n in names if n.endswith(".json") and "/shard-" in n]
    datas = [n for n in names if n.endswith(".arc")]
    rechain = rng.random() < 0.9
    r = rng.random()
    if r < 0.15 and "head.json" in objs:
        h = json.loads(objs["head.json"])
        if rng.random() < 0.25 and len(manifests) > 1:  # an older step, named correctly: a valid head
            m = manifests[int(rng.integers(len(manifests)))]
            mo = json.loads(objs[m])
            h.update(step=mo["step"], manifest=digest128(objs[m]), keyframe_step=mo["keyframe_step"])
        else:
            mutate_json_obj(rng, h, stream)
        objs["head.json"] = _encode_json(rng, h)
        return "head.json"
    if r < 0.5:
        name = manifests[int(rng.integers(len(manifests)))]
        obj = json.loads(objs[name])
        mutate_json_obj(rng, obj, stream)
        if rechain and rng.random() < 0.85:
            _fix_tails(objs, obj)
        raw = _encode_json(rng, obj)
        if rng.random() < 0.05:
            raw = mutate_bytes(rng, raw)
        if rechain:
            _rechain_manifest(objs, name, raw)
        else:
            objs[name] = raw
        return name
    if r < 0.6:
        name = descs[int(rng.integers(len(descs)))]
        obj = json.loads(objs[name])
        mutate_json_obj(rng, obj, stream)
        raw = _encode_json(rng, obj)
        if rng.random() < 0.5:  # the step's manifest made again from the descriptors: check_store does it
            objs[name] = raw
            return f"recommit {name}"
        if rechain:
            _rechain_descriptor(objs, name, raw)
        else:
            objs[name] = raw
        return name
    if r < 0.9:
        name = datas[int(rng.integers(len(datas)))]
        data = objs[name]
        k = rng.random()
        new = mutate_struct(rng, data) if k < 0.6 else mutate_bytes(rng, data)
        if rechain:
            _replace_data(rng, objs, name, new)
        else:
            objs[name] = new
        return name
    k = int(rng.integers(5))
    if k == 0:  # an object gone
        name = names[int(rng.integers(len(names)))]
        del objs[name]
        return f"deleted {name}"
    if k == 1 and len(datas) > 1:  # two data objects' bytes swapped, references re-chained
        a, b = (datas[int(i)] for i in rng.choice(len(datas), 2, replace=False))
        da, db = objs[a], objs[b]
        _replace_data(rng, objs, a, db)
        if b in objs:
            _replace_data(rng, objs, b, da)
        return f"swapped {a} {b}"
    if k == 2:  # a data object shorter or longer than its references say
        name = datas[int(rng.integers(len(datas)))]
        d = objs[name]
        objs[name] = d[: int(rng.integers(len(d)))] if rng.random() < 0.6 else d + _garbage(rng, 1, 64)
        return f"resized {name}"
    if k == 3 and len(manifests) > 1:  # one step's manifest in another's place, re-chained
        a, b = (manifests[int(i)] for i in rng.choice(len(manifests), 2, replace=False))
        _rechain_manifest(objs, a, objs[b])
        return f"manifest {b} at {a}"
    h = json.loads(objs["head.json"])  # the head pointing at a step that is not there
    h["step"] = max(stream["steps"]) + 1
    objs["head.json"] = canonical(h)
    return "head beyond the stream"


def _put_stream(url: str, objs: dict) -> None:
    if url.startswith("memory://"):
        fs = _memfs()
        root = "/" + url.split("://", 1)[1].strip("/")
        for n, d in objs.items():
            fs.pipe_file(f"{root}/{n}", d)
        return
    for n, d in objs.items():
        p = os.path.join(url, n)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(d)


def _drop_stream(url: str) -> None:
    if url.startswith("memory://"):
        fs = _memfs()
        root = "/" + url.split("://", 1)[1].strip("/")
        for k in [k for k in fs.store if k.startswith(root + "/")]:
            del fs.store[k]
        fs.pseudo_dirs[:] = [d for d in fs.pseudo_dirs if not (d == root or d.startswith(root + "/"))]
    else:
        shutil.rmtree(url, ignore_errors=True)


def _read_obj(url: str, name: str):
    try:
        if url.startswith("memory://"):
            return _memfs().cat_file("/" + url.split("://", 1)[1].strip("/") + "/" + name)
        with open(os.path.join(url, name), "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


def _recommit(url: str, objs: dict, desc: str, stream) -> str | None:
    """Delete the manifest of a step whose descriptor was changed and let ``Publisher.commit`` make it
    again from the descriptors (it parses them all); then re-chain the new manifest into ``objs`` and
    the store. Returns a failure or None."""
    from arcfmt import Publisher

    step = int(desc.split("/")[1])
    mname = _step_dir(desc) + "/manifest.json"
    if url.startswith("memory://"):
        _memfs().rm_file("/" + url.split("://", 1)[1].strip("/") + "/" + mname)
    else:
        os.unlink(os.path.join(url, mname))
    try:
        Publisher(url, shard=0, num_shards=stream["shards"], workers=1).commit(step)
    except Exception as exc:  # noqa: BLE001
        fail = _arc_fail("Publisher.commit", exc)
        if fail:
            return fail
    new = _read_obj(url, mname)
    if new is None:
        del objs[mname]
        return None
    _rechain_manifest(objs, mname, new)
    _drop_stream(url)
    _put_stream(url, objs)
    return None


def _selectable(stream, patterns) -> bool:
    """Whether the tensor patterns select anything (tensor names are the same at every step)."""
    import fnmatch
    last = stream["published"][max(stream["steps"])]
    return patterns is None or any(fnmatch.fnmatchcase(k, p) for k in last for p in patterns)


def _head_at(objs: dict, step: int) -> bytes:
    """A valid head naming an earlier step of the intact stream."""
    from arcfmt.store import names as N
    from arcfmt.store.objects import Head, digest128

    raw = objs[N.manifest_name(step)]
    return Head(step, digest128(raw), json.loads(raw)["keyframe_step"], 0).to_bytes()


def folder_problem(into: str, published: dict, patterns, want_step=None, mutated=False) -> str | None:
    """None when ``into`` is absent or holds one whole published step (every selected tensor, exact),
    and no staging entry is left beside it; else what is wrong."""
    import fnmatch

    from arcfmt.safetensors_io import open_checkpoint

    left = _leftovers(os.path.dirname(into))
    if left:
        return f"staging entries left beside the folder: {left}"
    if not os.path.exists(into):
        return None if want_step is None else f"no folder, expected step {want_step}"
    try:
        with open(os.path.join(into, "arcfmt-stream.json")) as f:
            st = json.load(f)
        step = st["step"]
    except Exception as exc:  # noqa: BLE001
        return f"the folder has no readable stream state: {type(exc).__name__}: {exc}"
    if want_step is not None and step != want_step:
        return f"the folder is at step {step}, expected {want_step}"
    if step not in published:
        return f"the folder is at step {step}, which was never published"
    want = {k: v for k, v in published[step].items()
            if patterns is None or any(fnmatch.fnmatchcase(k, p) for p in patterns)}
    try:
        got = open_checkpoint(into).tensors()
    except Exception as exc:  # noqa: BLE001
        return f"the folder does not read back: {type(exc).__name__}: {exc}"
    if patterns is not None and mutated:
        # A filtered follower reads only its tensors' records, so it cannot tell a re-chained index
        # that renamed or dropped an unread tensor from a step published that way (SPEC S9.4 step 4,
        # S13: integrity, not authenticity). It must still never hold a tensor that was not published.
        want = {k: v for k, v in want.items() if k in got}
    bad = _same_tensors(got, want)
    return None if bad is None else f"the folder (step {step}) is not what was published: {bad}"


# Syncs a repaired stream gets before the case fails. 2, not 1: a follower that failed a step with
# WrongBaseError keeps that step's chunks in its spool (Follower._apply forgets them only after a
# FormatError or VerificationError), so when the damage was in the object's bytes, the next sync
# reuses them and fails once more (ChecksumError, which does clear them). Set it to 1 to see that.
# A repaired stream must be followed at the first attempt (the spool is cleared on WrongBaseError too).
REPAIR_ATTEMPTS = 1


def check_store(rng, tmpdir, stream, case):
    """Returns (failure or None, {name: bytes} of the mutated stream to save or None)."""
    from arcfmt import Follower
    from arcfmt.store.objects import parse_head

    objs = dict(stream["objects"])
    what = mutate_stream(rng, objs, stream)
    local = rng.random() < 0.2
    url = os.path.join(tmpdir, f"store-{case}") if local else f"memory://arcfz-{os.getpid()}-{case}"
    parent = os.path.join(tmpdir, f"follow-{case}")
    into = os.path.join(parent, "model")
    patterns = None if rng.random() < 0.85 else [["s0.*"], ["s1.*", "*w0"], ["nothing"]][int(rng.integers(3))]
    kw = dict(workers=1, retries=1, backoff=0.001, tensors=patterns, spool=rng.random() < 0.5,
              memory_budget=int(rng.choice([1, 256, 4096, 1 << 20])), chunk_size=int(rng.choice([64, 1000, 8 << 20])),
              max_gap=int(rng.choice([0, 64, 1 << 20])), missing_wait=0.0)   # a missing object is damage here
    warm = len(stream["steps"]) > 1 and rng.random() < 0.3
    try:
        os.makedirs(parent)
        extra = None
        if warm:  # the folder first follows the intact stream to an earlier step, a user file put beside
            early = int(rng.choice(stream["steps"][:-1]))
            _put_stream(url, dict(stream["objects"], **{"head.json": _head_at(stream["objects"], early)}))
            try:
                Follower(url, into=into, **kw).sync()
            except Exception as e:  # noqa: BLE001
                fail = _arc_fail(f"store (warm-up to step {early})", e)
                if fail is None and _selectable(stream, patterns):
                    fail = f"store (warm-up to step {early}): sync refused: {type(e).__name__}: {e}"
                if fail:
                    return fail, None
            fail = folder_problem(into, stream["published"], patterns, early if os.path.isdir(into) else None)
            if fail:
                return f"store (warm-up to step {early}): {fail}", None
            if os.path.isdir(into):
                extra = _garbage(rng, 1, 40)
                with open(os.path.join(into, "config.json"), "wb") as f:
                    f.write(extra)
            _drop_stream(url)
        _put_stream(url, objs)
        if what.startswith("recommit "):
            fail = _recommit(url, objs, what.split()[1], stream)
            if fail:
                return f"store ({what}): {fail}", objs
        try:
            Follower(url, into=into, **kw).sync()
            exc = None
        except Exception as e:  # noqa: BLE001
            exc = e
        where = f"store ({what})"
        if exc is not None:
            fail = _arc_fail(where, exc)
            if fail:
                return fail, objs
            fail = folder_problem(into, stream["published"], patterns, mutated=True)
        else:
            head_step = early if warm and os.path.isdir(into) else None
            if "head.json" in objs:
                try:
                    step = parse_head(objs["head.json"]).step
                except ArcError:
                    return f"{where}: sync succeeded on a head that does not parse", objs
                head_step = step if head_step is None else max(step, head_step)  # a head behind the folder: no-op
            fail = folder_problem(into, stream["published"], patterns, head_step, mutated=True)
        if fail is None and extra is not None:
            try:
                with open(os.path.join(into, "config.json"), "rb") as f:
                    if f.read() != extra:
                        fail = "the user's config.json beside the weights changed"
            except FileNotFoundError:
                fail = "the user's config.json beside the weights is gone"
        if fail:
            return f"{where}: {fail}", objs
        if rng.random() < 0.25:  # the stream repaired: the same folder must now reach its head
            _drop_stream(url)
            _put_stream(url, stream["objects"])
            err = None
            for _ in range(REPAIR_ATTEMPTS):
                try:
                    Follower(url, into=into, **kw).sync()
                    err = None
                    break
                except Exception as e:  # noqa: BLE001
                    err = e
                    if not isinstance(e, ArcError):
                        break
            if err is not None:
                fail = _arc_fail(f"{where}, then repaired", err)
                if fail is None and _selectable(stream, patterns):
                    fail = f"{where}, then repaired: sync refused: {type(err).__name__}: {err}"
            else:
                fail = folder_problem(into, stream["published"], patterns, max(stream["steps"]))
                fail = fail and f"{where}, then repaired: {fail}"
            if fail:
                return fail, objs
        return None, None
    finally:
        _drop_stream(url)
        shutil.rmtree(parent, ignore_errors=True)


# ------------------------------------------------------------------------------------ the run

# engine, share of the cases (interleaved by case number: the case's first random number picks it)
ENGINES = [("safetensors", 0.08), ("intact", 0.03), ("struct", 0.3), ("bytes", 0.21), ("names", 0.09),
           ("dims", 0.09), ("layouts", 0.1), ("store", 0.1)]
ENGINE_NAMES = [n for n, _ in ENGINES]


def pick_engine(r: float, engines=None) -> str:
    allowed = [(n, w) for n, w in ENGINES if engines is None or n in engines]
    total = sum(w for _, w in allowed)
    acc = 0.0
    for n, w in allowed:
        acc += w / total
        if r < acc:
            return n
    return allowed[-1][0]


class _Hang(BaseException):
    pass


def _on_alarm(signum, frame):
    raise _Hang()


def default_tmp_root():
    """/dev/shm where there is one: the follower and apply fsync every file, which tmpfs makes free."""
    d = "/dev/shm"
    return d if os.path.isdir(d) and os.access(d, os.W_OK | os.X_OK) else None


def _save(out_dir, seed, case, data) -> None:
    os.makedirs(out_dir, exist_ok=True)
    if isinstance(data, dict):  # a stream's objects, or a checkpoint and its delta
        with tarfile.open(os.path.join(out_dir, f"case-{seed}-{case}.tar"), "w") as tar:
            for name, blob in sorted(data.items()):
                info = tarfile.TarInfo(name)
                info.size = len(blob)
                tar.addfile(info, io.BytesIO(blob))
    else:
        with open(os.path.join(out_dir, f"case-{seed}-{case}.arc"), "wb") as f:
            f.write(data)


def run_case(seed, case, engine, rng, tmpdir, files, streams):
    """One case: ``(failure or None, input to save or None, start time of the timed part)``."""
    t0 = time.perf_counter()
    if engine == "safetensors":
        fail = check_safetensors(rng, tmpdir)
        return fail, open(os.path.join(tmpdir, "x.safetensors"), "rb").read() if fail else None, t0
    if engine == "layouts":
        timed = [0.0]
        fail, data = check_layouts(rng, tmpdir, case, timed)
        return fail, data, time.perf_counter() - timed[0]  # time the applies, not the making of the case
    if engine == "store":
        key = case // 16  # one published stream serves 16 consecutive store cases
        if key not in streams:
            streams.clear()
            streams[key] = build_stream(np.random.default_rng([seed, key, 2]))
        t0 = time.perf_counter()
        fail, data = check_store(rng, tmpdir, streams[key], case)
        return fail, data, t0
    key = case // 8  # one valid file serves 8 consecutive cases: the mutations differ, the making is shared
    if key not in files:
        files.clear()
        files[key] = random_file(np.random.default_rng([seed, key, 1]))
    base, target, good, previous = files[key]
    t0 = time.perf_counter()  # time the readers, not the making of the case
    if engine == "names":
        fail, data = check_names(rng, tmpdir, files[key])
        return fail, data, t0
    if engine == "dims":
        fail, data = check_dims(rng, files[key])
        return fail, data, t0
    if engine == "intact":
        data, intact = good, True
    elif engine == "struct":
        data, intact = mutate_struct(rng, good), False
    else:
        data, intact = mutate_bytes(rng, good), False
    t0 = time.perf_counter()
    fail = check_delta(base, target, data, intact or data == good, previous)
    if fail is None and intact and previous is not None:
        fail = _check_without_previous(base, data, previous)
    return fail, data if fail else None, t0


def _run_limited(hard, *args):
    """:func:`run_case` under the hang alarm of ``hard`` seconds (None: no alarm, off the main thread)."""
    if hard:
        signal.setitimer(signal.ITIMER_REAL, hard)
    try:
        return run_case(*args)
    finally:
        if hard:
            signal.setitimer(signal.ITIMER_REAL, 0)


def _rerun_seconds(seed, case, engines, tmpdir, files, streams, hard):
    """The timed seconds of ``case`` run again (its own input, a fresh folder); infinite where it raises
    or hangs. ``hard``: the hang limit (its alarm), or None off the main thread."""
    rng = np.random.default_rng([seed, case])
    engine = pick_engine(rng.random(), engines)
    again = tempfile.mkdtemp(prefix=f"rerun-{case}-", dir=tmpdir)
    try:
        _, _, t0 = _run_limited(hard, seed, case, engine, rng, again, files, streams)
    except (_Hang, Exception):  # noqa: BLE001 - the first run's outcome stands
        return float("inf")
    finally:
        shutil.rmtree(again, ignore_errors=True)
    return time.perf_counter() - t0


def run_range(seed, start, stop, max_seconds, out_dir, engines=None, max_rss_mib=None, tmp_root=None):
    from arcfmt.encodings import ctx_delta
    ctx_delta.warm_up()  # the per-case time limit is for decoding, not for compiling the kernels
    failures, slow = [], 0
    counts = {n: 0 for n in ENGINE_NAMES}
    seconds = {n: 0.0 for n in ENGINE_NAMES}
    worst = 0.0
    files, streams = {}, {}
    hard = max(30.0, 20 * max_seconds)   # a case still running after this is stopped (a hang)
    alarm = threading.current_thread() is threading.main_thread()
    if alarm:
        old_handler = signal.signal(signal.SIGALRM, _on_alarm)
    rss_flagged = False
    try:
        with tempfile.TemporaryDirectory(prefix="arcfmt-fuzz-", dir=tmp_root) as tmpdir:
            for case in range(start, stop):
                rng = np.random.default_rng([seed, case])
                engine = pick_engine(rng.random(), engines)
                t_case = t0 = time.perf_counter()
                specialized = backend.compiled_specializations()
                data = None
                try:
                    fail, data, t0 = _run_limited(hard if alarm else None, seed, case, engine, rng, tmpdir,
                                                  files, streams)
                except _Hang:
                    fail = f"hung: stopped after {hard:.0f} s"
                except Exception:  # noqa: BLE001 - a bug in the fuzzer itself is also worth seeing
                    fail = f"fuzzer error ({engine}):\n{traceback.format_exc()}"
                    engine = "fuzzer"
                t1 = time.perf_counter()
                dt = t1 - t0
                worst = max(worst, dt)
                counts[engine] = counts.get(engine, 0) + 1
                seconds[engine] = seconds.get(engine, 0.0) + (t1 - t_case)
                # a case whose arrays needed a kernel for types warm_up did not cover waited for numba,
                # once per install: not slow input; nor is one the machine stalled (CI met cases of 8 s
                # that take 20 ms, with no compile): slow input is slow again, so a slow case is rerun
                if dt > max_seconds and backend.compiled_specializations() == specialized:
                    again = _rerun_seconds(seed, case, engines, tmpdir, files, streams, hard if alarm else None)
                    if again > max_seconds:
                        slow += 1
                        fail = (fail or "") + f" slow: {dt:.2f} s, then {again:.2f} s"
                if max_rss_mib and not rss_flagged:
                    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
                    if rss > max_rss_mib:
                        rss_flagged = True
                        fail = (fail or "") + f" peak RSS reached {rss} MiB (cap {max_rss_mib} MiB) in this case"
                if fail:
                    failures.append({"case": case, "engine": engine, "failure": fail[-2000:]})
                    if data is not None and out_dir:
                        _save(out_dir, seed, case, data)
    finally:
        if alarm:
            signal.signal(signal.SIGALRM, old_handler)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    return dict(failures=failures, slow=slow, counts=counts, seconds=seconds, worst_seconds=worst, peak_rss_mib=rss)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=2000)
    ap.add_argument("--start", type=int, default=0, help="first case number (to resume or reproduce)")
    ap.add_argument("--log", help="append every failure to this JSON-lines file as soon as its chunk ends")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--chunk", type=int, default=2000)
    ap.add_argument("--max-seconds", type=float, default=2.0)
    ap.add_argument("--max-rss-mib", type=int, default=1024)
    ap.add_argument("--engines", help=f"comma-separated subset of {','.join(ENGINE_NAMES)} (default: all; "
                                      f"the case-to-engine mapping depends on it)")
    ap.add_argument("--tmp-dir", default=default_tmp_root(),
                    help="where cases write their files (default: /dev/shm when there is one)")
    ap.add_argument("--out", default="fuzz-failures")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    engines = None
    if args.engines:
        engines = [e.strip() for e in args.engines.split(",") if e.strip()]
        unknown = [e for e in engines if e not in ENGINE_NAMES]
        if unknown or not engines:
            ap.error(f"unknown engines {unknown}; choose from {','.join(ENGINE_NAMES)}")
    t0 = time.perf_counter()
    chunks = [(args.seed, s, min(args.cases, s + args.chunk), args.max_seconds, args.out, engines, args.max_rss_mib,
               args.tmp_dir) for s in range(args.start, args.cases, args.chunk)]
    total = dict(failures=[], slow=0, counts={}, seconds={}, worst_seconds=0.0, peak_rss_mib=0)
    done = 0
    with ProcessPoolExecutor(args.workers) as pool:
        for res in pool.map(run_range, *zip(*chunks)):
            total["failures"] += res["failures"]
            total["slow"] += res["slow"]
            total["worst_seconds"] = max(total["worst_seconds"], res["worst_seconds"])
            total["peak_rss_mib"] = max(total["peak_rss_mib"], res["peak_rss_mib"])
            for k, v in res["counts"].items():
                total["counts"][k] = total["counts"].get(k, 0) + v
            for k, v in res["seconds"].items():
                total["seconds"][k] = total["seconds"].get(k, 0.0) + v
            done += sum(res["counts"].values())
            if args.log and res["failures"]:
                with open(args.log, "a") as logf:
                    for f in res["failures"]:
                        logf.write(json.dumps(f) + "\n")
            if not args.json:
                print(f"\r{done}/{args.cases - args.start} cases, {len(total['failures'])} failures", end="",
                      file=sys.stderr)
    total["cases"] = done
    total["elapsed_seconds"] = time.perf_counter() - t0
    total["cases_per_second"] = {k: round(c / total["seconds"][k], 1) for k, c in total["counts"].items()
                                 if c and total["seconds"].get(k)}
    total["ok"] = not total["failures"] and total["peak_rss_mib"] <= args.max_rss_mib
    if args.json:
        print(json.dumps(total, indent=1))
    else:
        print(file=sys.stderr)
        for f in total["failures"][:20]:
            print(f"case {f['case']} ({f['engine']}): {f['failure']}")
        c = total["counts"]
        per = ", ".join(f"{k} {c[k]}" for k in ENGINE_NAMES + ["fuzzer"] if c.get(k))
        rate = ", ".join(f"{k} {v:.0f}/s" for k, v in total["cases_per_second"].items())
        print(f"{done} cases ({per}) in {total['elapsed_seconds']:.0f} s: "
              f"{len(total['failures'])} failures, {total['slow']} over {args.max_seconds} s "
              f"(slowest {total['worst_seconds']:.3f} s), peak RSS {total['peak_rss_mib']} MiB per worker")
        print(f"cases per second and worker, by engine: {rate}")
    return 0 if total["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
