#!/usr/bin/env python3
"""What an ``arcfmt`` command costs before and around its work: wall seconds of whole commands.

    python tools/startup.py TRAJ_DIR [--runs N] [--other-tree DIR] [--json]

On the last step pair of a trajectory (two .safetensors files), times ``arcfmt --version``, ``apply``
(to a new file), ``encode`` and three ``publish`` calls with ``--state`` (a keyframe, a delta, a delta
with the previous step), each in a new process as a user or a trainer's loop runs them, and prints min
and median seconds per command, and which heavy modules the command imported. ``--other-tree``: the
same commands of another checkout (e.g. a ``git worktree`` of the previous commit), run alternately
with this one's, so the machine's swings hit both alike. The kernels must be compiled in each tree
first (``arcfmt warm-up``), or the first runs time the compile.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import _paths

WATCH = ("ml_dtypes", "numba", "arcfmt.store.publisher", "arcfmt.store.follower")
PROBE = ("import runpy, sys\nsys.argv = ['arcfmt'] + sys.argv[1:]\n"
         "try:\n    runpy.run_module('arcfmt', run_name='__main__')\nexcept SystemExit:\n    pass\n"
         "print(' '.join(m for m in {watch!r} if m in sys.modules), file=sys.stderr)\n")


def commands(base: str, target: str, work: str) -> list[tuple[str, list[str]]]:
    state, stream = os.path.join(work, "state"), os.path.join(work, "stream")
    out = [("version", ["--version"]),
           ("apply", ["-q", "apply", base, os.path.join(work, "d.arc"), "-o", os.path.join(work, "o.safetensors")]),
           ("encode", ["-q", "encode", base, target, "-o", os.path.join(work, "e.arc")])]
    for k, (what, path) in enumerate((("keyframe", base), ("delta", target), ("delta+previous", base))):
        out.append((f"publish {what}", ["-q", "publish", stream, "--step", str(k), "--state", state, path]))
    return out


def run_tree(tree: str, argv: list[str], work: str) -> tuple[float, str]:
    env = {**os.environ, "PYTHONPATH": tree}
    t = time.perf_counter()   # (run in ``work``: ``python -c`` puts the working folder first on sys.path)
    p = subprocess.run([sys.executable, "-c", PROBE.format(watch=WATCH), *argv], env=env, capture_output=True,
                       text=True, timeout=600, cwd=work)
    dt = time.perf_counter() - t
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed in {tree}:\n{p.stderr[-2000:]}")
    return dt, p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trajectory")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--other-tree")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    files = sorted(glob.glob(os.path.join(args.trajectory, "*.safetensors")))
    if len(files) < 2:
        raise SystemExit(f"{args.trajectory}: needs two .safetensors checkpoints")
    base, target = files[-2], files[-1]
    trees = {"this": _paths.ROOT}
    if args.other_tree:
        trees["other"] = os.path.abspath(args.other_tree)
    times: dict[str, dict[str, list[float]]] = {t: {} for t in trees}
    imported: dict[str, dict[str, str]] = {t: {} for t in trees}
    base, target = os.path.abspath(base), os.path.abspath(target)
    work = tempfile.mkdtemp(prefix="arcfmt-startup-")
    try:
        run_tree(_paths.ROOT, ["-q", "encode", base, target, "-o", os.path.join(work, "d.arc")], work)
        for tree in trees.values():   # each tree's check that it is the one imported
            p = subprocess.run([sys.executable, "-c", "import arcfmt; print(arcfmt.__file__)"], capture_output=True,
                               text=True, env={**os.environ, "PYTHONPATH": tree}, cwd=work, check=True)
            assert p.stdout.strip().startswith(tree), (tree, p.stdout)
        for _ in range(args.runs):
            for tree_name, tree in trees.items():
                for p in ("o.safetensors", "e.arc", "state", "stream"):
                    shutil.rmtree(os.path.join(work, p), ignore_errors=True)
                    if os.path.isfile(os.path.join(work, p)):
                        os.remove(os.path.join(work, p))
                for name, cmd in commands(base, target, work):
                    dt, mods = run_tree(tree, cmd, work)
                    times[tree_name].setdefault(name, []).append(dt)
                    imported[tree_name][name] = mods
    finally:
        shutil.rmtree(work, ignore_errors=True)
    res = {t: {n: {"min_s": min(v), "median_s": statistics.median(v), "imports": imported[t][n]}
               for n, v in times[t].items()} for t in trees}
    if args.json:
        print(json.dumps({"base": base, "target": target, "trees": trees, "results": res}, indent=2))
        return 0
    print(f"{os.path.basename(base)} -> {os.path.basename(target)}, {args.runs} runs a command")
    print("| command | " + " | ".join(f"{t}: min / median s" for t in trees) + " | imported (this) |")
    print("|---|" + "---:|" * len(trees) + "---|")
    for n in res["this"]:
        cells = " | ".join(f"{res[t][n]['min_s']:.2f} / {res[t][n]['median_s']:.2f}" for t in trees)
        print(f"| {n} | {cells} | {res['this'][n]['imports'] or '-'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
