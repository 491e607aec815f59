"""The stream's JSON objects (SPEC.md Part II): head pointer, per-step manifest, shard descriptor.

Not to be confused with :mod:`arcfmt.layout`, the byte layouts of the delta file format (Part I)
that the data objects named here are written in. Each object is one JSON object in canonical form
(sorted keys, no spaces, ASCII, one trailing newline), so the same content always has the same
bytes and the same xxh3-128. Parsing is strict — size capped before decoding, UTF-8, no duplicate
keys, no floats/NaN, every field type- and range-checked — because every byte comes from a shared
bucket. Unknown keys are ignored (SPEC.md Part II).
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field

import xxhash

from .. import dtypes
from .. import layout as FL
from ..errors import ArcError, CorruptError, LimitError, UnsupportedVersionError
from . import names as N

MAJOR, MINOR = 1, 1
VERSION = [MAJOR, MINOR]

HEAD_FORMAT = "arcfmt-stream-head"
MANIFEST_FORMAT = "arcfmt-stream-manifest"
DESCRIPTOR_FORMAT = "arcfmt-stream-shard"

MAX_HEAD_BYTES = 4096
MAX_MANIFEST_BYTES = 16 << 20
MAX_DESCRIPTOR_BYTES = 64 << 20
MAX_TENSORS = FL.MAX_TENSORS         # per shard, as in the file format
MAX_OBJECT_BYTES = (1 << 63) - 1
MIN_TAIL_BYTES = FL.RECORD_HEADER_SIZE + FL.TRAILER_SIZE                          # 56: an empty INDX + trailer
MAX_TAIL_BYTES = FL.RECORD_HEADER_SIZE + FL.MAX_RECORD_PAYLOAD + FL.TRAILER_SIZE  # the largest INDX + trailer
_HEX16 = re.compile(r"[0-9a-f]{16}\Z")
_HEX64 = re.compile(r"[0-9a-f]{64}\Z")


# ------------------------------------------------------------------------------------ JSON

def canonical(obj) -> bytes:
    """The one byte form writers use: sorted keys, ``,``/``:`` separators, ASCII escapes, ``\\n``."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode() + b"\n"


def digest128(data) -> str:
    """xxh3-128 of bytes as 32 lower-case hex digits (the canonical big-endian form)."""
    return xxhash.xxh3_128_hexdigest(data)


def _no_dupes(pairs):
    out = {}
    for k, v in pairs:
        if k in out:
            raise CorruptError(f"duplicate key {k!r}")
        out[k] = v
    return out


def _no_float(s):
    raise CorruptError(f"non-integer number {s!r}")


