"""What a follower reads from outside is bounded by what the structure can hold, on the wire and on disk.

- manifest sizes: an object's tail (index + trailer) can never exceed one INDX record plus the
  trailer, so a ~1 KB manifest claiming a 2^63-byte object is refused before a request is planned;
- the wire (through the fault proxy of tests/support/faults.py, in front of SeaweedFS and
  fake-gcs-server): an endless body on a limited read is read to ``limit + 1`` bytes only; a ``200``
  with the whole object or a ``206`` longer than asked is sliced when that is provably right, and
  refused with what happened otherwise; a body cut short is retried; a trickling answer hits the
  per-request deadline (and a caller's deadline), and is retried within the budget;
- one retry layer: ``retries=N`` means N + 1 requests for one read, whatever s3fs and botocore
  would do on their own (unless the caller's storage options ask for botocore's retries), and a cap
  on the total retry time;
- the resumption spool: an entry is used only if it is a regular file of exactly the chunk's size
  (a FIFO, a symlink to /dev/zero, a sparse 1 GiB file are removed and fetched again, never read);
  a symlink planted as the spool folder is not followed; ``forget`` removes only the spool's own
  entries.
"""
from __future__ import annotations

import json
import os
import threading
import time
from typing import ClassVar

import pytest
from fsspec.implementations.memory import MemoryFileSystem

from arcfmt.errors import (
    ArcError,
    ChecksumError,
    CorruptError,
    LimitError,
    TruncatedError,
)
from arcfmt.store import Follower, Publisher, TransportError
from arcfmt.store import names as N
from arcfmt.store import objects as SL
from arcfmt.store import ranges as R
from arcfmt.store.backends import Store
from arcfmt.store.objects import MAX_HEAD_BYTES
from arcfmt.store.ranges import FetchStats, RangeFetcher
from support.faults import FaultProxy, act, s3_fs, s3_options
from support.store import H32, Remote, _unique, assert_folder, object_ref, publish_step, trajectory

SHARDS = 2
CHUNK = 512
BOUND = 32 << 20      # what a client may have pulled off one socket (kernel buffers included) at most




def _manifest(obj):
    return SL.canonical(dict(
        format=SL.MANIFEST_FORMAT, version=[1, 0], step=5, base_step=4, base_manifest=H32, keyframe=False,
        keyframe_step=0, model_digest=H32, tensors=3, writer=None,
        shards=[dict(shard=0, file="a.safetensors", descriptor=H32, target_digest=H32, tensors=3, delta=obj,
                     keyframe=None)]))


# ================================================================================= manifest sizes

BIG = (1 << 63) - 1


@pytest.mark.parametrize("size,index_offset,err", [
    (BIG, 52, LimitError),                                   # a 2^63-byte tail: ~2^40 range requests before
    (BIG, BIG - SL.MAX_TAIL_BYTES - 1, LimitError),          # one byte more than an INDX record + trailer
    (BIG, BIG - SL.MAX_TAIL_BYTES, None),                    # the largest tail there can be
    (BIG, BIG - 56, None),                                   # the smallest
    (BIG, BIG - 55, CorruptError),                           # no room for an INDX record and the trailer
    (BIG + 1, 52, CorruptError),                             # beyond 2^63 - 1
    (107, 52, CorruptError),                                 # smaller than the smallest arcfmt file
    (108, 51, CorruptError),                                 # the index before header + META
    (108, 52, None),
    (1000, 800, None),
    (1000, -1, CorruptError),
])
def test_object_sizes_are_bounded_by_the_structure(size, index_offset, err):
    raw = _manifest(object_ref(size=size, index_offset=index_offset))
    if err is None:
        m = SL.parse_manifest(raw, "m")
        assert m.shards[0].delta.tail_size <= SL.MAX_TAIL_BYTES
    else:
        with pytest.raises(err, match="index_offset|size|index and trailer"):
            SL.parse_manifest(raw, "m")
    d = dict(format=SL.DESCRIPTOR_FORMAT, version=[1, 0], step=5, shard=0, num_shards=1, file="a.safetensors",
             target_digest=H32, tensors=[], delta=object_ref(size=size, index_offset=index_offset), keyframe=None,
             writer=None)
    if err is None:
        SL.parse_descriptor(SL.canonical(d), "d")
    else:
        with pytest.raises(err):
            SL.parse_descriptor(SL.canonical(d), "d")


