"""The previous step (format 1.9, SPEC.md §7 "History", §8.11 ``ctx-delta-rh``): a file written with
it codes signs in contexts of each element's last change, names that step by hash, and is read only
with it — a missing or wrong previous step is refused before anything is decoded, never misread."""
from __future__ import annotations

import dataclasses
import io
import json

import numpy as np
import pytest
from test_ctx_delta import CTX_NAMES

import arcfmt
from arcfmt import backend, records, twins
from arcfmt import layout as L
from arcfmt.encodings import ctx_delta as ctx
from arcfmt.errors import InputError, WrongBaseError
from arcfmt.history import History
from arcfmt.writer import DeltaWriter
from support.cli import run
from support.data import BY_NAME, assert_bit_exact, bits_of, random_values

kernels = backend.compiled()


def _steps(name: str, seed: int, shape=(60, 100), moved: float = 0.3, again: float = 0.3, same: float = 0.9):
    """(previous, base, target) of one dtype: ``moved`` of the elements changed one unit from the
    previous step to the base, ``again`` of them change again, ``same`` of those the same way (momentum),
    and as many others change with a random sign; values of both signs, so ``ord`` matters."""
    dt = BY_NAME[name]
    rng = np.random.default_rng(seed)
    prev = bits_of(random_values(rng, dt, shape)).reshape(-1).copy()
    half = 1 << (dt.bits - 1)
    o = ctx.ordered(ctx_dt(name), prev)
    up = np.where(rng.random(o.size) < 0.5, 1, -1)
    moved_mask = rng.random(o.size) < moved
    ob = np.where(moved_mask, o + up, o).clip(-half, half - 1)
    step = np.where(rng.random(o.size) < same, up, -up)
    again_mask = moved_mask & (rng.random(o.size) < again)
    fresh = ~moved_mask & (rng.random(o.size) < again * moved)
    step = np.where(fresh, np.where(rng.random(o.size) < 0.5, 1, -1), step)
    ot = np.where(again_mask | fresh, ob + step, ob).clip(-half, half - 1)
    arr = [ctx.unordered(ctx_dt(name), x).astype(prev.dtype).view(dt.np).reshape(shape) for x in (o, ob, ot)]
    return {"w": arr[0]}, {"w": arr[1]}, {"w": arr[2]}


def ctx_dt(name):
    from arcfmt.dtypes import from_name
    return from_name(name)


def _write(base, target, **kw) -> tuple[bytes, DeltaWriter]:
    buf = io.BytesIO()
    with DeltaWriter(buf, **kw) as w:
        w.write_tensors((n, base.get(n), t) for n, t in target.items())
    return buf.getvalue(), w


@pytest.mark.parametrize("name", CTX_NAMES)
def test_a_file_with_history_rebuilds_only_with_its_previous_step(name):
    prev, base, target = _steps(name, 7)
    data, w = _write(base, target, previous=prev, force_encoding="ctx-delta-rh")
    assert [b.encoding for t in w.stats for b in t.blocks] == ["ctx-delta-rh"]
    assert_bit_exact(arcfmt.decode(base, data, previous=prev), target)
    assert_bit_exact(dict(arcfmt.StreamReader(io.BytesIO(data), base, previous=prev)), target)
    kept = History.between(prev["w"], base["w"])
    assert_bit_exact(arcfmt.decode(base, data, previous={"w": kept}), target)
    with pytest.raises(WrongBaseError, match="needs the previous step"):
        arcfmt.decode(base, data)
    with pytest.raises(WrongBaseError, match="needs the previous step"):
        list(arcfmt.StreamReader(io.BytesIO(data), base))
    wrong = bits_of(prev["w"]).copy()
    wrong.reshape(-1)[5] ^= 1
    with pytest.raises(WrongBaseError, match="not the previous step"):
        arcfmt.decode(base, data, previous={"w": wrong.view(prev["w"].dtype)})
    with pytest.raises(WrongBaseError, match="expects"):
        arcfmt.decode(base, data, previous={"w": prev["w"].reshape(-1)})
    # a history kept for another base: the hashes name both ends
    with pytest.raises(WrongBaseError, match="leads to another base"):
        arcfmt.decode(base, data, previous={"w": dataclasses.replace(kept, base_hash=kept.base_hash ^ 1)})


def test_history_pays_where_signs_follow_the_last_move_and_costs_nothing_elsewhere():
    """The default writer picks ctx-delta-rh per block where its contexts size the signs smaller by
    more than the record's hash, else ctx-delta-rc, whose record then names no previous step. (Here
    the elements that moved move again at thrice the rate of the rest: ctx-delta-rhp, §8.12, where
    format 1.10 may be written.)"""
    prev, base, target = _steps("BF16", 3, shape=(200, 300), same=0.95)
    with_prev, w = _write(base, target, previous=prev, readers=(1, 9))
    without, _ = _write(base, target)
    assert [b.encoding for t in w.stats for b in t.blocks] == ["ctx-delta-rh"]
    assert [b.encoding for t in _write(base, target, previous=prev)[1].stats for b in t.blocks] == ["ctx-delta-rhp"]
    assert len(with_prev) < 0.95 * len(without)
    # signs that ignore the last move: no history used, the file needs no previous step
    prev2, base2, target2 = _steps("BF16", 4, shape=(200, 300), same=0.5)
    data, w = _write(base2, target2, previous=prev2, readers=(1, 9))
    assert [b.encoding for t in w.stats for b in t.blocks] == ["ctx-delta-rc"]
    assert_bit_exact(arcfmt.decode(base2, data), target2)


