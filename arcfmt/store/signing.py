"""Signed steps (SPEC.md S15): who published this step, checked before any of its bytes are used.

xxh3 protects a stream against corruption, not against whoever can write the bucket. A trainer that
holds an Ed25519 key signs each committed step: ``steps/<S>/signature.json`` names the SHA-256 of the
step's manifest bytes; the manifest names each data object's SHA-256 and its base manifest's SHA-256,
so one signature at the head covers the whole chain below it. A follower given trusted public keys
refuses (``SignatureError``) any step whose signature does not verify, before it downloads a data
object, and checks each data object it uses against its signed SHA-256 before decoding it.

The ``cryptography`` package is imported only when a key is loaded, so streams without signing
need nothing more than the base install.
"""
from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass

from ..errors import CorruptError, FormatError, InputError
from . import names as N
from .errors import ConflictError, SignatureError
from .objects import (
    VERSION,
    Manifest,
    ObjectRef,
    _check_kind,
    _Fields,
    canonical,
    parse_json,
)

SIGNATURE_FORMAT = "arcfmt-stream-signature"
ALGORITHM = "ed25519"
MAX_SIGNATURE_BYTES = 64 << 10
MAX_KEY_FILE_BYTES = 64 << 10
DOMAIN = b"arcfmt-stream-signature-v1\x00"   # prefix of every signed message (S15.2)
PIP_HINT = "pip install 'arcfmt[sign]' (or: pip install 'cryptography>=42')"

_HEX16 = re.compile(r"[0-9a-f]{16}\Z")
_HEX64 = re.compile(r"[0-9a-f]{64}\Z")
_HEX128 = re.compile(r"[0-9a-f]{128}\Z")
_STREAM_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")


def signature_name(step: int) -> str:
    """``steps/<S>/signature.json``: beside the manifest it signs."""
    return f"{N.step_dir(step)}/signature.json"


def sha256_hex(data) -> str:
    return hashlib.sha256(data).hexdigest()


def check_stream_id(value, error=InputError):
    """A stream id (signed, S15): ``[A-Za-z0-9][A-Za-z0-9._-]{0,63}``, or None."""
    if value is None:
        return None
    if not isinstance(value, str) or not _STREAM_ID.match(value):
        raise error(f"stream id {value!r} must be 1-64 characters of A-Z a-z 0-9 . _ - (not starting with . _ -)")
    return value


# ------------------------------------------------------------------------------------ keys

def _crypto():
    """The Ed25519 classes and serialization module, imported on first use."""
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError:
        raise InputError(f"signed streams need the 'cryptography' package: {PIP_HINT}") from None
    return ed25519, serialization


def _raw_public(pub) -> bytes:
    _, ser = _crypto()
    return pub.public_bytes(ser.Encoding.Raw, ser.PublicFormat.Raw)


def key_id(pub) -> str:
    """First 16 hex digits of SHA-256 over the raw 32-byte public key (S15.1)."""
    raw = pub if isinstance(pub, (bytes, bytearray)) else _raw_public(pub)
    return sha256_hex(bytes(raw))[:16]


def _read_key_file(path, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_KEY_FILE_BYTES + 1)
    except OSError as exc:
        raise InputError(f"cannot read {what} {os.fspath(path)}: {exc.strerror or exc}") from None
    if len(data) > MAX_KEY_FILE_BYTES:
        raise InputError(f"{what} {os.fspath(path)} is larger than {MAX_KEY_FILE_BYTES} bytes")
    return data


def _key_bytes(data: bytes) -> bytes | None:
    """32 raw key bytes from a raw or hex key file's contents, or None (then it should be PEM)."""
    if len(data) == 32 and not data.startswith(b"-----"):
        return data
    text = data.strip()
    if re.fullmatch(rb"[0-9a-fA-F]{64}", text):
        return bytes.fromhex(text.decode())
    return None


def load_private_key(key):
    """An Ed25519 private key from a key object, or a PEM (PKCS#8, unencrypted) / raw 32-byte / 64-hex
    file path (``input`` for anything else)."""
    ed, ser = _crypto()
    if isinstance(key, ed.Ed25519PrivateKey):
        return key
    if not isinstance(key, (str, os.PathLike)):
        raise InputError(f"sign_key must be a key file path or an Ed25519PrivateKey, not {type(key).__name__}")
    data = _read_key_file(key, "signing key")
    raw = _key_bytes(data)
    try:
        k = ed.Ed25519PrivateKey.from_private_bytes(raw) if raw is not None else \
            ser.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise InputError(f"{os.fspath(key)} is not an unencrypted Ed25519 private key: {exc}") from None
    if not isinstance(k, ed.Ed25519PrivateKey):
        raise InputError(f"{os.fspath(key)} is a {type(k).__name__}, not an Ed25519 private key")
    return k


