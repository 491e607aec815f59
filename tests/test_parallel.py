"""arcfmt.parallel: every job runs once, small ones on the calling thread, errors reach the caller in job
order; the helpers outlive a call and a batch's close leaves none of its jobs running."""
from __future__ import annotations

import os
import threading
import time

import pytest

from arcfmt.errors import CorruptError
from arcfmt.parallel import DONE, SHARED_MIN_ELEMS, Batch, Job, run_jobs


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


def test_the_first_error_in_job_order_wins():
    def bad(k):
        raise CorruptError(f"job {k} is bad")

    jobs = [(lambda: None,)] * 3 + [(bad, 3)] + [(lambda: None,)] * 3 + [(bad, 7)]
    for _ in range(20):   # whichever thread gets there first
        with pytest.raises(CorruptError, match="job 3"):
            run_jobs(jobs, 3, elems=[SHARED_MIN_ELEMS] * len(jobs))


def test_largest_jobs_start_first_and_the_first_error_in_job_order_still_wins():
    """Shared jobs start largest first (a large block started last kept one core busy alone at the
    end); a larger job's error, met first, waits for the smaller jobs before it in job order, and the
    first error in job order is the one raised."""
    started, lock = [], threading.Lock()

    def job(k):
        with lock:
            started.append(k)

    sizes = [SHARED_MIN_ELEMS, 4 * SHARED_MIN_ELEMS, 2 * SHARED_MIN_ELEMS, 8 * SHARED_MIN_ELEMS]
    run_jobs([(job, k) for k in range(4)], 2, elems=sizes)
    assert started[:2] in ([3, 1], [1, 3]) and sorted(started) == [0, 1, 2, 3]

    def bad(k):
        raise CorruptError(f"job {k} is bad")

    jobs = [(lambda: None,), (bad, 1), (lambda: None,), (bad, 3)]
    for _ in range(20):
        with pytest.raises(CorruptError, match="job 1"):
            run_jobs(jobs, 2, elems=sizes)   # job 3, the largest, fails first


def test_helpers_live_on_and_are_not_started_per_call():
    run_jobs([(lambda: None,)] * 4, 3, elems=[SHARED_MIN_ELEMS] * 4)
    before = {t.ident for t in threading.enumerate() if t.name.startswith("arcfmt-helper")}
    assert len(before) >= 2
    for _ in range(50):
        run_jobs([(lambda: None,)] * 4, 3, elems=[SHARED_MIN_ELEMS] * 4)
    after = {t.ident for t in threading.enumerate() if t.name.startswith("arcfmt-helper")}
    assert after == before


def test_close_drops_queued_jobs_and_waits_for_running_ones():
    """After close() no job of the batch runs or is running: the pipeline's buffers are free then."""
    gate, started, ran = threading.Event(), threading.Event(), []

    def slow():
        started.set()
        gate.wait(5)
        ran.append("slow")

    batch = Batch(2)
    first = Job(slow, ())
    batch.submit(first)
    assert started.wait(5)     # a helper runs it
    queued = [Job(ran.append, (k,)) for k in range(5)]
    for j in queued:
        batch.submit(j)
    closer = threading.Thread(target=batch.close)
    closer.start()
    closer.join(0.2)
    assert closer.is_alive()   # waiting for the running job
    gate.set()
    closer.join(5)
    assert not closer.is_alive()
    assert first.state == DONE and ran[0] == "slow"
    time.sleep(0.05)
    assert all(j.state == DONE for j in queued) and len(ran) <= 1 + 5
    n = len(ran)
    time.sleep(0.05)
    assert len(ran) == n       # nothing of the batch runs after close


