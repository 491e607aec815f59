"""Encode between checkpoints on disk and apply a delta to one, with all-or-nothing output.

Output is built beside its destination and exposed by one atomic rename (a file), or by an atomic
directory exchange (a folder), only after every tensor and the model digest have verified. A crash at
any moment leaves the destination as it was or fully updated; leftovers are removed on the next run.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import errno
import json
import mmap
import os
import queue
import shutil
import threading
import uuid
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import xxhash

from . import transforms
from .arrays import release
from .errors import ArcError, InputError, VerificationError, WrongBaseError
from .reader import DeltaReader
from .safetensors_io import INDEX_NAME, Checkpoint, build_header, layout_specs, open_checkpoint
from .writer import DEFAULT_BLOCK_ELEMS, DeltaWriter

TMP_TAG = ".arcfmt-tmp-"
OLD_TAG = ".arcfmt-old-"


# --------------------------------------------------------------------------------------- encode

def encode_checkpoints(base_path: str | None, target_path: str, out, *, base_step=None, target_step=None,
                       block_elems=DEFAULT_BLOCK_ELEMS, effort="default", workers=None, keyframe=False,
                       progress=None) -> DeltaWriter:
    """Write the delta from the checkpoint at ``base_path`` to the one at ``target_path`` into ``out``
    (a path, written atomically, or a binary file object). Returns the closed writer (sizes, stats)."""
    target = open_checkpoint(target_path)
    base = open_checkpoint(base_path).tensors() if base_path is not None and not keyframe else {}
    tensors = target.tensors()

    def items():
        for name, arr in tensors.items():
            yield name, base.get(name), arr
            if progress is not None:
                progress(arr.nbytes)

    def write(f):
        w = DeltaWriter(f, base_step=base_step, target_step=target_step, block_elems=block_elems, effort=effort,
                        workers=workers)
        w.write_tensors(items(), keyframe=keyframe)
        w.close()
        return w

    if hasattr(out, "write"):
        return write(out)
    return _atomic_file(os.fspath(out), write)


def _atomic_file(path: str, fill):
    parent = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(parent, f"{TMP_TAG}{os.getpid()}-{uuid.uuid4().hex[:8]}-{os.path.basename(path)}")
    try:
        with open(tmp, "wb") as f:
            result = fill(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_dir(parent)
        return result
    except BaseException:
        _remove(tmp)
        raise


# --------------------------------------------------------------------------------------- apply

@dataclass
class ApplyResult:
    path: str
    tensors: int
    changed_tensors: int
    bytes_written: int
    files: int


def apply_delta(base_path: str, delta, out_path: str | None = None, *, in_place: bool = False,
                workers=None, progress=None) -> ApplyResult:
    """Rebuild the target checkpoint from the one at ``base_path`` and an arcfmt file.

    ``out_path``: where the target goes (same layout as the base). ``in_place``: replace the base
    itself, crash-safely. Nothing is written until every base tensor has been checked.
    """
    if in_place == (out_path is not None):
        raise InputError("give exactly one of an output path or in_place=True")
    base_path = os.fspath(base_path).rstrip("/") or "/"
    dest = base_path if in_place else os.fspath(out_path).rstrip("/")
    recover(dest)
    base = open_checkpoint(base_path)
    if not base.is_dir and os.path.isdir(dest):
        dest = os.path.join(dest, os.path.basename(base_path))
    if not in_place and os.path.exists(dest):
        raise InputError(f"{dest} already exists (use --in-place to update the base itself)")
    if isinstance(delta, (str, os.PathLike)):
        with open(delta, "rb") as f:
            return apply_delta(base_path, DeltaReader(f, workers=workers), out_path, in_place=in_place,
                               workers=workers, progress=progress)
    reader = delta if isinstance(delta, DeltaReader) else DeltaReader(delta, workers=workers)
    plan = _plan(base, reader)
    parent = os.path.dirname(os.path.abspath(dest))
    staging = os.path.join(parent, f"{TMP_TAG}{os.getpid()}-{uuid.uuid4().hex[:8]}-{os.path.basename(dest)}")
    try:
        written = _write_outputs(base, reader, plan, staging, in_place, workers, progress)
        if base.is_dir:
            _fsync_dir(staging)
            if os.path.exists(dest):
                _exchange_dirs(staging, dest)
                shutil.rmtree(staging, ignore_errors=True)
            else:
                os.rename(staging, dest)
        else:
            os.replace(staging, dest)
        _fsync_dir(parent)
    except BaseException:
        _remove(staging)
        raise
    changed = sum(1 for n in reader.names if n in plan.changed)
    return ApplyResult(dest, len(reader.names), changed, written, len(plan.files))


@dataclass
class _Plan:
    files: list          # (file name, [(name, DType, shape)], metadata, header bytes or None, base file or None)
    bases: dict          # name -> checked base flat view (or None)
    changed: set         # tensors whose bytes differ from the base


def _plan(base: Checkpoint, reader: DeltaReader) -> _Plan:
    base_arrays = base.tensors()
    changed = set()
    for name in reader.names:  # every base check happens before anything is written
        th = reader.header(name)
        if th.needs_base and name not in base_arrays:
            raise WrongBaseError(f"tensor {name!r} needs its base, which {base.path} does not have")
        if not th.needs_base or any(b.encoding != transforms.UNCHANGED for b in reader.entries[name].blocks):
            changed.add(name)
    # Hashing the base is most of the check: tensors are hashed in parallel (xxhash and the page
    # faults of the memory map run outside the GIL); the first failure in file order is raised and
    # the checks not yet started are dropped.
    pool = ThreadPoolExecutor(reader.workers, thread_name_prefix="arcfmt-check")
    try:
        jobs = [pool.submit(reader.check_base, n, base_arrays.get(n)) for n in reader.names]
        bases = {n: j.result() for n, j in zip(reader.names, jobs)}
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    wanted = set(reader.names)
    placed = set()
    files = []
    for f in base.files:
        items = []
        for t in f.tensors:
            if t.name in wanted:
                th = reader.header(t.name)
                items.append((t.name, th.dtype, th.shape))
                placed.add(t.name)
        files.append([os.path.basename(f.path), items, f.metadata, f])
    extra = [n for n in reader.names if n not in placed]
    if extra:
        files[-1][1].extend((n, reader.header(n).dtype, reader.header(n).shape) for n in extra)
    out = []
    for fname, items, metadata, bf in files:
        if not items and base.is_dir:
            continue
        same = [(s.name, s.dtype, s.shape) for s in bf.tensors] == items
        out.append((fname, items, metadata, bf.header_bytes if same else None, bf))
    return _Plan(out, bases, changed)


def _write_outputs(base, reader, plan, staging, in_place, workers, progress) -> int:
    if base.is_dir:
        os.makedirs(staging)
    total = 0
    written_names = {}
    for fname, items, metadata, header_bytes, bf in plan.files:
        target = os.path.join(staging, fname) if base.is_dir else staging
        names = [n for n, _, _ in items]
        written_names[fname] = names
        untouched = header_bytes is not None and not any(n in plan.changed for n in names)
        if untouched and base.is_dir:
            _link_or_copy(bf.path, target, hardlink=in_place)
            continue
        specs = layout_specs(items)
        header = header_bytes if header_bytes is not None else build_header(specs, metadata)
        size = 8 + len(header) + (specs[-1].end if specs else 0)
        _write_shard(target, header, specs, reader, plan.bases, progress)
        total += size
    # The model digest covers every tensor; each was verified against its hash as it was written.
    reader.check_target_digest({n: None for n in reader.names})
    reader.check_base_digest()
    if base.is_dir and base.index_json is not None:
        index = dict(base.index_json)
        index["weight_map"] = {n: fname for fname, names in written_names.items() for n in names}
        meta = dict(index.get("metadata") or {})
        if "total_size" in meta:
            meta["total_size"] = sum(s.end - s.begin for _, items, *_ in plan.files for s in layout_specs(items))
        index["metadata"] = meta
        same = base.index_json.get("weight_map") == index["weight_map"] and base.index_json.get("metadata") == meta
        src = os.path.join(base.path, INDEX_NAME)
        dst = os.path.join(staging, INDEX_NAME)
        if same:
            _link_or_copy(src, dst, hardlink=in_place)
        else:
            with open(dst, "w") as f:
                json.dump(index, f, indent=2)
                f.flush()
                os.fsync(f.fileno())
    return total


def _write_shard(target, header, specs, reader, bases, progress) -> None:
    """Write one output file: its header, then every tensor decoded block by block straight into the
    file's write buffers, each verified against its target hash; fsynced before it returns."""
    out = _OutputFile(target)
    try:
        out.write(len(header).to_bytes(8, "little") + header)
        data_start = out.pos
        with ThreadPoolExecutor(reader.workers, thread_name_prefix="arcfmt-apply") as pool:
            for s in specs:
                if out.pos != data_start + s.begin:  # the blocks of a tensor cover it exactly
                    raise RuntimeError(f"arcfmt: {s.name!r} would start at {out.pos - data_start}, "
                                       f"its header says {s.begin}")
                _decode_into(out, reader, s.name, bases[s.name], pool)
                if progress is not None and s.end > s.begin:
                    progress(s.end - s.begin)
        out.finish()
    finally:
        out.close()


