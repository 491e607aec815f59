"""Delta streams over object storage, measured: bytes a follower downloads, requests, end-to-end time.

    python tools/stream_bench.py /tmp/t3                      # SeaweedFS on 127.0.0.1 (tests/support/servers.py)
    python tools/stream_bench.py /tmp/t3 --backend moto --steps 10 --shards 4 --json

A trajectory folder (``step0000.safetensors`` …, e.g. from ``../shared/corpus/corpus.py expand``) is
cut into ``--shards`` trainer shards. For every step, all shards publish concurrently (threads), and
two followers poll the head: one keeps the whole model, one only the MLP tensors (``--tensors``).
Printed per step and follower: bytes downloaded vs the bytes of the records it needs + its
index/trailer reads, requests per shard, and the time from the start of ``publish`` to the
follower's verified, swapped checkpoint — against downloading the full checkpoint (all shard files,
concurrently) from the same server.

    python tools/stream_bench.py --regions 3 --followers 4 --steps 8     # mirrors: cross-region bytes

``--regions R`` measures regional mirrors instead (SPEC.md S17), on local folders — one folder per
region standing for its bucket (or ``--backend memory``: one memory:// root per region). Region 0
holds the trainer's stream; each of the R - 1 other regions has ``--followers`` N followers. Run once
*without* mirrors (every remote follower reads region 0) and once *with* them (one ``Mirror`` per
remote region copies each step into the region's folder, and the region's followers follow that),
the trainer publishing the same M steps live each time. Every byte is counted where it is read: each
reader of region 0's stream gets its own metered filesystem (every ``cat_file`` answer — which every
head poll, JSON object and range read goes through — is added up, by kind: head, other JSON, data
objects), so "cross-region bytes" is what readers outside region 0 actually read from it. Latency:
seconds from the trainer's head move to the region's mirror head move, and to each follower's
verified, swapped folder. With no TRAJECTORY, a seeded model (``--layers``, ``--width``) is stepped the
way an RL step looks (tests/support/store.py).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
import _paths  # noqa: E402, F401  (this checkout's arcfmt and tests/support)

from support import servers  # noqa: E402  (starts the local servers)

servers.use_client_env()

import fsspec  # noqa: E402
from fsspec.implementations.local import LocalFileSystem  # noqa: E402
from fsspec.implementations.memory import MemoryFileSystem  # noqa: E402

from arcfmt.safetensors_io import open_checkpoint, write_file  # noqa: E402
from arcfmt.store import Follower, Mirror, Publisher  # noqa: E402
from arcfmt.store.errors import NoStreamError  # noqa: E402

DEFAULT_FILTER = ["encoder.layer.*.intermediate.dense.*", "encoder.layer.[0-9].output.dense.*",
                  "model.layers.*.mlp.*"]


def shard_names(tensors: dict, n: int) -> list:
    """Contiguous groups of tensor names with about the same bytes each."""
    names = list(tensors)
    sizes = [tensors[k].nbytes for k in names]
    total = sum(sizes)
    groups, cur, acc = [], [], 0
    for k, s in zip(names, sizes):
        cur.append(k)
        acc += s
        if acc >= total * (len(groups) + 1) / n and len(groups) < n - 1:
            groups.append(cur)
            cur = []
    groups.append(cur)
    while len(groups) < n:   # fewer tensors than shards: split the largest group
        big = max(range(len(groups)), key=lambda i: len(groups[i]))
        g = groups.pop(big)
        groups[big:big] = [g[: len(g) // 2], g[len(g) // 2:]]
    return groups


def fmt(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trajectory", nargs="?", help="folder with step0000.safetensors, step0001.safetensors, ... "
                                                  "(--regions: optional, else a seeded model)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--backend", choices=["seaweedfs", "moto", "fake-gcs", "local", "memory"], default=None,
                    help="default: seaweedfs (--regions: local; it takes local or memory only)")
    ap.add_argument("--regions", type=int, help="measure mirrors: this many regions (region 0: the trainer's)")
    ap.add_argument("--followers", type=int, default=4, help="--regions: followers per remote region (default 4)")
    ap.add_argument("--layers", type=int, default=4, help="--regions without TRAJECTORY: the model's layers")
    ap.add_argument("--width", type=int, default=256, help="--regions without TRAJECTORY: the model's width")
    ap.add_argument("--keyframe-every", type=int, default=5)
    ap.add_argument("--effort", default="default", choices=["fast", "default", "max"])
    ap.add_argument("--no-history", action="store_true",
                    help="publish no delta that needs the previous step (format 1.9; as `arcfmt publish --no-history`)")
    ap.add_argument("--tensors", action="append", help="the filtered follower's patterns (default: the MLPs)")
    ap.add_argument("--interval", type=float, default=0.02, help="followers' head poll interval (s)")
    ap.add_argument("--bandwidth", type=float, default=125.0,
                    help="MB/s of a cross-region link, for the modelled transfer times (default 125 = 1 Gbit/s)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.regions is not None:
        if args.regions < 2 or args.followers < 1:
            ap.error("--regions needs at least 2 regions and --followers at least 1")
        if args.backend not in (None, "local", "memory"):
            ap.error("--regions runs on local folders or memory:// roots (--backend local or memory)")
        return regions_main(args)
    args.backend = args.backend or "seaweedfs"
    if args.backend == "memory":
        ap.error("--backend memory is for --regions only")
    if not args.trajectory:
        ap.error("give a TRAJECTORY folder")

    files = sorted(f for f in os.listdir(args.trajectory) if f.startswith("step") and f.endswith(".safetensors"))
    files = files[: args.steps]
    if len(files) < 2:
        ap.error(f"{args.trajectory} has fewer than 2 step files")
    ckpts = [open_checkpoint(os.path.join(args.trajectory, f)).tensors() for f in files]
    groups = shard_names(ckpts[0], args.shards)
    model_bytes = sum(a.nbytes for a in ckpts[0].values())
    patterns = args.tensors or DEFAULT_FILTER

    work = tempfile.mkdtemp(prefix="arcfmt-stream-bench-")
    server = None
    if args.backend == "local":
        url, so = os.path.join(work, "stream"), {}
        base_url = os.path.join(work, "full")
    else:
        server = servers.STARTERS[args.backend]()
        url = f"{servers.protocol(server)}://{servers.BUCKET}/bench-{os.getpid()}"
        so = servers.storage_options(server)
        base_url = f"{url}-full"
    try:
        return run(args, ckpts, groups, model_bytes, patterns, work, url, so, base_url)
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(work, ignore_errors=True)


def run(args, ckpts, groups, model_bytes, patterns, work, url, so, base_url) -> int:
    n = args.shards
    pubs = [Publisher(url, shard=i, num_shards=n, keyframe_every=args.keyframe_every, storage_options=so,
                      effort=args.effort, tmp_dir=work, history=not args.no_history) for i in range(n)]
    followers = {
        "full": Follower(url, os.path.join(work, "f-full"), storage_options=so),
        "filtered": Follower(url, os.path.join(work, "f-mlp"), tensors=patterns, storage_options=so),
    }
    done = {k: {} for k in followers}       # follower -> {step: (wall time, StepUpdate)}
    stop = threading.Event()
    errors = []

    def follow(name, fol):
        try:
            while not stop.is_set():
                try:
                    for upd in fol.sync():
                        done[name][upd.step] = (time.perf_counter(), upd)
                except NoStreamError:   # the trainer has not published its first step yet
                    pass
                time.sleep(args.interval)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append((name, exc))

    threads = [threading.Thread(target=follow, args=kv, daemon=True) for kv in followers.items()]
    for t in threads:
        t.start()
    try:
        # the full checkpoint as plain objects, for the baseline download
        fs, root = fsspec.core.url_to_fs(base_url, **so)
        if args.backend == "local":
            os.makedirs(root, exist_ok=True)
        full_paths = []
        for i, g in enumerate(groups):
            local = os.path.join(work, f"full-{i}.safetensors")
            write_file(local, {k: ckpts[0][k] for k in g})
            p = f"{root}/model-{i + 1:05d}-of-{n:05d}.safetensors"
            fs.put_file(local, p)
            full_paths.append(p)
        full_bytes = sum(os.path.getsize(os.path.join(work, f"full-{i}.safetensors")) for i in range(n))

        rows = []
        for step, tensors in enumerate(ckpts):
            parts = [{k: tensors[k] for k in g} for g in groups]
            t0 = time.perf_counter()
            results = [None] * n

            def pub(i, results=results, step=step, parts=parts):  # run and joined within this iteration
                results[i] = pubs[i].publish(step, parts[i])

            pts = [threading.Thread(target=pub, args=(i,)) for i in range(n)]
            for t in pts:
                t.start()
            for t in pts:
                t.join()
            t_pub = time.perf_counter() - t0
            deadline = time.monotonic() + 600
            while any(step not in done[k] for k in done) and not errors and time.monotonic() < deadline:
                time.sleep(0.005)
            if errors:
                raise errors[0][1]
            delta_bytes = sum(r.delta.size for r in results if r.delta is not None)
            kf_bytes = sum(r.keyframe.size for r in results if r.keyframe is not None)
            row = dict(step=step, publish_s=t_pub, delta_bytes=delta_bytes, keyframe_bytes=kf_bytes,
                       encode_s=max(r.encode_seconds for r in results))
            for name in followers:
                t_done, upd = done[name][step]
                row[name] = dict(kind=upd.kind, e2e_s=t_done - t0, apply_s=upd.seconds, bytes=upd.bytes_downloaded,
                                 needed=upd.bytes_needed, tail=upd.tail_bytes,
                                 ratio=upd.bytes_downloaded / max(1, upd.bytes_needed + upd.tail_bytes),
                                 requests=upd.requests, shards_read=upd.shards_read,
                                 requests_per_shard=upd.requests / upd.shards, tensors=upd.tensors)
            rows.append(row)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)

    # baseline: download the full checkpoint (every shard file, concurrently) from the same server
    base_times = []
    for _ in range(3):
        t0 = time.perf_counter()
        data = fs.cat(full_paths)
        base_times.append(time.perf_counter() - t0)
        assert sum(len(v) for v in data.values()) == full_bytes
    t0 = time.perf_counter()
    fs.put([os.path.join(work, f"full-{i}.safetensors") for i in range(n)],
           [p + ".again" for p in full_paths])
    upload_full = time.perf_counter() - t0
    baseline = statistics.median(base_times)

    deltas = [r for r in rows if r["step"] > 0]
    summary = dict(
        backend=args.backend, steps=len(rows), shards=n, model_bytes=model_bytes, full_checkpoint_bytes=full_bytes,
        filter=patterns, keyframe_every=args.keyframe_every,
        mean_delta_bytes=statistics.mean(r["delta_bytes"] for r in deltas),
        delta_ratio_percent=100 * statistics.mean(r["delta_bytes"] for r in deltas) / model_bytes,
        download_full_s=baseline, upload_plus_download_full_s=upload_full + baseline,
        bandwidth_mb_s=args.bandwidth,
    )
    bw = args.bandwidth * 1e6
    for name in followers:
        ds = [r[name] for r in deltas]
        summary[name] = dict(
            max_ratio=max(d["ratio"] for d in ds), mean_bytes=statistics.mean(d["bytes"] for d in ds),
            max_requests_per_shard=max(d["requests_per_shard"] for d in ds),
            median_e2e_s=statistics.median(d["e2e_s"] for d in ds), max_e2e_s=max(d["e2e_s"] for d in ds),
            median_apply_s=statistics.median(d["apply_s"] for d in ds),
            modelled_transfer_s=statistics.mean(d["bytes"] for d in ds) / bw,
            bootstrap=dict(kind=rows[0][name]["kind"], bytes=rows[0][name]["bytes"], e2e_s=rows[0][name]["e2e_s"]))
    if args.json:
        print(json.dumps(dict(summary=summary, steps=rows)))
        return 0
    print(f"stream bench: {args.trajectory}, {len(rows)} steps, {n} shards, backend {args.backend}, "
          f"model {fmt(model_bytes)}, keyframe every {args.keyframe_every} steps, filter {patterns}")
    print(f"{'step':>4} {'delta':>10} {'publish':>8} | {'follower':8} {'kind':8} {'down':>10} {'needed+tail':>12} "
          f"{'ratio':>6} {'req/shard':>9} {'apply':>6} {'e2e':>6}")
    print("(publish: slowest shard's encode + upload + commit; req/shard: range requests / shards of the step; "
          "e2e: publish start → verified, swapped folder)")
    for r in rows:
        for j, name in enumerate(followers):
            f = r[name]
            head = f"{r['step']:>4} {fmt(r['delta_bytes']):>10} {r['publish_s']:>7.2f}s" if j == 0 else " " * 24
            print(f"{head} | {name:8} {f['kind']:8} {fmt(f['bytes']):>10} {fmt(f['needed'] + f['tail']):>12} "
                  f"{f['ratio']:>6.3f} {f['requests_per_shard']:>9.2f} {f['apply_s']:>5.2f}s {f['e2e_s']:>5.2f}s")
    print(f"mean delta {fmt(summary['mean_delta_bytes'])} ({summary['delta_ratio_percent']:.3f} % of the model)")
    for name in followers:
        s = summary[name]
        print(f"{name:8}: downloaded/(needed+tail) max {s['max_ratio']:.3f}; requests per shard per step max "
              f"{s['max_requests_per_shard']:.2f}; publish→verified checkpoint median {s['median_e2e_s']:.2f} s "
              f"(max {s['max_e2e_s']:.2f} s); bootstrap ({s['bootstrap']['kind']}) {fmt(s['bootstrap']['bytes'])}")
    print(f"full checkpoint ({fmt(full_bytes)}): download {baseline:.2f} s; upload + download "
          f"{summary['upload_plus_download_full_s']:.2f} s (all on 127.0.0.1)")
    print(f"at {args.bandwidth:.0f} MB/s between regions: full checkpoint {full_bytes / bw:.3f} s per step; "
          + "; ".join(f"{name} follower's bytes {summary[name]['modelled_transfer_s'] * 1000:.2f} ms"
                      for name in followers))
    return 0


# ============================================================================ --regions: mirrors

class _Metered:
    """A filesystem read through a meter: every byte ``cat_file`` returns is counted (the stream
    layer's every read of a local or generic store — head polls, JSON objects, range reads through
    ``cat_ranges`` — goes through it), by the kind of object read."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.meter = {"head": 0, "json": 0, "data": 0, "reads": 0}
        self._meter_lock = threading.Lock()

    def cat_file(self, path, start=None, end=None, **kw):
        data = super().cat_file(path, start=start, end=end, **kw)
        _count(self, path, data)
        return data


