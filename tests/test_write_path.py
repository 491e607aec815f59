"""The one verified write path: nothing unverified is exposed, nothing outside is touched.

Regression tests for each way the decode → verify → write sequence once lost the promise: digests
skipped in place, output budgets, base files with odd layouts, files beside the weights, modes and
owners, clean-up of entries that are not ours, planted links, a tensor in two shards, a spool that
eats the disk, and SIGKILL at every deterministic point of ``apply --in-place``.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys

import numpy as np
import pytest

import arcfmt
from arcfmt import pipeline, staging
from arcfmt.checkpoint import apply_delta, encode_checkpoints
from arcfmt.demo import make_model_pair, save_sharded
from arcfmt.errors import CorruptError, FileAccessError, LimitError, VerificationError
from arcfmt.safetensors_io import open_checkpoint, read_file, write_file
from support.faults import KillPoints
from support.records import Rec, assemble, parse_file


def digest_tree(path) -> dict:
    path = str(path)
    if os.path.isfile(path):
        return {"": hashlib.sha256(open(path, "rb").read()).hexdigest()}
    return {n: hashlib.sha256(open(os.path.join(path, n), "rb").read()).hexdigest()
            for n in sorted(os.listdir(path)) if os.path.isfile(os.path.join(path, n))}


def pair_arrays(seed=0, n=4000):
    rng = np.random.default_rng(seed)
    base = {"w": rng.standard_normal(n).astype(np.float32), "b": rng.standard_normal(64).astype(np.float32)}
    target = {"w": base["w"] * np.float32(1.001), "b": base["b"].copy()}
    return base, target


# ------------------------------------------------------------------------------ digests, budgets

@pytest.mark.parametrize("which, err", [("target_digest", VerificationError), ("base_digest", CorruptError)])
def test_apply_in_place_checks_both_digests_like_decode(which, err):
    """A file whose index digest is wrong (records re-chained, so only the digest check can tell) is
    refused by decode, by StreamReader and by apply_in_place, which then leaves the live arrays as they were."""
    base, target = pair_arrays()
    bad = assemble(parse_file(arcfmt.encode(base, target)), **{which: bytes(16)})
    with pytest.raises(err):
        arcfmt.decode(base, bad)
    with pytest.raises(err):
        import io
        list(arcfmt.StreamReader(io.BytesIO(bad), base))
    live = {k: v.copy() for k, v in base.items()}
    with pytest.raises(err):
        list(arcfmt.apply_in_place(live, bad))
    assert all(live[k].tobytes() == base[k].tobytes() for k in base)


def test_small_file_cannot_allocate_gigabytes_by_default(monkeypatch):
    """A keyframe of zeros is tiny and declares a large tensor: the default budget (scaled to the file)
    refuses it with a LimitError that names the parameter; the caller who expects it says so. A delta
    whose output a base backs is not limited by default."""
    monkeypatch.setattr(pipeline, "DEFAULT_MIN_OUTPUT", 1 << 20)
    z = {"z": np.zeros(1 << 20, np.float32)}          # 4 MiB, a file of a few hundred bytes
    kf = arcfmt.encode(None, z, effort="fast")
    assert len(kf) * pipeline.OUTPUT_PER_FILE_BYTE < 4 << 20
    with pytest.raises(LimitError, match="max_output_bytes"):
        arcfmt.decode(None, kf)
    import io
    with pytest.raises(LimitError, match="max_output_bytes"):
        list(arcfmt.StreamReader(io.BytesIO(kf)))
    assert arcfmt.decode(None, kf, max_output_bytes=4 << 20)["z"].tobytes() == z["z"].tobytes()
    d = arcfmt.encode(z, {"z": z["z"] + 1})
    assert arcfmt.decode(z, d)["z"].tobytes() == (z["z"] + 1).tobytes()


def test_decoded_tensors_share_arenas_of_bounded_size(monkeypatch):
    """Decoded arrays come from arenas of at most ARENA_BYTES (a larger tensor alone), each 64-byte
    aligned within its arena, none overlapping another; the output budget is counted as before."""
    monkeypatch.setattr(pipeline, "ARENA_BYTES", 1 << 16)
    rng = np.random.default_rng(3)
    sizes = [100, 5000, 8000, 40000, 3, 9000, 0, 17000]   # float32 elements: 0.4 KB .. 160 KB
    base = {f"t{i}": rng.standard_normal(n).astype(np.float32) for i, n in enumerate(sizes)}
    target = {k: v + np.float32(1) for k, v in base.items()}
    out = arcfmt.decode(base, arcfmt.encode(base, target))
    assert all(out[k].tobytes() == target[k].tobytes() for k in target)
    arenas: dict[int, list[np.ndarray]] = {}
    for a in out.values():
        root = a
        while isinstance(root.base, np.ndarray):
            root = root.base
        arenas.setdefault(id(root), []).append(a)
        assert (a.ctypes.data - root.ctypes.data) % 64 == 0
    for views in arenas.values():
        span = max(v.ctypes.data + v.nbytes for v in views) - min(v.ctypes.data for v in views)
        assert span <= 1 << 16 or len(views) == 1
    assert 1 < len(arenas) < len(sizes)   # small tensors share, large ones do not
    spans = sorted((v.ctypes.data, v.ctypes.data + v.nbytes) for v in out.values() if v.nbytes)
    assert all(e <= s for (_, e), (s, _) in zip(spans, spans[1:]))
    with pytest.raises(LimitError, match="max_output_bytes"):
        arcfmt.decode(None, arcfmt.encode(None, target, effort="fast"), max_output_bytes=200000)


def test_unchanged_tensor_whose_target_hash_differs_is_refused_in_place():
    """All blocks unchanged but a target hash that is not the base's: never reported as applied."""
    import arcfmt.records as R
    from arcfmt import layout as L
    base, target = pair_arrays()
    p = parse_file(arcfmt.encode(base, target), block_records=True)
    recs = []
    for r in p.recs:
        if r.type == L.TENS and r.name == "b":
            th = R.parse_tensor(r.payload, "t")
            th.target_hash ^= 1
            r = Rec(L.TENS, R.build_tensor(th), name="b")
        recs.append(r)
    entries = []
    for r in recs:
        if r.type == L.TENS:
            th = R.parse_tensor(r.payload, "t")
            entries.append((th.name.encode(), th.dtype.code, th.shape, th.target_hash))
    from arcfmt.integrity import model_digest
    bad = assemble(p, recs, target_digest=model_digest(entries))
    live = {k: v.copy() for k, v in base.items()}
    with pytest.raises(VerificationError, match="'b'"):
        list(arcfmt.apply_in_place(live, bad))
    assert all(live[k].tobytes() == base[k].tobytes() for k in base)


