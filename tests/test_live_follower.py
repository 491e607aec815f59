"""The live follower (issue 16): the model held in memory, brought along one verified step at a time,
sparse updates an engine applies with ``index_copy_``, snapshots a restart resumes from."""
from __future__ import annotations

import numpy as np
import pytest

from arcfmt.arrays import as_numpy
from arcfmt.errors import ArcError, InputError
from arcfmt.store import Follower, Publisher
from support.store import MLP, assert_folder, publish_step, trajectory
from support.store import publishers as support_publishers


@pytest.fixture(scope="module")
def traj():
    return trajectory(steps=7, seed=21)


def publishers(url, n, **kw):
    kw.setdefault("keyframe_every", 3)
    return support_publishers(url, n, **kw)


def same(a, b) -> bool:
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def test_live_model_follows_bit_exact_and_sparse_rebuilds_an_engine_copy(memory_url, traj):
    pubs = publishers(memory_url, 2)
    live: dict = {}
    fol = Follower(memory_url, live=live)
    engine = None
    for s in range(len(traj)):
        publish_step(pubs, s, traj[s])
        (upd,) = fol.sync()
        assert upd.step == s and upd.live is live and upd.path == ""
        assert set(live) == set(traj[s]) and all(same(live[n], traj[s][n]) for n in live)
        if engine is None:                       # the engine loads the first step whole
            engine = {n: np.array(a, copy=True) for n, a in upd.weights()}
            assert upd.kind == "keyframe"
            continue
        written = 0
        for name, idx, vals in upd.sparse():     # then only what changed
            assert idx.dtype == np.int32 and vals.dtype == traj[s][name].dtype and np.all(np.diff(idx) > 0)
            engine[name].reshape(-1)[idx] = vals
            written += idx.size
        assert written == upd.values_changed > 0
        assert all(same(engine[n], traj[s][n]) for n in traj[s])
        assert s < 2 or upd.sparse_bytes < 0.1 * upd.whole_bytes   # ~1 % of values change per step
        assert upd.verified_model


def test_a_failing_step_leaves_the_live_model_exactly_as_it_was(tmp_path, traj):
    url = str(tmp_path / "stream")
    pubs = publishers(url, 2, keyframe_every=0)
    publish_step(pubs, 0, traj[0])
    live: dict = {}
    fol = Follower(url, live=live)
    fol.sync()
    res = publish_step(pubs, 1, traj[1])
    before = {n: np.array(a, copy=True) for n, a in live.items()}
    obj = tmp_path / "stream" / res[1].delta.name         # the second shard's delta: the first shard decodes fine
    data = bytearray(obj.read_bytes())
    data[60] ^= 0x40                                      # a record of shard 1, inside its checksummed payload
    obj.write_bytes(bytes(data))
    with pytest.raises(ArcError):
        fol.sync()
    assert all(same(live[n], before[n]) for n in live)    # not one value of shard 0 was written either
    assert fol.step == 0


def test_snapshots_and_a_restart_resume_from_disk(tmp_path, traj):
    url = str(tmp_path / "stream")
    pubs = publishers(url, 1, keyframe_every=0)
    snap = tmp_path / "snap"
    live: dict = {}
    fol = Follower(url, live=live, snapshot=snap, snapshot_every=2)
    for s in range(5):
        pubs[0].publish(s, traj[s])
        (upd,) = fol.sync()
        assert upd.snapshot == (s % 2 == 1)
    assert_folder(snap, traj[3])                          # the last snapshot: step 3
    assert fol.save_snapshot() and not fol.save_snapshot()
    assert_folder(snap, traj[4])
    pubs[0].publish(5, traj[5])
    pubs[0].publish(6, traj[6])
    # a restarted rollout: the model from the snapshot, then only the deltas since
    live2: dict = {}
    fol2 = Follower(url, live=live2, snapshot=snap)
    assert fol2.step == 4 and same(live2[next(iter(traj[4]))], traj[4][next(iter(traj[4]))])
    ups = fol2.sync()
    assert [(u.step, u.kind) for u in ups] == [(5, "delta"), (6, "delta")]
    assert all(same(live2[n], traj[6][n]) for n in traj[6])


def test_live_arrays_not_at_the_snapshot_step_fall_back_to_a_keyframe(tmp_path, traj):
    url = str(tmp_path / "stream")
    pubs = publishers(url, 1, keyframe_every=2)
    for s in range(4):
        pubs[0].publish(s, traj[s])
    snap = tmp_path / "snap"
    Follower(url, snap).sync(until=2)                     # a folder at step 2 (a keyframe is at 2)
    pubs[0].publish(4, traj[4])
    wrong = {n: np.array(a, copy=True) for n, a in traj[0].items()}   # the engine's weights are not step 2's
    fol = Follower(url, live=wrong, snapshot=snap)
    ups = fol.sync()
    assert ups[0].kind == "keyframe" and ups[-1].step == 4
    assert all(same(wrong[n], traj[4][n]) for n in traj[4])


def test_filters_and_new_tensors(memory_url, traj):
    pubs = publishers(memory_url, 1, keyframe_every=0)
    pubs[0].publish(0, traj[0])
    live: dict = {}
    fol = Follower(memory_url, live=live, tensors=[MLP])
    fol.sync()
    assert set(live) == {n for n in traj[0] if ".mlp." in n}
    grown = dict(traj[1])
    name = next(n for n in grown if ".mlp." in n)
    grown[name] = np.concatenate([grown[name].reshape(-1), grown[name].reshape(-1)[:4]])   # another shape
    pubs[0].publish(1, grown)
    (upd,) = fol.sync()
    assert upd.fresh == [name] and same(live[name], grown[name]) and name not in {c for c, _, _ in upd.sparse()}


