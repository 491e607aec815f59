"""Range reads of stream objects over fsspec: coalescing, chunking, retries, a resumable spool.

``RangeFetcher.fetch`` takes many byte ranges of many objects and gets them with one concurrent
``fs.cat_ranges`` call per attempt (s3fs and gcsfs run the requests in parallel), splitting every
range into chunks of at most ``chunk_size`` bytes, retrying only the chunks that failed with a
transient error (capped exponential backoff with jitter), and — when a spool folder is given —
keeping each finished chunk on disk so that an interrupted download resumes without fetching it
again. ``ObjectSource`` is the ``ByteSource`` (``size`` + ``read(offset, length)``) that
``arcfmt.DeltaReader`` reads from: it serves what was prefetched and fetches any miss.
"""
from __future__ import annotations

import bisect
import os
import threading
import time
from dataclasses import asdict, dataclass

import xxhash

from ..errors import ArcError, TruncatedError
from . import retry
from .errors import MissingError, TransportError

DEFAULT_CHUNK = 8 << 20
DEFAULT_MAX_GAP = 1 << 20
DEFAULT_OVERHEAD = 0.04


@dataclass
class FetchStats:
    requests: int = 0       # range requests sent (one per chunk and attempt)
    bytes: int = 0          # bytes received from the store
    retries: int = 0        # chunk requests sent again after a transient error
    reused_chunks: int = 0  # chunks taken from the spool (an interrupted download resumed)
    reused_bytes: int = 0

    def as_dict(self) -> dict:
        return asdict(self)

    def minus(self, other: "FetchStats") -> "FetchStats":
        return FetchStats(**{k: v - getattr(other, k) for k, v in asdict(self).items()})


def coalesce(ranges, *, max_gap: int = DEFAULT_MAX_GAP, overhead: float = DEFAULT_OVERHEAD) -> list:
    """Merge byte ranges ``(start, end)`` of one object into fewer requests.

    Overlapping and touching ranges always merge. Gaps between the rest are bridged smallest first
    while each is at most ``max_gap`` and all bridged gaps together stay within ``overhead`` × the
    bytes needed — so the bytes requested never exceed (1 + overhead) × the bytes needed.
    """
    rs = sorted((int(s), int(e)) for s, e in ranges if e > s)
    merged = []
    for s, e in rs:
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    needed = sum(e - s for s, e in merged)
    budget = overhead * needed
    gaps = sorted((merged[i + 1][0] - merged[i][1], i) for i in range(len(merged) - 1))
    bridge, spent = set(), 0
    for g, i in gaps:
        if g > max_gap or spent + g > budget:
            break
        spent += g
        bridge.add(i)
    out = []
    for i, (s, e) in enumerate(merged):
        if i - 1 in bridge:
            out[-1][1] = e
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def chunked(start: int, end: int, chunk: int) -> list:
    """``[start, end)`` cut into pieces of at most ``chunk`` bytes."""
    return [(s, min(end, s + chunk)) for s in range(start, end, chunk)]


