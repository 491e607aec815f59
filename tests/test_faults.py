"""Faults against the real local servers (SeaweedFS, moto) and a local folder (issue 6, "Faults").

- publishers SIGKILLed at every request of a step (before it reaches the server, or after the server
  acted on it) and before/after every fsync, link, rename and read (local folder): no follower ever
  sees half a step, and a restarted publisher completes the step or cleanly replaces it; killed while
  saving its ``--state``, it can go on with the next step;
- followers SIGKILLed while fetching, writing and swapping: the folder is always one whole, verified
  step, and a restarted follower does not fetch again what it had finished;
- corrupted, truncated, missing objects, manifests, heads, descriptors, bytes corrupted on the wire and
  in the resumption spool: detected, reported with a typed error or refetched, never applied;
- two ``arcfmt publish`` processes racing for one step: exactly one wins, the other exits 1 ``(conflict)``;
- connection resets, 5xx answers and slow answers from a fault-injecting proxy: retried with bounded
  backoff; persistent or permanent errors end in ``TransportError`` after a bounded number of attempts.

Processes are forked from a pre-imported zygote (tests/support/faults.py) so that each kill costs
milliseconds, not an interpreter start. ``apply --in-place`` under SIGKILL is covered by
tests/test_checkpoint.py; the follower's folder swap, which uses the same exchange, is covered here.
"""
from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from arcfmt.errors import ChecksumError, CorruptError, TruncatedError
from arcfmt.reader import DeltaReader
from arcfmt.records import BlockRef
from arcfmt.safetensors_io import write_file
from arcfmt.store import (
    ConflictError,
    Follower,
    MissingError,
    Publisher,
    TransportError,
)
from arcfmt.store import names as N
from arcfmt.store.follower import STATE_NAME
from arcfmt.store.objects import Head, canonical
from support.faults import FaultProxy, act, s3_fs, s3_options
from support.store import Remote, _unique, assert_folder, kinds, split, trajectory

SHARDS = 2
CHUNK = 512            # small range requests: a step of the test model takes a dozen of them


@pytest.fixture(scope="module")
def traj():
    return trajectory(steps=64, seed=21)


@pytest.fixture(scope="module")
def other():
    """Another trainer's weights for the same model (a restarted trainer that computed other values)."""
    return trajectory(steps=64, seed=99)


class Stream:
    """A fresh stream: on a real server (``url`` + storage options, ``fs`` to damage objects directly)
    or in a local folder."""

    def __init__(self, kind, request, tmp_path):
        self.kind = kind
        if kind == "local":
            import fsspec

            self.server = None
            self.url = str(tmp_path / "stream")
            self.so = {}
            self.fs = fsspec.filesystem("file")
            self.root = self.url
        else:
            self.server = request.getfixturevalue(f"{kind}_server")
            remote = Remote(self.server, _unique(request))
            self.url, self.so = remote.url, remote.storage_options
            self.fs = s3_fs(self.so)
            self.root = self.url[len("s3://"):]
        self.remote = kind != "local"

    def path(self, name: str) -> str:
        return f"{self.root}/{name}"

    def read(self, name: str) -> bytes:
        return self.fs.cat_file(self.path(name))

    def write(self, name: str, data: bytes) -> None:
        self.fs.pipe_file(self.path(name), data)
        self.fs.invalidate_cache()

    def remove(self, name: str) -> None:
        self.fs.rm(self.path(name))
        self.fs.invalidate_cache()

    def exists(self, name: str) -> bool:
        self.fs.invalidate_cache()
        return self.fs.exists(self.path(name))


class Checkpoints:
    """Trainer shard files ``DIR/step{s}/model-0000{i+1}-of-00002.safetensors`` written on demand."""

    def __init__(self, root, steps):
        self.root = root
        self.steps = steps

    def parts(self, s):
        return split(self.steps[s], SHARDS)

    def path(self, s, i) -> str:
        p = self.root / f"step{s:04d}" / f"model-{i + 1:05d}-of-{SHARDS:05d}.safetensors"
        if not p.exists():
            p.parent.mkdir(parents=True, exist_ok=True)
            write_file(p, self.parts(s)[i], {"format": "pt"})
        return str(p)


def spread(lo: int, hi: int, n: int) -> list:
    """About ``n`` integers spread evenly over ``[lo, hi]`` (all of them if there are fewer)."""
    if hi - lo + 1 <= n:
        return list(range(lo, hi + 1))
    return sorted({round(lo + i * (hi - lo) / (n - 1)) for i in range(n)})


def leftovers(into) -> list:
    parent = os.path.dirname(os.fspath(into))
    return [n for n in os.listdir(parent) if n.startswith((".arcfmt-tmp-", ".arcfmt-old-"))]


