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

import contextlib
import hashlib
import json
import os
import random
import re
import shutil
import stat
import subprocess
import tempfile
import threading
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import xxhash

from .. import layout as FL
from .. import records
from ..arrays import Stored, as_numpy, as_uint
from ..errors import ArcError, InputError
from ..integrity import KnownBase, model_digest, tensor_hash
from ..parallel import default_workers, run_jobs
from ..reader import DeltaReader
from ..safetensors_io import open_checkpoint, write_file
from ..writer import DEFAULT_BLOCK_ELEMS, ON_MISMATCH, DeltaWriter, check_mismatches, check_readers
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
    check_own_name,
    parse_descriptor,
    parse_head,
    parse_manifest,
)
from .retry import check_count as retry_count
from .retry import check_seconds as retry_seconds

HEAD_ATTEMPTS = 32


@dataclass
class CommitResult:
    """Whether a step is committed: its manifest written (by this call or another shard's), or which
    shards' descriptors (or which base step) it still waits for, and where the head is."""

    step: int
    committed: bool                 # the step's manifest exists (written by this call or another)
    made_manifest: bool = False     # this call wrote it
    waiting_for: list = field(default_factory=list)   # shards whose descriptors are missing
    waiting_for_base: int | None = None
    head: int | None = None         # the head's step after this call
    manifest: Manifest | None = None


@dataclass
class PublishResult:
    """One shard's publish of a step: the objects uploaded (``delta``, ``keyframe``), the times, and
    the ``commit`` it led to (a :class:`CommitResult`)."""

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
    note: str | None = None         # why this step is a keyframe although a base was at hand

    def as_dict(self) -> dict:
        """The publish and its commit as a JSON-ready dict."""
        c = self.commit
        return dict(step=self.step, shard=self.shard, num_shards=self.num_shards, file=self.file,
                    delta=None if self.delta is None else self.delta.to_json(),
                    keyframe=None if self.keyframe is None else self.keyframe.to_json(),
                    model_bytes=self.model_bytes, committed=c.committed, made_manifest=c.made_manifest,
                    waiting_for=c.waiting_for, waiting_for_base=c.waiting_for_base, head=c.head,
                    encode_seconds=self.encode_seconds, upload_seconds=self.upload_seconds, seconds=self.seconds,
                    note=self.note)


class _HashingWriter:
    """A write-only file wrapper that hashes (xxh3-128 for the name, SHA-256 for signatures, S15) and
    counts what passes through: the object is hashed once, while it is written."""

    def __init__(self, f):
        self._f = f
        self.h = xxhash.xxh3_128()
        self.sha = hashlib.sha256()
        self.n = 0

    def write(self, data):
        self._f.write(data)
        self.h.update(data)
        self.sha.update(data)
        self.n += len(data)
        return len(data)


def _load_tensors(obj, what: str):
    """(mapping name → array, source path or None) from a mapping or a safetensors file/folder path."""
    if isinstance(obj, Mapping):
        return obj, None
    if isinstance(obj, (str, os.PathLike)):
        return open_checkpoint(os.fspath(obj)).stored(), os.fspath(obj)
    raise InputError(f"{what} must be a mapping of tensor name to array, or a safetensors path")


class _Own(dict):
    """Arrays the publisher copied itself (its memory of a step), which it may copy the next step into."""


def _copy_step(arrays: Mapping, spare: _Own | None, workers: int | None) -> _Own:
    """A copy of ``arrays`` the publisher owns, into ``spare``'s buffers where a name has one of the same
    dtype and shape (in parallel: copies run outside the GIL). A file's tensors (:class:`Stored`) are
    copied as their bytes and stay stored ones: nothing builds their numpy float dtype."""
    out = _Own()
    jobs, elems = [], []
    for n, a in arrays.items():
        a = a if isinstance(a, Stored) else as_numpy(a)
        o = None if spare is None else spare.get(n)
        if o is not None and isinstance(o, Stored) == isinstance(a, Stored) and o.shape == a.shape \
                and o.dtype == a.dtype and _data(o).flags.writeable:
            jobs.append((np.copyto, _data(o), _data(a)))
            elems.append(_data(a).size)
            out[n] = o
        else:
            out[n] = Stored(a.dtype, a.shape, a.flat.copy()) if isinstance(a, Stored) else np.array(a, copy=True)
    run_jobs(jobs, workers or default_workers(), elems)
    return out


def _data(a: np.ndarray | Stored) -> np.ndarray:
    return a.flat if isinstance(a, Stored) else a


