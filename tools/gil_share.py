#!/usr/bin/env python3
"""The share of single-thread encode and decode time that holds the GIL, and what it allows on N cores.

    python tools/gil_share.py TRAJ_DIR [TRAJ_DIR ...] [--pairs 2] [--repeat 3] [--cores 16] [--block-elems N] [--json]

Runs arcfmt's in-memory encode (``DeltaWriter``) and decode (``arcfmt.decode``, as tools/bench.py
times them) with one worker thread on the last ``--pairs`` step pairs of each trajectory, with every
call that releases the GIL timed: the compiled kernels (numba ``nogil``), the codecs (zstd, xz and
bz2 release it inside their C libraries), xxh3 on buffers large enough for xxhash to release it, and
the bulk numpy copies the pipeline makes. Everything else — Python code, small numpy calls, the
argument handling around each of those calls — holds the GIL. That share ``g`` bounds the speed-up
of threads on any number of cores: Amdahl's ``1 / (g + (1 - g) / N)`` (printed for ``--cores``).

An instrument, not a sampler: time inside a call that releases the GIL is counted as free of it even
where the call takes the GIL briefly (numba's argument unboxing happens before it releases it, and is
counted as inside); the figures are best of ``--repeat`` runs.
"""
from __future__ import annotations

import argparse
import functools
import io
import json
import time
from collections.abc import Callable
from typing import Any

import _paths  # noqa: F401  (this checkout's arcfmt first)
import numpy as np
import xxhash
from bench import load, steps_in

import arcfmt
from arcfmt import backend, codecs
from arcfmt.encodings import ctx_delta
from arcfmt.writer import DEFAULT_BLOCK_ELEMS, DeltaWriter

XXH_GIL_MIN = 2048  # xxhash releases the GIL for inputs above this many bytes (smaller ones hold it)


