#!/usr/bin/env python3
"""Fuzz every entry point that reads untrusted bytes; report anything outside the ArcError tree.

    python tools/fuzz.py --cases 1000000 --workers 2 --seed 1      # the long run (README shows its result)
    python tools/fuzz.py --cases 2000                              # a quick look

Engines, interleaved case by case (all seeded, reproducible from --seed and the case number):
  * ``struct``: build a random valid file (random dtypes, shapes, densities, encodings, codecs, block
    sizes), take it apart into records, change one field or byte *and put the checksums, index and
    trailer right again* so the structural checks behind the checksums are what gets exercised;
  * ``bytes``: raw mutations of valid files (bit flips, byte sets, insertions, deletions, truncations,
    splices, duplicated chunks), checksums left as they fall;
  * ``safetensors``: mutated safetensors headers and files (the checkpoint input path).
Every case runs the random-access reader and the streaming reader. A case fails when it raises an
exception that is not an ArcError, takes longer than --max-seconds, or returns tensors that differ
from the original target (a corrupted file must never decode to wrong data). Failing inputs are saved
under --out (default fuzz-failures/) to become regression vectors. Peak RSS of each worker is reported
and checked against --max-rss-mib (the decoders run with a bounded output budget).
"""
from __future__ import annotations

import argparse
import io
import json
import os
import resource
import sys
import tempfile
import time
import traceback
from concurrent.futures import ProcessPoolExecutor

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from arcfmt import ArcError  # noqa: E402
from arcfmt.reader import DeltaReader, StreamReader  # noqa: E402

import make_vectors as mv  # noqa: E402  (the record toolkit: split / assemble)

DTYPES = [mv.BF16, np.float16, np.float32, np.float64, np.int8, np.uint8, np.int32, np.bool_]
ENCODINGS = [None, None, None, "xor", "keyframe", "ctx-delta"]
CODECS = [None, None, "raw", "zstd", "xz", "bz2"]
BUDGET = 64 << 20  # output budget of the decoders under test


def random_model(rng):
    base, target = {}, {}
    for i in range(int(rng.integers(1, 4))):
        dt = DTYPES[int(rng.integers(len(DTYPES)))]
        shape = tuple(int(x) for x in rng.integers(0, 40, int(rng.integers(0, 3))))
        w = np.dtype(dt).itemsize
        n = int(np.prod(shape)) if shape else 1
        u = rng.integers(0, 256, n * w, dtype=np.uint8)
        if dt is np.bool_:
            u &= 1
        b = u.view(dt).reshape(shape)
        t = u.copy()
        if n:
            idx = rng.integers(0, n * w, int(rng.integers(0, n * w + 1) * rng.random() ** 3))
            t[idx] ^= rng.integers(1, 256, idx.size, dtype=np.uint8) if dt is not np.bool_ else 1
        name = f"t{i}" if rng.random() < 0.8 else f"layer.{i}.ß"
        base[name] = b
        target[name] = t.view(dt).reshape(shape)
    return base, target


def random_file(rng):
    base, target = random_model(rng)
    enc = ENCODINGS[int(rng.integers(len(ENCODINGS)))]
    kw = dict(block_elems=int(rng.choice([7, 64, 1 << 20])), force_codec=CODECS[int(rng.integers(len(CODECS)))],
              note="fuzz" if rng.random() < 0.2 else None)
    try:
        if enc == "keyframe" or rng.random() < 0.1:
            data = mv.write_delta(None if rng.random() < 0.5 else base, target, keyframe=True, **kw)
        elif enc == "xor":
            data = mv.write_delta(base, target, force_encoding="xor", **kw)
        elif enc == "ctx-delta":  # float tensors as ctx-delta (several classes at effort max), others as chosen
            ctx_ok = {k for k, v in target.items() if v.dtype in (mv.BF16, np.float16, np.float32)
                      and base[k].dtype == v.dtype and base[k].shape == v.shape}
            data = mv.write_delta({k: base[k] for k in ctx_ok}, {k: target[k] for k in ctx_ok},
                                  force_encoding="ctx-delta", effort="max", **kw) if ctx_ok else \
                mv.write_delta(base, target, **kw)
            if ctx_ok:
                base, target = {k: base[k] for k in ctx_ok}, {k: target[k] for k in ctx_ok}
        else:
            data = mv.write_delta(base, target, **kw)
    except ArcError:
        data = mv.write_delta(base, target)
    return base, target, data


