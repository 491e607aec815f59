"""The stores a stream lives on: one adapter class per kind of fsspec filesystem, and :class:`Store`.

A stream needs from its store bounded reads (whole small objects, byte ranges of large ones), plain
writes, and the two atomic operations of SPEC.md S8.1. Each :class:`Backend` subclass does them the
one way its store allows, and is chosen once per filesystem from a registry keyed by fsspec
protocol (and by the package a filesystem class comes from), as fsspec chooses its own classes:

- :class:`LocalBackend` (``file``, ``local``): create = a temporary file ``link()``-ed to the name
  (fails if it exists); compare-and-swap = ``flock`` + check + write-then-rename;
- :class:`MemoryBackend` (``memory``): check-then-write under a process-wide lock;
- :class:`S3Backend` (``s3``, ``s3a``, any s3fs class): ``PutObject`` with ``If-None-Match: *`` /
  ``If-Match: <ETag>``; a 412 in any of its shapes is exists / lost (SeaweedFS answers 412 without
  the ``Condition`` element, which s3fs turns into ``OSError(EINVAL)``);
- :class:`GcsBackend` (``gs``, ``gcs``, any gcsfs class): one multipart upload with
  ``ifGenerationMatch=0`` / ``=<generation>``;
- :class:`GenericBackend` (any other filesystem): check-then-write, *not* atomic (``Store`` warns).

A new kind of store is one subclass with those operations, decorated with :func:`register`.

Every read is bounded: at most the asked range of any answer is read, S3 and GCS requests each within
a deadline, and what came back is checked by :mod:`arcfmt.store.ranges` (``_plan_answer`` and
friends). Nothing here retries: :class:`Store` wraps every operation in the one retry layer,
:mod:`arcfmt.store.retry` (``retries``, ``retry_time``, the caller's deadline), and a filesystem it
builds from a URL has its client libraries' own retries turned off (:func:`open_fs`).

:class:`Store` is the stream's view of one root URL, used by the publisher and the follower; the
follower's :class:`arcfmt.store.ranges.RangeFetcher` reads data objects through the same adapters.
"""
from __future__ import annotations

import abc
import asyncio
import builtins
import errno
import fcntl
import json
import os
import re
import stat
import threading
import time
import uuid
import warnings
from dataclasses import dataclass

import fsspec

from ..errors import ArcError, InputError, LimitError, TruncatedError
from ..staging import DIR_NOFOLLOW, fsync_dir
from . import names as N
from . import retry
from .errors import MissingError, TransportError
from .objects import MAX_DESCRIPTOR_BYTES, MAX_HEAD_BYTES, MAX_MANIFEST_BYTES, digest128
from .ranges import (
    _DIGITS,
    _ERROR_BODY,
    WIRE_CONCURRENCY,
    _check_len,
    _empty_answer,
    _plan_answer,
    _read_body,
    _timed,
    read_fd,
)

_WARNED: set[str] = set()   # names of filesystem classes already warned about (once per process each)
_MAX_LIMIT = max(MAX_DESCRIPTOR_BYTES, MAX_HEAD_BYTES, MAX_MANIFEST_BYTES)


# ============================================================================ the registry

_BY_PROTOCOL: dict[str, type[Backend]] = {}   # fsspec protocol → Backend subclass
_BY_PACKAGE: dict[str, type[Backend]] = {}    # top-level package of a filesystem class → Backend subclass


def register(cls: type[Backend]) -> type[Backend]:
    """Make ``cls`` (a :class:`Backend` subclass) the adapter of every filesystem with one of its
    ``protocols``, or whose class comes from one of its ``packages``. Returns ``cls`` (a decorator)."""
    for p in cls.protocols:
        _BY_PROTOCOL[p] = cls
    for m in cls.packages:
        _BY_PACKAGE[m] = cls
    return cls


def backend_class(fs) -> type[Backend]:
    """The :class:`Backend` subclass for ``fs``: by its first registered protocol, else by the package
    its class comes from, else :class:`GenericBackend`."""
    protos = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
    for p in protos:
        if p in _BY_PROTOCOL:
            return _BY_PROTOCOL[p]
    return _BY_PACKAGE.get(type(fs).__module__.split(".")[0], GenericBackend)


def backend_for(fs) -> Backend:
    """The adapter for ``fs``."""
    return backend_class(fs)(fs)


# ============================================================================ the base class

