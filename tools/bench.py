#!/usr/bin/env python3
"""Side-by-side benchmark of arcfmt and its peers on RL checkpoint trajectories.

    python tools/bench.py TRAJECTORY_DIR [TRAJECTORY_DIR ...] [--pairs N] [--json] [--breakdown] [--block-elems N]
                          [--without ENCODING]

A trajectory dir holds step*.safetensors (e.g. `python ../shared/corpus/corpus.py expand
rl-minilm-lr1e-6 /tmp/t`). Every consecutive step pair is encoded and decoded by arcfmt (in memory,
checkpoints preloaded, best of --repeat timings) and checked bit-exact; peers (fireworks arc_v3 and
arc_v2, z4ai) run in their own interpreter (--peers-python, default /work/peers-venv/bin/python)
through tools/peers_worker.py and are skipped with a note when not installed.

Figures per method and trajectory: % of BF16 bytes, bytes per changed element, encode MB/s and decode
MB/s (BF16 bytes of the target per second; decode = verified, bit-exact rebuild), and whether every
round trip was bit-exact.

Beside them, the compulsory-work floor of a decode on the same pairs (issue 19): what any verified
rebuild must do at least — allocate the output, copy the base into it, and xxh3 the base and the
output, one thread — as `floor MB/s`, and arcfmt's decode as `% of floor` (best of --repeat each).
"""
from __future__ import annotations

import argparse
import glob
import io
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import xxhash

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import arcfmt  # noqa: E402
from arcfmt import encodings  # noqa: E402
from arcfmt.dtypes import from_name  # noqa: E402
from arcfmt.safetensors_io import open_checkpoint  # noqa: E402
from arcfmt.writer import DEFAULT_BLOCK_ELEMS, DeltaWriter  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
PEERS = ("arc_v3", "arc_v2", "z4ai")


def stream_labels(encoding: str, dtype: str) -> tuple:
    """The label of each stream of a block, from the encoding registry: its SPEC.md §8 name, prefixed by
    the part of the block it codes where that differs (``positions:quotients``)."""
    rs = encodings.by_name(encoding).stream_roles(from_name(dtype))
    return tuple(r.name if r.part == r.name else f"{r.part}:{r.name}" for r in rs) or ("stream",)


def load(path: str) -> dict:
    ck = open_checkpoint(path)
    return {k: np.array(v) for k, v in ck.tensors().items()}  # into memory: I/O is not measured


def steps_in(folder: str) -> list[str]:
    files = sorted(glob.glob(os.path.join(folder, "step*.safetensors")))
    if len(files) < 2:
        raise SystemExit(f"{folder}: needs at least two step*.safetensors files")
    return files


def floor_seconds(base: dict, target: dict) -> float:
    """One run of the compulsory work of a decode of ``target`` from ``base``: allocate the output (one
    allocation, as arcfmt's decoder makes), copy each base tensor into it and xxh3 the base and the
    output tensor (the base check and the target check of SPEC.md §12.3); one thread."""
    t0 = time.perf_counter()
    out = np.empty(sum(v.nbytes for v in target.values()), np.uint8)
    at = 0
    for name, v in target.items():
        b = base.get(name)
        src = (b if b is not None and b.nbytes == v.nbytes else v).reshape(-1).view(np.uint8)
        xxhash.xxh3_64_intdigest(src)
        dst = out[at: at + src.size]
        np.copyto(dst, src)
        xxhash.xxh3_64_intdigest(dst)
        at += src.size
    return time.perf_counter() - t0


