"""Jobs on the calling thread plus helper threads that live as long as the process.

Why helpers that stay: starting and joining threads for every decode, base check or encoder batch
cost about 0.3 ms a call (a third of a millisecond on a 13.7 MB model's 7 ms decode), and a
``ThreadPoolExecutor`` per call as much again. Each caller's jobs form a :class:`Batch`, which the
caller also works through itself while it waits, so every core decodes and nobody hands small jobs
across threads for nothing. One lock guards every job's state; idle helpers wait on one condition of
it (woken one at a time, for one queued job), callers on another (woken when a job finishes).
"""
from __future__ import annotations

import functools
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

# Jobs on fewer elements than this run on the calling thread only: with the GIL, sharing them costs
# more than it saves (measured: a model's norms and biases decode slower on two threads than on one).
SHARED_MIN_ELEMS = 1 << 18

NEW, RUNNING, DONE = 0, 1, 2

# How long :meth:`Batch.handoff` waits at most for a helper to start (it wakes in tens of microseconds
# once it can take the GIL; a caller must not hang on helpers that are all busy with other callers).
HANDOFF_S = 0.002

@functools.cache   # once: glibc reads /sys for os.cpu_count() at every call (~17 µs a decode)
def default_workers() -> int:
    """The threads a reader, writer or publisher uses when the caller names none: the cores, at most 8."""
    return min(8, os.cpu_count() or 1)


class Job:
    """``fn(*args)`` run once, on whichever thread takes it; its ``result`` or ``error`` stays here."""

    __slots__ = ("fn", "args", "state", "error", "result", "batch", "thread")

    def __init__(self, fn: Callable[..., object], args: tuple[object, ...]) -> None:
        self.fn, self.args, self.state = fn, args, NEW
        self.error: BaseException | None = None
        self.result: object = None
        self.batch: Batch | None = None   # set when it is queued for the helpers
        self.thread = 0                   # the thread running it (ident), while it runs

    def run(self) -> None:
        try:
            self.result = self.fn(*self.args)
        except BaseException as exc:  # noqa: BLE001 - raised by the caller, in order
            self.error = exc
        finally:
            self.fn = self.args = None  # type: ignore[assignment]  # a finished job holds no buffers


class _Helpers:
    """The process's helper threads and the one queue they take jobs from (any caller's)."""

    def __init__(self) -> None:
        # an RLock only so close() can tell it was called inside the lock (a GC finalizer or a signal
        # handler on a thread in take()/_finish()/...): it is never taken twice
        self.lock = threading.RLock()
        self.work = threading.Condition(self.lock)   # idle helpers: a job was queued or a batch has room
        self.done = threading.Condition(self.lock)   # callers: a job finished
        self.queue: deque[Job] = deque()
        self.threads: list[threading.Thread] = []

    def ensure(self, n: int) -> None:
        """At least ``n`` helpers (they are never stopped: idle, they wait on ``work``)."""
        with self.lock:
            while len(self.threads) < n:
                t = threading.Thread(target=self._loop, name=f"arcfmt-helper-{len(self.threads)}", daemon=True)
                t.start()
                self.threads.append(t)

    def take(self) -> Job | None:
        """The oldest job nobody started whose batch has fewer helpers on it than it asked for,
        marked running (the caller holds the lock)."""
        q = self.queue
        while q and q[0].state != NEW:
            q.popleft()
        for k, job in enumerate(q):
            batch = job.batch
            assert batch is not None  # only a batch's shared jobs are queued
            if job.state == NEW and batch.helping < batch.limit:
                del q[k]
                batch.helping += 1
                _start(job)
                if batch.handing_off:
                    self.done.notify_all()
                return job
        return None

    def _loop(self) -> None:
        while True:
            with self.lock:
                job = self.take()
                while job is None:
                    self.work.wait()
                    job = self.take()
            try:
                job.run()
            finally:
                _finish(job, helped=True)


def _start(job: Job) -> None:
    job.state = RUNNING
    job.thread = threading.get_ident()
    if job.batch is not None:
        job.batch.running.add(job)


def _finish(job: Job, helped: bool = False) -> None:
    """A queued job (of a batch) is done: its batch's counts, then whoever waits."""
    batch = job.batch
    assert batch is not None
    h = batch.helpers
    with h.lock:
        job.state = DONE
        batch.running.discard(job)
        if helped:
            batch.helping -= 1   # the helper finishing this takes the freed slot itself, next
        h.done.notify_all()


_helpers = _Helpers()


def _interrupted(job: Job) -> None:
    """A Ctrl-C (or exit) caught in a job run on the calling thread goes on at once, not in job order."""
    if job.error is not None and not isinstance(job.error, Exception):
        raise job.error


def _after_fork() -> None:  # a forked child has none of the parent's threads
    global _helpers
    _helpers = _Helpers()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