def test_what_carries_history():
    """Tensors of the ctx-delta dtypes, of at least 4096 elements, given a previous value of their dtype
    and shape; not in the modes for older readers; forced ctx-delta-rh without one is refused."""
    prev, base, target = _steps("BF16", 5)
    small = {"s": base["w"][:10]}
    data, w = _write({**base, **small}, {**target, "s": target["w"][:10]}, previous={**prev, "s": prev["w"][:10]})
    r = arcfmt.DeltaReader(data)
    assert r.meta.history and r.header("w").needs_history and not r.header("s").needs_history
    data, _ = _write(base, target, previous=prev, compact_index=False)
    assert not arcfmt.DeltaReader(data).meta.history
    assert_bit_exact(arcfmt.decode(base, data), target)
    with pytest.raises(InputError, match="needs the previous step"):
        _write(base, target, force_encoding="ctx-delta-rh")
    with pytest.raises(InputError, match="mapping"):
        DeltaWriter(io.BytesIO(), previous=[1])


def test_apply_in_place_with_the_previous_step():
    prev, base, target = _steps("F32", 9)
    data, _ = _write(base, target, previous=prev, force_encoding="ctx-delta-rh")
    live = {"w": base["w"].copy()}
    with pytest.raises(WrongBaseError):
        list(arcfmt.apply_in_place(live, data))
    assert np.array_equal(bits_of(live["w"]), bits_of(base["w"]))
    list(arcfmt.apply_in_place(live, data, previous=prev))
    assert_bit_exact(live, target)


@pytest.mark.skipif(kernels is None, reason="numba not installed or ARCFMT_JIT=0")
@pytest.mark.parametrize("name", CTX_NAMES)
@pytest.mark.parametrize("same", [0.5, 0.95])
def test_ctx_delta_rh_matches_the_numpy_twins(name, same):
    """The same choice, params and stream from both backends; each decodes the other's."""
    prev, base, target = _steps(name, 11, same=same)
    out = []
    for chosen in (kernels, twins):
        with backend.using(chosen):
            out.append(_write(base, target, previous=prev)[0])
    assert out[0] == out[1]
    with backend.using(twins):
        assert_bit_exact(arcfmt.decode(base, out[0], previous=prev), target)


def test_the_command_line_encodes_and_applies_with_previous(tmp_path):
    from arcfmt.safetensors_io import write_file
    prev, base, target = _steps("F32", 13)
    for n, d in (("p", prev), ("b", base), ("t", target)):
        write_file(str(tmp_path / f"{n}.safetensors"), d)
    run("encode", tmp_path / "b.safetensors", tmp_path / "t.safetensors", "--previous", tmp_path / "p.safetensors",
        "-o", tmp_path / "d.arc", rc=0)
    p = run("apply", tmp_path / "b.safetensors", tmp_path / "d.arc", "-o", tmp_path / "o.safetensors", rc=1)
    assert p.stderr.count("\n") == 1 and "wrong_base" in p.stderr and "previous step" in p.stderr
    assert not (tmp_path / "o.safetensors").exists()
    run("apply", tmp_path / "b.safetensors", tmp_path / "d.arc", "--previous", tmp_path / "b.safetensors",
        "-o", tmp_path / "o.safetensors", rc=1)
    run("apply", tmp_path / "b.safetensors", tmp_path / "d.arc", "--previous", tmp_path / "p.safetensors",
        "-o", tmp_path / "o.safetensors", rc=0)
    assert (tmp_path / "o.safetensors").read_bytes() == (tmp_path / "t.safetensors").read_bytes()


# ------------------------------------------------------------------------------------ streams

def _momentum(steps: int, seed: int = 0, shape=(64, 512)) -> list[dict]:
    """Checkpoints of one BF16 tensor (and a small F32 one) whose weights keep moving the way they last
    moved: each step, a fifth of them move one unit, 95 % of those in their last direction."""
    rng = np.random.default_rng(seed)
    dt = BY_NAME["BF16"]
    o = ctx.ordered(ctx_dt("BF16"), bits_of(random_values(rng, dt, shape)).reshape(-1))
    way = np.where(rng.random(o.size) < 0.5, 1, -1)
    bias = rng.standard_normal(16).astype(np.float32)
    out = []
    for _ in range(steps):
        out.append({"w": ctx.unordered(ctx_dt("BF16"), o).astype(np.uint16).view(dt.np).reshape(shape),
                    "b": bias.copy()})
        way = np.where(rng.random(o.size) < 0.05, -way, way)
        o = o + np.where(rng.random(o.size) < 0.2, way, 0)
        bias = bias + np.float32(0.001)
    return out


