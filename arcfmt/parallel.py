"""Jobs on the calling thread plus helper threads that live as long as the process.

Why helpers that stay: starting and joining threads for every decode, base check or encoder batch
cost about 0.3 ms a call (a third of a millisecond on a 13.7 MB model's 7 ms decode), and a
``ThreadPoolExecutor`` per call as much again. The helpers wait on one condition; each caller's jobs
form a :class:`Batch`, which the caller also works through itself while it waits, so every core
decodes and nobody hands small jobs across threads for nothing.
"""
from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

# Jobs on fewer elements than this run on the calling thread only: with the GIL, sharing them costs
# more than it saves (measured: a model's norms and biases decode slower on two threads than on one).
SHARED_MIN_ELEMS = 1 << 18

NEW, RUNNING, DONE = 0, 1, 2


class Job:
    """``fn(*args)`` run once, on whichever thread takes it; its ``result`` or ``error`` stays here."""

    __slots__ = ("fn", "args", "state", "error", "result", "batch")

    def __init__(self, fn: Callable[..., object], args: tuple[object, ...]) -> None:
        self.fn, self.args, self.state = fn, args, NEW
        self.error: BaseException | None = None
        self.result: object = None
        self.batch: Batch | None = None

    def run(self) -> None:
        try:
            self.result = self.fn(*self.args)
        except BaseException as exc:  # noqa: BLE001 - raised by the caller, in order
            self.error = exc


class _Helpers:
    """The process's helper threads and the one queue they take jobs from (any caller's)."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.queue: deque[Job] = deque()
        self.threads: list[threading.Thread] = []

    def ensure(self, n: int) -> None:
        """At least ``n`` helpers (they are never stopped: idle, they wait on the condition)."""
        with self.cond:
            while len(self.threads) < n:
                t = threading.Thread(target=self._loop, name=f"arcfmt-helper-{len(self.threads)}", daemon=True)
                self.threads.append(t)
                t.start()

    def take(self) -> Job | None:
        """The oldest job nobody started whose batch has fewer helpers on it than it asked for,
        marked running (the caller holds ``cond``)."""
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
                return job
        return None

    def _loop(self) -> None:
        cond = self.cond
        while True:
            with cond:
                job = self.take()
                while job is None:
                    cond.wait()
                    job = self.take()
            job.run()
            _finish(job, helped=True)


def _start(job: Job) -> None:
    job.state = RUNNING
    if job.batch is not None:
        job.batch.running += 1


def _finish(job: Job, helped: bool = False) -> None:
    with _helpers.cond:
        job.state = DONE
        if job.batch is not None:
            job.batch.running -= 1
            job.batch.helping -= helped
        _helpers.cond.notify_all()


_helpers = _Helpers()


def _after_fork() -> None:  # a forked child has none of the parent's threads
    global _helpers
    _helpers = _Helpers()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


class Batch:
    """One caller's jobs: the calling thread plus at most ``workers − 1`` helpers at a time.

    :meth:`submit` queues a job for the helpers (or runs it at once, unshared); :meth:`wait` returns
    once a job is done, running it — or another of this batch's jobs nobody started — on the calling
    thread meanwhile; :meth:`close` drops the batch's jobs nobody started and waits for its running
    ones, so no job of it touches anything after ``close`` returns."""

    def __init__(self, workers: int) -> None:
        self.shared = workers > 1
        self.limit = workers - 1   # helpers on this batch's jobs at once: ``workers`` threads in all
        self.mine: deque[Job] = deque()
        self.running = 0           # of its jobs, on any thread
        self.helping = 0           # of its jobs, on helpers
        if self.shared:
            _helpers.ensure(workers - 1)

    def submit(self, job: Job, shared: bool = True) -> None:
        if not (shared and self.shared):
            job.state = RUNNING
            job.run()
            job.state = DONE
            return
        job.batch = self
        h = _helpers
        with h.cond:
            h.queue.append(job)
            self.mine.append(job)
            h.cond.notify()

    def _take(self, job: Job) -> Job | None:
        """``job`` itself if nobody started it, else another of this batch's; marked running."""
        if job.state == NEW:
            _start(job)
            return job
        mine = self.mine
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
            return
        cond = _helpers.cond
        while True:
            with cond:
                if job.state == DONE:
                    return
                mine = self._take(job)
                if mine is None:
                    cond.wait()
                    continue
            mine.run()
            _finish(mine)

    def close(self) -> None:
        cond = _helpers.cond
        with cond:
            for j in self.mine:
                if j.state == NEW:
                    j.state = DONE   # dropped: the helpers skip it
            self.mine.clear()
            while self.running:
                cond.wait()


def run_jobs(jobs: Sequence[tuple[Any, ...]], workers: int, elems: Sequence[int] | None = None) -> None:
    """Run ``(fn, *args)`` jobs on the calling thread and ``workers − 1`` helpers.

    ``elems`` (one count per job, optional): jobs on fewer than SHARED_MIN_ELEMS elements run on the
    calling thread alone, while the helpers start on the others. The first error (in job order) is
    raised once every started job has finished; jobs after a failed one may not run.
    """
    batch = Batch(workers)
    started: list[Job] = []
    try:
        small: list[Job] = []
        for k, (fn, *args) in enumerate(jobs):
            job = Job(fn, tuple(args))
            if elems is not None and elems[k] < SHARED_MIN_ELEMS or not batch.shared:
                small.append(job)
            else:
                batch.submit(job)
            started.append(job)
        for job in small:
            batch.wait(job)
            if job.error is not None:
                break
        for job in started:
            if job.state != DONE:
                batch.wait(job)
            if job.error is not None:
                raise job.error
    finally:
        batch.close()