class Backend(abc.ABC):
    """What the stream layer does on one fsspec filesystem ``fs``; a subclass per kind of store.

    ``path`` arguments are full paths on ``fs``; ``limits`` is the caller's :class:`retry.Deadlines`
    (``limits.timeout_for(what)``: seconds the next request may take). No method retries.

    - ``read_ranges(items, exact=, timeout=)``: ``(path, start, end, what)`` each → per item its
      bytes (never longer than ``end - start``; with ``exact`` exactly that long, a shorter object is
      ``TruncatedError``) or the exception that ended it;
    - ``read_one(path, start, end, exact=, timeout=, what=)``: one range; raises what ended it;
    - ``read_versioned(path, limit, limits, what)``: ``(at most limit + 1 bytes, version token)``;
    - ``create(path, data, limits)``: True if created, False if the object existed;
    - ``replace(path, data, token, limits)``: True if replaced, False if it is no longer at ``token``;
    - ``put_bytes(path, data)`` / ``put_file(path, local_path)``: plain writes of immutable objects.

    The base class has the plain fsspec reads and writes (``cat_ranges``, ``cat_file``,
    ``pipe_file``, ``put_file``); the versioned read and the conditional writes are each
    subclass's own (abstract here).
    """

    name = "base"           # Store.backend: "local", "memory", "s3", "gcs" or "generic"
    protocols: tuple = ()   # the fsspec protocols it serves
    packages: tuple = ()    # it also serves filesystem classes from these packages, whatever their protocol
    atomic = True           # create and replace are atomic against every other writer (else Store warns)

    def __init__(self, fs):
        self.fs = fs

    # -- opening a URL
    @classmethod
    def client_options(cls, storage_options: dict) -> dict:
        """The storage options to build a filesystem of ours with (the client's own retries off)."""
        return storage_options

    @classmethod  # noqa: B027 - an optional hook, a no-op by default
    def own_client(cls, fs, storage_options: dict) -> None:
        """Adjust a filesystem just built from ``client_options``."""

    # -- reads
    def _check_object(self, path, start, end, exact, what) -> None:  # noqa: B027 - an optional hook, a no-op by default
        """Called before a range is read (local files: it must be a regular file)."""

    def read_ranges(self, items, *, exact: bool, timeout: float, concurrency: int = WIRE_CONCURRENCY) -> list:
        items = list(items)
        if not items:
            return []
        out: list = [None] * len(items)
        todo = []
        for i, (p, s, e, w) in enumerate(items):
            try:
                self._check_object(p, s, e, exact, w)
            except Exception as exc:  # noqa: BLE001 - reported for this item
                out[i] = exc
                continue
            todo.append(i)
        if todo:
            try:
                res = self.fs.cat_ranges([items[i][0] for i in todo], [items[i][1] for i in todo],
                                         [items[i][2] for i in todo], on_error="return")
            except Exception as exc:  # noqa: BLE001 - a whole batch failed: each item failed so
                res = [exc] * len(todo)
            for i, r in zip(todo, res):
                if not isinstance(r, BaseException):
                    _, s, e, w = items[i]
                    try:
                        r = _check_len(r, s, e, exact, w)
                    except ArcError as exc:
                        r = exc
                out[i] = r
        return out

    def read_one(self, path, start, end, *, exact: bool, timeout: float, what: str):
        self._check_object(path, start, end, exact, what)
        return _check_len(self.fs.cat_file(path, start=start, end=end), start, end, exact, what)

    @abc.abstractmethod
    def read_versioned(self, path, limit, limits, what):
        ...

    # -- writes
    def put_bytes(self, path, data) -> None:
        self.fs.pipe_file(path, data)

    def put_file(self, path, local_path) -> None:
        self.fs.put_file(local_path, path)

    @abc.abstractmethod
    def create(self, path, data, limits) -> bool:
        ...

    @abc.abstractmethod
    def replace(self, path, data, token, limits) -> bool:
        ...

    # -- listing and deletion (retention, SPEC.md S16)
    def list(self, path: str, limit: int) -> builtins.list:
        """``(full path, size, mtime or None, regular file?)`` for every object below ``path`` (a
        missing folder: none); more than ``limit`` objects is ``LimitError``."""
        self.fs.invalidate_cache(path)
        found = self.fs.find(path, detail=True, withdirs=False)
        if len(found) > limit:
            raise LimitError(f"more than {limit} objects under {path}")
        out = []
        for p, info in found.items():
            size = info.get("size")
            if isinstance(size, bool) or not isinstance(size, int) or size < 0:
                size = 0
            out.append((p, size, _mtime(info), info.get("type", "file") == "file"))
        return out

    def remove_empty_folders(self, path: str, doomed) -> None:
        """Remove the empty folders directly in ``path`` whose names ``doomed(name)`` accepts (object
        stores have no folders: nothing)."""
        return

    def delete(self, paths: builtins.list, root: str | None = None) -> None:
        """Remove each object; one that is already gone is fine. In any order (call again for an order).
        ``root``: the stream's folder, below which nothing is followed (local stores)."""
        for p in paths:
            try:
                self.fs.rm_file(p)
            except FileNotFoundError:
                pass
            finally:
                self.fs.invalidate_cache(p)


def _mtime(info: dict) -> float | None:
    """Seconds since the epoch from an fsspec ``info`` dict, whatever the filesystem calls it."""
    import datetime as dt

    for key in ("LastModified", "mtime", "updated", "created", "timeCreated"):
        v = info.get(key)
        if isinstance(v, dt.datetime):
            return (v if v.tzinfo else v.replace(tzinfo=dt.UTC)).timestamp()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < 1e11:
            return float(v)
        if isinstance(v, str) and len(v) <= 64:
            try:
                t = dt.datetime.fromisoformat(v.replace("Z", "+00:00"))
            except ValueError:
                continue
            return (t if t.tzinfo else t.replace(tzinfo=dt.UTC)).timestamp()
    return None


# ------------------------------------------------------------------- versions by content

def _token(limit: int, data) -> str:
    """The version of a local or generic object: its first ``limit + 1`` bytes' hash, with ``limit``."""
    return f"{limit}:{digest128(data)}"


def _token_limit(token) -> int | None:
    lim, sep, _ = str(token).partition(":")
    if not sep or not lim.isdigit() or int(lim) > _MAX_LIMIT:
        return None
    return int(lim)


# ============================================================================ any fsspec filesystem