def parse_json(data, what: str, limit: int, containers: int = 1024) -> dict:
    """Decode one untrusted JSON object of at most ``limit`` bytes and at most ``containers`` arrays
    and objects (SPEC.md S12; `limit`, `corrupt`)."""
    if len(data) > limit:
        raise LimitError(f"{what} is {len(data)} bytes, more than the {limit}-byte limit")
    if len(data) > 2 * containers:   # each array or object takes two bytes at least: else within the bound
        n = _containers(bytes(data), containers)
        if n > containers:
            raise LimitError(f"{what} holds {n} JSON arrays and objects, more than the {containers} it may (S12)")
    try:
        text = bytes(data).decode("utf-8")
        obj = json.loads(text, object_pairs_hook=_no_dupes, parse_float=_no_float, parse_constant=_no_float)
    except CorruptError as exc:
        raise CorruptError(f"{what}: {exc}") from None
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise CorruptError(f"{what} is not valid UTF-8 JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise CorruptError(f"{what} is not a JSON object")
    if _depth(obj) > MAX_JSON_DEPTH:
        raise CorruptError(f"{what} nests deeper than {MAX_JSON_DEPTH} levels")
    return obj


MAX_JSON_DEPTH = 64
# A run of JSON strings (escapes included) and bytes other than the brackets that open an array or an
# object; a string left open runs to the end, so the scan never fails and restarts. Linear, and every
# repetition possessive: a repetition that may backtrack keeps a frame per byte (8 GB for a 64 MiB
# string), and ``re.sub`` over such runs built a list of every piece between them (2 GB for 11M short
# strings); the count below iterates once per bracket at most, and stops past the bound.
_JSON_RUN = re.compile(rb'(?:"[^"\\]*+(?:\\.[^"\\]*+)*+(?:"|\\?\Z)|[^"\[{]++)++', re.DOTALL)


def _containers(data: bytes, bound: int) -> int:
    """The number of ``[`` and ``{`` outside JSON strings: exact up to ``bound``, else some count above it."""
    at = n = 0
    for run in _JSON_RUN.finditer(data):
        n += run.start() - at   # the brackets between two runs
        at = run.end()
        if n > bound:
            return n
    return n + len(data) - at
# Arrays and objects one object may hold (S12): four times what the largest valid one holds
HEAD_CONTAINERS = SIGNATURE_CONTAINERS = 1024
MANIFEST_CONTAINERS = 16 * N.MAX_SHARDS + 1024
DESCRIPTOR_CONTAINERS = 4 * MAX_TENSORS + 1024


def _depth(obj) -> int:
    """Nesting depth of decoded JSON, computed without recursion."""
    deepest = 0
    stack = [(obj, 1)]
    while stack:
        node, d = stack.pop()
        deepest = max(deepest, d)
        if deepest > MAX_JSON_DEPTH:
            return deepest
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        stack.extend((c, d + 1) for c in children if isinstance(c, (dict, list)))
    return deepest


class _Fields:
    """Typed access to a decoded JSON object; every miss or mistype is `corrupt`, naming the field."""

    def __init__(self, obj: dict, where: str):
        self.obj = obj
        self.where = where

    def get(self, key, kind, *, nullable=False):
        if key not in self.obj:
            raise CorruptError(f"{self.where}: missing field {key!r}")
        v = self.obj[key]
        if v is None and nullable:
            return None
        ok = (isinstance(v, int) and not isinstance(v, bool)) if kind is int else isinstance(v, kind)
        if not ok:
            raise CorruptError(f"{self.where}: field {key!r} must be {kind.__name__}"
                               f"{' or null' if nullable else ''}, not {type(v).__name__}")
        return v

    def int(self, key, lo=0, hi=MAX_OBJECT_BYTES, *, nullable=False):
        v = self.get(key, int, nullable=nullable)
        if v is not None and not lo <= v <= hi:
            raise CorruptError(f"{self.where}: field {key!r} = {v} is outside {lo}..{hi}")
        return v

    def hex32(self, key, *, nullable=False):
        v = self.get(key, str, nullable=nullable)
        return None if v is None else N.check_hex32(v, f"{self.where}: field {key!r}")

    def hex16(self, key):
        v = self.get(key, str)
        if not _HEX16.match(v):
            raise CorruptError(f"{self.where}: field {key!r} must be 16 lower-case hex digits")
        return v

    def sha256(self, key, *, nullable=False):
        """An optional 1.1 field (S15): None when absent; when present, 64 lower-case hex digits."""
        if key not in self.obj:
            return None
        v = self.get(key, str, nullable=nullable)
        if v is not None and not _HEX64.match(v):
            raise CorruptError(f"{self.where}: field {key!r} must be 64 lower-case hex digits")
        return v


def _check_kind(obj: dict, fmt: str, where: str) -> _Fields:
    f = _Fields(obj, where)
    got = f.get("format", str)
    if got != fmt:
        raise CorruptError(f"{where}: format is {got!r}, expected {fmt!r}")
    v = f.get("version", list)
    if len(v) != 2 or not all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 1 << 16 for x in v):
        raise CorruptError(f"{where}: version must be [major, minor], two integers in 0..65535")
    if v[0] != MAJOR:
        raise UnsupportedVersionError(f"{where}: stream version {v[0]}.{v[1]}; this reader implements {MAJOR}.x")
    return f


