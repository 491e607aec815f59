"""Range reads of stream objects: coalescing, chunking, retries, a resumable spool, and the checks
of every answer a store sends.

``RangeFetcher.fetch`` takes many byte ranges of many objects and gets them concurrently through
the filesystem's adapter (:mod:`arcfmt.store.backends`: S3 and GCS, one asynchronous GET per range
on the filesystem's event loop; other filesystems, one ``fs.cat_ranges`` call per batch),
splitting every range into chunks of at most ``chunk_size`` bytes, retrying only the chunks that
failed with a transient error (capped exponential backoff with jitter, within the retry budget and
the caller's deadline), and — when a spool folder is given — keeping each finished chunk on disk so
that an interrupted download resumes without fetching it again. ``ObjectSource`` is the
``ByteSource`` (``size`` + ``read(offset, length)``) that ``arcfmt.DeltaReader`` reads from: it
serves what was prefetched and fetches any miss.

The answers (``_plan_answer``, ``_read_body``, ``_check_len``, ``_timed``; the adapters send the
requests and call these): an answer is never read further than the range asked for (a server that
ignores the ``Range`` header and streams an endless body costs at most the range's length), every
request has a total deadline (a server that trickles its answer is abandoned, a transient error),
and what comes back is exactly the range asked for: a ``200`` with the whole object or a ``206``
longer than asked is sliced when the slice is provably the asked bytes, and refused ("the store
answered …") otherwise; an object shorter than the range is ``TruncatedError``. Invalid arguments
(``chunk_size``, the retry budget, deadlines) are ``InputError``.
"""
from __future__ import annotations

import asyncio
import bisect
import os
import re
import stat
import threading
import time
import warnings
from dataclasses import asdict, dataclass

import xxhash

from ..errors import ArcError, TruncatedError
from . import retry
from .errors import MissingError, TransportError

DEFAULT_CHUNK = 8 << 20
DEFAULT_MAX_GAP = 1 << 20
DEFAULT_OVERHEAD = 0.04

MAX_SKIP = DEFAULT_CHUNK      # bytes of an answer before the asked offset that are read and dropped at most
WIRE_CONCURRENCY = 32         # requests in flight at once in one Backend.read_ranges call
_PIECE = 1 << 20              # bytes asked of a response body per read
_ERROR_BODY = 1 << 16         # bytes of an error answer's body read at most (GCS)
_MAX_INT = (1 << 63) - 1
_CONTENT_RANGE = re.compile(r"bytes ([0-9]{1,19})-([0-9]{1,19})/([0-9]{1,19}|\*)\Z")
_DIGITS = re.compile(r"[0-9]{1,19}\Z")


@dataclass
class FetchStats:
    """Counters of the range reads made so far (requests, bytes, retries, spool reuse)."""

    requests: int = 0       # range requests sent (one per chunk and attempt)
    bytes: int = 0          # bytes received from the store
    retries: int = 0        # chunk requests sent again after a transient error
    reused_chunks: int = 0  # chunks taken from the spool (an interrupted download resumed)
    reused_bytes: int = 0

    def as_dict(self) -> dict:
        """The counters as a dict."""
        return asdict(self)

    def minus(self, other: FetchStats) -> FetchStats:
        """The counters since ``other`` (an earlier copy): field by field ``self - other``."""
        return FetchStats(**{k: v - getattr(other, k) for k, v in asdict(self).items()})


def coalesce(ranges, *, max_gap: int = DEFAULT_MAX_GAP, overhead: float = DEFAULT_OVERHEAD) -> list:
    """Merge byte ranges ``(start, end)`` of one object into fewer requests.

    Overlapping and touching ranges always merge. Gaps between the rest are bridged smallest first
    while each is at most ``max_gap`` and all bridged gaps together stay within ``overhead`` × the
    bytes needed — so the bytes requested never exceed (1 + overhead) × the bytes needed.
    """
    rs = sorted((int(s), int(e)) for s, e in ranges if e > s)
    merged: list[list[int]] = []
    for s, e in rs:
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    needed = sum(e - s for s, e in merged)
    budget = overhead * needed
    gaps = sorted((merged[i + 1][0] - merged[i][1], i) for i in range(len(merged) - 1))
    bridge: set[int] = set()
    spent = 0
    for g, i in gaps:
        if g > max_gap or spent + g > budget:
            break
        spent += g
        bridge.add(i)
    out: list[list[int]] = []
    for i, (s, e) in enumerate(merged):
        if i - 1 in bridge:
            out[-1][1] = e
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def chunked(start: int, end: int, chunk: int) -> list:
    """``[start, end)`` cut into pieces of at most ``chunk`` bytes."""
    return [(s, min(end, s + chunk)) for s in range(start, end, chunk)]