class GenericBackend(Backend):
    """Any other fsspec filesystem (the registry's fallback, registered for no protocol):
    check-then-write, *not* atomic — two racing publishers can both pass the check (``Store`` warns
    once per filesystem class). Versions are content hashes."""

    name = "generic"
    atomic = False

    def read_versioned(self, path, limit, limits, what):
        data = self.read_one(path, 0, limit + 1, exact=False, timeout=limits.timeout_for(what), what=what)
        return data, _token(limit, data)

    def create(self, path, data, limits) -> bool:
        if self.fs.exists(path):
            return False
        self.fs.pipe_file(path, bytes(data))
        return True

    def replace(self, path, data, token, limits) -> bool:
        limit = _token_limit(token)
        if limit is None:
            return False
        try:
            current = _token(limit, self.fs.cat_file(path, start=0, end=limit + 1))
        except FileNotFoundError:
            current = None
        if current != token:
            return False
        self.fs.pipe_file(path, bytes(data))
        return True


# ============================================================================ memory:// (one process)

_MEMORY_LOCK = threading.Lock()


@register
class MemoryBackend(GenericBackend):
    """fsspec's ``memory://``: the generic check-then-write, made atomic (within one process, the
    only place a memory filesystem exists) by a process-wide lock."""

    name = "memory"
    protocols = ("memory",)
    atomic = True

    def read_versioned(self, path, limit, limits, what):
        with _MEMORY_LOCK:
            return super().read_versioned(path, limit, limits, what)

    def create(self, path, data, limits) -> bool:
        with _MEMORY_LOCK:
            return super().create(path, data, limits)

    def replace(self, path, data, token, limits) -> bool:
        with _MEMORY_LOCK:
            return super().replace(path, data, token, limits)


# ============================================================================ local files

@register
class LocalBackend(Backend):
    """A POSIX folder (SPEC.md S8.1): create = write a temporary file, ``fsync``, ``link()`` it to the
    name (``EEXIST``: it exists); compare-and-swap = under an exclusive ``flock`` of a lock file
    beside the object, versioned read, compare, write-then-rename. Versions are content hashes.
    Every object read must be a regular file (never a FIFO or a device)."""

    name = "local"
    protocols = ("file", "local")

    def _check_object(self, path, start, end, exact, what) -> None:
        _local_check(path, start, end, exact, what)

    def put_bytes(self, path, data) -> None:
        _local_write(path, data)

    def put_file(self, path, local_path) -> None:
        with open(local_path, "rb") as src:
            _local_write(path, src)

    def read_versioned(self, path, limit, limits, what):
        data = _local_read(path, limit + 1, what)
        return data, _token(limit, data)

    def create(self, path, data, limits) -> bool:
        return _local_create(path, data)

    def replace(self, path, data, token, limits) -> bool:
        limit = _token_limit(token)
        if limit is None:
            return False
        lock = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.lock")
        with open(lock, "a+b") as lf:
            fcntl.flock(lf, fcntl.LOCK_EX)
            try:
                try:
                    current = _token(limit, _local_read(path, limit + 1, path))
                except FileNotFoundError:
                    current = None
                if current != token:
                    return False
                _local_write(path, data)
                return True
            finally:
                fcntl.flock(lf, fcntl.LOCK_UN)


    def list(self, path: str, limit: int) -> builtins.list:
        """A walk that never follows a symbolic link: every folder is opened ``O_NOFOLLOW`` and read
        through its descriptor; a link (or any other non-regular entry) is listed, never entered."""
        out: builtins.list = []
        try:
            fd = os.open(path, DIR_NOFOLLOW)
        except FileNotFoundError:
            return out
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise TransportError(f"listing {path}: it is not a folder (a symbolic link?)") from None
            raise
        _local_walk(fd, path, out, limit, 0, [0])
        return out

    def delete(self, paths: builtins.list, root: str | None = None) -> None:
        for p in paths:
            _local_delete(p, root)

    def remove_empty_folders(self, path: str, doomed) -> None:
        """``rmdir`` through ``path`` opened ``O_NOFOLLOW``: only an empty real folder goes (a link, a
        file or a folder with anything in it stays)."""
        try:
            fd = os.open(path, DIR_NOFOLLOW)
        except OSError:
            return
        try:
            with os.scandir(fd) as it:
                names = [e.name for e in it if e.is_dir(follow_symlinks=False) and doomed(e.name)]
            for name in names:
                try:
                    os.rmdir(name, dir_fd=fd)
                except OSError:
                    pass          # not empty (or gone): left alone
        finally:
            os.close(fd)


_MAX_WALK_DEPTH = 8


def _local_walk(fd: int, path: str, out: list, limit: int, depth: int, folders: list) -> None:
    """List the folder open at ``fd`` (closed here) into ``out``, descending into real folders only.
    Folders entered count too (``folders[0]``, at most ``limit`` of them), and both bounds are checked
    as each entry is read: a million empty folders, or one folder of millions of entries, is `limit`
    after ``limit`` of them, not a walk (and a list) of all."""
    try:
        with os.scandir(fd) as it:
            for e in it:
                full = f"{path}/{e.name}"
                try:
                    st = e.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue          # removed since the folder was read (a temporary file renamed, say)
                if stat.S_ISDIR(st.st_mode):
                    if depth + 1 >= _MAX_WALK_DEPTH:
                        continue
                    folders[0] += 1
                    if folders[0] > limit:
                        raise LimitError(f"more than {limit} folders under {path}")
                    try:
                        sub = os.open(e.name, DIR_NOFOLLOW, dir_fd=fd)
                    except (FileNotFoundError, NotADirectoryError):
                        continue      # replaced meanwhile (by a link, say): not entered
                    except OSError as exc:
                        if exc.errno == errno.ELOOP:
                            continue
                        raise
                    _local_walk(sub, full, out, limit, depth + 1, folders)
                else:
                    out.append((full, st.st_size if stat.S_ISREG(st.st_mode) else 0, st.st_mtime,
                                stat.S_ISREG(st.st_mode)))
                if len(out) > limit:
                    raise LimitError(f"more than {limit} objects under {path}")
    finally:
        os.close(fd)


