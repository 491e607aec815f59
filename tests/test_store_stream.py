"""Publish → follow end to end on memory:// and local folders: bit-exact steps, the cheapest path,
commits that never expose half a step, racing publishers, resumption, tampering, the CLI."""
from __future__ import annotations

import json
import os
import threading

import numpy as np
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from arcfmt.errors import ChecksumError, CorruptError, InputError, TruncatedError, WrongBaseError
from arcfmt.safetensors_io import write_file
from arcfmt.store import ConflictError, Follower, MissingError, Publisher
from arcfmt.store import names as N
from arcfmt.store.backends import Store
from arcfmt.store.errors import NoStreamError
from arcfmt.store.follower import STATE_NAME
from support.store import (
    MLP,
    arcfmt,
    assert_folder,
    folder_tensors,
    next_step,
    publish_step,
    publishers,
    run_cli_trajectory,
    split,
    trajectory,
)


@pytest.fixture(scope="module")
def traj():
    return trajectory(steps=6, seed=3)


def mlp_names(tensors):
    return {n for n in tensors if ".mlp." in n}


# ------------------------------------------------------------------------------------ the main job

@pytest.mark.parametrize("shards", [1, 3])
def test_publish_and_follow_bit_exact(url, tmp_path, traj, shards):
    pubs = publishers(url, shards, keyframe_every=3)
    full = Follower(url, tmp_path / "full")
    mlp = Follower(url, tmp_path / "mlp", tensors=[MLP])
    with pytest.raises(NoStreamError):                        # nothing there yet: a typo'd URL is an error
        full.sync()
    assert full.head() is None
    for step, tensors in enumerate(traj):
        res = publish_step(pubs, step, tensors)
        assert [r.commit.committed for r in res] == [False] * (shards - 1) + [True]
        assert res[-1].commit.made_manifest and res[-1].commit.head == step
        assert all((r.keyframe is not None) == (step % 3 == 0) for r in res)
        assert all((r.delta is not None) == (step > 0) for r in res)
        for fol, names in ((full, None), (mlp, mlp_names(tensors))):
            (upd,) = fol.sync()
            assert (upd.step, upd.kind, upd.lag_steps) == (step, "keyframe" if step == 0 else "delta", 0)
            assert_folder(fol.into, tensors, names)
            # bytes: at most 5 % over the records needed + the index/trailer reads
            assert upd.bytes_downloaded <= 1.05 * (upd.bytes_needed + upd.tail_bytes)
            # requests: one tail read per shard, then a few coalesced ranges
            assert upd.requests <= (2 if names is None else 4) * shards, upd.as_dict()
            assert upd.verified_model == (names is None)
            assert fol.step == step and fol.sync() == []
        got = dict(upd.weights())
        assert set(got) <= mlp_names(tensors) and got
        for n, a in got.items():
            assert a.tobytes() == tensors[n].tobytes()
    assert not os.path.exists(tmp_path / ".arcfmt-spool-full") or not os.listdir(tmp_path / ".arcfmt-spool-full")


def test_changed_tensors_are_reported(url, tmp_path, traj):
    (pub,) = publishers(url, 1)
    pub.publish(0, traj[0])
    fol = Follower(url, tmp_path / "f")
    fol.sync()
    t1 = dict(traj[0])
    t1["model.norm.weight"] = traj[1]["model.norm.weight"]      # only one tensor changes
    t1["extra.bias"] = np.arange(5, dtype=np.float32)          # and one appears
    pub.publish(1, t1)
    (upd,) = fol.sync()
    assert sorted(upd.changed) == ["extra.bias", "model.norm.weight"]
    assert dict((n, a.tobytes()) for n, a in upd.weights()) == {n: t1[n].tobytes() for n in upd.changed}
    assert_folder(fol.into, t1)


def test_follow_iterates_while_trainer_publishes(url, tmp_path, traj):
    pubs = publishers(url, 2)
    publish_step(pubs, 0, traj[0])
    fol = Follower(url, tmp_path / "f")

    def trainer():
        for s in range(1, 4):
            publish_step(pubs, s, traj[s])

    t = threading.Thread(target=trainer)
    t.start()
    seen = [u.step for u in fol.follow(until=3, interval=0.02, timeout=60)]
    t.join()
    assert seen[-1] == 3 and seen == sorted(set(seen))
    assert_folder(fol.into, traj[3])


