"""What the command line writes, and what it refuses to: existing outputs without --force, outputs that
are one of the inputs (through symbolic and hard links, each shard of a folder), links written through;
the mode of what it replaces; OS errors as one line naming the user's path, exit code 1."""
from __future__ import annotations

import errno
import hashlib
import os
import stat
import subprocess

import pytest

import arcfmt
from arcfmt import cli
from arcfmt.checkpoint import encode_checkpoints
from arcfmt.demo import make_model_pair, save_sharded
from arcfmt.safetensors_io import write_file
from support.cli import run

TMP_MARK = ".arcfmt-"


def refused(p, category="input"):
    """Exit 1 with exactly one line on stderr, of the given category, nothing on stdout."""
    assert p.returncode == 1, (p.returncode, p.stdout, p.stderr)
    assert p.stderr.startswith(f"arcfmt: error ({category}): ") and p.stderr.count("\n") == 1, p.stderr
    assert p.stdout == "" and TMP_MARK not in p.stderr and "internal error" not in p.stderr
    return p.stderr


def digest(path):
    if os.path.isdir(path):
        return {n: digest(os.path.join(path, n)) for n in sorted(os.listdir(path))}
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def leftovers(*dirs):
    return [n for d in dirs for n in os.listdir(d) if n.startswith(TMP_MARK)]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """b.safetensors / t.safetensors, the same as folders bd / td (2 shards and an index), and a delta."""
    d = tmp_path_factory.mktemp("safety")
    base, target = make_model_pair(seed=3, layers=1, d=64, vocab=300)
    write_file(d / "b.safetensors", base)
    write_file(d / "t.safetensors", target)
    save_sharded(d / "bd", base)
    save_sharded(d / "td", target)
    assert run("encode", d / "b.safetensors", d / "t.safetensors", "-o", d / "d.arc").returncode == 0
    return d


@pytest.fixture
def snapshot(models):
    before = {n: digest(models / n) for n in ("b.safetensors", "t.safetensors", "bd", "td", "d.arc")}
    yield
    assert {n: digest(models / n) for n in before} == before, "an input was changed"
    assert not leftovers(models, models / "bd", models / "td")


# ----------------------------------------------------------------------------- outputs that are inputs

def _same_file_cases(models, work):
    """(base, target, output) where the output is, one way or another, one of the inputs."""
    b, t, bd, td = models / "b.safetensors", models / "t.safetensors", models / "bd", models / "td"
    shard = bd / "model-00001-of-00002.safetensors"
    os.link(b, work / "hard-b")
    os.symlink(t, work / "sym-t")
    os.link(shard, work / "hard-shard")
    os.symlink(td / "model.safetensors.index.json", work / "sym-index")
    os.symlink(models, work / "dirlink")
    return {
        "the base itself": (b, t, b),
        "the target itself": (b, t, t),
        "a hard link to the base": (b, t, work / "hard-b"),
        "a symlink to the target": (b, t, work / "sym-t"),
        "the base through a symlinked folder": (b, t, work / "dirlink" / "b.safetensors"),
        "the base spelled with ..": (b, t, models / "bd" / ".." / "b.safetensors"),
        "a shard of the base folder": (bd, td, shard),
        "a hard link to a shard": (bd, td, work / "hard-shard"),
        "a symlink to the target folder's index": (bd, td, work / "sym-index"),
        "the base folder": (bd, td, bd),
    }


@pytest.mark.slow  # about 10 s: 21 runs of the command
def test_encode_refuses_an_output_that_is_an_input_even_with_force(models, tmp_path, snapshot):
    for what, (base, target, out) in _same_file_cases(models, tmp_path).items():
        for force in ((), ("--force",)):
            msg = refused(run("encode", base, target, "-o", out, *force))
            assert str(out) in msg and "refusing to overwrite an input" in msg, (what, msg)
            assert "--force" in msg  # says that --force does not help
    p = run("encode", "--keyframe", models / "t.safetensors", "-o", models / "t.safetensors", "--force")
    refused(p)
    assert not leftovers(tmp_path)


def test_report_refuses_an_output_that_is_an_input(models, snapshot):
    for out in (models / "d.arc", models / "b.safetensors"):
        msg = refused(run("report", models / "d.arc", "--base", models / "b.safetensors", "-o", out, "--force"))
        assert "refusing to overwrite an input" in msg


