"""Signed steps (SPEC.md S15): a bucket writer without the trainer's key cannot make a trusting
follower apply anything; signing costs the trainer one small object per step and nothing else."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys

import numpy as np
import pytest

from arcfmt.errors import ArcError, InputError
from arcfmt.store import Follower, Publisher, SignatureError
from arcfmt.store import follower as F
from arcfmt.store import objects as SL
from arcfmt.store import signing as SG
from arcfmt.store.errors import ConflictError
from support.store import MLP, arcfmt, assert_folder, folder_tensors, publish_step, split, trajectory

pytest.importorskip("cryptography")
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey  # noqa: E402

STEP = "steps/{:020d}"


@pytest.fixture(scope="module")
def traj():
    return trajectory(5, seed=7)


@pytest.fixture
def keys(tmp_path):
    """Two key pairs on disk (``a``, ``b``): {name: (private path, public path, key id)}."""
    out = {}
    for name in ("a", "b"):
        p = tmp_path / "keys" / name
        p.parent.mkdir(exist_ok=True)
        kid = SG.generate_key_files(p)
        out[name] = (str(p), str(p) + ".pub", kid)
    return out


def publishers(url, n, key=None, **kw):
    return [Publisher(url, shard=i, num_shards=n, keyframe_every=0, effort="fast", sign_key=key, **kw)
            for i in range(n)]


def signed_stream(url, traj, key, steps=3, shards=2, **kw):
    pubs = publishers(url, shards, key, **kw)
    for s in range(steps):
        publish_step(pubs, s, traj[s])
    return pubs


def read(root, name) -> bytes:
    with open(os.path.join(root, name), "rb") as f:
        return f.read()


def write(root, name, data: bytes) -> None:
    os.makedirs(os.path.dirname(os.path.join(root, name)), exist_ok=True)
    with open(os.path.join(root, name), "wb") as f:
        f.write(data)


def set_head(root, step) -> None:
    """What a bucket writer can do: point the head at any manifest."""
    raw = read(root, f"{STEP.format(step)}/manifest.json")
    m = SL.parse_manifest(raw, "m")
    write(root, "head.json", SL.Head(step, SL.digest128(raw), m.keyframe_step, 0).to_bytes())


def refuses(fol, into, before, err=SignatureError):
    """The follower refuses, having downloaded no data object, and its folder is as it was."""
    b0 = fol.stats.bytes
    with pytest.raises(err):
        fol.sync()
    if before is None:
        assert not os.path.exists(os.path.join(into, F.STATE_NAME))
    else:
        assert_folder(into, before)
    return fol.stats.bytes - b0


# ------------------------------------------------------------------------------------ happy paths

def test_signed_stream_followed_bit_exact_and_old_readers_ignore_it(memory_url, tmp_path, traj, keys):
    priv, pub, kid = keys["a"]
    signed_stream(memory_url, traj, priv, steps=3)
    fol = Follower(memory_url, tmp_path / "t", trust=[pub])
    ups = fol.sync()
    assert [u.step for u in ups] == [0, 1, 2] and ups[0].kind == "keyframe"
    assert_folder(tmp_path / "t", traj[2])
    st = fol.state()
    assert st["signed_by"] == kid and len(st["manifest_sha256"]) == 64
    # an untrusting follower (a 1.0 reader: unknown keys ignored, signature.json never read) follows too
    plain = Follower(memory_url, tmp_path / "p")
    assert [u.step for u in plain.sync()] == [0, 1, 2]
    assert_folder(tmp_path / "p", traj[2])
    # the trusting follower keeps following, step by step, by deltas
    pubs = publishers(memory_url, 2, priv)
    for i, part in enumerate(split(traj[3], 2)):
        pubs[i].publish(3, part, base=split(traj[2], 2)[i], base_step=2)
    (u,) = fol.sync()
    assert (u.step, u.kind, u.from_step) == (3, "delta", 2)
    assert_folder(tmp_path / "t", traj[3])


def test_objects_carry_sha256_chain(tmp_path, traj, keys):
    root = str(tmp_path / "s")
    signed_stream(root, traj, keys["a"][0], steps=2)
    m0 = read(root, f"{STEP.format(0)}/manifest.json")
    m1raw = read(root, f"{STEP.format(1)}/manifest.json")
    m1 = SL.parse_manifest(m1raw, "m1")
    assert m1.base_manifest_sha256 == hashlib.sha256(m0).hexdigest()
    assert json.loads(m0)["base_manifest_sha256"] is None
    for s in m1.shards:
        assert s.descriptor_sha256 == hashlib.sha256(read(root, f"{STEP.format(1)}/shard-{s.shard:05d}-of-00002.json")
                                                     ).hexdigest()
        assert s.delta.sha256 == hashlib.sha256(read(root, s.delta.name)).hexdigest()
    sig = SG.parse_signature(read(root, f"{STEP.format(1)}/signature.json"), "sig")
    assert sig.manifest_sha256 == hashlib.sha256(m1raw).hexdigest() and sig.key_id == keys["a"][2]
    assert sig.to_bytes() == read(root, f"{STEP.format(1)}/signature.json")   # canonical


def test_key_files_and_objects_in_every_form(tmp_path, traj):
    k = Ed25519PrivateKey.generate()
    from cryptography.hazmat.primitives import serialization as ser
    raw_priv = k.private_bytes(ser.Encoding.Raw, ser.PrivateFormat.Raw, ser.NoEncryption())
    raw_pub = k.public_key().public_bytes(ser.Encoding.Raw, ser.PublicFormat.Raw)
    (tmp_path / "k.raw").write_bytes(raw_priv)
    (tmp_path / "k.hex").write_text(raw_priv.hex() + "\n")
    (tmp_path / "p.hex").write_text(raw_pub.hex())
    kid = hashlib.sha256(raw_pub).hexdigest()[:16]
    for key in (k, str(tmp_path / "k.raw"), tmp_path / "k.hex"):
        assert SG.Signer(key).key_id == kid
    for pub in (k.public_key(), raw_pub, str(tmp_path / "p.hex"), k):
        assert list(SG.TrustSet([pub]).keys) == [kid]
    (tmp_path / "junk").write_bytes(b"not a key")
    with pytest.raises(InputError):
        SG.Signer(str(tmp_path / "junk"))
    with pytest.raises(InputError):
        SG.TrustSet([str(tmp_path / "junk")])
    with pytest.raises(InputError):
        SG.TrustSet([])
    with pytest.raises(InputError, match="needs trust"):
        Follower(str(tmp_path / "s"), tmp_path / "f", stream_id="x")
    with pytest.raises(InputError, match="needs sign_key"):
        Publisher(str(tmp_path / "s"), stream_id="x")
    with pytest.raises(InputError, match="stream id"):
        Publisher(str(tmp_path / "s"), sign_key=k, stream_id="../x")


def test_missing_cryptography_is_an_input_error_with_the_pip_command(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "cryptography.hazmat.primitives.asymmetric", None)
    with pytest.raises(InputError, match="pip install"):
        Publisher(str(tmp_path / "s"), sign_key=str(tmp_path / "k"))
    with pytest.raises(InputError, match="pip install"):
        Follower(str(tmp_path / "s"), tmp_path / "f", trust=[str(tmp_path / "k.pub")])
    Follower(str(tmp_path / "s"), tmp_path / "f")   # no trust asked: nothing imported


def test_key_rotation(memory_url, tmp_path, traj, keys):
    (a, a_pub, _), (b, b_pub, kb) = keys["a"], keys["b"]
    signed_stream(memory_url, traj, a, steps=2)
    both = Follower(memory_url, tmp_path / "both", trust=[a_pub, b_pub])
    only_a = Follower(memory_url, tmp_path / "a", trust=[a_pub])
    assert len(both.sync()) == 2 and len(only_a.sync()) == 2
    pubs = publishers(memory_url, 2, b)    # the trainer rotates to key b
    for s in (2, 3):
        for i, part in enumerate(split(traj[s], 2)):
            pubs[i].publish(s, part, base=split(traj[s - 1], 2)[i], base_step=s - 1)
    assert [(u.step, u.kind) for u in both.sync()] == [(2, "delta"), (3, "delta")]
    assert both.state()["signed_by"] == kb
    refuses(only_a, tmp_path / "a", traj[1])           # b is not trusted there
    # b's signature at the head covers the whole chain below it, key a's steps included
    only_b = Follower(memory_url, tmp_path / "b", trust=[b_pub])
    assert [u.step for u in only_b.sync()] == [0, 1, 2, 3]
    assert_folder(tmp_path / "b", traj[3])
    # a folder vouched for by a key no longer trusted starts again from a keyframe
    retired = Follower(memory_url, tmp_path / "a", trust=[b_pub])
    ups = retired.sync()
    assert ups[0].kind == "keyframe" and ups[-1].step == 3
    assert_folder(tmp_path / "a", traj[3])


def test_partial_selection_in_trust_mode_downloads_whole_shard_objects(memory_url, tmp_path, traj, keys):
    signed_stream(memory_url, traj, keys["a"][0], steps=2)
    fol = Follower(memory_url, tmp_path / "mlp", trust=[keys["a"][1]], tensors=MLP)
    ups = fol.sync()
    assert_folder(tmp_path / "mlp", traj[1], {n for n in traj[1] if ".mlp." in n})
    from arcfmt.store.backends import Store
    st = Store(memory_url)
    used = [any(".mlp." in n for n in part) for part in split(traj[0], 2)]
    for u in ups:
        m = SL.parse_manifest(st.read(f"{STEP.format(u.step)}/manifest.json", SL.MAX_MANIFEST_BYTES), "m")
        objs = [s.object(u.kind) for s in m.shards]
        assert u.bytes_downloaded == sum(o.tail_size for o in objs) + sum(o.size for o, w in zip(objs, used) if w)


def test_two_ranks_with_the_key_sign_once_and_a_planted_signature_is_a_conflict(tmp_path, traj, keys):
    root = str(tmp_path / "s")
    pubs = signed_stream(root, traj, keys["a"][0], steps=1)
    sig = read(root, f"{STEP.format(0)}/signature.json")
    for p in pubs:   # every rank's commit finds the signature and accepts it
        assert p.commit(0).committed
    assert read(root, f"{STEP.format(0)}/signature.json") == sig
    # a signature planted before the committer signs (another manifest's) makes the commit fail loudly
    other = json.loads(sig)
    other["manifest_sha256"] = "0" * 64
    write(root, f"{STEP.format(1)}/signature.json", SL.canonical(other))
    with pytest.raises(ConflictError, match="signature"):
        publish_step(pubs, 1, traj[1])


# ------------------------------------------------------------------------------------ attacks

@pytest.fixture
def attacked(tmp_path, traj, keys):
    """A signed local stream at step 2, a trusting follower holding step 2, and a forger's publishers."""
    root = str(tmp_path / "s")
    signed_stream(root, traj, keys["a"][0], steps=3)
    into = str(tmp_path / "into")
    fol = Follower(root, into, trust=[keys["a"][1]])
    assert len(fol.sync()) == 3
    return root, into, fol


