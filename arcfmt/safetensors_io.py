"""Safetensors checkpoints (one file, or a folder of shards) read through memory maps, and written back.

Only reads what the safetensors format defines: a u64 header length, a JSON header, raw little-endian
tensor bytes. The header is validated like any other untrusted input.
"""
from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass, field

import numpy as np

from . import dtypes
from .arrays import Stored, as_numpy, as_uint
from .errors import InputError, SafetensorsError, UnsupportedError, os_error
from .layout import MAX_DIMS, MAX_TENSOR_ELEMS

MAX_HEADER_BYTES = 100 * 1024 * 1024  # the safetensors reference limit
HEADER_LENGTH_SIZE = 8                # the u64 little-endian header length every safetensors file opens with
INDEX_NAME = "model.safetensors.index.json"


@dataclass
class TensorSpec:
    name: str
    dtype: dtypes.DType
    shape: tuple
    begin: int  # offsets relative to the data section
    end: int


@dataclass
class SafetensorsFile:
    path: str
    header_bytes: bytes          # the JSON header exactly as stored (padding included)
    metadata: dict | None
    tensors: list                # TensorSpec, in data-offset order
    data_start: int
    _mmap: np.memmap | None = field(default=None, repr=False)

    @property
    def names(self) -> list[str]:
        return [t.name for t in self.tensors]

    def array(self, spec: TensorSpec) -> np.ndarray:
        """A read-only memory-mapped view of one tensor (nothing is read until it is used)."""
        return as_numpy(self.stored(spec))

    def stored(self, spec: TensorSpec) -> Stored:
        """One tensor as stored: its flat unsigned view, read-only and memory-mapped (nothing is read
        until it is used), with its dtype and shape."""
        if spec.end == spec.begin:
            return Stored(spec.dtype, spec.shape, np.zeros(0, spec.dtype.uint))
        if self._mmap is None:
            self._mmap = np.memmap(self.path, np.uint8, mode="r")
        raw = self._mmap[self.data_start + spec.begin: self.data_start + spec.end]
        return Stored(spec.dtype, spec.shape, raw.view(spec.dtype.uint))


# ------------------------------------------------------------------------------------ the header frame
# A safetensors file: HEADER_LENGTH_SIZE bytes of little-endian header length n, the n-byte JSON header,
# then the data section. These two functions are the only code that reads or writes that frame.

def frame_header(header: bytes) -> bytes:
    """The bytes a safetensors file opens with: the header's length, then the header; the data section
    starts right after them (at :func:`data_start`)."""
    return len(header).to_bytes(HEADER_LENGTH_SIZE, "little") + header


def data_start(header: bytes) -> int:
    """Where the data section of a file with this header starts."""
    return HEADER_LENGTH_SIZE + len(header)


def read_header(f, size: int, path: str) -> bytes:
    """The header bytes of the safetensors file open as ``f`` (``size`` bytes long, read from its start),
    its length checked against the file and ``MAX_HEADER_BYTES`` before it is read."""
    head = f.read(HEADER_LENGTH_SIZE)
    if len(head) < HEADER_LENGTH_SIZE:
        raise SafetensorsError(f"{path}: shorter than the {HEADER_LENGTH_SIZE}-byte header length")
    n = int.from_bytes(head, "little")
    if n > MAX_HEADER_BYTES or n > size - HEADER_LENGTH_SIZE:
        raise SafetensorsError(f"{path}: header length {n} is beyond the file or the {MAX_HEADER_BYTES}-byte limit")
    header_bytes = f.read(n)
    if len(header_bytes) != n:
        raise SafetensorsError(f"{path}: the file ends inside its {n}-byte header")
    return header_bytes


# ------------------------------------------------------------------------------------ files

def open_input(path: str):
    """``(file, stat)`` of ``path`` opened for reading without ever blocking in ``open``: a FIFO
    without a writer would wait forever there. The caller decides what a file that is not regular (a
    FIFO, a pipe, a device) means; OSError as ``open`` raises it."""
    f = open(path, "rb", opener=lambda p, _: os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)))
    try:   # (opened by name: the file object's name is the user's path, for the messages that cite it)
        st = os.fstat(f.fileno())
        os.set_blocking(f.fileno(), True)
        return f, st
    except BaseException:
        f.close()
        raise