def _encodings(url, step):
    from arcfmt.store.backends import Store
    from arcfmt.store.objects import parse_manifest
    st = Store(url)
    m = parse_manifest(st.read(f"steps/{step:020d}/manifest.json", 1 << 20), f"steps/{step:020d}/manifest.json")
    ref = m.shards[0].delta
    r = arcfmt.DeltaReader(st.read(ref.name, ref.size))
    return {b.encoding for n in r.names for b in r.entries[n].blocks}


def test_a_stream_writes_history_and_every_follower_keeps_it(tmp_path):
    """Deltas after the first are written with the previous step, except the one after a keyframe
    step; a folder follower and a live one rebuild every step bit for bit, keep the history beside
    the folder's state, and a follower started again later reads it back."""
    from arcfmt.store import Follower, Publisher
    from arcfmt.store.follower import HISTORY_NAME
    from support.store import assert_folder
    url = str(tmp_path / "stream")
    traj = _momentum(8)
    pub = Publisher(url, keyframe_every=4)
    folder, live = Follower(url, tmp_path / "f"), {}
    live_fol = Follower(url, live=live)
    rh = ctx.CtxDeltaRh.id
    for step, t in enumerate(traj):
        pub.publish(step, t)
        assert [u.kind for u in folder.sync()] == ["keyframe" if step == 0 else "delta"]
        live_fol.sync()
        assert_folder(tmp_path / "f", t)
        assert_bit_exact(live, t)
        if step:
            assert (rh in _encodings(url, step)) == (step not in (1, 5)), step   # 4 is a keyframe step
        assert (tmp_path / "f" / HISTORY_NAME).is_file()   # (after a keyframe: one that says so)
    more = _momentum(10)[8:]
    pub.publish(8, more[0])
    events = []
    again = Follower(url, tmp_path / "f", progress=events.append)   # a new process: history from the folder
    assert [u.kind for u in again.sync()] == ["delta"] and not [e for e in events if e["event"] == "restart"]
    assert rh in _encodings(url, 8)
    assert_folder(tmp_path / "f", more[0])


@pytest.mark.parametrize("damage", ["missing", "other step", "bad code", "flipped code", "short", "symlink"])
def test_a_follower_without_its_history_starts_again_from_a_keyframe(tmp_path, damage):
    """A history file lost, of another step, with a code above 2, truncated or a link: never used;
    the delta that needs it is refused and the follower takes the latest keyframe, then the deltas."""
    from arcfmt.store import Follower, Publisher
    from arcfmt.store.follower import HISTORY_NAME
    from support.store import assert_folder
    url = str(tmp_path / "stream")
    traj = _momentum(8)
    pub = Publisher(url, keyframe_every=4)
    fol = Follower(url, tmp_path / "f")
    for step, t in enumerate(traj[:7]):
        pub.publish(step, t)
        fol.sync()
    h = tmp_path / "f" / HISTORY_NAME
    if damage == "missing":
        h.unlink()
    elif damage == "other step":
        saved = h.read_bytes()
        pub.publish(7, traj[7])
        fol.sync()
        h.write_bytes(saved)
    elif damage in ("bad code", "flipped code"):   # a code of 3; a 1 made 2 (the codes' hash tells)
        data = bytearray(h.read_bytes())
        data[-1] = 3 if damage == "bad code" else data[-1] ^ 3
        h.write_bytes(bytes(data))
    elif damage == "short":
        h.write_bytes(h.read_bytes()[:-1])
    else:
        (tmp_path / "elsewhere").write_bytes(h.read_bytes())
        h.unlink()
        h.symlink_to(tmp_path / "elsewhere")
    last = 7 if damage != "other step" else 8
    t = _momentum(10)[last] if last == 8 else traj[7]
    pub.publish(last, t)
    events = []
    again = Follower(url, tmp_path / "f", progress=events.append)
    ups = again.sync()
    kf = last // 4 * 4   # the latest keyframe step
    assert [(u.step, u.kind) for u in ups] == [(kf, "keyframe")] + [(s, "delta") for s in range(kf + 1, last + 1)]
    assert [e["event"] for e in events if e["event"] == "restart"] == ["restart"]
    assert_folder(tmp_path / "f", t)


def test_a_publisher_keeps_the_previous_step_across_processes_or_writes_none(tmp_path):
    """With state_dir, a new Publisher per step (as ``arcfmt publish``) still writes history; with
    history=False (followers older than 1.9) no delta needs a previous step."""
    from arcfmt.store import Follower, Publisher
    from support.store import assert_folder
    traj = _momentum(5)
    for history in (True, False):
        url = str(tmp_path / f"stream-{history}")
        fol = Follower(url, tmp_path / f"f-{history}")
        for step, t in enumerate(traj):
            Publisher(url, keyframe_every=0, state_dir=str(tmp_path / f"state-{history}"), remember=False,
                      history=history).publish(step, t)
            fol.sync()
            assert_folder(tmp_path / f"f-{history}", t)
            if step >= 2:
                assert (ctx.CtxDeltaRh.id in _encodings(url, step)) == history


