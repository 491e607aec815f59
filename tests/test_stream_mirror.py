"""Regional mirrors (SPEC.md S17): a mirror republishes a stream's committed steps into another store,
checking every hash and decoding nothing, and followers of the mirror get bit-identical folders.
Corruption in the source never reaches the destination's head; a mirror SIGKILLed at any point is
finished by a rerun, and a follower of the destination never meets a missing object."""
from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest

from arcfmt.errors import ChecksumError, CorruptError, InputError, LimitError, TruncatedError
from arcfmt.store import ConflictError, Follower, Mirror, MissingError, Publisher
from arcfmt.store import names as N
from arcfmt.store.backends import Store
from arcfmt.store.objects import Head
from arcfmt.store.signing import MAX_SIGNATURE_BYTES, signature_name
from support.store import Remote, _unique, arcfmt, assert_folder, publish_step, run_cli_trajectory, trajectory
from support.store import publishers as support_publishers


@pytest.fixture(scope="module")
def traj():
    return trajectory(steps=6, seed=21)


@pytest.fixture(params=["local", "memory"])
def where(request, tmp_path, memory_url):
    """``(source URL, destination URL)`` on one kind of store."""
    if request.param == "memory":
        return memory_url + "/src", memory_url + "/dst"
    return str(tmp_path / "src"), str(tmp_path / "dst")


def publishers(url, n=2, **kw):
    return support_publishers(url, n, **kw)


def objects(url, so=None) -> dict:
    """Every object of a stream but its head: name → bytes."""
    st = Store(url, so)
    fs = st.fs
    out = {}
    for p in fs.find(st.root):
        rel = p[len(st.root.rstrip("/")) + 1:] if st.root else p
        if rel != N.HEAD and not os.path.basename(rel).startswith("."):
            out[rel] = fs.cat_file(p)
    return out


def folder_bytes(path) -> dict:
    """The checkpoint files of a follower's folder, byte for byte (the stream state names its manifest)."""
    return {n: open(os.path.join(path, n), "rb").read() for n in sorted(os.listdir(path))}


def mirror(src, dst, tmp_path, **kw):
    kw.setdefault("missing_wait", 0)
    return Mirror(src, dst, tmp_dir=str(tmp_path / "mirror-tmp"), **kw)


# ------------------------------------------------------------------------------------ the main job

def test_mirror_then_follow_is_bit_identical(where, tmp_path, traj):
    src, dst = where
    pubs = publishers(src, keyframe_every=3)
    mir = mirror(src, dst, tmp_path, chunk_size=4096, concurrency=3)   # many chunks per object
    with pytest.raises(MissingError, match="no stream"):
        mir.sync()                                                        # nothing there at all yet
    for step in range(5):
        publish_step(pubs, step, traj[step])
    # a new mirror starts at the latest keyframe (step 3), as a new follower would
    res = mir.sync()
    assert [(r.step, r.head_moved, r.lag_steps) for r in res] == [(3, True, 1), (4, True, 0)]
    assert res[0].objects_copied == 4 and res[1].objects_copied == 2     # step 3: delta + keyframe per shard
    assert all(r.objects_present == 0 for r in res)
    assert sum(r.bytes_read for r in res) > sum(r.bytes_copied for r in res)   # + the heads, the plan
    assert mir.head().step == 4 and mir.head().manifest == res[1].manifest
    assert not any(n.startswith(("steps/00000000000000000000", "steps/00000000000000000001",
                                 "steps/00000000000000000002")) for n in objects(dst))
    # the destination holds the source's objects of the copied steps, byte for byte
    s_obj, d_obj = objects(src), objects(dst)
    assert {n: b for n, b in s_obj.items() if int(n.split("/")[1]) >= 3} == d_obj
    # a follower of the mirror and a follower of the source end with the same bytes
    a, b = Follower(src, tmp_path / "a"), Follower(dst, tmp_path / "b")
    assert [u.step for u in b.sync()] == [3, 4]
    a.sync()
    assert folder_bytes(a.into) == folder_bytes(b.into)
    assert_folder(b.into, traj[4])
    # the next step: mirrored as a delta, followed as one
    publish_step(pubs, 5, traj[5])
    (r,) = mir.sync()
    assert (r.step, r.objects_copied, r.lag_steps) == (5, 2, 0)
    (u,) = b.sync()
    assert (u.step, u.kind) == (5, "delta")
    a.sync()
    assert folder_bytes(a.into) == folder_bytes(b.into)
    # idempotent: up to date, a rerun reads the heads only and copies nothing
    before = objects(dst)
    assert mir.sync() == [] and objects(dst) == before
    # nothing of the mirror's staging is left
    assert os.listdir(tmp_path / "mirror-tmp") == []