class Batch:
    """One caller's jobs: the calling thread plus at most ``workers − 1`` helpers at a time.

    :meth:`submit` queues a job for the helpers (or runs it at once, unshared); :meth:`wait` returns
    once a job is done, running it — or another of this batch's jobs nobody started — on the calling
    thread meanwhile; :meth:`close` drops the batch's jobs nobody started and waits for those running
    on other threads, so no job of it touches anything after ``close`` returns."""

    def __init__(self, workers: int) -> None:
        self.shared = workers > 1
        self.limit = workers - 1        # helpers on this batch's jobs at once: ``workers`` threads in all
        self.mine: deque[Job] = deque()
        self.running: set[Job] = set()  # of its jobs, on any thread
        self.helping = 0                # of them, on helpers
        self.handing_off = False        # its caller waits in :meth:`handoff`
        self.helpers = _helpers         # a batch made before a fork has no helpers in the child
        if self.shared:
            _helpers.ensure(workers - 1)

    def submit(self, job: Job, shared: bool = True) -> None:
        if not (shared and self.shared):
            job.state = RUNNING
            job.run()
            job.state = DONE
            _interrupted(job)
            return
        h = self.helpers
        if h is not _helpers:
            raise RuntimeError("a batch started before fork() is used in the child")
        job.batch = self
        with h.lock:
            q = h.queue
            while q and q[0].state != NEW:   # jobs callers ran themselves
                q.popleft()
            q.append(job)
            self.mine.append(job)
            if self.helping < self.limit:   # at its limit, its own helpers take it when done
                h.work.notify()

    def handoff(self, timeout: float = HANDOFF_S) -> None:
        """Wait, at most ``timeout`` seconds, until a helper has started one of the jobs queued: a
        helper woken for a job needs the GIL to start it, which a caller going on in Python holds
        for up to the interpreter's switch interval (5 ms). Measured before this wait: the corpus
        model's bases queued while the calling thread checked the headers, and the helper started
        on them 1.5 ms later, a tenth of the decode."""
        if not self.shared:
            return
        h = self.helpers
        deadline = time.monotonic() + timeout
        with h.lock:
            self.handing_off = True
            try:
                while self.helping == 0 and any(j.state == NEW for j in self.mine):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return
                    h.done.wait(left)
            finally:
                self.handing_off = False

    def _take(self, job: Job) -> Job | None:
        """``job`` itself if nobody started it, else another of this batch's; marked running."""
        mine = self.mine
        while mine and mine[0].state != NEW:   # started or done: only NEW ones matter here
            mine.popleft()
        if job.state == NEW:
            _start(job)
            return job
        while mine:
            j = mine.popleft()
            if j.state == NEW:
                _start(j)
                return j
        return None

    def wait(self, job: Job) -> None:
        if job.batch is None:   # never queued: it runs here (once)
            if job.state == NEW:
                job.state = RUNNING
                job.run()
                job.state = DONE
                _interrupted(job)
            return
        h = self.helpers
        if h is not _helpers:
            raise RuntimeError("a batch started before fork() is waited on in the child")
        while True:
            with h.lock:
                if job.state == DONE:
                    return
                mine = self._take(job)
                if mine is None:
                    h.done.wait()
                    continue
            try:
                mine.run()
            finally:
                _finish(mine)
            _interrupted(mine)

    def close(self) -> None:
        if not self.shared:     # nothing of it was ever queued
            return
        h = self.helpers
        if h is not _helpers:   # in a forked child: the threads that ran its jobs are not here
            return
        if h.lock._is_owned():  # type: ignore[attr-defined]
            # a finalizer (the GC finalizing an abandoned decode generator, a signal handler) on a
            # thread inside the lock: taking it again would deadlock, and so would waiting (jobs
            # finishing elsewhere need the lock). Drop what nobody started -- states only, nothing the
            # interrupted code may be iterating is restructured -- and return.
            for j in self.mine:
                if j.state == NEW:
                    j.state = DONE
            return
        me = threading.get_ident()
        with h.lock:
            for j in self.mine:
                if j.state == NEW:
                    j.state = DONE   # dropped
            self.mine.clear()
            if any(j.batch is self for j in h.queue):
                h.queue = deque(j for j in h.queue if j.batch is not self)
            # wait for its jobs on other threads; one on this thread is the caller's own, abandoned
            # (an interrupt between taking and running it) or below us on this stack
            while any(j.thread != me for j in self.running):
                h.done.wait()


def run_jobs(jobs: Sequence[tuple[Any, ...]], workers: int, elems: Sequence[int] | None = None) -> None:
    """Run ``(fn, *args)`` jobs on the calling thread and ``workers − 1`` helpers.

    ``elems`` (one count per job, optional): jobs on fewer than SHARED_MIN_ELEMS elements run on the
    calling thread alone (first, while the helpers start on the others); the shared ones start largest
    first. Why: a batch's one large block started last kept one core busy alone at its end (a pure-BF16
    step's largest block is a third of its encoding time). An error is raised once no job is running on
    another thread; jobs not yet started then do not run: an error of a job run here at once, one of a
    shared job once every shared job before it in job order has run: the first in job order.
    """
    batch = Batch(workers)
    try:
        shared: list[Job] = []
        sizes: list[int] = []
        small: list[tuple[Any, ...]] = []
        for k, (fn, *args) in enumerate(jobs):
            if batch.shared and (elems is None or elems[k] >= SHARED_MIN_ELEMS):
                shared.append(Job(fn, tuple(args)))
                sizes.append(0 if elems is None else elems[k])
            else:
                small.append((fn, *args))
        order = sorted(range(len(shared)), key=lambda i: -sizes[i])   # stable: job order among equals
        for i in order:
            batch.submit(shared[i])
        for fn, *args in small:
            fn(*args)
        for i in order:
            batch.wait(shared[i])
            if shared[i].error is not None:
                for job in shared[:i]:   # an earlier job's error comes first
                    batch.wait(job)
                raise next(job.error for job in shared[:i + 1] if job.error is not None)
    finally:
        batch.close()
