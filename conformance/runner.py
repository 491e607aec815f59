"""Run the conformance vectors against an implementation and report pass / fail / crash / timeout.

    python -m conformance run                       # the reference implementation (in process)
    python -m conformance run --impl independent    # conformance/independent_decoder.py
    python -m conformance run --impl "CMD {base} {delta} {out} [{mode}] [{previous}]"
                              [--impl-objects "CMD {kind} {object} [{name}]"]
    python -m conformance list                      # the vectors and what they cover
    python -m conformance rules                     # SPEC.md conditions (Appendix A, A.1) without a vector
    python -m conformance mutate                    # checks of the independent decoder no vector notices

Contract for --impl (conformance/README.md): the command rebuilds the target from {base} (a safetensors
file) and {delta} (an arcfmt file) and writes {out}, a JSON object {name: {dtype, shape, sha256}};
exit 0 = rebuilt, 1 = rejected (first stdout line ``error: CATEGORY: message``), anything else = crash.
{previous} (SPEC 1.9) is the option ``--previous PATH`` (the vector's previous step, a safetensors file)
for a vector that has one, else empty; a template without {previous} has ``--previous PATH`` appended
when the vector has one.
"""
from __future__ import annotations

import argparse
import contextlib
import fnmatch
import gzip
import hashlib
import io
import json
import os
import shlex
import string
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MANIFEST = os.path.join(HERE, "manifest.json")


def load_manifest():
    with open(MANIFEST, encoding="utf-8") as f:
        return json.load(f)


@contextlib.contextmanager
def object_file(v, key: str = "object"):
    """The path of a vector's file ``v[key]`` (its stream object, or its ``delta``) as the decoder or
    validator gets it: the file itself, or, for a file stored gzip-compressed (``.json.gz``,
    ``.arc.gz``, README), its expansion in a temporary file that is removed afterwards."""
    path = os.path.join(HERE, v[key])
    if not path.endswith(".gz"):
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="arcfmt-conf-") as tmp:
        out = os.path.join(tmp, os.path.basename(path)[:-3])
        with gzip.open(path, "rb") as src, open(out, "wb") as dst:
            while True:
                chunk = src.read(1 << 20)
                if not chunk:
                    break
                dst.write(chunk)
        yield out


def object_name(v) -> str:
    """The name a stream-object vector's object was read under (SPEC.md S3), e.g. ``head.json``."""
    return v.get("object_name", "")


def previous_path(v) -> str | None:
    """The path of a vector's previous step (SPEC.md 1.9, §7 "History": a safetensors file, opened and
    checked like the base file, after it), or None when the vector has none (``previous`` absent or
    null). Like ``base``, the manifest names it relative to this folder (``vectors/NAME.previous.safetensors``)."""
    name = v.get("previous")
    return os.path.join(HERE, name) if name else None


# ------------------------------------------------------------------------------------ reference

def reference_decode(base_path: str, delta_path: str, mode: str, prev_path: str | None = None) -> dict:
    """Rebuild with arcfmt in process; returns {name: {dtype, shape, sha256}} or raises ArcError.
    ``prev_path``: the vector's previous step (SPEC.md 1.9), opened as the base file is, after it, and
    passed as ``previous=``; None (no previous step) passes no such keyword."""
    import numpy as np

    import arcfmt
    from arcfmt.errors import SafetensorsError, WrongBaseError
    from arcfmt.safetensors_io import open_checkpoint

    try:  # SPEC.md §1 "Base files": a base file that is not one is `wrong_base`, before the delta is read
        base = open_checkpoint(base_path).tensors()
    except SafetensorsError as exc:
        raise WrongBaseError(f"base file: {exc}") from None
    extra = {}
    if prev_path is not None:
        try:  # SPEC.md §1 "Base files" (1.9): a previous step given as a file is checked the same way, after the base
            extra["previous"] = open_checkpoint(prev_path).tensors()
        except SafetensorsError as exc:
            raise WrongBaseError(f"previous file: {exc}") from None
    with open(delta_path, "rb") as f:
        data = f.read()
    if mode == "stream":
        out = dict(arcfmt.StreamReader(io.BytesIO(data), base, **extra))
    else:
        out = arcfmt.decode(base, data, **extra)
    res = {}
    for name, a in out.items():
        from arcfmt.dtypes import from_numpy
        res[name] = {"dtype": from_numpy(a.dtype).name, "shape": list(a.shape),
                     "sha256": hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()}
    return res