def folder_step(into) -> int:
    with open(os.path.join(into, STATE_NAME)) as f:
        return json.load(f)["step"]


def spooled(into, step: int) -> tuple[int, int]:
    """(chunks, bytes) in a follower's resumption spool for objects of ``step``."""
    d = os.path.join(os.path.dirname(os.fspath(into)), f".arcfmt-spool-{os.path.basename(os.fspath(into))}")
    if not os.path.isdir(d):
        return 0, 0
    tag = f"{N.STEPS}__{step:020d}__"
    files = [n for n in os.listdir(d) if n.startswith(tag)]
    return len(files), sum(os.path.getsize(os.path.join(d, n)) for n in files)


class Victim:
    """The job a proxy rule kills: set once forked; the rule waits for it."""

    def __init__(self):
        self.job = None
        self.ready = threading.Event()

    def set(self, job):
        self.job = job
        self.ready.set()

    def kill(self, _req=None):
        assert self.ready.wait(30), "the job was never started"
        self.job.kill()
        deadline = time.monotonic() + 10        # let it die before the connection is reset
        while time.monotonic() < deadline:
            try:
                with open(f"/proc/{self.job.pid}/stat") as f:
                    if f.read().split(") ", 1)[1][0] in "ZX":
                        return
            except FileNotFoundError:
                return
            time.sleep(0.001)


# ================================================================================= killed publishers

@pytest.mark.kill
@pytest.mark.parametrize("kind", kinds("seaweedfs", "moto", "local"))
def test_killed_publisher_never_exposes_a_half_step(kind, request, tmp_path, zygote, make_proxy, traj, other):
    """Shard 1 has published step s; shard 0 (the last, so the committer) is SIGKILLed at one point of
    its publish: at each of its requests, before the server sees it or after the server acted on it
    (S3), or before and after each of its fsync/link/rename/replace/unlink calls and reads (local
    folder). A follower then sees step s-1, or all of step s, bit for bit. A restarted shard 0
    completes the step; every third time (and at the first kill points) it tries to publish *other*
    weights instead: it wins if the killed run had not claimed the shard, else it gets ``conflict``
    and the step is what the killed run published — never a mix."""
    st = Stream(kind, request, tmp_path)
    ck, alt = Checkpoints(tmp_path / "ckpt", traj), Checkpoints(tmp_path / "alt", other)
    state = [str(tmp_path / f"state{i}") for i in range(SHARDS)]

    def publisher(i):
        return Publisher(st.url, shard=i, num_shards=SHARDS, storage_options=st.so, state_dir=state[i],
                         writer="job-1", effort="fast", keyframe_every=0, workers=1)

    proxy = make_proxy(st.server) if st.remote else None
    child_so = s3_options(proxy.endpoint) if st.remote else {}
    fol = Follower(st.url, tmp_path / "f", storage_options=st.so)
    want = {0: traj[0]}
    for i in range(SHARDS):
        publisher(i).publish(0, ck.path(0, i))
    fol.sync()

    def child_publish(s, kill_at=None):
        return zygote.spawn("publish", url=st.url, so=child_so, shard=0, num_shards=SHARDS, step=s,
                            path=ck.path(s, 0), state_dir=state[0], writer="job-1", kill_at=kill_at,
                            keyframe_every=0, tmp_dir=str(tmp_path))

    # step 1 without a fault: how many requests / kill points a publish of shard 0 has
    publisher(1).publish(1, ck.path(1, 1))
    if proxy:
        proxy.reset_log()
    job = child_publish(1)
    res = job.result()
    assert job.rc == 0 and res["ok"] and res["result"]["committed"], (res, job.log_text())
    want[1] = traj[1]
    if proxy:
        n_req = proxy.count()
        assert n_req >= 8, proxy.requests               # claim, manifest, head, reads...
        plan = [(k, mode) for k in range(1, n_req + 1)
                for mode in (("before", "after") if kind == "seaweedfs" else ("after",))]
    else:
        plan = [(p, "point") for p in range(1, res["result"]["points"] + 1)]

    outcomes = {"before-head": 0, "after-head": 0, "replaced": 0, "conflict": 0}
    for j, (k, mode) in enumerate(plan):
        s = j + 2
        parts = ck.parts(s)
        publisher(1).publish(s, ck.path(s, 1))
        victim = Victim()
        if proxy:
            proxy.reset_log()
            proxy.rule = (lambda r, k=k, mode=mode, v=victim:
                          None if r.n != k else act("reset", before=v.kill) if mode == "before"
                          else act("reset-after", after=v.kill))
            job = child_publish(s)
        else:
            job = child_publish(s, kill_at=k)
        victim.set(job)
        rc = job.wait()
        if proxy:
            proxy.rule = None
        assert rc == -signal.SIGKILL, (k, mode, rc, job.result(), job.log_text())

        # what a follower sees now: the old step, or all of the new one
        head = fol.head().step
        assert head in (s - 1, s), (k, mode, head)
        fol.sync()
        assert fol.step == head
        if head == s:
            want[s] = traj[s]
        assert_folder(fol.into, want[head])
        outcomes["after-head" if head == s else "before-head"] += 1

        # the restarted rank: the same weights, or other ones
        claimed = st.exists(N.descriptor_name(s, 0, SHARDS))
        if j % 3 == 2 or k <= 3:
            mine = {**split(other[s], SHARDS)[0], **parts[1]}
            try:
                r = publisher(0).publish(s, alt.path(s, 0))
                assert not claimed, (k, mode, "a claimed shard was taken over")
                want[s] = mine
                outcomes["replaced"] += 1
            except ConflictError as exc:
                assert claimed and "already published" in str(exc), (k, mode, exc)
                outcomes["conflict"] += 1
                r = publisher(0).publish(s, ck.path(s, 0))     # what it had published: finishes the commit
                want[s] = traj[s]
        else:
            r = publisher(0).publish(s, ck.path(s, 0))
            want[s] = traj[s]
        assert r.commit.committed and r.commit.head == s, (k, mode, r.commit)
        fol.sync()
        assert fol.step == s
        assert_folder(fol.into, want[s])
    assert all(outcomes.values()), outcomes
    # a new follower walks the whole chain from the only keyframe and ends bit-exact
    late = Follower(st.url, tmp_path / "late", storage_options=st.so)
    late.sync()
    assert late.step == len(plan) + 1
    assert_folder(late.into, want[late.step])