def _rewrite_manifest(url, step, patch):
    """Rewrite a local stream's manifest of ``step`` with ``patch(manifest dict)`` and point the head at it."""
    mpath = os.path.join(url, N.manifest_name(step))
    with open(mpath, "rb") as f:
        m = json.loads(f.read())
    patch(m)
    raw = SL.canonical(m)
    with open(mpath, "wb") as f:
        f.write(raw)
    head = SL.Head(step, SL.digest128(raw), m["keyframe_step"], 0)
    with open(os.path.join(url, N.HEAD), "wb") as f:
        f.write(head.to_bytes())


def test_follower_refuses_a_huge_object_before_fetching(tmp_path):
    """A manifest naming a 2^63-byte object is refused at parse time (it made a follower build ~2^40
    range requests and run out of memory); one whose tail is small but lies past the object's end is
    read with one small request and found truncated."""
    traj = trajectory(steps=1, seed=5)
    url = str(tmp_path / "stream")
    publish_step([Publisher(url, shard=0, num_shards=1, effort="fast")], 0, traj[0])

    def huge(m):
        m["shards"][0]["keyframe"]["size"] = BIG

    _rewrite_manifest(url, 0, huge)
    fol = Follower(url, tmp_path / "f")
    t0 = time.monotonic()
    with pytest.raises(LimitError, match="index and trailer"):
        fol.sync()
    assert time.monotonic() - t0 < 10 and fol.stats.requests == 0 and fol.step is None

    def far_tail(m):
        o = m["shards"][0]["keyframe"]
        o["size"], o["index_offset"] = BIG, BIG - 200

    _rewrite_manifest(url, 0, far_tail)
    with pytest.raises(TruncatedError):
        fol.sync()
    assert fol.stats.requests == 1 and fol.stats.bytes == 0 and fol.step is None


# ================================================================================= answers, in isolation

@pytest.mark.parametrize("status,crange,clen,start,end,exact,want", [
    (206, "bytes 0-9/100", "10", 0, 10, True, (0, 10, False)),
    (206, "bytes 0-99/100", "100", 0, 10, True, (0, 10, False)),      # longer: the first 10 bytes
    (206, "bytes 5-99/100", None, 10, 20, True, (5, 10, False)),       # starts before: skip 5
    (200, None, "100", 10, 20, True, (10, 10, False)),                 # the whole object: its slice
    (200, None, None, 0, 4097, False, (0, 4097, True)),                # unsized: read 4097 at most
    (206, "bytes 0-299/300", "300", 0, 4097, False, (0, 300, False)),  # a small object, limited read
    (200, None, "300", 0, 4097, False, (0, 300, False)),
])
def test_answers_are_planned_to_the_asked_bytes(status, crange, clen, start, end, exact, want):
    assert R._plan_answer(status, crange, clen, start, end, exact, "x") == want


@pytest.mark.parametrize("status,crange,clen,start,end,exact,err,match", [
    (206, "bytes 10-19/100", "10", 0, 10, True, TransportError, "answered bytes 10..20 of 100"),   # wrong place
    (206, "bytes 0-4/100", "5", 0, 10, True, TransportError, "answered bytes 0..5"),          # shorter, not EOF
    (206, "bytes 0-9/10", "10", 0, 20, True, TruncatedError, "the object is 10 bytes"),
    (206, None, "10", 0, 10, True, TransportError, "Content-Range"),
    (206, "bytes 0-9/5", "10", 0, 10, True, TransportError, "impossible"),
    (206, "bytes 0-9/100", "11", 0, 10, True, TransportError, "disagrees"),
    (206, "bytes 0-99999999999999999999/1", None, 0, 10, True, TransportError, "malformed"),
    (200, None, "-1", 0, 10, True, TransportError, "malformed Content-Length"),
    (200, None, str(1 << 30), R.MAX_SKIP + 1, R.MAX_SKIP + 11, True, TransportError, "whole object"),
    (200, None, "5", 0, 10, True, TruncatedError, "the object is 5 bytes"),
    (302, None, None, 0, 10, True, TransportError, "HTTP 302"),
])
def test_wrong_answers_are_refused(status, crange, clen, start, end, exact, err, match):
    with pytest.raises(err, match=match) as e:
        R._plan_answer(status, crange, clen, start, end, exact, "x")
    assert isinstance(e.value, ArcError)
    if err is TransportError:
        assert e.value.transient     # retried within the budget, then a final TransportError


