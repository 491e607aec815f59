"""Regional mirrors: republish a stream's committed steps into another bucket (SPEC.md Part II, S17).

A fleet in another region should cross the region boundary once per step, not once per follower: a
:class:`Mirror` follows a source stream and copies each committed step into a destination stream,
oldest first and in commit order — data objects, descriptors, the manifest, the step's signature if
it has one, then the head by compare-and-swap — so that the destination is itself a stream that
followers follow unchanged. Nothing is decoded: every copied byte is checked by the same chain of
hashes a follower checks (head → manifest → base manifests; manifest → descriptor; manifest → whole
object and tail), and the destination's head only ever names a step whose every object is already
there. Names are content-addressed and commit objects are conditional creates, so a rerun (after a
crash or a SIGKILL at any point) copies only what is missing, and two runs never disagree silently.
"""
from __future__ import annotations

import os
import random
import re
import shutil
import stat
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

import xxhash

from ..errors import ArcError, ChecksumError, InputError, LimitError, TruncatedError
from . import names as N
from . import retry
from .backends import Store
from .errors import ConflictError, MissingError, NoStreamError
from .objects import (
    MAX_DESCRIPTOR_BYTES,
    MAX_HEAD_BYTES,
    MAX_MANIFEST_BYTES,
    Head,
    Manifest,
    ObjectRef,
    check_own_name,
    digest128,
    parse_descriptor,
    parse_head,
    parse_manifest,
)
from .ranges import DEFAULT_CHUNK, FetchStats, RangeFetcher, chunked
from .signing import MAX_SIGNATURE_BYTES, signature_name  # copied verbatim when the source has one

MAX_CHAIN = 1 << 20                 # manifests one walk may read (as a follower's plan, S12)
HEAD_ATTEMPTS = 32
DEFAULT_MISSING_WAIT = 60.0
_TMP = re.compile(r"arcfmt-mirror-([0-9]{1,10})-[0-9a-f]{8}\Z")


@dataclass
class MirrorResult:
    """One step made visible in the destination (its head moved to it, or it was already past)."""

    step: int
    manifest: str                  # xxh3-128 of the step's manifest
    objects_copied: int            # data objects written to the destination
    objects_present: int           # data objects the destination already held (a resumed run)
    bytes_copied: int              # bytes written to the destination (data objects and JSON objects)
    bytes_read: int                # bytes read from the source for this step
    seconds: float
    source_head: int               # the source head's step when this step was planned
    lag_seconds: float             # how long ago the source head was moved, when this step's head moved
    head_moved: bool               # the destination's head was moved to this step by this call
    signed: bool                   # the step's signature was copied (or was already there)

    @property
    def lag_steps(self) -> int:
        """Steps this one is behind the source's head when it was planned."""
        return self.source_head - self.step

    def as_dict(self) -> dict:
        """The fields and ``lag_steps`` as a JSON-ready dict."""
        return dict(asdict(self), lag_steps=self.lag_steps)