def read_file(path: str) -> SafetensorsFile:
    try:
        f, st = open_input(path)
        with f:
            if not stat.S_ISREG(st.st_mode):
                raise SafetensorsError(f"{path}: not a regular file (a FIFO, device or folder): a checkpoint "
                                       "file is read where it is")
            size = st.st_size
            header_bytes = read_header(f, size, path)
    except OSError as exc:
        raise os_error(exc, "read", path) from None
    try:   # UTF-8 only (json.loads of bytes would also take UTF-16/32 or a BOM); a nesting too deep for
        # the parser or an integer of thousands of digits is as malformed as a syntax error
        header = json.loads(header_bytes.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise SafetensorsError(f"{path}: header is not valid UTF-8 JSON: {str(exc)[:200]}") from None
    if not isinstance(header, dict):
        raise SafetensorsError(f"{path}: header is not a JSON object")
    has_metadata = "__metadata__" in header
    metadata = header.pop("__metadata__", None)
    if has_metadata and (not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values())):
        raise SafetensorsError(f"{path}: __metadata__ must map strings to strings")
    data_size = size - data_start(header_bytes)
    specs = []
    for name, info in header.items():
        try:
            if not (isinstance(info, dict) and isinstance(info["dtype"], str) and isinstance(info["shape"], list)
                    and isinstance(info["data_offsets"], list)):
                raise TypeError("dtype must be a string, shape and data_offsets arrays")
            dt = dtypes.from_name(info["dtype"])
            shape = tuple(info["shape"])
            begin, end = info["data_offsets"]
        except (TypeError, KeyError, ValueError, UnsupportedError) as exc:
            raise SafetensorsError(f"{path}: tensor {name!r}: bad header entry ({exc})") from None
        if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape) or not all(
                isinstance(x, int) and not isinstance(x, bool) for x in (begin, end)):  # JSON true is no integer
            raise SafetensorsError(f"{path}: tensor {name!r}: shape and offsets must be non-negative integers")
        if len(shape) > MAX_DIMS:
            raise SafetensorsError(f"{path}: tensor {name!r} has {len(shape)} dimensions (at most {MAX_DIMS})")
        nonzero = 1
        for d in shape:
            nonzero *= max(d, 1)
        if nonzero > MAX_TENSOR_ELEMS:  # numpy cannot even describe such a shape, empty or not
            raise SafetensorsError(f"{path}: tensor {name!r}: shape {list(shape)} is beyond "
                                   f"{MAX_TENSOR_ELEMS} elements")
        count = 0 if 0 in shape else nonzero
        if not 0 <= begin <= end <= data_size or end - begin != count * dt.itemsize:
            raise SafetensorsError(f"{path}: tensor {name!r}: offsets [{begin}, {end}) do not hold "
                                   f"{count} {dt.name} elements inside the {data_size}-byte data section")
        specs.append(TensorSpec(name, dt, shape, begin, end))
    specs.sort(key=lambda s: (s.begin, s.end))
    for a, b in zip(specs, specs[1:]):
        if a.end > b.begin:
            raise SafetensorsError(f"{path}: tensors {a.name!r} and {b.name!r} overlap")
    return SafetensorsFile(path, header_bytes, metadata, specs, data_start(header_bytes))


@dataclass
class Checkpoint:
    """A model on disk: one safetensors file, or a folder of shards (with or without an index json)."""

    path: str
    is_dir: bool
    files: list            # SafetensorsFile, in shard order
    index_json: dict | None

    @property
    def names(self) -> list[str]:
        return [n for f in self.files for n in f.names]

    def tensors(self) -> dict:
        """name → read-only memory-mapped array, in file order."""
        return {t.name: f.array(t) for f in self.files for t in f.tensors}

    def stored(self) -> dict[str, Stored]:
        """name → the tensor as stored (:class:`arcfmt.arrays.Stored`), in file order: what the
        transforms take, without building a numpy float dtype (no ml_dtypes import)."""
        return {t.name: f.stored(t) for f in self.files for t in f.tensors}

    def file_of(self) -> dict:
        return {t.name: f for f in self.files for t in f.tensors}

    @property
    def nbytes(self) -> int:
        return sum(t.end - t.begin for f in self.files for t in f.tensors)


