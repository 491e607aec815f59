"""Checkpoint files on disk: encode/apply for single files and sharded folders, all-or-nothing output."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import ml_dtypes
import numpy as np
import pytest

import arcfmt
from arcfmt.checkpoint import apply_delta, encode_checkpoints
from arcfmt.demo import make_model_pair, save_sharded
from arcfmt.safetensors_io import open_checkpoint, write_file


def digest_tree(path):
    if os.path.isfile(path):
        return {"": hashlib.sha256(open(path, "rb").read()).hexdigest()}
    return {n: hashlib.sha256(open(os.path.join(path, n), "rb").read()).hexdigest() for n in sorted(os.listdir(path))}


def siblings(path):
    parent = os.path.dirname(os.path.abspath(path))
    return sorted(os.listdir(parent))


@pytest.fixture
def pair(tmp_path):
    base, target = make_model_pair(seed=1, layers=1, d=64, vocab=500)
    return base, target


@pytest.mark.parametrize("layout", ["file", "folder-index", "folder-plain"])
def test_encode_apply_bit_identical_files(tmp_path, pair, layout):
    base, target = pair
    if layout == "file":
        b, t = tmp_path / "b.safetensors", tmp_path / "t.safetensors"
        write_file(b, base, {"format": "pt"})
        write_file(t, target, {"format": "pt"})
    else:
        b, t = tmp_path / "b", tmp_path / "t"
        save_sharded(b, base, shards=3)
        save_sharded(t, target, shards=3)
        if layout == "folder-plain":
            os.unlink(b / "model.safetensors.index.json")
            os.unlink(t / "model.safetensors.index.json")
    delta = tmp_path / "d.arc"
    encode_checkpoints(b, t, delta, base_step=4, target_step=5)
    out = tmp_path / ("o.safetensors" if layout == "file" else "o")
    res = apply_delta(b, delta, out)
    assert digest_tree(out) == digest_tree(t)
    assert res.tensors == len(target)
    r = arcfmt.DeltaReader(open(delta, "rb").read())
    assert (r.base_step, r.target_step) == (4, 5)


def test_in_place_file_and_folder(tmp_path, pair):
    base, target = pair
    for kind in ("file", "folder"):
        if kind == "file":
            b, t = tmp_path / "b.safetensors", tmp_path / "t.safetensors"
            write_file(b, base)
            write_file(t, target)
        else:
            b, t = tmp_path / "bd", tmp_path / "td"
            save_sharded(b, base)
            save_sharded(t, target)
        delta = tmp_path / f"{kind}.arc"
        encode_checkpoints(b, t, delta)
        apply_delta(b, delta, in_place=True)
        assert digest_tree(b) == digest_tree(t)
        assert not [n for n in siblings(b) if ".arcfmt-" in n]
        # applying the same delta again: the base is now the target, so it is refused untouched
        before = digest_tree(b)
        with pytest.raises(arcfmt.WrongBaseError):
            apply_delta(b, delta, in_place=True)
        assert digest_tree(b) == before


def test_wrong_base_writes_nothing(tmp_path, pair):
    base, target = pair
    b, t = tmp_path / "b", tmp_path / "t"
    save_sharded(b, base)
    save_sharded(t, target)
    delta = tmp_path / "d.arc"
    encode_checkpoints(b, t, delta)
    other = {k: v.copy() for k, v in base.items()}
    name = next(iter(other))
    other[name].view(np.uint8).reshape(-1)[0] ^= 1
    ob = tmp_path / "other"
    save_sharded(ob, other)
    before = set(os.listdir(tmp_path))
    with pytest.raises(arcfmt.WrongBaseError, match=name):
        apply_delta(ob, delta, tmp_path / "out")
    assert set(os.listdir(tmp_path)) == before


def test_corrupt_delta_leaves_no_partial_output(tmp_path, pair):
    base, target = pair
    b, t = tmp_path / "b.safetensors", tmp_path / "t.safetensors"
    write_file(b, base)
    write_file(t, target)
    delta = tmp_path / "d.arc"
    encode_checkpoints(b, t, delta)
    data = bytearray(open(delta, "rb").read())
    before_base = digest_tree(b)
    for cut in (len(data) // 3, len(data) - 41):  # truncated, then a flipped byte in the stream data
        bad = tmp_path / "bad.arc"
        if cut == len(data) // 3:
            bad.write_bytes(bytes(data[:cut]))
        else:
            d2 = bytearray(data)
            d2[200] ^= 0x40
            bad.write_bytes(bytes(d2))
        before = set(os.listdir(tmp_path))
        with pytest.raises(arcfmt.ArcError):
            apply_delta(b, bad, tmp_path / "o.safetensors")
        with pytest.raises(arcfmt.ArcError):
            apply_delta(b, bad, in_place=True)
        assert set(os.listdir(tmp_path)) == before
        assert digest_tree(b) == before_base


def test_shape_and_dtype_changes_and_new_tensors(tmp_path):
    rng = np.random.default_rng(3)
    base = {"a": rng.standard_normal((8, 8)).astype(ml_dtypes.bfloat16), "b": np.arange(6, dtype=np.int64),
            "gone": np.ones(3, np.float32)}
    target = {"a": rng.standard_normal((8, 9)).astype(ml_dtypes.bfloat16), "b": np.arange(6, dtype=np.int32),
              "new": np.zeros((2, 2), np.float16)}
    b, t = tmp_path / "b.safetensors", tmp_path / "t.safetensors"
    write_file(b, base)
    write_file(t, target)
    delta = tmp_path / "d.arc"
    encode_checkpoints(b, t, delta)
    apply_delta(b, delta, tmp_path / "o.safetensors")
    got = open_checkpoint(tmp_path / "o.safetensors").tensors()
    assert set(got) == set(target)
    for k in target:
        assert got[k].dtype == target[k].dtype and got[k].tobytes() == target[k].tobytes()


def _apply_cmd(base, delta):
    return [sys.executable, "-m", "arcfmt", "apply", str(base), str(delta), "--in-place", "--no-progress"]


@pytest.mark.parametrize("kind", ["file", "folder"])
def test_in_place_survives_sigkill_at_any_moment(tmp_path, kind):
    """Kill `arcfmt apply --in-place` at many points: the base is always the old or the new model."""
    base, target = make_model_pair(seed=5, layers=4, d=256, vocab=8000)
    if kind == "file":
        b, t = tmp_path / "b.safetensors", tmp_path / "t.safetensors"
        write_file(b, base)
        write_file(t, target)
    else:
        b, t = tmp_path / "b", tmp_path / "t"
        save_sharded(b, base, shards=4)
        save_sharded(t, target, shards=4)
    delta = tmp_path / "d.arc"
    encode_checkpoints(b, t, delta)
    pristine = tmp_path / "pristine"
    (shutil.copytree if kind == "folder" else shutil.copyfile)(b, pristine)
    old, new = digest_tree(b), digest_tree(t)
    t0 = time.perf_counter()
    subprocess.run(_apply_cmd(b, delta), check=True, capture_output=True)
    full = time.perf_counter() - t0
    assert digest_tree(b) == new
    outcomes = set()
    for i in range(12):
        shutil.rmtree(b) if kind == "folder" else os.unlink(b)
        (shutil.copytree if kind == "folder" else shutil.copyfile)(pristine, b)
        p = subprocess.Popen(_apply_cmd(b, delta), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(full * (i + 0.5) / 12)
        p.send_signal(signal.SIGKILL)
        p.wait()
        from arcfmt.checkpoint import recover
        recover(str(b))
        state = digest_tree(b)
        assert state in (old, new), f"kill {i}: base is neither the old nor the new model"
        outcomes.add("old" if state == old else "new")
        assert not [n for n in siblings(b) if ".arcfmt-" in n]
    assert outcomes  # at least one kill landed; both outcomes are allowed


@pytest.mark.parametrize("shape", [[2**62, 2**62, 0], [2**41], [1] * 20, [-1, 2], [3.5]])
def test_safetensors_header_with_impossible_shape(tmp_path, shape):
    """Found by tools/fuzz.py: shapes numpy cannot describe must be a SafetensorsError, not a crash."""
    path = tmp_path / "x.safetensors"
    h = json.dumps({"a": {"dtype": "F32", "shape": shape, "data_offsets": [0, 0]}}).encode()
    path.write_bytes(len(h).to_bytes(8, "little") + h)
    with pytest.raises(arcfmt.SafetensorsError):
        open_checkpoint(path).tensors()