def _local_delete(p: str, root: str | None = None) -> None:
    """Unlink ``p`` if it is a regular file reached without following a link — below ``root`` (the
    stream's folder, given by the user) every folder on the way is opened ``O_NOFOLLOW`` relative to
    the one before, so a folder swapped for a link at any depth is never entered; then remove ``p``'s
    folder if that left it empty. Anything else — a link, a folder, a FIFO — is left alone."""
    if root and p.startswith(root.rstrip("/") + "/"):
        top, parts = root, p[len(root.rstrip("/")) + 1:].split("/")
    else:
        top, parts = os.path.dirname(os.path.dirname(p)) or ".", p.split("/")[-2:]
    if len(parts) < 2 or any(x in ("", ".", "..") for x in parts):
        return
    fds: list[int] = []
    try:
        try:
            fds.append(os.open(top, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))
            for part in parts[:-1]:
                fds.append(os.open(part, DIR_NOFOLLOW, dir_fd=fds[-1]))
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR):
                return
            raise
        fd, name = fds[-1], parts[-1]
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            return
        if not stat.S_ISREG(st.st_mode):
            return
        try:
            _local_unlink_at(name, fd)
        except FileNotFoundError:
            return
        fsync_dir_fd(fd)
        try:
            os.rmdir(parts[-2], dir_fd=fds[-2])     # only an empty folder: ENOTEMPTY otherwise
        except OSError:
            pass
    finally:
        for fd in reversed(fds):
            os.close(fd)


def _local_unlink_at(name: str, dir_fd: int) -> None:
    os.unlink(name, dir_fd=dir_fd)


def fsync_dir_fd(fd: int) -> None:
    try:
        os.fsync(fd)
    except OSError:
        pass


def _local_check(path, start, end, exact, what) -> None:
    """A local stream object must be a regular file (a FIFO or a device would block or never end), at
    least ``end`` bytes long for an exact read."""
    st = os.stat(path)
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(errno.EISDIR, "is a directory", path)
    if not stat.S_ISREG(st.st_mode):
        raise TransportError(f"{what}: {path} is not a regular file")
    if exact and st.st_size < end:
        raise TruncatedError(f"{what}: the object is {st.st_size} bytes, shorter than its manifest says (a read "
                             f"of bytes {start}..{end})")


def _local_read(p: str, n: int, what: str) -> bytes:
    """At most ``n`` bytes of a local object, which must be a regular file (never a FIFO or device:
    opened non-blocking and checked before it is read)."""
    fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, "is a directory", p)
        if not stat.S_ISREG(st.st_mode):
            raise TransportError(f"{what}: {p} is not a regular file")
        return read_fd(fd, n)
    finally:
        os.close(fd)


def _tmp_beside(p: str) -> str:
    return os.path.join(os.path.dirname(p), f".{os.path.basename(p)}.tmp-{os.getpid()}-{uuid.uuid4().hex[:12]}")


def _write_tmp(p: str, data) -> str:
    os.makedirs(os.path.dirname(p), exist_ok=True)
    tmp = _tmp_beside(p)
    with open(tmp, "wb") as f:
        if hasattr(data, "read"):
            while chunk := data.read(8 << 20):
                f.write(chunk)
        else:
            f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return tmp


def _local_write(p: str, data) -> None:
    """Write-then-rename: readers see the old object or the whole new one."""
    tmp = _write_tmp(p, data)
    try:
        os.replace(tmp, p)
    except BaseException:
        _unlink(tmp)
        raise
    fsync_dir(os.path.dirname(p))


def _local_create(p: str, data) -> bool:
    """Write a temporary file, then hard-link it to the name: atomic, and fails if the name exists."""
    tmp = _write_tmp(p, data)
    try:
        os.link(tmp, p)
    except FileExistsError:
        return False
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV):
            raise
        # No hard links here: O_EXCL claims the name (readers may see it being filled for a moment).
        try:
            fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "wb") as f:
            with open(tmp, "rb") as src:
                f.write(src.read())
            f.flush()
            os.fsync(f.fileno())
    finally:
        _unlink(tmp)
    fsync_dir(os.path.dirname(p))
    return True


def _unlink(p):
    try:
        os.unlink(p)
    except FileNotFoundError:
        pass


# ============================================================================ S3 and GCS

