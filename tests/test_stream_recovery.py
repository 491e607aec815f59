"""A stream gets out of a step that can never commit on its own, refuses a shard count that cannot
commit, and says so when there is no stream at all (issue 15 item 3, SPEC.md S8.2 *Recovery*)."""
from __future__ import annotations

import json
import os
import shutil

import pytest

from arcfmt.errors import CorruptError, InputError
from arcfmt.safetensors_io import write_file
from arcfmt.store import ConflictError, Follower, MissingError, Publisher
from arcfmt.store.publisher import why_blocked
from support.store import arcfmt, assert_folder, publish_step, publishers, split, trajectory


@pytest.fixture(scope="module")
def traj():
    return trajectory(steps=6, seed=5)


def ranks(url, n, **kw):
    kw.setdefault("keyframe_every", 0)
    return publishers(url, n, **kw)


@pytest.mark.parametrize("first", [0, 1])
def test_a_stolen_shard_does_not_wedge_the_stream(url, tmp_path, traj, first):
    """One shard of step 1 published under another writer: step 1 can never commit, both real ranks
    get ``conflict`` (whichever publishes first), and step 2 goes out as keyframes by itself."""
    real = ranks(url, 2, writer="job-1")
    publish_step(real, 0, traj[0])
    Publisher(url, shard=0, num_shards=2, writer="intruder", effort="fast").publish(1, split(traj[3], 2)[0])
    parts = split(traj[1], 2)
    order = [first, 1 - first]
    for i in order:
        with pytest.raises(ConflictError):
            real[i].publish(1, parts[i])
    assert why_blocked(real[0].store, 1, 2) is not None       # status and publishers see it
    res = publish_step(real, 2, traj[2])
    assert all(r.keyframe is not None and r.delta is None and r.note for r in res), [r.note for r in res]
    assert res[-1].commit.committed and res[-1].commit.head == 2
    res = publish_step(real, 3, traj[3])                       # and deltas again from there
    assert all(r.delta is not None and r.note is None for r in res) and res[-1].commit.committed
    fol = Follower(url, tmp_path / "f")
    assert [(u.step, u.kind) for u in fol.sync()] == [(2, "keyframe"), (3, "delta")]
    assert_folder(tmp_path / "f", traj[3])


def test_mixed_kinds_recover_at_the_next_step(url, tmp_path, traj):
    """Shard 0 sends only a keyframe, shard 1 only a delta: step 1 can never commit; at step 2 the rank
    that committed nothing notices from the descriptors, the other from its own conflict."""
    real = ranks(url, 2)
    publish_step(real, 0, traj[0])
    parts = split(traj[1], 2)
    r0 = Publisher(url, shard=0, num_shards=2, effort="fast", remember=False).publish(1, parts[0])
    assert r0.keyframe is not None and r0.delta is None and not r0.commit.committed
    real[0]._last = (1, parts[0])   # the rank itself still remembers step 1 as published
    with pytest.raises(ConflictError, match="can never be committed"):
        real[1].publish(1, parts[1], keyframe=False)
    res = publish_step(real, 2, traj[2])
    assert all(r.keyframe is not None and r.delta is None for r in res)
    assert "base step 1 can never be committed" in res[0].note and "was lost" in res[1].note
    assert res[-1].commit.committed
    Follower(url, tmp_path / "f").sync()
    assert_folder(tmp_path / "f", traj[2])


def test_a_base_still_coming_is_not_blocked(url, traj):
    """A base step whose last shard has not claimed yet is pending, not dead: the delta goes out."""
    real = ranks(url, 2)
    publish_step(real, 0, traj[0])
    parts1, parts2 = split(traj[1], 2), split(traj[2], 2)
    real[0].publish(1, parts1[0])
    assert why_blocked(real[0].store, 1, 2) is None
    r = real[0].publish(2, parts2[0])                 # shard 1 of step 1 is still on its way
    assert r.delta is not None and r.note is None and not r.commit.committed
    real[1].publish(1, parts1[1])
    assert real[1].publish(2, parts2[1]).commit.head == 2


