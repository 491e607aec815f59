#!/usr/bin/env python3
"""The ctx-delta decode kernels of this checkout beside another tree's, in one process, interleaved.

    python tools/kernel_ab.py OTHER_TREE TRAJ_DIR [TRAJ_DIR ...] [--first K] [--pairs N] [--rounds 9]

Why in one process: on a shared 2-vCPU machine a whole decode's time swings 20 % between runs, more
than a kernel change moves it; the same blocks decoded by both kernels in alternating rounds see the
same machine. Each step pair (``--first`` and ``--pairs`` as ``tools/bench.py`` takes them; here
``--pairs`` defaults to 3) is encoded once with this checkout; every ctx-delta block's streams are
decoded once; then each round runs every block through both kernels' ``ctx_decode`` (which side runs
first alternates), and after the rounds both outputs must be the same bytes. Prints per trajectory the
sum over blocks, min and median over rounds, and the change. The times include each block's Python
wrapper and numba's dispatch (about 7 µs a block, the same on both sides), so a percentage slightly
understates the kernel's own change.

``OTHER_TREE`` is a checkout (e.g. ``git worktree add /tmp/old HEAD~1``); its ``arcfmt/kernels.py`` is
loaded as a module of this checkout's package, so it must use the same backend statuses.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time
from types import ModuleType

import _paths  # noqa: F401  (this checkout's arcfmt first)
import numpy as np
from bench import load, steps_in

import arcfmt
from arcfmt import backend, encodings, kernels, pipeline, records
from arcfmt.reader import DeltaReader


def other_kernels(tree: str) -> ModuleType:
    path = os.path.join(tree, "arcfmt", "kernels.py")
    spec = importlib.util.spec_from_file_location("arcfmt._kernels_of_other_tree", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"{path}: not found")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod   # numba's cache finds a compiled function's module by its name
    spec.loader.exec_module(mod)   # its "from .backend import ..." is this checkout's backend
    return mod


def blocks(files: list[str]) -> list[tuple]:
    """``(dtype, params, streams, m, base block)`` of every ctx-delta, -as, -rc and -rp block of each
    pair as the default writer codes it (no -rp: that is effort max's; the other tree must know every
    encoding the pairs use)."""
    ctx = {encodings.by_name(n).id for n in ("ctx-delta", "ctx-delta-as", "ctx-delta-rc", "ctx-delta-rp")}
    out = []
    for a, b in zip(files, files[1:]):
        base, target = load(a), load(b)
        r = DeltaReader(arcfmt.encode(base, target))
        for name in r.names:
            th = r.header(name)
            base_u = pipeline.check_base(th, base.get(name))
            for k in range(th.block_count):
                lb = r.load_block(name, k)
                if lb.info.encoding not in ctx or base_u is None:
                    continue
                s, e = th.block_range(k)
                streams = records.decode_block_streams(lb.payload, lb.info, name)
                params = encodings.get(lb.info.encoding).unpack(lb.info.params)
                out.append((th.dtype, params, streams, e - s, base_u[s:e]))
    return out


def run(mod: ModuleType, jobs: list[tuple], outs: list[np.ndarray]) -> float:
    t0 = time.perf_counter()
    for (dt, p, streams, m, base), out in zip(jobs, outs):
        if mod.ctx_decode(dt, p, streams, m, base, out) != backend.OK:
            raise SystemExit(f"{mod.__name__}: a block failed to decode")
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("other", metavar="OTHER_TREE")
    ap.add_argument("trajectories", nargs="+", metavar="TRAJ_DIR")
    ap.add_argument("--first", type=int, default=0, help="start at this step pair (as tools/bench.py)")
    ap.add_argument("--pairs", type=int, default=3, help="step pairs from there (as tools/bench.py)")
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args(argv)
    sides = {"this": kernels, "other": other_kernels(args.other)}
    print("| trajectory | blocks | this tree ms (min / median) | other tree ms (min / median) | change (median) |")
    print("|---|---:|---:|---:|---:|")
    for traj in args.trajectories:
        jobs = blocks(steps_in(traj)[args.first:][: args.pairs + 1])
        outs = {k: [np.zeros(j[3], j[4].dtype) for j in jobs] for k in sides}
        times: dict[str, list[float]] = {k: [] for k in sides}
        for k, mod in sides.items():   # compile (or load) both first
            run(mod, jobs, outs[k])
        for rnd in range(args.rounds):
            for k in (("this", "other") if rnd % 2 else ("other", "this")):
                times[k].append(run(sides[k], jobs, outs[k]))
        if not all(np.array_equal(x, y) for x, y in zip(outs["this"], outs["other"])):
            raise SystemExit(f"{traj}: the two kernels decode different bytes")
        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"| {traj} | {len(jobs)} | {min(times['this']) * 1e3:.2f} / {med['this'] * 1e3:.2f} "
              f"| {min(times['other']) * 1e3:.2f} / {med['other'] * 1e3:.2f} "
              f"| {100 * (med['this'] / med['other'] - 1):+.1f} % |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
