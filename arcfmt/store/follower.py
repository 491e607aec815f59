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
import os
import shutil
import stat
import time
from dataclasses import dataclass, field

import xxhash

from .. import layout as FL
from .. import pipeline, records
from ..checkpoint_writer import CheckpointSink, ShardLayout, check_written, write_json, write_new_file
from ..errors import (
    ArcError,
    ChecksumError,
    CorruptError,
    FormatError,
    InputError,
    LimitError,
    VerificationError,
    WrongBaseError,
    os_error,
)
from ..integrity import model_digest
from ..reader import DeltaReader
from ..safetensors_io import INDEX_NAME, open_checkpoint
from ..staging import OLD_TAG, Stage, open_private, recover
from . import names as N
from . import retry
from .backends import Store
from .errors import MissingError
from .objects import (
    MAX_HEAD_BYTES,
    MAX_MANIFEST_BYTES,
    VERSION,
    Head,
    Manifest,
    ObjectRef,
    ShardEntry,
    canonical,
    digest128,
    parse_head,
    parse_json,
    parse_manifest,
)
from .ranges import DEFAULT_CHUNK, DEFAULT_MAX_GAP, DEFAULT_OVERHEAD, FetchStats, ObjectSource, RangeFetcher, coalesce

STATE_NAME = "arcfmt-stream.json"
MAX_CHAIN = 1 << 20          # manifests one plan may read walking back from the head
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

    @property
    def lag_steps(self) -> int:
        return self.head_step - self.step

    def weights(self):
        """``(name, array)`` for every changed tensor, read (memory-mapped) from the folder as it is now:
        the shape vLLM-style ``load_weights`` takes. Arrays stay valid after later steps replace the
        folder (the files are unlinked, not overwritten)."""
        if not self.changed:
            return
        arrays = open_checkpoint(self.path).tensors()
        for name in self.changed:
            if name in arrays:
                yield name, arrays[name]

    def as_dict(self) -> dict:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "changed"}
        d.update(changed=len(self.changed), lag_steps=self.lag_steps)
        return d


@dataclass
class _ShardPlan:
    entry: ShardEntry
    obj: ObjectRef
    source: ObjectSource
    index: records.Index
    wanted: list = field(default_factory=list)     # IndexEntry of the tensors to rebuild
    groups: list = field(default_factory=list)     # wanted, cut into groups that fit the memory budget
    reader: DeltaReader | None = None