def _with_hashes(arrays: Mapping, hashes: dict[str, int] | None) -> Mapping:
    """``arrays`` with the tensor hash of each named in ``hashes`` (KnownBase: the writer names it by
    that hash instead of hashing it again)."""
    if not hashes:
        return arrays
    return {n: KnownBase(a, hashes[n]) if n in hashes else a for n, a in arrays.items()}


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
                 retries: int = 5, writer: str | None = None, on_commit=None, on_commit_timeout: float = 60.0,
                 on_mismatch: str = "warn",
                 sign_key=None, stream_id: str | None = None, keep_last: int | None = None,
                 keep_keyframes: int = 0, compact_index: bool = True, history: bool = True,
                 readers: tuple[int, int] | None = None):
        N.check_shard(shard, num_shards)
        self.writer = N.check_writer(writer)
        # sign_key: an Ed25519 private key (object or PEM/raw file): every step this publisher commits or
        # finds committed is signed before the head moves (S15); stream_id is signed with it
        self.signer = None
        if sign_key is not None:
            from .signing import Signer
            self.signer = Signer(sign_key, stream_id)
        elif stream_id is not None:
            raise InputError("stream_id is signed: it needs sign_key")
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
        self.compact_index = compact_index   # False: data objects a 1.4 or 1.5 follower reads (SPEC.md §10, §7)
        self.workers = workers
        self.remember = remember
        self.state_dir = state_dir
        self.tmp_dir = tmp_dir
        self._last: tuple[int, dict[str, np.ndarray]] | None = None   # (step, {name: array}) of the previous publish
        # history (format 1.9, SPEC.md S8.2): each delta is written with the previous step — the base of
        # the delta that made its base — where this publisher made that delta itself and its base step
        # has no keyframe (a follower that joined there holds no history); off for fleets of followers
        # older than 1.9 (and with compact_index=False, whose files are for older readers anyway)
        self.history = bool(history)
        # the oldest format version the fleet's followers read (DeltaWriter's readers=): e.g. (1, 9) keeps
        # the history's signs but writes no ctx-delta-rhp block (1.10, §8.12); checked by the writer
        self.readers = check_readers(readers)   # a bad value is an InputError now, not at the first step
        # (base step, base, step) of the last delta published: the next one's previous step where its base
        # is that step (in memory, and in state_dir across processes)
        self._before: tuple[int, dict[str, np.ndarray], int] | None = None
        # the tensor hashes of the arrays of _last and _before where they are this publisher's own copies
        # of steps it wrote (the hashes it wrote them with): their next deltas name them by these, unhashed
        self._last_hashes: dict[str, int] | None = None
        self._before_hashes: dict[str, int] | None = None
        # one publish at a time: each reads and replaces what the last one kept (its copies, whose
        # buffers the next copy reuses), so two in flight would encode from buffers being overwritten
        self._publishing = threading.Lock()
        self._publishing_in: int | None = None   # the thread inside a publish
        # whether the delta of step _before[2] was written with its previous step (its META has HISTORY):
        # the next delta may need its own only then, or where _before[0]'s manifest has keyframes (S8.2)
        self._before_history = False
        # keep_last: after each commit it makes, prune to the newest keep_last steps (S16; None: never)
        self.keep_last = None if keep_last is None else retry_count(keep_last, "keep_last", 1)
        self.keep_keyframes = retry_count(keep_keyframes, "keep_keyframes")
        self._lost_step: tuple[int, str] | None = None   # (step, why) of a publish that ended in conflict
        self._file: str | None = None     # the shard's file name at the last step published
        if on_commit is not None and not callable(on_commit) and not (isinstance(on_commit, str) and on_commit):
            raise InputError("on_commit must be a callable or a shell command")
        self.on_commit = on_commit
        if on_mismatch not in ON_MISMATCH:
            raise InputError(f"on_mismatch must be one of {', '.join(ON_MISMATCH)}, not {on_mismatch!r}")
        self.on_mismatch = on_mismatch   # a tensor the base lacks, or of another shape or dtype: a keyframe
        self.on_commit_timeout = retry_seconds(on_commit_timeout, "on_commit_timeout")

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
        kept = st.get("file")
        if isinstance(kept, str) and self._file is None:
            with contextlib.suppress(InputError):
                self._file = N.check_file_name(kept)
        before = st.get("before")   # the base of the last step's delta, kept for the history (1.9)
        if self._before is None and isinstance(before, dict):
            self._before = self._load_before(before, st["step"])
            self._before_history = before.get("history") is True   # (states before this field: False)
        return st["step"], open_checkpoint(os.path.join(self.state_dir, name)).stored()

    def _load_before(self, before: dict, step: int):
        """The state's ``before`` entry: ``(its step, its tensors, step)`` if it names a regular file of
        this state folder (``<stem>-step<N>.safetensors``, not a link) whose tensors have the digest
        recorded with it; else None (the next delta is then written without a previous step)."""
        assert self.state_dir is not None
        stem = os.path.basename(self._state_paths(self.state_dir)[1])[: -len(".safetensors")]
        b_step, name, digest = before.get("step"), before.get("tensors"), before.get("digest")
        if not (isinstance(b_step, int) and not isinstance(b_step, bool) and isinstance(name, str)
                and name == f"{stem}-step{b_step}.safetensors" and isinstance(digest, str)):
            return None
        path = os.path.join(self.state_dir, name)
        with contextlib.suppress(ArcError, OSError):
            if stat.S_ISREG(os.lstat(path).st_mode):
                tensors = open_checkpoint(path).stored()
                if _digest_of(tensors) == digest:
                    return (b_step, tensors, step)
        return None

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
        state = {"url": self.url, "step": step, "shard": self.shard, "num_shards": self.num_shards,
                 "tensors": name, "file": self._file}
        keep = {name}
        if self._before is not None and self._before[2] == step:   # the delta's base: the next one's previous
            bname = f"{stem}-step{self._before[0]}.safetensors"
            bpath = os.path.join(self.state_dir, bname)
            if not os.path.isfile(bpath):   # (it is the last state's tensors, unless base= was given)
                write_file(bpath + f".tmp-{os.getpid()}", dict(self._before[1]))
                os.replace(bpath + f".tmp-{os.getpid()}", bpath)
            state["before"] = {"step": self._before[0], "tensors": bname, "digest": _digest_of(self._before[1]),
                               "history": self._before_history}
            keep.add(bname)
        with open(jpath + ".tmp", "w") as f:
            json.dump(state, f)
        os.replace(jpath + ".tmp", jpath)
        for n in os.listdir(self.state_dir):     # earlier steps' tensors
            if n not in keep and (n == os.path.basename(cpath) or (n.startswith(stem + "-step")
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
        base), None follows ``keyframe_every``. Calls from several threads run one after the other.
        """
        if self._publishing_in == threading.get_ident():   # (an on_commit callback of this publish)
            raise InputError("publish() called from inside a publish of the same publisher (from on_commit?)")
        with self._publishing:
            self._publishing_in = threading.get_ident()
            try:
                return self._publish_one(step, tensors, base, base_step, keyframe, file_name)
            finally:
                self._publishing_in = None

    def _publish_one(self, step, tensors, base, base_step, keyframe, file_name) -> PublishResult:
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
            file_name = self._file_name(step, source_path)
        N.check_file_name(file_name)
        note = self._keyframe_instead(step, base_step if base_map is not None else None, keyframe)
        if note is not None:
            base_map, base_step = None, None   # a delta from this base could never be committed
        if keyframe is None:
            make_kf = base_map is None or (self.keyframe_every > 0 and step % self.keyframe_every == 0)
        else:
            make_kf = bool(keyframe) or base_map is None

        model_bytes = sum(int((a if isinstance(a, Stored) else as_numpy(a)).nbytes) for a in target.values())
        # the previous step: only behind a base this publisher remembers having made as a delta itself,
        # where S8.2's chain goes on
        previous = None
        if base is None and base_map is not None and self._before is not None and self._before[2] == base_step \
                and self.history and self._chain_goes_on():
            previous = self._before[1]
        # the hashes of its own copies, which it made itself (never the caller's arrays nor a state file)
        known = (self._last_hashes if self._last is not None and base_map is self._last[1] else None,
                 self._before_hashes if self._before is not None and previous is self._before[1] else None)
        try:
            return self._publish(step, target, source_path, base_map, base_step, make_kf, file_name, note,
                                 model_bytes, t_start, previous, base is not None, known)
        except ConflictError as exc:
            self._set_lost(step, str(exc))   # the next step goes out as a keyframe (S8.2, recovery)
            if "keyframe" in str(exc):
                raise
            raise ConflictError(f"{exc}; this rank publishes its next step as a keyframe, so the stream goes "
                                f"on") from None

    def _publish(self, step, target, source_path, base_map, base_step, make_kf, file_name, note, model_bytes,
                 t_start, previous=None, given=False, known=(None, None)) -> PublishResult:
        done = self._already_published(step, target)
        if done is not None:  # a retry of a publish that got as far as its claim: finish the commit only
            result = self.commit(step, mine=done)
            self._remember(step, target, source_path, done.file, None)
            return PublishResult(step, self.shard, self.num_shards, done.file, done.delta, done.keyframe,
                                 model_bytes, result, 0.0, 0.0, time.perf_counter() - t_start, note)
        t0 = time.perf_counter()
        made = {}
        tmpfiles: list[str] = []
        try:
            if base_map is not None:
                check_mismatches(base_map, target, self.on_mismatch, stacklevel=3)
                made["delta"] = self._encode(step, target, base_map, base_step, tmpfiles, previous, known)
            if make_kf:
                made["keyframe"] = self._encode(step, target, None, None, tmpfiles)
            t1 = time.perf_counter()
            refs = {}
            for kind, (path, info) in made.items():
                name = N.object_name(step, self.shard, self.num_shards, kind, info["xxh3_128"])
                self.store.put_file(name, path)
                refs[kind] = ObjectRef(name, info["size"], info["xxh3_128"], info["index_offset"], info["tail"],
                                       base_step if kind == "delta" else None,
                                       info["base_digest"] if kind == "delta" else None, sha256=info["sha256"])
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
        self._remember(step, target, source_path, file_name,
                       (base_step, base_map) if base_map is not None and not make_kf else None, given,
                       {n: int(h, 16) for n, _, _, h in first["tensors"]},
                       history="delta" in made and made["delta"][1]["history"])
        t3 = time.perf_counter()
        return PublishResult(step, self.shard, self.num_shards, file_name, refs.get("delta"), refs.get("keyframe"),
                             model_bytes, result, t1 - t0, t2 - t1, t3 - t_start, note)

    def _file_name(self, step: int, source_path: str | None) -> str:
        """The name followers give this shard's file: the one it had at the last step this publisher
        published (so an engine pointed at the folder never has to list it again), else the
        checkpoint's own file name unless that carries the step number (``step0017.safetensors``
        would be renamed every step), else ``shard-<i>-of-<n>.safetensors``."""
        if self._file is None and self.state_dir and self._last is None:
            self._load_state()   # the file name of a run before this process, if any
        if self._file is not None:
            return self._file
        b = os.path.basename(source_path) if source_path and os.path.isfile(source_path) else None
        if b and not re.search(rf"(?i)(step|iter|global_step)[-_]?0*{step}(?!\d)", b):
            with contextlib.suppress(InputError):
                return N.check_file_name(b)
        return N.default_file_name(self.shard, self.num_shards)

    def _chain_goes_on(self) -> bool:
        """Whether the next delta may need its previous step, ``_before``'s tensors (S8.2): the delta of
        step ``_before[2]`` was written with its own, or ``_before[0]``'s manifest has keyframes (a chain
        starts right after a step whose manifest has keyframes; once broken it waits for the next one,
        so a follower that saw a step of deltas without one knows the next needs none)."""
        assert self._before is not None
        if self._before_history:
            return True
        raw = self.store.read(N.manifest_name(self._before[0]), MAX_MANIFEST_BYTES, missing_ok=True)
        try:
            return raw is not None and parse_manifest(raw, N.manifest_name(self._before[0])).keyframe
        except ArcError:
            return False   # a damaged manifest: no chain (the next delta is written without its previous step)

    def _keyframe_instead(self, step: int, base_step: int | None, keyframe: bool | None) -> str | None:
        """Why this step must be a keyframe although a base is at hand (None: a delta from it can commit).

        A base step that can never be committed (a shard claimed by another writer, shards that cannot
        combine), or this publisher's own last step lost, would wedge every later step: the step goes
        out as a keyframe instead, on every rank that sees it (S8.2). A shard count that differs from the
        stream's is a resharded trainer: allowed only for a keyframe asked for on every rank."""
        lost = self._lost()
        if base_step is None:
            n = self._stream_shards()
            if n is not None and n != self.num_shards and keyframe is not True:
                raise InputError(f"the stream has {n} shards (at its head); this publisher is shard {self.shard} "
                                 f"of {self.num_shards}: a resharded trainer starts with a keyframe step "
                                 f"(--keyframe on every rank); else check --shard")
            return None
        braw = self.store.read(N.manifest_name(base_step), MAX_MANIFEST_BYTES, missing_ok=True)
        if braw is not None:
            n = parse_manifest(braw, N.manifest_name(base_step)).num_shards
        elif self.store.read(N.descriptor_name(base_step, self.shard, self.num_shards), MAX_DESCRIPTOR_BYTES,
                             missing_ok=True) is None:
            n = self._stream_shards()   # the base was never published at this shard count here
        else:
            n = self.num_shards
        if n is not None and n != self.num_shards:
            if keyframe is not True:
                raise InputError(f"base step {base_step} has {n} shards; this publisher is shard {self.shard} "
                                 f"of {self.num_shards}: a resharded trainer starts with a keyframe step "
                                 f"(--keyframe on every rank); else check --shard")
            return f"resharded from {n} to {self.num_shards} shards"
        if lost is not None:
            return f"this publisher's step {lost[0]} was lost ({lost[1]})"
        if braw is not None:
            return None
        why = why_blocked(self.store, base_step, self.num_shards, self.writer, any_writer=False)
        return None if why is None else f"base step {base_step} can never be committed: {why}"

    def _stream_shards(self) -> int | None:
        """The shard count of the step at the stream's head (None: nothing committed yet)."""
        raw = self.store.read(N.HEAD, MAX_HEAD_BYTES, missing_ok=True)
        if raw is None:
            return None
        try:
            h = parse_head(raw)
        except ArcError:
            return None   # a damaged head is repaired by the next commit
        mraw = self.store.read(N.manifest_name(h.step), MAX_MANIFEST_BYTES, missing_ok=True)
        return None if mraw is None else parse_manifest(mraw, N.manifest_name(h.step)).num_shards

    def _lost_path(self) -> str | None:
        return None if not self.state_dir else self._state_paths(self.state_dir)[0][: -len(".json")] + ".lost"

    def _lost(self) -> tuple[int, str] | None:
        """(step, reason) of this publisher's last publish if it ended in ``conflict`` (also across runs
        with ``state_dir``), else None."""
        if self._lost_step is not None:
            return self._lost_step
        p = self._lost_path()
        if p is None:
            return None
        try:
            with open(p, "rb") as f:
                st = json.loads(f.read(1 << 16))
            return int(st["step"]), str(st["why"])
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError):
            return (-1, f"{p} is unreadable")

    def _set_lost(self, step: int, why: str | None) -> None:
        self._lost_step = None if why is None else (step, why)
        p = self._lost_path()
        if p is None:
            return
        if why is None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(p)
            return
        os.makedirs(self.state_dir or ".", exist_ok=True)
        with open(p + ".tmp", "w") as f:
            json.dump({"step": step, "why": why}, f)
        os.replace(p + ".tmp", p)

    def _remember(self, step, target, source_path, file: str, delta_from=None, given: bool = False,
                  hashes: dict[str, int] | None = None, *, history: bool = False) -> None:
        """``delta_from``: ``(base step, base)`` of the delta just published where the step has no
        keyframe of this shard: the next delta's previous step (the publisher's history) where S8.2
        allows one (:meth:`_chain_goes_on`); copied when the caller ``given`` it (``base=``: its arrays
        or file may change before the next step). ``hashes``: the target's tensor hashes as the step's
        file names them; ``history``: whether that delta was written with its own previous step.

        The copies go into the buffers of the copy no longer needed (the step before the previous,
        or the previous without history), already in memory: a fresh copy of every tensor faulted its
        pages in again each step (a fifth of a publish on the corpus model)."""
        self._set_lost(step, None)
        self._file = file
        old_last, old_before = self._last, self._before
        keep = delta_from is not None and self.history and bool(self.remember or self.state_dir)
        own_base = keep and not given and old_last is not None and delta_from[1] is old_last[1]
        if keep and given:
            delta_from = (delta_from[0], _copy_step(delta_from[1], None, self.workers))
        self._before = (*delta_from, step) if keep else None
        self._before_history = keep and history
        self._before_hashes = self._last_hashes if own_base else None
        if self.remember:
            in_use = {id(self._before[1])} if self._before is not None else set()
            spare = next((m[1] for m in (old_before, old_last)
                          if m is not None and isinstance(m[1], _Own) and id(m[1]) not in in_use), None)
            self._last = (step, _copy_step(target, spare, self.workers))
            self._last_hashes = hashes
        else:
            self._last_hashes = None
        self._save_state(step, target, source_path)

    def _already_published(self, step, target) -> Descriptor | None:
        """This shard's descriptor for ``step`` if it exists with these very tensors (a retry); None
        if there is none; ``conflict`` if another publisher claimed the shard with other tensors."""
        name = N.descriptor_name(step, self.shard, self.num_shards)
        raw = self.store.read(name, MAX_DESCRIPTOR_BYTES, missing_ok=True)
        if raw is None:
            return None
        d = parse_descriptor(raw, name)
        if d.target_digest != _digest_of(target) or d.writer != self.writer:
            raise ConflictError(f"shard {self.shard} of {self.num_shards} for step {step} was already published "
                                f"by another publisher with different content ({name}"
                                f"{f', writer {d.writer}' if d.writer else ''})")
        return d

    def _encode(self, step, target, base, base_step, tmpfiles, previous=None, known=(None, None)):
        """``known``: the tensor hashes of ``base`` and of ``previous`` where they are this publisher's
        own copies (see :meth:`_remember`), handed to the writer with them (KnownBase)."""
        fd, path = tempfile.mkstemp(prefix="arcfmt-publish-", suffix=".arc", dir=self.tmp_dir)
        tmpfiles.append(path)
        if base is not None:
            base = _with_hashes(base, known[0])
        if previous is not None:
            previous = _with_hashes(previous, known[1])
        with os.fdopen(fd, "wb") as f:
            hw = _HashingWriter(f)
            w = DeltaWriter(hw, base_step=base_step, target_step=step, block_elems=self.block_elems,
                            compact_index=self.compact_index,
                            effort=self.effort if base is not None else self.keyframe_effort, workers=self.workers,
                            previous=previous, readers=self.readers)
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
            info = dict(size=size, xxh3_128=hw.h.hexdigest(), sha256=hw.sha.hexdigest(),
                        index_offset=trailer.index_offset, tail=xxhash.xxh3_64_hexdigest(tail),
                        target_digest=r.target_digest.hex(), base_digest=r.base_digest.hex(), tensors=tensors,
                        history=r.meta.history)
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
            self._sign(m)
            return CommitResult(step, True, False, head=self._advance_head(m), manifest=m)
        dnames = [N.descriptor_name(step, i, n) for i in range(n)]
        raws = self.store.read_many(dnames, MAX_DESCRIPTOR_BYTES)
        missing = [i for i, r in enumerate(raws) if r is None]
        if missing:
            return CommitResult(step, False, waiting_for=missing)
        descs = []
        for r, dn in zip(raws, dnames):
            d = parse_descriptor(r, dn)
            check_own_name(d, dn, error=ConflictError)
            descs.append(d)
        entries = check_shards(step, descs)
        base_b, use_kf = combinable(step, descs)
        use_delta = base_b is not None
        base_m = None
        if base_b is not None:
            bname = N.manifest_name(base_b)
            braw = self.store.read(bname, MAX_MANIFEST_BYTES, missing_ok=True)
            if braw is None and _depth == 0:
                self.commit(base_b, _depth=1)   # its last shard may have died before committing it
                braw = self.store.read(bname, MAX_MANIFEST_BYTES, missing_ok=True)
            if braw is None:
                if not use_kf:
                    return CommitResult(step, False, waiting_for_base=base_b)
                use_delta = False
            else:
                base_m = parse_manifest(braw, bname)
                check_own_name(base_m, bname, error=ConflictError)
                if base_m.num_shards != n:
                    if not use_kf:
                        raise ConflictError(f"step {step} cannot be committed: {n} shards of deltas from step "
                                            f"{base_b}, which has {base_m.num_shards} (a resharded trainer "
                                            f"starts with a keyframe step){_NEXT_KEYFRAME}")
                    use_delta = False
        m_base_step: int | None = None
        m_base_digest: str | None = None
        m_base_sha256: str | None = None
        keyframe_step = step
        if use_delta:
            assert base_m is not None   # read and parsed above whenever use_delta still holds
            m_base_step, m_base_digest, m_base_sha256 = base_m.step, base_m.digest, base_m.sha256
            if not use_kf:
                keyframe_step = base_m.keyframe_step
        m = Manifest(step, m_base_step, m_base_digest, use_kf, keyframe_step, model_digest(entries).hex(), len(entries),
                     [ShardEntry(d.shard, d.file, d.digest, d.target_digest, len(d.tensors),
                                 d.delta if use_delta else None, d.keyframe if use_kf else None, d.sha256)
                      for d in descs],
                     descs[0].writer, base_manifest_sha256=m_base_sha256)
        data = m.to_bytes()
        made = self.store.create(mname, data)
        if made:
            m.raw = data
        else:
            m = parse_manifest(self.store.read(mname, MAX_MANIFEST_BYTES), mname)
            if [s.descriptor for s in m.shards] != [d.digest for d in descs]:
                raise ConflictError(f"{mname} was written from other shard descriptors than the ones in the store")
        _check_mine(m, mine)
        self._sign(m)
        result = CommitResult(step, True, made, head=self._advance_head(m), manifest=m)
        if made:
            self._notify(m, result)
            self._prune()
        return result

    def _prune(self) -> None:
        """Retention after a commit this call made (S16): only the committer prunes, and a failure
        to prune is a warning, never a failed publish."""
        if self.keep_last is None:
            return
        from .prune import prune
        try:
            prune(store=self.store, keep_last=self.keep_last, keep_keyframes=self.keep_keyframes)
        except (ArcError, OSError) as exc:
            warnings.warn(f"pruning after the commit failed (the step is committed): {type(exc).__name__}: {exc}",
                          stacklevel=3)

    def _notify(self, m: Manifest, result: CommitResult) -> None:
        """Run the ``on_commit`` hook once for a step this call committed (it made the manifest): a
        callable gets the step's facts as a dict, a command gets them as one JSON line on stdin. The
        step is committed whatever the hook does: a failing hook is a warning, never an error."""
        if self.on_commit is None:
            return
        facts = commit_facts(self.url, m, result.head)
        try:
            if callable(self.on_commit):
                self.on_commit(facts)
                return
            p = subprocess.run(self.on_commit, shell=True, input=json.dumps(facts) + "\n", text=True,
                               capture_output=True, timeout=self.on_commit_timeout)
            if p.returncode != 0:
                warnings.warn(f"on-commit command exited with {p.returncode} for step {m.step}: "
                              f"{(p.stderr or p.stdout).strip()[-500:]}", stacklevel=2)
        except subprocess.TimeoutExpired:
            warnings.warn(f"on-commit command ran past {self.on_commit_timeout} s for step {m.step}", stacklevel=2)
        except Exception as exc:  # the user's hook: the step is committed whatever it does
            warnings.warn(f"on-commit hook failed for step {m.step}: {type(exc).__name__}: {exc}", stacklevel=2)

    def _sign(self, m: Manifest) -> None:
        """Create ``steps/<S>/signature.json`` for a committed step, before the head moves (S15.3). An
        existing one (another rank's, a retry's) must sign this very manifest."""
        if self.signer is None:
            return
        from .signing import MAX_SIGNATURE_BYTES, signature_name
        name = signature_name(m.step)
        if self.store.create(name, self.signer.sign(m, int(time.time() * 1000))):
            return
        self.signer.check_existing(self.store.read(name, MAX_SIGNATURE_BYTES), m, name)

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


