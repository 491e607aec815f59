#!/usr/bin/env python3
"""What is left of a step's size, lever by lever (issue 19): framing, and adaptive bounds per stream.

    python tools/size_levers.py TRAJECTORY_DIR STEP [--history H]

For the BF16 step pair STEP-1 → STEP of a trajectory (step*.safetensors, as tools/bench.py reads
them), encodes the pair with the default writer and prints

- the file's framing (every byte that is not a stream's stored bytes), by field;
- the stored bytes of each stream role;
- adaptive (Krichevsky–Trofimov) code lengths, per block, that a coder with that context could reach:
  positions given the base's exponent, signs given the sign of each element's last change within
  ``H`` earlier steps, magnitudes given the exponent — bounds for a format change, not a coder;
- for tensors where nearly every element moves each step, the static entropy of the steps ``d`` and
  of ``d - d_prev`` (the previous step's change), given the exponent.

Needs steps STEP-1-H … STEP. Figures go to BENCHMARKS.md; nothing is written.
"""
from __future__ import annotations

import argparse
import collections
import io
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench import load  # noqa: E402

from arcfmt import layout as L  # noqa: E402
from arcfmt import records  # noqa: E402
from arcfmt.writer import DEFAULT_BLOCK_ELEMS, DeltaWriter  # noqa: E402


def ordered(u: np.ndarray) -> np.ndarray:
    u = u.astype(np.int64)
    return np.where(u < 0x8000, u, 0x7FFF - u)


def kt_bits(bits: np.ndarray, ctx: np.ndarray) -> float:
    """Adaptive KT code length of a bit sequence, one model per context value, in sequence order."""
    if bits.size == 0:
        return 0.0
    order = np.argsort(ctx, kind="stable")
    b, c = bits[order].astype(np.int64), ctx[order]
    start = np.r_[0, np.flatnonzero(np.diff(c)) + 1]
    first = np.repeat(start, np.diff(np.r_[start, b.size]))
    n = np.arange(b.size) - first
    ones_before = np.r_[0, np.cumsum(b)[:-1]]
    n1 = ones_before - ones_before[first]
    p1 = (n1 + 0.5) / (n + 1.0)
    return float(-np.log2(np.where(b == 1, p1, 1 - p1)).sum())


def kt_symbols(vals: np.ndarray, ctx: np.ndarray, alphabet: int = 64) -> float:
    """Adaptive code length of small symbols (capped at ``alphabet - 1``), one model per context."""
    total = 0.0
    v = np.minimum(vals, alphabet - 1)
    for cv in np.unique(ctx):
        x = v[ctx == cv]
        counts = np.zeros(alphabet)
        for i, s in enumerate(x):
            total -= np.log2((counts[s] + 0.5) / (i + alphabet * 0.5))
            counts[s] += 1
    return total


def entropy(x: np.ndarray, ctx: np.ndarray) -> float:
    """Static entropy (bits) of ``x`` given ``ctx``."""
    total = 0.0
    for cv in np.unique(ctx):
        _, c = np.unique(x[ctx == cv], return_counts=True)
        total -= float((c * np.log2(c / c.sum())).sum())
    return total


