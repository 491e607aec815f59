"""The public Python API as a user meets it: docstrings everywhere, ``help(arcfmt)`` as a guide, torch in
and torch out, the file-level calls, one-call random access, and the keyframe-mismatch warning."""
from __future__ import annotations

import dataclasses
import hashlib
import inspect
import io
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import arcfmt
import arcfmt.store
from arcfmt.demo import save_sharded
from arcfmt.safetensors_io import open_checkpoint, write_file
from support.data import BY_NAME, assert_bit_exact, assert_same_tensor, make_pair, random_values

# ------------------------------------------------------------------------------------- docstrings


def _public_members(cls):
    """``(name, function)`` of the public methods and properties of ``cls`` and its arcfmt bases."""
    seen = set()
    for klass in cls.__mro__:
        if not klass.__module__.startswith("arcfmt"):
            continue
        for name, v in vars(klass).items():
            if name.startswith("_") or name in seen:
                continue
            seen.add(name)
            f = v.fget if isinstance(v, property) else getattr(v, "__func__", v)
            if inspect.isfunction(f):
                yield name, f


def _undocumented():
    missing = []
    for mod in (arcfmt, arcfmt.store):
        for name in mod.__all__:
            obj = getattr(mod, name)
            if not (inspect.isclass(obj) or inspect.isfunction(obj)):
                continue
            doc = (obj.__doc__ or "").strip()
            if inspect.isclass(obj) and dataclasses.is_dataclass(obj) and doc.startswith(obj.__name__ + "("):
                doc = ""  # the signature dataclasses write when there is no docstring
            if not doc:
                missing.append(f"{mod.__name__}.{name}")
            if inspect.isclass(obj):
                missing += [f"{mod.__name__}.{name}.{m}" for m, f in _public_members(obj)
                            if not (f.__doc__ or "").strip()]
    return missing


def test_every_public_name_and_method_has_a_docstring():
    assert _undocumented() == []


def test_the_walk_sees_methods_and_properties():
    names = dict(_public_members(arcfmt.DeltaReader))
    assert {"decode", "decode_all", "header", "to_array", "names", "target_step"} <= set(names)
    assert {"write_tensor", "write_tensors", "close"} <= set(dict(_public_members(arcfmt.DeltaWriter)))
    assert "wants" in dict(_public_members(arcfmt.store.Follower))


def test_package_docstring_is_a_guide():
    doc = arcfmt.__doc__
    assert doc is not None
    for word in ("encode_files", "apply_files", "DeltaReader", "StreamReader", "DeltaWriter", "apply_in_place",
                 "Publisher", "Follower", "ArcError", "KeyframeWarning", "README.md", "SPEC.md"):
        assert word in doc, word
    for ref in set(re.findall(r"\barcfmt\.(\w+)", doc)):   # every arcfmt.X it shows exists
        assert hasattr(arcfmt, ref) or ref in ("store", "torch"), ref
    out = io.StringIO()
    sys.stdout, saved = out, sys.stdout
    try:
        help(arcfmt)
    finally:
        sys.stdout = saved
    text = out.getvalue()
    for section in ("Tensors in memory", "Checkpoints on disk", "One delta file", "Live engines", "Errors"):
        assert section in text, section


def test_py_typed_ships():
    assert (Path(arcfmt.__file__).parent / "py.typed").is_file()
    pyproject = (Path(__file__).resolve().parent.parent / "pyproject.toml").read_text()
    assert "py.typed" in pyproject


def test_new_names_are_exported():
    for name in ("encode_files", "apply_files", "KeyframeWarning"):
        assert name in arcfmt.__all__
    assert issubclass(arcfmt.KeyframeWarning, UserWarning)


# ------------------------------------------------------------------------------------- random access

def _model(seed=5):
    base, target = make_pair(seed, "BF16", shapes=((64,), (4, 33), (0,)), density=0.1)
    f32b, f32t = make_pair(seed + 1, "F32", shapes=((50,),), density=0.2, names=["f32"])
    base.update(f32b)
    target.update(f32t)
    return base, target


