"""The one decode-and-verify path (SPEC.md §12.3): every consumer of decoded bytes is a sink of it.

Readers turn a file into a sequence of :class:`Item` (a checked tensor header, its checked base and a
loader per block); :func:`run` decodes the blocks — on the calling thread and helper threads — hashes
each tensor's bytes in order as they complete, and hands a tensor to its sink's ``commit`` only once
its hash matches ``target_hash``. The checks themselves (base, tensor hash, digests) live here once:
a new consumer (a new file, an in-place file, live arrays, a GPU engine) is a new sink, never a new
copy of them.

A sink's ``open(th)`` returns a per-tensor object with ``buffer(b, encoding, base_block, drain)``
(where block ``b``'s elements go: a flat unsigned array of the block's length), ``done(b, arr)``
(block ``b`` is decoded and hashed, called in order) and ``commit()`` (the tensor verified; its
return value is what :func:`run` yields). Buffers may be private staging memory: nothing is exposed
before ``commit``.
"""
from __future__ import annotations

import enum
import functools
import os
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import numpy as np
import xxhash

from . import backend, encodings, records
from . import layout as L
from .arrays import PAGE, Stored, as_uint, is_mapped, numpy_view, release
from .dtypes import DType
from .errors import ArcError, CorruptError, LimitError, VerificationError, WrongBaseError
from .integrity import DigestEntry, KnownBase, model_digest, tensor_hash
from .layout import BytesLike
from .parallel import DONE, SHARED_MIN_ELEMS, Batch, Job, run_jobs

_T = TypeVar("_T")
_T_co = TypeVar("_T_co", covariant=True)

# What a block loader returns: the checked block header and its payload
Loaded = tuple[records.BlockInfo, BytesLike]


class TensorOutput(Protocol[_T_co]):
    """What a sink's ``open(th)`` returns: where one tensor's blocks go (see the module docstring)."""

    def buffer(self, b: int, encoding: int | None, base_block: np.ndarray | None,
               drain: Callable[[], None]) -> np.ndarray: ...

    def done(self, b: int, arr: np.ndarray) -> None: ...

    def commit(self) -> _T_co: ...


class Sink(Protocol[_T_co]):
    """A consumer of verified tensors: :func:`run` yields what its tensors' ``commit()`` return."""

    def open(self, th: records.TensorHeader) -> TensorOutput[_T_co]: ...

# Decoded output not backed by a base of the same size that a decoder allocates by default: at least
# this much, or OUTPUT_PER_FILE_BYTE times the file's size (SPEC.md §17: a small file can declare huge
# tensors; a caller who expects more says so with max_output_bytes).
DEFAULT_MIN_OUTPUT = 256 << 20
OUTPUT_PER_FILE_BYTE = 16


def default_output_budget(file_size: int) -> int:
    return max(DEFAULT_MIN_OUTPUT, OUTPUT_PER_FILE_BYTE * file_size)


# --------------------------------------------------------------------------------------- checks

def check_base(th: records.TensorHeader, base: object) -> np.ndarray | None:
    """§12.3 step 1: the base tensor's flat unsigned view, once it is the one the file names."""
    if not th.needs_base:
        return None
    if base is None:
        raise WrongBaseError(f"tensor {th.name!r} needs its base, which was not given")
    known = base.hash if isinstance(base, KnownBase) else None
    dt, shape, u = as_uint(base.array if isinstance(base, KnownBase) else base)
    if dt is not th.dtype or tuple(shape) != th.shape:
        raise WrongBaseError(f"base tensor {th.name!r} is {dt.name}{list(shape)}, the file expects "
                             f"{th.dtype.name}{list(th.shape)}")
    got = tensor_hash(u) if known is None else known
    if got != th.base_hash:
        raise WrongBaseError(f"base tensor {th.name!r} does not match the base this delta was made from "
                             f"(hash {got:016x}, expected {th.base_hash:016x})")
    return u