def test_python_api_refuses_the_same_way(models, tmp_path, snapshot):
    b, t = models / "b.safetensors", models / "t.safetensors"
    with pytest.raises(arcfmt.InputError, match="refusing to overwrite an input"):
        encode_checkpoints(b, t, b, force=True)
    with pytest.raises(arcfmt.InputError, match="refusing to overwrite an input"):
        encode_checkpoints(models / "bd", models / "td", models / "td" / "model-00002-of-00002.safetensors")
    out = tmp_path / "x.arc"
    out.write_bytes(b"keep me")
    with pytest.raises(arcfmt.InputError, match="already exists; use --force"):
        encode_checkpoints(b, t, out)
    assert out.read_bytes() == b"keep me"
    w = encode_checkpoints(b, t, out, force=True)
    assert out.stat().st_size == w.size and out.read_bytes() == (models / "d.arc").read_bytes()
    with open(tmp_path / "y.arc", "wb") as f:   # a file object: written as given, no checks to make
        encode_checkpoints(b, t, f)
    assert not leftovers(tmp_path)


def test_check_output_for_folders(models, tmp_path):
    """The rules for a folder output (what apply -o uses): an existing one needs force, one that is or
    holds an input is refused even so, a file where a folder goes is refused."""
    from arcfmt.outputs import check_output

    bd, delta = models / "bd", models / "d.arc"
    assert check_output(tmp_path / "new", [bd, delta], folder=True) == str(tmp_path / "new")
    (tmp_path / "old").mkdir()
    with pytest.raises(arcfmt.InputError, match="already exists; use --in-place"):
        check_output(tmp_path / "old", [bd, delta], folder=True, hint="use --in-place")
    assert check_output(tmp_path / "old", [bd, delta], True, folder=True) == str(tmp_path / "old")
    for out in (bd, models):  # the base folder; a folder that holds the delta (and the base)
        with pytest.raises(arcfmt.InputError, match="refusing"):
            check_output(out, [bd, delta], True, folder=True)
    (tmp_path / "holder").mkdir()
    os.link(delta, tmp_path / "holder" / "a-hard-link")
    with pytest.raises(arcfmt.InputError, match=f"holds the input {delta}"):
        check_output(tmp_path / "holder", [bd, delta], True, folder=True)
    (tmp_path / "file").write_text("x")
    with pytest.raises(arcfmt.InputError, match="not a folder"):
        check_output(tmp_path / "file", [bd, delta], True, folder=True)
    with pytest.raises(arcfmt.FileAccessError, match="No such file or directory"):
        check_output(tmp_path / "no" / "out", [bd, delta], folder=True)


def test_output_appearing_while_encoding_is_not_replaced(models, tmp_path, snapshot):
    """Without force, the final rename itself refuses to replace a file that appeared meanwhile."""
    out = tmp_path / "late.arc"

    def progress(n):
        if not out.exists():
            out.write_bytes(b"written by someone else")

    with pytest.raises(arcfmt.InputError, match="already exists; use --force"):
        encode_checkpoints(models / "b.safetensors", models / "t.safetensors", out, progress=progress)
    assert out.read_bytes() == b"written by someone else" and not leftovers(tmp_path)


# ----------------------------------------------------------------------------- existing outputs, --force

def test_existing_output_needs_force_and_keeps_its_mode(models, tmp_path, snapshot):
    out = tmp_path / "s.arc"
    out.write_bytes(b"an older delta")
    os.chmod(out, 0o640)
    owner = (4321, 4322) if os.geteuid() == 0 else (os.getuid(), os.getgid())
    if os.geteuid() == 0:
        os.chown(out, *owner)
    msg = refused(run("encode", models / "bd", models / "td", "-o", out))
    assert f"{out} already exists; use --force to replace it" in msg
    assert out.read_bytes() == b"an older delta"
    p = run("encode", models / "bd", models / "td", "-o", out, "--force")
    assert p.returncode == 0, p.stderr
    st = out.stat()
    assert stat.S_IMODE(st.st_mode) == 0o640 and (st.st_uid, st.st_gid) == owner
    assert run("inspect", out).returncode == 0
    assert sorted(os.listdir(tmp_path)) == ["s.arc"]

    page = tmp_path / "r.html"
    assert run("report", models / "d.arc", "-o", page).returncode == 0
    os.chmod(page, 0o600)
    msg = refused(run("report", models / "d.arc", "-o", page))
    assert f"{page} already exists; use --force" in msg
    p = run("report", models / "d.arc", "--base", models / "b.safetensors", "-o", page, "--force")
    assert p.returncode == 0, p.stderr
    assert stat.S_IMODE(page.stat().st_mode) == 0o600 and page.read_text(encoding="utf-8").startswith("<!DOCTYPE")
    assert sorted(os.listdir(tmp_path)) == ["r.html", "s.arc"]


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_new_output_gets_the_default_mode(models, tmp_path, umask):
    out = tmp_path / "new.arc"
    p = run("encode", models / "b.safetensors", models / "t.safetensors", "-o", out, preexec_fn=lambda: os.umask(umask))
    assert p.returncode == 0, p.stderr
    assert stat.S_IMODE(out.stat().st_mode) == 0o666 & ~umask