# ------------------------------------------------------------------------------------ objects

@dataclass(frozen=True)
class ObjectRef:
    """One immutable data object (an arcfmt file) of a shard: a delta or a keyframe."""

    name: str
    size: int
    xxh3_128: str           # of the whole object
    index_offset: int       # where its INDX record starts (SPEC.md §11)
    tail_xxh3_64: str       # xxh3-64 of bytes [index_offset, size): INDX record + trailer
    base_step: int | None = None     # deltas only
    base_digest: str | None = None   # deltas only: the file's base digest (SPEC.md §13.2)
    sha256: str | None = None        # SHA-256 of the whole object (1.1, S15; None in 1.0 objects)

    @property
    def kind(self) -> str:
        return "keyframe" if self.base_step is None else "delta"

    @property
    def tail_size(self) -> int:
        return self.size - self.index_offset

    def to_json(self) -> dict:
        d = dict(name=self.name, size=self.size, xxh3_128=self.xxh3_128, index_offset=self.index_offset,
                 tail_xxh3_64=self.tail_xxh3_64)
        if self.base_step is not None:
            d.update(base_step=self.base_step, base_digest=self.base_digest)
        if self.sha256 is not None:
            d.update(sha256=self.sha256)
        return d


def _parse_object(obj, kind, step, shard, num_shards, where) -> ObjectRef:
    if not isinstance(obj, dict):
        raise CorruptError(f"{where}: must be a JSON object")
    f = _Fields(obj, where)
    size = f.int("size", FL.MIN_FILE_SIZE, MAX_OBJECT_BYTES)
    digest = f.hex32("xxh3_128")
    name = N.check_object_name(f.get("name", str), step, shard, num_shards, kind, digest, where)
    index_offset = f.int("index_offset", FL.FIRST_RECORD_OFFSET, size - MIN_TAIL_BYTES)
    if size - index_offset > MAX_TAIL_BYTES:
        # the tail is one INDX record (a record header and at most MAX_RECORD_PAYLOAD bytes, SPEC.md §14) and the
        # trailer: a follower reads it whole, so a larger one is refused before any request is planned
        raise LimitError(f"{where}: its index and trailer would be {size - index_offset} bytes "
                         f"(size {size} - index_offset {index_offset}), more than {MAX_TAIL_BYTES}")
    tail = f.hex16("tail_xxh3_64")
    base_step = base_digest = None
    if kind == "delta":
        base_step = f.int("base_step", 0, N.MAX_STEP)
        if base_step >= step:
            raise CorruptError(f"{where}: base_step {base_step} is not before step {step}")
        base_digest = f.hex32("base_digest")
    return ObjectRef(name, size, digest, index_offset, tail, base_step, base_digest, f.sha256("sha256"))


# ------------------------------------------------------------------------------------ head

@dataclass(frozen=True)
class Head:
    step: int
    manifest: str           # xxh3-128 hex of the manifest's bytes
    keyframe_step: int
    time_ms: int            # when the head was moved (informative: lag in seconds)

    def to_bytes(self) -> bytes:
        return canonical(dict(format=HEAD_FORMAT, version=VERSION, step=self.step, manifest=self.manifest,
                              keyframe_step=self.keyframe_step, time_ms=self.time_ms))


def parse_head(data, where: str = N.HEAD) -> Head:
    f = _check_kind(parse_json(data, where, MAX_HEAD_BYTES, HEAD_CONTAINERS), HEAD_FORMAT, where)
    step = f.int("step", 0, N.MAX_STEP)
    kf = f.int("keyframe_step", 0, step)
    return Head(step, f.hex32("manifest"), kf, f.int("time_ms", 0, MAX_OBJECT_BYTES))


# ------------------------------------------------------------------------------------ descriptor