def test_reader_decode_is_one_call():
    base, target = _model()
    delta = arcfmt.encode(base, target, block_elems=16, workers=1)
    r = arcfmt.DeltaReader(delta)
    for n in target:
        old = r.to_array(n, r.decode_tensor(n, r.check_base(n, base[n])))
        assert_same_tensor(r.decode(n, base[n]), old, n)
        assert_same_tensor(r.decode(n, base), target[n], n)   # the whole base mapping works too
    with pytest.raises(arcfmt.MissingTensorError):
        r.decode("nope", base)
    wrong = dict(base)
    wrong["f32"] = base["f32"] + 1
    with pytest.raises(arcfmt.WrongBaseError):
        r.decode("f32", wrong)
    kf = arcfmt.DeltaReader(arcfmt.encode(None, target))
    assert_same_tensor(kf.decode("f32"), target["f32"])      # a keyframe tensor needs no base


# ------------------------------------------------------------------------------------- torch

def _torch_pair():
    torch = pytest.importorskip("torch")
    from arcfmt.torch import to_torch
    base, target = _model(11)
    target["new"] = random_values(np.random.default_rng(3), BY_NAME["F16"], (7,))
    tb = {n: to_torch(a.copy()) for n, a in base.items()}
    return torch, base, target, tb


def _np(t):
    from arcfmt.arrays import as_numpy
    return as_numpy(t)


def test_torch_in_torch_out():
    torch, base, target, tb = _torch_pair()
    delta = arcfmt.encode(tb, target, block_elems=16, workers=1, on_mismatch="ignore")
    out = arcfmt.decode(tb, delta)
    assert all(isinstance(v, torch.Tensor) for v in out.values())
    assert out["layer.0.weight"].dtype == torch.bfloat16 and out["new"].dtype == torch.float16
    assert_bit_exact({n: _np(v) for n, v in out.items()}, target)
    # numpy in, numpy out; and either way on request (as safetensors' framework="pt"/"np")
    assert all(isinstance(v, np.ndarray) for v in arcfmt.decode(base, delta).values())
    assert all(isinstance(v, np.ndarray) for v in arcfmt.decode(tb, delta, framework="np").values())
    assert all(isinstance(v, torch.Tensor) for v in arcfmt.decode(base, delta, framework="pt").values())
    kf = arcfmt.encode(None, target)
    got = arcfmt.decode(None, kf, framework="torch", device="cpu")
    assert all(isinstance(v, torch.Tensor) and v.device.type == "cpu" for v in got.values())
    assert_bit_exact({n: _np(v) for n, v in got.items()}, target)


def test_torch_output_goes_to_the_device_asked_for():
    torch, base, target, tb = _torch_pair()
    delta = arcfmt.encode(tb, target, block_elems=16, workers=1, on_mismatch="ignore")
    out = arcfmt.decode(tb, delta, device="meta")       # a device that needs no accelerator
    assert all(v.device.type == "meta" for v in out.values())
    assert arcfmt.DeltaReader(delta).decode("f32", tb, device="meta").device.type == "meta"


def test_torch_mismatch_check_reads_dtype_and_shape_only():
    torch, base, target, tb = _torch_pair()
    tb["f32"] = tb["f32"].to(torch.float64)
    with pytest.warns(arcfmt.KeyframeWarning, match=r"'f32' \(dtype F64 in the base, F32 here\)"):
        arcfmt.encode(tb, target)


def test_torch_from_the_reader():
    torch, base, target, tb = _torch_pair()
    delta = arcfmt.encode(tb, target, block_elems=16, workers=1, on_mismatch="ignore")
    r = arcfmt.DeltaReader(delta)
    one = r.decode("layer.1.weight", tb["layer.1.weight"])
    assert isinstance(one, torch.Tensor) and tuple(one.shape) == (4, 33)
    assert_same_tensor(_np(one), target["layer.1.weight"])
    assert isinstance(r.decode("new", tb), torch.Tensor)     # new tensor, torch base mapping: torch
    assert isinstance(r.decode("new"), np.ndarray)
    every = r.decode_all(tb)
    assert all(isinstance(v, torch.Tensor) for v in every.values())


def test_torch_from_the_stream_reader():
    """Front to back, as from a pipe: torch bases give torch tensors, numpy ones numpy, either on request."""
    import io

    torch, base, target, tb = _torch_pair()
    delta = arcfmt.encode(tb, target, block_elems=16, workers=1, on_mismatch="ignore")
    got = dict(arcfmt.StreamReader(io.BytesIO(delta), tb))
    assert all(isinstance(v, torch.Tensor) for v in got.values()) and got["new"].dtype == torch.float16
    assert_bit_exact({n: _np(v) for n, v in got.items()}, target)
    assert all(isinstance(v, np.ndarray) for _, v in arcfmt.StreamReader(io.BytesIO(delta), tb, framework="np"))
    assert all(isinstance(v, torch.Tensor) for _, v in arcfmt.StreamReader(io.BytesIO(delta), base, framework="pt"))
    assert all(v.device.type == "meta" for _, v in arcfmt.StreamReader(io.BytesIO(delta), tb, device="meta"))
    with pytest.raises(arcfmt.InputError, match="device"):
        arcfmt.StreamReader(io.BytesIO(delta), base, device="cpu")
    with pytest.raises(arcfmt.InputError, match="framework"):
        arcfmt.StreamReader(io.BytesIO(delta), base, framework="tf")


