#!/usr/bin/env python3
"""What arcfmt writes per stream role beside what the data leave for the contexts a decoder can hold.

    python tools/size_floor.py TRAJECTORY_DIR [...] [--pairs N] [--first K] [--json]

The size target of issue 19 is measured against estimates of what the data carry. Per step pair
(base → target, and the step before the base for the *previous-step* contexts), this prints the
bytes arcfmt's default effort writes per role and, beside them, adaptive (Krichevsky–Trofimov)
code lengths — what an adaptive binary coder with that context would spend, model cost included:

- positions: one "changed?" bit per element, context = the base's exponent field (the context
  ctx-delta's classes approximate), and the same × "did this element change in the previous step";
- signs: one bit per change, raw, and KT with context = the direction of the same element's
  previous change (none / up / down), or = the signs of the previous change in its row and column
  (shown with the magnitudes' estimate added: ctx-delta-rc codes signs and magnitudes in one stream);
- magnitudes: |d| binarised as Elias-gamma (unary length, then the bits below the top one), the
  unary bits and the first bit below the top adaptive per exponent field, the rest raw;
- headers+index: the bytes of records, framing and index (nothing else is estimated there).

Estimates need no format change to compute and do not say how to reach them; they bound what a
coder with these contexts can reach on these pairs. Run on late pairs (``--first``), as the bench.
"""
from __future__ import annotations

import argparse
import glob
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import arcfmt  # noqa: E402
from arcfmt.reader import DeltaReader  # noqa: E402
from arcfmt.safetensors_io import open_checkpoint  # noqa: E402

_LN2 = math.log(2)
_LNPI = math.log(math.pi)


def kt_bits(ones, zeros) -> float:
    """Total KT code length (bits) of binary sources with these counts (arrays, one per context)."""
    ones = np.asarray(ones, np.float64).ravel()
    zeros = np.asarray(zeros, np.float64).ravel()
    keep = (ones + zeros) > 0
    a, b = ones[keep], zeros[keep]
    return float(np.sum(_LNPI + _lgamma(a + b + 1) - _lgamma(a + 0.5) - _lgamma(b + 0.5)) / _LN2)


_lgamma = np.vectorize(math.lgamma, otypes=[np.float64])


def load(path: str) -> dict:
    return {k: np.array(v) for k, v in open_checkpoint(path).tensors().items()}


def ordered(u: np.ndarray, bits: int) -> np.ndarray:
    """SPEC.md §8.6 ``ord``: the order-preserving integer of each bit pattern (int64)."""
    v = u.astype(np.int64)
    half = 1 << (bits - 1)
    return np.where(v < half, v, half - 1 - v)


def exponent_field(u: np.ndarray, dt) -> np.ndarray:
    return ((u.astype(np.int64) >> dt.mant_bits) & ((1 << dt.exp_bits) - 1)).astype(np.int64)


def _counts(ctx: np.ndarray, bit: np.ndarray, n_ctx: int):
    ones = np.bincount(ctx[bit], minlength=n_ctx)
    allc = np.bincount(ctx, minlength=n_ctx)
    return ones, allc - ones


def _row_col_signs(sg: np.ndarray) -> np.ndarray:
    """Per changed element of a 2-D sign array (0 where unchanged): 3 × (sign of the previous change in
    its row) + (sign of the previous change in its column), each 0 none / 1 up / 2 down."""
    def prev_along(a):
        out = np.zeros_like(a)
        for i in range(a.shape[0]):
            idx = np.flatnonzero(a[i])
            if len(idx) > 1:
                out[i, idx[1:]] = a[i, idx[:-1]]
        return out
    left = prev_along(sg)
    up = prev_along(sg.T).T
    code = lambda s: np.where(s > 0, 1, np.where(s < 0, 2, 0))  # noqa: E731
    return (3 * code(left) + code(up))[sg != 0]