def reference_object(kind: str, path: str, name: str = "") -> None:
    """Parse a stream object (SPEC.md Part II) with arcfmt; raises ArcError when it must be refused.
    With ``name`` (the name it was read under), its step / shard / shard count are checked against it last."""
    from arcfmt.store import objects as SL
    from arcfmt.store import signing as SG

    with open(path, "rb") as f:
        data = f.read()
    obj = {"head": SL.parse_head, "manifest": SL.parse_manifest, "descriptor": SL.parse_descriptor,
           "signature": SG.parse_signature}[kind](data, name or path)
    if name:
        SL.check_own_name(obj, name)


def run_reference(v, mode, timeout):
    """Judge the reference on one vector. A run that waited for numba to compile a kernel for new argument
    types (once per install, seconds) is timed again: the limit is for decoding, not for compiling."""
    from arcfmt import backend

    compiled = backend.compiled_specializations()
    result = _run_reference(v, mode, timeout)
    if result[0] == "timeout" and backend.compiled_specializations() != compiled:
        result = _run_reference(v, mode, timeout)
    return result


def _run_reference(v, mode, timeout):
    from arcfmt import ArcError

    t0 = time.perf_counter()
    try:
        if "kind" in v:
            with object_file(v) as path:
                reference_object(v["kind"], path, object_name(v))
            out = None
            rc, category = 0, None
            return judge_object(v, rc, category) + (time.perf_counter() - t0,)
        with object_file(v, "delta") as delta:
            out = reference_decode(os.path.join(HERE, v["base"]), delta, mode, previous_path(v))
        rc, category = 0, None
    except ArcError as exc:
        if "kind" in v:
            return judge_object(v, 1, exc.category) + (time.perf_counter() - t0,)
        out, rc, category = None, 1, exc.category
    except Exception as exc:  # noqa: BLE001 - a crash is what we are looking for
        return "crash", f"{type(exc).__name__}: {exc}", time.perf_counter() - t0
    dt = time.perf_counter() - t0
    if dt > timeout:
        return "timeout", f"took {dt:.1f} s", dt
    return judge(v, rc, out, category, mode) + (dt,)


# ------------------------------------------------------------------------------------ external

def impl_command(impl: str) -> str:
    if impl == "independent":
        path = os.path.join(HERE, "independent_decoder.py")
        return (f"{shlex.quote(sys.executable)} {shlex.quote(path)} {{previous}} {{base}} {{delta}} {{out}} "
                f"{{mode_flag}}")
    return impl


def previous_option(v) -> str:
    """What ``{previous}`` becomes in an --impl template: ``--previous PATH`` (quoted for the shell) for a
    vector with a previous step (SPEC.md 1.9), else the empty string."""
    path = previous_path(v)
    return "" if path is None else f"--previous {shlex.quote(path)}"


def expand_template(template: str, **fields) -> str:
    """``template`` with its placeholders filled in. ``{previous}`` (``previous_option``) is filled in
    where the template has it; a template without it gets it appended (after a space) when it is not
    empty, so that a command written before 1.9 is still told of a vector's previous step."""
    cmd = template.format(**fields)
    if "previous" not in {f for _, f, _, _ in string.Formatter().parse(template) if f} and fields["previous"]:
        cmd += " " + fields["previous"]
    return cmd


def objects_command(impl: str | None, impl_objects: str | None) -> str | None:
    if impl_objects:
        return impl_objects
    if impl == "independent":
        path = os.path.join(HERE, "independent_decoder.py")
        return f"{shlex.quote(sys.executable)} {shlex.quote(path)} object {{kind}} {{object}} {{name}}"
    return None


def _run_shell(cmd, timeout):
    """(completed process or None on timeout, seconds)."""
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, timeout
    return p, time.perf_counter() - t0


def _error_category(stdout: str):
    """The category of a first line ``error: CATEGORY: message``, or None."""
    parts = (stdout.strip().splitlines() or [""])[0].split(":", 2)
    return parts[1].strip() if len(parts) >= 2 and parts[0].strip() == "error" else None


def run_external_object(template, v, timeout):
    with object_file(v) as path:
        cmd = template.format(kind=v["kind"], object=shlex.quote(path), name=shlex.quote(object_name(v)))
        p, dt = _run_shell(cmd, timeout)
    if p is None:
        return "timeout", f"no answer in {timeout} s", timeout
    if p.returncode in (0, 1):
        return judge_object(v, p.returncode, _error_category(p.stdout)) + (dt,)
    return "crash", f"exit {p.returncode}: {p.stderr.strip()[-200:]}", dt