class Mirror:
    """Copies the stream at ``src`` into ``dst`` (any fsspec URLs; they may be different kinds of
    store, S3 → GCS), step by committed step; see the module docstring.

    ``src_options`` / ``dst_options``: storage options of each side (or ``src_fs`` / ``dst_fs``, a
    filesystem used as it is). ``chunk_size``: the largest range request; ``concurrency``: range
    requests in flight per data object; ``workers``: data objects copied at once (memory held:
    ``workers`` × ``concurrency`` × ``chunk_size``, 64 MiB by default; disk: the objects being
    staged). ``missing_wait``: seconds an object the source's chain names may stay missing (a source
    with asynchronous replication) before ``MissingError``. ``tmp_dir``: where data objects are staged
    (a private folder of this run is made there; the free space is checked before each object).
    ``progress``: called with one dict per event (``{"event": "step", ...}``, ``"object"``).
    """

    def __init__(self, src: str, dst: str, *, src_options: dict | None = None, dst_options: dict | None = None,
                 src_fs=None, dst_fs=None, chunk_size: int = DEFAULT_CHUNK, concurrency: int = 2, workers: int = 4,
                 retries: int = retry.DEFAULT_RETRIES, backoff: float = retry.DEFAULT_BACKOFF,
                 request_timeout: float | None = None, retry_time: float | None = None,
                 missing_wait: float = DEFAULT_MISSING_WAIT, tmp_dir: str | None = None, progress=None):
        self.src = Store(src, src_options, fs=src_fs, retries=retries, backoff=backoff,
                         request_timeout=request_timeout, retry_time=retry_time)
        self.dst = Store(dst, dst_options, fs=dst_fs, retries=retries, backoff=backoff,
                         request_timeout=request_timeout, retry_time=retry_time)
        if _same_place(self.src, self.dst):
            raise InputError(f"the source {src} and the destination {dst} are the same stream (or one holds the "
                             f"other); a mirror needs another bucket or folder")
        self.chunk_size = retry.check_count(chunk_size, "chunk_size", 1)
        self.concurrency = retry.check_count(concurrency, "concurrency", 1)
        self.missing_wait = retry.check_seconds(missing_wait, "missing_wait", finite=False)
        self.tmp_dir = os.path.abspath(tmp_dir if tmp_dir is not None else tempfile.gettempdir())
        self.progress = progress
        self.stats = FetchStats()          # data-object bytes read from the source (all steps)
        self.fetcher = RangeFetcher(self.src.fs, chunk_size=self.chunk_size, retries=retries, backoff=backoff,
                                    stats=self.stats, batch=self.concurrency, request_timeout=request_timeout,
                                    retry_time=retry_time)
        self.json_bytes_read = 0           # head, manifest, descriptor and signature bytes read from the source
        self.workers = retry.check_count(workers, "workers", 1)
        self._work: str | None = None
        self._cleaned = False
        self._lock = threading.Lock()
        self._reserved = 0                 # bytes of the objects being staged now (the free-space check)
        self._signs = False                # the source signs its steps (a signature was seen there)

    # ------------------------------------------------------------------------------ reading
    def _emit(self, **event) -> None:
        if self.progress is not None:
            self.progress(event)

    def source_head(self) -> Head | None:
        """The source's head, or None when nothing has been committed there yet."""
        raw = self.src.read(N.HEAD, MAX_HEAD_BYTES, missing_ok=True)
        if raw is None:
            return None
        self.json_bytes_read += len(raw)
        return parse_head(raw, f"{self.src.url}: {N.HEAD}")

    def head(self) -> Head | None:
        """The destination's head (None: none yet, or one that does not parse, which the next step
        replaces — as a committer replaces it, S8.2)."""
        raw = self.dst.read(N.HEAD, MAX_HEAD_BYTES, missing_ok=True)
        return None if raw is None else _parse_or_none(raw)

    def _waiting(self, what: str, wait: bool = True):
        """Yields while ``what`` may still appear (``missing_wait``), sleeping between; then ``MissingError``."""
        t0 = time.monotonic()
        delay = 0.05
        while True:
            yield
            left = (self.missing_wait if wait else 0) - (time.monotonic() - t0)
            if left <= 0:
                raise MissingError(f"{what} is missing from the source{self._waited()}, but the source's head "
                                   f"chain names it")
            time.sleep(min(delay, left))
            delay = min(2.0, delay * 2)

    def _waited(self) -> str:
        return f" (waited {self.missing_wait:g} s)" if self.missing_wait else ""

    def _src_json(self, name: str, limit: int, wait: bool = True) -> bytes:
        for _ in self._waiting(name, wait):
            raw = self.src.read(name, limit, missing_ok=True)
            if raw is not None:
                self.json_bytes_read += len(raw)
                return raw
        raise AssertionError("unreachable")  # pragma: no cover

    def _src_signature(self, name: str) -> bytes | None:
        """A step's signature, or None for an unsigned step. A source that signs (its head step is
        signed, or so was a step copied before) has every step signed: a missing signature there is
        not there *yet* (replication lag) and is waited for as a missing object is (S17.1 step 2.4)."""
        t0 = time.monotonic()
        try:
            raw = self._src_json(name, MAX_SIGNATURE_BYTES, wait=self._signs)
        except MissingError:
            # copied unsigned; the next step's signature decides again whether to wait (a source that
            # stopped signing costs one wait, not one per step for good)
            self._signs = False
            self._emit(event="unsigned", name=name, waited=round(time.monotonic() - t0, 3))
            return None
        self._signs = True
        return raw

    def _src_manifest(self, step: int, digest: str, wait: bool = True) -> Manifest:
        name = N.manifest_name(step)
        raw = self._src_json(name, MAX_MANIFEST_BYTES, wait)
        if digest128(raw) != digest:
            raise ChecksumError(f"source {name} does not hash to {digest}, the value its successor (or the head) "
                                f"holds")
        m = parse_manifest(raw, f"source {name}")
        check_own_name(m, name, f"source {name}")
        return m

    # ------------------------------------------------------------------------------ planning
    def plan(self) -> list:
        """The manifests to copy now, oldest first: back from the source head to the destination's
        step (same manifest hash), or — for a new mirror, or one whose step is not on the source's
        chain — to the latest keyframe step."""
        src_head = self.source_head()
        return [] if src_head is None else self._plan(src_head, self.head())

    def _plan(self, src_head: Head, dst_head: Head | None) -> list:
        if dst_head is not None and src_head.step <= dst_head.step:
            if src_head.step == dst_head.step and src_head.manifest != dst_head.manifest:
                raise ConflictError(f"the destination is at step {dst_head.step} with another manifest than the "
                                    f"source's: it is not a mirror of {self.src.url}")
            return []   # up to date (or a source replica that lags behind what was mirrored before)
        chain: list[Manifest] = []
        kf: int | None = None      # index in chain of the first (latest) step with keyframes walked
        fresh = dst_head is None
        step, digest = src_head.step, src_head.manifest
        while True:
            if dst_head is not None and not fresh:
                if step == dst_head.step and digest == dst_head.manifest:
                    break
                if step <= dst_head.step:
                    # the destination's step is not on this chain (a rewritten source): start from a keyframe
                    fresh = True
                    if kf is not None:
                        del chain[kf + 1:]
                        break
            if len(chain) >= MAX_CHAIN:
                raise LimitError(f"more than {MAX_CHAIN} manifests between the source's head and the destination's")
            try:
                m = self._src_manifest(step, digest, wait=kf is None)
            except MissingError:
                # a manifest missing once a keyframe was walked: older steps were pruned from the source
                # (S16, S9.5 step 1): start from the latest keyframe walked
                if kf is None:
                    raise
                del chain[kf + 1:]
                break
            chain.append(m)
            if m.keyframe and kf is None:
                kf = len(chain) - 1
            if fresh and m.keyframe:
                break
            if m.base_step is None or m.base_manifest is None:
                break            # a keyframe-only step: the chain starts here, nothing older is needed
            step, digest = m.base_step, m.base_manifest
        if not chain[-1].keyframe and (dst_head is None or fresh):
            raise MissingError(f"no keyframe is reachable from the source's head (step {src_head.step})")
        return list(reversed(chain))

    # ------------------------------------------------------------------------------ mirroring
    def sync(self, until: int | None = None) -> list:
        """Copy every step up to the source's current head (stop once the destination reaches ``until``).
        A source with no stream at all (no head, no steps: a typo'd URL) is ``MissingError``."""
        return list(self._run(_check_until(until), require=True))

    def follow(self, *, until: int | None = None, interval: float = 2.0, timeout: float | None = None,
               wait: bool = False) -> Iterator[MirrorResult]:
        """Yield a :class:`MirrorResult` per mirrored step, polling the source head every ``interval``
        seconds, until the destination reaches ``until`` (forever if None) or ``timeout`` seconds pass
        without a new step. ``wait``: where the source has no stream yet, wait for one (else
        ``MissingError``)."""
        interval = retry.check_seconds(interval, "interval")
        timeout = None if timeout is None else retry.check_seconds(timeout, "timeout", finite=False)
        until = _check_until(until)
        last = time.monotonic()
        first = True
        while True:
            for res in self._run(until, require=first and not wait):
                last = time.monotonic()
                yield res
            first = False
            h = self.head()
            if until is not None and h is not None and h.step >= until:
                return
            if timeout is not None and time.monotonic() - last > timeout:
                return
            time.sleep(interval)

    def _require_stream(self) -> None:
        """``MissingError`` unless something of a stream is at the source's root (asked only when it has
        no head: one shallow listing, so that a wrong URL is an error, not "nothing yet" forever)."""
        fs, root = self.src.fs, self.src.root
        try:
            fs.invalidate_cache(root)
        except Exception:  # noqa: BLE001 - only a cache
            pass
        found = self.src._call(lambda: fs.ls(root, detail=False), f"listing {self.src.url}", missing_ok=True)
        names = {str(p).rstrip("/").rsplit("/", 1)[-1] for p in found or ()}
        if not names & {N.HEAD, N.STEPS}:
            raise NoStreamError(f"no stream at {self.src.url}: no {N.HEAD} and no {N.STEPS}/ there (check the "
                               f"source URL)")

    def _run(self, until, require: bool = False):
        if not self._cleaned:
            self._cleaned = True
            _clean_stale(self.tmp_dir)     # staging left by runs that were killed
        read0: int | None = self.stats.bytes + self.json_bytes_read   # the heads and the plan: the first step's
        src_head = self.source_head()
        if src_head is None:
            if require:
                self._require_stream()
            return
        dst_head = self.head()
        if until is not None and dst_head is not None and dst_head.step >= until:
            return
        path = self._plan(src_head, dst_head)
        if not path:
            return
        if not self._signs:   # does the source sign its steps? its head step, or the last one copied, says
            self._signs = self.src.read(signature_name(src_head.step), MAX_SIGNATURE_BYTES,
                                        missing_ok=True) is not None or (
                dst_head is not None and self.dst.read(signature_name(dst_head.step), MAX_SIGNATURE_BYTES,
                                                       missing_ok=True) is not None)
        self._open_work()
        try:
            for m in path:
                res = self._copy_step(m, src_head, read0)
                read0 = None
                yield res
                if until is not None and m.step >= until:
                    return
        finally:
            self._close_work()

    def _copy_step(self, m: Manifest, src_head: Head, read0: int | None = None) -> MirrorResult:
        t0 = time.perf_counter()
        if read0 is None:
            read0 = self.stats.bytes + self.json_bytes_read
        # 1. data objects (every object the manifest names; each checked whole, and its tail), ``workers``
        # at a time; the first failure stops the step before anything else of it is written
        refs = [ref for s in m.shards for ref in (s.delta, s.keyframe) if ref is not None]
        done = _map(self._copy_if_missing, refs, self.workers)
        copied = sum(done)
        present = len(refs) - copied
        written = sum(ref.size for ref, c in zip(refs, done) if c)
        # 2. descriptors, each hashing to what the manifest says it was built from
        names = [N.descriptor_name(m.step, s.shard, m.num_shards) for s in m.shards]
        for s, name in zip(m.shards, names):
            raw = self._src_json(name, MAX_DESCRIPTOR_BYTES)
            if digest128(raw) != s.descriptor:
                raise ChecksumError(f"source {name} does not hash to {s.descriptor}, the descriptor hash of step "
                                    f"{m.step}'s manifest")
            d = parse_descriptor(raw, f"source {name}")
            check_own_name(d, name, f"source {name}")
            written += self._create(name, raw)
        # 3. the manifest (its hash was checked against its successor or the head while planning)
        written += self._create(N.manifest_name(m.step), m.raw)
        # 4. the step's signature, verbatim, if the source has one
        sig_name = signature_name(m.step)
        sig = self._src_signature(sig_name)
        if sig is not None:
            written += self._create(sig_name, sig)
        # 5. the head, forward only
        moved = self._advance_head(m)
        res = MirrorResult(m.step, m.digest, copied, present, written, self.stats.bytes + self.json_bytes_read - read0,
                           time.perf_counter() - t0, src_head.step, max(0.0, time.time() - src_head.time_ms / 1000),
                           moved, sig is not None)
        self._emit(event="step", **res.as_dict())
        return res

    def _create(self, name: str, data: bytes) -> int:
        """Conditional create; an object already there must hold exactly these bytes (`conflict`)."""
        if self.dst.create(name, data):
            return len(data)
        there = self.dst.read(name, len(data) + 1, missing_ok=True)
        if there != data:
            raise ConflictError(f"the destination already holds a different {name}: it is not a mirror of "
                                f"{self.src.url}")
        return 0

    def _advance_head(self, m: Manifest) -> bool:
        """Compare-and-swap the destination's head forward to ``m``, unless it is already there or past."""
        for attempt in range(HEAD_ATTEMPTS):
            raw, token = self.dst.read_versioned(N.HEAD, MAX_HEAD_BYTES)
            h = None if raw is None else _parse_or_none(raw)
            if h is not None and h.step >= m.step:
                if h.step == m.step and h.manifest != m.digest:
                    raise ConflictError(f"the destination's head names another manifest for step {m.step}")
                return False
            new = Head(m.step, m.digest, m.keyframe_step, int(time.time() * 1000))
            if self.dst.replace(N.HEAD, new.to_bytes(), token):
                return True
            time.sleep(random.uniform(0.005, 0.05) * (attempt + 1))
        raise ConflictError(f"could not move the destination's head to step {m.step} after {HEAD_ATTEMPTS} attempts")

    # ------------------------------------------------------------------------------ data objects
    def _dst_has(self, ref: ObjectRef) -> bool:
        """The destination holds ``ref`` already: exactly ``size`` bytes long with the manifest's tail
        hash (the name is the whole object's hash; a damaged one is written again)."""
        p = self.dst.path(ref.name)
        h = xxhash.xxh3_64()
        for s, e in chunked(ref.index_offset, ref.size + 1, self.chunk_size):
            what = f"checking {ref.name} in the destination"
            try:
                data = self.dst._call(lambda s=s, e=e, what=what: self.dst.adapter.read_one(
                    p, s, e, exact=False, timeout=self.dst.timeout_for(what), what=what), what, missing_ok=True)
            except TruncatedError:
                return False
            if data is None:
                return False
            if e == ref.size + 1:
                if len(data) != e - s - 1:
                    return False        # shorter or longer than the manifest says
            elif len(data) != e - s:
                return False
            h.update(data)
        return h.hexdigest() == ref.tail_xxh3_64

    def _copy_if_missing(self, ref: ObjectRef) -> bool:
        """Copy ``ref`` unless the destination holds it already; True if it was copied."""
        if self._dst_has(ref):
            return False
        self._copy_object(ref)
        self._emit(event="object", name=ref.name, bytes=ref.size)
        return True

    def _copy_object(self, ref: ObjectRef) -> None:
        """Range reads in chunks into a private temporary file, hashing as it goes (never the whole
        object in memory), then one upload; only bytes that hash to the manifest's values are sent.
        The free space is checked first, counting what the other workers have reserved."""
        assert self._work is not None
        with self._lock:
            free = shutil.disk_usage(self._work).free - self._reserved
            if ref.size > free:
                raise LimitError(f"{ref.name} is {ref.size} bytes; {self._work} has {max(0, free)} bytes free")
            self._reserved += ref.size
        local = os.path.join(self._work, ref.name.rsplit("/", 1)[-1])
        path = self.src.path(ref.name)
        try:
            for _ in self._waiting(ref.name):
                try:
                    self._fetch_to(ref, path, local)
                    break
                except MissingError:
                    continue
            self.dst.put_file(ref.name, local)
        finally:
            _unlink(local)
            with self._lock:
                self._reserved -= ref.size

    def _fetch_to(self, ref: ObjectRef, path: str, local: str) -> None:
        whole, tail = xxhash.xxh3_128(), xxhash.xxh3_64()
        window = self.chunk_size * self.concurrency
        fd = os.open(local, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as f:
            for b in range(0, ref.size, window):      # at most ``concurrency`` chunks in memory at once
                group = chunked(b, min(ref.size, b + window), self.chunk_size)
                for (s, e), data in zip(group, self.fetcher.fetch([(path, s, e, ref.name) for s, e in group])):
                    whole.update(data)
                    if e > ref.index_offset:
                        tail.update(memoryview(data)[max(0, ref.index_offset - s):])
                    f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if whole.hexdigest() != ref.xxh3_128:
            raise ChecksumError(f"source {ref.name} does not hash to {ref.xxh3_128}, the xxh3-128 its manifest "
                                f"states")
        if tail.hexdigest() != ref.tail_xxh3_64:
            raise ChecksumError(f"source {ref.name}: its index and trailer do not hash to the manifest's "
                                f"tail_xxh3_64")

    # ------------------------------------------------------------------------------ the private folder
    def _open_work(self) -> None:
        """A folder of this run's own under ``tmp_dir`` (mode 0700); folders that runs killed before
        they could remove theirs (their pid is gone) are removed first — only our own name pattern."""
        os.makedirs(self.tmp_dir, exist_ok=True)
        for _ in range(16):
            p = os.path.join(self.tmp_dir, f"arcfmt-mirror-{os.getpid()}-{os.urandom(4).hex()}")
            try:
                os.mkdir(p, 0o700)
            except FileExistsError:
                continue
            self._work = p
            return
        raise InputError(f"cannot make a private folder in {self.tmp_dir}")  # pragma: no cover

    def _close_work(self) -> None:
        if self._work is not None:
            shutil.rmtree(self._work, ignore_errors=True)
            self._work = None


# ------------------------------------------------------------------------------------ helpers

def _map(fn, items: list, workers: int) -> list:
    """``[fn(x) for x in items]`` on up to ``workers`` threads; the first error is raised once every
    started call has ended (so nothing is still writing when the caller goes on)."""
    if workers <= 1 or len(items) <= 1:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(max_workers=min(workers, len(items)), thread_name_prefix="arcfmt-mirror") as ex:
        futures = [ex.submit(fn, x) for x in items]
        errors = [f.exception() for f in futures]
    for e in errors:
        if e is not None:
            raise e
    return [f.result() for f in futures]


def _parse_or_none(raw) -> Head | None:
    try:
        return parse_head(raw)
    except ArcError:
        return None


def _check_until(until):
    return None if until is None else retry.check_count(until, "until")


def _same_place(a: Store, b: Store) -> bool:
    same_fs = type(a.fs) is type(b.fs) and (a.fs is b.fs or a.backend in ("local", "memory"))
    ra, rb = a.root.rstrip("/"), b.root.rstrip("/")
    if a.backend == "local" and same_fs:
        ra, rb = os.path.realpath(ra), os.path.realpath(rb)
    return same_fs and (ra == rb or rb.startswith(ra + "/") or ra.startswith(rb + "/"))


def _unlink(p: str) -> None:
    try:
        os.unlink(p)
    except FileNotFoundError:
        pass


def _clean_stale(tmp_dir: str) -> None:
    try:
        names = os.listdir(tmp_dir)
    except OSError:
        return
    for n in names:
        m = _TMP.match(n)
        if m is None:
            continue
        p = os.path.join(tmp_dir, n)
        try:
            st = os.lstat(p)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or _alive(int(m.group(1))):
            continue
        shutil.rmtree(p, ignore_errors=True)


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


__all__ = ["Mirror", "MirrorResult"]
