"""The calls most users need: ``encode``/``decode`` in memory, ``encode_files``/``apply_files`` on disk.

Arrays in are numpy (ml_dtypes for BF16/FP8) or torch tensors; arrays out are numpy unless the caller
gave torch (or asked for it with ``framework="pt"``, as ``safetensors.safe_open`` does).
"""
from __future__ import annotations

import io
import os
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from . import pipeline
from .arrays import numpy_view
from .errors import InputError
from .reader import DeltaReader
from .writer import DEFAULT_BLOCK_ELEMS, DeltaWriter, check_mismatches

if TYPE_CHECKING:
    from .checkpoint import ApplyResult

# --------------------------------------------------------------------------------- torch in, torch out

_FRAMEWORKS = {"np": "np", "numpy": "np", "pt": "pt", "torch": "pt", "pytorch": "pt"}


def _is_torch(x: object) -> bool:
    return type(x).__module__.split(".", 1)[0] == "torch"


def wants_torch(base: Any, framework: str | None) -> bool:
    """Whether decoded tensors go back as torch tensors: ``framework`` ``"pt"`` (or ``"torch"``) yes,
    ``"np"`` (or ``"numpy"``) no; ``None`` (the default) follows the base — torch when it holds torch
    tensors (``base`` a mapping of them, or one tensor), numpy otherwise (no base: numpy)."""
    if framework is not None:
        try:
            return _FRAMEWORKS[framework] == "pt"
        except (KeyError, TypeError):
            raise InputError(f"framework must be 'np' or 'pt' (or None: like the base), not {framework!r}") from None
    if isinstance(base, Mapping):
        return any(_is_torch(v) for v in base.values())
    return _is_torch(base)


def as_framework(arrays: dict, base: Any, framework: str | None = None, device: Any = None) -> dict:
    """``arrays`` (name → decoded numpy array) as the caller wants them (see :func:`wants_torch`).

    Torch tensors share the decoded arrays' memory (no copy) on the CPU, or are moved to ``device``
    when given; with ``device=None`` a tensor goes where its same-named base tensor is (a new tensor:
    where the first torch base tensor is). ``device`` without torch output, or torch output without
    PyTorch installed, is an InputError."""
    if not wants_torch(base, framework):
        if device is not None:
            raise InputError("device= is for torch output: pass framework='pt' (or torch base tensors)")
        return arrays
    try:
        from . import torch as _torch  # the one module that imports torch
    except ImportError as exc:         # framework="pt" without PyTorch installed
        raise InputError(str(exc)) from None
    return _torch.from_decoded(arrays, base, device)


# --------------------------------------------------------------------------------- in memory

def encode(base: Mapping | None, target: Mapping, *, base_step=None, target_step=None,
           block_elems: int = DEFAULT_BLOCK_ELEMS, effort: str = "default", workers=None,
           keyframe: bool = False, on_mismatch: str = "warn", compact_index: bool = True) -> bytes:
    """Encode ``target`` as a delta from ``base`` (name → array: numpy, ml_dtypes or torch) to bytes.

    ``base=None`` or ``keyframe=True`` writes a full lossless snapshot that needs no base. A target
    tensor without a base tensor of the same name, dtype and shape is stored whole (a keyframe
    tensor); ``on_mismatch`` says what to do about it: ``"warn"`` (default: one
    :class:`arcfmt.KeyframeWarning` naming them), ``"error"`` (:class:`arcfmt.InputError`, before
    anything is encoded) or ``"ignore"``. ``base_step``/``target_step`` label the file (a reader can
    refuse a delta against the wrong step); ``effort``: ``"fast"``, ``"default"`` or ``"max"``.
    ``compact_index=False`` writes the index as format 1.4 did, and no inline blocks (SPEC.md §10, §7): a
    file 1.4 and 1.5 decoders read, for a fleet whose followers are not all upgraded yet.
    """
    if not isinstance(target, Mapping) or (base is not None and not isinstance(base, Mapping)):
        raise InputError("base and target must be mappings of tensor name to array")
    if base is not None and not keyframe:   # a keyframe file has no base to mismatch
        check_mismatches(base, target, on_mismatch, stacklevel=2)
    else:
        check_mismatches({}, {}, on_mismatch)  # only the value is checked
    buf = io.BytesIO()
    with DeltaWriter(buf, base_step=base_step, target_step=target_step, block_elems=block_elems,
                     effort=effort, workers=workers, compact_index=compact_index) as w:
        w.write_tensors(((name, None if base is None else base.get(name), arr) for name, arr in target.items()),
                        keyframe=keyframe)
    return buf.getvalue()