def test_a_rerun_after_a_lost_head_copies_no_data(tmp_path, traj):
    """Everything but the head is there (a run killed before its head move): the rerun reads no data
    object from the source, checks what the destination holds and moves the head."""
    src, dst = str(tmp_path / "src"), str(tmp_path / "dst")
    pubs = publishers(src)
    for step in range(3):
        publish_step(pubs, step, traj[step])
    mirror(src, dst, tmp_path).sync()
    os.unlink(os.path.join(dst, N.HEAD))
    again = mirror(src, dst, tmp_path)
    res = again.sync()
    assert [(r.step, r.objects_copied, r.objects_present, r.bytes_copied) for r in res] == \
        [(0, 0, 2, 0), (1, 0, 2, 0), (2, 0, 2, 0)]
    assert again.stats.bytes == 0 and all(r.head_moved for r in res)
    # a destination object that was damaged is written again (content-addressed: same name, right bytes)
    name = next(n for n in objects(dst) if n.startswith(f"{N.step_dir(2)}/") and n.endswith(".arc"))
    p = os.path.join(dst, name)
    with open(p, "r+b") as f:
        f.truncate(os.path.getsize(p) - 1)
    os.unlink(os.path.join(dst, N.HEAD))
    res = mirror(src, dst, tmp_path).sync()
    assert [(r.step, r.objects_copied) for r in res] == [(0, 0), (1, 0), (2, 1)]
    assert objects(dst) == objects(src)


def test_follow_mirrors_each_new_step(tmp_path, traj):
    src, dst = str(tmp_path / "src"), str(tmp_path / "dst")
    pubs = publishers(src, n=1)
    publish_step(pubs, 0, traj[0])
    mir = mirror(src, dst, tmp_path)
    got, errors = [], []

    def run():
        try:
            got.extend(mir.follow(until=3, interval=0.01, timeout=60))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    t = threading.Thread(target=run)
    t.start()
    for step in range(1, 4):
        time.sleep(0.05)
        publish_step(pubs, step, traj[step])
    t.join(60)
    assert not errors and not t.is_alive()
    assert [r.step for r in got] == [0, 1, 2, 3] and mir.head().step == 3
    assert all(r.seconds >= 0 and r.lag_seconds >= 0 for r in got)
    assert_folder(Follower(dst, tmp_path / "f").sync()[-1].path, traj[3])


def test_signature_is_copied_verbatim_before_the_head(tmp_path, traj):
    src, dst = str(tmp_path / "src"), str(tmp_path / "dst")
    pubs = publishers(src, n=1)
    publish_step(pubs, 0, traj[0])
    blob = b'{"not parsed by the mirror": true}\n'
    with open(os.path.join(src, signature_name(0)), "wb") as f:
        f.write(blob)
    (r,) = mirror(src, dst, tmp_path).sync()
    assert r.signed and open(os.path.join(dst, signature_name(0)), "rb").read() == blob
    publish_step(pubs, 1, traj[1])
    with open(os.path.join(src, signature_name(1)), "wb") as f:
        f.write(b"x" * (MAX_SIGNATURE_BYTES + 1))
    with pytest.raises(LimitError):
        mirror(src, dst, tmp_path).sync()
    assert Store(dst).read(N.HEAD, 4096) and mirror(src, dst, tmp_path).head().step == 0


# ------------------------------------------------------------------------------------ refusals

def _last_objects(src, step):
    d = os.path.join(src, N.step_dir(step))
    return sorted(os.path.join(d, n) for n in os.listdir(d) if n.endswith(".arc"))


@pytest.mark.parametrize("fault", ["flip-data", "flip-tail", "truncate", "swap-descriptor", "flip-manifest",
                                   "remove-data"])