def mutate_struct(rng, data):
    p = mv.split(data)
    choice = rng.random()
    if choice < 0.6 and p.recs:
        r = p.recs[int(rng.integers(len(p.recs)))]
        pl = bytearray(r.payload)
        for _ in range(int(rng.integers(1, 4))):
            if pl and rng.random() < 0.8:
                k = int(rng.integers(len(pl)))
                pl[k] = int(rng.integers(256)) if rng.random() < 0.5 else pl[k] ^ (1 << int(rng.integers(8)))
            elif rng.random() < 0.5:
                pl.insert(int(rng.integers(len(pl) + 1)), int(rng.integers(256)))
            elif pl:
                del pl[int(rng.integers(len(pl)))]
        r.payload = bytes(pl)
        return mv.assemble(p)
    if choice < 0.75 and len(p.recs) > 1:
        i, j = sorted(int(x) for x in rng.integers(0, len(p.recs), 2))
        p.recs[i], p.recs[j] = p.recs[j], p.recs[i]
        return mv.assemble(p)
    if choice < 0.85:
        def fn(index):
            blocks = [b for e in index.entries for b in e.blocks]
            if blocks:
                b = blocks[int(rng.integers(len(blocks)))]
                field = ["offset", "size", "encoding"][int(rng.integers(3))]
                setattr(b, field, int(rng.integers(0, 256 if field == "encoding" else 1 << 12)))
        return mv.assemble(p, index_fn=fn)
    # the index body, bytes changed, codec raw
    body = bytearray(mv.L.IndexBody.build(_index_dict(p)))
    if body:
        k = int(rng.integers(len(body)))
        body[k] = int(rng.integers(256))
    return mv.assemble(p, index_payload=bytes([0]) + mv.varint(len(body)) + bytes(body))


def _index_dict(p):
    payload = mv.records.build_index(p.index)
    q = mv.L.IndexPayload.parse(payload)
    raw = mv.records.codecs.decode(q.codec, q.body, q.body_length)
    return mv.L.IndexBody.parse(bytes(raw))


def mutate_bytes(rng, data):
    d = bytearray(data)
    for _ in range(int(rng.integers(1, 6))):
        op = rng.random()
        if not d:
            d += bytes([int(rng.integers(256))])
        elif op < 0.35:
            k = int(rng.integers(len(d)))
            d[k] ^= 1 << int(rng.integers(8))
        elif op < 0.55:
            d[int(rng.integers(len(d)))] = int(rng.choice([0, 0xFF, 0x7F, 0x80, int(rng.integers(256))]))
        elif op < 0.7:
            del d[int(rng.integers(len(d))):][:int(rng.integers(1, 64))]
        elif op < 0.8:
            k = int(rng.integers(len(d) + 1))
            d[k:k] = rng.integers(0, 256, int(rng.integers(1, 32)), dtype=np.uint8).tobytes()
        elif op < 0.9:
            d = d[: int(rng.integers(len(d) + 1))]
        else:
            a = int(rng.integers(len(d)))
            d[a:a] = d[a: a + int(rng.integers(1, 64))]
    return bytes(d)


def check_delta(base, target, data, intact):
    """Run both readers; return a failure string or None."""
    for mode in ("random", "stream"):
        try:
            if mode == "random":
                out = DeltaReader(data, workers=1, max_output_bytes=BUDGET).decode_all(base)
            else:
                out = dict(StreamReader(io.BytesIO(data), base, max_output_bytes=BUDGET))
        except ArcError as exc:
            if not str(exc):
                return f"{mode}: {type(exc).__name__} without a message"
            if intact:
                return f"{mode}: valid file rejected: {type(exc).__name__}: {exc}"
            continue
        except Exception:  # noqa: BLE001 - exactly what we hunt
            return f"{mode}: non-ArcError exception:\n{traceback.format_exc()}"
        if set(out) != set(target) or any(out[k].tobytes() != np.asarray(target[k]).tobytes()
                                          or out[k].shape != np.asarray(target[k]).shape for k in target):
            return f"{mode}: decoded to tensors that differ from the target"
    return None


def check_safetensors(rng, tmpdir):
    from arcfmt.safetensors_io import open_checkpoint, write_file

    base, _ = random_model(rng)
    path = os.path.join(tmpdir, "x.safetensors")
    write_file(path, base)
    data = bytearray(open(path, "rb").read())
    data = bytearray(mutate_bytes(rng, bytes(data)))
    n = int.from_bytes(bytes(data[:8]).ljust(8, b"\0"), "little")
    if rng.random() < 0.5 and 8 < len(data):  # a header edit that keeps the JSON length field consistent
        try:
            h = json.loads(bytes(data[8:8 + n]))
            k = next((k for k in h if k != "__metadata__"), None)
            if k is not None:
                field = ["dtype", "shape", "data_offsets"][int(rng.integers(3))]
                h[k][field] = [["F32", "X9", 5, None][int(rng.integers(4))], [-1, 2], [0, 1 << 62], "s"][int(rng.integers(4))]
                hb = json.dumps(h).encode()
                data = bytearray(len(hb).to_bytes(8, "little") + hb + bytes(data[8 + n:]))
        except (ValueError, UnicodeDecodeError):
            pass
    with open(path, "wb") as f:
        f.write(bytes(data))
    try:
        ck = open_checkpoint(path)
        for a in ck.tensors().values():
            np.asarray(a).tobytes()
    except ArcError as exc:
        if not str(exc):
            return "safetensors: ArcError without a message"
    except Exception:  # noqa: BLE001
        return f"safetensors: non-ArcError exception:\n{traceback.format_exc()}"
    return None