def decode(base: Mapping | None, delta, *, names=None, workers=None, max_output_bytes: int | None = None,
           framework: str | None = None, device: Any = None, previous: Mapping | None = None) -> dict:
    """Rebuild the target (name → array) from ``base`` and an arcfmt file (bytes, a file object, or
    any ``DeltaReader`` source).

    Bit-exact and verified: every tensor against its hash, the model against its digest. Raises a
    subclass of :class:`arcfmt.ArcError` on any bad input or wrong base. ``names``: only these tensors
    (the digests are then not checked, as they cover the whole model). ``max_output_bytes`` bounds the
    memory the rebuilt tensors may take (by default: what the bases back, plus a bound scaled to the
    file, so a small file cannot make gigabytes).

    Torch in, torch out: with torch base tensors the result holds torch tensors (on each base tensor's
    device), else numpy arrays; ``framework="pt"`` or ``"np"`` chooses explicitly (as in
    ``safetensors.safe_open``), ``device`` places torch output.

    ``previous``: the step before the base (name → array, or :class:`arcfmt.History` kept from it),
    which a file written with it needs (format 1.9, SPEC.md §7): checked like the base.
    """
    reader = DeltaReader(delta, workers=workers, max_output_bytes=max_output_bytes)
    return reader.decode_all({} if base is None else base, names, framework=framework, device=device,
                             previous=previous)


def apply_in_place(arrays: Mapping, delta, *, workers=None, names=None,
                   max_output_bytes: int | None = None, previous: Mapping | None = None) -> Iterator[tuple[str, Any]]:
    """Apply a delta straight into live arrays (numpy, or CPU torch tensors), without a full copy.

    Yields ``(name, array)`` for every tensor that changed — the pairs a vLLM-style
    ``load_weights`` takes — after it has been updated. Every base tensor (and, for the whole file,
    both digests) is checked before any decoded byte is used (with two threads or more, the largest
    tensors' blocks start decoding into private memory meanwhile); each tensor's changed blocks are
    rebuilt into private memory and verified against the file's hash *before* any byte of the live
    array is overwritten (blocks whose encoding is ``unchanged`` are never touched). A tensor whose
    dtype or shape changes, or that is new, is yielded as a fresh array instead (the caller must
    install it; a torch tensor when ``arrays`` holds torch tensors). Raises a subclass of
    :class:`arcfmt.ArcError`; tensors already yielded stay updated, the failing one and those after
    it are untouched. ``previous``: as for :func:`decode`.
    """
    reader = DeltaReader(delta, workers=workers, max_output_bytes=max_output_bytes)
    started: list[pipeline.Early] = []

    def start_early(headers: list) -> None:
        """As ``decode`` does, into the sink below made of the arrays that will pass its checks."""
        live = {}
        for th in headers:
            view = _live_view(arrays, th) if th.needs_base else None
            if view is not None:
                live[th.name] = view
        sink = pipeline.LiveSink(live, arrays, pipeline.ArraySink(   # (fresh arrays: allocated in run)
            reader.output_budget([th for th in headers if th.name not in live])))
        started.append(pipeline.Early(sink, reader.workers, 2 * reader.workers))   # closed below, always
        reader.start_early(started[-1], headers, {n: v for n, v in live.items() if reader.changes(n)})

    try:
        yield from _apply_live(reader, arrays, names, previous, start_early, started)
    finally:
        for e in started:
            e.close()


def _live_view(arrays: Mapping, th: Any) -> Any:
    """The live array of ``th`` as a writeable flat unsigned view, if it is one of its dtype and shape
    (else None, whatever the object: the checks will say what is wrong, in their turn)."""
    try:
        view = numpy_view(arrays[th.name])
        if view is None or not view.flags.writeable or pipeline.base_structure(th, view) is None:
            return None
        return view.reshape(-1).view(th.dtype.uint)
    except Exception:  # noqa: BLE001 - not one to start on
        return None


