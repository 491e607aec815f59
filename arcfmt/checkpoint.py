"""Encode between checkpoints on disk and apply a delta to one, with all-or-nothing output.

Output is built beside its destination and exposed by one atomic rename (a file), or by an atomic
directory exchange (a folder), only after every tensor and the model digest have verified. A crash at
any moment leaves the destination as it was or fully updated; leftovers are removed on the next run.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import shutil
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from . import transforms
from .errors import ArcError, InputError, WrongBaseError
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
    bases = {}
    changed = set()
    for name in reader.names:  # every base check happens before anything is written
        th = reader.header(name)
        if th.needs_base and name not in base_arrays:
            raise WrongBaseError(f"tensor {name!r} needs its base, which {base.path} does not have")
        bases[name] = reader.check_base(name, base_arrays.get(name))
        if not th.needs_base or any(b.encoding != transforms.UNCHANGED for b in reader.entries[name].blocks):
            changed.add(name)
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
        data_start = 8 + len(header)
        size = data_start + (specs[-1].end if specs else 0)
        with open(target, "wb") as f:
            f.write(len(header).to_bytes(8, "little"))
            f.write(header)
            f.truncate(size)
        if specs and size > data_start:
            mm = np.memmap(target, np.uint8, mode="r+")
            try:
                with ThreadPoolExecutor(reader.workers, thread_name_prefix="arcfmt-apply") as pool:
                    for s in specs:
                        if s.end == s.begin:
                            reader.decode_tensor(s.name, plan.bases[s.name], np.empty(0, s.dtype.uint))
                            continue
                        out = mm[data_start + s.begin: data_start + s.end].view(s.dtype.uint)
                        reader.decode_tensor(s.name, plan.bases[s.name], out, pool=pool)
                        if progress is not None:
                            progress(s.end - s.begin)
                mm.flush()
            finally:
                del mm
        else:
            for s in specs:
                reader.decode_tensor(s.name, plan.bases[s.name], np.empty(0, s.dtype.uint))
        with open(target, "rb+") as f:
            os.fsync(f.fileno())
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