class _HttpBackend(Backend):
    """An asynchronous HTTP filesystem (s3fs, gcsfs): every range is one GET of our own on the
    filesystem's event loop (``_get``), run concurrently and each within its deadline; the answer is
    checked by :mod:`arcfmt.store.ranges`. Conditional writes are single requests, each within
    ``limits.timeout_for``."""

    @abc.abstractmethod
    async def _get(self, path, start, end, exact, what, versioned=False):
        ...

    def _run(self, coro_fn, *args, timeout=None, **kw):
        """``coro_fn(*args, **kw)`` on the filesystem's loop, from this thread."""
        from fsspec.asyn import sync

        return sync(self.fs.loop, coro_fn, *args, timeout=timeout, **kw)

    def read_ranges(self, items, *, exact: bool, timeout: float, concurrency: int = WIRE_CONCURRENCY) -> list:
        items = list(items)
        if not items:
            return []

        async def run():
            sem = asyncio.Semaphore(max(1, concurrency))

            async def one(p, s, e, w):
                if e <= s:
                    return b""
                async with sem:
                    return await _timed(self._get(p, s, e, exact, w), timeout, w, s, e)

            return await asyncio.gather(*(one(*it) for it in items), return_exceptions=True)

        return list(self._run(run))

    def _read(self, path, start, end, *, exact, timeout, what, versioned=False):
        async def run():
            return await _timed(self._get(path, start, end, exact, what, versioned), timeout, what, start, end)

        return self._run(run)

    def read_one(self, path, start, end, *, exact: bool, timeout: float, what: str):
        return self._read(path, start, end, exact=exact, timeout=timeout, what=what)

    def delete(self, paths: builtins.list, root: str | None = None) -> None:
        """Concurrent DELETEs on the filesystem's loop; an object already gone is fine (``root``: unused,
        object stores have no links)."""
        async def run():
            sem = asyncio.Semaphore(WIRE_CONCURRENCY)

            async def one(p):
                async with sem:
                    try:
                        await self.fs._rm_file(p)
                    except FileNotFoundError:
                        pass
                    finally:
                        self.fs.invalidate_cache(p)

            res = await asyncio.gather(*(one(p) for p in paths), return_exceptions=True)
            for r in res:
                if isinstance(r, BaseException):
                    raise r

        if paths:
            self._run(run)

    def read_versioned(self, path, limit, limits, what):
        """``(bytes, ETag or generation)``, from the same one GET."""
        return self._read(path, 0, limit + 1, exact=False, timeout=limits.timeout_for(what), what=what,
                          versioned=True)


def _precondition_failed(exc: BaseException) -> bool:
    """A 412 from S3 in any of the shapes s3fs gives it (FileExistsError, or EINVAL + ClientError)."""
    if isinstance(exc, FileExistsError):
        return True
    cause = exc.__cause__
    resp = getattr(cause, "response", None)
    if isinstance(resp, dict):
        err = resp.get("Error") or {}
        meta = resp.get("ResponseMetadata") or {}
        if err.get("Code") in ("PreconditionFailed", "412") or meta.get("HTTPStatusCode") == 412:
            return True
    return isinstance(exc, OSError) and exc.errno == errno.EINVAL and "pre-condition" in str(exc).lower()


def _is_invalid_range(exc: BaseException) -> bool:
    """A 416 from S3 (the range starts at or past the object's end), as s3fs raises it."""
    for e in (exc, exc.__cause__):
        resp = getattr(e, "response", None)
        if isinstance(resp, dict):
            err = resp.get("Error") or {}
            meta = resp.get("ResponseMetadata") or {}
            if err.get("Code") in ("InvalidRange", "416") or meta.get("HTTPStatusCode") == 416:
                return True
    return False


@register
class S3Backend(_HttpBackend):
    """S3 and compatible servers through s3fs: ranged ``GetObject`` (the ``ETag`` is the version);
    create = ``PutObject`` with ``If-None-Match: *``, compare-and-swap = ``PutObject`` with
    ``If-Match: <ETag>``; a 412 in any shape s3fs gives it (:func:`_precondition_failed`) is
    exists / lost."""

    name = "s3"
    protocols = ("s3", "s3a")
    packages = ("s3fs",)

    @classmethod
    def client_options(cls, storage_options: dict) -> dict:
        """botocore ``retries={"total_max_attempts": 1}`` unless ``config_kwargs["retries"]`` is set,
        and an instance of our own (``skip_instance_cache``) so that :meth:`own_client` may set it."""
        so = dict(storage_options)
        cfg = so.get("config_kwargs") or {}
        if isinstance(cfg, dict):           # anything else: s3fs says what is wrong with it
            cfg = dict(cfg)
            cfg.setdefault("retries", {"total_max_attempts": 1})
            so["config_kwargs"] = cfg
        so.setdefault("skip_instance_cache", True)
        return so

    @classmethod
    def own_client(cls, fs, storage_options: dict) -> None:
        """s3fs's own retries = 1 on an instance of our own."""
        if storage_options["skip_instance_cache"] and hasattr(fs, "retries"):
            fs.retries = 1

    async def _get(self, path, start, end, exact, what, versioned=False):
        fs = self.fs
        bucket, key, vers = fs.split_path(path)
        kw = {"VersionId": vers} if vers else {}
        try:
            resp = await fs._call_s3("get_object", Bucket=bucket, Key=key, Range=f"bytes={start}-{end - 1}", **kw)
        except OSError as exc:
            if not isinstance(exc, FileNotFoundError) and _is_invalid_range(exc):
                data = _empty_answer(start, end, exact, what)
                return (data, None) if versioned else data
            raise
        body = resp["Body"]
        try:
            meta = resp.get("ResponseMetadata") or {}
            hdrs = {str(k).lower(): v for k, v in (meta.get("HTTPHeaders") or {}).items()}
            plan = _plan_answer(meta.get("HTTPStatusCode"), hdrs.get("content-range"), hdrs.get("content-length"),
                                start, end, exact, what)
            data = await _read_body(body.read, *plan, start, end, exact, what)
        finally:
            body.close()
        if versioned:
            etag = resp.get("ETag")
            if not isinstance(etag, str) or not etag:
                raise TransportError(f"{what}: the store sent no ETag", transient=False)
            return data, etag
        return data

    def _conditional_put(self, path, data, limits, **condition) -> bool:
        """One conditional PUT: True when it was stored, False when its precondition failed (for
        If-Match, also when the object is gone)."""
        try:
            self._run(self.fs._pipe_file, path, data, timeout=limits.timeout_for(f"writing {path}"), **condition)
            return True
        except FileNotFoundError:
            if "IfMatch" in condition:
                return False
            raise
        except OSError as exc:
            if _precondition_failed(exc):
                return False
            raise
        finally:
            self.fs.invalidate_cache(path)

    def create(self, path, data, limits) -> bool:
        return self._conditional_put(path, data, limits, mode="create")

    def replace(self, path, data, token, limits) -> bool:
        return self._conditional_put(path, data, limits, IfMatch=token)