def base_structure(th: records.TensorHeader, base: object) -> np.ndarray | None:
    """The base's flat unsigned view when it is a C-contiguous array of the file's dtype and shape in
    its own memory, its hash not yet checked; else None (copies nothing, and raises nothing, whatever
    the object: its errors are :func:`check_base`'s to report, in their turn): what :class:`Early` may
    decode against while check_base still runs, which alone decides whether it is the right base."""
    try:
        x = base.array if isinstance(base, KnownBase) else base
        a = x if isinstance(x, Stored) else numpy_view(x)
        if a is None or (isinstance(a, np.ndarray) and not a.flags.c_contiguous):
            return None
        dt, shape, u = as_uint(a)
    except Exception:  # noqa: BLE001 - not a base to start on; check_base reports it in its turn
        return None
    return u if dt is th.dtype and tuple(shape) == th.shape else None


def check_previous(th: records.TensorHeader, base_u: np.ndarray | None, previous: object) -> Any:
    """§12.3 step 1 for a tensor with HISTORY (1.9), after its base: where its block codes come from
    (:class:`arcfmt.history.Source`), or None for a tensor without HISTORY."""
    if th.previous_hash is None:   # no HISTORY: nothing to check (and no import to run, tensor by tensor)
        return None
    from .history import checked
    return checked(th, base_u, previous)


def verify_hash(th: records.TensorHeader, digest: int) -> None:
    """§12.3 step 3."""
    if digest != th.target_hash:
        raise VerificationError(f"tensor {th.name!r}: reconstructed bytes do not match the target hash")


def digest_entries(headers: Iterable[records.TensorHeader], which: str = "target") -> list[DigestEntry]:
    """Model-digest entries (§13.2) of tensor headers: their target hashes, or (``"base"``) the base
    hashes of those that need a base."""
    if which == "target":
        return [(h.name.encode("utf-8"), h.dtype.code, h.shape, h.target_hash) for h in headers]
    return [(h.name.encode("utf-8"), h.dtype.code, h.shape, h.base_hash) for h in headers
            if h.base_hash is not None]  # h.needs_base


def check_digests(headers: Sequence[records.TensorHeader], index: records.Index) -> None:
    """§12.3 step 4 for a file whose every tensor is reconstructed (``headers``: all of them).

    Both digests are functions of the tensor headers, and every tensor is verified against its
    ``target_hash`` before it is exposed, so checking them from the headers — before any block is
    decoded — is the same check, made before anything is written.
    """
    if model_digest(digest_entries(headers)) != index.target_digest:
        raise VerificationError("the rebuilt model does not match the target digest in the index")
    base = digest_entries(headers, "base")
    if (model_digest(base) if base else L.NO_BASE_DIGEST) != index.base_digest:
        raise CorruptError("the base digest in the index does not match the tensors' base hashes")


def decode_block(th: records.TensorHeader, b: int, loaded: Loaded, base_block: np.ndarray | None,
                 out: np.ndarray, *, changes: bool = False, history: Any = None) -> np.ndarray | None:
    """Decode one loaded block (``(BlockInfo, payload)``) into ``out``; errors name the block. With
    ``changes``: the positions it changed, where the encoding hands them over (else None).
    ``history``: where a tensor with HISTORY gets its codes (§7, :func:`check_previous`), asked for this
    block's only where its encoding reads them."""
    info, payload = loaded
    if out is base_block and encodings.keeps_base(info.encoding):
        return None  # in place: the bytes are already there
    # the block's name is made only when an error is raised (a repr and a format: per block, it showed)
    try:
        streams = records.decode_block_streams(payload, info)
    except (CorruptError, LimitError) as exc:
        raise _named(exc, th, b) from None
    codes = None
    if history is not None and encodings.get(info.encoding).needs_history:
        codes = history.codes(*th.block_range(b))   # made here, on the decoding thread, before the block
    try:
        return encodings.decode_block(th.dtype, info.encoding, info.params, streams, out.size, base_block, out,
                                      changes=changes, history=codes)
    except ArcError as exc:
        raise _named(exc, th, b) from None


def _named(exc: ArcError, th: records.TensorHeader, b: int) -> ArcError:
    """``exc`` again, its message after the block's name."""
    return type(exc)(f"tensor {th.name!r} block {b}: {exc}")


# --------------------------------------------------------------------------------------- items

