"""The command line behaves like the tools a user already knows (issue 18): ``-`` for stdin/stdout, a
closed pipe is no error, ``-q`` and ARCFMT_QUIET / ARCFMT_NO_PROGRESS, one stderr line per store retry,
exit codes 130 and 141, hints for swapped arguments and a delta applied twice, sanity checks of
--block-elems / --workers, fast keyframes, ``-o DIR/``, a readable ``inspect`` and ``--version``.
Every test runs ``python -m arcfmt`` as a user would, except where it needs to fake the disk."""
from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import termios
import threading
import time

import numpy as np
import pytest

import arcfmt
from arcfmt import cli, encodings
from arcfmt.demo import make_model_pair, save_sharded
from arcfmt.safetensors_io import write_file
from arcfmt.store import STREAM_VERSION, retry
from support.cli import QUIET_ENV, run


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    """step0007/ and step0008/ (folders of 2 shards), b.safetensors / t.safetensors, and the delta d.arc."""
    d = tmp_path_factory.mktemp("conv")
    base, target = make_model_pair(seed=5, layers=1, d=64, vocab=300)
    save_sharded(d / "step0007", base)
    save_sharded(d / "step0008", target)
    write_file(d / "b.safetensors", base)
    write_file(d / "t.safetensors", target)
    run("encode", d / "step0007", d / "step0008", "-o", d / "d.arc", rc=0)
    return d


def same_folder(a, b):
    assert sorted(os.listdir(a)) == sorted(os.listdir(b))
    for n in os.listdir(a):
        assert (a / n).read_bytes() == (b / n).read_bytes(), n


# ----------------------------------------------------------------------------- - is stdin / stdout

def test_dash_is_stdout_for_encode_and_stdin_for_apply_and_inspect(ckpts, tmp_path):
    p = run("encode", ckpts / "step0007", ckpts / "step0008", "-o", "-", input=b"", rc=0)
    assert p.stdout == (ckpts / "d.arc").read_bytes()  # the delta itself, nothing else on stdout
    assert p.stderr.startswith(b"wrote <stdout>: ") and p.stderr.count(b"\n") == 1  # the summary: stderr
    assert not os.path.exists("-") and not (tmp_path / "-").exists()
    js = run("encode", ckpts / "step0007", ckpts / "step0008", "-o", "-", "--json", input=b"", rc=0)
    assert js.stdout == p.stdout and json.loads(js.stderr)["bytes"] == len(p.stdout)
    # a pipe into inspect and apply (spooled), and a redirected file (read where it is)
    info = json.loads(run("inspect", "-", "--json", input=p.stdout, rc=0).stdout)
    assert info["target_step"] == 8 and info["file_bytes"] == len(p.stdout)
    run("apply", ckpts / "step0007", "-", "-o", tmp_path / "piped", input=p.stdout, rc=0)
    same_folder(tmp_path / "piped", ckpts / "step0008")
    with open(ckpts / "d.arc", "rb") as f:
        run("apply", ckpts / "step0007", "-", "-o", tmp_path / "redirected", stdin=f, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, rc=0)
    same_folder(tmp_path / "redirected", ckpts / "step0008")
    # a truncated pipe is the same error as a truncated file
    p = run("apply", ckpts / "step0007", "-", "-o", tmp_path / "cut", input=p.stdout[:-9], rc=1)
    assert b"(truncated)" in p.stderr and not (tmp_path / "cut").exists()


def _on_a_terminal(args, which):
    """Run arcfmt with stdin or stdout (``which``: 0 or 1) on a pseudo-terminal: (rc, stderr)."""
    master, slave = pty.openpty()
    try:
        streams = {"stdin": subprocess.DEVNULL, "stdout": subprocess.PIPE}
        streams[("stdin", "stdout")[which]] = slave
        p = subprocess.run([sys.executable, "-m", "arcfmt", *map(str, args)], stderr=subprocess.PIPE, text=True,
                           timeout=120, **streams)
    finally:
        os.close(slave)
        os.close(master)
    return p.returncode, p.stderr


def test_dash_never_means_a_terminal(ckpts, tmp_path):
    rc, err = _on_a_terminal(["encode", ckpts / "step0007", ckpts / "step0008", "-o", "-"], 1)
    assert rc == 2 and "refusing to write a binary delta to a terminal" in err and err.count("\n") == 1
    rc, err = _on_a_terminal(["inspect", "-"], 0)
    assert rc == 2 and "standard input" in err and "terminal" in err


