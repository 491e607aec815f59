"""Encode between checkpoints on disk and apply a delta to one, with all-or-nothing output.

Output is built beside its destination and exposed by one atomic rename (a file), or by an atomic
directory exchange (a folder), only after every tensor and the model digest have verified. A crash at
any moment leaves the destination as it was or fully updated; leftovers are removed on the next run.
"""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass

from . import outputs, pipeline
from .checkpoint_writer import CheckpointSink, ShardLayout, check_written, write_json
from .errors import ArcError, InputError, LimitError, SafetensorsError, WrongBaseError, os_error
from .reader import DeltaReader
from .safetensors_io import INDEX_NAME, Checkpoint, open_checkpoint
from .staging import OLD_TAG, TMP_TAG, Stage, recover, staging_name
from .writer import DEFAULT_BLOCK_ELEMS, DeltaWriter, check_mismatches

# --------------------------------------------------------------------------------------- encode

def encode_checkpoints(base_path: str | None, target_path: str, out, *, base_step=None, target_step=None,
                       block_elems=DEFAULT_BLOCK_ELEMS, effort="default", workers=None, keyframe=False,
                       progress=None, force=False, on_mismatch: str = "warn", stacklevel: int = 2,
                       compact_index: bool = True, previous_path: str | None = None) -> DeltaWriter:
    """Write the delta from the checkpoint at ``base_path`` to the one at ``target_path`` into ``out``
    (a path, written atomically, or a binary file object). Returns the closed writer (sizes, stats).
    The one implementation behind ``arcfmt encode`` and :func:`arcfmt.encode_files`.

    A path ``out`` that exists is refused unless ``force``, and one that is the same file as an input
    (through links too, each shard of a folder) always: arcfmt.outputs.check_output. Target tensors
    without a same-named, same-dtype, same-shape base tensor become keyframes: ``on_mismatch``
    ``"warn"`` (one :class:`arcfmt.KeyframeWarning`, ``stacklevel`` as for :func:`warnings.warn` from
    here), ``"error"`` (InputError before the output is created) or ``"ignore"``. ``previous_path``:
    the checkpoint of the step before the base (format 1.9, SPEC.md §7): signs coded in contexts of
    each element's last change, and the file then needs that checkpoint to be applied."""
    from . import outputs

    base_path = os.fspath(base_path) if base_path is not None and not keyframe else None
    target_path = os.fspath(target_path)
    check_mismatches({}, {}, on_mismatch)  # a bad value fails before anything is read
    previous_path = os.fspath(previous_path) if previous_path is not None and base_path is not None else None
    for p in (target_path, base_path, previous_path):
        if p is not None:
            outputs.check_readable(p)
    if not hasattr(out, "write"):
        out = outputs.check_output(out, [base_path, target_path, previous_path], force)
    try:
        target = open_checkpoint(target_path)
        base = open_checkpoint(base_path).stored() if base_path is not None else {}
        previous = open_checkpoint(previous_path).stored() if previous_path is not None else None
    except OSError as exc:
        raise os_error(exc, "read", exc.filename or target_path) from None
    tensors = target.stored()
    if base_path is not None:
        check_mismatches(base, tensors, on_mismatch, stacklevel=stacklevel)

    def items():
        for name, arr in tensors.items():
            yield name, base.get(name), arr
            if progress is not None:
                progress(arr.nbytes)

    def write(f):
        w = DeltaWriter(f, base_step=base_step, target_step=target_step, block_elems=block_elems, effort=effort,
                        workers=workers, compact_index=compact_index, previous=previous)
        w.write_tensors(items(), keyframe=keyframe)
        w.close()
        return w

    if hasattr(out, "write"):
        return write(out)
    return _atomic_file(out, write, overwrite=force)


def _atomic_file(path: str, fill, *, overwrite: bool = False):
    """``fill(f)`` into a new file beside ``path`` (O_EXCL|O_NOFOLLOW), fsync, rename over ``path``.

    ``overwrite``: replace an existing ``path`` (a symbolic link: the link itself, never its target),
    keeping its mode and owner; without it an existing ``path`` is refused (InputError), even one that
    appears while ``fill`` runs. OS errors are FileAccessError naming ``path`` (see arcfmt.outputs)."""
    parent = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(parent, staging_name(path))
    from .outputs import write_atomic

    recover(path)   # what a killed run left beside it (this module's names only, of dead processes)

    return write_atomic(path, tmp, fill, overwrite=overwrite)