@dataclass
class Item:
    """One tensor to rebuild: its header, its checked base (flat unsigned view or None), one loader
    per block returning ``(BlockInfo, payload)`` (called on any thread, in any order), and the
    blocks' encodings when the index gives them before loading."""

    th: records.TensorHeader
    base_u: np.ndarray | None
    loaders: Iterable[Callable[[], Loaded]]
    encodings: Sequence[int] | None = None
    order: int = 0   # the tensor's place in the file: which of several failures :func:`run` reports
    history: Any = None   # where its blocks' history codes come from (HISTORY, §7): :func:`check_previous`


class _Drain(enum.Enum):
    DRAIN = enum.auto()


DRAIN = _Drain.DRAIN  # in an item sequence: finish every block in flight before the next item is taken


# --------------------------------------------------------------------------------------- scheduler

class _Tensor:
    __slots__ = ("item", "out", "hash", "left", "single", "mapped", "failed")

    def __init__(self, item: Item, out: TensorOutput[Any]) -> None:
        self.item, self.out = item, out
        base = item.base_u   # its blocks' base pages are handed back once decoded
        self.mapped = base is not None and base.nbytes >= PAGE and is_mapped(base)
        self.single = item.th.block_count == 1
        self.hash: xxhash.xxh3_64 | None = None if self.single else xxhash.xxh3_64()
        self.left = item.th.block_count
        self.failed = False   # a block of it failed (held by run's verify_last): never committed


def _decode_job(th: records.TensorHeader, b: int, load: Callable[[], Loaded], base_block: np.ndarray | None,
                arr: np.ndarray, hashed: list[int] | None,
                post: Callable[[int, np.ndarray, np.ndarray | None], None] | None,
                history: Any = None) -> None:
    changed = decode_block(th, b, load(), base_block, arr, changes=post is not None, history=history)
    if hashed is not None:  # a tensor of one block is hashed on the thread that decoded it
        hashed.append(tensor_hash(arr))
    if post is not None:    # the sink's own per-block work, on the same thread (e.g. StagedSink's diff)
        post(b, arr, changed)


# Blocks a tensor's loaders read and check ahead, back to back on the calling thread, at most (a batch
# ends once AHEAD_BYTES of payload are held): Python run right after a block's kernel finds the caches cold
# (measured on a 1.41 GB shard: a block's load held the GIL 91 µs there against 21 µs back to back).
AHEAD_BLOCKS = 8
AHEAD_BYTES = 16 << 20


def _given(loaded: Loaded) -> Loaded:
    return loaded


def _failed(exc: Exception) -> Loaded:
    raise exc


def _loaded_ahead(loaders: Iterable[Callable[[], Loaded]]) -> Iterable[Callable[[], Loaded]]:
    """``loaders``, each already called: up to AHEAD_BLOCKS at a time, before any of them is decoded.
    A loader's failure is handed to its own block's job (raised in block order, as if loaded there),
    and the blocks after it are loaded where they are decoded, as before."""
    if isinstance(loaders, list) and len(loaders) == 1:   # most tensors: one block, no batch to make
        return [_called(loaders[0])]
    return _batches_loaded(loaders)


def _called(load: Callable[[], Loaded]) -> functools.partial[Loaded]:
    """``load`` called now: what its block's job calls instead — its result, or its failure raised then
    (a StopIteration too: taken for the loaders' end, it once dropped a tensor without a word)."""
    try:
        return functools.partial(_given, load())
    except Exception as exc:  # noqa: BLE001 - raised by the block's job, in order
        return functools.partial(_failed, exc)


def _batches_loaded(loaders: Iterable[Callable[[], Loaded]]) -> Iterator[Callable[[], Loaded]]:
    """:func:`_loaded_ahead` of any number of loaders."""
    it = iter(loaders)
    while True:
        batch: list[Callable[[], Loaded]] = []
        held = 0
        while len(batch) < AHEAD_BLOCKS and held < AHEAD_BYTES:
            load = next(it, None)
            if load is None:
                break
            done = _called(load)
            batch.append(done)
            if done.func is _failed:   # the blocks after it are loaded where they are decoded
                yield from batch
                yield from it
                return
            held += len(done.args[0][1])
        if not batch:
            return
        yield from batch


# Blocks decoded or in flight but not yet completed (hashed in order, handed to the sink) at most, shared
# ones included (so it caps ``window`` too): a block run on this thread (under SHARED_MIN_ELEMS elements)
# is done at once but waits behind an older shared one; this bounds what such blocks hold (a staging
# sink: 64 blocks of under 2^18 elements, 128 MiB at 8-byte elements, a few MiB for a model's norms).
MAX_PENDING = 64