_PENDING_BYTES = 64 << 20  # decoded blocks in flight, at most (beyond the first two)


def _decode_into(out, reader, name, base_u, pool) -> None:
    """Decode the blocks of one tensor in parallel into the next bytes of ``out``, in order; its bytes
    are hashed as they complete and checked against the tensor's target hash before it returns
    (the caller exposes nothing it has written unless every tensor passed)."""
    th = reader.header(name)
    item = th.dtype.itemsize
    window = max(2, min(2 * reader.workers, _PENDING_BYTES // max(1, th.block_elems * item)))
    h = xxhash.xxh3_64()
    pending = deque()
    spare = []  # buffers for blocks that straddle two write windows

    def finish_one():
        b, at, fut, arr, temp = pending.popleft()
        fut.result()
        raw = memoryview(arr).cast("B")
        h.update(raw)
        out.complete(at, raw.nbytes, raw if temp is not None else None)
        if temp is not None:
            spare.append(temp)
        if base_u is not None:
            s, e = th.block_range(b)
            release(base_u[s:e])

    def drain():
        while pending:
            finish_one()

    for b in range(th.block_count):
        s, e = th.block_range(b)
        n = (e - s) * item
        at, arr = out.reserve(n, th.dtype.uint, drain)
        temp = None
        if arr is None:
            temp = next((t for t in spare if t.nbytes >= n), None)
            if temp is None:
                temp = np.empty(n, np.uint8)
            else:
                spare.remove(temp)
            arr = temp[:n].view(th.dtype.uint)
        fut = pool.submit(reader.decode_block_into_buffer, name, b, None if base_u is None else base_u[s:e], arr)
        pending.append((b, at, fut, arr, temp))
        while len(pending) >= window:
            finish_one()
    drain()
    if h.intdigest() != th.target_hash:
        raise VerificationError(f"tensor {name!r}: reconstructed bytes do not match the target hash")


# --------------------------------------------------------------------------------------- output files

DIRECT_IO = True          # write new files with O_DIRECT where the filesystem takes it
WINDOW_BYTES = 16 << 20   # one write, and the unit of the writer thread's queue
WINDOWS = 6               # write buffers per file
_ALIGN = 4096             # O_DIRECT offsets, lengths and buffer addresses
_O_DIRECT = getattr(os, "O_DIRECT", 0)


class _OutputFile:
    """A new file written front to back in large aligned writes by a background thread.

    The file is cut into windows of ``WINDOW_BYTES``. The caller reserves the next byte ranges in
    order (a range that lies in one window comes back as a writable view of that window's buffer, so
    it can be filled from any thread), then completes them in order; a window goes to the writer
    thread once every byte in it is complete, so decoding, hashing and writing overlap and the disk
    is busy from the first window on. Writes bypass the page cache (O_DIRECT) where the filesystem
    allows it: a copy larger than what the page cache absorbs then goes to the disk at device speed
    instead of through writeback (tools/scale.py); where O_DIRECT is refused, ordinary writes are
    used. Nothing is durable before :meth:`finish`, which fsyncs.
    """

    def __init__(self, path: str, window: int = None, windows: int = None, direct: bool = None):
        self.window = window or WINDOW_BYTES
        self.nwindows = max(2, windows or WINDOWS)
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0)
        self.direct = bool(_O_DIRECT) and (DIRECT_IO if direct is None else direct) \
            and self.window % _ALIGN == 0
        self.fd = None
        if self.direct:
            try:
                self.fd = os.open(path, flags | _O_DIRECT, 0o644)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                self.direct = False
        if self.fd is None:
            self.fd = os.open(path, flags, 0o644)
        self.pos = 0            # end of the bytes reserved so far
        self.done = 0           # every byte before this one is final
        self._open = deque()    # [offset, buffer] of the windows being filled, in file order
        self._free = queue.SimpleQueue()
        for _ in range(self.nwindows):
            self._free.put(mmap.mmap(-1, self.window))  # page-aligned, as O_DIRECT needs
        self._todo = queue.SimpleQueue()
        self._error = None
        self._thread = threading.Thread(target=self._run, name="arcfmt-write", daemon=True)
        self._thread.start()

    # -- writer thread
    def _run(self):
        while True:
            item = self._todo.get()
            if item is None:
                return
            buf, offset, n = item
            if self._error is None:
                try:
                    self._pwrite(buf, offset, n)
                except BaseException as exc:  # reported to the caller by the next _check()
                    self._error = exc
            self._free.put(buf)

    def _pwrite(self, buf, offset, n):
        mv = memoryview(buf)[:n]
        while mv:
            try:
                k = os.pwrite(self.fd, mv, offset)
            except OSError as exc:
                if not (self.direct and exc.errno == errno.EINVAL):
                    raise
                # the filesystem opened the file for O_DIRECT but refuses this write: go on buffered
                import fcntl
                fcntl.fcntl(self.fd, fcntl.F_SETFL, fcntl.fcntl(self.fd, fcntl.F_GETFL) & ~_O_DIRECT)
                self.direct = False
                continue
            mv = mv[k:]
            offset += k

    def _check(self):
        if self._error is not None:
            raise self._error

    # -- windows
    def _buffer(self, offset: int, drain):
        """The buffer of the window at ``offset``, opening the windows up to it."""
        while not self._open or self._open[-1][0] < offset:
            if len(self._open) >= self.nwindows:
                if drain is None:
                    raise RuntimeError("arcfmt: no free write window")  # unreachable: see complete()
                drain()  # completes every reserved range, which hands all windows but the last over
                if len(self._open) >= self.nwindows:
                    raise RuntimeError("arcfmt: no free write window after completing every range")
                continue
            nxt = self._open[-1][0] + self.window if self._open else self.done // self.window * self.window
            self._check()
            self._open.append((nxt, self._free.get()))
        for off, buf in self._open:
            if off == offset:
                return buf
        raise RuntimeError(f"arcfmt: write window at {offset} is no longer open")

    def reserve(self, n: int, dtype, drain):
        """Reserve the next ``n`` bytes: ``(offset, view)``, where ``view`` is a writable ``dtype`` array
        over them when they lie in one window, else None (then pass the bytes to :meth:`complete`).
        ``drain`` completes every range reserved so far; it is called when all windows are in use."""
        at = self.pos
        self.pos += n
        if n == 0 or at // self.window != (at + n - 1) // self.window:
            return at, None
        woff = at // self.window * self.window
        buf = self._buffer(woff, drain)
        return at, np.frombuffer(buf, dtype, n // np.dtype(dtype).itemsize, at - woff)

    def complete(self, at: int, n: int, data=None) -> None:
        """The ``n`` bytes reserved at ``at`` are final (``data``: their bytes, when no view was given).
        Ranges must be completed in the order they were reserved."""
        if at != self.done:
            raise RuntimeError(f"arcfmt: range at {at} completed out of order (expected {self.done})")
        if data is not None:
            # Windows past self.done are only ever opened contiguously from self.done's window, so
            # copying never needs more windows than are open or free: no drain here.
            mv = memoryview(data).cast("B")
            pos = at
            while mv:
                woff = pos // self.window * self.window
                buf = self._buffer(woff, None)
                k = min(len(mv), woff + self.window - pos)
                buf[pos - woff: pos - woff + k] = mv[:k]
                mv = mv[k:]
                pos += k
                self.done = pos
                self._hand_over()
        self.done = at + n
        self._hand_over()

    def write(self, data) -> None:
        """Append bytes (nothing may be reserved and not yet completed)."""
        n = memoryview(data).nbytes
        at = self.pos
        self.pos += n
        self.complete(at, n, data)

    def _hand_over(self):
        while self._open and self._open[0][0] + self.window <= self.done:
            off, buf = self._open.popleft()
            self._check()
            self._todo.put((buf, off, self.window))

    def finish(self) -> None:
        """Write what is left, wait for every write, set the exact size and fsync."""
        if self.done != self.pos:
            raise RuntimeError("arcfmt: finish() with reserved bytes not completed")
        if self._open:
            off, buf = self._open.popleft()
            n = self.done - off
            m = -(-n // _ALIGN) * _ALIGN  # O_DIRECT writes whole aligned blocks; the size is set below
            buf[n:m] = bytes(m - n)
            self._todo.put((buf, off, m))
        self._todo.put(None)
        self._thread.join()
        self._check()
        os.ftruncate(self.fd, self.done)
        os.fsync(self.fd)

    def close(self) -> None:
        """Stop the writer thread (abandoning pending writes if finish() was not reached) and close."""
        if self._thread.is_alive():
            if self._error is None:
                self._error = InputError("write abandoned")
            self._todo.put(None)
            self._thread.join()
        os.close(self.fd)


# --------------------------------------------------------------------------------------- atomic swaps

def _link_or_copy(src, dst, hardlink):
    if hardlink:
        try:
            os.link(src, dst)
            return
        except OSError:
            pass
    shutil.copyfile(src, dst)
    with open(dst, "rb+") as f:
        os.fsync(f.fileno())


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange_dirs(a: str, b: str) -> None:
    """Swap two directories atomically (Linux renameat2 RENAME_EXCHANGE), else a recoverable two-step."""
    libc_name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(libc_name, use_errno=True) if libc_name else None
    fn = getattr(libc, "renameat2", None) if libc else None
    if fn is not None:
        res = fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
        if res == 0:
            return
    # Fallback: b → old, a → b. A crash in between leaves only `old`, which recover() puts back.
    old = os.path.join(os.path.dirname(b), f"{OLD_TAG}{os.path.basename(b)}")
    os.rename(b, old)
    os.rename(a, b)
    os.rename(old, a)


def recover(dest: str) -> None:
    """Finish or roll back what a killed run left beside ``dest``."""
    parent = os.path.dirname(os.path.abspath(dest)) or "."
    base = os.path.basename(dest)
    old = os.path.join(parent, f"{OLD_TAG}{base}")
    if os.path.exists(old):
        if not os.path.exists(dest):
            os.rename(old, dest)  # the swap was cut between its two renames: put the old one back
        else:
            shutil.rmtree(old, ignore_errors=True)
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for n in names:
        if n.startswith(TMP_TAG) and n.endswith("-" + base):
            pid = n[len(TMP_TAG):].split("-", 1)[0]
            if pid.isdigit() and _alive(int(pid)) and int(pid) != os.getpid():
                continue
            _remove(os.path.join(parent, n))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove(path):
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def _fsync_dir(path):
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


__all__ = ["encode_checkpoints", "apply_delta", "recover", "ApplyResult", "ArcError"]