# ================================================================================= the wire, on S3

@pytest.fixture(scope="module")
def s3_stream(request, tmp_path_factory):
    """Two committed steps of two shards on SeaweedFS (published once for the module)."""
    srv = request.getfixturevalue("seaweedfs_server")
    remote = Remote(srv, _unique(request) + "-wire")
    traj = trajectory(steps=2, seed=31)
    pubs = [Publisher(remote.url, shard=i, num_shards=SHARDS, storage_options=remote.storage_options, effort="fast")
            for i in range(SHARDS)]
    for s in range(2):
        publish_step(pubs, s, traj[s])
    return remote, traj


def _proxy(remote, rule=None):
    return FaultProxy(remote.server.endpoint, rule)


def _is_head(r):
    return r.method == "GET" and r.path.endswith("/" + N.HEAD)


def _is_data_get(r):
    return r.method == "GET" and r.is_data()


@pytest.mark.servers
def test_endless_body_is_read_only_to_the_limit(s3_stream, tmp_path):
    """A server that ignores the Range of a head read and streams an endless body: the read stops at
    ``limit + 1`` bytes (``limit``), at once — before, 537 MB were read into memory in 0.6 s."""
    remote, _ = s3_stream
    with _proxy(remote, lambda r: act("endless") if _is_head(r) else None) as proxy:
        so = s3_options(proxy.endpoint)
        st = Store(remote.url, so, retries=0)
        for read in (lambda: st.read(N.HEAD, MAX_HEAD_BYTES), lambda: st.read_versioned(N.HEAD, MAX_HEAD_BYTES),
                     lambda: st.read_many([N.HEAD], MAX_HEAD_BYTES),
                     lambda: Follower(remote.url, tmp_path / "f", storage_options=so, retries=0).head()):
            proxy.reset_log()
            t0 = time.monotonic()
            with pytest.raises(LimitError, match="larger than its 4096-byte limit"):
                read()
            assert time.monotonic() - t0 < 10
            time.sleep(0.2)        # let the proxy see the hang-up
            (r,) = [r for r in proxy.requests if _is_head(r)]
            assert r.action == "endless" and r.sent < BOUND, r.sent


@pytest.mark.servers
def test_endless_data_bodies_are_bounded(s3_stream, tmp_path):
    """Endless bodies for every range read: each read takes at most the asked bytes (plus what precedes
    them in a whole-object answer) and the step is refused by its checks, never applied."""
    remote, _ = s3_stream
    with _proxy(remote, lambda r: act("endless") if _is_data_get(r) else None) as proxy:
        fol = Follower(remote.url, tmp_path / "f", storage_options=s3_options(proxy.endpoint), chunk_size=CHUNK,
                       retries=1, backoff=0.01)
        with pytest.raises((ChecksumError, CorruptError, TransportError)):
            fol.sync()
        time.sleep(0.2)
        sent = [r.sent for r in proxy.requests if _is_data_get(r)]
        assert sent and max(sent) < BOUND, sent
        assert fol.step is None


@pytest.mark.servers
def test_whole_object_answers_are_sliced_or_refused(s3_stream, tmp_path, monkeypatch):
    """A caching proxy that answers every range with ``200`` and the whole object: the follower takes
    the asked slice (the rest of the answer is filler that would fail every check) and applies the
    steps bit for bit. An answer that would need too much dropped before the asked offset is refused,
    saying what the store answered."""
    remote, traj = s3_stream
    with _proxy(remote, lambda r: act("whole") if r.method == "GET" else None) as proxy:
        so = s3_options(proxy.endpoint)
        fol = Follower(remote.url, tmp_path / "f", storage_options=so, chunk_size=CHUNK)
        ups = fol.sync()
        assert [u.step for u in ups] == [0, 1]
        assert_folder(fol.into, traj[1])
        assert {r.action for r in proxy.requests if _is_data_get(r)} == {"whole"}
        assert sum(u.retries for u in ups) == 0
        monkeypatch.setattr(R, "MAX_SKIP", 0)
        fol = Follower(remote.url, tmp_path / "g", storage_options=so, chunk_size=CHUNK, retries=1, backoff=0.01)
        with pytest.raises(TransportError, match=r"the store answered \d+ bytes \(HTTP 200: the whole object\) "
                                                 r"for a range of \d+ bytes at offset \d+ \(after 1 retries\)"):
            fol.sync()
        assert fol.step is None