class _Started:
    """A tensor whose blocks :class:`Early` started: its sink output, and per block what :func:`run`
    completes (the job, its buffer, its base block, where a one-block tensor's hash goes)."""

    __slots__ = ("out", "blocks")

    def __init__(self, out: TensorOutput[Any],
                 blocks: list[tuple[Job, np.ndarray, np.ndarray | None, list[int] | None]]) -> None:
        self.out, self.blocks = out, blocks


def _no_drain() -> None:
    raise AssertionError("an early start's sink hands out buffers without draining")


class Early:
    """Large tensors' blocks started on the helpers while the calling thread still makes §12.1 step
    6's checks, for :func:`run` to complete as its own: into the sink's private buffers, their
    failures held as run holds any block's (SPEC.md §12.1: a decoder may start step 7 sooner when
    nothing it decodes is exposed or reported before the checks pass). If a check fails, :meth:`close`
    drops what nobody started and waits for the rest; the caller discards the sink.

    Why: those checks are Python for every tensor — 6 ms of a 22 ms decode of the corpus model —
    during which the helpers, done with the large bases' hashes, had nothing to do. Only for a sink
    whose buffers are private memory handed out at once (:class:`ArraySink`): a file sink's buffers
    are windows of its output, bounded and drained, and a staging sink works per block (``decoded``)."""

    def __init__(self, sink: Sink[Any], workers: int, max_blocks: int) -> None:
        assert not any(hasattr(sink, a) for a in ("in_flight_bytes", "needs_drain")), "not a private sink"
        self.sink = sink
        self.batch = Batch(workers)
        self.left = max_blocks if self.batch.shared else 0   # blocks it may still start
        self._started: dict[str, _Started] = {}

    def start(self, item: Item) -> None:
        """Queue ``item``'s first blocks (as many as it may still start) for the helpers, loaded here
        first (as :func:`run` loads them): a load's failure is its block's, held with the job. (Its
        ``loaders`` are a list: a random-access reader's.)"""
        th = item.th
        out = self.sink.open(th)
        assert getattr(out, "decoded", None) is None, "a sink with per-block work starts nothing early"
        blocks = []
        for b, load in enumerate(_loaded_ahead(list(item.loaders)[:max(0, self.left)])):
            s, e = th.block_range(b)
            base_block = None if item.base_u is None else item.base_u[s:e]
            arr = out.buffer(b, None if item.encodings is None else item.encodings[b], base_block, _no_drain)
            hashed: list[int] | None = [] if th.block_count == 1 else None
            job = Job(_decode_job, (th, b, load, base_block, arr, hashed, None, item.history))
            self.batch.submit(job)
            blocks.append((job, arr, base_block, hashed))
        self._started[th.name] = _Started(out, blocks)
        self.left -= len(blocks)

    def take(self, name: str) -> _Started | None:
        return self._started.pop(name, None)

    def close(self) -> None:
        self.batch.close()