@register
class GcsBackend(_HttpBackend):
    """Google Cloud Storage (and fake-gcs-server) through gcsfs: ranged media GET (the
    ``x-goog-generation`` header is the version); create and compare-and-swap = one multipart upload
    with ``ifGenerationMatch=0`` / ``=<generation>`` (GCS checks preconditions on single-request
    uploads); 412 (or 404 on a swap: the object is gone) is exists / lost. Requests go out on
    gcsfs's session directly, so that gcsfs's own retries do not add to ours."""

    name = "gcs"
    protocols = ("gs", "gcs")
    packages = ("gcsfs",)

    async def _get(self, path, start, end, exact, what, versioned=False):
        from gcsfs.retry import validate_response

        fs = self.fs
        await fs._set_session()
        headers = fs._get_headers({"Range": f"bytes={start}-{end - 1}"})
        async with fs.session.request("GET", fs.url(path), params=fs._get_params({}), headers=headers,
                                      timeout=fs.requests_timeout) as r:
            try:
                if r.status == 416:
                    data = _empty_answer(start, end, exact, what)
                elif r.status >= 300:
                    content = await r.content.read(_ERROR_BODY)
                    validate_response(r.status, content, path)
                    raise TransportError(f"{what}: the store answered HTTP {r.status}",
                                         transient=r.status in retry._RETRY_HTTP)
                else:
                    plan = _plan_answer(r.status, r.headers.get("Content-Range"), r.headers.get("Content-Length"),
                                        start, end, exact, what)
                    data = await _read_body(r.content.read, *plan, start, end, exact, what)
                gen = r.headers.get("x-goog-generation")
            finally:
                r.close()
        if versioned:
            if gen is None or not _DIGITS.match(str(gen)):
                raise TransportError(f"{what}: the server sent no x-goog-generation header", transient=False)
            return data, str(gen)
        return data

    def create(self, path, data, limits) -> bool:
        return self._upload(path, data, "0", limits)

    def replace(self, path, data, token, limits) -> bool:
        if not str(token).isdigit():
            return False
        return self._upload(path, data, str(token), limits)

    def _upload(self, p, data, generation: str, limits) -> bool:
        """One multipart upload with ``ifGenerationMatch``: True when stored, False on 412 (or 404:
        the object is gone)."""
        fs = self.fs
        bucket, key, _ = fs.split_path(p)
        meta = json.dumps({"name": key})
        body = (f"--==0==\nContent-Type: application/json; charset=UTF-8\n\n{meta}\n--==0==\n"
                f"Content-Type: application/octet-stream\n\n").encode() + bytes(data) + b"\n--==0==--"

        async def upload():
            from urllib.parse import quote

            from gcsfs.retry import validate_response

            await fs._set_session()
            url = f"{fs._location}/upload/storage/v1/b/{quote(bucket)}/o"
            params = fs._get_params({"uploadType": "multipart", "ifGenerationMatch": generation})
            headers = fs._get_headers({"Content-Type": 'multipart/related; boundary="==0=="'})
            async with fs.session.request("POST", url, params=params, headers=headers, data=body,
                                          timeout=fs.requests_timeout) as r:
                try:
                    content = await r.content.read(_ERROR_BODY)
                    if r.status == 412 or (r.status == 404 and generation != "0"):
                        return False
                    if r.status >= 300:
                        validate_response(r.status, content, url)
                        raise TransportError(f"writing {p}: the store answered HTTP {r.status}",
                                             transient=r.status in retry._RETRY_HTTP)
                    return True
                finally:
                    r.close()

        try:
            return self._run(upload, timeout=limits.timeout_for(f"writing {p}"))
        finally:
            fs.invalidate_cache(p)


# ============================================================================ opening a URL

def open_fs(url: str, storage_options: dict | None = None):
    """``(fs, root)`` for a stream URL, with the client's own retries off so that arcfmt's are the only
    layer: the backend registered for the URL's protocol adjusts the storage options first
    (:meth:`Backend.client_options`; S3: botocore ``retries={"total_max_attempts": 1}`` unless
    ``storage_options`` sets ``config_kwargs["retries"]``, and s3fs's ``retries`` = 1 on an instance of
    our own). GCS: gcsfs retries inside its request method, which the stream layer does not use for
    reads and commits."""
    so = dict(storage_options or {})
    proto = url.split("://", 1)[0].lower() if "://" in url else "file"
    cls = _BY_PROTOCOL.get(proto)
    if cls is not None:
        so = cls.client_options(so)
    fs, root = fsspec.core.url_to_fs(url, **so)
    if cls is not None and backend_class(fs) is cls:
        cls.own_client(fs, so)
    return fs, root