def test_argument_checks(tmp_path, memory_url):
    with pytest.raises(InputError, match="into=. or the live"):
        Follower(memory_url)
    with pytest.raises(InputError, match="snapshot="):
        Follower(memory_url, live={}, into=tmp_path / "x")
    with pytest.raises(InputError, match="live follower"):
        Follower(memory_url, tmp_path / "x", snapshot_every=3)
    fol = Follower(memory_url, tmp_path / "y")
    with pytest.raises(InputError, match="live follower"):
        fol.save_snapshot()


def test_a_torch_engine_follows_through_sparse_updates(memory_url, traj):
    """Plays the engine: a torch module whose parameters follow the stream through sparse updates only
    and are bit-identical to the trainer's at every step."""
    t = pytest.importorskip("torch")
    import arcfmt.torch as at

    pubs = publishers(memory_url, 2)
    publish_step(pubs, 0, traj[0])
    live = {n: at.to_torch(np.array(a, copy=True)) for n, a in traj[0].items()}   # the engine's CPU mirror
    module = t.nn.Module()
    for n, a in traj[0].items():
        module.register_parameter(n.replace(".", "_"), t.nn.Parameter(at.to_torch(np.array(a, copy=True)),
                                                                      requires_grad=False))
    params = {n: getattr(module, n.replace(".", "_")) for n in traj[0]}
    fol = Follower(memory_url, live=live)
    assert fol.sync()[0].kind == "keyframe"          # the mirror's step is unknown: bootstrapped from a keyframe
    for s in range(1, len(traj)):
        publish_step(pubs, s, traj[s])
        for upd in fol.sync():
            assert at.apply_sparse(params, upd) == upd.values_changed
        for n in traj[s]:
            assert same(as_numpy(params[n].detach()), traj[s][n]), (s, n)
            assert isinstance(live[n], t.Tensor)


def test_torch_helpers(tmp_path, memory_url, traj):
    t = pytest.importorskip("torch")
    import arcfmt.torch as at
    from arcfmt.safetensors_io import write_file

    write_file(tmp_path / "m.safetensors", traj[0])
    live = at.load_checkpoint(tmp_path / "m.safetensors")
    assert all(isinstance(v, t.Tensor) and same(as_numpy(v), traj[0][n]) for n, v in live.items())
    pub = Publisher(memory_url, effort="fast", keyframe_every=0)
    pub.publish(0, traj[0])
    fol = Follower(memory_url, live=live)
    fol.sync()
    pub.publish(1, traj[1])
    (upd,) = fol.sync()
    whole = {n: v.clone() for n, v in at.load_checkpoint(tmp_path / "m.safetensors").items()}
    assert at.apply_weights(whole, upd) == upd.whole_bytes
    assert all(same(as_numpy(whole[n]), traj[1][n]) for n in traj[1])
    names = [n for n, _, _ in at.sparse(upd)]
    assert names and all(n in traj[1] for n in names)
    with pytest.raises(InputError, match="not among the parameters"):
        at.apply_sparse({}, upd)
    assert at.apply_sparse({}, upd, strict=False) == 0
    wrong = {n: v.to(t.float32) if v.dtype == t.bfloat16 else v for n, v in whole.items()}
    with pytest.raises(InputError, match="the parameter is"):
        at.apply_sparse(wrong, upd)


@pytest.mark.kill
def test_killed_live_follower_leaves_its_snapshot_a_whole_step(tmp_path, zygote, traj):
    """A live follower writing its snapshot after a step is SIGKILLed at every point of the write (each
    fsync, rename, link, unlink, the folder exchange, the old folder's removal): the snapshot folder is
    then step s-1 or step s, whole and bit-exact, and a restarted live follower resumes from it."""
    url = str(tmp_path / "stream")
    (pub,) = publishers(url, 1, keyframe_every=0)
    snap = tmp_path / "snap"
    weights = [traj[s] if s < len(traj) else traj[2 + s % 2] for s in range(64)]
    pub.publish(0, weights[0])
    Follower(url, snap).sync()                     # the first snapshot: a folder follower's folder
    pub.publish(1, weights[1])
    job = zygote.spawn("live", url=url, snapshot=str(snap))
    res = job.result()
    assert job.rc == 0 and res["ok"], (res, job.log_text())
    points = res["result"]["points"]
    assert 10 <= points < 60 and [u["step"] for u in res["result"]["updates"]] == [1]
    assert_folder(snap, weights[1])
    outcomes = set()
    for k in range(1, points + 1):
        s = k + 1
        pub.publish(s, weights[s])
        job = zygote.spawn("live", url=url, snapshot=str(snap), kill_at=k)
        job.result()
        got = Follower(url, snap).state()["step"]
        assert got in (s - 1, s), (k, got)
        assert_folder(snap, weights[got])
        outcomes.add(got == s)
        job = zygote.spawn("live", url=url, snapshot=str(snap))     # restarted: resumes from the snapshot
        res = job.result()
        assert job.rc == 0 and res["ok"], (res, job.log_text())
        assert_folder(snap, weights[s])
    assert outcomes == {False, True}          # killed both before and after the swap


def test_pinned_memory_where_there_is_no_accelerator(tmp_path, traj):
    t = pytest.importorskip("torch")
    import arcfmt.torch as at
    from arcfmt.safetensors_io import write_file

    write_file(tmp_path / "m.safetensors", traj[0])
    if t.cuda.is_available():
        live = at.load_checkpoint(tmp_path / "m.safetensors", pin_memory=True)
        assert all(v.is_pinned() for v in live.values())
    else:
        with pytest.warns(UserWarning, match="pin_memory ignored"):
            live = at.load_checkpoint(tmp_path / "m.safetensors", pin_memory=True)
    assert all(same(as_numpy(v), traj[0][n]) for n, v in live.items())
