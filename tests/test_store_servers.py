"""The stream against real object stores on 127.0.0.1: SeaweedFS and moto (S3, via s3fs) and
fake-gcs-server (GCS, via gcsfs). No client library is mocked; each server runs as a process."""
from __future__ import annotations

import threading

import pytest

from arcfmt.store import ConflictError, Follower, Publisher
from arcfmt.store import names as N
from arcfmt.store.backends import Store
from support.store import MLP, Remote, _unique, assert_folder, publish_step, run_cli_trajectory, split, trajectory

pytestmark = pytest.mark.servers  # every test here talks to a real local server


@pytest.fixture(scope="module")
def traj():
    return trajectory(steps=4, seed=11)


def test_conditional_create_and_compare_and_swap(remote):
    st = Store(remote.url, remote.storage_options)
    assert st.backend == ("gcs" if remote.kind == "fake-gcs" else "s3")
    m = N.manifest_name(3)
    assert st.create(m, b"first")
    assert not st.create(m, b"second")          # SeaweedFS: 412 without <Condition>; moto: with; GCS: 412
    assert st.read(m, 100) == b"first"
    assert st.read_versioned(N.HEAD, 100) == (None, None)
    assert st.replace(N.HEAD, b"h1", None)
    data, tok = st.read_versioned(N.HEAD, 100)
    assert data == b"h1" and tok
    assert st.replace(N.HEAD, b"h2", tok)
    assert not st.replace(N.HEAD, b"h3", tok)   # stale ETag / generation
    assert st.read(N.HEAD, 100) == b"h2"
    assert st.read_many([m, N.manifest_name(4)], 100) == [b"first", None]


def test_racing_creates_one_winner(remote):
    results = []
    barrier = threading.Barrier(6)
    name = N.manifest_name(9)

    def race(i):
        st = Store(remote.url, remote.storage_options)
        barrier.wait()
        results.append((st.create(name, f"writer {i}".encode()), i))

    ts = [threading.Thread(target=race, args=(i,)) for i in range(6)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    winners = [i for ok, i in results if ok]
    assert len(winners) == 1, results
    assert Store(remote.url, remote.storage_options).read(name, 100) == f"writer {winners[0]}".encode()


def test_publish_and_follow(remote, tmp_path, traj):
    so = remote.storage_options
    pubs = [Publisher(remote.url, shard=i, num_shards=2, keyframe_every=2, storage_options=so, effort="fast")
            for i in range(2)]
    full = Follower(remote.url, tmp_path / "full", storage_options=so, chunk_size=8192)
    mlp = Follower(remote.url, tmp_path / "mlp", tensors=[MLP], storage_options=so)
    for step, tensors in enumerate(traj):
        res = publish_step(pubs, step, tensors)
        assert res[-1].commit.committed and res[-1].commit.head == step
        for fol, names in ((full, None), (mlp, {n for n in tensors if ".mlp." in n})):
            (upd,) = fol.sync()
            assert upd.step == step
            assert_folder(fol.into, tensors, names)
            assert upd.bytes_downloaded <= 1.05 * (upd.bytes_needed + upd.tail_bytes)
            if names is not None:
                assert upd.requests <= 4 * 2
    late = Follower(remote.url, tmp_path / "late", storage_options=so)
    assert [(u.step, u.kind) for u in late.sync()] == [(2, "keyframe"), (3, "delta")]
    assert_folder(late.into, traj[3])


def test_racing_shards_and_publishers(remote, tmp_path, traj):
    so = remote.storage_options
    n = 3
    parts = split(traj[0], n)
    results, errors = [], []
    barrier = threading.Barrier(n + 1)

    def go(i, tensors):
        pub = Publisher(remote.url, shard=i, num_shards=n, storage_options=so, effort="fast")
        barrier.wait()
        try:
            results.append(pub.publish(0, tensors))
        except ConflictError as exc:
            errors.append(exc)

    # three shards at once, plus a second publisher for shard 0 with other tensors
    jobs = [(i, parts[i]) for i in range(n)] + [(0, split(traj[1], n)[0])]
    ts = [threading.Thread(target=go, args=job) for job in jobs]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert len(errors) == 1 and "already published" in str(errors[0])
    assert sum(r.commit.made_manifest for r in results) == 1
    assert Follower(remote.url, tmp_path / "unused", storage_options=so).head().step == 0


@pytest.mark.parametrize("kind", ["seaweedfs", "fake-gcs"])
def test_cli_against_server(kind, request, tmp_path, traj):
    """``arcfmt publish`` / ``arcfmt follow`` pointed at the server the way a user points them at S3/GCS:
    the endpoint and credentials come from the environment, nothing from the command line."""
    srv = request.getfixturevalue(f"{kind.replace('-', '_')}_server")
    remote = Remote(srv, _unique(request))
    extra = ("-O", "token=anon") if kind == "fake-gcs" else ()
    run_cli_trajectory(remote.url, tmp_path, traj, env=remote.env, steps=3, shards=2, extra=extra)


def test_wrong_credentials_are_refused(request, traj):
    """SeaweedFS enforces SigV4 with the keys it was started with: a wrong secret is a one-line
    transport error, not a retry loop."""
    from arcfmt.store import TransportError

    remote = Remote(request.getfixturevalue("seaweedfs_server"), _unique(request))
    so = dict(remote.storage_options, secret="not-the-secret")
    with pytest.raises(TransportError):
        Publisher(remote.url, storage_options=so, effort="fast").publish(0, traj[0])