# ------------------------------------------------------------------------------------ paths

def test_new_follower_starts_from_latest_keyframe(url, tmp_path, traj):
    pubs = publishers(url, 2, keyframe_every=2)
    early = Follower(url, tmp_path / "early")
    for s in range(5):
        publish_step(pubs, s, traj[s])
        if s == 1:
            early.sync()
    new = Follower(url, tmp_path / "new")
    assert [(m.step, k) for m, k in new.plan()] == [(4, "keyframe")]
    # a follower at step 1: three small deltas beat keyframe 4 (or keyframe 2 + two deltas)
    assert [(m.step, k) for m, k in early.plan()] == [(2, "delta"), (3, "delta"), (4, "delta")]
    publish_step(pubs, 5, traj[5])
    assert [(m.step, k) for m, k in new.plan()] == [(4, "keyframe"), (5, "delta")]
    ups = new.sync()
    assert [(u.step, u.kind, u.from_step) for u in ups] == [(4, "keyframe", None), (5, "delta", 4)]
    assert_folder(new.into, traj[5])
    early.sync()
    assert_folder(early.into, traj[5])


def test_far_behind_follower_takes_keyframe_when_cheaper(url, tmp_path):
    rng = np.random.default_rng(5)
    steps = [{"w": rng.standard_normal(4000).astype(np.float32)} for _ in range(7)]   # every value changes
    (pub,) = publishers(url, 1, keyframe_every=5)
    fol = Follower(url, tmp_path / "f")
    pub.publish(0, steps[0])
    fol.sync()
    for s in range(1, 7):
        pub.publish(s, steps[s])
    plan = [(m.step, k) for m, k in fol.plan()]
    assert plan == [(5, "keyframe"), (6, "delta")]
    fol.sync()
    assert_folder(fol.into, steps[6])


def test_filter_change_starts_again_from_keyframe(url, tmp_path, traj):
    pubs = publishers(url, 2, keyframe_every=2)
    for s in range(3):
        publish_step(pubs, s, traj[s])
    Follower(url, tmp_path / "f", tensors=[MLP]).sync()
    other = Follower(url, tmp_path / "f", tensors=["model.embed_tokens.*"])
    assert [(m.step, k) for m, k in other.plan()] == [(2, "keyframe")]
    other.sync()
    assert_folder(other.into, traj[2], ["model.embed_tokens.weight"])


def test_patterns_that_match_nothing_are_refused(url, tmp_path, traj):
    (pub,) = publishers(url, 1)
    pub.publish(0, traj[0])
    fol = Follower(url, tmp_path / "f", tensors=["no.such.*"])
    with pytest.raises(InputError, match="match none"):
        fol.sync()
    assert fol.step is None and not os.path.exists(fol.into)


def test_until_stops_early(url, tmp_path, traj):
    (pub,) = publishers(url, 1)
    for s in range(4):
        pub.publish(s, traj[s])
    fol = Follower(url, tmp_path / "f")
    fol.sync(until=0)
    assert fol.step == 0
    assert [u.step for u in fol.follow(until=2, interval=0.01)] == [1, 2]
    assert fol.step == 2 and [u.step for u in fol.sync()] == [3]


# ------------------------------------------------------------------------------------ commits

def test_half_published_step_is_invisible(url, tmp_path, traj):
    pubs = publishers(url, 3)
    publish_step(pubs, 0, traj[0])
    fol = Follower(url, tmp_path / "f")
    fol.sync()
    parts = split(traj[1], 3)
    r0 = pubs[0].publish(1, parts[0])
    r2 = pubs[2].publish(1, parts[2])
    assert not r0.commit.committed and r2.commit.waiting_for == [1]
    assert fol.sync() == [] and fol.step == 0 and fol.head().step == 0
    assert pubs[1].publish(1, parts[1]).commit.committed
    assert [u.step for u in fol.sync()] == [1]
    assert_folder(fol.into, traj[1])