@pytest.mark.servers
@pytest.mark.parametrize("extra,earlier", [(333, 0), (0, 17), (5000, 100)])
def test_longer_answers_are_sliced(s3_stream, tmp_path, extra, earlier):
    """``206`` answers longer than asked, or starting before the asked offset (filler around the real
    bytes): the follower keeps exactly the asked bytes and applies the steps bit for bit."""
    remote, traj = s3_stream
    def rule(r):
        return act("longer", extra=extra, earlier=earlier) if _is_data_get(r) else None

    with _proxy(remote, rule) as proxy:
        fol = Follower(remote.url, tmp_path / "f", storage_options=s3_options(proxy.endpoint), chunk_size=CHUNK)
        ups = fol.sync()
        assert [u.step for u in ups] == [0, 1] and sum(u.retries for u in ups) == 0
        assert_folder(fol.into, traj[1])
        assert proxy.count(lambda r: r.action == "longer") > 0


@pytest.mark.servers
def test_bodies_cut_short_are_retried(s3_stream, tmp_path):
    """The first answer of every range request ends halfway: retried (by arcfmt alone: the filesystem
    it builds has the client libraries' retries off), then applied."""
    remote, traj = s3_stream
    def rule(r):
        return act("cut") if _is_data_get(r) and r.attempt == 0 else None

    with _proxy(remote, rule) as proxy:
        fol = Follower(remote.url, tmp_path / "f", storage_options=s3_options(proxy.endpoint), chunk_size=CHUNK,
                       backoff=0.01)
        ups = fol.sync()
        assert [u.step for u in ups] == [0, 1]
        assert_folder(fol.into, traj[1])
        cut = proxy.count(lambda r: r.action == "cut")
        assert cut > 0 and sum(u.retries for u in ups) == cut
        assert all(n == 2 for n in _per_key(proxy, _is_data_get).values())


def _per_key(proxy, pred):
    out = {}
    for r in proxy.requests:
        if pred(r):
            out[r.key] = out.get(r.key, 0) + 1
    return out


@pytest.mark.servers
def test_trickling_answers_hit_the_request_deadline(s3_stream, tmp_path):
    """A server that sends its answer one byte at a time, each well inside botocore's read timeout:
    each request is abandoned at its total deadline and retried; a read whose every attempt trickles
    ends after ``retries`` retries, in bounded time."""
    remote, traj = s3_stream
    def rule(r):
        return act("trickle", seconds=0.05) if _is_data_get(r) and r.attempt == 0 else None

    with _proxy(remote, rule) as proxy:
        so = s3_options(proxy.endpoint)
        fol = Follower(remote.url, tmp_path / "f", storage_options=so, chunk_size=1 << 20, backoff=0.01)
        fol.store.request_timeout = fol.fetcher.request_timeout = 1.0
        t0 = time.monotonic()
        ups = fol.sync()
        took = time.monotonic() - t0
        assert [u.step for u in ups] == [0, 1]
        assert_folder(fol.into, traj[1])
        trickled = proxy.count(lambda r: r.action == "trickle")
        assert trickled >= 2 and sum(u.retries for u in ups) == trickled
        assert took < 5 + 1.5 * trickled, took

        proxy.rule = lambda r: act("trickle", seconds=0.05) if _is_head(r) else None
        proxy.reset_log()
        st = Store(remote.url, so, retries=2, backoff=0.01, request_timeout=0.5)
        t0 = time.monotonic()
        with pytest.raises(TransportError, match=r"no complete answer within 0.5 s .*\(after 2 retries\)"):
            st.read(N.HEAD, MAX_HEAD_BYTES)
        assert time.monotonic() - t0 < 4
        # the message proves 3 attempts; under load the last one can be abandoned before the proxy has
        # logged it, so give its log a moment and never allow more than 3
        settle = time.monotonic() + 2
        while proxy.count(_is_head) < 3 and time.monotonic() < settle:
            time.sleep(0.05)
        assert 2 <= proxy.count(_is_head) <= 3


