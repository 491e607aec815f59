"""Running a batch of independent jobs on the calling thread plus helper threads."""
from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

# Jobs on fewer elements than this run on the calling thread only: with the GIL, sharing them costs
# more than it saves (measured: a model's norms and biases decode slower on two threads than on one).
SHARED_MIN_ELEMS = 1 << 18


def run_jobs(jobs: Sequence[tuple[Any, ...]], workers: int, elems: Sequence[int] | None = None) -> None:
    """Run ``(fn, *args)`` jobs on the calling thread and ``workers − 1`` helper threads, in order.

    ``elems`` (one count per job, optional): jobs on fewer than SHARED_MIN_ELEMS elements run on the
    calling thread alone, while the helpers start on the others. Why not a pool: the caller works too
    instead of waiting on futures, and there is no hand-off per job. The first error stops the others
    from starting new jobs and is raised here.
    """
    small: Sequence[tuple[Any, ...]] = ()
    if elems is not None:
        small = [j for j, n in zip(jobs, elems) if n < SHARED_MIN_ELEMS]
        jobs = [j for j, n in zip(jobs, elems) if n >= SHARED_MIN_ELEMS]
    if workers <= 1 or not jobs:
        for fn, *args in list(small) + list(jobs):
            fn(*args)
        return
    it = iter(jobs)
    lock = threading.Lock()
    errors: list[BaseException] = []

    def drain() -> None:
        while not errors:
            with lock:
                job = next(it, None)
            if job is None:
                return
            try:
                job[0](*job[1:])
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
                errors.append(exc)
                return

    helpers = [threading.Thread(target=drain, name="arcfmt-worker") for _ in range(min(workers - 1, len(jobs)))]
    for t in helpers:
        t.start()
    try:
        for fn, *args in small:
            if errors:
                break
            fn(*args)
    except BaseException as exc:  # noqa: BLE001
        errors.append(exc)
    drain()
    for t in helpers:
        t.join()
    if errors:
        raise errors[0]