# ================================================================================ answers
# What a store sent back is checked here, whichever backend asked (arcfmt.store.backends sends the
# requests): never more than the asked range is kept, and nothing that is not provably the asked bytes.

def _mismatch(what, start, end, answered: str) -> TransportError:
    return TransportError(f"{what}: the store answered {answered} for a range of {end - start} bytes at offset "
                          f"{start}", transient=True)


def _plan_answer(status, content_range, content_length, start, end, exact, what) -> tuple[int, int, bool]:
    """From an answer's status and headers: ``(skip, want, open_ended)`` — bytes to read and drop,
    bytes to keep, and whether the body's length is unknown (read to its end or to ``want``). Every
    number in the headers is checked before use; an answer that cannot hold exactly the asked bytes
    is refused (transient ``TransportError``), an object shorter than an exact range is
    ``TruncatedError``."""
    clen: int | None = None
    avail: int | None
    if content_length is not None:
        if not _DIGITS.match(str(content_length).strip()):
            raise TransportError(f"{what}: the store sent a malformed Content-Length {str(content_length)[:40]!r}",
                                 transient=True)
        clen = int(str(content_length).strip())
    if status == 206:
        m = _CONTENT_RANGE.match(str(content_range or "").strip())
        if m is None:
            raise TransportError(f"{what}: the store answered 206 with a missing or malformed Content-Range "
                                 f"{str(content_range)[:60]!r}", transient=True)
        a, b = int(m.group(1)), int(m.group(2))
        total = None if m.group(3) == "*" else int(m.group(3))
        if a > b or b > _MAX_INT or (total is not None and (b >= total or total > _MAX_INT)):
            raise TransportError(f"{what}: the store answered 206 with an impossible Content-Range {m.group(0)!r}",
                                 transient=True)
        first, avail = a, b - a + 1
        if clen is not None and clen != avail:
            raise TransportError(f"{what}: the store's Content-Length {clen} disagrees with its Content-Range "
                                 f"{m.group(0)!r}", transient=True)
        shown = f"bytes {a}..{b + 1}{'' if total is None else f' of {total}'} (HTTP 206)"
    elif status == 200:
        first, avail, total = 0, clen, clen
        shown = f"{'an endless or unsized body' if clen is None else f'{clen} bytes'} (HTTP 200: the whole object)"
    else:
        raise TransportError(f"{what}: the store answered HTTP {status} to a range request", transient=True)
    if exact and total is not None and total < end:
        raise TruncatedError(f"{what}: the object is {total} bytes, shorter than its manifest says (a read of "
                             f"bytes {start}..{end})")
    stop = end if total is None else min(end, total)
    skip = start - first
    if skip < 0 or skip > MAX_SKIP or (avail is not None and first + avail < stop):
        raise _mismatch(what, start, end, shown)
    return skip, max(0, stop - start), avail is None


async def _read_body(read, skip, want, open_ended, start, end, exact, what) -> bytes:
    """Read and drop ``skip`` bytes, then read ``want`` bytes: never more, whatever the body holds."""
    left = skip
    while left:
        chunk = await read(min(left, _PIECE))
        if not chunk:
            raise TransportError(f"{what}: the answer ended {left} bytes before the asked offset {start}",
                                 transient=not open_ended)
        left -= len(chunk)
    parts, got = [], 0
    while got < want:
        chunk = await read(min(want - got, _PIECE))
        if not chunk:
            break
        parts.append(chunk)
        got += len(chunk)
    data = parts[0] if len(parts) == 1 else b"".join(parts)
    if len(data) > want:                          # a body reader that returned more than asked
        data = data[:want]
    if len(data) < want:
        if open_ended:                            # the whole object ended here: it is this short
            if exact:
                raise TruncatedError(f"{what}: the object is {start + len(data)} bytes, shorter than its manifest "
                                     f"says (a read of bytes {start}..{end})")
            return bytes(data)
        raise TransportError(f"{what}: the answer ended after {len(data)} of {want} bytes", transient=True)
    return bytes(data)