@pytest.mark.servers
def test_a_callers_deadline_ends_a_fetch(s3_stream):
    """``RangeFetcher.time_limit`` (a follower's per-step deadline): a fetch whose answers trickle ends
    when the caller's time is up, however long each request may take and however many retries are left."""
    remote, _ = s3_stream
    with _proxy(remote, lambda r: act("trickle", seconds=0.05) if _is_data_get(r) else None) as proxy:
        fs = s3_fs(s3_options(proxy.endpoint), strict=True)
        st = Store(remote.url, fs=fs)
        head = SL.parse_head(st.read(N.HEAD, MAX_HEAD_BYTES))
        m = SL.parse_manifest(st.read(N.manifest_name(head.step), SL.MAX_MANIFEST_BYTES), "m")
        o = m.shards[0].object("delta")
        f = RangeFetcher(fs, retries=50, backoff=0.01, request_timeout=30)
        t0 = time.monotonic()
        with f.time_limit(1.5), pytest.raises(TransportError, match="deadline"):
            f.fetch([(st.path(o.name), 0, o.size, o.name)])
        assert time.monotonic() - t0 < 4
        assert f.deadline is None


# ================================================================================= one retry layer

@pytest.mark.servers
def test_one_retry_layer(s3_stream, tmp_path):
    """A store that always answers 503: ``retries=2`` sends 3 requests for one head read (before: 150
    requests in 261 s at the defaults, arcfmt × s3fs × botocore), and ends at once. A caller's own
    botocore retries in ``storage_options`` are respected. ``retry_time`` caps the time spent retrying."""
    remote, _ = s3_stream
    with _proxy(remote, lambda r: act("status", status=503) if _is_head(r) else None) as proxy:
        so = s3_options(proxy.endpoint)
        for read in (lambda: Store(remote.url, so, retries=2, backoff=0.01).read(N.HEAD, MAX_HEAD_BYTES),
                     lambda: Store(remote.url, so, retries=2, backoff=0.01).read_versioned(N.HEAD, MAX_HEAD_BYTES),
                     lambda: Follower(remote.url, tmp_path / "f", storage_options=so, retries=2, backoff=0.01).head()):
            proxy.reset_log()
            t0 = time.monotonic()
            with pytest.raises(TransportError, match=r"\(after 2 retries\)"):
                read()
            assert time.monotonic() - t0 < 5
            assert proxy.count(_is_head) == 3
        # the caller asked botocore for 3 attempts: arcfmt's retries=0 then means 3 requests
        user = dict(so, config_kwargs={"retries": {"total_max_attempts": 3, "mode": "standard"}})
        proxy.reset_log()
        with pytest.raises(TransportError):
            Store(remote.url, user, retries=0, backoff=0.01).read(N.HEAD, MAX_HEAD_BYTES)
        assert proxy.count(_is_head) == 3
        # a cap on the time spent retrying
        # (the store's session is opened first: on a loaded machine that alone can take most of a second,
        # and a first attempt slower than retry_time rightly leaves no time for a retry)
        capped = Store(remote.url, so, retries=1000, backoff=0.05, retry_time=1.0)
        assert capped.read("not-there", 10, missing_ok=True) is None      # only the head answers 503
        proxy.reset_log()
        t0 = time.monotonic()
        with pytest.raises(TransportError, match="retry time"):
            capped.read(N.HEAD, MAX_HEAD_BYTES)
        assert time.monotonic() - t0 < 4
        assert 2 <= proxy.count(_is_head) < 60


@pytest.mark.servers
def test_one_retry_layer_gcs(request, tmp_path):
    """The same on GCS (fake-gcs-server behind the proxy): reads and commits go through gcsfs's session
    without gcsfs's own retries; an endless body and a whole-object answer are handled as on S3."""
    srv = request.getfixturevalue("fake_gcs_server")
    remote = Remote(srv, _unique(request))
    Store(remote.url, remote.storage_options).replace(N.HEAD, b"x" * 300, None)
    with FaultProxy(srv.endpoint) as proxy:
        so = dict(remote.storage_options, endpoint_url=proxy.endpoint)
        proxy.rule = lambda r: act("status", status=503) if r.method == "GET" else None
        t0 = time.monotonic()
        with pytest.raises(TransportError, match=r"\(after 2 retries\)"):
            Store(remote.url, so, retries=2, backoff=0.01).read(N.HEAD, MAX_HEAD_BYTES)
        assert time.monotonic() - t0 < 5 and proxy.count(lambda r: r.method == "GET") == 3
        proxy.rule = lambda r: act("status", status=503) if r.method == "POST" else None
        proxy.reset_log()
        with pytest.raises(TransportError, match=r"\(after 1 retries\)"):
            Store(remote.url, so, retries=1, backoff=0.01).create(N.manifest_name(1), b"m")
        assert proxy.count(lambda r: r.method == "POST") == 2
        proxy.rule = lambda r: act("endless") if r.method == "GET" else None
        proxy.reset_log()
        with pytest.raises(LimitError):
            Store(remote.url, so, retries=0).read(N.HEAD, 100)
        time.sleep(0.2)
        assert proxy.requests[0].sent < BOUND
        proxy.rule = lambda r: act("whole") if r.method == "GET" else None
        st = Store(remote.url, so, retries=0)
        assert st.read(N.HEAD, MAX_HEAD_BYTES) == b"x" * 300
        data, tok = st.read_versioned(N.HEAD, MAX_HEAD_BYTES)
        assert data == b"x" * 300 and st.replace(N.HEAD, b"y", tok) and not st.replace(N.HEAD, b"z", tok)


