"""Notification: a hook once per committed step on the trainer side, a push that wakes a follower
before its next poll (issue 15 item 6; the head stays the contract, SPEC.md S8.2 *Notifications*)."""
from __future__ import annotations

import json
import os
import sys
import threading
import time

import pytest

from arcfmt.errors import InputError
from arcfmt.safetensors_io import write_file
from arcfmt.store import Follower, Publisher
from support.store import arcfmt, publish_step, trajectory


@pytest.fixture(scope="module")
def traj():
    return trajectory(steps=4, seed=9)


def test_on_commit_runs_once_per_committed_step(memory_url, traj):
    seen = []
    pubs = [Publisher(memory_url, shard=i, num_shards=3, effort="fast", on_commit=seen.append) for i in range(3)]
    for s in range(3):
        publish_step(pubs, s, traj[s])
    assert [f["step"] for f in seen] == [0, 1, 2]          # the committer only, once per step
    f = seen[1]
    assert f["event"] == "commit" and f["shards"] == 3 and f["base_step"] == 0 and f["head"] == 1
    assert set(f["bytes"]) == {"delta"} and f["bytes"]["delta"] > 0 and len(f["manifest"]) == 32
    publish_step(pubs, 2, traj[2])                          # a retry commits nothing new: no second call
    assert len(seen) == 3


def test_a_failing_hook_never_fails_the_publish(memory_url, traj):
    def boom(facts):
        raise RuntimeError("the message bus is down")

    with pytest.warns(UserWarning, match="the message bus is down"):
        res = Publisher(memory_url, effort="fast", on_commit=boom).publish(0, traj[0])
    assert res.commit.committed
    with pytest.warns(UserWarning, match="exited with 3"):
        Publisher(memory_url, effort="fast", on_commit="exit 3").publish(1, traj[1], base=traj[0], base_step=0)
    with pytest.raises(InputError):
        Publisher(memory_url, on_commit=42)


def test_cli_on_commit_gets_json_on_stdin(tmp_path, traj):
    out = tmp_path / "facts.jsonl"
    cmd = f"{sys.executable} -c 'import sys; open(sys.argv[1], \"a\").write(sys.stdin.read())' {out}"
    for s in range(2):
        f = tmp_path / f"step{s:04d}" / "model.safetensors"
        f.parent.mkdir()
        write_file(f, traj[s])
        arcfmt("publish", tmp_path / "stream", f, "--state", tmp_path / "state", "--effort", "fast",
               "--on-commit", cmd, rc=0)
    facts = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(x["step"], x["keyframe"], x["url"]) for x in facts] == [(0, True, str(tmp_path / "stream")),
                                                                     (1, False, str(tmp_path / "stream"))]


def _follow_in_thread(fol, **kw):
    got = []

    def run():
        for u in fol.follow(until=1, interval=30.0, **kw):
            got.append((u.step, time.monotonic()))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, got


def test_wake_fifo_ends_the_poll_wait(tmp_path, traj):
    url = str(tmp_path / "stream")
    pub = Publisher(url, effort="fast")
    pub.publish(0, traj[0])
    fifo = tmp_path / "wake"
    fol = Follower(url, tmp_path / "f")
    t, got = _follow_in_thread(fol, wake_fifo=str(fifo))
    deadline = time.monotonic() + 20
    while not got and time.monotonic() < deadline:
        time.sleep(0.02)
    assert got and got[0][0] == 0
    pub.publish(1, traj[1])
    t0 = time.monotonic()
    fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)     # what a notification subscriber does
    os.write(fd, b"step 1\n")
    os.close(fd)
    t.join(20)
    assert not t.is_alive() and got[-1][0] == 1
    assert got[-1][1] - t0 < 10                          # woken, not after the 30 s poll interval


def test_wake_from_python_and_bad_fifos(tmp_path, traj):
    url = str(tmp_path / "stream")
    pub = Publisher(url, effort="fast")
    pub.publish(0, traj[0])
    fol = Follower(url, tmp_path / "f")
    t, got = _follow_in_thread(fol)
    deadline = time.monotonic() + 20
    while not got and time.monotonic() < deadline:
        time.sleep(0.02)
    pub.publish(1, traj[1])
    fol.wake()
    t.join(20)
    assert not t.is_alive() and got[-1][0] == 1
    plain = tmp_path / "plain"
    plain.write_text("x")
    with pytest.raises(InputError, match="not a named pipe"):
        next(Follower(url, tmp_path / "g").follow(until=5, wake_fifo=str(plain)))
    link = tmp_path / "link"
    os.symlink(tmp_path / "wake-target", link)
    os.mkfifo(tmp_path / "wake-target")
    with pytest.raises(InputError, match="link"):
        next(Follower(url, tmp_path / "h").follow(until=5, wake_fifo=str(link)))