# ------------------------------------------------------------------------------------ found by review

def test_a_history_made_by_hand_is_copied_and_checked():
    """Codes of 3, of the wrong length, in an array subclass that lies about its contents, or fields of
    the wrong type: InputError, never an index past the kernels' contexts."""
    prev, base, target = _steps("BF16", 21)
    data, _ = _write(base, target, previous=prev, force_encoding="ctx-delta-rh")
    good = History.between(prev["w"], base["w"])

    class Lying(np.ndarray):
        def max(self, *a, **k):
            return np.uint8(0)
    bad = good.packed.copy()
    bad[0] = 0xFF
    for packed in (bad, bad.view(Lying), good.packed[:-1], np.ma.masked_array(bad)):
        with pytest.raises(InputError, match="codes"):
            arcfmt.decode(base, data, previous={"w": dataclasses.replace(good, packed=packed)})
    for field, value in (("dtype", "BF16"), ("shape", 5), ("previous_hash", "0")):
        with pytest.raises(InputError):
            arcfmt.decode(base, data, previous={"w": dataclasses.replace(good, **{field: value})})
    with pytest.raises(InputError, match="mapping"):
        arcfmt.decode(base, data, previous=[prev["w"]])
    assert_bit_exact(arcfmt.decode(base, data, previous={"w": good}), target)


def _stream(tmp_path, steps, **kw):
    from arcfmt.store import Publisher
    url = str(tmp_path / "stream")
    pub = Publisher(url, **kw)
    return url, pub, _momentum(steps)


def test_a_delta_that_needs_a_history_after_a_keyframe_is_the_streams_fault(tmp_path, monkeypatch):
    """A publisher that breaks S8.2 (history right after a keyframe step): the follower that joins at
    the keyframe reports wrong_base once, and never loops through keyframes."""
    from arcfmt.store import Follower, Publisher
    real = Publisher._remember

    def keep_always(self, step, target, source_path, file, delta_from=None, given=False, hashes=None, **kw):
        real(self, step, target, source_path, file, delta_from, given, hashes, **kw)
        if self._last is not None and delta_from is None and step > 0:   # (a keyframe step: keep it anyway)
            self._before, self._before_history = (step - 1, self._prev_for_test, step), True
        self._prev_for_test = {n: a.copy() for n, a in self._last[1].items()}   # (its buffers are reused)
    monkeypatch.setattr(Publisher, "_remember", keep_always)
    url, pub, traj = _stream(tmp_path, 4, keyframe_every=2)
    pub._prev_for_test = None
    for step, t in enumerate(traj):
        pub.publish(step, t)
    assert ctx.CtxDeltaRh.id in _encodings(url, 3)
    events = []
    fol = Follower(url, tmp_path / "f", progress=events.append)
    with pytest.raises(WrongBaseError, match="keyframe step"):
        fol.sync()
    assert fol.step == 2 and not [e for e in events if e["event"] == "restart"]


def test_the_publishers_history_is_its_own(tmp_path):
    """A base given by the caller (base=) and changed afterwards, and a state folder whose "before"
    entry points elsewhere: the next delta is still one that applies."""
    from arcfmt.store import Follower, Publisher
    from support.store import assert_folder
    url, pub, traj = _stream(tmp_path, 4, keyframe_every=0)
    fol = Follower(url, tmp_path / "f")
    pub.publish(0, traj[0])
    buf = {k: v.copy() for k, v in traj[0].items()}
    pub.publish(1, traj[1], base=buf, base_step=0)
    buf["w"][...] = traj[3]["w"]   # the trainer reuses its buffer
    for step in (2, 3):
        pub.publish(step, traj[step])
        fol.sync()
        assert_folder(tmp_path / "f", traj[step])
    state = tmp_path / "state"
    url2 = str(tmp_path / "stream2")
    for step in range(3):
        Publisher(url2, keyframe_every=0, state_dir=str(state), remember=False).publish(step, traj[step])
    (jpath,) = state.glob("*.json")
    st = json.loads(jpath.read_text())
    assert "before" in st
    st["before"]["tensors"] = ".."
    jpath.write_text(json.dumps(st))
    Publisher(url2, keyframe_every=0, state_dir=str(state), remember=False).publish(3, traj[3])
    assert ctx.CtxDeltaRh.id not in _encodings(url2, 3)   # written without a previous step
    Follower(url2, tmp_path / "f2").sync()
    assert_folder(tmp_path / "f2", traj[3])


def test_followers_keep_no_history_for_a_stream_that_needs_none(tmp_path):
    from arcfmt.store import Follower
    url, pub, traj = _stream(tmp_path, 5, keyframe_every=0, history=False)
    fol = Follower(url, tmp_path / "f")
    for step, t in enumerate(traj):
        pub.publish(step, t)
        fol.sync()
    assert fol._histories == {}   # after two deltas without HISTORY, nothing is kept