@dataclass
class Descriptor:
    """What one shard published for one step: its claim, written before the manifest."""

    step: int
    shard: int
    num_shards: int
    file: str
    target_digest: str
    tensors: list           # (name, dtype name, shape tuple, hash hex16), in file order
    delta: ObjectRef | None
    keyframe: ObjectRef | None
    writer: str | None = None     # the trainer incarnation that published it (S5)
    raw: bytes = b""

    @property
    def digest(self) -> str:
        return digest128(self.raw if self.raw else self.to_bytes())

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.raw if self.raw else self.to_bytes()).hexdigest()

    def to_bytes(self) -> bytes:
        return canonical(dict(
            format=DESCRIPTOR_FORMAT, version=VERSION, step=self.step, shard=self.shard,
            num_shards=self.num_shards, file=self.file, target_digest=self.target_digest, writer=self.writer,
            tensors=[[n, d, list(s), h] for n, d, s, h in self.tensors],
            delta=None if self.delta is None else self.delta.to_json(),
            keyframe=None if self.keyframe is None else self.keyframe.to_json()))

    def digest_entries(self):
        """(name bytes, dtype code, shape, hash) for the model digest of SPEC.md §13.2."""
        return [(n.encode("utf-8"), dtypes.from_name(d).code, tuple(s), int(h, 16)) for n, d, s, h in self.tensors]


def parse_descriptor(data, where: str) -> Descriptor:
    f = _check_kind(parse_json(data, where, MAX_DESCRIPTOR_BYTES, DESCRIPTOR_CONTAINERS), DESCRIPTOR_FORMAT, where)
    step = f.int("step", 0, N.MAX_STEP)
    num_shards = f.int("num_shards", 1, N.MAX_SHARDS)
    shard = f.int("shard", 0, num_shards - 1)
    file = N.check_file_name(f.get("file", str), CorruptError)
    target_digest = f.hex32("target_digest")
    raw_tensors = f.get("tensors", list)
    if len(raw_tensors) > MAX_TENSORS:
        raise LimitError(f"{where}: {len(raw_tensors)} tensors, more than {MAX_TENSORS}")
    tensors, seen = [], set()
    from ..records import check_name
    for i, t in enumerate(raw_tensors):
        w = f"{where}: tensors[{i}]"
        if not (isinstance(t, list) and len(t) == 4 and isinstance(t[0], str) and isinstance(t[1], str)
                and isinstance(t[2], list) and isinstance(t[3], str)):
            raise CorruptError(f"{w} must be [name, dtype, shape, hash]")
        name, dt, shape, h = t
        check_name(name.encode("utf-8", "surrogatepass"), w)
        if name in seen:
            raise CorruptError(f"{w}: duplicate tensor {name!r}")
        seen.add(name)
        if dt not in dtypes.BY_NAME:
            raise CorruptError(f"{w}: unknown dtype {dt!r}")
        if len(shape) > FL.MAX_DIMS or not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 1 << 63
                                               for d in shape):
            raise CorruptError(f"{w}: shape must be at most {FL.MAX_DIMS} non-negative integers")
        if not _HEX16.match(h):
            raise CorruptError(f"{w}: hash must be 16 lower-case hex digits")
        tensors.append((name, dt, tuple(shape), h))
    objs = {}
    for kind in N.KINDS:
        v = f.get(kind, dict, nullable=True)
        objs[kind] = None if v is None else _parse_object(v, kind, step, shard, num_shards, f"{where}: {kind}")
    if objs["delta"] is None and objs["keyframe"] is None:
        raise CorruptError(f"{where}: a shard needs a delta or a keyframe object")
    writer = N.check_writer(f.get("writer", str, nullable=True), CorruptError)
    return Descriptor(step, shard, num_shards, file, target_digest, tensors, objs["delta"], objs["keyframe"],
                      writer, bytes(data))


# ------------------------------------------------------------------------------------ manifest