def forged(traj, s):
    """Weights the attacker wants followers to load."""
    return {n: (a.astype(np.float32) * 2).astype(a.dtype) for n, a in traj[s].items()}


def test_unsigned_forged_step_is_refused_before_any_download(attacked, traj):
    root, into, fol = attacked
    publish_step(publishers(root, 2), 3, forged(traj, 3), keyframe=True)   # no key: unsigned, head moved
    assert fol.head().step == 3
    assert refuses(fol, into, traj[2]) == 0
    fresh = Follower(root, into + "-new", trust=fol._trust.keys.values())
    assert refuses(fresh, into + "-new", None) == 0


def test_step_signed_by_another_key_is_refused(attacked, traj, keys):
    root, into, fol = attacked
    publish_step(publishers(root, 2, keys["b"][0]), 3, forged(traj, 3), keyframe=True)
    with pytest.raises(SignatureError, match="not trusted"):
        fol.sync()
    assert_folder(into, traj[2])


def test_rewritten_head_step_with_recomputed_hashes_is_refused(attacked, traj, tmp_path):
    """The attacker republishes step 2 with other weights: new objects under correct xxh3 names, new
    descriptors and manifest, head updated; only the signature (which it cannot make) is old."""
    root, into, fol = attacked
    sig = read(root, f"{STEP.format(2)}/signature.json")
    shutil.rmtree(os.path.join(root, STEP.format(2)))
    publish_step(publishers(root, 2), 2, forged(traj, 2), keyframe=True)
    write(root, f"{STEP.format(2)}/signature.json", sig)
    set_head(root, 2)
    new = Follower(root, tmp_path / "new", trust=fol._trust.keys.values())
    with pytest.raises(SignatureError, match="SHA-256"):
        new.sync()
    assert new.stats.bytes == 0
    assert Follower(root, tmp_path / "plain").sync()[-1].step == 2   # what a non-trusting follower would take