def _digest_of(tensors: dict) -> str:
    """The model digest (SPEC.md §13.2) of ``name → array``, hex: what a state's ``before`` entry is
    checked by when it is read back."""
    entries = []
    for n, a in tensors.items():
        dt, shape, u = as_uint(a)
        entries.append((n.encode("utf-8"), dt.code, tuple(shape), tensor_hash(u)))
    return model_digest(entries).hex()


def _check_mine(m: Manifest, mine: Descriptor | None) -> None:
    if mine is None:
        return
    if m.num_shards != mine.num_shards or m.shards[mine.shard].descriptor != mine.digest:
        raise ConflictError(f"step {m.step} was committed without this publisher's shard {mine.shard} of "
                            f"{mine.num_shards} (another writer's shards won the step)")



_NEXT_KEYFRAME = ("; it can never be committed: every rank publishes its next step as a keyframe on its own "
                  "(or pass --keyframe / keyframe=True on every rank)")
MAX_BLOCKED_DEPTH = 8   # base steps ``why_blocked`` follows down an uncommitted chain


def commit_facts(url: str, m: Manifest, head: int | None) -> dict:
    """What an ``on_commit`` hook is told of a committed step (JSON-ready)."""
    kinds = [k for k, on in (("delta", m.base_step is not None), ("keyframe", m.keyframe)) if on]
    return dict(event="commit", url=url, step=m.step, manifest=m.digest, base_step=m.base_step,
                keyframe=m.keyframe, keyframe_step=m.keyframe_step, model_digest=m.model_digest, tensors=m.tensors,
                shards=m.num_shards, writer=m.writer, head=head, time_ms=int(time.time() * 1000),
                bytes={k: m.cost(k) for k in kinds})


