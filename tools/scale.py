#!/usr/bin/env python3
"""Scale check: encode and apply a synthetic BF16 model bigger than a few GB with bounded memory.

    python tools/scale.py --dir /tmp/scale              # a 3B-shaped model, ~6.4 GB per checkpoint
    python tools/scale.py --dir /tmp/scale --layers 2   # a quick small run
    python tools/scale.py --dir /tmp/scale --write-only # only the checkpoints, for other tools

Writes base and target checkpoints (4 safetensors shards + index, Llama-3.2-3B shapes, RL-like sparse
changes: about 1 % of values move by one unit in the last place, a few change sign or exponent), then
runs, each in its own process so its peak RSS can be read: `arcfmt encode`, `arcfmt apply -o` into a
new folder, and `arcfmt apply --in-place`. Prints size, MB/s, peak RSS and cores busy (CPU seconds
over wall seconds) per phase, compared with the same phases on a small model (2 layers), and checks
the rebuilt checkpoints are byte-identical.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

from arcfmt.cli import _block_elems  # noqa: E402  (the range arcfmt encode --block-elems takes)
from arcfmt.dtypes import BF16  # noqa: E402
from arcfmt.safetensors_io import INDEX_NAME, build_header, layout_specs  # noqa: E402

CHUNK = 1 << 24  # elements generated at a time
ENCODE_ARGS: list[str] = []   # --block-elems, when given


def shapes_3b(layers: int, hidden=3072, inter=8192, kv=1024, vocab=128256):
    out = [("model.embed_tokens.weight", (vocab, hidden))]
    for i in range(layers):
        p = f"model.layers.{i}."
        out += [(p + "input_layernorm.weight", (hidden,)), (p + "self_attn.q_proj.weight", (hidden, hidden)),
                (p + "self_attn.k_proj.weight", (kv, hidden)), (p + "self_attn.v_proj.weight", (kv, hidden)),
                (p + "self_attn.o_proj.weight", (hidden, hidden)), (p + "post_attention_layernorm.weight", (hidden,)),
                (p + "mlp.gate_proj.weight", (inter, hidden)), (p + "mlp.up_proj.weight", (inter, hidden)),
                (p + "mlp.down_proj.weight", (hidden, inter))]
    out.append(("model.norm.weight", (hidden,)))
    return out


def gen_chunk(rng, n):
    """BF16 bit patterns of weights ~N(0, 0.02): exponents around 2^-6, random mantissas and signs."""
    exp = np.clip(np.round(rng.normal(120, 2, n)), 100, 126).astype(np.uint16)
    return (rng.integers(0, 2, n, dtype=np.uint16) << 15) | (exp << 7) | rng.integers(0, 128, n, dtype=np.uint16)


def step_chunk(rng, u, density=0.01):
    t = u.copy()
    idx = np.flatnonzero(rng.random(u.size) < density)
    mant = t[idx] & 0x7F
    up = rng.random(idx.size) < 0.5
    inc = (up & (mant < 0x7F)) | (~up & (mant == 0))
    t[idx] = np.where(inc, t[idx] + 1, t[idx] - 1)
    flip = idx[rng.random(idx.size) < 0.01]
    t[flip] ^= 0x8000
    return t


def write_pair(folder_base, folder_target, shapes, shards=4, seed=0):
    os.makedirs(folder_base, exist_ok=True)
    os.makedirs(folder_target, exist_ok=True)
    per = -(-len(shapes) // shards)
    weight_map = {}
    rng = np.random.default_rng(seed)
    total = 0
    for k in range(shards):
        part = shapes[k * per:(k + 1) * per]
        if not part:
            continue
        fname = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        specs = layout_specs([(n, BF16, s) for n, s in part])
        header = build_header(specs, {"format": "pt"})
        with open(os.path.join(folder_base, fname), "wb") as fb, open(os.path.join(folder_target, fname), "wb") as ft:
            for f in (fb, ft):
                f.write(len(header).to_bytes(8, "little"))
                f.write(header)
            for s in specs:
                n = (s.end - s.begin) // 2
                for start in range(0, n, CHUNK):
                    u = gen_chunk(rng, min(CHUNK, n - start))
                    fb.write(u.tobytes())
                    ft.write(step_chunk(rng, u).tobytes())
                total += s.end - s.begin
        weight_map.update({n: fname for n, _ in part})
    for folder in (folder_base, folder_target):
        with open(os.path.join(folder, INDEX_NAME), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f)
    return total


RUN = ("import json, resource, sys, time; from arcfmt.cli import main; t=time.perf_counter(); "
       "u0=resource.getrusage(resource.RUSAGE_SELF); "
       "rc=main(sys.argv[1:]); dt=time.perf_counter()-t; "
       "u=resource.getrusage(resource.RUSAGE_SELF); "
       "cpu=u.ru_utime+u.ru_stime-u0.ru_utime-u0.ru_stime; "   # the phase's CPU, not the imports'
       "print(json.dumps(dict(rc=rc, seconds=dt, peak_rss=u.ru_maxrss*1024, cpu_s=cpu)), "
       "file=sys.stderr)")


def phase(args):
    os.sync()  # the previous phase's writeback must not be billed to this one
    p = subprocess.run([sys.executable, "-c", RUN, *args, "--no-progress"], capture_output=True, text=True, cwd=ROOT)
    last = [line for line in p.stderr.splitlines() if line.startswith("{")]
    res = json.loads(last[-1]) if last else None
    if p.returncode != 0 or res is None or res["rc"] != 0:  # main() returns its exit code: check it too
        raise SystemExit(f"phase {args[0]} failed: {p.stdout}\n{p.stderr}")
    return res


def digest_tree(path):
    out = {}
    for n in sorted(os.listdir(path)):
        h = hashlib.sha256()
        with open(os.path.join(path, n), "rb") as f:
            for chunk in iter(lambda: f.read(1 << 24), b""):
                h.update(chunk)
        out[n] = h.hexdigest()
    return out


def run(folder, layers, label):
    shutil.rmtree(folder, ignore_errors=True)
    b, t = os.path.join(folder, "step0000"), os.path.join(folder, "step0001")
    t0 = time.perf_counter()
    total = write_pair(b, t, shapes_3b(layers))
    gen = time.perf_counter() - t0
    delta = os.path.join(folder, "step0001.arc")
    res = {"label": label, "model_bytes": total, "generate_s": gen}
    res["encode"] = phase(["encode", b, t, "-o", delta, *ENCODE_ARGS])
    res["delta_bytes"] = os.path.getsize(delta)
    out = os.path.join(folder, "rebuilt")
    res["apply_new"] = phase(["apply", b, delta, "-o", out])
    want = digest_tree(t)
    res["apply_new"]["bit_exact"] = digest_tree(out) == want
    shutil.rmtree(out)
    res["apply_in_place"] = phase(["apply", b, delta, "--in-place"])
    res["apply_in_place"]["bit_exact"] = digest_tree(b) == want
    for k in ("encode", "apply_new", "apply_in_place"):
        res[k]["mb_per_s"] = total / 1e6 / res[k]["seconds"]
    shutil.rmtree(folder, ignore_errors=True)
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default="/tmp/arcfmt-scale")
    ap.add_argument("--layers", type=int, default=28, help="28 = Llama-3.2-3B shapes (~6.4 GB of BF16)")
    ap.add_argument("--max-rss-gib", type=float, default=2.0)
    ap.add_argument("--block-elems", type=_block_elems, help="passed to arcfmt encode (default: its own)")
    ap.add_argument("--write-only", action="store_true",
                    help="only write the big pair (DIR/big/step0000, step0001) and exit: data for other tools, "
                         "e.g. tools/gil_share.py on a dir of links step0000.safetensors and "
                         "step0001.safetensors to one shard of each")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.write_only and args.block_elems is not None:
        ap.error("--write-only writes checkpoints only: --block-elems is for the encode")
    if args.write_only:
        folder = os.path.join(args.dir, "big")
        shutil.rmtree(folder, ignore_errors=True)
        total = write_pair(os.path.join(folder, "step0000"), os.path.join(folder, "step0001"), shapes_3b(args.layers))
        print(f"wrote {folder}/step0000 and step0001: {total / 1e9:.2f} GB each")
        return 0
    ENCODE_ARGS[:] = [] if args.block_elems is None else ["--block-elems", str(args.block_elems)]
    small = run(os.path.join(args.dir, "small"), 2, "small (2 layers)")
    big = run(os.path.join(args.dir, "big"), args.layers, f"big ({args.layers} layers)")
    ok = True
    rows = []
    for r in (small, big):
        for k in ("encode", "apply_new", "apply_in_place"):
            p = r[k]
            rows.append((r["label"], k, r["model_bytes"], p["seconds"], p["mb_per_s"], p["peak_rss"],
                         p["cpu_s"] / p["seconds"], p.get("bit_exact", True)))
            ok &= p.get("bit_exact", True)
    for k in ("encode", "apply_new", "apply_in_place"):
        ok &= big[k]["peak_rss"] <= args.max_rss_gib * (1 << 30)
        big[k]["vs_small_speed"] = big[k]["mb_per_s"] / small[k]["mb_per_s"]
    if args.json:
        print(json.dumps(dict(small=small, big=big, ok=ok), indent=1))
    else:
        print("| model | phase | GB | seconds | MB/s | peak RSS MiB | cores busy | bit-exact |")
        print("|---|---|---|---|---|---|---|---|")
        for label, k, nb, s, mbs, rss, busy, ex in rows:
            print(f"| {label} | {k} | {nb / 1e9:.2f} | {s:.1f} | {mbs:.0f} | {rss / 2**20:.0f} | {busy:.2f} "
                  f"| {'yes' if ex else 'NO'} |")
        print(f"delta: {big['delta_bytes'] / 1e6:.1f} MB for {big['model_bytes'] / 1e9:.2f} GB "
              f"({100 * big['delta_bytes'] / big['model_bytes']:.3f} %); big/small speed: "
              + ", ".join(f"{k} {big[k]['vs_small_speed']:.2f}" for k in ("encode", "apply_new", "apply_in_place")))
        print("OK" if ok else f"FAILED: peak RSS above {args.max_rss_gib} GiB or not bit-exact")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