def test_removed_or_damaged_signature_is_refused(attacked, traj, tmp_path):
    root, into, fol = attacked
    keys = list(fol._trust.keys.values())
    name = f"{STEP.format(2)}/signature.json"
    sig = read(root, name)
    os.unlink(os.path.join(root, name))
    with pytest.raises(SignatureError, match="not signed"):
        Follower(root, tmp_path / "n1", trust=keys).sync()
    bad = json.loads(sig)
    bad["signature"] = ("1" if bad["signature"][0] != "1" else "2") + bad["signature"][1:]
    write(root, name, SL.canonical(bad))
    with pytest.raises(SignatureError, match="does not verify"):
        Follower(root, tmp_path / "n2", trust=keys).sync()
    bad = json.loads(sig)
    bad["time_ms"] += 1   # a signed field changed
    write(root, name, SL.canonical(bad))
    with pytest.raises(SignatureError, match="does not verify"):
        Follower(root, tmp_path / "n3", trust=keys).sync()
    # another step's genuine signature copied in
    write(root, name, read(root, f"{STEP.format(1)}/signature.json"))
    with pytest.raises(SignatureError, match="signs step 1"):
        Follower(root, tmp_path / "n4", trust=keys).sync()


def test_replayed_old_step_never_moves_a_follower_back(attacked, traj):
    root, into, fol = attacked
    set_head(root, 0)   # a genuine, signed, old step
    assert fol.sync() == []
    assert_folder(into, traj[2])
    assert fol.state()["step"] == 2


