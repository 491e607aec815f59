"""The trainer side: each shard publishes its part of a step; the last one to finish commits it.

Protocol for step S, shard i of n (SPEC.md Part II):
1. encode the shard's delta from its previous step (and a keyframe when due) into local temporary
   files; upload each as an immutable, content-addressed data object;
2. create the shard's descriptor ``steps/S/shard-i-of-n.json`` with a conditional create — the
   shard's claim: a second publisher with different content gets ``ConflictError``;
3. read every descriptor of step S; if all n exist, build the manifest and create
   ``steps/S/manifest.json`` conditionally (exactly one committer wins; the others find the same
   descriptors in the winner's manifest);
4. move ``head.json`` forward to S with compare-and-swap (never backwards).

Every read and write goes through :class:`arcfmt.store.backends.Store` (the store's adapter, the one
retry layer); the objects are :mod:`arcfmt.store.objects`.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import xxhash

from .. import layout as FL
from .. import records
from ..arrays import as_numpy, as_uint
from ..errors import ArcError, InputError
from ..integrity import model_digest, tensor_hash
from ..reader import DeltaReader
from ..safetensors_io import open_checkpoint, write_file
from ..writer import DEFAULT_BLOCK_ELEMS, DeltaWriter
from . import names as N
from .backends import Store
from .errors import ConflictError
from .objects import (
    MAX_DESCRIPTOR_BYTES,
    MAX_HEAD_BYTES,
    MAX_MANIFEST_BYTES,
    Descriptor,
    Head,
    Manifest,
    ObjectRef,
    ShardEntry,
    parse_descriptor,
    parse_head,
    parse_manifest,
)

HEAD_ATTEMPTS = 32


@dataclass
class CommitResult:
    step: int
    committed: bool                 # the step's manifest exists (written by this call or another)
    made_manifest: bool = False     # this call wrote it
    waiting_for: list = field(default_factory=list)   # shards whose descriptors are missing
    waiting_for_base: int | None = None
    head: int | None = None         # the head's step after this call
    manifest: Manifest | None = None


@dataclass
class PublishResult:
    step: int
    shard: int
    num_shards: int
    file: str
    delta: ObjectRef | None
    keyframe: ObjectRef | None
    model_bytes: int
    commit: CommitResult
    encode_seconds: float
    upload_seconds: float
    seconds: float

    def as_dict(self) -> dict:
        c = self.commit
        return dict(step=self.step, shard=self.shard, num_shards=self.num_shards, file=self.file,
                    delta=None if self.delta is None else self.delta.to_json(),
                    keyframe=None if self.keyframe is None else self.keyframe.to_json(),
                    model_bytes=self.model_bytes, committed=c.committed, made_manifest=c.made_manifest,
                    waiting_for=c.waiting_for, waiting_for_base=c.waiting_for_base, head=c.head,
                    encode_seconds=self.encode_seconds, upload_seconds=self.upload_seconds, seconds=self.seconds)


class _HashingWriter:
    """A write-only file wrapper that hashes (xxh3-128) and counts what passes through."""

    def __init__(self, f):
        self._f = f
        self.h = xxhash.xxh3_128()
        self.n = 0

    def write(self, data):
        self._f.write(data)
        self.h.update(data)
        self.n += len(data)
        return len(data)


def _load_tensors(obj, what: str):
    """(mapping name → array, source path or None) from a mapping or a safetensors file/folder path."""
    if isinstance(obj, Mapping):
        return obj, None
    if isinstance(obj, (str, os.PathLike)):
        return open_checkpoint(os.fspath(obj)).tensors(), os.fspath(obj)
    raise InputError(f"{what} must be a mapping of tensor name to array, or a safetensors path")


class Publisher:
    """Publishes one trainer shard's part of every step to a stream (any fsspec URL).

    ``publish(step, tensors)`` encodes the delta from the previous step this publisher published
    (kept in memory, or in ``state_dir`` across processes; or given as ``base=`` / ``base_step=``),
    plus a keyframe every ``keyframe_every`` steps (``step % keyframe_every == 0``) or on demand.

    ``writer``: an id shared by every rank of one trainer incarnation (a job id). A step is only
    committed from descriptors of one writer, so two trainers racing for the same steps cannot have
    their shards mixed into one step; without it such a race is detected per shard only.
    """

    def __init__(self, url: str, *, shard: int = 0, num_shards: int = 1, keyframe_every: int = 10,
                 storage_options: dict | None = None, fs=None, effort: str = "default",
                 keyframe_effort: str = "fast", block_elems: int = DEFAULT_BLOCK_ELEMS, workers=None,
                 remember: bool = True, state_dir: str | None = None, tmp_dir: str | None = None,
                 retries: int = 5, writer: str | None = None):
        N.check_shard(shard, num_shards)
        self.writer = N.check_writer(writer)
        if isinstance(keyframe_every, bool) or not isinstance(keyframe_every, int) or keyframe_every < 0:
            raise InputError("keyframe_every must be a non-negative integer (0: only on demand)")
        self.store = Store(url, storage_options, fs=fs, retries=retries)
        self.url = url
        self.shard = shard
        self.num_shards = num_shards
        self.keyframe_every = keyframe_every
        self.effort = effort
        self.keyframe_effort = keyframe_effort
        self.block_elems = block_elems
        self.workers = workers
        self.remember = remember
        self.state_dir = state_dir
        self.tmp_dir = tmp_dir
        self._last: tuple[int, dict[str, np.ndarray]] | None = None   # (step, {name: array}) of the previous publish

    # ------------------------------------------------------------------------------ state
    def _state_paths(self, state_dir: str) -> tuple[str, str]:
        stem = f"arcfmt-publisher-shard-{self.shard:05d}-of-{self.num_shards:05d}"
        return os.path.join(state_dir, stem + ".json"), os.path.join(state_dir, stem + ".safetensors")

    def _load_state(self):
        if not self.state_dir:
            return None
        jpath, cpath = self._state_paths(self.state_dir)
        try:
            with open(jpath, "rb") as f:
                st = json.load(f)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise InputError(f"{jpath}: unreadable publisher state ({exc}); remove it to start over") from None
        if not isinstance(st, dict) or st.get("url") != self.url or not isinstance(st.get("step"), int):
            raise InputError(f"{jpath} belongs to another stream ({st.get('url') if isinstance(st, dict) else '?'}); "
                             f"use another --state folder")
        name = st.get("tensors", os.path.basename(cpath))   # state folders written before "tensors" existed
        if not isinstance(name, str) or os.path.basename(name) != name or not name.endswith(".safetensors"):
            raise InputError(f"{jpath}: unreadable publisher state (tensors {name!r}); remove it to start over")
        return st["step"], open_checkpoint(os.path.join(self.state_dir, name)).tensors()

    def _save_state(self, step, tensors, source_path):
        if not self.state_dir:
            return
        os.makedirs(self.state_dir, exist_ok=True)
        jpath, cpath = self._state_paths(self.state_dir)
        # The tensors go to a file named by their step, and the JSON switches to it with one rename: a
        # kill at any moment leaves a state whose step and tensors agree (else the next step's delta
        # would be made from one step's tensors but labelled with another base step).
        stem = os.path.basename(cpath)[: -len(".safetensors")]
        name = f"{stem}-step{step}.safetensors"
        path = os.path.join(self.state_dir, name)
        tmp = path + f".tmp-{os.getpid()}"
        if source_path is not None and os.path.isfile(source_path):
            shutil.copyfile(source_path, tmp)
        else:
            write_file(tmp, dict(tensors))
        os.replace(tmp, path)
        with open(jpath + ".tmp", "w") as f:
            json.dump({"url": self.url, "step": step, "shard": self.shard, "num_shards": self.num_shards,
                       "tensors": name}, f)
        os.replace(jpath + ".tmp", jpath)
        for n in os.listdir(self.state_dir):     # earlier steps' tensors
            if n != name and (n == os.path.basename(cpath) or (n.startswith(stem + "-step")
                                                                and n.endswith(".safetensors"))):
                try:
                    os.unlink(os.path.join(self.state_dir, n))
                except FileNotFoundError:
                    pass

    # ------------------------------------------------------------------------------ publish
    def publish(self, step: int, tensors, *, base=None, base_step: int | None = None, keyframe: bool | None = None,
                file_name: str | None = None) -> PublishResult:
        """Publish this shard's tensors for ``step``; commit the step if every shard is there.

        ``tensors``: mapping name → array (numpy, ml_dtypes, torch) or a safetensors file path.
        ``base``/``base_step``: the previous step's tensors of this shard (default: what this
        publisher published last). ``keyframe``: True forces one, False never (unless there is no
        base), None follows ``keyframe_every``.
        """
        t_start = time.perf_counter()
        N.check_step(step)
        target, source_path = _load_tensors(tensors, "tensors")
        if base is not None:
            if base_step is None:
                raise InputError("base= needs base_step=")
            base_map, _ = _load_tensors(base, "base")
        elif base_step is not None:
            raise InputError("base_step= needs base=")
        else:
            last = self._last if self._last is not None else self._load_state()
            base_map, base_step = (last[1], last[0]) if last is not None else (None, None)
        if base_step is not None:
            N.check_step(base_step, "base step")
            if base_step >= step:
                if base is not None:
                    raise InputError(f"base step {base_step} is not before step {step}")
                base_map, base_step = None, None  # republishing an earlier step: keyframe only
        if file_name is None:
            b = os.path.basename(source_path) if source_path and os.path.isfile(source_path) else None
            try:
                file_name = N.check_file_name(b) if b else N.default_file_name(self.shard, self.num_shards)
            except InputError:
                file_name = N.default_file_name(self.shard, self.num_shards)
        N.check_file_name(file_name)
        if keyframe is None:
            make_kf = base_map is None or (self.keyframe_every > 0 and step % self.keyframe_every == 0)
        else:
            make_kf = bool(keyframe) or base_map is None

        model_bytes = sum(int(as_numpy(a).nbytes) for a in target.values())
        done = self._already_published(step, target)
        if done is not None:  # a retry of a publish that got as far as its claim: finish the commit only
            result = self.commit(step, mine=done)
            self._remember(step, target, source_path)
            return PublishResult(step, self.shard, self.num_shards, done.file, done.delta, done.keyframe,
                                 model_bytes, result, 0.0, 0.0, time.perf_counter() - t_start)
        t0 = time.perf_counter()
        made = {}
        tmpfiles: list[str] = []
        try:
            if base_map is not None:
                made["delta"] = self._encode(step, target, base_map, base_step, tmpfiles)
            if make_kf:
                made["keyframe"] = self._encode(step, target, None, None, tmpfiles)
            t1 = time.perf_counter()
            refs = {}
            for kind, (path, info) in made.items():
                name = N.object_name(step, self.shard, self.num_shards, kind, info["xxh3_128"])
                self.store.put_file(name, path)
                refs[kind] = ObjectRef(name, info["size"], info["xxh3_128"], info["index_offset"], info["tail"],
                                       base_step if kind == "delta" else None,
                                       info["base_digest"] if kind == "delta" else None)
            t2 = time.perf_counter()
        finally:
            for p in tmpfiles:
                try:
                    os.unlink(p)
                except FileNotFoundError:
                    pass
        first = next(iter(made.values()))[1]
        assert len({info["target_digest"] for _, info in made.values()}) == 1, "delta and keyframe disagree"
        desc = Descriptor(step, self.shard, self.num_shards, file_name, first["target_digest"], first["tensors"],
                          refs.get("delta"), refs.get("keyframe"), self.writer)
        self._claim(desc)
        result = self.commit(step, mine=desc)
        self._remember(step, target, source_path)
        t3 = time.perf_counter()
        return PublishResult(step, self.shard, self.num_shards, file_name, refs.get("delta"), refs.get("keyframe"),
                             model_bytes, result, t1 - t0, t2 - t1, t3 - t_start)

    def _remember(self, step, target, source_path) -> None:
        if self.remember:
            self._last = (step, {n: np.array(as_numpy(a), copy=True) for n, a in target.items()})
        self._save_state(step, target, source_path)

    def _already_published(self, step, target) -> Descriptor | None:
        """This shard's descriptor for ``step`` if it exists with these very tensors (a retry); None
        if there is none; ``conflict`` if another publisher claimed the shard with other tensors."""
        name = N.descriptor_name(step, self.shard, self.num_shards)
        raw = self.store.read(name, MAX_DESCRIPTOR_BYTES, missing_ok=True)
        if raw is None:
            return None
        d = parse_descriptor(raw, name)
        entries = []
        for n, a in target.items():
            dt, shape, u = as_uint(a)
            entries.append((n.encode("utf-8"), dt.code, tuple(shape), tensor_hash(u)))
        if d.target_digest != model_digest(entries).hex() or d.writer != self.writer:
            raise ConflictError(f"shard {self.shard} of {self.num_shards} for step {step} was already published "
                                f"by another publisher with different content ({name}"
                                f"{f', writer {d.writer}' if d.writer else ''})")
        return d

    def _encode(self, step, target, base, base_step, tmpfiles):
        fd, path = tempfile.mkstemp(prefix="arcfmt-publish-", suffix=".arc", dir=self.tmp_dir)
        tmpfiles.append(path)
        with os.fdopen(fd, "wb") as f:
            hw = _HashingWriter(f)
            w = DeltaWriter(hw, base_step=base_step, target_step=step, block_elems=self.block_elems,
                            effort=self.effort if base is not None else self.keyframe_effort, workers=self.workers)
            w.write_tensors((n, None if base is None else base.get(n), a) for n, a in target.items())
            w.close()
        size = hw.n
        with open(path, "rb") as f:
            f.seek(size - FL.TRAILER_SIZE)
            trailer = records.check_trailer(f.read(FL.TRAILER_SIZE), size)
            f.seek(trailer.index_offset)
            tail = f.read(size - trailer.index_offset)
            f.seek(0)
            r = DeltaReader(f)
            tensors = []
            for n in r.names:
                th = r.header(n)
                tensors.append((n, th.dtype.name, tuple(th.shape), f"{th.target_hash:016x}"))
            info = dict(size=size, xxh3_128=hw.h.hexdigest(), index_offset=trailer.index_offset,
                        tail=xxhash.xxh3_64_hexdigest(tail), target_digest=r.target_digest.hex(),
                        base_digest=r.base_digest.hex(), tensors=tensors)
        return path, info

    def _claim(self, desc: Descriptor) -> None:
        """Create the shard's descriptor; an existing one must be byte-identical (a retry)."""
        name = N.descriptor_name(desc.step, desc.shard, desc.num_shards)
        data = desc.to_bytes()
        if self.store.create(name, data):
            return
        existing = self.store.read(name, MAX_DESCRIPTOR_BYTES)
        if existing != data:
            other = None
            try:
                other = parse_descriptor(existing, name).writer
            except ArcError:
                pass
            raise ConflictError(f"shard {desc.shard} of {desc.num_shards} for step {desc.step} was already "
                                f"published by another publisher with different content ({name}"
                                f"{f', writer {other}' if other else ''})")

    # ------------------------------------------------------------------------------ commit
    def commit(self, step: int, *, mine: Descriptor | None = None, _depth: int = 0) -> CommitResult:
        """Write step ``step``'s manifest if every shard's descriptor exists, then move the head.

        Safe to call any number of times from any shard (it is what ``publish`` ends with). With
        ``mine`` (this shard's descriptor), a manifest that does not contain it is ``conflict``.
        """
        N.check_step(step)
        n = self.num_shards
        mname = N.manifest_name(step)
        raw = self.store.read(mname, MAX_MANIFEST_BYTES, missing_ok=True)
        if raw is not None:
            m = parse_manifest(raw, mname)
            _check_mine(m, mine)
            return CommitResult(step, True, False, head=self._advance_head(m), manifest=m)
        dnames = [N.descriptor_name(step, i, n) for i in range(n)]
        raws = self.store.read_many(dnames, MAX_DESCRIPTOR_BYTES)
        missing = [i for i, r in enumerate(raws) if r is None]
        if missing:
            return CommitResult(step, False, waiting_for=missing)
        descs = []
        for i, (r, dn) in enumerate(zip(raws, dnames)):
            d = parse_descriptor(r, dn)
            if (d.step, d.shard, d.num_shards) != (step, i, n):
                raise ConflictError(f"{dn} describes step {d.step} shard {d.shard} of {d.num_shards}")
            descs.append(d)
        # a delta object always has its base_step (ObjectRef.kind); the second test only tells mypy so
        bases = {d.delta.base_step for d in descs if d.delta is not None and d.delta.base_step is not None}
        use_delta = all(d.delta is not None for d in descs) and len(bases) == 1
        use_kf = all(d.keyframe is not None for d in descs)
        base_m = None
        if use_delta:
            b = next(iter(bases))
            bname = N.manifest_name(b)
            braw = self.store.read(bname, MAX_MANIFEST_BYTES, missing_ok=True)
            if braw is None and _depth == 0:
                self.commit(b, _depth=1)   # its last shard may have died before committing it
                braw = self.store.read(bname, MAX_MANIFEST_BYTES, missing_ok=True)
            if braw is None:
                if not use_kf:
                    return CommitResult(step, False, waiting_for_base=b)
                use_delta = False
            else:
                base_m = parse_manifest(braw, bname)
                if base_m.step != b:
                    raise ConflictError(f"{bname} describes step {base_m.step}")
        if not use_delta and not use_kf:
            raise ConflictError(f"step {step} cannot be committed: its shards do not all have a delta from the "
                                f"same base step ({sorted(bases)}) nor all a keyframe")
        writers = sorted({d.writer or "" for d in descs})
        if len(writers) > 1:
            raise ConflictError(f"step {step} cannot be committed: its shards come from different writers "
                                f"({', '.join(w or '(none)' for w in writers)})")
        entries = []
        owner: dict[bytes, int] = {}   # tensor name → shard
        files: dict[str, int] = {}     # file name, lower case → shard
        for d in descs:
            for e in d.digest_entries():
                if e[0] in owner:
                    raise ConflictError(f"step {step}: tensor {e[0].decode()!r} is published by shards "
                                        f"{owner[e[0]]} and {d.shard}")
                owner[e[0]] = d.shard
                entries.append(e)
            if d.file.lower() in files:
                raise ConflictError(f"step {step}: shards {files[d.file.lower()]} and {d.shard} use the same "
                                    f"file name {d.file!r}")
            files[d.file.lower()] = d.shard
        m_base_step: int | None = None
        m_base_digest: str | None = None
        keyframe_step = step
        if use_delta:
            assert base_m is not None   # read and parsed above whenever use_delta still holds
            m_base_step, m_base_digest = base_m.step, base_m.digest
            if not use_kf:
                keyframe_step = base_m.keyframe_step
        m = Manifest(step, m_base_step, m_base_digest, use_kf, keyframe_step, model_digest(entries).hex(), len(entries),
                     [ShardEntry(d.shard, d.file, d.digest, d.target_digest, len(d.tensors),
                                 d.delta if use_delta else None, d.keyframe if use_kf else None) for d in descs],
                     descs[0].writer)
        data = m.to_bytes()
        made = self.store.create(mname, data)
        if made:
            m.raw = data
        else:
            m = parse_manifest(self.store.read(mname, MAX_MANIFEST_BYTES), mname)
            if [s.descriptor for s in m.shards] != [d.digest for d in descs]:
                raise ConflictError(f"{mname} was written from other shard descriptors than the ones in the store")
        _check_mine(m, mine)
        return CommitResult(step, True, made, head=self._advance_head(m), manifest=m)

    def _advance_head(self, m: Manifest) -> int:
        """Compare-and-swap the head forward to ``m`` unless it is already at or past it."""
        for attempt in range(HEAD_ATTEMPTS):
            raw, token = self.store.read_versioned(N.HEAD, MAX_HEAD_BYTES)
            if raw is not None:
                try:
                    h = parse_head(raw)
                except ArcError:
                    h = None  # a damaged head is repaired by the next commit
                if h is not None and h.step >= m.step:
                    return h.step
            new = Head(m.step, m.digest, m.keyframe_step, int(time.time() * 1000)).to_bytes()
            if self.store.replace(N.HEAD, new, token):
                return m.step
            time.sleep(random.random() * 0.05 * (attempt + 1))
        raise ConflictError(f"could not move {N.HEAD} to step {m.step}: {HEAD_ATTEMPTS} compare-and-swap attempts lost")


def _check_mine(m: Manifest, mine: Descriptor | None) -> None:
    if mine is None:
        return
    if m.num_shards != mine.num_shards or m.shards[mine.shard].descriptor != mine.digest:
        raise ConflictError(f"step {m.step} was committed without this publisher's shard {mine.shard} of "
                            f"{mine.num_shards} (another writer's shards won the step)")


__all__ = ["Publisher", "PublishResult", "CommitResult"]
