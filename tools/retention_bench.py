"""Retention (SPEC.md S16), measured: what a pruned stream stores, and that every follower still gets there.

    python tools/retention_bench.py                         # 200 steps, --keep-last 20, keyframe every 10
    python tools/retention_bench.py --steps 200 --keep-last 20 --keyframe-every 10 --json
    python tools/retention_bench.py status --steps 2000     # arcfmt status on a 2,000-step stream (local)
    python tools/retention_bench.py status --steps 2000 --backend seaweedfs

Default mode: a small seeded model (tests/support/store.py) publishes ``--steps`` steps into a local
folder twice, once without pruning and once with ``Publisher(keep_last=N)``. Followers join at various
times (a new folder synced at step 0, 25 %, 50 %, 90 % and the last step) and keep following at various
paces (every step; every 7, 25 or 45 steps: the last two fall out of the window and re-plan from a
kept keyframe). After every step the store is listed: the most step folders, objects and bytes it ever
held, and at the end. Every follower's final folder is compared bit for bit with the last step.

``status`` mode: builds a ``--steps`` stream (local folder; with ``--backend seaweedfs`` it is then
uploaded to a SeaweedFS bucket on 127.0.0.1) and times ``arcfmt.store.status`` (one listing + the
head's keyframe chain) and a ``prune --dry-run`` on it.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

import _paths  # noqa: F401  (this checkout's arcfmt and tests/support)

from support import servers  # noqa: E402

servers.use_client_env()

import numpy as np  # noqa: E402

from arcfmt.safetensors_io import open_checkpoint  # noqa: E402
from arcfmt.store import Follower, Publisher, prune, status  # noqa: E402
from arcfmt.store.backends import Store  # noqa: E402
from support.store import publish_step, trajectory  # noqa: E402


def _same(folder, want: dict) -> bool:
    got = open_checkpoint(os.fspath(folder)).tensors()
    return set(got) == set(want) and all(
        np.ascontiguousarray(got[k]).tobytes() == np.ascontiguousarray(want[k]).tobytes() for k in want)


def _usage(url):
    listed = Store(url).list()
    ours = [e for e in listed if e.kind != "other"]
    return len({e.step for e in ours}), len(ours), sum(e.size for e in ours)


def run_retention(args, keep_last, root):
    url = os.path.join(root, "stream")
    traj = trajectory(args.steps, seed=3, layers=args.layers, d=args.width, vocab=4 * args.width)
    pubs = [Publisher(url, shard=i, num_shards=args.shards, keyframe_every=args.keyframe_every, effort="fast",
                      keep_last=keep_last) for i in range(args.shards)]
    last = args.steps - 1
    joins = sorted({0, args.steps // 4, args.steps // 2, (9 * args.steps) // 10, last})
    paces = (1, 7, 25, 45)
    followers = {}    # name -> [Follower, pace, join step, stats]
    peak = (0, 0, 0)
    for s in range(args.steps):
        publish_step(pubs, s, traj[s])
        if s in joins:
            for pace in paces:
                name = f"join{s:04d}-pace{pace}"
                f = Follower(url, os.path.join(root, name), missing_wait=0)
                followers[name] = [f, pace, s, {"steps": 0, "keyframes": 0, "bytes": 0}]
        for _name, (f, pace, join, stats) in followers.items():
            if (s - join) % pace == 0 or s == last:
                for u in f.sync():
                    stats["steps"] += 1
                    stats["keyframes"] += u.kind == "keyframe"
                    stats["bytes"] += u.bytes_downloaded
        use = _usage(url)
        peak = tuple(max(a, b) for a, b in zip(peak, use))
    final = _usage(url)
    ok = {name: (f.step == last and _same(f.into, traj[last])) for name, (f, *_rest) in followers.items()}
    return dict(keep_last=keep_last, peak_step_folders=peak[0], peak_objects=peak[1], peak_bytes=peak[2],
                final_step_folders=final[0], final_objects=final[1], final_bytes=final[2],
                followers={name: dict(joined=j, pace=p, **st, at_head_bit_identical=ok[name])
                           for name, (_f, p, j, st) in followers.items()})


def retention(args) -> int:
    out = {}
    for label, keep in (("without pruning", None), (f"keep_last={args.keep_last}", args.keep_last)):
        root = tempfile.mkdtemp(prefix="arcfmt-retention-")
        try:
            t0 = time.perf_counter()
            out[label] = run_retention(args, keep, root)
            out[label]["seconds"] = round(time.perf_counter() - t0, 1)
        finally:
            shutil.rmtree(root, ignore_errors=True)
    bound = args.keep_last + args.keyframe_every - 1
    out["bound_step_folders"] = bound
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"{args.steps} steps, {args.shards} shard(s), keyframe every {args.keyframe_every}, model "
          f"layers={args.layers} width={args.width}")
    print(f"{'':<18} {'peak folders':>12} {'peak objects':>12} {'peak bytes':>12} {'end folders':>11} "
          f"{'end objects':>11} {'end bytes':>11} {'seconds':>8}")
    for label in list(out)[:2]:
        r = out[label]
        print(f"{label:<18} {r['peak_step_folders']:>12} {r['peak_objects']:>12} {r['peak_bytes']:>12} "
              f"{r['final_step_folders']:>11} {r['final_objects']:>11} {r['final_bytes']:>11} {r['seconds']:>8}")
    pr = out[f"keep_last={args.keep_last}"]
    print(f"bound: {args.keep_last} steps of deltas + the keyframe chain they need = at most {bound} step folders; "
          f"observed at most {pr['peak_step_folders']}: {'OK' if pr['peak_step_folders'] <= bound else 'EXCEEDED'}")
    print(f"{'follower (pruned stream)':<24} {'joined':>6} {'pace':>5} {'steps':>6} {'keyframes':>9} {'bytes':>9} "
          f"{'at head, bit-identical':>22}")
    base = out["without pruning"]["followers"]
    for name, f in pr["followers"].items():
        print(f"{name:<24} {f['joined']:>6} {f['pace']:>5} {f['steps']:>6} {f['keyframes']:>9} {f['bytes']:>9} "
              f"{str(f['at_head_bit_identical']):>22}   (unpruned: {base[name]['steps']} steps, "
              f"{base[name]['keyframes']} keyframes, {base[name]['bytes']} B)")
    bad = [n for n, f in pr["followers"].items() if not f["at_head_bit_identical"]]
    bad += [n for n, f in base.items() if not f["at_head_bit_identical"]]
    return 1 if bad else 0


def status_bench(args) -> int:
    root = tempfile.mkdtemp(prefix="arcfmt-status-")
    try:
        url = os.path.join(root, "stream")
        traj = trajectory(2, seed=5, layers=1, d=16, vocab=32)
        rng = np.random.default_rng(0)
        pubs = [Publisher(url, shard=i, num_shards=args.shards, keyframe_every=args.keyframe_every, effort="fast")
                for i in range(args.shards)]
        t0 = time.perf_counter()
        cur = traj[0]
        from support.store import next_step
        for s in range(args.steps):
            publish_step(pubs, s, cur)
            cur = next_step(cur, rng)
        built = time.perf_counter() - t0
        where = [("local", url, {})]
        if args.backend != "local":
            server = servers.STARTERS[args.backend]()
            so = servers.storage_options(server)
            rurl = f"{servers.protocol(server)}://{servers.BUCKET}/status-{os.getpid()}"
            st = Store(rurl, so)
            t1 = time.perf_counter()
            st.fs.put(url + "/", st.root + "/", recursive=True)
            print(f"uploaded to {args.backend} in {time.perf_counter() - t1:.1f} s", file=sys.stderr)
            where.append((args.backend, rurl, so))
        res = {"steps": args.steps, "build_seconds": round(built, 1)}
        for label, u, so in where:
            times = []
            for _ in range(args.repeat):
                t = time.perf_counter()
                stt = status(u, storage_options=so)
                times.append(time.perf_counter() - t)
            t = time.perf_counter()
            Store(u, so).list()
            tl = time.perf_counter() - t
            t = time.perf_counter()
            dry = prune(u, keep_last=20, dry_run=True, storage_options=so)
            tp = time.perf_counter() - t
            res[label] = dict(status_seconds_best=round(min(times), 3), status_seconds_all=[round(x, 3) for x in times],
                              objects=stt.objects, committed_steps=len(stt.steps), manifests_read=stt.manifests_read,
                              new_follower_bytes=stt.new_follower_bytes, total_bytes=stt.total_bytes,
                              listing_seconds=round(tl, 3), prune_dry_run_seconds=round(tp, 3),
                              prune_would_delete=len(dry.deleted))
        print(json.dumps(res) if args.json else json.dumps(res, indent=1))
        if args.backend != "local":
            server.stop()
        return 0
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", nargs="?", default="retention", choices=["retention", "status"])
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--keep-last", type=int, default=20)
    p.add_argument("--keyframe-every", type=int, default=10)
    p.add_argument("--shards", type=int, default=2)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--backend", default="local", choices=["local", "seaweedfs", "moto", "fake-gcs"])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if args.mode == "status":
        args.steps = args.steps or 2000
        return status_bench(args)
    args.steps = args.steps or 200
    return retention(args)


if __name__ == "__main__":
    sys.exit(main())