class RangeFetcher:
    """Fetches byte ranges of objects on ``fs``; see the module docstring."""

    def __init__(self, fs, *, chunk_size: int = DEFAULT_CHUNK, retries: int = 5, backoff: float = 0.2,
                 spool_dir: str | None = None, stats: FetchStats | None = None, on_bytes=None, batch: int = 16):
        if chunk_size < 1:
            raise ValueError("chunk_size must be positive")
        self.fs = fs
        self.chunk_size = chunk_size
        self.retries = retries
        self.backoff = backoff
        self.spool_dir = spool_dir
        self.stats = stats if stats is not None else FetchStats()
        self.on_bytes = on_bytes
        self.batch = batch
        self._lock = threading.Lock()

    # -- spool: one file per finished chunk, named <key>.<start>-<end>.<xxh3-64 of the bytes>
    @staticmethod
    def _spool_stem(key: str, start: int, end: int) -> str:
        return f"{key.replace('/', '__')}.{start}-{end}."

    def _spool_index(self) -> dict:
        if not self.spool_dir:
            return {}
        try:
            return {n.rsplit(".", 1)[0] + ".": n for n in os.listdir(self.spool_dir) if not n.startswith(".")}
        except FileNotFoundError:
            return {}

    def _spool_get(self, index, key, start, end):
        name = index.get(self._spool_stem(key, start, end))
        if name is None:
            return None
        p = os.path.join(self.spool_dir, name)
        try:
            with open(p, "rb") as f:
                data = f.read()
        except OSError:
            return None
        if len(data) != end - start or xxhash.xxh3_64_hexdigest(data) != name.rsplit(".", 1)[1]:
            _unlink(p)  # damaged: fetch it again
            return None
        return data

    def _spool_put(self, key, start, end, data) -> None:
        if not self.spool_dir:
            return
        name = self._spool_stem(key, start, end) + xxhash.xxh3_64_hexdigest(data)
        tmp = os.path.join(self.spool_dir, f".tmp-{os.getpid()}-{threading.get_ident()}-{name}")
        try:
            os.makedirs(self.spool_dir, exist_ok=True)
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, os.path.join(self.spool_dir, name))
        except OSError:
            _unlink(tmp)  # the spool is an optimisation: a full disk must not fail the download

    def forget(self, keep=lambda key: False) -> None:
        """Remove spooled chunks whose object key ``keep`` rejects (called after a step commits)."""
        if not self.spool_dir or not os.path.isdir(self.spool_dir):
            return
        for n in os.listdir(self.spool_dir):
            key = n.rsplit(".", 2)[0].replace("__", "/") if not n.startswith(".") else ""
            if not keep(key):
                _unlink(os.path.join(self.spool_dir, n))

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
        parts = [[] for _ in requests]
        for p, data in zip(pieces, got):
            parts[p[0]].append(data)
        return [ps[0] if len(ps) == 1 else b"".join(ps) for ps in parts]

    def _fetch_pieces(self, pieces) -> list:
        out = [None] * len(pieces)
        index = self._spool_index()
        pending = []
        for j, (_, _, s, e, key) in enumerate(pieces):
            data = self._spool_get(index, key, s, e) if index else None
            if data is not None:
                out[j] = data
                with self._lock:
                    self.stats.reused_chunks += 1
                    self.stats.reused_bytes += len(data)
            elif e > s:
                pending.append(j)
            else:
                out[j] = b""
        attempt = 0
        while pending:
            failed = []
            for b in range(0, len(pending), self.batch):
                group = pending[b: b + self.batch]
                with self._lock:
                    self.stats.requests += len(group)
                    if attempt:
                        self.stats.retries += len(group)
                try:
                    res = self.fs.cat_ranges([pieces[j][1] for j in group], [pieces[j][2] for j in group],
                                             [pieces[j][3] for j in group], on_error="return")
                except Exception as exc:  # noqa: BLE001 - a whole batch failed: classify like one range
                    res = [exc] * len(group)
                fatal = None   # raised after the good chunks of this batch are kept (and spooled)
                for j, r in zip(group, res):
                    _, path, s, e, key = pieces[j]
                    if isinstance(r, BaseException):
                        if fatal is not None:
                            continue
                        if isinstance(r, FileNotFoundError):
                            fatal = MissingError(f"{key}: the object is missing from the store")
                        elif isinstance(r, ArcError):
                            fatal = r
                        elif retry.is_transient(r) and attempt < self.retries:
                            failed.append(j)
                        else:
                            fatal = TransportError(f"{key}: bytes {s}..{e}: {type(r).__name__}: {r}"
                                                   f"{f' (after {attempt} retries)' if attempt else ''}")
                            fatal.__cause__ = r
                        continue
                    if len(r) != e - s:
                        fatal = fatal or TruncatedError(f"{key}: got {len(r)} bytes at offset {s}, expected "
                                                        f"{e - s}: the object is shorter than its manifest says")
                        continue
                    out[j] = r
                    with self._lock:
                        self.stats.bytes += len(r)
                    self._spool_put(key, s, e, r)
                    if self.on_bytes is not None:
                        self.on_bytes(len(r))
                if fatal is not None:
                    raise fatal
            pending = failed
            if pending:
                attempt += 1
                time.sleep(retry.backoff_delay(attempt, self.backoff))
        return out


class ObjectSource:
    """A ``ByteSource`` over one stream object: serves prefetched bytes, fetches any miss."""

    def __init__(self, fetcher: RangeFetcher, path: str, key: str, size: int):
        self.fetcher = fetcher
        self.path = path
        self.key = key
        self.size = size
        self._starts = []   # sorted chunk starts
        self._chunks = []   # (start, end, memoryview), parallel to _starts
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
        pieces, gaps = [], []
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


def _unlink(p):
    try:
        os.unlink(p)
    except FileNotFoundError:
        pass
