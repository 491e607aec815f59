"""Retention (SPEC.md S16) and the stream inventory: ``arcfmt status``, ``arcfmt prune``,
``Publisher(keep_last=)``, and the follower's handling of objects that disappear or are not there
yet (S9.5): a pruned manifest below a keyframe ends the plan walk, a missing object re-plans from
the head, and a missing object the head names is waited for, for a bounded time."""
from __future__ import annotations

import importlib
import json
import os
import shutil
import signal
import threading
import time

import pytest

from arcfmt.errors import InputError
from arcfmt.store import Follower, MissingError, Publisher, prune, status
from arcfmt.store import names as N
from arcfmt.store.backends import Store, classify
from support.store import arcfmt, assert_folder, kinds, publish_step, trajectory

prune_mod = importlib.import_module("arcfmt.store.prune")   # the module (arcfmt.store.prune is the function)

STEPS = 10
KF = 4          # keyframes at 0, 4, 8


@pytest.fixture(scope="module")
def traj():
    return trajectory(STEPS + 2, seed=7, layers=1, d=32, vocab=64)


class Where:
    """A stream location: local folder, memory:// or a real server (``remote``)."""

    def __init__(self, url, so=None, env=None, local=None):
        self.url, self.so, self.env, self.local = url, so or {}, env, local

    def store(self) -> Store:
        return Store(self.url, self.so)

    def pubs(self, n=2, **kw):
        return [Publisher(self.url, shard=i, num_shards=n, keyframe_every=KF, effort="fast", storage_options=self.so,
                          **kw) for i in range(n)]

    def follower(self, into, **kw):
        return Follower(self.url, into, storage_options=self.so, **kw)


@pytest.fixture(params=kinds("local", "memory", "seaweedfs", "fake-gcs"))
def where(request, tmp_path, memory_url):
    k = request.param
    if k == "local":
        return Where(str(tmp_path / "stream"), local=str(tmp_path / "stream"))
    if k == "memory":
        return Where(memory_url)
    from support.store import Remote, _unique
    srv = request.getfixturevalue(f"{k.replace('-', '_')}_server")
    r = Remote(srv, _unique(request))
    return Where(r.url, r.storage_options, r.env)


@pytest.fixture
def local(tmp_path):
    return Where(str(tmp_path / "stream"), local=str(tmp_path / "stream"))


def publish(w: Where, traj, steps=STEPS, n=2, pubs=None, followers=None, tmp=None):
    """Publish steps 0..steps-1; with ``followers`` (a set of steps), keep a follower folder at each."""
    pubs = pubs or w.pubs(n)
    at = {}
    for s in range(steps):
        publish_step(pubs, s, traj[s])
        if followers and s in followers:
            f = w.follower(tmp / f"at{s}")
            f.sync()
            assert f.step == s
            at[s] = tmp / f"at{s}"
    return pubs, at


def names(w: Where) -> list:
    return [e.name for e in w.store().list()]


def step_dirs(w: Where) -> set:
    return {e.step for e in w.store().list() if e.step is not None}


# ------------------------------------------------------------------------------------ status

