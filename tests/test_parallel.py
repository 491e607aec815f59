"""arcfmt.parallel.run_jobs: every job runs once, small ones on the calling thread, errors reach the caller."""
from __future__ import annotations

import threading

import pytest

from arcfmt.errors import CorruptError
from arcfmt.parallel import SHARED_MIN_ELEMS, run_jobs


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_every_job_runs_once_and_small_ones_stay_on_the_caller(workers):
    ran, lock = [], threading.Lock()

    def job(i):
        with lock:
            ran.append((i, threading.current_thread() is threading.main_thread()))

    elems = [SHARED_MIN_ELEMS if i % 3 == 0 else 10 for i in range(30)]
    run_jobs([(job, i) for i in range(30)], workers, elems=elems)
    assert sorted(i for i, _ in ran) == list(range(30))
    assert all(on_caller for i, on_caller in ran if elems[i] < SHARED_MIN_ELEMS)


@pytest.mark.parametrize("workers", [1, 2])
def test_an_error_in_any_job_is_raised_to_the_caller(workers):
    def bad():
        raise CorruptError("block 7 is bad")

    jobs = [(lambda: None,)] * 5 + [(bad,)] + [(lambda: None,)] * 5
    with pytest.raises(CorruptError, match="block 7"):
        run_jobs(jobs, workers, elems=[SHARED_MIN_ELEMS] * len(jobs))
    with pytest.raises(CorruptError, match="block 7"):
        run_jobs(jobs, workers, elems=[1] * len(jobs))