def test_swapped_data_object_bytes_are_refused_before_decoding(attacked, traj, tmp_path):
    """The attacker rewrites a record inside a data object, leaving its size, index and tail as they
    were (all the xxh3 checks a follower makes before decoding pass): SHA-256 refuses it first."""
    root, into, fol = attacked
    mine = SL.parse_manifest(read(root, f"{STEP.format(2)}/manifest.json"), "m")
    obj = mine.shards[0].delta.name
    data = bytearray(read(root, obj))
    data[70] ^= 0x01
    write(root, obj, bytes(data))
    fol2 = Follower(root, tmp_path / "new", trust=fol._trust.keys.values())
    # keyframe 0, delta 1, then step 2's object is refused
    with pytest.raises(SignatureError, match="signed sha256"):
        fol2.sync()
    assert fol2.state()["step"] == 1
    assert_folder(tmp_path / "new", traj[1])
    with pytest.raises(ArcError) as e:   # an untrusting follower finds it only while decoding (record checksum)
        Follower(root, tmp_path / "plain").sync()
    assert not isinstance(e.value, SignatureError)


def test_forged_base_manifest_below_a_signed_head_is_refused(attacked, traj, tmp_path, monkeypatch):
    """Rewriting a manifest below the head (with xxh3 forged, simulated) breaks the SHA-256 link."""
    root, into, fol = attacked
    name = f"{STEP.format(1)}/manifest.json"
    orig = read(root, name)
    m = json.loads(orig)
    m["writer"] = "attacker"
    fake = SL.canonical(m)
    write(root, name, fake)
    real = F.digest128
    monkeypatch.setattr(F, "digest128", lambda raw: real(orig) if bytes(raw) == fake else real(raw))
    with pytest.raises(SignatureError, match="SHA-256"):
        Follower(root, tmp_path / "new", trust=fol._trust.keys.values()).sync()