# ------------------------------------------------------------------------------ checkpoints on disk

def _write_odd_file(path, tensors: dict, order, gap=24):
    """A safetensors file whose header lists tensors in ``order`` while their data lie in reverse,
    with ``gap`` unused bytes before and between them (valid: safetensors allows holes)."""
    header, blobs, pos = {}, [], gap
    for name in reversed(order):
        raw = tensors[name].tobytes()
        header[name] = {"dtype": "F32", "shape": list(tensors[name].shape), "data_offsets": [pos, pos + len(raw)]}
        blobs.append((pos, raw))
        pos += len(raw) + gap
    h = json.dumps({n: header[n] for n in order}).encode()
    data = bytearray(pos)
    for at, raw in blobs:
        data[at: at + len(raw)] = raw
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little") + h + bytes(data))


@pytest.mark.parametrize("in_place", [False, True])
def test_base_with_gaps_and_out_of_order_tensors_gives_a_readable_output(tmp_path, in_place):
    base, target = pair_arrays()
    b, t = tmp_path / "b.safetensors", tmp_path / "t.safetensors"
    _write_odd_file(b, base, ["w", "b"])
    write_file(t, target)
    d = tmp_path / "d.arc"
    encode_checkpoints(b, t, d)
    out = b if in_place else tmp_path / "o.safetensors"
    apply_delta(b, d, None if in_place else out, in_place=in_place)
    f = read_file(str(out))  # its own header matches its data
    got = open_checkpoint(out).tensors()
    assert set(got) == set(target) and all(got[k].tobytes() == target[k].tobytes() for k in target)
    assert os.path.getsize(out) == f.data_start + sum(t.end - t.begin for t in f.tensors)


def _folder_pair(tmp_path, shards=3):
    base, target = make_model_pair(seed=3, layers=2, d=64, vocab=500)
    b, t = tmp_path / "b", tmp_path / "t"
    save_sharded(b, base, shards=shards)
    save_sharded(t, target, shards=shards)
    d = tmp_path / "d.arc"
    encode_checkpoints(b, t, d)
    return b, t, d


def test_files_beside_the_weights_survive_apply(tmp_path):
    """config.json, a tokenizer folder and a link beside the shards: kept in place, copied to a new folder."""
    b, t, d = _folder_pair(tmp_path)
    (b / "config.json").write_text('{"a": 1}')
    (b / "tok").mkdir()
    (b / "tok" / "vocab.txt").write_text("x y")
    os.symlink("config.json", b / "cfg-link")
    apply_delta(b, d, tmp_path / "o")
    apply_delta(b, d, in_place=True)
    for root in (b, tmp_path / "o"):
        assert (root / "config.json").read_text() == '{"a": 1}'
        assert (root / "tok" / "vocab.txt").read_text() == "x y"
        assert os.readlink(root / "cfg-link") == "config.json"
        weights = {k: v for k, v in digest_tree(root).items() if k.endswith((".safetensors", ".json"))
                   and k != "config.json"}
        assert weights == digest_tree(t)


def _user_extras(folder):
    """What a user keeps beside the weights that no checkpoint writer makes: a read-only sub-folder,
    a FIFO and a socket."""
    import socket
    (folder / "tok").mkdir()
    (folder / "tok" / "vocab.txt").write_text("x y")
    (folder / "tok" / "deep").mkdir()
    (folder / "tok" / "deep" / "merges.txt").write_text("a b")
    os.chmod(folder / "tok", 0o555)
    os.mkfifo(folder / "pipe")
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(folder / "sock"))
    s.close()


def _has_user_extras(folder) -> bool:
    return ((folder / "tok" / "vocab.txt").read_text() == "x y"
            and (folder / "tok" / "deep" / "merges.txt").read_text() == "a b"
            and stat.S_IMODE(os.stat(folder / "tok").st_mode) == 0o555
            and stat.S_ISFIFO(os.lstat(folder / "pipe").st_mode) and stat.S_ISSOCK(os.lstat(folder / "sock").st_mode))