class Clock:
    """Seconds spent inside the instrumented calls, per category."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = {}
        self.depth = 0

    def wrap(self, category: str, fn: Callable[..., Any], big: Callable[..., bool] | None = None) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed(*args: Any, **kw: Any) -> Any:
            if self.depth or (big is not None and not big(*args, **kw)):
                return fn(*args, **kw)
            self.depth += 1
            t0 = time.perf_counter()
            try:
                return fn(*args, **kw)
            finally:
                self.add(category, time.perf_counter() - t0)
                self.depth -= 1
        return timed

    def add(self, category: str, seconds: float) -> None:
        self.spent[category] = self.spent.get(category, 0.0) + seconds

    def reset(self) -> None:
        self.spent = {}


def _nbytes(buf: Any) -> int:
    try:
        return memoryview(buf).nbytes
    except TypeError:
        return 0


def instrument(clock: Clock) -> None:
    """Replace every GIL-releasing entry point the encode and decode paths call with a timed one."""
    ctx_delta.warm_up()  # compile first: a kernel that calls another must find the compiled one
    be = backend.selected()
    if be is not backend.twins():
        from arcfmt import kernels
        for name in dir(kernels):
            obj = getattr(kernels, name)
            if name.startswith("_") and hasattr(obj, "py_func") and hasattr(obj, "signatures"):
                setattr(kernels, name, clock.wrap("kernels", obj))
    for cls in (codecs.Zstd, codecs.Xz, codecs.Bz2):
        cls.decode = clock.wrap("codecs", cls.decode)  # type: ignore[method-assign]
        cls.compress = clock.wrap("codecs", cls.compress)  # type: ignore[method-assign]
    raw = xxhash.xxh3_64_intdigest
    xxhash.xxh3_64_intdigest = clock.wrap("xxh3", raw, lambda buf, *a, **k: _nbytes(buf) > XXH_GIL_MIN)
    hasher = xxhash.xxh3_64

    class Timed:
        def __init__(self, data: Any = b"", *a: Any, **k: Any) -> None:
            self._h = hasher(*a, **k)
            if _nbytes(data):
                self.update(data)

        def update(self, data: Any) -> None:
            if _nbytes(data) > XXH_GIL_MIN and not clock.depth:
                t0 = time.perf_counter()   # timed in place: a wrapper made per call held the GIL ~µs
                self._h.update(data)
                clock.add("xxh3", time.perf_counter() - t0)
            else:
                self._h.update(data)

        def intdigest(self) -> int:
            return self._h.intdigest()

        def digest(self) -> bytes:
            return self._h.digest()

    xxhash.xxh3_64 = Timed  # type: ignore[misc, assignment]
    # bulk numpy copies (np.copyto releases the GIL; an unchanged block is copied with it)
    np_copyto = np.copyto
    np.copyto = clock.wrap("numpy copies", np_copyto, lambda dst, src, *a, **k: dst.nbytes >= 1 << 16)  # type: ignore[assignment]


def measure(files: list[str], pairs: int, repeat: int, clock: Clock, block_elems: int = DEFAULT_BLOCK_ELEMS) -> dict:
    out: dict[str, dict[str, float]] = {}
    for a, b in list(zip(files, files[1:]))[-pairs:]:
        prev, cur = load(a), load(b)
        nbytes = sum(v.nbytes for v in cur.values())
        for phase in ("encode", "decode"):
            best: tuple[float, dict[str, float]] | None = None
            delta = b""
            kept: list[dict] = []
            for _ in range(repeat):
                clock.reset()
                t0 = time.perf_counter()
                if phase == "encode":
                    buf = io.BytesIO()
                    w = DeltaWriter(buf, workers=1, block_elems=block_elems)
                    w.write_tensors((k, prev.get(k), v) for k, v in cur.items())
                    w.close()
                    delta = buf.getvalue()
                else:
                    kept.append(arcfmt.decode(prev, delta_of[(a, b)], workers=1))
                total = time.perf_counter() - t0
                kept.clear()  # the output is freed outside the timed run (unmapping 1.41 GB took ~5 ms)
                if best is None or total < best[0]:
                    best = (total, dict(clock.spent))
            if phase == "encode":
                delta_of[(a, b)] = delta
            assert best is not None
            acc = out.setdefault(phase, {"total": 0.0, "bytes": 0.0})
            acc["total"] += best[0]
            acc["bytes"] += nbytes
            for k, v in best[1].items():
                acc[k] = acc.get(k, 0.0) + v
    return out


delta_of: dict[tuple[str, str], bytes] = {}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trajectories", nargs="+", metavar="TRAJ_DIR")
    ap.add_argument("--pairs", type=int, default=2, help="the last N step pairs of each trajectory")
    ap.add_argument("--repeat", type=int, default=3, help="runs per pair and phase (best is kept)")
    ap.add_argument("--cores", type=int, default=16, help="the core count of the Amdahl projection")
    ap.add_argument("--block-elems", type=int, default=DEFAULT_BLOCK_ELEMS,
                    help=f"elements per block of the encode (default {DEFAULT_BLOCK_ELEMS}, as arcfmt encode)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    clock = Clock()
    instrument(clock)
    report = []
    for traj in args.trajectories:
        res = measure(steps_in(traj), args.pairs, args.repeat, clock, args.block_elems)
        for phase, r in res.items():
            free = sum(v for k, v in r.items() if k not in ("total", "bytes"))
            g = max(0.0, 1 - free / r["total"])
            row = dict(trajectory=traj, phase=phase, mb_per_s=r["bytes"] / 1e6 / r["total"], seconds=r["total"],
                       gil_share=g, projected_speedup=1 / (g + (1 - g) / args.cores),
                       nogil={k: v / r["total"] for k, v in r.items() if k not in ("total", "bytes")})
            report.append(row)
    if args.json:
        print(json.dumps(dict(cores=args.cores, block_elems=args.block_elems, rows=report), indent=1))
        return 0
    print(f"| trajectory | phase | 1-thread MB/s | GIL held | outside the GIL (share of time) "
          f"| {args.cores} cores (Amdahl) |")
    print("|---|---|---|---|---|---|")
    for r in report:
        parts = ", ".join(f"{k} {100 * v:.0f} %" for k, v in sorted(r["nogil"].items(), key=lambda kv: -kv[1]))
        print(f"| {r['trajectory']} | {r['phase']} | {r['mb_per_s']:.0f} | {100 * r['gil_share']:.1f} % | {parts} "
              f"| {r['projected_speedup']:.1f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