def test_corruption_in_the_source_never_reaches_the_head(fault, tmp_path, traj):
    src, dst = str(tmp_path / "src"), str(tmp_path / "dst")
    pubs = publishers(src)
    publish_step(pubs, 0, traj[0])
    assert [r.step for r in mirror(src, dst, tmp_path).sync()] == [0]
    publish_step(pubs, 1, traj[1])
    publish_step(pubs, 2, traj[2])
    d = os.path.join(src, N.step_dir(1))
    obj = _last_objects(src, 1)[0]
    data = bytearray(open(obj, "rb").read())
    if fault == "flip-data":
        data[60] ^= 0x01             # a block's bytes: only the whole-object hash sees it
    elif fault == "flip-tail":
        data[-10] ^= 0x01
    elif fault == "truncate":
        data = data[:-1]
    if fault in ("flip-data", "flip-tail", "truncate"):
        with open(obj, "wb") as f:
            f.write(data)
    elif fault == "swap-descriptor":
        a, b = (os.path.join(d, f"shard-{i:05d}-of-00002.json") for i in range(2))
        with open(b, "rb") as f:
            other = f.read()
        with open(a, "wb") as f:
            f.write(other)
    elif fault == "flip-manifest":
        m = os.path.join(d, "manifest.json")
        raw = bytearray(open(m, "rb").read())
        raw[raw.index(b'"tensors":') + 10] ^= 0x01
        with open(m, "wb") as f:
            f.write(raw)
    elif fault == "remove-data":
        os.unlink(obj)
    want = {"flip-data": ChecksumError, "flip-tail": ChecksumError, "truncate": TruncatedError,
            "swap-descriptor": ChecksumError, "flip-manifest": ChecksumError, "remove-data": MissingError}[fault]
    t0 = time.monotonic()
    with pytest.raises(want) as ei:
        mirror(src, dst, tmp_path, missing_wait=0.3).sync()
    assert "source" in str(ei.value) or fault == "truncate" or fault == "remove-data"
    if fault == "remove-data":
        assert time.monotonic() - t0 >= 0.3                 # waited for a late replica, within the bound
    # the destination's head never moved past the good step; its followers get step 0, whole
    mir = mirror(src, dst, tmp_path)
    assert mir.head().step == 0
    assert not os.path.exists(os.path.join(dst, N.manifest_name(1)))
    assert [u.step for u in Follower(dst, tmp_path / "f").sync()] == [0]
    assert os.listdir(tmp_path / "mirror-tmp") == []


def test_an_object_that_appears_late_is_waited_for(tmp_path, traj):
    """A source replicated asynchronously: the head names a step whose data object is not there yet."""
    src, dst = str(tmp_path / "src"), str(tmp_path / "dst")
    publish_step(publishers(src), 0, traj[0])
    obj = _last_objects(src, 0)[1]
    hidden = str(tmp_path / "hidden.arc")
    os.rename(obj, hidden)
    threading.Timer(0.4, os.rename, (hidden, obj)).start()
    (r,) = mirror(src, dst, tmp_path, missing_wait=30).sync()
    assert r.step == 0 and r.seconds >= 0.3 and r.objects_copied == 2


def test_a_destination_of_another_stream_is_a_conflict(tmp_path, traj):
    src, dst = str(tmp_path / "src"), str(tmp_path / "dst")
    pubs = publishers(src)
    publish_step(pubs, 0, traj[0])
    publish_step(publishers(dst), 0, traj[1])             # another stream at the same step
    with pytest.raises(ConflictError):
        mirror(src, dst, tmp_path).sync()
    publish_step(pubs, 1, traj[1])
    with pytest.raises(ConflictError, match="different"):
        mirror(src, dst, tmp_path).sync()                  # its step-0 objects differ from the source's
    with pytest.raises(InputError, match="same stream"):
        Mirror(src, src)
    with pytest.raises(MissingError, match="no stream"):
        mirror(str(tmp_path / "nothing"), dst, tmp_path).sync()


def test_a_source_rewritten_below_the_destination_restarts_from_a_keyframe(tmp_path, traj):
    """The destination's step is not on the source's chain any more: copy from the latest keyframe,
    never moving the destination's head backwards."""
    src, dst, other = str(tmp_path / "src"), str(tmp_path / "dst"), str(tmp_path / "other")
    pubs, opubs = publishers(src), publishers(other)
    publish_step(pubs, 0, traj[0])
    mirror(src, dst, tmp_path).sync()
    # the destination got a step 1 of its own that the source never had (from a stream whose step 0 is
    # the source's, byte for byte)
    publish_step(opubs, 0, traj[0])
    publish_step(opubs, 1, traj[2])
    (r,) = mirror(other, dst, tmp_path).sync()
    assert r.step == 1
    # the source moves on with a keyframe at step 2 and a delta at 3
    publish_step(pubs, 1, traj[1])
    publish_step(pubs, 2, traj[2], keyframe=True)
    publish_step(pubs, 3, traj[3])
    res = mirror(src, dst, tmp_path).sync()
    assert [r.step for r in res] == [2, 3]
    assert_folder(Follower(dst, tmp_path / "f").sync()[-1].path, traj[3])