def run(items: Iterable[Item | _Drain], sink: Sink[_T], *, workers: int = 1,
        window: int | None = None, verify_last: bool = True, early: Early | None = None) -> Iterator[_T]:
    """Decode and verify every item into ``sink``; yield each tensor's ``commit()`` in item order.

    ``verify_last``: random access (§12.1) decodes every block (step 7), then verifies (step 8): a
    block or tensor that fails is not committed, nothing is committed after it, and once every block
    has been tried the first failed block in file order (``Item.order``, then block) is raised, else
    the first tensor whose hash failed (R-CHECK-ORDER: the same category whatever order the blocks ran
    in); streaming (§12.2 step 3, ``False``) raises each failure at once, in file order by itself.

    ``window``: shared blocks (those other threads may take) in flight at most (default twice
    ``workers``); blocks small enough to run here go on meanwhile, so this thread decodes small
    tensors while helpers decode large ones. On any failure nothing more is committed, every thread
    has stopped touching the sink's buffers, and the error is raised. The sink's own ``finish()``
    (if any) runs after the last commit.

    ``early``: the blocks it started (for this ``sink``) are completed here in their tensor's turn,
    as if started here; the caller closes it.
    """
    pool = Batch(workers)
    threads = pool.shared
    window = window or max(2, 2 * workers)
    shared_pending = [0]  # of ``pending``, the blocks submitted to be shared
    # A sink whose buffers are a bounded resource (a file's write windows) says how many bytes of
    # blocks may be in flight at once: past that, the oldest are completed before the next is taken.
    cap = getattr(sink, "in_flight_bytes", None)
    in_flight = [0]
    pending: deque[tuple[_Tensor, int, Job, np.ndarray, np.ndarray | None, list[int] | None]] = deque()
    ready: list[_T] = []
    # with verify_last: ((0 a block's failure | 1 a tensor's hash, file order, block), error), as found
    failed: list[tuple[tuple[int, int, int], ArcError]] = []

    def verified(t: _Tensor, digest: int) -> bool:
        try:
            verify_hash(t.item.th, digest)
        except VerificationError as exc:
            if not verify_last:
                raise
            failed.append(((1, t.item.order, 0), exc))
            return False
        return True

    def block_failed(t: _Tensor, b: int, arr: np.ndarray, exc: BaseException) -> None:
        """A block's load or decode raised: held (random access) or raised (streaming, or not ours).
        Its buffer is still handed back (a file sink completes its ranges in order, and reuses them)."""
        if not verify_last or not isinstance(exc, ArcError):
            raise exc
        failed.append(((0, t.item.order, b), exc))
        t.failed = True
        t.out.done(b, arr)
        t.left -= 1

    def complete_one() -> None:
        t, b, job, arr, base_block, hashed = pending.popleft()
        in_flight[0] -= arr.nbytes
        if job.batch is not None:
            shared_pending[0] -= 1
        pool.wait(job)
        if job.error is not None:
            block_failed(t, b, arr, job.error)
            return
        completed(t, b, arr, base_block, hashed)

    def completed(t: _Tensor, b: int, arr: np.ndarray, base_block: np.ndarray | None, hashed: list[int] | None) -> None:
        if t.failed:   # an earlier block of it failed: its hash means nothing, it is never committed
            t.out.done(b, arr)
            t.left -= 1
            return
        ok = True
        if t.single:
            assert hashed is not None  # a tensor of one block is hashed where it was decoded
            ok = verified(t, hashed[0])
        else:
            assert t.hash is not None
            t.hash.update(arr.data.cast("B"))
        t.out.done(b, arr)
        if t.mapped and base_block is not None and base_block is not arr:
            release(base_block)
        t.left -= 1
        if t.left == 0:
            if not t.single:
                assert t.hash is not None
                ok = verified(t, t.hash.intdigest())
            if ok and not failed:   # nothing is committed once a failure is held
                ready.append(t.out.commit())

    def drain() -> None:
        while pending:
            complete_one()

    def queued(t: _Tensor, b: int, job: Job, arr: np.ndarray, base_block: np.ndarray | None,
               hashed: list[int] | None) -> None:
        """A block whose job was submitted: pending, and the oldest completed while the window is full."""
        pending.append((t, b, job, arr, base_block, hashed))
        in_flight[0] += arr.nbytes
        if job.batch is not None:
            shared_pending[0] += 1
        while pending and (pending[0][2].state == DONE or shared_pending[0] >= window
                           or len(pending) >= MAX_PENDING):
            complete_one()

    barrier = getattr(sink, "needs_drain", None)
    try:
        for item in items:
            if item is DRAIN:
                drain()
                yield from _flush(ready, failed)
                continue
            th = item.th
            if not failed and barrier is not None and barrier(th):  # e.g. the sink's next file starts here
                drain()
                yield from _flush(ready, failed)
            # after a held failure the sink is left as it was: the rest is decoded aside, only to find
            # the first failure in file order, and never committed
            started = None if early is None else early.take(th.name)
            t = _Tensor(item, started.out if started is not None else _Aside(th) if failed else sink.open(th))
            first = 0   # its first blocks started early are on their way: the rest as usual
            if started is not None:
                for b, block in enumerate(started.blocks):
                    queued(t, b, *block)
                first = len(started.blocks)
            if th.block_count == 0 and verified(t, tensor_hash(np.empty(0, th.dtype.uint))) and not failed:
                ready.append(t.out.commit())
            post = getattr(t.out, "decoded", None)   # the sink's own per-block work, if any
            loaders = list(item.loaders)[first:] if first else item.loaders
            for b, load in enumerate(_loaded_ahead(loaders), first):
                s, e = th.block_range(b)
                base_block = None if item.base_u is None else item.base_u[s:e]
                enc = None if item.encodings is None else item.encodings[b]
                while pending and cap is not None and in_flight[0] + (e - s) * th.dtype.itemsize > cap:
                    complete_one()
                arr = t.out.buffer(b, enc, base_block, drain)
                hashed: list[int] | None = [] if t.single else None
                shared = e - s >= SHARED_MIN_ELEMS and threads
                if not pending and not shared:   # nothing in flight: decode and finish it here, no job
                    try:
                        _decode_job(th, b, load, base_block, arr, hashed, post, item.history)
                    except Exception as exc:  # noqa: BLE001 - block_failed holds or re-raises it
                        block_failed(t, b, arr, exc)
                    else:
                        completed(t, b, arr, base_block, hashed)
                else:
                    job = Job(_decode_job, (th, b, load, base_block, arr, hashed, post, item.history))
                    pool.submit(job, shared=shared)
                    queued(t, b, job, arr, base_block, hashed)
                if ready:
                    yield from _flush(ready, failed)
        drain()
        if failed:
            raise min(failed, key=lambda f: f[0])[1]
        yield from _flush(ready)
        finish = getattr(sink, "finish", None)
        if finish is not None:
            finish()
    finally:
        pool.close()


