"""Object names of a stream (SPEC.md Part II), validated before any of them is used.

Every name the stream layer reads or writes is relative to the stream root and is one of a few fixed
shapes, derived from integers (step, shard, shard count) and a content hash: a name found inside a
downloaded object is accepted only if it equals the name derived from the object's own fields, so a
manifest can never point a reader outside the stream, at ``..``, or at an absolute path.
"""
from __future__ import annotations

import re

from ..errors import CorruptError, InputError

MAX_NAME_BYTES = 1024          # any relative object name
MAX_FILE_NAME_BYTES = 200      # a checkpoint file name carried in a stream
MAX_STEP = (1 << 64) - 2       # 2^64 - 1 is the format's "no step"
MAX_SHARDS = 4096
MAX_SHARD_DIGITS = 5

HEAD = "head.json"
STEPS = "steps"
KINDS = ("delta", "keyframe")

_SEGMENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*\Z")
_FILE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*\.safetensors\Z")
_HEX32 = re.compile(r"[0-9a-f]{32}\Z")
_WRITER = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
_OBJECT = re.compile(r"steps/(\d{20})/shard-(\d{5})-of-(\d{5})-(delta|keyframe)-([0-9a-f]{32})\.arc\Z")
RESERVED_FILES = {"model.safetensors.index.json"}


def check_relative(name, what: str = "object name", error=InputError) -> str:
    """A relative name made of ``/``-separated segments of ``[A-Za-z0-9._-]``, none of them ``.`` or
    ``..``, none empty, none starting with ``.`` or ``-``; at most ``MAX_NAME_BYTES`` bytes."""
    if not isinstance(name, str):
        raise error(f"{what} must be a string, not {type(name).__name__}")
    if not name:
        raise error(f"{what} is empty")
    raw = name.encode("utf-8", "surrogatepass")
    if len(raw) > MAX_NAME_BYTES:
        raise error(f"{what} is {len(raw)} bytes long, more than {MAX_NAME_BYTES}")
    if name.startswith("/") or "\\" in name or ":" in name:
        raise error(f"{what} {name!r} must be relative (no leading '/', no '\\', no ':')")
    for seg in name.split("/"):
        if seg in ("", ".", ".."):
            raise error(f"{what} {name!r} has an empty, '.' or '..' segment")
        if not _SEGMENT.match(seg):
            raise error(f"{what} {name!r}: segment {seg!r} may only use A-Z a-z 0-9 . _ - "
                        f"and must not start with '.' or '-'")
    return name


def check_step(step, what: str = "step", error=InputError) -> int:
    if isinstance(step, bool) or not isinstance(step, int):
        raise error(f"{what} must be an integer, not {type(step).__name__}")
    if not 0 <= step <= MAX_STEP:
        raise error(f"{what} {step} is outside 0..{MAX_STEP}")
    return step


def check_shard(shard, num_shards, error=InputError) -> tuple[int, int]:
    for v, what in ((shard, "shard"), (num_shards, "shard count")):
        if isinstance(v, bool) or not isinstance(v, int):
            raise error(f"{what} must be an integer, not {type(v).__name__}")
    if not 1 <= num_shards <= MAX_SHARDS:
        raise error(f"shard count {num_shards} is outside 1..{MAX_SHARDS}")
    if not 0 <= shard < num_shards:
        raise error(f"shard {shard} is outside 0..{num_shards - 1}")
    return shard, num_shards


def check_file_name(name, error=InputError) -> str:
    """A plain checkpoint file name: ``[A-Za-z0-9_][A-Za-z0-9._-]*.safetensors``, ≤ 200 bytes."""
    if not isinstance(name, str):
        raise error(f"file name must be a string, not {type(name).__name__}")
    if len(name.encode("utf-8", "surrogatepass")) > MAX_FILE_NAME_BYTES or not _FILE.match(name) \
            or name in RESERVED_FILES:
        raise error(f"file name {name!r} is not a plain '.safetensors' name of at most {MAX_FILE_NAME_BYTES} "
                    f"bytes using A-Z a-z 0-9 . _ -")
    return name


def check_writer(value, error=InputError):
    """A writer id (one trainer incarnation): ``[A-Za-z0-9][A-Za-z0-9._-]{0,63}``, or None."""
    if value is None:
        return None
    if not isinstance(value, str) or not _WRITER.match(value):
        raise error(f"writer id {value!r} must be 1-64 characters of A-Z a-z 0-9 . _ - (not starting with . _ -)")
    return value


def check_hex32(value, what: str, error=CorruptError) -> str:
    if not isinstance(value, str) or not _HEX32.match(value):
        raise error(f"{what} must be 32 lower-case hex digits")
    return value


def step_dir(step: int) -> str:
    return f"{STEPS}/{check_step(step):020d}"


def manifest_name(step: int) -> str:
    return f"{step_dir(step)}/manifest.json"


def descriptor_name(step: int, shard: int, num_shards: int) -> str:
    check_shard(shard, num_shards)
    return f"{step_dir(step)}/shard-{shard:05d}-of-{num_shards:05d}.json"


def object_name(step: int, shard: int, num_shards: int, kind: str, digest_hex: str) -> str:
    """``steps/<step:020>/shard-<i:05>-of-<n:05>-<kind>-<xxh3-128 hex>.arc``: immutable, content-addressed."""
    check_shard(shard, num_shards)
    if kind not in KINDS:
        raise InputError(f"object kind must be one of {KINDS}, not {kind!r}")
    check_hex32(digest_hex, "object digest", InputError)
    return f"{step_dir(step)}/shard-{shard:05d}-of-{num_shards:05d}-{kind}-{digest_hex}.arc"


def default_file_name(shard: int, num_shards: int) -> str:
    return f"shard-{shard:05d}-of-{num_shards:05d}.safetensors"


def check_object_name(name, step: int, shard: int, num_shards: int, kind: str, digest_hex: str,
                      where: str) -> str:
    """An object name read from a manifest must be exactly the one its fields derive (`corrupt`)."""
    if not isinstance(name, str) or not _OBJECT.match(name):
        raise CorruptError(f"{where}: object name {name!r} is not a stream data object name")
    expect = object_name(step, shard, num_shards, kind, digest_hex)
    if name != expect:
        raise CorruptError(f"{where}: object name {name!r} does not match its fields (expected {expect!r})")
    return name


def split_root(url) -> str:
    """Check a stream root URL or path given by a user: no '.'/'..' segments, no control characters."""
    if not isinstance(url, str) or not url:
        raise InputError("the stream URL must be a non-empty string")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in url):
        raise InputError(f"stream URL {url!r} contains control characters")
    if len(url.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        raise InputError(f"stream URL is longer than {MAX_NAME_BYTES} bytes")
    path = url.split("://", 1)[1] if "://" in url else url
    for seg in path.split("/"):
        if seg in (".", ".."):
            raise InputError(f"stream URL {url!r} has a '.' or '..' segment")
    return url


def tensor_patterns(patterns) -> list[str] | None:
    """Tensor filter patterns (shell globs on tensor names); ``None`` = every tensor."""
    if patterns is None:
        return None
    if isinstance(patterns, str):
        patterns = [patterns]
    out = []
    for p in patterns:
        if not isinstance(p, str) or not p or len(p.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
            raise InputError(f"tensor pattern {p!r} must be a non-empty string of at most {MAX_NAME_BYTES} bytes")
        if p not in out:
            out.append(p)
    if not out:
        raise InputError("give at least one tensor pattern, or none for every tensor")
    return sorted(out)