def test_resharding_needs_a_keyframe_step_and_then_works(url, tmp_path, traj):
    """3 shards, then the trainer comes back with 4: a delta or an implicit keyframe is refused with the
    command to run; keyframes asked for on every rank commit; the follower's folder changes shape."""
    three = ranks(url, 3)
    publish_step(three, 0, traj[0])
    publish_step(three, 1, traj[1])
    fol = Follower(url, tmp_path / "f")
    fol.sync()
    four = ranks(url, 4)
    parts = split(traj[2], 4)
    with pytest.raises(InputError, match="the stream has 3 shards.*--keyframe on every rank"):
        four[2].publish(2, parts[2])                   # no base: would be a keyframe that never commits
    with pytest.raises(InputError, match="base step 1 has 3 shards"):
        four[2].publish(2, parts[2], base=split(traj[1], 4)[2], base_step=1)
    res = publish_step(four, 2, traj[2], keyframe=True)
    assert res[-1].commit.committed and res[-1].commit.manifest.num_shards == 4
    res = publish_step(four, 3, traj[3])
    assert all(r.delta is not None for r in res) and res[-1].commit.head == 3
    assert [(u.step, u.kind) for u in fol.sync()] == [(2, "keyframe"), (3, "delta")]
    assert_folder(tmp_path / "f", traj[3])
    files = sorted(n for n in os.listdir(tmp_path / "f") if n.endswith(".safetensors"))
    assert files == [f"shard-{i:05d}-of-00004.safetensors" for i in range(4)]   # the 3 old files are gone


def test_reshard_with_a_remembered_base_is_refused_with_the_command(url, traj):
    three = ranks(url, 3)
    publish_step(three, 0, traj[0])
    p = Publisher(url, shard=1, num_shards=2, effort="fast", keyframe_every=0)
    with pytest.raises(InputError, match="3 shards"):
        p.publish(1, split(traj[1], 2)[1], base=split(traj[0], 2)[1], base_step=0)


@pytest.mark.slow  # about 10 s: the recovery through the command line, state across processes
def test_cli_recovers_across_processes(tmp_path, traj):
    """``arcfmt publish --state`` runs one process per step: the lost step is remembered on disk."""
    url = tmp_path / "stream"
    ck = tmp_path / "ckpt"

    def pub(step, i, tensors, *extra, writer="job-1", rc=0):
        f = ck / f"step{step:04d}" / f"model-{i + 1:05d}-of-00002.safetensors"
        f.parent.mkdir(parents=True, exist_ok=True)
        write_file(f, tensors)
        return arcfmt("publish", url, f, "--shard", f"{i}/2", "--state", tmp_path / f"state{i}", "--writer", writer,
                      "--effort", "fast", "--keyframe-every", "0", "--json", *extra, rc=rc)

    for i, part in enumerate(split(traj[0], 2)):
        pub(0, i, part)
    intruder = ck / "evil.safetensors"
    write_file(intruder, split(traj[4], 2)[0])
    arcfmt("publish", url, intruder, "--step", "1", "--shard", "0/2", "--writer", "intruder", "--file-name",
           "model-00001-of-00002.safetensors", "--effort", "fast", rc=0)
    for i, part in enumerate(split(traj[1], 2)):
        p = pub(1, i, part, rc=1)
        assert p.stderr.startswith("arcfmt: error (conflict):") and "keyframe" in p.stderr
    outs = [json.loads(pub(2, i, part).stdout) for i, part in enumerate(split(traj[2], 2))]
    assert all(o["keyframe"] and o["delta"] is None and o["note"] for o in outs) and outs[-1]["head"] == 2
    p = arcfmt("follow", url, "--into", tmp_path / "f", "--once", rc=0)
    assert_folder(tmp_path / "f", traj[2])


def test_follow_of_no_stream_says_so(tmp_path, memory_url):
    with pytest.raises(MissingError, match="no stream"):
        Follower(str(tmp_path / "typo"), tmp_path / "f").sync()
    with pytest.raises(MissingError, match="no stream"):
        Follower(memory_url, tmp_path / "g").sync()
    p = arcfmt("follow", tmp_path / "typo", "--into", tmp_path / "h", "--once", rc=1)
    assert p.stderr.startswith("arcfmt: error (not_found): no stream at") and len(p.stderr.splitlines()) == 1
    p = arcfmt("follow", tmp_path / "typo", "--into", tmp_path / "h", "--timeout", "0.2", rc=1)
    assert "no stream at" in p.stderr
    # a stream whose first step is claimed but not committed yet exists: nothing to do, exit 0
    Publisher(str(tmp_path / "young"), shard=0, num_shards=2, effort="fast").publish(0, split(trajectory(1)[0], 2)[0])
    p = arcfmt("follow", tmp_path / "young", "--into", tmp_path / "k", "--once", rc=0)
    assert "nothing committed yet" in p.stdout
    # --wait: a follower started before its trainer waits for the stream to appear
    p = arcfmt("follow", tmp_path / "late", "--into", tmp_path / "m", "--wait", "--timeout", "0.3", rc=0)
    assert "waiting for a stream" in p.stderr


