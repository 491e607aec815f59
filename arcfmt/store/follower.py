"""The rollout side: follow a stream into a local checkpoint folder, step by verified step.

For each new head the follower plans the cheapest path by bytes from its own step — the chain of
deltas, or the latest keyframe plus the deltas after it — then for every step on the path:
reads each needed shard's index and trailer with one range request (checked against the manifest's
tail hash), fetches only the records of the tensors it wants (coalesced, chunked, concurrent,
retried, spooled for resumption), checks every base tensor, rebuilds and verifies every tensor, and
swaps the folder atomically: ``into`` is always one complete, verified step (SPEC.md Part II).
"""
from __future__ import annotations

import contextlib
import fcntl
import fnmatch
import hashlib
import json
import mmap
import os
import select
import shutil
import stat
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import xxhash

from .. import dtypes, encodings, pipeline, records
from .. import layout as FL
from ..arrays import as_numpy
from ..checkpoint_writer import CheckpointSink, ShardLayout, check_written, write_json, write_new_file
from ..errors import (
    ArcError,
    ChecksumError,
    CorruptError,
    FormatError,
    InputError,
    LimitError,
    MissingPreviousError,
    VerificationError,
    WrongBaseError,
    os_error,
)
from ..history import History, Recorder, unchanged
from ..integrity import KnownBase, model_digest
from ..parallel import default_workers
from ..reader import DeltaReader
from ..safetensors_io import INDEX_NAME, open_checkpoint
from ..staging import OLD_TAG, Stage, open_private, recover
from . import names as N
from . import retry
from .backends import Store
from .errors import MissingError, NoStreamError, SignatureError
from .objects import (
    MAX_HEAD_BYTES,
    MAX_MANIFEST_BYTES,
    VERSION,
    Head,
    Manifest,
    ObjectRef,
    ShardEntry,
    canonical,
    check_own_name,
    digest128,
    parse_head,
    parse_json,
    parse_manifest,
)
from .ranges import DEFAULT_CHUNK, DEFAULT_MAX_GAP, DEFAULT_OVERHEAD, FetchStats, ObjectSource, RangeFetcher, coalesce
from .signing import MAX_SIGNATURE_BYTES, check_object, sha256_hex, signature_name, unbound

STATE_NAME = "arcfmt-stream.json"
# The history of the folder's step (format 1.9, SPEC.md S9.1): the direction of each weight's last change,
# which a delta written with the previous step needs; a safetensors layout under a name no checkpoint
# loader globs (``*.safetensors``), written in the stage with the state and checked against it when read.
HISTORY_NAME = "arcfmt-stream-history.bin"
HISTORY_FORMAT = "arcfmt-stream-history"
MAX_CHAIN = 1 << 20          # manifests one plan may read walking back from the head
MAX_REPLANS = 64             # re-plans of one run after an object the plan named was missing
STATE_FORMAT = "arcfmt-stream-follower"


@dataclass
class StepUpdate:
    """One applied step: what was fetched, what changed, where the verified checkpoint is."""

    step: int
    from_step: int | None          # the folder's step before (None: bootstrapped from a keyframe)
    kind: str                      # "delta" or "keyframe"
    path: str                      # the checkpoint folder
    changed: list                  # names of tensors whose bytes changed (every tensor for a keyframe)
    tensors: int                   # tensors in the folder
    bytes_downloaded: int          # bytes received for this step (tails + records + gaps)
    bytes_needed: int              # header + META + records of the wanted tensors
    tail_bytes: int                # index + trailer reads
    requests: int                  # range requests sent
    shards: int                    # shards of the step
    shards_read: int               # shards with at least one wanted tensor
    reused_bytes: int              # bytes taken from the spool (resumed download)
    retries: int
    seconds: float
    head_step: int
    verified_model: bool           # the whole-model digest was checked (no tensor filter)
    manifest: str = ""
    head_age_seconds: float = 0.0  # how long ago the head was moved (wall clock) when this step was done
    live: Any = None               # a live follower's model (name -> array), updated to this step
    changes: list = field(default_factory=list)   # a live step's pipeline.Change per changed tensor
    fresh: list = field(default_factory=list)     # names a live step added or gave another dtype or shape
    values_changed: int = 0        # a live step: values that differ from the step before
    sparse_bytes: int = 0          # a live step: bytes of sparse() (positions + values)
    whole_bytes: int = 0           # bytes of weights() (every changed tensor whole)
    snapshot: bool = False         # a live step: the snapshot folder was rewritten after it

    @property
    def lag_steps(self) -> int:
        """Steps this update is behind the stream's head (0: up to date)."""
        return self.head_step - self.step

    def weights(self):
        """``(name, array)`` for every changed tensor — the shape vLLM-style ``load_weights`` takes: the
        live model's own arrays for a live follower, else read (memory-mapped) from the folder as it is
        now (arrays that stay valid after later steps replace the folder: its files are unlinked, not
        overwritten)."""
        if not self.changed:
            return
        arrays = self.live if self.live is not None else open_checkpoint(self.path).tensors()
        for name in self.changed:
            if name in arrays:
                yield name, arrays[name]

    def sparse(self):
        """A live step's change, per changed tensor: ``(name, positions, values)`` — flat positions
        (ascending numpy int32, int64 for tensors of 2^31 elements or more) and the new values there, in
        the tensor's dtype — relative to the live model before this step: what ``index_copy_`` needs to
        bring an engine's copy of the weights along (``arcfmt.torch.apply_sparse``). Tensors in
        ``fresh`` are not in it: load them whole."""
        if self.live is None:
            raise InputError("sparse() is the change a live follower (Follower(url, live=...)) applied; a "
                             "folder follower hands whole tensors: weights()")
        for c in self.changes:
            yield c.name, c.index, c.values.view(c.dtype.numpy)

    def as_dict(self) -> dict:
        """The numbers of this step as a JSON-ready dict (lists and the live model as counts)."""
        d = {k: getattr(self, k) for k in self.__dataclass_fields__ if k not in ("changed", "live", "changes", "fresh")}
        d.update(changed=len(self.changed), lag_steps=self.lag_steps, fresh=len(self.fresh))
        return d


@dataclass
class _ShardPlan:
    entry: ShardEntry
    obj: ObjectRef
    source: ObjectSource
    index: records.Index
    wanted: list = field(default_factory=list)     # IndexEntry of the tensors to rebuild
    groups: list = field(default_factory=list)     # wanted, cut into groups that fit the memory budget
    bases: dict = field(default_factory=dict)      # name -> checked base (flat unsigned view) or None
    reader: DeltaReader | None = None


