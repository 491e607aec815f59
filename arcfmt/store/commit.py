"""A stream's objects on one fsspec filesystem, with the two atomic operations commits need.

- ``create(name, data)``: make an object only if it does not exist yet (S3 ``If-None-Match: *`` via
  s3fs ``mode="create"``; GCS ``ifGenerationMatch=0`` via gcsfs ``mode="create"``; local files: write
  a temporary file, then ``link()`` it to the name, which fails if the name exists; ``memory://``: a
  process-wide lock). Returns False when the object already existed — whatever error the store used
  to say so (SeaweedFS answers 412 without the ``Condition`` element, which s3fs turns into
  ``OSError(EINVAL)``; that is normalised here).
- ``replace(name, data, token)``: compare-and-swap against the version ``read_versioned`` returned
  (S3 ``If-Match: <ETag>``; GCS ``ifGenerationMatch=<generation>`` on a multipart upload; local
  files: ``flock`` + check + write-then-rename).

Any other fsspec backend gets a check-then-write fallback that is *not* atomic; a warning says so.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import threading
import time
import uuid
import warnings

import fsspec

from ..checkpoint import _fsync_dir
from ..errors import InputError, LimitError
from . import names as N, retry
from .errors import MissingError, TransportError
from .layout import digest128

_MEMORY_LOCK = threading.Lock()
_WARNED = set()


def _backend_of(fs) -> str:
    protos = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
    mod = type(fs).__module__
    if "file" in protos or "local" in protos:
        return "local"
    if "memory" in protos:
        return "memory"
    if mod.startswith("s3fs") or "s3" in protos:
        return "s3"
    if mod.startswith("gcsfs") or "gs" in protos or "gcs" in protos:
        return "gcs"
    return "generic"


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


class Store:
    """The objects under one stream root URL (any fsspec URL), named by :mod:`arcfmt.store.names`."""

    def __init__(self, url: str, storage_options: dict | None = None, *, fs=None, retries: int = 5,
                 backoff: float = 0.2):
        N.split_root(url)
        if fs is None:
            try:
                fs, root = fsspec.core.url_to_fs(url, **(storage_options or {}))
            except (ImportError, ValueError) as exc:
                raise InputError(f"cannot open stream URL {url!r}: {exc}") from None
        else:
            root = fs._strip_protocol(url)
        self.url = url
        self.fs = fs
        self.root = root.rstrip("/") if root not in ("/", "") else root
        self.backend = _backend_of(fs)
        self.retries = retries
        self.backoff = backoff
        if self.backend == "generic" and type(fs).__name__ not in _WARNED:
            _WARNED.add(type(fs).__name__)
            warnings.warn(f"{type(fs).__name__} has no conditional writes: commits fall back to "
                          f"check-then-write, which two racing publishers can both pass", stacklevel=2)

    # -- names
    def path(self, name: str) -> str:
        N.check_relative(name)
        return f"{self.root}/{name}" if self.root else name

    def _call(self, fn, what, missing_ok=False):
        return retry.call(fn, what, retries=self.retries, backoff=self.backoff, missing_ok=missing_ok)

    # -- plain reads and writes
    def read(self, name: str, limit: int, *, missing_ok: bool = False):
        """The whole object, at most ``limit`` bytes (one ranged GET: no HEAD first)."""
        p = self.path(name)
        data = self._call(lambda: self.fs.cat_file(p, start=0, end=limit + 1), f"reading {name}", missing_ok)
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
        while todo:
            res = self.fs.cat_ranges([paths[i] for i in todo], [0] * len(todo), [limit + 1] * len(todo),
                                     on_error="return")
            again = []
            for i, r in zip(todo, res):
                if isinstance(r, FileNotFoundError):
                    continue
                if isinstance(r, BaseException):
                    if retry.is_transient(r) and attempt < self.retries:
                        again.append(i)
                        continue
                    raise TransportError(f"reading {names[i]}: {type(r).__name__}: {r}") from r
                if len(r) > limit:
                    raise LimitError(f"{names[i]} is larger than its {limit}-byte limit")
                out[i] = bytes(r)
            todo = again
            if todo:
                attempt += 1
                time.sleep(retry.backoff_delay(attempt, self.backoff))
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
        res = self._call(lambda: getattr(self, f"_read_versioned_{self.backend}")(p, limit),
                         f"reading {name}", missing_ok=True)
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

    def _read_versioned_local(self, p, limit):
        with open(p, "rb") as f:
            data = f.read(limit + 1)
        return data, digest128(data)

    def _replace_local(self, p, data, token):
        d = os.path.dirname(p)
        lock = os.path.join(d, f".{os.path.basename(p)}.lock")
        with open(lock, "a+b") as lf:
            fcntl.flock(lf, fcntl.LOCK_EX)
            try:
                try:
                    with open(p, "rb") as f:
                        current = digest128(f.read())
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

    def _read_versioned_memory(self, p, limit):
        with _MEMORY_LOCK:
            return self._read_versioned_generic(p, limit)

    def _replace_memory(self, p, data, token):
        with _MEMORY_LOCK:  # in one process, the lock makes the generic compare-and-swap atomic
            return self._replace_generic(p, data, token)

    # S3 (s3fs) --------------------------------------------------------------------------------
    def _conditional_put_s3(self, p, data, **condition):
        """One conditional PUT: True when it was stored, False when its precondition failed (for
        If-Match, also when the object is gone)."""
        try:
            self.fs.pipe_file(p, data, **condition)
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

    def _read_versioned_s3(self, p, limit):
        from fsspec.asyn import sync

        bucket, key, _ = self.fs.split_path(p)

        async def get():
            resp = await self.fs._call_s3("get_object", Bucket=bucket, Key=key, Range=f"bytes=0-{limit}")
            try:
                data = await resp["Body"].read()
            finally:
                resp["Body"].close()
            return data, resp["ETag"]

        return sync(self.fs.loop, get)

    def _replace_s3(self, p, data, token):
        return self._conditional_put_s3(p, data, IfMatch=token)

    # GCS (gcsfs) ------------------------------------------------------------------------------
    def _create_gcs(self, p, data):
        try:
            self.fs.pipe_file(p, data, mode="create")  # a multipart upload with ifGenerationMatch=0
            return True
        except FileExistsError:
            return False
        finally:
            self.fs.invalidate_cache(p)

    def _read_versioned_gcs(self, p, limit):
        bucket, key, _ = self.fs.split_path(p)
        headers, data = self.fs.call("GET", "b/{}/o/{}", bucket, key, alt="media",
                                     headers={"Range": f"bytes=0-{limit}"})
        gen = next((v for k, v in headers.items() if k.lower() == "x-goog-generation"), None)
        if gen is None:
            raise OSError(errno.EIO, f"{p}: the server sent no x-goog-generation header")
        return data, str(gen)

    def _replace_gcs(self, p, data, token):
        # A multipart upload (fake-gcs-server, like GCS, checks the precondition on it).
        bucket, key, _ = self.fs.split_path(p)
        meta = json.dumps({"name": key})
        body = (f"--==0==\nContent-Type: application/json; charset=UTF-8\n\n{meta}\n--==0==\n"
                f"Content-Type: application/octet-stream\n\n").encode() + bytes(data) + b"\n--==0==--"
        try:
            self.fs.call("POST", f"{self.fs._location}/upload/storage/v1/b/{bucket}/o", uploadType="multipart",
                         ifGenerationMatch=str(token), data=body, json_out=True,
                         headers={"Content-Type": 'multipart/related; boundary="==0=="'})
            return True
        except (FileExistsError, FileNotFoundError):
            return False
        finally:
            self.fs.invalidate_cache(p)

    # anything else: not atomic ----------------------------------------------------------------
    def _create_generic(self, p, data):
        if self.fs.exists(p):
            return False
        self.fs.pipe_file(p, bytes(data))
        return True

    def _read_versioned_generic(self, p, limit):
        data = self.fs.cat_file(p)
        return data[: limit + 1], digest128(data)

    def _replace_generic(self, p, data, token):
        try:
            current = digest128(self.fs.cat_file(p))
        except FileNotFoundError:
            current = None
        if current != token:
            return False
        self.fs.pipe_file(p, bytes(data))
        return True


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


__all__ = ["Store", "MissingError"]