def test_wait_runs_a_job_nobody_started_on_the_caller():
    batch = Batch(2)
    try:
        # keep the helper busy, then queue a job: waiting for it runs it here
        gate = threading.Event()
        busy = Job(gate.wait, (5,))
        batch.submit(busy)
        here = Job(threading.current_thread, ())
        batch.submit(here)
        for _ in range(100):
            if busy.state != 0:
                break
            time.sleep(0.01)
        batch.wait(here)
        assert here.result is threading.current_thread()
        gate.set()
        batch.wait(busy)
    finally:
        batch.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_starts_its_own_helpers():
    run_jobs([(lambda: None,)] * 4, 2, elems=[SHARED_MIN_ELEMS] * 4)
    pid = os.fork()
    if pid == 0:   # the child has none of the parent's threads: the jobs must still run
        code = 1
        try:
            out = []
            run_jobs([(out.append, k) for k in range(6)], 2, elems=[SHARED_MIN_ELEMS] * 6)
            code = 0 if sorted(out) == list(range(6)) else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def test_a_batch_uses_no_more_helpers_than_it_asked_for():
    run_jobs([(lambda: None,)] * 6, 4, elems=[SHARED_MIN_ELEMS] * 6)   # three helpers exist now
    lock, now, most = threading.Lock(), [0], [0]

    def job():
        with lock:
            now[0] += 1
            most[0] = max(most[0], now[0])
        time.sleep(0.01)
        with lock:
            now[0] -= 1

    batch = Batch(2)
    try:
        jobs = [Job(job, ()) for _ in range(12)]
        for j in jobs:
            batch.submit(j)
        time.sleep(0.05)   # the helpers alone, before the caller joins in
        for j in jobs:
            batch.wait(j)
    finally:
        batch.close()
    assert most[0] <= 2   # one helper and the caller


def test_a_job_queued_while_another_caller_waits_starts_on_an_idle_helper():
    """Helpers and callers wait on separate conditions: a caller of another batch never swallows the
    wake-up meant for an idle helper."""
    from arcfmt import parallel

    n = max(1, len(parallel._helpers.threads))
    gate = threading.Event()
    a = Batch(n + 1)
    busy = [Job(gate.wait, (5,)) for _ in range(n)]
    for j in busy:              # every helper there is now busy
        a.submit(j)
    for _ in range(500):
        if all(j.state != 0 for j in busy):
            break
        time.sleep(0.002)
    waiter = threading.Thread(target=a.wait, args=(busy[0],))
    waiter.start()              # a caller waits ...
    time.sleep(0.05)
    b = Batch(n + 2)            # ... before a new helper starts waiting for work
    time.sleep(0.05)
    started = threading.Event()
    quick = Job(started.set, ())
    b.submit(quick)
    try:
        assert started.wait(1), "the idle helper never took the job"
    finally:
        gate.set()
        waiter.join(5)
        b.wait(quick)
        a.close()
        b.close()


def test_close_from_inside_one_of_the_batchs_own_jobs_returns():
    """A decode generator finalized (e.g. by the garbage collector) on a helper that runs one of its own
    jobs closes its batch there: close() must not wait for the job it is called from."""
    batch = Batch(2)
    out = []

    def job():
        batch.close()
        out.append("closed")

    j = Job(job, ())
    batch.submit(j)
    for _ in range(200):
        if j.state == DONE:
            break
        time.sleep(0.01)
    assert j.state == DONE and out == ["closed"] and j.error is None


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_child_forked_while_a_batch_runs_can_close_it():
    gate = threading.Event()
    batch = Batch(2)
    job = Job(gate.wait, (5,))
    batch.submit(job)
    time.sleep(0.05)
    pid = os.fork()
    if pid == 0:   # the helper running the job is not in the child: close() must not wait for it
        try:
            batch.close()
        finally:
            os._exit(0)
    try:
        for _ in range(500):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.01)
        else:
            os.kill(pid, 9)
            raise AssertionError("the child hung in close()")
    finally:
        gate.set()
        batch.wait(job)
        batch.close()


def test_close_on_a_thread_inside_the_helpers_lock_returns():
    """The garbage collector can finalize an abandoned decode generator on a thread that holds the
    helpers' lock: its close() must drop what nobody started and return, not wait on that lock."""
    from arcfmt import parallel

    gate = threading.Event()
    batch = Batch(2)
    running = Job(gate.wait, (5,))
    batch.submit(running)
    for _ in range(500):
        if running.state != 0:
            break
        time.sleep(0.002)
    queued = Job(lambda: None, ())
    batch.submit(queued)
    done = []
    closer = threading.Thread(target=lambda: (parallel._helpers.lock.acquire(), batch.close(),
                                              parallel._helpers.lock.release(), done.append(1)), daemon=True)
    closer.start()
    closer.join(2)
    try:
        assert done == [1], "close() inside the lock hung"
        assert queued.state == DONE
    finally:
        gate.set()
        batch.wait(running)
        batch.close()


