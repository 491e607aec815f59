"""The ``arcfmt`` command line: demo, encode, apply, inspect, report, publish, follow.

Exit codes: 0 success; 1 the input was refused (bad, corrupt or wrong-base file: an ArcError; an
output that exists, without --force, or that is one of the inputs; or an operating-system error on a
file: ``arcfmt: error (io): cannot read|write PATH: reason``); 2 usage error; 3 unexpected internal
error (a bug: please report it with --debug output).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import time
from typing import Any

from . import FORMAT_VERSION, __version__
from .errors import ArcError

EPILOG = """examples:
  arcfmt demo
  arcfmt encode ckpt/step0030 ckpt/step0031 -o step31.arc
  arcfmt encode --keyframe ckpt/step0031 -o key31.arc
  arcfmt apply ckpt/step0030 step31.arc -o ckpt/step0031
  arcfmt apply /models/current step31.arc --in-place
  arcfmt inspect step31.arc --json
  arcfmt report step31.arc --base ckpt/step0030 -o step31.html
  arcfmt publish s3://bucket/run42 --step 17 --shard 3/8 ckpt/step0017/model-00004-of-00008.safetensors
  arcfmt follow s3://bucket/run42 --into /models/run42 [--tensors 'model.layers.*.mlp.*'] [--once|--until STEP]

Commands that write a file refuse one that exists unless --force, and always one of their inputs.