# ------------------------------------------------------------------------------------ killed mirrors

def _child_mirror(src, dst, tmp, kill_at, out) -> None:  # pragma: no cover - runs in a forked child
    code = 3
    try:
        from support import faults

        kp = faults._arm(kill_at, local_reads=True)
        try:
            Mirror(src, dst, tmp_dir=tmp, missing_wait=0, chunk_size=8192, concurrency=2).sync()
        finally:
            kp.kill_at = None
        with open(out, "w") as f:
            json.dump({"points": kp.count}, f)
        code = 0
    finally:
        os._exit(code)


def _fork_mirror(src, dst, tmp, kill_at, out) -> int:
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        _child_mirror(src, dst, tmp, kill_at, out)
    _, status = os.waitpid(pid, 0)
    return status


@pytest.mark.kill
def test_killed_mirror_is_finished_by_a_rerun(tmp_path, traj):
    """SIGKILL a mirror at every kill point of its copy (before and after each fsync, rename, link,
    unlink and read): the destination's head always names a whole step — a follower of it never meets
    a missing object — and a rerun finishes the copy, bit-identical."""
    src = str(tmp_path / "src")
    pubs = publishers(src)
    for step in range(2):
        publish_step(pubs, step, traj[step])
    out = str(tmp_path / "control.json")
    status = _fork_mirror(src, str(tmp_path / "control"), str(tmp_path / "tmp"), None, out)
    assert os.waitstatus_to_exitcode(status) == 0
    points = json.load(open(out))["points"]
    assert points > 30
    want = objects(src)
    for k in range(1, points + 1):
        dst, tmp = str(tmp_path / f"dst{k}"), str(tmp_path / f"tmp{k}")
        status = _fork_mirror(src, dst, tmp, k, str(tmp_path / f"r{k}.json"))
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, (k, status)
        head = Store(dst).read(N.HEAD, 4096, missing_ok=True) if os.path.isdir(dst) else None
        if head is not None:   # what a follower of the destination can see is whole
            fol = Follower(dst, tmp_path / f"f{k}", missing_wait=0)
            ups = fol.sync()
            assert ups and ups[-1].step == json.loads(head)["step"], k
        res = Mirror(src, dst, tmp_dir=tmp, missing_wait=0).sync()
        assert Mirror(src, dst, tmp_dir=tmp).head().step == 1, k
        assert objects(dst) == want, k
        assert not os.path.isdir(tmp) or os.listdir(tmp) == [], k    # the killed run's staging is removed
        assert all(r.objects_copied + r.objects_present == 2 for r in res)
        fol = Follower(dst, tmp_path / f"f{k}", missing_wait=0)
        fol.sync()
        assert_folder(fol.into, traj[1])


# ------------------------------------------------------------------------------------ stores and the CLI

@pytest.mark.servers
def test_mirror_seaweedfs_to_fake_gcs(request, tmp_path, traj):
    """S3 → GCS, each side with its own storage options; the GCS followers' folder equals the S3 ones'."""
    s3 = Remote(request.getfixturevalue("seaweedfs_server"), _unique(request))
    gcs = Remote(request.getfixturevalue("fake_gcs_server"), _unique(request))
    pubs = [Publisher(s3.url, shard=i, num_shards=2, keyframe_every=2, storage_options=s3.storage_options,
                      effort="fast") for i in range(2)]
    mir = Mirror(s3.url, gcs.url, src_options=s3.storage_options, dst_options=gcs.storage_options,
                 tmp_dir=str(tmp_path / "tmp"), chunk_size=8192, missing_wait=0)
    a = Follower(s3.url, tmp_path / "a", storage_options=s3.storage_options)
    b = Follower(gcs.url, tmp_path / "b", storage_options=gcs.storage_options)
    for step in range(4):
        publish_step(pubs, step, traj[step])
        if step == 1:
            continue                                       # two steps at once next time
        res = mir.sync()
        assert [r.step for r in res] == ([step - 1, step] if step == 2 else [step])
        a.sync()
        b.sync()
        assert folder_bytes(a.into) == folder_bytes(b.into)
    assert mir.sync() == []
    assert objects(gcs.url, gcs.storage_options) == objects(s3.url, s3.storage_options)