def _empty_answer(start, end, exact, what) -> bytes:
    """A 416 (the range starts at or past the object's end)."""
    if exact or start > 0:
        raise TruncatedError(f"{what}: the object ends before offset {start}, shorter than its manifest says")
    return b""


async def _timed(coro, timeout, what, start, end):
    t0 = time.monotonic()
    try:
        return await asyncio.wait_for(coro, timeout)
    except TimeoutError as exc:
        if time.monotonic() - t0 < timeout * 0.99:
            raise                                   # the client's own socket timeout: transient as it is
        raise TransportError(f"{what}: no complete answer within {timeout:g} s (bytes {start}..{end})",
                             transient=True) from exc


def _check_len(data, start, end, exact, what):
    need = end - start
    n = len(data)
    if n > need:
        raise TransportError(f"{what}: the store answered {n} bytes for a range of {need} bytes at offset {start}",
                             transient=True)
    if exact and n < need:
        raise TruncatedError(f"{what}: got {n} bytes at offset {start}, expected {need}: the object is shorter "
                             f"than its manifest says")
    return data


# ================================================================================ the spool

# A spool entry is <key>.<start>-<end>.<xxh3-64 of its bytes>, <key> the object name with "/" as "__";
# one being written is .tmp-<pid>-<thread>-<entry>. Nothing else in the folder is read or removed.
_SPOOL_KEY = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*\Z")
_SPOOL_ENTRY = re.compile(r"(?P<key>[A-Za-z0-9_][A-Za-z0-9._-]*)\.(?P<start>0|[1-9][0-9]{0,18})-"
                          r"(?P<end>0|[1-9][0-9]{0,18})\.(?P<hash>[0-9a-f]{16})\Z")
_SPOOL_TMP = re.compile(r"\.tmp-[0-9]{1,20}-[0-9]{1,24}-(?P<entry>.+)\Z")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_ENTRY_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def spool_key(key: str) -> str | None:
    """The spool's form of an object key (``/`` → ``__``), or None for a key it does not hold."""
    k = key.replace("/", "__")
    return k if _SPOOL_KEY.match(k) else None


def spool_entry_key(name: str) -> str | None:
    """The object key of a spool entry or of one being written, or None for any other name."""
    t = _SPOOL_TMP.match(name)
    m = _SPOOL_ENTRY.match(t.group("entry") if t else name)
    return None if m is None else m.group("key").replace("__", "/")


def _unlink_at(name: str, dfd: int) -> None:
    try:
        os.unlink(name, dir_fd=dfd)
    except OSError:
        pass  # gone already, or not ours to remove: the spool is only a cache


def read_fd(fd: int, n: int) -> bytes:
    """At most ``n`` bytes from an open file, in reads of at most 8 MiB."""
    parts, got = [], 0
    while got < n:
        b = os.read(fd, min(n - got, 8 << 20))
        if not b:
            break
        parts.append(b)
        got += len(b)
    return b"".join(parts)