def check_shards(step: int, descs: list) -> list:
    """The model-digest entries of a step's descriptors; ``conflict`` if they can never form one step:
    two writers, a tensor in two shards, two shards with one file name (S8.2 step 3.3)."""
    writers = sorted({d.writer or "" for d in descs})
    if len(writers) > 1:
        raise ConflictError(f"step {step} cannot be committed: its shards come from different writers "
                            f"({', '.join(w or '(none)' for w in writers)}){_NEXT_KEYFRAME}")
    entries = []
    owner: dict[bytes, int] = {}   # tensor name → shard
    files: dict[str, int] = {}     # file name, lower case → shard
    for d in descs:
        for e in d.digest_entries():
            if e[0] in owner:
                raise ConflictError(f"step {step}: tensor {e[0].decode()!r} is published by shards "
                                    f"{owner[e[0]]} and {d.shard}{_NEXT_KEYFRAME}")
            owner[e[0]] = d.shard
            entries.append(e)
        if d.file.lower() in files:
            raise ConflictError(f"step {step}: shards {files[d.file.lower()]} and {d.shard} use the same "
                                f"file name {d.file!r}{_NEXT_KEYFRAME}")
        files[d.file.lower()] = d.shard
    return entries


def combinable(step: int, descs: list) -> tuple[int | None, bool]:
    """``(base step of the deltas or None, keyframes?)`` that a step of these descriptors can have;
    ``conflict`` when it can have neither (mixed kinds or base steps)."""
    # a delta object always has its base_step (ObjectRef.kind); the second test only tells mypy so
    bases = {d.delta.base_step for d in descs if d.delta is not None and d.delta.base_step is not None}
    use_delta = all(d.delta is not None for d in descs) and len(bases) == 1
    use_kf = all(d.keyframe is not None for d in descs)
    if not use_delta and not use_kf:
        raise ConflictError(f"step {step} cannot be committed: its shards do not all have a delta from the "
                            f"same base step ({sorted(bases)}) nor all a keyframe{_NEXT_KEYFRAME}")
    return (next(iter(bases)) if use_delta else None), use_kf