def estimate_pair(prev: dict | None, base: dict, target: dict) -> dict:
    """KT bits per role (several contexts) for one pair, summed over the tensors that have a base."""
    from arcfmt.dtypes import from_numpy

    est = {k: 0.0 for k in ("positions:exp", "positions:exp+prev", "signs:raw", "signs:prev", "signs:row/col",
                            "magnitudes:exp")}
    for name, t in target.items():
        b = base.get(name)
        if b is None or b.dtype != t.dtype or b.shape != t.shape:
            continue
        dt = from_numpy(t.dtype)
        if dt.exp_bits == 0 or dt.itemsize > 4:
            continue
        bits = 8 * dt.itemsize
        bu, tu = b.view(dt.uint).ravel(), t.view(dt.uint).ravel()
        m = bu != tu
        x = exponent_field(bu, dt)
        n_x = 1 << dt.exp_bits
        est["positions:exp"] += kt_bits(*_counts(x, m, n_x))
        d_prev = None
        if prev is not None and name in prev and prev[name].shape == t.shape and prev[name].dtype == t.dtype:
            pu = prev[name].view(dt.uint).ravel()
            d_prev = ordered(bu, bits) - ordered(pu, bits)
            ctx = 2 * x + (d_prev != 0)
            est["positions:exp+prev"] += kt_bits(*_counts(ctx, m, 2 * n_x))
        else:
            est["positions:exp+prev"] += kt_bits(*_counts(x, m, n_x))
        c = int(m.sum())
        if c == 0:
            continue
        d = (ordered(tu, bits) - ordered(bu, bits))[m]
        neg = d < 0
        est["signs:raw"] += c
        if d_prev is not None:
            dp = d_prev[m]
            ctx = np.where(dp > 0, 1, np.where(dp < 0, 2, 0))
            est["signs:prev"] += kt_bits(*_counts(ctx, neg, 3))
        else:
            est["signs:prev"] += c
        if t.ndim == 2:
            full = np.zeros(t.shape, np.int64)
            full.ravel()[np.flatnonzero(m)] = np.where(neg, -1, 1)
            est["signs:row/col"] += kt_bits(*_counts(_row_col_signs(full), neg, 9))
        else:
            est["signs:row/col"] += c
        # magnitudes: Elias-gamma of |d| (>= 1): L = bit length; unary (L - 1 zeros, then a one) with a
        # context per (exponent, position in the unary), the first bit below the top per (exponent, L),
        # the remaining L - 2 bits raw
        a = np.abs(d)
        L = np.floor(np.log2(a)).astype(np.int64) + 1
        xe = x[m]
        maxl = int(L.max())
        for j in range(maxl):
            live = L > j
            stop = L[live] == j + 1
            est["magnitudes:exp"] += kt_bits(*_counts(xe[live], stop, n_x))
        two = L >= 2
        if two.any():
            second = ((a[two] >> (L[two] - 2)) & 1).astype(bool)
            est["magnitudes:exp"] += kt_bits(*_counts(xe[two] * 64 + L[two], second, n_x * 64))
            est["magnitudes:exp"] += float(np.sum(np.maximum(L - 2, 0)))
    return {k: v / 8 for k, v in est.items()}