class MeteredLocal(_Metered, LocalFileSystem):
    """A local folder through the meter."""


class MeteredMemory(_Metered, MemoryFileSystem):
    """The meter on a memory filesystem (one shared store per process, as memory:// is)."""


# a follower of a root with no stream yet raises this (where the follower has it), instead of waiting
NO_STREAM = getattr(__import__("arcfmt.store.errors", fromlist=["x"]), "NoStreamError", ())


def _count(fs, path, data) -> None:
    kind = "head" if str(path).endswith("/head.json") else "data" if str(path).endswith(".arc") else "json"
    with fs._meter_lock:
        fs.meter[kind] += len(data)
        fs.meter["reads"] += 1


def _metered(backend: str):
    """A fresh metered filesystem for one reader (never a cached instance shared with another)."""
    cls = MeteredMemory if backend == "memory" else MeteredLocal
    return cls(skip_instance_cache=True)


def _synthetic(args) -> list:
    from support.store import trajectory

    return trajectory(steps=args.steps, seed=7, layers=args.layers, d=args.width, vocab=4000)


def regions_main(args) -> int:
    if args.trajectory:
        files = sorted(f for f in os.listdir(args.trajectory) if f.startswith("step") and f.endswith(".safetensors"))
        ckpts = [open_checkpoint(os.path.join(args.trajectory, f)).tensors() for f in files[: args.steps]]
    else:
        ckpts = _synthetic(args)
    backend = args.backend or "local"
    groups = shard_names(ckpts[0], args.shards)
    model_bytes = sum(a.nbytes for a in ckpts[0].values())
    work = tempfile.mkdtemp(prefix="arcfmt-regions-bench-")
    try:
        phases = {mode: run_regions(args, ckpts, groups, work, backend, mode) for mode in ("direct", "mirror")}
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if backend == "memory":
            fs = MemoryFileSystem()
            if fs.exists(f"/regions-bench-{os.getpid()}"):
                fs.rm(f"/regions-bench-{os.getpid()}", recursive=True)
    return report_regions(args, backend, ckpts, model_bytes, phases)