def _clear(folder):
    if os.path.isdir(folder / "tok"):
        os.chmod(folder / "tok", 0o755)
    shutil.rmtree(folder)


def test_in_place_carries_read_only_folders_fifos_and_sockets(tmp_path):
    """In place, everything beside the weights is in the new folder before the swap (a read-only
    sub-folder, a FIFO, a socket: hard links, never moved afterwards); a new folder gets copies of
    the files and folders, and the FIFO and socket are not copied (at any depth), without an error."""
    b, t, d = _folder_pair(tmp_path)
    _user_extras(b)
    os.chmod(b / "tok", 0o755)
    os.mkfifo(b / "tok" / "deep" / "pipe2")
    os.chmod(b / "tok", 0o555)
    apply_delta(b, d, tmp_path / "o")
    o = tmp_path / "o"
    assert (o / "tok" / "deep" / "merges.txt").read_text() == "a b"
    assert not os.path.lexists(o / "pipe") and not os.path.lexists(o / "sock")
    assert not os.path.lexists(o / "tok" / "deep" / "pipe2")
    apply_delta(b, d, in_place=True)
    assert _has_user_extras(b)
    assert {k: v for k, v in digest_tree(b).items() if k.endswith((".safetensors", ".json"))} == digest_tree(t)
    assert not [n for n in os.listdir(tmp_path) if ".arcfmt-" in n]
    _clear(b)


def test_in_place_refuses_a_mount_point_inside_the_folder(tmp_path):
    """A sub-folder on another file system cannot move atomically: refused before anything changes,
    and what the mount holds is untouched (the clean-up never crosses into it)."""
    b, t, d = _folder_pair(tmp_path)
    (b / "cache").mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "none", str(b / "cache")], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        (b / "cache" / "data.bin").write_text("precious")
        before = digest_tree(b)
        with pytest.raises(arcfmt.errors.InputError, match="mount point"):
            apply_delta(b, d, in_place=True)
        assert digest_tree(b) == before and (b / "cache" / "data.bin").read_text() == "precious"
        assert not [n for n in os.listdir(tmp_path) if ".arcfmt-" in n]
    finally:
        subprocess.run(["umount", str(b / "cache")], capture_output=True)


def test_in_place_refuses_a_bind_mount_inside_the_folder(tmp_path):
    """A bind mount from the same file system has the folder's st_dev: it is found in the mount table,
    refused before anything changes, and its source outside the folder is untouched."""
    b, t, d = _folder_pair(tmp_path)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "f").write_text("precious")
    (b / "mnt").mkdir()
    if subprocess.run(["mount", "--bind", str(tmp_path / "elsewhere"), str(b / "mnt")], capture_output=True).returncode:
        pytest.skip("cannot bind-mount here")
    try:
        with pytest.raises(arcfmt.errors.InputError, match="mount point"):
            apply_delta(b, d, in_place=True)
        assert (tmp_path / "elsewhere" / "f").read_text() == "precious"
        assert not [n for n in os.listdir(tmp_path) if ".arcfmt-" in n]
    finally:
        subprocess.run(["umount", str(b / "mnt")], capture_output=True)


def test_in_place_refuses_a_tree_too_deep_and_carries_names_like_ours(tmp_path):
    """A sub-folder more than MAX_CARRY_DEPTH deep is one InputError, nothing left beside the folder
    (the next run is not wedged); a user's entries named like this module's temporaries are carried."""
    b, t, d = _folder_pair(tmp_path)
    (b / ".arcfmt-tmp-notes.txt").write_text("notes")
    (b / ".arcfmt-old-x").mkdir()
    deep = b / "deep"
    p = deep
    for _ in range(staging.MAX_CARRY_DEPTH + 1):
        p = p / "d"
    p.mkdir(parents=True)
    before = digest_tree(b)
    with pytest.raises(arcfmt.errors.InputError, match="folders deep"):
        apply_delta(b, d, in_place=True)
    assert digest_tree(b) == before and not [n for n in os.listdir(tmp_path) if ".arcfmt-" in n]
    shutil.rmtree(deep)
    apply_delta(b, d, in_place=True)
    assert (b / ".arcfmt-tmp-notes.txt").read_text() == "notes" and (b / ".arcfmt-old-x").is_dir()


def test_an_entry_written_while_applying_is_moved_to_the_new_folder(tmp_path, monkeypatch):
    """A log the user's job writes after the carry listed the folder (here: just before the swap) is
    moved into the new folder, not removed with the old one."""
    b, t, d = _folder_pair(tmp_path)
    real = staging.exchange_dirs

    def exchange(a, dest):
        (b / "train_log.txt").write_text("late")
        real(a, dest)
    monkeypatch.setattr(staging, "exchange_dirs", exchange)
    apply_delta(b, d, in_place=True)
    assert (b / "train_log.txt").read_text() == "late"
    assert not [n for n in os.listdir(tmp_path) if ".arcfmt-" in n]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a child as another user")