def test_torch_apply_in_place_gives_fresh_tensors_as_torch():
    torch, base, target, tb = _torch_pair()
    delta = arcfmt.encode(tb, target, block_elems=16, workers=1, on_mismatch="ignore")
    live = {n: t.clone() for n, t in tb.items()}
    got = dict(arcfmt.apply_in_place(live, delta))
    assert all(isinstance(v, torch.Tensor) for v in got.values())
    assert got["layer.0.weight"] is live["layer.0.weight"]   # updated in place
    live.update(got)
    assert_bit_exact({n: _np(v) for n, v in live.items()}, target)


def test_bad_framework_and_device_without_torch_are_input_errors():
    base, target = _model()
    delta = arcfmt.encode(base, target)
    with pytest.raises(arcfmt.InputError, match="framework"):
        arcfmt.decode(base, delta, framework="tf")
    with pytest.raises(arcfmt.InputError, match="device"):
        arcfmt.decode(base, delta, device="cpu")


def test_torch_asked_for_without_torch_is_an_input_error(monkeypatch):
    base, target = _model()
    delta = arcfmt.encode(base, target)
    monkeypatch.setitem(sys.modules, "torch", None)      # as if PyTorch were not installed
    monkeypatch.delitem(sys.modules, "arcfmt.torch", raising=False)
    monkeypatch.delattr(arcfmt, "torch", raising=False)
    with pytest.raises(arcfmt.InputError, match=r"pip install 'arcfmt\[torch\]'"):
        arcfmt.decode(base, delta, framework="pt")


def test_numpy_use_never_imports_torch():
    code = ("import sys, numpy as np, arcfmt\n"
            "b = {'a': np.arange(8, dtype=np.float32)}\n"
            "d = arcfmt.encode(b, {'a': b['a'] + 1})\n"
            "arcfmt.decode(b, d); arcfmt.DeltaReader(d).decode('a', b)\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parent.parent)


# ------------------------------------------------------------------------------------- files

def _tree(path):
    path = Path(path)
    if path.is_file():
        return {"": hashlib.sha256(path.read_bytes()).hexdigest()}
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.iterdir())}


@pytest.mark.parametrize("layout", ["file", "folder"])
def test_encode_files_apply_files_round_trip(tmp_path, layout):
    base, target = _model(21)
    if layout == "file":
        b, t, out = tmp_path / "b.safetensors", tmp_path / "t.safetensors", tmp_path / "o.safetensors"
        write_file(b, base, {"format": "pt"})
        write_file(t, target, {"format": "pt"})
    else:
        b, t, out = tmp_path / "b", tmp_path / "t", tmp_path / "o"
        save_sharded(b, base, shards=2)
        save_sharded(t, target, shards=2)
    delta = tmp_path / "d.arc"
    w = arcfmt.encode_files(b, t, delta, base_step=4, target_step=5, block_elems=16, workers=1)
    assert w.size == os.path.getsize(delta)
    res = arcfmt.apply_files(b, delta, out)
    assert _tree(out) == _tree(t)                      # bit-identical files
    assert res.tensors == len(target) and res.path == str(out)
    r = arcfmt.DeltaReader(delta.read_bytes())
    assert (r.base_step, r.target_step) == (4, 5)
    assert_bit_exact(arcfmt.decode(open_checkpoint(str(b)).tensors(), delta.read_bytes()), target)
    with pytest.raises(arcfmt.InputError, match="already exists"):   # the CLI's checks, not a copy
        arcfmt.encode_files(b, t, delta)
    with pytest.raises(arcfmt.InputError, match="input"):
        arcfmt.encode_files(b, t, t, force=True)


def test_apply_files_in_place_and_keyframe(tmp_path):
    base, target = _model(22)
    b, t = tmp_path / "b.safetensors", tmp_path / "t.safetensors"
    write_file(b, base, {"format": "pt"})
    write_file(t, target, {"format": "pt"})
    kf = tmp_path / "kf.arc"
    arcfmt.encode_files(None, t, kf)
    assert arcfmt.DeltaReader(kf.read_bytes()).base_step is None
    buf = io.BytesIO()
    arcfmt.encode_files(str(b), str(t), buf)           # a file object works as the output
    arcfmt.apply_files(b, buf.getvalue(), in_place=True)
    assert _tree(b) == _tree(t)