def run_range(seed, start, stop, max_seconds, out_dir):
    from arcfmt import ctx_delta
    ctx_delta.warm_up()  # the per-case time limit is for decoding, not for compiling the kernels
    failures, slow, counts = [], 0, {"struct": 0, "bytes": 0, "safetensors": 0, "intact": 0}
    worst = 0.0
    files = {}  # one valid file serves 8 consecutive cases: the mutations differ, the making is shared
    with tempfile.TemporaryDirectory() as tmpdir:
        for case in range(start, stop):
            rng = np.random.default_rng([seed, case])
            r = rng.random()
            t0 = time.perf_counter()
            data = None
            try:
                if r < 0.1:
                    engine = "safetensors"
                    fail = check_safetensors(rng, tmpdir)
                    data = open(os.path.join(tmpdir, "x.safetensors"), "rb").read() if fail else None
                else:
                    key = case // 8
                    if key not in files:
                        files.clear()
                        files[key] = random_file(np.random.default_rng([seed, key, 1]))
                    base, target, good = files[key]
                    if r < 0.13:
                        engine, data, intact = "intact", good, True
                    elif r < 0.6:
                        engine, data, intact = "struct", mutate_struct(rng, good), False
                    else:
                        engine, data, intact = "bytes", mutate_bytes(rng, good), False
                    if not intact and data == good:
                        intact = True
                    t0 = time.perf_counter()  # time the readers, not the making of the case
                    fail = check_delta(base, target, data, intact)
            except Exception:  # noqa: BLE001 - a bug in the fuzzer itself is also worth seeing
                engine, fail = "fuzzer", f"fuzzer error:\n{traceback.format_exc()}"
            dt = time.perf_counter() - t0
            worst = max(worst, dt)
            counts[engine] = counts.get(engine, 0) + 1
            if dt > max_seconds:
                slow += 1
                fail = (fail or "") + f" slow: {dt:.2f} s"
            if fail:
                failures.append({"case": case, "engine": engine, "failure": fail[-2000:]})
                if data is not None and out_dir:
                    os.makedirs(out_dir, exist_ok=True)
                    with open(os.path.join(out_dir, f"case-{seed}-{case}.arc"), "wb") as f:
                        f.write(data)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    return dict(failures=failures, slow=slow, counts=counts, worst_seconds=worst, peak_rss_mib=rss)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=2000)
    ap.add_argument("--start", type=int, default=0, help="first case number (to resume or reproduce)")
    ap.add_argument("--log", help="append every failure to this JSON-lines file as soon as its chunk ends")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--chunk", type=int, default=2000)
    ap.add_argument("--max-seconds", type=float, default=2.0)
    ap.add_argument("--max-rss-mib", type=int, default=1024)
    ap.add_argument("--out", default="fuzz-failures")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    chunks = [(args.seed, s, min(args.cases, s + args.chunk), args.max_seconds, args.out)
              for s in range(args.start, args.cases, args.chunk)]
    total = dict(failures=[], slow=0, counts={}, worst_seconds=0.0, peak_rss_mib=0)
    done = 0
    with ProcessPoolExecutor(args.workers) as pool:
        for res in pool.map(run_range, *zip(*chunks)):
            total["failures"] += res["failures"]
            total["slow"] += res["slow"]
            total["worst_seconds"] = max(total["worst_seconds"], res["worst_seconds"])
            total["peak_rss_mib"] = max(total["peak_rss_mib"], res["peak_rss_mib"])
            for k, v in res["counts"].items():
                total["counts"][k] = total["counts"].get(k, 0) + v
            done += sum(res["counts"].values())
            if args.log and res["failures"]:
                with open(args.log, "a") as logf:
                    for f in res["failures"]:
                        logf.write(json.dumps(f) + "\n")
            if not args.json:
                print(f"\r{done}/{args.cases} cases, {len(total['failures'])} failures", end="", file=sys.stderr)
    total["cases"] = done
    total["seconds"] = time.perf_counter() - t0
    total["ok"] = not total["failures"] and total["peak_rss_mib"] <= args.max_rss_mib
    if args.json:
        print(json.dumps(total, indent=1))
    else:
        print(file=sys.stderr)
        for f in total["failures"][:20]:
            print(f"case {f['case']} ({f['engine']}): {f['failure']}")
        c = total["counts"]
        print(f"{done} cases (struct {c.get('struct', 0)}, bytes {c.get('bytes', 0)}, safetensors "
              f"{c.get('safetensors', 0)}, intact {c.get('intact', 0)}) in {total['seconds']:.0f} s: "
              f"{len(total['failures'])} failures, {total['slow']} over {args.max_seconds} s "
              f"(slowest {total['worst_seconds']:.3f} s), peak RSS {total['peak_rss_mib']} MiB per worker")
    return 0 if total["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