exit codes: 0 ok, 1 input refused (corrupt, truncated, wrong base, an existing output, ...) or an
OS error on a file ("error (io): cannot read|write PATH: reason"), 2 usage, 3 internal error
"""


FORCE_HELP = ("replace OUTPUT if it exists (atomically, keeping its mode; a symbolic link is replaced "
              "itself, never written through); an output that is one of the inputs is refused even so")


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


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"


def cmd_encode(args) -> int:
    from .checkpoint import encode_checkpoints
    from .outputs import check_output, check_readable
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
    for p in (target, base):
        if p is not None:
            check_readable(p)
    check_output(args.output, [base, target], args.force)  # before minutes of reading; again when writing
    total = open_checkpoint(target).nbytes
    update, close = _progress(total, "encode", args.progress)
    t0 = time.perf_counter()
    try:
        w = encode_checkpoints(base, target, args.output, base_step=base_step, target_step=target_step,
                               block_elems=args.block_elems, effort=args.effort, workers=args.workers,
                               keyframe=args.keyframe, progress=update, force=args.force)
    finally:
        close()
    dt = time.perf_counter() - t0
    changed = sum(b.changed or 0 for t in w.stats for b in t.blocks)
    size = w.size
    assert size is not None  # encode_checkpoints returns the writer closed
    res = dict(output=args.output, bytes=size, model_bytes=total, ratio_percent=100 * size / max(total, 1),
               tensors=len(w.stats), changed_elements=changed, seconds=dt, mb_per_s=total / 1e6 / max(dt, 1e-9),
               base_step=base_step, target_step=target_step)
    if args.json:
        print(json.dumps(res))
    else:
        print(f"wrote {args.output}: {_fmt_bytes(size)} for {_fmt_bytes(total)} of weights "
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
            per: dict[str, dict[str, Any]] = {}  # stream → stored, decoded, codecs
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


def cmd_report(args) -> int:
    from .checkpoint import _atomic_file
    from .outputs import check_output, check_readable
    from .report import render_html, report_figures

    for p in (args.delta, args.base):
        if p is not None:
            check_readable(p)
    check_output(args.output, [args.delta, args.base], args.force)
    fig = report_figures(args.delta, args.base)
    page = render_html(fig).encode("utf-8")
    # a temp file beside it, fsync, rename; OS errors name args.output (FileAccessError, category io)
    _atomic_file(args.output, lambda f: f.write(page), overwrite=args.force)
    if args.json:
        print(json.dumps(fig))
    else:
        changed = "unknown" if fig["changed"] is None else f"{fig['changed']} changed values"
        print(f"wrote {args.output}: {fig['kind']} of {_fmt_bytes(fig['file_bytes'])}, {fig['tensor_count']} tensors, "
              f"{changed}, page {_fmt_bytes(len(page))}")
    return 0


def cmd_demo(args) -> int:
    from .demo import run_demo
    from .errors import InputError, os_error

    if args.dir is not None:
        # what run_demo writes there: refuse to replace it unless --force, and never follow a link there
        names = ("step0000", "step0001", "step0001.arc", "rebuilt-step0001")
        there = [n for n in names if os.path.lexists(os.path.join(args.dir, n))]
        if there and not args.force:
            raise InputError(f"{args.dir} already holds {', '.join(there)}; use --force to replace them")
        for n in there:  # --force: start afresh (rmtree and unlink remove links, never what they point to)
            p = os.path.join(args.dir, n)
            try:
                if os.path.isdir(p) and not os.path.islink(p):
                    shutil.rmtree(p)
                else:
                    os.unlink(p)
            except OSError as exc:
                raise os_error(exc, "write", exc.filename or p) from None
    res = run_demo(args.dir, seed=args.seed)
    if args.json:
        print(json.dumps(res))
    else:
        print(res["text"])
    return 0 if res["bit_exact"] else 1


def _storage_options(pairs) -> dict:
    """``KEY=VALUE`` pairs (values parsed as JSON when they are JSON, else kept as strings)."""
    out = {}
    for item in pairs or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--storage-option takes KEY=VALUE, not {item!r}")
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
    return out


def _step_in_path(path):
    """The step number in the last path component that names one (``step0017/...`` or ``step17.safetensors``)."""
    for part in reversed(os.path.normpath(path).split(os.sep)):
        m = re.search(r"step[_-]?(\d+)", part)
        if m:
            return int(m.group(1))
    return None


def cmd_publish(args) -> int:
    from .store import Publisher

    m = re.fullmatch(r"(\d+)/(\d+)", args.shard)
    if not m:
        raise UsageError(f"--shard takes RANK/COUNT with RANK counted from 0 (e.g. 3/8), not {args.shard!r}")
    shard, num_shards = int(m.group(1)), int(m.group(2))
    step = args.step if args.step is not None else _step_in_path(args.checkpoint)
    if step is None:
        raise UsageError("give --step (no 'stepNNN' in the checkpoint path)")
    base_step = args.base_step
    if args.base is not None and base_step is None:
        base_step = _step_in_path(args.base)
        if base_step is None:
            raise UsageError("give --base-step (no 'stepNNN' in the --base path)")
    if args.base is None and args.base_step is not None:
        raise UsageError("--base-step needs --base")
    pub = Publisher(args.url, shard=shard, num_shards=num_shards, keyframe_every=args.keyframe_every,
                    storage_options=_storage_options(args.storage_option), effort=args.effort,
                    workers=args.workers, remember=False, state_dir=args.state, writer=args.writer)
    res = pub.publish(step, args.checkpoint, base=args.base, base_step=base_step, keyframe=args.keyframe,
                      file_name=args.file_name)
    out = res.as_dict()
    if args.json:
        print(json.dumps(out))
        return 0
    parts = []
    for kind in ("delta", "keyframe"):
        o = out[kind]
        if o is not None:
            frm = f" from step {o['base_step']}" if kind == "delta" else ""
            parts.append(f"{kind}{frm} {_fmt_bytes(o['size'])} ({100 * o['size'] / max(res.model_bytes, 1):.3f} %)")
    c = res.commit
    if c.committed:
        state = f"step committed{' (manifest written here)' if c.made_manifest else ''}, head at step {c.head}"
    elif c.waiting_for_base is not None:
        state = f"waiting for base step {c.waiting_for_base} to be committed"
    else:
        state = f"waiting for shard(s) {', '.join(map(str, c.waiting_for))}"
    print(f"published step {step} shard {shard}/{num_shards} ({res.file}): {'; '.join(parts)}; {state}; "
          f"{res.seconds:.2f} s")
    return 0


def cmd_follow(args) -> int:
    from .store import Follower

    if args.once and args.until is not None:
        raise UsageError("give --once or --until, not both")
    bar = None

    def progress(event):
        nonlocal bar
        if event["event"] == "bytes":
            if bar is None:
                from tqdm import tqdm
                bar = tqdm(desc="download", unit="B", unit_scale=True, unit_divisor=1024, leave=False, file=sys.stderr)
            bar.update(event["bytes"])
        elif event["event"] == "step" and bar is not None:
            bar.close()
            bar = None

    fol = Follower(args.url, args.into, tensors=args.tensors, storage_options=_storage_options(args.storage_option),
                   chunk_size=args.chunk_size, workers=args.workers, progress=progress if args.progress else None)
    updates = fol.sync() if args.once else fol.follow(until=args.until, interval=args.interval, timeout=args.timeout)
    n = 0
    for u in updates:
        n += 1
        d = u.as_dict()
        if args.json:
            print(json.dumps(d), flush=True)
            continue
        frm = "new folder" if u.from_step is None else f"from step {u.from_step}"
        print(f"step {u.step} ({u.kind}, {frm}): {_fmt_bytes(u.bytes_downloaded)} in {u.requests} "
              f"request{'' if u.requests == 1 else 's'} "
              f"({_fmt_bytes(u.bytes_needed)} of records + {_fmt_bytes(u.tail_bytes)} of indexes), "
              f"{len(u.changed)}/{u.tensors} tensors changed, verified{' (whole model)' if u.verified_model else ''} "
              f"in {u.seconds:.2f} s; head {u.head_step}, lag {u.lag_steps} step(s)", flush=True)
    head = fol.head()
    summary = dict(event="done", step=fol.step, head=None if head is None else head.step, applied=n, into=fol.into)
    if args.json:
        print(json.dumps(summary))
    elif n == 0:
        print("nothing published yet" if head is None else f"{fol.into} is at step {fol.step} (head {head.step})")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="arcfmt", description="Lossless weight deltas for RL weight sync (SPEC.md).",
                                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version",
                   version=f"arcfmt {__version__} (format {FORMAT_VERSION[0]}.{FORMAT_VERSION[1]})")
    p.add_argument("--debug", action="store_true", help="show the full traceback on errors")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    def common(sp):
        sp.add_argument("--json", action="store_true", help="print the figures as one JSON object")
        sp.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)

    d = sub.add_parser("demo", help="make a small model pair, encode, apply, verify, print sizes",
                       description="Runs the main job on a built-in example (seeded, ~4 MB).")
    d.add_argument("--dir", help="keep the example files here (default: a temporary folder)")
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--force", action="store_true", help="replace the demo's files already in --dir")
    common(d)
    d.set_defaults(func=cmd_demo)

    e = sub.add_parser("encode", help="write the delta between two checkpoints",
                       description="BASE/TARGET: a .safetensors file or a folder of shards.",
                       epilog="example: arcfmt encode ckpt/step0030 ckpt/step0031 -o step31.arc",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    e.add_argument("paths", nargs="+", metavar="BASE TARGET")
    e.add_argument("-o", "--output", required=True, help="the .arc file to write (atomically)")
    e.add_argument("--force", action="store_true", help=FORCE_HELP)
    e.add_argument("--keyframe", action="store_true", help="full lossless snapshot of TARGET, needs no base")
    e.add_argument("--base-step", type=int, help="step id of the base (default: from a 'stepNNN' name)")
    e.add_argument("--target-step", type=int, help="step id of the target (default: from a 'stepNNN' name)")
    e.add_argument("--effort", choices=["fast", "default", "max"], default="default",
                   help="codec trials per stream: fast = zstd-3; default = zstd-15 (zstd-9 and xz-6 from 16 KiB); "
                        "max = strongest")
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

    r = sub.add_parser("report", help="draw a delta as one self-contained HTML page",
                       description="Per tensor: bytes per stream role, changed fraction, codec per stream; the\n"
                                   "file's identity and totals. One HTML file with inline SVG charts, no scripts.\n"
                                   "With --base, each tensor is also checked against the base, and changes in\n"
                                   "keyframe blocks are counted.",
                       epilog="examples:\n  arcfmt report step31.arc -o step31.html\n"
                              "  arcfmt report step31.arc --base ckpt/step0030 -o step31.html --json",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    r.add_argument("delta", metavar="DELTA")
    r.add_argument("--base", metavar="BASE", help="the base checkpoint: a .safetensors file or a folder of shards")
    r.add_argument("-o", "--output", required=True, help="the .html file to write (atomically)")
    r.add_argument("--force", action="store_true", help=FORCE_HELP)
    common(r)
    r.set_defaults(func=cmd_report)

    def storage(sp):
        sp.add_argument("-O", "--storage-option", action="append", metavar="KEY=VALUE",
                        help="fsspec storage option (repeatable), e.g. -O endpoint_url=http://127.0.0.1:8333; "
                             "credentials come from the usual botocore / google-auth places")

    pb = sub.add_parser("publish", help="publish one trainer shard's part of a step to a stream",
                        description="Uploads this shard's delta (and a keyframe when due) as immutable objects, "
                                    "claims the shard, and commits the step once every shard is there.",
                        epilog="example: arcfmt publish s3://bucket/run42 --step 17 --shard 3/8 "
                               "ckpt/step0017/model-00004-of-00008.safetensors --state /var/arcfmt",
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    pb.add_argument("url", metavar="URL", help="the stream: any fsspec URL (s3://, gs://, a local path, ...)")
    pb.add_argument("checkpoint", metavar="CHECKPOINT_SHARD", help="this shard's safetensors file (or folder)")
    pb.add_argument("--step", type=int, help="step id (default: from a 'stepNNN' in the path)")
    pb.add_argument("--shard", default="0/1", help="RANK/COUNT, RANK counted from 0 (default 0/1)")
    pb.add_argument("--base", help="the previous step's checkpoint shard, to publish a delta from")
    pb.add_argument("--base-step", type=int, help="step id of --base (default: from a 'stepNNN' in its path)")
    pb.add_argument("--state", metavar="DIR", help="keep a copy of what was published here; the next run "
                                                   "publishes its delta from it")
    pb.add_argument("--keyframe", action=argparse.BooleanOptionalAction, default=None,
                    help="force (or suppress) a keyframe; default: every --keyframe-every steps")
    pb.add_argument("--keyframe-every", type=int, default=10, help="keyframe when step %% N == 0 (0: on demand only)")
    pb.add_argument("--file-name", help="the file name followers give this shard (default: the checkpoint's)")
    pb.add_argument("--writer", metavar="ID", help="an id shared by all ranks of this trainer run (e.g. the job id): "
                                                   "a step is never committed from shards of different writers")
    pb.add_argument("--effort", choices=["fast", "default", "max"], default="default")
    pb.add_argument("--workers", type=int, help="encoder threads (default: CPU count)")
    storage(pb)
    common(pb)
    pb.set_defaults(func=cmd_publish)

    fo = sub.add_parser("follow", help="keep a local checkpoint folder at a stream's latest step",
                        description="Applies each committed step in order (or jumps through the latest keyframe when "
                                    "that downloads fewer bytes), verifies every tensor and swaps the folder "
                                    "atomically. Runs until interrupted unless --once or --until is given.",
                        epilog="example: arcfmt follow s3://bucket/run42 --into /models/run42 --tensors "
                               "'model.layers.*.mlp.*' --once",
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    fo.add_argument("url", metavar="URL")
    fo.add_argument("--into", required=True, metavar="DIR", help="the checkpoint folder to keep up to date")
    fo.add_argument("--tensors", action="append", metavar="PATTERN",
                    help="only tensors matching this shell pattern (repeatable; default: all)")
    fo.add_argument("--once", action="store_true", help="catch up with the current head, then exit")
    fo.add_argument("--until", type=int, metavar="STEP", help="exit once the folder is at STEP or later")
    fo.add_argument("--interval", type=float, default=2.0, help="seconds between head polls (default 2)")
    fo.add_argument("--timeout", type=float, help="exit after this many seconds without a new step")
    fo.add_argument("--chunk-size", type=int, default=8 << 20, help="largest range request in bytes (default 8 MiB)")
    fo.add_argument("--workers", type=int, help="decoder threads (default: CPU count)")
    fo.add_argument("--progress", action=argparse.BooleanOptionalAction, default=sys.stderr.isatty(),
                    help="show the bytes of each step as they arrive")
    storage(fo)
    common(fo)
    fo.set_defaults(func=cmd_follow)
    return p


def _os_error_text(exc: OSError, args) -> str:
    """``cannot read|write PATH: reason`` for an OSError that no command turned into an ArcError: the
    path the user gave, never a temporary file beside it."""
    reason = exc.strerror or str(exc) or type(exc).__name__
    path = exc.filename
    if path is None:
        return reason
    path = os.fsdecode(path) if isinstance(path, bytes) else str(path)
    verb = "access"
    name = os.path.basename(path)
    if name.startswith(".arcfmt-"):  # built beside the user's path: .arcfmt-tmp-PID-HEX-NAME, .arcfmt-old-NAME
        verb = "write"
        parts = name[len(".arcfmt-tmp-"):].split("-", 2)
        if name.startswith(".arcfmt-tmp-") and len(parts) == 3 and parts[2]:
            path = os.path.join(os.path.dirname(path), parts[2])
        elif name.startswith(".arcfmt-old-") and len(name) > len(".arcfmt-old-"):
            path = os.path.join(os.path.dirname(path), name[len(".arcfmt-old-"):])
        else:
            path = os.path.dirname(path) or "."
    writes = [getattr(args, k, None) for k in ("output", "into", "dir", "state")]
    if getattr(args, "in_place", False):
        writes.append(getattr(args, "base", None))
    reads = [getattr(args, k, None) for k in ("paths", "base", "delta", "checkpoint")]
    reads = [q for r in reads for q in (r if isinstance(r, list) else [r])]

    def among(paths):
        """The user's spelling of ``path`` if it is one of ``paths`` (or inside one), else None."""
        full = os.path.abspath(path)
        for q in paths:
            if isinstance(q, str) and q:
                fq = os.path.abspath(q)
                if full == fq:
                    return q
                if full.startswith(fq.rstrip(os.sep) + os.sep):
                    return path
        return None

    for kind, paths in (("write", writes), ("read", reads)):
        user = among(paths)
        if user is not None:
            path = user
            verb = kind if verb == "access" else verb
            break
    return f"cannot {verb} {path}: {reason}"


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
    except OSError as exc:  # the operating system refused a file: the user's to fix, not a bug
        if args.debug:
            raise
        print(f"arcfmt: error (io): {_os_error_text(exc, args)}", file=sys.stderr)
        return 1
    except Exception as exc:  # a bug, not bad input
        if args.debug:
            raise
        print(f"arcfmt: internal error: {type(exc).__name__}: {exc} (run with --debug for the trace)",
              file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