@dataclass
class ShardEntry:
    shard: int
    file: str
    descriptor: str         # xxh3-128 hex of the shard's descriptor bytes
    target_digest: str
    tensors: int
    delta: ObjectRef | None
    keyframe: ObjectRef | None
    descriptor_sha256: str | None = None   # SHA-256 of the descriptor's bytes (1.1, S15)

    def to_json(self) -> dict:
        d = dict(shard=self.shard, file=self.file, descriptor=self.descriptor, target_digest=self.target_digest,
                 tensors=self.tensors, delta=None if self.delta is None else self.delta.to_json(),
                 keyframe=None if self.keyframe is None else self.keyframe.to_json())
        if self.descriptor_sha256 is not None:
            d.update(descriptor_sha256=self.descriptor_sha256)
        return d

    def object(self, kind: str) -> ObjectRef:
        """The shard's object of ``kind``; asked only for a kind its manifest says every shard has."""
        ref = self.delta if kind == "delta" else self.keyframe
        if ref is None:
            raise CorruptError(f"shard {self.shard} has no {kind} object")
        return ref


@dataclass
class Manifest:
    """A committed step: written once, after every shard's objects and descriptor exist."""

    step: int
    base_step: int | None       # the step the delta objects apply to; None: no deltas
    base_manifest: str | None   # xxh3-128 hex of the base step's manifest bytes
    keyframe: bool              # every shard has a keyframe object
    keyframe_step: int          # latest step <= this one with keyframes, along the base chain
    model_digest: str           # SPEC.md §13.2 over every tensor of every shard
    tensors: int
    shards: list[ShardEntry] = field(default_factory=list)   # shard order
    writer: str | None = None   # every shard's descriptor names this writer
    raw: bytes = b""
    base_manifest_sha256: str | None = None   # SHA-256 of the base manifest's bytes (1.1, S15)
    has_base_sha256: bool = True  # write base_manifest_sha256 (null without a base); False: a 1.0 manifest

    @property
    def num_shards(self) -> int:
        return len(self.shards)

    @property
    def digest(self) -> str:
        return digest128(self.raw if self.raw else self.to_bytes())

    @property
    def sha256(self) -> str:
        """SHA-256 of the manifest's bytes: what a step's signature names (S15)."""
        return hashlib.sha256(self.raw if self.raw else self.to_bytes()).hexdigest()

    def cost(self, kind: str) -> int:
        """Bytes of every shard's object of this kind (the planner's edge weight)."""
        return sum(s.object(kind).size for s in self.shards)

    def to_bytes(self) -> bytes:
        return canonical(dict(
            format=MANIFEST_FORMAT, version=VERSION, step=self.step, base_step=self.base_step,
            base_manifest=self.base_manifest, keyframe=self.keyframe, keyframe_step=self.keyframe_step,
            model_digest=self.model_digest, tensors=self.tensors, shards=[s.to_json() for s in self.shards],
            writer=self.writer, **({"base_manifest_sha256": self.base_manifest_sha256} if self.has_base_sha256
                                   else {})))


