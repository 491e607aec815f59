"""The stream layer's one retry layer: which store errors are worth retrying, capped exponential
backoff with jitter, and the deadlines that bound it all.

With ``retries=N`` an operation sends at most N + 1 requests, and stops early once ``retry_time``
seconds have passed since its first attempt (no new attempt starts after that) or the caller's
deadline would pass (:class:`Deadlines`, shared by ``backends.Store`` and ``ranges.RangeFetcher``).
The client libraries' own retries are turned off where arcfmt builds the filesystem itself
(:func:`arcfmt.store.backends.open_fs`), so they do not multiply. The arguments that set these
budgets are checked here (:func:`check_budget`, :func:`check_count`, :func:`check_number`,
:func:`check_seconds`): a bad one is ``InputError``.

Whoever wants to know while a store keeps failing (the command line prints one stderr line per
retry) sets a notifier: :func:`set_notifier` or the :func:`notifier` context manager; it is called
with a :class:`RetryNotice` just before each retry's wait, from the thread that retries.
"""
from __future__ import annotations

import contextlib
import errno
import math
import operator
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ..errors import ArcError, InputError
from .errors import MissingError, TransportError

DEFAULT_RETRIES = 5
DEFAULT_BACKOFF = 0.2
DEFAULT_REQUEST_TIMEOUT = 60.0   # seconds one request may take, from sending it to the last byte of its answer
DEFAULT_RETRY_TIME = 120.0       # seconds after an operation's first attempt during which retries may start

_PERMANENT_TYPES = (FileNotFoundError, FileExistsError, PermissionError, IsADirectoryError, NotADirectoryError,
                    ArcError, ValueError, TypeError, KeyError, AttributeError, NotImplementedError, MemoryError)
_PERMANENT_ERRNOS = {errno.ENOENT, errno.EEXIST, errno.EACCES, errno.EPERM, errno.EINVAL, errno.ENAMETOOLONG,
                     errno.EISDIR, errno.ENOTDIR, errno.ENOSPC, errno.EROFS, errno.ELOOP, errno.ENXIO}
_PERMANENT_NAMES = {"NoCredentialsError", "PartialCredentialsError", "NoRegionError", "ParamValidationError",
                    "DefaultCredentialsError", "RefreshError", "InvalidConfigError"}
_NETWORK_MODULES = ("aiohttp", "botocore", "aiobotocore", "urllib3", "requests", "google", "gcsfs", "s3fs",
                    "http", "ssl", "socket", "asyncio", "concurrent")
_RETRY_HTTP = {408, 425, 429, 500, 502, 503, 504}


def is_transient(exc: BaseException) -> bool:
    """True for errors a retry may cure: connection resets, timeouts, throttling, 5xx answers, answers
    that did not match the request (``TransportError(transient=True)``)."""
    if isinstance(exc, TransportError):
        return exc.transient
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


def describe(exc: BaseException) -> str:
    """One line for an error in a message: an arcfmt error's own message, else ``Type: message``."""
    return str(exc) if isinstance(exc, ArcError) else f"{type(exc).__name__}: {exc}"


@dataclass(frozen=True)
class RetryNotice:
    """One retry about to start: what failed, why, which retry this is and how long it waits first."""
    what: str | None        # the operation ("reading head.json"); None where the caller did not say
    error: str | None       # the failure, one line (:func:`describe`)
    attempt: int            # the number of this retry: 1 for the first
    retries: int            # the most retries this operation makes
    delay: float            # seconds slept before it is sent

    def __str__(self) -> str:
        head = ": ".join(x for x in (self.what, self.error) if x) or "a store request failed"
        return f"{head}; retry {self.attempt} of {self.retries} in {self.delay:.1f} s"


_notifier: Callable[[RetryNotice], None] | None = None
_notifier_lock = threading.Lock()


def set_notifier(fn: Callable[[RetryNotice], None] | None) -> Callable[[RetryNotice], None] | None:
    """Call ``fn(notice)`` before every retry of every store operation of this process (None: stop);
    returns the notifier it replaces. An exception ``fn`` raises is ignored (it never fails the
    operation)."""
    global _notifier
    with _notifier_lock:
        prev, _notifier = _notifier, fn
    return prev


@contextlib.contextmanager
def notifier(fn: Callable[[RetryNotice], None] | None) -> Iterator[None]:
    """:func:`set_notifier` for the block only."""
    prev = set_notifier(fn)
    try:
        yield
    finally:
        set_notifier(prev)


def notify(what: str | None, error: BaseException | str | None, attempt: int, retries: int, delay: float) -> None:
    """Tell the notifier (if one is set) that retry ``attempt`` of ``what`` starts after ``delay`` s."""
    fn = _notifier
    if fn is None:
        return
    err = error if error is None or isinstance(error, str) else describe(error)
    if what and err and err.startswith(f"{what}: "):
        err = err[len(what) + 2:]
    try:
        fn(RetryNotice(what, err, attempt, retries, delay))
    except Exception:  # a notifier's own failure is no reason to fail the store operation
        pass


def check_count(value, what: str, minimum: int | None = 0) -> int:
    """``value`` as an ``int`` (anything with ``__index__``, not a bool), at least ``minimum``; else ``InputError``."""
    if not isinstance(value, bool):
        try:
            n = operator.index(value)
        except TypeError:
            pass
        else:
            if minimum is None or n >= minimum:
                return n
    least = "an integer" if minimum is None else f"an integer of at least {minimum}"
    raise InputError(f"{what} must be {least}, not {value!r}")


