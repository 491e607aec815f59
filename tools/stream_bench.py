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

from arcfmt.safetensors_io import open_checkpoint, write_file  # noqa: E402
from arcfmt.store import Follower, Publisher  # noqa: E402

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
    ap.add_argument("trajectory", help="folder with step0000.safetensors, step0001.safetensors, ...")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--backend", choices=["seaweedfs", "moto", "fake-gcs", "local"], default="seaweedfs")
    ap.add_argument("--keyframe-every", type=int, default=5)
    ap.add_argument("--effort", default="default", choices=["fast", "default", "max"])
    ap.add_argument("--tensors", action="append", help="the filtered follower's patterns (default: the MLPs)")
    ap.add_argument("--interval", type=float, default=0.02, help="followers' head poll interval (s)")
    ap.add_argument("--bandwidth", type=float, default=125.0,
                    help="MB/s of a cross-region link, for the modelled transfer times (default 125 = 1 Gbit/s)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

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
                      effort=args.effort, tmp_dir=work) for i in range(n)]
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
                for upd in fol.sync():
                    done[name][upd.step] = (time.perf_counter(), upd)
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


if __name__ == "__main__":
    sys.exit(main())