def test_cli_mirror_as_a_user_runs_it(tmp_path, traj):
    src, dst = str(tmp_path / "src"), str(tmp_path / "dst")
    run_cli_trajectory(src, tmp_path / "pub", traj, steps=3, shards=2)
    p = arcfmt("mirror", src, dst, "--tmp-dir", tmp_path / "tmp", rc=0)
    lines = p.stdout.splitlines()
    assert len(lines) == 3 and lines[0].startswith("step 0: copied 2 data objects") and "head moved" in lines[2]
    p = arcfmt("mirror", src, dst, "--json", rc=0)
    assert json.loads(p.stdout) == {"event": "done", "step": 2, "source_head": 2, "mirrored": 0, "dst": dst}
    p = arcfmt("mirror", src, dst, rc=0)
    assert p.stdout.strip() == f"{dst} is at step 2 (source head 2)"
    arcfmt("follow", dst, "--into", tmp_path / "b", "--once", rc=0)
    assert folder_bytes(tmp_path / "pub" / "full") == folder_bytes(tmp_path / "b")
    p = arcfmt("mirror", src, str(tmp_path / "dst2"), "--until", "2", "--interval", "0.05", "--json", rc=0)
    assert [json.loads(x)["step"] for x in p.stdout.splitlines()[:-1]] == [0, 1, 2]


@pytest.mark.parametrize("case", ["missing", "dots", "protocol", "same", "corrupt-head", "big-head"])
def test_cli_mirror_bad_source_is_one_line(case, tmp_path, traj):
    dst = str(tmp_path / "dst")
    src = str(tmp_path / "src")
    os.makedirs(src)
    if case == "corrupt-head":
        open(os.path.join(src, N.HEAD), "w").write('{"format": "arcfmt-stream-head"}')
    elif case == "big-head":
        open(os.path.join(src, N.HEAD), "w").write(" " * 5000)
    arg = {"missing": str(tmp_path / "nope"), "dots": f"{src}/../src", "protocol": "nosuch://bucket/run",
           "same": src, "corrupt-head": src, "big-head": src}[case]
    p = arcfmt("mirror", arg, src if case == "same" else dst, rc=1)
    want = {"missing": "not_found", "dots": "input", "protocol": "input", "same": "input",
            "corrupt-head": "corrupt", "big-head": "limit"}[case]
    assert p.stderr.startswith(f"arcfmt: error ({want}): ") and p.stderr.count("\n") == 1, p.stderr
    assert not os.path.exists(dst)


def test_cli_mirror_usage(tmp_path):
    p = arcfmt("mirror", tmp_path, tmp_path / "d", "--once", "--follow", rc=2)
    assert "one of --once, --follow and --until" in p.stderr
    p = arcfmt("mirror", tmp_path, tmp_path / "d", "--src-option", "novalue", rc=2)
    assert "--src-option takes KEY=VALUE" in p.stderr


def test_mirror_head_is_a_stream_head(tmp_path, traj):
    """What the mirror writes as the head is a head (S7): its step, manifest hash and keyframe step."""
    src, dst = str(tmp_path / "src"), str(tmp_path / "dst")
    pubs = publishers(src, keyframe_every=2)
    for step in range(4):
        publish_step(pubs, step, traj[step])
    res = mirror(src, dst, tmp_path).sync()
    h = mirror(src, dst, tmp_path).head()
    assert isinstance(h, Head) and (h.step, h.manifest, h.keyframe_step) == (3, res[-1].manifest, 2)
    with pytest.raises(CorruptError):
        open(os.path.join(src, N.HEAD), "w").write("{}")
        mirror(src, dst, tmp_path).sync()


def test_steps_pruned_from_the_source_restart_from_a_keyframe(tmp_path, traj):
    """The destination is behind steps the source no longer keeps (retention): the walk meets a
    missing manifest after a keyframe, and the copy starts from that keyframe."""
    import shutil

    src, dst = str(tmp_path / "src"), str(tmp_path / "dst")
    pubs = publishers(src, keyframe_every=3)
    publish_step(pubs, 0, traj[0])
    mirror(src, dst, tmp_path).sync()
    for step in range(1, 5):
        publish_step(pubs, step, traj[step])
    for step in (1, 2):
        shutil.rmtree(os.path.join(src, N.step_dir(step)))
    t0 = time.monotonic()
    assert [r.step for r in mirror(src, dst, tmp_path, missing_wait=30).sync()] == [3, 4]
    assert time.monotonic() - t0 < 10                    # a pruned step is not waited for (S9.5 step 1)
    assert_folder(Follower(dst, tmp_path / "f").sync()[-1].path, traj[4])
    shutil.rmtree(os.path.join(src, N.step_dir(3)))
    publish_step(pubs, 5, traj[5])
    (r,) = mirror(src, dst, tmp_path).sync()              # step 5's base (4) is the destination's head
    assert r.step == 5