def check_number(value, what: str, *, finite: bool = True, positive: bool = False, unit: str = "") -> float:
    """``value`` as a ``float`` ≥ 0 (``positive``: > 0; ``finite``: not infinity; never NaN or a bool);
    else ``InputError``."""
    if not isinstance(value, bool):
        try:
            t = float(value)
        except (TypeError, ValueError, OverflowError):
            pass
        else:
            if (t > 0 if positive else t >= 0) and (math.isfinite(t) or not finite and t == math.inf):
                return t
    kind = ("a positive" if positive else "a non-negative") + (", finite" if finite else "")
    raise InputError(f"{what} must be {kind} number{unit}, not {value!r}")


def check_seconds(value, what: str, *, finite: bool = True, positive: bool = False) -> float:
    """:func:`check_number` for a time in seconds."""
    return check_number(value, what, finite=finite, positive=positive, unit=" of seconds")


def check_budget(retries, backoff) -> tuple:
    """``(retries, backoff)`` checked: a whole number of retries ≥ 0 and a base delay in seconds ≥ 0."""
    return check_count(retries, "retries"), check_seconds(backoff, "backoff")


class Deadlines:
    """Per-request and caller deadlines, shared by ``Store`` and ``RangeFetcher``.

    ``request_timeout``: seconds one request may take (connection, headers and the whole body); a
    request past it is abandoned and counts as a transient error. ``retry_time``: seconds after an
    operation's first attempt during which a retry may still start. ``deadline``: an absolute
    ``time.monotonic()`` time set by the caller (see :meth:`time_limit`): no request runs past it and
    an operation still unfinished then fails with ``TransportError`` (not retried).
    """

    request_timeout: float = DEFAULT_REQUEST_TIMEOUT
    retry_time: float = DEFAULT_RETRY_TIME
    deadline: float | None = None

    def _init_deadlines(self, request_timeout, retry_time) -> None:
        rt = DEFAULT_REQUEST_TIMEOUT if request_timeout is None else \
            check_seconds(request_timeout, "request_timeout", positive=True)
        rr = DEFAULT_RETRY_TIME if retry_time is None else check_seconds(retry_time, "retry_time", finite=False)
        self.request_timeout = rt
        self.retry_time = rr
        self.deadline = None

    @contextlib.contextmanager
    def time_limit(self, seconds: float | None):
        """Within the block, every request and retry of this object ends by ``seconds`` from now (None:
        no limit beyond the per-request one). Nested limits keep the earliest."""
        prev = self.deadline
        if seconds is not None:
            t = time.monotonic() + check_seconds(seconds, "a time limit", finite=False)
            self.deadline = t if prev is None else min(prev, t)
        try:
            yield
        finally:
            self.deadline = prev

    def timeout_for(self, what: str) -> float:
        """Seconds the next request may take: ``request_timeout``, cut to what is left of the deadline."""
        t = self.request_timeout
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TransportError(f"{what}: the caller's deadline has passed")
            t = min(t, left)
        return t

    def may_retry(self, attempt: int, retries: int, started: float, delay: float, *, what: str | None = None,
                  error: BaseException | str | None = None) -> str | None:
        """None if retry number ``attempt + 1`` may start after sleeping ``delay`` (the notifier is
        then told, naming ``what`` and ``error``: :func:`notify`); else why not."""
        why = self._why_not(attempt, retries, started, delay)
        if why is None:
            notify(what, error, attempt + 1, retries, delay)
        return why

    def _why_not(self, attempt: int, retries: int, started: float, delay: float) -> str | None:
        if attempt >= retries:
            return f"after {attempt} retries" if attempt else ""
        now = time.monotonic()
        if now + delay - started > self.retry_time:
            return f"after {attempt} retries; its {self.retry_time:g} s of retry time are spent"
        if self.deadline is not None and now + delay >= self.deadline:
            return f"after {attempt} retries; the caller's deadline would pass"
        return None


def call(fn, what: str, *, retries: int = DEFAULT_RETRIES, backoff: float = DEFAULT_BACKOFF, stats=None,
         missing_ok=False, limits: Deadlines | None = None):
    """``fn()`` with retries of transient errors; a missing object is ``MissingError`` (or ``None``
    with ``missing_ok``); anything still failing is ``TransportError`` naming ``what``. ``limits``
    (a :class:`Deadlines`) caps the total retry time and the caller's deadline."""
    limits = limits if limits is not None else Deadlines()
    started = time.monotonic()
    attempt = 0
    err: Exception
    while True:
        try:
            return fn()
        except FileNotFoundError:
            if missing_ok:
                return None
            raise MissingError(f"{what}: no such object") from None
        except ArcError as exc:
            if not is_transient(exc):
                raise
            err = exc
        except Exception as exc:
            if not is_transient(exc):
                raise TransportError(f"{what}: {describe(exc)}") from exc
            err = exc
        delay = backoff_delay(attempt + 1, backoff)
        why = limits.may_retry(attempt, retries, started, delay, what=what, error=err)
        if why is not None:
            msg = describe(err) if isinstance(err, ArcError) and str(err).startswith(what) else \
                f"{what}: {describe(err)}"
            raise TransportError(f"{msg}{f' ({why})' if why else ''}") from err
        attempt += 1
        if stats is not None:
            stats.retries += 1
        time.sleep(delay)