# ================================================================================= the spool

class MemFS(MemoryFileSystem):
    """A memory filesystem of its own that counts range requests."""

    protocol = ("wiremem",)
    calls: ClassVar[list] = []

    def cat_ranges(self, paths, starts, ends, max_gap=None, on_error="return", **kw):
        MemFS.calls.extend(zip(paths, starts, ends))
        return [self.cat_file(p, s, e) for p, s, e in zip(paths, starts, ends)]


BLOB = bytes(range(256)) * 16          # 4096 bytes
KEY = "steps/00000000000000000001/a"


@pytest.fixture
def memfs():
    fs = MemFS()
    MemFS.calls = []
    fs.pipe_file("/w/a", BLOB)
    yield fs
    fs.rm("/w", recursive=True)


def _run(fn, timeout=20):
    """``fn()`` in a thread; fails the test instead of hanging it."""
    out = {}

    def go():
        try:
            out["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out["error"] = exc

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), "hung"
    if "error" in out:
        raise out["error"]
    return out["value"]


def test_spool_entries_must_be_plain_chunks(memfs, tmp_path):
    """A FIFO, a symlink to /dev/zero, a sparse 1 GiB file and a folder planted under spool entries'
    names are never read: each is removed (a folder is left alone) and its chunk fetched again."""
    spool = str(tmp_path / "spool")
    RangeFetcher(memfs, chunk_size=1024, spool_dir=spool).fetch([("/w/a", 0, 4096, KEY)])
    names = sorted(os.listdir(spool))
    assert len(names) == 4 and all(R.spool_entry_key(n) == KEY for n in names)
    planted = {}
    for n, how in zip(names, ("fifo", "zero", "sparse", "dir")):
        p = os.path.join(spool, n)
        os.unlink(p)
        if how == "fifo":
            os.mkfifo(p)
        elif how == "zero":
            os.symlink("/dev/zero", p)
        elif how == "sparse":
            with open(p, "wb") as f:
                f.truncate(1 << 30)
        else:
            os.mkdir(p)
        planted[n] = how
    MemFS.calls = []
    stats = FetchStats()
    t0 = time.monotonic()
    got = _run(lambda: RangeFetcher(memfs, chunk_size=1024, spool_dir=spool, stats=stats).fetch(
        [("/w/a", 0, 4096, KEY)]))
    assert got == [BLOB] and time.monotonic() - t0 < 5
    assert stats.reused_chunks == 0 and stats.requests == 4 and len(MemFS.calls) == 4
    left = set(os.listdir(spool))
    for n, how in planted.items():
        p = os.path.join(spool, n)
        if how == "dir":
            assert os.path.isdir(p)
        else:
            assert n in left and os.path.isfile(p) and not os.path.islink(p) and os.path.getsize(p) == 1024
    # and now they are reused
    stats = FetchStats()
    RangeFetcher(memfs, chunk_size=1024, spool_dir=spool, stats=stats).fetch([("/w/a", 0, 4096, KEY)])
    assert stats.reused_chunks == 3 and stats.requests == 1