def test_signed_10_manifest_without_sha256_fields_is_refused(tmp_path, traj, keys):
    """Even a genuine signature cannot vouch for data objects its manifest names only by xxh3."""
    root = str(tmp_path / "s")
    publish_step(publishers(root, 1), 0, traj[0])
    name = f"{STEP.format(0)}/manifest.json"
    m = json.loads(read(root, name))
    for s in m["shards"]:
        del s["keyframe"]["sha256"], s["descriptor_sha256"]
    del m["base_manifest_sha256"]
    raw = SL.canonical(m)
    write(root, name, raw)
    set_head(root, 0)
    signer = SG.Signer(keys["a"][0])
    s = SG.Signature(0, None, hashlib.sha256(raw).hexdigest(), signer.key_id, 1, "")
    write(root, f"{STEP.format(0)}/signature.json", SG.replace_sig(s, signer.key.sign(s.message()).hex()).to_bytes())
    fol = Follower(root, tmp_path / "f", trust=[keys["a"][1]])
    assert refuses(fol, tmp_path / "f", None) == 0
    with pytest.raises(ConflictError, match="cannot be signed"):
        signer.sign(SL.parse_manifest(raw, name), 1)


def test_steps_replayed_from_another_stream_are_refused_by_stream_id(tmp_path, traj, keys):
    priv, pub, _ = keys["a"]
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    signed_stream(a, traj, priv, steps=2, stream_id="run-a")
    pubs = publishers(b, 2, priv, stream_id="run-b")
    for s in range(4):
        publish_step(pubs, s, forged(traj, s))
    fol = Follower(a, tmp_path / "f", trust=[pub], stream_id="run-a")
    assert len(fol.sync()) == 2
    shutil.copytree(os.path.join(b, STEP.format(3)), os.path.join(a, STEP.format(3)))   # a keyframe? no: delta
    shutil.copytree(os.path.join(b, STEP.format(2)), os.path.join(a, STEP.format(2)))
    set_head(a, 3)
    with pytest.raises(SignatureError, match="run-b"):
        fol.sync()
    assert_folder(tmp_path / "f", traj[1])


def test_trusting_follower_refuses_an_unsigned_stream(memory_url, tmp_path, traj, keys):
    pubs = publishers(memory_url, 2)
    publish_step(pubs, 0, traj[0])
    with pytest.raises(SignatureError, match="not signed"):
        Follower(memory_url, tmp_path / "f", trust=[keys["a"][1]]).sync()
    # a folder filled without trust is not vouched for: a trusting follower starts it again
    Follower(memory_url, tmp_path / "g").sync()
    signed = publishers(memory_url, 2, keys["a"][0])
    for i, part in enumerate(split(traj[1], 2)):
        signed[i].publish(1, part, base=split(traj[0], 2)[i], base_step=0, keyframe=True)
    ups = Follower(memory_url, tmp_path / "g", trust=[keys["a"][1]]).sync()
    assert [(u.step, u.kind) for u in ups] == [(1, "keyframe")]


# ------------------------------------------------------------------------------------ CLI, servers

def test_cli_keygen_publish_follow(tmp_path, traj):
    key = tmp_path / "k" / "trainer.key"
    key.parent.mkdir()
    p = arcfmt("keygen", "--out", key, "--json", rc=0)
    kid = json.loads(p.stdout)["key_id"]
    assert oct(os.stat(key).st_mode & 0o777) == "0o600" and os.path.exists(str(key) + ".pub")
    assert kid == SG.key_id(SG.load_public_key(str(key) + ".pub"))
    p = arcfmt("keygen", "--out", key, rc=1)
    assert "exists" in p.stderr
    arcfmt("keygen", "--out", key, "--force", rc=0)
    from arcfmt.safetensors_io import write_file
    url = str(tmp_path / "s")
    for s in range(2):
        f = tmp_path / "ckpt" / f"step{s}" / "model.safetensors"
        f.parent.mkdir(parents=True)
        write_file(f, traj[s], {"format": "pt"})
        arcfmt("publish", url, f, "--state", tmp_path / "state", "--sign-key", key, "--stream-id", "run42",
               "--effort", "fast", rc=0)
    p = arcfmt("follow", url, "--into", tmp_path / "f", "--once", "--trust", str(key) + ".pub",
               "--stream-id", "run42", rc=0)
    assert_folder(tmp_path / "f", traj[1])
    other = tmp_path / "k" / "other.key"
    arcfmt("keygen", "--out", other, rc=0)
    p = arcfmt("follow", url, "--into", tmp_path / "g", "--once", "--trust", str(other) + ".pub", rc=1)
    assert "error (signature)" in p.stderr
    p = arcfmt("follow", url, "--into", tmp_path / "h", "--once", "--trust", str(key) + ".pub",
               "--stream-id", "run43", rc=1)
    assert "error (signature)" in p.stderr