def test_a_second_follower_of_the_folder_and_a_folder_changed_by_hand(tmp_path):
    """Another follower object moves the folder on: the first one's kept history is not used for a
    step it no longer holds. A tensor changed by hand is wrong_base even with the history gone (a lost
    history never hides a wrong base behind a restart)."""
    from arcfmt.safetensors_io import write_file
    from arcfmt.store import Follower
    from arcfmt.store.follower import HISTORY_NAME
    from support.store import assert_folder, folder_tensors
    url, pub, traj = _stream(tmp_path, 7, keyframe_every=0)
    a, b = Follower(url, tmp_path / "f"), Follower(url, tmp_path / "f")
    for step in range(5):
        pub.publish(step, traj[step])
        (a if step < 3 else b).sync()
    pub.publish(5, traj[5])
    a.sync()
    assert_folder(tmp_path / "f", traj[5])
    files = [p for p in (tmp_path / "f").glob("*.safetensors")]
    tensors = {k: np.array(v) for k, v in folder_tensors(tmp_path / "f").items()}
    tensors["b"] = tensors["b"] + np.float32(1)
    write_file(str(files[0]), tensors)
    (tmp_path / "f" / HISTORY_NAME).unlink()
    pub.publish(6, traj[6])
    events = []
    with pytest.raises(WrongBaseError, match="base tensor 'b'"):
        Follower(url, tmp_path / "f", progress=events.append).sync()
    assert not [e for e in events if e["event"] == "restart"]


def test_a_base_and_previous_step_given_with_their_hashes_are_not_hashed_again(monkeypatch):
    """KnownBase values: the writer names them by the hash given, hashing only the target, and writes
    the same bytes as from plain arrays. A wrong hash is never a misread: the file is refused."""
    from arcfmt import writer as wmod
    from arcfmt.integrity import KnownBase, tensor_hash
    prev, base, target = _steps("BF16", 7, shape=(80, 160))
    plain, _ = _write(base, target, previous=prev)
    hashed = []
    monkeypatch.setattr(wmod, "tensor_hash", lambda u: hashed.append(u.nbytes) or tensor_hash(u))
    h = {n: tensor_hash(bits_of(a)) for n, a in {**base, "p": prev["w"]}.items()}
    known, _ = _write({"w": KnownBase(base["w"], h["w"])}, target, previous={"w": KnownBase(prev["w"], h["p"])})
    assert known == plain and hashed == [target["w"].nbytes]
    lied, _ = _write({"w": KnownBase(base["w"], h["w"] ^ 1)}, target)
    with pytest.raises(WrongBaseError):
        arcfmt.decode(base, lied)


def test_a_publisher_names_its_own_copies_by_the_hashes_it_wrote_them_with(tmp_path, monkeypatch):
    """A trainer that updates one buffer in place and publishes it every step: the publisher's own
    copies (base and previous step) are not hashed again, their buffers are reused, and every step
    still rebuilds bit for bit, with history."""
    from arcfmt import writer as wmod
    from arcfmt.integrity import tensor_hash
    from arcfmt.store import Follower, Publisher
    from support.store import assert_folder
    url = str(tmp_path / "stream")
    traj = _momentum(6)
    pub, fol = Publisher(url, keyframe_every=0), Follower(url, tmp_path / "f")
    live = {n: a.copy() for n, a in traj[0].items()}
    hashed = []
    monkeypatch.setattr(wmod, "tensor_hash", lambda u: hashed.append(u.nbytes) or tensor_hash(u))
    buffers = []
    for step, t in enumerate(traj):
        for n, a in t.items():
            live[n][...] = a   # in place, as a trainer's optimizer step
        hashed.clear()
        pub.publish(step, live)
        fol.sync()
        assert_folder(tmp_path / "f", t)
        if step >= 2:
            assert sum(hashed) == sum(a.nbytes for a in t.values()), step   # the target only
            assert ctx.CtxDeltaRh.id in _encodings(url, step)
        buffers.append({n: id(a) for n, a in pub._last[1].items()})
    # two copies in turn (the base and the previous step of the next delta), each written over again
    assert buffers[4] == buffers[2] != buffers[3] == buffers[5]