@pytest.mark.kill
@pytest.mark.parametrize("kind", kinds("seaweedfs", "local"))
def test_publisher_killed_while_saving_its_state_can_move_on(kind, request, tmp_path, zygote, traj):
    """``--state`` is saved after the commit. A one-shard publisher SIGKILLed anywhere in that save
    (its step is already committed) and restarted with the *next* step — a trainer that saw its step
    go out and moved on — publishes a delta that applies: followers reach the new step bit-exact. (A
    state whose step and tensors disagreed once made every follower fail with ``wrong_base``. With
    several shards such a rank gets ``conflict`` instead — deltas from different bases — and
    republishing its step, as the other tests do, is the way on.)"""
    st = Stream(kind, request, tmp_path)
    state = str(tmp_path / "state")
    files = {}

    def path(s):
        if s not in files:
            files[s] = str(tmp_path / f"step{s:04d}" / "model.safetensors")
            os.makedirs(os.path.dirname(files[s]))
            write_file(files[s], traj[s], {"format": "pt"})
        return files[s]

    def publisher():
        return Publisher(st.url, storage_options=st.so, state_dir=state, effort="fast", keyframe_every=0, workers=1)

    def child(s, kill_at=None):
        return zygote.spawn("publish", url=st.url, so=st.so, shard=0, num_shards=1, step=s, path=path(s),
                            state_dir=state, kill_at=kill_at, keyframe_every=0, tmp_dir=str(tmp_path))

    fol = Follower(st.url, tmp_path / "f", storage_options=st.so)
    publisher().publish(0, path(0))
    fol.sync()
    job = child(1)
    res = job.result()
    assert job.rc == 0 and res["ok"], (res, job.log_text())
    names = res["result"]["names"]
    replaces = [i for i, n in enumerate(names) if n == "os.replace:before"]
    points = range(replaces[-2] + 1, len(names) + 1)      # from the save of the state's tensors on
    assert len(points) >= 4, names
    s = 1
    for k in points:
        s += 1
        job = child(s, kill_at=k)
        assert job.wait() == -signal.SIGKILL, (k, job.result(), job.log_text())
        assert fol.head().step == s                        # killed after its commit
        s += 1                                             # the trainer moves on
        r = publisher().publish(s, path(s))
        assert r.commit.committed and r.commit.head == s
        fol.sync()
        assert fol.step == s, k
        assert_folder(fol.into, traj[s])


# ================================================================================= killed followers

EXCHANGE = "arcfmt.staging.exchange_dirs"
REMOVE_OLD = "arcfmt.staging._remove_tree"


