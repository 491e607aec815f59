#!/usr/bin/env python3
"""Generate the conformance vectors in conformance/vectors/ and conformance/manifest.json, deterministically.

    python tools/make_vectors.py            # (re)write the vectors
    python tools/make_vectors.py --check    # exit 1 if the checked-in vectors differ from what this generates

Valid vectors (``y_``) come from the reference writer; must-reject vectors (``n_``) are valid files
taken apart into records, changed in one place, and put back together with every other checksum,
offset and index entry made consistent again, so that exactly the intended check fires.
"""
from __future__ import annotations

import argparse
import bz2 as _bz2
import gzip
import hashlib
import json
import lzma as _lzma
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field, replace

import _paths  # noqa: F401  (this checkout's arcfmt, and tests/support: the record toolkit)
import ml_dtypes
import numpy as np
import xxhash
import zstandard

from arcfmt import layout as L  # noqa: E402
from arcfmt import records
from arcfmt.integrity import model_digest, record_checksum  # noqa: E402
from arcfmt.planes import bytes_for, from_planes, ungap  # noqa: E402
from arcfmt.safetensors_io import write_file  # noqa: E402

# The record toolkit and data makers are tests/support's; the names stay importable from here
# (``mv.split``, ``mv.assemble``, ``mv.BF16``, ... for the tests).
from support.data import BF16, write_delta  # noqa: E402, F401
from support.records import (  # noqa: E402, F401
    FULL_INDEX_HEADER,
    Parts,
    Rec,
    assemble,
    block_to_record,
    fix_trailer_checksum,
    index_fields,
    prefix_names,
    raw_index_payload,
    raw_record,
    read_varint,
    set_first_encoding,
    split,
    tens_fields_end,
    tens_payload,
    u32,
    varint,
    xz_with_dictionary_code,
)

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "conformance")


# ------------------------------------------------------------------------------------ data

def _xz_mbi(v: int) -> bytes:
    """An .xz multibyte integer (7 bits a byte, low first)."""
    out = bytearray()
    while True:
        out.append((v & 0x7F) | (0x80 if v >= 0x80 else 0))
        v >>= 7
        if not v:
            return bytes(out)


def rng(seed):
    return np.random.default_rng(seed)


def bits(dtype, values):
    return np.array(values, dtype=f"<u{np.dtype(dtype).itemsize}").view(dtype)


def write_separate(base, target, **kw):
    """``write_delta`` without INLINE_BLOCKS (every block a BLCK record, as before 1.6): the vectors
    made before 1.6, whose faults sit in BLCK records, and those made beside them."""
    return write_delta(base, target, **{"inline_blocks": False, **kw})


def write_full(base, target, **kw):
    """``write_delta`` with the full index of SPEC.md §10 (offset and checksum columns, no
    COMPACT_INDEX): the must-reject vectors that change those columns, and those built beside them."""
    return write_delta(base, target, compact_index=False, **kw)


def rl_step(seed, shape, density=0.05, exc=0.1):
    """A BF16 tensor and a next step: ±1-ulp changes, a few sign/exponent changes."""
    r = rng(seed)
    base = (r.standard_normal(shape) * 0.02).astype(np.float32).astype(BF16)
    u = base.view(np.uint16).reshape(-1).copy()
    idx = np.flatnonzero(r.random(u.size) < density)
    u[idx] = (u[idx].astype(np.int32) + r.choice([-1, 1], idx.size)).astype(np.uint16)
    special = idx[r.random(idx.size) < exc]
    u[special] ^= 0x8000
    return base, u.view(BF16).reshape(shape)


# ------------------------------------------------------------------------------------ the suite

@dataclass
class Vector:
    name: str
    description: str
    covers: list
    base: dict
    delta: bytes
    expect_tensors: dict | None = None   # y_: the target tensors
    error: str | None = None             # n_: the category
    modes: list = field(default_factory=lambda: ["random", "stream"])
    gz: bool = False                     # the delta stored gzip-compressed (.arc.gz, conformance/README.md)
    errors: dict | None = None           # n_: a different category for some read mode (SPEC.md §12)
    previous: dict | bytes | None = None  # (1.9) the previous step (SPEC.md §7 "History"), a file like the base's


def valid_vectors():
    V = []

    def y(name, desc, covers, base, target, **kw):
        V.append(Vector(name, desc, covers, base or {}, write_separate(base, target, **kw), expect_tensors=target))

    b, t = rl_step(1, (64, 48))
    y("y_bf16_delta_basic", "BF16 ±1-ulp changes and sign flips: bf16-delta with kept steps and exceptions",
      ["8.3"], {"w": b}, {"w": t}, force_encoding="bf16-delta")
    r = rng(2)
    sp = bits(BF16, [0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0xFFC1, 0x7F81, 0x0001, 0x807F, 0x3F80, 0x0080, 0x7F7F])
    tg = bits(BF16, [0x8000, 0x0000, 0xFF80, 0x7F80, 0x7FC1, 0x7FC0, 0x7FFF, 0x0002, 0x8001, 0x3F81, 0x007F, 0x7F80])
    y("y_bf16_special_values", "±0, ±inf, NaN payloads, subnormals, exponent and sign changes", ["2", "8.3"],
      {"s": sp}, {"s": tg}, force_encoding="bf16-delta")
    bb = (r.standard_normal(300) * 0.1).astype(np.float32).astype(BF16)
    tt = (r.standard_normal(300) * 0.1).astype(np.float32).astype(BF16)
    y("y_bf16_all_changed", "every value changed", ["8.3"], {"a": bb}, {"a": tt}, force_encoding="bf16-delta")
    for dt, nm in ((np.float16, "f16"), (np.float32, "f32"), (np.float64, "f64"),
                   (ml_dtypes.float8_e4m3fn, "f8_e4m3"), (ml_dtypes.float8_e5m2, "f8_e5m2")):
        w = np.dtype(dt).itemsize
        u = rng(3).integers(0, 1 << (8 * w), 200, dtype=np.uint64).astype(f"<u{w}")
        base = u.view(dt)
        tu = u.copy()
        tu[::7] ^= 1
        tu[::31] ^= np.array(1 << (8 * w - 1), dtype=f"<u{w}")
        y(f"y_float_delta_{nm}", f"float-delta on {nm.upper()} (all bit patterns, NaNs included)", ["2", "8.4"],
          {"x": base}, {"x": tu.view(dt)}, force_encoding="float-delta")
    ints = [(np.bool_, "bool"), (np.uint8, "u8"), (np.int8, "i8"), (np.uint16, "u16"), (np.int16, "i16"),
            (np.uint32, "u32"), (np.int32, "i32"), (np.uint64, "u64"), (np.int64, "i64")]
    for dt, nm in ints:
        w = np.dtype(dt).itemsize
        u = rng(4).integers(0, 256, 100 * w, dtype=np.uint8)
        if dt is np.bool_:
            u = (u & 1).astype(np.uint8)
        base = u.view(dt)
        tu = u.copy()
        tu[::5] ^= 1
        y(f"y_xor_{nm}", f"xor on {nm.upper()}", ["2", "8.2"], {"i": base}, {"i": tu.view(dt)}, force_encoding="xor")
    b, t = rl_step(5, (40, 10))
    y("y_xor_bf16", "xor on BF16", ["8.2"], {"w": b}, {"w": t}, force_encoding="xor")
    for dt, nm in ((BF16, "bf16"), (np.float16, "f16"), (np.float32, "f32"), (np.float64, "f64"),
                   (ml_dtypes.float8_e4m3fn, "f8_e4m3"), (ml_dtypes.float8_e5m2, "f8_e5m2"), (np.int32, "i32"),
                   (np.bool_, "bool")):
        w = np.dtype(dt).itemsize
        u = rng(6).integers(0, 256, 64 * w, dtype=np.uint8)
        if dt is np.bool_:
            u &= 1
        y(f"y_keyframe_{nm}", f"keyframe of {nm.upper()}, no base", ["8.5"], None, {"k": u.view(dt).reshape(8, -1)})
    b, t = rl_step(7, (30, 20))
    y("y_keyframe_with_base_file", "keyframe=True file with a base present: no tensor needs the base", ["7", "8.5"],
      {"w": b}, {"w": t}, keyframe=True)
    b, _ = rl_step(8, (16, 16))
    y("y_unchanged", "nothing changed: unchanged blocks", ["8.1"], {"w": b}, {"w": b.copy()})
    b, t = rl_step(9, (50, 40), density=0.2)
    for codec in ("raw", "zstd", "xz", "bz2"):
        y(f"y_codec_{codec}", f"every stream coded with {codec}", ["9"], {"w": b}, {"w": t}, force_codec=codec)
    b, t = rl_step(10, (33, 31))
    y("y_multiblock", "a tensor cut into blocks of 100 elements (last block short)", ["7"], {"w": b}, {"w": t},
      block_elems=100)
    y("y_empty_tensor", "a tensor with a zero dimension: no blocks", ["7"], {"e": np.zeros((0, 5), BF16)},
      {"e": np.zeros((0, 5), BF16)})
    y("y_zero_dim_at_elems_limit", "dims [2^20, 0, 2^20]: 0 elements; the non-zero dims multiply to exactly "
      "MAX_TENSOR_ELEMS", ["7", "14"], None, {"z": np.zeros((1 << 20, 0, 1 << 20), np.float32)})
    y("y_scalar", "0-d tensors", ["7"], {"s": np.array(1.5, np.float32), "i": np.array(3, np.int64)},
      {"s": np.array(-1.5, np.float32), "i": np.array(3, np.int64)})
    b1, t1 = rl_step(11, (20, 20))
    b2, t2 = rl_step(12, (7,))
    y("y_multi_tensor", "several tensors, names with UTF-8", ["7", "13"],
      {"layers.0.wq": b1, "naïve/ß.bias": b2, "steps": np.arange(5, dtype=np.int64)},
      {"layers.0.wq": t1, "naïve/ß.bias": t2, "steps": np.arange(5, dtype=np.int64) + 1})
    y("y_shape_and_dtype_change", "tensors whose shape or dtype changed travel as keyframes; a new tensor too",
      ["7"], {"a": np.ones((4, 4), np.float32), "b": np.ones(3, np.int16)},
      {"a": np.ones((4, 5), np.float32), "b": np.ones(3, np.int32), "new": np.arange(3, dtype=np.uint8)})
    b, t = rl_step(13, (10, 10))
    y("y_note_record", "an ancillary note record", ["5", "5.1"], {"w": b}, {"w": t}, note="made by make_vectors")
    # an unknown ancillary record: must be skipped by both readers
    p = split(write_separate({"w": b}, {"w": t}))
    p.recs.insert(2, Rec(b"zzzz", b"future ancillary data"))
    V.append(Vector("y_unknown_ancillary", "an unknown ancillary record type is skipped", ["5", "10", "16"],
                    {"w": b}, assemble(p), expect_tensors={"w": t}))
    # PREFIXED_NAMES (§6, §7, 1.3): shared prefixes, none, a whole previous name, one ending inside a
    # UTF-8 sequence (a\xc3|\xa9 -> a\xc3|\xa8), and the same tensors with every name stored whole
    names = ["layers.0.attn.wq", "layers.0.attn.wk", "layers.0.attn", "emb", "a\u00e9", "a\u00e8", "a\u00e8.b"]
    pb = {nm: rl_step(30 + i, (6, 5))[0] for i, nm in enumerate(names)}
    pt = {nm: rl_step(30 + i, (6, 5))[1] for i, nm in enumerate(names)}
    pre = write_separate(pb, pt)
    assert split(pre).prefixed
    V.append(Vector("y_prefixed_names", "PREFIXED_NAMES: names after the bytes they share with the previous one "
                    "(several, none, all of it, a prefix ending inside a UTF-8 sequence)", ["6", "7", "16"],
                    pb, pre, expect_tensors=pt))
    V.append(Vector("y_whole_names", "a 1.3 file without PREFIXED_NAMES: every name stored whole", ["6", "7"],
                    pb, assemble(split(pre), prefixed=False), expect_tensors=pt))
    V += compact_valid_vectors()
    V += ctx_valid_vectors()
    V += dense_valid_vectors()
    V += ctxas_valid_vectors()
    V += ctxrc_valid_vectors()
    V += ctxrp_valid_vectors()
    V += ctxrh_valid_vectors()
    V += ctxrhp_valid_vectors()
    V += inline_valid_vectors()
    return V


# ------------------------------------------------------------------------------------ COMPACT_INDEX (§10.1)

def _noted_file(compact: bool) -> tuple[dict, dict, Parts]:
    """Two BF16 tensors of two blocks each with note records everywhere one can stand: before the first
    TENS, between a TENS and its first block, between blocks, between tensors, two in a row, and last."""
    base = {nm: rl_step(90 + i, (8, 10))[0] for i, nm in enumerate(("a", "b"))}
    target = {nm: rl_step(90 + i, (8, 10))[1] for i, nm in enumerate(("a", "b"))}
    p = split(write_separate(base, target, block_elems=40, compact_index=compact))
    recs = []
    for k, r in enumerate(p.recs):
        recs += [r, Rec(b"note", b"n%d" % k)]
    recs.insert(1, Rec(b"note", b"twice"))
    p.recs = recs
    return base, target, p


def compact_valid_vectors():
    V = []
    base, target, p = _noted_file(True)
    assert p.index.compact and len(p.find(b"note")) == 8
    V.append(Vector("y_compact_index_notes", "COMPACT_INDEX: TENS and BLCK offsets derived from the sizes around "
                    "note records everywhere they can stand (first, between a TENS and its blocks, between blocks "
                    "and tensors, two in a row, last)", ["4", "10", "10.1"], base, assemble(p), expect_tensors=target))
    base, target, q = _noted_file(False)
    V.append(Vector("y_full_index", "a 1.5 file without COMPACT_INDEX: the index with its offset and checksum "
                    "columns, as 1.4 wrote it", ["4", "10"], base, assemble(q), expect_tensors=target))
    e = write_separate(None, {"e": np.zeros((0, 3), np.float32)}, note="only")
    assert split(e).index.compact
    V.append(Vector("y_compact_index_no_blocks", "COMPACT_INDEX: a tensor without blocks after a note record",
                    ["10.1"], {}, e, expect_tensors={"e": np.zeros((0, 3), np.float32)}))
    return V


# ------------------------------------------------------------------------------------ 1.6: inline blocks

def _inline_file(seed=120):
    """A file with INLINE_BLOCKS: a one-block delta tensor and an unchanged one inline, a two-block tensor
    in BLCK records, an empty tensor, a one-block keyframe inline, note records between."""
    base = {nm: rl_step(seed + i, (8, 10))[0] for i, nm in enumerate(("a", "b"))}
    target = {nm: rl_step(seed + i, (8, 10))[1] for i, nm in enumerate(("a", "b"))}
    base["u"] = rl_step(seed + 5, (3, 7))[0]
    target["u"] = base["u"].copy()
    target["k"] = np.arange(-6, 6, dtype=np.int8).reshape(3, 4)   # keyframe and xor: one stream of m bytes
    target["e"] = np.zeros((0, 4), np.float32)
    target["two"] = rl_step(seed + 7, (130,))[1]
    base["two"] = rl_step(seed + 7, (130,))[0]
    return base, target, write_delta(base, target, block_elems=80, note="inline")


def inline_valid_vectors():
    V = []
    base, target, data = _inline_file()
    p = split(data)
    assert p.index.inline_blocks and sum(r.encoding is not None for r in p.find(L.TENS)) == 4
    V.append(Vector("y_inline_blocks", "INLINE_BLOCKS: one-block tensors (a delta, an unchanged one, a keyframe) "
                    "carry their block in the TENS record; a two-block tensor and an empty one do not; notes "
                    "between", ["4", "7", "10", "10.1"], base, data, expect_tensors=target))
    q = split(data)
    first = next(i for i, r in enumerate(q.recs) if r.type == L.TENS and r.encoding is not None)
    block_to_record(q, first)
    V.append(Vector("y_inline_blocks_optional", "INLINE_BLOCKS: one one-block tensor in a BLCK record beside "
                    "inline ones (the writer chooses per tensor)", ["7", "10"], base, assemble(q),
                    expect_tensors=target))
    q = split(data)
    for i in [i for i, r in enumerate(q.recs) if r.type == L.TENS and r.encoding is not None][::-1]:
        block_to_record(q, i)
    V.append(Vector("y_inline_blocks_none", "INLINE_BLOCKS set, no tensor inline", ["4", "7"], base, assemble(q),
                    expect_tensors=target))
    for enc, dt, codec in (("unchanged", BF16, None), ("xor", np.float16, "raw"), ("bf16-delta", BF16, "zstd"),
                           ("float-delta", np.float32, "raw"), ("keyframe", np.float32, "zstd"),
                           ("ctx-delta", BF16, "raw"), ("dense-delta", BF16, "raw"), ("ctx-delta-as", BF16, "raw")):
        r = rng(130 + len(V))
        b = (r.standard_normal((12, 17)) * 0.05).astype(np.float32).astype(dt)
        u = b.view(f"<u{b.dtype.itemsize}").copy()
        if enc != "unchanged":
            idx = r.random(u.size) < (0.7 if enc == "dense-delta" else 0.3)
            u.reshape(-1)[idx.reshape(-1)] += 1
        t = u.view(dt)
        d = write_delta({"x": b}, {"x": t}, force_encoding=enc if enc != "unchanged" else None, force_codec=codec)
        assert split(d).find(L.TENS)[0].encoding is not None and not split(d).find(L.BLCK)
        V.append(Vector(f"y_inline_{enc.replace('-', '_')}", f"INLINE_BLOCKS: a {enc} block carried in its TENS "
                        "record", ["7", "8"], {"x": b}, d, expect_tensors={"x": t}))
    return V


def inline_reject_vectors():
    V = []
    base, target, data = _inline_file()
    P = split(data)
    inl = [i for i, r in enumerate(P.recs) if r.type == L.TENS and r.encoding is not None]
    i0 = inl[0]   # tensor "a": a one-block BF16 delta

    def n(name, desc, covers, d, error, errors=None, base_=None):
        V.append(Vector(name, desc, list(covers), base if base_ is None else base_, d, error=error, errors=errors))

    def mod(fn, **kw):
        p = split(data)
        fn(p)
        return assemble(p, **kw)

    # -- the header and the trailer (§4, §11)
    full = split(write_full(base, target, block_elems=80))
    n("n_inline_without_compact", "header flag INLINE_BLOCKS without COMPACT_INDEX", ["4"],
      assemble(full, header=bytes(full.header[:12]) + u32(L.INLINE_BLOCKS)), "corrupt")

    def tr_clear(tb):
        tb[20] &= ~L.INLINE_BLOCKS
        fix_trailer_checksum(tb)
    n("n_flags_disagree_inline", "the header has INLINE_BLOCKS, the trailer not", ["11"],
      assemble(split(data), trailer_fn=tr_clear), "corrupt")
    sep = split(write_separate(base, target, block_elems=80))

    def tr_set(tb):
        tb[20] |= L.INLINE_BLOCKS
        fix_trailer_checksum(tb)
    n("n_flags_disagree_inline_trailer", "the trailer has INLINE_BLOCKS, the header not (no block inline)", ["11"],
      assemble(sep, trailer_fn=tr_set), "corrupt")
    # a file without INLINE_BLOCKS whose TENS records set bit 1 (reserved there) and carry their blocks
    q = split(data)
    for r in q.recs:
        r.encoding = None if r.type == L.TENS else r.encoding   # the index lists no block for them
    n("n_inline_block_without_header_flag", "a TENS record with flag bit 1 and an inline block in a file whose "
      "header lacks INLINE_BLOCKS: bytes left over (corrupt) before the reserved bit", ["7"],
      assemble(q, header=bytes(q.header[:12]) + u32(L.COMPACT_INDEX)), "corrupt")

    # -- TENS (§7)
    def flag(p, i, bits):
        _, at = tens_fields_end(p.recs[i].payload)
        pl = bytearray(p.recs[i].payload)
        pl[at] |= bits
        p.recs[i].payload = bytes(pl)

    def reserved(p):
        flag(p, i0, 0x04)
        p.recs[i0].payload = p.recs[i0].payload[:-1] + b"\xee"   # and a broken inline block: after
    n("n_inline_reserved_tens_flag", "INLINE_BLOCKS: TENS flag bit 2 (reserved) set on an inline tensor whose "
      "block's last byte is changed: reserved_bits first", ["7"], mod(reserved), "reserved_bits")

    def extra(p):
        two = next(i for i, r in enumerate(p.recs) if r.type == L.TENS and r.name == "two")
        p.recs[two].payload += b"\x00"
    n("n_inline_tens_extra_bytes", "INLINE_BLOCKS: a byte after target_hash in a TENS record without "
      "INLINE_BLOCK", ["7"], mod(extra), "corrupt")

    def two_blocks(p):
        two = next(i for i, r in enumerate(p.recs) if r.type == L.TENS and r.name == "two")
        flag(p, two, L.INLINE_BLOCK)
        p.recs[two].payload += b"\x7f"   # an unknown encoding: met only by a decoder that reads on
    n("n_inline_two_blocks_then_unknown_encoding", "INLINE_BLOCK on a tensor of two blocks (its records "
      "follow), then an unknown encoding id where its inline block would be", ["7"], mod(two_blocks), "corrupt")

    def truncated(p):
        end, _ = tens_fields_end(p.recs[i0].payload)
        p.recs[i0].payload = p.recs[i0].payload[:end]
        p.recs[i0].encoding = 5
    n("n_inline_block_missing", "INLINE_BLOCK set, the payload ends at target_hash (no encoding byte)", ["7", "8"],
      mod(truncated), "corrupt")

    # -- the inline block (§7, §8 checks 1, 3-6)
    def set_enc(p, e):
        end, _ = tens_fields_end(p.recs[i0].payload)
        pl = bytearray(p.recs[i0].payload)
        pl[end] = e
        p.recs[i0].payload, p.recs[i0].encoding = bytes(pl), e
    n("n_inline_unknown_encoding", "an inline block with encoding id 200", ["7", "8"],
      mod(lambda p: set_enc(p, 200)), "unsupported")
    n("n_inline_encoding_not_index", "the index lists xor for an inline ctx-delta block: random access compares "
      "when it reads the block, streaming at the cross-check", ["7", "8", "10"],
      mod(lambda p: setattr(p.recs[i0], "encoding", 1)), "corrupt")

    def needs_base(p):
        k = next(i for i, r in enumerate(p.recs) if r.type == L.TENS and r.name == "k")
        end, _ = tens_fields_end(p.recs[k].payload)
        pl = bytearray(p.recs[k].payload)
        pl[end] = 1   # xor (for I8 laid out as keyframe: one m-byte stream), which needs a base, in a keyframe tensor
        p.recs[k].payload, p.recs[k].encoding = bytes(pl), 1
    n("n_inline_needs_base", "an inline block with xor in a tensor without NEEDS_BASE", ["7", "8"], mod(needs_base),
      "corrupt")

    def data_extra(p):
        p.recs[i0].payload += b"\x00"
    n("n_inline_data_extra", "a byte after an inline block's stream data", ["7", "8"], mod(data_extra), "corrupt")

    def codec(p):
        k = next(i for i, r in enumerate(p.recs) if r.type == L.TENS and r.name == "k")
        end, _ = tens_fields_end(p.recs[k].payload)
        pl = bytearray(p.recs[k].payload)
        assert pl[end] == 4   # keyframe: no params, one stream for I8 (§8.5)
        pl[end + 1] = 77
        p.recs[k].payload = bytes(pl)
    n("n_inline_unknown_codec", "an inline keyframe block with codec id 77", ["7", "8", "9"], mod(codec),
      "unsupported")

    def wrong_base():
        b = dict(base)
        b["a"] = b["a"].copy()
        b["a"].view(np.uint16).reshape(-1)[0] ^= 1
        return b
    n("n_inline_unknown_encoding_then_wrong_base", "an inline block with encoding id 200, and a base that does "
      "not hash to base_hash: the block is checked with its TENS record, before the base", ["7", "12.1", "12.2"],
      mod(lambda p: set_enc(p, 200)), "unsupported", base_=wrong_base())

    def duplicate_then(p):
        b = next(i for i, r in enumerate(p.recs) if r.type == L.TENS and r.name == "b")
        assert p.recs[b].payload[:2] == b"\x01b" and p.recs[b].encoding is not None
        p.recs[b].payload, p.recs[b].name = b"\x01a" + p.recs[b].payload[2:], "a"
        end, _ = tens_fields_end(p.recs[b].payload)
        p.recs[b].payload = p.recs[b].payload[:end] + b"\xc8" + p.recs[b].payload[end + 1:]
    n("n_inline_duplicate_name_then_unknown_encoding", "a second tensor named a, whose inline block has encoding "
      "id 200: the index refuses the name (random access); streaming checks the name before the block",
      ["7", "10", "12.2"], mod(duplicate_then), "corrupt")

    def name_then(p):
        set_enc(p, 200)
        p.recs[i0].name = "zz"   # the index names it otherwise
    n("n_inline_index_name_then_unknown_encoding", "the index names an inline tensor otherwise, and its block "
      "has encoding id 200: random access compares the name first", ["7", "10"], mod(name_then), "corrupt",
      errors={"stream": "unsupported"})

    # -- the index (§10 check 4, "Later")
    def flag_with_record(p):
        b = split(data)
        block_to_record(b, i0)
        p.recs.insert(i0 + 1, b.recs[i0 + 1])   # the inline block, and the same block as a record after it
        p.recs[i0].encoding = None
    n("n_inline_flag_with_record", "an inline block also written as a BLCK record after it; the index lists "
      "the record", ["7", "10", "12.2"], mod(flag_with_record), "corrupt")

    def size_zero(p):
        block_to_record(p, i0)
        blk = p.recs.pop(i0 + 1)
        p.recs[i0].encoding = blk.encoding   # listed with size 0, though the TENS has no INLINE_BLOCK
    n("n_inline_index_size_zero_then_wrong_base", "the index gives a one-block tensor's block the size 0, its "
      "TENS record has no INLINE_BLOCK and no BLCK follows, and the base is wrong: random access refuses the "
      "flag at the TENS record, streaming meets the base first", ["10", "12.1"], mod(size_zero), "corrupt",
      errors={"stream": "wrong_base"}, base_=wrong_base())

    def size_zero_two(p):
        two = next(i for i, r in enumerate(p.recs) if r.type == L.TENS and r.name == "two")
        assert p.recs[two + 1].type == L.BLCK and p.recs[two + 2].type == L.BLCK
        blk = p.recs.pop(two + 1)
        p.recs[two].encoding = blk.encoding   # the first block listed with size 0, inside the TENS
        p.recs[0].payload = b"\x08" + p.recs[0].payload[1:]   # META: a reserved flag, met next (step 5)
    d = mod(size_zero_two)
    n("n_inline_size_zero_two_blocks_then_meta_flags", "the index gives the first block of a two-block tensor "
      "the size 0 (its record left out), and META has a reserved flag: random access refuses the index first",
      ["10", "12.1"], d, "corrupt", errors={"stream": "reserved_bits"})
    return V


def compact_reject_vectors():
    V = []
    base, _, p = _noted_file(True)

    def n(name, desc, index_fn, covers=("10.1",), src=p):
        V.append(Vector(name, desc, list(covers), base, assemble(src, index_fn=index_fn), error="corrupt"))

    def misplaced(ix):
        ix.others[3].offset += 1
    n("n_compact_other_misplaced", "COMPACT_INDEX: a note record listed one byte after where the records before "
      "it end", misplaced)

    def unordered(ix):
        ix.others[1], ix.others[2] = ix.others[2], ix.others[1]
    n("n_compact_others_out_of_order", "COMPACT_INDEX: two note records listed in reverse file order", unordered)

    def past(ix):
        ix.others[-1].offset = 1 << 62
    n("n_compact_other_past_index", "COMPACT_INDEX: a note record listed at offset 2^62, past the index", past)

    def past_fit(ix):
        moved = ix.others[-1]           # the note between the last block and the index
        ix.entries[-1].blocks[-1].size += moved.size
        moved.offset = (1 << 40) + 52
    n("n_compact_other_past_index_sizes_fit", "COMPACT_INDEX: the last note record listed past the end of the file, "
      "its size added to the block before it: the sizes end at the index, but the walk never reaches that note",
      past_fit)

    def unlisted(ix):
        del ix.others[-1]
    n("n_compact_end_short", "COMPACT_INDEX: the last note record not listed, so the records listed end before "
      "the index", unlisted)

    def longer(ix):
        ix.others[-1].size += 1
    n("n_compact_end_long", "COMPACT_INDEX: the last note record's size one byte too large, so the records end "
      "past the index", longer)

    def shifted(ix):
        ix.entries[0].blocks[0].size += 4
        ix.entries[0].blocks[1].size -= 4
    plain = split(write_separate(base, {nm: rl_step(90 + i, (8, 10))[1] for i, nm in enumerate(base)}, block_elems=40))

    ee = split(write_separate(None, {"e": np.zeros((0, 3), np.float32), "f": np.arange(6, dtype=np.float32)}))

    def tens_sizes_swapped(ix):
        a, b = ix.entries
        a.tens_size, b.tens_size = b.tens_size, a.tens_size
    assert ee.index.entries[0].tens_size != ee.index.entries[1].tens_size
    n("n_compact_adjacent_tens_sizes", "COMPACT_INDEX: the sizes of two adjacent TENS records (the first tensor has "
      "no blocks) swapped: the sum is right, both derived offsets are wrong", tens_sizes_swapped,
      covers=("10.1", "5", "12.2"), src=ee)

    def trailer_checksum(t):
        t[24] ^= 1
    for name, fn in (("other_misplaced", misplaced), ("end_short", unlisted)):
        V.append(Vector(f"n_compact_{name}_then_trailer_checksum", f"COMPACT_INDEX: as n_compact_{name}, and the "
                        "trailer's checksum wrong: random access checks the trailer first (checksum), streaming "
                        "the index first (corrupt)", ["10.1", "11", "12"], base,
                        assemble(p, index_fn=fn, trailer_fn=trailer_checksum), error="checksum",
                        errors={"stream": "corrupt"}))

    def many_blocks(payload):
        d = index_fields(payload, True)
        d["block_count"] = L.MAX_BLOCKS + 1
        body = L.CompactIndexBody.build(d)
        return raw_index_payload(body)
    probe = assemble(p)
    ioff = int.from_bytes(probe[-40:-32], "little")
    V.append(Vector("n_compact_limit_block_count", "COMPACT_INDEX: block_count MAX_BLOCKS + 1 (5 bytes a block: "
                    "a few KB of compressed body could declare it), refused when it is read", ["10", "14"], base,
                    assemble(p, index_payload=many_blocks(probe[ioff + 16:-40])), error="limit"))
    fbase, _, fp = _noted_file(False)

    def others_reversed(ix):
        ix.others[1], ix.others[2] = ix.others[2], ix.others[1]
    V.append(Vector("n_index_others_out_of_order", "a full index listing two note records in reverse file order "
                    "(they still tile the file)", ["10", "12.2"], fbase, assemble(fp, index_fn=others_reversed),
                    error="corrupt"))

    # R-DIGEST-EARLY: a tensor's TENS record left out (the index rebuilt, its digests kept): the later
    # tensors' BLCK records name the wrong ordinals (corrupt, §8 check 2), and the digest no longer
    # matches (verification) -- random access checks the digest at the end of §12.1 step 6, before
    # any block; streaming meets the blocks first
    dropped = split(write_separate(None, {nm: rl_step(95 + i, (3, 4))[1] for i, nm in enumerate("abc")}, block_elems=6))
    first_b = next(i for i, r in enumerate(dropped.recs) if r.type == L.TENS and r.name == "b")
    kept = dropped.recs[:1] + dropped.recs[first_b:]   # META, then tensors b and c with their blocks
    V.append(Vector("n_target_digest_then_block_ordinal", "a keyframe file with its first tensor's records "
                    "left out and the digests kept: random access refuses the target digest at the end of "
                    "step 6 (verification), streaming the next block's tensor ordinal (corrupt)",
                    ["12.1", "12.2", "12.3", "8"], {}, assemble(dropped, kept),
                    error="verification", errors={"stream": "corrupt"}))

    # §12.1 steps 7 and 8: random access decodes every block before it verifies any tensor; streaming
    # verifies each tensor before it reads the next one's blocks (§12.2 step 3). The first tensor (the
    # larger: a decoder that starts with the largest meets its hash first) has a wrong target_hash, the
    # digest made to match it; the second one's block names a wrong block ordinal.
    hb = {"a": rl_step(97, (40, 10))[0], "b": rl_step(98, (3, 4))[0]}
    ht = {"a": rl_step(97, (40, 10))[1], "b": rl_step(98, (3, 4))[1]}
    hp = split(write_separate(hb, ht))
    entries = []
    for r in hp.recs:
        if r.type == L.TENS:
            th = records.parse_tensor(r.payload, "")
            if th.name == "a":
                th.target_hash ^= 1
                r.payload = records.build_tensor(th)
            entries.append((th.name.encode(), th.dtype.code, th.shape, th.target_hash))
    blk_b = [r for r in hp.recs if r.type == L.BLCK][-1]
    assert blk_b.payload[:2] == b"\x01\x00"
    blk_b.payload = b"\x01\x05" + blk_b.payload[2:]
    V.append(Vector("n_tensor_hash_then_block_ordinal", "the first (larger) tensor rebuilds to bytes that do not "
                    "match its target_hash (the target digest made to match the records), the second one's block "
                    "names block 5: random access decodes every block before verifying (corrupt), streaming "
                    "verifies the first tensor before reading the second's block (verification)",
                    ["12.1", "12.2", "12.3", "8"], hb, assemble(hp, target_digest=model_digest(entries)),
                    error="corrupt", errors={"stream": "verification"}))

    # §12.1 step 7 (R-BLOCK-FIRST): of two failing blocks, the first in file order is reported, whatever
    # order a decoder runs them in (one that starts with the largest tensor meets the second first)
    def unknown_encoding(blk):
        hd = bytearray(blk.payload)
        _, k = read_varint(bytes(hd), 0)
        _, k = read_varint(bytes(hd), k)
        hd[k] = 200
        blk.payload, blk.encoding = bytes(hd), None

    op = split(write_separate(hb, ht))
    first_blk, last_blk = [r for r in op.recs if r.type == L.BLCK][0], [r for r in op.recs if r.type == L.BLCK][-1]
    last_blk.payload = b"\x01\x05" + last_blk.payload[2:]          # b (file order second): block ordinal 5
    unknown_encoding(first_blk)                                    # a (the larger, first): encoding id 200
    V.append(Vector("n_block_first_in_file_order", "two failing blocks: the first tensor's (the larger) has "
                    "encoding id 200 (unsupported), the second's names block 5 (corrupt): the first in file "
                    "order is reported", ["12.1", "8"], hb, assemble(op), error="unsupported"))
    op = split(write_separate({"b": hb["b"], "a": hb["a"]}, {"b": ht["b"], "a": ht["a"]}))
    small, large = [r for r in op.recs if r.type == L.BLCK]
    small.payload = small.payload[:1] + b"\x05" + small.payload[2:]   # b (the smaller, first): block ordinal 5
    unknown_encoding(large)                                        # a (the larger, second): encoding id 200
    V.append(Vector("n_block_first_in_file_order_small_first", "two failing blocks: the first tensor's (the "
                    "smaller) names block 5 (corrupt), the second's (the larger) has encoding id 200 "
                    "(unsupported): the first in file order is reported", ["12.1", "8"], hb, assemble(op),
                    error="corrupt"))

    def flip_trailer_bit(t):
        t[20] ^= L.COMPACT_INDEX
        fix_trailer_checksum(t)
    for src, what in ((plain, "compact"), (split(assemble(plain, header=FULL_INDEX_HEADER)), "full")):
        V.append(Vector(f"n_flags_disagree_{what}", f"a {what} index: the trailer's COMPACT_INDEX bit differs from the "
                        f"header's", ["4", "11"], base, assemble(src, trailer_fn=flip_trailer_bit), error="corrupt"))
    n("n_compact_sizes_shifted", "COMPACT_INDEX: two blocks' sizes 4 bytes off in opposite directions: the sum "
      "is right, the second block's derived offset is not a record's (random access: its header does not match; "
      "streaming: the cross-check)", shifted, covers=("10.1", "5", "12.2"), src=plain)
    return V


# ------------------------------------------------------------------------------------ ctx-delta (§8.6)

CTX_TYPES = (("bf16", BF16), ("f16", np.float16), ("f32", np.float32), ("f8_e4m3", ml_dtypes.float8_e4m3fn),
             ("f8_e5m2", ml_dtypes.float8_e5m2))


def ctx_case(seed, dt, m=4096, specials=True):
    """RL-like data: small weights change often and by several steps, large ones rarely by one; plus
    sign flips, zero crossings and special values, which ctx-delta carries as ordinary steps."""
    from arcfmt.dtypes import from_numpy
    from arcfmt.encodings.ctx_delta import ordered, unordered
    r = rng(seed)
    adt = from_numpy(np.dtype(dt))
    vals = (r.standard_normal(m) * np.exp2(r.uniform(-12, 0, m))).astype(dt)
    u = vals.view(f"<u{np.dtype(dt).itemsize}").copy()
    small = np.abs(vals.astype(np.float32)) < 2.0 ** -6
    ch = r.random(m) < np.where(small, 0.3, 0.03)
    steps = np.where(small, r.integers(1, 6, m), 1) * r.choice([-1, 1], m)
    half = 1 << (8 * np.dtype(dt).itemsize - 1)
    v = np.clip(ordered(adt, u) + np.where(ch, steps, 0), -half, half - 1)
    t = unordered(adt, v)
    if specials:
        w = np.dtype(dt).itemsize * 8
        sign = 1 << (w - 1)
        sp = [0, sign, 1, sign | 1, (1 << (w - 1)) - 1, (1 << w) - 1,
              (adt.exp_bits and ((1 << adt.exp_bits) - 1) << adt.mant_bits)]
        k = len(sp)
        u[:k * k] = np.repeat(np.array(sp, np.uint64), k).astype(u.dtype)
        t[:k * k] = np.tile(np.array(sp, np.uint64), k).astype(u.dtype)
    return u.view(dt), t.view(dt)


def ctx_custom(base, target, thresholds, codec="raw", block_elems=None, signs=None, rc=False, rp=False) -> bytes:
    """A one-tensor file whose blocks are ctx-delta with exactly the given thresholds, each stream of
    ``codec``; with ``signs`` ``(axis, P, phase)``, ctx-delta-as with that sign axis (``phase`` None: the
    block's place in the tensor, as the reference encoder sets it); with ``rc`` too, ctx-delta-rc (with
    ``rp`` as well, ctx-delta-rp)."""
    from arcfmt import codecs, encodings
    from arcfmt.dtypes import from_numpy
    from arcfmt.encodings import ctx_delta as ctx
    be = block_elems or max(1, base.size)
    name = "ctx-delta" if signs is None else "ctx-delta-rp" if rp else "ctx-delta-rc" if rc else "ctx-delta-as"
    d = write_separate({"x": base}, {"x": target}, force_encoding=name, force_codec=codec, block_elems=be)
    p = split(d)
    adt = from_numpy(base.dtype)
    bu = base.view(adt.uint).reshape(-1)
    tu = target.view(adt.uint).reshape(-1)
    k = 0
    for rec in p.recs:
        if rec.type != L.BLCK:
            continue
        b, t = bu[k * be:(k + 1) * be], tu[k * be:(k + 1) * be]
        pos = np.flatnonzero(b != t)
        axes = []
        if signs is not None:
            axis, period, phase = signs
            axes = [(axis, period, (k * be) % period if phase is None else phase)]
        if rc:
            enc = ctx.encode(adt, b, t, pos, thresholds=list(thresholds), rc_axes=axes, force_rc=True, rp=2 * rp)
            assert enc.rc and enc.rp == rp
        else:
            enc = ctx.encode(adt, b, t, pos, thresholds=list(thresholds), axes=axes, force_signs=bool(axes))
            assert enc.adaptive_signs == bool(axes)
        blk = encodings.EncodedBlock(encodings.by_name(name).id, enc.params, enc.streams, pos.size)
        rec.payload = records.build_block(0, k, blk, [codecs.encode_with(codecs.by_name(codec).id, bytes(x))
                                                      for x in enc.streams])
        k += 1
    return assemble(p)


def ctx_valid_vectors():
    V = []

    def y(name, desc, base, target, data=None, **kw):
        data = data if data is not None else write_separate(base, target, **kw)
        V.append(Vector(name, desc, ["8.6"], base, data, expect_tensors=target))

    for i, (nm, dt) in enumerate(CTX_TYPES):
        b, t = ctx_case(40 + i, dt)
        y(f"y_ctx_{nm}", f"ctx-delta on {nm.upper()}: several classes, multi-step changes, specials",
          {"x": b}, {"x": t}, force_encoding="ctx-delta", effort="max")
    b, t = ctx_case(50, BF16, m=3000)
    y("y_ctx_bf16_blocks_zstd", "ctx-delta in blocks of 700 elements, streams zstd-coded", {"x": b}, {"x": t},
      force_encoding="ctx-delta", force_codec="zstd", block_elems=700)
    y("y_ctx_bf16_blocks_xz", "ctx-delta in blocks of 1000 elements, streams xz-coded", {"x": b}, {"x": t},
      force_encoding="ctx-delta", force_codec="xz", block_elems=1000)
    y("y_ctx_one_class", "K = 1: positions are ranks among all elements", {"x": b}, {"x": t},
      data=ctx_custom(b, t, []))
    y("y_ctx_sixteen_classes", "K = 16, some classes empty of changes and of members", {"x": b}, {"x": t},
      data=ctx_custom(b, t, list(range(100, 250, 10))))
    y("y_ctx_empty_middle_class", "a middle class with members but no changes", {"x": b}, {"x": t},
      data=ctx_custom(b, t, [110, 111, 118]))
    r = rng(51)
    # through float32: ml_dtypes 0.6 and 0.7 round float64 -> bfloat16 differently (0.7 directly, 0.6
    # through float32), and the vector must not depend on the version installed
    sb = (r.standard_normal(60000) * 0.02).astype(np.float32).astype(BF16)
    su = sb.view(np.uint16).copy()
    idx = np.sort(r.choice(60000, 12, replace=False))
    su[idx] += 1
    y("y_ctx_sparse_large_rice", "12 changes in 60000 elements: large Rice parameters", {"x": sb},
      {"x": su.view(BF16)}, data=ctx_custom(sb, su.view(BF16), [120]))
    b, t = ctx_case(52, BF16, m=64, specials=False)
    t = (b.view(np.uint16) ^ 0x8000).view(BF16)
    y("y_ctx_all_changed_sign_flips", "every element changes sign: steps cross zero", {"x": b}, {"x": t},
      force_encoding="ctx-delta")
    return V


def empty_with_dims(dims) -> bytes:
    """A one-tensor file whose tensor (F32, no base, no blocks) declares ``dims``: TENS record and target
    digest rewritten, so the shape is the file's only fault."""
    p = split(write_separate(None, {"e": np.zeros((0, 5), np.float32)}))
    i = next(i for i, r in enumerate(p.recs) if r.type == L.TENS)
    th = records.parse_tensor(p.recs[i].payload, "")
    p.recs[i].payload = tens_payload(b"e", th.dtype.code, dims, th.block_elems, 0, target_hash=th.target_hash)
    p.index.target_digest = model_digest([(b"e", th.dtype.code, tuple(dims), th.target_hash)])
    return assemble(p)


def renamed_keyframe(name: bytes) -> bytes:
    """A one-tensor keyframe file (no base) whose tensor is renamed to ``name`` in its TENS record and the
    index, with the target digest to match: the name is the file's only fault."""
    p = split(write_separate(None, {"w": np.arange(6, dtype=np.float32).reshape(2, 3)}))
    i = next(i for i, r in enumerate(p.recs) if r.type == L.TENS)
    th = records.parse_tensor(p.recs[i].payload, "")
    p.recs[i].payload = tens_payload(name, th.dtype.code, th.shape, th.block_elems, 0, target_hash=th.target_hash)
    p.index.target_digest = model_digest([(name, th.dtype.code, th.shape, th.target_hash)])
    # a placeholder name of the same length in the index, then the index body rebuilt by hand with the real one
    probe = assemble(p, index_fn=lambda ix: setattr(ix.entries[0], "name", "x" * len(name)))
    d = index_fields(probe[int.from_bytes(probe[-40:-32], "little") + 16:-40], p.index.compact)
    d.update(name_lengths=[len(name)], names=name)
    body = L.index_body(p.index.compact).build(d)
    return assemble(p, index_payload=raw_index_payload(body))


def stream_names_past_index_limit() -> Vector:
    """§12.2 step 3: zero-element tensors whose 1024-byte names (PREFIXED_NAMES: about 35 bytes a record)
    pass MAX_INDEX_BYTES in all at the 65 537th, the stream cut right after that record: `limit` there
    (a decoder that does not count reads on, to `truncated`). 2.3 MB, stored gzip-compressed."""
    count = L.MAX_INDEX_BYTES // L.MAX_NAME_BYTES + 1
    out = bytearray(records.build_header(L.COMPACT_INDEX))
    out += raw_record(L.META, records.build_meta(records.Meta(None, None, prefixed_names=True)))
    empty_hash = xxhash.xxh3_64_intdigest(b"")
    prev = b""
    for i in range(count):
        name = b"n" * (L.MAX_NAME_BYTES - 5) + b"%05d" % i
        out += raw_record(L.TENS, L.build_tensor_payload(name, 11, [0], 1, 0, None, empty_hash, prev))
        prev = name
    return Vector("n_stream_names_past_index_limit", "streaming: 65 537 names of 1024 bytes, more than "
                  "MAX_INDEX_BYTES in all (cut after the last)", ["12.2", "14"], {}, bytes(out),
                  error="limit", modes=["stream"], gz=True)


def prefix_vectors():
    """Must-reject files of PREFIXED_NAMES (§6, §7): a TENS record's prefix_length (its first varint)
    or name_length changed in the file's own form, every other record kept consistent."""
    V = []
    names = ["enc.layer.0.w", "enc.layer.0.b", "__metadata_x", "__metadata_y"]
    base = {nm: rl_step(40 + i, (4, 3))[0] for i, nm in enumerate(names)}
    good = write_separate(base, {nm: rl_step(40 + i, (4, 3))[1] for i, nm in enumerate(names)})

    def n(name, desc, tensor, edit, error):
        p = split(good)
        recs = prefix_names(p, p.recs)
        r = [x for x in recs if x.type == L.TENS][tensor]
        k, at = read_varint(r.payload, 0)
        length, at2 = read_varint(r.payload, at)
        r.payload = edit(k, length, r.payload[at2:at2 + length], r.payload[at2 + length:])
        V.append(Vector(name, desc, ["6", "7"], base, assemble(p, recs, prefixed=False), error=error,
                        modes=["random", "stream"]))
    n("n_name_prefix_first", "the first tensor's prefix_length is 1 (there is no previous name)", 0,
      lambda k, ln, nm, rest: varint(1) + varint(ln) + nm + rest, "corrupt")
    n("n_name_prefix_longer", "prefix_length one more than the previous name's length", 1,
      lambda k, ln, nm, rest: varint(len(names[0]) + 1) + varint(ln) + nm + rest, "corrupt")
    n("n_name_prefix_limit", "prefix_length + name_length is MAX_NAME_BYTES + 1 (each alone is within it; "
      "refused before the name is read)", 1,
      lambda k, ln, nm, rest: varint(k) + varint(L.MAX_NAME_BYTES + 1 - k) + nm + rest, "limit")
    n("n_name_prefix_limit_wrap", "name_length 2^64 - 10 after prefix_length 12: the sum wraps to 2 in 64 bits, "
      "but the name is over MAX_NAME_BYTES", 1,
      lambda k, ln, nm, rest: varint(k) + varint((1 << 64) - 10) + nm + rest, "limit")
    V.append(stream_names_past_index_limit())
    n("n_name_prefix_joined_reserved", "the joined name is the reserved name (the 11 bytes '__metadata_' of the "
      "previous name, then '_')", 3, lambda k, ln, nm, rest: varint(11) + varint(1) + b"_" + rest, "corrupt")
    return V


def reject_vectors():
    V = []
    b, t = rl_step(20, (24, 16))
    base = {"w": b}
    good = write_full(base, {"w": t}, block_elems=200, force_encoding="bf16-delta")
    P = split(good)

    def n(name, desc, covers, data, error, modes=None, base_=None):
        V.append(Vector(name, desc, covers, base if base_ is None else base_, data, error=error,
                        modes=modes or ["random", "stream"]))

    def mod(fn, **kw):
        p = split(good)
        fn(p)
        return assemble(p, **kw)

    # -- truncation at every structural boundary
    bounds = {"in_magic": 5, "after_header": 16, "in_meta_header": 20, "after_meta": 52}
    pos = 52
    for i, r in enumerate(P.recs[1:4]):
        bounds[f"in_{r.type.decode().lower()}{i}_header"] = pos + 8
        bounds[f"in_{r.type.decode().lower()}{i}_payload"] = pos + 16 + (r.size - 16) // 2
        pos += r.size
        bounds[f"after_{r.type.decode().lower()}{i}"] = pos
    ioff = len(good) - 40 - 16 - len(P.index_payload)
    bounds.update({"before_index": ioff, "in_index": ioff + 20, "before_trailer": len(good) - 40,
                   "in_trailer": len(good) - 20, "last_byte": len(good) - 1})
    for k, cut in bounds.items():
        n(f"n_truncated_{k}", f"file cut at byte {cut} ({k.replace('_', ' ')})", ["11", "12", "15"], good[:cut],
          "truncated")
    n("n_empty_file", "zero bytes", ["4", "12.1"], b"", "truncated")
    # -- magic and versions
    n("n_bad_magic", "not an arcfmt file", ["4"], b"PK\x03\x04" + good[4:], "bad_magic")
    n("n_bad_magic_crlf_to_lf", "magic damaged by CRLF→LF conversion", ["4"],
      good[:4] + b"\n\x1a\n" + good[7:], "bad_magic")
    n("n_bad_magic_short", "a few bytes that are not the magic", ["4", "12.1"], b"ARC1", "bad_magic")

    hdr = bytearray(P.header)
    hdr[8:10] = (2).to_bytes(2, "little")

    def tr_major(tb):
        tb[16:18] = (2).to_bytes(2, "little")
        fix_trailer_checksum(tb)
    n("n_future_major", "major version 2 in header and trailer", ["4", "11", "16"],
      assemble(split(good), header=bytes(hdr), trailer_fn=tr_major), "unsupported_version")
    hdr = bytearray(P.header)
    hdr[12] = 4
    n("n_reserved_header_flags", "a reserved header flag bit set (bit 2; bit 0 is COMPACT_INDEX, bit 1 "
      "INLINE_BLOCKS)", ["4"],
      assemble(split(good), header=bytes(hdr)), "reserved_bits")

    def tr_flags(tb):
        tb[20] = 0x80
        fix_trailer_checksum(tb)
    n("n_reserved_trailer_flags", "a reserved trailer flag bit set", ["11"], assemble(split(good), trailer_fn=tr_flags),
      "reserved_bits")

    def tr_minor(tb):
        tb[18:20] = (0).to_bytes(2, "little")
        fix_trailer_checksum(tb)
    n("n_version_mismatch", "the trailer says 1.0, the header the writer's 1.x", ["12.1"],
      assemble(split(good), trailer_fn=tr_minor),
      "corrupt")

    def tr_ck(tb):
        tb[0] ^= 0x01
    n("n_trailer_checksum", "trailer bytes changed, checksum not", ["11"], assemble(split(good), trailer_fn=tr_ck),
      "checksum")

    def tr_off(tb):
        tb[0:8] = (int.from_bytes(tb[0:8], "little") + 8).to_bytes(8, "little")
        fix_trailer_checksum(tb)
    n("n_trailer_bad_index_offset", "trailer points past the index", ["11"], assemble(split(good), trailer_fn=tr_off),
      "corrupt")

    def meta_flags(p):
        p.recs[0].payload = b"\x04" + p.recs[0].payload[1:]   # bit 0 is PREFIXED_NAMES (1.3), bit 1 HISTORY (1.9)
    n("n_reserved_meta_flags", "META reserved flag (bit 2) set", ["6"], mod(meta_flags), "reserved_bits")
    V += prefix_vectors()
    tens_i = next(i for i, r in enumerate(P.recs) if r.type == L.TENS)

    def tens_edit(fn):
        def f(p):
            th = records.parse_tensor(p.recs[tens_i].payload, "")
            p.recs[tens_i].payload = fn(th)
        return f

    def tp(th, **kw):
        args = dict(name=th.name.encode(), dtype=th.dtype.code, dims=th.shape, block_elems=th.block_elems,
                    flags=1, base_hash=th.base_hash, target_hash=th.target_hash)
        args.update(kw)
        return tens_payload(**args)
    n("n_reserved_tens_flags", "TENS reserved flag bit set", ["7"], mod(tens_edit(lambda th: tp(th, flags=3))),
      "reserved_bits")
    # -- records
    def flip_blk(p):
        i = next(i for i, r in enumerate(p.recs) if r.type == L.BLCK)
        r = p.recs[i]
        good_ck = record_checksum(r.type + len(r.payload).to_bytes(4, "little"), r.payload)
        r.payload = r.payload[:-1] + bytes([r.payload[-1] ^ 0x10])
        r.checksum = good_ck
    n("n_record_checksum", "a BLCK byte changed after its checksum was computed", ["5"], mod(flip_blk), "checksum")

    def unknown_critical(p):
        p.recs.insert(2, Rec(b"ZZZZ", b"must understand"))
    n("n_unknown_critical_record", "a critical record type no decoder knows", ["5", "10", "16"],
      mod(unknown_critical), "unknown_record")

    def bad_type(p):
        p.recs.insert(2, Rec(b"z1zz", b"x"))
    n("n_record_type_not_letters", "a record type with a digit", ["5"], mod(bad_type), "corrupt")
    # -- limits
    n("n_limit_name_length", "a 1025-byte tensor name", ["7", "14"],
      mod(tens_edit(lambda th: tp(th, name=b"n" * 1025))), "limit")
    n("n_limit_ndim", "17 dimensions", ["7", "14"],
      mod(tens_edit(lambda th: tp(th, dims=(1,) * 15 + th.shape))), "limit")
    n("n_limit_block_elems", "block_elems of 2^24+1", ["7", "14"],
      mod(tens_edit(lambda th: tp(th, block_elems=(1 << 24) + 1))), "limit")
    n("n_limit_tensor_elems", "a tensor of 2^41 elements", ["7", "14"],
      mod(tens_edit(lambda th: tp(th, dims=(1 << 21, 1 << 20)))), "limit")
    n("n_limit_blocks_per_tensor", "2^25 blocks in one tensor", ["7", "14"],
      mod(tens_edit(lambda th: tp(th, dims=(1 << 25,), block_elems=1))), "limit")
    # Shapes whose only fault is the element limit: an empty keyframe tensor (no base, no blocks) given
    # other dims, with the index digest made to match, so that a decoder without the check accepts it.
    for vname, dims, desc in (
            ("n_limit_zero_dim_huge_dim", (0, 1 << 41), "dims [0, 2^41]: no elements, but the non-zero dims "
                                                         "exceed MAX_TENSOR_ELEMS"),
            ("n_limit_zero_dim_after_huge_dim", (1 << 41, 0), "dims [2^41, 0]: the zero dim comes last"),
            ("n_limit_zero_dim_max_varint", (0, (1 << 64) - 1), "dims [0, 2^64-1]: the largest varint after a 0"),
            ("n_limit_zero_dim_elems_wrap", (0, 1 << 32, 1 << 32), "dims [0, 2^32, 2^32]: the non-zero dims "
                                                                    "multiply to 2^64, which wraps to 0 in 64 bits"),
            ("n_limit_tensor_elems_wrap", (1 << 32, 1 << 32), "dims [2^32, 2^32]: 2^64 elements, which wraps to 0 "
                                                              "in 64 bits")):
        n(vname, desc, ["7", "14"], empty_with_dims(dims), "limit", base_={})

    def big_record(p):
        i = next(i for i, r in enumerate(p.recs) if r.type == L.BLCK)
        p.recs[i].checksum = 0
    data = bytearray(mod(big_record))
    # declare a payload beyond MAX_RECORD_PAYLOAD in the first BLCK's header (the index still says the real size)
    q = split(good)
    off = 52 + q.recs[1].size
    data[off + 4: off + 8] = ((1 << 28) + 1).to_bytes(4, "little")
    n("n_limit_record_payload", "a record header declaring 2^28+1 payload bytes", ["5", "14"], bytes(data), "limit")
    body = records.build_index(split(good).index)
    n("n_limit_index_body", "an index declaring a 2^26+1-byte body", ["10", "14"],
      assemble(split(good), index_payload=bytes([1]) + varint((1 << 26) + 1) + body[1:]), "limit")

    raw_body = L.IndexBody.build(dict(
        base_digest=bytes(16), target_digest=bytes(16), tensor_count=(1 << 20) + 1, block_count=0, name_lengths=[],
        names=b"", tens_offsets=[], tens_sizes=[], tens_checksums=[], tens_block_counts=[], blk_offsets=[],
        blk_sizes=[], blk_checksums=[], blk_encodings=[], other_count=0, other_offsets=[], other_sizes=[],
        other_types=[]))
    n("n_limit_tensor_count", "an index declaring 2^20+1 tensors", ["10", "14"],
      assemble(split(good), index_payload=raw_index_payload(raw_body)), "limit")
    # -- zstd frame rules, bombs
    bz, tz = rl_step(21, (40, 40), density=0.3)
    zfile = write_full({"w": bz}, {"w": tz}, force_codec="zstd", force_encoding="bf16-delta")

    def restream(fn, src=zfile):
        p = split(src)
        i = next(i for i, r in enumerate(p.recs) if r.type == L.BLCK)
        th = records.parse_tensor(p.recs[i - 1].payload, "")
        info = records.parse_block(p.recs[i].payload, th, 0, 0, "")
        streams = []
        pos = info.data_offset
        for s in info.streams:
            streams.append([s.codec, p.recs[i].payload[pos:pos + s.stored], s.decoded])
            pos += s.stored
        params = list(info.params)
        fn(streams, params)
        payload = L.BlockPayload.build(
            dict(tensor=0, block=0, encoding=info.encoding, params=params,
                 streams=[(c, len(d)) for c, d, _ in streams]),
            param_count=lambda e, h: len(params), stream_count=lambda e, q: len(streams))
        p.recs[i].payload = payload + b"".join(d for _, d, _ in streams)
        return assemble(p)

    def bomb(streams, params):
        c, d, L_ = streams[0]
        streams[0][1] = zstandard.ZstdCompressor(level=3).compress(b"\0" * (L_ * 64))
    n("n_zstd_bomb", "a zstd stream whose frame declares 64 times the stream's decoded length", ["9", "17"],
      restream(bomb), "corrupt", base_={"w": bz})

    def no_size(streams, params):
        c, d, L_ = streams[0]
        raw = zstandard.ZstdDecompressor().decompress(d)
        streams[0][1] = zstandard.ZstdCompressor(level=3, write_content_size=False).compress(raw)
    n("n_zstd_no_content_size", "a zstd frame without Frame_Content_Size", ["9"], restream(no_size), "corrupt",
      base_={"w": bz})

    def trailing(streams, params):
        streams[0][1] = streams[0][1] + zstandard.ZstdCompressor().compress(b"")
    n("n_zstd_two_frames", "a second zstd frame after the first", ["9"], restream(trailing), "corrupt",
      base_={"w": bz})

    def window(streams, params):
        # a hand-made frame: Window_Descriptor 2^28 (exponent 18), 4-byte Frame_Content_Size, one raw block
        raw = zstandard.ZstdDecompressor().decompress(streams[0][1])
        frame = b"\x28\xb5\x2f\xfd" + bytes([0x80, 18 << 3]) + len(raw).to_bytes(4, "little")
        frame += ((len(raw) << 3) | 1).to_bytes(3, "little") + raw
        streams[0][1] = frame
    n("n_zstd_window_too_large", "a zstd frame asking for a 256 MiB window", ["9", "14"], restream(window),
      "limit", base_={"w": bz})

    def xz_bomb(streams, params):
        c, d, L_ = streams[0]
        streams[0][0] = 2
        streams[0][1] = _lzma.compress(b"\0" * (L_ + 1000), format=_lzma.FORMAT_XZ)
    n("n_xz_bomb", "an xz stream that decodes past the declared length", ["9", "17"], restream(xz_bomb), "corrupt",
      base_={"w": bz})

    def bz_bomb(streams, params):
        c, d, L_ = streams[0]
        streams[0][0] = 3
        streams[0][1] = _bz2.compress(b"\0" * (L_ + 1000))
    n("n_bz2_bomb", "a bz2 stream that decodes past the declared length", ["9", "17"], restream(bz_bomb), "corrupt",
      base_={"w": bz})

    def raw_len(streams, params):
        raw = zstandard.ZstdDecompressor().decompress(streams[0][1])
        streams[0][0] = 0
        streams[0][1] = raw[:-1]
    n("n_raw_length_mismatch", "a raw stream one byte short", ["9"], restream(raw_len), "corrupt", base_={"w": bz})

    def unknown_codec(streams, params):
        streams[0][0] = 9
    n("n_unknown_codec", "codec id 9", ["9"], restream(unknown_codec), "unsupported", base_={"w": bz})

    def empty_zstd(streams, params):
        streams[2][0] = 1
        streams[2][1] = b""
    # the exceptions stream (2) is empty when e = 0; use a file with no exceptions
    bn, tn = rl_step(22, (40, 40), density=0.3, exc=0.0)
    n("n_empty_stream_not_raw", "a stream marked zstd whose stored bytes are empty (its decoded length is not 0: "
      "no frame magic; n_empty_stream_zstd_frame tests an empty stream)", ["9"],
      restream(empty_zstd, write_full({"w": bn}, {"w": tn}, force_codec="zstd", force_encoding="bf16-delta")),
      "corrupt", base_={"w": bn})

    # -- block contents (raw streams so the bytes are easy to change)
    rawfile = write_full(base, {"w": t}, force_codec="raw", force_encoding="bf16-delta")

    def rs(fn):
        return restream(fn, rawfile)

    def c_too_big(streams, params):
        params[0] = 24 * 16 + 1
    n("n_changed_count_beyond_block", "c > m", ["8.3"], rs(c_too_big), "corrupt")

    def e_too_big(streams, params):
        params[1] = params[0] + 1
    n("n_exception_count_beyond_changed", "e > c", ["8.3"], rs(e_too_big), "corrupt")

    def pos_out(streams, params):
        d = bytearray(streams[0][1])
        c = params[0]
        pw = len(d) // c
        last = c - 1
        for k in range(pw):  # make the last gap huge
            d[k * c + last] = 0xFF
        streams[0][1] = bytes(d)
    n("n_position_beyond_block", "a changed position past the end of the block", ["8.3"], rs(pos_out), "corrupt")

    def step_zero(streams, params):
        d = bytearray(streams[1][1])
        d[0] = 0
        streams[1][1] = bytes(d)
    n("n_step_zero", "a mantissa step of 0", ["8.3"], rs(step_zero), "corrupt")

    def step_range(streams, params):
        d = bytearray(streams[1][1])
        d[0] = 0x7F
        d[1] = 0x81
        streams[1][1] = bytes(d)
    n("n_step_out_of_range", "mantissa steps of +127 and -127 that leave the mantissa range", ["8.3"], rs(step_range),
      "corrupt")

    def layout_of(streams, params):
        """(positions, exception indices, kept positions) of the raw bf16-delta block."""
        c, e = params
        pos = ungap(from_planes(streams[0][1], c, bytes_for(24 * 16 - 1)))
        xi = ungap(from_planes(streams[2][1], e, bytes_for(c - 1))) if e else np.zeros(0, np.int64)
        kept = np.setdiff1d(np.arange(c), xi)
        return pos, xi, pos[kept]
    bu = b.view(np.uint16).reshape(-1)

    def exc_keeps(streams, params):
        pos, xi, _ = layout_of(streams, params)
        vals = bytearray(streams[3][1])
        e = params[1]
        v = int(bu[pos[xi[0]]]) ^ 1  # sign and exponent of the base kept: not an exception
        vals[0], vals[e] = v & 0xFF, v >> 8
        streams[3][1] = bytes(vals)
    n("n_exception_keeps_exponent", "an exception whose value keeps the base's sign and exponent", ["8.3"],
      rs(exc_keeps), "corrupt")
    n("n_block_extra_bytes", "a BLCK payload with a byte after its streams", ["8"], _extra_payload(rawfile),
      "corrupt")

    def wrong_step(streams, params):
        _, _, kpos = layout_of(streams, params)
        steps = bytearray(streams[1][1])
        for r, p_ in enumerate(kpos):
            s_ = steps[r] - 256 if steps[r] > 127 else steps[r]
            mant = int(bu[p_]) & 0x7F
            if 0 <= mant - s_ <= 0x7F and s_ != 0:
                steps[r] = (-s_) & 0xFF  # still a valid step, but not the right one
                break
        streams[1][1] = bytes(steps)
    n("n_verification", "a well-formed block that rebuilds a different tensor", ["12.3", "13"], rs(wrong_step),
      "verification")

    b2_wrong = b.copy()
    b2_wrong.view(np.uint16).reshape(-1)[5] ^= 1
    two_raw = write_full({"a": b, "b": b}, {"a": t, "b": t}, force_codec="raw", force_encoding="bf16-delta")
    V.append(Vector("n_verification_then_wrong_base", "tensor a (one block) rebuilds a different tensor, and tensor "
                    "b's base does not match: front to back, a is verified as soon as its block is in (§12.2 step 3); "
                    "random access checks every base first (§12.1 step 6)", ["12.1", "12.2", "12.3"],
                    {"a": b, "b": b2_wrong}, restream(wrong_step, two_raw), error="verification",
                    errors={"random": "wrong_base"}))
    n("n_unknown_encoding", "encoding id 12 (the first unassigned: 11 is ctx-delta-rhp since 1.10)", ["8"],
      mod(lambda p: set_first_encoding(p, 12)), "unsupported")

    n("n_encoding_dtype_mismatch", "float-delta used on BF16", ["8"], mod(lambda p: set_first_encoding(p, 3)),
      "unsupported")
    n("n_unknown_dtype", "dtype code 16", ["2", "7"], mod(tens_edit(lambda th: tp(th, dtype=16))), "unsupported")
    n("n_name_invalid_utf8", "a name that is not UTF-8 (byte 0xFF), in its TENS record and the index; no base, "
      "digest consistent", ["7", "10"], renamed_keyframe(b"w\xff"), "corrupt", base_={})
    n("n_name_control_char", "a name with a newline, in its TENS record and the index; no base, digest "
      "consistent", ["7", "10", "17"], renamed_keyframe(b"w\n"), "corrupt", base_={})
    n("n_name_empty", "an empty name, in its TENS record and the index; no base, digest consistent", ["7", "10"],
      renamed_keyframe(b""), "corrupt", base_={})
    n("n_name_reserved", "a tensor named __metadata__ (safetensors' reserved key), in its TENS record and the "
      "index; no base, digest consistent", ["7", "10", "19"], renamed_keyframe(b"__metadata__"), "corrupt", base_={})

    def nonminimal(p):
        th = records.parse_tensor(p.recs[tens_i].payload, "")
        pl = tp(th)
        # block_elems varint padded with a redundant 0x80 0x00
        be = varint(th.block_elems)
        i = pl.index(be, len(th.name) + 3)
        p.recs[tens_i].payload = pl[:i] + bytes([be[0] | 0x80]) + be[1:] + b"\x00" + pl[i + len(be):] if len(be) == 1 \
            else pl[:i] + be[:-1] + bytes([be[-1] | 0x80, 0]) + pl[i + len(be):]
    n("n_varint_not_minimal", "a varint with a redundant trailing zero group", ["1"], mod(nonminimal), "corrupt")
    n("n_tens_extra_bytes", "a TENS payload with a byte left over", ["5", "7"],
      mod(tens_edit(lambda th: tp(th) + b"\0")), "corrupt")

    def needs_base_off(p):
        th = records.parse_tensor(p.recs[tens_i].payload, "")
        p.recs[tens_i].payload = tp(th, flags=0)
    n("n_delta_without_base_flag", "a bf16-delta block in a tensor without NEEDS_BASE", ["7", "8"],
      mod(needs_base_off), "corrupt", base_={})

    def bad_ordinal(p):
        i = [i for i, r in enumerate(p.recs) if r.type == L.BLCK][1]
        pl = bytearray(p.recs[i].payload)
        pl[1] = 0  # block ordinal 0 again
        p.recs[i].payload = bytes(pl)
    n("n_block_ordinal_mismatch", "the second block says it is block 0", ["8"], mod(bad_ordinal), "corrupt")

    # -- index
    def overlap(index):
        index.entries[0].blocks[1].offset -= 4
    n("n_index_overlap", "two located records overlap", ["10"], assemble(split(good), index_fn=overlap), "corrupt")

    def gap(index):
        index.entries[0].blocks[1].offset += 1
        index.entries[0].blocks[1].size -= 1
    n("n_index_gap", "a hole between located records", ["10"], assemble(split(good), index_fn=gap), "corrupt")

    def out_of_range(index):
        index.entries[0].blocks[-1].offset = 1 << 40
    n("n_index_offset_out_of_range", "a block offset past the end of the file", ["10"],
      assemble(split(good), index_fn=out_of_range), "corrupt")

    def swap(index):
        b0, b1 = index.entries[0].blocks[0], index.entries[0].blocks[1]
        index.entries[0].blocks[0], index.entries[0].blocks[1] = b1, b0
    n("n_index_order", "blocks listed out of order", ["10"], assemble(split(good), index_fn=swap), "corrupt")

    def ck(index):
        index.entries[0].blocks[0].checksum ^= 1
    n("n_index_checksum_mismatch", "the index's checksum for a block differs from the record's", ["10"],
      assemble(split(good), index_fn=ck), "corrupt")

    def enc(index):
        index.entries[0].blocks[0].encoding = 1
    n("n_index_encoding_mismatch", "the index says xor, the block says bf16-delta", ["10"],
      assemble(split(good), index_fn=enc), "corrupt")

    def name(index):
        index.entries[0].name = "other"
    n("n_index_name_mismatch", "the index names a tensor differently than its TENS record", ["10"],
      assemble(split(good), index_fn=name), "corrupt")
    two = write_full({"a": b, "b": b}, {"a": t, "b": t})

    def dup(index):
        index.entries[1].name = index.entries[0].name
    n("n_duplicate_names", "two tensors with the same name", ["7", "10"], assemble(split(two), index_fn=dup),
      "corrupt", base_={"a": b, "b": b})

    def dup_tens(p):
        j = [i for i, r in enumerate(p.recs) if r.type == L.TENS][1]
        th = records.parse_tensor(p.recs[j].payload, "")
        p.recs[j].payload = tp(th, name=b"a")
        p.recs[j].name = "a"
    n("n_duplicate_tens_names", "two TENS records with the same name", ["7"], _assemble_mod(two, dup_tens),
      "corrupt", base_={"a": b, "b": b})
    # -- digests, ends, odd records
    def target_digest(index):
        index.target_digest = bytes(16)
    n("n_target_digest_mismatch", "the index's target digest does not match the tensors", ["12.3", "13.2"],
      assemble(split(good), index_fn=target_digest), "verification")

    def base_digest(index):
        index.base_digest = bytes(16)
    n("n_base_digest_mismatch", "the index's base digest does not match the tensors' base hashes",
      ["12.3", "13.2"], assemble(split(good), index_fn=base_digest), "corrupt")
    n("n_data_after_trailer_random", "a byte after the trailer: the last 40 bytes are no trailer", ["11", "12"],
      good + b"\0", "truncated", modes=["random"])
    n("n_data_after_trailer_stream", "a byte after the trailer, read front to back", ["12.2"], good + b"\0",
      "corrupt", modes=["stream"])

    def tr_major_only(tb):
        tb[16:18] = (3).to_bytes(2, "little")
        fix_trailer_checksum(tb)
    n("n_trailer_future_major", "the trailer alone says major version 3", ["11"],
      assemble(split(good), trailer_fn=tr_major_only), "unsupported_version")

    def meta_size(p):
        p.recs[0].payload = p.recs[0].payload + b"\0"
    n("n_meta_size", "a META payload of 21 bytes", ["6", "10"], mod(meta_size), "corrupt")

    def first_not_meta(p):
        p.recs.insert(0, Rec(b"note", b"before META"))
    n("n_first_record_not_meta", "a note before META", ["3", "12.2"], mod(first_not_meta), "corrupt")

    def meta_as_note(p):
        p.recs[0].type = b"note"
    n("n_meta_typed_note", "the record at offset 16 is a note whose 20-byte payload is a valid META payload: "
      "random access expects META there (a decoder that skips the type compare reads it as META and accepts); "
      "front to back the first record is not META", ["3", "5", "12.1", "12.2"],
      mod(meta_as_note, list_others=False), "corrupt")
    noted = write_full(base, {"w": t}, note="x")

    def other_type(index):
        index.others[0].type = b"TENS"
    n("n_index_other_type_reserved", "the index lists an other record as TENS", ["10"],
      assemble(split(noted), index_fn=other_type), "corrupt")

    def other_digit(index):
        index.others[0].type = b"n0te"
    n("n_index_other_type_not_letters", "an other record type with a digit in the index", ["10"],
      assemble(split(noted), index_fn=other_digit), "corrupt")
    n("n_block_elems_zero", "block_elems 0", ["7"], mod(tens_edit(lambda th: tp(th, block_elems=0))), "corrupt")

    def exc_index_out(streams, params):
        c, e = params
        d = bytearray(streams[2][1])
        xw = len(d) // e
        for k in range(xw):
            d[k * e + e - 1] = 0xFF
        streams[2][1] = bytes(d)
    n("n_exception_index_beyond_changed", "an exception index ≥ c", ["8.3"], rs(exc_index_out), "corrupt")
    kf = {"k": bits(np.float16, list(range(0, 60000, 1000)))}
    kraw = write_full(None, kf, force_codec="raw")

    def kf_range(streams, params):
        d = bytearray(streams[0][1])
        d[0] = 0xFF  # exponent field 255 for a 5-bit exponent
        streams[0][1] = bytes(d)
    n("n_keyframe_field_out_of_range", "a keyframe exponent value ≥ 2^E", ["8.5"], restream(kf_range, kraw),
      "corrupt", base_={})

    def zstd_dict(streams, params):
        raw = zstandard.ZstdDecompressor().decompress(streams[0][1])
        d = zstandard.ZstdCompressionDict(b"arcfmt dictionary content " * 8, dict_type=zstandard.DICT_TYPE_RAWCONTENT)
        fr = bytearray(zstandard.ZstdCompressor(dict_data=d, write_dict_id=True).compress(raw))
        # a raw-content dictionary has id 0; write a frame header that names dictionary 7 instead
        fd = fr[4]
        if not fd & 0x03:
            fr = fr[:4] + bytes([fd | 0x01]) + fr[5:6] + b"\x07" + fr[6:] if not fd & 0x20 else \
                fr[:4] + bytes([fd | 0x01]) + b"\x07" + fr[5:]
        streams[0][1] = bytes(fr)
    n("n_zstd_dictionary", "a zstd frame that names a dictionary", ["9"], restream(zstd_dict), "corrupt",
      base_={"w": bz})

    def xz_memory(streams, params):
        c, d, L_ = streams[0]
        raw = zstandard.ZstdDecompressor().decompress(d)
        x = bytearray(_lzma.compress(raw, format=_lzma.FORMAT_XZ, check=_lzma.CHECK_NONE,
                                     filters=[{"id": _lzma.FILTER_LZMA2, "dict_size": 1 << 20}]))
        # block header at byte 12: size, flags, filter id 0x21, props size 1, dict-size byte, padding, CRC32
        hsize = (x[12] + 1) * 4
        hdr = x[12:12 + hsize]
        k = hdr.index(b"\x21\x01", 2) + 2
        hdr[k] = 40  # a 4 GiB - 1 dictionary: far above MAX_XZ_MEMORY
        import zlib
        hdr[-4:] = zlib.crc32(bytes(hdr[:-4])).to_bytes(4, "little")
        x[12:12 + hsize] = hdr
        streams[0][0] = 2
        streams[0][1] = bytes(x)
    n("n_xz_memory_limit", "an xz stream whose dictionary needs more than MAX_XZ_MEMORY", ["9", "14"],
      restream(xz_memory), "limit", base_={"w": bz})

    def xz_dict(code):
        def edit(streams, params):
            raw = zstandard.ZstdDecompressor().decompress(streams[0][1])
            streams[0][0] = 2
            streams[0][1] = xz_with_dictionary_code(raw, code)
        return edit

    def xz_struct(fault):
        """An xz stream declaring a 4 GiB - 1 dictionary (limit), with one structural fault that the
        pre-decoding walk of §9 finds first (corrupt)."""
        def edit(streams, params):
            xz_dict(41 if fault == "props" else 40)(streams, params)
            x = bytearray(streams[0][1])
            n_ = len(x)
            isize = (int.from_bytes(x[n_ - 8:n_ - 4], "little") + 1) * 4
            ist = n_ - 12 - isize
            if fault == "footer":
                x[-2] = ord("Z")
            elif fault == "indicator":
                x[ist] = 1
            elif fault == "flags":
                x[13] |= 0x04
            elif fault == "unpadded":
                x[ist + 2] += 4  # the first record's unpadded size (one byte for a small stream)
            elif fault == "nonminimal":
                body = bytes(x[ist + 1:n_ - 12 - 4]).rstrip(b"\0")  # count and records, padding dropped
                assert body[0] == 1
                idx = b"\x00\x81\x00" + body[1:]
                idx += bytes(-len(idx) % 4)
                idx += zlib.crc32(idx).to_bytes(4, "little")
                footer = bytearray(x[n_ - 12:])
                footer[4:8] = (len(idx) // 4 - 1).to_bytes(4, "little")
                footer[0:4] = zlib.crc32(bytes(footer[4:10])).to_bytes(4, "little")
                x = x[:ist] + bytearray(idx) + footer
            elif fault in ("int_past", "int_long", "block_past_end"):
                # the index rewritten; a decoder that reads on past the fault finds a 4 GiB - 1 dictionary
                # (limit) or reads past the stored bytes
                assert x[ist + 1] == 1  # one block; its unpadded size as stored:
                k = ist + 2
                while x[k] & 0x80:
                    k += 1
                unpadded = bytes(x[ist + 2:k + 1])
                if fault == "int_past":
                    # the uncompressed size's continuation bytes run to the end of the index; the footer's
                    # first byte (CRC32, unchecked before decoding) would end it as 0x01
                    idx = b"\x00\x01" + unpadded
                    idx += b"\x80" * (4 - len(idx) % 4 or 4)
                    crc0 = b"\x01"
                elif fault == "int_long":
                    idx, crc0 = b"\x00" + b"\x80" * 9 + b"\x00\x00", b""  # a record count of 10+ bytes
                else:  # two blocks, the first 2 MiB long: the second would start far past the stored bytes
                    idx = b"\x00\x02" + _xz_mbi(1 << 21) + b"\x01" + unpadded + b"\x01"
                    idx += bytes(-len(idx) % 4)
                    idx += zlib.crc32(idx).to_bytes(4, "little")
                    crc0 = b""
                footer = bytearray(x[n_ - 12:])
                footer[4:8] = (len(idx) // 4 - 1).to_bytes(4, "little")
                footer[0:4] = zlib.crc32(bytes(footer[4:10])).to_bytes(4, "little")
                if crc0:
                    footer[0:1] = crc0
                x = x[:ist] + bytearray(idx) + footer
            elif fault == "props_past":
                # one block whose 8-byte header ends right after the LZMA2 filter's id and property size:
                # the property byte would be the header's CRC32, whose first byte is 40 (a 4 GiB - 1
                # dictionary for a decoder that reads on)
                hdr = bytes([1, 0, 0x21, 1, 40, 0, 0, 0])
                idx = b"\x00\x01\x0c\x01"
                idx += zlib.crc32(idx).to_bytes(4, "little")
                footer = bytearray(x[n_ - 12:])
                footer[4:8] = (len(idx) // 4 - 1).to_bytes(4, "little")
                footer[0:4] = zlib.crc32(bytes(footer[4:10])).to_bytes(4, "little")
                x = x[:12] + bytearray(hdr) + bytearray(4) + bytearray(idx) + footer
            streams[0][1] = bytes(x)
        return edit
    import zlib
    for fault, desc in (("footer", "the stream footer's magic damaged"),
                        ("indicator", "the index indicator byte not 0"),
                        ("flags", "a reserved bit of the block header's flags set"),
                        ("unpadded", "the index's unpadded size 4 too large: the block does not end at the index"),
                        ("nonminimal", "the index's record count written as a non-minimal 2-byte integer"),
                        ("props", "LZMA2 properties byte 41 (> 40)"),
                        ("int_past", "an index integer whose continuation bytes run past the end of the index"),
                        ("int_long", "an index record count of more than 9 bytes"),
                        ("block_past_end", "two blocks in the index, the second starting past the stored bytes"),
                        ("props_past", "a block header that ends before its LZMA2 filter's property byte")):
        n(f"n_xz_structure_{fault}", f"an xz stream with {desc}, declaring a dictionary beyond MAX_XZ_MEMORY: "
          "the structure is checked first (corrupt, not limit)", ["9"], restream(xz_struct(fault)), "corrupt",
          base_={"w": bz})
    def xz_crc(streams, params):
        xz_dict(20)(streams, params)
        x = bytearray(streams[0][1])
        x[12 + (x[12] + 1) * 4 - 1] ^= 0xFF
        streams[0][1] = bytes(x)
    n("n_xz_block_header_crc", "an xz stream whose block header CRC32 does not match (the structure parses; "
      "the decoder refuses it)", ["9"], restream(xz_crc), "corrupt", base_={"w": bz})
    n("n_xz_dictionary_over_limit", "an xz stream whose block header declares a 192 MiB LZMA2 dictionary "
      "(code 31): over MAX_XZ_MEMORY whatever the decoder's own memory needs", ["9", "14"], restream(xz_dict(31)),
      "limit", base_={"w": bz})
    V.append(Vector("y_xz_dictionary_at_limit", "an xz stream whose block header declares a 128 MiB LZMA2 "
                    "dictionary (code 30): exactly MAX_XZ_MEMORY, accepted", ["9", "14"], {"w": bz},
                    restream(xz_dict(30)), expect_tensors={"w": tz}))
    # -- more structure: records out of place, index columns, codec trailers
    def lie_type(p):
        p.recs.insert(2, Rec(b"ZZZZ", b"must understand"))
    V.append(Vector("n_index_hides_critical_record", "the index lists a critical ZZZZ record as ancillary zzzz",
                    ["5", "12.1"], base,
                    _assemble_fn(good, lie_type, lambda ix: setattr(ix.others[0], "type", b"zzzz")),
                    error="corrupt", errors={"stream": "unknown_record"}))

    def second_meta(p):
        p.recs.insert(2, Rec(b"META", p.recs[0].payload))
    n("n_second_meta", "a second META record", ["3", "12.2"], mod(second_meta), "corrupt")

    def tens_between_blocks(p):
        i = [i for i, r in enumerate(p.recs) if r.type == L.BLCK][0]
        p.recs.insert(i + 1, Rec(L.TENS, p.recs[i - 1].payload, name="w2"))
    n("n_tens_while_blocks_due", "a TENS record between the blocks of a tensor", ["3", "12.2"],
      mod(tens_between_blocks), "corrupt")

    def drop_block(p):
        i = [i for i, r in enumerate(p.recs) if r.type == L.BLCK][-1]
        del p.recs[i]
    n("n_missing_block", "the last block of a tensor is missing", ["3", "10", "12.2"], mod(drop_block), "corrupt")

    def critical_first(p):
        p.recs.insert(0, Rec(b"ZZZZ", b"x"))
    V.append(Vector("n_unknown_critical_first", "an unknown critical record before META (random access: the "
                    "index cannot tile the file from offset 52)", ["5", "10", "12.2"], base, mod(critical_first),
                    error="unknown_record", errors={"random": "corrupt"}))

    def body_edit(fn, src=good):
        p = split(src)
        d = dict(_index_dict_of(p))
        fn(d)
        body = L.IndexBody.build(d)
        return assemble(p, index_payload=raw_index_payload(body))

    def many_others(d):
        d["other_count"] = (1 << 20) + 1
    n("n_limit_other_count", "an index declaring 2^20+1 other records", ["10", "14"], body_edit(many_others), "limit")

    def counts_off(d):
        c = list(d["tens_block_counts"])
        c[0] += 1
        d["tens_block_counts"] = c
    n("n_index_block_counts", "per-tensor block counts that do not sum to block_count", ["10"],
      body_edit(counts_off), "corrupt")

    def counts_wrap(d):
        d["tens_block_counts"] = [c + (1 << 63) for c in d["tens_block_counts"]]
    n("n_index_block_counts_wrap", "block counts, each 2^63 too large, whose sum wraps to block_count in 64 bits "
      "(a 64-bit sum would then report limit)", ["10"], body_edit(counts_wrap, two), "corrupt",
      base_={"a": b, "b": b})

    def size_small(d):
        z = list(d["blk_sizes"])
        z[0] = 8
        d["blk_sizes"] = z
    n("n_index_record_size", "a located record size below 16", ["10"], body_edit(size_small), "corrupt")
    p_ = split(good)
    body = L.IndexBody.build(dict(_index_dict_of(p_))) + b"\0"
    n("n_index_extra_bytes", "a byte after the index body's columns", ["10"],
      assemble(p_, index_payload=raw_index_payload(body)), "corrupt")
    body = L.IndexBody.build(dict(_index_dict_of(split(good))))
    n("n_index_unknown_codec", "index body codec 9", ["10"],
      assemble(split(good), index_payload=bytes([9]) + varint(len(body)) + body), "unsupported")

    def long_name(d):
        d["name_lengths"] = [1025] + list(d["name_lengths"][1:])
        d["names"] = b"w" * 1025 + d["names"][1:]  # the first (and only) name was "w"
    n("n_index_name_too_long", "a 1025-byte name in the index", ["10", "14"], body_edit(long_name), "limit")

    def tr_shift(tb):
        off = int.from_bytes(tb[0:8], "little")
        size = int.from_bytes(tb[8:16], "little")
        tb[0:8] = (off - 8).to_bytes(8, "little")
        tb[8:16] = (size + 8).to_bytes(8, "little")
        fix_trailer_checksum(tb)
    n("n_trailer_index_offset_shifted", "the trailer points 8 bytes before the index", ["11", "12.2"],
      assemble(split(good), trailer_fn=tr_shift), "corrupt")

    def zstd_checksum(streams, params):
        raw = zstandard.ZstdDecompressor().decompress(streams[0][1])
        fr = bytearray(zstandard.ZstdCompressor(level=3, write_checksum=True).compress(raw))
        fr[-1] ^= 0xFF
        streams[0][1] = bytes(fr)
    n("n_zstd_bad_content_checksum", "a zstd frame whose content checksum does not match", ["9"],
      restream(zstd_checksum), "corrupt", base_={"w": bz})

    def zstd_cut(streams, params):
        streams[0][1] = streams[0][1][:-1]
    n("n_zstd_cut_short", "a zstd frame missing its last byte", ["9"], restream(zstd_cut), "corrupt", base_={"w": bz})

    def xz_trailing(streams, params):
        raw = zstandard.ZstdDecompressor().decompress(streams[0][1])
        streams[0][0] = 2
        streams[0][1] = _lzma.compress(raw, format=_lzma.FORMAT_XZ) + b"\0\0\0\0"
    n("n_xz_trailing_data", "bytes after the xz stream", ["9"], restream(xz_trailing), "corrupt", base_={"w": bz})

    def bz2_trailing(streams, params):
        raw = zstandard.ZstdDecompressor().decompress(streams[0][1])
        streams[0][0] = 3
        streams[0][1] = _bz2.compress(raw) + b"x"
    n("n_bz2_trailing_data", "bytes after the bzip2 stream", ["9"], restream(bz2_trailing), "corrupt",
      base_={"w": bz})

    # -- base
    wrong = b.copy()
    wrong.view(np.uint16).reshape(-1)[5] ^= 1
    n("n_wrong_base_values", "one base value differs", ["7", "12.3"], good, "wrong_base", base_={"w": wrong})
    n("n_wrong_base_dtype", "base tensor has another dtype", ["7"], good, "wrong_base",
      base_={"w": b.view(np.int16)})
    n("n_wrong_base_shape", "base tensor has another shape", ["7"], good, "wrong_base", base_={"w": b.reshape(16, 24)})
    n("n_wrong_base_missing", "the base lacks the tensor", ["7"], good, "wrong_base", base_={"x": b})
    V.extend(check_vectors(good, base, b, t, mod, tens_edit, tp, restream, rs, body_edit, zfile, bz, kraw, noted,
                           two, wrong))
    V.extend(base_file_vectors(good, b, mod, tens_edit, tp))
    return V


def safetensors_bytes(header, data: bytes = b"", length: int | None = None) -> bytes:
    """A base file from its parts, any of them wrong: the header (a dict, or the header bytes), the data
    section, and the header length field (``length``, default the header's true length)."""
    raw = header if isinstance(header, bytes) else json.dumps(header, separators=(",", ":")).encode()
    return (len(raw) if length is None else length).to_bytes(8, "little") + raw + data


def base_file_vectors(good, b, mod, tens_edit, tp):
    """SPEC.md §1 "Base files": a base file that is not a valid safetensors file is `wrong_base`, checked
    when it is opened. ``good`` applies to ``{"w": b}`` (BF16, 24 x 16)."""
    import xxhash
    V = []

    def n(name, desc, base_bytes, data=good):
        V.append(Vector(name, desc, ["1", "12.3", "15"], base_bytes, data, error="wrong_base"))
    raw = b.tobytes()
    entry = {"dtype": "BF16", "shape": [24, 16], "data_offsets": [0, len(raw)]}
    n("n_base_file_short", "a base file of 5 bytes: shorter than its 8-byte header length", b"\x02\x00\x00\x00\x00")
    n("n_base_file_header_length", "a base file whose header length is one byte more than the file holds",
      safetensors_bytes({"w": entry}, raw, length=len(json.dumps({"w": entry}, separators=(",", ":"))) + len(raw) + 1))
    n("n_base_file_header_not_json", "a base file whose header is not JSON", safetensors_bytes(b'{"w":', raw))
    n("n_base_file_header_not_object", "a base file whose header is a JSON array", safetensors_bytes(b"[]", raw))
    n("n_base_file_metadata", "a base file whose __metadata__ maps a key to a number",
      safetensors_bytes({"__metadata__": {"format": 1}, "w": entry}, raw))
    n("n_base_file_entry", "a base file whose tensor entry has no data_offsets",
      safetensors_bytes({"w": {"dtype": "BF16", "shape": [24, 16]}}, raw))
    n("n_base_file_metadata_null", "a base file whose __metadata__ is null (present, so it must be an object)",
      safetensors_bytes({"__metadata__": None, "w": entry}, raw))
    n("n_base_file_shape_not_array", "a base file whose tensor's shape is the string \"\" (not an array; a "
      "reader that iterates it would see a scalar)",
      safetensors_bytes({"w": dict(entry, shape="")}, raw))
    hdr = json.dumps({"w": entry}, separators=(",", ":")).encode()
    n("n_base_file_header_bom", "a base file whose JSON header starts with a UTF-8 byte order mark",
      safetensors_bytes(b"\xef\xbb\xbf" + hdr, raw))
    n("n_base_file_header_utf16", "a base file whose JSON header is UTF-16-LE (some JSON parsers detect it)",
      safetensors_bytes(json.dumps({"w": entry}, separators=(",", ":")).encode("utf-16-le"), raw))
    n("n_base_file_offsets_outside", "a base file whose tensor's data_offsets [2, 770] end 2 bytes past its "
      "768-byte data section", safetensors_bytes({"w": dict(entry, data_offsets=[2, len(raw) + 2])}, raw))
    # a file that needs no base: the base file is checked all the same, when it is opened
    kf = write_full(None, {"k": np.arange(6, dtype=np.uint8)})
    n("n_base_file_offsets_outside_unused", "a keyframe file (it needs no base) and a base file whose only "
      "tensor (U8 [10], not used) has data_offsets [0, 10] in an 8-byte data section",
      safetensors_bytes({"u": {"dtype": "U8", "shape": [10], "data_offsets": [0, 10]}}, bytes(8)), kf)
    n("n_base_file_header_length_unused", "a keyframe file (it needs no base) and a base file whose header "
      "length is one byte more than the file holds", safetensors_bytes(b"{}", length=3), kf)
    # data_offsets span 770 bytes for a 768-byte BF16 [24, 16]; the file's base_hash (and base_digest) is
    # the hash of all 770, so a decoder that hashes the range without checking its size accepts the file
    extra = raw + b"\x01\x02"
    h = xxhash.xxh3_64_intdigest(extra)
    lying = mod(tens_edit(lambda th: tp(th, base_hash=h)), base_digest=model_digest([(b"w", 11, (24, 16), h)]))
    n("n_base_file_size_mismatch", "a base file whose tensor's data_offsets hold 770 bytes where BF16 x [24, 16] "
      "is 768 (the file's base_hash is the hash of all 770)", safetensors_bytes(
          {"w": dict(entry, data_offsets=[0, len(extra)])}, extra), lying)
    return V


def check_vectors(good, base, b, t, mod, tens_edit, tp, restream, rs, body_edit, zfile, bz, kraw, noted, two, wrong):
    """Issue 17: a vector for each check of the independent decoder that no other vector notices
    (``python -m conformance mutate``). Where a check is backed up by a later one of the same category,
    a second fault of another category that only a later check finds makes the order observable."""
    V = []

    def n(name, desc, covers, data, error, modes=None, base_=None, errors=None):
        V.append(Vector(name, desc, covers, base if base_ is None else base_, data, error=error,
                        modes=modes or ["random", "stream"], errors=errors))
    tens_i = 1
    th0 = records.parse_tensor(split(good).recs[tens_i].payload, "")

    def tens_raw(fields):
        def f(p):
            p.recs[tens_i].payload = fields
        return f
    head = varint(1) + b"w" + bytes([th0.dtype.code, len(th0.shape)])
    tail = varint(th0.block_elems) + bytes([1]) + th0.base_hash.to_bytes(8, "little") + \
        th0.target_hash.to_bytes(8, "little")
    # -- payload cursor and varints (§1, §5)
    n("n_tens_payload_short", "a TENS payload that ends before its dtype byte", ["5", "7"],
      mod(tens_raw(varint(1) + b"w")), "corrupt")
    n("n_varint_truncated", "a TENS payload of one byte, a varint with its continuation bit set", ["1", "5"],
      mod(tens_raw(b"\x81")), "corrupt")
    n("n_varint_2_64", "a dimension written as a 10-byte varint of value 2^64", ["1", "7"],
      mod(tens_raw(head + b"\x80" * 9 + b"\x02" + varint(th0.shape[1]) + tail)), "corrupt")
    n("n_varint_11_bytes", "dims[0] written as an 11-byte varint (ten continuation bytes; its last byte "
      "would be dims[1] to a decoder that reads on)", ["1", "7"],
      mod(tens_raw(head + b"\x80" * 10 + varint(th0.shape[1]) + tail)), "corrupt")
    # -- names (§7): TENS record and index agree, digest consistent: the name is the only fault
    for vname, raw, desc in (
            ("n_name_surrogate", "w\ud800".encode("utf-8", "surrogatepass"), "a UTF-8-encoded surrogate U+D800"),
            ("n_name_overlong", b"w\xc0\xaf", "an overlong UTF-8 form of '/'"),
            ("n_name_delete_char", b"w\x7f", "U+007F DELETE in the name"),
            ("n_name_nul", b"w\x00x", "a NUL in the name")):
        n(vname, desc + " (no base, index and digest consistent)", ["7", "10"], renamed_keyframe(raw), "corrupt",
          base_={})
    V.append(Vector("y_name_c1_control", "a name holding U+0085 (a C1 control character, allowed by §7)",
                    ["7"], {}, renamed_keyframe("w\u0085".encode()),
                    expect_tensors={"w\u0085": np.arange(6, dtype=np.float32).reshape(2, 3)}))
    # -- header and trailer
    hdr = bytearray(split(good).header)
    hdr[8:10] = (2).to_bytes(2, "little")
    n("n_header_future_major", "major version 2 in the header only (the trailer says 1): the header is checked "
      "first", ["4", "12.1"], assemble(split(good), header=bytes(hdr)), "unsupported_version")

    def tr_small_index(tb):
        off = int.from_bytes(tb[0:8], "little")
        size = int.from_bytes(tb[8:16], "little")
        tb[0:8] = (off + size - 8).to_bytes(8, "little")
        tb[8:16] = (8).to_bytes(8, "little")
        fix_trailer_checksum(tb)
    # the trailer's lower bounds, with the bytes a decoder that skips them would read next made a record
    # header declaring more than MAX_RECORD_PAYLOAD (limit)
    p2 = split(good)
    p2.recs.append(Rec(b"abcd", b"1"))
    p2.recs.append(Rec(b"efgh", b"2"))
    two_others = assemble(p2)
    q2 = split(two_others)
    d2 = dict(_index_dict_of(q2))
    body2 = L.IndexBody.build(d2)
    assert body2.endswith(b"abcdefgh")

    def tr_small_index_letters(tb):
        off = int.from_bytes(tb[0:8], "little")
        size = int.from_bytes(tb[8:16], "little")
        tb[0:8] = (off + size - 8).to_bytes(8, "little")
        tb[8:16] = (8).to_bytes(8, "little")
        fix_trailer_checksum(tb)
    n("n_trailer_index_size_small_then_limit", "index_size 8 (< 16); the 16 bytes at index_offset read as a record "
      "header would declare 0x68676665 payload bytes (limit)", ["11", "12.1"],
      assemble(q2, index_payload=raw_index_payload(body2), trailer_fn=tr_small_index_letters),
      "corrupt")
    p3 = split(good)
    p3.recs[0].payload = bytes(4) + bytes(4) + b"abcd" + b"\xff\xff\xff\xff" + bytes(4)

    def tr_low_offset_letters(tb):
        off = int.from_bytes(tb[0:8], "little")
        size = int.from_bytes(tb[8:16], "little")
        tb[0:8] = (40).to_bytes(8, "little")
        tb[8:16] = (off + size - 40).to_bytes(8, "little")
        fix_trailer_checksum(tb)
    n("n_trailer_index_offset_low_then_limit", "index_offset 40 (< 52); META's steps make the 16 bytes at offset 40 "
      "read as a record header declare 2^32-1 payload bytes (limit)", ["6", "11", "12.1"],
      assemble(p3, trailer_fn=tr_low_offset_letters), "corrupt")
    n("n_trailer_index_size_small", "index_size 8 (< 16), index_offset + index_size still = size - 40", ["11"],
      assemble(split(good), trailer_fn=tr_small_index), "corrupt")

    def tr_low_offset(tb):
        off = int.from_bytes(tb[0:8], "little")
        size = int.from_bytes(tb[8:16], "little")
        tb[0:8] = (40).to_bytes(8, "little")
        tb[8:16] = (off + size - 40).to_bytes(8, "little")
        fix_trailer_checksum(tb)
    n("n_trailer_index_offset_low", "index_offset 40 (< 52), index_offset + index_size still = size - 40", ["11"],
      assemble(split(good), trailer_fn=tr_low_offset), "corrupt")
    # -- stream-mode order: a first fault, and a second one of another category that comes later
    n("n_first_record_not_meta_then_wrong_base", "a note before META, and a base that does not match: front to "
      "back, the note is the first fault", ["3", "12.2"], mod(lambda p: p.recs.insert(0, Rec(b"note", b"x"))),
      "corrupt", base_={"w": wrong})
    n("n_second_meta_then_wrong_base", "a second META before the TENS record, and a base that does not match",
      ["3", "12.2"], mod(lambda p: p.recs.insert(1, Rec(b"META", p.recs[0].payload))), "corrupt",
      base_={"w": wrong}, modes=["stream"])
    n("n_record_type_not_letters_then_wrong_base", "a record type with a digit before the TENS record, and a "
      "base that does not match", ["5", "12.2"], mod(lambda p: p.recs.insert(1, Rec(b"z1zz", b"x"))), "corrupt",
      base_={"w": wrong})

    def tens_v_between(p):
        i = [i for i, r in enumerate(p.recs) if r.type == L.BLCK][0]
        th = records.parse_tensor(p.recs[i - 1].payload, "")
        p.recs.insert(i + 1, Rec(L.TENS, tp(th, name=b"v"), name="v"))
    n("n_tens_while_blocks_due_named", "a TENS record of another name (not in the base) between the blocks of a "
      "tensor: the placement is checked before the base", ["3", "12.2"], mod(tens_v_between), "corrupt",
      modes=["stream"])

    def blck_not_due(p):
        i = [i for i, r in enumerate(p.recs) if r.type == L.BLCK][-1]
        p.recs.insert(i + 1, Rec(L.BLCK, p.recs[i].payload))
    n("n_block_not_due", "a BLCK record after the tensor's last block", ["3", "12.2"], mod(blck_not_due), "corrupt",
      modes=["stream"])
    b2 = b.copy()
    b2.view(np.uint16).reshape(-1)[0] ^= 1

    def dup_wrong_base(p):
        j = [i for i, r in enumerate(p.recs) if r.type == L.TENS][1]
        th = records.parse_tensor(p.recs[j].payload, "")
        p.recs[j].payload = tp(th, name=b"a")
        p.recs[j].name = "a"
    V.append(Vector("n_duplicate_tens_names_then_wrong_base", "two TENS records named a, the second with the base "
                    "hash of another tensor: the duplicate is found before the base", ["7", "12.2"],
                    {"a": b, "b": b2}, _assemble_mod(write_full({"a": b, "b": b2}, {"a": t, "b": t}), dup_wrong_base),
                    error="corrupt", modes=["stream"]))

    def second_tens_flags(p):
        j = [i for i, r in enumerate(p.recs) if r.type == L.TENS][1]
        p.recs[j].payload = tp(records.parse_tensor(p.recs[j].payload, ""), flags=3)
    V.append(Vector("n_wrong_base_then_reserved_tens_flags", "tensor a's base does not match, and the TENS record of "
                    "tensor b, after it, has a reserved flag bit set: each tensor's base is checked right after its "
                    "own TENS record, both ways (§12.1 step 6, §12.2 step 3), so a's base fails first",
                    ["7", "12.1", "12.2", "12.3"], {"a": b2, "b": b},
                    _assemble_mod(write_full({"a": b, "b": b}, {"a": t, "b": t}), second_tens_flags),
                    error="wrong_base"))
    # -- the streaming cross-check of the index (§12.2 step 6)
    n("n_index_tens_checksum_mismatch", "the index's checksum for the TENS record differs from the record's",
      ["10", "12.2"], assemble(split(good), index_fn=lambda ix: setattr(ix.entries[0], "tens_checksum",
                                                                        ix.entries[0].tens_checksum ^ 1)), "corrupt")

    def other_renamed(ix):
        ix.others[0].type = b"zzzz"
    n("n_index_other_type_mismatch", "the index lists the note record as zzzz", ["5", "10", "12.2"],
      assemble(split(noted), index_fn=other_renamed), "corrupt")
    e0 = write_full(None, {"e": np.zeros((0, 3), np.float32), "w": np.arange(6, dtype=np.float32)})

    def tens_as_other(ix):
        ent = ix.entries.pop(0)
        ix.others.append(records.OtherRecord(ent.tens_offset, ent.tens_size, b"tens"))
    n("n_index_lists_tens_as_other", "the index lists a TENS record (of a tensor with no blocks) as an ancillary "
      "tens record", ["10", "12.2"], assemble(split(e0), index_fn=tens_as_other), "corrupt", base_={})

    def blck_as_other(ix):
        blk = ix.entries[0].blocks.pop()
        ix.others.append(records.OtherRecord(blk.offset, blk.size, b"blck"))
    n("n_index_lists_blck_as_other", "the index lists a tensor's last BLCK record as an ancillary blck record",
      ["10", "12.2"], assemble(split(good), index_fn=blck_as_other), "corrupt")
    # -- the index body (§10)
    def tcount(d):
        d["tensor_count"] = 1 << 20
    n("n_index_column_short", "tensor_count 2^20: the name_lengths column runs past the body", ["10"],
      body_edit(tcount), "corrupt")

    def kcount(d):
        d["block_count"] = 1 << 61
    n("n_index_block_count_wrap", "block_count 2^61: 8 * block_count wraps to 0 in 64 bits", ["10", "1"],
      body_edit(kcount), "corrupt")

    def tens_order(d):
        for k in ("tens_offsets", "tens_sizes", "tens_checksums", "tens_block_counts", "name_lengths"):
            d[k] = list(d[k])[::-1]
        nl = list(d["name_lengths"])
        names = d["names"]
        d["names"] = names[nl[1]:] + names[:nl[1]]
    n("n_index_tens_order_with_blocks", "the index lists the second tensor first", ["10"], body_edit(tens_order, two),
      "corrupt", base_={"a": b, "b": b})

    def other_size_big(d):
        z = list(d["other_sizes"])
        z[0] = 16 + (1 << 28) + 1
        d["other_sizes"] = z
    n("n_index_other_size_big", "an other record size of 16 + 2^28 + 1", ["10"], body_edit(other_size_big, noted),
      "corrupt")

    def tile_end(d):
        z = list(d["blk_sizes"])
        z[-1] -= 1
        d["blk_sizes"] = z
    n("n_index_tiling_end", "the last record's size one short: the records end before the index", ["10"],
      body_edit(tile_end), "corrupt")

    # -- codecs (§9)
    def zframe(fn):
        def edit(streams, params):
            raw = zstandard.ZstdDecompressor().decompress(streams[0][1])
            streams[0][1] = fn(raw, streams[0][1])
        return edit
    n("n_zstd_header_short", "a zstd stream of the frame magic and nothing else", ["9"],
      restream(zframe(lambda raw, fr: fr[:4])), "corrupt", base_={"w": bz})
    n("n_zstd_header_cut", "a zstd frame cut inside its Frame_Content_Size field", ["9"],
      restream(zframe(lambda raw, fr: fr[:6])), "corrupt", base_={"w": bz})

    def one_raw_block(raw, fhd_extra=0, btype=0, size=None, last=1):
        fr = b"\x28\xb5\x2f\xfd" + bytes([0xA0 | fhd_extra]) + len(raw).to_bytes(4, "little")
        n_ = len(raw) if size is None else size
        return fr + ((n_ << 3) | (btype << 1) | last).to_bytes(3, "little") + (raw if btype == 0 else raw[:1])
    n("n_zstd_reserved_bit", "a zstd frame header descriptor with its reserved bit (3) set", ["9"],
      restream(zframe(lambda raw, fr: one_raw_block(raw, fhd_extra=0x08))), "corrupt", base_={"w": bz})
    n("n_zstd_reserved_block_type", "a zstd block of the reserved type 3", ["9"],
      restream(zframe(lambda raw, fr: one_raw_block(raw, btype=3))), "corrupt", base_={"w": bz})
    n("n_zstd_block_header_cut", "a zstd frame that ends after its frame header", ["9"],
      restream(zframe(lambda raw, fr: one_raw_block(raw)[:9])), "corrupt", base_={"w": bz})
    n("n_zstd_raw_block_too_long", "a zstd raw block one byte longer than the frame's content size", ["9"],
      restream(zframe(lambda raw, fr: one_raw_block(raw + b"\0")[:9] + one_raw_block(raw + b"\0")[9:])),
      "corrupt", base_={"w": bz})
    n("n_zstd_checksum_cut", "a zstd frame that declares a content checksum and ends before it", ["9"],
      restream(zframe(lambda raw, fr: one_raw_block(raw, fhd_extra=0x04))), "corrupt", base_={"w": bz})
    n("n_zstd_dictionary_zero_length_id", "a zstd frame with a 1-byte Dictionary_ID field holding 5", ["9"],
      restream(zframe(lambda raw, fr: b"\x28\xb5\x2f\xfd" + bytes([0xA1, 5]) + len(raw).to_bytes(4, "little")
                      + ((len(raw) << 3) | 1).to_bytes(3, "little") + raw)), "corrupt", base_={"w": bz})

    def recoded(codec, fn):
        """The first stream's bytes, decoded from zstd and stored as ``fn(raw)`` under ``codec``."""
        def edit(streams, params):
            raw = zstandard.ZstdDecompressor().decompress(streams[0][1])
            streams[0][0] = codec
            streams[0][1] = fn(raw)
        return edit

    def xz_of(fn):
        return recoded(2, fn)
    n("n_xz_garbage", "an xz stream that is not xz data", ["9"], restream(xz_of(lambda raw: b"\xfd7zXZ\0" + b"x" * 40)),
      "corrupt", base_={"w": bz})
    n("n_xz_cut", "an xz stream missing its last 20 bytes", ["9"],
      restream(xz_of(lambda raw: _lzma.compress(raw, format=_lzma.FORMAT_XZ)[:-20])), "corrupt", base_={"w": bz})
    n("n_xz_short_output", "an xz stream that decodes to one byte less than the declared length", ["9"],
      restream(xz_of(lambda raw: _lzma.compress(raw[:-1], format=_lzma.FORMAT_XZ))), "corrupt", base_={"w": bz})
    n("n_xz_empty", "an xz stream of no bytes for a non-empty stream", ["9"], restream(xz_of(lambda raw: b"")),
      "corrupt", base_={"w": bz})

    def bz_of(fn):
        return recoded(3, fn)
    n("n_bz2_garbage", "a bzip2 stream that is not bzip2 data", ["9"], restream(bz_of(lambda raw: b"BZh9" + b"x" * 40)),
      "corrupt", base_={"w": bz})
    n("n_bz2_cut", "a bzip2 stream missing its last 4 bytes", ["9"],
      restream(bz_of(lambda raw: _bz2.compress(raw)[:-4])), "corrupt", base_={"w": bz})
    n("n_bz2_short_output", "a bzip2 stream that decodes to one byte less than the declared length", ["9"],
      restream(bz_of(lambda raw: _bz2.compress(raw[:-1]))), "corrupt", base_={"w": bz})
    n("n_zstd_short_output", "a zstd frame that declares and holds one byte less than the stream's length", ["9"],
      restream(zframe(lambda raw, fr: zstandard.ZstdCompressor().compress(raw[:-1]))), "corrupt", base_={"w": bz})
    # an empty stream (L = 0) given codec zstd with a well-formed empty zstd frame
    eb = np.full(64, 1.5, np.float32).astype(BF16)
    et = eb.copy()
    et.view(np.uint16)[::5] += 1
    efile = write_full({"w": eb}, {"w": et}, force_codec="raw", force_encoding="bf16-delta")

    def empty_zstd(streams, params):
        assert params[1] == 0 and streams[2][1] == b""
        streams[2][0] = 1
        streams[2][1] = zstandard.ZstdCompressor().compress(b"")
    n("n_empty_stream_zstd_frame", "an empty stream (e = 0: no exceptions) stored as a valid empty zstd frame",
      ["9"], restream(empty_zstd, efile), "corrupt", base_={"w": eb})

    def empty_raw_bytes(streams, params):
        streams[2][1] = b"\0"
    n("n_empty_stream_raw_bytes", "an empty stream (e = 0) stored raw with one byte", ["9"],
      restream(empty_raw_bytes, efile), "corrupt", base_={"w": eb})
    # -- block checks made before the streams (§8 check order)
    def codec_and_sum(streams, params):
        streams[1][0] = 9
        streams[0][1] = streams[0][1] + b"\0"
    n("n_unknown_codec_before_lengths", "a stream of codec 9 and stored lengths that do not add up: codec ids "
      "(check 5) come before the lengths (check 6)", ["8", "9"], rs(codec_and_sum), "unsupported")

    def sum_then_window(streams, params):
        raw = streams[0][1]
        streams[0][0] = 1
        streams[0][1] = b"\x28\xb5\x2f\xfd" + bytes([0x80, 18 << 3]) + len(raw).to_bytes(4, "little") + \
            ((len(raw) << 3) | 1).to_bytes(3, "little") + raw
    def lengths_then_limit(data):
        p = split(data)
        i = next(i for i, r in enumerate(p.recs) if r.type == L.BLCK)
        p.recs[i].payload = p.recs[i].payload + b"\0"
        return assemble(p)
    n("n_block_extra_bytes_then_window", "a byte after the streams, and a zstd stream asking for a 256 MiB window: "
      "the lengths (check 6) come before the streams (check 7)", ["8", "9"],
      lengths_then_limit(rs(sum_then_window)), "corrupt")

    def c_then_codec(streams, params):
        params[0] = 24 * 16 + 1
        for s in streams:
            s[0] = 9
    n("n_changed_count_then_unknown_codec", "c > m, and every stream of codec 9: the params (check 1) come first",
      ["8", "8.3"], rs(c_then_codec), "corrupt")

    def e_then_codec(streams, params):
        params[1] = params[0] + 1
        for s in streams:
            s[0] = 9
    n("n_exception_count_then_unknown_codec", "e > c, and every stream of codec 9", ["8", "8.3"], rs(e_then_codec),
      "corrupt")
    fb = np.arange(8, dtype=np.float16)
    ft = fb.copy()
    ft[2] = 9
    ffile = write_full({"x": fb}, {"x": ft}, force_encoding="float-delta", force_codec="raw")
    pf = split(ffile)
    set_first_encoding(pf, 2)
    n("n_bf16_delta_on_f16", "bf16-delta used on an F16 tensor", ["8", "8.3"], assemble(pf), "unsupported",
      base_={"x": fb})

    def sm_range(streams, params):
        d = bytearray(streams[1][1])
        d[60] = 0xFF  # the high byte of element 0's sign/mantissa field: >= 2^11 for F16
        streams[1][1] = bytes(d)
    # -- zstd frame header checks, each followed by a window beyond MAX_WINDOW (limit): the order is observable
    def big_window_frame(raw, fhd=0x80, did=b"", fcs=None, magic=b"\x28\xb5\x2f\xfd"):
        fcs = len(raw).to_bytes(4, "little") if fcs is None else fcs
        return magic + bytes([fhd, 18 << 3]) + did + fcs + ((len(raw) << 3) | 1).to_bytes(3, "little") + raw
    for vname, fn, desc in (
            ("n_zstd_bad_magic_then_window", lambda raw, fr: big_window_frame(raw, magic=b"\x28\xb5\x2f\xfe"),
             "a zstd frame magic with one bit changed"),
            ("n_zstd_reserved_bit_then_window", lambda raw, fr: big_window_frame(raw, fhd=0x88),
             "a frame header descriptor with its reserved bit set"),
            ("n_zstd_no_content_size_then_window", lambda raw, fr: big_window_frame(raw, fhd=0x00, fcs=b""),
             "a frame without Frame_Content_Size"),
            ("n_zstd_content_size_then_window",
             lambda raw, fr: big_window_frame(raw, fcs=(len(raw) + 1).to_bytes(4, "little")),
             "a Frame_Content_Size one more than the stream's length"),
            ("n_zstd_dictionary_then_window", lambda raw, fr: big_window_frame(raw, fhd=0x81, did=b"\x07"),
             "a Dictionary_ID of 7"),
            ("n_zstd_header_cut_then_window", lambda raw, fr: big_window_frame(raw, fhd=0xC0)[:6 + 2],
             "a frame cut inside its 8-byte Frame_Content_Size")):
        n(vname, desc + ", and a window of 256 MiB: the header checks come first (corrupt, not limit)", ["9"],
          restream(zframe(fn)), "corrupt", base_={"w": bz})
    # -- index record sizes and the end of the tiling, with a fake other record whose header declares 2^32-1 bytes
    def fake_others(index_sizes, length=0xFFFFFFFF):
        p = split(good)
        fake = b"zzzz" + length.to_bytes(4, "little") + bytes(8)
        at = len(p.recs)
        p.recs.append(Rec(b"zzzz", b"", raw=fake))
        data = assemble(p, list_others=False)
        q = split(good)
        d = dict(_index_dict_of(q))
        ioff = int.from_bytes(data[-40:-32], "little")
        fake_off = ioff - 16
        del at
        offs, sizes = [], []
        pos = fake_off
        for sz in index_sizes:
            offs.append(pos)
            sizes.append(sz)
            pos += sz
        d.update(other_count=len(sizes), other_offsets=offs, other_sizes=sizes, other_types=[b"zzzz"] * len(sizes))
        body = L.IndexBody.build(d)
        out = bytearray(data[:ioff])
        rec = raw_record(L.INDX, raw_index_payload(body))
        tr = records.build_trailer(ioff, len(rec), 0)
        return bytes(out + rec + tr)
    V.append(Vector("n_index_record_size_then_limit", "two other records of index size 8 tiling a 16-byte header "
                    "that declares 2^32-1 payload bytes: the index's size check (corrupt) comes before the "
                    "other records' headers (limit)", ["10", "12.1"], base, fake_others([8, 8]), error="corrupt",
                    errors={"stream": "limit"}))
    V.append(Vector("n_index_tiling_end_then_limit", "an other record listed as 17 bytes, one past the start of "
                    "the index, whose header declares 2^32-1 payload bytes", ["10", "12.1"], base, fake_others([17]),
                    error="corrupt", errors={"stream": "limit"}))
    n("n_other_header_limit", "an ancillary record whose header declares 2^32-1 payload bytes, listed in the "
      "index as 16 bytes (random access reads its header, §12.1 step 4)", ["5", "12.1", "14"], fake_others([16]),
      "limit")
    V.append(Vector("n_other_header_length_mismatch", "an ancillary record whose header declares 5 payload bytes, "
                    "listed in the index as 16 bytes; front to back, its 5 bytes run into the INDX record and "
                    "its checksum fails", ["5", "10", "12.1"], base, fake_others([16], length=5), error="corrupt",
                    errors={"stream": "checksum"}))
    # -- index order and the base: the index (step 4) is checked before the base (step 6)
    ee = write_full(None, {"e": np.zeros((0, 3), np.float32), "f": np.zeros((3, 0), np.float32)})

    def swap_tens(ix):
        ix.entries.reverse()
    n("n_index_tens_order", "two tensors without blocks listed in reverse file order", ["10"],
      assemble(split(ee), index_fn=swap_tens), "corrupt", base_={})

    def swap_blocks(ix):
        bl = ix.entries[0].blocks
        bl[0], bl[1] = bl[1], bl[0]
    n("n_index_order_then_wrong_base", "blocks listed out of order, and a base that does not match", ["10", "12.1"],
      assemble(split(good), index_fn=swap_blocks), "corrupt", base_={"w": wrong}, modes=["random"])
    # -- a file whose first record is a 20-byte note in place of META
    def note_for_meta(p):
        p.recs[0] = Rec(b"note", bytes(20))
    n("n_meta_replaced_by_note", "a 20-byte note record where META belongs (no META at all), and a base that does "
      "not match", ["3", "6", "12.2"], mod(note_for_meta), "corrupt", base_={"w": wrong})
    n("n_keyframe_sign_mantissa_out_of_range", "a keyframe sign/mantissa value >= 2^(M+1)", ["8.5"],
      restream(sm_range, kraw), "corrupt", base_={})
    return V


def _index_dict_of(p):
    return index_fields(records.build_index(p.index), p.index.compact)


def _assemble_fn(data, fn, index_fn):
    p = split(data)
    fn(p)
    return assemble(p, index_fn=index_fn)


def _assemble_mod(data, fn):
    p = split(data)
    fn(p)
    return assemble(p)


def _extra_payload(data):
    p = split(data)
    i = next(i for i, r in enumerate(p.recs) if r.type == L.BLCK)
    p.recs[i].payload = p.recs[i].payload + b"\0"
    return assemble(p)


# ------------------------------------------------------------------------------------ stream objects (Part II)

@dataclass
class ObjectVector:
    name: str
    description: str
    covers: list
    kind: str                            # head | manifest | descriptor | signature
    data: bytes
    error: str | None = None
    object_name: str | None = None       # the name it is read under (S3); None: the one its fields give
    gz: bool = False                     # stored gzip-compressed (.json.gz, conformance/README.md)


def stream_objects():
    """Real objects of a small stream (2 shards, a keyframe step and a delta step), made by Publisher."""
    from arcfmt.store import Publisher
    from arcfmt.store import objects as SL

    with tempfile.TemporaryDirectory() as root:
        r = rng(40)
        steps = []
        for k in range(2):
            b = {f"s{k}.w": (r.standard_normal((16, 8)) * 0.02).astype(np.float32).astype(BF16)}
            t = {n: (a.astype(np.float32) * 1.001).astype(BF16) for n, a in b.items()}
            steps.append((b, t))
        for k, (b, _t) in enumerate(steps):
            pub = Publisher(root, shard=k, num_shards=2)
            pub.publish(0, b)
        objs = {}
        for k, (b, t) in enumerate(steps):
            pub = Publisher(root, shard=k, num_shards=2)
            pub.publish(1, t, base=b, base_step=0)
        def read(name):
            with open(os.path.join(root, name), "rb") as f:
                return f.read()
        objs["manifest_keyframe"] = read("steps/00000000000000000000/manifest.json")
        objs["manifest_delta"] = read("steps/00000000000000000001/manifest.json")
        objs["descriptor"] = read("steps/00000000000000000001/shard-00001-of-00002.json")
        # a signature (SPEC.md S15) of the delta step, by a fixed key at a fixed time: Ed25519 is
        # deterministic, so the bytes regenerate exactly
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        from arcfmt.store import signing as SG
        signer = SG.Signer(Ed25519PrivateKey.from_private_bytes(bytes(range(32))), "run42")
        objs["signature"] = signer.sign(SL.parse_manifest(objs["manifest_delta"], "manifest"), 1_700_000_000_000)
        h = replace(SL.parse_head(read("head.json")), time_ms=1_700_000_000_000)  # informative: fixed
        objs["head"] = h.to_bytes()
    return objs


# ------------------------------------------------------------------------------------ block surgery (§8.6, §8.7)

def _restream(fn, src):
    """``src`` with its first BLCK's streams and params passed through ``fn(streams, params)`` (edited in
    place: ``streams`` as ``[codec, stored bytes]`` pairs), the record rebuilt around them."""
    p = split(src)
    i = next(i for i, r in enumerate(p.recs) if r.type == L.BLCK)
    history = records.parse_meta(p.recs[0].payload).history   # (1.9) its TENS records may carry previous_hash
    th = records.parse_tensor(p.recs[i - 1].payload, "", None, False, history)
    info = records.parse_block(p.recs[i].payload, th, 0, 0, "")
    streams, pos = [], info.data_offset
    for st in info.streams:
        streams.append([st.codec, p.recs[i].payload[pos:pos + st.stored]])
        pos += st.stored
    params = list(info.params)
    fn(streams, params)
    payload = L.BlockPayload.build(
        dict(tensor=0, block=0, encoding=info.encoding, params=params,
             streams=[(c, len(d)) for c, d in streams]),
        param_count=lambda e, h: len(params), stream_count=lambda e, q: len(streams))
    p.recs[i].payload = payload + b"".join(d for _, d in streams)
    return assemble(p)


def _set_pad(i):
    """An edit that sets the last padding bit of stream ``i``."""
    def edit(streams, params):
        d = bytearray(streams[i][1])
        d[-1] |= 0x80
        streams[i][1] = bytes(d)
    return edit


def _extra_code(streams, params):
    """One more 1 bit among the quotient bits (the first 0 bit set)."""
    d = bytearray(streams[0][1])
    bits = [(d[i // 8] >> (i % 8)) & 1 for i in range(len(d) * 8)]
    i = bits.index(0)
    d[i // 8] |= 1 << (i % 8)
    streams[0][1] = bytes(d)


def _code_beyond(streams, params, q, r, m):
    """The last quotient code lengthened past what ``m`` elements hold (``params[q]``, qbits, grows)."""
    extra = (m >> r) + 1  # zeros before the last code's 1: its gap runs past the class or the block
    d = bytearray(streams[0][1])
    bits = [(d[i // 8] >> (i % 8)) & 1 for i in range(params[q])]
    bits = bits[:-1] + [0] * extra + [1]
    params[q] = len(bits)
    out = bytearray((len(bits) + 7) // 8)
    for i, v in enumerate(bits):
        out[i // 8] |= v << (i % 8)
    streams[0][1] = bytes(out)


def _magnitude_out(streams, params, mw, count):
    """Magnitudes widened to two bytes (``params[mw]``), the first 65535: a step out of the BF16 range."""
    params[mw] = 2
    mags = list(streams[3][1][:count])
    mags[0] = 0xFFFF
    streams[3][1] = bytes([v & 0xFF for v in mags]) + bytes([v >> 8 for v in mags])


def _wrong_sign(streams, params):
    d = bytearray(streams[2][1])
    d[0] ^= 1
    streams[2][1] = bytes(d)


def ctx_reject_vectors():
    V = []
    from arcfmt.encodings import ctx_delta as ctx
    b, t = ctx_case(60, BF16, m=2000, specials=False)
    base = {"x": b}
    cfile = ctx_custom(b, t, [112, 116, 119])
    m = b.size

    def n(name, desc, fn, error="corrupt", src=None, base_=None):
        V.append(Vector(name, desc, ["8.6"], base_ or base, _restream(fn, src or cfile), error=error))

    P = ctx.Params.unpack

    def at(params):  # offsets into the flat params: thresholds, counts, rice, qbits, mw
        k = params[0]
        return 1, k, 2 * k, 3 * k, 3 * k + 1

    def setp(fn):
        def edit(streams, params):
            fn(params, *at(params))
        return edit

    n("n_ctx_classes_zero", "K = 0", lambda s, p: (p.clear(), p.append(0), s.clear()))
    n("n_ctx_classes_too_many", "K = 17: rejected as soon as K is read",
      lambda s, p: (p.clear(), p.extend([17] + [1] * 52), s.clear()))
    n("n_ctx_threshold_zero", "a threshold of 0", setp(lambda p, t, c, r, q, mw: p.__setitem__(t, 0)))
    n("n_ctx_threshold_too_big", "a threshold above 2^E - 1", setp(lambda p, t, c, r, q, mw: p.__setitem__(c - 1, 256)))
    n("n_ctx_thresholds_not_increasing", "two equal thresholds",
      setp(lambda p, t, c, r, q, mw: p.__setitem__(t + 1, p[t])))

    def no_changes(p, t, c, r, q, mw):
        for k in range(c, r):
            p[k] = 0
    n("n_ctx_changed_zero", "every class count is 0", setp(no_changes))
    n("n_ctx_changed_beyond_block", "the counts add up to more than m",
      setp(lambda p, t, c, r, q, mw: p.__setitem__(c, p[c] + m)))
    n("n_ctx_rice_too_big", "a Rice parameter of 25", setp(lambda p, t, c, r, q, mw: p.__setitem__(r, 25)))
    n("n_ctx_qbits_below_changed", "qbits < c",
      setp(lambda p, t, c, r, q, mw: p.__setitem__(q, sum(p[c:r]) - 1)))
    n("n_ctx_qbits_beyond_block", "qbits > m", setp(lambda p, t, c, r, q, mw: p.__setitem__(q, m + 1)))
    n("n_ctx_mag_width_zero", "magnitude width 0", setp(lambda p, t, c, r, q, mw: p.__setitem__(mw, 0)))
    n("n_ctx_mag_width_too_big", "magnitude width 3 on BF16", setp(lambda p, t, c, r, q, mw: p.__setitem__(mw, 3)))

    info = P(records.parse_block(next(r for r in split(cfile).recs if r.type == L.BLCK).payload,
                                 records.parse_tensor(split(cfile).recs[1].payload, ""), 0, 0, "").params)
    assert info.qbits % 8 and info.changed % 8 and sum(a * b for a, b in zip(info.counts, info.rice)) % 8

    n("n_ctx_quotient_padding", "a padding bit set after the quotient codes", _set_pad(0))
    n("n_ctx_remainder_padding", "a padding bit set after the remainder fields", _set_pad(1))
    n("n_ctx_sign_padding", "a padding bit set after the sign bits", _set_pad(2))

    n("n_ctx_quotient_extra_code", "one more 1 bit than c among the quotient bits", _extra_code)

    def unterminated(streams, params):
        _, _, _, q, _ = at(params)
        params[q] += 1  # the new last bit is a (zero) padding bit: the last code is not terminated there
    n("n_ctx_quotient_unterminated", "bit qbits - 1 is not a terminating 1", unterminated)

    def rank_beyond(streams, params):
        t, c, r, q, mw = at(params)
        k = params[0]
        last = max(i for i in range(k) if params[c + i])
        _code_beyond(streams, params, q, params[r + last], m)
    n("n_ctx_rank_beyond_class", "the last class's last rank is not below its member count", rank_beyond)
    one = ctx_custom(b, t, [])

    n("n_ctx_position_beyond_block", "K = 1: the last position is past the end of the block", rank_beyond, src=one)

    def step_out(streams, params):
        t_, c, r, q, mw = at(params)
        _magnitude_out(streams, params, mw, sum(params[c:r]))
    n("n_ctx_step_out_of_range", "a magnitude of 65535: the step leaves the BF16 range", step_out)
    # steps one past each end of the range (§8.6 step 4: v must lie in [-H, H)), on a block of one change
    for sign, edge, desc in ((1, "to_h", "v = H (32768), one above the largest"),
                             (-1, "below_minus_h", "v = -H - 1 (-32769), one below the smallest")):
        eb = np.full(8, 0x3F80, np.uint16)   # 1.0: ord 16256
        et = eb.copy()
        et[3] = np.uint16(0x3F80 + sign)
        a = (1 << 15) - 16256 if sign > 0 else 16256 + (1 << 15) + 1

        def edge_mag(streams, params, a=a):
            params[3 * params[0] + 1] = 2   # mw: two bytes, the one magnitude a - 1
            streams[3][1] = bytes([(a - 1) & 0xFF, (a - 1) >> 8])
        n(f"n_ctx_step_out_of_range_{edge}", f"one change's step to {desc}: just outside the BF16 range",
          edge_mag, src=ctx_custom(eb.view(BF16), et.view(BF16), []), base_={"x": eb.view(BF16)})

    n("n_ctx_verification", "a well-formed ctx-delta block that rebuilds a different tensor (one sign bit)",
      _wrong_sign, error="verification")

    # Each param check followed by streams of codec 9 (§8 check 5, unsupported): the params come first.
    def then_codec(fn):
        def edit(streams, params):
            fn(params, *at(params))
            for st in streams:
                st[0] = 9
        return edit

    def k17(p, t, c, r, q, mw):
        cnt, qb, mwv = p[c:r], p[q], p[mw]
        p.clear()
        p.extend([17] + list(range(1, 17)) + [0] * 16 + [sum(cnt)] + [0] * 17 + [qb, mwv])
    for vname, fn, desc in (
            ("n_ctx_classes_then_codec", k17, "K = 17 (thresholds 1 .. 16, every other param valid)"),
            ("n_ctx_threshold_zero_then_codec", lambda p, t, c, r, q, mw: p.__setitem__(t, 0), "T_1 = 0"),
            ("n_ctx_thresholds_equal_then_codec", lambda p, t, c, r, q, mw: p.__setitem__(t + 1, p[t]),
             "T_1 = T_2"),
            ("n_ctx_threshold_too_big_then_codec", lambda p, t, c, r, q, mw: p.__setitem__(c - 1, 256),
             "T_{K-1} = 256 > 2^E - 1"),
            ("n_ctx_changed_then_codec", no_changes, "every class count 0 (c = 0)"),
            ("n_ctx_rice_then_codec", lambda p, t, c, r, q, mw: p.__setitem__(r, 25), "r_0 = 25"),
            ("n_ctx_qbits_then_codec", lambda p, t, c, r, q, mw: p.__setitem__(q, m + 1), "qbits > m"),
            ("n_ctx_mag_width_then_codec", lambda p, t, c, r, q, mw: p.__setitem__(mw, 3), "mw = 3 on BF16")):
        n(vname, desc + ", and every stream of codec 9: the params (check 1) come before the codec ids (check 5)",
          then_codec(fn))
    f64 = np.arange(16, dtype=np.float64)
    f64t = f64.copy()
    f64t[3] = 7.5
    ffile = write_separate({"x": f64}, {"x": f64t}, force_encoding="float-delta", force_codec="raw")

    pf = split(ffile)
    set_first_encoding(pf, 5)
    V.append(Vector("n_ctx_on_f64", "ctx-delta is not defined for F64", ["8", "8.6"], {"x": f64}, assemble(pf),
                    error="unsupported"))
    return V


# ------------------------------------------------------------------------------------ ctx-delta-as (§8.8)

def ctxas_case(seed, dt, shape=(48, 64), by="rows", specials=True):
    """``ctx_case``'s data, its steps' signs mostly shared along rows (or columns): what the contexts of
    ctx-delta-as are for."""
    from arcfmt.dtypes import from_numpy
    from arcfmt.encodings.ctx_delta import ordered, unordered
    m = int(np.prod(shape))
    b, t = ctx_case(seed, dt, m, specials)
    r = rng(seed + 2000)
    adt = from_numpy(np.dtype(dt))
    u, tv = b.view(adt.uint), t.view(adt.uint)
    d = ordered(adt, tv) - ordered(adt, u)
    idx = np.arange(m)
    group = idx // shape[-1] if by == "rows" else idx % shape[-1]
    lean = np.where(r.random(group.max() + 1) < 0.5, -1, 1)[group]
    flip = np.where(r.random(m) < 0.85, lean, -lean)
    half = 1 << (8 * np.dtype(dt).itemsize - 1)
    nd = np.where(d != 0, np.abs(d) * flip, 0)
    if specials:
        nd[:64] = d[:64]   # ctx_case's special values stay as they were
    v = np.clip(ordered(adt, u) + nd, -half, half - 1)
    v = np.where(v == ordered(adt, u), ordered(adt, tv), v)   # a clipped step that vanished: the old one
    return b.reshape(shape), unordered(adt, v).view(dt).reshape(shape)


def ctxas_custom(base, target, axis, period=1, phase=None, thresholds=(), codec="raw", block_elems=None) -> bytes:
    """:func:`ctx_custom` as ctx-delta-as with the given sign axis."""
    return ctx_custom(base, target, thresholds, codec, block_elems, signs=(axis, period, phase))


def _one_tensor_y(V, encoding, section):
    """``y(name, desc, base, target, data=None, **kw)``: a valid one-tensor vector of §``section``, its
    file ``data`` or one the writer makes with ``encoding`` forced."""
    def y(name, desc, base, target, data=None, **kw):
        data = data if data is not None else write_separate({"x": base}, {"x": target}, force_encoding=encoding,
                                                         **kw)
        V.append(Vector(name, desc, [section], {"x": base}, data, expect_tensors={"x": target}))
    return y


def _halving_case(r, changed, threes=0.0):
    """60000 BF16 weights, a fraction ``changed`` of them one step on, 97 % of the steps the same way
    (``threes``: that fraction of steps 3 long, not 1): many changes in few contexts, whose counts are
    halved many times while the range coder carries."""
    sb = (r.standard_normal(60000) * 0.02).astype(np.float32).astype(BF16)
    su = sb.view(np.uint16).copy().astype(np.int64)
    ch = r.random(60000) < changed
    o = np.where(su >= 32768, 32767 - su, su)
    step = np.where(r.random(60000) < 0.97, 1, -1)
    if threes:
        step = step * np.where(r.random(60000) < 1 - threes, 1, 3)
    o = o + np.where(ch, step, 0)
    return sb, np.where(o >= 0, o, 32767 - o).astype(np.uint16)


def _sign_axis_vectors(y, prefix, custom, seed, unit):
    """The sign contexts of §8.8, as ctx-delta-as and ctx-delta-rc share them: one for the block, rows,
    columns, classes, blocks and their phases, P and phase chosen freely, P = m. ``custom(b, t, axis, P,
    ...)`` writes the file; ``unit``: what is coded in class order."""
    b, t = ctxas_case(seed, BF16, (40, 75), by="rows")
    y(f"{prefix}_axis0", "one sign context for the block", b, t, data=custom(b, t, 0))
    y(f"{prefix}_rows", "a context per row (P = 75)", b, t, data=custom(b, t, 1, 75))
    y(f"{prefix}_rows_classes", f"a context per row, {unit} coded in class order across three classes", b, t,
      data=custom(b, t, 1, 75, thresholds=[112, 116, 119]))
    y(f"{prefix}_rows_blocks_phase", "rows in blocks of 700 elements: each block's phase is its offset mod P, "
      "streams zstd-coded", b, t, data=custom(b, t, 1, 75, block_elems=700, codec="zstd"))
    y(f"{prefix}_rows_any_phase", "P and phase the writer's choice, not the tensor's (P = 7, phase 6)", b, t,
      data=custom(b, t, 1, 7, phase=6))
    b, t = ctxas_case(seed + 1, BF16, (40, 75), by="columns")
    y(f"{prefix}_columns", "a context per column (P = 75)", b, t, data=custom(b, t, 2, 75))
    y(f"{prefix}_columns_blocks_phase", "columns in blocks of 1000 elements (phases 0, 25, 50, …)", b, t,
      data=custom(b, t, 2, 75, block_elems=1000))
    y(f"{prefix}_period_is_block", "P = m: every element its own context (columns), phase m - 1", b, t,
      data=custom(b, t, 2, 3000, phase=2999))


def ctxas_valid_vectors():
    V = []
    y = _one_tensor_y(V, "ctx-delta-as", "8.8")
    for i, (nm, dt) in enumerate(CTX_TYPES):
        b, t = ctxas_case(100 + i, dt)
        y(f"y_ctxas_{nm}", f"ctx-delta-as on {nm.upper()}: the reference encoder's axis, several classes, specials",
          b, t, effort="max")
    _sign_axis_vectors(y, "y_ctxas", ctxas_custom, 110, "signs")
    r = rng(112)
    sb, su = _halving_case(r, 0.5)
    y("y_ctxas_halving", "about 30000 signs in one context, 97 % alike: the counts are halved many times and "
      "the range coder carries", sb, su.view(BF16), data=ctxas_custom(sb, su.view(BF16), 0))
    return V


def _all_ones_bytes(c: int) -> int:
    """The bytes §8.8's range decoder reads for c signs in one context when its code is never below the
    bound (an initial code of 2^32 - 1): every sign decodes as 1."""
    rng, pos, a, b = 0xFFFFFFFF, 5, 0, 0
    for _ in range(c):
        rng -= (rng >> 12) * ((2 * a + 1) * 4096 // (2 * (a + b) + 2))
        while rng < 1 << 24:
            rng, pos = rng << 8, pos + 1
        b += 1
        if a + b == 256:
            a, b = (a + 1) // 2, (b + 1) // 2
    return pos


def _last_param(i, v):
    """An edit of one of a block's last four params (``axis, P, phase`` and the coded stream's length:
    ctx-delta-as's and ctx-delta-rc's), ``v`` a value or a function of the params."""
    def edit(streams, params):
        params[len(params) - 4 + i] = v(params) if callable(v) else v
    return edit


def _coded_bytes(fn, i=2):
    """An edit of stream ``i`` (range-coded), its length param following it."""
    def edit(streams, params):
        streams[i][1] = fn(bytearray(streams[i][1]))
        params[-1] = len(streams[i][1])
    return edit


_coded_bytes_of = _coded_bytes


def _then_codec(fn):
    """``fn``, and every stream of the unknown codec 9: the params' checks come first."""
    def edit(streams, params):
        fn(streams, params)
        for st in streams:
            st[0] = 9
    return edit


def _sign_axis_rejects(n, prefix, length, top, m, one, one_row, code_max_bytes, unit, stream=2):
    """The checks ctx-delta-as, -rc and -rp share (§8.8's sign params, the range coder's start and
    length): ``length`` names the stream-length param, ``top`` its bound, ``code_max_bytes`` the bytes a
    decoder that skips the first code's check reads; ``one`` and ``one_row`` files with one sign context;
    ``stream``: the range-coded stream's number."""
    def _coded_bytes(fn):
        return _coded_bytes_of(fn, stream)
    n(f"{prefix}_axis_too_big", "axis = 3", _last_param(0, 3))
    n(f"{prefix}_one_period", "axis 0 with P = 2", _last_param(1, 2), src=one)
    n(f"{prefix}_one_phase", "axis 0 with phase = 1", _last_param(2, 1), src=one)
    n(f"{prefix}_period_zero", "rows with P = 0", _last_param(1, 0))
    n(f"{prefix}_period_beyond_block", "rows with P = m + 1, the block coded with P = m (one row): a decoder "
      f"that does not check P reads the same {unit}", _last_param(1, m + 1), src=one_row)
    n(f"{prefix}_phase_not_below", "phase = P", _last_param(2, lambda p: p[-3]))
    n(f"{prefix}_{length[0]}_small", f"{length[0]} = 4, the stream cut to 4 bytes",
      _coded_bytes(lambda d: bytes(d[:4])))
    n(f"{prefix}_{length[0]}_big", f"{length[0]} = {length[1]}, the stream padded to it",
      _coded_bytes(lambda d: bytes(d) + bytes(top + 1 - len(d))))
    n(f"{prefix}_first_byte", "the range coder's first byte is 1", _coded_bytes(lambda d: bytes([1]) + bytes(d[1:])))
    n(f"{prefix}_code_max", "the first code is 2^32 - 1, the stream as long as a decoder that reads on takes "
      f"(code >= range: every {'sign' if unit == 'signs' else 'bit'} 1)",
      _coded_bytes(lambda d: b"\x00" + b"\xff" * 4 + bytes(code_max_bytes - 5)), src=one)
    n(f"{prefix}_past_end", f"the stream's last byte cut ({length[0]} too): the last {unit} read past the end",
      _coded_bytes(lambda d: bytes(d[:-1])))
    n(f"{prefix}_bytes_left", f"one byte more after the last {unit[:-1]}'s bytes ({length[0]} too)",
      _coded_bytes(lambda d: bytes(d) + b"\x00"))
    n(f"{prefix}_axis_then_codec", "axis = 3, and every stream of codec 9: the params come first",
      _then_codec(_last_param(0, 3)))
    n(f"{prefix}_{length[0]}_then_codec", f"{length[0]} = 4, and every stream of codec 9: the params come first",
      _then_codec(_last_param(3, 4)))


def ctxas_reject_vectors():
    V = []
    from arcfmt.encodings import ctx_delta as ctx
    b, t = ctxas_case(120, BF16, (40, 50), by="rows", specials=False)
    base = {"x": b}
    rows = ctxas_custom(b, t, 1, 50, thresholds=[112, 116, 119])
    one = ctxas_custom(b, t, 0)
    m = b.size
    one_row = ctxas_custom(b, t, 1, m)   # rows with P = m: one context, as with any P > m would be

    def n(name, desc, fn, error="corrupt", src=None):
        V.append(Vector(name, desc, ["8.8"], base, _restream(fn, src or rows), error=error))

    c = sum(ctx.Params.unpack(records.parse_block(next(r for r in split(rows).recs if r.type == L.BLCK).payload,
                                                  records.parse_tensor(split(rows).recs[1].payload, ""), 0, 0,
                                                  "").params).counts)
    _sign_axis_rejects(n, "n_ctxas", ("sbytes", "2c + 9"), 2 * c + 8, m, one, one_row, _all_ones_bytes(c), "signs")

    def step_out(streams, params):
        k = params[0]
        _magnitude_out(streams, params, 3 * k + 1, sum(params[k:2 * k]))
    n("n_ctxas_step_out_of_range", "a magnitude of 65535: the step leaves the BF16 range", step_out)

    # a stream that decodes, to the right length, but to one sign different: the target hash refuses it
    from arcfmt.dtypes import from_numpy
    adt = from_numpy(b.dtype)
    p0 = split(rows)
    info = records.parse_block(next(r for r in p0.recs if r.type == L.BLCK).payload,
                               records.parse_tensor(p0.recs[1].payload, ""), 0, 0, "")
    pp = ctx.Params.unpack(info.params)
    payload = next(r for r in p0.recs if r.type == L.BLCK).payload
    off, streams0 = info.data_offset, []
    for st in info.streams:
        streams0.append(bytes(payload[off:off + st.stored]))
        off += st.stored
    bu, tu = b.view(adt.uint).reshape(-1), t.view(adt.uint).reshape(-1)
    found = None
    for bit in range(8 * 5, 8 * len(streams0[2])):
        d = bytearray(streams0[2])
        d[bit >> 3] ^= 1 << (bit & 7)
        out = np.empty_like(bu)
        try:
            ctx.decode(adt, pp, [streams0[0], streams0[1], bytes(d), streams0[3]], m, bu, out)
        except Exception:  # noqa: BLE001 - a corrupt stream: try the next bit
            continue
        if int((out != tu).sum()) == 1:
            found = bit
            break
    assert found is not None

    def wrong_sign(streams, params):
        d = bytearray(streams[2][1])
        d[found >> 3] ^= 1 << (found & 7)
        streams[2][1] = bytes(d)
    n("n_ctxas_verification", "a well-formed ctx-delta-as block that rebuilds a different tensor (one sign)",
      wrong_sign, error="verification")

    f64 = np.arange(16, dtype=np.float64)
    f64t = f64.copy()
    f64t[3] = 7.5
    pf = split(write_separate({"x": f64}, {"x": f64t}, force_encoding="float-delta", force_codec="raw"))
    set_first_encoding(pf, 7)
    V.append(Vector("n_ctxas_on_f64", "ctx-delta-as is not defined for F64", ["8", "8.8"], {"x": f64}, assemble(pf),
                    error="unsupported"))
    return V


# ------------------------------------------------------------------------------------ ctx-delta-rc (§8.9)

def ctxrc_custom(base, target, axis, period=1, phase=None, thresholds=(), codec="raw", block_elems=None) -> bytes:
    """:func:`ctx_custom` as ctx-delta-rc with the given sign axis."""
    return ctx_custom(base, target, thresholds, codec, block_elems, signs=(axis, period, phase), rc=True)


def ctxrc_valid_vectors():
    V = []
    y = _one_tensor_y(V, "ctx-delta-rc", "8.9")
    for i, (nm, dt) in enumerate(CTX_TYPES):
        b, t = ctxas_case(140 + i, dt)
        y(f"y_ctxrc_{nm}", f"ctx-delta-rc on {nm.upper()}: the reference encoder's axis, several classes, specials "
          "(steps of every bit length up to the dtype's bits)", b, t, effort="max")
    _sign_axis_vectors(y, "y_ctxrc", ctxrc_custom, 150, "changes")
    # many changes in few contexts: counts halved many times, the coder carries
    r = rng(152)
    sb, su = _halving_case(r, 0.5, threes=0.1)
    y("y_ctxrc_halving", "about 30000 changes, 97 % of signs alike, 90 % of magnitude 1: the counts are halved "
      "many times and the range coder carries", sb, su.view(BF16), data=ctxrc_custom(sb, su.view(BF16), 0))
    # F32 steps of every bit length 1..32 in one exponent: the length and bit contexts of j >= 15 are shared
    base = np.full(64, 0xBF800000, np.uint32)   # -1.0 steps up, 1.0 down: every step stays in range
    base[32:] = 0x3F800000
    o = base.astype(np.int64)
    o = np.where(o >= 1 << 31, (1 << 31) - 1 - o, o)
    d = np.array([(1 << n) - 1 if n % 2 else 1 << (n - 1) for n in range(1, 33)] * 2, np.int64)
    d[32:] = -d[32:]
    half = 1 << 31
    v = o + d
    assert v.min() >= -half and v.max() < half
    tgt = np.where(v >= 0, v, half - 1 - v).astype(np.uint32)
    y("y_ctxrc_f32_every_length", "F32 steps of every bit length from 1 to 32 (both signs, the longest "
      "across zero): length and bit contexts past j = 15 shared", base.view(np.float32),
      tgt.view(np.float32), data=ctxrc_custom(base.view(np.float32), tgt.view(np.float32), 0))
    b, t = ctxas_case(153, BF16, (30, 40), by="rows")
    V.append(Vector("y_ctxrc_inline", "a ctx-delta-rc block inline in its TENS record (1.6 framing)", ["7", "8.9"],
                    {"x": b}, write_delta({"x": b}, {"x": t}, force_encoding="ctx-delta-rc"),
                    expect_tensors={"x": t}))
    return V


def _first_step(v):
    """An edit of the first change's step (for :func:`_rc_recode` and its kin): ``d[0] = v(d[0])``."""
    def edit_d(d, ords):
        d[0] = v(d[0])
    return edit_d


def _step_to(v):
    """An edit that makes the first change's step land on ``v``."""
    def edit_d(d, ords):
        d[0] = v - ords[0]
    return edit_d


def _rc_recode(base, target, edit_d, previous=None, rhp=False):
    """An edit of ctx-delta-rc's changes stream (and ``nbytes``): the block's steps in class order,
    passed through ``edit_d(d, ords)`` (``d`` a list of ints, edited in place; ``ords`` the bases'
    order-preserving integers), range-coded again with the block's own contexts (with ``previous``, a
    ctx-delta-rh block's: §8.11's sign contexts of the history from ``previous`` to ``base``; with
    ``rhp`` too, a ctx-delta-rhp block's, its class order that of the key fields x', §8.12)."""
    from arcfmt import twins
    from arcfmt.dtypes import from_numpy
    from arcfmt.encodings import ctx_delta as ctx

    def edit(streams, params):
        adt = from_numpy(base.dtype)
        p = ctx.Params.unpack_rc(params)
        bu, tu = base.view(adt.uint).reshape(-1), target.view(adt.uint).reshape(-1)
        pos = np.flatnonzero(bu != tu)
        if p.thresholds:
            field = key_of(base, previous)[pos] if rhp else ctx.exponent_field(adt, bu[pos])
            cls = np.searchsorted(np.array(p.thresholds), field, side="right")
            pos = pos[np.argsort(cls, kind="stable")]
        d = (ctx.ordered(adt, tu[pos]) - ctx.ordered(adt, bu[pos])).tolist()
        edit_d(d, ctx.ordered(adt, bu[pos]).tolist())
        hist = None if previous is None else history_of(base, previous)
        coded = twins._rc_encode(np.array(d, dtype=object), ctx.exponent_field(adt, bu[pos]), pos, bu.size,
                                 *p.signs[:3], 1 << adt.exp_bits, None, _kernel_codes(hist))
        streams[2][1] = coded
        params[-1] = len(coded)
    return edit


def _all_ones_rc_bytes(adt, base, target, previous=None, thresholds=()) -> int:
    """The bytes §8.9's decoder reads for a block coded with one sign context and no thresholds when its
    code is never below the bound (an initial code of 2^32 - 1): every bit decodes as 1, so every change
    is a sign 1 and a bit length 1 (the step -1). With ``previous``: §8.11's, its sign contexts h; with
    ``thresholds`` too, a ctx-delta-rhp block's (§8.12), its changes in the class order of the key fields."""
    from arcfmt import twins
    from arcfmt.encodings import ctx_delta as ctx
    signs = twins._count_model(1 if previous is None else 3)
    lengths = twins._count_model(twins._RC_LENGTHS << adt.exp_bits)
    rng, pos = 0xFFFFFFFF, 5
    bu, tu = base.view(adt.uint).reshape(-1), target.view(adt.uint).reshape(-1)
    changed = np.flatnonzero(bu != tu)
    if thresholds:
        cls = np.searchsorted(np.array(thresholds), key_of(base, previous)[changed], side="right")
        changed = changed[np.argsort(cls, kind="stable")]
    hs = [0] * changed.size if previous is None else history_of(base, previous)[changed].tolist()
    for x, h in zip(ctx.exponent_field(adt, bu[changed]).tolist(), hs):
        for model, i in ((signs, h), (lengths, x * twins._RC_LENGTHS)):
            p0, update = model
            rng -= (rng >> 12) * p0(i)
            update(i, 1)
            while rng < 1 << 24:
                rng, pos = rng << 8, pos + 1
    return pos


def ctxrc_reject_vectors():
    V = []
    from arcfmt.dtypes import from_numpy
    from arcfmt.encodings import ctx_delta as ctx
    b, t = ctxas_case(160, BF16, (40, 50), by="rows", specials=False)
    base = {"x": b}
    rows = ctxrc_custom(b, t, 1, 50, thresholds=[112, 116, 119])
    one = ctxrc_custom(b, t, 0)
    m = b.size
    one_row = ctxrc_custom(b, t, 1, m)   # rows with P = m: one context, as with any P > m would be
    adt = from_numpy(b.dtype)

    def n(name, desc, fn, error="corrupt", src=None, vb=None):
        V.append(Vector(name, desc, ["8.9"], vb or base, _restream(fn, src or rows), error=error))

    c = int((b.view(np.uint16) != t.view(np.uint16)).sum())
    _sign_axis_rejects(n, "n_ctxrc", ("nbytes", "(W + 1) c + 9"), ctx.rc_limit(adt, c), m, one, one_row,
                       _all_ones_rc_bytes(adt, b, t), "changes")
    n("n_ctxrc_qbits_small", "qbits = c - 1: ctx-delta's checks come first (there is no mw param)",
      lambda streams, params: params.__setitem__(3 * params[0], c - 1))

    n("n_ctxrc_length_beyond_bits", "the first change's bit length goes on past 16 bits (sixteen 0 bits in "
      "its length contexts)", _rc_recode(b, t, _first_step(lambda x: 1 << 16)))
    n("n_ctxrc_step_out_of_range", "the first change's step of 65535 (16 bits) leaves the BF16 range",
      _rc_recode(b, t, _first_step(lambda x: 65535 if x > 0 else -65535)))
    # the last change out of range: every change's bits read before the range check fails
    n("n_ctxrc_step_out_of_range_last", "the last change's step made 65535 (its sign kept) leaves the BF16 range",
      _rc_recode(b, t, lambda d, o: d.__setitem__(len(d) - 1, -65535 if d[-1] < 0 else 65535)))
    n("n_ctxrc_step_out_of_range_to_h", "the first change's step to v = H (32768), one above the largest",
      _rc_recode(b, t, _step_to(1 << 15)))
    n("n_ctxrc_step_out_of_range_below_minus_h", "the first change's step to v = -H - 1 (-32769), one below the "
      "smallest", _rc_recode(b, t, _step_to(-(1 << 15) - 1)))
    n("n_ctxrc_verification", "a well-formed ctx-delta-rc block that rebuilds a different tensor (one step's "
      "magnitude one larger)", _rc_recode(b, t, _first_step(lambda x: x + (1 if x > 0 else -1))),
      error="verification")

    f64 = np.arange(16, dtype=np.float64)
    f64t = f64.copy()
    f64t[3] = 7.5
    pf = split(write_separate({"x": f64}, {"x": f64t}, force_encoding="float-delta", force_codec="raw"))
    set_first_encoding(pf, 8)
    V.append(Vector("n_ctxrc_on_f64", "ctx-delta-rc is not defined for F64", ["8", "8.9"], {"x": f64}, assemble(pf),
                    error="unsupported"))
    return V


# ------------------------------------------------------------------------------------ ctx-delta-rp (§8.10)

def ctxrp_custom(base, target, axis, period=1, phase=None, thresholds=(), codec="raw", block_elems=None) -> bytes:
    """:func:`ctx_custom` as ctx-delta-rp with the given sign axis."""
    return ctx_custom(base, target, thresholds, codec, block_elems, signs=(axis, period, phase), rc=True, rp=True)


def _long_gaps_case(seed):
    """BF16 changes packed tight in part of the block and far apart in the rest: small Rice parameters,
    so some quotients run past 15 bits (G(k, 15) shared), in several classes."""
    r = rng(seed)
    b = (r.standard_normal(20000) * 0.02).astype(np.float32).astype(BF16)
    u = b.view(np.uint16).copy()
    pos = np.concatenate([np.arange(0, 3000, 2), np.arange(3000, 20000, 1700), [19999]])
    u[pos] = np.where(u[pos] >= 32768, u[pos] - 1, u[pos] + 1)
    return b, u.view(BF16)


def ctxrp_valid_vectors():
    V = []
    y = _one_tensor_y(V, "ctx-delta-rp", "8.10")
    for i, (nm, dt) in enumerate(CTX_TYPES):
        b, t = ctxas_case(170 + i, dt)
        y(f"y_ctxrp_{nm}", f"ctx-delta-rp on {nm.upper()}: the reference encoder's axis and Rice parameters, up to "
          "16 classes, specials (steps of every bit length up to the dtype's bits)", b, t, effort="max")
    _sign_axis_vectors(y, "y_ctxrp", ctxrp_custom, 180, "gaps and changes")
    b, t = _long_gaps_case(182)
    y("y_ctxrp_long_quotients", "gaps of 1 and of 1700 in one block, one class: quotients of every length up to "
      "hundreds of bits (the contexts past j = 15 shared)", b, t, data=ctxrp_custom(b, t, 0))
    y("y_ctxrp_long_quotients_classes", "the same gaps over four classes, each with its own contexts and Rice "
      "parameter", b, t, data=ctxrp_custom(b, t, 0, thresholds=[115, 118, 120]))
    r = rng(183)
    sb, su = _halving_case(r, 0.6)
    y("y_ctxrp_halving", "about 36000 changes in one class: the gap and change counts are halved many times and "
      "the range coder carries", sb, su.view(BF16), data=ctxrp_custom(sb, su.view(BF16), 0))
    b, t = ctxas_case(184, BF16, (30, 40), by="rows")
    V.append(Vector("y_ctxrp_inline", "a ctx-delta-rp block inline in its TENS record (1.6 framing)", ["7", "8.10"],
                    {"x": b}, write_delta({"x": b}, {"x": t}, force_encoding="ctx-delta-rp"),
                    expect_tensors={"x": t}))
    return V


def _rp_recode(base, target, edit_g=None, edit_d=None):
    """An edit of ctx-delta-rp's stream (and ``nbytes``): the block's gaps (class order) passed through
    ``edit_g(g, counts)`` and its steps through ``edit_d(d, ords)`` (lists of ints, edited in place),
    range-coded again with the block's own params."""
    from arcfmt import twins
    from arcfmt.dtypes import from_numpy
    from arcfmt.encodings import ctx_delta as ctx

    def edit(streams, params):
        adt = from_numpy(base.dtype)
        p = ctx.Params.unpack_rp(params)
        bu, tu = base.view(adt.uint).reshape(-1), target.view(adt.uint).reshape(-1)
        pos = np.flatnonzero(bu != tu)
        cls_all = np.searchsorted(np.array(p.thresholds, np.int64), ctx.exponent_field(adt, bu), side="right")
        gaps, members = [], []
        for k in range(p.classes):
            members.append(np.flatnonzero(cls_all == k))
            ranks = np.searchsorted(members[k], pos[cls_all[pos] == k])
            gaps += (np.diff(ranks, prepend=-1) - 1).tolist()
        pos = pos[np.argsort(cls_all[pos], kind="stable")]
        d = (ctx.ordered(adt, tu[pos]) - ctx.ordered(adt, bu[pos])).tolist()
        if edit_g:
            edit_g(gaps, p.counts)
            ranks = np.cumsum(np.array(gaps, np.int64) + 1)
            off, moved = 0, []
            for k, ck in enumerate(p.counts):   # the positions the edited gaps name (sign contexts follow them)
                rk = ranks[off:off + ck] - (ranks[off - 1] if off else 0) - 1
                off += ck
                if ck and rk[-1] >= members[k].size:
                    break   # past the class: the decoder stops there, the changes are never read
                moved.append(members[k][rk])
            else:
                pos = np.concatenate(moved)
        if edit_d:
            edit_d(d, ctx.ordered(adt, bu[pos]).tolist())
        coded = twins._rc_encode(np.array(d, dtype=object), ctx.exponent_field(adt, bu[pos]), pos, bu.size,
                                 *p.signs[:3], 1 << adt.exp_bits, (np.array(gaps, np.int64), p.counts, p.rice))
        streams[0][1] = coded
        params[-1] = len(coded)
    return edit


def _all_ones_rp_bytes(adt, base, target, rice) -> int:
    """The bytes §8.10's decoder reads for a block of one class (Rice parameter ``rice``) and one sign
    context when its code is never below the bound (2^32 - 1): every bit decodes as 1, so every gap is
    2^r - 1 and every change a sign 1 and a bit length 1. Counted by running the numpy twins' decoder
    from that code (its start check skipped)."""
    from arcfmt import twins
    from arcfmt.encodings import ctx_delta as ctx
    bu, tu = base.view(adt.uint).reshape(-1), target.view(adt.uint).reshape(-1)
    c = int((bu != tu).sum())
    dec = twins._RangeDecoder(b"\x00" + b"\xff" * 4 + bytes(16 * c + 64), 0xFFFFFFFF)
    pos = twins._rp_ranks(dec, [c], [rice], bu.size)
    try:
        twins._rc_decode(dec, pos, ctx.ordered(adt, bu[pos]), ctx.exponent_field(adt, bu[pos]), bu.size, 0, 1, 0,
                         8 * adt.itemsize, 1 << adt.exp_bits)
    except twins._Failed as exc:   # the zeros left over: bytes after the last change
        assert exc.status == twins.S_LENGTH
    return dec.r


def ctxrp_reject_vectors():
    V = []
    from arcfmt.dtypes import from_numpy
    from arcfmt.encodings import ctx_delta as ctx
    b, t = ctxas_case(190, BF16, (40, 50), by="rows", specials=False)
    base = {"x": b}
    rows = ctxrp_custom(b, t, 1, 50, thresholds=[112, 116, 119])
    one = ctxrp_custom(b, t, 0)
    m = b.size
    one_row = ctxrp_custom(b, t, 1, m)
    adt = from_numpy(b.dtype)

    def n(name, desc, fn, error="corrupt", src=None):
        V.append(Vector(name, desc, ["8.10"], base, _restream(fn, src or rows), error=error))

    def params_of(src):
        p = split(src)
        i = next(i for i, r in enumerate(p.recs) if r.type == L.BLCK)
        return ctx.Params.unpack_rp(records.parse_block(p.recs[i].payload, records.parse_tensor(
            p.recs[i - 1].payload, ""), 0, 0, "").params)
    c = int((b.view(np.uint16) != t.view(np.uint16)).sum())
    r_one = params_of(one).rice[0]
    assert c << r_one <= m   # every gap 2^r - 1: the ranks stay in the block
    _sign_axis_rejects(n, "n_ctxrp", ("nbytes", "(W + 4) c + ceil(m / 8) + 10"), ctx.rp_limit(adt, c, m), m, one,
                       one_row, _all_ones_rp_bytes(adt, b, t, r_one), "changes", stream=0)
    n("n_ctxrp_rice_big", "r_0 = 25: ctx-delta's checks come first (there is no qbits param)",
      lambda streams, params: params.__setitem__(2 * params[0], 25))

    n("n_ctxrp_length_beyond_bits", "the first change's bit length goes on past 16 bits",
      _rp_recode(b, t, edit_d=_first_step(lambda x: 1 << 16)))
    n("n_ctxrp_step_out_of_range_to_h", "the first change's step to v = H (32768), one above the largest",
      _rp_recode(b, t, edit_d=_step_to(1 << 15)))
    n("n_ctxrp_step_out_of_range_below_minus_h", "the first change's step to v = -H - 1, one below the smallest",
      _rp_recode(b, t, edit_d=_step_to(-(1 << 15) - 1)))
    n("n_ctxrp_step_out_of_range_last", "the last change's step made 65535 (its sign kept)",
      _rp_recode(b, t, edit_d=lambda d, o: d.__setitem__(len(d) - 1, -65535 if d[-1] < 0 else 65535)))

    def far(g, counts):
        g[0] = 4 * m   # a quotient that passes the block long before its end bit
    n("n_ctxrp_quotient_far", "the first gap is 4m: its quotient's 0 bits take the rank to m and on (the stream "
      "ends the quotient later, then codes every change)", _rp_recode(b, t, edit_g=far))
    rice_rows = params_of(rows).rice

    def field_far(g, counts):   # a class's first gap: the quotient stops short of m, its field reaches m
        k = next(k for k, ck in enumerate(counts) if ck and rice_rows[k])
        r = rice_rows[k]
        g[sum(counts[:k])] = (((m - 1) >> r) << r) + (1 << r) - 1
    n("n_ctxrp_quotient_far_by_field", "a class's first gap ends its quotient below m, and its field takes the "
      "rank to m or beyond", _rp_recode(b, t, edit_g=field_far))

    members0 = int((ctx.exponent_field(adt, b.view(np.uint16).reshape(-1)) < 112).sum())
    pr = params_of(rows)

    def to_class_end(g, counts):
        k = next(k for k, ck in enumerate(counts) if ck)
        last = sum(g[:counts[k]]) + counts[k] - 1   # the class's last rank
        n_k = members0 if k == 0 else None
        assert n_k is not None and last < n_k < m
        g[counts[k] - 1] += n_k - last   # that rank made n_k: past its class, still inside the block
    assert pr.counts[0] > 0
    n("n_ctxrp_rank_beyond_class", "class 0's last rank made n_0 (its member count, below m): beyond its class",
      _rp_recode(b, t, edit_g=to_class_end))

    def moved(g, counts):
        j = next(j for j, x in enumerate(g) if x > 0)
        g[j] -= 1   # one class's changes from here on move to the member before
    n("n_ctxrp_verification", "a well-formed ctx-delta-rp block that rebuilds a different tensor (one gap one "
      "shorter)", _rp_recode(b, t, edit_g=moved), error="verification")

    f64 = np.arange(16, dtype=np.float64)
    f64t = f64.copy()
    f64t[3] = 7.5
    pf = split(write_separate({"x": f64}, {"x": f64t}, force_encoding="float-delta", force_codec="raw"))
    set_first_encoding(pf, 9)
    V.append(Vector("n_ctxrp_on_f64", "ctx-delta-rp is not defined for F64", ["8", "8.10"], {"x": f64},
                    assemble(pf), error="unsupported"))
    return V


# ---------------------------------------------------------------------- ctx-delta-rh, HISTORY (1.9: §6, §7, §8.11)

def write_history(base, target, previous, **kw):
    """A file written given the previous step (1.9, ``DeltaWriter(previous=)``): META has HISTORY; the
    tensors of the ctx-delta dtypes given a previous value carry HISTORY as the writer chooses (every one
    with ``force_encoding="ctx-delta-rh"``, else those of 4096 elements or more). Framing as the
    reference writer sets it (INLINE_BLOCKS: the modes for older readers write no HISTORY)."""
    return write_delta(base, target, previous=previous, **kw)


def _adt(a):
    from arcfmt.dtypes import from_numpy
    return from_numpy(np.dtype(a.dtype))


def previous_for(base, target, seed=0, agree=0.85, still=0.12, mirror=0.15):
    """A previous step for ``(base, target)`` whose history (§7) predicts the direction of most changes:
    where the target steps up from the base, the base mostly came up from the previous value (h = 1),
    where it steps down mostly down (h = 2); some changes have h = 0 (``still``: the previous value is
    the base), and ``1 - agree`` of the others the opposite history. ``mirror`` of the changes have a
    previous value of the other sign (the base's bits with the sign bit flipped: ``ord`` -x - 1, the
    step across zero, ±0 included) in the direction of their step. The unchanged elements get any
    history. Deterministic in its arguments."""
    from arcfmt.encodings.ctx_delta import ordered, unordered
    adt = _adt(base)
    bu, tu = base.view(adt.uint).reshape(-1), target.view(adt.uint).reshape(-1)
    ob, ot = ordered(adt, bu), ordered(adt, tu)
    s = np.sign(ot - ob)
    r = rng(seed + 7000)
    m = bu.size
    half = 1 << (8 * adt.itemsize - 1)
    want = np.where(r.random(m) < agree, s, -s)          # +1: base above the previous value (h = 1)
    want = np.where(s == 0, r.choice([-1, 0, 1], m), want)
    want = np.where((s != 0) & (r.random(m) < still), 0, want)
    op = np.clip(ob - want * r.integers(1, 4, m), -half, half - 1)
    # across zero: the previous value of the other sign, where that is the step's direction too
    flip = (s != 0) & ((ob >= 0) == (s > 0)) & (r.random(m) < mirror)
    flip |= (bu == 0) | (bu == (1 << (8 * adt.itemsize - 1)))   # +0 came from -0 and -0 from +0
    op = np.where(flip, -ob - 1, op)
    prev = unordered(adt, op).view(base.dtype).reshape(base.shape)
    return prev


def _kernel_codes(h):
    """Codes of :func:`history_of` (one a byte) as the encoder and decoder take them: packed four to a
    byte, with the offset of element 0 (None stays None)."""
    from arcfmt.history import pack
    return None if h is None else (pack(h), 0)


def history_of(base, previous) -> np.ndarray:
    """§7's h of every element (flat uint8): 0 for equal bit patterns, 1 where ord(base) > ord(previous), 2
    where less — computed here from §8.6's ord, not by the encoder."""
    from arcfmt.encodings.ctx_delta import ordered
    adt = _adt(base)
    bu, pu = base.view(adt.uint).reshape(-1), previous.view(adt.uint).reshape(-1)
    ob, op = ordered(adt, bu), ordered(adt, pu)
    return np.where(bu == pu, 0, np.where(ob > op, 1, 2)).astype(np.uint8)


def _check_history_case(base, target, previous, least=8):
    """The changes of ``(base, target)`` have every history, and among them are steps across zero and
    elements whose history a decoder comparing raw bit patterns instead of ``ord`` gets wrong."""
    adt = _adt(base)
    bu, tu = base.view(adt.uint).reshape(-1), target.view(adt.uint).reshape(-1)
    pu = previous.view(adt.uint).reshape(-1)
    ch = bu != tu
    h = history_of(base, previous)
    raw = np.where(bu == pu, 0, np.where(bu > pu, 1, 2))
    sign = 1 << (8 * adt.itemsize - 1)
    across = ch & (h != 0) & ((bu & sign) != (pu & sign))
    for what, n in (("h = 0", (ch & (h == 0)).sum()), ("h = 1", (ch & (h == 1)).sum()),
                    ("h = 2", (ch & (h == 2)).sum()), ("raw order differs", (ch & (raw != h)).sum()),
                    ("across zero", across.sum())):
        assert n >= least, f"only {n} changes with {what}"


def _block_parts(data):
    """Each block of a file written with HISTORY: ``(tensor header, tensor ordinal, block ordinal, encoding,
    params, decoded streams)``, inline blocks included."""
    from arcfmt import codecs
    p = split(data, block_records=True)
    history = records.parse_meta(p.recs[0].payload).history
    out, th, t, b = [], None, -1, 0
    for r in p.recs:
        if r.type == L.TENS:
            th, t, b = records.parse_tensor(r.payload, "", None, False, history), t + 1, 0
        elif r.type == L.BLCK:
            info = records.parse_block(r.payload, th, t, b, "")
            streams, pos = [], info.data_offset
            for st in info.streams:
                streams.append(codecs.decode(st.codec, r.payload[pos:pos + st.stored], st.decoded))
                pos += st.stored
            out.append((th, t, b, info.encoding, list(info.params), streams))
            b += 1
    return out


RH = 10   # ctx-delta-rh's encoding id (§8)
RHP = 11  # ctx-delta-rhp's (1.10)


def _changes_rejects(n, prefix, name, recode):
    """The faults of a BF16 block's range-coded changes (§8.9's checks, as ctx-delta-rh and -rhp read
    them) that ``recode`` (an edit of the steps) writes: a bit length past 16 bits, steps out of range,
    and a well-formed block that rebuilds another tensor."""
    n(f"{prefix}_length_beyond_bits", "the first change's bit length goes on past 16 bits (sixteen 0 bits in its "
      "length contexts)", recode(_first_step(lambda x: 1 << 16)))
    n(f"{prefix}_step_out_of_range", "the first change's step of 65535 (16 bits) leaves the BF16 range",
      recode(_first_step(lambda x: 65535 if x > 0 else -65535)))
    n(f"{prefix}_step_out_of_range_last", "the last change's step made 65535 (its sign kept) leaves the BF16 range",
      recode(lambda d, o: d.__setitem__(len(d) - 1, -65535 if d[-1] < 0 else 65535)))
    n(f"{prefix}_step_out_of_range_to_h", "the first change's step to v = H (32768), one above the largest",
      recode(_step_to(1 << 15)))
    n(f"{prefix}_step_out_of_range_below_minus_h", "the first change's step to v = -H - 1 (-32769), one below the "
      "smallest", recode(_step_to(-(1 << 15) - 1)))
    n(f"{prefix}_verification", f"a well-formed {name} block that rebuilds a different tensor (one step's "
      "magnitude one larger)", recode(_first_step(lambda x: x + (1 if x > 0 else -1))), error="verification")


def _rh_blocks(data):
    return [x for x in _block_parts(data) if x[3] == RH]


def assert_history_matters(data, base, target, previous):
    """Every ctx-delta-rh block of ``data`` (one tensor ``x``, or named by ``base``'s keys) is checked the
    way a wrong decoder would read it: with no history (as ctx-delta-rc), with h = 0 everywhere, with the
    neighbouring element's h, with h from raw bit patterns instead of ``ord``, with h = 0 where the values
    are equal as numbers (±0) instead of as bit patterns, and (a block after the first) with the h of the
    tensor's first elements: each must fail or rebuild another block. And its changes stream differs
    from ctx-delta-rc's of the same block, axis and classes. Returns the wrong readings some block tells
    from the right one (a block whose changes such a reader gets right is not one), and the number of
    ctx-delta-rh blocks."""
    from arcfmt.encodings import ctx_delta as ctx
    from arcfmt.errors import CorruptError
    n, seen = 0, set()
    for th, _, b, _, params, streams in _rh_blocks(data):
        be = th.block_elems
        bt, tt, pt = base[th.name], target[th.name], previous[th.name]
        adt = _adt(bt)
        bu = bt.view(adt.uint).reshape(-1)
        tu = tt.view(adt.uint).reshape(-1)
        pu = pt.view(adt.uint).reshape(-1)
        s, e = b * be, min(bu.size, (b + 1) * be)
        hist = history_of(bt, pt)
        h = hist[s:e]
        pos = np.flatnonzero(bu[s:e] != tu[s:e])
        raw = np.where(bu == pu, 0, np.where(bu > pu, 1, 2)).astype(np.uint8)[s:e]
        # (h = 1 and 2 swapped everywhere is not among them: it renames the contexts 3j + 1 and 3j + 2,
        # which start alike and never meet, so such a decoder reads every stream as §8.11 does)
        with np.errstate(invalid="ignore"):
            fb, fp = bt.reshape(-1)[s:e].astype(np.float64), pt.reshape(-1)[s:e].astype(np.float64)
            by_value = np.where(fb == fp, 0, np.where(fb > fp, 1, 2)).astype(np.uint8)
        wrong = {"zero": np.zeros_like(h), "neighbour": np.roll(h, 1), "raw bits": raw, "float values": by_value}
        if b:
            wrong["tensor offset"] = hist[:e - s]
        p = ctx.Params.unpack_rc(params)
        p.rh = True
        out = np.empty(e - s, adt.uint)
        ctx.decode(adt, p, streams, e - s, bu[s:e], out, None, _kernel_codes(h))
        assert (out == tu[s:e]).all()
        n += 1
        axis, period, phase = p.signs[:3]
        j = np.zeros_like(pos) if axis == 0 else (pos + phase) // period if axis == 1 else (pos + phase) % period
        wrong["none"] = None
        for what, hw in wrong.items():
            q = ctx.Params.unpack_rc(params)
            q.rh = hw is not None
            # contexts start alike and never meet: a reading whose contexts are a renaming of the right
            # ones (one to one over the changes: h = 0 everywhere read as none, every change its own
            # context, h right at every change) reads every stream alike, so no block can tell it
            right, read = 3 * j + h[pos], (j if hw is None else 3 * j + hw[pos])
            pairs = set(zip(right.tolist(), read.tolist()))
            if len(pairs) == len(set(right.tolist())) == len(set(read.tolist())):
                continue
            seen.add(what)
            try:
                ctx.decode(adt, q, streams, e - s, bu[s:e], out, None, _kernel_codes(hw))
            except CorruptError:
                continue
            assert (out != tu[s:e]).any(), f"{th.name} block {b}: a decoder with h {what} rebuilds it too"
        if "none" in seen:   # ... and then the writer's ctx-delta-rc stream of the block differs from it
            rc = ctx.encode(adt, bu[s:e], tu[s:e], pos, thresholds=p.thresholds, rc_axes=[p.signs[:3]],
                            force_rc=True)
            assert rc.rc and not rc.rh and rc.streams[2] != bytes(streams[2])
    return seen, n


def rh_custom(base, target, previous, axis, period=1, phase=None, thresholds=(), codec="raw",
              block_elems=None, rhp=False) -> bytes:
    """:func:`ctx_custom` as ctx-delta-rh (§8.11): a one-tensor file given the previous step, its tensor
    with HISTORY, its blocks ctx-delta-rh with exactly the given thresholds and sign axis (``phase`` None:
    the block's place in the tensor), each stream of ``codec``, every block a BLCK record (the header
    without INLINE_BLOCKS). ``rhp``: ctx-delta-rhp (§8.12) instead, the thresholds on the key fields x'."""
    from arcfmt import codecs, encodings
    from arcfmt.encodings import ctx_delta as ctx
    be = block_elems or max(1, base.size)
    # (the writer forced to ctx-delta-rh: it gives every tensor so forced HISTORY, whatever its size)
    p = split(write_history({"x": base}, {"x": target}, {"x": previous}, force_encoding="ctx-delta-rh",
                            force_codec=codec, block_elems=be), block_records=True)
    adt = _adt(base)
    bu = base.view(adt.uint).reshape(-1)
    tu = target.view(adt.uint).reshape(-1)
    pu = previous.view(adt.uint).reshape(-1)
    hist = history_of(base, previous)
    k = 0
    for rec in p.recs:
        if rec.type != L.BLCK:
            continue
        b, t = bu[k * be:(k + 1) * be], tu[k * be:(k + 1) * be]
        pos = np.flatnonzero(b != t)
        axes = [(axis, period, (k * be) % period if phase is None else phase)]
        enc = ctx.encode(adt, b, t, pos, thresholds=list(thresholds), rc_axes=axes, force_rc=True,
                         history=_kernel_codes(hist[k * be:(k + 1) * be]), force_rh=True, rhp=2 * rhp,
                         previous=pu[k * be:(k + 1) * be] if rhp else None)
        assert enc.rc and enc.rh and not enc.rp and enc.rhp == rhp
        blk = encodings.EncodedBlock(RHP if rhp else RH, enc.params, enc.streams, pos.size)
        rec.payload = records.build_block(0, k, blk, [codecs.encode_with(codecs.by_name(codec).id, bytes(x))
                                                      for x in enc.streams])
        rec.encoding = blk.encoding
        k += 1
    return assemble(p)


def _rh_axes(data):
    """The sign params ``(axis, P, phase)`` of each ctx-delta-rh block of ``data``."""
    return [tuple(params[3 * params[0] + 1:3 * params[0] + 4]) for _, _, _, _, params, _ in _rh_blocks(data)]


EVERY_WRONG_READING = {"none", "zero", "neighbour", "raw bits", "float values", "tensor offset"}


def _multi_block_case():
    """``(base, target, previous, file)``: tensor emb (no HISTORY: not in the previous step) and tensor
    layers.0.w (HISTORY), 8 blocks of 1024, the writer's choice per block: a history that predicts the
    signs in blocks 0-3 and 7 (ctx-delta-rh), one that does not in 4 and 5 (-rc), 6 unchanged."""
    b, t = ctx_case(195, BF16, 8192)
    b, t = b.reshape(64, 128), t.copy().reshape(64, 128)
    p = previous_for(b, t, 195, agree=0.95).reshape(-1)
    p[4096:6144] = previous_for(b, t, 196, agree=0.5, still=0.3).reshape(-1)[4096:6144]   # no use: -rc
    p = p.reshape(b.shape)
    t.reshape(-1)[6144:7168] = b.reshape(-1)[6144:7168]                                  # unchanged
    e, et = ctxas_case(197, BF16, (64, 128), by="rows", specials=False)
    base, target = {"emb": e, "layers.0.w": b}, {"emb": et, "layers.0.w": t}
    return base, target, {"layers.0.w": p}, write_history(base, target, {"layers.0.w": p}, effort="max",
                                                          block_elems=1024)


def _history_vector_maker(V, seen_all, encoding, covers, previous_of, matters, wrong_default):
    """``y(name, desc, base, target, data=None, previous=None, covers=..., wrong=..., **kw)``: a one-tensor
    ``x`` vector given the previous step (default ``previous_of(base, target)``), its file ``data`` or the
    writer's with ``encoding`` forced, checked by ``matters`` to tell every reading in ``wrong`` apart
    (the readings it told go into ``seen_all``), appended to ``V``; returns the file."""
    def y(name, desc, base, target, data=None, previous=None, covers=covers, wrong=wrong_default, **kw):
        previous = previous_of(base, target) if previous is None else previous
        if data is None:
            data = write_history({"x": base}, {"x": target}, {"x": previous}, force_encoding=encoding, **kw)
        seen, n = matters(data, {"x": base}, {"x": target}, {"x": previous})
        assert n and set(wrong) <= seen, (name, n, set(wrong) - seen)
        seen_all.update(seen)
        V.append(Vector(name, desc, list(covers), {"x": base}, data, expect_tensors={"x": target},
                        previous={"x": previous}))
        return data
    return y


def _inline_pair(y, prefix, encoding, code, b, t, p):
    """Through ``y``: a one-block tensor written with ``encoding`` forced, its block inline in its TENS
    record (1.6 framing), and the same block in a BLCK record after it."""
    inline = write_history({"x": b}, {"x": t}, {"x": p}, force_encoding=encoding)
    q = split(inline)
    assert q.recs[1].type == L.TENS and q.recs[1].encoding == code and not any(r.type == L.BLCK for r in q.recs)
    y(f"{prefix}_inline", f"a {encoding} block inline in its TENS record (1.6 framing), the tensor with HISTORY",
      b, t, previous=p, data=inline)
    y(f"{prefix}_blck_record", f"the block of {prefix}_inline in a BLCK record after its TENS record (a header "
      "without INLINE_BLOCKS)", b, t, previous=p, data=assemble(split(inline, block_records=True)))


def _on_f64(name, encoding, code, section):
    """A float-delta block of an F64 tensor renamed ``encoding`` (``code``): not defined for F64."""
    f64 = np.arange(16, dtype=np.float64)
    f64t = f64.copy()
    f64t[3] = 7.5
    pf = split(write_separate({"x": f64}, {"x": f64t}, force_encoding="float-delta", force_codec="raw"))
    set_first_encoding(pf, code)
    return Vector(name, f"{encoding} is not defined for F64 (§8 check 1, before check 4: the tensor has no HISTORY "
                  "either)", ["8", section], {"x": f64}, assemble(pf), error="unsupported")


def ctxrh_valid_vectors():
    V = []
    seen_all = set()

    # a one-tensor ``x`` vector given the previous step (default :func:`previous_for`), its file or the
    # writer's with ctx-delta-rh forced; ``wrong``: the wrong readings of h its blocks must tell
    y = _history_vector_maker(V, seen_all, "ctx-delta-rh", ("7", "8.11"), previous_for, assert_history_matters, ())

    for i, (nm, dt) in enumerate(CTX_TYPES):
        b, t = ctxas_case(170 + i, dt)
        p = previous_for(b, t, 170 + i)
        _check_history_case(b, t, p)
        y(f"y_ctxrh_{nm}", f"ctx-delta-rh on {nm.upper()}, two blocks (2000 elements: the second's history "
          "from tensor elements 2000 on): a previous step whose changes predict most steps' signs, changes "
          "with h = 0, 1 and 2, steps across zero (±0 included) and negative values, whose order is not their "
          "bits' order; specials", b, t, previous=p, effort="max", block_elems=2000,
          wrong=EVERY_WRONG_READING - {"float values"})
    # the writer's choice of axis under the history contexts (§18): one context, rows, columns
    b0, t0 = ctx_case(180, BF16, 3072)
    for axis, (b, t) in ((0, (b0.reshape(48, 64), t0.reshape(48, 64))),
                         (1, ctxas_case(180, BF16, (48, 64), by="rows")),
                         (2, ctxas_case(180, BF16, (48, 64), by="columns"))):
        p = previous_for(b, t, 180)
        what = {0: "signs alike in no row or column: one context", 1: "signs alike along rows: a context a row",
                2: "signs alike along columns: a context a column"}[axis]
        data = y(f"y_ctxrh_chosen_{['axis0', 'rows', 'columns'][axis]}", f"ctx-delta-rh, the writer's sign axis: "
                 f"{what} (times three histories)", b, t, previous=p, effort="max")
        assert [a[0] for a in _rh_axes(data)] == [axis], _rh_axes(data)

    def custom(b, t, axis, period=1, phase=None, thresholds=(), codec="raw", block_elems=None):
        data = rh_custom(b, t, previous_for(b, t), axis, period, phase, thresholds, codec, block_elems)
        assert {a[:2] for a in _rh_axes(data)} == {(axis, period)}
        return data
    _sign_axis_vectors(y, "y_ctxrh", custom, 190, "changes")
    # many changes in few contexts: counts halved many times, the coder carries
    r = rng(192)
    sb, su = _halving_case(r, 0.5, threes=0.1)
    st = su.view(BF16)
    y("y_ctxrh_halving", "about 30000 changes, 97 % of signs alike, in three contexts (one axis context times "
      "three histories): the counts are halved many times and the range coder carries", sb, st,
      data=rh_custom(sb, st, previous_for(sb, st), 0))
    b, t = ctxas_case(193, BF16, (30, 40), by="rows")
    y("y_ctxrh_previous_is_base", "the previous step is the base itself: h = 0 everywhere, only contexts 3j used",
      b, t, previous=b.copy())
    # one-block tensors: the block inline in its TENS record (1.6 framing), and the same block in a BLCK record
    b, t = ctxas_case(194, BF16, (30, 40), by="rows")
    _inline_pair(y, "y_ctxrh", "ctx-delta-rh", RH, b, t, previous_for(b, t, 194))
    # several blocks: the writer's choice per block in a tensor with HISTORY (§18), beside a tensor without
    base, target, prev, data = _multi_block_case()
    kinds = [(th.name, blk, enc) for th, _, blk, enc, _, _ in _block_parts(data)]
    assert [k[2] for k in kinds if k[0] == "layers.0.w"] == [RH] * 4 + [8, 8, 0, RH], kinds
    assert {k[2] for k in kinds if k[0] == "emb"} == {8}, kinds
    ths = [records.parse_tensor(r.payload, "", None, False, True) for r in split(data, block_records=True).recs
           if r.type == L.TENS]
    assert [th.needs_history for th in ths] == [False, True]
    seen, n = assert_history_matters(data, base, target, prev)
    assert n == 5 and EVERY_WRONG_READING - {"float values"} <= seen, seen
    V.append(Vector("y_ctxrh_multi_block", "a tensor of 8 blocks with HISTORY, the writer's choice per block: "
                    "ctx-delta-rh where the history predicts the signs (blocks 0-3 and 7), ctx-delta-rc where it "
                    "does not (4, 5), unchanged (6); before it a tensor without HISTORY (not in the previous "
                    "step) of ctx-delta-rc blocks", ["7", "8.11", "12.3"], base, data, expect_tensors=target,
                    previous=prev))
    assert EVERY_WRONG_READING <= seen_all, EVERY_WRONG_READING - seen_all
    return V


def _history_fixture(seed=200):
    """The must-reject vectors' ctx-delta-rh data: BF16 [40, 50], signs alike along rows, a previous step
    that predicts them (no specials: every step in range both ways)."""
    b, t = ctxas_case(seed, BF16, (40, 50), by="rows", specials=False)
    return b, t, previous_for(b, t, seed)


def ctxrh_reject_vectors():
    """ctx-delta-rh's params and changes stream (§8.11: §8.9's checks, R-CTXRH-PARAMS, R-CTXRH-CHANGES),
    as ctxrc_reject_vectors makes them, on blocks coded with the history contexts."""
    V = []
    from arcfmt.encodings import ctx_delta as ctx
    b, t, prev = _history_fixture()
    base = {"x": b}
    rows = rh_custom(b, t, prev, 1, 50, thresholds=[112, 116, 119])
    one = rh_custom(b, t, prev, 0)
    m = b.size
    one_row = rh_custom(b, t, prev, 1, m)
    adt = _adt(b)

    def n(name, desc, fn, error="corrupt", src=None):
        V.append(Vector(name, desc, ["7", "8.11"], base, _restream(fn, src or rows), error=error,
                        previous={"x": prev}))

    c = int((b.view(np.uint16) != t.view(np.uint16)).sum())
    _sign_axis_rejects(n, "n_ctxrh", ("nbytes", "(W + 1) c + 9"), ctx.rc_limit(adt, c), m, one, one_row,
                       _all_ones_rc_bytes(adt, b, t, prev), "changes")
    n("n_ctxrh_qbits_small", "qbits = c - 1: ctx-delta's checks come first (there is no mw param)",
      lambda streams, params: params.__setitem__(3 * params[0], c - 1))


    def recode(edit_d):
        return _rc_recode(b, t, edit_d, prev)
    _changes_rejects(n, "n_ctxrh", "ctx-delta-rh", recode)
    # the stream as ctx-delta-rc codes it (contexts j, not 3j + h), its params those of the block: a decoder
    # that ignores the history reads it right; read as §8.11 says, its changes leave bytes over (corrupt)
    from arcfmt import twins

    def as_rc(streams, params):
        p = ctx.Params.unpack_rc(params)
        bu, tu = b.view(adt.uint).reshape(-1), t.view(adt.uint).reshape(-1)
        pos = np.flatnonzero(bu != tu)
        cls = np.searchsorted(np.array(p.thresholds), ctx.exponent_field(adt, bu[pos]), side="right")
        pos = pos[np.argsort(cls, kind="stable")]
        d = ctx.ordered(adt, tu[pos]) - ctx.ordered(adt, bu[pos])
        coded = twins._rc_encode(np.array(d.tolist(), dtype=object), ctx.exponent_field(adt, bu[pos]), pos, m,
                                 *p.signs[:3], 1 << adt.exp_bits)
        assert coded != streams[2][1]
        streams[2][1] = coded
        params[-1] = len(coded)
    data = _restream(as_rc, rows)
    pr = split(data, block_records=True)
    probe = _block_parts(data)[0]
    q = ctx.Params.unpack_rc(probe[4])
    out = np.empty(m, adt.uint)
    ctx.decode(adt, q, probe[5], m, b.view(adt.uint).reshape(-1), out)   # as ctx-delta-rc: the target
    assert (out == t.view(adt.uint).reshape(-1)).all() and pr.recs[2].encoding == RH
    q.rh = True
    from arcfmt.errors import CorruptError
    try:   # as §8.11: (with this data) the changes read leave bytes over
        ctx.decode(adt, q, probe[5], m, b.view(adt.uint).reshape(-1), out, None, _kernel_codes(history_of(b, prev)))
        raise AssertionError("n_ctxrh_coded_as_rc decodes")
    except CorruptError as exc:
        assert "bytes left" in str(exc), exc
    V.append(Vector("n_ctxrh_coded_as_rc", "a ctx-delta-rh block whose changes stream is coded as ctx-delta-rc's "
                    "(sign contexts j, not 3j + h): a decoder that ignores the history rebuilds the target; read "
                    "as §8.11 says, the changes end with bytes left over", ["8.11"], base, data, error="corrupt",
                    previous={"x": prev}))

    V.append(_on_f64("n_ctxrh_on_f64", "ctx-delta-rh", RH, "8.11"))
    return V


def _retens(payload, history, **kw):
    """A TENS payload (its name whole, as :func:`split` gives it) rebuilt with fields changed — ``flags``,
    ``dtype``, ``base_hash``, ``previous_hash`` (1.9: written with flag HISTORY), ... —, its inline block kept;
    ``history``: the file's META has HISTORY."""
    th = records.parse_tensor(payload, "", None, True, history)
    end, at = tens_fields_end(payload)
    f = dict(name=th.name.encode(), dtype=th.dtype.code, dims=th.shape, block_elems=th.block_elems,
             flags=payload[at], base_hash=th.base_hash, target_hash=th.target_hash, previous_hash=th.previous_hash)
    f.update(kw)
    return L.build_tensor_payload(f["name"], f["dtype"], f["dims"], f["block_elems"], f["flags"], f["base_hash"],
                                  f["target_hash"], None, f["previous_hash"]) + payload[end:]


def _meta_flags(p, set_=0, clear=0):
    """META's flags (§6) with bits set and cleared (``p`` from :func:`split`: PREFIXED_NAMES is
    :func:`assemble`'s to set)."""
    f = (int.from_bytes(p.recs[0].payload[:4], "little") | set_) & ~clear
    p.recs[0].payload = u32(f) + p.recs[0].payload[4:]


def _tens_history(p):
    """The TENS records of ``p`` and whether each carries HISTORY (its META has it)."""
    history = records.parse_meta(p.recs[0].payload).history
    return [(i, records.parse_tensor(r.payload, "", None, True, history).needs_history)
            for i, r in enumerate(p.recs) if r.type == L.TENS]


def _hash(a) -> int:
    """xxh3-64 of a tensor's bytes (§7 "Tensor bytes")."""
    return xxhash.xxh3_64_intdigest(np.ascontiguousarray(a).tobytes())


def _one_off(a):
    """``a`` with the bit pattern of its first element one more (another hash, the same dtype and shape)."""
    u = a.copy().view(f"<u{a.dtype.itemsize}").reshape(-1)
    u[0] += 1
    return u.view(a.dtype).reshape(a.shape)


def history_vectors():
    """HISTORY (§6, §7) and the previous step (§1 "Base files", §12.3 step 1): which files need one,
    what a decoder checks of it and when; and ctx-delta-rh where the tensor has no HISTORY (§8 check 4)."""
    V = []
    b, t, prev = _history_fixture()
    base, previous = {"x": b}, {"x": prev}
    good = rh_custom(b, t, prev, 1, 50, thresholds=[112, 116, 119])   # x: HISTORY, one ctx-delta-rh BLCK

    def y(name, desc, covers, base_, data, target_, previous_):
        V.append(Vector(name, desc, covers, base_, data, expect_tensors=target_, previous=previous_))

    def n(name, desc, covers, data, error, base_=None, previous_=previous, **kw):
        V.append(Vector(name, desc, covers, base if base_ is None else base_, data, error=error,
                        previous=previous_, **kw))

    # -- files that need no previous step
    sb = {nm: rl_step(210 + i, (20, 30))[0] for i, nm in enumerate(("a", "b"))}
    st = {nm: rl_step(210 + i, (20, 30))[1] for i, nm in enumerate(("a", "b"))}
    sp = {nm: _one_off(v) for nm, v in sb.items()}
    unused = write_history(sb, st, sp)   # 600 elements each: under the writer's 4096, no HISTORY
    q = split(unused)
    assert records.parse_meta(q.recs[0].payload).history and not any(h for _, h in _tens_history(q))
    y("y_history_unused", "META has HISTORY, no TENS record has it, and no previous step is given: none is "
      "needed (§6: without a tensor's HISTORY, no previous value)", ["6", "7"], sb, unused, st, None)
    plain = write_delta(sb, st)
    assert not records.parse_meta(split(plain).recs[0].payload).history
    junk = {"a": np.zeros(3, np.int8), "zz": np.arange(4, dtype=np.float32)}
    y("y_history_previous_not_needed", "a file without HISTORY given a previous step (whose tensor a is another "
      "dtype and shape): its tensors are looked up only for tensors with HISTORY", ["1", "7"], sb, plain, st, junk)
    # a previous file with more in it than the HISTORY tensor's value
    i_b, i_t = np.arange(-6, 6, dtype=np.int32), np.arange(-6, 6, dtype=np.int32) * 3
    c_b, c_t = rl_step(213, (10, 12))
    x_b, x_t = ctx_case(213, BF16, 4096)
    x_b, x_t = x_b.reshape(64, 64), x_t.reshape(64, 64)
    x_p = previous_for(x_b, x_t, 213, agree=0.95)
    eb, tg = {"x": x_b, "i": i_b, "c": c_b}, {"x": x_t, "i": i_t, "c": c_t}
    data = write_history(eb, tg, {"x": x_p, "i": i_b[::-1].copy(), "c": c_b.reshape(12, 10)})
    hs = dict((split(data).recs[i].name, h) for i, h in _tens_history(split(data)))
    assert hs == {"x": True, "i": False, "c": False} and len(_rh_blocks(data)) == 1, hs
    y("y_history_previous_extra", "tensor x has HISTORY (a ctx-delta-rh block); the previous step also holds i "
      "(I32: no HISTORY), c (BF16 of another shape: no HISTORY) and an unrelated tensor zz, which are not looked "
      "at", ["1", "7", "8.11"], eb, data, tg,
      {"c": c_b.reshape(12, 10), "i": i_b[::-1].copy(), "x": x_p, "zz": np.ones((2, 2), np.float16)})
    # a tensor with HISTORY whose blocks do not use it: the writer's -rc where the history predicts nothing
    nb, nt = ctx_case(214, BF16, 8192)
    nb, nt = nb.reshape(64, 128), nt.reshape(64, 128)
    np_ = previous_for(nb, nt, 214, agree=0.5, still=0.3)
    norh = write_history({"x": nb}, {"x": nt}, {"x": np_}, block_elems=4096)
    assert [h for _, h in _tens_history(split(norh))] == [True] and not _rh_blocks(norh)
    y("y_history_no_rh_blocks", "a tensor with HISTORY (two blocks) none of whose blocks is ctx-delta-rh: the "
      "previous step is still checked, and must match", ["7", "12.3"], {"x": nb}, norh, {"x": nt}, {"x": np_})
    # HISTORY on an I32 tensor (§7 does not restrict it to ctx-delta's dtypes): xor blocks, a previous value
    ib, it, ip = np.arange(40, dtype=np.int32).reshape(5, 8), np.arange(40, dtype=np.int32).reshape(5, 8) ^ 5, \
        np.full((5, 8), -7, np.int32)
    q = split(write_history({"i": ib}, {"i": it}, {"i": ip}), block_records=True)
    q.recs[1].payload = _retens(q.recs[1].payload, True, flags=L.NEEDS_BASE | L.TENS_HISTORY,
                                previous_hash=_hash(ip))
    y("y_history_on_i32", "HISTORY on an I32 tensor (xor block): §7 allows it on any tensor with a base; its "
      "previous value is checked, and no block uses it", ["7", "12.3"], {"i": ib}, assemble(q), {"i": it}, {"i": ip})

    # -- the previous step a tensor with HISTORY needs (§12.3 step 1, R-PREVIOUS)
    n("n_previous_missing_file", "tensor x has HISTORY and no previous step is given at all", ["7", "12.3"],
      good, "wrong_base", previous_=None)
    n("n_previous_missing_tensor", "the previous step has no tensor x (only one named y, x's value)",
      ["7", "12.3"], good, "wrong_base", previous_={"y": prev})
    f16 = prev.view(np.float16)
    assert _hash(f16) == _hash(prev)
    n("n_previous_dtype", "the previous tensor x is F16 (the same bytes: previous_hash matches)", ["7", "12.3"],
      good, "wrong_base", previous_={"x": f16})
    n("n_previous_shape", "the previous tensor x is [50, 40], the tensor [40, 50] (the same bytes: "
      "previous_hash matches)", ["7", "12.3"], good, "wrong_base", previous_={"x": prev.reshape(50, 40)})
    n("n_previous_hash", "the previous tensor x differs in one element: its bytes do not hash to previous_hash",
      ["7", "12.3"], good, "wrong_base", previous_={"x": _one_off(prev)})
    n("n_previous_hash_no_rh_blocks", "a tensor with HISTORY none of whose blocks uses it, its previous value "
      "one element off", ["7", "12.3"], norh, "wrong_base", base_={"x": nb}, previous_={"x": _one_off(np_)})
    n("n_previous_hash_then_first_byte", "the previous value one element off, and the tensor's ctx-delta-rh block "
      "corrupt (its changes stream's first byte 1): the previous step is checked before any block",
      ["7", "12.3", "8.11"], _restream(_coded_bytes(lambda d: bytes([1]) + bytes(d[1:])), good), "wrong_base",
      previous_={"x": _one_off(prev)})
    # two tensors with HISTORY: a's block corrupt, b's previous value wrong. Random access checks every
    # tensor's base and previous step before any block (§12.1 step 6); front to back, a's block comes first
    a2, ta2 = ctx_case(215, BF16, 4096)
    b2, tb2 = ctx_case(216, BF16, 4096)
    a2, ta2, b2, tb2 = a2.reshape(64, 64), ta2.reshape(64, 64), b2.reshape(64, 64), tb2.reshape(64, 64)
    pa2, pb2 = previous_for(a2, ta2, 215, agree=0.95), previous_for(b2, tb2, 216, agree=0.95)
    two = assemble(split(write_history({"a": a2, "b": b2}, {"a": ta2, "b": tb2}, {"a": pa2, "b": pb2}),
                         block_records=True))
    assert [x[3] for x in _block_parts(two)] == [RH, RH]
    n("n_ctxrh_first_byte_then_previous_hash", "tensor a's ctx-delta-rh block starts with byte 1, and tensor b's "
      "previous value is one element off: random access checks b's previous step before any block is decoded "
      "(§12.1 step 6), streaming decodes a's block first (§12.2 step 3)", ["8.11", "12.1", "12.2", "12.3"],
      _restream(_coded_bytes(lambda d: bytes([1]) + bytes(d[1:])), two), "wrong_base", base_={"a": a2, "b": b2},
      previous_={"a": pa2, "b": _one_off(pb2)}, errors={"stream": "corrupt"})

    # -- a previous step given as a file that is not a valid base file (§1): wrong_base, when it is opened
    raw = prev.tobytes()
    entry = {"dtype": "BF16", "shape": [40, 50], "data_offsets": [0, len(raw)]}
    n("n_previous_file_short", "a previous file of 5 bytes: shorter than its 8-byte header length", ["1", "7"],
      good, "wrong_base", previous_=b"\x02\x00\x00\x00\x00")
    n("n_previous_file_header_not_json", "a previous file whose header is not JSON", ["1", "7"], good,
      "wrong_base", previous_=safetensors_bytes(b'{"x":', raw))
    n("n_previous_file_offsets_outside", "a previous file whose tensor's data_offsets end 2 bytes past its data "
      "section", ["1", "7"], good, "wrong_base",
      previous_=safetensors_bytes({"x": dict(entry, data_offsets=[2, len(raw) + 2])}, raw))
    extra = raw + b"\x01\x02"   # 4002 bytes for a BF16 [40, 50]; previous_hash their hash
    q = split(good)
    q.recs[1].payload = _retens(q.recs[1].payload, True, previous_hash=xxhash.xxh3_64_intdigest(extra))
    n("n_previous_file_size_mismatch", "a previous file whose tensor's data_offsets hold 4002 bytes where BF16 x "
      "[40, 50] is 4000 (the file's previous_hash is the hash of all 4002)", ["1", "7"], assemble(q),
      "wrong_base", previous_=safetensors_bytes({"x": dict(entry, data_offsets=[0, len(extra)])}, extra))
    n("n_previous_file_short_unused_history", "META has HISTORY but no tensor has it (y_history_unused), and the "
      "previous file given is 5 bytes: it is checked when it is opened, needed or not", ["1", "6"], unused,
      "wrong_base", base_=sb, previous_=b"\x02\x00\x00\x00\x00")
    n("n_previous_file_header_not_json_unused", "a file without HISTORY, and a previous file given whose header is "
      "not JSON: it is checked when it is opened, needed or not", ["1"], plain, "wrong_base", base_=sb,
      previous_=safetensors_bytes(b'{"x":', raw))
    n("n_previous_file_short_then_bad_magic", "a previous file of 5 bytes, and an arcfmt file whose magic is "
      "damaged: the previous file is checked when it is opened, before the arcfmt file is read (§1)", ["1", "4"],
      b"PK\x03\x04" + good[4:], "wrong_base", previous_=b"\x02\x00\x00\x00\x00")

    # -- TENS flag HISTORY (§7)

    def flag(q, i, bits):
        _, at = tens_fields_end(q.recs[i].payload)
        pl = bytearray(q.recs[i].payload)
        pl[at] |= bits
        q.recs[i].payload = bytes(pl)
    q = split(plain, block_records=True)
    flag(q, 1, L.TENS_HISTORY)
    n("n_tens_history_reserved", "TENS flag bit 2 (HISTORY) set in a file whose META lacks HISTORY: reserved there, "
      "and it brings no field", ["6", "7"], assemble(q), "reserved_bits", base_=sb, previous_=sp)
    q = split(norh)
    _meta_flags(q, clear=L.META_HISTORY)
    n("n_tens_history_field_without_meta_history", "META's HISTORY cleared in a file whose tensor carries "
      "HISTORY and previous_hash (its blocks ctx-delta-rc): bit 2 is reserved and brings no field, so 8 bytes "
      "are left over (corrupt), found before the reserved bit", ["6", "7"], assemble(q), "corrupt",
      base_={"x": nb}, previous_={"x": np_})
    kb = np.arange(12, dtype=np.float32).reshape(3, 4)
    kp = kb[::-1].copy()
    q = split(write_history({}, {"k": kb}, {"k": kp}), block_records=True)   # a keyframe, no base
    assert records.parse_meta(q.recs[0].payload).history

    def no_base(q, **kw):
        q.recs[1].payload = _retens(q.recs[1].payload, True, flags=L.TENS_HISTORY | kw.pop("more", 0),
                                    previous_hash=_hash(kp), **kw)
        return assemble(q)
    n("n_tens_history_without_needs_base", "a keyframe tensor (no NEEDS_BASE) with HISTORY and a previous_hash "
      "(the previous value given matches it)", ["7"], no_base(q), "corrupt", base_={}, previous_={"k": kp})
    q = split(write_history({}, {"k": kb}, {"k": kp}), block_records=True)
    n("n_tens_history_without_needs_base_then_unknown_dtype", "HISTORY without NEEDS_BASE, and dtype code 200: "
      "the flags are checked before the dtype code", ["7"], no_base(q, dtype=200), "corrupt", base_={},
      previous_={"k": kp})
    q = split(write_history({}, {"k": kb}, {"k": kp}), block_records=True)
    n("n_tens_reserved_then_history_without_needs_base", "TENS flag bit 3 (reserved) and HISTORY without "
      "NEEDS_BASE: reserved bits first", ["7"], no_base(q, more=0x08), "reserved_bits", base_={},
      previous_={"k": kp})
    q = split(good)
    _meta_flags(q, set_=1 << 31)
    n("n_reserved_meta_flags_with_history", "META flags HISTORY and bit 31 (reserved)", ["6"], assemble(q),
      "reserved_bits")
    # META has HISTORY and no previous step is given; tensor emb (no HISTORY) has a reserved flag, and
    # layers.0.w after it has HISTORY: the missing previous step is found at layers.0.w, not at META
    mbase, _, _, mdata = _multi_block_case()
    q = split(mdata)
    emb = next(i for i, r in enumerate(q.recs) if r.type == L.TENS and r.name == "emb")
    assert [h for _, h in _tens_history(q)] == [False, True]
    flag(q, emb, 0x08)
    n("n_reserved_tens_flags_then_previous_missing", "META has HISTORY and no previous step is given; the first "
      "tensor (no HISTORY) has TENS flag bit 3 set, the second has HISTORY: the previous step is looked for at "
      "the tensor that needs it, after the first tensor's checks", ["7", "12.3"], assemble(q), "reserved_bits",
      base_=mbase, previous_=None)

    # -- an inline ctx-delta-rh block: its checks (§8 checks 1-6) come with its TENS record's, before the
    # base and the previous step (§7, §12.1 step 6, §12.2 step 3)
    ib, itg = ctxas_case(194, BF16, (30, 40), by="rows")
    ip = previous_for(ib, itg, 194)
    inline = write_history({"x": ib}, {"x": itg}, {"x": ip}, force_encoding="ctx-delta-rh")
    q = split(inline)
    assert q.recs[1].encoding == RH

    def inline_again(src):
        """``src`` (its one block in a BLCK record) with that block inline again (1.6 framing)."""
        q = split(src)
        assert [r.type for r in q.recs[1:3]] == [L.TENS, L.BLCK]
        blk = q.recs.pop(2)
        _, at = read_varint(blk.payload, 0)
        _, at = read_varint(blk.payload, at)
        flag(q, 1, L.INLINE_BLOCK)
        q.recs[1].payload += blk.payload[at:]
        q.recs[1].encoding = blk.payload[at]
        q.header = q.header[:12] + u32(int.from_bytes(q.header[12:16], "little") | L.INLINE_BLOCKS)
        return assemble(q)
    assert inline_again(assemble(split(inline, block_records=True))) == inline
    n("n_inline_ctxrh_axis_then_previous_hash", "an inline ctx-delta-rh block with axis = 3, and the previous "
      "value one element off: the inline block's params are checked with its TENS record, before the previous "
      "step", ["7", "8.11", "12.3"], inline_again(_restream(_last_param(0, 3), assemble(split(inline,
                                                                                         block_records=True)))),
      "corrupt", base_={"x": ib}, previous_={"x": _one_off(ip)})
    q = split(inline)
    q.recs[1].payload = _retens(q.recs[1].payload, True, flags=L.NEEDS_BASE | L.INLINE_BLOCK, previous_hash=None)
    n("n_inline_ctxrh_without_history_then_wrong_base", "an inline ctx-delta-rh block in a tensor without "
      "HISTORY (META has it), and a base that does not match: §8 check 4 is among the inline block's checks, "
      "before the base", ["7", "8", "12.3"], assemble(q), "corrupt", base_={"x": _one_off(ib)},
      previous_={"x": ip})

    # -- ctx-delta-rh in a tensor without HISTORY (§8 check 4, R-CTXRH-TENSOR)
    def without_history(meta_too=False, src=good):
        q = split(src)
        q.recs[1].payload = _retens(q.recs[1].payload, True, flags=L.NEEDS_BASE, previous_hash=None)
        if meta_too:
            _meta_flags(q, clear=L.META_HISTORY)
        return assemble(q)
    n("n_ctxrh_without_history", "META has HISTORY, tensor x has none, and its block is ctx-delta-rh",
      ["7", "8"], without_history(), "corrupt")
    n("n_ctxrh_without_meta_history", "a file without HISTORY (META nor TENS) whose block is ctx-delta-rh",
      ["6", "8"], without_history(True), "corrupt")
    n("n_ctxrh_without_history_then_codec", "META has HISTORY, tensor x has none, and its ctx-delta-rh block's "
      "streams are of codec 9: check 4 comes before the codec ids (check 5)", ["7", "8"],
      without_history(src=_restream(_then_codec(lambda streams, params: None), good)), "corrupt")
    return V


# ---------------------------------------------------------------------- ctx-delta-rhp (1.10: §8.12)

def key_of(base, previous) -> np.ndarray:
    """§8.12's key field ``x'(i) = x(i) + 2^E · z(i)`` of every element (flat int64), ``z(i) = 1`` where §7's
    ``h(i)`` is not 0: computed here from §8.6's exponent field and :func:`history_of`, not by the
    encoder's class keys."""
    from arcfmt.encodings.ctx_delta import exponent_field
    adt = _adt(base)
    x = exponent_field(adt, base.view(adt.uint).reshape(-1)).astype(np.int64)
    return x + ((history_of(base, previous) != 0).astype(np.int64) << adt.exp_bits)


def previous_rhp(base, target, seed=0, idle=0.85, **kw):
    """:func:`previous_for`'s previous step (its history predicts the signs of most changes), where
    ``idle`` of the elements that do not change now did not move at the previous step either (h = 0):
    the elements that move are mostly those that moved, what ctx-delta-rhp's classes (§8.12) take."""
    prev = previous_for(base, target, seed, **kw)
    adt = _adt(base)
    bu, tu = base.view(adt.uint).reshape(-1), target.view(adt.uint).reshape(-1)
    pu = prev.view(adt.uint).reshape(-1).copy()
    keep = (bu == tu) & (rng(seed + 7100).random(bu.size) < idle)
    pu[keep] = bu[keep]
    return pu.view(base.dtype).reshape(base.shape)


def moving_again_case(seed, shape=(96, 128), active=0.08, again=0.7, fresh=0.004, back=0.6):
    """``(base, target, previous)`` like pure-BF16 training (§8.12 "Why"): a weight moves by one ulp once
    its update passes half an ulp, and updates change slowly, so the weights that moved at the previous
    step (``active`` of them, one ulp either way) move again (``again`` of them, ``back`` of those the
    way they came), the others seldom (``fresh``)."""
    from arcfmt.dtypes import from_numpy
    from arcfmt.encodings.ctx_delta import ordered, unordered
    adt = from_numpy(np.dtype(BF16))
    r = rng(seed)
    m = int(np.prod(shape))
    b = (r.standard_normal(m) * 0.02).astype(np.float32).astype(BF16)
    o = ordered(adt, b.view(np.uint16))
    act = r.random(m) < active
    came = r.choice([-1, 1], m)                       # the previous step's move: base = previous + came
    move = np.where(act, r.random(m) < again, r.random(m) < fresh)
    step = np.where(act, np.where(r.random(m) < back, -came, came), r.choice([-1, 1], m))
    t = unordered(adt, o + np.where(move, step, 0)).view(BF16)
    p = unordered(adt, o - np.where(act, came, 0)).view(BF16)
    return b.reshape(shape), t.reshape(shape), p.reshape(shape)


def _bit(data, i) -> int:
    return (data[i // 8] >> (i % 8)) & 1


def _rice_gaps(p, streams) -> list:
    """Each class's gaps (§8.6 steps 1 and 3) from a block's decoded quotient and remainder streams."""
    qs, run = [], 0
    for i in range(p.qbits):
        if _bit(streams[0], i):
            qs.append(run)
            run = 0
        else:
            run += 1
    assert len(qs) == p.changed
    out, at, i = [], 0, 0
    for ck, r in zip(p.counts, p.rice):
        g = []
        for _ in range(ck):
            g.append((qs[i] << r) + sum(_bit(streams[1], at + j) << j for j in range(r)))
            at, i = at + r, i + 1
        out.append(g)
    return out


def _rice_streams(gaps, rice) -> tuple[bytes, bytes, int]:
    """Streams 0 and 1 of §8.6 for each class's ``gaps`` and Rice parameters: ``(quotients, remainders,
    qbits)``."""
    qbits, rbits = [], []
    for g, r in zip(gaps, rice):
        for v in g:
            qbits += [0] * (v >> r) + [1]
            rbits += [(v >> j) & 1 for j in range(r)]

    def pack_bits(bits):
        out = bytearray((len(bits) + 7) // 8)
        for i, v in enumerate(bits):
            out[i // 8] |= v << (i % 8)
        return bytes(out)
    return pack_bits(qbits), pack_bits(rbits), len(qbits)


def _positions_of(p, gaps, key) -> np.ndarray | None:
    """The changed elements, in class order, that classes of the fields ``key`` (§8.6's classes, on
    whatever field a decoder compares) give these gaps; None where a class's last rank is not below its
    member count (§8.6 step 3: corrupt)."""
    cls = np.searchsorted(np.array(p.thresholds, np.int64), key, side="right")
    out = [np.empty(0, np.int64)]
    for k, g in enumerate(gaps):
        if g:
            members = np.flatnonzero(cls == k)
            ranks = np.cumsum(np.array(g, np.int64) + 1) - 1
            if ranks[-1] >= members.size:
                return None
            out.append(members[ranks])
    return np.concatenate(out)


def _first_beyond(p, gaps, key) -> int | None:
    """The first class whose last rank is not below its member count, with classes of the fields ``key``
    (None: every rank inside its class)."""
    cls = np.searchsorted(np.array(p.thresholds, np.int64), key, side="right")
    return next((k for k, g in enumerate(gaps) if g and sum(g) + len(g) - 1 >= (cls == k).sum()), None)


def _rhp_blocks(data):
    return [x for x in _block_parts(data) if x[3] == RHP]


# the wrong readings of §8.12's classes a ctx-delta-rhp vector must tell from the right one
RHP_WRONG = {"x", "neighbour", "inverted", "h = 1 only", "tensor offset", "byte offset", "float values", "bound"}


def assert_rhp_matters(data, base, target, previous):
    """Every ctx-delta-rhp block of ``data`` (tensors named by ``base``'s keys) is decoded right (the
    reference decoder, given the tensor's codes from the block's first element: mid-byte where the block
    starts there) and its positions read from its quotient and remainder streams with classes of the
    right key fields x' (§8.12); then with the classes a wrong decoder makes: of ``x`` (as ctx-delta-rh,
    z = 0), of z from the element before (``neighbour``), of ``1 - z`` (``inverted``), of z = 1 only
    where h = 1, of z from the tensor's first elements (``tensor offset``, a block after the first), from
    the elements at the start of the block's first code byte (``byte offset``: its history starting
    mid-byte), and from values compared as numbers (``float values``: ±0 equal, NaN unequal); and
    ``bound``: a last threshold above §8.6's ``2^E − 1``. A reading is told apart (returned) where a
    block's class ranks pass a member count (corrupt) or name another set of changed elements (the
    target is not rebuilt: every decoded step is non-zero). The reference decoder read as ctx-delta-rh
    (``x``) and with the tensor's first codes (``tensor offset``) must then fail or rebuild another block.
    Returns the readings told apart and the number of ctx-delta-rhp blocks."""
    from arcfmt.encodings import ctx_delta as ctx
    from arcfmt.errors import CorruptError
    from arcfmt.history import pack
    n, seen = 0, set()
    for th, _, b, _, params, streams in _rhp_blocks(data):
        be = th.block_elems
        bt, tt, pt = base[th.name], target[th.name], previous[th.name]
        adt = _adt(bt)
        big = 1 << adt.exp_bits
        bu, tu = bt.view(adt.uint).reshape(-1), tt.view(adt.uint).reshape(-1)
        s, e = b * be, min(bu.size, (b + 1) * be)
        hist = history_of(bt, pt)
        codes = pack(hist)
        x = ctx.exponent_field(adt, bu).astype(np.int64)
        z = (hist != 0).astype(np.int64)
        p = ctx.Params.unpack_rc(params)
        p.rh = p.rhp = True
        pos = np.flatnonzero(bu[s:e] != tu[s:e])
        gaps = _rice_gaps(p, streams)
        key = (x + z * big)[s:e]
        right = _positions_of(p, gaps, key)
        cls = np.searchsorted(np.array(p.thresholds, np.int64), key[pos], side="right")
        assert right is not None and (right == pos[np.argsort(cls, kind="stable")]).all()
        out = np.empty(e - s, adt.uint)
        ctx.decode(adt, p, streams, e - s, bu[s:e], out, None, (codes, s))
        assert (out == tu[s:e]).all()
        n += 1
        with np.errstate(invalid="ignore"):
            fb, fp = bt.reshape(-1).astype(np.float64), pt.reshape(-1).astype(np.float64)
        wrong = {"x": np.zeros(e - s, np.int64), "neighbour": np.roll(z, 1)[s:e], "inverted": 1 - z[s:e],
                 "h = 1 only": (hist[s:e] == 1).astype(np.int64), "float values": (fb != fp)[s:e].astype(np.int64)}
        if b:
            wrong["tensor offset"] = z[:e - s]
        if s % 4:
            wrong["byte offset"] = z[s - s % 4:e - s % 4]
        told = set()
        for what, zw in wrong.items():
            if (zw == z[s:e]).all():
                continue
            got = _positions_of(p, gaps, x[s:e] + zw * big)
            if got is None or got.size != pos.size or (np.sort(got) != pos).any():
                told.add(what)
        q = ctx.Params.unpack_rc(params)
        q.rh = True   # (q.rhp False: ctx-delta-rh's params and bound)
        try:
            ctx.stream_lengths(adt, q, e - s)
        except CorruptError:
            told.add("bound")
        else:
            assert p.thresholds[-1:] <= [big - 1]
        for what, rhp, at in (("x", False, s), ("tensor offset", True, 0)):
            if what not in told:
                continue
            q.rhp = rhp
            try:
                ctx.decode(adt, q, streams, e - s, bu[s:e], out, None, (codes, at))
            except CorruptError:
                continue
            assert (out != tu[s:e]).any(), f"{th.name} block {b}: a decoder with classes of {what} rebuilds it"
        seen |= told
    return seen, n


ONE_BLOCK_WRONG = ("x", "neighbour", "inverted", "h = 1 only")   # what every ctx-delta-rhp vector tells
MULTI_BLOCK_WRONG = (*ONE_BLOCK_WRONG, "tensor offset", "byte offset")   # ... and one whose blocks start mid-byte


def ctxrhp_valid_vectors():
    V = []
    from arcfmt.encodings import ctx_delta as ctx
    seen_all = set()

    # a one-tensor ``x`` vector given the previous step (default :func:`previous_rhp`), its file or the
    # writer's with ctx-delta-rhp forced; ``wrong``: the wrong readings of §8.12's classes it must tell
    y = _history_vector_maker(V, seen_all, "ctx-delta-rhp", ("7", "8.12"), previous_rhp, assert_rhp_matters,
                              ONE_BLOCK_WRONG)

    def thresholds(data):
        return [ctx.Params.unpack_rc(params).thresholds for *_, params, _ in _rhp_blocks(data)]

    # every dtype: two blocks, of 2049 and 2047 elements (the second's history from tensor element 2049,
    # inside a byte of the packed codes), the writer's thresholds on x' (effort max: its class DP's best;
    # 4096 elements: the writer forced to ctx-delta-rhp gives HISTORY only to tensors of 4096 or more)
    for i, (nm, dt) in enumerate(CTX_TYPES):
        b, t = ctxas_case(230 + i, dt, (64, 64))
        p = previous_rhp(b, t, 230 + i)
        _check_history_case(b, t, p)
        data = y(f"y_ctxrhp_{nm}", f"ctx-delta-rhp on {nm.upper()}, two blocks (block_elems 2049: the second's "
                 "history from tensor element 2049, mid-byte in the packed codes), the writer's thresholds on the key "
                 "fields x' = x + 2^E z: most elements that move now moved at the previous step; changes with h = "
                 "0, 1 and 2, steps across zero (±0 included), specials", b, t, previous=p, effort="max",
                 block_elems=2049, wrong=(*MULTI_BLOCK_WRONG, "bound"))
        top = (1 << _adt(b).exp_bits)
        assert len(thresholds(data)) == 2 and any(v >= top for ts in thresholds(data) for v in ts), \
            (nm, thresholds(data))
    # thresholds chosen by hand: below 2^E only (every element that moved in the last class), at 2^E (the
    # elements that moved above those that did not), above it, and the last at its bound 2^(E+1) - 1
    b, t = ctxas_case(240, BF16, (40, 75), by="rows")
    p = previous_rhp(b, t, 240)
    y("y_ctxrhp_thresholds_below_2e", "thresholds 112, 116, 119 (all below 2^E = 256): classes of x' put every "
      "element that moved at the previous step in the last class, classes of x do not", b, t, previous=p,
      data=rh_custom(b, t, p, 1, 75, thresholds=[112, 116, 119], rhp=True))
    y("y_ctxrhp_threshold_at_2e", "thresholds 112, 116, 256, 368, 372: T_3 = 2^E puts the elements that moved "
      "above those that did not, the last two split them by exponent again (classes 3-5 are empty of members "
      "to a decoder comparing x)", b, t, previous=p,
      data=rh_custom(b, t, p, 1, 75, thresholds=[112, 116, 256, 368, 372], rhp=True),
      wrong=(*ONE_BLOCK_WRONG, "bound"))
    y("y_ctxrhp_blocks_phase", "blocks of 701 elements (offsets 701, 1402, 2103, 2804: each block's history "
      "starts at another place in a code byte), thresholds 116, 256, 372, rows, streams zstd-coded", b, t,
      previous=p, data=rh_custom(b, t, p, 1, 75, thresholds=[116, 256, 372], codec="zstd", block_elems=701,
                                 rhp=True), wrong=(*MULTI_BLOCK_WRONG, "bound"))
    for i, (nm, dt) in enumerate((CTX_TYPES[0], CTX_TYPES[1], CTX_TYPES[3])):
        b, t = ctxas_case(245 + i, dt, (40, 75), by="rows")
        p = previous_rhp(b, t, 245 + i)
        e = _adt(b).exp_bits
        bu, pu = b.view(_adt(b).uint).reshape(-1), p.view(_adt(b).uint).reshape(-1).copy()
        top = (bu >> _adt(b).mant_bits & ((1 << e) - 1)) == (1 << e) - 1   # exponent field 2^E - 1
        pu[top] = bu[top] ^ 1   # (previous_for's previous value clipped at the ends of ord: equal to the base)
        p = pu.view(b.dtype).reshape(b.shape)
        kf = key_of(b, p)
        ch = bu != t.view(_adt(b).uint).reshape(-1)
        mid = max(1, int(np.median(kf[ch & (kf < 1 << e)])))
        ts = [mid, 1 << e, (1 << e) + mid, (1 << (e + 1)) - 1]
        assert 1 <= mid < (1 << e) - 1 and (ch & (kf == ts[-1])).sum() >= 2 and (~ch & (kf == ts[-1])).any()
        y(f"y_ctxrhp_threshold_top_{nm}", f"{nm.upper()}, thresholds {', '.join(map(str, ts))}: the last is "
          f"2^(E+1) - 1, its class the elements of exponent field 2^E - 1 (specials) that moved at the previous "
          f"step, some of which change (a decoder that keeps §8.6's bound 2^E - 1 refuses the params)", b, t,
          previous=p, data=rh_custom(b, t, p, 1, 75, thresholds=ts, rhp=True), wrong=(*ONE_BLOCK_WRONG, "bound"))
    # the writer's own choice: pure-BF16-like steps, where the elements that moved move again
    b, t, p = moving_again_case(250)
    data = write_history({"w": b}, {"w": t}, {"w": p}, block_elems=4099, effort="default")
    kinds = [enc for *_, enc, _, _ in _block_parts(data)]
    assert kinds == [RHP] * 3, kinds
    seen, n = assert_rhp_matters(data, {"w": b}, {"w": t}, {"w": p})
    assert n == 3 and set(MULTI_BLOCK_WRONG) <= seen, seen
    seen_all.update(seen)
    V.append(Vector("y_ctxrhp_chosen", "the writer's own choice (effort default) on pure-BF16-like steps: 8 % of "
                    "the weights moved one ulp at the previous step, 70 % of them move again, 0.4 % of the others; "
                    "three ctx-delta-rhp blocks of 4099 elements (histories from elements 4099 and 8198, mid-byte)",
                    ["7", "8.12", "18"], {"w": b}, data, expect_tensors={"w": t}, previous={"w": p}))
    # a one-block tensor: the block inline in its TENS record (1.6 framing), and the same block in a BLCK record
    b, t = ctxas_case(251, BF16, (64, 64), by="rows")
    _inline_pair(y, "y_ctxrhp", "ctx-delta-rhp", RHP, b, t, previous_rhp(b, t, 251))
    assert RHP_WRONG <= seen_all, RHP_WRONG - seen_all
    return V


def _rhp_fixture(seed=260):
    """The must-reject vectors' ctx-delta-rhp data: BF16 [40, 50], signs alike along rows, a previous
    step whose moves predict most changes (no specials: every step in range both ways)."""
    b, t = ctxas_case(seed, BF16, (40, 50), by="rows", specials=False)
    return b, t, previous_rhp(b, t, seed)


def ctxrhp_reject_vectors():
    """ctx-delta-rhp's params, positions and changes stream (§8.12: §8.9's checks with the last threshold
    up to 2^(E+1) - 1, on the classes of x'; R-CTXRHP-PARAMS, R-CTXRHP-CHANGES), and ctx-delta-rhp where
    the tensor has no HISTORY (§8 check 4, R-CTXRHP-TENSOR)."""
    V = []
    from arcfmt.encodings import ctx_delta as ctx
    from arcfmt.errors import CorruptError
    from arcfmt.history import pack
    b, t, prev = _rhp_fixture()
    base = {"x": b}
    ts = [112, 116, 256, 372]
    rows = rh_custom(b, t, prev, 1, 50, thresholds=ts, rhp=True)
    one = rh_custom(b, t, prev, 0, thresholds=[256], rhp=True)
    m = b.size
    one_row = rh_custom(b, t, prev, 1, m, thresholds=[256], rhp=True)
    adt = _adt(b)
    bu, tu = b.view(adt.uint).reshape(-1), t.view(adt.uint).reshape(-1)
    hist = history_of(b, prev)
    codes = (pack(hist), 0)

    def n(name, desc, fn, error="corrupt", src=None):
        V.append(Vector(name, desc, ["7", "8.12"], base, _restream(fn, src or rows), error=error,
                        previous={"x": prev}))

    def block(data):
        """The first block's params (unpacked) and decoded streams."""
        _, _, _, enc, params, streams = _block_parts(data)[0]
        assert enc == RHP
        p = ctx.Params.unpack_rc(params)
        p.rh = p.rhp = True
        return p, streams

    c = int((bu != tu).sum())
    _sign_axis_rejects(n, "n_ctxrhp", ("nbytes", "(W + 1) c + 9"), ctx.rc_limit(adt, c), m, one, one_row,
                       _all_ones_rc_bytes(adt, b, t, prev, [256]), "changes")
    n("n_ctxrhp_qbits_small", "qbits = c - 1: ctx-delta's checks come first (there is no mw param)",
      lambda streams, params: params.__setitem__(3 * params[0], c - 1))

    def recode(edit_d):
        return _rc_recode(b, t, edit_d, prev, rhp=True)
    _changes_rejects(n, "n_ctxrhp", "ctx-delta-rhp", recode)
    # the recoded blocks decode as the reference decoder reads them, up to the fault: the class order of x'
    p, streams = block(_restream(recode(lambda d, o: None), rows))
    out = np.empty(m, adt.uint)
    ctx.decode(adt, p, streams, m, bu, out, None, codes)
    assert (out == tu).all()

    # -- the last threshold past 2^(E+1) - 1: one more class, after the others, with no changes (and no
    # members, as its threshold is above every key field): a decoder that does not check the bound
    # decodes the block right
    def extra_class(top):
        def edit(streams, params):
            k = params[0]
            params[:] = [k + 1, *params[1:k], top, *params[k:2 * k], 0, *params[2 * k:3 * k], 0, *params[3 * k:]]
        return edit
    for nm, dt, seed in (("bf16", BF16, 261), ("f16", np.float16, 262), ("f8_e4m3", ml_dtypes.float8_e4m3fn, 263)):
        if dt is BF16:
            src, vb, vp, vt = rows, b, prev, t
        else:
            vb, vt, vp = _rhp_fixture_of(seed, dt)
            e = _adt(vb).exp_bits
            src = rh_custom(vb, vt, vp, 1, 50, thresholds=[(1 << e) - 2, 1 << e], rhp=True)
        top = 1 << (_adt(vb).exp_bits + 1)
        data = _restream(extra_class(top), src)
        _, _, _, _, params, streams = _block_parts(src)[0]
        extra_class(top)(None, params)
        p = ctx.Params.unpack_rc(params)
        p.rh = p.rhp = True
        vu = vb.view(_adt(vb).uint).reshape(-1)
        vo = np.empty(vu.size, _adt(vb).uint)
        ctx.decode(_adt(vb), p, streams, vu.size, vu, vo, None, (pack(history_of(vb, vp)), 0))
        assert (vo == vt.view(_adt(vb).uint).reshape(-1)).all()   # unchecked, the bound hides nothing else
        try:
            ctx.stream_lengths(_adt(vb), p, vu.size)
            raise AssertionError("the threshold passes")
        except CorruptError:
            pass
        V.append(Vector(f"n_ctxrhp_threshold_too_big_{nm}", f"{nm.upper()}: a last threshold 2^(E+1) = {top}, its "
                        "class empty (no changes, no members): every other field valid, a decoder that does not "
                        "check the bound rebuilds the target", ["7", "8.12"], {"x": vb}, data, error="corrupt",
                        previous={"x": vp}))
    n("n_ctxrhp_threshold_too_big_then_codec", "a last threshold 2^(E+1) = 512 (a class with no changes), and every "
      "stream of codec 9: the params come first", _then_codec(extra_class(512)))

    # -- a rank just past its class under x' (n_k of x' counts only the elements that moved, or only those that
    # did not), still inside the class to a decoder that compares x (n_k of x is larger)
    p, streams = block(rows)
    gaps = _rice_gaps(p, streams)
    key, x = key_of(b, prev), ctx.exponent_field(adt, bu).astype(np.int64)
    kk = max((k for k in range(p.classes) if gaps[k] and 0 < (np.searchsorted(ts, key, side="right") == k).sum()
              < (np.searchsorted(ts, x, side="right") == k).sum() - len(gaps[k])), key=lambda k: len(gaps[k]))
    n_k = int((np.searchsorted(ts, key, side="right") == kk).sum())
    last = sum(gaps[kk]) + len(gaps[kk]) - 1
    gaps[kk][-1] += n_k - last   # the class's last rank made n_k

    def to_class_end(streams, params):
        s0, s1, qbits = _rice_streams(gaps, p.rice)
        streams[0][1], streams[1][1] = s0, s1
        params[3 * params[0]] = qbits
    data = _restream(to_class_end, rows)
    q, st = block(data)
    assert _first_beyond(q, _rice_gaps(q, st), key) == kk and _first_beyond(q, _rice_gaps(q, st), x) != kk
    try:
        ctx.decode(adt, q, st, m, bu, out, None, codes)
        raise AssertionError("n_ctxrhp_rank_beyond_class decodes")
    except CorruptError as exc:
        assert "beyond" in str(exc), exc
    n_x = int((np.searchsorted(ts, x, side="right") == kk).sum())
    beyond_x = _first_beyond(q, _rice_gaps(q, st), x)
    V.append(Vector("n_ctxrhp_rank_beyond_class", f"thresholds {', '.join(map(str, ts))}: class {kk}'s last rank made "
                    f"{n_k}, its member count with classes of x' (those that did not move): beyond its class. A "
                    f"decoder comparing x finds it inside (n_{kk} = {n_x} there) and fails at class {beyond_x} "
                    f"instead (T_{beyond_x} = {ts[beyond_x - 1]}: no x reaches it)", ["7", "8.12"], base, data,
                    error="corrupt", previous={"x": prev}))

    # -- the block coded as ctx-delta-rh (classes of x, thresholds below 2^E), named ctx-delta-rhp: a decoder
    # that computes the classes from x rebuilds the target; read as §8.12 says, a class's ranks pass its
    # member count (of x': the elements that moved leave the classes below the last)
    rh = rh_custom(b, t, prev, 1, 50, thresholds=[112, 116, 119])
    pr = split(rh)
    set_first_encoding(pr, RHP)
    data = assemble(pr)
    q, st = block(data)
    assert _positions_of(q, _rice_gaps(q, st), key) is None
    q.rhp = False
    ctx.decode(adt, q, st, m, bu, out, None, codes)   # as ctx-delta-rh: the target
    assert (out == tu).all()
    q.rhp = True
    try:
        ctx.decode(adt, q, st, m, bu, out, None, codes)
        raise AssertionError("n_ctxrhp_coded_as_rh decodes")
    except CorruptError as exc:
        assert "beyond" in str(exc), exc
    V.append(Vector("n_ctxrhp_coded_as_rh", "a ctx-delta-rh block (thresholds 112, 116, 119) named ctx-delta-rhp: a "
                    "decoder that computes the classes from x rebuilds the target; with classes of x' (every element "
                    "that moved in the last class) a class's last rank is beyond its member count", ["8.12"], base,
                    data, error="corrupt", previous={"x": prev}))

    V.append(_on_f64("n_ctxrhp_on_f64", "ctx-delta-rhp", RHP, "8.12"))

    # -- ctx-delta-rhp in a tensor without HISTORY (§8 check 4, R-CTXRHP-TENSOR)
    def without_history(src, meta_too=False, inline=False):
        q = split(src)
        q.recs[1].payload = _retens(q.recs[1].payload, True, flags=L.NEEDS_BASE | (L.INLINE_BLOCK if inline else 0),
                                    previous_hash=None)
        if meta_too:
            _meta_flags(q, clear=L.META_HISTORY)
        return assemble(q)

    def nt(name, desc, covers, data, base_=base, previous_=None, **kw):
        V.append(Vector(name, desc, covers, base_, data, error="corrupt", previous={"x": prev} if previous_ is None
                        else previous_, **kw))
    nt("n_ctxrhp_without_history", "META has HISTORY, tensor x has none, and its block is ctx-delta-rhp",
       ["7", "8"], without_history(rows))
    nt("n_ctxrhp_without_meta_history", "a file without HISTORY (META nor TENS) whose block is ctx-delta-rhp",
       ["6", "8"], without_history(rows, True))
    nt("n_ctxrhp_without_history_then_codec", "META has HISTORY, tensor x has none, and its ctx-delta-rhp block's "
       "streams are of codec 9: check 4 comes before the codec ids (check 5)", ["7", "8"],
       without_history(_restream(_then_codec(lambda streams, params: None), rows)))
    ib, itg = ctxas_case(264, BF16, (64, 64), by="rows")
    ip = previous_rhp(ib, itg, 264)
    inline = write_history({"x": ib}, {"x": itg}, {"x": ip}, force_encoding="ctx-delta-rhp")
    assert split(inline).recs[1].encoding == RHP
    nt("n_inline_ctxrhp_without_history_then_wrong_base", "an inline ctx-delta-rhp block in a tensor without "
       "HISTORY (META has it), and a base that does not match: §8 check 4 is among the inline block's checks, "
       "before the base", ["7", "8", "12.3"], without_history(inline, inline=True), base_={"x": _one_off(ib)},
       previous_={"x": ip})
    return V


def _rhp_fixture_of(seed, dt):
    """:func:`_rhp_fixture` of another dtype."""
    b, t = ctxas_case(seed, dt, (40, 50), by="rows", specials=False)
    return b, t, previous_rhp(b, t, seed)


# ------------------------------------------------------------------------------------ dense-delta (§8.7)

def dense_case(seed, dt, m=4096, unchanged=0.1, specials=True):
    """``ctx_case``'s data where most elements change (a bias moving every step): all but about
    ``unchanged`` of the elements step by one to five units, across zero and binades too."""
    from arcfmt.dtypes import from_numpy
    from arcfmt.encodings.ctx_delta import ordered, unordered
    b, t = ctx_case(seed, dt, m, specials)
    r = rng(seed + 1000)
    adt = from_numpy(np.dtype(dt))
    u = b.view(adt.uint)
    half = 1 << (8 * np.dtype(dt).itemsize - 1)
    tv = t.view(adt.uint).copy()
    move = (r.random(m) >= unchanged) & (tv == u)
    v = np.clip(ordered(adt, u) + r.integers(1, 6, m) * r.choice([-1, 1], m), -half, half - 1)
    tv[move] = unordered(adt, v)[move]
    return b, tv.view(dt)


def dense_valid_vectors():
    V = []

    def y(name, desc, base, target, **kw):
        V.append(Vector(name, desc, ["8.7"], {"x": base}, write_separate({"x": base}, {"x": target},
                                                                      force_encoding="dense-delta", **kw),
                        expect_tensors={"x": target}))

    for i, (nm, dt) in enumerate(CTX_TYPES):
        b, t = dense_case(70 + i, dt)
        y(f"y_dense_{nm}", f"dense-delta on {nm.upper()}: most elements change, multi-step, specials",
          b, t, effort="max")
    b, t = dense_case(80, BF16, m=3000)
    y("y_dense_bf16_blocks_zstd", "dense-delta in blocks of 700 elements, streams zstd-coded", b, t,
      force_codec="zstd", block_elems=700)
    b, t = dense_case(81, BF16, m=64, unchanged=0, specials=False)
    assert (b.view(np.uint16) != t.view(np.uint16)).all()
    y("y_dense_all_changed", "every element changes: no unchanged positions, qbits = 0, streams 0 and 1 empty",
      b, t, force_codec="raw")
    r = rng(82)
    sb = (r.standard_normal(60000) * 0.02).astype(np.float32).astype(BF16)
    su = sb.view(np.uint16) + np.uint16(1)
    keep = np.sort(r.choice(60000, 12, replace=False))
    keep[-1] = 59999  # the last element unchanged: a gap that ends the block
    su[keep] = sb.view(np.uint16)[keep]
    y("y_dense_sparse_unchanged", "12 unchanged in 60000 elements, the last one among them: a large Rice "
      "parameter", sb, su.view(BF16), force_codec="raw")
    b, t = dense_case(83, BF16, m=3001, unchanged=0.45, specials=False)
    y("y_dense_half_changed", "about half the elements change: r = 0 or 1, gaps of every size", b, t,
      force_codec="raw")
    return V


def dense_reject_vectors():
    V = []
    from arcfmt.encodings import ctx_delta as ctx
    b, t = dense_case(90, BF16, m=2000, specials=False)
    base = {"x": b}
    dfile = write_separate(base, {"x": t}, force_encoding="dense-delta", force_codec="raw")
    m = b.size

    def n(name, desc, fn, error="corrupt", src=None):
        V.append(Vector(name, desc, ["8.7"], base, _restream(fn, src or dfile), error=error))

    C, R, Q, MW = range(4)  # dense-delta's params: c, r, qbits, mw

    def setp(i, v):
        def edit(streams, params):
            params[i] = v(params) if callable(v) else v
        return edit

    info = ctx.dense_unpack(records.parse_block(next(r for r in split(dfile).recs if r.type == L.BLCK).payload,
                                                records.parse_tensor(split(dfile).recs[1].payload, ""), 0, 0,
                                                "").params)
    u = m - info.changed
    assert info.qbits % 8 and info.changed % 8 and (u * info.rice[0]) % 8 and info.rice[0] >= 1
    n("n_dense_changed_zero", "c = 0", setp(C, 0))

    def all_unchanged(streams, params):  # c = 0 and streams that would say "nothing changed", all consistent
        params[:] = [0, 0, m, 1]
        streams[:] = [[0, b"\xff" * (m // 8)], [0, b""], [0, b""], [0, b""]]
    assert m % 8 == 0
    n("n_dense_changed_zero_all_unchanged", "c = 0 with every other param and stream consistent: m codes of "
      "gap 0 list every element as unchanged (only the c check refuses it)", all_unchanged)
    n("n_dense_changed_beyond_block", "c = m + 1", setp(C, m + 1))
    n("n_dense_rice_too_big", "a Rice parameter of 25", setp(R, 25))
    n("n_dense_qbits_below_unchanged", "qbits = u - 1 (u = m - c)", setp(Q, u - 1))
    n("n_dense_qbits_beyond_block", "qbits = m + 1", setp(Q, m + 1))
    n("n_dense_mag_width_zero", "magnitude width 0", setp(MW, 0))
    n("n_dense_mag_width_too_big", "magnitude width 3 on BF16", setp(MW, 3))

    n("n_dense_quotient_padding", "a padding bit set after the quotient codes", _set_pad(0))
    n("n_dense_remainder_padding", "a padding bit set after the remainder fields", _set_pad(1))
    n("n_dense_sign_padding", "a padding bit set after the sign bits", _set_pad(2))

    n("n_dense_quotient_extra_code", "one more 1 bit than u among the quotient bits", _extra_code)
    n("n_dense_quotient_unterminated", "bit qbits - 1 is not a terminating 1", setp(Q, lambda p: p[Q] + 1))
    every = dense_case(91, BF16, m=64, unchanged=0, specials=False)
    afile = write_separate({"x": every[0]}, {"x": every[1]}, force_encoding="dense-delta", force_codec="raw")

    def zero_bit(streams, params):
        params[Q] = 1
        streams[0][1] = b"\x00"
    V.append(Vector("n_dense_quotient_unterminated_all_changed", "u = 0 but qbits = 1: stream 0 holds one 0 "
                    "bit, no code (the count of 1 bits is right; the last bit is not a terminating 1)", ["8.7"],
                    {"x": every[0]}, _restream(zero_bit, afile), error="corrupt"))

    def beyond(streams, params):
        _code_beyond(streams, params, Q, params[R], m)
    n("n_dense_position_beyond_block", "the last unchanged position is past the end of the block (qbits "
      "still within m)", beyond)
    assert info.qbits + (m >> info.rice[0]) + 1 <= m

    def step_out(streams, params):
        _magnitude_out(streams, params, MW, params[C])
    n("n_dense_step_out_of_range", "a magnitude of 65535: the step leaves the BF16 range", step_out)

    n("n_dense_verification", "a well-formed dense-delta block that rebuilds a different tensor (one sign bit)",
      _wrong_sign, error="verification")

    def then_codec(i, v):
        def edit(streams, params):
            setp(i, v)(streams, params)
            for st in streams:
                st[0] = 9
        return edit
    def all_unchanged_then_codec(streams, params):
        all_unchanged(streams, params)
        streams[0][0] = 9
    n("n_dense_changed_zero_all_unchanged_then_codec", "c = 0 with every other param consistent, and stream 0 "
      "of codec 9: the params (check 1) come before the codec ids (check 5)", all_unchanged_then_codec)
    for vname, i, v, desc in (("n_dense_changed_then_codec", C, 0, "c = 0"),
                              ("n_dense_rice_then_codec", R, 25, "r = 25"),
                              ("n_dense_qbits_then_codec", Q, m + 1, "qbits > m"),
                              ("n_dense_mag_width_then_codec", MW, 3, "mw = 3 on BF16")):
        n(vname, desc + ", and every stream of codec 9: the params (check 1) come before the codec ids (check 5)",
          then_codec(i, v))
    f64 = np.arange(16, dtype=np.float64)
    f64t = f64 + 1
    pf = split(write_separate({"x": f64}, {"x": f64t}, force_encoding="float-delta", force_codec="raw"))
    set_first_encoding(pf, 6)
    V.append(Vector("n_dense_on_f64", "dense-delta is not defined for F64", ["8", "8.7"], {"x": f64}, assemble(pf),
                    error="unsupported"))
    return V


def object_vectors():
    o = stream_objects()
    V = [ObjectVector("y_stream_head", "a head pointer", ["S7"], "head", o["head"]),
         ObjectVector("y_stream_manifest_keyframe", "the manifest of a keyframe step", ["S6"], "manifest",
                      o["manifest_keyframe"]),
         ObjectVector("y_stream_manifest_delta", "the manifest of a delta step, 2 shards", ["S6"], "manifest",
                      o["manifest_delta"]),
         ObjectVector("y_stream_descriptor", "a shard descriptor", ["S5"], "descriptor", o["descriptor"])]

    def edit(kind, src, fn):
        obj = json.loads(o[src])
        fn(obj)
        return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode() + b"\n"

    def nv(name, desc, covers, kind, data, error):
        V.append(ObjectVector(name, desc, covers, kind, data, error))

    def obj_name(value):
        def f(m):
            m["shards"][0]["delta"]["name"] = value
        return f
    nv("n_stream_manifest_path_traversal", "a data object named ../../../etc/passwd", ["S3", "S13"], "manifest",
       edit("manifest", "manifest_delta", obj_name("../../../etc/passwd")), "corrupt")
    nv("n_stream_manifest_absolute_name", "a data object named with an absolute path", ["S3", "S13"], "manifest",
       edit("manifest", "manifest_delta", obj_name("/etc/passwd")), "corrupt")
    nv("n_stream_manifest_name_traversal_inside", "a name that climbs out of its step folder", ["S3", "S13"],
       "manifest", edit("manifest", "manifest_delta", obj_name(
           "steps/00000000000000000001/../../head.json")), "corrupt")
    nv("n_stream_manifest_other_step_name", "a well-formed name for another step", ["S3"], "manifest",
       edit("manifest", "manifest_delta", lambda m: m["shards"][0]["delta"].__setitem__(
           "name", m["shards"][0]["delta"]["name"].replace("00000000000000000001", "00000000000000000002", 1))),
       "corrupt")

    def file_traversal(m):
        m["shards"][0]["file"] = "../escape.safetensors"
    nv("n_stream_manifest_file_traversal", "a shard file name ../escape.safetensors", ["S3", "S13"], "manifest",
       edit("manifest", "manifest_delta", file_traversal), "corrupt")

    def base_after(m):
        m["base_step"] = 5
    nv("n_stream_manifest_base_after_step", "base_step after step", ["S6"], "manifest",
       edit("manifest", "manifest_delta", base_after), "corrupt")
    nv("n_stream_manifest_future_major", "version [2, 0]", ["S11"], "manifest",
       edit("manifest", "manifest_delta", lambda m: m.__setitem__("version", [2, 0])), "unsupported_version")
    nv("n_stream_head_future_major", "version [2, 0]", ["S11"], "head",
       edit("head", "head", lambda m: m.__setitem__("version", [2, 0])), "unsupported_version")
    nv("n_stream_head_float", "a float where an integer belongs", ["S2"], "head",
       o["head"].replace(b'"step":1', b'"step":1.0'), "corrupt")
    nv("n_stream_head_duplicate_key", "a key given twice", ["S2"], "head",
       o["head"].replace(b'"step":1', b'"step":1,"step":2'), "corrupt")
    nv("n_stream_head_too_large", "a head over its 4096-byte limit", ["S12"], "head",
       o["head"][:-2] + b',"x":"' + b"a" * 5000 + b'"}\n', "limit")
    nv("n_stream_head_keyframe_after_step", "keyframe_step after step", ["S7"], "head",
       edit("head", "head", lambda m: m.__setitem__("keyframe_step", 9)), "corrupt")
    nv("n_stream_head_not_json", "not JSON", ["S2"], "head", b"\x8aARC\r\n\x1a\n", "corrupt")
    nv("n_stream_head_deep_nesting", "an unknown key nesting 70 levels deep", ["S2"], "head",
       o["head"][:-2] + b',"zz":' + b"[" * 70 + b"]" * 70 + b"}\n", "corrupt")
    nv("n_stream_head_bom", "a UTF-8 byte order mark before the object", ["S2"], "head", b"\xef\xbb\xbf" + o["head"],
       "corrupt")
    nv("n_stream_head_version_shape", "version [1] instead of [major, minor]", ["S11"], "head",
       edit("head", "head", lambda m: m.__setitem__("version", [1])), "corrupt")
    nv("n_stream_manifest_upper_hex", "an object hash in upper-case hex", ["S2"], "manifest",
       edit("manifest", "manifest_delta", lambda m: m["shards"][0]["delta"].__setitem__(
           "xxh3_128", m["shards"][0]["delta"]["xxh3_128"].upper())), "corrupt")

    def dup_files(m):
        m["shards"][1]["file"] = m["shards"][0]["file"].upper().replace(".SAFETENSORS", ".safetensors")
    nv("n_stream_manifest_duplicate_files", "two shard file names equal but for case", ["S3"], "manifest",
       edit("manifest", "manifest_delta", dup_files), "corrupt")
    nv("n_stream_manifest_tensor_sum", "shard tensor counts that do not add up", ["S6"], "manifest",
       edit("manifest", "manifest_delta", lambda m: m.__setitem__("tensors", m["tensors"] + 1)), "corrupt")
    nv("n_stream_manifest_keyframe_step", "a keyframe manifest whose keyframe_step is not its step", ["S6"],
       "manifest", edit("manifest", "manifest_keyframe", lambda m: m.__setitem__("keyframe_step", 0) or
                        m.__setitem__("step", 3)), "corrupt")
    nv("n_stream_manifest_small_object", "a data object reference of 100 bytes (below 108)", ["S4"], "manifest",
       edit("manifest", "manifest_delta", lambda m: m["shards"][0]["delta"].__setitem__("size", 100)), "corrupt")
    nv("n_stream_manifest_index_offset", "an index offset past the end of its object", ["S4"], "manifest",
       edit("manifest", "manifest_delta", lambda m: m["shards"][0]["delta"].__setitem__(
           "index_offset", m["shards"][0]["delta"]["size"])), "corrupt")
    nv("n_stream_manifest_huge_tail", "an object of 2**63-1 bytes whose index starts at 52: a tail no INDX "
       "record can fill", ["S4", "S12"], "manifest",
       edit("manifest", "manifest_delta", lambda m: (m["shards"][0]["delta"].__setitem__("size", 2**63 - 1),
                                                     m["shards"][0]["delta"].__setitem__("index_offset", 52))),
       "limit")
    nv("n_stream_descriptor_no_objects", "a descriptor with neither a delta nor a keyframe", ["S5"], "descriptor",
       edit("descriptor", "descriptor", lambda m: (m.__setitem__("delta", None), m.__setitem__("keyframe", None))),
       "corrupt")
    nv("n_stream_descriptor_bad_writer", "a writer id with a space", ["S5"], "descriptor",
       edit("descriptor", "descriptor", lambda m: m.__setitem__("writer", "job 42")), "corrupt")
    nv("n_stream_descriptor_unknown_dtype", "a tensor of dtype F128", ["S5"], "descriptor",
       edit("descriptor", "descriptor", lambda m: m["tensors"][0].__setitem__(1, "F128")), "corrupt")
    V.append(ObjectVector("y_stream_head_unknown_key", "a key this version does not define is ignored", ["S2", "S11"],
                          "head", edit("head", "head", lambda m: m.__setitem__("zz_future", {"a": [1, 2]}))))
    nv("n_stream_descriptor_bad_hex", "a target digest that is not 32 hex digits", ["S5"], "descriptor",
       edit("descriptor", "descriptor", lambda m: m.__setitem__("target_digest", "xyz")), "corrupt")
    nv("n_stream_descriptor_control_char_name", "a tensor name with a newline", ["S5", "S13"], "descriptor",
       edit("descriptor", "descriptor", lambda m: m["tensors"][0].__setitem__(0, "bad\nname")), "corrupt")

    # -- issue 17: one vector per check of the independent decoder (python -m conformance mutate)
    nv("n_stream_head_nan", "NaN where an integer belongs", ["S2"], "head",
       o["head"].replace(b'"step":1', b'"step":NaN'), "corrupt")
    nv("n_stream_head_array", "a JSON array, not an object", ["S2"], "head", b"[1]\n", "corrupt")
    nv("n_stream_head_step_string", "step given as a string", ["S2", "S7"], "head",
       edit("head", "head", lambda m: m.__setitem__("step", "1")), "corrupt")
    nv("n_stream_head_negative_minor", "version [1, -1]", ["S11"], "head",
       edit("head", "head", lambda m: m.__setitem__("version", [1, -1])), "corrupt")
    nv("n_stream_manifest_format_number", "format given as a number", ["S2", "S6"], "manifest",
       edit("manifest", "manifest_delta", lambda m: m.__setitem__("format", 1)), "corrupt")
    nv("n_stream_manifest_keyframe_string", "keyframe given as a string", ["S2", "S6"], "manifest",
       edit("manifest", "manifest_delta", lambda m: m.__setitem__("keyframe", "no")), "corrupt")
    nv("n_stream_manifest_delta_number", "a shard's delta reference given as a number", ["S2", "S6"], "manifest",
       edit("manifest", "manifest_delta", lambda m: m["shards"][0].__setitem__("delta", 5)), "corrupt")
    nv("n_stream_manifest_shards_object", "shards given as an object", ["S2", "S6"], "manifest",
       edit("manifest", "manifest_delta", lambda m: m.__setitem__("shards", {})), "corrupt")
    nv("n_stream_manifest_no_shards", "shards an empty array", ["S6"], "manifest",
       edit("manifest", "manifest_delta", lambda m: m.__setitem__("shards", [])), "corrupt")
    nv("n_stream_manifest_file_number", "a shard file name given as a number", ["S3", "S6"], "manifest",
       edit("manifest", "manifest_delta", lambda m: m["shards"][0].__setitem__("file", 7)), "corrupt")
    nv("n_stream_manifest_file_too_long", "a shard file name of 201 bytes", ["S3"], "manifest",
       edit("manifest", "manifest_delta", lambda m: m["shards"][0].__setitem__("file", "a" * 189 + ".safetensors")),
       "corrupt")
    nv("n_stream_manifest_shard_number", "a shard entry given as a number", ["S6"], "manifest",
       edit("manifest", "manifest_delta", lambda m: m["shards"].__setitem__(0, 5)), "corrupt")
    nv("n_stream_manifest_shards_swapped", "the two shard entries in the wrong order", ["S6"], "manifest",
       edit("manifest", "manifest_delta", lambda m: m["shards"].reverse()), "corrupt")
    nv("n_stream_manifest_delta_missing", "a shard of a delta step without its delta reference", ["S6"], "manifest",
       edit("manifest", "manifest_delta", lambda m: m["shards"][0].__setitem__("delta", None)), "corrupt")
    nv("n_stream_manifest_base_manifest_null", "base_manifest null although base_step is given", ["S6"], "manifest",
       edit("manifest", "manifest_delta", lambda m: m.__setitem__("base_manifest", None)), "corrupt")
    nv("n_stream_descriptor_writer_number", "writer given as a number", ["S5"], "descriptor",
       edit("descriptor", "descriptor", lambda m: m.__setitem__("writer", 5)), "corrupt")
    nv("n_stream_descriptor_name_number", "a tensor name given as a number", ["S5"], "descriptor",
       edit("descriptor", "descriptor", lambda m: m["tensors"][0].__setitem__(0, 5)), "corrupt")
    nv("n_stream_descriptor_name_too_long", "a tensor name of 1025 bytes", ["S5", "S12"], "descriptor",
       edit("descriptor", "descriptor", lambda m: m["tensors"][0].__setitem__(0, "n" * 1025)), "limit")
    nv("n_stream_descriptor_name_surrogate", "a tensor name holding the escaped lone surrogate \\ud800", ["S2", "S5"],
       "descriptor", edit("descriptor", "descriptor", lambda m: m["tensors"][0].__setitem__(0, "w\ud800")), "corrupt")
    nv("n_stream_descriptor_entry_object", "a tensors entry given as an object", ["S5"], "descriptor",
       edit("descriptor", "descriptor", lambda m: m["tensors"].__setitem__(0, {})), "corrupt")
    nv("n_stream_descriptor_shape_17_dims", "a shape of 17 dimensions", ["S5"], "descriptor",
       edit("descriptor", "descriptor", lambda m: m["tensors"][0].__setitem__(2, [1] * 17)), "corrupt")
    nv("n_stream_descriptor_shape_negative", "a shape holding -1", ["S5"], "descriptor",
       edit("descriptor", "descriptor", lambda m: m["tensors"][0].__setitem__(2, [-1, 8])), "corrupt")
    nv("n_stream_descriptor_writer_float", "writer (a nullable field) given as 1.5", ["S2", "S5"], "descriptor",
       edit("descriptor", "descriptor", lambda m: m.__setitem__("writer", "@@W@@")).replace(b'"@@W@@"', b"1.5"),
       "corrupt")
    nv("n_stream_descriptor_writer_nan", "writer (a nullable field) given as NaN", ["S2", "S5"], "descriptor",
       edit("descriptor", "descriptor", lambda m: m.__setitem__("writer", "@@W@@")).replace(b'"@@W@@"', b"NaN"),
       "corrupt")
    nv("n_stream_manifest_keyframe_zero", "keyframe given as the integer 0 (not false)", ["S2", "S6"], "manifest",
       edit("manifest", "manifest_delta", lambda m: m.__setitem__("keyframe", 0)), "corrupt")
    nv("n_stream_manifest_no_shards_no_tensors", "shards an empty array and tensors 0", ["S6"], "manifest",
       edit("manifest", "manifest_delta", lambda m: (m.__setitem__("shards", []), m.__setitem__("tensors", 0))),
       "corrupt")

    def swap_shard_fields(m):
        m["shards"][0]["shard"], m["shards"][1]["shard"] = 1, 0
    nv("n_stream_manifest_shard_fields_swapped", "the shard fields of the two entries swapped (entries in place)",
       ["S6"], "manifest", edit("manifest", "manifest_delta", swap_shard_fields), "corrupt")
    # manifest relations (S6) are checked before the shard entries' references (S4); a reference whose tail no
    # INDX record can fill (limit) makes the order observable
    def huge_tail(ref):
        ref["size"], ref["index_offset"] = 2**63 - 1, 52

    def rel(fn, src="manifest_delta"):
        return edit("manifest", src, fn)
    nv("n_stream_manifest_base_after_step_then_tail", "base_step 5 after step 1, and a delta reference with a tail "
       "of 2^63 bytes (limit)", ["S4", "S6"], "manifest",
       rel(lambda m: (m.__setitem__("base_step", 5), huge_tail(m["shards"][0]["delta"]))), "corrupt")
    nv("n_stream_manifest_keyframe_step_then_tail", "a keyframe manifest of step 0 whose keyframe_step is 5, and a "
       "keyframe reference with a tail of 2^63 bytes", ["S4", "S6"], "manifest",
       rel(lambda m: (m.__setitem__("keyframe_step", 5), huge_tail(m["shards"][0]["keyframe"])), "manifest_keyframe"),
       "corrupt")
    nv("n_stream_manifest_neither", "base_step null and keyframe false: neither deltas nor keyframes", ["S6"],
       "manifest", rel(lambda m: (m.__setitem__("keyframe", False), m.__setitem__("keyframe_step", 5)),
                       "manifest_keyframe"), "corrupt")
    nv("n_stream_manifest_keyframe_step_after_base_then_tail", "keyframe_step 2 after base_step 0 (keyframe false), "
       "and a delta reference with a tail of 2^63 bytes", ["S4", "S6"], "manifest",
       rel(lambda m: (m.__setitem__("keyframe_step", 2), huge_tail(m["shards"][0]["delta"]))), "corrupt")

    def kf_given(m):
        kf = dict(m["shards"][0]["delta"])
        huge_tail(kf)
        m["shards"][0]["keyframe"] = kf
    nv("n_stream_manifest_unexpected_keyframe_then_tail", "a shard keyframe reference in a manifest whose keyframe "
       "is false (the reference's tail is 2^63 bytes)", ["S4", "S6"], "manifest", rel(kf_given), "corrupt")

    def delta_base_differs(m):
        m["step"] = 2
        for e in m["shards"]:
            e["delta"]["name"] = e["delta"]["name"].replace("00000000000000000001", "00000000000000000002", 1)
        m["shards"][0]["delta"]["base_step"] = 1
    nv("n_stream_manifest_delta_base_step", "a step-2 manifest with base_step 0 whose first delta reference says "
       "base_step 1", ["S4", "S6"], "manifest", rel(delta_base_differs), "corrupt")
    nv("n_stream_descriptor_duplicate_name", "one tensor listed twice", ["S5"], "descriptor",
       edit("descriptor", "descriptor", lambda m: m["tensors"].append(list(m["tensors"][0]))), "corrupt")
    # -- S2: large integers and nesting depth at their edges, lone surrogates by where they are
    def head_steps(step, kf):
        return edit("head", "head", lambda m: (m.__setitem__("step", step), m.__setitem__("keyframe_step", kf)))
    V.append(ObjectVector("y_stream_head_step_max", "step and keyframe_step 2^64 - 2, the largest step (beyond "
                          "signed 64-bit integers)", ["S1", "S2", "S7"], "head", head_steps(2**64 - 2, 2**64 - 2)))
    V.append(ObjectVector("y_stream_head_step_2_63", "step 2^63: one more than the largest signed 64-bit integer",
                          ["S2", "S7"], "head", head_steps(2**63, 0)))
    nv("n_stream_head_step_2_64_minus_1", "step 2^64 - 1 (the file format's 'no step'): out of range", ["S1", "S2"],
       "head", head_steps(2**64 - 1, 0), "corrupt")
    nv("n_stream_head_step_2_64", "step 2^64: out of range, not wrapped to 0", ["S2"], "head", head_steps(2**64, 0),
       "corrupt")
    nv("n_stream_head_keyframe_after_step_2_53", "step 2^53, keyframe_step 2^53 + 1: after the step, though a "
       "reader holding numbers as doubles sees them equal", ["S2", "S7"], "head", head_steps(2**53, 2**53 + 1),
       "corrupt")
    V.append(ObjectVector("y_stream_head_depth_64", "an unknown key whose value nests arrays to depth 64 in all "
                          "(the object is level 1)", ["S2"], "head",
                          o["head"][:-2] + b',"zz":' + b"[" * 63 + b"]" * 63 + b"}\n"))
    nv("n_stream_head_depth_65", "an unknown key whose value nests arrays to depth 65 in all", ["S2"], "head",
       o["head"][:-2] + b',"zz":' + b"[" * 64 + b"]" * 64 + b"}\n", "corrupt")
    V.append(ObjectVector("y_stream_head_unknown_key_lone_surrogate", "an unknown key whose value holds the "
                          "escaped lone surrogate \\ud800: ignored", ["S2", "S11"], "head",
                          o["head"][:-2] + b',"zz":"\\ud800"}\n'))
    V.append(ObjectVector("y_stream_descriptor_name_surrogate_pair", "a tensor name holding an escaped surrogate "
                          "pair (U+1F600), a valid character", ["S2", "S5"], "descriptor",
                          edit("descriptor", "descriptor", lambda m: m["tensors"][0].__setitem__(0, "w\U0001F600"))))
    # -- signed steps (S15): the signature object and the 1.1 SHA-256 fields
    V.append(ObjectVector("y_stream_signature", "the signature of a delta step (Ed25519, stream id run42)",
                          ["S15.2"], "signature", o["signature"]))
    V.append(ObjectVector("y_stream_manifest_sha256", "a delta manifest with the 1.1 SHA-256 fields (object sha256, "
                          "descriptor_sha256, base_manifest_sha256)", ["S6", "S15.3"], "manifest",
                          o["manifest_delta"]))

    def strip_sha(m):
        m.pop("base_manifest_sha256")
        for e in m["shards"]:
            e.pop("descriptor_sha256")
            e["delta"].pop("sha256")
    V.append(ObjectVector("y_stream_manifest_without_sha256", "a 1.0 manifest: the optional 1.1 SHA-256 fields absent",
                          ["S6", "S11", "S15.3"], "manifest", edit("manifest", "manifest_delta", strip_sha)))
    nv("n_stream_manifest_sha256_short", "an object sha256 of 63 hex digits", ["S4", "S15.3"], "manifest",
       edit("manifest", "manifest_delta", lambda m: m["shards"][0]["delta"].__setitem__(
           "sha256", m["shards"][0]["delta"]["sha256"][:63])), "corrupt")
    nv("n_stream_manifest_descriptor_sha256_upper", "a descriptor_sha256 in upper-case hex", ["S2", "S15.3"],
       "manifest", edit("manifest", "manifest_delta", lambda m: m["shards"][1].__setitem__(
           "descriptor_sha256", m["shards"][1]["descriptor_sha256"].upper())), "corrupt")
    nv("n_stream_manifest_base_sha256_null", "base_manifest_sha256 null although base_step is given",
       ["S6", "S15.3"], "manifest",
       edit("manifest", "manifest_delta", lambda m: m.__setitem__("base_manifest_sha256", None)), "corrupt")
    nv("n_stream_manifest_base_sha256_number", "base_manifest_sha256 an integer", ["S6", "S15.3"], "manifest",
       edit("manifest", "manifest_delta", lambda m: m.__setitem__("base_manifest_sha256", 7)), "corrupt")
    nv("n_stream_signature_short_hex", "a signature of 126 hex digits", ["S15.2"], "signature",
       edit("signature", "signature", lambda m: m.__setitem__("signature", m["signature"][:126])), "corrupt")
    nv("n_stream_signature_unknown_algorithm", "algorithm ed448", ["S15.2"], "signature",
       edit("signature", "signature", lambda m: m.__setitem__("algorithm", "ed448")), "corrupt")
    nv("n_stream_signature_upper_hex", "manifest_sha256 in upper-case hex", ["S2", "S15.2"], "signature",
       edit("signature", "signature", lambda m: m.__setitem__("manifest_sha256", m["manifest_sha256"].upper())),
       "corrupt")
    nv("n_stream_signature_missing_key_id", "no key_id field", ["S2", "S15.2"], "signature",
       edit("signature", "signature", lambda m: m.pop("key_id")), "corrupt")
    nv("n_stream_signature_key_id_long", "a key_id of 32 hex digits", ["S15.2"], "signature",
       edit("signature", "signature", lambda m: m.__setitem__("key_id", m["key_id"] * 2)), "corrupt")
    nv("n_stream_signature_bad_stream_id", "a stream id with a slash", ["S15.2"], "signature",
       edit("signature", "signature", lambda m: m.__setitem__("stream", "run/42")), "corrupt")
    nv("n_stream_signature_wrong_format", "the format string of a manifest", ["S15.2"], "signature",
       edit("signature", "signature", lambda m: m.__setitem__("format", "arcfmt-stream-manifest")), "corrupt")
    nv("n_stream_signature_too_large", "a signature object over its 64 KiB limit", ["S12", "S15.2"], "signature",
       o["signature"][:-2] + b',"zz":"' + b"a" * (64 << 10) + b'"}\n', "limit")
    # -- the object's own name (S2 check order, last): the step / shard / count in it equal the fields
    for vname, kind, src, name, desc in (
            ("n_stream_manifest_name_other_step", "manifest", "manifest_delta",
             "steps/00000000000000000002/manifest.json", "step 1's manifest read as step 2's"),
            ("n_stream_manifest_keyframe_name_other_step", "manifest", "manifest_keyframe",
             "steps/00000000000000000001/manifest.json", "step 0's manifest read as step 1's"),
            ("n_stream_descriptor_name_other_step", "descriptor", "descriptor",
             "steps/00000000000000000000/shard-00001-of-00002.json", "step 1's descriptor read as step 0's"),
            ("n_stream_descriptor_name_other_shard", "descriptor", "descriptor",
             "steps/00000000000000000001/shard-00000-of-00002.json", "shard 1's descriptor read as shard 0's"),
            ("n_stream_descriptor_name_other_count", "descriptor", "descriptor",
             "steps/00000000000000000001/shard-00001-of-00003.json", "a descriptor of shard 1 of 2 read as of 3"),
            ("n_stream_signature_name_other_step", "signature", "signature",
             "steps/00000000000000000002/signature.json", "step 1's signature read as step 2's")):
        V.append(ObjectVector(vname, desc + ": the object's fields disagree with the name it was read under",
                              ["S2", "S3", "S5" if kind == "descriptor" else "S6" if kind == "manifest" else "S15.2"],
                              kind, o[src], "corrupt", object_name=name))
    # -- more than MAX_DESCRIPTOR_TENSORS entries (about 3 MB: stored gzip-compressed, README). The count is
    # checked when the field is reached, before the entries (each [] is not a valid entry: corrupt after)
    V.append(ObjectVector("n_stream_descriptor_too_many_tensors", "a descriptor with 2^20 + 1 tensor entries "
                          "(each an empty array): the count limit comes before the entries' own checks",
                          ["S5", "S12"], "descriptor",
                          edit("descriptor", "descriptor", lambda d: d.__setitem__("tensors", [[]] * ((1 << 20) + 1))),
                          "limit", gz=True))
    return V


# ------------------------------------------------------------------------------------ rules (SPEC.md Appendix A)

RULES = [  # (vector name glob, rules or conditions it exercises: SPEC.md Appendix A and A.1)
    # -- inline blocks (1.6: §4, §7, §10)
    ("y_inline_*", ["R-INLINE.DECODE"]), ("n_inline_without_compact", ["R-INLINE.HEADER"]),
    ("n_flags_disagree_inline*", ["R-FLAGS-AGREE"]),
    ("n_tensor_hash_then_block_ordinal", ["R-TENSOR-HASH", "R-BLOCK-ORDINALS", "R-CHECK-ORDER", "R-BLOCK-FIRST"]),
    ("n_block_first_in_file_order*", ["R-BLOCK-FIRST", "R-CHECK-ORDER"]),
    ("n_inline_block_without_header_flag", ["R-PAYLOAD-EXACT.EXTRA"]),
    ("n_inline_reserved_tens_flag", ["R-TENS-FLAGS", "R-CHECK-ORDER"]),
    ("n_inline_tens_extra_bytes", ["R-PAYLOAD-EXACT.EXTRA"]),
    ("n_inline_two_blocks_then_unknown_encoding", ["R-INLINE.COUNT", "R-CHECK-ORDER"]),
    ("n_inline_block_missing", ["R-INLINE.BLOCK", "R-PAYLOAD-EXACT.SHORT"]),
    ("n_inline_unknown_encoding*", ["R-INLINE.BLOCK", "R-ENCODING.KNOWN"]),
    ("n_inline_encoding_not_index", ["R-INLINE.BLOCK", "R-BLOCK-ENCODING-INDEX"]),
    ("n_inline_needs_base", ["R-INLINE.BLOCK", "R-NO-BASE"]),
    ("n_inline_data_extra", ["R-INLINE.BLOCK", "R-BLOCK-LENGTHS"]),
    ("n_inline_unknown_codec", ["R-INLINE.BLOCK", "R-CODEC-ID"]),
    ("n_inline_*_then_wrong_base", ["R-CHECK-ORDER"]),
    ("n_inline_index_name_then_*", ["R-INDEX-NAME", "R-CHECK-ORDER"]),
    ("n_inline_duplicate_name_then_*", ["R-NAME-UNIQUE.TENS", "R-NAME-UNIQUE.INDEX", "R-CHECK-ORDER"]),
    ("n_inline_flag_with_record", ["R-INLINE.SIZE", "R-RECORD-ORDER.BLOCK-NOT-DUE"]),
    ("n_inline_index_size_zero_*", ["R-INLINE.SIZE"]), ("n_inline_size_zero_two_blocks_*", ["R-INLINE.SIZE"]),
    # -- dense-delta (§8.7)
    ("y_dense_*", ["R-DENSE"]), ("n_dense_changed_*", ["R-DENSE-PARAMS.C"]),
    ("n_dense_rice_*", ["R-DENSE-PARAMS.RICE"]), ("n_dense_qbits_*", ["R-DENSE-PARAMS.QBITS"]),
    ("n_dense_mag_width_*", ["R-DENSE-PARAMS.MW"]), ("n_dense_*_then_codec", ["R-CHECK-ORDER"]),
    ("n_dense_*_padding", ["R-BIT-PADDING"]), ("n_dense_quotient_extra_code", ["R-DENSE-QUOTIENTS.COUNT"]),
    ("n_dense_quotient_unterminated*", ["R-DENSE-QUOTIENTS.TERMINATED"]),
    ("n_dense_position_beyond_block", ["R-DENSE-RANK"]), ("n_dense_step_out_of_range", ["R-DENSE-STEP"]),
    ("n_dense_verification", ["R-TENSOR-HASH", "R-VERIFY-EVERY-PATH"]), ("n_dense_on_f64", ["R-ENCODING.DTYPE"]),
    # -- ctx-delta-rc (§8.9)
    ("y_ctxrc_*", ["R-CTXRC", "R-CTX"]), ("n_ctxrc_axis_*", ["R-CTXRC-PARAMS.AXIS"]),
    ("n_ctxrc_one_*", ["R-CTXRC-PARAMS.ONE"]), ("n_ctxrc_period_*", ["R-CTXRC-PARAMS.PERIOD"]),
    ("n_ctxrc_phase_*", ["R-CTXRC-PARAMS.PHASE"]), ("n_ctxrc_nbytes_*", ["R-CTXRC-PARAMS.NBYTES"]),
    ("n_ctxrc_*_then_codec", ["R-CHECK-ORDER"]), ("n_ctxrc_first_byte", ["R-CTXRC-CHANGES.FIRST"]),
    ("n_ctxrc_code_max", ["R-CTXRC-CHANGES.CODE"]), ("n_ctxrc_past_end", ["R-CTXRC-CHANGES.PAST-END"]),
    ("n_ctxrc_bytes_left", ["R-CTXRC-CHANGES.LENGTH"]), ("n_ctxrc_length_*", ["R-CTXRC-CHANGES.LONG"]),
    ("n_ctxrc_step_out_of_range*", ["R-CTXRC-CHANGES.STEP"]), ("n_ctxrc_qbits_*", ["R-CTX-PARAMS.QBITS"]),
    ("n_ctxrc_verification", ["R-TENSOR-HASH", "R-VERIFY-EVERY-PATH"]), ("n_ctxrc_on_f64", ["R-ENCODING.DTYPE"]),
    # -- ctx-delta-rh, HISTORY and the previous step (1.9: §1, §6, §7, §8.11, §12.3)
    ("y_ctxrh_*", ["R-CTXRH", "R-CTXRC", "R-CTX", "R-PREVIOUS"]), ("y_ctxrh_inline", ["R-INLINE.DECODE"]),
    ("y_ctxrh_multi_block", ["R-BLOCK-ORDINALS"]),
    ("y_history_*", ["R-META-FLAGS"]), ("y_history_no_rh_blocks", ["R-TENS-FLAGS", "R-PREVIOUS", "R-CTXRC"]),
    ("y_history_previous_extra", ["R-TENS-FLAGS", "R-PREVIOUS", "R-BASE-FILE"]),
    ("y_history_previous_not_needed", ["R-BASE-FILE"]), ("y_history_on_i32", ["R-TENS-FLAGS", "R-PREVIOUS", "R-XOR"]),
    ("n_ctxrh_axis_*", ["R-CTXRH-PARAMS"]), ("n_ctxrh_one_*", ["R-CTXRH-PARAMS"]),
    ("n_ctxrh_period_*", ["R-CTXRH-PARAMS"]), ("n_ctxrh_phase_*", ["R-CTXRH-PARAMS"]),
    ("n_ctxrh_nbytes_*", ["R-CTXRH-PARAMS"]), ("n_ctxrh_qbits_*", ["R-CTXRH-PARAMS", "R-CTX-PARAMS.QBITS"]),
    ("n_ctxrh_*_then_codec", ["R-CHECK-ORDER"]), ("n_ctxrh_first_byte*", ["R-CTXRH-CHANGES"]),
    ("n_ctxrh_code_max", ["R-CTXRH-CHANGES"]), ("n_ctxrh_past_end", ["R-CTXRH-CHANGES"]),
    ("n_ctxrh_bytes_left", ["R-CTXRH-CHANGES"]), ("n_ctxrh_length_*", ["R-CTXRH-CHANGES"]),
    ("n_ctxrh_step_out_of_range*", ["R-CTXRH-CHANGES"]), ("n_ctxrh_coded_as_rc", ["R-CTXRH", "R-CTXRH-CHANGES"]),
    ("n_ctxrh_verification", ["R-TENSOR-HASH", "R-VERIFY-EVERY-PATH"]), ("n_ctxrh_on_f64", ["R-ENCODING.DTYPE"]),
    ("n_ctxrh_without_*", ["R-CTXRH-TENSOR"]),
    # -- ctx-delta-rhp (1.10: §8.12)
    ("y_ctxrhp_*", ["R-CTXRHP", "R-CTXRH", "R-CTXRC", "R-CTX", "R-PREVIOUS"]), ("y_ctxrhp_inline", ["R-INLINE.DECODE"]),
    ("y_ctxrhp_threshold_top_*", ["R-CTXRHP-PARAMS"]),
    ("y_ctxrhp_chosen", ["R-BLOCK-ORDINALS"]), ("y_ctxrhp_blocks_phase", ["R-BLOCK-ORDINALS"]),
    ("n_ctxrhp_axis_*", ["R-CTXRHP-PARAMS"]), ("n_ctxrhp_one_*", ["R-CTXRHP-PARAMS"]),
    ("n_ctxrhp_period_*", ["R-CTXRHP-PARAMS"]), ("n_ctxrhp_phase_*", ["R-CTXRHP-PARAMS"]),
    ("n_ctxrhp_nbytes_*", ["R-CTXRHP-PARAMS"]), ("n_ctxrhp_qbits_*", ["R-CTXRHP-PARAMS", "R-CTX-PARAMS.QBITS"]),
    ("n_ctxrhp_threshold_too_big*", ["R-CTXRHP-PARAMS"]),
    ("n_ctxrhp_*_then_codec", ["R-CHECK-ORDER"]), ("n_ctxrhp_first_byte", ["R-CTXRHP-CHANGES"]),
    ("n_ctxrhp_code_max", ["R-CTXRHP-CHANGES"]), ("n_ctxrhp_past_end", ["R-CTXRHP-CHANGES"]),
    ("n_ctxrhp_bytes_left", ["R-CTXRHP-CHANGES"]), ("n_ctxrhp_length_*", ["R-CTXRHP-CHANGES"]),
    ("n_ctxrhp_step_out_of_range*", ["R-CTXRHP-CHANGES"]), ("n_ctxrhp_rank_beyond_class", ["R-CTXRHP-CHANGES"]),
    ("n_ctxrhp_coded_as_rh", ["R-CTXRHP", "R-CTXRHP-CHANGES"]),
    ("n_ctxrhp_verification", ["R-TENSOR-HASH", "R-VERIFY-EVERY-PATH"]), ("n_ctxrhp_on_f64", ["R-ENCODING.DTYPE"]),
    ("n_ctxrhp_without_*", ["R-CTXRHP-TENSOR"]),
    ("n_inline_ctxrhp_without_history_then_wrong_base", ["R-INLINE.BLOCK", "R-CTXRHP-TENSOR"]),
    ("n_ctxrh_first_byte_then_previous_hash", ["R-PREVIOUS.HASH", "R-CHECK-ORDER"]),
    ("n_previous_missing_*", ["R-PREVIOUS.PRESENT"]), ("n_previous_dtype", ["R-PREVIOUS.DTYPE"]),
    ("n_previous_shape", ["R-PREVIOUS.SHAPE"]), ("n_previous_hash*", ["R-PREVIOUS.HASH"]),
    ("n_previous_hash_then_*", ["R-CHECK-ORDER"]),
    ("n_previous_file_short*", ["R-BASE-FILE.FRAME"]), ("n_previous_file_header_not_json*", ["R-BASE-FILE.JSON"]),
    ("n_previous_file_offsets_outside", ["R-BASE-FILE.OFFSETS"]),
    ("n_previous_file_size_mismatch", ["R-BASE-FILE.SIZE"]), ("n_previous_file_*_then_*", ["R-CHECK-ORDER"]),
    ("n_tens_history_reserved", ["R-TENS-FLAGS"]),
    ("n_tens_history_field_without_meta_history", ["R-PAYLOAD-EXACT.EXTRA", "R-CHECK-ORDER"]),
    ("n_tens_history_without_needs_base*", ["R-TENS-HISTORY"]),
    ("n_tens_history_without_needs_base_then_*", ["R-CHECK-ORDER"]),
    ("n_tens_reserved_then_history_without_needs_base", ["R-TENS-FLAGS", "R-CHECK-ORDER"]),
    ("n_reserved_meta_flags_with_history", ["R-META-FLAGS"]),
    ("n_reserved_tens_flags_then_previous_missing", ["R-TENS-FLAGS", "R-CHECK-ORDER"]),
    ("n_inline_ctxrh_axis_then_previous_hash", ["R-INLINE.BLOCK", "R-CTXRH-PARAMS", "R-CHECK-ORDER"]),
    ("n_inline_ctxrh_without_history_then_wrong_base", ["R-INLINE.BLOCK", "R-CTXRH-TENSOR"]),
    # -- ctx-delta-rp (§8.10)
    ("y_ctxrp_*", ["R-CTXRP", "R-CTXRC", "R-CTX"]), ("n_ctxrp_axis_*", ["R-CTXRP-PARAMS.AXIS"]),
    ("n_ctxrp_one_*", ["R-CTXRP-PARAMS.ONE"]), ("n_ctxrp_period_*", ["R-CTXRP-PARAMS.PERIOD"]),
    ("n_ctxrp_phase_*", ["R-CTXRP-PARAMS.PHASE"]), ("n_ctxrp_nbytes_*", ["R-CTXRP-PARAMS.NBYTES"]),
    ("n_ctxrp_*_then_codec", ["R-CHECK-ORDER"]), ("n_ctxrp_first_byte", ["R-CTXRP-CHANGES.FIRST"]),
    ("n_ctxrp_code_max", ["R-CTXRP-CHANGES.CODE"]), ("n_ctxrp_past_end*", ["R-CTXRP-CHANGES.PAST-END"]),
    ("n_ctxrp_bytes_left", ["R-CTXRP-CHANGES.LENGTH"]), ("n_ctxrp_length_*", ["R-CTXRP-CHANGES.LONG"]),
    ("n_ctxrp_quotient_far*", ["R-CTXRP-CHANGES.FAR"]), ("n_ctxrp_rank_beyond_class", ["R-CTXRP-CHANGES.RANK"]),
    ("n_ctxrp_step_out_of_range*", ["R-CTXRP-CHANGES.STEP"]), ("n_ctxrp_rice_*", ["R-CTX-PARAMS.RICE"]),
    ("n_ctxrp_verification", ["R-TENSOR-HASH", "R-VERIFY-EVERY-PATH"]), ("n_ctxrp_on_f64", ["R-ENCODING.DTYPE"]),
    # -- ctx-delta-as (§8.8)
    ("y_ctxas_*", ["R-CTXAS", "R-CTX"]), ("n_ctxas_axis_*", ["R-CTXAS-PARAMS.AXIS"]),
    ("n_ctxas_one_*", ["R-CTXAS-PARAMS.ONE"]), ("n_ctxas_period_*", ["R-CTXAS-PARAMS.PERIOD"]),
    ("n_ctxas_phase_*", ["R-CTXAS-PARAMS.PHASE"]), ("n_ctxas_sbytes_*", ["R-CTXAS-PARAMS.SBYTES"]),
    ("n_ctxas_*_then_codec", ["R-CHECK-ORDER"]), ("n_ctxas_first_byte*", ["R-CTXAS-SIGNS.FIRST"]),
    ("n_ctxas_code_*", ["R-CTXAS-SIGNS.CODE"]), ("n_ctxas_past_end", ["R-CTXAS-SIGNS.PAST-END"]),
    ("n_ctxas_bytes_left", ["R-CTXAS-SIGNS.LENGTH"]), ("n_ctxas_rank_beyond_class", ["R-CTX-RANK"]),
    ("n_ctxas_step_out_of_range", ["R-CTX-STEP"]),
    ("n_ctxas_verification", ["R-TENSOR-HASH", "R-VERIFY-EVERY-PATH"]), ("n_ctxas_on_f64", ["R-ENCODING.DTYPE"]),
    # -- ctx-delta (§8.6)
    ("y_ctx_*", ["R-CTX"]), ("n_ctx_classes_*", ["R-CTX-CLASSES"]),
    ("n_ctx_threshold_zero*", ["R-CTX-PARAMS.T-MIN"]), ("n_ctx_thresholds_*", ["R-CTX-PARAMS.T-INCREASING"]),
    ("n_ctx_threshold_too_big*", ["R-CTX-PARAMS.T-MAX"]), ("n_ctx_changed_*", ["R-CTX-PARAMS.C"]),
    ("n_ctx_rice_*", ["R-CTX-PARAMS.RICE"]), ("n_ctx_qbits_*", ["R-CTX-PARAMS.QBITS"]),
    ("n_ctx_mag_width_*", ["R-CTX-PARAMS.MW"]), ("n_ctx_*_then_codec", ["R-CHECK-ORDER"]),
    ("n_ctx_*_padding", ["R-BIT-PADDING"]),
    ("n_ctx_quotient_extra_code", ["R-CTX-QUOTIENTS.COUNT"]),
    ("n_ctx_quotient_unterminated", ["R-CTX-QUOTIENTS.TERMINATED"]),
    ("n_ctx_rank_beyond_class", ["R-CTX-RANK"]), ("n_ctx_position_beyond_block", ["R-CTX-RANK"]),
    ("n_ctx_step_out_of_range*", ["R-CTX-STEP"]), ("n_ctx_verification", ["R-TENSOR-HASH", "R-VERIFY-EVERY-PATH"]),
    ("n_ctx_on_f64", ["R-ENCODING.DTYPE"]),
    # -- valid files
    ("y_bf16_*", ["R-DELTA"]), ("y_float_delta_*", ["R-DELTA", "R-DTYPE"]), ("y_xor_*", ["R-XOR", "R-DTYPE"]),
    ("y_keyframe_*", ["R-KEYFRAME", "R-DTYPE"]), ("y_unchanged", ["R-UNCHANGED"]),
    ("y_codec_raw", ["R-RAW"]), ("y_codec_zstd", ["R-ZSTD"]), ("y_codec_xz", ["R-XZ"]), ("y_codec_bz2", ["R-BZ2"]),
    ("y_zero_dim_at_elems_limit", ["R-ELEMS", "R-ELEMS-ZERO-DIM", "R-ELEMS-PARTIAL"]), ("y_empty_tensor", ["R-ELEMS"]),
    ("y_scalar", ["R-ELEMS"]),
    ("y_note_record", ["R-ANCILLARY"]), ("y_unknown_ancillary", ["R-ANCILLARY"]),
    ("y_multiblock", ["R-BLOCK-ORDINALS", "R-INDEX-TILING.CONTIGUOUS"]),
    ("y_multi_tensor", ["R-NAME", "R-TARGET-DIGEST"]),
    ("y_shape_and_dtype_change", ["R-NO-BASE", "R-KEYFRAME"]), ("y_name_c1_control", ["R-NAME"]),
    # -- header, size, trailer
    ("n_truncated_in_magic", ["R-SHORT.TRUNCATED"]), ("n_truncated_after_header", ["R-MIN-SIZE"]),
    ("n_truncated_in_meta_header", ["R-MIN-SIZE"]), ("n_truncated_after_meta", ["R-MIN-SIZE"]),
    ("n_truncated_*", ["R-TRAILER-MAGIC", "R-RECORD-PRESENT"]), ("n_empty_file", ["R-SHORT.TRUNCATED"]),
    ("n_bad_magic_short", ["R-SHORT.BAD-MAGIC"]), ("n_bad_magic*", ["R-MAGIC"]), ("n_future_major", ["R-MAJOR"]),
    ("n_header_future_major", ["R-MAJOR", "R-CHECK-ORDER"]),
    ("n_reserved_header_flags", ["R-HEADER-FLAGS"]),
    ("y_compact_index_*", ["R-INDEX-COMPACT"]), ("y_full_index", ["R-INDEX-TILING", "R-RECORD-LOCATED"]),
    ("n_compact_other_*", ["R-INDEX-COMPACT.OTHER"]), ("n_compact_others_*", ["R-INDEX-COMPACT.OTHER"]),
    ("n_compact_end_*", ["R-INDEX-COMPACT.END"]), ("n_flags_disagree_*", ["R-FLAGS-AGREE"]),
    ("n_compact_*_then_trailer_checksum", ["R-TRAILER-CHECKSUM", "R-CHECK-ORDER"]),
    ("n_compact_limit_block_count", ["R-INDEX-COUNTS.BLOCKS"]),
    ("n_target_digest_then_block_ordinal", ["R-DIGEST-EARLY", "R-TARGET-DIGEST", "R-CHECK-ORDER"]),
    ("n_index_others_out_of_order", ["R-INDEX-ORDER.OTHER"]),
    ("n_compact_sizes_shifted", ["R-RECORD-LOCATED.HEADER", "R-STREAM-CROSSCHECK.BLCK"]),
    ("n_compact_adjacent_tens_sizes", ["R-RECORD-LOCATED.HEADER", "R-STREAM-CROSSCHECK.TENS"]),
    ("n_reserved_trailer_flags", ["R-TRAILER-FLAGS"]),
    ("n_version_mismatch", ["R-VERSIONS-AGREE"]), ("n_trailer_checksum", ["R-TRAILER-CHECKSUM"]),
    ("n_trailer_bad_index_offset", ["R-TRAILER-OFFSETS.END"]), ("n_trailer_future_major", ["R-TRAILER-MAJOR"]),
    ("n_trailer_index_size_small*", ["R-TRAILER-OFFSETS.INDEX-SIZE"]),
    ("n_trailer_index_offset_low*", ["R-TRAILER-OFFSETS.INDEX-OFFSET"]),
    ("n_trailer_index_offset_shifted", ["R-TRAILER-OFFSETS.END", "R-RECORD-LOCATED.HEADER", "R-STREAM-TRAILER-INDEX"]),
    ("n_data_after_trailer_random", ["R-TRAILER-MAGIC"]), ("n_data_after_trailer_stream", ["R-STREAM-END"]),
    # -- records
    ("n_reserved_meta_flags", ["R-META-FLAGS"]), ("n_reserved_tens_flags", ["R-TENS-FLAGS"]),
    ("y_prefixed_names", ["R-NAME-PREFIX", "R-NAME", "R-INDEX-NAME"]), ("y_whole_names", ["R-NAME"]),
    ("n_name_prefix_first", ["R-NAME-PREFIX.FIRST"]), ("n_name_prefix_longer", ["R-NAME-PREFIX.LONGER"]),
    ("n_name_prefix_limit*", ["R-NAME-LIMIT"]), ("n_name_prefix_joined_reserved", ["R-NAME-RESERVED"]),
    ("n_stream_names_past_index_limit", ["R-STREAM-NAMES"]),
    ("n_record_checksum", ["R-RECORD-CHECKSUM"]), ("n_unknown_critical_record", ["R-CRITICAL"]),
    ("n_record_type_not_letters*", ["R-RECORD-TYPE"]), ("n_*_then_wrong_base", ["R-CHECK-ORDER"]),
    ("n_wrong_base_then_*", ["R-CHECK-ORDER", "R-BASE.HASH"]),
    ("n_first_record_not_meta*", ["R-RECORD-ORDER.FIRST-META"]),
    ("n_meta_replaced_by_note", ["R-RECORD-ORDER.FIRST-META"]),
    ("n_second_meta*", ["R-RECORD-ORDER.ONE-META"]),
    ("n_tens_while_blocks_due*", ["R-RECORD-ORDER.BLOCKS-DUE", "R-INDEX-ORDER.BLCK"]),
    ("n_missing_block", ["R-INDEX-BLOCK-COUNTS.TENS", "R-RECORD-ORDER.BLOCKS-DUE"]),
    ("n_block_not_due", ["R-RECORD-ORDER.BLOCK-NOT-DUE", "R-INDEX-BLOCK-COUNTS.TENS"]),
    ("n_unknown_critical_first", ["R-CRITICAL"]),
    ("n_tens_payload_short", ["R-PAYLOAD-EXACT.SHORT"]), ("n_varint_truncated", ["R-PAYLOAD-EXACT.SHORT"]),
    ("n_tens_extra_bytes", ["R-PAYLOAD-EXACT.EXTRA"]), ("n_meta_size", ["R-PAYLOAD-EXACT.EXTRA"]),
    ("n_block_extra_bytes", ["R-BLOCK-LENGTHS", "R-PAYLOAD-EXACT.EXTRA"]),
    ("n_block_extra_bytes_then_window", ["R-BLOCK-LENGTHS", "R-CHECK-ORDER"]),
    ("n_varint_not_minimal", ["R-VARINT.MINIMAL"]), ("n_varint_2_64", ["R-VARINT.RANGE"]),
    ("n_varint_11_bytes", ["R-VARINT.LENGTH"]),
    # -- TENS
    ("n_limit_name_length", ["R-NAME-LIMIT"]), ("n_limit_ndim", ["R-NDIM"]),
    ("n_limit_block_elems", ["R-BLOCK-ELEMS.LIMIT"]), ("n_block_elems_zero", ["R-BLOCK-ELEMS.ZERO"]),
    ("n_limit_tensor_elems", ["R-ELEMS"]), ("n_limit_blocks_per_tensor", ["R-BLOCKS"]),
    ("n_limit_zero_dim_*", ["R-ELEMS-ZERO-DIM"]), ("n_limit_zero_dim_elems_wrap", ["R-ELEMS-PARTIAL"]),
    ("n_limit_tensor_elems_wrap", ["R-ELEMS", "R-ELEMS-PARTIAL"]),
    ("n_unknown_dtype", ["R-DTYPE"]),
    ("n_name_invalid_utf8*", ["R-NAME.UTF8"]), ("n_name_control_char", ["R-NAME.CONTROL"]),
    ("n_name_delete_char", ["R-NAME.CONTROL"]), ("n_name_nul", ["R-NAME.CONTROL"]),
    ("n_name_empty*", ["R-NAME.EMPTY"]), ("n_name_surrogate", ["R-NAME.SURROGATE"]),
    ("n_name_overlong", ["R-NAME.OVERLONG"]), ("n_name_reserved", ["R-NAME-RESERVED"]),
    ("n_delta_without_base_flag", ["R-NO-BASE"]),
    ("n_duplicate_names", ["R-NAME-UNIQUE.INDEX"]), ("n_duplicate_tens_names*", ["R-NAME-UNIQUE.TENS"]),
    # -- BLCK
    ("n_block_ordinal_mismatch", ["R-BLOCK-ORDINALS"]),
    ("n_unknown_encoding", ["R-ENCODING.KNOWN"]), ("n_encoding_dtype_mismatch", ["R-ENCODING.DTYPE"]),
    ("n_bf16_delta_on_f16", ["R-ENCODING.DTYPE"]),
    ("n_changed_count_*", ["R-DELTA-PARAMS.C"]), ("n_exception_count_*", ["R-DELTA-PARAMS.E"]),
    ("n_*_then_unknown_codec", ["R-CHECK-ORDER"]), ("n_unknown_codec_before_lengths", ["R-CODEC-ID", "R-CHECK-ORDER"]),
    ("n_position_beyond_block", ["R-POSITIONS"]), ("n_step_zero", ["R-STEP.ZERO"]),
    ("n_step_out_of_range", ["R-STEP.RANGE"]), ("n_exception_keeps_exponent", ["R-EXCEPTION-VALUE"]),
    ("n_exception_index_beyond_changed", ["R-EXCEPTION-INDEX"]),
    ("n_keyframe_field_out_of_range", ["R-KEYFRAME-RANGE.EXPONENT"]),
    ("n_keyframe_sign_mantissa_out_of_range", ["R-KEYFRAME-RANGE.SIGN-MANTISSA"]),
    ("n_verification", ["R-TENSOR-HASH", "R-VERIFY-EVERY-PATH"]),
    ("n_verification_then_wrong_base", ["R-TENSOR-HASH", "R-VERIFY-EVERY-PATH"]),
    # -- codecs
    ("n_zstd_bomb", ["R-ZSTD.CONTENT-SIZE", "R-BOMB"]), ("n_zstd_no_content_size*", ["R-ZSTD.CONTENT-SIZE"]),
    ("n_zstd_content_size_*", ["R-ZSTD.CONTENT-SIZE"]), ("n_zstd_short_output", ["R-ZSTD.CONTENT-SIZE"]),
    ("n_zstd_two_frames", ["R-ZSTD.ONE-FRAME"]), ("n_zstd_dictionary*", ["R-ZSTD.DICTIONARY"]),
    ("n_zstd_bad_magic*", ["R-ZSTD.MAGIC"]), ("n_zstd_header_*", ["R-ZSTD.HEADER"]),
    ("n_zstd_reserved_bit*", ["R-ZSTD.RESERVED-BIT"]), ("n_zstd_reserved_block_type", ["R-ZSTD.BLOCKS"]),
    ("n_zstd_block_header_cut", ["R-ZSTD.BLOCKS"]), ("n_zstd_raw_block_too_long", ["R-ZSTD.BLOCKS", "R-BOMB"]),
    ("n_zstd_cut_short", ["R-ZSTD.BLOCKS"]), ("n_zstd_checksum_cut", ["R-ZSTD.CHECKSUM"]),
    ("n_zstd_bad_content_checksum", ["R-ZSTD.CHECKSUM"]), ("n_zstd_*_then_window", ["R-CHECK-ORDER"]),
    ("n_zstd_window_too_large", ["R-ZSTD-WINDOW"]),
    ("n_xz_bomb", ["R-XZ.LENGTH", "R-BOMB"]), ("n_xz_memory_limit", ["R-XZ-MEMORY"]),
    ("n_xz_dictionary_over_limit", ["R-XZ-MEMORY"]), ("n_xz_structure_*", ["R-XZ.VALID", "R-CHECK-ORDER"]),
    ("n_meta_typed_note", ["R-RECORD-LOCATED.HEADER", "R-RECORD-ORDER.FIRST-META"]),
    ("n_base_file_short", ["R-BASE-FILE.FRAME"]), ("n_base_file_header_length*", ["R-BASE-FILE.FRAME"]),
    ("n_base_file_header_not_*", ["R-BASE-FILE.JSON"]), ("n_base_file_header_bom", ["R-BASE-FILE.JSON"]),
    ("n_base_file_header_utf16", ["R-BASE-FILE.JSON"]), ("n_base_file_metadata*", ["R-BASE-FILE.ENTRIES"]),
    ("n_base_file_shape_not_array", ["R-BASE-FILE.ENTRIES"]),
    ("n_base_file_entry", ["R-BASE-FILE.ENTRIES"]), ("n_base_file_offsets_outside*", ["R-BASE-FILE.OFFSETS"]),
    ("n_base_file_size_mismatch", ["R-BASE-FILE.SIZE"]),
    ("n_stream_*_name_other_*", ["R-S-NAMES.OWN"]), ("n_stream_descriptor_too_many_tensors", ["R-S-LIMITS"]),
    ("n_xz_block_header_crc", ["R-XZ.VALID"]), ("y_xz_dictionary_at_limit", ["R-XZ-MEMORY"]),
    ("n_xz_garbage", ["R-XZ.VALID"]), ("n_xz_cut", ["R-XZ.VALID"]), ("n_xz_empty", ["R-XZ.VALID"]),
    ("n_xz_short_output", ["R-XZ.LENGTH"]), ("n_xz_trailing_data", ["R-XZ.ONE-STREAM"]),
    ("n_bz2_bomb", ["R-BZ2.LENGTH", "R-BOMB"]), ("n_bz2_garbage", ["R-BZ2.VALID"]), ("n_bz2_cut", ["R-BZ2.VALID"]),
    ("n_bz2_short_output", ["R-BZ2.LENGTH"]), ("n_bz2_trailing_data", ["R-BZ2.ONE-STREAM"]),
    ("n_raw_length_mismatch", ["R-RAW"]), ("n_unknown_codec", ["R-CODEC-ID"]),
    ("n_empty_stream_not_raw", ["R-ZSTD.MAGIC"]), ("n_empty_stream_zstd_frame", ["R-EMPTY-STREAM.CODEC"]),
    ("n_empty_stream_raw_bytes", ["R-EMPTY-STREAM.STORED"]),
    # -- index
    ("n_limit_record_payload", ["R-RECORD-LIMIT"]), ("n_limit_index_body", ["R-INDEX-LIMIT"]),
    ("n_limit_tensor_count", ["R-INDEX-COUNTS.TENSORS"]), ("n_limit_other_count", ["R-INDEX-COUNTS.OTHERS"]),
    ("n_index_overlap", ["R-INDEX-TILING.CONTIGUOUS"]), ("n_index_gap", ["R-INDEX-TILING.CONTIGUOUS"]),
    ("n_index_offset_out_of_range", ["R-INDEX-TILING.CONTIGUOUS"]),
    ("n_index_tiling_end*", ["R-INDEX-TILING.END"]),
    ("n_index_order*", ["R-INDEX-ORDER.BLCK"]), ("n_index_tens_order*", ["R-INDEX-ORDER.TENS"]),
    ("n_index_checksum_mismatch", ["R-RECORD-LOCATED.CHECKSUM", "R-STREAM-CROSSCHECK.BLCK"]),
    ("n_index_tens_checksum_mismatch", ["R-RECORD-LOCATED.CHECKSUM", "R-STREAM-CROSSCHECK.TENS"]),
    ("n_index_encoding_mismatch", ["R-BLOCK-ENCODING-INDEX", "R-STREAM-CROSSCHECK.BLCK"]),
    ("n_index_name_mismatch", ["R-INDEX-NAME", "R-STREAM-CROSSCHECK.TENS"]),
    ("n_index_other_type_reserved", ["R-INDEX-OTHER-TYPES.CORE"]),
    ("n_index_other_type_not_letters", ["R-INDEX-OTHER-TYPES.LETTERS"]),
    ("n_index_other_type_mismatch", ["R-INDEX-OTHER-HEADERS.TYPE", "R-STREAM-CROSSCHECK.OTHER"]),
    ("n_index_lists_tens_as_other", ["R-INDEX-OTHER-HEADERS.TYPE", "R-STREAM-CROSSCHECK.TENS"]),
    ("n_index_lists_blck_as_other", ["R-INDEX-OTHER-HEADERS.TYPE", "R-STREAM-CROSSCHECK.BLCK"]),
    ("n_index_hides_critical_record", ["R-INDEX-OTHER-HEADERS.TYPE", "R-CRITICAL"]),
    ("n_other_header_limit", ["R-INDEX-OTHER-HEADERS.LIMIT"]),
    ("n_other_header_length_mismatch", ["R-INDEX-OTHER-HEADERS.LENGTH"]),
    ("n_index_block_counts", ["R-INDEX-BLOCK-COUNTS.SUM"]), ("n_index_block_counts_wrap", ["R-INDEX-BLOCK-COUNTS.SUM"]),
    ("n_index_record_size*", ["R-INDEX-SIZES.MIN"]), ("n_index_other_size_big", ["R-INDEX-SIZES.MAX"]),
    ("n_index_extra_bytes", ["R-INDEX-EXACT.EXTRA"]), ("n_index_column_short", ["R-INDEX-EXACT.COLUMNS"]),
    ("n_index_block_count_wrap", ["R-INDEX-EXACT.COLUMNS"]),
    ("n_index_unknown_codec", ["R-INDEX-CODEC"]), ("n_index_name_too_long", ["R-NAME-LIMIT"]),
    # -- digests, base
    ("n_target_digest_mismatch", ["R-TARGET-DIGEST", "R-VERIFY-EVERY-PATH"]),
    ("n_base_digest_mismatch", ["R-BASE-DIGEST", "R-VERIFY-EVERY-PATH"]),
    ("n_wrong_base_values", ["R-BASE.HASH"]), ("n_wrong_base_dtype", ["R-BASE.DTYPE"]),
    ("n_wrong_base_shape", ["R-BASE.SHAPE"]), ("n_wrong_base_missing", ["R-BASE.PRESENT"]),
    # -- stream objects (Part II)
    ("y_stream_*", ["R-S-OBJECTS"]), ("n_stream_*traversal*", ["R-S-NAMES.OBJECT"]),
    ("n_stream_*absolute*", ["R-S-NAMES.OBJECT"]), ("n_stream_manifest_other_step_name", ["R-S-NAMES.OBJECT"]),
    ("n_stream_manifest_file_traversal", ["R-S-NAMES.FILE"]), ("n_stream_manifest_file_*", ["R-S-NAMES.FILE"]),
    ("n_stream_manifest_duplicate_files", ["R-S-NAMES.FILE-UNIQUE"]),
    ("n_stream_*future_major", ["R-S-VERSION.MAJOR"]), ("n_stream_head_version_shape", ["R-S-VERSION.SHAPE"]),
    ("n_stream_head_negative_minor", ["R-S-VERSION.MINOR"]),
    ("n_stream_head_float", ["R-S-JSON.NUMBER"]), ("n_stream_head_nan", ["R-S-JSON.NUMBER"]),
    ("n_stream_descriptor_writer_float", ["R-S-JSON.NUMBER"]), ("n_stream_descriptor_writer_nan", ["R-S-JSON.NUMBER"]),
    ("n_stream_head_duplicate_key", ["R-S-JSON.DUPLICATE"]), ("n_stream_head_not_json", ["R-S-JSON.SYNTAX"]),
    ("n_stream_head_array", ["R-S-JSON.SYNTAX"]),
    ("n_stream_head_deep_nesting", ["R-S-JSON.DEPTH"]), ("n_stream_head_bom", ["R-S-JSON.BOM"]),
    ("n_stream_manifest_upper_hex", ["R-S-JSON.TYPES"]), ("n_stream_descriptor_bad_hex", ["R-S-JSON.TYPES"]),
    ("n_stream_head_step_string", ["R-S-JSON.TYPES"]), ("n_stream_manifest_format_number", ["R-S-JSON.TYPES"]),
    ("n_stream_manifest_keyframe_string", ["R-S-JSON.TYPES"]), ("n_stream_manifest_keyframe_zero", ["R-S-JSON.TYPES"]),
    ("n_stream_manifest_delta_number", ["R-S-JSON.TYPES"]), ("n_stream_manifest_shards_object", ["R-S-JSON.TYPES"]),
    ("n_stream_manifest_shard_number", ["R-S-JSON.TYPES"]), ("n_stream_descriptor_writer_number", ["R-S-JSON.TYPES"]),
    ("n_stream_descriptor_name_number", ["R-S-JSON.TYPES"]), ("n_stream_descriptor_entry_object", ["R-S-JSON.TYPES"]),
    ("y_stream_head_step_*", ["R-S-JSON.INTEGERS"]), ("n_stream_head_step_2_64*", ["R-S-JSON.INTEGERS"]),
    ("n_stream_head_keyframe_after_step_2_53", ["R-S-JSON.INTEGERS"]), ("*_stream_head_depth_*", ["R-S-JSON.DEPTH"]),
    ("y_stream_head_unknown_key_lone_surrogate", ["R-S-JSON.SURROGATES"]),
    ("y_stream_descriptor_name_surrogate_pair", ["R-S-JSON.SURROGATES"]),
    ("n_stream_head_too_large", ["R-S-LIMITS"]), ("n_stream_head_keyframe_after_step", ["R-S-OBJECTS.HEAD"]),
    ("n_stream_manifest_base_after_step*", ["R-S-OBJECTS.MANIFEST"]),
    ("n_stream_manifest_keyframe_step*", ["R-S-OBJECTS.MANIFEST"]),
    ("n_stream_manifest_neither", ["R-S-OBJECTS.MANIFEST"]),
    ("n_stream_manifest_base_manifest_null", ["R-S-OBJECTS.MANIFEST"]),
    ("n_stream_manifest_*_then_tail", ["R-CHECK-ORDER"]),
    ("n_stream_manifest_no_shards*", ["R-S-OBJECTS.SHARDS"]),
    ("n_stream_manifest_shards_swapped", ["R-S-OBJECTS.SHARDS"]),
    ("n_stream_manifest_shard_fields_swapped", ["R-S-OBJECTS.SHARDS"]),
    ("n_stream_manifest_delta_missing", ["R-S-OBJECTS.SHARDS"]),
    ("n_stream_manifest_unexpected_keyframe_then_tail", ["R-S-OBJECTS.SHARDS"]),
    ("n_stream_manifest_delta_base_step", ["R-S-OBJECTS.SHARDS"]),
    ("n_stream_manifest_tensor_sum", ["R-S-OBJECTS.SHARDS"]),
    ("n_stream_descriptor_no_objects", ["R-S-OBJECTS.DESCRIPTOR"]),
    ("n_stream_descriptor_bad_writer", ["R-S-OBJECTS.DESCRIPTOR"]),
    ("n_stream_descriptor_unknown_dtype", ["R-S-OBJECTS.DESCRIPTOR"]),
    ("n_stream_descriptor_shape_*", ["R-S-OBJECTS.DESCRIPTOR"]),
    ("n_stream_descriptor_duplicate_name", ["R-S-OBJECTS.DESCRIPTOR"]),
    ("n_stream_descriptor_control_char_name", ["R-S-OBJECTS.TENSOR-NAME"]),
    ("n_stream_descriptor_name_surrogate", ["R-S-OBJECTS.TENSOR-NAME", "R-S-JSON.SURROGATES"]),
    ("n_stream_descriptor_name_too_long", ["R-S-OBJECTS.TENSOR-NAME"]),
    ("n_stream_manifest_small_object", ["R-S-OBJECTS.REFERENCES"]),
    ("n_stream_manifest_index_offset", ["R-S-OBJECTS.REFERENCES"]),
    ("n_stream_manifest_huge_tail", ["R-S-TAIL"]),
    ("y_stream_signature", ["R-S-SIGNATURE"]), ("n_stream_signature_*", ["R-S-SIGNATURE"]),
    ("*_stream_manifest_*sha256*", ["R-S-SIGNATURE"]), ("n_stream_signature_too_large", ["R-S-LIMITS"]),
]


def rules_for(name: str) -> list:
    import fnmatch
    out = []
    for pattern, rules in RULES:
        if fnmatch.fnmatch(name, pattern):
            out += [r for r in rules if r not in out]
    return out


# ------------------------------------------------------------------------------------ output

def tensor_expect(arr):
    a = np.asarray(arr)
    return {"dtype": {"bool": "BOOL"}.get(a.dtype.name, None) or _dtype_name(a.dtype), "shape": list(a.shape),
            "sha256": hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()}


def _dtype_name(dt):
    from arcfmt.dtypes import from_numpy
    return from_numpy(dt).name


def generate(out_dir: str) -> None:
    vec_dir = os.path.join(out_dir, "vectors")
    os.makedirs(vec_dir, exist_ok=True)
    manifest = {"format": "arcfmt conformance vectors", "spec_version": "1.10",
                "contract": "see conformance/README.md", "vectors": []}
    for v in (valid_vectors() + reject_vectors() + compact_reject_vectors() + inline_reject_vectors()
              + ctx_reject_vectors() + dense_reject_vectors() + ctxas_reject_vectors() + ctxrc_reject_vectors()
              + ctxrp_reject_vectors() + ctxrh_reject_vectors() + history_vectors() + ctxrhp_reject_vectors()):
        base_file = f"{v.name}.base.safetensors"
        prev_file = f"{v.name}.previous.safetensors"
        delta_file = f"{v.name}.arc" + (".gz" if v.gz else "")
        for fname, tensors in ((base_file, v.base), (prev_file, v.previous)):
            if tensors is None and fname == prev_file:   # no previous step given
                continue
            if isinstance(tensors, bytes):  # a base file given byte for byte (SPEC.md §1 "Base files")
                with open(os.path.join(vec_dir, fname), "wb") as f:
                    f.write(tensors)
            else:
                write_file(os.path.join(vec_dir, fname), tensors)
        with open(os.path.join(vec_dir, delta_file), "wb") as f:
            f.write(gzip.compress(v.delta, compresslevel=9, mtime=0) if v.gz else v.delta)
        entry = {"name": v.name, "expect": "accept" if v.error is None else "reject",
                 "description": v.description, "covers": ["SPEC.md §" + c for c in v.covers],
                 "rules": rules_for(v.name),
                 "base": f"vectors/{base_file}", "delta": f"vectors/{delta_file}", "modes": v.modes}
        if v.previous is not None:   # (1.9) the previous step, given as a file like the base (SPEC.md §1, §7)
            entry["previous"] = f"vectors/{prev_file}"
        if v.error is None:
            entry["tensors"] = {k: tensor_expect(a) for k, a in v.expect_tensors.items()}
        else:
            entry["error"] = v.error
            if v.errors:
                entry["errors"] = v.errors
        manifest["vectors"].append(entry)
    for v in object_vectors():
        fname = f"{v.name}.json" + (".gz" if v.gz else "")
        with open(os.path.join(vec_dir, fname), "wb") as f:
            f.write(gzip.compress(v.data, compresslevel=9, mtime=0) if v.gz else v.data)
        entry = {"name": v.name, "expect": "accept" if v.error is None else "reject",
                 "description": v.description, "covers": ["SPEC.md " + c for c in v.covers],
                 "rules": rules_for(v.name), "kind": v.kind, "object": f"vectors/{fname}",
                 "object_name": v.object_name or own_name(v.kind, v.data)}
        if v.error is not None:
            entry["error"] = v.error
        manifest["vectors"].append(entry)
    with open(os.path.join(out_dir, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1, ensure_ascii=False)
        f.write("\n")


def _content(path: str) -> bytes:
    """A vector file's content: a ``.gz`` file's expansion (zlib builds may compress the same bytes differently)."""
    with open(path, "rb") as f:
        data = f.read()
    return gzip.decompress(data) if path.endswith(".gz") else data


def own_name(kind: str, data: bytes) -> str:
    """The name (SPEC.md S3) a stream object is stored under, from its own step / shard / shard count; for
    an object whose fields do not give one, the name of the object it was made from (its fields' own
    checks come first, S2)."""
    default = {"head": "head.json", "manifest": "steps/00000000000000000001/manifest.json",
               "descriptor": "steps/00000000000000000001/shard-00001-of-00002.json",
               "signature": "steps/00000000000000000001/signature.json"}[kind]
    try:
        obj = json.loads(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)
    except ValueError:
        return default
    if kind == "head" or not isinstance(obj, dict):
        return default

    def ok(k, lo, hi):
        x = obj.get(k)
        return isinstance(x, int) and not isinstance(x, bool) and lo <= x <= hi
    if not ok("step", 0, (1 << 64) - 2):
        return default
    step_dir = f"steps/{obj['step']:020d}"
    if kind == "descriptor":
        if not (ok("num_shards", 1, 4096) and ok("shard", 0, obj["num_shards"] - 1)):
            return default
        return f"{step_dir}/shard-{obj['shard']:05d}-of-{obj['num_shards']:05d}.json"
    return f"{step_dir}/{kind}.json"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="compare with the checked-in vectors instead of writing")
    args = ap.parse_args(argv)
    if not args.check:
        shutil.rmtree(os.path.join(ROOT, "vectors"), ignore_errors=True)
        generate(ROOT)
        m = json.load(open(os.path.join(ROOT, "manifest.json")))
        print(f"wrote {len(m['vectors'])} vectors to {os.path.relpath(ROOT)}")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        generate(tmp)
        diffs = []
        for rel in ["manifest.json"] + sorted(os.listdir(os.path.join(tmp, "vectors"))):
            a = os.path.join(tmp, rel if rel == "manifest.json" else os.path.join("vectors", rel))
            b = os.path.join(ROOT, rel if rel == "manifest.json" else os.path.join("vectors", rel))
            if not os.path.exists(b) or _content(a) != _content(b):
                diffs.append(rel)
        extra = set(os.listdir(os.path.join(ROOT, "vectors"))) - set(os.listdir(os.path.join(tmp, "vectors"))) \
            if os.path.isdir(os.path.join(ROOT, "vectors")) else set()
        diffs += sorted(extra)
        if diffs:
            print("vectors differ from the generator: " + ", ".join(diffs[:20]))
            return 1
        print("checked-in vectors match the generator")
        return 0


if __name__ == "__main__":
    sys.exit(main())
