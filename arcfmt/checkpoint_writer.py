"""The one checkpoint writer: safetensors files written front to back from the decode pipeline.

Every output file's header is built from the layout actually written (never copied from a base), its
space is reserved before any tensor is decoded (a full disk is an error, never a crash), bytes go out
in large ``pwrite`` calls (``O_DIRECT`` where the filesystem takes it; never through a memory map of
a sparse file), and a finished checkpoint is re-opened with this package's own reader and checked
against the layout before anything swaps it in (:mod:`arcfmt.staging`).
"""
from __future__ import annotations

import errno
import json
import mmap
import os
import queue
import threading
from collections import deque
from dataclasses import dataclass

import numpy as np

from .errors import InputError, VerificationError, os_error
from .safetensors_io import build_header, data_start, frame_header, layout_specs, read_file
from .staging import Owner, Stage

DIRECT_IO = True          # write new files with O_DIRECT where the filesystem takes it
WINDOW_BYTES = 16 << 20   # one write, and the unit of the writer thread's queue
WINDOWS = 6               # write buffers per file
_ALIGN = 4096             # O_DIRECT offsets, lengths and buffer addresses
_O_DIRECT = getattr(os, "O_DIRECT", 0)


def _window_buffer(n: int) -> mmap.mmap:
    """A page-aligned write buffer (as O_DIRECT needs): private anonymous memory in huge pages where
    the system has them. Why: ``mmap(-1, n)`` is shared memory (shmem), which the kernel pins and
    hands to the disk 4 KiB page by page; measured here (tools/scale.py's disk, 16 MiB O_DIRECT
    writes), huge-page buffers write at 2.4 GB/s against 1.7, with less system time."""
    private = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)
    if not private or not hasattr(mmap, "MADV_HUGEPAGE"):
        return mmap.mmap(-1, n)
    buf = mmap.mmap(-1, n, flags=private)
    try:
        buf.madvise(mmap.MADV_HUGEPAGE)
    except OSError:
        pass  # no transparent huge pages: ordinary private pages
    return buf