def test_blocks_loaded_ahead_fail_in_block_order():
    """The pipeline loads a tensor's blocks ahead of decoding them (warm caches for the Python); a
    loader's failure must still reach its own block's job, after the blocks before it, and the
    blocks after it are loaded only where they are decoded."""
    from arcfmt import pipeline

    calls = []

    def ok(b):
        def load():
            calls.append(b)
            return (b, memoryview(b"x"))
        return load

    def bad():
        calls.append("bad")
        raise ValueError("block 2 is damaged")

    out = list(pipeline._loaded_ahead([ok(0), ok(1), bad, ok(3), ok(4)]))
    assert calls == [0, 1, "bad"]                       # read ahead, stopped at the failure
    assert [f()[0] for f in out[:2]] == [0, 1]
    with pytest.raises(ValueError, match="block 2"):
        out[2]()
    assert [f()[0] for f in out[3:]] == [3, 4]          # loaded now, where they are decoded
    assert calls[-2:] == [3, 4]
    many = list(pipeline._loaded_ahead([ok(i) for i in range(20)]))
    assert len(many) == 20 and [f()[0] for f in many] == list(range(20))
    one = list(pipeline._loaded_ahead([ok(7)]))        # one block (most tensors): loaded at once too
    assert calls[-1] == 7 and [f()[0] for f in one] == [7]
    with pytest.raises(ValueError, match="block 2"):
        list(pipeline._loaded_ahead([bad]))[0]()


@pytest.mark.parametrize("blocks", [1, 3])
def test_a_loader_raising_stopiteration_is_a_failure_not_the_end(blocks):
    """A loader's StopIteration is its block's failure, raised by the block's job: once taken for the
    end of the loaders, it dropped the tensor from the output without an error."""
    from arcfmt import pipeline

    def stop():
        raise StopIteration

    loads = [(lambda b=b: (b, memoryview(b"x"))) for b in range(blocks - 1)] + [stop]
    out = list(pipeline._loaded_ahead(loads))
    assert len(out) == blocks
    assert [f()[0] for f in out[:-1]] == list(range(blocks - 1))
    with pytest.raises(StopIteration):
        out[-1]()


def _stalled_big_then_small(monkeypatch, smalls: int, stall_s: float):
    """Run the pipeline on one large tensor (shared) whose decode stalls until every small tensor
    after it has decoded (or ``stall_s`` passes), then ``smalls`` small ones; the decode order."""
    import numpy as np

    from arcfmt import pipeline, records
    from arcfmt.dtypes import from_name
    from arcfmt.integrity import tensor_hash

    bf16 = from_name("BF16")
    zero_hash = {n: tensor_hash(np.zeros(n, np.uint16)) for n in (SHARED_MIN_ELEMS, 64)}
    big = records.TensorHeader("big", bf16, (SHARED_MIN_ELEMS,), SHARED_MIN_ELEMS, None, zero_hash[SHARED_MIN_ELEMS])
    small = [records.TensorHeader(f"s{i}", bf16, (64,), 64, None, zero_hash[64]) for i in range(smalls)]
    order: list[str] = []
    all_small = threading.Event()

    def fake_decode(th, b, loaded, base_block, out, *, changes=False, history=None):
        if th.name == "big":
            all_small.wait(stall_s)
            order.append("big")
        else:
            order.append(th.name)
            if len(order) == smalls:
                all_small.set()
        out[:] = 0

    monkeypatch.setattr(pipeline, "decode_block", fake_decode)
    headers = [big, *small]
    items = [pipeline.Item(h, None, [lambda: (None, memoryview(b""))]) for h in headers]
    sink = pipeline.ArraySink(1 << 30, headers)
    t0 = time.perf_counter()
    names = [n for n, _ in pipeline.run(items, sink, workers=2, window=2)]
    assert names == [h.name for h in headers]   # committed in item order whatever the decode order
    return order, time.perf_counter() - t0


def test_small_tensors_decode_here_while_a_shared_block_is_in_flight(monkeypatch):
    """The window counts shared blocks only: the caller goes on with small tensors (each decoded on
    this thread at once) while a helper decodes a large one, instead of waiting for it after the
    first few (the helper then idled at the end while the caller did the small ones alone)."""
    order, took = _stalled_big_then_small(monkeypatch, smalls=6, stall_s=10)
    assert order == [f"s{i}" for i in range(6)] + ["big"] and took < 5