class _Aside:
    """A tensor taken after :func:`run` holds a failure: decoded into buffers of its own (checked, as
    random access checks every block), never committed."""

    def __init__(self, th: records.TensorHeader) -> None:
        self.th = th

    def buffer(self, b: int, encoding: int | None, base_block: np.ndarray | None,
               drain: Callable[[], None]) -> np.ndarray:
        return np.empty(self.th.block_len(b), self.th.dtype.uint)

    def done(self, b: int, arr: np.ndarray) -> None:
        pass

    def commit(self) -> Any:
        raise AssertionError("a tensor decoded aside is never committed")


def _flush(ready: list[_T], failed: list[Any] | None = None) -> Iterator[_T]:
    """The verified tensors' commits, in order; none once a block or tensor has failed (raised last)."""
    while ready and not failed:
        yield ready.pop(0)


# --------------------------------------------------------------------------------------- array sinks

class ArraySink:
    """New arrays: each tensor's output is allocated within the caller's budget and yielded as
    ``(name, array)`` once verified. ``headers``: allocate these up front, in a few arenas
    (:func:`allocate_all`: small tensors share pages, and a process decoding again reuses them)."""

    def __init__(self, budget: int, headers: Sequence[records.TensorHeader] | None = None) -> None:
        self.budget = [budget]
        self.arena: dict[str, np.ndarray] = {}
        if headers:
            self.arena = dict(zip((h.name for h in headers), allocate_all(headers, self.budget)))

    def open(self, th: records.TensorHeader) -> _ArrayTensor:
        out = self.arena.pop(th.name, None)
        if out is None:
            out = allocate_all([th], self.budget)[0]
        return _ArrayTensor(th, out)


class _ArrayTensor:
    __slots__ = ("th", "flat")

    def __init__(self, th: records.TensorHeader, flat: np.ndarray) -> None:
        self.th, self.flat = th, flat

    def buffer(self, b: int, encoding: int | None, base_block: np.ndarray | None,
               drain: Callable[[], None]) -> np.ndarray:
        s, e = self.th.block_range(b)
        return self.flat[s:e]

    def done(self, b: int, arr: np.ndarray) -> None:
        pass

    def commit(self) -> tuple[str, np.ndarray]:
        return self.th.name, self.flat.view(self.th.dtype.numpy).reshape(self.th.shape)


