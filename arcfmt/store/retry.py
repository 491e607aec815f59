"""Which store errors are worth retrying, and retrying them with capped exponential backoff + jitter."""
from __future__ import annotations

import errno
import random
import time

from ..errors import ArcError
from .errors import MissingError, TransportError

_PERMANENT_TYPES = (FileNotFoundError, FileExistsError, PermissionError, IsADirectoryError, NotADirectoryError,
                    ArcError, ValueError, TypeError, KeyError, AttributeError, NotImplementedError, MemoryError)
_PERMANENT_ERRNOS = {errno.ENOENT, errno.EEXIST, errno.EACCES, errno.EPERM, errno.EINVAL, errno.ENAMETOOLONG,
                     errno.EISDIR, errno.ENOTDIR, errno.ENOSPC, errno.EROFS}
_PERMANENT_NAMES = {"NoCredentialsError", "PartialCredentialsError", "NoRegionError", "ParamValidationError",
                    "DefaultCredentialsError", "RefreshError", "InvalidConfigError"}
_NETWORK_MODULES = ("aiohttp", "botocore", "aiobotocore", "urllib3", "requests", "google", "gcsfs", "s3fs",
                    "http", "ssl", "socket", "asyncio", "concurrent")
_RETRY_HTTP = {408, 425, 429, 500, 502, 503, 504}


def is_transient(exc: BaseException) -> bool:
    """True for errors a retry may cure: connection resets, timeouts, throttling, 5xx answers."""
    if isinstance(exc, _PERMANENT_TYPES):
        return False
    if type(exc).__name__ in _PERMANENT_NAMES:
        return False
    code = getattr(exc, "code", None)
    if isinstance(code, int) and 400 <= code < 600:
        return code in _RETRY_HTTP
    if isinstance(exc, (TimeoutError, ConnectionError)):
        return True
    if isinstance(exc, OSError):
        return exc.errno not in _PERMANENT_ERRNOS
    return type(exc).__module__.split(".")[0] in _NETWORK_MODULES


def backoff_delay(attempt: int, base: float, cap: float = 5.0) -> float:
    """Full-jitter exponential backoff: uniform in [base·2^(k-1)/2, base·2^(k-1)], capped."""
    d = min(cap, base * (2 ** max(0, attempt - 1)))
    return d / 2 + random.random() * d / 2


def call(fn, what: str, *, retries: int = 5, backoff: float = 0.2, stats=None, missing_ok=False):
    """``fn()`` with retries of transient errors; a missing object is ``MissingError`` (or ``None``
    with ``missing_ok``); anything still failing is ``TransportError`` naming ``what``."""
    attempt = 0
    while True:
        try:
            return fn()
        except FileNotFoundError:
            if missing_ok:
                return None
            raise MissingError(f"{what}: no such object") from None
        except ArcError:
            raise
        except Exception as exc:  # noqa: BLE001 - classified below
            if not is_transient(exc) or attempt >= retries:
                raise TransportError(f"{what}: {type(exc).__name__}: {exc}"
                                     f"{f' (after {attempt} retries)' if attempt else ''}") from exc
            attempt += 1
            if stats is not None:
                stats.retries += 1
            time.sleep(backoff_delay(attempt, backoff))
