#!/usr/bin/env python3
"""The Python work of an encode and a decode, per tensor: bytecodes executed and calls, by function.

    python tools/py_work.py TRAJ_DIR [TRAJ_DIR ...] [--pairs 1] [--top 0] [--json]

Runs arcfmt's in-memory encode (``DeltaWriter``) and decode (``arcfmt.decode``), as tools/bench.py
and tools/gil_share.py do, with one worker thread on the last ``--pairs`` step pairs of each
trajectory, under a tracer that counts every bytecode the interpreter executes (``f_trace_opcodes``)
and every Python call. Both counts are the same from run to run, whatever else the machine does: the
instrument for the Python that holds the GIL (``tools/gil_share.py`` times it, and its share bounds
what threads give on any number of cores), where this machine's timings swing by more than a change
of that Python moves them. Calls made by C code (numpy, xxhash, the codecs) into Python are counted;
the C work itself and the compiled kernels are not. ``--top N``: the N functions that execute the
most bytecodes, per tensor. The trajectories' step files are loaded first (not counted).
"""
from __future__ import annotations

import argparse
import collections
import functools
import io
import json
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

import _paths  # noqa: F401  (this checkout's arcfmt first)
from bench import load, steps_in

import arcfmt
from arcfmt.encodings import ctx_delta
from arcfmt.writer import DeltaWriter


class Counter:
    """Bytecodes and calls while :meth:`run` runs a function, in total and by function."""

    def __init__(self) -> None:
        self.ops = 0
        self.calls = 0
        self.by_function: collections.Counter[str] = collections.Counter()

    def _trace(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event == "call":
            self.calls += 1
            frame.f_trace_opcodes = True
        elif event == "opcode":
            self.ops += 1
            code = frame.f_code
            self.by_function[f"{code.co_filename.rsplit('/', 1)[-1]}:{code.co_name}"] += 1
        return self._trace

    def run(self, fn: Any) -> Any:
        self.ops = self.calls = 0
        self.by_function.clear()
        sys.settrace(self._trace)
        try:
            return fn()
        finally:
            sys.settrace(None)


def _encoder(prev: dict, cur: dict) -> Callable[[], bytes]:
    def encode() -> bytes:
        buf = io.BytesIO()
        w = DeltaWriter(buf, workers=1)
        w.write_tensors((k, prev.get(k), v) for k, v in cur.items())
        w.close()
        return buf.getvalue()
    return encode


def measure(traj: str, pairs: int, top: int) -> list[dict]:
    files = steps_in(traj)
    rows = []
    counter = Counter()
    for a, b in list(zip(files, files[1:]))[-pairs:]:
        prev, cur = load(a), load(b)
        encode = _encoder(prev, cur)
        delta = encode()
        decode = functools.partial(arcfmt.decode, prev, delta, workers=1)
        for _ in range(2):   # first calls load kernels and fill caches: counted on the third
            decode()
            encode()
        n = len(cur)
        for phase, fn in (("encode", encode), ("decode", decode)):
            counter.run(fn)
            rows.append(dict(trajectory=traj, pair=[a, b], phase=phase, tensors=n, bytecodes=counter.ops,
                             calls=counter.calls, bytecodes_per_tensor=counter.ops / n,
                             calls_per_tensor=counter.calls / n,
                             top=[(f, c / n) for f, c in counter.by_function.most_common(top)]))
    return rows


def _positive(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected at least 1, not {n}")
    return n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trajectories", nargs="+", metavar="TRAJ_DIR")
    ap.add_argument("--pairs", type=_positive, default=1, help="the last N step pairs of each trajectory")
    ap.add_argument("--top", type=int, default=0, help="the N functions that execute the most bytecodes")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    ctx_delta.warm_up()
    rows = [r for traj in args.trajectories for r in measure(traj, args.pairs, args.top)]
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print("| trajectory | phase | tensors | bytecodes a tensor | calls a tensor |")
    print("|---|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r['trajectory']} | {r['phase']} | {r['tensors']} | {r['bytecodes_per_tensor']:.0f} "
              f"| {r['calls_per_tensor']:.1f} |")
    for r in rows:
        if r["top"]:
            print(f"\n{r['trajectory']} {r['phase']}, bytecodes a tensor by function:")
            for f, c in r["top"]:
                print(f"  {c:8.1f}  {f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