def why_blocked(store: Store, step: int, num_shards: int, writer: str | None = None, *,
                any_writer: bool = True, _depth: int = 0) -> str | None:
    """Why ``step`` (of ``num_shards`` shards) can never be committed, or None when it is committed
    or still may be (shards missing, a base that may still come). Reads only, never writes.

    With ``any_writer`` False, a shard claimed by another writer than ``writer`` blocks the step for
    that writer (a publisher asking about its own base step)."""
    if store.read(N.manifest_name(step), MAX_MANIFEST_BYTES, missing_ok=True) is not None:
        return None
    dnames = [N.descriptor_name(step, i, num_shards) for i in range(num_shards)]
    descs = []
    for dn, raw in zip(dnames, store.read_many(dnames, MAX_DESCRIPTOR_BYTES)):
        if raw is None:
            continue
        try:
            d = parse_descriptor(raw, dn)
        except ArcError as exc:
            return f"{dn} is unreadable ({exc})"
        if not any_writer and d.writer != writer:
            return f"shard {d.shard} was claimed by writer {d.writer or '(none)'}"
        descs.append(d)
    try:
        check_shards(step, descs)
        if len(descs) < num_shards:
            return None   # the missing shards may still come
        base, use_kf = combinable(step, descs)
    except ConflictError as exc:
        return str(exc).split("; it can never", 1)[0]
    if use_kf or base is None or _depth >= MAX_BLOCKED_DEPTH:
        return None
    braw = store.read(N.manifest_name(base), MAX_MANIFEST_BYTES, missing_ok=True)
    if braw is not None:
        try:
            bm = parse_manifest(braw, N.manifest_name(base))
        except ArcError as exc:
            return f"its base step {base} has an unreadable manifest ({exc})"
        if bm.num_shards != num_shards:
            return f"its deltas are from step {base}, which has {bm.num_shards} shards, not {num_shards}"
        return None    # committable: a committer died before writing its manifest
    why = why_blocked(store, base, num_shards, writer, any_writer=any_writer, _depth=_depth + 1)
    return None if why is None else f"its base step {base} can never be committed ({why})"


__all__ = ["Publisher", "PublishResult", "CommitResult", "why_blocked"]