def test_plan_says_what_would_be_copied(tmp_path, traj):
    src, dst = str(tmp_path / "src"), str(tmp_path / "dst")
    pubs = publishers(src, keyframe_every=2)
    for step in range(4):
        publish_step(pubs, step, traj[step])
    mir = mirror(src, dst, tmp_path)
    assert [m.step for m in mir.plan()] == [2, 3]
    mir.sync(until=2)
    assert mir.head().step == 2 and [m.step for m in mir.plan()] == [3]
    mir.sync()
    assert mir.plan() == [] and mir.sync(until=1) == []


def test_signed_steps_stay_signed_in_the_mirror(tmp_path, traj):
    """A signed stream's mirror: the signatures come across verbatim, so a follower that trusts the
    trainer's key follows the mirror as it follows the source (SPEC.md S15, S17.1 step 2.4)."""
    pytest.importorskip("cryptography")
    from arcfmt.store.signing import generate_key_files

    key = str(tmp_path / "run.key")
    generate_key_files(key)
    src, dst = str(tmp_path / "src"), str(tmp_path / "dst")
    pubs = publishers(src, sign_key=key, stream_id="run42")
    for step in range(3):
        publish_step(pubs, step, traj[step])
    res = mirror(src, dst, tmp_path).sync()
    assert [(r.step, r.signed) for r in res] == [(0, True), (1, True), (2, True)]
    fol = Follower(dst, tmp_path / "f", trust=[key + ".pub"], stream_id="run42")
    assert [u.step for u in fol.sync()] == [0, 1, 2]
    assert_folder(fol.into, traj[2])


def test_a_signature_that_arrives_late_is_waited_for(tmp_path, traj):
    """A source that signs, replicated asynchronously: step 1's signature shows up after its head. The
    mirror waits for it (as for any late object) instead of copying the step unsigned for good; an
    unsigned stream costs no wait."""
    src, dst = str(tmp_path / "src"), str(tmp_path / "dst")
    pubs = publishers(src, n=1)
    publish_step(pubs, 0, traj[0])
    with open(os.path.join(src, signature_name(0)), "wb") as f:
        f.write(b'{"sig": 0}\n')
    assert [r.signed for r in mirror(src, dst, tmp_path, missing_wait=30).sync()] == [True]
    publish_step(pubs, 1, traj[1])
    late = os.path.join(src, signature_name(1))
    threading.Timer(0.4, lambda: open(late, "wb").write(b'{"sig": 1}\n')).start()
    (r,) = mirror(src, dst, tmp_path, missing_wait=30).sync()
    assert r.step == 1 and r.signed and r.seconds >= 0.3
    assert open(os.path.join(dst, signature_name(1)), "rb").read() == b'{"sig": 1}\n'
    # a signing source whose signature never comes: copied unsigned once missing_wait is spent
    publish_step(pubs, 2, traj[2])
    events = []
    (r,) = mirror(src, dst, tmp_path, missing_wait=0.3, progress=events.append).sync()
    assert r.step == 2 and not r.signed and any(e["event"] == "unsigned" for e in events)
    # a source that stopped signing: one wait was spent, the next steps wait for nothing
    publish_step(pubs, 3, traj[3])
    publish_step(pubs, 4, traj[4])
    m = mirror(src, dst, tmp_path, missing_wait=30)
    t0 = time.monotonic()
    assert [(r.step, r.signed) for r in m.sync()] == [(3, False), (4, False)] and time.monotonic() - t0 < 10
    # an unsigned source: nothing is waited for
    src2, dst2 = str(tmp_path / "src2"), str(tmp_path / "dst2")
    publish_step(publishers(src2, n=1), 0, traj[0])
    t0 = time.monotonic()
    (r,) = mirror(src2, dst2, tmp_path, missing_wait=30).sync()
    assert not r.signed and time.monotonic() - t0 < 10
