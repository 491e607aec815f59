"""Fixtures and helpers for the stream tests (``tests/test_store_*.py``, ``test_faults.py``, ``test_wire.py``;
a pytest plugin, loaded by ``tests/conftest.py``).

- Real object stores on 127.0.0.1, one per kind, started once per session on first use and stopped
  by PID at the end (``support.servers``); a test that needs one whose package is not installed is
  skipped with the reason. ``.ci/run`` installs them, so CI runs every test.
- Seeded RL-like trajectories (BF16 weights, ~1 % of values move by one ulp per step, FP32 norms),
  split into trainer shards; no dependency on ../shared.
"""
from __future__ import annotations

import json
import os
import re
import uuid

from support import servers

# Before any client library is imported (SPEC.md Part II / README: S3-compatible servers and emulators).
servers.use_client_env()

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from arcfmt.demo import make_model_pair  # noqa: E402
from arcfmt.safetensors_io import open_checkpoint, write_file  # noqa: E402
from support.cli import run  # noqa: E402

SERVER_KINDS = ["seaweedfs", "moto", "fake-gcs"]
S3_KINDS = ["seaweedfs", "moto"]
MLP = "model.layers.*.mlp.*"


# ------------------------------------------------------------------------------------ servers

def kinds(*names: str) -> list:
    """Values for a test's ``kind`` parameter: a server kind is marked ``servers`` (so ``-m "not slow"``
    leaves it out), others ("local", "memory") are not."""
    return [pytest.param(k, marks=pytest.mark.servers) if k in SERVER_KINDS else k for k in names]


def _server_fixture(kind):
    @pytest.fixture(scope="session")
    def fixture():
        try:
            srv = servers.STARTERS[kind]()
        except servers.ServerUnavailable as exc:
            pytest.skip(str(exc))
        try:
            yield srv
        finally:
            srv.stop()
    fixture.__name__ = f"{kind.replace('-', '_')}_server"
    return fixture


seaweedfs_server = _server_fixture("seaweedfs")
moto_server = _server_fixture("moto")
fake_gcs_server = _server_fixture("fake-gcs")


def _unique(request) -> str:
    name = re.sub(r"[^A-Za-z0-9_-]+", "-", request.node.name)[:60].strip("-")
    return f"{name}-{uuid.uuid4().hex[:10]}"


class Remote:
    """A unique stream location on a real server: ``url`` + ``storage_options`` (+ ``env`` for the CLI)."""

    def __init__(self, server, prefix):
        self.server = server
        self.kind = server.kind
        self.url = f"{servers.protocol(server)}://{servers.BUCKET}/{prefix}"
        self.storage_options = servers.storage_options(server)
        self.env = servers.client_env(server)

    def fs(self):
        import fsspec
        return fsspec.filesystem(servers.protocol(self.server), **self.storage_options)

    def __repr__(self):
        return f"Remote({self.kind}, {self.url})"


@pytest.fixture(params=kinds(*SERVER_KINDS))
def remote(request):
    """A fresh prefix on each real server kind (SeaweedFS, moto, fake-gcs-server)."""
    srv = request.getfixturevalue(f"{request.param.replace('-', '_')}_server")
    return Remote(srv, _unique(request))


@pytest.fixture(params=kinds(*S3_KINDS))
def s3_remote(request):
    srv = request.getfixturevalue(f"{request.param}_server")
    return Remote(srv, _unique(request))


@pytest.fixture
def memory_url(request):
    """A fresh ``memory://`` stream (removed afterwards)."""
    import fsspec

    url = f"memory://arcfmt-tests/{_unique(request)}"
    yield url
    fs = fsspec.filesystem("memory")
    if fs.exists(url):
        fs.rm(url, recursive=True)


@pytest.fixture(params=["memory", "local"])
def url(request, tmp_path, memory_url):
    """A fresh stream on ``memory://`` and in a local folder (the two stores every stream test covers)."""
    return memory_url if request.param == "memory" else str(tmp_path / "stream")


def publishers(url, n: int = 1, **kw) -> list:
    """One Publisher per shard of an ``n``-shard trainer (fast effort unless told otherwise)."""
    from arcfmt.store import Publisher

    kw.setdefault("effort", "fast")
    return [Publisher(url, shard=i, num_shards=n, **kw) for i in range(n)]


# ------------------------------------------------------------------------------------ data