def run_regions(args, ckpts, groups, work, backend, mode) -> dict:
    """One live run: the trainer publishes every step into region 0; remote followers read region 0
    (``direct``) or their region's mirror (``mirror``). Returns the meters, sizes and timings."""
    n, regions, nf = args.shards, args.regions, args.followers

    def root(r):
        return f"memory://regions-bench-{os.getpid()}/{mode}/region{r}" if backend == "memory" else \
            os.path.join(work, mode, f"region{r}", "run42")

    src = root(0)
    pubs = [Publisher(src, shard=i, num_shards=n, keyframe_every=args.keyframe_every, effort=args.effort,
                      tmp_dir=work) for i in range(n)]
    readers = {}        # (region, who) -> metered filesystem reading region 0's stream
    mirrors = {}
    if mode == "mirror":
        for r in range(1, regions):
            readers[(r, "mirror")] = fs = _metered(backend)
            mirrors[r] = Mirror(src, root(r), src_fs=fs, tmp_dir=os.path.join(work, f"mirror-tmp-{r}"))
    followers = {}
    region_fs = {}      # followers' reads of their own region's mirror (not cross-region)
    for r in range(1, regions):
        for i in range(nf):
            fs = _metered(backend)
            if mode == "direct":
                readers[(r, f"follower{i}")] = fs
                url = src
            else:
                region_fs[(r, i)] = fs
                url = root(r)
            followers[(r, i)] = Follower(url, os.path.join(work, mode, f"fleet{r}", f"f{i}"), fs=fs, workers=1)
    t_head: dict = {}
    t_mirror: dict = {r: {} for r in mirrors}
    t_applied: dict = {k: {} for k in followers}
    stop = threading.Event()
    errors: list = []

    def run_mirror(r, mir):
        try:
            while not stop.is_set():
                if t_head:        # once the trainer's stream exists (before it, sync() says "no stream")
                    for res in mir.sync():
                        if res.head_moved:
                            t_mirror[r][res.step] = time.perf_counter()
                time.sleep(args.interval)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append((f"mirror {r}", exc))

    def run_follower(key, fol):
        try:
            while not stop.is_set():
                try:
                    for upd in fol.sync():
                        t_applied[key][upd.step] = time.perf_counter()
                except NO_STREAM:
                    pass          # the region's mirror has not copied its first step yet
                time.sleep(args.interval)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append((f"follower {key}", exc))

    threads = [threading.Thread(target=run_mirror, args=kv, daemon=True) for kv in mirrors.items()]
    threads += [threading.Thread(target=run_follower, args=kv, daemon=True) for kv in followers.items()]
    for t in threads:
        t.start()
    published = []
    try:
        for step, tensors in enumerate(ckpts):
            parts = [{k: tensors[k] for k in g} for g in groups]
            res = [p.publish(step, parts[i]) for i, p in enumerate(pubs)]
            t_head[step] = time.perf_counter()     # the last shard's publish moved the head
            assert res[-1].commit.head == step, res[-1].commit
            published.append(sum(o.size for r in res for o in (r.delta, r.keyframe) if o is not None))
            deadline = time.monotonic() + 600
            while any(step not in t for t in t_applied.values()) and not errors and time.monotonic() < deadline:
                time.sleep(0.005)
            if errors:
                raise errors[0][1]
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    # every remote follower holds the last step, bit for bit (a mirror is a stream, followed unchanged)
    last = ckpts[-1]
    for fol in followers.values():
        got = open_checkpoint(fol.into).tensors()
        assert set(got) == set(last) and all(got[k].tobytes() == last[k].tobytes() for k in last), fol.into
    cross = {k: dict(fs.meter) for k, fs in readers.items()}
    return dict(t_head=t_head, t_mirror=t_mirror, t_applied=t_applied, cross=cross, published=published,
                region={k: dict(fs.meter) for k, fs in region_fs.items()})