def test_a_read_only_sub_folder_leaves_nothing_behind_for_its_owner(tmp_path):
    """Run as the folder's (non-root) owner: the old tree, whose read-only sub-folder the owner may not
    write, is still removed after the swap; the user's file keeps its link count."""
    import pathlib
    import tempfile
    tmp_path = pathlib.Path(tempfile.mkdtemp(prefix="arcfmt-owner-", dir="/tmp"))  # pytest's are root's, 0700
    os.chmod(tmp_path, 0o755)
    b, t, d = _folder_pair(tmp_path)
    (b / "tok").mkdir()
    (b / "tok" / "vocab.json").write_text("v")
    os.chmod(b / "tok", 0o555)
    for root, dirs, files in os.walk(tmp_path):
        for n in [root, *(os.path.join(root, x) for x in dirs + files)]:
            os.lchown(n, 4321, 4321)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.setgroups([])
            os.setgid(4321)
            os.setuid(4321)
            apply_delta(b, d, in_place=True)
            os._exit(0)
        except BaseException:  # noqa: BLE001
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert not [n for n in os.listdir(tmp_path) if ".arcfmt-" in n]
    assert os.stat(b / "tok" / "vocab.json").st_nlink == 1 and (b / "tok" / "vocab.json").read_text() == "v"
    os.chmod(b / "tok", 0o755)
    shutil.rmtree(tmp_path)


@pytest.mark.parametrize("kind", ["file", "folder"])
def test_in_place_keeps_modes_and_owner(tmp_path, kind):
    """Private weights stay private: the file (or folder and every file in it) keeps mode and owner."""
    if kind == "file":
        base, target = pair_arrays()
        b, t = tmp_path / "b.safetensors", tmp_path / "t.safetensors"
        write_file(b, base)
        write_file(t, target)
        d = tmp_path / "d.arc"
        encode_checkpoints(b, t, d)
        os.chmod(b, 0o600)
        paths = [b]
    else:
        b, t, d = _folder_pair(tmp_path)
        os.chmod(b, 0o700)
        paths = [b] + [b / n for n in os.listdir(b)]
        for p in paths[1:]:
            os.chmod(p, 0o600)
    if os.geteuid() == 0:
        for p in paths:
            os.chown(p, 1234, 4321)
    before = {str(p): os.stat(p) for p in paths}
    apply_delta(b, d, in_place=True)
    assert digest_tree(b) == digest_tree(t)
    for p in paths:
        st, old = os.stat(p), before[str(p)]
        assert stat.S_IMODE(st.st_mode) == stat.S_IMODE(old.st_mode), p
        assert (st.st_uid, st.st_gid) == (old.st_uid, old.st_gid), p