# ============================================================================ stream names in a listing

MAX_LIST_ENTRIES = 1 << 22    # objects one listing may return (LimitError beyond)
STEP_KINDS = ("manifest", "signature", "descriptor", "delta", "keyframe")   # what Store.delete may remove

_LISTED = re.compile(r"steps/(\d{20})/(?:(manifest|signature)\.json|shard-(\d{5})-of-(\d{5})"
                     r"(?:\.json|-(delta|keyframe)-[0-9a-f]{32}\.arc))\Z")


@dataclass(frozen=True)
class Listed:
    """One object of a listing. ``kind``: ``head``, ``manifest``, ``signature`` (S15), ``descriptor``,
    ``delta``, ``keyframe``, or ``other`` for anything whose name is not a stream name (or that is not a regular
    object): reported, never touched."""

    name: str                  # relative to the stream root
    size: int
    mtime: float | None        # seconds since the epoch, as the store reports it
    kind: str
    step: int | None = None
    shard: int | None = None
    num_shards: int | None = None


def classify(name: str, size: int = 0, mtime: float | None = None, regular: bool = True) -> Listed:
    """A :class:`Listed` for a relative name: what kind of stream object its name says it is."""
    if regular and name == N.HEAD:
        return Listed(name, size, mtime, "head")
    m = _LISTED.match(name) if regular and len(name) <= N.MAX_NAME_BYTES else None
    if m is not None:
        step = int(m.group(1))
        if step <= N.MAX_STEP:
            if m.group(2):
                return Listed(name, size, mtime, m.group(2), step)
            i, n = int(m.group(3)), int(m.group(4))
            if 1 <= n <= N.MAX_SHARDS and i < n:
                return Listed(name, size, mtime, m.group(5) or "descriptor", step, i, n)
    return Listed(name, size, mtime, "other")


# ============================================================================ the facade

