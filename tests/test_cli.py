"""The command line as a user runs it: exit codes, one-line errors, --json output."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import arcfmt
from arcfmt.demo import make_model_pair, save_sharded
from support.cli import run as cli_run


def run(*args, check_rc=None):
    return cli_run(*args, rc=check_rc)


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    base, target = make_model_pair(seed=2, layers=1, d=64, vocab=300)
    save_sharded(d / "step0007", base)
    save_sharded(d / "step0008", target)
    return d


def test_demo_json():
    p = run("demo", "--json", check_rc=0)
    res = json.loads(p.stdout)
    assert res["bit_exact"] is True and res["delta_bytes"] < res["model_bytes"] / 10


def test_encode_inspect_apply(ckpts, tmp_path):
    delta = tmp_path / "s.arc"
    p = run("encode", ckpts / "step0007", ckpts / "step0008", "-o", delta, "--json", check_rc=0)
    res = json.loads(p.stdout)
    assert res["bytes"] == os.path.getsize(delta) and (res["base_step"], res["target_step"]) == (7, 8)
    p = run("inspect", delta, "--json", check_rc=0)
    info = json.loads(p.stdout)
    assert info["format_version"] == "{}.{}".format(*arcfmt.FORMAT_VERSION) and info["target_step"] == 8
    assert info["prefixed_names"] is True   # the writer sets PREFIXED_NAMES (SPEC.md §6, 1.3)
    assert info["compact_index"] is True    # and COMPACT_INDEX (§4, §10.1, 1.5)
    assert {t["dtype"] for t in info["tensors"]} == {"BF16", "F32"}
    assert all("streams" in t for t in info["tensors"])
    p = run("inspect", delta, "--blocks", check_rc=0)
    assert "ctx-delta" in p.stdout or "bf16-delta" in p.stdout
    p = run("apply", ckpts / "step0007", delta, "-o", tmp_path / "out", "--json", check_rc=0)
    assert json.loads(p.stdout)["verified"] is True
    for n in os.listdir(ckpts / "step0008"):
        assert (tmp_path / "out" / n).read_bytes() == (ckpts / "step0008" / n).read_bytes()


def test_full_index_for_fleets_not_yet_upgraded(ckpts, tmp_path):
    """``--full-index`` (and ``compact_index=False``): the index as format 1.4 wrote it, read the same."""
    delta = tmp_path / "f.arc"
    run("encode", ckpts / "step0007", ckpts / "step0008", "-o", delta, "--full-index", check_rc=0)
    assert json.loads(run("inspect", delta, "--json", check_rc=0).stdout)["compact_index"] is False
    assert delta.read_bytes()[12:16] == bytes(4)
    run("apply", ckpts / "step0007", delta, "-o", tmp_path / "out", check_rc=0)
    for n in os.listdir(ckpts / "step0008"):
        assert (tmp_path / "out" / n).read_bytes() == (ckpts / "step0008" / n).read_bytes()
    base = {"w": np.arange(64, dtype=np.float32)}
    target = {"w": base["w"] + 1}
    full, compact = (arcfmt.encode(base, target, compact_index=c) for c in (False, True))
    assert len(full) > len(compact) and full[12] == 0 and compact[12] == 3
    assert arcfmt.decode(base, full)["w"].tobytes() == target["w"].tobytes()


def test_keyframe(ckpts, tmp_path):
    key = tmp_path / "k.arc"
    run("encode", "--keyframe", ckpts / "step0008", "-o", key, check_rc=0)
    run("apply", ckpts / "step0007", key, "-o", tmp_path / "out", check_rc=0)
    for n in os.listdir(ckpts / "step0008"):
        assert (tmp_path / "out" / n).read_bytes() == (ckpts / "step0008" / n).read_bytes()


def test_encode_never_replaces_its_base(ckpts, tmp_path):
    """`arcfmt encode base target -o base` used to replace the base with the delta and exit 0."""
    base = tmp_path / "step0007.safetensors"
    base.write_bytes((ckpts / "step0007" / "model-00001-of-00002.safetensors").read_bytes())
    before = base.read_bytes()
    target = tmp_path / "step0008.safetensors"
    target.write_bytes((ckpts / "step0008" / "model-00001-of-00002.safetensors").read_bytes())
    for extra in ((), ("--force",)):
        p = run("encode", base, target, "-o", base, *extra, check_rc=1)
        assert p.stderr == (f"arcfmt: error (input): {base} is one of the inputs: refusing to overwrite "
                            "an input (even with --force)\n")
        p = run("encode", ckpts / "step0007", ckpts / "step0008", "-o",
                ckpts / "step0007" / "model-00002-of-00002.safetensors", *extra, check_rc=1)
        assert "refusing to overwrite an input" in p.stderr and p.stderr.count("\n") == 1
    assert base.read_bytes() == before and sorted(os.listdir(tmp_path)) == [base.name, target.name]
    delta = tmp_path / "d.arc"
    run("encode", base, target, "-o", delta, check_rc=0)
    p = run("encode", base, target, "-o", delta, check_rc=1)
    assert p.stderr == f"arcfmt: error (input): {delta} already exists; use --force to replace it\n"
    run("encode", base, target, "-o", delta, "--force", check_rc=0)
    p = run("encode", tmp_path / "nope", target, "-o", tmp_path / "e.arc", check_rc=1)
    assert p.stderr == f"arcfmt: error (io): cannot read {tmp_path / 'nope'}: No such file or directory\n"


def test_errors_are_one_line_with_exit_codes(ckpts, tmp_path):
    delta = tmp_path / "s.arc"
    run("encode", ckpts / "step0007", ckpts / "step0008", "-o", delta, check_rc=0)
    # wrong base: the target is not the base this delta was made from
    p = run("apply", ckpts / "step0008", delta, "-o", tmp_path / "o", check_rc=1)
    assert p.stderr.startswith("arcfmt: error (wrong_base):") and p.stderr.count("\n") == 1
    assert not (tmp_path / "o").exists()
    bad = tmp_path / "bad.arc"
    bad.write_bytes(b"PK\x03\x04 not an arcfmt file at all, but long enough to have a trailer" * 3)
    p = run("inspect", bad, check_rc=1)
    assert "(bad_magic)" in p.stderr
    bad.write_bytes(delta.read_bytes()[:-7])
    p = run("apply", ckpts / "step0007", bad, "-o", tmp_path / "o", check_rc=1)
    assert "(truncated)" in p.stderr
    run("apply", ckpts / "step0007", delta, check_rc=2)  # neither -o nor --in-place
    run("frobnicate", check_rc=2)
    p = run("--help", check_rc=0)
    assert "examples:" in p.stdout and "exit codes" in p.stdout and "--force" in p.stdout
    assert "--force" in run("encode", "--help", check_rc=0).stdout


def test_versions_have_one_source():
    """The package version and the format version each come from one place: what --version says,
    what the metadata says and what every file is written as agree."""
    import importlib.metadata

    import numpy as np

    import arcfmt
    from arcfmt import records
    p = subprocess.run([sys.executable, "-m", "arcfmt", "--version"], capture_output=True, text=True)
    major, minor = arcfmt.FORMAT_VERSION
    from arcfmt.store import STREAM_VERSION
    assert p.stdout.strip() == (f"arcfmt {arcfmt.__version__} (writes format {major}.{minor} files; "
                                f"stream layout {STREAM_VERSION[0]}.{STREAM_VERSION[1]})")
    assert importlib.metadata.version("arcfmt") == arcfmt.__version__
    data = arcfmt.encode(None, {"a": np.zeros(3, np.float32)})
    assert records.check_header(data[:16]).version == arcfmt.FORMAT_VERSION
    assert arcfmt.DeltaReader(data).describe()["format_version"] == f"{major}.{minor}"


@pytest.mark.parametrize("progress", ["--progress", "--no-progress"])
def test_apply_checks_each_base_right_after_its_header(tmp_path, progress):
    """The command makes §12.1 step 6 in its order too (R-CHECK-ORDER): tensor a's wrong base is the
    error, not the damaged TENS record of tensor b after it (the progress bar's total once read every
    header ahead of the checks)."""
    v = os.path.join(os.path.dirname(__file__), "..", "conformance", "vectors", "n_wrong_base_then_reserved_tens_flags")
    p = run("apply", progress, v + ".base.safetensors", v + ".arc", "-o", tmp_path / "o.safetensors", check_rc=1)
    assert p.stderr.strip().splitlines()[-1].startswith("arcfmt: error (wrong_base): base tensor 'a'")
    assert not (tmp_path / "o.safetensors").exists()