def next_step(prev: dict, rng: np.random.Generator, density: float = 0.01) -> dict:
    """One RL-like step: ``density`` of the values move by one unit in the last place."""
    out = {}
    for name, a in prev.items():
        u = np.ascontiguousarray(a).view(f"<u{a.dtype.itemsize}").reshape(-1).copy()
        k = max(1, int(u.size * density))
        idx = rng.choice(u.size, size=k, replace=False)
        up = rng.random(k) < 0.5
        u[idx[up]] += 1
        u[idx[~up]] -= 1
        out[name] = u.view(a.dtype).reshape(a.shape)
    return out


def trajectory(steps: int = 4, seed: int = 0, layers: int = 2, d: int = 64, vocab: int = 500) -> list:
    """``steps`` checkpoints (name → array) of a small transformer-shaped model, seeded."""
    base, target = make_model_pair(seed=seed, layers=layers, d=d, vocab=vocab)
    out = [base, target][:steps]
    rng = np.random.default_rng(seed + 1000)
    while len(out) < steps:
        out.append(next_step(out[-1], rng))
    return out


def split(tensors: dict, n: int) -> list:
    """The tensors of a model as ``n`` trainer shards (contiguous groups, every shard non-empty)."""
    names = list(tensors)
    per = -(-len(names) // n)
    return [{k: tensors[k] for k in names[i * per:(i + 1) * per]} for i in range(n)]


def publish_step(pubs, step: int, tensors: dict, **kw) -> list:
    """Every shard publishes its part of ``tensors`` (in shard order); returns the results."""
    parts = split(tensors, len(pubs))
    return [p.publish(step, parts[i], **kw) for i, p in enumerate(pubs)]


def folder_tensors(path) -> dict:
    return open_checkpoint(os.fspath(path)).tensors()


def assert_folder(path, want: dict, names=None) -> None:
    """The folder holds exactly ``names`` (default: all of ``want``), bit for bit."""
    got = folder_tensors(path)
    names = set(want) if names is None else set(names)
    assert set(got) == names, (sorted(got), sorted(names))
    for n in names:
        assert got[n].dtype == want[n].dtype and got[n].shape == want[n].shape, n
        assert np.ascontiguousarray(got[n]).tobytes() == np.ascontiguousarray(want[n]).tobytes(), n


# ------------------------------------------------------------------------------------ command line

arcfmt = run    # the stream tests' name for it (support.cli.run)


def run_cli_trajectory(url, tmp_path, traj, env=None, steps=3, shards=2, extra=()):
    """Trainer ranks publish safetensors shards with ``arcfmt publish --state``; two followers follow."""
    state = tmp_path / "state"
    for s in range(steps):
        for i, part in enumerate(split(traj[s], shards)):
            d = tmp_path / "ckpt" / f"step{s:04d}"
            d.mkdir(parents=True, exist_ok=True)
            f = d / f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
            write_file(f, part, {"format": "pt"})
            p = arcfmt("publish", url, f, "--shard", f"{i}/{shards}", "--state", state / str(i), "--json",
                       "--effort", "fast", *extra, env=env, rc=0)
            out = json.loads(p.stdout)
            assert out["step"] == s and out["committed"] == (i == shards - 1)
            assert (out["delta"] is not None) == (s > 0)
    p = arcfmt("follow", url, "--into", tmp_path / "full", "--once", "--json", *extra, env=env, rc=0)
    lines = [json.loads(x) for x in p.stdout.splitlines()]
    assert lines[-1] == {"event": "done", "step": steps - 1, "head": steps - 1, "applied": steps,
                         "into": str(tmp_path / "full")}
    assert lines[0]["kind"] == "keyframe" and lines[0]["verified_model"]
    assert_folder(tmp_path / "full", traj[steps - 1])
    files = sorted(n for n in os.listdir(tmp_path / "full") if n.endswith(".safetensors"))
    assert files == [f"model-{i + 1:05d}-of-{shards:05d}.safetensors" for i in range(shards)]
    p = arcfmt("follow", url, "--into", tmp_path / "mlp", "--tensors", MLP, "--until", steps - 1, *extra,
               env=env, rc=0)
    assert "verified" in p.stdout and "lag 0" in p.stdout
    assert_folder(tmp_path / "mlp", traj[steps - 1], {n for n in traj[0] if ".mlp." in n})


H32 = "0123456789abcdef" * 2  # a well-formed 32-hex digest


def object_ref(kind="delta", step=5, shard=0, n=1, **kw) -> dict:
    """A well-formed data-object reference of a manifest or descriptor (SPEC S4), fields overridable."""
    from arcfmt.store import names as N
    d = dict(name=N.object_name(step, shard, n, kind, H32), size=1000, xxh3_128=H32, index_offset=800,
             tail_xxh3_64="0123456789abcdef")
    if kind == "delta":
        d.update(base_step=step - 1, base_digest=H32)
    d.update(kw)
    return d