def actual_pair(base: dict, target: dict) -> dict:
    """Bytes arcfmt's default effort writes for the pair, per role (positions, signs, magnitudes, headers)."""
    delta = arcfmt.encode(base, target, on_mismatch="ignore")
    r = DeltaReader(delta)
    d = r.describe()
    out = {"positions": 0, "signs": 0, "magnitudes": 0, "changes": 0, "other": 0}
    in_streams = 0
    from bench import stream_labels  # noqa: PLC0415 - the bench's role names, one definition
    for t in d["tensors"]:
        for blk in t["blocks"]:
            for label, st in zip(stream_labels(blk["encoding"], t["dtype"]), blk["streams"]):
                part, _, name = label.rpartition(":")
                # "changes": ctx-delta-rc's signs and magnitudes coded together (-rp's holds its gaps
                # too, but this tool encodes at the default effort, which writes no -rp block)
                key = ("changes" if name == "changes" else "positions" if "positions" in (part, name) else
                       "signs" if name == "signs" else "magnitudes" if name in ("magnitudes", "steps") else "other")
                out[key] += st["stored"]
                in_streams += st["stored"]
    out["headers+index"] = len(delta) - in_streams
    out["total"] = len(delta)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dirs", nargs="+", metavar="TRAJECTORY_DIR")
    ap.add_argument("--pairs", type=int, default=4, help="step pairs per trajectory")
    ap.add_argument("--first", type=int, default=1, help="first pair (its base's predecessor is used too)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    report = {}
    for folder in args.dirs:
        files = sorted(glob.glob(os.path.join(folder, "step*.safetensors")))
        lo = max(1, args.first)
        pairs = [(files[i - 1], files[i], files[i + 1]) for i in range(lo, min(len(files) - 1, lo + args.pairs))]
        if not pairs:
            print(f"{folder}: not enough steps", file=sys.stderr)
            return 1
        act: dict = {}
        est: dict = {}
        bf16 = 0
        for p, b, t in pairs:
            P, B, T = load(p), load(b), load(t)
            bf16 += sum(a.size * 2 for a in T.values())
            for k, v in actual_pair(B, T).items():
                act[k] = act.get(k, 0) + v
            for k, v in estimate_pair(P, B, T).items():
                est[k] = est.get(k, 0) + v
        n = len(pairs)
        act = {k: v / n for k, v in act.items()}
        est = {k: v / n for k, v in est.items()}
        bf16 /= n
        report[folder] = dict(pairs=n, bf16_bytes=bf16, actual=act, estimate=est)
        if args.json:
            continue
        print(f"\n{folder}: {n} pairs from pair {lo}; bytes per step (BF16 model {bf16 / 1e6:.1f} MB)")
        print(f"  {'role':<26}{'arcfmt':>10}{'KT estimate':>14}{'ratio':>8}")
        print(f"  {'positions':<26}{act['positions']:>10.0f}")
        for k in ("positions:exp", "positions:exp+prev"):
            print(f"    {k:<24}{'':>10}{est[k]:>14.0f}{est[k] / max(act['positions'], 1):>8.3f}")
        # signs and magnitudes as one row: ctx-delta-rc codes them together, in one stream ("changes")
        steps = act["signs"] + act["magnitudes"] + act["changes"]
        print(f"  {'signs+magnitudes':<26}{steps:>10.0f}")
        for k in ("signs:raw", "signs:prev", "signs:row/col"):
            v = est[k] + est["magnitudes:exp"]
            print(f"    {k + ' + magnitudes:exp':<34}{v:>14.0f}{v / max(steps, 1):>8.3f}")
        print(f"  {'headers+index':<26}{act['headers+index']:>10.0f}")
        print(f"  {'other streams':<26}{act['other']:>10.0f}")
        best = (min(est["positions:exp"], est["positions:exp+prev"]) + min(est["signs:raw"], est["signs:prev"],
                est["signs:row/col"]) + est["magnitudes:exp"])
        stateless = est["positions:exp"] + min(est["signs:raw"], est["signs:row/col"]) + est["magnitudes:exp"]
        tot = act["total"]
        print(f"  {'total':<26}{tot:>10.0f}   = {100 * tot / bf16:.4f} % of BF16")
        for label, content in (("exponent contexts, no state", stateless), ("with previous-step contexts", best)):
            for oh, what in ((1.0, "today's framing"), (0.5, "half the framing")):
                v = content + act["other"] + oh * act["headers+index"]
                print(f"  estimate: {label}, {what}: {v:>9.0f} = {v / tot:.3f}× today ({100 * v / bf16:.4f} %)")
    if args.json:
        print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
