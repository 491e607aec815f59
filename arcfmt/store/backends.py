"""A stream's objects on one fsspec filesystem, with the two atomic operations commits need.

- ``create(name, data)``: make an object only if it does not exist yet (S3 ``If-None-Match: *`` via
  s3fs ``mode="create"``; GCS ``ifGenerationMatch=0`` on one multipart upload; local files: write
  a temporary file, then ``link()`` it to the name, which fails if the name exists; ``memory://``: a
  process-wide lock). Returns False when the object already existed — whatever error the store used
  to say so (SeaweedFS answers 412 without the ``Condition`` element, which s3fs turns into
  ``OSError(EINVAL)``; that is normalised here).
- ``replace(name, data, token)``: compare-and-swap against the version ``read_versioned`` returned
  (S3 ``If-Match: <ETag>``; GCS ``ifGenerationMatch=<generation>`` on a multipart upload; local
  files: ``flock`` + check + write-then-rename).

Reads go through :func:`arcfmt.store.ranges.read_one` / ``read_ranges``: never more than
``limit + 1`` bytes of any answer, every request within ``request_timeout`` seconds. There is one
retry layer, this one (``retries``, ``retry_time``, see :mod:`arcfmt.store.retry`): a filesystem built
here from a URL has its client libraries' retries turned off (:func:`open_fs`).

Any other fsspec backend gets a check-then-write fallback that is *not* atomic; a warning says so.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import stat
import threading
import time
import uuid
import warnings

import fsspec

from ..checkpoint import _fsync_dir
from ..errors import ArcError, InputError, LimitError
from . import names as N
from . import retry
from .errors import MissingError, TransportError
from .layout import MAX_DESCRIPTOR_BYTES, MAX_HEAD_BYTES, MAX_MANIFEST_BYTES, digest128
from .ranges import _ERROR_BODY, WIRE_CONCURRENCY, backend_of, read_one, read_ranges

_MEMORY_LOCK = threading.Lock()
_WARNED = set()
_MAX_LIMIT = max(MAX_DESCRIPTOR_BYTES, MAX_HEAD_BYTES, MAX_MANIFEST_BYTES)

_backend_of = backend_of   # the old name


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


def open_fs(url: str, storage_options: dict | None = None):
    """``(fs, root)`` for a stream URL, with the client's own retries off so that arcfmt's are the only
    layer (S3: botocore ``retries={"total_max_attempts": 1}`` unless ``storage_options`` sets
    ``config_kwargs["retries"]``, and s3fs's ``retries`` = 1 on an instance of our own). GCS: gcsfs
    retries inside its request method, which the stream layer does not use for reads and commits."""
    so = dict(storage_options or {})
    proto = url.split("://", 1)[0].lower() if "://" in url else "file"
    own_s3 = proto in ("s3", "s3a")
    if own_s3:
        cfg = so.get("config_kwargs") or {}
        if isinstance(cfg, dict):           # anything else: s3fs says what is wrong with it
            cfg = dict(cfg)
            cfg.setdefault("retries", {"total_max_attempts": 1})
            so["config_kwargs"] = cfg
        so.setdefault("skip_instance_cache", True)   # an instance of our own: its s3fs retries are set below
    fs, root = fsspec.core.url_to_fs(url, **so)
    if own_s3 and so["skip_instance_cache"] and backend_of(fs) == "s3" and hasattr(fs, "retries"):
        fs.retries = 1
    return fs, root


class Store(retry.Deadlines):
    """The objects under one stream root URL (any fsspec URL), named by :mod:`arcfmt.store.names`.

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
        self.backend = backend_of(fs)
        self.retries = retries
        self.backoff = backoff
        self._init_deadlines(request_timeout, retry_time)
        if self.backend == "generic" and type(fs).__name__ not in _WARNED:
            _WARNED.add(type(fs).__name__)
            warnings.warn(f"{type(fs).__name__} has no conditional writes: commits fall back to "
                          f"check-then-write, which two racing publishers can both pass", stacklevel=2)

    # -- names
    def path(self, name: str) -> str:
        N.check_relative(name)
        return f"{self.root}/{name}" if self.root else name

    def _call(self, fn, what, missing_ok=False):
        return retry.call(fn, what, retries=self.retries, backoff=self.backoff, missing_ok=missing_ok, limits=self)

    def _timed(self, what, coro_fn, *args, **kw):
        """``coro_fn(*args, **kw)`` on an async filesystem's loop, within the request timeout."""
        from fsspec.asyn import sync

        return sync(self.fs.loop, coro_fn, *args, timeout=self.timeout_for(what), **kw)

    # -- plain reads and writes
    def read(self, name: str, limit: int, *, missing_ok: bool = False):
        """The whole object, at most ``limit`` bytes (one ranged GET of ``limit + 1`` bytes, no HEAD
        first; never more is read from the answer, whatever the server sends)."""
        p = self.path(name)
        what = f"reading {name}"
        data = self._call(lambda: read_one(self.fs, self.backend, p, 0, limit + 1, exact=False,
                                           timeout=self.timeout_for(what), what=what), what, missing_ok)
        if data is not None and len(data) > limit:
            raise LimitError(f"{name} is larger than its {limit}-byte limit")
        return data

    def read_many(self, names: list, limit: int) -> list:
        """Several small objects concurrently; ``None`` for each one that does not exist."""
        if not names:
            return []
        paths = [self.path(n) for n in names]
        out = [None] * len(names)
        todo = list(range(len(names)))
        attempt = 0
        started = time.monotonic()
        while todo:
            what = f"reading {names[todo[0]]}"
            res = read_ranges(self.fs, self.backend, [(paths[i], 0, limit + 1, f"reading {names[i]}") for i in todo],
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
                why = self.may_retry(attempt, self.retries, started, delay)
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
        if self.backend == "local":
            self._call(lambda: _local_write(p, data), f"writing {name}")
        else:
            self._call(lambda: self.fs.pipe_file(p, data), f"writing {name}")
        self.fs.invalidate_cache(p)

    def put_file(self, name: str, local_path: str) -> None:
        p = self.path(name)
        if self.backend == "local":
            def put():
                with open(local_path, "rb") as src:
                    _local_write(p, src)
            self._call(put, f"uploading {name}")
        else:
            self._call(lambda: self.fs.put_file(local_path, p), f"uploading {name}")
        self.fs.invalidate_cache(p)

    # -- conditional writes
    def create(self, name: str, data: bytes) -> bool:
        """Create ``name`` with ``data`` if it does not exist. True: created; False: it existed."""
        p = self.path(name)
        return self._call(lambda: getattr(self, f"_create_{self.backend}")(p, data), f"creating {name}")

    def read_versioned(self, name: str, limit: int):
        """``(bytes, token)`` for a later ``replace``; ``(None, None)`` if the object does not exist."""
        p = self.path(name)
        what = f"reading {name}"
        res = self._call(lambda: getattr(self, f"_read_versioned_{self.backend}")(p, limit, what),
                         what, missing_ok=True)
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
        return self._call(lambda: getattr(self, f"_replace_{self.backend}")(p, data, token), f"updating {name}")

    # local files ------------------------------------------------------------------------------
    def _create_local(self, p, data):
        return _local_create(p, data)

    def _read_versioned_local(self, p, limit, what):
        data = _local_read(p, limit + 1, what)
        return data, _token(limit, data)

    def _replace_local(self, p, data, token):
        limit = _token_limit(token)
        if limit is None:
            return False
        d = os.path.dirname(p)
        lock = os.path.join(d, f".{os.path.basename(p)}.lock")
        with open(lock, "a+b") as lf:
            fcntl.flock(lf, fcntl.LOCK_EX)
            try:
                try:
                    current = _token(limit, _local_read(p, limit + 1, p))
                except FileNotFoundError:
                    current = None
                if current != token:
                    return False
                _local_write(p, data)
                return True
            finally:
                fcntl.flock(lf, fcntl.LOCK_UN)

    # memory:// (one process) ------------------------------------------------------------------
    def _create_memory(self, p, data):
        with _MEMORY_LOCK:
            if self.fs.exists(p):
                return False
            self.fs.pipe_file(p, bytes(data))
            return True

    def _read_versioned_memory(self, p, limit, what):
        with _MEMORY_LOCK:
            return self._read_versioned_generic(p, limit, what)

    def _replace_memory(self, p, data, token):
        with _MEMORY_LOCK:  # in one process, the lock makes the generic compare-and-swap atomic
            return self._replace_generic(p, data, token)

    # S3 (s3fs) --------------------------------------------------------------------------------
    def _conditional_put_s3(self, p, data, **condition):
        """One conditional PUT: True when it was stored, False when its precondition failed (for
        If-Match, also when the object is gone)."""
        try:
            self._timed(f"writing {p}", self.fs._pipe_file, p, data, **condition)
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
            self.fs.invalidate_cache(p)

    def _create_s3(self, p, data):
        return self._conditional_put_s3(p, data, mode="create")

    def _read_versioned_s3(self, p, limit, what):
        return read_one(self.fs, "s3", p, 0, limit + 1, exact=False, timeout=self.timeout_for(what), what=what,
                        versioned=True)

    def _replace_s3(self, p, data, token):
        return self._conditional_put_s3(p, data, IfMatch=token)

    # GCS (gcsfs) ------------------------------------------------------------------------------
    def _create_gcs(self, p, data):
        return self._upload_gcs(p, data, "0")

    def _read_versioned_gcs(self, p, limit, what):
        return read_one(self.fs, "gcs", p, 0, limit + 1, exact=False, timeout=self.timeout_for(what), what=what,
                        versioned=True)

    def _replace_gcs(self, p, data, token):
        if not str(token).isdigit():
            return False
        return self._upload_gcs(p, data, str(token))

    def _upload_gcs(self, p, data, generation: str) -> bool:
        """One multipart upload with ``ifGenerationMatch`` (GCS and fake-gcs-server check the
        precondition on it): True when stored, False on 412 (or 404: the object is gone). Sent on
        gcsfs's session directly, so that gcsfs's own retries do not add to ours."""
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
            return self._timed(f"writing {p}", upload)
        finally:
            fs.invalidate_cache(p)

    # anything else: not atomic ----------------------------------------------------------------
    def _create_generic(self, p, data):
        if self.fs.exists(p):
            return False
        self.fs.pipe_file(p, bytes(data))
        return True

    def _read_versioned_generic(self, p, limit, what):
        data = read_one(self.fs, "generic", p, 0, limit + 1, exact=False, timeout=self.timeout_for(what), what=what)
        return data, _token(limit, data)

    def _replace_generic(self, p, data, token):
        limit = _token_limit(token)
        if limit is None:
            return False
        try:
            current = _token(limit, self.fs.cat_file(p, start=0, end=limit + 1))
        except FileNotFoundError:
            current = None
        if current != token:
            return False
        self.fs.pipe_file(p, bytes(data))
        return True


def _token(limit: int, data) -> str:
    """The version of a local or generic object: its first ``limit + 1`` bytes' hash, with ``limit``."""
    return f"{limit}:{digest128(data)}"


def _token_limit(token) -> int | None:
    lim, sep, _ = str(token).partition(":")
    if not sep or not lim.isdigit() or int(lim) > _MAX_LIMIT:
        return None
    return int(lim)


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
        parts, got = [], 0
        while got < n:
            b = os.read(fd, min(n - got, 8 << 20))
            if not b:
                break
            parts.append(b)
            got += len(b)
        return b"".join(parts)
    finally:
        os.close(fd)


# ------------------------------------------------------------------------------------ local helpers

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
    _fsync_dir(os.path.dirname(p))


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
    _fsync_dir(os.path.dirname(p))
    return True


def _unlink(p):
    try:
        os.unlink(p)
    except FileNotFoundError:
        pass


__all__ = ["MissingError", "Store"]
