"""Mutation testing of the conformance suite: every check of the independent decoder must be noticed.

    python -m conformance mutate               # list the surviving mutants; exit 1 unless each is a listed equivalent
    python -m conformance mutate --list        # the checks (mutation sites) found, with their ids
    python -m conformance mutate --full        # run every vector against every mutant (slow; proves the shortcut)

A *check* is every call ``fail(...)`` in conformance/independent_decoder.py and every ``raise
_JsonReject(...)`` (the JSON grammar checks of SPEC.md S2), found in its syntax tree — nothing is listed
by hand, so a check added to the decoder is a mutation site at once. The mutant of a check:

- the check is the whole body of an ``if``: the condition becomes ``(condition) and False`` (evaluated
  as before, never taken: a decoder that does not make this check, the ``elif`` after it still made);
- anywhere else (an ``except`` handler, the end of a loop): the statement becomes ``pass``.

A mutant is *killed* when some run (a vector in one read mode, or a stream object) no longer passes:
it is accepted or rejected with another category, crashes or times out. A mutant no vector kills
*survives*: the suite cannot tell a decoder that skips this check from one that makes it.

The shortcut (exact, not a sample): a mutant behaves like the decoder on every input until it reaches
the mutated check, and the decoder raises there. So a mutant can differ only on the runs where the
unmutated decoder raised at that very check; one baseline run of every vector records where each run
raised, and each mutant is run on those runs only. ``--full`` runs everything and must agree.

Survivors that cannot be killed — *equivalent* mutants, where another check always fires first, or
always fires next with the same category — are listed in conformance/equivalent_mutants.json with the
reason, and reviewed like code. The gate (``.ci/run``) fails on an unlisted survivor and on a listed
entry that is no longer a survivor (killed, or no longer a check).
"""
from __future__ import annotations

import ast
import json
import multiprocessing as mp
import os
import signal
import sys
import time
import types

from . import runner

HERE = os.path.dirname(os.path.abspath(__file__))
DECODER = os.path.join(HERE, "independent_decoder.py")
EQUIVALENTS = os.path.join(HERE, "equivalent_mutants.json")
RUN_SECONDS = 20          # per run; a mutant that loops is killed (timeout)
MEMORY_BYTES = 3 << 30    # per worker; a mutant that allocates what a skipped limit would have refused is killed


# ------------------------------------------------------------------------------------ the sites

class Site:
    def __init__(self, sid, func, line, end_line, kind, category, message):
        self.id, self.func, self.line, self.end_line = sid, func, line, end_line
        self.kind, self.category, self.message = kind, category, message


def _parents(tree):
    par = {}
    for n in ast.walk(tree):
        for c in ast.iter_child_nodes(n):
            par[c] = n
    return par


def _is_check(node) -> bool:
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
        f = node.value.func
        return isinstance(f, ast.Name) and f.id == "fail"
    if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
        f = node.exc.func
        return isinstance(f, ast.Name) and f.id == "_JsonReject"
    return False


def find_sites(source: str):
    """[(Site, statement node)] in source order; ids are stable: function / category / message text."""
    tree = ast.parse(source)
    par = _parents(tree)
    found, seen = [], {}
    for node in ast.walk(tree):
        if not (isinstance(node, (ast.Expr, ast.Raise)) and _is_check(node)):
            continue
        func, p = "<module>", par.get(node)
        while p is not None:
            if isinstance(p, (ast.FunctionDef, ast.ClassDef)):
                func = p.name
                break
            p = par.get(p)
        call = node.value if isinstance(node, ast.Expr) else node.exc
        if isinstance(node, ast.Expr):
            category = call.args[0].value if isinstance(call.args[0], ast.Constant) else ast.unparse(call.args[0])
            msg_node = call.args[1] if len(call.args) > 1 else None
        else:
            category, msg_node = "json", call.args[0] if call.args else None
        message = "" if msg_node is None else ast.unparse(msg_node)
        base = f"{func}: {category}: {message}"
        seen[base] = seen.get(base, 0) + 1
        sid = base if seen[base] == 1 else f"{base} #{seen[base]}"
        parent = par[node]
        kind = "if" if isinstance(parent, ast.If) and parent.body == [node] else "pass"
        found.append((Site(sid, func, node.lineno, node.end_lineno, kind, category, message), node))
    found.sort(key=lambda sn: sn[0].line)
    return tree, par, found


def mutant_code(source: str, index: int):
    """The decoder with check number ``index`` switched off, compiled (line numbers unchanged)."""
    tree, par, found = find_sites(source)
    site, node = found[index]
    parent = par[node]
    if site.kind == "if":
        parent.test = ast.copy_location(ast.BoolOp(op=ast.And(), values=[parent.test, ast.Constant(False)]),
                                        parent.test)
    else:
        for field in ("body", "orelse", "finalbody", "handlers"):
            block = getattr(parent, field, None)
            if isinstance(block, list) and node in block:
                block[block.index(node)] = ast.copy_location(ast.Pass(), node)
                break
    ast.fix_missing_locations(tree)
    return compile(tree, DECODER, "exec")