def test_blocks_waiting_behind_a_shared_one_are_bounded(monkeypatch):
    """At most MAX_PENDING blocks wait to be completed behind the oldest: past that the caller
    waits for it (what done small blocks hold stays bounded)."""
    from arcfmt import pipeline

    monkeypatch.setattr(pipeline, "MAX_PENDING", 3)
    order, _ = _stalled_big_then_small(monkeypatch, smalls=6, stall_s=3)
    assert order.index("big") == 2   # the big block and two small ones pending: the caller waited


@pytest.mark.parametrize("workers", [1, 2])
def test_the_first_failing_check_in_file_order_wins(workers):
    """§12.1 step 6 tensor by tensor, as the spec orders the checks (header, then base): a wrong base
    of a large tensor (hashed by a helper) is reported before a damaged TENS record of a later tensor,
    and a later wrong base before nothing earlier."""
    import numpy as np

    import arcfmt
    from arcfmt import records
    from arcfmt.errors import ReservedBitsError, WrongBaseError
    from support.records import assemble, split, tens_payload

    rng = np.random.default_rng(7)
    big = rng.integers(0, 1 << 14, SHARED_MIN_ELEMS, dtype=np.uint16)
    small = rng.integers(0, 1 << 14, 64, dtype=np.uint16)
    base = {"a": big, "b": small}
    target = {"a": big ^ np.uint16(1), "b": small ^ np.uint16(1)}
    p = split(arcfmt.encode(base, target), block_records=True)
    j = [i for i, r in enumerate(p.recs) if r.type == b"TENS"][1]
    th = records.parse_tensor(p.recs[j].payload, "")
    p.recs[j].payload = tens_payload(th.name.encode(), th.dtype.code, th.shape, th.block_elems, 3, th.base_hash,
                                     th.target_hash)
    damaged = assemble(p)
    wrong_a = {"a": big ^ np.uint16(2), "b": small}
    for names in (None, ["b", "a"]):   # file order, whatever order the caller names them in
        with pytest.raises(WrongBaseError, match="'a'"):
            arcfmt.decode(wrong_a, damaged, workers=workers, names=names)
    with pytest.raises(ReservedBitsError):
        arcfmt.decode(base, damaged, workers=workers)
    good = arcfmt.encode(base, target)
    with pytest.raises(WrongBaseError, match="'b'"):
        arcfmt.decode({"a": big, "b": small ^ np.uint16(2)}, good, workers=workers)
    out = arcfmt.decode(base, good, workers=workers)
    assert all(np.array_equal(v.view(np.uint16), target[k]) for k, v in out.items())
    assert list(arcfmt.decode(base, good, workers=workers, names=["b", "a"])) == ["b", "a"]


def test_large_bases_are_hashed_first_on_every_thread(monkeypatch):
    """The bases are checked once every header is read: the large ones first, on the calling thread
    and the helpers at once (handed over one by one between headers, they waited for the GIL while
    the caller read the next headers), the small ones after them; and a damaged header before a
    wrong large base is still the failure reported (the earlier check in file order)."""
    import numpy as np

    import arcfmt
    from arcfmt import pipeline, records
    from arcfmt.errors import ReservedBitsError
    from support.records import assemble, split, tens_payload

    rng = np.random.default_rng(3)
    base = {"a": rng.integers(0, 1 << 14, 64, dtype=np.uint16),
            "b": rng.integers(0, 1 << 14, SHARED_MIN_ELEMS, dtype=np.uint16),
            "c": rng.integers(0, 1 << 14, 2 * SHARED_MIN_ELEMS, dtype=np.uint16)}
    target = {k: v ^ np.uint16(1) for k, v in base.items()}
    delta = arcfmt.encode(base, target)
    started: list[tuple[str, int]] = []
    check = pipeline.check_base

    def stalled(th, b):
        started.append((th.name, threading.get_ident()))
        if th.size >= SHARED_MIN_ELEMS:
            time.sleep(0.2)   # long enough for the other thread to take the other large base
        return check(th, b)

    monkeypatch.setattr(pipeline, "check_base", stalled)
    arcfmt.decode(base, delta, workers=2)
    assert [n for n, _ in started] in (["c", "b", "a"], ["b", "c", "a"])
    assert started[0][1] != started[1][1]   # both large ones at once, on two threads

    p = split(delta, block_records=True)
    j = [i for i, r in enumerate(p.recs) if r.type == b"TENS"][0]
    th = records.parse_tensor(p.recs[j].payload, "")
    p.recs[j].payload = tens_payload(th.name.encode(), th.dtype.code, th.shape, th.block_elems, 3, th.base_hash,
                                     th.target_hash)
    with pytest.raises(ReservedBitsError):
        arcfmt.decode({**base, "c": base["c"] ^ np.uint16(2)}, assemble(p), workers=2)