def test_a_broken_chain_of_history_waits_for_the_next_keyframe(tmp_path, monkeypatch):
    """A delta without the previous step where its base step has no keyframe — a base given by the
    caller, a publish retried after its claim — ends the chain (S8.2): no later delta needs a history
    until after the next keyframe step, so followers that keep none meanwhile never start again."""
    from arcfmt.store import Follower, Publisher
    from support.store import assert_folder
    url = str(tmp_path / "stream")
    traj = _momentum(12)
    pub, fol = Publisher(url, keyframe_every=0), Follower(url, tmp_path / "f", progress=(events := []).append)
    real = Publisher.commit
    for step, t in enumerate(traj):
        kw = {}
        if step == 3:
            kw = dict(base={n: a.copy() for n, a in traj[2].items()}, base_step=2)
        if step == 8:   # the claim is made, the commit fails once: the retry finds the shard published
            calls: list[int] = []

            def flaky(self, s, calls=calls, **k):
                if k.get("mine") is not None and not calls:
                    calls.append(s)
                    raise OSError("transient store error")
                return real(self, s, **k)
            monkeypatch.setattr(Publisher, "commit", flaky)
            with pytest.raises(OSError):
                pub.publish(step, t)
            monkeypatch.setattr(Publisher, "commit", real)
        pub.publish(step, t, keyframe=step == 5 or None, **kw)
        fol.sync()
        assert_folder(tmp_path / "f", t)
    uses = [step for step in range(1, 12) if ctx.CtxDeltaRh.id in _encodings(url, step)]
    assert uses == [2, 7, 8], uses   # 1 and 6: right after a keyframe step; 3-5, 9-11: the chain broken
    assert not [e for e in events if e["event"] == "restart"]


def test_publishes_from_two_threads_run_one_after_the_other(tmp_path, monkeypatch):
    """Two publish() calls in flight on one Publisher: the second waits for the first (each reads
    and replaces the copies the last one kept), and every step rebuilds."""
    import threading

    from arcfmt import writer as wmod
    from arcfmt.store import Follower, Publisher
    url = str(tmp_path / "stream")
    traj = _momentum(4)
    pub = Publisher(url, keyframe_every=0, history=False)
    pub.publish(0, traj[0])
    pub.publish(1, traj[1])
    go, inside = threading.Event(), threading.Event()
    real = wmod.DeltaWriter.write_tensors

    def slow(self, items, **kw):
        if threading.current_thread().name == "B":
            inside.set()
            go.wait(10)
        return real(self, items, **kw)
    monkeypatch.setattr(wmod.DeltaWriter, "write_tensors", slow)
    out = {}
    b = threading.Thread(target=lambda: out.setdefault(2, pub.publish(2, traj[2])), name="B")
    b.start()
    inside.wait(10)
    c = threading.Thread(target=lambda: out.setdefault(3, pub.publish(3, traj[3])), name="C")
    c.start()
    c.join(0.5)
    assert c.is_alive()   # waits for B
    go.set()
    b.join()
    c.join()
    assert out[3].delta.base_step == 2
    Follower(url, tmp_path / "f").sync()
    from support.store import assert_folder
    assert_folder(tmp_path / "f", traj[3])


@pytest.mark.parametrize("bad", [np.uint64(1), -1, 1 << 64, "0x1", True])
def test_a_known_hash_that_is_not_a_u64_is_an_input_error(bad):
    from arcfmt.integrity import KnownBase
    base = np.arange(10000, dtype=np.float32)
    target = base.copy()
    target[::7] += 1
    with pytest.raises(InputError), DeltaWriter(io.BytesIO()) as w:
        w.write_tensors([("w", KnownBase(base, bad), target)])


def _meta_history(url, step) -> str:
    """Per shard of the step: 'H' where its delta was written with its previous step, '.' else."""
    from arcfmt.store.backends import Store
    from arcfmt.store.objects import parse_manifest
    st = Store(url)
    m = parse_manifest(st.read(f"steps/{step:020d}/manifest.json", 1 << 20), "manifest")
    return "".join("-" if e.delta is None else "H" if arcfmt.DeltaReader(st.read(e.delta.name, e.delta.size))
                   .meta.history else "." for e in m.shards)


@pytest.mark.parametrize("live", [False, True])
def test_two_shards_one_keyframe_alone_and_one_chain_broken(tmp_path, live):
    """Shard 1's chain broken by a base given at step 3, shard 0 alone asked for a keyframe at step 5
    (the step's manifest has none): each chain waits for a step whose manifest has keyframes, and a
    follower of the whole model, or of one shard's tensors, never starts again."""
    from arcfmt.store import Follower, Publisher
    from support.store import assert_folder
    url = str(tmp_path / "stream")
    t0, t1 = _momentum(12, seed=0), _momentum(12, seed=1)

    def part(t, i):
        return {f"{n}{i}": a for n, a in t.items()}
    p0 = Publisher(url, shard=0, num_shards=2, keyframe_every=8)
    p1 = Publisher(url, shard=1, num_shards=2, keyframe_every=8)
    events: list = []
    arrays: dict = {}
    fols = [Follower(url, live=arrays) if live else Follower(url, tmp_path / "f", progress=events.append),
            Follower(url, tmp_path / "g", tensors=["*0"], progress=events.append)]
    for s in range(12):
        p0.publish(s, part(t0[s], 0), keyframe=True if s == 5 else None)
        p1.publish(s, part(t1[s], 1), **(dict(base=part(t1[2], 1), base_step=2) if s == 3 else {}))
        for f in fols:
            f.sync()
        want = {**part(t0[s], 0), **part(t1[s], 1)}
        if live:
            assert_bit_exact(arrays, want)
        else:
            assert_folder(tmp_path / "f", want)
    got = [_meta_history(url, s) for s in range(1, 12)]
    assert got == ["..", "HH", "H.", "H.", "H.", "..", "..", "..", "..", "HH", "HH"], got
    assert not [e for e in events if e["event"] == "restart"]