def test_a_pipe_is_spooled_within_the_free_space(ckpts, tmp_path, monkeypatch, capsys):
    """A delta from a pipe goes to a private temporary file, never unbounded: each MiB is checked
    against the free space of its folder first (faked here: 1000 bytes free)."""
    r, w = os.pipe()
    data = (ckpts / "d.arc").read_bytes()
    threading.Thread(target=lambda: (os.write(w, data), os.close(w)), daemon=True).start()
    real = cli.shutil.disk_usage
    monkeypatch.setattr(cli.shutil, "disk_usage", lambda p: real(p)._replace(free=1000))
    monkeypatch.setattr(sys, "stdin", os.fdopen(r, "rb"))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(cli.tempfile, "tempdir", None)
    assert cli.main(["inspect", "-"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("arcfmt: error (limit): standard input: more than 0 bytes, and ") and "1000 bytes free" in err
    assert os.listdir(tmp_path) == []  # the spool was never a name in the folder


# ----------------------------------------------------------------------------- closed pipes, exit codes

def test_a_closed_pipe_ends_quietly_with_141(ckpts, tmp_path):
    """`arcfmt inspect x.arc | head -1` and `arcfmt encode ... -o - | head -c 10`: no traceback, no
    message, the status of any tool that head stops (128 + SIGPIPE)."""
    names = {f"layer{i:04d}.a_rather_long_tensor_name_that_goes_on.weight": np.full(3, i, np.float32)
             for i in range(1500)}
    write_file(tmp_path / "many.safetensors", names)
    run("encode", "--keyframe", tmp_path / "many.safetensors", "-o", tmp_path / "many.arc", rc=0)
    for args in (["inspect", "--blocks", tmp_path / "many.arc"],
                 ["encode", "--keyframe", tmp_path / "many.safetensors", "-o", "-"]):
        p = subprocess.Popen([sys.executable, "-m", "arcfmt", *map(str, args)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
        assert p.stdout.read(10)
        p.stdout.close()  # what head does once it has what it wants
        err = p.stderr.read().decode()
        assert p.wait(timeout=120) == 141, err
        assert err == "" or err.startswith("wrote <stdout>"), err  # encode's summary may come first
    for code in ("130", "141", "Ctrl-C", "0 ok", "2 usage", "3 internal"):
        assert code in cli.EPILOG and code in run("--help", rc=0).stdout


def test_ctrl_c_is_130(tmp_path):
    # `python -m arcfmt`, with SIGINT as a terminal has it: a runner started in the background
    # (`nohup ... &`, no job control) hands its children SIGINT ignored, and Python then never raises
    # KeyboardInterrupt (this test hung in such a run, the follower waiting on)
    start = ("import runpy, signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
             "runpy.run_module('arcfmt', run_name='__main__', alter_sys=True)")
    p = subprocess.Popen([sys.executable, "-c", start, "follow", tmp_path / "no-stream-yet", "--into",
                          tmp_path / "m", "--wait", "--interval", "0.2"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env={**os.environ, **QUIET_ENV})
    while "waiting for a stream" not in p.stderr.readline():  # (after the first-compile note of a fresh install)
        pass
    p.send_signal(signal.SIGINT)
    assert p.wait(timeout=60) == 130
    assert p.stderr.read() == "arcfmt: interrupted\n"


def test_ctrl_c_while_the_command_imports_is_130(monkeypatch, capsys):
    """The console script imports ``arcfmt.cli`` before ``main`` runs: that import is the standard
    library's alone, and the command's own modules load inside ``main``, where a Ctrl-C is one line."""
    code = ("import sys, arcfmt, arcfmt.cli; "
            "print(sorted(m for m in ('numpy', 'numba', 'construct', 'arcfmt.api') if m in sys.modules))")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "[]\n"

    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "build_parser", interrupted)
    assert cli.main(["inspect", "x.arc"]) == 130
    assert capsys.readouterr().err == "arcfmt: interrupted\n"

    class InterruptedImport:   # Ctrl-C while the console script's entry imports the command's module
        def find_spec(self, name, path, target=None):
            if name == "arcfmt.cli":
                raise KeyboardInterrupt

    monkeypatch.delitem(sys.modules, "arcfmt.cli")
    monkeypatch.setattr(sys, "meta_path", [InterruptedImport(), *sys.meta_path])
    assert arcfmt.main() == 130
    assert capsys.readouterr().err == "arcfmt: interrupted\n"


# ----------------------------------------------------------------------------- quiet, progress, retries

def test_quiet_switch_and_environment(tmp_path):
    """-q before or after the command, or ARCFMT_QUIET=1: nothing on stderr but errors; the results
    on stdout stay. The warning silenced here: a delta larger than its target."""
    rng = np.random.default_rng(0)
    write_file(tmp_path / "step0001.safetensors", {"w": rng.standard_normal(64).astype(np.float32)})
    write_file(tmp_path / "step0002.safetensors", {"w": rng.standard_normal(64).astype(np.float32)})
    pair = (tmp_path / "step0001.safetensors", tmp_path / "step0002.safetensors")
    p = run("encode", *pair, "-o", tmp_path / "a.arc", rc=0)
    warning = [line for line in p.stderr.splitlines() if "compiling" not in line]  # no first-compile note
    assert len(warning) == 1 and re.fullmatch(r"arcfmt: warning: the delta \(.+\) is larger than its target's "
                                              r"weights \(256 B\): BASE and TARGET share little.*", warning[0]), warning
    for how, env in ((["-q", "encode"], None), (["encode", "-q"], None), (["encode", "--quiet"], None),
                     (["encode"], {"ARCFMT_QUIET": "1"})):
        p = run(*how, *pair, "-o", tmp_path / "b.arc", "--force", env=env, rc=0)
        assert p.stderr == "" and p.stdout.startswith("wrote "), (how, p.stderr)
    p = run("-q", "apply", tmp_path / "nope.safetensors", tmp_path / "a.arc", "-o", tmp_path / "x", rc=1)
    assert p.stderr.startswith("arcfmt: error (") and "nope.safetensors" in p.stderr  # errors are never silenced


def _stderr_on_a_terminal(args, env):
    """stderr of ``arcfmt ARGS`` when it is a terminal (where progress bars are on by default)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # tqdm draws nothing 0 wide
    p = subprocess.Popen([sys.executable, "-m", "arcfmt", *map(str, args)], stdout=subprocess.DEVNULL,
                         stderr=slave, env={**os.environ, **QUIET_ENV, **env})
    os.close(slave)
    out = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    assert p.wait(timeout=120) == 0
    return out.decode(errors="replace")


def test_progress_off_everywhere_by_environment(ckpts, tmp_path):
    args = ["encode", ckpts / "step0007", ckpts / "step0008", "-o", tmp_path / "p.arc", "--force"]
    assert "encode" in _stderr_on_a_terminal(args, {})  # the bar, on a terminal
    assert _stderr_on_a_terminal(args, {"ARCFMT_NO_PROGRESS": "1"}) == ""
    assert _stderr_on_a_terminal(args, {"ARCFMT_QUIET": "1"}) == ""
    assert _stderr_on_a_terminal(["-q", *args], {}) == ""
    assert "encode" in _stderr_on_a_terminal([*args, "--progress"], {"ARCFMT_NO_PROGRESS": "1"})  # asked for


def test_retry_notifier_hook():
    """arcfmt.store.retry tells a notifier about every retry, once each, before its wait."""
    seen = []
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionResetError(104, "Connection reset by peer")
        return "ok"

    with retry.notifier(seen.append):
        assert retry.call(flaky, "reading head.json", retries=5, backoff=0) == "ok"
    assert [(n.what, n.attempt, n.retries) for n in seen] == [("reading head.json", 1, 5), ("reading head.json", 2, 5)]
    first = str(seen[0])
    assert first.startswith("reading head.json: ConnectionResetError: ") and "retry 1 of 5 in 0.0 s" in first
    with retry.notifier(lambda n: 1 / 0):  # a failing notifier never fails the operation
        calls.clear()
        assert retry.call(flaky, "x", retries=5, backoff=0) == "ok"
    assert retry.set_notifier(None) is None


@pytest.mark.slow  # ~13 s: two runs that each wait out 5 retries
def test_one_line_per_retry_while_a_store_keeps_failing(tmp_path):
    pytest.importorskip("s3fs")
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = ["status", "s3://bucket/run", "-O", f"endpoint_url=http://127.0.0.1:{port}", "-O", "key=k", "-O", "secret=s"]
    t0 = time.monotonic()
    p = run(*args, rc=1)
    lines = p.stderr.splitlines()
    assert len(lines) == 6 and lines[-1].startswith("arcfmt: error (transport): reading head.json"), p.stderr
    for k, line in enumerate(lines[:-1], 1):
        assert line.startswith("arcfmt: reading head.json: ") and f"; retry {k} of 5 in " in line, line
    assert time.monotonic() - t0 < 60
    p = run(*args, env={"ARCFMT_QUIET": "1"}, rc=1)
    assert p.stderr.count("\n") == 1 and p.stderr.startswith("arcfmt: error (transport)")


# ----------------------------------------------------------------------------- hints and sanity checks

def test_swapped_arguments_and_a_delta_applied_twice(ckpts, tmp_path):
    p = run("apply", ckpts / "d.arc", ckpts / "step0007", "-o", tmp_path / "o", rc=1)
    assert p.stderr == (f"arcfmt: error (input): DELTA {ckpts / 'step0007'} is a folder of safetensors shards, "
                        f"not an arcfmt delta — swapped arguments? (arcfmt apply BASE DELTA)\n")
    run("encode", ckpts / "b.safetensors", ckpts / "t.safetensors", "-o", tmp_path / "f.arc", rc=0)
    p = run("apply", tmp_path / "f.arc", ckpts / "b.safetensors", "-o", tmp_path / "o", rc=1)
    assert "is a safetensors file, not an arcfmt delta — swapped arguments?" in p.stderr
    p = run("apply", ckpts / "b.safetensors", ckpts / "t.safetensors", "-o", tmp_path / "o", rc=1)
    assert "the delta comes second" in p.stderr and "arcfmt encode BASE TARGET" in p.stderr
    p = run("inspect", ckpts / "t.safetensors", rc=1)
    assert "(bad_magic)" in p.stderr and "is a safetensors file" in p.stderr
    # applied twice: in place, then again
    work = tmp_path / "current"
    shutil.copytree(ckpts / "step0007", work)
    p = run("apply", work, ckpts / "d.arc", "--in-place", rc=0)
    p = run("apply", work, ckpts / "d.arc", "--in-place", rc=1)
    assert p.stderr == (f"arcfmt: error (wrong_base): BASE {work} is already at step 8, the target of this delta "
                        "(applied twice?): nothing to do\n")
    same_folder(work, ckpts / "step0008")
    other, _ = make_model_pair(seed=6, layers=1, d=64, vocab=300)
    save_sharded(tmp_path / "other", other)
    p = run("apply", tmp_path / "other", ckpts / "d.arc", "-o", tmp_path / "o", rc=1)  # merely the wrong base
    assert "(wrong_base)" in p.stderr and "already" not in p.stderr
    assert not (tmp_path / "o").exists()


def test_block_elems_and_workers_are_checked(ckpts, tmp_path):
    pair = (ckpts / "step0007", ckpts / "step0008")
    for bad in ("7", "0", str((1 << 24) + 1)):
        p = run("encode", *pair, "-o", tmp_path / "x.arc", "--block-elems", bad, rc=2)
        assert "argument --block-elems:" in p.stderr and p.stdout == ""
    assert "below 1024" in run("encode", *pair, "-o", tmp_path / "x.arc", "--block-elems", "7").stderr
    run("encode", *pair, "-o", tmp_path / "x.arc", "--block-elems", "1024", rc=0)
    for cmd in (["encode", *pair, "-o", tmp_path / "y.arc"], ["apply", pair[0], ckpts / "d.arc", "-o", tmp_path / "o"],
                ["publish", tmp_path / "s", ckpts / "b.safetensors", "--step", "1"],
                ["follow", tmp_path / "s", "--into", tmp_path / "f", "--once"]):
        for bad in ("0", "-2") if cmd[0] == "encode" else ("0",):
            p = run(*cmd, "--workers", bad, rc=2)
            assert "argument --workers:" in p.stderr, p.stderr
    assert not (tmp_path / "y.arc").exists() and not (tmp_path / "s").exists()


def test_keyframes_encode_fast_by_default(ckpts, tmp_path):
    def effort(*args):
        return json.loads(run("encode", *args, "--json", "--force", rc=0).stdout)["effort"]

    key = ("--keyframe", ckpts / "step0008", "-o", tmp_path / "k.arc")
    assert effort(*key) == "fast"
    assert effort(*key, "--effort", "default") == "default"
    assert effort(ckpts / "step0007", ckpts / "step0008", "-o", tmp_path / "d.arc") == "default"
    assert effort(ckpts / "step0007", ckpts / "step0008", "-o", tmp_path / "d.arc", "--effort", "fast") == "fast"


# ----------------------------------------------------------------------------- -o DIR/

def test_output_folder_names_files_after_the_target_step(ckpts, tmp_path):
    p = run("encode", ckpts / "step0007", ckpts / "step0008", "-o", f"{tmp_path / 'deltas'}/", "--json", rc=0)
    assert json.loads(p.stdout)["output"] == str(tmp_path / "deltas" / "step0008.arc")
    assert os.listdir(tmp_path / "deltas") == ["step0008.arc"]
    run("encode", ckpts / "step0007", ckpts / "step0008", "-o", tmp_path / "deltas", rc=1)  # exists: --force
    run("encode", "--keyframe", ckpts / "t.safetensors", "-o", tmp_path / "deltas", "--target-step", "12", rc=0)
    run("encode", "--keyframe", ckpts / "t.safetensors", "-o", tmp_path / "deltas", rc=0)  # no step: its name
    assert sorted(os.listdir(tmp_path / "deltas")) == ["step0008.arc", "step0012.arc", "t.arc"]
    run("report", tmp_path / "deltas" / "step0008.arc", "-o", f"{tmp_path / 'pages'}/", rc=0)
    assert os.listdir(tmp_path / "pages") == ["step0008.html"]
    # apply of a one-file base into a folder: named after the step it is at, not after the base
    run("encode", ckpts / "b.safetensors", ckpts / "t.safetensors", "-o", tmp_path / "f.arc", "--base-step", "7",
        "--target-step", "8", rc=0)
    run("apply", ckpts / "b.safetensors", tmp_path / "f.arc", "-o", f"{tmp_path / 'models'}/", rc=0)
    assert os.listdir(tmp_path / "models") == ["step0008.safetensors"]
    assert (tmp_path / "models" / "step0008.safetensors").read_bytes() == (ckpts / "t.safetensors").read_bytes()


# ----------------------------------------------------------------------------- inspect, --version

def test_inspect_is_complete(tmp_path):
    rng = np.random.default_rng(1)
    long = "model.layers.17.block_sparse_moe.experts.63.gate_and_up_projection.weight"  # 72 characters
    base = {long: rng.standard_normal((64, 40)).astype(np.float32), "b": np.arange(3000, dtype=np.int32)}
    target = {k: v.copy() for k, v in base.items()}
    target[long][::7, ::3] += 1e-3
    write_file(tmp_path / "step0003.safetensors", base)
    write_file(tmp_path / "step0004.safetensors", target)
    run("encode", tmp_path / "step0003.safetensors", tmp_path / "step0004.safetensors", "-o", tmp_path / "d.arc",
        "--block-elems", "1024", rc=0)
    out = run("inspect", tmp_path / "d.arc", rc=0).stdout.splitlines()
    assert " delta " in out[0] and "step 3 → 4" in out[0]
    row = next(line for line in out if line.startswith(long + " "))  # the whole name
    used = json.loads(run("inspect", tmp_path / "d.arc", "--json", rc=0).stdout)
    t = next(t for t in used["tensors"] if t["name"] == long)
    roles = [r.name for e in t["encodings"] if e != "unchanged"
             for r in encodings.by_name(e).stream_roles(arcfmt.dtypes.from_name("F32"))]
    assert roles and all(r in row for r in roles) and " s0" not in row and list(t["streams"]) == roles
    assert t["block_count"] == 3 and t["changed"] == int(np.count_nonzero(target[long] != base[long]))
    total = out[-1].split()
    assert total[:3] == ["total", str(2560 + 3000), "el."]  # elements, changed, bytes
    assert int(total[4]) == sum(x["bytes"] for x in used["tensors"]) == used["totals"]["bytes"]
    assert int(total[3]) == used["totals"]["changed"] == t["changed"]
    blocks = run("inspect", tmp_path / "d.arc", "--blocks", rc=0).stdout.splitlines()
    assert sum(line.startswith("  block ") for line in blocks) == 3 + 3  # 2560 elements of each, 1024 a block
    bj = json.loads(run("inspect", tmp_path / "d.arc", "--blocks", "--json", rc=0).stdout)
    assert all("role" in s for x in bj["tensors"] for b in x["blocks"] for s in b["streams"])
    # a keyframe: no base step, no base digest, no changed count
    run("encode", "--keyframe", tmp_path / "step0004.safetensors", "-o", tmp_path / "k.arc", rc=0)
    out = run("inspect", tmp_path / "k.arc", rc=0).stdout.splitlines()
    assert " keyframe " in out[0] and "step — → 4" in out[0] and out[1].startswith("base digest —  ")
    assert all(line.split()[3] == "—" for line in out[3:])  # each tensor's changed count, and the total's
    assert "exponent" in out[3] and "sign+mantissa" in out[3]
    kj = json.loads(run("inspect", tmp_path / "k.arc", "--json", rc=0).stdout)
    assert kj["kind"] == "keyframe" and kj["base_step"] is None and kj["totals"]["changed"] is None


def test_version_names_the_file_format_and_the_stream_layout():
    out = run("--version", rc=0).stdout.strip()
    major, minor = arcfmt.FORMAT_VERSION
    assert out == (f"arcfmt {arcfmt.__version__} (writes format {major}.{minor} files; "
                   f"stream layout {STREAM_VERSION[0]}.{STREAM_VERSION[1]})")