def load_public_key(key):
    """An Ed25519 public key from a key object (a private key gives its public half), raw 32 bytes,
    or a PEM (SubjectPublicKeyInfo) / raw / 64-hex file path."""
    ed, ser = _crypto()
    if isinstance(key, ed.Ed25519PublicKey):
        return key
    if isinstance(key, ed.Ed25519PrivateKey):
        return key.public_key()
    if isinstance(key, (bytes, bytearray)):
        data, where = bytes(key), "public key bytes"
    elif isinstance(key, (str, os.PathLike)):
        data, where = _read_key_file(key, "trusted key"), os.fspath(key)
    else:
        raise InputError(f"a trusted key must be a file path, bytes or an Ed25519PublicKey, not {type(key).__name__}")
    raw = _key_bytes(data)
    try:
        k = ed.Ed25519PublicKey.from_public_bytes(raw) if raw is not None else ser.load_pem_public_key(data)
    except (ValueError, TypeError) as exc:
        raise InputError(f"{where} is not an Ed25519 public key: {exc}") from None
    if not isinstance(k, ed.Ed25519PublicKey):
        raise InputError(f"{where} is a {type(k).__name__}, not an Ed25519 public key")
    return k


def generate_key_files(out, *, force: bool = False) -> str:
    """Write a new private key to ``out`` (PEM PKCS#8, mode 0600, refused if it exists unless
    ``force``) and its public key to ``out.pub`` (PEM); return the key id."""
    ed, ser = _crypto()
    out = os.fspath(out)
    pub_path = out + ".pub"
    if not force:
        for p in (out, pub_path):
            if os.path.lexists(p):
                raise InputError(f"{p} exists; give --force to replace it")
    k = ed.Ed25519PrivateKey.generate()
    priv = k.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.PKCS8, ser.NoEncryption())
    pub = k.public_key().public_bytes(ser.Encoding.PEM, ser.PublicFormat.SubjectPublicKeyInfo)
    _write_private(out, priv, 0o600)
    _write_private(pub_path, pub, 0o644)
    return key_id(k.public_key())


def _write_private(path: str, data: bytes, mode: int) -> None:
    """Write ``data`` to a fresh temporary file of ``mode`` beside ``path``, then rename it over
    ``path``: the key is never readable by others, even for a moment, and a link at ``path`` is
    replaced, not written through."""
    tmp = f"{path}.tmp-{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)   # whatever the umask
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


# ------------------------------------------------------------------------------------ the object

@dataclass(frozen=True)
class Signature:
    """``steps/<S>/signature.json`` (S15.2)."""

    step: int
    stream: str | None
    manifest_sha256: str
    key_id: str
    time_ms: int
    signature: str           # 128 hex: the Ed25519 signature of message()
    version: tuple = tuple(VERSION)
    raw: bytes = b""

    def signed_fields(self) -> dict:
        return dict(format=SIGNATURE_FORMAT, version=list(self.version), step=self.step, stream=self.stream,
                    manifest_sha256=self.manifest_sha256, key_id=self.key_id, algorithm=ALGORITHM,
                    time_ms=self.time_ms)

    def message(self) -> bytes:
        """What is signed: the domain prefix, then the canonical JSON of every field but ``signature``."""
        return DOMAIN + canonical(self.signed_fields())

    def to_bytes(self) -> bytes:
        return canonical(dict(self.signed_fields(), signature=self.signature))


def parse_signature(data, where: str) -> Signature:
    """Structure only (no key needed): every field as S15.2's table says, else `corrupt`/`limit`."""
    f = _check_kind(parse_json(data, where, MAX_SIGNATURE_BYTES), SIGNATURE_FORMAT, where)
    step = f.int("step", 0, N.MAX_STEP)
    stream = check_stream_id(f.get("stream", str, nullable=True), CorruptError)
    digest = _hex(f, "manifest_sha256", _HEX64, 64)
    kid = _hex(f, "key_id", _HEX16, 16)
    algorithm = f.get("algorithm", str)
    if algorithm != ALGORITHM:
        raise CorruptError(f"{where}: algorithm {algorithm!r} is not {ALGORITHM!r}")
    time_ms = f.int("time_ms", 0, (1 << 63) - 1)
    sig = _hex(f, "signature", _HEX128, 128)
    return Signature(step, stream, digest, kid, time_ms, sig, tuple(f.obj["version"]), bytes(data))


def _hex(f: _Fields, key: str, rx, n: int) -> str:
    v = f.get(key, str)
    if not rx.match(v):
        raise CorruptError(f"{f.where}: field {key!r} must be {n} lower-case hex digits")
    return v


# ------------------------------------------------------------------------------------ binding