def bench_arcfmt(files, repeat, effort, breakdown, block_elems=DEFAULT_BLOCK_ELEMS, before=None):
    """``before``: with history (format 1.9), the step file before ``files[0]`` (or None): each pair is
    encoded with the step before its base as the previous step, as a stream's publisher does, and
    decoded with it (its history computed inside the timed decode), the first pair without one
    where ``before`` is None."""
    rows = []
    roles = {}
    per_tensor = {}
    history = before is not False
    earlier = load(before) if history and before else None
    prev = load(files[0])
    for a, b in zip(files, files[1:]):
        cur = load(b)
        bf16 = sum(v.nbytes for v in cur.values())
        changed = sum(int(np.count_nonzero(prev[k].view(f"u{v.itemsize}") != v.view(f"u{v.itemsize}")))
                      for k, v in cur.items() if k in prev and prev[k].shape == v.shape and prev[k].dtype == v.dtype)
        enc_t, dec_t, floor_t = [], [], []
        for _ in range(repeat):
            floor_t.append(floor_seconds(prev, cur))
            buf = io.BytesIO()
            t0 = time.perf_counter()
            w = DeltaWriter(buf, effort=effort, block_elems=block_elems, previous=earlier)
            w.write_tensors((k, prev.get(k), v) for k, v in cur.items())
            w.close()
            enc_t.append(time.perf_counter() - t0)
            delta = buf.getvalue()
            t0 = time.perf_counter()
            out = arcfmt.decode(prev, delta, previous=earlier)
            dec_t.append(time.perf_counter() - t0)
        exact = out.keys() == cur.keys() and all(out[k].tobytes() == cur[k].tobytes() for k in cur)
        rows.append(dict(peer="arcfmt", base=a, target=b, bytes=len(delta), bf16_bytes=bf16, changed=changed,
                         encode_s=min(enc_t), decode_s=min(dec_t), floor_s=min(floor_t), exact=exact,
                         error=None))
        if breakdown:
            headers = len(delta)
            for t in w.stats:
                pt = per_tensor.setdefault(t.name, dict(bytes=0, changed=0, elements=0, roles={}))
                pt["bytes"] += t.size
                pt["elements"] += int(np.prod(t.shape)) if t.shape else 1
                in_streams = 0
                for blk in t.blocks:
                    pt["changed"] += blk.changed or 0
                    for i, (codec, stored, _) in enumerate(blk.streams):
                        names = stream_labels(blk.encoding, t.dtype)
                        role = names[min(i, len(names) - 1)]
                        r = roles.setdefault(role, dict(bytes=0, codecs={}))
                        r["bytes"] += stored
                        r["codecs"][codec] = r["codecs"].get(codec, 0) + 1
                        top = role.split(":")[0]
                        pt["roles"][top] = pt["roles"].get(top, 0) + stored
                        in_streams += stored
                        headers -= stored
                pt["roles"]["headers"] = pt["roles"].get("headers", 0) + t.size - in_streams
            roles.setdefault("headers+index", dict(bytes=0, codecs={}))["bytes"] += headers
        if history:
            earlier = prev
        prev = cur
    return rows, roles, per_tensor


def bench_peer(peer, files, repeat, python):
    if not os.path.exists(python):
        return None, f"{peer}: skipped, peers interpreter {python} not found (see tools/README.md)"
    with tempfile.NamedTemporaryFile("w", suffix=".pairs", delete=False) as f:
        for a, b in zip(files, files[1:]):
            f.write(f"{a} {b}\n")
        pairs = f.name
    try:
        cmd = [python, os.path.join(HERE, "peers_worker.py"), "--peer", peer, "--pairs-file", pairs,
               "--repeat", str(repeat)]
        if peer == "arc_v3":
            cmd += ["--arc3-wait-multiplier", "1e9"]  # let every arc_v3 candidate finish: its smallest output
        p = subprocess.run(cmd, capture_output=True, text=True)
    finally:
        os.unlink(pairs)
    rows = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    if not rows:
        return None, f"{peer}: skipped, worker failed: {p.stderr.strip()[-300:]}"
    if rows[0].get("error", "") and str(rows[0]["error"]).startswith("not installed"):
        return None, f"{peer}: skipped, {rows[0]['error']}"
    return rows, None


