"""First use (issue 19): the kernels' one-time compilation is said before it happens — one line from the
command, one ``FirstCompileWarning`` from the Python API — never silently inside a call a user times;
``arcfmt warm-up`` does it ahead of time."""
from __future__ import annotations

import json
import subprocess
import sys
import warnings

import numpy as np
import pytest

import arcfmt
from arcfmt import backend
from arcfmt.demo import make_model_pair, save_sharded
from support.cli import QUIET_ENV, run


@pytest.fixture
def nothing_cached(monkeypatch):
    """This process as if numba had cached no kernel yet, and nothing had been said."""
    monkeypatch.setattr(backend, "first_compile_pending", lambda kernel=None: True)
    monkeypatch.setattr(backend._selection, "announced", set())


def test_said_once_per_kernel(nothing_cached):
    with pytest.warns(backend.FirstCompileWarning, match="once per install"):
        backend.warn_first_compile(backend.ENCODE)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        backend.warn_first_compile(backend.ENCODE)   # said already: silent
    assert backend.announce_first_compile((backend.ENCODE, backend.DECODE)) == backend.FIRST_COMPILE  # decode's
    assert backend.announce_first_compile() is None


def test_not_said_where_cached_or_on_numpy(monkeypatch):
    monkeypatch.setattr(backend._selection, "announced", set())
    monkeypatch.setattr(backend, "first_compile_pending", lambda kernel=None: False)
    assert backend.announce_first_compile() is None
    monkeypatch.setattr(backend._selection, "announced", set())
    monkeypatch.setattr(backend, "first_compile_pending", lambda kernel=None: True)
    with backend.using(backend.twins()):
        assert backend.announce_first_compile() is None


def test_the_api_warns_before_its_first_kernel_call(nothing_cached):
    rng = np.random.default_rng(3)
    base = {"w": rng.standard_normal((512, 512)).astype(np.float32)}
    t = base["w"].view(np.uint32).reshape(-1).copy()
    t[rng.random(t.size) < 0.02] += 1
    target = {"w": t.view(np.float32).reshape(512, 512)}
    with pytest.warns(backend.FirstCompileWarning):
        delta = arcfmt.encode(base, target, workers=1)
    with pytest.warns(backend.FirstCompileWarning):
        out = arcfmt.decode(base, delta, workers=1)
    assert out["w"].tobytes() == target["w"].tobytes()


def test_warm_up_command():
    p = run("warm-up", "--json", env={"ARCFMT_JIT": "0"}, rc=0)
    assert json.loads(p.stdout) == {"backend": "numpy", "compiled": False, "seconds": 0.0, "cache": None}
    p = run("warm-up", rc=0)   # the suite's cache: what is missing is compiled now, the rest loaded
    assert p.stdout.startswith("arcfmt: the ctx-delta kernels are ready: ") and "compiling" not in p.stderr
    p = run("warm-up", "--json", rc=0)
    res = json.loads(p.stdout)
    assert res["backend"] == "numba" and res["compiled"] is False and res["cache"] == backend.cache_dir()


@pytest.mark.slow
def test_a_fresh_install_says_so_once(tmp_path):
    """A fresh numba cache (NUMBA_CACHE_DIR): the command says it compiles, once, on stderr (no second
    line from the API); a Python call that compiles other kernels warns; once cached, nothing is said."""
    base, target = make_model_pair(seed=5, layers=1, d=64, vocab=300)
    save_sharded(tmp_path / "a", base)
    save_sharded(tmp_path / "b", target)
    env = {"NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    p = run("encode", tmp_path / "a", tmp_path / "b", "-o", tmp_path / "d.arc", env=env, rc=0)
    assert p.stderr.count("compiling the ctx-delta kernels") == 1 and "warning" not in p.stderr
    code = ("import warnings, arcfmt; warnings.simplefilter('always');"
            f"arcfmt.apply_files({str(tmp_path / 'a')!r}, {str(tmp_path / 'd.arc')!r}, {str(tmp_path / 'c')!r})")
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                           env={**__import__("os").environ, **env})
    assert child.returncode == 0, child.stderr
    assert "FirstCompileWarning" in child.stderr   # the decoder's kernels were not cached yet
    p = run("encode", tmp_path / "a", tmp_path / "b", "-o", tmp_path / "e.arc", env=env, rc=0)
    assert "compiling" not in p.stderr