def test_recover_removes_only_its_own_entries(tmp_path):
    """Clean-up removes the staging entries of *this* destination left by dead processes, and a
    planted link is unlinked, its target never touched; a sibling destination's staging stays."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious").write_text("keep")
    dest = tmp_path / "b"
    dest.mkdir()
    mine = tmp_path / f"{staging.TMP_TAG}{dead.pid}-deadbeef-b"
    os.symlink(victim, mine)
    mine_dir = tmp_path / f"{staging.TMP_TAG}{dead.pid}-0badf00d-b"
    mine_dir.mkdir()
    (mine_dir / "x").write_text("x")
    other = tmp_path / f"{staging.TMP_TAG}{dead.pid}-deadbeef-a-b"   # the staging of a folder named "a-b"
    other.mkdir()
    planted_old = tmp_path / f"{staging.OLD_TAG}b"
    os.symlink(victim, planted_old)
    staging.recover(str(dest))
    assert not os.path.lexists(mine) and not os.path.lexists(mine_dir)
    assert other.is_dir() and os.path.islink(planted_old)
    assert (victim / "precious").read_text() == "keep" and dest.is_dir()


def test_disk_full_is_an_error_never_a_crash(tmp_path):
    """An output that cannot fit: one typed error naming the destination, nothing left behind."""
    b, t, d = _folder_pair(tmp_path)
    small = tmp_path / "small"
    small.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(small)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a small tmpfs here")
    try:
        with pytest.raises((LimitError, FileAccessError)):
            apply_delta(b, d, small / "o")
        assert os.listdir(small) == []
    finally:
        subprocess.run(["umount", str(small)], check=False)


# ------------------------------------------------------------------------------ the follower

def test_follower_lock_is_never_followed_through_a_planted_link(tmp_path):
    base, _ = pair_arrays()
    pub = arcfmt.Publisher(str(tmp_path / "stream"), shard=0, num_shards=1)
    pub.publish(0, base)
    victim = tmp_path / "victim"
    victim.write_text("keep")
    os.symlink(victim, tmp_path / ".arcfmt-lock-f")
    with pytest.raises(FileAccessError):
        arcfmt.Follower(str(tmp_path / "stream"), into=tmp_path / "f").sync()
    assert victim.read_text() == "keep" and not (tmp_path / "f").exists()


def test_follower_refuses_a_tensor_in_two_shards(tmp_path, monkeypatch):
    """A step whose shards both carry tensor "a" (a bucket writer can commit such a step) is corrupt."""
    from arcfmt.store import objects as SL
    base, _ = pair_arrays()
    url = str(tmp_path / "stream")
    real = SL.Descriptor.digest_entries

    def disguised(self):  # the publisher's own duplicate check, blinded
        return [(e[0] + (b"#%d" % self.shard),) + tuple(e[1:]) for e in real(self)]

    monkeypatch.setattr(SL.Descriptor, "digest_entries", disguised)
    arcfmt.Publisher(url, shard=0, num_shards=2).publish(0, base)
    arcfmt.Publisher(url, shard=1, num_shards=2).publish(0, {"w": base["w"]})
    monkeypatch.setattr(SL.Descriptor, "digest_entries", real)
    for tensors in (None, ["w"]):
        with pytest.raises(CorruptError, match="two shards"):
            arcfmt.Follower(url, into=tmp_path / "f", tensors=tensors).sync()
        assert not (tmp_path / "f").exists()


def test_follower_gives_up_its_spool_before_refusing_a_step(tmp_path, monkeypatch):
    """The space check counts the follower's own spool: a step that fits once the spool is dropped
    is applied; one that does not fit is refused and the folder is untouched."""
    import arcfmt.store.follower as F
    base, target = pair_arrays()
    url = str(tmp_path / "stream")
    pub = arcfmt.Publisher(url, shard=0, num_shards=1)
    pub.publish(0, base)
    fol = arcfmt.Follower(url, into=tmp_path / "f")
    fol.sync()
    pub.publish(1, target)
    os.makedirs(fol.spool_dir, exist_ok=True)
    junk = os.path.join(fol.spool_dir, "steps__000000000001__x.0-10.0123456789abcdef")
    with open(junk, "wb") as f:
        f.write(b"0123456789")
    real = shutil.disk_usage

    def usage(path):
        u = real(path)
        spool = fol.spool_dir is not None and os.path.isdir(fol.spool_dir) and os.listdir(fol.spool_dir)
        return u._replace(free=1 if spool else u.free)

    monkeypatch.setattr(F.shutil, "disk_usage", usage)
    (u,) = fol.sync()
    assert u.step == 1 and not os.path.exists(junk)
    pub.publish(2, base)
    monkeypatch.setattr(F.shutil, "disk_usage", lambda p: real(p)._replace(free=1))
    before = digest_tree(tmp_path / "f")
    with pytest.raises(LimitError, match="bytes free"):
        fol.sync()
    assert digest_tree(tmp_path / "f") == before


def test_follower_keeps_the_users_files_and_modes(tmp_path):
    base, target = pair_arrays()
    url = str(tmp_path / "stream")
    pub = arcfmt.Publisher(url, shard=0, num_shards=1)
    pub.publish(0, base)
    into = tmp_path / "f"
    fol = arcfmt.Follower(url, into=into)
    fol.sync()
    (into / "config.json").write_text("{}")
    os.chmod(into, 0o700)
    for n in os.listdir(into):
        os.chmod(into / n, 0o600)
    pub.publish(1, target)
    (u,) = fol.sync()
    assert (into / "config.json").read_text() == "{}"
    assert stat.S_IMODE(os.stat(into).st_mode) == 0o700
    assert {stat.S_IMODE(os.stat(into / n).st_mode) for n in os.listdir(into)} == {0o600}


# ------------------------------------------------------------------------------ SIGKILL at every point

WATCHED = [(os, "fsync"), (os, "rename"), (os, "replace"), (os, "link"), (os, "unlink"), (os, "pwrite"),
           (os, "posix_fallocate"), (os, "mkdir"), (shutil, "rmtree"), (shutil, "copy2"),
           (staging, "exchange_dirs")]


def _apply_killed(base, delta, kill_at) -> tuple[int, list]:
    """Fork, arm the kill points, apply in place; ``(exit status, point names)`` — the names only come
    back from a run that was not killed."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(r)
        try:
            kp = KillPoints(kill_at)
            for obj, attr in WATCHED:
                kp.watch(obj, attr)
            apply_delta(str(base), str(delta), in_place=True, workers=2)
            os.write(w, json.dumps(kp.names).encode())
            os._exit(0)
        except BaseException:  # noqa: BLE001
            os._exit(1)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        out = f.read()
    _, status = os.waitpid(pid, 0)
    return status, json.loads(out) if out else []


@pytest.mark.kill
@pytest.mark.parametrize("kind", ["file", "folder"])
def test_in_place_killed_at_every_point_is_old_or_new_with_its_modes(tmp_path, kind):
    """SIGKILL before and after every fsync, rename, link, unlink, write, space reservation, folder
    exchange and removal of ``apply --in-place``: the base is then the old or the new model, never a
    mix, with its modes; the next run's recovery leaves nothing beside it."""
    if kind == "file":
        base, target = make_model_pair(seed=5, layers=1, d=64, vocab=300)
        b, t = tmp_path / "b.safetensors", tmp_path / "t.safetensors"
        write_file(b, base)
        write_file(t, target)
        d = tmp_path / "d.arc"
        encode_checkpoints(b, t, d)
    else:
        b, t, d = _folder_pair(tmp_path)
        (b / "config.json").write_text("{}")
    pristine = tmp_path / "pristine"
    extras = _user_extras if kind == "folder" else (lambda _: None)
    (shutil.copytree if kind == "folder" else shutil.copy2)(
        b, pristine, **({"symlinks": True} if kind == "folder" else {}))
    old, new = digest_tree(b), None
    extras(b)
    status, names = _apply_killed(b, d, None)
    assert status == 0 and names
    new = digest_tree(b)
    assert {k: v for k, v in new.items() if k != "config.json"} == digest_tree(t)
    seen = set()
    for k in range(1, len(names) + 1):
        _clear(b) if kind == "folder" else os.unlink(b)
        (shutil.copytree if kind == "folder" else shutil.copy2)(pristine, b)
        os.chmod(b, 0o700 if kind == "folder" else 0o600)
        if kind == "folder":
            for n in os.listdir(b):
                os.chmod(b / n, 0o600)
        extras(b)
        status, _ = _apply_killed(b, d, k)
        assert os.WIFSIGNALED(status), (k, names[k - 1], status)
        state = digest_tree(b)   # what an engine reading the base right now would see
        assert state in (old, new), (k, names[k - 1])
        seen.add("old" if state == old else "new")
        assert stat.S_IMODE(os.stat(b).st_mode) == (0o700 if kind == "folder" else 0o600), (k, names[k - 1])
        if kind == "folder":
            weights = [n for n in os.listdir(b) if os.path.isfile(b / n)]
            assert {stat.S_IMODE(os.stat(b / n).st_mode) for n in weights} == {0o600}, (k, names[k - 1])
            assert (b / "config.json").read_text() == "{}"
        staging.recover(str(b))
        assert not [n for n in os.listdir(tmp_path) if ".arcfmt-" in n], (k, names[k - 1])
        if kind == "folder":   # the user's folder, FIFO and socket: in the folder, old or new, after recovery
            assert _has_user_extras(b), (k, names[k - 1])
    assert seen == {"old", "new"}