def test_large_blocks_start_while_the_checks_are_made(monkeypatch):
    """A decode on two threads starts the largest tensors' blocks while the calling thread still checks
    the other tensors (§12.1 step 6): the small tensor's base check waits here until a large block
    has started, which it does without any check being skipped, and the output is the target."""
    import numpy as np

    import arcfmt
    from support.data import EarlyProbe, large_after_small

    base, target, delta = large_after_small(11)
    probe = EarlyProbe(monkeypatch)
    out = arcfmt.decode(base, delta, workers=2)
    assert probe.seen == [True]
    assert all(np.array_equal(out[k].view(np.uint16), target[k]) for k in target)
    probe.reset(wait_s=0.3)
    out = arcfmt.decode(base, delta, workers=1)   # one thread: no block before every check is made
    assert probe.seen == [False] and probe.began.is_set()
    assert all(np.array_equal(out[k].view(np.uint16), target[k]) for k in target)


def _with_block_damaged(delta: bytes, which: int) -> bytes:
    """``delta`` with the last stream byte of its block ``which`` (of every block, in file order, written
    as records) flipped: that block fails its checks, or its tensor its hash."""
    from support.records import assemble, split

    p = split(delta, block_records=True)
    j = [i for i, r in enumerate(p.recs) if r.type == b"BLCK"][which]
    payload = bytearray(p.recs[j].payload)
    payload[-1] ^= 0xFF
    p.recs[j].payload = bytes(payload)
    return assemble(p)


def _reported_as_one_thread_reports_it(base, damaged: bytes) -> None:
    import arcfmt
    from arcfmt.errors import ArcError

    with pytest.raises(ArcError) as two:
        arcfmt.decode(base, damaged, workers=2)
    with pytest.raises(type(two.value)) as one:
        arcfmt.decode(base, damaged, workers=1)
    assert str(two.value) == str(one.value)


def test_a_block_started_early_never_outranks_a_check(monkeypatch):
    """A damaged block of the large tensor, decoded while the checks run: a failing check of a tensor
    after it in the file is what is reported (step 6 before step 7), the block's own failure only when
    every check passed; and the decode returns only once no helper is still writing its buffers."""
    import numpy as np

    import arcfmt
    from arcfmt import pipeline
    from arcfmt.errors import WrongBaseError
    from support.data import large_after_small

    base, _, delta = large_after_small(12)
    damaged = _with_block_damaged(delta, -1)   # the large tensor's last block
    # the small tensor comes first in the file: move the large one's check after it by a wrong small base
    wrong_small = {**base, "small": base["small"] ^ np.uint16(2)}
    finished: list[float] = []
    decode_job = pipeline._decode_job

    def slow(th, *args):
        try:
            time.sleep(0.05)
            return decode_job(th, *args)
        finally:
            finished.append(time.monotonic())

    monkeypatch.setattr(pipeline, "_decode_job", slow)
    for _ in range(3):
        finished.clear()
        with pytest.raises(WrongBaseError, match="'small'"):
            arcfmt.decode(wrong_small, damaged, workers=2)
        returned = time.monotonic()
        assert all(t <= returned for t in finished)
        _reported_as_one_thread_reports_it(base, damaged)