def follower_points(names, local) -> list:
    """Kill points of a follower's step, as ``[label, occurrence]`` (their numbers vary with the number of
    chunks, their labels do not): spool writes while fetching, the fsyncs of the new files, state and
    staging folder, the folder exchange, the removal of the old folder, the parent's fsync, the spool
    clean-up; for a local store also its reads."""
    fsyncs = [i for i, n in enumerate(names) if n == "os.fsync:after"]
    forget = names[fsyncs[-1]:].index("os.unlink:before") + fsyncs[-1]
    pts = [["os.replace:after", 1], ["os.replace:before", 3], ["os.replace:after", 5],
           ["os.fsync:before", 1], ["os.fsync:after", 2], ["os.fsync:after", 4], ["os.fsync:after", 5],
           [EXCHANGE + ":before", 1], [EXCHANGE + ":after", 1], [REMOVE_OLD + ":before", 1],
           [REMOVE_OLD + ":after", 1], ["os.fsync:after", 6],
           ["os.unlink:before", names[:forget + 1].count("os.unlink:before")]]
    if local:
        pts += [["LocalFileSystem.cat_file:after", 1], ["LocalFileSystem.cat_ranges:before", 1],
                ["LocalFileSystem.cat_ranges:after", 2], ["LocalFileSystem.cat_ranges:before", 4]]
    for label, n in pts:
        assert names.count(label) >= n, (label, n, names)
    return pts


@pytest.mark.kill
@pytest.mark.parametrize("kind", kinds("seaweedfs", "local"))
def test_killed_follower_keeps_a_whole_step_and_resumes(kind, request, tmp_path, zygote, make_proxy, traj):
    """A follower applying step s is SIGKILLed at one point: at one of its range requests (S3, through
    the proxy), or before/after one of its spool writes, fsyncs, the folder exchange, the removal of
    the old folder, the spool clean-up, a local read (see ``follower_points``). Its folder is then
    step s-1 or step s, whole and bit-exact. Restarted, it takes every chunk it had finished from its
    spool: it sends exactly the requests a fresh follower sends minus the spooled chunks, and
    downloads exactly the bytes minus the spooled bytes."""
    st = Stream(kind, request, tmp_path)
    ck = Checkpoints(tmp_path / "ckpt", traj)
    pubs = [Publisher(st.url, shard=i, num_shards=SHARDS, storage_options=st.so, effort="fast", keyframe_every=4)
            for i in range(SHARDS)]

    def publish(s):
        for i, p in enumerate(pubs):
            p.publish(s, ck.path(s, i))

    proxy = make_proxy(st.server) if st.remote else None
    child_so = s3_options(proxy.endpoint) if st.remote else {}
    into = tmp_path / "f"

    def follower(name):
        return Follower(st.url, tmp_path / name, storage_options=st.so, chunk_size=CHUNK, concurrency=2)

    control = follower("control")
    publish(0)
    control.sync()
    follower("f").sync()
    # private weights: the folder and its files keep their modes through every swap and every kill
    os.chmod(into, 0o700)
    for n in os.listdir(into):
        os.chmod(into / n, 0o600)

    def child(kill_at=None):
        return zygote.spawn("follow", url=st.url, so=child_so, into=str(into), chunk_size=CHUNK, concurrency=2,
                            kill_at=kill_at)

    # steps 1 and 2 without a fault (step 1, from the demo pair, is bigger than the later ones): the
    # requests and kill points of one step; the forked follower fetches what the control does
    for s in (1, 2):
        publish(s)
        (c1,) = control.sync()
        if proxy:
            proxy.reset_log()
        job = child()
        res = job.result()
        assert job.rc == 0 and res["ok"], (res, job.log_text())
        (u1,) = res["result"]["updates"]
        assert u1["requests"] == c1.requests >= 6 and u1["bytes_downloaded"] == c1.bytes_downloaded
    plan = [("point", p) for p in follower_points(res["result"]["names"], local=not proxy)]
    if proxy:
        plan += [("request", k) for k in spread(1, proxy.count() - 3, 6)]   # a step may have a few fewer

    seen = {"old": 0, "new": 0, "resumed": 0}
    for j, (how, k) in enumerate(plan):
        s = j + 3
        publish(s)
        (ctl,) = control.sync()
        victim = Victim()
        if how == "request":
            proxy.reset_log()
            proxy.rule = lambda r, k=k, v=victim: act("reset", before=v.kill) if r.n == k else None
            job = child()
        else:
            job = child(kill_at=k)
        victim.set(job)
        rc = job.wait()
        if proxy:
            proxy.rule = None
        assert rc == -signal.SIGKILL, (how, k, rc, job.result(), job.log_text())

        # the folder, as an inference engine would read it right now
        at = folder_step(into)
        assert at in (s - 1, s), (how, k, at)
        assert_folder(into, traj[at])
        seen["new" if at == s else "old"] += 1
        chunks, nbytes = spooled(into, s)

        ups = follower("f").sync()
        if at == s:
            assert ups == []
        else:
            (u,) = ups
            assert u.step == s and u.reused_bytes == nbytes, (how, k, u.as_dict(), chunks, nbytes)
            assert u.requests == ctl.requests - chunks, (how, k, u.requests, ctl.requests, chunks)
            assert u.bytes_downloaded == ctl.bytes_downloaded - nbytes
            seen["resumed"] += chunks > 0
        assert folder_step(into) == s
        assert_folder(into, traj[s])
        assert not leftovers(into), leftovers(into)
        assert stat.S_IMODE(os.stat(into).st_mode) == 0o700, (how, k)
        assert {stat.S_IMODE(os.stat(into / n).st_mode) for n in os.listdir(into)} == {0o600}, (how, k)
    assert seen["old"] and seen["new"] and seen["resumed"], seen