def test_a_symlink_planted_as_the_spool_folder_is_not_followed(memfs, tmp_path):
    """The spool folder is a symlink to another folder (before, ``forget`` deleted every file there):
    it is not used — not read, not written, nothing in the target is removed — and fetching works."""
    target = tmp_path / "precious"
    target.mkdir()
    (target / "notes.txt").write_bytes(b"keep me")
    decoy = f"{KEY.replace('/', '__')}.0-1024.{'0' * 16}"
    (target / decoy).write_bytes(b"\x00" * 1024)
    spool = tmp_path / "spool"
    os.symlink(target, spool)
    f = RangeFetcher(memfs, chunk_size=1024, spool_dir=str(spool))
    with pytest.warns(UserWarning, match="symbolic link"):
        got = f.fetch([("/w/a", 0, 4096, KEY)])
    assert got == [BLOB]
    f.forget(keep=lambda key: False)
    assert sorted(os.listdir(target)) == sorted(["notes.txt", decoy])
    assert (target / "notes.txt").read_bytes() == b"keep me"
    assert os.path.islink(spool)


def test_forget_removes_only_the_spools_own_entries(memfs, tmp_path):
    spool = tmp_path / "spool"
    f = RangeFetcher(memfs, chunk_size=1024, spool_dir=str(spool))
    f.fetch([("/w/a", 0, 2048, KEY), ("/w/a", 0, 1024, "steps/00000000000000000002/a")])
    foreign = ["notes.txt", ".hidden", "x.0-1.zz", "a.0-1.0123456789abcdeF", "..", "a b.0-1.0123456789abcdef"]
    for n in foreign:
        if n != "..":
            (spool / n).write_bytes(b"x")
    tmp = f".tmp-1-2-{KEY.replace('/', '__')}.0-1024.0123456789abcdef"
    (spool / tmp).write_bytes(b"x")
    f.forget(keep=lambda key: key.startswith("steps/00000000000000000002/"))
    left = sorted(os.listdir(spool))
    assert left == sorted([n for n in foreign if n != ".."] +
                          [n for n in left if R.spool_entry_key(n) == "steps/00000000000000000002/a"])
    assert len([n for n in left if R.spool_entry_key(n)]) == 1
    f.forget()
    assert sorted(os.listdir(spool)) == sorted(n for n in foreign if n != "..")


def test_the_spool_folder_is_private(memfs, tmp_path):
    spool = tmp_path / "spool"
    RangeFetcher(memfs, chunk_size=1024, spool_dir=str(spool)).fetch([("/w/a", 0, 1024, KEY)])
    assert (os.stat(spool).st_mode & 0o777) == 0o700
    assert all((os.stat(spool / n).st_mode & 0o077) == 0 for n in os.listdir(spool))


# ================================================================================= local stream objects

def test_a_fifo_in_a_local_stream_does_not_hang(tmp_path):
    """A FIFO where a local stream's head (or an object) belongs: refused at once, never opened for reading."""
    url = str(tmp_path / "stream")
    os.makedirs(url)
    os.mkfifo(os.path.join(url, N.HEAD))
    st = Store(url, retries=0)
    with pytest.raises(TransportError, match="not a regular file"):
        _run(lambda: st.read(N.HEAD, MAX_HEAD_BYTES))
    with pytest.raises(TransportError, match="not a regular file"):
        _run(lambda: st.read_versioned(N.HEAD, MAX_HEAD_BYTES))
    with pytest.raises(TransportError, match="not a regular file"):
        _run(lambda: st.read_many([N.HEAD], MAX_HEAD_BYTES))
    with pytest.raises(TransportError, match="not a regular file"):
        _run(lambda: RangeFetcher(st.fs, retries=0).fetch([(st.path(N.HEAD), 0, 10, N.HEAD)]))


def test_local_versions_are_read_within_the_limit(tmp_path):
    """The compare-and-swap of a local head reads at most ``limit + 1`` bytes of it, also to compare."""
    url = str(tmp_path / "stream")
    st = Store(url)
    assert st.replace(N.HEAD, b"h1", None)
    data, tok = st.read_versioned(N.HEAD, 100)
    assert data == b"h1" and st.replace(N.HEAD, b"h2", tok) and not st.replace(N.HEAD, b"h3", tok)
    with open(os.path.join(url, N.HEAD), "wb") as f:
        f.truncate(1 << 30)            # sparse: reading it whole would take 1 GiB
    with pytest.raises(LimitError):
        st.read_versioned(N.HEAD, 100)
    assert not st.replace(N.HEAD, b"h4", tok)
    assert not st.replace(N.HEAD, b"h4", "not-a-token")