class RangeFetcher(retry.Deadlines):
    """Fetches byte ranges of objects on ``fs``; see the module docstring.

    ``retries``: a failed chunk is asked for at most ``retries`` more times; ``retry_time``: no retry
    starts later than this many seconds after the fetch began; ``request_timeout``: seconds one range
    request may take, answer included (S3, GCS); ``deadline`` / :meth:`time_limit`: the caller's
    limit for everything (a follower's per-step deadline). ``spool_dir``: the resumption spool, a
    folder of our own (a symlink, or a folder owned by another user, is not used)."""

    def __init__(self, fs, *, chunk_size: int = DEFAULT_CHUNK, retries: int = retry.DEFAULT_RETRIES,
                 backoff: float = retry.DEFAULT_BACKOFF, spool_dir: str | None = None, stats: FetchStats | None = None,
                 on_bytes=None, batch: int = 16, request_timeout: float | None = None,
                 retry_time: float | None = None):
        # imported here: the backends build on this module's answer checks
        from .backends import backend_for

        chunk_size = retry.check_count(chunk_size, "chunk_size", 1)
        batch = retry.check_count(batch, "batch (requests in flight)", None)
        self.fs = fs
        self.adapter = backend_for(fs)
        self.backend = self.adapter.name
        self.chunk_size = chunk_size
        self.retries, self.backoff = retry.check_budget(retries, backoff)
        self.spool_dir = spool_dir
        self.stats = stats if stats is not None else FetchStats()
        self.on_bytes = on_bytes
        self.batch = max(1, batch)
        self._lock = threading.Lock()
        self._init_deadlines(request_timeout, retry_time)
        self._refused: str | None = None

    # -- the spool folder: opened without following a symlink, used through its descriptor only
    def _spool_open(self, create: bool) -> int | None:
        if not self.spool_dir:
            return None
        try:
            fd = os.open(self.spool_dir, _DIR_FLAGS)
        except FileNotFoundError:
            if not create:
                return None
            try:
                parent = os.path.dirname(os.path.abspath(self.spool_dir))
                os.makedirs(parent, exist_ok=True)
                os.mkdir(self.spool_dir, 0o700)
            except FileExistsError:
                pass
            except OSError:
                return None
            try:
                fd = os.open(self.spool_dir, _DIR_FLAGS)
            except OSError as exc:
                return self._refuse(f"{type(exc).__name__}: {exc}")
        except OSError as exc:   # ELOOP or ENOTDIR: a symlink, or not a folder
            try:
                link = stat.S_ISLNK(os.lstat(self.spool_dir).st_mode)
            except OSError:
                link = False
            return self._refuse("it is a symbolic link" if link else f"{type(exc).__name__}: {exc}")
        st = os.fstat(fd)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            os.close(fd)
            return self._refuse("it is not a folder owned by this user")
        return fd

    def _refuse(self, why: str):
        if self._refused != why:
            self._refused = why
            warnings.warn(f"not using the resumption spool {self.spool_dir}: {why}", stacklevel=3)

    @staticmethod
    def _spool_index(dfd: int | None) -> dict:
        if dfd is None:
            return {}
        index: dict[tuple[str, int, int], str] = {}
        try:
            names = os.listdir(dfd)
        except OSError:
            return {}
        for n in names:
            m = _SPOOL_ENTRY.match(n)
            if m is not None:
                index.setdefault((m.group("key"), int(m.group("start")), int(m.group("end"))), n)
        return index

    def _spool_get(self, dfd, index, key, start, end):
        """A spooled chunk, used only if it is a regular file of exactly ``end - start`` bytes whose
        hash is in its name; anything else found under its name is removed (and fetched again)."""
        sk = spool_key(key)
        name = None if sk is None else index.get((sk, start, end))
        if name is None:
            return None
        want = end - start
        try:
            fd = os.open(name, _ENTRY_FLAGS, dir_fd=dfd)
        except OSError:
            _unlink_at(name, dfd)     # a symlink, or gone
            return None
        try:
            st = os.fstat(fd)
            data = read_fd(fd, want) if stat.S_ISREG(st.st_mode) and st.st_size == want else None
        except OSError:
            data = None
        finally:
            os.close(fd)
        if data is None or len(data) != want or xxhash.xxh3_64_hexdigest(data) != name.rsplit(".", 1)[1]:
            _unlink_at(name, dfd)     # damaged or not a chunk: fetch it again
            return None
        return data

    def _spool_put(self, dfd, key, start, end, data) -> None:
        sk = spool_key(key)
        if dfd is None or sk is None:
            return
        name = f"{sk}.{start}-{end}.{xxhash.xxh3_64_hexdigest(data)}"
        tmp = f".tmp-{os.getpid()}-{threading.get_ident()}-{name}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            try:
                fd = os.open(tmp, flags, 0o600, dir_fd=dfd)
            except FileExistsError:
                _unlink_at(tmp, dfd)  # left by a crashed run of this pid and thread id
                fd = os.open(tmp, flags, 0o600, dir_fd=dfd)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except OSError:
            _unlink_at(tmp, dfd)      # the spool is an optimisation: a full disk must not fail the download

    def forget(self, keep=lambda key: False) -> None:
        """Remove spooled chunks (and chunks being written) whose object key ``keep`` rejects (called
        after a step commits). Only the spool's own entries are ever removed."""
        dfd = self._spool_open(create=False)
        if dfd is None:
            return
        try:
            for n in os.listdir(dfd):
                key = spool_entry_key(n)
                if key is not None and not keep(key):
                    _unlink_at(n, dfd)
        except OSError:
            pass
        finally:
            os.close(dfd)

    # -- fetching
    def fetch(self, requests) -> list:
        """``requests``: ``(path, start, end, key)`` each; returns the bytes of each, in order.

        Each request is fetched in chunks of at most ``chunk_size`` (concurrently, with the others),
        and reassembled. ``key`` names the object in errors and in the spool.
        """
        pieces = []  # (request index, path, start, end, key)
        for i, (path, s, e, key) in enumerate(requests):
            for cs, ce in chunked(s, e, self.chunk_size) or [(s, s)]:
                pieces.append((i, path, cs, ce, key))
        got = self._fetch_pieces(pieces)
        parts: list[list[bytes]] = [[] for _ in requests]
        for p, data in zip(pieces, got):
            parts[p[0]].append(data)
        return [ps[0] if len(ps) == 1 else b"".join(ps) for ps in parts]

    def _fetch_pieces(self, pieces) -> list:
        spool = [self._spool_open(create=False), False]   # [folder descriptor, creation tried]
        try:
            return self._fetch_with(pieces, spool)
        finally:
            if spool[0] is not None:
                os.close(spool[0])

    def _put(self, spool, key, s, e, data) -> None:
        if not self.spool_dir:
            return
        if spool[0] is None and not spool[1]:
            spool[1] = True
            spool[0] = self._spool_open(create=True)
        self._spool_put(spool[0], key, s, e, data)

    def _fetch_with(self, pieces, spool) -> list:
        out: list[bytes | None] = [None] * len(pieces)
        index = self._spool_index(spool[0])
        pending = []
        for j, (_, _, s, e, key) in enumerate(pieces):
            data = self._spool_get(spool[0], index, key, s, e) if index else None
            if data is not None:
                out[j] = data
                with self._lock:
                    self.stats.reused_chunks += 1
                    self.stats.reused_bytes += len(data)
            elif e > s:
                pending.append(j)
            else:
                out[j] = b""
        started = time.monotonic()
        attempt = 0
        while pending:
            failed = []   # (piece, error) of the chunks a retry may cure
            for b in range(0, len(pending), self.batch):
                group = pending[b: b + self.batch]
                timeout = self.timeout_for(pieces[group[0]][4])
                with self._lock:
                    self.stats.requests += len(group)
                    if attempt:
                        self.stats.retries += len(group)
                res = self.adapter.read_ranges([(pieces[j][1], pieces[j][2], pieces[j][3], pieces[j][4])
                                                for j in group], exact=True, timeout=timeout, concurrency=len(group))
                fatal: ArcError | None = None   # raised after the good chunks of this batch are kept (and spooled)
                for j, r in zip(group, res):
                    _, _, s, e, key = pieces[j]
                    if isinstance(r, BaseException):
                        if fatal is not None:
                            continue
                        if isinstance(r, FileNotFoundError):
                            fatal = MissingError(f"{key}: the object is missing from the store")
                        elif retry.is_transient(r):
                            failed.append((j, r))
                        elif isinstance(r, ArcError):
                            fatal = r
                        else:
                            fatal = TransportError(f"{key}: bytes {s}..{e}: {type(r).__name__}: {r}"
                                                   f"{f' (after {attempt} retries)' if attempt else ''}")
                            fatal.__cause__ = r
                        continue
                    if len(r) != e - s:   # read_ranges guarantees it; never accept a wrong length
                        fatal = fatal or TransportError(f"{key}: got {len(r)} bytes for a range of {e - s} at "
                                                        f"offset {s}")
                        continue
                    out[j] = r
                    with self._lock:
                        self.stats.bytes += len(r)
                    self._put(spool, key, s, e, r)
                    if self.on_bytes is not None:
                        self.on_bytes(len(r))
                if fatal is not None:
                    raise fatal
            if failed:
                delay = retry.backoff_delay(attempt + 1, self.backoff)
                why = self.may_retry(attempt, self.retries, started, delay, what=pieces[failed[0][0]][4],
                                     error=failed[0][1])
                if why is not None:
                    j, r = failed[0]
                    _, _, s, e, key = pieces[j]
                    msg = str(r) if isinstance(r, ArcError) else f"{key}: bytes {s}..{e}: {type(r).__name__}: {r}"
                    raise TransportError(f"{msg}{f' ({why})' if why else ''}") from r
                attempt += 1
                time.sleep(delay)
            pending = [j for j, _ in failed]
        return out