def test_handoff_returns_once_a_helper_has_started():
    """``Batch.handoff`` returns as soon as a helper has taken one of the batch's queued jobs (it needs
    the GIL for that, which the caller's Python would hold); with every helper busy elsewhere it gives
    up after its timeout, and the job still runs."""
    from arcfmt.parallel import NEW

    batch = Batch(2)
    try:
        job = Job(time.sleep, (0.05,))
        batch.submit(job)
        batch.handoff(timeout=10)
        assert job.state != NEW
        batch.wait(job)
    finally:
        batch.close()

    from arcfmt import parallel

    release = threading.Event()
    n = len(parallel._helpers.threads)   # (earlier tests may have started more than one)
    other = Batch(n + 1)
    busy = [Job(release.wait, (10,)) for _ in range(n)]
    for j in busy:
        other.submit(j)
    batch = Batch(2)
    try:
        deadline = time.monotonic() + 10
        while any(j.state == NEW for j in busy) and time.monotonic() < deadline:   # every helper taken
            time.sleep(0.01)
        job = Job(lambda: None, ())
        batch.submit(job)
        t = time.monotonic()
        batch.handoff(timeout=0.1)
        assert 0.09 <= time.monotonic() - t < 5 and job.state == NEW
        batch.wait(job)   # run here
        assert job.state == DONE
    finally:
        release.set()
        batch.close()
        for j in busy:
            other.wait(j)
        other.close()


def test_a_tensor_started_in_part_is_finished_by_run(monkeypatch):
    """Early starts at most its window's blocks: a tensor of more gets its first ones started while
    the checks are made and the rest from :func:`run`, in block order (its hash is fed in order); a
    damaged block on either side of the cut is reported as one thread reports it."""
    import numpy as np

    import arcfmt
    from arcfmt import pipeline, reader
    from support.data import large_after_small

    monkeypatch.setattr(reader, "DECODE_WINDOW_PER_WORKER", 1)   # two blocks early, on two threads
    base, target, delta = large_after_small(5, large_blocks=3)
    taken: list[int] = []
    take = pipeline.Early.take

    def counted(self, name):
        started = take(self, name)
        if started is not None:
            taken.append(len(started.blocks))
        return started

    monkeypatch.setattr(pipeline.Early, "take", counted)
    out = arcfmt.decode(base, delta, workers=2)
    assert taken == [2]
    assert all(np.array_equal(out[k].view(np.uint16), target[k]) for k in target)
    for which in (-3, -1):   # the large tensor's first block (started early) and its last (by run)
        _reported_as_one_thread_reports_it(base, _with_block_damaged(delta, which))


def test_an_early_start_allocates_only_what_the_given_bases_back():
    """A small file that declares large tensors, decoded without their bases: the early start may not
    take the outputs as backed by bases not given (it starts only where every base is there, of its
    tensor's size), so nothing near their size is allocated before the wrong base is reported — the
    same as one thread."""
    import tracemalloc

    import numpy as np

    import arcfmt
    from arcfmt.errors import WrongBaseError

    base = {f"t{i}": np.zeros(1 << 22, np.uint16) for i in range(8)}   # 8 MiB each, unchanged
    delta = arcfmt.encode(base, base)
    assert len(delta) < 8192
    for workers in (1, 2):
        tracemalloc.start()
        try:
            with pytest.raises(WrongBaseError, match="'t0'"):
                arcfmt.decode(None, delta, workers=workers)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 8 << 20, (workers, peak)


def test_an_interrupt_during_the_early_start_leaves_no_helper_running(monkeypatch):
    """A Ctrl-C (or any exception) while the early start loads a block: the decode raises it, and only
    once the blocks it had started are done — no helper writes into its buffers after it returned."""
    import arcfmt
    from arcfmt import pipeline
    from arcfmt.reader import DeltaReader
    from support.data import large_after_small

    base, _, delta = large_after_small(9, large_blocks=3)
    big = {**base, "large2": base["large"].copy()}
    delta = arcfmt.encode(big, {k: v ^ 1 for k, v in big.items()}, block_elems=SHARED_MIN_ELEMS)
    running: set = set()
    decode_job = pipeline._decode_job

    def slow(th, b, *args):
        running.add((th.name, b))
        try:
            time.sleep(0.3)
            return decode_job(th, b, *args)
        finally:
            running.discard((th.name, b))

    monkeypatch.setattr(pipeline, "_decode_job", slow)
    reader = DeltaReader(delta, workers=2)
    load = reader._load

    def interrupted(name, b):   # the second tensor started: the first one's blocks are on their way
        if name == "large2":
            raise KeyboardInterrupt
        return load(name, b)

    reader._load = interrupted
    with pytest.raises(KeyboardInterrupt):
        reader.decode_all(big)
    assert running == set()