# --------------------------------------------------------------------------------------- apply

@dataclass
class ApplyResult:
    """What :func:`apply_delta` (``arcfmt.apply_files``) did: the output ``path``, the number of
    ``tensors`` in it and of ``changed_tensors``, the tensor ``bytes_written`` and the ``files``
    written or linked."""

    path: str
    tensors: int
    changed_tensors: int
    bytes_written: int
    files: int


def apply_delta(base_path: str, delta, out_path: str | None = None, *, in_place: bool = False,
                workers=None, progress=None, max_output_bytes: int | None = None,
                delta_path: str | None = None, previous_path: str | None = None) -> ApplyResult:
    """Rebuild the target checkpoint from the one at ``base_path`` and an arcfmt file.

    ``out_path``: where the target goes (same layout as the base). ``in_place``: replace the base
    itself, crash-safely, keeping its modes and owner. The one implementation behind ``arcfmt apply``
    and :func:`arcfmt.apply_files`. ``max_output_bytes``: the most tensor bytes
    the output may hold (default: what the base backs plus a bound scaled to the delta's size, so a
    small file cannot fill a disk). Every base tensor and both digests are checked before anything is
    written; the output is staged beside its destination, re-opened and checked, and only then swapped
    in. Files beside the weights in a folder (config, tokenizer) come along. ``delta_path``: the
    file ``delta`` (a reader) was opened from, so that an output that is that file is refused as an input.
    ``previous_path``: the checkpoint of the step before the base, which a delta written with it needs
    (format 1.9, SPEC.md §7; checked like the base, ``wrong_base``).
    """
    if in_place == (out_path is not None):
        raise InputError("give exactly one of an output path or in_place=True")
    base_path = os.fspath(base_path).rstrip("/") or "/"
    dest = base_path if out_path is None else os.fspath(out_path).rstrip("/")  # out_path is None iff in_place
    try:
        base = open_checkpoint(base_path)
    except SafetensorsError as exc:  # SPEC.md §1 "Base files", §19: a base that is not one is `wrong_base`
        raise WrongBaseError(f"base: {exc}") from None
    try:
        previous = None if previous_path is None else open_checkpoint(os.fspath(previous_path))
    except SafetensorsError as exc:  # a previous step given as a file is a base file (SPEC.md §1)
        raise WrongBaseError(f"previous step: {exc}") from None
    if not base.is_dir and os.path.isdir(dest):
        dest = os.path.join(dest, os.path.basename(base_path))
    if in_place and base.is_dir and os.path.islink(base_path):
        raise InputError(f"{base_path} is a symbolic link to the folder {os.path.realpath(base_path)}: in place "
                         "replaces the folder itself, never through a link; give that folder, or write a new "
                         "one with -o and point the link at it")
    recover(dest)
    if not in_place:
        named = delta if isinstance(delta, (str, os.PathLike)) else delta_path
        previous_named = None if previous_path is None else os.fspath(previous_path)
        dest = outputs.check_output(dest, [base_path, named, previous_named],
                                    force=False, folder=base.is_dir, hint="use --in-place to update the base itself")
    if isinstance(delta, (str, os.PathLike)):
        try:
            f = open(delta, "rb")
        except OSError as exc:
            raise os_error(exc, "read", os.fspath(delta)) from None
        with f:
            return apply_delta(base_path, DeltaReader(f, workers=workers, max_output_bytes=max_output_bytes),
                               out_path, in_place=in_place, workers=workers, progress=progress,
                               previous_path=previous_path)
    reader = delta if isinstance(delta, DeltaReader) else DeltaReader(delta, workers=workers,
                                                                      max_output_bytes=max_output_bytes)
    plan = plan_apply(base, reader, None if previous is None else previous.stored())
    parent = os.path.dirname(os.path.abspath(dest))
    need = sum(lay.size for lay in plan.layouts) + sum(os.path.getsize(f.path) for f in plan.copies if not in_place)
    free = _free_bytes(parent)
    if need > free:
        raise LimitError(f"the output needs {need} bytes in {parent}, which has {free} free")
    stage = Stage(dest, folder=base.is_dir, like=base_path, keep_owner=in_place)
    sink = CheckpointSink(stage, plan.layouts, progress)
    try:
        for f in plan.copies:  # files whose tensors are all unchanged: the base file as it is
            _link_or_copy(f.path, stage.file(os.path.basename(f.path)), hardlink=in_place)
        items = [reader.item(s.name, plan.bases[s.name]) for lay in plan.layouts for s in lay.specs]
        for _ in pipeline.run(items, sink, workers=reader.workers):
            pass
        if base.is_dir:
            _write_index(base, plan, stage, in_place)
            own = {os.path.basename(f.path) for f in base.files} | {INDEX_NAME}
            stage.carry(base.path, own, link=in_place)
        check_written(stage, plan.layouts)
        stage.commit()
    except BaseException:
        sink.close()
        stage.abort()
        raise
    changed = sum(1 for n in reader.names if n in plan.changed)
    return ApplyResult(stage.dest if not in_place else dest, len(reader.names), changed, sink.bytes_written,
                       len(plan.layouts) + len(plan.copies))