def test_apply_and_follow_bound_what_a_small_file_may_write(tmp_path, monkeypatch):
    """A tiny delta whose new tensor is 4 MiB of zeros: apply refuses it by default (before writing
    anything), takes it when the caller raises max_output_bytes; a follower likewise."""
    monkeypatch.setattr(pipeline, "DEFAULT_MIN_OUTPUT", 1 << 20)
    base, _ = pair_arrays()
    target = {**base, "z": np.zeros(1 << 20, np.float32)}
    b, t = tmp_path / "b.safetensors", tmp_path / "t.safetensors"
    write_file(b, base)
    write_file(t, target)
    d = tmp_path / "d.arc"
    encode_checkpoints(b, t, d, effort="fast")
    with pytest.raises(LimitError, match="max_output_bytes"):
        apply_delta(b, d, tmp_path / "o.safetensors")
    assert not os.path.exists(tmp_path / "o.safetensors")
    apply_delta(b, d, tmp_path / "o.safetensors", max_output_bytes=8 << 20)
    assert digest_tree(tmp_path / "o.safetensors") == digest_tree(t)
    url = str(tmp_path / "stream")
    arcfmt.Publisher(url, shard=0, num_shards=1, effort="fast").publish(0, target)
    with pytest.raises(LimitError, match="max_output_bytes"):
        arcfmt.Follower(url, into=tmp_path / "f").sync()
    assert not (tmp_path / "f").exists()
    (u,) = arcfmt.Follower(url, into=tmp_path / "f", max_output_bytes=8 << 20).sync()
    assert u.step == 0


def test_follower_state_that_is_a_fifo_or_a_link_is_refused_not_waited_on(tmp_path):
    base, target = pair_arrays()
    url = str(tmp_path / "stream")
    pub = arcfmt.Publisher(url, shard=0, num_shards=1)
    pub.publish(0, base)
    into = tmp_path / "f"
    arcfmt.Follower(url, into=into).sync()
    pub.publish(1, target)
    from arcfmt.store.follower import STATE_NAME
    state = into / STATE_NAME
    saved = state.read_bytes()
    state.unlink()
    os.mkfifo(state)
    with pytest.raises(arcfmt.InputError, match="not a regular file"):
        arcfmt.Follower(url, into=into).sync()
    state.unlink()
    (tmp_path / "elsewhere.json").write_bytes(saved)
    os.symlink(tmp_path / "elsewhere.json", state)
    with pytest.raises(arcfmt.InputError):
        arcfmt.Follower(url, into=into).sync()


def test_a_shard_with_no_tensors_is_followed(tmp_path):
    """Found by the fuzzer: a step with an empty shard crashed the follower."""
    url = "memory://empty-shard-" + os.path.basename(str(tmp_path))
    arcfmt.Publisher(url, shard=0, num_shards=2).publish(1, {})
    arcfmt.Publisher(url, shard=1, num_shards=2).publish(1, {"w": np.ones(3, np.float32)})
    (u,) = arcfmt.Follower(url, into=tmp_path / "m").sync()
    assert u.step == 1 and u.verified_model
    assert open_checkpoint(tmp_path / "m").tensors()["w"].tobytes() == np.ones(3, np.float32).tobytes()


@pytest.mark.parametrize("in_place", [False, True])
def test_a_folder_whose_every_tensor_goes_stays_a_checkpoint(tmp_path, in_place):
    """Found by the fuzzer: an empty target left a folder without any safetensors file."""
    (tmp_path / "base").mkdir()
    write_file(tmp_path / "base" / "model-00001-of-00001.safetensors", {"w": np.ones(4, np.float32)})
    write_file(tmp_path / "target.safetensors", {})
    d = tmp_path / "d.arc"
    encode_checkpoints(tmp_path / "base", tmp_path / "target.safetensors", d)
    out = tmp_path / "base" if in_place else tmp_path / "out"
    apply_delta(tmp_path / "base", d, None if in_place else out, in_place=in_place)
    assert open_checkpoint(out).tensors() == {}


