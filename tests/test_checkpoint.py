"""Checkpoint files on disk: encode/apply for single files and sharded folders, all-or-nothing output."""
from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os

import ml_dtypes
import numpy as np
import pytest

import arcfmt
from arcfmt import checkpoint_writer
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


def _save_pair(tmp_path, base, target, kind):
    """Base and target on disk as one safetensors file each, or as folders of 3 shards with an index."""
    if kind == "file":
        b, t = tmp_path / "b.safetensors", tmp_path / "t.safetensors"
        write_file(b, base, {"format": "pt"})
        write_file(t, target, {"format": "pt"})
    else:
        b, t = tmp_path / "b", tmp_path / "t"
        save_sharded(b, base, shards=3)
        save_sharded(t, target, shards=3)
    return b, t


@pytest.mark.parametrize("layout", ["file", "folder-index", "folder-plain"])
def test_encode_apply_bit_identical_files(tmp_path, pair, layout):
    base, target = pair
    b, t = _save_pair(tmp_path, base, target, "file" if layout == "file" else "folder")
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


@pytest.mark.parametrize("shape", [[2**62, 2**62, 0], [2**41], [1] * 20, [-1, 2], [3.5]])
def test_safetensors_header_with_impossible_shape(tmp_path, shape):
    """Found by tools/fuzz.py: shapes numpy cannot describe must be a SafetensorsError, not a crash."""
    path = tmp_path / "x.safetensors"
    h = json.dumps({"a": {"dtype": "F32", "shape": shape, "data_offsets": [0, 0]}}).encode()
    path.write_bytes(len(h).to_bytes(8, "little") + h)
    with pytest.raises(arcfmt.SafetensorsError):
        open_checkpoint(path).tensors()


# ----------------------------------------------------------------------- how apply writes its output

def _pair_on_disk(tmp_path, kind, block_elems, seed=7):
    base, target = make_model_pair(seed=seed, layers=2, d=96, vocab=700)
    b, t = _save_pair(tmp_path, base, target, kind)
    delta = tmp_path / "d.arc"
    encode_checkpoints(b, t, delta, block_elems=block_elems)
    return b, t, delta


@pytest.mark.parametrize("direct", [True, False])
@pytest.mark.parametrize("block_elems", [1000, 7000, 1 << 20])  # blocks inside, across, larger than windows
@pytest.mark.parametrize("kind", ["file", "folder"])
def test_apply_through_small_write_windows(tmp_path, monkeypatch, direct, block_elems, kind):
    """Blocks decoded straight into write windows, straddling two, or bigger than several: bit-exact."""
    monkeypatch.setattr(checkpoint_writer, "WINDOW_BYTES", 8192)
    monkeypatch.setattr(checkpoint_writer, "WINDOWS", 2)
    monkeypatch.setattr(checkpoint_writer, "DIRECT_IO", direct)
    b, t, delta = _pair_on_disk(tmp_path, kind, block_elems)
    out = tmp_path / ("o.safetensors" if kind == "file" else "o")
    apply_delta(b, delta, out, workers=3)
    assert digest_tree(out) == digest_tree(t)
    apply_delta(b, delta, in_place=True, workers=2)
    assert digest_tree(b) == digest_tree(t)
    assert not [n for n in siblings(b) if ".arcfmt-" in n]


def test_o_direct_refused_falls_back_to_buffered_writes(tmp_path, monkeypatch):
    """A filesystem that refuses O_DIRECT at open, or only at the first write: ordinary writes, same bytes."""
    if not checkpoint_writer._O_DIRECT:
        pytest.skip("no O_DIRECT on this platform")
    b, t, delta = _pair_on_disk(tmp_path, "folder", 5000)
    real_open, real_pwrite = os.open, os.pwrite
    refused = {"open": 0, "pwrite": 0}

    def open_no_direct(path, flags, *a, **k):
        if flags & checkpoint_writer._O_DIRECT:
            refused["open"] += 1
            raise OSError(errno.EINVAL, "O_DIRECT not supported")
        return real_open(path, flags, *a, **k)

    def pwrite_no_direct(fd, data, offset):
        if fcntl.fcntl(fd, fcntl.F_GETFL) & checkpoint_writer._O_DIRECT:
            refused["pwrite"] += 1
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(os, "open", open_no_direct)
    apply_delta(b, delta, tmp_path / "o1")
    monkeypatch.setattr(os, "open", real_open)
    monkeypatch.setattr(os, "pwrite", pwrite_no_direct)
    apply_delta(b, delta, tmp_path / "o2")
    assert refused["open"] > 0 and refused["pwrite"] > 0
    assert digest_tree(tmp_path / "o1") == digest_tree(tmp_path / "o2") == digest_tree(t)


@pytest.mark.parametrize("fail_after", [0, 3])
def test_write_error_leaves_nothing_behind(tmp_path, monkeypatch, fail_after):
    """A failing write (disk full) on the writer thread: the error reaches the caller, the base is
    untouched and no staging file or folder is left."""
    monkeypatch.setattr(checkpoint_writer, "WINDOW_BYTES", 8192)
    b, t, delta = _pair_on_disk(tmp_path, "folder", 5000)
    before = digest_tree(b)
    listing = set(os.listdir(tmp_path))
    real_pwrite = os.pwrite
    calls = [0]

    def pwrite_full(fd, data, offset):
        calls[0] += 1
        if calls[0] > fail_after:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", pwrite_full)
    for kwargs in (dict(out_path=tmp_path / "o"), dict(in_place=True)):
        with pytest.raises(arcfmt.FileAccessError, match="No space left on device") as exc:
            apply_delta(b, delta, **kwargs)
        assert ".arcfmt-" not in str(exc.value)  # the user's path, never the staging one
        assert set(os.listdir(tmp_path)) == listing
        assert digest_tree(b) == before


def test_tensor_failing_its_hash_is_never_exposed(tmp_path, monkeypatch):
    """A block that decodes to wrong bytes (a decoder bug, bad memory): the tensor's target hash
    catches it before the file is finished; nothing is exposed, the base stays as it was."""
    b, t, delta = _pair_on_disk(tmp_path, "folder", 5000)
    before = digest_tree(b)
    listing = set(os.listdir(tmp_path))
    real = arcfmt.pipeline.decode_block
    victim = open_checkpoint(t).names[-1]

    def flaky(th, block, loaded, base_block, out_block, **kw):
        changed = real(th, block, loaded, base_block, out_block, **kw)
        if th.name == victim and block == 0:
            out_block.view(np.uint8)[0] ^= 1
        return changed

    monkeypatch.setattr(arcfmt.pipeline, "decode_block", flaky)
    for kwargs in (dict(out_path=tmp_path / "o"), dict(in_place=True)):
        with pytest.raises(arcfmt.VerificationError, match=victim.replace(".", r"\.")):
            apply_delta(b, delta, **kwargs)
        assert set(os.listdir(tmp_path)) == listing
        assert digest_tree(b) == before