@pytest.mark.servers
def test_signed_stream_on_a_real_server(remote, tmp_path, traj, keys):
    if remote.kind == "moto":
        pytest.skip("SeaweedFS and fake-gcs cover the S3 and GCS paths")
    priv, pub, _ = keys["a"]
    pubs = publishers(remote.url, 2, priv, storage_options=remote.storage_options)
    for s in range(3):
        publish_step(pubs, s, traj[s])
    fol = Follower(remote.url, tmp_path / "f", trust=[pub], storage_options=remote.storage_options)
    assert [u.step for u in fol.sync()] == [0, 1, 2]
    assert_folder(tmp_path / "f", traj[2])
    forger = publishers(remote.url, 2, keys["b"][0], storage_options=remote.storage_options)
    publish_step(forger, 3, forged(traj, 3), keyframe=True)
    with pytest.raises(SignatureError):
        fol.sync()
    assert_folder(tmp_path / "f", traj[2])
    assert isinstance(SignatureError("x"), ArcError) and folder_tensors(tmp_path / "f")


def test_trust_mode_objects_above_the_memory_budget_pass_through_a_file(memory_url, tmp_path, traj, keys,
                                                                       monkeypatch):
    """A signed object bigger than ``memory_budget`` is hashed as it arrives, a budget at a time, into an
    unlinked temporary file beside the folder, and decoded from its mapping alone (no byte fetched
    again after the hash): followed bit-exactly, a flipped byte still refused by SHA-256 before anything
    is decoded, a budget of 0 still sends one request per chunk, and a disk without room is `limit`."""
    signed_stream(memory_url, traj, keys["a"][0], steps=3)
    spilled, sources = [], []
    real_spill, real_add = F.Follower._spill_signed, F.Follower._add_signed
    monkeypatch.setattr(F.Follower, "_spill_signed", lambda self, p: spilled.append(p.obj.size) or real_spill(self, p))
    monkeypatch.setattr(F.Follower, "_add_signed", staticmethod(lambda p, data: sources.append(p.source)
                                                              or real_add(p, data)))
    fol = Follower(memory_url, tmp_path / "t", trust=[keys["a"][1]], memory_budget=512, chunk_size=4096)
    assert [u.step for u in fol.sync()] == [0, 1, 2]
    assert_folder(tmp_path / "t", traj[2])
    assert len(spilled) >= 3 and all(s > 512 for s in spilled)
    assert sources and all(src.misses == 0 for src in sources)    # every record read came from the checked bytes
    assert not [n for n in os.listdir(tmp_path) if "signed" in n]   # unlinked
    # a budget of 0: whole chunks all the same (not one request per byte)
    f0 = Follower(memory_url, tmp_path / "z", trust=[keys["a"][1]], memory_budget=0, chunk_size=4096)
    f0.sync()
    assert f0.stats.requests <= 3 * sum(-(-s // 4096) + 2 for s in spilled)
    # the same follower refuses a damaged object it spills
    from arcfmt.store.backends import Store
    st = Store(memory_url)
    pubs = publishers(memory_url, 2, keys["a"][0])
    for i, part in enumerate(split(traj[3], 2)):
        pubs[i].publish(3, part, base=split(traj[2], 2)[i], base_step=2)
    m = SL.parse_manifest(st.read(f"{STEP.format(3)}/manifest.json", SL.MAX_MANIFEST_BYTES), "m")
    obj = m.shards[0].delta
    data = bytearray(st.read(obj.name, obj.size))
    data[70] ^= 1
    st.fs.pipe_file(st.path(obj.name), bytes(data))
    with pytest.raises(SignatureError, match="signed sha256"):
        fol.sync()
    assert fol.state()["step"] == 2
    assert_folder(tmp_path / "t", traj[2])
    # no room for the spill: `limit`, before anything is fetched
    from arcfmt.errors import LimitError
    monkeypatch.setattr(F.shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(1, 1, 0))
    fresh = Follower(memory_url, tmp_path / "full", trust=[keys["a"][1]], memory_budget=512)
    with pytest.raises(LimitError, match="bytes free"):
        fresh.sync()
