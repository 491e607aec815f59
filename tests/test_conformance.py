"""The conformance suite: vectors match their generator, and the reference passes every one."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def test_vectors_match_generator():
    p = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "make_vectors.py"), "--check"],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr


def test_reference_passes_every_vector():
    from conformance.runner import main

    assert main(["run"]) == 0


def test_a_reference_run_that_waited_for_a_compile_is_timed_again(monkeypatch):
    """CI met a clean install's first ctx-delta vector over the limit while numba compiled: such a run is
    timed again; a slow run that compiled nothing stays a timeout."""
    from arcfmt import backend
    from conformance import runner

    runs, compiled = [], [0]

    def once(v, mode, timeout):
        runs.append(timeout)
        compiled[0] += v["compiles"]
        slow = len(runs) == 1 or v["slow"]
        return ("timeout", "took 15.8 s", 15.8) if slow else ("pass", "", 0.01)

    monkeypatch.setattr(runner, "_run_reference", once)
    monkeypatch.setattr(backend, "compiled_specializations", lambda: compiled[0])
    # compiled, then fast: passes, timed again under the same limit
    assert runner.run_reference({"compiles": 3, "slow": False}, "random", 10.0) == ("pass", "", 0.01)
    assert runs == [10.0, 10.0]
    # compiled, and slow again: a timeout
    runs.clear()
    assert runner.run_reference({"compiles": 3, "slow": True}, "random", 10.0)[0] == "timeout" and len(runs) == 2
    # compiled nothing: a timeout at once
    runs.clear()
    assert runner.run_reference({"compiles": 0, "slow": False}, "random", 10.0)[0] == "timeout" and runs == [10.0]


def test_compiled_specializations_counts_what_numba_built():
    from arcfmt import backend
    from arcfmt.encodings import ctx_delta

    ctx_delta.warm_up()
    assert (backend.compiled_specializations() > 0) == (backend.selected() is not backend.twins())


def test_every_decoder_rule_has_a_vector():
    from conformance.runner import main

    assert main(["rules"]) == 0


def test_independent_decoder_passes_every_vector():
    """The second decoder, written from SPEC.md alone, rebuilds and refuses exactly as the vectors say
    (every run in this process, as `conformance mutate` runs it: a process per run took 107 s of CI)."""
    from conformance import mutate, runner

    vectors = runner.load_manifest()["vectors"]
    runs = mutate._runs(vectors)
    handler = signal.getsignal(signal.SIGALRM)   # run_one's time limit sets its own
    try:
        bad = [(vectors[vi]["name"], mode, *mutate.run_one(None, vectors[vi], mode)[:2]) for vi, mode in runs]
    finally:
        signal.signal(signal.SIGALRM, handler)
    assert len(runs) > 1000 and [b for b in bad if b[2] != "pass"] == []


def test_independent_decoder_command():
    """The same decoder as a stranger runs it, one process per run (`conformance run --impl independent`):
    every vector that is the first of its kind (accepted, each error category, each stream object kind)
    in both read modes, through the command's files and exit codes."""
    from conformance import runner

    first: dict = {}
    for v in runner.load_manifest()["vectors"]:
        first.setdefault((v.get("kind"), v["expect"], v.get("error")), v)
    decode = runner.impl_command("independent")
    objects = runner.objects_command("independent", None)
    outcomes = []
    for v in first.values():
        if "kind" in v:
            outcomes.append((v["name"], runner.run_external_object(objects, v, 60)[:2]))
        else:
            outcomes += [((v["name"], mode), runner.run_external(decode, v, mode, 60)[:2])
                         for mode in v.get("modes", ["random"])]
    assert len(outcomes) >= 20 and all(o == ("pass", "") for _, o in outcomes), outcomes


def test_mutation_sites_are_found_and_compile():
    """`python -m conformance mutate` finds every check of the independent decoder from its syntax tree, with
    unique ids, and each mutant compiles (the gate itself runs in .ci/run)."""
    from conformance import mutate

    with open(mutate.DECODER, encoding="utf-8") as f:
        source = f.read()
    _, _, found = mutate.find_sites(source)
    ids = [s.id for s, _ in found]
    assert len(ids) == len(set(ids)) and len(ids) >= 200
    assert source.count("fail(") - 1 + source.count("raise _JsonReject(") == len(ids)  # less the def of fail
    for i in (0, len(found) // 2, len(found) - 1):
        assert mutate.mutant_code(source, i).co_filename == mutate.DECODER


def test_equivalent_mutants_name_existing_checks():
    """Every entry of conformance/equivalent_mutants.json names a check that exists and gives a reason."""
    import json

    from conformance import mutate

    with open(mutate.DECODER, encoding="utf-8") as f:
        ids = {s.id for s, _ in mutate.find_sites(f.read())[2]}
    with open(mutate.EQUIVALENTS, encoding="utf-8") as f:
        entries = json.load(f)["equivalent"]
    for e in entries:
        assert e["check"] in ids, e["check"]
        assert e["kind"] in ("equivalent", "backstopped", "unreachable", "not vectored") and len(e["reason"]) > 20