def run_external(template, v, mode, timeout):
    with tempfile.TemporaryDirectory(prefix="arcfmt-conf-") as tmp, object_file(v, "delta") as delta:
        out_path = os.path.join(tmp, "out.json")
        cmd = expand_template(template, base=shlex.quote(os.path.join(HERE, v["base"])),
                              delta=shlex.quote(delta), out=shlex.quote(out_path),
                              mode=mode, mode_flag="--stream" if mode == "stream" else "",
                              previous=previous_option(v))
        p, dt = _run_shell(cmd, timeout)
        if p is None:
            return "timeout", f"no answer in {timeout} s", timeout
        if p.returncode == 0:
            try:
                with open(out_path, encoding="utf-8") as f:
                    out = json.load(f)
            except (OSError, ValueError) as exc:
                return "fail", f"exit 0 but no readable {{out}}: {exc}", dt
            return judge(v, 0, out, None, mode) + (dt,)
        if p.returncode == 1:
            return judge(v, 1, None, _error_category(p.stdout), mode) + (dt,)
        return "crash", f"exit {p.returncode}: {p.stderr.strip()[-200:]}", dt


# ------------------------------------------------------------------------------------ judging

def judge_object(v, rc, category):
    if v["expect"] == "accept":
        return ("pass", "") if rc == 0 else ("fail", f"rejected a valid object ({category})")
    if rc == 0:
        return "fail", "accepted an object that must be rejected"
    if category != v["error"]:
        return "fail", f"rejected as {category!r}, expected {v['error']!r}"
    return "pass", ""


def judge(v, rc, out, category, mode="random"):
    if v["expect"] == "accept":
        if rc != 0:
            return "fail", f"rejected a valid file ({category})"
        if out != v["tensors"]:
            wrong = sorted(set(out) ^ set(v["tensors"])) or [k for k in v["tensors"] if out.get(k) != v["tensors"][k]]
            return "fail", f"wrong output for {', '.join(wrong[:3])}"
        return "pass", ""
    if rc == 0:
        return "fail", "accepted a file that must be rejected"
    want = v.get("errors", {}).get(mode, v["error"])
    if category != want:
        return "fail", f"rejected as {category!r}, expected {want!r}"
    return "pass", ""


def cmd_run(args) -> int:
    m = load_manifest()
    vectors = [v for v in m["vectors"] if fnmatch.fnmatch(v["name"], args.filter)]
    template = impl_command(args.impl) if args.impl else None
    modes = ["random", "stream"] if args.mode == "both" else [args.mode]
    if template is not None and "{mode" not in template and args.mode == "both":
        modes = ["random"]
    obj_template = objects_command(args.impl, args.impl_objects)
    rows = []
    skipped = 0
    for v in vectors:
        if "kind" in v:  # a stream object (SPEC.md Part II): parsed once, no read modes
            if template is None:
                outcome, detail, dt = run_reference(v, "random", args.timeout)
            elif obj_template is None:
                skipped += 1
                continue
            else:
                outcome, detail, dt = run_external_object(obj_template, v, args.timeout)
            rows.append(dict(vector=v["name"], mode="object", outcome=outcome, detail=detail, seconds=round(dt, 3)))
            continue
        for mode in modes:
            if mode not in v.get("modes", ["random"]):
                continue
            if template is None:
                outcome, detail, dt = run_reference(v, mode, args.timeout)
            else:
                outcome, detail, dt = run_external(template, v, mode, args.timeout)
            rows.append(dict(vector=v["name"], mode=mode, outcome=outcome, detail=detail, seconds=round(dt, 3)))
    counts = {k: sum(1 for r in rows if r["outcome"] == k) for k in ("pass", "fail", "crash", "timeout")}
    if args.json:
        print(json.dumps(dict(implementation=args.impl or "reference", results=rows, summary=counts), indent=1))
    else:
        w = max((len(r["vector"]) for r in rows), default=10)
        for r in rows:
            if r["outcome"] != "pass" or args.verbose:
                print(f"{r['vector']:{w}s}  {r['mode']:6s}  {r['outcome']:7s}  {r['detail']}")
        print(f"{args.impl or 'reference'}: {len(rows)} runs of {len(vectors) - skipped} vectors — "
              f"{counts['pass']} passed, {counts['fail']} failed, {counts['crash']} crashed, "
              f"{counts['timeout']} timed out"
              + (f" ({skipped} stream-object vectors not run: no --impl-objects)" if skipped else ""))
    return 0 if counts["pass"] == len(rows) else 1


def cmd_list(args) -> int:
    for v in load_manifest()["vectors"]:
        exp = "accept" if v["expect"] == "accept" else f"reject:{v['error']}"
        print(f"{v['name']:44s} {exp:28s} {', '.join(v['covers'])}  {v['description']}")
    return 0