# ------------------------------------------------------------------------------------ one run in process

_MODULES: dict = {}


def _module(index):
    if index not in _MODULES:
        with open(DECODER, encoding="utf-8") as f:
            source = f.read()
        code = compile(source, DECODER, "exec") if index is None else mutant_code(source, index)
        mod = types.ModuleType(f"independent_decoder_mutant_{index}")
        mod.__file__ = DECODER
        exec(code, mod.__dict__)
        _MODULES[index] = mod
    return _MODULES[index]


class _Timeout(BaseException):
    pass


def _alarm(signum, frame):
    raise _Timeout()


def _raising_lines(exc) -> list:
    """The decoder lines where an ArcError (and the _JsonReject it was made from) was raised."""
    lines = []
    while exc is not None:
        tb, last = exc.__traceback__, None
        while tb is not None:
            code = tb.tb_frame.f_code
            if code.co_filename == DECODER and code.co_name != "fail":
                last = tb.tb_lineno
            tb = tb.tb_next
        if last is not None:
            lines.append(last)
        exc = exc.__context__
    return lines


def run_one(index, v, mode):
    """(outcome, detail, lines where the run raised) for one vector / mode against mutant ``index``."""
    mod = _module(index)
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(RUN_SECONDS)
    try:
        if "kind" in v:
            try:
                with runner.object_file(v) as path:
                    mod.check_stream_object(v["kind"], path, runner.object_name(v))
                outcome, detail = runner.judge_object(v, 0, None)
                lines: list = []
            except mod.ArcError as exc:
                outcome, detail = runner.judge_object(v, 1, exc.category)
                lines = _raising_lines(exc)
            return outcome, detail, lines
        decode = mod.decode_streaming if mode == "stream" else mod.decode_random_access
        base = previous = None
        try:
            base = mod.BaseCheckpoint(os.path.join(HERE, v["base"]))
            prev_path = runner.previous_path(v)  # SPEC.md 1.9: opened and checked after the base file
            previous = mod.BaseCheckpoint(prev_path, "previous") if prev_path is not None else None
            with runner.object_file(v, "delta") as delta:
                out = mod.report(decode(delta, base, previous))
        except mod.ArcError as exc:
            outcome, detail = runner.judge(v, 1, None, exc.category, mode)
            return outcome, detail, _raising_lines(exc)
        finally:
            for f in (base, previous):
                if f is not None:
                    f.f.close()
        outcome, detail = runner.judge(v, 0, out, None, mode)
        return outcome, detail, []
    except _Timeout:
        return "timeout", f"no answer in {RUN_SECONDS} s", []
    except MemoryError:
        return "crash", "MemoryError", []
    except Exception as exc:  # noqa: BLE001 - a mutant's crash kills it
        return "crash", f"{type(exc).__name__}: {exc}"[:200], []
    finally:
        signal.alarm(0)


def _worker_init():
    try:
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))
    except (ImportError, ValueError, OSError):
        pass


def _task(args):
    index, vi, mode = args
    v = runner.load_manifest()["vectors"][vi] if _VECTORS is None else _VECTORS[vi]
    return args, run_one(index, v, mode)


_VECTORS = None
RAISED_BY: dict = {}


def _runs(vectors):
    out = []
    for vi, v in enumerate(vectors):
        if "kind" in v:
            out.append((vi, "object"))
        else:
            out.extend((vi, mode) for mode in ("random", "stream") if mode in v.get("modes", ["random"]))
    return out


# ------------------------------------------------------------------------------------ the command

def load_equivalents() -> dict:
    if not os.path.exists(EQUIVALENTS):
        return {}
    with open(EQUIVALENTS, encoding="utf-8") as f:
        data = json.load(f)
    return {e["check"]: e["reason"] for e in data["equivalent"]}