def test_status_fields(where, traj, tmp_path):
    pubs, _ = publish(where, traj, steps=7)
    pubs[0].publish(7, {k: traj[7][k] for k in list(traj[7])[: len(traj[7]) // 2 + 1]})  # a claim, shard 1 missing
    st = status(where.url, storage_options=where.so)
    assert st.head.step == 6 and st.head.keyframe_step == 4 and st.head.age_seconds < 120
    assert [s.step for s in st.steps] == list(range(7))
    kinds_ = {s.step: s.kind for s in st.steps}
    assert kinds_[0] == "keyframe" and kinds_[4] == "both" and kinds_[5] == "delta" and kinds_[6] == "delta"
    assert st.keyframes == [0, 4]
    assert all(s.shards == 2 and s.committed and s.bytes > 0 for s in st.steps)
    assert all(s.read and s.writer is None for s in st.steps)   # 7 steps: every manifest read (details=16)
    assert [(p.step, p.descriptors, p.missing) for p in st.pending] == [(7, [0], [1])]
    # what a new follower would download: exactly what Follower.plan picks for an empty folder
    plan = where.follower(tmp_path / "ghost").plan()
    assert st.new_follower_path == [(m.step, k) for m, k in plan] == [(4, "keyframe"), (5, "delta"), (6, "delta")]
    assert st.new_follower_bytes == sum(m.cost(k) for m, k in plan)
    listed = where.store().list()
    head_size = len(where.store().read(N.HEAD, 4096))
    assert st.total_bytes == sum(e.size for e in listed) + head_size and st.objects == len(listed) + 1
    assert not os.path.exists(tmp_path / "ghost")
    # details=0: only the chain back to the keyframe is read; the rest comes from the names
    st0 = status(where.url, storage_options=where.so, details=0)
    assert st0.manifests_read == 3 and {s.step for s in st0.steps if s.read} == {4, 5, 6}
    assert {s.step: s.kind for s in st0.steps} == kinds_
    # the command line: a table, and --json one object (the endpoint from the environment, as a user's)
    if where.url.startswith("memory://"):
        return
    so = ("-O", "token=anon") if where.url.startswith("gs://") else ()
    p = arcfmt("status", where.url, *so, env=where.env, rc=0)
    assert "head: step 6" in p.stdout and "claimed, not committed: step 7" in p.stdout and "keyframes: 2" in p.stdout
    d = json.loads(arcfmt("status", where.url, "--json", *so, env=where.env, rc=0).stdout)
    assert d["head"]["step"] == 6 and d["keyframes"] == [0, 4] and d["new_follower_bytes"] == st.new_follower_bytes


def test_status_of_an_empty_stream(tmp_path):
    st = status(str(tmp_path / "nothing"))
    assert st.head is None and st.steps == [] and st.total_bytes == 0 and st.new_follower_bytes is None
    assert not os.path.exists(tmp_path / "nothing")


def test_status_of_a_stream_whose_head_is_garbage_shows_the_rest(local, traj, tmp_path):
    """An operator repairing a stream needs its steps: an unreadable head is reported, not fatal."""
    from support.cli import run
    publish(local, traj, steps=3, n=1)
    with open(os.path.join(local.local, "head.json"), "wb") as f:
        f.write(b"garbage")
    st = status(local.url)
    assert st.head is None and st.head_error.startswith("corrupt: ") and len(st.steps) == 3
    p = run("status", local.url, rc=0)
    assert "head: unreadable (corrupt: " in p.stdout and "committed steps: 3" in p.stdout


# ------------------------------------------------------------------------------------ prune

def _check_all_reach_head(w, at, traj, tmp, last):
    for s, folder in at.items():
        f = w.follower(folder, missing_wait=0)
        f.sync()
        assert f.step == last, s
        assert_folder(folder, traj[last])
    fresh = w.follower(tmp / f"fresh-{time.monotonic_ns()}", missing_wait=0)
    ups = fresh.sync()
    assert ups[0].kind == "keyframe" and fresh.step == last
    assert_folder(fresh.into, traj[last])


def test_prune_keeps_exactly_what_it_must(where, traj, tmp_path):
    _, at = publish(where, traj, followers=set(range(STEPS)), tmp=tmp_path)
    before = names(where)
    dry = prune(where.url, keep_last=3, dry_run=True, storage_options=where.so)
    assert names(where) == before                                  # a dry run deletes nothing
    assert dry.window == [7, 8, 9] and dry.kept == [4, 5, 6, 7, 8, 9] and dry.pruned_steps == [0, 1, 2, 3]
    res = prune(where.url, keep_last=3, storage_options=where.so)
    assert res.deleted == dry.deleted and res.pruned_steps == dry.pruned_steps
    assert step_dirs(where) == {4, 5, 6, 7, 8, 9}
    assert sorted(set(before) - set(names(where))) == sorted(res.deleted)
    # deletion order: every manifest first, then descriptors, then data objects
    kinds_ = [classify(n).kind for n in res.deleted]
    order = {"manifest": 0, "signature": 1, "descriptor": 2, "delta": 3, "keyframe": 3}
    assert [order[k] for k in kinds_] == sorted(order[k] for k in kinds_)
    # followers at every kept step and below the window, and a fresh one, still reach the head
    _check_all_reach_head(where, at, traj, tmp_path, STEPS - 1)
    again = prune(where.url, keep_last=3, storage_options=where.so)
    assert again.deleted == [] and again.pruned_steps == []


def test_prune_keep_keyframes_and_window_on_a_keyframe(local, traj, tmp_path):
    publish(local, traj, n=1)
    res = prune(local.url, keep_last=2, keep_keyframes=1)
    assert res.window == [8, 9] and res.kept == [8, 9] and res.rollback == [4]
    assert step_dirs(local) == {4, 8, 9}
    res = prune(local.url, keep_last=2, keep_keyframes=0)
    assert step_dirs(local) == {8, 9} and res.pruned_steps == [4]
    with pytest.raises(InputError):
        prune(local.url, keep_last=0)


def test_old_follower_replans_to_a_keyframe(local, traj, tmp_path):
    _, at = publish(local, traj, n=1, followers={2}, tmp=tmp_path)
    prune(local.url, keep_last=3)
    f = local.follower(at[2], missing_wait=0)
    plan = f.plan()          # the walk ends at the pruned manifest below keyframe 8... or at 4
    assert plan[0][1] == "keyframe" and plan[0][0].step in (4, 8)
    ups = f.sync()
    assert ups[0].kind == "keyframe" and f.step == STEPS - 1
    assert_folder(at[2], traj[STEPS - 1])


@pytest.mark.parametrize("kind", kinds("local", "seaweedfs"))
def test_follower_racing_a_prune_mid_step_replans(kind, request, tmp_path, traj):
    w = _where(kind, request, tmp_path)
    _, at = publish(w, traj, n=1, followers={2}, tmp=tmp_path)
    f = w.follower(at[2], missing_wait=0)
    plan = f.plan()
    assert [k for _, k in plan] == ["delta"] * 7     # steps 3..9 as deltas: cheaper than a keyframe
    real = f._apply_step
    calls = []

    def racing(m, kind, head, cur):
        if not calls:    # between the plan and the first fetch: everything below keyframe 8 goes
            prune(w.url, keep_last=2, storage_options=w.so)
        calls.append((m.step, kind))
        return real(m, kind, head, cur)

    f._apply_step = racing
    events = []
    f.progress = events.append
    ups = f.sync()
    assert calls[0] == (3, "delta") and (8, "keyframe") in calls
    assert [(u.step, u.kind) for u in ups] == [(8, "keyframe"), (9, "delta")]
    assert any(e["event"] == "missing" for e in events)
    assert_folder(at[2], traj[STEPS - 1])


def _where(kind, request, tmp_path):
    if kind == "local":
        return Where(str(tmp_path / "stream"), local=str(tmp_path / "stream"))
    from support.store import Remote, _unique
    srv = request.getfixturevalue(f"{kind.replace('-', '_')}_server")
    r = Remote(srv, _unique(request))
    return Where(r.url, r.storage_options, r.env)


def test_a_publisher_committing_while_pruning(local, traj, tmp_path, monkeypatch):
    pubs, at = publish(local, traj, steps=STEPS, n=2, followers={9}, tmp=tmp_path)
    real_list = Store.list

    def list_then_publish(self, *a, **kw):    # the head is read; a new step commits before the listing
        publish_step(pubs, STEPS, traj[STEPS])
        return real_list(self, *a, **kw)

    monkeypatch.setattr(Store, "list", list_then_publish)
    res = prune(local.url, keep_last=1)
    monkeypatch.setattr(Store, "list", real_list)
    assert res.head == STEPS - 1 and res.kept == [8, 9]     # from the head it read
    assert step_dirs(local) == {8, 9, STEPS}                 # the step committed meanwhile is untouched
    _check_all_reach_head(local, at, traj, tmp_path, STEPS)
    # concurrently, for real: a publisher with keep_last prunes after each commit it makes
    stop = threading.Event()
    errors = []

    def pruner():
        while not stop.is_set():
            try:
                prune(local.url, keep_last=2)
            except Exception as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

    t = threading.Thread(target=pruner)
    t.start()
    try:
        publish_step(pubs, STEPS + 1, traj[STEPS + 1])
    finally:
        stop.set()
        t.join()
    assert not errors
    fresh = local.follower(tmp_path / "after-race")
    fresh.sync()
    assert_folder(fresh.into, traj[STEPS + 1])


def test_publisher_keep_last(local, traj, tmp_path, monkeypatch):
    pubs = local.pubs(2, keep_last=3)
    for s in range(STEPS):
        res = publish_step(pubs, s, traj[s])
        assert res[1].commit.made_manifest
        kept = step_dirs(local)
        assert max(kept) == s and len(kept) <= 3 + KF
    assert step_dirs(local) == {4, 5, 6, 7, 8, 9}

    def broken(*a, **kw):
        raise MissingError("injected")

    monkeypatch.setattr(prune_mod, "prune", broken)
    with pytest.warns(UserWarning, match="pruning after the commit failed"):
        res = publish_step(pubs, STEPS, traj[STEPS])
    assert res[1].commit.committed and res[1].commit.head == STEPS
    f = local.follower(tmp_path / "f")
    f.sync()
    assert_folder(f.into, traj[STEPS])


def test_non_stream_objects_are_never_touched(where, traj):
    publish(where, traj, n=1)
    st = where.store()
    fs = st.fs
    extra = [f"{N.step_dir(1)}/notes.txt", f"{N.STEPS}/README", f"{N.step_dir(2)}/manifest.json.bak",
             f"{N.step_dir(2)}/shard-00000-of-00001-delta-XYZ.arc", "other/x.json"]
    for n in extra:
        if where.local:
            os.makedirs(os.path.dirname(st.path(n)), exist_ok=True)
        fs.pipe_file(st.path(n), b"keep me")
    res = prune(where.url, keep_last=2, storage_options=where.so)
    assert res.other == 4 and res.pruned_steps == [0, 1, 2, 3, 4, 5, 6, 7]
    for n in extra:
        assert fs.cat_file(st.path(n)) == b"keep me", n
    assert not any(n in res.deleted for n in extra)
    for bad in ("head.json", extra[0], "steps/../head.json", "/etc/passwd"):
        with pytest.raises(InputError):
            st.delete([bad])
    assert fs.cat_file(st.path(extra[0])) == b"keep me"


def test_symlinks_in_a_local_stream_are_never_followed(local, traj, tmp_path):
    publish(local, traj, n=1)
    outside = tmp_path / "outside"
    (outside / "steps-like").mkdir(parents=True)
    victim = outside / "steps-like" / "manifest.json"
    victim.write_bytes(b"precious")
    root = local.local
    # a step folder that is a link, and a link named like a descriptor inside a step that gets pruned
    linked_step = os.path.join(root, "steps", f"{2:020d}")
    shutil.rmtree(linked_step)
    os.symlink(outside / "steps-like", linked_step, target_is_directory=True)
    os.symlink(victim, os.path.join(root, N.step_dir(1), "shard-00000-of-00001.json.tmp"))
    os.unlink(os.path.join(root, N.descriptor_name(1, 0, 1)))
    os.symlink(victim, os.path.join(root, N.descriptor_name(1, 0, 1)))
    listed = {e.name: e.kind for e in local.store().list()}
    assert listed[N.step_dir(2)] == "other" and listed[N.descriptor_name(1, 0, 1)] == "other"
    prune(local.url, keep_last=2)
    assert victim.read_bytes() == b"precious" and os.path.islink(linked_step)
    assert os.path.islink(os.path.join(root, N.descriptor_name(1, 0, 1)))
    local.store().delete([N.descriptor_name(1, 0, 1), f"{N.step_dir(2)}/manifest.json"])   # never through a link
    assert victim.read_bytes() == b"precious" and os.path.islink(os.path.join(root, N.descriptor_name(1, 0, 1)))
    f = local.follower(tmp_path / "f")
    f.sync()
    assert_folder(f.into, traj[STEPS - 1])


def test_steps_folder_swapped_for_a_link_after_the_listing_is_never_followed(local, traj, tmp_path, monkeypatch):
    """A bucket writer replaces ``steps/`` with a link to another folder between prune's walk and its
    deletions: every folder below the stream's is opened without following links, so nothing outside
    is removed (the deletions that can no longer be made are simply not made)."""
    publish(local, traj, n=1)
    root = local.local
    outside = tmp_path / "outside"
    for step in range(STEPS):
        (outside / f"{step:020d}").mkdir(parents=True)
        for name in ("manifest.json", "shard-00000-of-00001.json"):
            (outside / f"{step:020d}" / name).write_bytes(b"precious")
    real_delete = Store.delete
    swapped = []

    def swap_then_delete(self, names):
        if not swapped:
            swapped.append(1)
            os.rename(os.path.join(root, "steps"), os.path.join(root, "steps.real"))
            os.symlink(outside, os.path.join(root, "steps"), target_is_directory=True)
        return real_delete(self, names)
    monkeypatch.setattr(Store, "delete", swap_then_delete)
    prune(local.url, keep_last=2)
    assert swapped
    assert all((outside / f"{step:020d}" / n).read_bytes() == b"precious" for step in range(STEPS)
               for n in ("manifest.json", "shard-00000-of-00001.json"))


def test_cli_prune(local, traj, tmp_path):
    publish(local, traj, n=1)
    before = names(local)
    d = json.loads(arcfmt("prune", local.url, "--keep-last", "3", "--dry-run", "--json", rc=0).stdout)
    assert d["dry_run"] and d["pruned_steps"] == [0, 1, 2, 3] and names(local) == before
    p = arcfmt("prune", local.url, "--keep-last", "3", rc=0)
    assert "deleted" in p.stdout and step_dirs(local) == {4, 5, 6, 7, 8, 9}
    p = arcfmt("prune", local.url, "--keep-last", "0", rc=1)
    assert "error (input)" in p.stderr


# ------------------------------------------------------------------------------------ kill test

_KILLED = -signal.SIGKILL


def _prune_killed_at(url: str, n: int) -> int:
    """Fork; the child prunes and SIGKILLs itself just before its n-th deletion. The wait status."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            from arcfmt.store import backends
            count = [0]
            real = backends._local_unlink_at

            def unlink(name, dir_fd):
                count[0] += 1
                if count[0] == n:
                    os.kill(os.getpid(), signal.SIGKILL)
                real(name, dir_fd)

            backends._local_unlink_at = unlink
            prune(url, keep_last=2)
            os._exit(0)
        except BaseException:
            os._exit(1)
    _, status_ = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status_)


@pytest.mark.kill
def test_prune_killed_at_every_deletion(traj, tmp_path):
    pristine = Where(str(tmp_path / "pristine"))
    _, at = publish(pristine, traj, n=1, followers={8, 9}, tmp=tmp_path / "f0")
    full = prune(pristine.url, keep_last=2, dry_run=True)
    total = len(full.deleted)
    assert total >= 20
    final = sorted(set(names(pristine)) - set(full.deleted))
    for n in range(1, total + 1):
        w = Where(str(tmp_path / f"s{n}"))
        shutil.copytree(pristine.url, w.url, symlinks=True)
        assert _prune_killed_at(w.url, n) == _KILLED, n
        # fresh followers and followers at kept steps still reach the head
        folders = {}
        for s, folder in at.items():
            folders[s] = tmp_path / f"k{n}-{s}"
            shutil.copytree(folder, folders[s], symlinks=True)
        _check_all_reach_head(w, folders, traj, tmp_path / f"k{n}", STEPS - 1)
        prune(w.url, keep_last=2)           # a rerun finishes the job
        assert names(w) == final, n
        assert sorted(os.listdir(os.path.join(w.url, N.STEPS))) == sorted({n_.split("/")[1] for n_ in final
                                                                            if n_.startswith(N.STEPS + "/")})
        shutil.rmtree(w.url)
        for folder in folders.values():
            shutil.rmtree(folder)


# ------------------------------------------------------------------------------------ missing objects

def _hide(path):
    aside = path + ".aside"
    os.rename(path, aside)
    return aside


def test_missing_object_that_appears_is_waited_for(local, traj, tmp_path):
    pubs, at = publish(local, traj, steps=3, n=1, followers={2}, tmp=tmp_path)
    publish_step(pubs, 3, traj[3])
    # replication lag: the head (and manifest) of step 3 are seen before its data object
    obj = os.path.join(local.local, next(e.name for e in local.store().list() if e.step == 3 and e.kind == "delta"))
    aside = _hide(obj)
    timer = threading.Timer(1.0, os.rename, (aside, obj))
    timer.start()
    t0 = time.monotonic()
    f = local.follower(at[2], missing_wait=20, backoff=0.05)
    f.sync()
    timer.join()
    assert f.step == 3 and time.monotonic() - t0 >= 0.9
    assert_folder(at[2], traj[3])
    # the head's own manifest not there yet
    publish_step(pubs, 4, traj[4])
    man = os.path.join(local.local, N.manifest_name(4))
    aside = _hide(man)
    timer = threading.Timer(1.0, os.rename, (aside, man))
    timer.start()
    f.sync()
    timer.join()
    assert f.step == 4
    assert_folder(at[2], traj[4])


def test_missing_object_that_never_appears_is_not_found_after_the_bound(local, traj, tmp_path):
    pubs, at = publish(local, traj, steps=3, n=1, followers={2}, tmp=tmp_path)
    publish_step(pubs, 3, traj[3])
    obj = os.path.join(local.local, next(e.name for e in local.store().list() if e.step == 3 and e.kind == "delta"))
    _hide(obj)
    f = local.follower(at[2], missing_wait=1.5, backoff=0.05)
    t0 = time.monotonic()
    with pytest.raises(MissingError):
        f.sync()
    took = time.monotonic() - t0
    assert 1.4 <= took < 10, took
    assert f.step == 2
    assert_folder(at[2], traj[2])
    p = arcfmt("follow", local.url, "--into", at[2], "--once", "--missing-wait", "0.5", rc=1)
    assert "error (not_found)" in p.stderr


def test_listing_is_bounded_and_names_are_classified(local, traj):
    publish(local, traj, steps=3, n=1)
    from arcfmt.errors import LimitError
    with pytest.raises(LimitError):
        local.store().list(limit=3)
    assert len(local.store().list(limit=100)) == 9     # 3 steps: manifest, descriptor, one data object each
    h = "0" * 32
    assert classify(f"steps/{1:020d}/shard-00001-of-00002-delta-{h}.arc").kind == "delta"
    for bad in (f"steps/{1:020d}/shard-00002-of-00002.json", f"steps/{1:020d}/shard-00000-of-00000.json",
                f"steps/{(1 << 64) - 1:020d}/manifest.json", f"steps/{1:020d}/shard-00000-of-00001-delta-{h}.arc.tmp",
                f"steps/{1:020d}/../manifest.json", "steps/1/manifest.json", "head.json.lock"):
        assert classify(bad).kind == "other", bad
    with pytest.raises(InputError):
        local.store().list("../x")


def test_empty_step_folders_left_by_a_killed_prune_are_removed(local, traj, tmp_path):
    """A prune killed between its last unlink and the folder's removal leaves an empty step folder that
    no object listing shows: the next prune removes it — but never a link, a non-empty folder or a kept
    step's folder."""
    publish(local, traj, n=1)
    steps_dir = os.path.join(local.local, N.STEPS)
    prune(local.url, keep_last=3)
    kept = sorted(os.listdir(steps_dir))
    os.mkdir(os.path.join(steps_dir, f"{1:020d}"))                     # as a kill before its rmdir leaves it
    (tmp_path / "outside").mkdir()
    os.symlink(tmp_path / "outside", os.path.join(steps_dir, f"{2:020d}"), target_is_directory=True)
    os.mkdir(os.path.join(steps_dir, f"{3:020d}"))
    (tmp_path / "keep-me").write_bytes(b"x")
    os.link(tmp_path / "keep-me", os.path.join(steps_dir, f"{3:020d}", "notes.txt"))   # not a stream name
    os.mkdir(os.path.join(steps_dir, "00000000000000000001x"))
    res = prune(local.url, keep_last=3)
    assert res.deleted == []
    left = sorted(os.listdir(steps_dir))
    assert f"{1:020d}" not in left and f"{2:020d}" in left and f"{3:020d}" in left
    assert "00000000000000000001x" in left and os.path.isdir(tmp_path / "outside")
    assert set(kept) <= set(left)