def test_status_shows_a_step_that_can_never_commit(tmp_path, traj):
    url = str(tmp_path / "stream")
    real = ranks(url, 2, writer="job-1")
    publish_step(real, 0, traj[0])
    Publisher(url, shard=0, num_shards=2, writer="intruder", effort="fast").publish(1, split(traj[3], 2)[0])
    with pytest.raises(ConflictError):
        real[1].publish(1, split(traj[1], 2)[1])
    p = arcfmt("status", url, rc=0)
    assert "can never commit: step 1" in p.stdout and "different writers" in p.stdout
    st = json.loads(arcfmt("status", url, "--json", rc=0).stdout)
    assert [s["step"] for s in st["pending"] if s["blocked"]] == [1]


def test_the_follower_keeps_each_shard_file_name(tmp_path, traj):
    """Checkpoints saved as ``step0017.safetensors``: the follower's file keeps the name of the first
    step (an engine pointed at the folder never re-lists it); other names are kept as they are."""
    url = tmp_path / "stream"
    for s in range(3):
        f = tmp_path / "ckpt" / f"step{s:04d}.safetensors"
        f.parent.mkdir(exist_ok=True)
        write_file(f, traj[s])
        arcfmt("publish", url, f, "--state", tmp_path / "state", "--effort", "fast", rc=0)
        arcfmt("follow", url, "--into", tmp_path / "f", "--once", rc=0)
        assert sorted(n for n in os.listdir(tmp_path / "f") if n.endswith(".safetensors")) == \
            ["shard-00000-of-00001.safetensors"]
    p = Publisher(str(tmp_path / "named"), effort="fast")
    for s in range(2):
        f = tmp_path / "ck2" / f"{s}" / "model.safetensors"
        f.parent.mkdir(parents=True)
        write_file(f, traj[s])
        assert p.publish(s, str(f)).file == "model.safetensors"


@pytest.mark.servers
def test_recovery_resharding_and_no_stream_on_real_servers(remote, tmp_path, traj):
    """The same recovery, reshard and no-stream paths against SeaweedFS, moto and fake-gcs-server."""
    so = remote.storage_options
    real = ranks(remote.url, 2, writer="job-1", storage_options=so)
    publish_step(real, 0, traj[0])
    Publisher(remote.url, shard=0, num_shards=2, writer="intruder", effort="fast",
              storage_options=so).publish(1, split(traj[3], 2)[0])
    for i, part in enumerate(split(traj[1], 2)):
        with pytest.raises(ConflictError):
            real[i].publish(1, part)
    res = publish_step(real, 2, traj[2])
    assert all(r.keyframe is not None and r.note for r in res) and res[-1].commit.head == 2
    three = ranks(remote.url, 3, storage_options=so)
    with pytest.raises(InputError, match="the stream has 2 shards"):
        three[0].publish(3, split(traj[3], 3)[0])
    res = publish_step(three, 3, traj[3], keyframe=True)
    assert res[-1].commit.committed
    fol = Follower(remote.url, tmp_path / "f", storage_options=so)
    assert [(u.step, u.kind) for u in fol.sync()] == [(3, "keyframe")]
    assert_folder(tmp_path / "f", traj[3])
    with pytest.raises(MissingError, match="no stream"):
        Follower(remote.url + "-typo", tmp_path / "g", storage_options=so).sync()


def test_a_follower_refuses_deltas_across_shard_counts(tmp_path, traj):
    """A manifest of deltas whose base step has another shard count (which no committer writes) is
    corrupt for a follower, found while the plan walks (SPEC S6, S9.2 step 3)."""
    from arcfmt.store import names as N
    from arcfmt.store.objects import Head, canonical, digest128, parse_json

    url = tmp_path / "stream"
    real = ranks(str(url), 2)
    publish_step(real, 0, traj[0])
    publish_step(real, 1, traj[1])
    m0p, m1p = url / N.manifest_name(0), url / N.manifest_name(1)
    m0 = parse_json(m0p.read_bytes(), "m0", 1 << 24)
    m0["shards"] = m0["shards"][:1]
    m0["tensors"] = m0["shards"][0]["tensors"]
    ref = m0["shards"][0]["keyframe"]
    one = ref["name"].replace("-of-00002-", "-of-00001-")   # names carry the shard count (S3)
    shutil.copyfile(url / ref["name"], url / one)
    ref["name"] = one
    raw0 = canonical(m0)
    m0p.write_bytes(raw0)
    m1 = parse_json(m1p.read_bytes(), "m1", 1 << 24)
    m1["base_manifest"] = digest128(raw0)
    m1.pop("base_manifest_sha256", None)
    raw1 = canonical(m1)
    m1p.write_bytes(raw1)
    (url / N.HEAD).write_bytes(Head(1, digest128(raw1), 0, 0).to_bytes())
    with pytest.raises(CorruptError, match="2 shards of deltas from step 0, which has 1"):
        Follower(str(url), tmp_path / "f").sync()