def test_a_step_of_no_tensors_is_still_a_checkpoint(tmp_path):
    """Found by the fuzzer: a step whose every shard is empty left a folder without a safetensors file."""
    url = "memory://no-tensors-" + os.path.basename(str(tmp_path))
    arcfmt.Publisher(url, shard=0, num_shards=1).publish(0, {"w": np.ones(3, np.float32)})
    arcfmt.Publisher(url, shard=0, num_shards=1).publish(1, {})
    ups = arcfmt.Follower(url, into=tmp_path / "m").sync()
    assert ups[-1].step == 1 and open_checkpoint(tmp_path / "m").tensors() == {}


def test_a_folder_whose_index_maps_no_tensor_opens(tmp_path):
    """Found by the fuzzer: an index json with an empty weight_map made the folder unreadable."""
    (tmp_path / "m").mkdir()
    write_file(tmp_path / "m" / "a.safetensors", {})
    (tmp_path / "m" / "model.safetensors.index.json").write_text('{"metadata": {}, "weight_map": {}}')
    assert open_checkpoint(tmp_path / "m").tensors() == {}


def test_encode_and_decode_never_touch_the_callers_arrays(tmp_path):
    """Copies of memory-mapped tensors are np.memmap instances in anonymous memory: releasing their
    pages (as is right for a file's pages) zeroed the caller's base. Found while benchmarking."""
    base, target = pair_arrays(n=1 << 16)
    write_file(tmp_path / "b.safetensors", base)
    write_file(tmp_path / "t.safetensors", target)
    b = {k: v.copy() for k, v in open_checkpoint(tmp_path / "b.safetensors").tensors().items()}
    t = {k: v.copy() for k, v in open_checkpoint(tmp_path / "t.safetensors").tensors().items()}
    assert isinstance(b["w"], np.memmap)
    d = arcfmt.encode(b, t, block_elems=4096)
    assert all(b[k].tobytes() == base[k].tobytes() for k in base)
    for _ in range(2):
        got = arcfmt.decode(b, d)
        assert all(got[k].tobytes() == target[k].tobytes() for k in target)
        assert all(b[k].tobytes() == base[k].tobytes() for k in base)


@pytest.mark.parametrize("in_place", [False, True])
def test_blocks_in_flight_across_files_of_a_folder(tmp_path, monkeypatch, in_place):
    """Every block on the helper threads, so the next file's first tensor opens while the last
    file's blocks are still in flight: the writer waits for them (found by tools/scale.py)."""
    monkeypatch.setattr(pipeline, "SHARED_MIN_ELEMS", 1)
    b, t, d = _folder_pair(tmp_path, shards=3)
    out = b if in_place else tmp_path / "o"
    apply_delta(b, d, None if in_place else out, in_place=in_place, workers=2)
    assert digest_tree(out) == digest_tree(t)
    url = str(tmp_path / "stream")
    tensors = open_checkpoint(t).tensors()
    names = list(tensors)
    for s in range(2):
        arcfmt.Publisher(url, shard=s, num_shards=2).publish(0, {n: np.array(tensors[n]) for n in names[s::2]})
    (u,) = arcfmt.Follower(url, into=tmp_path / "f", workers=2).sync()
    got = open_checkpoint(tmp_path / "f").tensors()
    assert all(got[n].tobytes() == np.asarray(tensors[n]).tobytes() for n in names)


def test_blocks_in_flight_stay_within_what_the_sink_holds(monkeypatch):
    """A sink with bounded buffers (a file's write windows: ``in_flight_bytes``) never has more
    bytes of blocks handed out and not yet done than it says, however many threads decode: a
    window of 2 × workers blocks of 2^21 F32 elements is 128 MiB, more than six 16 MiB windows."""
    monkeypatch.setattr(pipeline, "SHARED_MIN_ELEMS", 1)
    rng = np.random.default_rng(3)
    base = {f"w{i}": rng.normal(0, 1, 5000).astype(np.float32) for i in range(6)}
    target = {k: v + np.float32(1e-3) for k, v in base.items()}
    reader = arcfmt.DeltaReader(arcfmt.encode(base, target, block_elems=1000), workers=8)
    _, bases, _ = reader.selection(base)
    block_bytes = 1000 * 4

    class Bounded(pipeline.ArraySink):
        in_flight_bytes = 3 * block_bytes

        def __init__(self):
            super().__init__(1 << 30)
            self.out, self.most = 0, 0

        def open(self, th):
            inner, sink = super().open(th), self

            class Out:
                def buffer(self, b, encoding, base_block, drain):
                    arr = inner.buffer(b, encoding, base_block, drain)
                    sink.out += arr.nbytes
                    sink.most = max(sink.most, sink.out)
                    return arr

                def done(self, b, arr):
                    sink.out -= arr.nbytes
                    inner.done(b, arr)

                def commit(self):
                    return inner.commit()
            return Out()

    sink = Bounded()
    got = dict(pipeline.run([reader.item(n, bases[n]) for n in reader.names], sink, workers=8))
    assert all(got[k].tobytes() == target[k].tobytes() for k in target)
    assert sink.out == 0 and block_bytes < sink.most <= Bounded.in_flight_bytes
    sink = Bounded()
    Bounded.in_flight_bytes = None  # without a bound, the window of 16 blocks is what holds them
    dict(pipeline.run([reader.item(n, bases[n]) for n in reader.names], sink, workers=8))
    assert sink.most > 3 * block_bytes