class Store(retry.Deadlines):
    """The objects under one stream root URL (any fsspec URL), named by :mod:`arcfmt.store.names`.

    Its adapter (``adapter``, a :class:`Backend`; ``backend`` is its name) is chosen once, here.
    ``retries``: an operation sends at most ``retries`` + 1 requests; ``retry_time``: no retry starts
    later than this many seconds after the operation's first attempt; ``request_timeout``: seconds one
    request may take, answer included (S3, GCS; other filesystems are not timed); ``time_limit()``:
    a caller's deadline for everything inside a block. With ``fs`` given, it is used as it is (its
    client's own retries included); else it is built from ``url`` and ``storage_options`` with the
    client's retries off (see :func:`open_fs`)."""

    def __init__(self, url: str, storage_options: dict | None = None, *, fs=None, retries: int = retry.DEFAULT_RETRIES,
                 backoff: float = retry.DEFAULT_BACKOFF, request_timeout: float | None = None,
                 retry_time: float | None = None):
        N.split_root(url)
        self.retries, self.backoff = retry.check_budget(retries, backoff)
        self._init_deadlines(request_timeout, retry_time)
        if fs is None:
            try:
                fs, root = open_fs(url, storage_options)
            except (ImportError, ValueError, TypeError) as exc:
                raise InputError(f"cannot open stream URL {url!r}: {exc}") from None
        else:
            root = fs._strip_protocol(url)
        self.url = url
        self.fs = fs
        self.root = root.rstrip("/") if root not in ("/", "") else root
        self.adapter = backend_for(fs)
        self.backend = self.adapter.name
        if not self.adapter.atomic and type(fs).__name__ not in _WARNED:
            _WARNED.add(type(fs).__name__)
            warnings.warn(f"{type(fs).__name__} has no conditional writes: commits fall back to "
                          f"check-then-write, which two racing publishers can both pass", stacklevel=2)

    # -- names
    def path(self, name: str) -> str:
        N.check_relative(name)
        return f"{self.root}/{name}" if self.root else name

    def _call(self, fn, what, missing_ok=False):
        return retry.call(fn, what, retries=self.retries, backoff=self.backoff, missing_ok=missing_ok, limits=self)

    # -- plain reads and writes
    def read(self, name: str, limit: int, *, missing_ok: bool = False):
        """The whole object, at most ``limit`` bytes (one ranged GET of ``limit + 1`` bytes, no HEAD
        first; never more is read from the answer, whatever the server sends)."""
        p = self.path(name)
        what = f"reading {name}"
        data = self._call(lambda: self.adapter.read_one(p, 0, limit + 1, exact=False, timeout=self.timeout_for(what),
                                                        what=what), what, missing_ok)
        if data is not None and len(data) > limit:
            raise LimitError(f"{name} is larger than its {limit}-byte limit")
        return data

    def read_many(self, names: list, limit: int) -> list:
        """Several small objects concurrently; ``None`` for each one that does not exist."""
        if not names:
            return []
        paths = [self.path(n) for n in names]
        out: list = [None] * len(names)
        todo = list(range(len(names)))
        attempt = 0
        started = time.monotonic()
        while todo:
            what = f"reading {names[todo[0]]}"
            res = self.adapter.read_ranges([(paths[i], 0, limit + 1, f"reading {names[i]}") for i in todo],
                                           exact=False, timeout=self.timeout_for(what), concurrency=WIRE_CONCURRENCY)
            again = []
            for i, r in zip(todo, res):
                if isinstance(r, FileNotFoundError):
                    continue
                if isinstance(r, BaseException):
                    if retry.is_transient(r):
                        again.append((i, r))
                        continue
                    if isinstance(r, ArcError):
                        raise r
                    raise TransportError(f"reading {names[i]}: {type(r).__name__}: {r}") from r
                if len(r) > limit:
                    raise LimitError(f"{names[i]} is larger than its {limit}-byte limit")
                out[i] = bytes(r)
            if again:
                delay = retry.backoff_delay(attempt + 1, self.backoff)
                why = self.may_retry(attempt, self.retries, started, delay, what=f"reading {names[again[0][0]]}",
                                     error=again[0][1])
                if why is not None:
                    i, r = again[0]
                    msg = str(r) if isinstance(r, ArcError) else f"reading {names[i]}: {type(r).__name__}: {r}"
                    raise TransportError(f"{msg}{f' ({why})' if why else ''}") from r
                attempt += 1
                time.sleep(delay)
            todo = [i for i, _ in again]
        return out

    def put_bytes(self, name: str, data: bytes) -> None:
        """Write an immutable object (data objects are content-addressed: rewriting is harmless)."""
        p = self.path(name)
        self._call(lambda: self.adapter.put_bytes(p, data), f"writing {name}")
        self.fs.invalidate_cache(p)

    def put_file(self, name: str, local_path: str) -> None:
        p = self.path(name)
        self._call(lambda: self.adapter.put_file(p, local_path), f"uploading {name}")
        self.fs.invalidate_cache(p)

    # -- conditional writes
    def create(self, name: str, data: bytes) -> bool:
        """Create ``name`` with ``data`` if it does not exist. True: created; False: it existed."""
        p = self.path(name)
        return self._call(lambda: self.adapter.create(p, data, self), f"creating {name}")

    def read_versioned(self, name: str, limit: int):
        """``(bytes, token)`` for a later ``replace``; ``(None, None)`` if the object does not exist."""
        p = self.path(name)
        what = f"reading {name}"
        res = self._call(lambda: self.adapter.read_versioned(p, limit, self, what), what, missing_ok=True)
        if res is None or res[0] is None:
            return None, None
        if len(res[0]) > limit:
            raise LimitError(f"{name} is larger than its {limit}-byte limit")
        return res

    def replace(self, name: str, data: bytes, token) -> bool:
        """Write ``data`` only if the object is still at version ``token`` (None: does not exist)."""
        if token is None:
            return self.create(name, data)
        p = self.path(name)
        return self._call(lambda: self.adapter.replace(p, data, token, self), f"updating {name}")

    # -- listing and deletion (retention, SPEC.md S16)
    def list(self, prefix: str = N.STEPS, *, limit: int = MAX_LIST_ENTRIES) -> builtins.list[Listed]:
        """Every object below ``prefix`` (a relative folder name) as :class:`Listed`, names relative to
        the root, sorted by name; one listing (no object is read). More than ``limit`` is ``LimitError``;
        a name that is not a stream name comes back as kind ``other``."""
        limit = retry.check_count(limit, "limit", 1)
        base = self.path(N.check_relative(prefix.rstrip("/"), "listing prefix"))
        what = f"listing {prefix}"
        found = self._call(lambda: self.adapter.list(base, limit), what, missing_ok=True) or []
        root = self.root.rstrip("/")
        cut = len(root) + 1 if root else 0
        out: builtins.list[Listed] = []
        for p, size, mtime, regular in found:
            p = str(p)
            if root and not p.startswith(root + "/"):
                continue                 # not below the root as we spelled it: nothing of ours
            out.append(classify(p[cut:], size, mtime, regular))
        out.sort(key=lambda e: e.name)
        return out

    def remove_empty_step_folders(self, below: int, keep=()) -> None:
        """Remove the empty step folders of steps below ``below`` but for ``keep`` (local stores: a
        prune killed between its last unlink and its folder's removal leaves one, which no listing of
        objects shows; object stores have no folders)."""
        keep = set(keep)

        def doomed(name: str) -> bool:
            return len(name) == 20 and name.isascii() and name.isdigit() and int(name) < below \
                and int(name) not in keep

        base = self.path(N.STEPS)
        self._call(lambda: self.adapter.remove_empty_folders(base, doomed), "removing empty step folders")

    def delete(self, names) -> None:
        """Remove these stream objects (manifests, descriptors, data objects; a missing one is fine),
        through the retry layer, in batches. Names in one call go in any order: call once per group
        that must be gone before the next. Any other name is ``InputError`` and nothing is removed."""
        names = builtins.list(names)
        for n in names:
            if not isinstance(n, str) or classify(n).kind not in STEP_KINDS:
                raise InputError(f"{n!r} is not the name of a stream step object: not deleted")
        paths = [self.path(n) for n in names]
        for b in range(0, len(paths), 256):
            batch = paths[b: b + 256]
            self._call(lambda batch=batch: self.adapter.delete(batch, root=self.root), f"deleting {names[b]}")


__all__ = ["Backend", "GcsBackend", "GenericBackend", "Listed", "LocalBackend", "MemoryBackend", "MissingError",
           "S3Backend", "Store", "backend_class", "backend_for", "classify", "open_fs", "register"]