class Follower:
    """Keeps the folder ``into`` at the stream's latest step (all tensors, or those matching ``tensors``),
    or, with ``live=`` (name -> numpy array or CPU torch tensor; ``{}`` to start from a keyframe), a
    model in memory: each step is staged and verified whole before any live array is written, and its
    :meth:`StepUpdate.sparse` change is what an engine's copy needs (``arcfmt.torch.apply_sparse``).
    ``snapshot``: the live model's folder, read at start (the live arrays are taken to be at its step;
    empty ``live`` is filled from it) and rewritten every ``snapshot_every`` steps and when
    :meth:`follow` ends, so a restarted rollout resumes from disk plus the deltas since. The live
    arrays are the follower's to write: it checks them, as the base of the next step, by the hashes it
    verified when it wrote them (hashing them only when it did not write them, as after a start).

    ``tensors``: shell-style patterns (``fnmatch``) on tensor names, e.g. ``"model.layers.*.mlp.*"``.
    ``progress``: called with one dict per event (``{"event": "step", ...}``, ``"bytes"``, ``"head"``).
    ``concurrency``: range requests in flight at once; finished batches are spooled, so an interrupted
    download loses at most one batch. ``memory_budget``: record bytes held in memory at once; a shard
    with more is fetched and rebuilt a group of tensors at a time (with ``trust``, where a whole object
    is hashed before use, it passes through an unlinked temporary file instead). ``max_output_bytes``: the most
    tensor bytes one shard's object may make (default: what the folder's base backs plus a bound
    scaled to the object's size, so a tiny object cannot fill the disk). ``request_timeout``: the
    deadline of one request, body included (a trickling server is abandoned and retried);
    ``retry_time``: no retry starts later than this after an operation's first attempt;
    ``step_timeout``: the deadline of a whole step's downloads (None: none). ``missing_wait``: seconds
    an object the head chain names may stay missing (replication lag) before ``not_found``; an object
    pruned meanwhile is re-planned around at once (SPEC.md S9.5).
    """

    def __init__(self, url: str, into=None, *, tensors=None, storage_options: dict | None = None, fs=None,
                 chunk_size: int = DEFAULT_CHUNK, max_gap: int = DEFAULT_MAX_GAP, overhead: float = DEFAULT_OVERHEAD,
                 retries: int = 5, backoff: float = 0.2, workers=None, spool: bool = True, progress=None,
                 concurrency: int = 16, memory_budget: int = 256 << 20, max_output_bytes: int | None = None,
                 request_timeout: float | None = None, retry_time: float | None = None,
                 step_timeout: float | None = None, missing_wait: float = 30.0, trust=None,
                 stream_id: str | None = None, live=None, snapshot=None, snapshot_every: int = 0):
        # the history of the step held (name -> History; None: not read from the folder yet): what a delta
        # written with the previous step needs (format 1.9); two bits a weight, in memory and on disk
        self._histories: dict[str, History] | None = None
        # the step and manifest those histories lead to, the kind of step that made them ("keyframe":
        # none), and whether that step's manifest has keyframes (a publisher writes no history after
        # one, S8.2); checked against the state before each use (another follower may have moved it)
        self._histories_at: tuple[int, str, str, bool] | None = None
        self._restarted = False   # started again from a keyframe in this run, for want of a history
        self._always_record = False   # ... in any run of this follower: its publisher does not keep S8.2
        # whether the stream writes deltas that need the previous step (None: not known yet): a follower
        # keeps no history for a stream that does not (a delta without HISTORY after a delta says so)
        self._uses_history: bool | None = None
        self.store = Store(url, storage_options, fs=fs, retries=retries, backoff=backoff,
                           request_timeout=request_timeout, retry_time=retry_time)
        # An object the head chain names but the store does not have yet (asynchronous replication) is
        # looked for again, re-planning from the head, for up to this many seconds (SPEC.md S9.5).
        self.missing_wait = retry.check_seconds(missing_wait, "missing_wait")
        self.step_timeout = None if step_timeout is None else \
            retry.check_seconds(step_timeout, "step_timeout", finite=False)
        self.url = url
        # live: the model held in memory (name -> numpy array or CPU torch tensor), updated in place one
        # verified step at a time; snapshot: its folder, rewritten every snapshot_every steps and on
        # shutdown (and read at start: the live arrays are then taken to be at its step).
        self.live = live
        if live is not None:
            if into is not None:
                raise InputError("a live follower keeps its folder as snapshot=, not into=")
            into = snapshot
        elif snapshot is not None or snapshot_every:
            raise InputError("snapshot= and snapshot_every= are for a live follower (live=)")
        self.snapshot_every = retry.check_count(snapshot_every, "snapshot_every")
        if into is None and live is None:
            raise InputError("give the folder to keep (into=) or the live model to update (live=)")
        self.into = None if into is None else os.path.abspath(os.fspath(into)).rstrip("/")
        if self.into is not None and not os.path.basename(self.into):
            raise InputError("--into must name a folder, not the file system root")
        self.patterns = N.tensor_patterns(tensors)
        # trust: public keys (files, raw bytes, key objects); then every step must be signed by one of
        # them, and every byte used must hash to what was signed (S15). stream_id: the signed id required.
        self._trust = None
        self._bound: dict[tuple[int, str], str] = {}   # (step, xxh3 of manifest) -> SHA-256 it must have
        self._signed_by: str | None = None             # key id of the plan's head signature
        if trust is not None:
            from .signing import TrustSet
            self._trust = TrustSet(trust, stream_id)
        elif stream_id is not None:
            raise InputError("stream_id is checked in signatures: it needs trust=")
        self.max_gap = retry.check_count(max_gap, "max_gap")
        self.memory_budget = retry.check_count(memory_budget, "memory_budget")
        self.max_output_bytes = None if max_output_bytes is None else retry.check_count(max_output_bytes,
                                                                                        "max_output_bytes")
        self.overhead = retry.check_number(overhead, "overhead", finite=False)
        self.workers = workers or default_workers()
        self.progress = progress
        parent, base = os.path.split(self.into) if self.into is not None else (tempfile.gettempdir(), "")
        self._parent = parent
        self._lock_path = os.path.join(parent, f".arcfmt-lock-{base}")
        # a live follower spools nothing: it writes no disk byte between snapshots, and a restarted one
        # starts again from its snapshot anyway
        spool = spool and self.into is not None and live is None
        self.spool_dir = os.path.join(parent, f".arcfmt-spool-{base}") if spool else None
        self.stats = FetchStats()
        self._waker: _Waker | None = None
        self.fetcher = RangeFetcher(self.store.fs, chunk_size=chunk_size, retries=retries, backoff=backoff,
                                    spool_dir=self.spool_dir, stats=self.stats, on_bytes=self._on_bytes,
                                    batch=concurrency, request_timeout=request_timeout, retry_time=retry_time)
        self._live: _LiveModel | None = None if live is None else _LiveModel(self, live)

    # ------------------------------------------------------------------------------ small helpers
    def _emit(self, **event) -> None:
        if self.progress is not None:
            self.progress(event)

    def _on_bytes(self, n: int) -> None:
        if self.progress is not None:
            self.progress({"event": "bytes", "bytes": n, "total": self.stats.bytes})

    def wants(self, name: str) -> bool:
        """Whether the tensor ``name`` is followed: it matches one of the ``tensors`` glob patterns
        (``fnmatch``, case-sensitive), or no patterns were given."""
        return self.patterns is None or any(fnmatch.fnmatchcase(name, p) for p in self.patterns)

    @contextlib.contextmanager
    def _locked(self):
        if self.into is None:   # a live follower without a snapshot folder holds nothing on disk
            yield
            return
        try:
            os.makedirs(self._parent, exist_ok=True)
        except OSError as exc:
            raise os_error(exc, "write", self._parent) from None
        fd = open_private(self._lock_path)  # never through a link planted at the lock's name
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise InputError(f"another follower is updating {self.into}") from None
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    # ------------------------------------------------------------------------------ local state
    def state(self) -> dict | None:
        """The folder's stream state (``step``, ``manifest``, ``tensors``), or None for a new folder;
        for a live follower, the live model's."""
        if self._live is not None:
            return self._live.state
        return self._folder_state()

    def _folder_state(self) -> dict | None:
        assert self.into is not None
        p = os.path.join(self.into, STATE_NAME)
        try:
            raw = _read_regular(p, 1 << 20)
        except FileNotFoundError:
            if os.path.isdir(self.into) and any(not n.startswith(".") for n in os.listdir(self.into)):
                raise InputError(f"{self.into} is not empty and was not made by 'arcfmt follow'; "
                                 f"choose an empty or new folder") from None
            return None
        try:
            st = parse_json(raw, p, 1 << 20)
            ok = (st.get("format") == STATE_FORMAT and isinstance(st.get("step"), int)
                  and isinstance(st.get("manifest"), str) and len(st["manifest"]) == 32
                  and (st.get("tensors") is None or (isinstance(st["tensors"], list)
                                                     and all(isinstance(t, str) for t in st["tensors"]))))
        except ArcError:
            ok = False
        if not ok:
            raise InputError(f"{p} is not a valid follower state; remove {self.into} to start over")
        return st

    @property
    def step(self) -> int | None:
        """The step the folder (or live model) is at now; None before the first step."""
        st = self.state()
        return None if st is None else st["step"]

    # ------------------------------------------------------------------------------ stream reads
    def head(self) -> Head | None:
        """The stream's head, or None when nothing has been committed yet."""
        raw = self.store.read(N.HEAD, MAX_HEAD_BYTES, missing_ok=True)
        return None if raw is None else parse_head(raw)

    def _manifest(self, step: int, digest: str) -> Manifest:
        name = N.manifest_name(step)
        raw = self.store.read(name, MAX_MANIFEST_BYTES, missing_ok=True)
        if raw is None:
            raise MissingError(f"{name} is missing, but the stream's head chain names it")
        if digest128(raw) != digest:
            raise ChecksumError(f"{name} does not hash to {digest}, the value its successor (or the head) holds")
        if self._trust is not None:   # bound to the signed head by SHA-256 before it is parsed (S15.4)
            want = self._bound.get((step, digest))
            if want is None:
                raise SignatureError(f"{name} is not covered by a signature: its successor names no "
                                     f"base_manifest_sha256 (a 1.0 manifest)")
            if sha256_hex(raw) != want:
                raise SignatureError(f"{name} does not hash to the SHA-256 its signed successor (or signature) "
                                     f"names")
        m = parse_manifest(raw, name)
        check_own_name(m, name)
        if self._trust is not None and m.base_step is not None and m.base_manifest is not None \
                and m.base_manifest_sha256 is not None:
            self._bound[(m.base_step, m.base_manifest)] = m.base_manifest_sha256
        return m

    def _signed_head(self, head: Head) -> None:
        """Verify the head step's signature with a trusted key; it binds the head's manifest (S15.4)."""
        assert self._trust is not None
        name = signature_name(head.step)
        sig = self._trust.verify(self.store.read(name, MAX_SIGNATURE_BYTES, missing_ok=True), head.step, name)
        self._bound = {(head.step, head.manifest): sig.manifest_sha256}
        self._signed_by = sig.key_id

    def _trusted(self, state: dict | None) -> dict | None:
        """The folder's state if a trusted key vouched for it (else None: start from a signed keyframe)."""
        if state is None or self._trust is None:
            return state
        sha, by = state.get("manifest_sha256"), state.get("signed_by")
        if not (isinstance(sha, str) and len(sha) == 64 and isinstance(by, str) and by in self._trust.keys):
            return None
        return state

    def plan(self, head: Head | None = None, state: dict | None = None, *, fresh: bool = False) -> list:
        """The cheapest path by bytes from the folder's step to ``head``: ``[(Manifest, kind), ...]``;
        ``fresh``: as a follower with no step (from a keyframe)."""
        head = head or self.head()
        if head is None:
            return []
        if state is None and not fresh:
            state = self.state()
        if state is not None and state.get("tensors") != self.patterns:
            state = None  # another tensor selection: start again from a keyframe
        state = self._trusted(state)   # trust mode: a folder no trusted key vouched for starts again
        f_step = None if state is None else state["step"]
        f_hash = None if state is None else state["manifest"]
        if f_step is not None and f_step >= head.step:
            if f_step > head.step or f_hash == head.manifest:
                return []
            f_step = None  # the head's step, but another manifest: off the chain, start from a keyframe
        if self._trust is not None:
            self._signed_head(head)   # before any manifest is read (S15.4)
        chain: list[Manifest] = []
        best: tuple[int, int | str] | None = None   # (cost, "delta") or (cost, chain index of a keyframe step)
        d = 0                    # delta bytes from the current manifest up to the head
        step, digest = head.step, head.manifest
        while True:
            if f_step is not None and step == f_step and digest == f_hash and \
                    (self._trust is None or self._bound.get((step, digest)) == (state or {}).get("manifest_sha256")):
                if best is None or d <= best[0]:
                    best = (d, "delta")
                break
            if f_step is not None and step <= f_step:
                f_step = None     # the folder's step is not on this chain: only a keyframe can help
            if len(chain) >= MAX_CHAIN:
                raise LimitError(f"more than {MAX_CHAIN} manifests between the head and a usable start")
            if self._trust is not None and best is not None and (step, digest) not in self._bound:
                break             # below here nothing is bound to the signature: take the path found
            try:
                m = self._manifest(step, digest)
            except MissingError:
                if best is None:
                    raise
                break             # pruned below a keyframe already found (SPEC.md S9.5): take that path
            if chain and chain[-1].num_shards != m.num_shards:   # chain[-1] holds deltas from m (S6)
                raise CorruptError(f"step {chain[-1].step} has {chain[-1].num_shards} shards of deltas from step "
                                   f"{m.step}, which has {m.num_shards}")
            chain.append(m)
            if m.keyframe:
                c = m.cost("keyframe") + d
                if best is None or c < best[0]:
                    best = (c, len(chain) - 1)
                if f_step is None:
                    break         # a new folder: the latest keyframe is the cheapest start
            if m.base_step is None or m.base_manifest is None:   # both or neither (parse_manifest)
                break
            d += m.cost("delta")
            if best is not None and d >= best[0]:
                break             # no path further down can be cheaper
            step, digest = m.base_step, m.base_manifest
        if best is None:
            raise MissingError(f"no keyframe is reachable from the head (step {head.step}) for a folder at "
                               f"step {None if state is None else state['step']}")
        k = best[1]
        path = [(m, "delta") for m in reversed(chain)] if isinstance(k, str) else \
            [(chain[k], "keyframe")] + [(m, "delta") for m in reversed(chain[:k])]
        if self._trust is not None:   # every object to be used must have a signed SHA-256 (S15.4)
            for m, kind in path:
                why = unbound(m, kind)
                if why is not None:
                    raise SignatureError(f"step {m.step} cannot be verified: {why}")
        return path

    # ------------------------------------------------------------------------------ following
    def sync(self, until: int | None = None) -> list:
        """Apply every step up to the current head (stop early once the folder reaches ``until``)."""
        return list(self._run(_check_until(until)))

    def follow(self, *, until: int | None = None, interval: float = 2.0, timeout: float | None = None,
               wait: bool = False, wake_fifo: str | None = None):
        """Yield a :class:`StepUpdate` per applied step, polling the head every ``interval`` seconds,
        until the folder reaches ``until`` (forever if None) or ``timeout`` seconds pass without one.

        ``wait``: where there is no stream yet, wait for one (else ``NoStreamError``). ``wake_fifo``: a
        named pipe (made if missing) whose every write ends the current wait at once, so a push from a
        message service (SNS, Pub/Sub, Redis, a ``publish --on-commit`` hook) wakes the follower before
        its next poll; :meth:`wake` does the same from another thread. The head stays the contract."""
        interval = retry.check_seconds(interval, "interval")
        timeout = None if timeout is None else retry.check_seconds(timeout, "timeout", finite=False)
        _check_until(until)
        last_progress = time.monotonic()
        waiting_said = False
        with _Waker(wake_fifo) as waker:
            self._waker = waker
            try:
                while True:
                    applied = False
                    try:
                        for upd in self._run(until):
                            applied = True
                            yield upd
                    except NoStreamError:
                        if not wait:
                            raise
                        if not waiting_said:
                            waiting_said = True
                            self._emit(event="waiting", url=self.url)
                    if applied:
                        last_progress = time.monotonic()
                    st = self.step
                    if until is not None and st is not None and st >= until:
                        return
                    if timeout is not None and time.monotonic() - last_progress > timeout:
                        return
                    waker.sleep(interval)
            finally:
                self._waker = None
                if self._live is not None:
                    self._live.write_snapshot()   # on shutdown: a restart resumes from here

    def save_snapshot(self) -> bool:
        """A live follower: write the live model into its snapshot folder now (False: nothing new)."""
        if self._live is None:
            raise InputError("save_snapshot() is for a live follower (live=, snapshot=)")
        return self._live.write_snapshot()

    def wake(self) -> None:
        """End the poll wait of a running :meth:`follow` now (thread-safe; a no-op when none runs)."""
        w = self._waker
        if w is not None:
            w.wake()

    def _require_stream(self) -> None:
        """``NoStreamError`` unless something of a stream exists at the root (asked only when there is no
        head: one shallow listing, so a typo'd URL is an error, not "nothing published yet" forever)."""
        fs, root = self.store.fs, self.store.root
        with contextlib.suppress(Exception):
            fs.invalidate_cache(root)
        found = self.store._call(lambda: fs.ls(root, detail=False), f"listing {self.url}", missing_ok=True)
        names = {os.path.basename(str(p).rstrip("/")) for p in found or ()}
        if not names & {N.HEAD, N.STEPS}:
            raise NoStreamError(f"no stream at {self.url}: no {N.HEAD} and no {N.STEPS}/ there (check the URL; "
                                f"--wait / wait=True waits for a trainer to start)")

    def _run(self, until):
        self._restarted = False
        with self._locked():
            if self.into is not None:
                recover(self.into)
            first_miss = None
            attempt = 0
            while True:
                try:
                    yield from self._run_plan(until)
                    return
                except NoStreamError:
                    raise    # nothing to wait for here: follow(wait=True) polls for a stream
                except MissingError as exc:
                    # Pruned under us (re-plan from the head: a kept keyframe) or not replicated yet
                    # (wait): a bounded number of times, within missing_wait (SPEC.md S9.5).
                    now = time.monotonic()
                    first_miss = now if first_miss is None else first_miss
                    left = self.missing_wait - (now - first_miss)
                    if attempt >= MAX_REPLANS or (attempt >= 1 and left <= 0):
                        raise
                    attempt += 1
                    self._emit(event="missing", error=str(exc), attempt=attempt)
                    if attempt > 1:
                        time.sleep(max(0.0, min(left, retry.backoff_delay(attempt - 1, max(self.store.backoff, 0.05)))))

    def _run_plan(self, until):
        head = self.head()
        self._emit(event="head", step=None if head is None else head.step)
        if head is None:
            self._require_stream()
            return
        state = None if self._restarted else self.state()
        path = self.plan(head, state, fresh=self._restarted)
        cur = None if state is None or state.get("tensors") != self.patterns else state["step"]
        for m, kind in path:
            if until is not None and cur is not None and cur >= until:
                return
            try:
                upd = self._apply(m, kind, head, cur)
            except MissingPreviousError as exc:
                # the step needs the history of the one held, which this follower does not have (lost
                # with its folder's history file, or never kept): start from a keyframe, once a run
                # (SPEC.md S9.4). Right after a keyframe no delta may need one (S8.2): the stream's fault.
                self._uses_history = True
                if kind != "delta" or self._restarted:
                    raise
                if self._histories_at is not None and self._histories_at[2] == "keyframe":
                    raise WrongBaseError(f"step {m.step} needs the history of step {self._histories_at[0]}, a "
                                         f"keyframe step, after which no delta may need one (SPEC.md S8.2): "
                                         f"{exc}") from None
                self._restarted = self._always_record = True
                self._emit(event="restart", step=m.step, why="no history of the step held")
                yield from self._run_plan(until)
                return
            except WrongBaseError:
                if self._live is None or kind != "delta" or self._live.state is None or self._live.rebased:
                    raise
                # the live arrays are not at the snapshot's step after all: start from a keyframe instead
                self._live.state, self._live.rebased = None, True
                yield from self._run_plan(until)
                return
            cur = upd.step
            yield upd

    # ------------------------------------------------------------------------------ one step
    def _apply(self, m: Manifest, kind: str, head: Head, cur: int | None) -> StepUpdate:
        try:
            with self.store.time_limit(self.step_timeout), self.fetcher.time_limit(self.step_timeout):
                return self._apply_step(m, kind, head, cur)
        except (FormatError, VerificationError, WrongBaseError, SignatureError):
            # Bytes that failed a check may sit in the spool (a damaged object, a byte flipped in
            # transit, a base hash flipped in the object): drop this step's chunks, or every later attempt
            # would reuse them and fail again.
            self.fetcher.forget(keep=lambda key: _step_of_key(key) != m.step)
            raise

    def _apply_step(self, m: Manifest, kind: str, head: Head, cur: int | None) -> StepUpdate:
        t0 = time.perf_counter()
        s0 = FetchStats(**self.stats.as_dict())
        if self._live is not None:
            plans, verified_model = self._prepare(m, kind, self._live.bases(kind))
            changed, count, extra = self._live.apply(m, kind, plans)
        else:
            state = self._folder_state() if kind == "delta" else None
            base = {}
            if state is not None and state.get("files"):
                assert self.into is not None
                base = open_checkpoint(self.into).stored()   # checked as bytes: no float dtype built
            plans, verified_model = self._prepare(m, kind, base)
            changed, count = self._write_folder(m, plans, state, kind)
            extra = {}
        self.fetcher.forget(keep=lambda key: _step_of_key(key) > m.step)
        ds = self.stats.minus(s0)
        needed = sum(e - s for p in plans for s, e in _needed_ranges(p.wanted))
        upd = StepUpdate(m.step, cur, kind, self.into or "", changed, count, ds.bytes, needed,
                         sum(p.obj.tail_size for p in plans), ds.requests,
                         m.num_shards, sum(1 for p in plans if p.wanted), ds.reused_bytes, ds.retries,
                         time.perf_counter() - t0, head.step, verified_model, m.digest,
                         max(0.0, time.time() - head.time_ms / 1000), **extra)
        self._emit(event="step", **upd.as_dict())
        return upd

    def _prepare(self, m: Manifest, kind: str, base) -> tuple[list, bool]:
        """Fetch a step's bytes and check everything that can be checked before decoding (S9.3, S9.4
        steps 1, 2 and 4): readers open on every shard with wanted tensors, every base tensor checked
        against ``base`` (name -> array: the folder's or the live model's), bases held in ``p.bases``;
        ``(plans, whether the whole-model digest was checked)``."""
        plans = self._tails(m, kind)
        whole = self._trust is not None
        if whole:
            self._fetch_signed(plans)   # every used object whole, SHA-256 checked before it is decoded (S15.4)
        if self.patterns is not None and not any(p.wanted for p in plans):
            raise InputError(f"the tensor patterns {self.patterns} match none of the "
                             f"{sum(len(p.index.entries) for p in plans)} tensors of step {m.step}")
        # Phase A, one concurrent batch over every shard: a shard whose records fit the memory budget
        # is fetched whole; a bigger one only its header and META (its TENS records, which may carry
        # their blocks, SPEC §7, are fetched below a group at a time).
        first = []
        for p in plans:
            p.groups = ([p.wanted] if p.wanted else []) if whole else _groups(p.wanted, self.memory_budget)
            if whole:
                continue      # already fetched whole
            if len(p.groups) == 1:
                first.append((p, _needed_ranges(p.wanted)))
            elif p.groups:
                first.append((p, [(0, FL.FIRST_RECORD_OFFSET)]))
        self._prefetch([(p, coalesce(rs, max_gap=self.max_gap, overhead=self.overhead)) for p, rs in first])
        for p in plans:
            if p.wanted:
                p.reader = self._open_reader(m, kind, p)
        # Every base tensor, and for a whole-model selection every digest, is checked before
        # anything is written (S9.4 steps 2 and 4).
        for p in plans:
            if not p.wanted:
                continue
            p.bases = {}
            for group in p.groups:
                names = [e.name for e in group]
                if len(p.groups) > 1:   # this group's TENS records only: memory stays within the budget
                    self._prefetch([(p, coalesce([(e.tens_offset, e.tens_offset + e.tens_size) for e in group],
                                                 max_gap=self.max_gap, overhead=self.overhead))])
                # a keyframe object's tensors need no base: checked in each tensor's turn (§12.1 step 6)
                p.bases.update(p.reader.selection(base, names, workers=self.workers, keyframe=kind == "keyframe",
                                                  previous=self._history_for(kind))[1])
                if len(p.groups) > 1:   # read again with the group's blocks (_items)
                    p.reader.release_blocks(names)
                    p.source.drop(FL.FIRST_RECORD_OFFSET, p.obj.index_offset)
            if len(p.groups) > 1 and len(p.wanted) == len(p.reader.names):
                p.reader.check_digests()   # the whole file, as one selection of every tensor checks it
            headers = [p.reader.header(e.name) for e in p.wanted]
            pipeline.check_budget(headers, p.reader.output_budget(headers), p.obj.name)
        verified_model = self.patterns is None
        if verified_model:
            headers = [p.reader.header(n) for p in plans if p.reader is not None for n in p.reader.names]
            if model_digest(pipeline.digest_entries(headers)).hex() != m.model_digest:
                raise VerificationError(f"step {m.step}: the rebuilt model does not match the manifest's "
                                        f"model digest")
        return plans, verified_model

    def _history_for(self, kind: str) -> dict[str, History] | None:
        """The history of the step held, for a delta's tensors with HISTORY: the one kept in memory if
        it is of the state's step and manifest, else the folder's (read again)."""
        if kind != "delta":
            return None
        state = self.state()
        at = None if state is None else (state["step"], state["manifest"])
        if self._histories is None or self._histories_at is None or self._histories_at[:2] != at:
            self._histories, self._histories_at = self._read_histories(state)
        return self._histories

    def _read_histories(self, state: dict | None) -> tuple[dict[str, History], tuple[int, str, str, bool] | None]:
        """The folder's history file and what it leads to, if it is a regular file of the state's step
        and manifest whose every tensor's codes hash as recorded; else none (a delta that needs one
        then starts the follower again from a keyframe)."""
        if self.into is None or state is None:
            return {}, None
        path = os.path.join(self.into, HISTORY_NAME)
        try:
            if not stat.S_ISREG(os.lstat(path).st_mode):
                return {}, None
            ck = open_checkpoint(path)
            meta = ck.files[0].metadata or {}
            if meta.get("format") != HISTORY_FORMAT or meta.get("step") != str(state["step"]) \
                    or meta.get("manifest") != state["manifest"] or meta.get("kind") not in ("delta", "keyframe") \
                    or meta.get("keyframes") not in ("0", "1"):
                return {}, None
            fields = parse_json(meta.get("tensors", "").encode(), path, 1 << 30)
            out = {}
            tensors = ck.tensors()
            if set(tensors) != set(fields):
                return {}, None
            for name, arr in tensors.items():
                prev, base, dt_name, shape, digest = fields[name]
                shape = tuple(shape)
                n = int(np.prod(shape, dtype=object)) if shape else 1
                if arr.dtype != np.uint8 or arr.ndim != 1 or arr.size != -(-n // 4) \
                        or xxhash.xxh3_64_hexdigest(np.ascontiguousarray(arr).data) != digest:
                    return {}, None   # damaged, or not a history this follower wrote
                out[name] = History(dtypes.from_name(dt_name), shape, int(prev, 16), int(base, 16), np.array(arr))
            return out, (state["step"], state["manifest"], meta["kind"], meta["keyframes"] == "1")
        except (ArcError, OSError, KeyError, TypeError, ValueError, OverflowError):
            return {}, None   # a cache: anything amiss, and the next delta that needs it restarts from a keyframe

    def _records(self, plans, kind: str) -> bool:
        """Whether to keep the history of this step: unless the stream is known to write no delta that
        needs one before its next keyframe step (S8.2: a step whose deltas were written without their
        previous step, its META without HISTORY, and whose base step has no keyframes ends every
        chain; one starts again only right after a keyframe step). Never so once this follower started
        again for want of a history (a publisher that does not keep S8.2)."""
        if kind == "delta":
            if any(p.reader is not None and p.reader.meta.history for p in plans):
                self._uses_history = True
            elif self._histories_at is not None:
                self._uses_history = None if self._histories_at[3] or self._always_record else False
        return kind == "delta" and self._uses_history is not False

    def _keep_histories(self, m: Manifest, kind: str, recorded: dict[str, History], headers) -> None:
        """After a verified step: the history of every tensor a delta rebuilt from its base (those it
        left alone: all 0), none after a keyframe (or for a stream that needs none)."""
        if kind == "delta" and self._uses_history is not False:
            for th in headers:
                if th.name not in recorded and th.base_hash is not None:
                    recorded[th.name] = unchanged(th)
        else:
            recorded = {}
        self._histories, self._histories_at = recorded, (m.step, m.digest, kind, m.keyframe)

    def _write_folder(self, m: Manifest, plans, state, kind: str) -> tuple[list, int]:
        """Rebuild the step beside the folder, verify it as it is written, read it back, swap it in."""
        assert self.into is not None
        layouts = _layouts(plans)
        record = self._records(plans, kind)
        history_bytes = sum(-(-p.reader.header(e.name).size // 4) for p in plans for e in p.wanted) if record else 0
        self._check_space(m, sum(lay.size for lay in layouts) + history_bytes)
        stage = Stage(self.into, folder=True)
        sink = Recorder(CheckpointSink(stage, layouts), record)
        try:
            for _ in pipeline.run(self._items(plans), sink, workers=self.workers):
                pass
            changed = [e.name for p in plans for e in p.wanted if p.reader.changes(e.name)]
            self._keep_histories(m, kind, sink.histories, [p.reader.header(e.name) for p in plans for e in p.wanted])
            self._finish(m, layouts, stage, state)
        except BaseException:
            sink.close()
            stage.abort()
            self._histories, self._histories_at = None, None   # read again from the folder, which is as it was
            raise
        return changed, sum(len(p.wanted) for p in plans)

    def _fetch_signed(self, plans) -> None:
        """Trust mode: each shard object with wanted tensors, fetched whole ([0, size)) through the
        range fetcher, must hash to its signed SHA-256, and its tail must be the tail already parsed.
        Objects that fit ``memory_budget`` together are held in memory; a bigger one is written, as it
        is hashed, to an unlinked temporary file beside the folder (no folder: ``TMPDIR``) and read
        back mapped, so memory stays bounded however large a signed keyframe is (on a tmpfs the
        mapping is memory again)."""
        used = [p for p in plans if p.wanted]
        small, big, held = [], [], 0
        for p in sorted(used, key=lambda p: p.obj.size):
            if held + p.obj.size <= self.memory_budget:
                small.append(p)
                held += p.obj.size
            else:
                big.append(p)
        datas = self.fetcher.fetch([(p.source.path, 0, p.obj.size, p.source.key) for p in small])
        for p, data in zip(small, datas):
            check_object(p.obj, data)
            self._add_signed(p, data)
        for p in big:
            self._add_signed(p, self._spill_signed(p))

    def _spill_signed(self, p) -> memoryview:
        """One signed object through a temporary file: hashed as it arrives, mapped once it checked.
        Requests are the fetcher's chunks, ``memory_budget`` bytes of them (at least one) at a time."""
        size, where = p.obj.size, self._parent
        try:
            free = shutil.disk_usage(where).free
        except OSError as exc:
            raise os_error(exc, "check the free space of", where) from None
        if size > free:
            raise LimitError(f"{p.obj.name}: {size} bytes to check before use (trust mode), but {where} has "
                             f"{free} bytes free")
        chunk = self.fetcher.chunk_size
        step = max(chunk, min(self.memory_budget, size))
        h = hashlib.sha256()
        try:
            with tempfile.TemporaryFile(prefix=".arcfmt-signed-", dir=where) as f:
                for a in range(0, size, step):
                    stop = min(a + step, size)
                    reqs = [(p.source.path, lo, min(lo + chunk, stop), p.source.key) for lo in range(a, stop, chunk)]
                    for data in self.fetcher.fetch(reqs):
                        h.update(data)
                        f.write(data)
                f.flush()
                if p.obj.sha256 is None or f.tell() != size or h.hexdigest() != p.obj.sha256:
                    raise SignatureError(f"{p.obj.name}: its bytes do not hash to the signed sha256 in the manifest")
                # the mapping outlives the file object (its pages stay until the last view is gone)
                return memoryview(mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ))
        except OSError as exc:
            raise os_error(exc, "write", where) from None

    @staticmethod
    def _add_signed(p, data) -> None:
        if bytes(p.source.read(p.obj.index_offset, p.obj.tail_size)) != data[p.obj.index_offset:]:
            raise SignatureError(f"{p.obj.name}: its signed bytes end in another tail than the one read")
        p.source.add(0, data)

    def _tails(self, m: Manifest, kind: str) -> list:
        """Every shard's index and trailer, in one range request each (one concurrent batch)."""
        objs = [(s, s.object(kind)) for s in m.shards]
        tails = self.fetcher.fetch([(self.store.path(o.name), o.index_offset, o.size, o.name) for _, o in objs])
        plans = []
        for (s, o), tail in zip(objs, tails):
            if xxhash.xxh3_64_hexdigest(tail) != o.tail_xxh3_64:
                raise ChecksumError(f"{o.name}: its index and trailer do not hash to the manifest's tail_xxh3_64")
            index = _parse_tail(tail, o)
            if len(index.entries) != s.tensors:  # the manifest counts each shard's tensors (S6, S9.4)
                raise CorruptError(f"{o.name}: its index lists {len(index.entries)} tensors, the manifest "
                                   f"{s.tensors}")
            src = ObjectSource(self.fetcher, self.store.path(o.name), o.name, o.size)
            src.add(o.index_offset, tail)
            plans.append(_ShardPlan(s, o, src, index, [e for e in index.entries if self.wants(e.name)]))
        owner: dict[str, str] = {}
        for p in plans:  # one step is one model: a name in two shards would be two tensors (S6)
            for e in p.index.entries:
                other = owner.setdefault(e.name, p.obj.name)
                if other != p.obj.name:
                    raise CorruptError(f"step {m.step}: tensor {e.name!r} is in two shards ({other} and "
                                       f"{p.obj.name})")
        return plans

    def _prefetch(self, jobs) -> None:
        """Fetch ``[(plan, ranges)]`` in one concurrent batch into the plans' sources."""
        reqs = [(p.source.path, a, b, p.source.key) for p, rs in jobs for a, b in rs]
        datas = iter(self.fetcher.fetch(reqs))
        for p, rs in jobs:
            for a, _ in rs:
                p.source.add(a, next(datas))

    def _open_reader(self, m: Manifest, kind: str, p: _ShardPlan) -> DeltaReader:
        r = DeltaReader(p.source, workers=self.workers, max_output_bytes=self.max_output_bytes, index=p.index)
        where = p.obj.name
        if r.target_step != m.step:
            raise CorruptError(f"{where}: its META says target step {r.target_step}, the manifest {m.step}")
        want_base = m.base_step if kind == "delta" else None
        if r.base_step != want_base:
            raise CorruptError(f"{where}: its META says base step {r.base_step}, the manifest {want_base}")
        if r.target_digest.hex() != p.entry.target_digest:
            raise CorruptError(f"{where}: its target digest differs from the manifest's")
        if kind == "delta" and r.base_digest.hex() != p.obj.base_digest:
            raise CorruptError(f"{where}: its base digest differs from the manifest's")
        return r

    def _items(self, plans):
        """Pipeline items shard by shard; a shard bigger than the memory budget is fetched one group
        of tensors at a time, each group's bytes dropped once its blocks are done."""
        for shard, p in enumerate(plans):
            if not p.wanted:
                continue
            r = p.reader
            for group in p.groups:
                if len(p.groups) > 1:   # the blocks, and the TENS records that carry theirs (SPEC §7)
                    blocks = [(b.offset, b.offset + b.size) for e in group for b in e.blocks if b.size] + [
                        (e.tens_offset, e.tens_offset + e.tens_size) for e in group
                        if len(e.blocks) == 1 and not e.blocks[0].size]
                    self._prefetch([(p, coalesce(blocks, max_gap=self.max_gap, overhead=self.overhead))])
                for e in group:
                    item = r.item(e.name, p.bases[e.name])
                    item.order += shard << 32   # failures are ranked shard by shard, then in file order
                    yield item
                if len(p.groups) > 1:
                    yield pipeline.DRAIN
                    p.source.drop(FL.FIRST_RECORD_OFFSET, p.obj.index_offset)   # bounded memory

    def _check_space(self, m: Manifest, need: int) -> None:
        """The step's files must fit beside the folder; this follower's own spool (resumable chunks)
        is given up first if that makes them fit."""
        free = shutil.disk_usage(self._parent).free
        if need > free and self.spool_dir is not None:
            self.fetcher.forget()
            free = shutil.disk_usage(self._parent).free
        if need > free:
            raise LimitError(f"step {m.step} needs {need} bytes of tensors in {self._parent}, which has "
                             f"{free} bytes free")

    def _finish(self, m: Manifest, layouts, stage: Stage, old_state) -> None:
        """Index, stream state and the user's own files into the stage; check it reads back; swap."""
        weight_map = {s.name: lay.file for lay in layouts for s in lay.specs}
        total = sum(lay.tensor_bytes for lay in layouts)
        write_json(stage.file(INDEX_NAME), {"metadata": {"total_size": total, "arcfmt_step": str(m.step)},
                                            "weight_map": weight_map}, stage.owner_of(INDEX_NAME))
        files = sorted(lay.file for lay in layouts)
        state = dict(format=STATE_FORMAT, version=VERSION, step=m.step, manifest=m.digest,
                     model_digest=m.model_digest, tensors=self.patterns, files=files,
                     manifest_sha256=m.sha256, signed_by=self._signed_by if self._trust is not None else None)
        write_new_file(stage.file(STATE_NAME), canonical(state), stage.owner_of(STATE_NAME))
        if self._histories is not None and self._histories_at is not None \
                and self._histories_at[:2] == (m.step, m.digest):
            # the step's history, beside its state (a restarted follower reads it back); its mode and
            # owner: the history's it replaces, else the state's (as private as the state)
            like = HISTORY_NAME if self.into is not None and os.path.isfile(os.path.join(self.into, HISTORY_NAME)) \
                else STATE_NAME
            write_new_file(stage.file(HISTORY_NAME), _history_bytes(self._histories, m, self._histories_at[2]),
                           stage.owner_of(like))
        assert self.into is not None
        if os.path.isdir(self.into):
            prev = self._folder_state() if old_state is None else old_state
            written = set((prev or {}).get("files") or [])
            for name in files:   # the manifest names the files: one of the user's is never replaced
                if name not in written and os.path.lexists(os.path.join(self.into, name)):
                    raise InputError(f"step {m.step} names the shard file {name}, which {self.into} holds but no "
                                     f"step this follower applied wrote: it is not replaced; move it away")
            own = {INDEX_NAME, STATE_NAME, HISTORY_NAME, *files, *written}
            stage.carry(self.into, own, link=True)
        check_written(stage, layouts)
        stage.commit()


# ------------------------------------------------------------------------------------ live model

class _LiveModel:
    """A live follower's model: arrays in memory (numpy, or CPU torch tensors viewed as numpy), brought
    to each step through :class:`pipeline.StagedSink` — every change staged and every tensor verified
    before any live array is written, so a failed step leaves the model exactly at the old one — plus
    the snapshot folder, rewritten through the follower's one stage-and-swap."""

    def __init__(self, fol: Follower, arrays):
        self.fol = fol
        self.arrays = arrays
        self.state: dict | None = None
        self.files: list[tuple[str, list[str]]] = []   # the last step's (file, tensor names), for snapshots
        self.hashes: dict[str, int] = {}               # name -> tensor hash at the live step
        self.since_snapshot = 0
        self.rebased = False     # fell back to a keyframe once because the live arrays were not at the snapshot
        if fol.into is not None:
            st = fol._folder_state()
            if st is not None:
                if not len(arrays):   # bootstrap from the snapshot folder itself
                    for n, a in open_checkpoint(fol.into).tensors().items():
                        arrays[n] = np.array(a, copy=True)
                self.state = dict(st)  # the live arrays are taken to be at its step: the bases check it

    def bases(self, kind: str) -> dict:
        """The live arrays as bases; those this follower wrote itself at the live step carry their
        verified hash (checked against the delta's base hash without hashing the model again)."""
        if kind == "keyframe":
            return {}
        return {n: KnownBase(a, self.hashes[n]) if n in self.hashes else as_numpy(a)
                for n, a in self.arrays.items()}

    def _flat(self, name: str, th) -> np.ndarray | None:
        """The writeable flat unsigned view of a live tensor of ``th``'s dtype and shape, else None."""
        a = self.arrays.get(name)
        if a is None:
            return None
        v = as_numpy(a)
        if v.dtype != th.dtype.numpy or tuple(v.shape) != tuple(th.shape):
            return None
        if not (v.flags.c_contiguous and v.flags.writeable):
            raise InputError(f"live tensor {name!r} must be C-contiguous and writeable")
        return v.reshape(-1).view(th.dtype.uint)

    def apply(self, m: Manifest, kind: str, plans) -> tuple[list, int, dict]:
        headers = {e.name: p.reader.header(e.name) for p in plans for e in p.wanted}
        flats = {}
        for n, th in headers.items():
            f = self._flat(n, th)
            if f is not None:
                flats[n] = f
        fresh_headers = [th for n, th in headers.items() if n not in flats]
        budget = sum(p.reader.output_budget([headers[e.name] for e in p.wanted if e.name not in flats])
                     for p in plans if p.wanted)
        sink = Recorder(pipeline.StagedSink(flats, pipeline.ArraySink(budget, fresh_headers)),
                        self.fol._records(plans, kind))
        changes, fresh = [], {}
        items = (it for it in self.fol._items(plans)
                 if it is pipeline.DRAIN or it.th.name not in flats or kind == "keyframe"
                 or _changes(plans, it.th.name))
        for out in pipeline.run(items, sink, workers=self.fol.workers):
            if isinstance(out, pipeline.Change):
                if out.index.size:
                    changes.append(out)
            else:
                fresh[out[0]] = out[1]
        for n in flats:   # a tensor the delta leaves as it is: its bytes are the base's, checked above
            th = headers[n]
            if kind == "delta" and not _changes(plans, n):
                assert th.base_hash is not None
                pipeline.verify_hash(th, th.base_hash)
        # Everything verified: only now does any live array change (and the history of this step is kept).
        sink.apply(changes, self.fol.workers)
        torch_like = any(type(a).__module__.startswith("torch") for a in self.arrays.values())
        for n, a in fresh.items():
            self.arrays[n] = _torch_of(a) if torch_like else a
        self.files = [(p.entry.file, [e.name for e in p.wanted]) for p in plans if p.wanted]
        self.hashes = {n: th.target_hash for n, th in headers.items()}
        self.state = dict(format=STATE_FORMAT, version=VERSION, step=m.step, manifest=m.digest,
                          model_digest=m.model_digest, tensors=self.fol.patterns,
                          files=sorted(f for f, _ in self.files), manifest_sha256=m.sha256,
                          signed_by=self.fol._signed_by if self.fol._trust is not None else None)
        self.manifest = m
        self.fol._keep_histories(m, kind, sink.histories, [headers[n] for n in flats])
        changed = [c.name for c in changes] + sorted(fresh)
        values = sum(int(c.index.size) for c in changes)
        extra = dict(live=self.arrays, changes=changes, fresh=sorted(fresh), values_changed=values,
                     sparse_bytes=sum(c.index.nbytes + c.values.nbytes for c in changes),
                     whole_bytes=sum(as_numpy(self.arrays[n]).nbytes for n in changed))
        self.since_snapshot += 1
        if self.fol.into is not None and self.fol.snapshot_every and self.since_snapshot >= self.fol.snapshot_every:
            self.write_snapshot(locked=True)    # inside the follower's run: its lock is held
            extra["snapshot"] = True
        return changed, len(headers), extra

    def write_snapshot(self, *, locked: bool = False) -> bool:
        """Write the live model at its step into the snapshot folder (stage, verify every tensor against
        the step's hashes as it is written, read back, swap). False when there is nothing new to write."""
        fol = self.fol
        if fol.into is None or self.state is None or not self.files or self.since_snapshot == 0:
            return False
        layouts, items = [], []
        for file, names in self.files:
            specs = []
            for n in names:
                v = as_numpy(self.arrays[n])
                dt = dtypes.from_numpy(v.dtype)
                specs.append((n, dt, tuple(v.shape)))
                th = records.TensorHeader(n, dt, tuple(v.shape), SNAPSHOT_BLOCK, self.hashes[n], self.hashes[n])
                flat = np.ascontiguousarray(v).reshape(-1).view(dt.uint)
                items.append(pipeline.Item(th, flat, [_copy_block(b) for b in range(th.block_count)]))
            layouts.append(ShardLayout(file, specs, {"format": "pt"}))
        with contextlib.nullcontext() if locked else fol._locked():
            old = fol._folder_state()
            fol._check_space(self.manifest, sum(lay.size for lay in layouts))
            stage = Stage(fol.into, folder=True)
            sink = CheckpointSink(stage, layouts)
            try:
                for _ in pipeline.run(items, sink, workers=fol.workers):
                    pass
                fol._finish(self.manifest, layouts, stage, old)
            except BaseException:
                sink.close()
                stage.abort()
                raise
        self.since_snapshot = 0
        return True


SNAPSHOT_BLOCK = 1 << 20   # elements per copied block of a snapshot (hashing and copying in parallel)


def _history_bytes(histories: dict[str, History], m: Manifest, kind: str) -> bytes:
    """The history file (:data:`HISTORY_NAME`) of step ``m``: each tensor's packed codes, and in the
    metadata the step, manifest and kind of step they belong to, and each tensor's hashes, dtype, shape
    and the xxh3 of its codes (checked when read back)."""
    from ..safetensors_io import file_parts
    fields = {n: [f"{h.previous_hash:016x}", f"{h.base_hash:016x}", h.dtype.name, list(h.shape),
                  xxhash.xxh3_64_hexdigest(np.ascontiguousarray(h.packed).data)] for n, h in histories.items()}
    return b"".join(file_parts({n: h.packed for n, h in histories.items()},
                               {"format": HISTORY_FORMAT, "step": str(m.step), "manifest": m.digest, "kind": kind,
                                "keyframes": "1" if m.keyframe else "0",
                                "tensors": json.dumps(fields, separators=(",", ":"))}))


def _copy_block(b: int):
    """A pipeline block loader that rebuilds a block as its base (the live array): a verified copy."""
    info = records.BlockInfo(0, b, encodings.UNCHANGED, [])
    return lambda: (info, b"")


def _changes(plans, name: str) -> bool:
    for p in plans:
        if p.reader is not None and name in p.bases:
            return p.reader.changes(name)
    return True


def _torch_of(a):
    from ..torch import to_torch
    return to_torch(a)


# ------------------------------------------------------------------------------------ helpers

class _Waker:
    """The poll wait of :meth:`Follower.follow`: a plain sleep, ended early by :meth:`wake` (a self-pipe)
    or by any write into a named pipe. The pipe is opened read-write, so it never reads as closed
    while no writer has it open, and never through a symbolic link."""

    def __init__(self, fifo: str | None):
        self.fifo = None if fifo is None else os.fspath(fifo)
        self.fds: list[int] = []
        self._w: int | None = None

    def __enter__(self) -> _Waker:
        r, self._w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.fds.append(r)
        if self.fifo is not None:
            try:
                with contextlib.suppress(FileExistsError):
                    os.mkfifo(self.fifo, 0o600)
                fd = os.open(self.fifo, os.O_RDWR | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError as exc:
                self.__exit__()
                raise InputError(f"--wake-fifo {self.fifo}: {exc.strerror or exc} (it must be a named pipe, "
                                 f"not a link)") from None
            self.fds.append(fd)
            if not stat.S_ISFIFO(os.fstat(fd).st_mode):
                self.__exit__()
                raise InputError(f"--wake-fifo {self.fifo} exists and is not a named pipe")
        return self

    def __exit__(self, *exc) -> None:
        for fd in self.fds + ([self._w] if self._w is not None else []):
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds, self._w = [], None

    def wake(self) -> None:
        if self._w is not None:
            with contextlib.suppress(OSError):
                os.write(self._w, b"!")

    def sleep(self, seconds: float) -> None:
        ready, _, _ = select.select(self.fds, [], [], seconds)
        for fd in ready:   # drain: one wake per burst of writes
            with contextlib.suppress(OSError):
                while os.read(fd, 65536):
                    pass


def _layouts(plans) -> list:
    """The checkpoint files of a step: one per shard with wanted tensors, in the data object's order."""
    layouts = [ShardLayout(p.entry.file, [(e.name, p.reader.header(e.name).dtype, p.reader.header(e.name).shape)
                                          for e in p.wanted], {"format": "pt"}) for p in plans if p.wanted]
    if not layouts:  # a step of no tensors is still a checkpoint: one file holding none
        layouts = [ShardLayout(plans[0].entry.file, [], {"format": "pt"})]
    return layouts


def _check_until(until):
    return None if until is None else retry.check_count(until, "until")


def _groups(wanted, budget: int) -> list:
    """``wanted`` (IndexEntry, file order) cut into runs whose records total at most ``budget`` bytes
    (a tensor bigger than the budget is a group of its own)."""
    groups: list[list[records.IndexEntry]] = []
    cur: list[records.IndexEntry] = []
    size = 0
    for e in wanted:
        n = e.tens_size + sum(b.size for b in e.blocks)
        if cur and size + n > budget:
            groups.append(cur)
            cur, size = [], 0
        cur.append(e)
        size += n
    if cur:
        groups.append(cur)
    return groups


def _needed_ranges(wanted) -> list:
    if not wanted:
        return []
    out = [(0, FL.FIRST_RECORD_OFFSET)]
    for e in wanted:
        out.append((e.tens_offset, e.tens_offset + e.tens_size))
        out.extend((b.offset, b.offset + b.size) for b in e.blocks)
    return out


def _parse_tail(tail: bytes, obj) -> records.Index:
    """The index of an object from its tail bytes ([index_offset, size)), with every check of §11/§10."""
    size = obj.size
    trailer = records.check_trailer(tail[-FL.TRAILER_SIZE:], size, alone=True)
    if trailer.index_offset != obj.index_offset:
        raise CorruptError(f"{obj.name}: trailer says the index is at {trailer.index_offset}, the manifest "
                           f"{obj.index_offset}")
    head = records.parse_record_head(tail[:FL.RECORD_HEADER_SIZE], obj.index_offset)
    if head.type != FL.INDX or head.length != trailer.index_size - FL.RECORD_HEADER_SIZE:
        raise CorruptError(f"{obj.name}: no INDX record of the trailer's size at offset {obj.index_offset}")
    payload = memoryview(tail)[FL.RECORD_HEADER_SIZE: trailer.index_size]
    records.verify_record(head, tail[:FL.RECORD_HEADER_SIZE], payload, obj.index_offset)
    # the header is not in the tail: the trailer repeats its COMPACT_INDEX and INLINE_BLOCKS bits (§11),
    # checked against the header when the records are read (a DeltaReader over the ranges)
    return records.parse_index(payload, obj.index_offset, bool(trailer.flags & FL.COMPACT_INDEX),
                               bool(trailer.flags & FL.INLINE_BLOCKS))


def _read_regular(path: str, limit: int) -> bytes:
    """At most ``limit`` + 1 bytes of a file that must be a regular file reached without a link (a FIFO,
    device or planted link at the state's name is refused, never read or waited on)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise InputError(f"{path} is not a valid follower state ({exc.strerror}); remove it to start over") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise InputError(f"{path} is not a regular file; remove it to start over")
        return os.read(fd, limit + 1)
    finally:
        os.close(fd)


def _step_of_key(key: str) -> int:
    parts = key.split("/")
    try:
        return int(parts[1]) if len(parts) > 2 and parts[0] == N.STEPS else -1
    except ValueError:
        return -1


__all__ = ["Follower", "StepUpdate", "STATE_NAME", "OLD_TAG"]