def test_racing_shard_publishers_one_wins(url, tmp_path, traj):
    (a,) = publishers(url, 1)
    a.publish(0, traj[0])
    b = Publisher(url, effort="fast")
    contents = {"a": traj[1], "b": traj[2]}
    results, errors = [], []
    barrier = threading.Barrier(2)

    def go(who, pub):
        barrier.wait()
        try:
            pub.publish(1, contents[who], base=traj[0], base_step=0)
            results.append(who)
        except ConflictError as exc:
            errors.append(exc)

    ts = [threading.Thread(target=go, args=("a", a)), threading.Thread(target=go, args=("b", b))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert len(results) == 1 and len(errors) == 1 and "already published" in str(errors[0])
    fol = Follower(url, tmp_path / "f")
    fol.sync()
    assert_folder(fol.into, contents[results[0]])
    # publishing the winner's content again is a no-op, not a conflict
    again = Publisher(url, effort="fast").publish(1, contents[results[0]], base=traj[0], base_step=0)
    assert again.commit.committed and not again.commit.made_manifest


def test_concurrent_shards_commit_exactly_once(url, tmp_path, traj):
    n = 4
    pubs = publishers(url, n, keyframe_every=0)
    parts = split(traj[0], n)
    results = []
    barrier = threading.Barrier(n)

    def go(i):
        barrier.wait()
        results.append(pubs[i].publish(0, parts[i]))

    ts = [threading.Thread(target=go, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert sum(r.commit.made_manifest for r in results) == 1
    assert any(r.commit.committed for r in results)
    assert Follower(url, tmp_path / "unused").head().step == 0


def test_dead_committer_is_helped_by_next_step(url, tmp_path, traj, monkeypatch):
    pubs = publishers(url, 2)
    publish_step(pubs, 0, traj[0])
    real = Publisher.commit
    monkeypatch.setattr(Publisher, "commit", lambda self, step, mine=None, _depth=0: real(self, step, mine=mine)
                        if step != 1 else type("R", (), {"committed": False, "made_manifest": False,
                                                         "waiting_for": [], "waiting_for_base": None, "head": None})())
    publish_step(pubs, 1, traj[1])              # every shard "dies" before committing step 1
    monkeypatch.setattr(Publisher, "commit", real)
    st = Store(url)
    assert st.read(N.manifest_name(1), 1 << 20, missing_ok=True) is None
    fol = Follower(url, tmp_path / "f")
    fol.sync()
    assert fol.step == 0
    res = publish_step(pubs, 2, traj[2])        # committing step 2 commits step 1 first
    assert res[-1].commit.committed and res[-1].commit.head == 2
    assert [u.step for u in fol.sync()] == [1, 2]
    assert_folder(fol.into, traj[2])
    assert pubs[0].commit(1).committed          # and committing again is harmless


def test_two_trainers_never_mix_into_one_step(url, tmp_path, traj):
    """Two trainer incarnations (writers) race for step 1 shard by shard: each may win some shards,
    but no step is committed from a mix; the shards that lost say so."""
    old = publishers(url, 2, writer="job-1")
    publish_step(old, 0, traj[0])
    new = publishers(url, 2, writer="job-2")
    parts_old, parts_new = split(traj[1], 2), split(traj[2], 2)
    old[0].publish(1, parts_old[0], base=split(traj[0], 2)[0], base_step=0)      # job-1 wins shard 0
    new_base = split(traj[0], 2)
    with pytest.raises(ConflictError, match="writer job-1"):
        new[0].publish(1, parts_new[0], base=new_base[0], base_step=0)
    with pytest.raises(ConflictError, match="different writers"):
        new[1].publish(1, parts_new[1], base=new_base[1], base_step=0)           # job-2 wins shard 1
    with pytest.raises(ConflictError, match="writer job-2"):
        old[1].publish(1, parts_old[1])
    assert Follower(url, tmp_path / "f").sync()[-1].step == 0                      # step 1 never appears


def test_republishing_is_idempotent(url, tmp_path, traj):
    pubs = publishers(url, 2)
    publish_step(pubs, 0, traj[0])
    first = publish_step(pubs, 1, traj[1])
    again = publish_step(publishers(url, 2), 1, traj[1])     # e.g. a rank restarted after it had published
    assert [r.delta for r in again] == [r.delta for r in first]
    assert all(r.commit.committed and not r.commit.made_manifest and r.encode_seconds == 0 for r in again)
    Follower(url, tmp_path / "f").sync()
    assert_folder(tmp_path / "f", traj[1])


def test_head_never_moves_backwards(url, tmp_path, traj):
    (pub,) = publishers(url, 1)
    pub.publish(0, traj[0])
    pub.publish(2, traj[2])
    res = Publisher(url, effort="fast").publish(1, traj[1], base=traj[0], base_step=0)
    assert res.commit.committed and res.commit.head == 2
    assert Follower(url, tmp_path / "unused").head().step == 2


def test_inconsistent_shards_cannot_commit(url, traj):
    pubs = publishers(url, 2)
    publish_step(pubs, 0, traj[0])
    parts = split(traj[1], 2)
    pubs[0].publish(1, parts[0], keyframe=False)
    p1 = Publisher(url, shard=1, num_shards=2, effort="fast", remember=False)
    with pytest.raises(ConflictError, match="cannot be committed"):
        p1.publish(1, parts[1])                 # no base: a keyframe only, while shard 0 has only a delta
    with pytest.raises(ConflictError, match="published by shards"):
        dup = Publisher(url, shard=1, num_shards=2, effort="fast")
        Publisher(url, shard=0, num_shards=2, effort="fast").publish(3, parts[0])
        dup.publish(3, parts[0])                # the same tensors from two shards


# ------------------------------------------------------------------------------------ resumption

class CrashingMemFS(MemoryFileSystem):
    """memory:// whose range reads stop the process (a BaseException, like a kill) after N requests."""

    protocol = ("memory",)
    budget = None
    requests = 0

    def cat_ranges(self, paths, starts, ends, max_gap=None, on_error="return", **kw):
        out = []
        for p, s, e in zip(paths, starts, ends):
            if CrashingMemFS.budget is not None:
                if CrashingMemFS.budget <= 0:
                    raise KeyboardInterrupt("simulated crash")
                CrashingMemFS.budget -= 1
            CrashingMemFS.requests += 1
            out.append(self.cat_file(p, s, e))
        return out


def test_interrupted_download_resumes_without_refetching(memory_url, tmp_path, traj):
    pubs = publishers(memory_url, 2)
    publish_step(pubs, 0, traj[0])
    into, control = tmp_path / "f", tmp_path / "control"
    Follower(memory_url, into).sync()
    Follower(memory_url, control).sync()
    publish_step(pubs, 1, traj[1])
    publish_step(pubs, 2, traj[2])
    fs = CrashingMemFS()
    CrashingMemFS.budget, CrashingMemFS.requests = None, 0
    per_step = [u.requests for u in Follower(memory_url, control, fs=fs, chunk_size=512).sync()]
    assert len(per_step) == 2 and per_step[1] > 4
    CrashingMemFS.budget, CrashingMemFS.requests = per_step[0] + per_step[1] // 2, 0   # dies inside step 2
    fol = Follower(memory_url, into, fs=fs, chunk_size=512, concurrency=2)
    with pytest.raises(KeyboardInterrupt):
        fol.sync()
    assert fol.step == 1                        # the folder is a complete, verified step
    assert_folder(into, traj[1])
    before = CrashingMemFS.requests - per_step[0]
    CrashingMemFS.budget, CrashingMemFS.requests = None, 0
    (upd,) = Follower(memory_url, into, fs=fs, chunk_size=512).sync()
    assert upd.step == 2 and upd.reused_bytes > 0
    # what was fetched before the crash is not fetched again (but the batch in flight is lost)
    assert upd.requests <= per_step[1] - before + 2 and upd.requests < per_step[1]
    assert_folder(into, traj[2])
    assert not os.listdir(tmp_path / ".arcfmt-spool-f")


# ------------------------------------------------------------------------------------ bad streams

@pytest.fixture
def local_stream(tmp_path, traj):
    url = str(tmp_path / "stream")
    pubs = publishers(url, 2)
    publish_step(pubs, 0, traj[0])
    fol = Follower(url, tmp_path / "f", missing_wait=0)   # a missing object is damage here, not lag
    fol.sync()
    res = publish_step(pubs, 1, traj[1])
    return url, fol, res


def _flip(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x40]))


@pytest.mark.parametrize("damage,err", [
    ("record", ChecksumError), ("tail", ChecksumError), ("missing", MissingError), ("manifest", ChecksumError),
    ("head", CorruptError), ("truncated", (TruncatedError, ChecksumError)),
])
def test_damaged_stream_fails_and_keeps_the_folder(local_stream, damage, err, traj):
    url, fol, res = local_stream
    obj = os.path.join(url, res[0].delta.name)
    if damage == "record":
        _flip(obj, 72)                          # inside the first TENS record's payload
    elif damage == "tail":
        _flip(obj, res[0].delta.index_offset + 20)
    elif damage == "missing":
        os.unlink(obj)
    elif damage == "manifest":
        p = os.path.join(url, N.manifest_name(1))
        data = open(p, "rb").read().replace(b'"tensors":', b'"tensors": ', 1)
        open(p, "wb").write(data)
    elif damage == "head":
        open(os.path.join(url, N.HEAD), "wb").write(b'{"format":"arcfmt-stream-head"}')
    elif damage == "truncated":
        with open(obj, "r+b") as f:
            f.truncate(res[0].delta.size - 10)
    with pytest.raises(err):
        fol.sync()
    assert fol.step == 0
    assert_folder(fol.into, traj[0])
    assert not [n for n in os.listdir(os.path.dirname(fol.into)) if n.startswith(".arcfmt-tmp-")]


def test_wrong_local_base_is_refused(local_stream, traj):
    url, fol, _ = local_stream
    victim = sorted(os.listdir(fol.into))
    st = folder_tensors(fol.into)
    name = "model.layers.0.mlp.up_proj.weight"
    changed = {k: np.array(v) for k, v in st.items()}
    changed[name] = next_step({name: changed[name]}, np.random.default_rng(1))[name]
    # rewrite the folder's shard holding the tensor with one value off (a corrupted local copy)
    idx = json.load(open(os.path.join(fol.into, "model.safetensors.index.json")))
    fname = idx["weight_map"][name]
    write_file(os.path.join(fol.into, fname), {k: changed[k] for k, f in idx["weight_map"].items() if f == fname},
               {"format": "pt"})
    with pytest.raises(WrongBaseError):
        fol.sync()
    assert sorted(os.listdir(fol.into)) == victim and fol.step == 0


def test_folder_checks(tmp_path, memory_url, traj):
    (pub,) = publishers(memory_url, 1)
    pub.publish(0, traj[0])
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    with pytest.raises(InputError, match="not empty"):
        Follower(memory_url, busy).sync()
    fol = Follower(memory_url, tmp_path / "f")
    other = Follower(memory_url, tmp_path / "f")
    gen = fol.follow(interval=0.01, timeout=0)
    next(gen)                                   # holds the folder's lock while the caller works
    with pytest.raises(InputError, match="another follower"):
        other.sync()
    gen.close()
    (tmp_path / "f" / STATE_NAME).write_bytes(b"{}")
    with pytest.raises(InputError, match="not a valid follower state"):
        other.sync()


# ------------------------------------------------------------------------------------ command line

@pytest.mark.slow  # about 8 s: a trajectory through the command
def test_cli_publish_and_follow(tmp_path, traj):
    run_cli_trajectory(str(tmp_path / "stream"), tmp_path, traj)
    p = arcfmt("follow", tmp_path / "stream", "--into", tmp_path / "full", "--once", rc=0)
    assert "is at step 2 (head 2)" in p.stdout


def test_cli_errors(tmp_path, traj):
    f = tmp_path / "step0000.safetensors"
    write_file(f, traj[0])
    url = tmp_path / "stream"
    assert "RANK/COUNT" in arcfmt("publish", url, f, "--shard", "3", rc=2).stderr
    assert "--step" in arcfmt("publish", url, tmp_path / "x.safetensors", rc=2).stderr
    arcfmt("publish", url, f, rc=0)
    g = tmp_path / "other.safetensors"
    write_file(g, traj[1])
    p = arcfmt("publish", url, g, "--step", "0", rc=1)
    assert p.stderr.startswith("arcfmt: error (conflict):") and len(p.stderr.strip().splitlines()) == 1
    p = arcfmt("follow", url, "--into", tmp_path / "f", "--once", "--until", "3", rc=2)
    p = arcfmt("follow", tmp_path / "empty-stream", "--into", tmp_path / "g", "--once", rc=1)
    assert "no stream at" in p.stderr
    p = arcfmt("follow", "s3://bucket/../x", "--into", tmp_path / "g", "--once", rc=1)
    assert "arcfmt: error (input)" in p.stderr


@pytest.mark.parametrize("tensors", [None, [MLP]])
def test_memory_budget_rebuilds_group_by_group(url, tmp_path, traj, tensors):
    """With a tiny budget every shard is fetched and rebuilt a few tensors at a time (keyframe and deltas)."""
    pubs = publishers(url, 2)
    small = Follower(url, tmp_path / "small", tensors=tensors, memory_budget=20_000)
    big = Follower(url, tmp_path / "big", tensors=tensors)
    for s in range(3):
        publish_step(pubs, s, traj[s])
        (a,), (b,) = small.sync(), big.sync()
        assert_folder(small.into, traj[s], None if tensors is None else mlp_names(traj[s]))
        assert sorted(a.changed) == sorted(b.changed)
        assert a.requests >= b.requests
        assert a.bytes_downloaded <= 1.05 * (a.bytes_needed + a.tail_bytes), a.as_dict()


def test_memory_budget_holds_with_inline_blocks(tmp_path, monkeypatch):
    """Tensors whose TENS records carry their blocks (SPEC.md §7, 1.6): the follower fetches and checks
    the TENS records a group at a time, and reads the inline blocks again with their group, so the bytes
    it holds stay within the budget (an adversary review: all TENS records at once held 4.1 MB against a
    200 KB budget)."""
    from arcfmt.store import ranges

    rng = np.random.default_rng(0)
    model = {f"t{i:04d}": rng.standard_normal(4000).astype(np.float32) for i in range(120)}   # 16 KB each
    url = str(tmp_path / "stream")
    Publisher(url, effort="fast").publish(0, model)
    peak = [0]
    add = ranges.ObjectSource.add

    def counted(self, start, data):
        add(self, start, data)
        peak[0] = max(peak[0], sum(e - s for s, e, _ in self._chunks))
    monkeypatch.setattr(ranges.ObjectSource, "add", counted)
    fol = Follower(url, tmp_path / "f", memory_budget=100_000)
    fol.sync()
    assert_folder(fol.into, model)
    assert peak[0] <= 100_000 + (1 << 16), peak[0]   # a group may end on one tensor past the budget


def test_folder_off_the_chain_restarts_from_an_older_keyframe(tmp_path, traj):
    """A folder at a step the head's chain does not contain (the stream was rewritten) takes a keyframe,
    even one further back than its own step."""
    url = str(tmp_path / "stream")
    (pub,) = publishers(url, 1, keyframe_every=0)
    for s in range(3):
        pub.publish(s, traj[s])
    fol = Follower(url, tmp_path / "f")
    fol.sync()
    st = json.loads((tmp_path / "f" / "arcfmt-stream.json").read_text())
    st["manifest"] = "0" * 32                   # as if the folder followed another stream to step 2
    (tmp_path / "f" / "arcfmt-stream.json").write_text(json.dumps(st))
    pub.publish(3, traj[3])
    assert [(m.step, k) for m, k in fol.plan()] == [(0, "keyframe"), (1, "delta"), (2, "delta"), (3, "delta")]
    fol.sync()
    assert_folder(fol.into, traj[3])


def test_every_reader_refuses_an_object_under_another_steps_name(tmp_path, traj):
    """SPEC.md S2 "Own name": a manifest stored under step 1's name but describing step 7 (its head
    and chain hashes repaired) is `corrupt` to the follower, the mirror and the pruner alike — one
    check (``objects.check_own_name``), the one the conformance vectors exercise."""
    from arcfmt.store.mirror import Mirror
    from arcfmt.store.objects import canonical, digest128
    from arcfmt.store.prune import prune

    url = str(tmp_path / "s")
    pub = Publisher(url, shard=0, num_shards=1)
    pub.publish(0, traj[0])
    pub.publish(1, traj[1])
    root = tmp_path / "s"
    mpath = root / N.manifest_name(1)
    m = json.loads(mpath.read_bytes().replace(N.step_dir(1).encode(), N.step_dir(7).encode()))
    m["step"] = 7   # a whole, valid manifest of step 7 (its objects' names say so too)
    new = canonical(m)
    mpath.write_bytes(new)
    hpath = root / N.HEAD
    h = json.loads(hpath.read_bytes())
    h["manifest"] = digest128(new)
    hpath.write_bytes(canonical(h))
    with pytest.raises(CorruptError, match="the object describes"):
        Follower(url, into=tmp_path / "f").sync()
    with pytest.raises(CorruptError, match="the object describes"):
        Mirror(url, str(tmp_path / "m")).sync()
    with pytest.raises(CorruptError, match=r"\(nothing pruned\): the object describes"):
        prune(url, keep_last=1)
    assert (root / N.manifest_name(0)).exists()   # nothing pruned


def test_a_step_never_replaces_a_file_the_follower_did_not_write(url, tmp_path, traj):
    """The manifest names each shard's file: a step whose file name is one the user keeps in the folder
    (and no step this follower applied wrote) is refused, and the user's file and the folder stay."""
    (pub,) = publishers(url, 1, keyframe_every=100)
    pub.publish(0, traj[0])
    fol = Follower(url, tmp_path / "f")
    fol.sync()
    mine = tmp_path / "f" / "adapter.safetensors"
    mine.write_bytes(b"MY OWN ADAPTER WEIGHTS")
    pub.publish(1, traj[1], keyframe=True, file_name="adapter.safetensors")
    with pytest.raises(InputError, match="adapter.safetensors"):
        fol.sync()
    assert mine.read_bytes() == b"MY OWN ADAPTER WEIGHTS" and fol.step == 0
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".arcfmt-tmp-")]