def _appendix() -> str:
    spec = os.path.join(HERE, "..", "SPEC.md")
    with open(spec, encoding="utf-8") as f:
        text = f.read()
    start = text.index("## Appendix A. Rule index")
    end = text.find("\n# Part II", start)
    return text[start:] if end < 0 else text[start:end]


def spec_rules() -> list:
    """The rule table of SPEC.md Appendix A: (rule id, sections, statement, category, binds)."""
    rows = []
    for line in _appendix().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[0].startswith("R-"):
            rows.append(tuple(cells))
    return rows


def spec_conditions() -> dict:
    """SPEC.md Appendix A.1: {rule id: [(condition id, statement, category)]} for the rules split into conditions."""
    out: dict = {}
    for line in _appendix().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("R-") and "." in cells[0]:
            out.setdefault(cells[0].split(".", 1)[0], []).append(tuple(cells))
    return out


def cmd_rules(args) -> int:
    """Count SPEC.md's decoder conditions (Appendix A.1; an unsplit rule is one condition) that vectors
    exercise; list those without a vector, and the writer/tool rules checked elsewhere."""
    covered: dict = {}
    vectors = load_manifest()["vectors"]
    for v in vectors:
        for r in v.get("rules", []):
            covered.setdefault(r, []).append(v["name"])
    rows = spec_rules()
    conds = spec_conditions()
    known = {r[0] for r in rows} | {c[0] for cs in conds.values() for c in cs}
    unknown = sorted(set(covered) - known)
    bad_parent = sorted(r for r in covered if r in conds and any(
        v["expect"] == "reject" and r in v.get("rules", []) for v in vectors))
    orphan = sorted(set(conds) - {r[0] for r in rows})
    units = []  # (condition id, statement, rule row)
    for r in rows:
        if r[4] != "decoder":
            continue
        for c in conds.get(r[0], [(r[0], r[2], r[3])]):
            units.append((c[0], c[1], r))
    missing = [u for u in units if u[0] not in covered]
    if args.verbose:
        for cid, stmt, _r in units:
            print(f"{cid:34s} {len(covered.get(cid, [])):3d} vectors  {stmt}")
    for r in rows:
        if r[4] != "decoder":
            print(f"{r[0]:34s} ({r[4]} rule: checked by the reference implementation's tests)  {r[2]}")
    for cid, stmt, r in missing:
        print(f"{cid:34s} NO VECTOR  §{r[1]}  {stmt}")
    for r in unknown:
        print(f"{r:34s} named by vectors but not in SPEC.md Appendix A")
    for r in bad_parent:
        print(f"{r:34s} split into conditions (Appendix A.1): a must-reject vector names the condition, not the rule")
    for r in orphan:
        print(f"{r:34s} has conditions in Appendix A.1 but no rule row")
    decoder = [r for r in rows if r[4] == "decoder"]
    print(f"{len(units) - len(missing)} of {len(units)} decoder conditions have vectors "
          f"({len(decoder)} decoder rules, {sum(1 for r in decoder if r[0] in conds)} of them split into "
          f"{sum(len(conds[r[0]]) for r in decoder if r[0] in conds)} conditions); "
          f"{len(rows) - len(decoder)} writer/tool rules are checked by tests")
    return 0 if not (missing or unknown or bad_parent or orphan) else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m conformance", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run the vectors against an implementation")
    r.add_argument("--impl", help="'independent', or a command with {base} {delta} {out} and optionally {mode} "
                                  "and {previous} (--previous PATH, or nothing; appended when left out)")
    r.add_argument("--impl-objects", help="a command with {kind}, {object} and optionally {name} for the "
                                          "stream-object vectors (SPEC.md Part II); 'independent' supplies its own")
    r.add_argument("--mode", choices=["random", "stream", "both"], default="both")
    r.add_argument("--filter", default="*", help="only vectors whose name matches this glob")
    r.add_argument("--timeout", type=float, default=10.0, help="seconds per vector")
    r.add_argument("--json", action="store_true")
    r.add_argument("-v", "--verbose", action="store_true", help="list passing runs too")
    r.set_defaults(func=cmd_run)
    ru = sub.add_parser("rules", help="count SPEC.md's decoder conditions that vectors exercise; list those without")
    ru.add_argument("-v", "--verbose", action="store_true", help="list covered rules too")
    ru.set_defaults(func=cmd_rules)
    ls = sub.add_parser("list", help="list the vectors")
    ls.set_defaults(func=cmd_list)
    from . import mutate
    mutate.add_parser(sub)
    args = ap.parse_args(argv)
    return args.func(args)