def framing(data: bytes) -> tuple[collections.Counter, int]:
    """Bytes of the file by framing field, and the streams' stored bytes."""
    acc: collections.Counter = collections.Counter()
    acc["file header + trailer"] = L.HEADER_SIZE + L.TRAILER_SIZE
    streams = 0
    pos = L.HEADER_SIZE
    th = None
    prefixed, prev = False, b""
    inline = records.check_header(data[:L.HEADER_SIZE]).inline_blocks
    while pos < len(data) - L.TRAILER_SIZE:
        head = records.parse_record_head(data[pos: pos + L.RECORD_HEADER_SIZE], pos)
        payload = data[pos + L.RECORD_HEADER_SIZE: pos + L.RECORD_HEADER_SIZE + head.length]
        name = head.type.decode()
        acc[f"{name} record headers"] += L.RECORD_HEADER_SIZE
        if head.type == L.META:
            prefixed = records.parse_meta(payload).prefixed_names
        if head.type == L.TENS:
            th = records.parse_tensor(payload, "", prev if prefixed else None, inline)
            prev = th.name.encode()
            at = L._varint_at(payload, 0, "prefix")[1] if prefixed else 0   # PREFIXED_NAMES: prefix length
            n, at = L._varint_at(payload, at, "name")
            acc["TENS name fields"] += at + n
            end = head.length if th.inline_at is None else th.inline_at
            acc["TENS other fields (dtype, shape, flags, hashes)"] += end - (at + n)
            if th.inline_at is not None:   # its block (1.6, §7)
                stored = sum(s.stored for s in records.parse_block(payload, th, 0, 0, "").streams)
                streams += stored
                acc["inline block fields (encoding, params, stream table)"] += head.length - end - stored
        elif head.type == L.BLCK and th is not None:
            tensor, at = L._varint_at(payload, 0, "tensor")
            block, _ = L._varint_at(payload, at, "block")
            stored = sum(s.stored for s in records.parse_block(payload, th, tensor, block, "").streams)
            streams += stored
            acc["BLCK fields (ordinals, encoding, params, stream table)"] += head.length - stored
        else:
            acc[f"{name} payloads"] += head.length
        pos += L.RECORD_HEADER_SIZE + head.length
    return acc, streams


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder")
    ap.add_argument("step", type=int)
    ap.add_argument("--history", type=int, default=8, help="earlier steps searched for an element's last change")
    args = ap.parse_args(argv)
    steps = [load(os.path.join(args.folder, f"step{s:04d}.safetensors"))
             for s in range(args.step - 1 - args.history, args.step + 1)]
    base, target = steps[-2], steps[-1]
    buf = io.BytesIO()
    w = DeltaWriter(buf)
    w.write_tensors((k, base.get(k), v) for k, v in target.items())
    w.close()
    data = buf.getvalue()
    print(f"step {args.step - 1} -> {args.step}: {len(data)} B, {len(target)} tensors")
    acc, streams = framing(data)
    print(f"framing {len(data) - streams} B ({(len(data) - streams) / len(data):.1%}):")
    for k, v in acc.most_common():
        print(f"  {k:52s} {v:8d}  {v / len(data):6.2%}")
    roles: collections.Counter = collections.Counter()
    for t in w.stats:
        for blk in t.blocks:
            for i, (_, stored, _) in enumerate(blk.streams):
                roles[f"{blk.encoding} stream {i}"] += stored
    print("stored streams:")
    for k, v in roles.most_common():
        print(f"  {k:52s} {v:8d}  {v / len(data):6.2%}")
    pos_kt = sign_kt = mag_kt = sign_raw = axis_kt = axis_hist_kt = 0.0
    moving = []
    for name, v in target.items():
        if v.dtype.itemsize != 2 or name not in base or base[name].shape != v.shape:
            continue
        o = [ordered(s[name].view(np.uint16).ravel()) for s in steps]
        last = np.zeros(o[0].shape, np.int64)   # sign of each element's most recent earlier change
        for j in range(len(o) - 2, 0, -1):
            last = np.where(last == 0, np.sign(o[j] - o[j - 1]), last)
        d = o[-1] - o[-2]
        b = base[name].view(np.uint16).ravel()
        cols = v.shape[-1] if v.ndim >= 2 else d.size
        flat = np.arange(d.size, dtype=np.int64)
        by_axis = [0.0, 0.0]      # signs given the row, given the column (this tensor, per block)
        by_axis_hist = [0.0, 0.0]
        for s0 in range(0, d.size, DEFAULT_BLOCK_ELEMS):
            sl = slice(s0, s0 + DEFAULT_BLOCK_ELEMS)
            ch = d[sl] != 0
            if not ch.any():
                continue
            ex = ((b[sl] >> 7) & 0xFF).astype(np.int64)
            pos_kt += kt_bits(ch, ex) / 8
            sign_kt += kt_bits(d[sl][ch] < 0, last[sl][ch]) / 8
            sign_raw += ch.sum() / 8
            for k, axis in enumerate((flat[sl][ch] // cols, flat[sl][ch] % cols)):
                by_axis[k] += kt_bits(d[sl][ch] < 0, axis) / 8
                by_axis_hist[k] += kt_bits(d[sl][ch] < 0, axis * 3 + last[sl][ch] + 1) / 8
            mag_kt += kt_symbols(np.abs(d[sl][ch]) - 1, ex[ch]) / 8
        axis_kt += min(by_axis)
        axis_hist_kt += min(by_axis_hist)
        if (d != 0).mean() > 0.9:
            dp = o[-2] - o[-3]
            ch = d != 0
            ex = ((b >> 7) & 0xFF).astype(np.int64)[ch]
            moving.append((name, entropy(d[ch], ex) / 8, entropy((d - dp)[ch], ex) / 8))
    print("adaptive bounds (KT, per block; BF16 tensors):")
    print(f"  positions given the exponent                          {pos_kt:10.0f} B")
    print(f"  signs stored raw (one bit each)                       {sign_raw:10.0f} B")
    print(f"  signs given the last change's sign ({args.history} steps back)      {sign_kt:10.0f} B")
    print(f"  signs given their row or column (better axis, no history) {axis_kt:6.0f} B")
    print(f"  signs given row or column and the last change's sign  {axis_hist_kt:10.0f} B")
    print(f"  magnitudes given the exponent                         {mag_kt:10.0f} B")
    for name, h_d, h_dd in moving:
        print(f"  {name}: H(d | exponent) {h_d:.0f} B, H(d - d_prev | exponent) {h_dd:.0f} B")
    return 0


if __name__ == "__main__":
    sys.exit(main())