# ================================================================================= damaged stream

def _largest_block(data: bytes):
    """The largest record holding a block: a BLCK, or a TENS carrying its block (SPEC.md §7)."""
    r = DeltaReader(data)
    recs = [b for e in r.entries.values() for b in e.blocks] + [
        BlockRef(e.tens_offset, e.tens_size, None, e.blocks[0].encoding) for e in r.entries.values()
        if len(e.blocks) == 1 and e.blocks[0].size == 0]
    return max(recs, key=lambda b: b.size)


def _flip(data: bytes, offset: int) -> bytes:
    b = bytearray(data)
    b[offset] ^= 0x10
    return bytes(b)


@pytest.mark.parametrize("kind", kinds("seaweedfs", "local"))
def test_damaged_objects_are_detected_never_applied(kind, request, tmp_path, traj):
    """Step by step, one object of the new step is damaged in the store; the follower refuses the step
    with a typed error and keeps its folder; once the object is repaired the same follower applies the
    step — bytes that failed a check are never reused from its spool."""
    st = Stream(kind, request, tmp_path)
    ck = Checkpoints(tmp_path / "ckpt", traj)
    pubs = [Publisher(st.url, shard=i, num_shards=SHARDS, storage_options=st.so, effort="fast", keyframe_every=0)
            for i in range(SHARDS)]
    fol = Follower(st.url, tmp_path / "f", storage_options=st.so, chunk_size=CHUNK, concurrency=2,
                   missing_wait=0)   # a missing object is damage here, not replication lag
    control = Follower(st.url, tmp_path / "control", storage_options=st.so, chunk_size=CHUNK, concurrency=2)
    step = [-1]

    def publish(keyframe=None):
        s = step[0] = step[0] + 1
        return [p.publish(s, ck.path(s, i), keyframe=keyframe) for i, p in enumerate(pubs)]

    publish()
    fol.sync()
    control.sync()

    def refused(err, repair, who=None):
        who = who or fol
        before = who.step
        with pytest.raises(err):
            who.sync()
        assert who.step == before
        if before is None:
            assert not os.path.exists(who.into)
        else:
            assert_folder(who.into, traj[before])
        assert not leftovers(who.into)
        repair()
        ups = who.sync()
        assert who.step == step[0] and ups[-1].step == step[0]
        assert_folder(who.into, traj[step[0]])
        return ups[-1]

    def damaged(name, data):
        orig = st.read(name)
        st.write(name, data(orig))
        return lambda: st.write(name, orig)

    cases = []

    # a data block: its record checksum fails
    res = publish()
    obj = res[0].delta.name
    blk = _largest_block(st.read(obj))
    refused(ChecksumError, damaged(obj, lambda d: _flip(d, blk.offset + blk.size // 2)))
    control.sync()
    cases.append("block")

    # the index: the tail hash from the manifest fails
    res = publish()
    obj = res[1].delta.name
    refused(ChecksumError, damaged(obj, lambda d: _flip(d, res[1].delta.index_offset + 9)))
    control.sync()
    cases.append("index")

    # truncated object
    res = publish()
    obj = res[0].delta.name
    refused(TruncatedError, damaged(obj, lambda d: d[:-100]))
    control.sync()
    cases.append("truncated")

    # a missing object; the chunks fetched before the error stay spooled, and one of them is then
    # damaged on the follower's disk: it is fetched again, the others are reused
    res = publish()
    obj = res[1].delta.name
    orig = st.read(obj)
    st.remove(obj)
    with pytest.raises(MissingError):
        fol.sync()
    assert_folder(fol.into, traj[step[0] - 1])
    chunks, nbytes = spooled(fol.into, step[0])
    assert chunks >= 1
    spool = tmp_path / ".arcfmt-spool-f"
    victim = min(p for p in spool.iterdir() if p.name.startswith(f"{N.STEPS}__{step[0]:020d}__"))
    vsize = victim.stat().st_size
    victim.write_bytes(_flip(victim.read_bytes(), 3))
    st.write(obj, orig)
    (ctl,) = control.sync()
    (u,) = fol.sync()
    assert u.reused_bytes == nbytes - vsize
    assert u.requests == ctl.requests - (chunks - 1), (u.as_dict(), ctl.requests, chunks)
    assert_folder(fol.into, traj[step[0]])
    cases.append("missing+spool")

    # the manifest: one byte more, and a well-formed manifest of other content
    res = publish()
    mname = N.manifest_name(step[0])
    refused(ChecksumError, damaged(mname, lambda d: d.replace(b'"tensors":', b'"tensors": ', 1)))
    control.sync()
    res = publish()
    mname = N.manifest_name(step[0])
    refused(ChecksumError, damaged(mname, lambda d: canonical(dict(json.loads(d), model_digest="0" * 32))))
    control.sync()
    cases.append("manifest")

    # the head: garbage, and a well-formed head naming a manifest hash that is not the step's
    res = publish()
    refused(CorruptError, damaged(N.HEAD, lambda d: b'{"format":"arcfmt-stream-head"}\n'))
    control.sync()
    res = publish()
    refused(ChecksumError, damaged(N.HEAD, lambda d: Head(step[0], "0" * 32, 0, 0).to_bytes()))
    control.sync()
    cases.append("head")

    # a keyframe, for a new follower: refused, and its folder never created
    res = publish(keyframe=True)
    obj = res[0].keyframe.name
    blk = _largest_block(st.read(obj))
    new = Follower(st.url, tmp_path / "new", storage_options=st.so, chunk_size=CHUNK)
    refused(ChecksumError, damaged(obj, lambda d: _flip(d, blk.offset + blk.size // 2)), who=new)
    fol.sync()
    control.sync()
    cases.append("keyframe")

    # a descriptor, on the trainer side: the committer refuses it and the head stays
    s = step[0] + 1
    pubs[1].publish(s, ck.path(s, 1))
    dname = N.descriptor_name(s, 1, SHARDS)
    repair = damaged(dname, lambda d: d.replace(b'"file":"', b'"file":"../', 1))
    with pytest.raises(CorruptError):
        pubs[0].publish(s, ck.path(s, 0))
    assert fol.head().step == s - 1
    repair()
    assert pubs[0].publish(s, ck.path(s, 0)).commit.head == s     # the retried rank finishes the commit
    step[0] = s
    fol.sync()
    assert_folder(fol.into, traj[s])
    cases.append("descriptor")
    assert len(cases) == 8


@pytest.mark.servers
def test_bytes_corrupted_on_the_wire_are_refused_then_refetched(request, tmp_path, traj):
    """The proxy flips one byte of a range answer (SeaweedFS): the step is refused with ``checksum``;
    the next attempt fetches clean bytes and applies it (the bad chunk is not reused from the spool)."""
    st = Stream("seaweedfs", request, tmp_path)
    ck = Checkpoints(tmp_path / "ckpt", traj)
    pubs = [Publisher(st.url, shard=i, num_shards=SHARDS, storage_options=st.so, effort="fast")
            for i in range(SHARDS)]
    for s in range(2):
        for i, p in enumerate(pubs):
            p.publish(s, ck.path(s, i))
    with FaultProxy(st.server.endpoint) as proxy:
        so = s3_options(proxy.endpoint)
        fol = Follower(st.url, tmp_path / "f", storage_options=so, chunk_size=CHUNK, concurrency=2)
        fol.sync(until=0)
        for target in ("tail", "records"):
            hit = []

            def rule(r, target=target, hit=hit):
                if not r.is_data() or hit:
                    return None
                if (target == "records") == r.range.startswith("bytes=0-"):
                    hit.append(r)
                    return act("corrupt")
                return None

            proxy.rule = rule
            with pytest.raises(ChecksumError):
                fol.sync()
            assert hit and fol.step == 0
            assert_folder(fol.into, traj[0])
            proxy.rule = None
        (u,) = fol.sync()
        assert u.step == 1
        assert_folder(fol.into, traj[1])


# ================================================================================= racing publishers

def _cli(args, env):
    return subprocess.Popen([sys.executable, "-m", "arcfmt", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, **env})


@pytest.mark.parametrize("kind", kinds("seaweedfs", "moto", "local"))
def test_racing_cli_publishers_one_wins(kind, request, tmp_path, traj, other):
    """Two ``arcfmt publish`` processes publish different weights as step 0 of one stream. On S3 the proxy
    holds both claims (the descriptors' conditional PUTs) until both have arrived, so they really reach
    the server together. Exactly one exits 0; the other exits 1 with one ``arcfmt: error (conflict)``
    line; a follower gets the winner's weights. Racing with the *same* weights, both succeed and the
    manifest is written once."""
    st = Stream(kind, request, tmp_path)
    proxy = None
    env = {}
    if st.remote:
        from support import servers

        held, lock = [], threading.Lock()
        barrier = [threading.Barrier(2, timeout=60)]

        def rule(r):
            if r.method == "PUT" and r.path.endswith(".json") and "/shard-" in r.path:
                with lock:
                    hold = len(held) < 2
                    if hold:
                        held.append(r)
                if hold:
                    barrier[0].wait()

        proxy = FaultProxy(st.server.endpoint, rule)
        env = dict(servers.client_env(st.server), AWS_ENDPOINT_URL_S3=proxy.endpoint)
    files = {}
    for who, tr in (("a", traj), ("b", other)):
        files[who] = tmp_path / who / "model.safetensors"
        files[who].parent.mkdir()
        write_file(files[who], tr[0])
    try:
        url = st.url + "-different"
        ps = {who: _cli(["publish", url, files[who], "--step", 0, "--state", tmp_path / f"state-{who}", "--json",
                         "--effort", "fast", "--writer", f"job-{who}"], env) for who in files}
        outs = {who: (p.wait(timeout=120), *p.communicate()) for who, p in ps.items()}
        codes = sorted(rc for rc, _, _ in outs.values())
        assert codes == [0, 1], outs
        winner = next(w for w, (rc, _, _) in outs.items() if rc == 0)
        loser = "b" if winner == "a" else "a"
        err = outs[loser][2].strip().splitlines()
        assert len(err) == 1 and err[0].startswith("arcfmt: error (conflict):"), outs[loser]
        assert json.loads(outs[winner][1])["committed"]
        fol = Follower(url, tmp_path / "f", storage_options=st.so)
        fol.sync()
        assert_folder(fol.into, (traj if winner == "a" else other)[0])
        if st.remote:
            assert len(held) == 2                     # both claims were in flight together

        if kind == "seaweedfs":                       # the same weights: both succeed, one manifest
            held.clear()
            barrier[0] = threading.Barrier(2, timeout=60)
            url = st.url + "-same"
            ps = [_cli(["publish", url, files["a"], "--step", 0, "--json", "--effort", "fast"], env)
                  for _ in range(2)]
            outs = [(p.wait(timeout=120), *p.communicate()) for p in ps]
            assert [rc for rc, _, _ in outs] == [0, 0], outs
            made = [json.loads(o)["made_manifest"] for _, o, _ in outs]
            assert sorted(made) == [False, True], outs
            assert len(held) == 2
    finally:
        if proxy:
            proxy.close()


# ================================================================================= transient errors

def _fault_of(n: int):
    """A rotating schedule: the first attempt of a request gets one of these faults."""
    return [act("status", status=503), act("reset"), act("status", status=500), act("reset-after"),
            act("status", status=503), None, act("reset"), act("status", status=502), act("reset-after"),
            act("status", status=504), act("delay", seconds=0.2), None][n % 12]


@pytest.mark.parametrize("kind", kinds("seaweedfs", "moto"))
def test_transient_errors_are_retried(kind, request, tmp_path, traj):
    """Through the proxy, the first attempt of almost every request fails: 503, 500, a connection reset
    before the server sees it, a reset after the server acted on it (a lost answer to a conditional
    create), or a slow answer. botocore and s3fs are set to one attempt each, so arcfmt's own retries
    do all the work. Three steps are published by two ranks and followed bit-exactly, with retries."""
    st = Stream(kind, request, tmp_path)
    ck = Checkpoints(tmp_path / "ckpt", traj)
    pending, cycles = {}, [0]

    def rule(r):
        """Fault a request (resets twice: aiohttp itself retries a reset pooled connection once), then
        let its next attempt pass, so every retry can succeed."""
        q = pending.get(r.key)
        if not q:
            f = _fault_of(cycles[0])
            cycles[0] += 1
            q = ([f, f] if f and f["do"].startswith("reset") else [f] if f else []) + ["pass"]
        a = q.pop(0)
        pending[r.key] = q
        return None if a == "pass" else a

    with FaultProxy(st.server.endpoint, rule) as proxy:
        so = s3_options(proxy.endpoint)
        pubs = [Publisher(st.url, shard=i, num_shards=SHARDS, fs=s3_fs(so, strict=True), effort="fast",
                          keyframe_every=2) for i in range(SHARDS)]
        for p in pubs:
            p.store.backoff = 0.05
        fol = Follower(st.url, tmp_path / "f", fs=s3_fs(so, strict=True), chunk_size=16384, concurrency=4,
                       backoff=0.05)
        retried = 0
        for s in range(3):
            res = [p.publish(s, ck.path(s, i)) for i, p in enumerate(pubs)]
            assert res[-1].commit.committed and res[-1].commit.head == s
            ups = fol.sync()
            assert ups[-1].step == s
            retried += sum(u.retries for u in ups)
            assert_folder(fol.into, traj[s])
        kinds = {r.action for r in proxy.requests}
        assert {"status", "reset", "reset-after", "delay"} <= kinds, kinds
        assert retried > 0
        assert Follower(st.url, tmp_path / "g", storage_options=st.so).sync()[-1].step == 2


@pytest.mark.servers
def test_slow_answers_time_out_and_are_retried(request, tmp_path, traj):
    """Answers slower than the client's read timeout are abandoned and retried; answers that are only
    slow are waited for."""
    st = Stream("seaweedfs", request, tmp_path)
    ck = Checkpoints(tmp_path / "ckpt", traj)
    pubs = [Publisher(st.url, shard=i, num_shards=SHARDS, storage_options=st.so, effort="fast")
            for i in range(SHARDS)]
    for s in range(2):
        for i, p in enumerate(pubs):
            p.publish(s, ck.path(s, i))
    def rule(r):   # step 1's data: the first answer comes after the client's timeout; the rest: slow
        late = r.attempt == 0 and r.is_data() and f"/{1:020d}/" in r.path
        return act("delay", seconds=1.5 if late else 0.2)

    with FaultProxy(st.server.endpoint, rule) as proxy:
        so = s3_options(proxy.endpoint, read_timeout=0.6)
        fol = Follower(st.url, tmp_path / "f", fs=s3_fs(so, strict=True), chunk_size=1 << 20, backoff=0.05)
        t0 = time.monotonic()
        ups = fol.sync()
        took = time.monotonic() - t0
        assert [u.step for u in ups] == [0, 1]
        assert sum(u.retries for u in ups) >= 2
        assert_folder(fol.into, traj[1])
        assert any(r.attempt == 1 for r in proxy.requests if r.is_data())
        assert took < 30


@pytest.mark.servers
def test_persistent_and_permanent_errors_end_after_bounded_backoff(request, tmp_path, traj):
    """A store that keeps answering 503 is given up after ``retries`` retries with capped, growing,
    jittered delays (``transport``); a 403 is not retried at all; a publisher whose uploads keep failing
    gives up too and the head does not move. The follower's folder is untouched."""
    st = Stream("seaweedfs", request, tmp_path)
    ck = Checkpoints(tmp_path / "ckpt", traj)
    pubs = [Publisher(st.url, shard=i, num_shards=SHARDS, storage_options=st.so, effort="fast")
            for i in range(SHARDS)]
    for s in range(2):
        for i, p in enumerate(pubs):
            p.publish(s, ck.path(s, i))
    base = Follower(st.url, tmp_path / "f", storage_options=st.so)
    base.sync(until=0)
    with FaultProxy(st.server.endpoint) as proxy:
        so = s3_options(proxy.endpoint)
        for status, retries, attempts in ((503, 3, 4), (403, 3, 1)):
            proxy.rule = lambda r, status=status: act("status", status=status) if r.is_data() else None
            proxy.reset_log()
            fol = Follower(st.url, tmp_path / "f", fs=s3_fs(so, strict=True), retries=retries, backoff=0.1)
            t0 = time.monotonic()
            with pytest.raises(TransportError, match="after 3 retries" if status == 503 else "PermissionError"):
                fol.sync()
            took = time.monotonic() - t0
            assert fol.step == 0
            assert_folder(fol.into, traj[0])
            per_key = {}
            for r in proxy.requests:
                if r.is_data():
                    per_key.setdefault(r.key, []).append(r.t)
            assert per_key and all(len(ts) == attempts for ts in per_key.values()), per_key
            if status == 503:
                ts = next(iter(per_key.values()))
                gaps = np.diff(ts)
                for i, g in enumerate(gaps):                 # full jitter in [d/2, d], d = 0.1 * 2^i
                    d = 0.1 * 2 ** i
                    assert d / 2 - 0.02 <= g <= d + 0.5, gaps
                assert took < 5
        # a publisher whose uploads always fail
        proxy.rule = lambda r: act("status", status=500) if r.method == "PUT" else None
        proxy.reset_log()
        p = Publisher(st.url, shard=0, num_shards=SHARDS, fs=s3_fs(so, strict=True), effort="fast", retries=2)
        p.store.backoff = 0.05
        with pytest.raises(TransportError, match="after 2 retries"):
            p.publish(2, ck.path(2, 0), base=ck.path(1, 0), base_step=1)
        puts = [r for r in proxy.requests if r.method == "PUT"]
        assert len(puts) == 3 and len({r.key for r in puts}) == 1
    assert Follower(st.url, tmp_path / "g", storage_options=st.so).head().step == 1