class LiveSink:
    """Live arrays updated in place (a rollout engine's CPU weights). Changed blocks are staged in
    private memory and copied into the live array only once the whole tensor verified; unchanged
    blocks are never written. ``live``: name → writeable C-contiguous flat unsigned view; tensors not
    in it (new, or of another dtype or shape) go to ``fresh``, an :class:`ArraySink`."""

    def __init__(self, live: Mapping[str, np.ndarray], arrays: Mapping[str, object], fresh: ArraySink) -> None:
        self.live, self.arrays, self.fresh = live, arrays, fresh

    def open(self, th: records.TensorHeader) -> TensorOutput[tuple[str, object]]:
        flat = self.live.get(th.name)
        if flat is None:
            return self.fresh.open(th)
        return _LiveTensor(th, flat, self.arrays[th.name])


class _LiveTensor:
    __slots__ = ("th", "flat", "array", "staged")

    def __init__(self, th: records.TensorHeader, flat: np.ndarray, array: object) -> None:
        self.th, self.flat, self.array = th, flat, array
        self.staged: list[tuple[int, int, np.ndarray]] = []

    def buffer(self, b: int, encoding: int | None, base_block: np.ndarray | None,
               drain: Callable[[], None]) -> np.ndarray:
        if base_block is not None and encodings.keeps_base(encoding):
            return base_block  # decode_block leaves it as it is
        s, e = self.th.block_range(b)
        out = np.empty(e - s, self.th.dtype.uint)
        self.staged.append((s, e, out))
        return out

    def done(self, b: int, arr: np.ndarray) -> None:
        pass

    def commit(self) -> tuple[str, object]:
        for s, e, out in self.staged:
            self.flat[s:e] = out
        self.staged = []
        return self.th.name, self.array


@dataclass
class Change:
    """One tensor's change, staged: flat positions (ascending; int32 when the tensor has fewer than
    2^31 elements, else int64) and the new values there (the tensor's dtype, as unsigned bits)."""

    name: str
    dtype: DType
    index: np.ndarray
    values: np.ndarray


class StagedSink:
    """A whole step for live arrays, written only after every tensor of it verified.

    Each block is decoded into private memory, hashed, and reduced to what differs from the live
    contents (positions and new values); nothing touches a live array until :meth:`apply`, which the
    caller runs once every tensor of the step passed its hash (and the step its digests). The staged
    changes are also the sparse update an engine takes (``index_copy_``). ``live``: name → writeable
    C-contiguous flat unsigned view; tensors not in it go to ``fresh``, an :class:`ArraySink`."""

    def __init__(self, live: Mapping[str, np.ndarray], fresh: ArraySink) -> None:
        self.live, self.fresh = live, fresh
        # decode buffers, reused once a block is hashed and reduced: fresh pages for every block of a
        # large model would cost more in page faults than the decoding itself
        self._free: dict[tuple[int, np.dtype], list[np.ndarray]] = {}
        self._lock = threading.Lock()

    def open(self, th: records.TensorHeader) -> TensorOutput[Change | tuple[str, np.ndarray]]:
        flat = self.live.get(th.name)
        if flat is None:
            return self.fresh.open(th)
        return _StagedTensor(th, flat, self)

    def _take(self, n: int, dt: np.dtype) -> np.ndarray:
        with self._lock:
            free = self._free.get((n, dt))
            if free:
                return free.pop()
        return np.empty(n, dt)

    def _give(self, arr: np.ndarray) -> None:
        with self._lock:
            free = self._free.setdefault((arr.size, arr.dtype), [])
            if len(free) < 64:
                free.append(arr)

    def apply(self, changes: Sequence[Change], workers: int = 1) -> None:
        """Write the staged changes into the live arrays (no check can fail any more); the compiled
        scatter runs without the GIL, so ``workers`` threads write different tensors at once."""
        scatter = backend.selected().scatter
        run_jobs([(scatter, self.live[c.name], c.index, c.values) for c in changes], workers)


