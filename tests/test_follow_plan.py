"""The follower's plan and its guard rails on what a bucket writer can change, and the store's
backend registry and argument checks."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
from fsspec.implementations.local import LocalFileSystem
from fsspec.implementations.memory import MemoryFileSystem

import arcfmt
from arcfmt.errors import CorruptError, InputError
from arcfmt.store import backends
from arcfmt.store import names as N
from arcfmt.store.objects import canonical, digest128


def _stream(tmp_path, steps=2):
    url = str(tmp_path / "stream")
    rng = np.random.default_rng(0)
    w = {"a": rng.standard_normal(64).astype(np.float32), "b": rng.standard_normal(8).astype(np.float32)}
    pub = arcfmt.Publisher(url, shard=0, num_shards=1)
    published = {}
    for s in range(steps):
        w = {k: v + np.float32(s) for k, v in w.items()}
        pub.publish(s, w)
        published[s] = w
    return url, published


def _rewrite_manifest(url, step, edit):
    """A bucket writer's edit of one manifest, re-chained into the head (the last step's manifest)."""
    path = os.path.join(url, N.manifest_name(step))
    m = json.loads(open(path, "rb").read())
    edit(m)
    raw = canonical(m)
    with open(path, "wb") as f:
        f.write(raw)
    head_path = os.path.join(url, N.HEAD)
    h = json.loads(open(head_path, "rb").read())
    h["manifest"] = digest128(raw)
    with open(head_path, "wb") as f:
        f.write(canonical(h))


def test_an_index_must_hold_the_manifests_tensor_count(tmp_path):
    url, _ = _stream(tmp_path, steps=1)

    def more(m):
        m["shards"][0]["tensors"] += 1
        m["tensors"] += 1

    _rewrite_manifest(url, 0, more)
    for tensors in (None, ["a"]):
        with pytest.raises(CorruptError, match="tensors, the manifest"):
            arcfmt.Follower(url, into=tmp_path / "f", tensors=tensors).sync()
        assert not (tmp_path / "f").exists()


def test_a_folder_at_the_heads_step_with_another_manifest_starts_again(tmp_path):
    """The head's step with another manifest than the folder's (the stream rewritten at that step):
    the follower is off the chain and rebuilds from a keyframe instead of saying it is up to date."""
    url, published = _stream(tmp_path, steps=1)
    into = tmp_path / "f"
    arcfmt.Follower(url, into=into).sync()
    before = json.loads((into / "arcfmt-stream.json").read_text())["manifest"]
    _rewrite_manifest(url, 0, lambda m: m.__setitem__("writer", "job-2"))
    (u,) = arcfmt.Follower(url, into=into).sync()
    assert u.step == 0 and u.kind == "keyframe"
    assert json.loads((into / "arcfmt-stream.json").read_text())["manifest"] != before
    assert arcfmt.Follower(url, into=into).sync() == []


def test_each_filesystem_gets_its_own_backend_class():
    assert backends.backend_class(LocalFileSystem()) is backends.LocalBackend
    assert backends.backend_class(MemoryFileSystem()) is backends.MemoryBackend
    assert issubclass(backends.GenericBackend, backends.Backend)


@pytest.mark.parametrize("kw", [dict(retries=-1), dict(backoff=-1.0), dict(request_timeout=0),
                                dict(retry_time=-1), dict(chunk_size=0), dict(memory_budget=-5),
                                dict(step_timeout=-1)])
def test_bad_follower_arguments_are_input_errors(tmp_path, kw):
    with pytest.raises(InputError):
        arcfmt.Follower(str(tmp_path / "s"), into=tmp_path / "f", **kw)


def test_a_step_parses_each_shards_index_once(tmp_path, monkeypatch):
    """The follower plans a step from each shard's index and hands that index to the reader, which
    checks the INDX record's checksum but does not parse it a second time."""
    from arcfmt import records
    url, published = _stream(tmp_path, steps=3)
    follower = arcfmt.Follower(url, into=tmp_path / "f")
    follower.sync()
    nxt = {k: v + np.float32(7) for k, v in published[2].items()}
    arcfmt.Publisher(url, shard=0, num_shards=1).publish(3, nxt)
    calls = []
    real = records.parse_index
    monkeypatch.setattr(records, "parse_index", lambda *a, **k: calls.append(1) or real(*a, **k))
    (update,) = follower.sync()
    assert update.step == 3 and len(calls) == 1
    assert {n: a.tobytes() for n, a in update.weights()} == {n: v.tobytes() for n, v in nxt.items()}


def test_a_reader_uses_a_given_index_only_if_its_own_bytes_give_it(tmp_path):
    """DeltaReader(index=): another file's index (or one from other bytes) is not trusted: the reader
    parses its own; the index of its own INDX record is used as it is."""
    from arcfmt import records
    from arcfmt.reader import DeltaReader
    from support.data import make_pair
    b1, t1 = make_pair(1, "BF16", [(300,), (40,)], 0.1, names=["a", "b"])
    b2, t2 = make_pair(2, "BF16", [(50,)], 0.1, names=["c"])
    one, two = arcfmt.encode(b1, t1), arcfmt.encode(b2, t2)
    mine = DeltaReader(one).index
    assert DeltaReader(one, index=mine).index is mine
    other = DeltaReader(two).index
    r = DeltaReader(one, index=other)
    assert r.index is not other and r.names == ["a", "b"]
    bare = records.Index(other.base_digest, other.target_digest, other.entries, other.others, other.compact,
                         other.inline_blocks)   # no record of what it was parsed from
    assert DeltaReader(two, index=bare).index is not bare