def test_a_symlink_output_is_replaced_itself_never_written_through(models, tmp_path, snapshot):
    victim = tmp_path / "victim.txt"
    victim.write_text("not yours")
    link = tmp_path / "link.arc"
    link.symlink_to(victim)
    msg = refused(run("encode", models / "b.safetensors", models / "t.safetensors", "-o", link))
    assert f"{link} already exists (a symbolic link); use --force" in msg
    assert link.is_symlink() and victim.read_text() == "not yours"
    p = run("encode", models / "b.safetensors", models / "t.safetensors", "-o", link, "--force")
    assert p.returncode == 0, p.stderr
    assert not link.is_symlink() and link.read_bytes() == (models / "d.arc").read_bytes()
    assert victim.read_text() == "not yours"

    dangling = tmp_path / "dangling.html"
    dangling.symlink_to(tmp_path / "nowhere.html")
    refused(run("report", models / "d.arc", "-o", dangling))
    assert dangling.is_symlink()
    assert run("report", models / "d.arc", "-o", dangling, "--force").returncode == 0
    assert not dangling.is_symlink() and dangling.is_file() and not (tmp_path / "nowhere.html").exists()
    assert not leftovers(tmp_path)


def test_special_files_are_never_replaced(models, tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    msg = refused(run("encode", models / "b.safetensors", models / "t.safetensors", "-o", fifo, "--force"))
    assert "not a regular file" in msg and stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_demo_dir_needs_force(tmp_path, monkeypatch, capsys):
    d = tmp_path / "demo"
    (d / "step0000").mkdir(parents=True)
    (d / "step0000" / "model.safetensors").write_bytes(b"an earlier demo's")
    victim = tmp_path / "victim.arc"
    victim.write_text("not yours")
    (d / "step0001.arc").symlink_to(victim)
    msg = refused(run("demo", "--dir", d))
    assert f"{d} already holds step0000, step0001.arc; use --force to replace them" in msg
    assert (d / "step0001.arc").is_symlink() and (d / "step0000" / "model.safetensors").exists()

    import arcfmt.demo

    seen = {}

    def fake_run_demo(workdir, seed=0):  # what the demo finds when it starts writing
        seen["listing"] = sorted(os.listdir(workdir))
        return dict(text="ok", bit_exact=True)

    monkeypatch.setattr(arcfmt.demo, "run_demo", fake_run_demo)
    assert cli.main(["demo", "--dir", str(d), "--force"]) == 0
    assert seen["listing"] == [] and victim.read_text() == "not yours"
    assert capsys.readouterr().out == "ok\n"


def test_force_is_documented():
    for cmd in ("encode", "report", "demo"):
        assert "--force" in run(cmd, "--help").stdout
    readme = open(os.path.join(os.path.dirname(__file__), "..", "README.md"), encoding="utf-8").read()
    section = readme.split("### Command line", 1)[1].split("\n## ", 1)[0]
    assert "--force" in section and "(io)" in section
    assert "--force" in cli.EPILOG and "(io)" in cli.EPILOG and "(io)" in cli.__doc__


# ----------------------------------------------------------------------------- OS errors

def test_missing_paths_are_io_errors(models, tmp_path):
    msg = refused(run("encode", tmp_path / "missing", models / "t.safetensors", "-o", tmp_path / "x.arc"), "io")
    assert msg == f"arcfmt: error (io): cannot read {tmp_path / 'missing'}: No such file or directory\n"
    msg = refused(run("report", tmp_path / "missing.arc", "-o", tmp_path / "r.html"), "io")
    assert msg == f"arcfmt: error (io): cannot read {tmp_path / 'missing.arc'}: No such file or directory\n"
    out = tmp_path / "no" / "such" / "folder" / "x.arc"
    msg = refused(run("encode", models / "b.safetensors", models / "t.safetensors", "-o", out), "io")
    assert msg == f"arcfmt: error (io): cannot write {out}: No such file or directory\n"
    (tmp_path / "a-folder").mkdir()
    (tmp_path / "a-folder" / "td.arc").mkdir()  # -o DIR writes DIR/td.arc (no step in the name): a folder there
    msg = refused(run("encode", models / "bd", models / "td", "-o", tmp_path / "a-folder", "--force"), "io")
    assert msg == f"arcfmt: error (io): cannot write {tmp_path / 'a-folder' / 'td.arc'}: Is a directory\n"
    os.rmdir(tmp_path / "a-folder" / "td.arc")
    msg = refused(run("report", models / "d.arc", "-o", tmp_path / "missing" / "r.html"), "io")
    assert f"cannot write {tmp_path / 'missing' / 'r.html'}: No such file or directory" in msg
    assert os.listdir(tmp_path) == ["a-folder"] and os.listdir(tmp_path / "a-folder") == []


@pytest.fixture
def mount(tmp_path):
    """mount(options) -> a fresh tmpfs folder; skips when this machine cannot mount one."""
    mounted = []

    def make(options):
        d = tmp_path / f"mnt{len(mounted)}"
        d.mkdir()
        p = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(d)], capture_output=True, text=True)
        if p.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {p.stderr.strip() or p.returncode}")
        mounted.append(d)
        return d

    yield make
    for d in mounted:
        subprocess.run(["umount", str(d)], capture_output=True)