class OutputFile:
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

    def __init__(self, path: str, size: int, *, display: str | None = None, owner: Owner | None = None,
                 window: int | None = None, windows: int | None = None, direct: bool | None = None):
        self.display = display or path   # the path errors name: the user's, not the staging one
        self.size = size
        self.owner = owner
        self.window = window or WINDOW_BYTES
        self.nwindows = max(2, windows or WINDOWS)
        # a new private file (0600 until finish() gives it its mode), never through a planted link
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
        self.direct = bool(_O_DIRECT) and (DIRECT_IO if direct is None else direct) \
            and self.window % _ALIGN == 0
        fd: int | None = None
        try:
            if self.direct:
                try:
                    fd = os.open(path, flags | _O_DIRECT, 0o600)
                except OSError as exc:
                    if exc.errno != errno.EINVAL:
                        raise
                    self.direct = False
            if fd is None:
                fd = os.open(path, flags, 0o600)
            self.fd: int = fd
            self._reserve_space(size)
        except OSError as exc:
            if fd is not None:
                os.close(fd)
            raise os_error(exc, "write", self.display) from None
        self.pos = 0            # end of the bytes reserved so far
        self.done = 0           # every byte before this one is final
        # (offset, buffer) of the windows being filled, in file order
        self._open: deque[tuple[int, mmap.mmap]] = deque()
        self._free: queue.SimpleQueue[mmap.mmap] = queue.SimpleQueue()
        for _ in range(self.nwindows):
            self._free.put(_window_buffer(self.window))
        # (buffer, offset, length) to write; None: stop
        self._todo: queue.SimpleQueue[tuple[mmap.mmap, int, int] | None] = queue.SimpleQueue()
        self._error: BaseException | None = None
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

    def _reserve_space(self, size: int) -> None:
        """Allocate the file's blocks now, so a full disk fails here, before any decoding, and a
        write can never meet ENOSPC (nor a memory map SIGBUS) halfway."""
        if size <= 0:
            return
        try:
            os.posix_fallocate(self.fd, 0, size)
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                raise

    def _check(self):
        if self._error is not None:
            exc = self._error
            if isinstance(exc, OSError):
                raise os_error(exc, "write", self.display) from None
            raise exc

    # -- windows
    def _buffer(self, offset: int, drain):
        """The buffer of the window at ``offset``, opening the windows up to it."""
        while not self._open or self._open[-1][0] < offset:
            if len(self._open) >= self.nwindows:
                assert drain is not None, "no free write window"  # unreachable: see complete()
                drain()  # completes every reserved range, which hands all windows but the last over
                assert len(self._open) < self.nwindows, "no free write window after completing every range"
                continue
            nxt = self._open[-1][0] + self.window if self._open else self.done // self.window * self.window
            self._check()
            self._open.append((nxt, self._free.get()))
        for off, buf in self._open:
            if off == offset:
                return buf
        raise AssertionError(f"write window at {offset} is no longer open")

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
        assert at == self.done, f"range at {at} completed out of order (expected {self.done})"
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
        assert self.done == self.pos, "finish() with reserved bytes not completed"
        assert self.done == self.size, f"wrote {self.done} bytes of a {self.size}-byte file"
        if self._open:
            off, buf = self._open.popleft()
            n = self.done - off
            m = -(-n // _ALIGN) * _ALIGN  # O_DIRECT writes whole aligned blocks; the size is set below
            buf[n:m] = bytes(m - n)
            self._todo.put((buf, off, m))
        self._todo.put(None)
        self._thread.join()
        self._check()
        try:
            os.ftruncate(self.fd, self.done)
            if self.owner is not None:
                self.owner.apply(self.fd)
            os.fsync(self.fd)
        except OSError as exc:
            raise os_error(exc, "write", self.display) from None

    def close(self) -> None:
        """Stop the writer thread (abandoning pending writes if finish() was not reached) and close."""
        if self._thread.is_alive():
            if self._error is None:
                self._error = InputError("write abandoned")
            self._todo.put(None)
            self._thread.join()
        os.close(self.fd)


# --------------------------------------------------------------------------------------- small files

def write_new_file(path: str, data: bytes, owner: Owner | None = None) -> None:
    """A new small file of the checkpoint (an index, a state): created, never through a planted link,
    given its mode, fsynced."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        if owner is not None:
            owner.apply(fd)
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json(path: str, obj, owner: Owner | None = None) -> None:
    write_new_file(path, json.dumps(obj, indent=2).encode("utf-8"), owner)


# --------------------------------------------------------------------------------------- layouts

@dataclass
class ShardLayout:
    """One output file: its name in the folder (None: the checkpoint is this one file), its tensors
    ``(name, DType, shape)`` in data order, and the ``__metadata__`` its header carries."""

    file: str | None
    items: list
    metadata: dict | None = None

    def __post_init__(self):
        self.specs = layout_specs(self.items)
        self.header = build_header(self.specs, self.metadata)
        self.data_start = data_start(self.header)
        self.size = self.data_start + (self.specs[-1].end if self.specs else 0)

    @property
    def tensor_bytes(self) -> int:
        return self.specs[-1].end if self.specs else 0


def check_written(stage: Stage, layouts: list) -> None:
    """Re-open every written file with this package's reader and check that it holds exactly the
    layout meant — names, dtypes, shapes, offsets, size — before it may be swapped in."""
    for lay in layouts:
        path = stage.file(lay.file)
        try:
            f = read_file(path)
            size = os.path.getsize(path)
        except InputError as exc:
            raise VerificationError(f"the checkpoint written for {stage.dest} does not read back: {exc}") from None
        except OSError as exc:
            raise os_error(exc, "read", stage.dest) from None
        got = [(t.name, t.dtype, tuple(t.shape), t.begin, t.end) for t in f.tensors]
        want = [(s.name, s.dtype, tuple(s.shape), s.begin, s.end) for s in lay.specs]
        if got != want or size != lay.size or f.metadata != lay.metadata:
            raise VerificationError(f"the checkpoint written for {stage.dest} does not hold the layout "
                                    f"it was written with ({lay.file or os.path.basename(stage.dest)})")


# --------------------------------------------------------------------------------------- the sink

class CheckpointSink:
    """A :mod:`arcfmt.pipeline` sink writing ``layouts`` into ``stage``: tensors arrive in layout
    order; each file is opened (space reserved) at its first tensor and finished (mode, fsync) after
    its last; files with no tensor are written at :meth:`finish`."""

    # Blocks in flight (pipeline.run): at most what the write windows hold beside the two a block
    # may straddle, so reserving the next block never has to wait for every block in flight.
    in_flight_bytes = (WINDOWS - 2) * WINDOW_BYTES

    def __init__(self, stage: Stage, layouts: list, progress=None):
        self.stage = stage
        self.layouts = layouts
        self.progress = progress
        self._order = deque((lay, s) for lay in layouts for s in lay.specs)
        self._written: set[int] = set()
        self._cur: tuple[ShardLayout, OutputFile, int] | None = None  # (layout, its file, specs left)
        self.bytes_written = 0

    def _open_file(self, lay: ShardLayout) -> OutputFile:
        out = OutputFile(self.stage.file(lay.file), lay.size, display=self.stage.display,
                         owner=self.stage.owner_of(lay.file))
        out.write(frame_header(lay.header))
        return out

    def _finish_file(self, lay, out) -> None:
        try:
            out.finish()
        finally:
            out.close()
        self._written.add(id(lay))
        self.bytes_written += lay.size

    def needs_drain(self, th: object) -> bool:
        """Whether every tensor in flight must be done before ``th`` opens: it starts a new file while
        the last one is still open (files are written one after the other)."""
        return self._cur is not None and bool(self._order) and self._order[0][0] is not self._cur[0]

    def open(self, th):
        lay, spec = self._order.popleft()
        assert (spec.name, spec.dtype, tuple(spec.shape)) == (th.name, th.dtype, tuple(th.shape)), \
            f"tensor {th.name!r} arrived out of layout order"
        if self._cur is None or self._cur[0] is not lay:
            assert self._cur is None, "a file was left unfinished"
            self._cur = (lay, self._open_file(lay), len(lay.specs))
        out = self._cur[1]
        assert out.pos == lay.data_start + spec.begin, f"{spec.name!r} would not start where its header says"
        return _FileTensor(self, th, spec, out)

    def _tensor_done(self, spec) -> None:
        if self.progress is not None and spec.end > spec.begin:
            self.progress(spec.end - spec.begin)
        assert self._cur is not None, "a tensor done with no file open"
        lay, out, left = self._cur
        self._cur = (lay, out, left - 1)
        if left - 1 == 0:
            self._cur = None
            self._finish_file(lay, out)

    def finish(self) -> None:
        assert not self._order and self._cur is None, "not every tensor of the layout was written"
        for lay in self.layouts:
            if id(lay) not in self._written:  # a file with no tensors: its header alone
                self._finish_file(lay, self._open_file(lay))

    def close(self) -> None:
        """Stop the open file's writer thread, if a failure left one running."""
        if self._cur is not None:
            self._cur[1].close()
            self._cur = None


class _FileTensor:
    __slots__ = ("sink", "th", "spec", "out", "at")

    def __init__(self, sink, th, spec, out):
        self.sink, self.th, self.spec, self.out, self.at = sink, th, spec, out, {}

    def buffer(self, b, encoding, base_block, drain):
        s, e = self.th.block_range(b)
        n = (e - s) * self.th.dtype.itemsize
        at, arr = self.out.reserve(n, self.th.dtype.uint, drain)
        temp = arr is None
        if temp:  # straddles two write windows: decoded aside, copied in when complete
            arr = np.empty(e - s, self.th.dtype.uint)
        self.at[b] = (at, n, temp)
        return arr

    def done(self, b, arr) -> None:
        at, n, temp = self.at.pop(b)
        self.out.complete(at, n, memoryview(arr).cast("B") if temp else None)

    def commit(self):
        self.sink._tensor_done(self.spec)
        return self.th.name
