"""Load: one publisher and 8 followers on a loopback object store, every step checked bit for bit.

    python tools/load.py /tmp/t1                       # SeaweedFS on 127.0.0.1 (tests/support/servers.py), 50 steps
    python tools/load.py /tmp/t1 --backend moto --steps 20 --json

A trajectory folder (``step0000.safetensors`` ..., e.g. from ``../shared/corpus/corpus.py expand``) is
published step after step by one publisher process (``--shards`` trainer shards, published in turn,
a keyframe every ``--keyframe-every`` steps). If the folder has fewer files than ``--steps``, the
missing steps are synthesized from the last one the way an RL step looks (``--density`` of the
values of every floating-point tensor move by one unit in the last place, seeded) and written
beside the others in the work folder, so that they too are checked against files.

Eight follower processes (``arcfmt.Follower.follow``) keep their own folder at the stream's head:
  full-1 .. full-3   every tensor;
  filter-mlp/attn/embed  only the tensors matching shell patterns (``--filter NAME=PATTERN,...``);
  late               every tensor, started once the publisher has committed ``--late-at`` (default:
                     60 % of the steps): it bootstraps from the latest keyframe;
  restarted          every tensor, SIGKILLed while it downloads a step after ``--kill-at`` (default:
                     30 %; once ``--kill-after-chunks`` chunks of it have arrived), restarted
                     ``--restart-after`` seconds later: it resumes, reusing the chunks it had.
Each follower checks, for every step it reports, every tensor of its folder against the trajectory's
file of that step (xxh3-64 of the bytes, computed beforehand from the files) and the set of tensor
names against its selection. The tool prints per follower: steps, bytes downloaded (total, per step,
against the full checkpoint), requests, lag (publish committed → verified folder, in seconds; and
in steps behind the head), apply time and throughput; ``--json`` prints everything, per step
included. Exit status 0 only if every follower reached the last step and every step it reported
was bit-exact.
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
import _paths  # noqa: E402, F401  (this checkout's arcfmt and tests/support)

from support import servers  # noqa: E402  (starts the local servers)
from support.store import next_step  # noqa: E402  (one RL-like step of a model)

servers.use_client_env()

DEFAULT_FILTERS = {
    "filter-mlp": ["encoder.layer.*.intermediate.dense.*", "encoder.layer.*.output.dense.*", "*.mlp.*"],
    "filter-attn": ["encoder.layer.*.attention.*", "*.self_attn.*"],
    "filter-embed": ["embeddings.*", "*embed_tokens*", "*.norm.*"],
}


def fmt(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024


def pct(xs, q):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    return xs[min(len(xs) - 1, max(0, round(q / 100 * (len(xs) - 1))))]


def emit(f, **event) -> None:
    event["t"] = time.time()
    f.write(json.dumps(event) + "\n")
    f.flush()


# ===================================================================================== workers

def worker_publish(args) -> int:
    from arcfmt.store import Publisher

    cfg = json.loads(args.config)
    so = cfg["storage_options"]
    files = cfg["files"]
    n = cfg["shards"]
    pubs = [Publisher(cfg["url"], shard=i, num_shards=n, storage_options=so, keyframe_every=cfg["keyframe_every"],
                      effort=cfg["effort"], tmp_dir=cfg["work"]) for i in range(n)]
    groups = cfg["groups"]
    out = sys.stdout
    from arcfmt.safetensors_io import open_checkpoint

    for step, path in enumerate(files):
        t0 = time.time()
        tensors = open_checkpoint(path).tensors()
        res = [p.publish(step, {k: tensors[k] for k in groups[i]}) for i, p in enumerate(pubs)]
        t1 = time.time()
        emit(out, event="published", step=step, start=t0, committed_at=t1, seconds=t1 - t0,
             committed=res[-1].commit.committed, head=res[-1].commit.head,
             delta_bytes=sum(r.delta.size for r in res if r.delta is not None),
             keyframe_bytes=sum(r.keyframe.size for r in res if r.keyframe is not None),
             encode_seconds=sum(r.encode_seconds for r in res), upload_seconds=sum(r.upload_seconds for r in res))
        del tensors
        if cfg["interval"] > 0:
            time.sleep(max(0.0, cfg["interval"] - (time.time() - t0)))
    return 0


def worker_follow(args) -> int:
    import xxhash

    from arcfmt.safetensors_io import open_checkpoint
    from arcfmt.store import Follower

    cfg = json.loads(args.config)
    with open(cfg["expect"]) as f:
        expect = json.load(f)                    # {step: {name: xxh3-64}}
    patterns = cfg["tensors"]
    out = sys.stdout

    def progress(ev):
        if ev["event"] == "bytes":
            emit(out, event="bytes", bytes=ev["bytes"])

    fol = Follower(cfg["url"], cfg["into"], tensors=patterns, storage_options=cfg["storage_options"],
                   progress=progress, workers=1)
    emit(out, event="start", step=fol.step)
    for upd in fol.follow(until=cfg["until"], interval=cfg["poll"], timeout=cfg["timeout"]):
        t_applied = time.time()
        want = expect[str(upd.step)]
        if patterns is not None:
            want = {k: v for k, v in want.items() if any(fnmatch.fnmatchcase(k, p) for p in patterns)}
        got = open_checkpoint(upd.path).tensors()
        bad = sorted(set(want) ^ set(got))
        for name, h in want.items():
            if name in got and xxhash.xxh3_64_hexdigest(memoryview(got[name].reshape(-1).view("u1"))) != h:
                bad.append(name)
        del got
        d = upd.as_dict()
        emit(out, event="step", applied_at=t_applied, verify_seconds=time.time() - t_applied, verified=not bad,
             bad=bad[:5], **{k: d[k] for k in ("step", "from_step", "kind", "bytes_downloaded", "bytes_needed",
                                                "tail_bytes", "requests", "reused_bytes", "retries", "seconds",
                                                "head_step", "lag_steps", "tensors", "changed", "verified_model")})
    emit(out, event="done", step=fol.step)
    return 0


# ===================================================================================== orchestration

class Proc:
    """A worker process whose JSON-lines output is collected by a thread."""

    def __init__(self, name, role, config, log_dir):
        self.name = name
        self.role = role
        self.config = config
        self.events = []
        self.log_dir = log_dir
        self.runs = 0
        self.kills = []
        self.proc = None
        self.cond = threading.Condition()

    def start(self):
        self.runs += 1
        with open(os.path.join(self.log_dir, f"{self.name}-{self.runs}.err"), "wb") as err:
            self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", self.role,
                                          "--config", json.dumps(self.config)],
                                         stdout=subprocess.PIPE, stderr=err, text=True)
        run = self.runs
        threading.Thread(target=self._read, args=(self.proc, run), daemon=True).start()

    def _read(self, proc, run):
        for line in proc.stdout:
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            ev["run"] = run
            with self.cond:
                self.events.append(ev)
                self.cond.notify_all()
        proc.wait()
        with self.cond:
            self.events.append({"event": "exit", "rc": proc.returncode, "run": run, "t": time.time()})
            self.cond.notify_all()

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)      # our own child, by its pid
            self.kills.append(time.time())
            self.proc.wait()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def of(self, kind):
        with self.cond:
            return [e for e in self.events if e["event"] == kind]

    def wait_for(self, pred, timeout):
        deadline = time.monotonic() + timeout
        with self.cond:
            while not pred(self.events):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(min(left, 1.0))
        return True


def synthesize(files, steps, work, density, seed, log):
    """``files`` extended to ``steps`` checkpoints: new steps from the last one, RL-like (see the doc)."""
    import numpy as np

    from arcfmt.safetensors_io import open_checkpoint, write_file

    files = list(files)
    if len(files) >= steps:
        return files[:steps], 0
    rng = np.random.default_rng(seed)
    prev = {k: np.array(v) for k, v in open_checkpoint(files[-1]).tensors().items()}
    made = 0
    while len(files) < steps:
        nxt = {}
        for name, a in prev.items():
            if a.dtype.kind in "fV" or "bfloat16" in str(a.dtype) or "float8" in str(a.dtype):
                nxt[name] = next_step({name: a}, rng, density)[name]
            else:
                nxt[name] = a
        p = os.path.join(work, "synth", f"step{len(files):04d}.safetensors")
        os.makedirs(os.path.dirname(p), exist_ok=True)
        write_file(p, nxt, {"format": "pt"})
        files.append(p)
        prev = nxt
        made += 1
    log(f"synthesized {made} steps after {os.path.basename(files[-made - 1])} (density {density}, seed {seed})")
    return files, made


def expected_digests(files, path, log):
    import xxhash

    from arcfmt.safetensors_io import open_checkpoint

    t0 = time.time()
    out = {}
    for step, f in enumerate(files):
        ts = open_checkpoint(f).tensors()
        out[str(step)] = {k: xxhash.xxh3_64_hexdigest(memoryview(a.reshape(-1).view("u1"))) for k, a in ts.items()}
    with open(path, "w") as fh:
        json.dump(out, fh)
    log(f"hashed {len(files)} step files in {time.time() - t0:.1f} s")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trajectory", nargs="?", help="folder with step0000.safetensors, step0001.safetensors, ...")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--backend", choices=["seaweedfs", "moto", "local"], default="seaweedfs")
    ap.add_argument("--shards", type=int, default=2, help="trainer shards, all published by the one publisher")
    ap.add_argument("--keyframe-every", type=int, default=10)
    ap.add_argument("--effort", choices=["fast", "default", "max"], default="default")
    ap.add_argument("--interval", type=float, default=0.0, help="seconds from one step's start to the next's "
                                                                 "(0: back to back)")
    ap.add_argument("--poll", type=float, default=0.2, help="followers' head poll interval (s)")
    ap.add_argument("--filter", action="append", metavar="NAME=PATTERN[,PATTERN]",
                    help="a filtered follower (repeatable; default: MLP, attention and embedding followers)")
    ap.add_argument("--late-at", type=int, help="step after which the late follower starts (default 60 %%)")
    ap.add_argument("--kill-at", type=int, help="step after which the restarted follower is killed (default 30 %%)")
    ap.add_argument("--restart-after", type=float, default=3.0)
    ap.add_argument("--kill-after-chunks", type=int, default=3,
                    help="the restarted follower is killed once this many chunks of a step have arrived")
    ap.add_argument("--density", type=float, default=0.01, help="for synthesized steps")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=3600.0, help="give up after this many seconds")
    ap.add_argument("--keep", action="store_true", help="keep the work folder")
    ap.add_argument("--json", action="store_true", help="print everything as one JSON object instead")
    ap.add_argument("--json-out", metavar="FILE", help="also write that JSON object to FILE")
    ap.add_argument("--worker", choices=["publish", "follow"], help=argparse.SUPPRESS)
    ap.add_argument("--config", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker == "publish":
        return worker_publish(args)
    if args.worker == "follow":
        return worker_follow(args)
    if not args.trajectory:
        ap.error("give a trajectory folder")

    log = (lambda msg: print(f"[load] {msg}", file=sys.stderr, flush=True)) if args.json else \
        (lambda msg: print(f"[load] {msg}", flush=True))
    files = sorted(os.path.join(args.trajectory, f) for f in os.listdir(args.trajectory)
                   if f.startswith("step") and f.endswith(".safetensors"))
    if not files:
        ap.error(f"{args.trajectory} has no step*.safetensors files")
    work = tempfile.mkdtemp(prefix="arcfmt-load-")
    server = None
    try:
        files, synthesized = synthesize(files, args.steps, work, args.density, args.seed, log)
        expect = expected_digests(files, os.path.join(work, "expect.json"), log)
        from arcfmt.safetensors_io import open_checkpoint

        t0 = open_checkpoint(files[0]).tensors()
        names = list(t0)
        sizes = {k: int(a.nbytes) for k, a in t0.items()}
        model_bytes = sum(sizes.values())
        full_file_bytes = os.path.getsize(files[0])
        from stream_bench import shard_names  # same split as the stream benchmark

        groups = shard_names(t0, args.shards)
        del t0
        filters = {}
        for spec in args.filter or []:
            name, _, pats = spec.partition("=")
            filters[name] = pats.split(",")
        if not filters:
            filters = {k: v for k, v in DEFAULT_FILTERS.items()
                       if any(fnmatch.fnmatchcase(n, p) for n in names for p in v)}
        for name, pats in filters.items():
            if not any(fnmatch.fnmatchcase(n, p) for n in names for p in pats):
                ap.error(f"filter {name}: {pats} match no tensor of the trajectory")

        if args.backend == "local":
            url, so = os.path.join(work, "stream"), {}
        else:
            server = servers.STARTERS[args.backend]()
            url = f"{servers.protocol(server)}://{servers.BUCKET}/load-{os.getpid()}"
            so = servers.storage_options(server)
            log(f"{args.backend} pid {server.pid} at {server.endpoint}")
        last = len(files) - 1
        late_at = args.late_at if args.late_at is not None else int(0.6 * last)
        kill_at = args.kill_at if args.kill_at is not None else int(0.3 * last)
        return run(args, log, work, url, so, files, synthesized, expect, names, sizes, model_bytes,
                   full_file_bytes, groups, filters, last, late_at, kill_at)
    finally:
        if server is not None:
            server.stop()
        if args.keep:
            log(f"work folder kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def run(args, log, work, url, so, files, synthesized, expect, names, sizes, model_bytes, full_file_bytes, groups,
        filters, last, late_at, kill_at) -> int:
    logs = os.path.join(work, "logs")
    os.makedirs(logs)

    def fcfg(name, tensors):
        return dict(url=url, storage_options=so, into=os.path.join(work, "followers", name), tensors=tensors,
                    expect=os.path.join(work, "expect.json"), until=last, poll=args.poll, timeout=600.0)

    specs = [("full-1", None), ("full-2", None), ("full-3", None)] + list(filters.items()) + \
        [("late", None), ("restarted", None)]
    while len(specs) < 8:
        specs.insert(3, (f"full-{len(specs) - len(filters) - 1}", None))
    followers = {name: Proc(name, "follow", fcfg(name, pats), logs) for name, pats in specs}
    pub = Proc("publisher", "publish", dict(url=url, storage_options=so, files=files, shards=len(groups),
                                            groups=groups, keyframe_every=args.keyframe_every, effort=args.effort,
                                            interval=args.interval, work=work), logs)
    log(f"{len(files)} steps ({synthesized} synthesized), model {fmt(model_bytes)} in {len(names)} tensors, "
        f"{len(groups)} shards, keyframe every {args.keyframe_every}, effort {args.effort}; followers: "
        + ", ".join(f"{n}{'' if p is None else ' ' + ','.join(p)}" for n, p in specs)
        + f"; late joins after step {late_at}, 'restarted' is killed after step {kill_at}")
    t_start = time.time()
    deadline = time.monotonic() + args.timeout
    for name, f in followers.items():
        if name != "late":
            f.start()
    pub.start()
    problems = []

    def published(n):
        return pub.wait_for(lambda evs: any(e["event"] == "published" and e["step"] >= n for e in evs)
                            or any(e["event"] == "exit" for e in evs), deadline - time.monotonic())

    # the late joiner
    def late():
        published(late_at)
        followers["late"].start()
        log(f"late follower started (head at step {max(e['step'] for e in pub.of('published'))})")

    # the restart: kill while a step is being downloaded, after kill_at
    restart_info = {}

    def restart():
        r = followers["restarted"]
        ok = r.wait_for(lambda evs: any(e["event"] == "step" and e["step"] >= kill_at for e in evs),
                        deadline - time.monotonic())
        if not ok:
            problems.append("restarted: never reached the kill step")
            return
        for _ in range(5):     # kill it after some chunks of a step have arrived, before the step is done
            n0 = len(r.events)
            r.wait_for(lambda evs, n0=n0: sum(e["event"] == "bytes" for e in evs[n0:]) >= args.kill_after_chunks
                       or any(e["event"] in ("step", "done", "exit") for e in evs[n0:]), deadline - time.monotonic())
            if not any(e["event"] == "step" for e in r.events[n0:]):
                break
        at = max((e["step"] for e in r.of("step")), default=None)
        r.kill()
        restart_info.update(killed_after_step=at, killed_at=time.time(),
                            chunks_before_kill=sum(e["event"] == "bytes" for e in r.events[n0:]),
                            mid_download=any(e["event"] == "bytes" for e in r.events[n0:]))
        log(f"'restarted' follower SIGKILLed while downloading the step after {at}; restarting in "
            f"{args.restart_after:.1f} s")
        time.sleep(args.restart_after)
        r.start()

    helpers = [threading.Thread(target=late, daemon=True), threading.Thread(target=restart, daemon=True)]
    for h in helpers:
        h.start()
    # wait for the end
    pub.wait_for(lambda evs: any(e["event"] == "exit" for e in evs), deadline - time.monotonic())
    for h in helpers:
        h.join(max(0.0, deadline - time.monotonic()))
    for name, f in followers.items():
        ok = f.wait_for(lambda evs, runs=f.runs: any(e["event"] == "exit" and e["run"] == runs for e in evs),
                        deadline - time.monotonic())
        if not ok:
            problems.append(f"{name}: still running at the deadline")
            f.kill()
    t_end = time.time()

    # --------------------------------------------------------------------------- results
    pubs = {e["step"]: e for e in pub.of("published")}
    if len(pubs) != len(files):
        problems.append(f"publisher: published {len(pubs)} of {len(files)} steps "
                        f"(exit {[e.get('rc') for e in pub.of('exit')]}; see {logs})")
    pub_summary = dict(
        steps=len(pubs), seconds=sum(e["seconds"] for e in pubs.values()),
        mean_delta_bytes=statistics.mean([e["delta_bytes"] for e in pubs.values() if e["delta_bytes"]] or [0]),
        keyframes=sum(1 for e in pubs.values() if e["keyframe_bytes"]),
        mean_publish_seconds=statistics.mean([e["seconds"] for e in pubs.values()] or [0]),
        steps_per_second=len(pubs) / max(1e-9, (max((e["committed_at"] for e in pubs.values()), default=t_start)
                                                 - t_start)))
    summary = {}
    for name, f in followers.items():
        steps = f.of("step")
        exits = f.of("exit")
        rc = [e["rc"] for e in exits]
        bad = [e for e in steps if not e["verified"]]
        reported = sorted({e["step"] for e in steps})
        final = steps[-1]["step"] if steps else None
        if bad:
            problems.append(f"{name}: steps {[e['step'] for e in bad]} not bit-exact: {bad[0]['bad']}")
        if final != last:
            problems.append(f"{name}: ended at step {final}, not {last} (exit codes {rc}; see {logs})")
        if any(c not in (0, -signal.SIGKILL) for c in rc):
            problems.append(f"{name}: exit codes {rc} (see {logs})")
        lags = [e["applied_at"] - pubs[e["step"]]["committed_at"] for e in steps if e["step"] in pubs]
        first_t = min((e["t"] for e in f.events if e["event"] == "start"), default=t_start)
        active = max(1e-9, (steps[-1]["applied_at"] if steps else t_end) - first_t)
        sel = [n for n in names if f.config["tensors"] is None or
               any(fnmatch.fnmatchcase(n, p) for p in f.config["tensors"])]
        started = min((e["t"] for e in f.events if e["event"] == "start"), default=t_start)
        live = [e["applied_at"] - pubs[e["step"]]["committed_at"] for e in steps
                if e["step"] in pubs and pubs[e["step"]]["committed_at"] >= started]
        summary[name] = dict(
            tensors=f.config["tensors"], selected_tensors=len(sel), selected_bytes=sum(sizes[n] for n in sel),
            runs=f.runs, exit_codes=rc,
            first_step=reported[0] if reported else None, last_step=final, steps_reported=len(steps),
            all_bit_exact=not bad and bool(steps), kinds={k: sum(1 for e in steps if e["kind"] == k)
                                                        for k in ("keyframe", "delta")},
            bytes=sum(e["bytes_downloaded"] for e in steps),
            bytes_per_delta_step=statistics.mean([e["bytes_downloaded"] for e in steps if e["kind"] == "delta"]
                                                 or [0]),
            requests=sum(e["requests"] for e in steps), reused_bytes=sum(e["reused_bytes"] for e in steps),
            retries=sum(e["retries"] for e in steps),
            apply_seconds_mean=statistics.mean([e["seconds"] for e in steps] or [0]),
            verify_seconds_mean=statistics.mean([e["verify_seconds"] for e in steps] or [0]),
            lag_seconds_mean=statistics.mean(lags) if lags else None, lag_seconds_p50=pct(lags, 50),
            lag_seconds_p95=pct(lags, 95), lag_seconds_max=max(lags) if lags else None,
            lag_steps_max=max((e["lag_steps"] for e in steps), default=None),
            lag_seconds_mean_live=statistics.mean(live) if live else None,
            steps_per_second=len(steps) / active,
            verified_bytes_per_second=len(steps) * sum(sizes[n] for n in sel) / active,
            active_seconds=active,
        )
        summary[name]["vs_full_checkpoints"] = (summary[name]["bytes"] / max(1, len(steps) * full_file_bytes))
    if restart_info:
        r = followers["restarted"]
        after = [e for e in r.of("step") if e["run"] == r.runs]
        restart_info.update(resumed_at_step=after[0]["step"] if after else None,
                            resumed_reused_bytes=after[0]["reused_bytes"] if after else None)
        summary["restarted"]["restart"] = restart_info
    result = dict(
        config=dict(trajectory=args.trajectory, steps=len(files), synthesized=synthesized, backend=args.backend,
                    shards=len(groups), keyframe_every=args.keyframe_every, effort=args.effort,
                    interval=args.interval, poll=args.poll, late_at=late_at, kill_at=kill_at,
                    model_bytes=model_bytes, full_checkpoint_bytes=full_file_bytes, tensors=len(names),
                    cpus=os.cpu_count()),
        wall_seconds=t_end - t_start, publisher=pub_summary, followers=summary, problems=problems,
        steps={"publisher": [pubs[s] for s in sorted(pubs)],
               **{n: f.of("step") for n, f in followers.items()}},
    )
    if args.json_out:
        with open(args.json_out, "w") as fh:
            json.dump(result, fh)
    if args.json:
        print(json.dumps(result))
        return 0 if not problems else 1
    print(f"\nload: {len(files)} steps ({synthesized} synthesized) of {args.trajectory}, model {fmt(model_bytes)} "
          f"({len(names)} tensors, {len(groups)} shards), backend {args.backend}, {os.cpu_count()} CPUs, "
          f"wall {t_end - t_start:.1f} s")
    p = pub_summary
    print(f"publisher: {p['steps']} steps, {p['steps_per_second']:.2f} steps/s, {p['mean_publish_seconds']:.2f} s "
          f"per step (encode + upload + commit, effort {args.effort}), mean delta {fmt(p['mean_delta_bytes'])}, "
          f"{p['keyframes']} keyframes")
    hdr = (f"{'follower':13} {'selection':>9} {'steps':>11} {'exact':>5} {'bytes':>10} {'per delta':>10} "
           f"{'vs full':>7} {'reqs':>5} {'apply':>6} {'lag mean':>8} {'p95':>6} {'max':>6} {'lag st':>6} "
           f"{'steps/s':>7} {'MB/s':>6}")
    print(hdr)
    print("(selection: tensors kept; steps: first..last reported (count); vs full: bytes / (steps × full "
          "checkpoint file); apply: mean s per step; lag: publish committed → verified folder, s; lag st: most "
          "steps behind the head; steps/s and MB/s of verified weights over the follower's running time)")
    for name, s in summary.items():
        span = f"{s['first_step']}..{s['last_step']} ({s['steps_reported']})"
        lag_st = s["lag_steps_max"] if s["lag_steps_max"] is not None else "-"
        print(f"{name:13} {s['selected_tensors']:>9} {span:>11} {'yes' if s['all_bit_exact'] else 'NO':>5} "
              f"{fmt(s['bytes']):>10} {fmt(s['bytes_per_delta_step']):>10} {100 * s['vs_full_checkpoints']:>6.2f}% "
              f"{s['requests']:>5} {s['apply_seconds_mean']:>5.2f}s {(s['lag_seconds_mean'] or 0):>7.2f}s "
              f"{s['lag_seconds_p95']:>5.2f}s {(s['lag_seconds_max'] or 0):>5.2f}s {lag_st:>6} "
              f"{s['steps_per_second']:>7.2f} {s['verified_bytes_per_second'] / 1e6:>6.1f}")
    if "late" in summary and summary["late"]["lag_seconds_mean_live"] is not None:
        print(f"late: its lag counts from each step's commit, so the steps committed before it started include "
              f"the wait; over the steps committed after it started: mean "
              f"{summary['late']['lag_seconds_mean_live']:.2f} s")
    if restart_info:
        ri = restart_info
        print(f"restarted: SIGKILLed in the step after {ri.get('killed_after_step')}, {ri.get('chunks_before_kill')} "
              f"chunks into it; after the restart it resumed at step {ri.get('resumed_at_step')} reusing "
              f"{fmt(ri.get('resumed_reused_bytes') or 0)} from its spool")
    print("all followers bit-exact at every step they reported, and at the last step" if not problems else
          "PROBLEMS:\n  " + "\n  ".join(problems))
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
