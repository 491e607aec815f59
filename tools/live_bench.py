#!/usr/bin/env python3
"""Live follower vs folder follower: time per step, bytes handed to the engine, memory, disk writes.

    python tools/live_bench.py --trajectory /tmp/t1              # step folders (corpus.py expand)
    python tools/live_bench.py --scale --dir /tmp/arcfmt-live    # tools/scale.py's 6.4 GB model, 2 steps
    python tools/live_bench.py --scale --layers 2 --dir /tmp/x   # the same, small

Publishes the checkpoints to a local stream (one shard per safetensors file, the first step a keyframe;
for --scale: base, target, base, target), then, each in its own process, follows it two ways from the
first step: into a folder (every step
rewritten through stage-and-swap) and live (the model in memory, `Follower(live=...)`). For each later
step: seconds, bytes a sparse update hands an engine (`update.sparse()`: positions + values) against
the changed tensors whole (`update.weights()`), peak RSS above the model itself (sampled every 5 ms),
and bytes written to disk (/proc/self/io).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from tools._paths import ROOT  # noqa: E402


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _written() -> int:
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("write_bytes:"))


class _Peak:
    """Peak resident memory while a block runs, sampled on a thread."""

    def __init__(self):
        self.peak = 0
        self._stop = threading.Event()

    def __enter__(self):
        self.peak = _rss()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def _run(self):
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, _rss())

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, _rss())


def worker(mode: str, url: str, work: str) -> None:
    """One follower, in a process of its own; prints one JSON line per timed step."""
    from arcfmt.safetensors_io import open_checkpoint
    from arcfmt.store import Follower

    if mode == "live":
        fol = Follower(url, live={})
    else:
        fol = Follower(url, os.path.join(work, "folder"))
    first = fol.sync(until=0)               # the first step (a keyframe) is not timed
    arrays = fol.live if mode == "live" else open_checkpoint(fol.into).tensors()
    model = sum(int(a.nbytes) for a in arrays.values())
    del arrays
    assert first and first[0].step == 0
    while True:
        base_rss = _rss()
        w0 = _written()
        with _Peak() as peak:
            steps = fol._run(None)           # a generator: each next() applies one verified step
            try:
                upd = next(steps)
            except StopIteration:
                break
            finally:
                steps.close()
        print(json.dumps(dict(mode=mode, step=upd.step, seconds=upd.seconds, model_bytes=model,
                              sparse_bytes=upd.sparse_bytes if mode == "live" else None,
                              whole_bytes=sum(int(a.nbytes) for _, a in upd.weights()),
                              values_changed=upd.values_changed if mode == "live" else None,
                              peak_above_model=peak.peak - base_rss, disk_written=_written() - w0,
                              downloaded=upd.bytes_downloaded)), flush=True)


def publish(folders: list, url: str) -> None:
    from arcfmt.store import Publisher

    def shards(d):   # a checkpoint file is one shard; a folder, one per safetensors file in it
        if os.path.isfile(d):
            return [d]
        return [os.path.join(d, f) for f in sorted(os.listdir(d)) if f.endswith(".safetensors")]

    n = len(shards(folders[0]))
    pubs = [Publisher(url, shard=i, num_shards=n, keyframe_every=0, effort="fast") for i in range(n)]
    for step, d in enumerate(folders):
        t = time.perf_counter()
        for p, f in zip(pubs, shards(d)):
            p.publish(step, f)
        print(f"published step {step} in {time.perf_counter() - t:.1f} s", file=sys.stderr, flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trajectory", help="a folder of stepNNNN checkpoints, files or folders (corpus.py expand)")
    ap.add_argument("--scale", action="store_true", help="tools/scale.py's synthetic model (base + target)")
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--dir", default="/tmp/arcfmt-live")
    ap.add_argument("--steps", type=int, default=6, help="steps of --trajectory to use")
    ap.add_argument("--modes", default="folder,live", help="which followers to run (default folder,live)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args.worker, args.url, args.dir)
        return 0
    os.makedirs(args.dir, exist_ok=True)
    if args.scale:
        from tools.scale import shapes_3b, write_pair
        folders = [os.path.join(args.dir, "step0000"), os.path.join(args.dir, "step0001")]
        if not all(os.path.exists(os.path.join(f, "model.safetensors.index.json")) for f in folders):
            write_pair(*folders, shapes_3b(args.layers))
        folders += folders   # steps 2 and 3 go back and forth: as many changes per step, and a warm second step
    elif args.trajectory:
        folders = sorted(os.path.join(args.trajectory, d) for d in os.listdir(args.trajectory)
                         if re.fullmatch(r"step\d+(\.safetensors)?", d))[: args.steps]
    else:
        ap.error("give --trajectory or --scale")
    url = os.path.join(args.dir, "stream")
    if not os.path.exists(os.path.join(url, "head.json")):
        publish(folders, url)
    rows = []
    for mode in args.modes.split(","):
        subprocess.run(["rm", "-rf", os.path.join(args.dir, "folder")], check=True)
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", mode, "--url", url, "--dir", args.dir]
        p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        if p.returncode:
            print(p.stderr, file=sys.stderr)
            return 1
        rows += [json.loads(line) for line in p.stdout.splitlines()]
    if args.json:
        print(json.dumps(rows))
        return 0
    mib = 1 << 20
    print(f"{'mode':7} {'step':>4} {'s/step':>7} {'to engine':>12} {'% model':>8} {'whole':>10} {'peak RSS +':>11} "
          f"{'disk written':>13}")
    for r in rows:
        eng = r["sparse_bytes"] if r["mode"] == "live" else r["whole_bytes"]
        print(f"{r['mode']:7} {r['step']:>4} {r['seconds']:>7.2f} {eng / mib:>10.2f} M "
              f"{100 * eng / r['model_bytes']:>7.2f}% {r['whole_bytes'] / mib:>8.1f} M "
              f"{r['peak_above_model'] / mib:>9.1f} M {r['disk_written'] / mib:>11.1f} M")
    means = {}
    for mode in ("folder", "live"):
        rs = [r for r in rows if r["mode"] == mode][1:]   # the first timed step also pays first-use costs
        if rs:
            means[mode] = sum(r["seconds"] for r in rs) / len(rs)
            print(f"{mode}: mean {means[mode]:.2f} s/step over {len(rs)} warm steps, "
                  f"model {rs[0]['model_bytes'] / mib:.1f} MiB")
    if len(means) == 2:
        print(f"live follower: {means['folder'] / means['live']:.1f}x faster per step than the folder follower")
    return 0


if __name__ == "__main__":
    sys.exit(main())