def open_checkpoint(path: str) -> Checkpoint:
    path = os.fspath(path)
    if os.path.isdir(path):
        index_path = os.path.join(path, INDEX_NAME)
        index_json = None
        if os.path.exists(index_path):
            try:
                f, st = open_input(index_path)
                with f:
                    if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_HEADER_BYTES:
                        raise SafetensorsError(f"{index_path}: not a regular file of at most {MAX_HEADER_BYTES} "
                                               "bytes")
                    raw = f.read(MAX_HEADER_BYTES + 1)
            except OSError as exc:
                raise os_error(exc, "read", index_path) from None
            try:
                index_json = json.loads(raw.decode("utf-8"))
                weight_map = index_json["weight_map"] if isinstance(index_json, dict) else None
                if not isinstance(weight_map, dict) or not isinstance(index_json.get("metadata", {}), dict):
                    raise TypeError("weight_map must be an object, and metadata too where present")
                names = list(dict.fromkeys(weight_map.values()))
            except (ValueError, KeyError, TypeError, RecursionError) as exc:
                raise SafetensorsError(f"{index_path}: not a valid safetensors index ({str(exc)[:200]})") from None
            for n in names:
                if not isinstance(n, str) or os.path.basename(n) != n or n in ("", ".", ".."):
                    raise SafetensorsError(f"{index_path}: shard name {n!r} is not a plain file name")
        if index_json is None or not names:  # no index, or one that maps no tensor (a model of none)
            names = sorted(n for n in os.listdir(path) if n.endswith(".safetensors"))
        if not names:
            raise InputError(f"{path}: no .safetensors files in this folder")
        files = [read_file(os.path.join(path, n)) for n in names]
        seen = set()
        for shard in files:
            for n in shard.names:
                if n in seen:
                    raise SafetensorsError(f"{path}: tensor {n!r} appears in more than one shard")
                seen.add(n)
        return Checkpoint(path, True, files, index_json)
    if not os.path.exists(path):
        raise InputError(f"{path}: no such file or folder")
    return Checkpoint(path, False, [read_file(path)], None)


def build_header(specs: list, metadata: dict | None) -> bytes:
    """A compact JSON header padded with spaces to 8 bytes, as the safetensors writers make it."""
    header = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    for s in specs:
        header[s.name] = {"dtype": s.dtype.name, "shape": list(s.shape), "data_offsets": [s.begin, s.end]}
    h = json.dumps(header, separators=(",", ":")).encode("utf-8")
    return h + b" " * (-len(h) % 8)


def layout_specs(items) -> list:
    """TensorSpecs with consecutive offsets for ``(name, DType, shape)`` items, in order."""
    out = []
    off = 0
    for name, dt, shape in items:
        n = int(np.prod(shape, dtype=np.int64)) if shape else 1
        out.append(TensorSpec(name, dt, tuple(shape), off, off + n * dt.itemsize))
        off += n * dt.itemsize
    return out


def file_parts(tensors: dict, metadata: dict | None = None) -> list:
    """The bytes of a safetensors file of ``name → array``, in order: its framed header, then each
    tensor's data (buffers, not copied)."""
    items = []
    flat = {}
    for name, a in tensors.items():
        dt, shape, u = as_uint(a)
        items.append((name, dt, shape))
        flat[name] = u
    specs = layout_specs(items)
    return [frame_header(build_header(specs, metadata))] + [np.ascontiguousarray(flat[s.name]).data.cast("B")
                                                             for s in specs]


def write_file(path: str, tensors: dict, metadata: dict | None = None) -> None:
    """Write ``name → array`` as one safetensors file (used for fixtures and the demo)."""
    with open(path, "wb") as f:
        for part in file_parts(tensors, metadata):
            f.write(part)