class Follower:
    """Keeps the folder ``into`` at the stream's latest step (all tensors, or those matching ``tensors``).

    ``tensors``: shell-style patterns (``fnmatch``) on tensor names, e.g. ``"model.layers.*.mlp.*"``.
    ``progress``: called with one dict per event (``{"event": "step", ...}``, ``"bytes"``, ``"head"``).
    ``concurrency``: range requests in flight at once; finished batches are spooled, so an interrupted
    download loses at most one batch. ``memory_budget``: record bytes held in memory at once; a shard
    with more is fetched and rebuilt a group of tensors at a time. ``max_output_bytes``: the most
    tensor bytes one shard's object may make (default: what the folder's base backs plus a bound
    scaled to the object's size, so a tiny object cannot fill the disk). ``request_timeout``: the
    deadline of one request, body included (a trickling server is abandoned and retried);
    ``retry_time``: no retry starts later than this after an operation's first attempt;
    ``step_timeout``: the deadline of a whole step's downloads (None: none).
    """

    def __init__(self, url: str, into, *, tensors=None, storage_options: dict | None = None, fs=None,
                 chunk_size: int = DEFAULT_CHUNK, max_gap: int = DEFAULT_MAX_GAP, overhead: float = DEFAULT_OVERHEAD,
                 retries: int = 5, backoff: float = 0.2, workers=None, spool: bool = True, progress=None,
                 concurrency: int = 16, memory_budget: int = 256 << 20, max_output_bytes: int | None = None,
                 request_timeout: float | None = None, retry_time: float | None = None,
                 step_timeout: float | None = None):
        self.store = Store(url, storage_options, fs=fs, retries=retries, backoff=backoff,
                           request_timeout=request_timeout, retry_time=retry_time)
        self.step_timeout = None if step_timeout is None else \
            retry.check_seconds(step_timeout, "step_timeout", finite=False)
        self.url = url
        self.into = os.path.abspath(os.fspath(into)).rstrip("/")
        if not os.path.basename(self.into):
            raise InputError("--into must name a folder, not the file system root")
        self.patterns = N.tensor_patterns(tensors)
        self.max_gap = retry.check_count(max_gap, "max_gap")
        self.memory_budget = retry.check_count(memory_budget, "memory_budget")
        self.max_output_bytes = None if max_output_bytes is None else retry.check_count(max_output_bytes,
                                                                                        "max_output_bytes")
        self.overhead = retry.check_number(overhead, "overhead", finite=False)
        self.workers = workers or min(8, os.cpu_count() or 1)
        self.progress = progress
        parent, base = os.path.split(self.into)
        self._parent = parent
        self._lock_path = os.path.join(parent, f".arcfmt-lock-{base}")
        self.spool_dir = os.path.join(parent, f".arcfmt-spool-{base}") if spool else None
        self.stats = FetchStats()
        self.fetcher = RangeFetcher(self.store.fs, chunk_size=chunk_size, retries=retries, backoff=backoff,
                                    spool_dir=self.spool_dir, stats=self.stats, on_bytes=self._on_bytes,
                                    batch=concurrency, request_timeout=request_timeout, retry_time=retry_time)

    # ------------------------------------------------------------------------------ small helpers
    def _emit(self, **event) -> None:
        if self.progress is not None:
            self.progress(event)

    def _on_bytes(self, n: int) -> None:
        if self.progress is not None:
            self.progress({"event": "bytes", "bytes": n, "total": self.stats.bytes})

    def wants(self, name: str) -> bool:
        return self.patterns is None or any(fnmatch.fnmatchcase(name, p) for p in self.patterns)

    @contextlib.contextmanager
    def _locked(self):
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
        """The folder's stream state (``step``, ``manifest``, ``tensors``), or None for a new folder."""
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
        m = parse_manifest(raw, name)
        if m.step != step:
            raise CorruptError(f"{name} describes step {m.step}")
        return m

    def plan(self, head: Head | None = None, state: dict | None = None) -> list:
        """The cheapest path by bytes from the folder's step to ``head``: ``[(Manifest, kind), ...]``."""
        head = head or self.head()
        if head is None:
            return []
        if state is None:
            state = self.state()
        if state is not None and state.get("tensors") != self.patterns:
            state = None  # another tensor selection: start again from a keyframe
        f_step = None if state is None else state["step"]
        f_hash = None if state is None else state["manifest"]
        if f_step is not None and f_step >= head.step:
            if f_step > head.step or f_hash == head.manifest:
                return []
            f_step = None  # the head's step, but another manifest: off the chain, start from a keyframe
        chain: list[Manifest] = []
        best: tuple[int, int | str] | None = None   # (cost, "delta") or (cost, chain index of a keyframe step)
        d = 0                    # delta bytes from the current manifest up to the head
        step, digest = head.step, head.manifest
        while True:
            if f_step is not None and step == f_step and digest == f_hash:
                if best is None or d <= best[0]:
                    best = (d, "delta")
                break
            if f_step is not None and step <= f_step:
                f_step = None     # the folder's step is not on this chain: only a keyframe can help
            if len(chain) >= MAX_CHAIN:
                raise LimitError(f"more than {MAX_CHAIN} manifests between the head and a usable start")
            m = self._manifest(step, digest)
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
        if isinstance(k, str):   # "delta"
            return [(m, "delta") for m in reversed(chain)]
        return [(chain[k], "keyframe")] + [(m, "delta") for m in reversed(chain[:k])]

    # ------------------------------------------------------------------------------ following
    def sync(self, until: int | None = None) -> list:
        """Apply every step up to the current head (stop early once the folder reaches ``until``)."""
        return list(self._run(_check_until(until)))

    def follow(self, *, until: int | None = None, interval: float = 2.0, timeout: float | None = None):
        """Yield a :class:`StepUpdate` per applied step, polling the head every ``interval`` seconds,
        until the folder reaches ``until`` (forever if None) or ``timeout`` seconds pass without one."""
        interval = retry.check_seconds(interval, "interval")
        timeout = None if timeout is None else retry.check_seconds(timeout, "timeout", finite=False)
        _check_until(until)
        last_progress = time.monotonic()
        while True:
            applied = False
            for upd in self._run(until):
                applied = True
                yield upd
            if applied:
                last_progress = time.monotonic()
            st = self.step
            if until is not None and st is not None and st >= until:
                return
            if timeout is not None and time.monotonic() - last_progress > timeout:
                return
            time.sleep(interval)

    def _run(self, until):
        with self._locked():
            recover(self.into)
            head = self.head()
            self._emit(event="head", step=None if head is None else head.step)
            if head is None:
                return
            state = self.state()
            path = self.plan(head, state)
            cur = None if state is None or state.get("tensors") != self.patterns else state["step"]
            for m, kind in path:
                if until is not None and cur is not None and cur >= until:
                    return
                upd = self._apply(m, kind, head, cur)
                cur = upd.step
                yield upd

    # ------------------------------------------------------------------------------ one step
    def _apply(self, m: Manifest, kind: str, head: Head, cur: int | None) -> StepUpdate:
        try:
            with self.store.time_limit(self.step_timeout), self.fetcher.time_limit(self.step_timeout):
                return self._apply_step(m, kind, head, cur)
        except (FormatError, VerificationError, WrongBaseError):
            # Bytes that failed a check may sit in the spool (a damaged object, a byte flipped in
            # transit, a base hash flipped in the object): drop this step's chunks, or every later attempt
            # would reuse them and fail again.
            self.fetcher.forget(keep=lambda key: _step_of_key(key) != m.step)
            raise

    def _apply_step(self, m: Manifest, kind: str, head: Head, cur: int | None) -> StepUpdate:
        t0 = time.perf_counter()
        s0 = FetchStats(**self.stats.as_dict())
        plans = self._tails(m, kind)
        if self.patterns is not None and not any(p.wanted for p in plans):
            raise InputError(f"the tensor patterns {self.patterns} match none of the "
                             f"{sum(len(p.index.entries) for p in plans)} tensors of step {m.step}")
        needed = sum(e - s for p in plans for s, e in _needed_ranges(p.wanted))
        tail_bytes = sum(p.obj.tail_size for p in plans)
        # Phase A, one concurrent batch over every shard: a shard whose records fit the memory budget
        # is fetched whole; a bigger one only its header, META and TENS records (shapes and hashes).
        first = []
        for p in plans:
            p.groups = _groups(p.wanted, self.memory_budget)
            if len(p.groups) == 1:
                first.append((p, _needed_ranges(p.wanted)))
            elif p.groups:
                first.append((p, [(0, FL.FIRST_RECORD_OFFSET)] + [(e.tens_offset, e.tens_offset + e.tens_size)
                                                                  for e in p.wanted]))
        self._prefetch([(p, coalesce(rs, max_gap=self.max_gap, overhead=self.overhead)) for p, rs in first])
        for p in plans:
            if p.wanted:
                p.reader = self._open_reader(m, kind, p)
        base = {}
        state = self.state() if kind == "delta" else None
        if state is not None and state.get("files") and any(p.wanted for p in plans):
            base = open_checkpoint(self.into).tensors()
        # Every base tensor, and for a whole-model selection every digest, is checked before
        # anything is written (S9.4 steps 2 and 4).
        bases = {}
        for p in plans:
            if not p.wanted:
                continue
            for e in p.wanted:
                if kind == "keyframe" and p.reader.header(e.name).needs_base:
                    raise CorruptError(f"{p.obj.name}: tensor {e.name!r} of a keyframe object needs a base")
            bases.update(p.reader.selection(base, [e.name for e in p.wanted], workers=self.workers)[1])
            headers = [p.reader.header(e.name) for e in p.wanted]
            pipeline.check_budget(headers, p.reader.output_budget(headers), p.obj.name)
        verified_model = self.patterns is None
        if verified_model:
            headers = [p.reader.header(n) for p in plans if p.reader is not None for n in p.reader.names]
            if model_digest(pipeline.digest_entries(headers)).hex() != m.model_digest:
                raise VerificationError(f"step {m.step}: the rebuilt model does not match the manifest's "
                                        f"model digest")
        layouts = [ShardLayout(p.entry.file, [(e.name, p.reader.header(e.name).dtype,
                                                p.reader.header(e.name).shape) for e in p.wanted],
                               {"format": "pt"}) for p in plans if p.wanted]
        if not layouts:  # a step of no tensors is still a checkpoint: one file holding none
            layouts = [ShardLayout(plans[0].entry.file, [], {"format": "pt"})]
        self._check_space(m, sum(lay.size for lay in layouts))
        stage = Stage(self.into, folder=True)
        sink = CheckpointSink(stage, layouts)
        try:
            for _ in pipeline.run(self._items(plans, bases), sink, workers=self.workers):
                pass
            changed = [e.name for p in plans for e in p.wanted if p.reader.changes(e.name)]
            count = sum(len(p.wanted) for p in plans)
            self._finish(m, plans, layouts, stage, state)
        except BaseException:
            sink.close()
            stage.abort()
            raise
        self.fetcher.forget(keep=lambda key: _step_of_key(key) > m.step)
        ds = self.stats.minus(s0)
        upd = StepUpdate(m.step, cur, kind, self.into, changed, count, ds.bytes, needed, tail_bytes, ds.requests,
                         m.num_shards, sum(1 for p in plans if p.wanted), ds.reused_bytes, ds.retries,
                         time.perf_counter() - t0, head.step, verified_model, m.digest,
                         max(0.0, time.time() - head.time_ms / 1000))
        self._emit(event="step", **upd.as_dict())
        return upd

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
        r = DeltaReader(p.source, workers=self.workers, max_output_bytes=self.max_output_bytes)
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

    def _items(self, plans, bases):
        """Pipeline items shard by shard; a shard bigger than the memory budget is fetched one group
        of tensors at a time, each group's bytes dropped once its blocks are done."""
        for p in plans:
            if not p.wanted:
                continue
            r = p.reader
            for group in p.groups:
                if len(p.groups) > 1:
                    blocks = [(b.offset, b.offset + b.size) for e in group for b in e.blocks]
                    self._prefetch([(p, coalesce(blocks, max_gap=self.max_gap, overhead=self.overhead))])
                for e in group:
                    yield r.item(e.name, bases[e.name])
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

    def _finish(self, m: Manifest, plans, layouts, stage: Stage, old_state) -> None:
        """Index, stream state and the user's own files into the stage; check it reads back; swap."""
        weight_map = {s.name: lay.file for lay in layouts for s in lay.specs}
        total = sum(lay.tensor_bytes for lay in layouts)
        write_json(stage.file(INDEX_NAME), {"metadata": {"total_size": total, "arcfmt_step": str(m.step)},
                                            "weight_map": weight_map}, stage.owner_of(INDEX_NAME))
        files = sorted(lay.file for lay in layouts)
        state = dict(format=STATE_FORMAT, version=VERSION, step=m.step, manifest=m.digest,
                     model_digest=m.model_digest, tensors=self.patterns, files=files)
        write_new_file(stage.file(STATE_NAME), canonical(state), stage.owner_of(STATE_NAME))
        if os.path.isdir(self.into):
            prev = self.state() if old_state is None else old_state
            own = {INDEX_NAME, STATE_NAME, *files, *((prev or {}).get("files") or [])}
            stage.carry(self.into, own, link=True)
        check_written(stage, layouts)
        stage.commit()


# ------------------------------------------------------------------------------------ helpers

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
    trailer = records.check_trailer(tail[-FL.TRAILER_SIZE:], size)
    if trailer.index_offset != obj.index_offset:
        raise CorruptError(f"{obj.name}: trailer says the index is at {trailer.index_offset}, the manifest "
                           f"{obj.index_offset}")
    head = records.parse_record_head(tail[:FL.RECORD_HEADER_SIZE], obj.index_offset)
    if head.type != FL.INDX or head.length != trailer.index_size - FL.RECORD_HEADER_SIZE:
        raise CorruptError(f"{obj.name}: no INDX record of the trailer's size at offset {obj.index_offset}")
    payload = memoryview(tail)[FL.RECORD_HEADER_SIZE: trailer.index_size]
    records.verify_record(head, tail[:FL.RECORD_HEADER_SIZE], payload, obj.index_offset)
    return records.parse_index(payload, obj.index_offset)


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