def test_disk_full_is_an_io_error_naming_the_output(models, mount):
    small = mount("size=64k")
    out = small / "k.arc"
    msg = refused(run("encode", "--keyframe", models / "td", "-o", out), "io")  # ~90 KiB: does not fit
    assert msg == f"arcfmt: error (io): cannot write {out}: No space left on device\n"
    assert os.listdir(small) == []                                             # the temp file is gone
    with pytest.raises(arcfmt.FileAccessError, match="No space left on device") as exc:
        encode_checkpoints(None, models / "td", out, keyframe=True)
    assert exc.value.category == "io" and str(out) in str(exc.value) and TMP_MARK not in str(exc.value)
    assert os.listdir(small) == []


def test_read_only_file_system_is_an_io_error(models, mount):
    ro = mount("ro,size=64k")
    for args in (("encode", models / "b.safetensors", models / "t.safetensors"), ("report", models / "d.arc")):
        msg = refused(run(*args, "-o", ro / "out"), "io")
        assert msg == f"arcfmt: error (io): cannot write {ro / 'out'}: Read-only file system\n"


def _drop_dac_override():
    """In the child, before exec: root without the capabilities that let it write anywhere."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
        if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def test_permission_denied_is_an_io_error(models, tmp_path):
    """A folder the user may not write to. Root may write anywhere: there the command runs without
    CAP_DAC_OVERRIDE."""
    locked = tmp_path / "locked"
    locked.mkdir()
    os.chmod(locked, 0o555)
    try:
        out = locked / "x.arc"
        preexec = _drop_dac_override if os.geteuid() == 0 else None
        if preexec is None and os.access(locked, os.W_OK):
            pytest.skip("this user may write into a read-only folder")
        try:
            p = run("encode", models / "b.safetensors", models / "t.safetensors", "-o", out, preexec_fn=preexec)
        except subprocess.SubprocessError as exc:
            pytest.skip(f"cannot drop root's capabilities here: {exc}")
        msg = refused(p, "io")
        assert msg == f"arcfmt: error (io): cannot write {out}: Permission denied\n"
        assert os.listdir(locked) == []
    finally:
        os.chmod(locked, 0o755)


def test_an_os_error_escaping_a_command_is_an_io_error_not_a_bug(monkeypatch, capsys, tmp_path):
    """The last line of defence in cli.main: exit 1, category io, the user's path (never a temp name)."""
    out = tmp_path / "o.arc"

    def boom(exc):
        def cmd(args):
            raise exc
        return cmd

    cases = [
        (OSError(errno.ENOSPC, "No space left on device", str(tmp_path / ".arcfmt-tmp-123-0a1b2c3d-o.arc")),
         ["encode", "b", "t", "-o", str(out)], f"cannot write {out}: No space left on device"),
        (PermissionError(errno.EACCES, "Permission denied", "b"),
         ["encode", "b", "t", "-o", str(out)], "cannot read b: Permission denied"),
        (OSError(errno.EROFS, "Read-only file system", str(out)),
         ["encode", "b", "t", "-o", str(out)], f"cannot write {out}: Read-only file system"),
        (OSError(errno.EIO, "Input/output error"), ["encode", "b", "t", "-o", str(out)], "Input/output error"),
        (IsADirectoryError(errno.EISDIR, "Is a directory", str(tmp_path / "x")),
         ["inspect", str(tmp_path / "x")], f"cannot read {tmp_path / 'x'}: Is a directory"),
    ]
    for exc, argv, text in cases:
        monkeypatch.setattr(cli, "cmd_encode", boom(exc))
        monkeypatch.setattr(cli, "cmd_inspect", boom(exc))
        assert cli.main(argv) == 1
        err = capsys.readouterr().err
        assert err == f"arcfmt: error (io): {text}\n", err