class ObjectSource:
    """A ``ByteSource`` over one stream object: serves prefetched bytes, fetches any miss."""

    def __init__(self, fetcher: RangeFetcher, path: str, key: str, size: int):
        self.fetcher = fetcher
        self.path = path
        self.key = key
        self.size = size
        self._starts: list[int] = []   # sorted chunk starts
        self._chunks: list[tuple[int, int, memoryview]] = []   # (start, end, memoryview), parallel to _starts
        self._lock = threading.Lock()
        self.misses = 0

    def add(self, start: int, data) -> None:
        """Cache bytes at ``start``. Chunks inside the new one are dropped, and a chunk inside an
        existing one is not kept, so the chunk with the largest start <= p is the only one that can
        cover an offset p."""
        mv = memoryview(data).cast("B") if not isinstance(data, memoryview) else data
        end = start + len(mv)
        with self._lock:
            i = bisect.bisect_right(self._starts, start) - 1
            if i >= 0 and self._chunks[i][1] >= end:
                return
            j = bisect.bisect_left(self._starts, start)
            k = j
            while k < len(self._chunks) and self._chunks[k][0] < end:
                k += 1
            kept = [c for c in self._chunks[j:k] if c[1] > end]
            self._chunks[j:k] = [(start, end, mv)] + kept
            self._starts[j:k] = [start] + [c[0] for c in kept]

    def drop(self, lo: int, hi: int) -> None:
        """Forget the cached chunks that lie inside ``[lo, hi)`` (to bound memory)."""
        with self._lock:
            keep = [(i, c) for i, c in enumerate(self._chunks) if not (lo <= c[0] and c[1] <= hi)]
            self._chunks = [c for _, c in keep]
            self._starts = [c[0] for c in self._chunks]

    def prefetch(self, ranges) -> None:
        ranges = list(ranges)
        for (s, _), data in zip(ranges, self.fetcher.fetch([(self.path, s, e, self.key) for s, e in ranges])):
            self.add(s, data)

    def _pieces(self, offset, end):
        """The cached pieces covering [offset, end) in order (``None`` for a gap), and the gaps."""
        pieces: list[memoryview | None] = []
        gaps: list[tuple[int, int]] = []
        pos = offset
        with self._lock:
            while pos < end:
                i = bisect.bisect_right(self._starts, pos) - 1
                if i >= 0 and self._chunks[i][1] > pos:
                    s, e, mv = self._chunks[i]
                    take = min(e, end)
                    pieces.append(mv[pos - s: take - s])
                    pos = take
                else:
                    stop = min(self._starts[i + 1], end) if i + 1 < len(self._starts) else end
                    gaps.append((pos, stop))
                    pieces.append(None)
                    pos = stop
        return pieces, gaps

    def read(self, offset: int, length: int):
        if offset < 0 or length < 0 or offset + length > self.size:
            raise TruncatedError(f"{self.key}: read of {length} bytes at offset {offset} runs past the end of "
                                 f"the {self.size}-byte object")
        if length == 0:
            return b""
        pieces, gaps = self._pieces(offset, offset + length)
        if gaps:
            self.misses += len(gaps)
            self.prefetch(gaps)
            pieces, gaps = self._pieces(offset, offset + length)
        if len(pieces) == 1:
            return pieces[0]
        return b"".join(bytes(p) for p in pieces)