def test_publish_from_its_own_on_commit_is_an_input_error(tmp_path):
    from arcfmt.store import Publisher
    traj = _momentum(2)
    seen: list = []

    def again(result):
        try:
            pub.publish(1, traj[1])
        except InputError as exc:
            seen.append(str(exc))
    pub = Publisher(str(tmp_path / "stream"), on_commit=again)
    pub.publish(0, traj[0])
    assert seen and "inside a publish" in seen[0]


def test_a_followers_own_histories_are_used_as_they_are(tmp_path, monkeypatch):
    """The histories a follower made itself (from verified steps) are not copied and checked again
    each step, as one made by hand is; they are read-only."""
    from arcfmt import history as hmod
    from arcfmt.store import Follower, Publisher
    url = str(tmp_path / "stream")
    traj = _momentum(4)
    pub, arrays = Publisher(url, keyframe_every=0), {}
    fol = Follower(url, live=arrays)
    copies: list = []
    real = hmod._own_copy
    monkeypatch.setattr(hmod, "_own_copy", lambda h, name: copies.append(name) or real(h, name))
    for step, t in enumerate(traj):
        pub.publish(step, t)
        fol.sync()
        assert_bit_exact(arrays, t)
    assert ctx.CtxDeltaRh.id in _encodings(url, 3) and not copies
    assert all(not h.packed.flags.writeable for h in fol._histories.values())


# ---------------------------------------------------------------------------------- ctx-delta-rhp (1.10)

def _persistent(name: str, seed: int, m: int = 40_000, moved: float = 0.1, again: float = 0.8, fresh: float = 0.01):
    """(previous, base, target) where the same elements keep moving (pure-BF16 training: an update past
    half an ulp stays past it): ``moved`` of them moved from previous to base, ``again`` of those move
    once more, ``fresh`` of the others start to; one unit each way."""
    dt = BY_NAME[name]
    rng = np.random.default_rng(seed)
    prev = bits_of(random_values(rng, dt, (m,))).reshape(-1).copy()
    half = 1 << (dt.bits - 1)
    o = ctx.ordered(ctx_dt(name), prev)
    moved_mask = rng.random(m) < moved
    ob = np.where(moved_mask, o + np.where(rng.random(m) < 0.5, 1, -1), o).clip(-half, half - 1)
    go = np.where(moved_mask, rng.random(m) < again, rng.random(m) < fresh)
    ot = np.where(go, ob + np.where(rng.random(m) < 0.5, 1, -1), ob).clip(-half, half - 1)
    arr = [ctx.unordered(ctx_dt(name), x).astype(prev.dtype).view(dt.np) for x in (o, ob, ot)]
    return {"w": arr[0]}, {"w": arr[1]}, {"w": arr[2]}


@pytest.mark.parametrize("name", CTX_NAMES)
def test_ctx_delta_rhp_rebuilds_only_with_its_previous_step(name):
    """§8.12, forced, in blocks that start mid-byte of the history codes (1001 elements a block): every
    reader rebuilds it with the previous step (arrays, or a kept History), and refuses it without."""
    prev, base, target = _persistent(name, 11, m=5000)
    data, w = _write(base, target, previous=prev, force_encoding="ctx-delta-rhp", block_elems=1001)
    assert {b.encoding for t in w.stats for b in t.blocks} == {"ctx-delta-rhp"}
    assert_bit_exact(arcfmt.decode(base, data, previous=prev), target)
    assert_bit_exact(dict(arcfmt.StreamReader(io.BytesIO(data), base, previous=prev)), target)
    kept = History.between(prev["w"], base["w"])
    assert_bit_exact(arcfmt.decode(base, data, previous={"w": kept}), target)
    live = {"w": base["w"].copy()}
    list(arcfmt.apply_in_place(live, data, previous=prev))
    assert_bit_exact(live, target)
    with pytest.raises(WrongBaseError, match="needs the previous step"):
        arcfmt.decode(base, data)
    small = {k: v[:100] for k, v in (("p", prev["w"]), ("b", base["w"]), ("t", target["w"]))}
    data_s, w_s = _write({"w": small["b"]}, {"w": small["t"]}, previous={"w": small["p"]},
                         force_encoding="ctx-delta-rhp")
    assert [b.encoding for t in w_s.stats for b in t.blocks] == ["ctx-delta-rhp"]   # forced: any size
    assert_bit_exact(arcfmt.decode({"w": small["b"]}, data_s, previous={"w": small["p"]}), {"w": small["t"]})
    if kernels is not None:   # the numpy twins read it alike
        with backend.using(twins):
            assert_bit_exact(arcfmt.decode(base, data, previous=prev), target)