# ----------------------------------------------------------------------------- hostile inputs on disk

@pytest.mark.parametrize("index", ['{"weight_map": ["a"]}', '{"weight_map": "abc"}', '[1, 2]',
                                   "[" * 100_000 + "]" * 100_000, '{"weight_map": {"x": 5}}',
                                   '{"weight_map": {"x": "model-00001-of-00002.safetensors"}, "metadata": "abc"}'],
                         ids=["list-map", "string-map", "not-an-object", "deep", "non-string-shard", "string-metadata"])
def test_a_malformed_index_json_is_refused_in_one_line(models, tmp_path, index):
    """model.safetensors.index.json of any shape: one line, exit 1 (`wrong_base` for a base, SPEC §1),
    for every command that opens the folder; nothing written."""
    import shutil
    b = tmp_path / "b"
    shutil.copytree(models / "bd", b)
    (b / "model.safetensors.index.json").write_text(index)
    refused(run("apply", b, models / "d.arc", "-o", tmp_path / "o"), "wrong_base")   # a base file: SPEC §1
    refused(run("encode", b, models / "td", "-o", tmp_path / "e.arc"), "safetensors")
    refused(run("apply", b, models / "d.arc", "--in-place"), "wrong_base")
    assert sorted(os.listdir(tmp_path)) == ["b"] and not leftovers(b)


def test_fifos_never_hang_a_command(models, tmp_path):
    """A FIFO where a checkpoint file or a delta should be: a base file is refused at once, a delta
    FIFO without a writer reads as empty; neither waits for a writer."""
    import shutil
    os.mkfifo(tmp_path / "fifo")
    b = tmp_path / "b"
    shutil.copytree(models / "bd", b)
    os.unlink(b / "model.safetensors.index.json")
    os.mkfifo(b / "zz.safetensors")   # in a folder without an index, every *.safetensors is a shard
    assert "not a regular file" in refused(run("apply", b, models / "d.arc", "-o", tmp_path / "o"), "wrong_base")
    assert "not a regular file" in refused(run("encode", "--keyframe", tmp_path / "fifo", "-o", tmp_path / "k.arc"),
                                           "safetensors")
    refused(run("apply", models / "b.safetensors", tmp_path / "fifo", "-o", tmp_path / "o"), "truncated")
    assert sorted(os.listdir(tmp_path)) == ["b", "fifo"]


def test_a_delta_from_a_pipe_path_is_read_like_standard_input(models, tmp_path):
    """`arcfmt apply BASE <(curl ...)`: a pipe given by path is spooled, as `-` is."""
    r, w = os.pipe()
    data = (models / "d.arc").read_bytes()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the writer
        os.close(r)
        os.write(w, data)
        os._exit(0)
    os.close(w)
    try:
        p = subprocess.run([__import__("sys").executable, "-m", "arcfmt", "apply", str(models / "b.safetensors"),
                            f"/dev/fd/{r}", "-o", str(tmp_path / "o.safetensors")], pass_fds=(r,),
                           capture_output=True, text=True, timeout=300)
    finally:
        os.close(r)
        os.waitpid(pid, 0)
    assert p.returncode == 0, p.stderr
    assert digest(tmp_path / "o.safetensors") == digest(models / "t.safetensors")