def summarize(rows):
    ok = [r for r in rows if not r.get("error")]
    if not ok:
        return None
    bf16 = sum(r["bf16_bytes"] for r in ok)
    size = sum(r["bytes"] for r in ok)
    changed = sum(r["changed"] for r in ok)
    out = dict(pairs=len(ok), errors=len(rows) - len(ok), bytes=size, bf16_bytes=bf16,
               percent=100 * size / bf16, bytes_per_changed=size / max(changed, 1),
               encode_mbs=bf16 / 1e6 / sum(r["encode_s"] for r in ok),
               decode_mbs=bf16 / 1e6 / sum(r["decode_s"] for r in ok),
               exact=all(r["exact"] for r in ok))
    if all("floor_s" in r for r in ok):
        out["floor_mbs"] = bf16 / 1e6 / sum(r["floor_s"] for r in ok)
        out["percent_of_floor"] = 100 * out["decode_mbs"] / out["floor_mbs"]
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trajectories", nargs="+", metavar="TRAJECTORY_DIR")
    ap.add_argument("--pairs", type=int, help="only the first N step pairs of each trajectory")
    ap.add_argument("--first", type=int, default=0, help="start at this step pair")
    ap.add_argument("--repeat", type=int, default=2, help="timing runs per pair (best is kept)")
    ap.add_argument("--block-elems", type=int, default=DEFAULT_BLOCK_ELEMS,
                    help=f"arcfmt's elements per block (default {DEFAULT_BLOCK_ELEMS}, as arcfmt encode)")
    ap.add_argument("--effort", default="default",
                    help="arcfmt effort level(s), comma-separated (fast, default, max): one row each")
    ap.add_argument("--peers", default=",".join(PEERS), help="comma list of peers to run ('' for none)")
    ap.add_argument("--peers-python", default=os.environ.get("ARCFMT_PEERS_PYTHON", "/work/peers-venv/bin/python"))
    ap.add_argument("--json", action="store_true", help="print one JSON document instead of tables")
    ap.add_argument("--json-out", metavar="FILE", help="also write the JSON document to FILE")
    ap.add_argument("--breakdown", action="store_true", help="where arcfmt's bytes go: per stream role and per tensor")
    ap.add_argument("--top", type=int, default=10, help="tensors listed by --breakdown (largest first)")
    ap.add_argument("--history", action="store_true",
                    help="also arcfmt with the previous step (format 1.9, as a stream's follower reads it): a row "
                         "'arcfmt+prev' per effort, each pair encoded and decoded with the step before its base")
    ap.add_argument("--without", metavar="ENCODING", action="append", default=[],
                    help="arcfmt as if it had no such encoding (its writer never proposes it; repeatable): what "
                         "one encoding is worth, e.g. --without dense-delta")
    args = ap.parse_args(argv)
    for name in args.without:
        try:
            encodings.unregister(name)
        except KeyError:
            ap.error(f"--without: no encoding {name!r} (registered: "
                     f"{', '.join(e.name for e in encodings.registered())})")

    efforts = [e for e in args.effort.split(",") if e]
    if not efforts or any(e not in ("fast", "default", "max") for e in efforts):
        ap.error("--effort takes fast, default and/or max")
    report = dict(block_elems=args.block_elems, without=args.without, trajectories=[])
    for traj in args.trajectories:
        every = steps_in(traj)
        files = every[args.first:]
        before = every[args.first - 1] if args.first > 0 else None
        if args.pairs:
            files = files[: args.pairs + 1]
        t = dict(trajectory=traj, pairs=len(files) - 1, methods={}, notes=[])
        per_pair = {}
        for i, effort in enumerate(efforts):
            name = "arcfmt" if effort == "default" or len(efforts) == 1 else f"arcfmt-{effort}"
            erows, eroles, eper = bench_arcfmt(files, args.repeat, effort, args.breakdown, args.block_elems, False)
            t["methods"][name] = summarize(erows)
            per_pair[name] = erows
            if i == 0 or effort == "default":
                rows, roles, per_tensor, main = erows, eroles, eper, name
            if args.history:
                hrows, hroles, hper = bench_arcfmt(files, args.repeat, effort, args.breakdown, args.block_elems, before)
                t["methods"][name + "+prev"] = summarize(hrows)
                per_pair[name + "+prev"] = hrows
                if args.breakdown and (i == 0 or effort == "default"):
                    t["breakdown_prev"] = dict(method=name + "+prev", roles=hroles, tensors=hper)
        for peer in [p for p in args.peers.split(",") if p]:
            prow, note = bench_peer(peer, files, args.repeat, args.peers_python)
            if note:
                t["notes"].append(note)
                continue
            per_pair[peer] = prow
            t["methods"][peer] = summarize(prow)
        if "arc_v3" in per_pair:
            v3 = {(r["base"], r["target"]): r for r in per_pair["arc_v3"] if not r.get("error")}
            t["arcfmt_smaller_than_arc_v3_pairs"] = sum(
                1 for r in rows if (r["base"], r["target"]) in v3
                and r["bytes"] <= v3[(r["base"], r["target"])]["bytes"])
            t["arcfmt_faster_decode_than_arc_v3_pairs"] = sum(
                1 for r in rows if (r["base"], r["target"]) in v3
                and r["decode_s"] <= v3[(r["base"], r["target"])]["decode_s"])
            a, b = t["methods"][main], t["methods"]["arc_v3"]
            t["vs_arc_v3"] = dict(size=a["bytes"] / b["bytes"], encode_speed=a["encode_mbs"] / b["encode_mbs"],
                                  decode_speed=a["decode_mbs"] / b["decode_mbs"])
        if args.breakdown:
            t["breakdown"] = dict(method=main, roles=roles, tensors=per_tensor)
        t["per_pair"] = per_pair
        report["trajectories"].append(t)

    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(report, f, indent=1)
    if args.json:
        print(json.dumps(report, indent=1))
        return
    for t in report["trajectories"]:
        print(f"\n{t['trajectory']}: {t['pairs']} step pairs")
        print(f"| {'method':12s} | {'% of BF16':>9s} | {'B/changed':>9s} | {'encode MB/s':>11s} "
              f"| {'decode MB/s':>11s} | {'floor MB/s':>10s} | {'% of floor':>10s} | bit-exact |")
        print(f"|{'-' * 14}|{'-' * 11}|{'-' * 11}|{'-' * 13}|{'-' * 13}|{'-' * 12}|{'-' * 12}|-----------|")
        for name, s in t["methods"].items():
            if s is None:
                continue
            fl = (f"{s['floor_mbs']:10.0f} | {s['percent_of_floor']:9.1f}%" if "floor_mbs" in s
                  else f"{'':10s} | {'':10s}")
            print(f"| {name:12s} | {s['percent']:8.4f}% | {s['bytes_per_changed']:9.3f} | {s['encode_mbs']:11.0f} | "
                  f"{s['decode_mbs']:11.0f} | {fl} | {'yes' if s['exact'] else 'NO':9s} |")
        for note in t["notes"]:
            print(f"note: {note}")
        if "vs_arc_v3" in t:
            v = t["vs_arc_v3"]
            print(f"{main} / arc_v3: size {v['size']:.3f}x, encode speed {v['encode_speed']:.2f}x, decode speed "
                  f"{v['decode_speed']:.2f}x; arcfmt smaller on {t['arcfmt_smaller_than_arc_v3_pairs']}/{t['pairs']} "
                  f"pairs, decodes faster on {t['arcfmt_faster_decode_than_arc_v3_pairs']}/{t['pairs']}")
        for name in [n for n in t["methods"] if n.endswith("+prev") and t["methods"].get(n[:-5])]:
            print(f"{name} / {name[:-5]}: size {t['methods'][name]['bytes'] / t['methods'][name[:-5]]['bytes']:.3f}x")
        if args.breakdown:
            tot = t["methods"][t["breakdown"]["method"]]["bytes"]
            print("arcfmt bytes by stream role:")
            for role, r in sorted(t["breakdown"]["roles"].items(), key=lambda kv: -kv[1]["bytes"]):
                codecs = ", ".join(f"{c}×{n}" for c, n in sorted(r["codecs"].items()))
                print(f"  {role:14s} {r['bytes']:>10d}  {100 * r['bytes'] / tot:5.1f} %  {codecs}")
            print("top tensors by bytes (positions / steps / other streams / headers):")
            for name, r in sorted(t["breakdown"]["tensors"].items(), key=lambda kv: -kv[1]["bytes"])[:args.top]:
                ro = r["roles"]
                other = r["bytes"] - ro.get("positions", 0) - ro.get("steps", 0) - ro.get("headers", 0)
                print(f"  {name[:48]:48s} {r['bytes']:>9d} B  {r['changed']:>8d} changed  "
                      f"{r['bytes'] / max(r['changed'], 1):.3f} B/changed  "
                      f"{ro.get('positions', 0):>8d} / {ro.get('steps', 0):>8d} / {other:>7d} / "
                      f"{ro.get('headers', 0):>6d}")


if __name__ == "__main__":
    main()