WARM_THEN_USE = r"""
import os, sys, warnings
import numpy as np
import ml_dtypes
import arcfmt
from arcfmt import backend
from arcfmt.safetensors_io import write_file

warnings.simplefilter("ignore")
arcfmt.warm_up()
built = backend.compiled_specializations()
tmp = sys.argv[1]
rng = np.random.default_rng(7)
def step(m, seed):
    r = np.random.default_rng(seed)
    out = {}
    for k, a in m.items():
        u = a.view(f"u{a.dtype.itemsize}").copy().reshape(-1)
        u[r.random(u.size) < 0.05] += 1
        out[k] = u.view(a.dtype).reshape(a.shape)
    return out
kinds = (ml_dtypes.bfloat16, np.float16, np.float32, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2)
base = {f"w{i}": (rng.standard_normal((128, 300)) * 0.05).astype(k) for i, k in enumerate(kinds)}
base["steps"] = np.arange(1000, dtype=np.int64)   # 8-byte elements: another width of a live model's scatter
base["f64"] = rng.standard_normal(1000)
new, newer = step(base, 1), step(base, 2)
for name, m in (("a", base), ("b", new)):
    os.makedirs(os.path.join(tmp, name))
    write_file(os.path.join(tmp, name, "model.safetensors"), m)
done = []
def check(what):
    done.append((what, backend.compiled_specializations() - built))
arcfmt.encode_files(os.path.join(tmp, "a"), os.path.join(tmp, "b"), os.path.join(tmp, "d.arc")); check("encode files")
arcfmt.apply_files(os.path.join(tmp, "a"), os.path.join(tmp, "d.arc"), in_place=True); check("apply in place")
arcfmt.decode(new, arcfmt.encode(new, newer)); check("encode and decode arrays")
store = "file://" + os.path.join(tmp, "store")
pub = arcfmt.Publisher(store)
for s, m in enumerate((base, new, newer)):
    pub.publish(s, m)
check("publish")
live = {}
arcfmt.Follower(store, live=live).sync(); check("live follower")
print(done)
assert all(n == 0 for _, n in done), done
"""


def test_after_warm_up_nothing_compiles(tmp_path):
    """Issue 19, first use: after ``arcfmt warm-up`` no user path waits for numba, whatever it reads
    (memory-mapped files or arrays in memory), writes (a new file, in place, a live model) or codes (the
    five ctx-delta dtypes): every kernel it calls was built then, for the argument types it passes."""
    child = subprocess.run([sys.executable, "-c", WARM_THEN_USE, str(tmp_path)], capture_output=True,
                           text=True, timeout=600)
    assert child.returncode == 0, child.stdout + child.stderr


FILE_COMMANDS = r"""
import sys
from arcfmt.cli import main
d = sys.argv[1]
for argv in (["encode", d + "/a", d + "/b", "-o", d + "/d.arc"],
             ["encode", d + "/a", d + "/b", "-o", d + "/p.arc", "--previous", d + "/p"],
             ["apply", d + "/a", d + "/d.arc", "-o", d + "/c"],
             ["apply", d + "/a", d + "/p.arc", "-o", d + "/e", "--previous", d + "/p"],
             ["inspect", d + "/d.arc"], ["report", d + "/d.arc", "--base", d + "/a", "-o", d + "/r.html"],
             ["apply", d + "/a", d + "/d.arc", "--in-place"],
             *(["publish", d + "/stream", "--step", str(k), "--state", d + "/state", d + "/" + m]
               for k, m in ((1, "a"), (2, "b"), (3, "a"))),
             *(["follow", d + "/stream", "--into", d + "/f", "--until", str(k)] for k in (1, 3))):
    assert main(argv) == 0, argv
print(sorted(m for m in sys.modules if m.split(".")[0] == "ml_dtypes"))
"""


def test_commands_on_files_never_import_ml_dtypes(tmp_path):
    """Its import registers hundreds of ufunc loops (0.55-0.7 s with ml_dtypes 0.7): a command that only
    moves a BF16 checkpoint's bytes between files (a trainer's ``arcfmt publish`` every step) must not
    pay it at every start."""
    base, target = make_model_pair(seed=6, layers=1, d=64, vocab=300)
    assert any(a.dtype.name == "bfloat16" for a in base.values())
    previous = {n: a.copy() for n, a in base.items()}
    previous[next(iter(previous))] = target[next(iter(target))]
    for name, model in (("p", previous), ("a", base), ("b", target)):
        save_sharded(tmp_path / name, model)
    child = subprocess.run([sys.executable, "-c", FILE_COMMANDS, str(tmp_path)], capture_output=True, text=True,
                           timeout=300, env={**__import__("os").environ, **QUIET_ENV})
    assert child.returncode == 0, child.stderr
    assert child.stdout.strip().splitlines()[-1] == "[]", child.stdout[-2000:]