def parse_manifest(data, where: str) -> Manifest:
    f = _check_kind(parse_json(data, where, MAX_MANIFEST_BYTES, MANIFEST_CONTAINERS), MANIFEST_FORMAT, where)
    step = f.int("step", 0, N.MAX_STEP)
    base_step = f.int("base_step", 0, N.MAX_STEP, nullable=True)
    if base_step is not None and base_step >= step:
        raise CorruptError(f"{where}: base_step {base_step} is not before step {step}")
    base_manifest = f.hex32("base_manifest", nullable=True)
    if (base_manifest is None) != (base_step is None):
        raise CorruptError(f"{where}: base_manifest must be given exactly when base_step is")
    has_base_sha256 = "base_manifest_sha256" in f.obj
    base_sha256 = f.sha256("base_manifest_sha256", nullable=True)
    if has_base_sha256 and (base_sha256 is None) != (base_step is None):
        raise CorruptError(f"{where}: base_manifest_sha256 must be null exactly when base_step is")
    keyframe = f.get("keyframe", bool)
    keyframe_step = f.int("keyframe_step", 0, step)
    if keyframe != (keyframe_step == step):
        raise CorruptError(f"{where}: keyframe_step must equal step exactly when the step has keyframes")
    if not keyframe and base_step is None:
        raise CorruptError(f"{where}: a step needs deltas (base_step) or keyframes")
    if base_step is not None and not keyframe and keyframe_step > base_step:
        raise CorruptError(f"{where}: keyframe_step {keyframe_step} is after base_step {base_step}")
    model_digest = f.hex32("model_digest")
    total = f.int("tensors", 0, MAX_TENSORS * N.MAX_SHARDS)
    raw_shards = f.get("shards", list)
    n = len(raw_shards)
    if not 1 <= n <= N.MAX_SHARDS:
        raise CorruptError(f"{where}: {n} shards, expected 1..{N.MAX_SHARDS}")
    shards, files = [], set()
    for i, s in enumerate(raw_shards):
        w = f"{where}: shards[{i}]"
        if not isinstance(s, dict):
            raise CorruptError(f"{w} must be a JSON object")
        sf = _Fields(s, w)
        if sf.int("shard", 0, n - 1) != i:
            raise CorruptError(f"{w}: shard number {s['shard']} out of order")
        file = N.check_file_name(sf.get("file", str), CorruptError)
        if file.lower() in files:
            raise CorruptError(f"{w}: file name {file!r} used by two shards")
        files.add(file.lower())
        objs = {}
        for kind in N.KINDS:
            v = sf.get(kind, dict, nullable=True)
            objs[kind] = None if v is None else _parse_object(v, kind, step, i, n, f"{w}: {kind}")
        if (objs["delta"] is not None) != (base_step is not None):
            raise CorruptError(f"{w}: every shard has a delta object exactly when the step has a base_step")
        if objs["delta"] is not None and objs["delta"].base_step != base_step:
            raise CorruptError(f"{w}: delta base_step {objs['delta'].base_step} differs from the step's {base_step}")
        if (objs["keyframe"] is not None) != keyframe:
            raise CorruptError(f"{w}: every shard has a keyframe object exactly when keyframe is true")
        shards.append(ShardEntry(i, file, sf.hex32("descriptor"), sf.hex32("target_digest"),
                                 sf.int("tensors", 0, MAX_TENSORS), objs["delta"], objs["keyframe"],
                                 sf.sha256("descriptor_sha256")))
    if sum(s.tensors for s in shards) != total:
        raise CorruptError(f"{where}: shard tensor counts do not add up to {total}")
    writer = N.check_writer(f.get("writer", str, nullable=True), CorruptError)
    return Manifest(step, base_step, base_manifest, keyframe, keyframe_step, model_digest, total, shards, writer,
                    bytes(data), base_sha256, has_base_sha256)


def own_name(obj) -> str:
    """The name SPEC.md S3 gives an object by what it describes: its step (and, for a descriptor, its
    shard and shard count). An object read under another name is not the one that name promises."""
    if isinstance(obj, Head):
        return N.HEAD
    if isinstance(obj, Manifest):
        return N.manifest_name(obj.step)
    if isinstance(obj, Descriptor):
        return N.descriptor_name(obj.step, obj.shard, obj.num_shards)
    from .signing import signature_name  # a signature (S15.2): beside the manifest it signs
    return signature_name(obj.step)


def check_own_name(obj, name: str, what: str | None = None, error: type[ArcError] = CorruptError) -> None:
    """SPEC.md S2 "Check order", last: the object was read under ``name``; the step (and, for a descriptor,
    the shard and shard count) that name carries must be the object's own (`corrupt`). Every reader of
    a stream (follower, mirror, pruner, publisher, the conformance runner) checks it here; ``what``
    names it; ``error``: a publisher's commit reports another writer's object as a conflict."""
    want = own_name(obj)
    if name != want:
        raise error(f"{what or name}: the object describes {want}")