def test_names_near_the_file_system_limit_are_staged_beside_themselves(tmp_path):
    """A folder or file whose name leaves no room for the staging tag (240 of 255 bytes): its staging
    names carry a short form of it, the same on every run, so apply and encode work and recovery
    still finds what a killed run left."""
    long = "m" * 240
    b, t, d = _folder_pair(tmp_path)
    os.rename(b, tmp_path / long)
    b = tmp_path / long
    apply_delta(b, d, in_place=True)
    assert {k: v for k, v in digest_tree(b).items() if k.endswith((".safetensors", ".json"))} == digest_tree(t)
    out = tmp_path / ("o" * 240 + ".arc")
    encode_checkpoints(t, b, out)
    assert out.exists()
    left = tmp_path / staging.staging_name(str(b))
    left.mkdir()   # as a killed run of another process would leave it (its pid is ours: recover skips it)
    os.rename(left, tmp_path / left.name.replace(f"-{os.getpid()}-", "-999999-", 1))
    staging.recover(str(b))
    assert not [n for n in os.listdir(tmp_path) if ".arcfmt-" in n]


# ------------------------------------------------------------------------------------- held failures

def _three_tensors():
    rng = np.random.default_rng(3)
    base = {k: rng.standard_normal(64).astype(np.float32) for k in "abc"}
    return base, {k: v + np.float32(0.5) for k, v in base.items()}


def _with(base, target, fault):
    """A delta of ``target`` whose records ``fault(p)`` changes, its target digest made to match the
    TENS records (so the change is the file's only fault before the blocks, SPEC §12.1 step 6)."""
    from arcfmt import layout as L
    from arcfmt.integrity import model_digest
    from arcfmt.records import parse_tensor

    p = parse_file(arcfmt.encode(base, target, workers=1), block_records=True)
    fault(p, L)
    entries = []
    for r in p.recs:
        if r.type == L.TENS:
            th = parse_tensor(r.payload, "")
            entries.append((th.name.encode(), th.dtype.code, th.shape, th.target_hash))
    return assemble(p, target_digest=model_digest(entries))


def test_a_bad_block_leaves_later_live_tensors_untouched():
    """apply_in_place with a bad block in the second tensor: the third is decoded aside (random access
    tries every block, SPEC §12.1 step 7) but never written into its live array."""
    base, target = _three_tensors()

    def ordinal(p, L):
        blk = [r for r in p.recs if r.type == L.BLCK][1]
        blk.payload = blk.payload[:1] + b"\x07" + blk.payload[2:]
    live = {k: v.copy() for k, v in base.items()}
    got = []
    with pytest.raises(CorruptError):
        for name, _ in arcfmt.apply_in_place(live, _with(base, target, ordinal)):
            got.append(name)
    for k in "bc":
        assert live[k].tobytes() == base[k].tobytes(), k
    assert live["a"].tobytes() == (target["a"] if "a" in got else base["a"]).tobytes()


def test_a_failed_hash_in_a_multi_file_apply_is_verification(tmp_path):
    """A first tensor whose bytes fail its hash, the base in two shard files: the apply says
    ``verification`` (the failure is held while the other tensors decode aside; the output files are
    never opened for them), and writes nothing."""
    base, target = _three_tensors()

    def bad_hash(p, L):
        from arcfmt.records import build_tensor, parse_tensor
        r = next(r for r in p.recs if r.type == L.TENS and r.name == "a")
        th = parse_tensor(r.payload, "")
        th.target_hash ^= 1
        r.payload = build_tensor(th)
    bp = tmp_path / "base"
    bp.mkdir()
    write_file(str(bp / "model-00001-of-00002.safetensors"), {"a": base["a"]})
    write_file(str(bp / "model-00002-of-00002.safetensors"), {"b": base["b"], "c": base["c"]})
    (tmp_path / "d.arc").write_bytes(_with(base, target, bad_hash))
    with pytest.raises(VerificationError):
        apply_delta(str(bp), str(tmp_path / "d.arc"), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("workers", [1, 2])
def test_a_bad_block_with_later_blocks_in_flight_is_refused_and_writes_nothing(tmp_path, workers):
    """A checkpoint apply whose first tensor's fourth block is damaged, its other blocks and three more
    tensors' in flight on other threads: the write windows those blocks reserved are handed back in
    order (an adversary review: an AssertionError, not the file's `corrupt`), and no output appears."""
    rng = np.random.default_rng(0)
    base = {k: rng.standard_normal(300_000).astype(np.float32) for k in "abcd"}
    target = {k: v + np.float32(0.5) for k, v in base.items()}
    from arcfmt import layout as L

    d = arcfmt.encode(base, target, block_elems=65_536, workers=1)
    p = parse_file(d, block_records=True)
    blk = [r for r in p.recs if r.type == L.BLCK][3]
    assert blk.payload[:2] == b"\x00\x03"
    blk.payload = b"\x00\x7f" + blk.payload[2:]
    write_file(str(tmp_path / "base.safetensors"), base)
    (tmp_path / "d.arc").write_bytes(assemble(p))
    with pytest.raises(CorruptError):
        apply_delta(str(tmp_path / "base.safetensors"), str(tmp_path / "d.arc"), str(tmp_path / "out.safetensors"),
                    workers=workers)
    assert sorted(os.listdir(tmp_path)) == ["base.safetensors", "d.arc"]
