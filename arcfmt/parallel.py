"""Running a batch of independent jobs on the calling thread plus helper threads."""
from __future__ import annotations

import threading


def run_jobs(jobs, workers: int) -> None:
    """Run ``(fn, *args)`` jobs on the calling thread and ``workers − 1`` helper threads, in order.

    Why not a pool: the caller works too instead of waiting on futures, and there is no hand-off per
    job — with the GIL, hand-offs cost more than the small blocks of a model's norms and biases.
    The first error stops the others from starting new jobs and is raised here.
    """
    if workers <= 1 or len(jobs) <= 1:
        for fn, *args in jobs:
            fn(*args)
        return
    it = iter(jobs)
    lock = threading.Lock()
    errors = []

    def drain():
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

    helpers = [threading.Thread(target=drain, name="arcfmt-dec") for _ in range(min(workers, len(jobs)) - 1)]
    for t in helpers:
        t.start()
    drain()
    for t in helpers:
        t.join()
    if errors:
        raise errors[0]