def unbound(m: Manifest, kind: str | None = None) -> str | None:
    """Why ``m`` is not fully covered by SHA-256 (for objects of ``kind``, or both), else None."""
    if m.base_step is not None and m.base_manifest_sha256 is None:
        return "it has no base_manifest_sha256"
    for s in m.shards:
        if s.descriptor_sha256 is None:
            return f"shard {s.shard} has no descriptor_sha256"
        for k in (kind,) if kind else N.KINDS:
            ref = s.delta if k == "delta" else s.keyframe
            if ref is not None and ref.sha256 is None:
                return f"shard {s.shard}'s {k} object has no sha256 (written by a 1.0 publisher)"
    return None


def check_object(ref: ObjectRef, data) -> None:
    """A data object's whole bytes against its signed size and SHA-256 (`signature`)."""
    if len(data) != ref.size or ref.sha256 is None or sha256_hex(data) != ref.sha256:
        raise SignatureError(f"{ref.name}: its bytes do not hash to the signed sha256 in the manifest")


class Signer:
    """Signs committed steps with one private key (publisher side)."""

    def __init__(self, key, stream_id: str | None = None):
        self.key = load_private_key(key)
        self.public = self.key.public_key()
        self.key_id = key_id(self.public)
        self.stream_id = check_stream_id(stream_id)

    def sign(self, m: Manifest, time_ms: int) -> bytes:
        why = unbound(m)
        if why is not None:
            raise ConflictError(f"step {m.step} cannot be signed: its manifest is not covered by SHA-256 ({why})")
        s = Signature(m.step, self.stream_id, m.sha256, self.key_id, time_ms, "")
        return replace_sig(s, self.key.sign(s.message()).hex()).to_bytes()

    def check_existing(self, raw: bytes, m: Manifest, where: str) -> None:
        """An existing signature of ``m``'s step (another rank's, or a retry's) must sign this very
        manifest; one by this key must verify (`conflict` otherwise: the step cannot be re-signed)."""
        try:
            s = parse_signature(raw, where)
        except FormatError as exc:
            raise ConflictError(f"{where} exists but is not a valid signature ({exc})") from None
        if s.step != m.step or s.manifest_sha256 != m.sha256:
            raise ConflictError(f"{where} exists but signs another manifest than {N.manifest_name(m.step)}")
        if s.stream != self.stream_id:
            raise ConflictError(f"{where} exists but is signed for stream {s.stream!r}, not {self.stream_id!r}")
        if s.key_id == self.key_id and not _verifies(self.public, s):
            raise ConflictError(f"{where} names this publisher's key {self.key_id} but does not verify")


def replace_sig(s: Signature, sig_hex: str) -> Signature:
    return Signature(s.step, s.stream, s.manifest_sha256, s.key_id, s.time_ms, sig_hex, s.version)


def _verifies(pub, s: Signature) -> bool:
    from cryptography.exceptions import InvalidSignature
    try:
        pub.verify(bytes.fromhex(s.signature), s.message())
    except InvalidSignature:
        return False
    return True


class TrustSet:
    """The public keys a follower accepts, by key id, and the stream id it requires (if any)."""

    def __init__(self, keys, stream_id: str | None = None):
        if isinstance(keys, (str, bytes, os.PathLike)) or not hasattr(keys, "__iter__"):
            keys = [keys]
        self.keys = {}
        for k in keys:
            pub = load_public_key(k)
            self.keys[key_id(pub)] = pub
        if not self.keys:
            raise InputError("trust= needs at least one public key (None: do not check signatures)")
        self.stream_id = check_stream_id(stream_id)

    def verify(self, raw: bytes | None, step: int, where: str) -> Signature:
        """The signature of ``step`` (its bytes, None if missing), checked: structure, step, key,
        stream id, Ed25519 (`signature`, or `corrupt` for a malformed object)."""
        if raw is None:
            raise SignatureError(f"step {step} is not signed ({where} is missing)")
        s = parse_signature(raw, where)
        if s.step != step:
            raise SignatureError(f"{where} signs step {s.step}, not {step}")
        pub = self.keys.get(s.key_id)
        if pub is None:
            raise SignatureError(f"{where} is signed by key {s.key_id}, which is not trusted "
                                 f"(trusted: {', '.join(sorted(self.keys))})")
        if not _verifies(pub, s):
            raise SignatureError(f"{where}: the signature by key {s.key_id} does not verify")
        if self.stream_id is not None and s.stream != self.stream_id:
            raise SignatureError(f"{where} is signed for stream {s.stream!r}, not {self.stream_id!r}")
        return s


__all__ = ["Signature", "Signer", "TrustSet", "parse_signature", "signature_name", "key_id", "load_private_key",
           "load_public_key", "generate_key_files", "check_object", "unbound", "MAX_SIGNATURE_BYTES",
           "SIGNATURE_FORMAT", "DOMAIN"]