class _StagedTensor:
    __slots__ = ("th", "flat", "kept", "parts", "sink")

    def __init__(self, th: records.TensorHeader, flat: np.ndarray, sink: StagedSink) -> None:
        self.th, self.flat, self.sink = th, flat, sink
        self.kept: set[int] = set()
        self.parts: dict[int, tuple[np.ndarray, np.ndarray]] = {}   # block -> (positions, values)

    def buffer(self, b: int, encoding: int | None, base_block: np.ndarray | None,
               drain: Callable[[], None]) -> np.ndarray:
        if base_block is not None and encodings.keeps_base(encoding):
            self.kept.add(b)
            return base_block  # decode_block leaves it as it is: nothing changes in this block
        return self.sink._take(self.th.block_len(b), self.th.dtype.uint)

    def decoded(self, b: int, arr: np.ndarray, changed: np.ndarray | None) -> None:
        """On the decoding thread: reduce the block to what differs from the live contents — from the
        positions the decoder changed when it hands them over, else by comparing the whole block (the
        compiled ``changes`` runs without the GIL); the block's buffer is then reused."""
        if b in self.kept:
            return
        s, e = self.th.block_range(b)
        live = self.flat[s:e]
        if changed is not None:   # exactly the positions whose value the block changes
            at = np.sort(changed)
        else:
            at = backend.selected().changes(live, arr)
        if at.size:
            self.parts[b] = (at + s, arr[at])

    def done(self, b: int, arr: np.ndarray) -> None:
        if b not in self.kept:
            self.sink._give(arr)   # hashed and reduced: the buffer serves a later block

    def commit(self) -> Change:
        wide = np.int64 if self.th.size >= 1 << 31 else np.int32
        parts = [self.parts[b] for b in sorted(self.parts)]
        if parts:
            index = np.concatenate([i for i, _ in parts]).astype(wide, copy=False)
            values = np.concatenate([v for _, v in parts])
        else:
            index, values = np.empty(0, wide), np.empty(0, self.th.dtype.uint)
        self.parts = {}
        return Change(self.th.name, self.th.dtype, index, values)


# --------------------------------------------------------------------------------------- memory

def allocate_all(headers: Sequence[records.TensorHeader], budget: list[int]) -> list[np.ndarray]:
    """Output buffers for several tensors, each refused (LimitError) past the caller's budget.

    They are 64-byte aligned views into a few allocations (arenas of consecutive tensors, at most
    ``ARENA_BYTES`` unless one tensor is larger): small tensors share pages instead of each faulting its
    own, and no arena is so large that the allocator maps (and the kernel zeroes) it afresh at every
    decode of a process that decodes step after step (see ``ARENA_BYTES``).
    """
    need: list[int] = []
    offsets: list[int] = []
    total, used = 0, 0  # used: tensor bytes, counted against the budget
    for th in headers:
        n = th.size * th.dtype.itemsize
        if n > budget[0] - used:
            raise LimitError(f"tensor {th.name!r} needs {n} bytes of output, more than the {budget[0] - used} "
                             f"left of this decoder's output budget (raise max_output_bytes if you expect "
                             f"that much)")
        offsets.append(total)
        need.append(n)
        used += n
        total += n + (-n % 64)  # alignment padding is not output
    out: list[np.ndarray] = []
    try:
        start = 0
        while start < len(headers):   # arenas of at most ARENA_BYTES (a larger tensor: its own)
            end = start + 1
            while end < len(headers) and offsets[end] + need[end] - offsets[start] <= ARENA_BYTES:
                end += 1
            base = offsets[start]
            arena = np.empty(max(offsets[end - 1] + need[end - 1] - base, 1), np.uint8)
            out += [arena[offsets[i] - base:offsets[i] - base + need[i]].view(headers[i].dtype.uint)
                    for i in range(start, end)]
            start = end
    except MemoryError:
        raise LimitError(f"cannot allocate {total} bytes of output") from None
    budget[0] -= used
    return out


# The largest arena of output :func:`allocate_all` makes: glibc serves an allocation up to 32 MiB from
# its heap once one that size was freed, so a process decoding step after step reuses pages it has
# faulted in (as the per-tensor arrays of tools/bench.py's floor are); a larger one is a fresh mapping
# every time, faulted in and zeroed again (the corpus model's 45 MB in one arena: 303 page faults a
# decode; in arenas of this size, none).
ARENA_BYTES = 16 << 20


def check_budget(headers: Iterable[records.TensorHeader], budget: int, where: str) -> None:
    """Refuse (LimitError) a selection whose output exceeds ``budget`` before anything is allocated
    or written — for outputs on disk too (an apply, a follower's step)."""
    need = sum(h.size * h.dtype.itemsize for h in headers)
    if need > budget:
        raise LimitError(f"{where} would write {need} bytes of tensors, more than the {budget} this "
                         f"file may make (raise max_output_bytes if you expect that much)")


def physical_memory() -> int:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 1 << 40