def analyse(full=False, jobs=None, progress=None):
    """{site id: {"site", "runs", "killed_by"}} plus the baseline outcomes."""
    global _VECTORS
    vectors = runner.load_manifest()["vectors"]
    _VECTORS = vectors
    with open(DECODER, encoding="utf-8") as f:
        source = f.read()
    _, _, found = find_sites(source)
    sites = [s for s, _ in found]
    runs = _runs(vectors)
    jobs = jobs or min(4, os.cpu_count() or 1)
    ctx = mp.get_context("fork")
    with ctx.Pool(jobs, initializer=_worker_init) as pool:
        base_res = pool.map(_task, [(None, vi, mode) for vi, mode in runs], chunksize=4)
        reached: dict = {}
        baseline_bad = []
        raised_by: dict = {}  # vector name -> ids of the checks it raised at (the first, and a JSON one)
        for (_, vi, mode), (outcome, detail, lines) in base_res:
            if outcome != "pass":
                baseline_bad.append((vectors[vi]["name"], mode, outcome, detail))
            for ln in lines:
                for i, s in enumerate(sites):
                    if s.line <= ln <= s.end_line:
                        reached.setdefault(i, []).append((vi, mode))
                        raised_by.setdefault(vectors[vi]["name"], set()).add(s.id)
        tasks = []
        for i in range(len(sites)):
            for vi, mode in (runs if full else reached.get(i, [])):
                tasks.append((i, vi, mode))
        results: dict = {}
        for (i, vi, mode), (outcome, detail, _) in pool.imap_unordered(_task, tasks, chunksize=2):
            results.setdefault(i, []).append((vectors[vi]["name"], mode, outcome, detail))
    report = {}
    for i, s in enumerate(sites):
        killed = [r for r in results.get(i, []) if r[2] != "pass"]
        report[s.id] = dict(site=s, reached=len(reached.get(i, [])), killed_by=sorted(killed))
    global RAISED_BY
    RAISED_BY = raised_by
    return report, baseline_bad, len(runs), len(tasks)


def cmd_mutate(args) -> int:
    with open(DECODER, encoding="utf-8") as f:
        _, _, found = find_sites(f.read())
    if args.list:
        for s, _ in found:
            print(f"L{s.line:<5d} {s.kind:4s} {s.id}")
        print(f"{len(found)} checks")
        return 0
    t0 = time.perf_counter()
    report, baseline_bad, n_runs, n_tasks = analyse(full=args.full, jobs=args.jobs)
    dt = time.perf_counter() - t0
    if baseline_bad:
        for name, mode, outcome, detail in baseline_bad:
            print(f"BASELINE {name} {mode}: {outcome} {detail}")
        print("the unmutated independent decoder does not pass every vector: fix that first")
        return 1
    if args.map:
        # SPEC.md conditions -> the checks of the independent decoder their must-reject vectors fire
        by_cond: dict = {}
        for v in runner.load_manifest()["vectors"]:
            if v["expect"] == "reject":
                for r in v.get("rules", []):
                    by_cond.setdefault(r, set()).update(RAISED_BY.get(v["name"], ()))
        for r in sorted(by_cond):
            print(f"{r:34s} {len(by_cond[r]):2d} checks: " + " | ".join(sorted(by_cond[r]))[:300])
        unmapped = [r for r, c in by_cond.items() if not c]
        print(f"{len(by_cond)} conditions named by must-reject vectors; {len(unmapped)} map to no check")
    equivalents = load_equivalents()
    survivors = [sid for sid, r in report.items() if not r["killed_by"]]
    unlisted = [sid for sid in survivors if sid not in equivalents]
    stale = [sid for sid in equivalents if sid not in report or report[sid]["killed_by"]]
    if args.verbose:
        for sid, r in report.items():
            k = r["killed_by"]
            print(f"L{r['site'].line:<5d} {'killed ' if k else 'SURVIVES'} {len(k):3d}/{r['reached']:<3d} {sid}"
                  + (f"  [e.g. {k[0][0]} {k[0][1]}: {k[0][2]}]" if k else ""))
    for sid in survivors:
        r = report[sid]
        tag = "equivalent" if sid in equivalents else "SURVIVES"
        why = ("no vector reaches it" if not r["reached"]
               else f"reached by {r['reached']} run(s), each still passes")
        print(f"{tag:10s} L{r['site'].line:<5d} {sid}  ({why})")
    for sid in stale:
        why = "not a check any more" if sid not in report else f"killed by {report[sid]['killed_by'][0][0]}"
        print(f"STALE      {sid}  (listed in equivalent_mutants.json, but {why})")
    print(f"{len(report)} mutants (checks of conformance/independent_decoder.py): "
          f"{len(report) - len(survivors)} killed, "
          f"{len(survivors)} survive ({len(survivors) - len(unlisted)} listed as equivalent, {len(unlisted)} not); "
          f"{n_runs} baseline runs + {n_tasks} mutant runs in {dt:.0f} s")
    return 0 if not unlisted and not stale else 1


def add_parser(sub):
    mu = sub.add_parser("mutate", help="switch off each check of the independent decoder; "
                                       "list the ones no vector notices")
    mu.add_argument("--list", action="store_true", help="list the checks (mutation sites) and exit")
    mu.add_argument("--full", action="store_true", help="run every vector against every mutant (slow)")
    mu.add_argument("--jobs", type=int, default=None, help="worker processes (default: cores, at most 4)")
    mu.add_argument("-v", "--verbose", action="store_true", help="list killed mutants too")
    mu.add_argument("--map", action="store_true", help="list, for each SPEC.md condition, the checks its vectors fire")
    mu.set_defaults(func=cmd_mutate)


if __name__ == "__main__":
    sys.exit(runner.main(["mutate", *sys.argv[1:]]))