@dataclass
class ApplyPlan:
    """How :func:`plan_apply` lays the output out."""

    layouts: list        # ShardLayout of every file to write, in order
    copies: list         # SafetensorsFile of the base whose every tensor is unchanged: linked or copied
    bases: dict          # name -> checked base flat view (or None)
    changed: set         # tensors whose bytes differ from the base
    names: dict          # file name -> tensor names it holds in the output


def plan_apply(base: Checkpoint, reader: DeltaReader, previous: dict | None = None) -> ApplyPlan:
    """Check every base tensor (and previous value, ``previous``, where a tensor needs it) and the
    digests, and lay the output out as the base is laid out: each base file keeps its tensors (those
    the delta has), new tensors go into the last file."""
    base_arrays = base.stored()
    _, bases, _ = reader.selection(base_arrays, workers=reader.workers, previous=previous)
    headers = [reader.header(n) for n in reader.names]
    pipeline.check_budget(headers, reader.output_budget(headers), "this delta")
    changed = {n for n in reader.names if reader.changes(n)}
    wanted = set(reader.names)
    groups = []
    for f in base.files:
        groups.append([f, [t.name for t in f.tensors if t.name in wanted]])
    placed = {n for _, names in groups for n in names}
    groups[-1][1].extend(n for n in reader.names if n not in placed)
    layouts, copies, names = [], [], {}
    keep_one = base.is_dir and not any(ns for _, ns in groups)  # a folder keeps one file, if empty
    for k, (f, ns) in enumerate(groups):
        fname = os.path.basename(f.path)
        if not ns and base.is_dir and not (keep_one and k == len(groups) - 1):
            continue  # every tensor of this shard is gone
        names[fname] = ns
        same = [(t.name, t.dtype, tuple(t.shape)) for t in f.tensors] == \
            [(n, reader.header(n).dtype, reader.header(n).shape) for n in ns]
        if same and base.is_dir and not any(n in changed for n in ns):
            copies.append(f)
            continue
        items = [(n, reader.header(n).dtype, reader.header(n).shape) for n in ns]
        layouts.append(ShardLayout(fname if base.is_dir else None, items, f.metadata))
    return ApplyPlan(layouts, copies, bases, changed, names)


def _write_index(base: Checkpoint, plan: ApplyPlan, stage: Stage, in_place: bool) -> None:
    if base.index_json is None:
        return
    index = dict(base.index_json)
    index["weight_map"] = {n: fname for fname, ns in plan.names.items() for n in ns}
    meta = dict(index.get("metadata") or {})
    if "total_size" in meta:
        meta["total_size"] = sum(lay.tensor_bytes for lay in plan.layouts) + sum(
            t.end - t.begin for f in plan.copies for t in f.tensors)
    index["metadata"] = meta
    src = os.path.join(base.path, INDEX_NAME)
    if base.index_json.get("weight_map") == index["weight_map"] and base.index_json.get("metadata") == meta:
        _link_or_copy(src, stage.file(INDEX_NAME), hardlink=in_place)
        return
    write_json(stage.file(INDEX_NAME), index, stage.owner_of(INDEX_NAME))


def _free_bytes(path: str) -> int:
    try:
        return shutil.disk_usage(path).free
    except OSError as exc:
        raise os_error(exc, "write", path) from None


def _link_or_copy(src, dst, hardlink):
    if hardlink:
        try:
            os.link(src, dst)
            return
        except OSError:
            pass
    shutil.copy2(src, dst)
    fd = os.open(dst, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


__all__ = ["encode_checkpoints", "apply_delta", "plan_apply", "recover", "ApplyResult", "ArcError",
           "OLD_TAG", "TMP_TAG"]