def test_publish_warns_when_the_head_stays_ahead_of_the_step(tmp_path):
    """A head at a later step than the one just committed (another run's, or forged): the step commits
    but followers cannot see it; the command says so on one warning line (and exits 0)."""
    from support.cli import run
    rng = np.random.default_rng(0)
    for s in range(3):
        write_file(tmp_path / f"c{s}.safetensors", {"w": rng.standard_normal(256).astype(np.float32)})
    url = tmp_path / "st"
    for s in range(2):
        assert run("publish", url, "--step", s, "--shard", "0/1", tmp_path / f"c{s}.safetensors").returncode == 0
    head = json.loads((url / "head.json").read_text())
    head["step"] = 100
    (url / "head.json").write_text(json.dumps(head))
    p = run("publish", url, "--step", 2, "--shard", "0/1", tmp_path / "c2.safetensors")
    assert p.returncode == 0 and "head at step 100" in p.stdout
    warn = [x for x in p.stderr.splitlines() if x.startswith("arcfmt: warning:")]
    assert len(warn) == 1 and "stays at step 100, ahead of step 2" in warn[0], p.stderr


def test_a_full_index_publisher_for_fleets_not_yet_upgraded(tmp_path, traj):
    """``compact_index=False`` (``publish --full-index``): data objects whose header leaves COMPACT_INDEX
    clear (SPEC.md §4, §10; what a 1.4 follower reads), followed like any other."""
    url = str(tmp_path / "stream")
    (pub,) = publishers(url, 1, compact_index=False)
    for step in (0, 1):
        res = pub.publish(step, traj[step])
        for obj in (res.delta, res.keyframe):
            if obj is not None:
                with open(os.path.join(url, obj.name), "rb") as f:
                    head = f.read(16)
                assert int.from_bytes(head[12:16], "little") == 0
    Follower(url, tmp_path / "f").sync()
    assert_folder(tmp_path / "f", traj[1])