# ------------------------------------------------------------------------------------- mismatch warning

def _mismatched():
    base, target = _model(31)
    base["renamed_in_base"] = base.pop("f32")                              # name
    base["layer.1.weight"] = base["layer.1.weight"].reshape(33, 4)         # shape
    base["layer.0.weight"] = base["layer.0.weight"].astype(np.float32)     # dtype
    return base, target


def test_encode_warns_once_when_tensors_silently_become_keyframes():
    base, target = _mismatched()
    with pytest.warns(arcfmt.KeyframeWarning) as rec:
        delta = arcfmt.encode(base, target)
    assert len(rec) == 1
    msg = str(rec[0].message)
    assert "\n" not in msg and "3 target tensors" in msg
    assert "'f32' (not in the base)" in msg
    assert "'layer.1.weight' (shape (33, 4) in the base, (4, 33) here)" in msg
    assert "'layer.0.weight' (dtype F32 in the base, BF16 here)" in msg
    assert rec[0].filename == __file__                 # points at the caller's line
    assert_bit_exact(arcfmt.decode(base, delta), target)


def test_no_warning_when_nothing_is_lost():
    base, target = _model(32)
    bad, _ = _mismatched()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        arcfmt.encode(base, target)                    # every tensor has its base
        arcfmt.encode(None, target)                    # a keyframe is asked for
        arcfmt.encode(bad, target, keyframe=True)
        arcfmt.encode(bad, target, on_mismatch="ignore")
        arcfmt.encode(base, {n: target[n] for n in list(target)[:1]})   # tensors dropped: not keyframes


def test_on_mismatch_error_refuses_before_writing(tmp_path):
    base, target = _mismatched()
    with pytest.raises(arcfmt.InputError, match="would be stored whole.*on_mismatch='error'"):
        arcfmt.encode(base, target, on_mismatch="error")
    with pytest.raises(arcfmt.InputError, match="on_mismatch must be"):
        arcfmt.encode(base, target, on_mismatch="loud")
    with pytest.raises(arcfmt.InputError, match="on_mismatch must be"):
        arcfmt.encode(None, target, on_mismatch="loud")
    b, t = tmp_path / "b.safetensors", tmp_path / "t.safetensors"
    write_file(b, base, {"format": "pt"})
    write_file(t, target, {"format": "pt"})
    with pytest.raises(arcfmt.InputError, match="would be stored whole"):
        arcfmt.encode_files(b, t, tmp_path / "d.arc", on_mismatch="error")
    assert sorted(os.listdir(tmp_path)) == ["b.safetensors", "t.safetensors"]   # nothing written
    with pytest.warns(arcfmt.KeyframeWarning) as rec:
        arcfmt.encode_files(b, t, tmp_path / "d.arc")
    assert len(rec) == 1 and rec[0].filename == __file__


def test_cli_encode_prints_the_warning_once(tmp_path):
    base, target = _mismatched()
    b, t = tmp_path / "b.safetensors", tmp_path / "t.safetensors"
    write_file(b, base, {"format": "pt"})
    write_file(t, target, {"format": "pt"})
    env = dict(os.environ, PYTHONWARNINGS="")
    p = subprocess.run([sys.executable, "-m", "arcfmt", "encode", str(b), str(t), "-o", str(tmp_path / "d.arc")],
                       capture_output=True, text=True, env=env, cwd=Path(__file__).resolve().parent.parent)
    assert p.returncode == 0, p.stderr
    assert p.stderr.count("'f32' (not in the base)") == 1, p.stderr   # one warning, however the CLI shows it


def test_a_lazy_public_name_wins_over_its_submodule():
    """``arcfmt.store.prune`` is the function even once the submodule of that name was imported first
    (the publisher imports it after every commit with ``keep_last``): a new interpreter, so the order is
    this one."""
    code = ("import arcfmt.store.prune, arcfmt.store as s, inspect\n"
            "print(inspect.isfunction(s.prune), s.STREAM_MAJOR, s.STREAM_MINOR) ")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    from arcfmt.store import STREAM_VERSION
    assert p.stdout.split() == ["True", str(STREAM_VERSION[0]), str(STREAM_VERSION[1])]
