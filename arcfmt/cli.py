"""The ``arcfmt`` command line: demo, encode, apply, inspect.

Exit codes: 0 success; 1 the input was refused (bad, corrupt or wrong-base file: an ArcError);
2 usage error; 3 unexpected internal error (a bug: please report it with --debug output).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time

from . import __version__
from .errors import ArcError

EPILOG = """examples:
  arcfmt demo
  arcfmt encode ckpt/step0030 ckpt/step0031 -o step31.arc
  arcfmt encode --keyframe ckpt/step0031 -o key31.arc
  arcfmt apply ckpt/step0030 step31.arc -o ckpt/step0031
  arcfmt apply /models/current step31.arc --in-place
  arcfmt inspect step31.arc --json

exit codes: 0 ok, 1 input refused (corrupt, truncated, wrong base, ...), 2 usage, 3 internal error
"""


class UsageError(Exception):
    """Arguments that do not make sense together (exit code 2)."""


def _step_of(path: str | None):
    m = re.search(r"step[_-]?(\d+)", os.path.basename(os.path.normpath(path))) if path else None
    return int(m.group(1)) if m else None


def _progress(total: int, desc: str, enabled: bool):
    if not enabled:
        return None, lambda: None
    from tqdm import tqdm

    bar = tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024, leave=False,
               file=sys.stderr)
    return bar.update, bar.close


def _fmt_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024


def cmd_encode(args) -> int:
    from .checkpoint import encode_checkpoints
    from .safetensors_io import open_checkpoint

    if args.keyframe:
        if len(args.paths) != 1:
            raise UsageError("arcfmt encode --keyframe takes one checkpoint: TARGET")
        base, target = None, args.paths[0]
    else:
        if len(args.paths) != 2:
            raise UsageError("arcfmt encode takes BASE TARGET (or --keyframe TARGET)")
        base, target = args.paths
    base_step = args.base_step if args.base_step is not None else _step_of(base)
    target_step = args.target_step if args.target_step is not None else _step_of(target)
    total = open_checkpoint(target).nbytes
    update, close = _progress(total, "encode", args.progress)
    t0 = time.perf_counter()
    try:
        w = encode_checkpoints(base, target, args.output, base_step=base_step, target_step=target_step,
                               block_elems=args.block_elems, effort=args.effort, workers=args.workers,
                               keyframe=args.keyframe, progress=update)
    finally:
        close()
    dt = time.perf_counter() - t0
    changed = sum(b.changed or 0 for t in w.stats for b in t.blocks)
    res = dict(output=args.output, bytes=w.size, model_bytes=total, ratio_percent=100 * w.size / max(total, 1),
               tensors=len(w.stats), changed_elements=changed, seconds=dt, mb_per_s=total / 1e6 / max(dt, 1e-9),
               base_step=base_step, target_step=target_step)
    if args.json:
        print(json.dumps(res))
    else:
        print(f"wrote {args.output}: {_fmt_bytes(w.size)} for {_fmt_bytes(total)} of weights "
              f"({res['ratio_percent']:.3f} %), {len(w.stats)} tensors, {changed} changed values, "
              f"{dt:.2f} s ({res['mb_per_s']:.0f} MB/s)")
    return 0


def cmd_apply(args) -> int:
    from .checkpoint import apply_delta
    from .reader import DeltaReader

    if args.in_place == (args.output is not None):
        raise UsageError("arcfmt apply needs exactly one of -o OUT or --in-place")
    t0 = time.perf_counter()
    with open(args.delta, "rb") as f:
        reader = DeltaReader(f, workers=args.workers)
        total = sum(reader.header(n).size * reader.header(n).dtype.itemsize for n in reader.names)
        update, close = _progress(total, "apply", args.progress)
        try:
            res = apply_delta(args.base, reader, args.output, in_place=args.in_place, workers=args.workers,
                              progress=update)
        finally:
            close()
    dt = time.perf_counter() - t0
    out = dict(output=res.path, tensors=res.tensors, changed_tensors=res.changed_tensors,
               bytes_written=res.bytes_written, files=res.files, seconds=dt, verified=True,
               target_step=reader.target_step)
    if args.json:
        print(json.dumps(out))
    else:
        print(f"{'updated' if args.in_place else 'wrote'} {res.path}: {res.tensors} tensors "
              f"({res.changed_tensors} changed), {res.files} file(s), verified bit-exact in {dt:.2f} s")
    return 0


def cmd_inspect(args) -> int:
    from .reader import DeltaReader

    with open(args.delta, "rb") as f:
        d = DeltaReader(f).describe()
    if not args.blocks:
        for t in d["tensors"]:
            per = {}
            for b in t["blocks"]:
                for i, s in enumerate(b["streams"]):
                    key = f"s{i}"
                    p = per.setdefault(key, dict(stored=0, decoded=0, codecs=set()))
                    p["stored"] += s["stored"]
                    p["decoded"] += s["decoded"]
                    p["codecs"].add(s["codec"])
            t["streams"] = {k: dict(stored=v["stored"], decoded=v["decoded"], codecs=sorted(v["codecs"]))
                            for k, v in per.items()}
            t["block_count"] = len(t.pop("blocks"))
    if args.json:
        print(json.dumps(d, indent=None))
        return 0
    steps = f"step {d['base_step']} → {d['target_step']}"
    print(f"arcfmt {d['format_version']} · {_fmt_bytes(d['file_bytes'])} · {steps} · "
          f"{len(d['tensors'])} tensors · index {_fmt_bytes(d['index_bytes'])}")
    print(f"base digest {d['base_digest']}  target digest {d['target_digest']}")
    print(f"{'tensor':48s} {'dtype':8s} {'shape':>16s} {'changed':>9s} {'bytes':>9s}  encoding / streams (codec:bytes)")
    for t in d["tensors"]:
        shape = "×".join(map(str, t["shape"])) or "()"
        ch = "?" if t["changed"] is None else str(t["changed"])
        if args.blocks:
            streams = "; ".join(
                f"{b['encoding']}[" + " ".join(f"{s['codec']}:{s['stored']}" for s in b["streams"]) + "]"
                for b in t["blocks"])
        else:
            streams = ",".join(t["encodings"]) + " " + " ".join(
                f"{'/'.join(v['codecs'])}:{v['stored']}" for v in t["streams"].values())
        print(f"{t['name'][:48]:48s} {t['dtype']:8s} {shape:>16s} {ch:>9s} {t['bytes']:>9d}  {streams}")
    return 0


def cmd_demo(args) -> int:
    from .demo import run_demo

    res = run_demo(args.dir, seed=args.seed)
    if args.json:
        print(json.dumps(res))
    else:
        print(res["text"])
    return 0 if res["bit_exact"] else 1


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="arcfmt", description="Lossless weight deltas for RL weight sync (SPEC.md).",
                                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"arcfmt {__version__} (format 1.0)")
    p.add_argument("--debug", action="store_true", help="show the full traceback on errors")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    def common(sp):
        sp.add_argument("--json", action="store_true", help="print the figures as one JSON object")
        sp.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)

    d = sub.add_parser("demo", help="make a small model pair, encode, apply, verify, print sizes",
                       description="Runs the main job on a built-in example (seeded, ~4 MB).")
    d.add_argument("--dir", help="keep the example files here (default: a temporary folder)")
    d.add_argument("--seed", type=int, default=0)
    common(d)
    d.set_defaults(func=cmd_demo)

    e = sub.add_parser("encode", help="write the delta between two checkpoints",
                       description="BASE/TARGET: a .safetensors file or a folder of shards.",
                       epilog="example: arcfmt encode ckpt/step0030 ckpt/step0031 -o step31.arc",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    e.add_argument("paths", nargs="+", metavar="BASE TARGET")
    e.add_argument("-o", "--output", required=True, help="the .arc file to write (atomically)")
    e.add_argument("--keyframe", action="store_true", help="full lossless snapshot of TARGET, needs no base")
    e.add_argument("--base-step", type=int, help="step id of the base (default: from a 'stepNNN' name)")
    e.add_argument("--target-step", type=int, help="step id of the target (default: from a 'stepNNN' name)")
    e.add_argument("--effort", choices=["fast", "default", "max"], default="default",
                   help="codec trials per stream: fast = zstd-3; default = zstd-19, xz, bz2; max = strongest")
    e.add_argument("--block-elems", type=int, default=1 << 20, help="elements per block (default 1048576)")
    e.add_argument("--workers", type=int, help="encoder threads (default: CPU count)")
    e.add_argument("--progress", action=argparse.BooleanOptionalAction, default=sys.stderr.isatty())
    common(e)
    e.set_defaults(func=cmd_encode)

    a = sub.add_parser("apply", help="rebuild the target checkpoint from BASE and a delta",
                       epilog="examples:\n  arcfmt apply ckpt/step0030 step31.arc -o ckpt/step0031\n"
                              "  arcfmt apply /models/current step31.arc --in-place",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    a.add_argument("base", metavar="BASE")
    a.add_argument("delta", metavar="DELTA")
    a.add_argument("-o", "--output", help="write the target here (must not exist)")
    a.add_argument("--in-place", action="store_true", help="replace BASE, crash-safely")
    a.add_argument("--workers", type=int, help="decoder threads (default: CPU count)")
    a.add_argument("--progress", action=argparse.BooleanOptionalAction, default=sys.stderr.isatty())
    common(a)
    a.set_defaults(func=cmd_apply)

    i = sub.add_parser("inspect", help="show what a delta file holds, per tensor",
                       epilog="example: arcfmt inspect step31.arc --json")
    i.add_argument("delta", metavar="DELTA")
    i.add_argument("--blocks", action="store_true", help="one entry per block instead of per tensor")
    common(i)
    i.set_defaults(func=cmd_inspect)
    return p


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ArcError as exc:
        if args.debug:
            raise
        print(f"arcfmt: error ({exc.category}): {exc}", file=sys.stderr)
        return 1
    except UsageError as exc:
        print(f"arcfmt: usage error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("arcfmt: interrupted", file=sys.stderr)
        return 130
    except SystemExit:
        raise
    except Exception as exc:  # a bug, not bad input
        if args.debug:
            raise
        print(f"arcfmt: internal error: {type(exc).__name__}: {exc} (run with --debug for the trace)",
              file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