def report_regions(args, backend, ckpts, model_bytes, phases) -> int:
    steps, remote, nf = len(ckpts), args.regions - 1, args.followers
    published = phases["direct"]["published"]
    step_bytes = sum(published)                    # every object of every step, as the trainer wrote them

    def total(mode, kind=None):
        return sum(v[kind] if kind else v["head"] + v["json"] + v["data"] for v in phases[mode]["cross"].values())

    def lat(mode, which):
        p = phases[mode]
        out = []
        for s in range(steps):
            if which == "mirror":
                out += [p["t_mirror"][r][s] - p["t_head"][s] for r in p["t_mirror"] if s in p["t_mirror"][r]]
            else:
                out += [t[s] - p["t_head"][s] for t in p["t_applied"].values() if s in t]
        return out

    summary = dict(backend=backend, regions=args.regions, followers_per_region=nf, steps=steps, shards=args.shards,
                   model_bytes=model_bytes, published_bytes=step_bytes, interval_s=args.interval)
    for mode in ("direct", "mirror"):
        summary[mode] = dict(
            cross_region_bytes=total(mode), cross_region_data_bytes=total(mode, "data"),
            cross_region_json_bytes=total(mode, "json"), cross_region_head_bytes=total(mode, "head"),
            cross_region_reads=total(mode, "reads"),
            copies_per_region=total(mode, "data") / max(1, remote * step_bytes),
            follower_lag_s=dict(median=statistics.median(lat(mode, "follower")), max=max(lat(mode, "follower"))))
    m = summary["mirror"]
    m["mirror_lag_s"] = dict(median=statistics.median(lat("mirror", "mirror")), max=max(lat("mirror", "mirror")))
    m["in_region_bytes"] = sum(v["head"] + v["json"] + v["data"] for v in phases["mirror"]["region"].values())
    if args.json:
        print(json.dumps(summary))
        return 0
    d = summary["direct"]
    where = "local folders, one per region" if backend == "local" else "memory:// roots, one per region"
    print(f"regions bench ({where}): {args.regions} regions (region 0: the trainer's), {nf} followers in each "
          f"of the {remote} remote regions, {steps} steps, {args.shards} shards, model {fmt(model_bytes)}, "
          f"keyframe every {args.keyframe_every}; head polls every {args.interval:g} s")
    print(f"the trainer wrote {fmt(step_bytes)} of data objects in all ({fmt(published[0])} at step 0, then "
          f"{fmt(statistics.mean(published[1:]))} per step on average)")
    print("cross-region bytes = bytes read from region 0's stream by readers outside region 0, metered per reader:")
    print(f"{'':22} {'total':>11} {'data objects':>13} {'other JSON':>11} {'head polls':>11} {'reads':>7} "
          f"{'data read / (regions x written)':>32}")
    for mode, label in (("direct", f"no mirror ({nf}/region)"), ("mirror", "one mirror per region")):
        x = summary[mode]
        print(f"{label:22} {fmt(x['cross_region_bytes']):>11} {fmt(x['cross_region_data_bytes']):>13} "
              f"{fmt(x['cross_region_json_bytes']):>11} {fmt(x['cross_region_head_bytes']):>11} "
              f"{x['cross_region_reads']:>7} {x['copies_per_region']:>32.3f}")
    print("(a mirror copies every data object the trainer wrote once per region — a keyframe step's delta and "
          "keyframe both, so that new followers start in-region; each follower reads what its path needs)")
    print(f"saved: {fmt(d['cross_region_bytes'] - m['cross_region_bytes'])} "
          f"({d['cross_region_bytes'] / max(1, m['cross_region_bytes']):.2f}x fewer cross-region bytes); "
          f"the mirrored regions' followers read {fmt(m['in_region_bytes'])} inside their regions")
    print("latency after the trainer's head moved (median / max over steps, regions and followers):")
    print(f"  no mirror: follower applied   {d['follower_lag_s']['median']:.3f} s / {d['follower_lag_s']['max']:.3f} s")
    print(f"  mirror:    mirror head moved  {m['mirror_lag_s']['median']:.3f} s / {m['mirror_lag_s']['max']:.3f} s")
    print(f"             follower applied   {m['follower_lag_s']['median']:.3f} s / {m['follower_lag_s']['max']:.3f} s"
          f"  (extra over no mirror: {m['follower_lag_s']['median'] - d['follower_lag_s']['median']:+.3f} s median)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