def test_a_shard_the_index_names_but_cannot_be_read_is_an_io_error(models, tmp_path):
    import shutil
    b = tmp_path / "b"
    shutil.copytree(models / "bd", b)
    os.unlink(b / "model-00002-of-00002.safetensors")
    msg = refused(run("apply", b, models / "d.arc", "-o", tmp_path / "o"), "io")
    assert msg.endswith("model-00002-of-00002.safetensors: No such file or directory\n")


def test_inspect_escapes_what_a_terminal_would_interpret(tmp_path):
    """SPEC.md §17: C1 controls (an 8-bit CSI) and bidirectional overrides in names are printed escaped."""
    import warnings

    import numpy as np
    names = ["c1\u009b31mRED", "bidi\u202eevil", "back\\slash"]   # C0 controls are refused in names (§7)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        (tmp_path / "n.arc").write_bytes(arcfmt.encode({n: np.zeros(4, np.float32) for n in names},
                                                       {n: np.ones(4, np.float32) for n in names}))
    out = run("inspect", tmp_path / "n.arc", rc=0).stdout
    assert "c1\\x9b31mRED" in out and "bidi\\u202eevil" in out and "back\\\\slash" in out
    assert not any(0x80 <= ord(ch) < 0xA0 or 0x202A <= ord(ch) <= 0x202E for ch in out)


def test_warnings_are_one_line_and_quiet_silences_them(tmp_path):
    import numpy as np
    write_file(tmp_path / "a.safetensors", {"w": np.zeros(64, np.float32)})
    write_file(tmp_path / "u.safetensors", {"w": np.zeros(64, np.uint8)})
    p = run("encode", tmp_path / "a.safetensors", tmp_path / "u.safetensors", "-o", tmp_path / "e.arc", rc=0)
    lines = [x for x in p.stderr.splitlines() if "compiling" not in x]
    assert lines and all(x.startswith("arcfmt: warning: ") for x in lines), p.stderr
    assert any("stored whole (keyframe)" in x for x in lines)
    p = run("-q", "encode", tmp_path / "a.safetensors", tmp_path / "u.safetensors", "-o", tmp_path / "e.arc",
            "--force", rc=0)
    assert p.stderr == ""


def test_in_place_through_a_symlinked_folder_is_refused_up_front(models, tmp_path):
    import shutil
    shutil.copytree(models / "bd", tmp_path / "real")
    os.symlink("real", tmp_path / "current")
    before = digest(tmp_path / "real")
    msg = refused(run("apply", tmp_path / "current", models / "d.arc", "--in-place"))
    assert "symbolic link" in msg and "-o" in msg
    assert digest(tmp_path / "real") == before and os.readlink(tmp_path / "current") == "real"
    assert not leftovers(tmp_path)


def test_apply_onto_its_own_delta_names_the_input(models, tmp_path):
    import shutil
    shutil.copy(models / "d.arc", tmp_path / "d.arc")
    msg = refused(run("apply", models / "b.safetensors", tmp_path / "d.arc", "-o", tmp_path / "d.arc"))
    assert "is one of the inputs" in msg


def test_encode_removes_what_a_killed_encode_left(models, tmp_path):
    """A SIGKILLed encode leaves its temporary file; the next encode to that output removes it (only
    names of this tool, of processes that are gone)."""
    dead = tmp_path / ".arcfmt-tmp-999999-0123abcd-x.arc"
    dead.write_bytes(b"")
    other = tmp_path / ".arcfmt-tmp-999999-0123abcd-y.arc"
    other.write_bytes(b"")
    run("encode", models / "b.safetensors", models / "t.safetensors", "-o", tmp_path / "x.arc", rc=0)
    assert not dead.exists() and other.exists()


def test_os_errors_without_a_file_name_still_name_the_users_path(models):
    """An input that cannot seek (a /proc file) and standard output on a full device: the one line names
    what the user gave."""
    if os.path.exists("/proc/self/status"):
        msg = refused(run("inspect", "/proc/self/status"), "io")
        assert msg == "arcfmt: error (io): cannot read /proc/self/status: Invalid argument\n"
    if os.path.exists("/dev/full"):
        with open("/dev/full", "wb") as full:
            p = run("encode", models / "b.safetensors", models / "t.safetensors", "-o", "-", stdout=full,
                    stderr=subprocess.PIPE)
        assert p.returncode == 1 and p.stderr.decode().endswith(
            "arcfmt: error (io): cannot write standard output: No space left on device\n"), p.stderr