def test_ctx_delta_rhp_where_the_history_predicts_the_positions():
    """The default writer picks ctx-delta-rhp where the class DP says the history's classes save more
    than 5 % of the position bits and the record's hash; ctx-delta-rh where they do not (the elements
    that moved are no likelier to move again); never for readers of 1.9 (``readers=``)."""
    prev, base, target = _persistent("BF16", 12)
    data, w = _write(base, target, previous=prev)
    old, w9 = _write(base, target, previous=prev, readers=(1, 9))
    assert [b.encoding for t in w.stats for b in t.blocks] == ["ctx-delta-rhp"]
    assert [b.encoding for t in w9.stats for b in t.blocks] == ["ctx-delta-rc"]   # (signs at random)
    assert len(data) < 0.85 * len(old)
    assert_bit_exact(arcfmt.decode(base, data, previous=prev), target)
    prev2, base2, target2 = _persistent("BF16", 13, again=0.03, fresh=0.03)
    _, w2 = _write(base2, target2, previous=prev2)
    assert "ctx-delta-rhp" not in {b.encoding for t in w2.stats for b in t.blocks}


def test_readers_says_what_older_fleets_read():
    """``readers=(1, minor)``: no encoding added after it (1.9: ctx-delta-rh but no -rhp; before 1.9 no
    previous step at all); anything but a format version of this major up to this one is refused."""
    prev, base, target = _persistent("BF16", 14)
    data, _ = _write(base, target, previous=prev, readers=(1, 8))
    assert not arcfmt.DeltaReader(data).meta.history
    assert_bit_exact(arcfmt.decode(base, data), target)
    for bad in ((1, 99), (2, 0), (1, 3), (1,), "1.9", (1, True), [1, 9]):
        with pytest.raises(InputError, match="readers"):
            DeltaWriter(io.BytesIO(), readers=bad)
    with pytest.raises(InputError, match="needs the previous step"):
        _write(base, target, previous=prev, readers=(1, 8), force_encoding="ctx-delta-rhp")
    with pytest.raises(InputError, match="readers of 1.9 cannot read it"):
        _write(base, target, previous=prev, readers=(1, 9), force_encoding="ctx-delta-rhp")
    # the framing older readers read: a full index before 1.5, no inline block before 1.6
    for readers, compact, inline in (((1, 4), False, False), ((1, 5), True, False), ((1, 6), True, True)):
        head = records.check_header(_write(base, target, readers=readers)[0][:L.HEADER_SIZE])
        assert (head.compact_index, head.inline_blocks) == (compact, inline), readers


def test_ctx_delta_rhp_thresholds_reach_the_key_fields():
    """A threshold up to 2^(E+1) - 1 is read (the key field x' of §8.12); one past it is corrupt, and so
    is ctx-delta-rh's threshold past 2^E - 1 (§8.6)."""
    from arcfmt.dtypes import from_name
    from arcfmt.errors import CorruptError
    dt = from_name("BF16")
    top = (1 << dt.exp_bits) - 1
    p = ctx.Params([top + 1, 2 * top + 1], [1, 1, 1], [0, 0, 0], 3, 0, signs=(0, 1, 0, 5), rc=True, rh=True,
                   rhp=True)
    assert ctx.stream_lengths(dt, p, 100)
    p.thresholds = [top + 1, 2 * top + 2]
    with pytest.raises(CorruptError, match="thresholds"):
        ctx.stream_lengths(dt, p, 100)
    p.thresholds, p.rhp = [top + 1], False
    p.counts, p.rice = [1, 1], [0, 0]
    with pytest.raises(CorruptError, match="thresholds"):
        ctx.stream_lengths(dt, p, 100)


def test_publisher_and_cli_take_readers(tmp_path):
    """A publisher for a fleet of 1.9 followers: ``readers=(1, 9)`` (``arcfmt publish --readers 1.9``)
    writes no ctx-delta-rhp block; a bad version is refused at once."""
    from arcfmt.store import Publisher
    with pytest.raises(InputError, match="readers"):
        Publisher(str(tmp_path / "s"), readers=(1, 99))
    prev, base, target = _persistent("BF16", 15)
    for readers, want in ((None, {11}), ((1, 9), set())):
        url = tmp_path / f"s{readers}"
        pub = Publisher(str(url), readers=readers)
        for step, ck in enumerate((prev, base, target)):
            pub.publish(step, ck)
        seen = set()
        for obj in sorted(url.rglob("*")):
            if obj.is_file() and obj.read_bytes()[:len(L.MAGIC)] == L.MAGIC:
                r = arcfmt.DeltaReader(obj.read_bytes())
                seen |= {r.load_block(n, b).info.encoding for n in r.names for b in range(r.header(n).block_count)}
        assert seen & {11} == want, seen
    p = run("publish", tmp_path / "t", "--readers", "one.nine", "--step", "0", tmp_path / "x", rc=2)
    assert "format version" in p.stderr