def _apply_live(reader: DeltaReader, arrays: Mapping, names, previous, start_early: Callable[[list], None],
                started: list[pipeline.Early]) -> Iterator[tuple[str, Any]]:
    """:func:`apply_in_place` once its reader is open and its early start ready."""
    wanted, bases, _ = reader.selection(arrays, names, workers=reader.workers, previous=previous,
                                        early=start_early if reader.workers > 1 else None)
    live = {}
    for n in wanted:
        if bases[n] is None:
            continue
        view = numpy_view(arrays[n])   # never a copy: the update must land in the caller's memory
        if view is None or not (view.flags.c_contiguous and view.flags.writeable):
            raise InputError(f"tensor {n!r}: the live array must be C-contiguous and writeable, in CPU memory")
        live[n] = view.reshape(-1).view(reader.header(n).dtype.uint)
    early = started[0] if started else None
    sink: pipeline.Sink[Any]
    if early is not None and isinstance(early.sink, pipeline.LiveSink) and early.sink.live.keys() == live.keys():
        sink = early.sink
    else:   # (the same arrays pass both ways; a sink made of others starts nothing)
        early = None
        fresh = [reader.header(n) for n in wanted if n not in live]
        sink = pipeline.LiveSink(live, arrays, pipeline.ArraySink(reader.output_budget(fresh)))
    items = []
    for n in wanted:
        if n in live and not reader.changes(n):
            # its bytes are the base's, whose hash was just checked: the target hash must be that one
            base_hash = reader.header(n).base_hash
            assert base_hash is not None  # it is live: it has a checked base
            pipeline.verify_hash(reader.header(n), base_hash)
            continue
        items.append(reader.item(n, bases[n]))
    torch_out = wants_torch(arrays, None)
    for name, arr in pipeline.run(items, sink, workers=reader.workers, early=early):
        if torch_out and name not in live:
            arr = as_framework({name: arr}, arrays)[name]
        yield name, arr


# --------------------------------------------------------------------------------- files on disk

def encode_files(base: str | os.PathLike | None, target: str | os.PathLike, out, *, base_step: int | None = None,
                 target_step: int | None = None, block_elems: int = DEFAULT_BLOCK_ELEMS, effort: str = "default",
                 workers: int | None = None, keyframe: bool = False, force: bool = False,
                 on_mismatch: str = "warn", progress: Callable[[int], object] | None = None,
                 compact_index: bool = True, previous: str | os.PathLike | None = None) -> DeltaWriter:
    """Write the delta between two safetensors checkpoints (a ``.safetensors`` file or a sharded folder
    with its ``model.safetensors.index.json``) to ``out``: what ``arcfmt encode BASE TARGET -o OUT`` does.

    ``base=None`` (or ``keyframe=True``) writes a keyframe of ``target``. ``out`` is a path, written
    atomically (an existing file is refused unless ``force``; an input never), or a binary file
    object. Tensors are read memory-mapped, so checkpoints larger than memory stream through.
    ``on_mismatch`` and ``compact_index`` as for :func:`encode`; ``progress(nbytes)`` is called as target
    tensors are read. ``previous``: the checkpoint of the step before ``base`` (format 1.9, SPEC.md §7):
    smaller files, which then need that checkpoint to be applied (:func:`apply_files` ``previous``).
    Returns the closed :class:`DeltaWriter` (``.size``: bytes written; ``.stats``: per tensor).
    """
    from .checkpoint import encode_checkpoints

    return encode_checkpoints(None if base is None else os.fspath(base), os.fspath(target), out,
                              base_step=base_step, target_step=target_step, block_elems=block_elems,
                              effort=effort, workers=workers, keyframe=keyframe, progress=progress, force=force,
                              on_mismatch=on_mismatch, stacklevel=3, compact_index=compact_index,
                              previous_path=None if previous is None else os.fspath(previous))


def apply_files(base: str | os.PathLike, delta, out: str | os.PathLike | None = None, *, in_place: bool = False,
                workers: int | None = None, max_output_bytes: int | None = None,
                progress: Callable[[int], object] | None = None,
                previous: str | os.PathLike | None = None) -> ApplyResult:
    """Rebuild the target checkpoint from the one at ``base`` and a delta: what ``arcfmt apply`` does.

    ``delta``: a path, bytes, a binary file object or a :class:`DeltaReader`. Give exactly one of
    ``out`` (a new file or folder, laid out as the base; an existing one is refused; an existing folder
    receives a file named as the base) or ``in_place=True`` (replace the base, keeping its mode and
    owner). All or nothing: every base tensor and both digests are checked before anything is written,
    the output is verified bit-exact before one atomic rename exposes it, and files beside the weights
    (config, tokenizer) come along. Returns an ``ApplyResult`` (``path``, ``tensors``,
    ``changed_tensors``, ``bytes_written``, ``files``). ``previous``: the checkpoint of the step before
    ``base``, which a delta written with one needs (format 1.9).
    """
    from .checkpoint import apply_delta

    return apply_delta(os.fspath(base), delta, None if out is None else os.fspath(out), in_place=in_place,
                       workers=workers, progress=progress, max_output_bytes=max_output_bytes,
                       previous_path=None if previous is None else os.fspath(previous))


__all__ = ["encode", "decode", "apply_in_place", "encode_files", "apply_files", "as_framework", "wants_torch"]
